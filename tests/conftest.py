"""Shared test helpers: real system tools (skipped locally when absent, required in CI),
fixture trees stored as text, free ports and exporter subprocesses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixturetree import unpack
from tests.tiers import tier

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(name: str) -> str:
    """Path of a system tool. Missing: skip with the reason locally, fail in CI (never skip)."""
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} not installed (Debian package; .ci/run installs it)"
    if IN_CI:
        pytest.fail(f"CI must run this test: {message}")
    pytest.skip(message)
    raise AssertionError("unreachable")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (``e2e``, ``tool``, or none: fast); see tests/tiers.py."""
    for item in items:
        if isinstance(item, pytest.Function):
            name = tier(item.path, item.originalname, item.fixturenames)
            if name:
                item.add_marker(name)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fixture_tree(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Unpack ``tests/fixtures/<name>.txt`` into a fresh folder and return its root."""

    def make(name: str) -> Path:
        root = tmp_path / name
        unpack((FIXTURES / f"{name}.txt").read_text(), root)
        return root

    return make


def http_get(url: str, timeout: float = 10.0, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def wait_http(url: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            status, body, _ = http_get(url, timeout=2.0)
            if status == 200:
                return body
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s ({last})")


class ExporterProcess:
    """``ccl-exporter serve`` in a subprocess on a free loopback port (``simulated``: on the simulated
    node, ``python -m ccl_sim serve``)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, simulated: bool = False) -> None:
        from devtools.stack import simulated_serve_argv, simulator_env

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, **(env or {})}
        serve = simulated_serve_argv() if simulated else [sys.executable, "-m", "exporter", "serve"]
        self.proc = subprocess.Popen(
            [*serve, "--web.listen-address", f"127.0.0.1:{self.port}", *args],
            env=simulator_env(full_env) if simulated else full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_http(self.url + "/healthz")
        except TimeoutError:
            self.stop()
            raise

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")[1]

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.stdout.read() if self.proc.stdout else ""


@pytest.fixture
def exporter_process() -> Iterator[type[ExporterProcess]]:
    started: list[ExporterProcess] = []

    class Tracked(ExporterProcess):
        def __init__(self, *args: str, env: dict[str, str] | None = None, simulated: bool = False) -> None:
            super().__init__(*args, env=env, simulated=simulated)
            started.append(self)

    yield Tracked
    for process in started:
        process.stop()


class AppClient:
    """An HTTP client (aiohttp's) on an app served by ``exporter.http.endpoints.serving`` on a loopback port."""

    def __init__(self, session: object, port: int, server: object) -> None:
        self.session = session
        self.port = port
        self.server = server  # exporter.http.server.WebServer: its guard, its port

    def get(self, path: str, **kwargs: object):  # type: ignore[no-untyped-def]
        return self.session.get(path, **kwargs)  # type: ignore[attr-defined]

    def post(self, path: str, **kwargs: object):  # type: ignore[no-untyped-def]
        return self.session.post(path, **kwargs)  # type: ignore[attr-defined]


@pytest.fixture
async def app_client():  # type: ignore[no-untyped-def]
    """Call with an ``ExporterApp`` (and aiohttp ClientSession options): the app runs and listens
    on 127.0.0.1 until the test ends, and the returned ``AppClient`` talks to it."""
    import contextlib

    import aiohttp

    from exporter.http.endpoints import serving

    async with contextlib.AsyncExitStack() as stack:

        async def start(app, **session_options):  # type: ignore[no-untyped-def]
            server = await stack.enter_async_context(serving(app, "127.0.0.1", 0))
            port = server.port
            session = await stack.enter_async_context(
                aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}", **session_options)
            )
            return AppClient(session, port, server)

        yield start
