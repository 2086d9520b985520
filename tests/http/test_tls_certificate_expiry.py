"""When the served TLS certificate expires: ``exporter.http.certificates`` reads a certificate's
notAfter from its DER, and the exporter and the webhook expose it as a gauge.

Certificates are made here with the ``openssl`` command line; what the reader finds is compared
with two readers that are not ours: ``openssl x509 -enddate`` on the file, and the notAfter a TLS
client receives from our server (``SSLSocket.getpeercert``, read with ``ssl.cert_time_to_seconds``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from exporter.http.certificates import CertificateError, earliest_not_after, not_after, pem_certificates
from exporter.http.endpoints import CERTIFICATE_EXPIRY_METRIC, create_app, serving
from exporter.http.webconfig import WebConfigSource
from tests.conftest import require_tool
from tests.metrics_text import promtool_check_metrics, value
from tests.pki import openssl


class Fixed:
    name = "fixed"

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("ccl_test_fixed", "test")
        family.add_metric([], 1.0)
        yield family


def _self_signed(folder: Path, name: str, days: int, key: str = "ec") -> Path:
    """``name.crt``/``name.key``: a v3 certificate for 127.0.0.1 valid for ``days`` days."""
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if key == "ec" else ["-newkey", "rsa:2048"]
    openssl(
        "req",
        "-x509",
        *new_key,
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        str(days),
        "-subj",
        f"/CN={name}",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
        cwd=folder,
    )
    return folder / f"{name}.crt"


def _openssl_not_after(path: Path) -> float:
    """``openssl x509 -enddate``, in seconds since the epoch."""
    out = subprocess.run(
        [require_tool("openssl"), "x509", "-in", str(path), "-noout", "-enddate"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return float(ssl.cert_time_to_seconds(out.strip().removeprefix("notAfter=")))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certificates")
    _self_signed(folder, "month", 30)
    _self_signed(folder, "rsa", 400, key="rsa")
    _self_signed(folder, "century", 40000)  # after 2049: GeneralizedTime instead of UTCTime
    # A version-1 certificate (no [0] version field), signed by its own key.
    openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "v1.key",
        "-out",
        "v1.csr",
        "-subj",
        "/CN=v1",
        cwd=folder,
    )
    openssl("x509", "-req", "-in", "v1.csr", "-signkey", "v1.key", "-out", "v1.crt", "-days", "10", cwd=folder)
    return folder


@pytest.mark.parametrize("name", ["month", "rsa", "century", "v1"])
def test_not_after_is_what_openssl_reads(certificates: Path, name: str) -> None:
    path = certificates / f"{name}.crt"
    (der,) = pem_certificates(path.read_bytes())
    assert not_after(der) == _openssl_not_after(path)
    assert earliest_not_after(path.read_bytes()) == _openssl_not_after(path)


def test_the_versions_and_time_types_are_the_ones_meant(certificates: Path) -> None:
    """The cases above cover both Time types, and certificates with and without the version field."""

    def text(name: str) -> str:
        return subprocess.run(
            [require_tool("openssl"), "x509", "-in", str(certificates / f"{name}.crt"), "-noout", "-text"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout

    assert "Version: 1 (0x0)" in text("v1") and "Version: 3 (0x2)" in text("month")
    (century,) = pem_certificates((certificates / "century.crt").read_bytes())
    (month,) = pem_certificates((certificates / "month.crt").read_bytes())
    assert b"\x18\x0f" in century, "GeneralizedTime"
    assert b"\x18\x0f" not in month and month.count(b"\x17\x0d") == 2, "two UTCTimes"


def test_a_chain_expires_with_its_earliest_certificate(certificates: Path) -> None:
    chain = b"".join((certificates / f"{name}.crt").read_bytes() for name in ("rsa", "month", "century"))
    assert earliest_not_after(chain) == _openssl_not_after(certificates / "month.crt")
    assert len(pem_certificates(chain)) == 3


@pytest.mark.parametrize(
    ("pem", "reason"),
    [
        (b"", "no CERTIFICATE block"),
        (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "no CERTIFICATE block"),
        (b"-----BEGIN CERTIFICATE-----\n@@@@\n-----END CERTIFICATE-----\n", "not base64"),
        (b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", "tbsCertificate: truncated"),
        (b"-----BEGIN CERTIFICATE-----\nAgA=\n-----END CERTIFICATE-----\n", "certificate: tag 0x02"),
    ],
)
def test_what_is_not_a_certificate_gets_a_reason(pem: bytes, reason: str) -> None:
    with pytest.raises(CertificateError, match=reason):
        earliest_not_after(pem)


def _time_in_der(der: bytes, replacement: bytes) -> bytes:
    """``der`` with its notAfter UTCTime (13 characters) replaced by ``replacement`` of the same length."""
    start = der.index(b"\x17\x0d", der.index(b"\x17\x0d") + 15) + 2
    return der[:start] + replacement + der[start + 13 :]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"491231235959Z", 2524607999.0),
        (b"500101000000Z", -631152000.0),
        (b"991301000000Z", None),
        (b"4912312359+01", None),
        (b"49123123595.Z", None),
    ],
)
def test_utc_time_years_and_malformed_times(certificates: Path, text: bytes, expected: float | None) -> None:
    """RFC 5280: a UTCTime year below 50 is 20YY, from 50 it is 19YY; a month 13, an offset instead
    of Z or a fraction is refused."""
    (der,) = pem_certificates((certificates / "month.crt").read_bytes())
    changed = _time_in_der(der, text)
    if expected is None:
        with pytest.raises(CertificateError, match="notAfter"):
            not_after(changed)
    else:
        assert not_after(changed) == expected


def test_every_truncation_is_a_certificate_error(certificates: Path) -> None:
    (der,) = pem_certificates((certificates / "rsa.crt").read_bytes())
    for length in range(len(der)):
        try:
            not_after(der[:length])
        except CertificateError:
            continue
        pytest.fail(f"a certificate cut to {length} bytes was read")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_are_a_time_or_a_certificate_error(data: bytes) -> None:
    for blob in (data, b"\x30\x82\x01\x00\x30\x81\xf0" + data):
        try:
            seconds = not_after(blob)
        except CertificateError:
            continue
        assert isinstance(seconds, float)
    pem = b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(data) + b"-----END CERTIFICATE-----\n"
    with contextlib.suppress(CertificateError):
        earliest_not_after(pem)


# --- the web configuration and the servers' gauges ---------------------------------------------


def test_the_web_config_knows_when_its_certificate_expires(tmp_path: Path, certificates: Path) -> None:
    shutil.copy(certificates / "month.crt", tmp_path / "tls.crt")
    shutil.copy(certificates / "month.key", tmp_path / "tls.key")
    files = WebConfigSource.from_tls_files(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert files.certificate_expiry() == _openssl_not_after(certificates / "month.crt")
    inline = "".join(
        f"  {key}: |\n" + "".join(f"    {line}\n" for line in (certificates / f"rsa.{suffix}").read_text().splitlines())
        for key, suffix in (("cert", "crt"), ("key", "key"))
    )
    (tmp_path / "web.yml").write_text("tls_server_config:\n" + inline)
    assert WebConfigSource.from_file(tmp_path / "web.yml").certificate_expiry() == _openssl_not_after(
        certificates / "rsa.crt"
    )
    (tmp_path / "plain.yml").write_text("")
    assert WebConfigSource.from_file(tmp_path / "plain.yml").certificate_expiry() is None


async def _peer_not_after_and_metrics(port: int, ca: Path) -> tuple[float, str]:
    context = ssl.create_default_context(cafile=str(ca))
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="127.0.0.1")
    peer = writer.get_extra_info("peercert")
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return float(ssl.cert_time_to_seconds(peer["notAfter"])), raw.partition(b"\r\n\r\n")[2].decode()


async def test_the_exporter_exposes_the_expiry_of_the_certificate_it_serves(tmp_path: Path, certificates: Path) -> None:
    for suffix in ("crt", "key"):
        shutil.copy(certificates / f"month.{suffix}", tmp_path / f"tls.{suffix}")
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    app = create_app([Fixed()], process_metrics=False)
    async with serving(app, "127.0.0.1", 0, web_config=WebConfigSource.from_file(config)) as server:
        served, metrics = await _peer_not_after_and_metrics(server.port, tmp_path / "tls.crt")
        assert value(metrics, CERTIFICATE_EXPIRY_METRIC) == served == _openssl_not_after(tmp_path / "tls.crt")
        assert promtool_check_metrics(require_tool("promtool"), metrics).returncode == 0
        # Renewed in place (as kubelet updates a mounted Secret): the gauge follows the new file.
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS)
        for suffix in ("crt", "key"):
            shutil.copy(certificates / f"rsa.{suffix}", tmp_path / f"tls.{suffix}")
        await asyncio.sleep(WebConfigSource.RECHECK_SECONDS + 0.1)
        served, metrics = await _peer_not_after_and_metrics(server.port, tmp_path / "tls.crt")
        assert value(metrics, CERTIFICATE_EXPIRY_METRIC) == served == _openssl_not_after(certificates / "rsa.crt")


async def test_without_tls_the_exporter_has_no_certificate_gauge(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("")
    async with serving(
        create_app([Fixed()], process_metrics=False), "127.0.0.1", 0, web_config=WebConfigSource.from_file(config)
    ) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        body = (await asyncio.wait_for(reader.read(), 10)).decode()
        writer.close()
    assert "ccl_test_fixed 1.0" in body and CERTIFICATE_EXPIRY_METRIC not in body
