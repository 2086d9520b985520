"""``make demo`` without Prometheus/Alertmanager on the PATH, and Ctrl-C stopping what it started.

The full chain (with both binaries) runs in ``bench/detection_latency.py`` and the e2e tests,
through the same ``devtools.stack`` and ``devtools.timeline`` code the demo uses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import REPO, free_port, http_get, require_tool, wait_http


def _demo(port: int, *args: str, path: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "PATH": path}  # no prometheus, no prometheus-alertmanager
    return subprocess.Popen(
        [sys.executable, "-m", "devtools.demo", "--port", str(port), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_without_the_binaries_it_serves_the_node_and_says_what_it_skipped() -> None:
    port = free_port()
    demo = _demo(port, "--exit-after-timeline")
    out, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, out
    assert f"http://127.0.0.1:{port}/metrics" in out
    assert "Skipped Prometheus, Alertmanager and the alert timeline: prometheus, prometheus-alertmanager" in out
    assert "apt-get install prometheus prometheus-alertmanager" in out


def test_ctrl_c_stops_the_exporter_it_started() -> None:
    port = free_port()
    demo = _demo(port)
    try:
        body = wait_http(f"http://127.0.0.1:{port}/metrics", timeout=30)
        assert "ccl_rdma_port_state_id" in body
        deadline = time.monotonic() + 20
        while "Ctrl-C stops it" not in (line := demo.stdout.readline() if demo.stdout else ""):
            assert line and time.monotonic() < deadline, "the demo never said it was ready"
        demo.send_signal(signal.SIGINT)
        assert demo.wait(20) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(5)
    try:
        status = http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0]
    except OSError:
        status = None
    assert status is None, "the exporter outlived the demo"


def test_a_missing_rules_file_is_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With the binaries present but no rule file, the demo says which file it lacks."""
    prometheus, alertmanager = require_tool("prometheus"), require_tool("prometheus-alertmanager")
    port = free_port()
    path = os.pathsep.join({os.path.dirname(prometheus), os.path.dirname(alertmanager)})
    demo = _demo(port, "--exit-after-timeline", "--rules", str(tmp_path / "nowhere.yaml"), path=path)
    out, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, out
    assert f"{tmp_path / 'nowhere.yaml'} (run from a source checkout, or pass --rules) not available" in out
