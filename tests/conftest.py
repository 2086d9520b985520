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
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import is_hypothesis_test, settings

from tests.fixturetree import unpack
from tests.tiers import tier

# jsonschema imports rfc3987_syntax where it is installed (the SBOM tool's dependencies bring it)
# to check the "iri" format, and that import builds a parser: two seconds in every test process.
# No test checks formats (jsonschema.validate asserts none without a format checker), so the module
# reads as not installed, which jsonschema handles as it does any missing format library.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Hypothesis profiles: `make test` (CI) runs every property with the examples its @settings asks
# for (Hypothesis' default profile); `make test-fast` (--hypothesis-profile=fast) runs a tenth of
# them, at least FAST_MIN_EXAMPLES, and keeps no example database.
FAST_PROFILE = "fast"
FAST_EXAMPLE_SHARE = 10
FAST_MIN_EXAMPLES = 10
settings.register_profile(FAST_PROFILE, max_examples=FAST_MIN_EXAMPLES, database=None)


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
    """Mark each test with its tier (``e2e``, ``tool``, ``slow``, or none: fast; see tests/tiers.py),
    and under the fast Hypothesis profile give each property a tenth of its examples."""
    fast_examples = settings.get_current_profile_name() == FAST_PROFILE
    properties = {}  # id -> the function: a parametrized property is one function for all its items
    for item in items:
        if isinstance(item, pytest.Function):
            name = tier(item.path, item.originalname, item.fixturenames)
            if name:
                item.add_marker(name)
            if fast_examples and is_hypothesis_test(item.obj):
                properties[id(item.obj)] = item.obj
    for test in properties.values():
        fewer_examples(test)


def fewer_examples(test: object) -> None:
    """A tenth of the examples an @settings asks for (which a profile cannot lower). Hypothesis keeps
    a test's settings in this attribute (hypothesis.core), and reads it when the test runs."""
    declared = test._hypothesis_internal_use_settings  # type: ignore[attr-defined]
    wanted = max(FAST_MIN_EXAMPLES, declared.max_examples // FAST_EXAMPLE_SHARE)
    if wanted < declared.max_examples:
        test._hypothesis_internal_use_settings = settings(declared, max_examples=wanted)  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Captured output as UTF-8 can carry it: a test of undecodable input (a device name that is
    not UTF-8) logs lone surrogates, which pytest-xdist cannot send from its worker (it would stop
    the whole run); they are kept as backslash escapes."""
    report: pytest.TestReport = yield
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8")) for title, text in report.sections
    ]
    return report


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
