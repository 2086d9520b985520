"""`helm test`: GET /metrics from every exporter behind the chart's Service, as Prometheus scrapes.

The scheme, the CA, the client certificate, the server name and the basic-auth credentials are
the ones the chart's monitor scrapes with: templates/tests/smoke-test.yaml passes the address,
the scheme and the server name in the environment, the certificates and credentials as files.
Exit 0 when every address the Service name resolves to answered 200 with the exporter's own
metrics, 1 otherwise; one line per address either way.

Standard library only: it runs in the exporter's image.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import ssl
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TLS_FOLDER = Path(os.environ.get("SMOKE_TLS_FOLDER", "/etc/ccl-exporter-test/tls"))
BASIC_AUTH_FOLDER = Path(os.environ.get("SMOKE_BASIC_AUTH_FOLDER", "/etc/ccl-exporter-test/basic-auth"))
TIMEOUT_SECONDS = 10.0
MAX_BODY_BYTES = 16 * 1024 * 1024
PARALLEL = 16
# Every page of the exporter has it (exporter/collectors/umbrella.py).
EXPECTED = b"ccl_exporter_build_info"


def tls_context() -> ssl.SSLContext:
    ca = TLS_FOLDER / "ca.crt"
    context = ssl.create_default_context(cafile=str(ca) if ca.is_file() else None)
    if os.environ.get("SMOKE_INSECURE_SKIP_VERIFY") == "true":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    cert, key = TLS_FOLDER / "tls.crt", TLS_FOLDER / "tls.key"
    if cert.is_file() and key.is_file():
        context.load_cert_chain(str(cert), str(key))
    return context


def headers(host: str) -> dict[str, str]:
    found = {"Host": host, "Accept": "text/plain", "Connection": "close"}
    username, password = BASIC_AUTH_FOLDER / "username", BASIC_AUTH_FOLDER / "password"
    if username.is_file() and password.is_file():
        token = base64.b64encode(username.read_bytes() + b":" + password.read_bytes()).decode()
        found["Authorization"] = f"Basic {token}"
    return found


def fetch(address: str, port: int, host: str, context: ssl.SSLContext | None) -> str:
    """One line saying what ``address`` answered; it starts with "ok" when it served the metrics."""
    server_name = os.environ.get("SMOKE_SERVER_NAME") or host
    try:
        with socket.create_connection((address, port), timeout=TIMEOUT_SECONDS) as raw:
            sock = context.wrap_socket(raw, server_hostname=server_name) if context else raw
            with sock:
                request = "".join(f"{k}: {v}\r\n" for k, v in headers(host).items())
                sock.sendall(f"GET /metrics HTTP/1.1\r\n{request}\r\n".encode())
                response = http.client.HTTPResponse(sock)
                response.begin()
                body = response.read(MAX_BODY_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        return f"failed {address}: {type(exc).__name__}: {exc}"
    if response.status != 200:
        return f"failed {address}: HTTP {response.status} {response.reason}"
    if EXPECTED not in body:
        return f"failed {address}: HTTP 200 without {EXPECTED.decode()} ({len(body)} bytes)"
    return f"ok {address}: {len(body)} bytes"


def main() -> int:
    unsupported = os.environ.get("SMOKE_UNSUPPORTED")
    if unsupported:
        print(f"failed: {unsupported}")
        return 1
    host, port = os.environ["SMOKE_HOST"], int(os.environ["SMOKE_PORT"])
    scheme = os.environ.get("SMOKE_SCHEME", "http")
    try:
        addresses = sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})
    except OSError as exc:
        print(f"failed: {host} does not resolve ({exc}): no exporter is ready behind the Service")
        return 1
    context = tls_context() if scheme == "https" else None
    with ThreadPoolExecutor(PARALLEL) as pool:
        lines = list(pool.map(lambda address: fetch(address, port, host, context), addresses))
    for line in lines:
        print(line)
    served = sum(line.startswith("ok ") for line in lines)
    print(f"{served} of {len(addresses)} exporters behind {host} served /metrics over {scheme}")
    return 0 if addresses and served == len(addresses) else 1


if __name__ == "__main__":
    sys.exit(main())
