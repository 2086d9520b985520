"""Command-line flags: node_exporter style, each also settable by environment variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.cli import build_parser, config_from_args
from exporter.collectors import all_collectors
from exporter.config import parse_listen_address
from exporter.flags import env_name


def config(argv: list[str], environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    args = build_parser(environ or {}).parse_args(["serve", *argv])
    return config_from_args(args, all_collectors())


def test_defaults() -> None:
    cfg = config([])
    assert cfg.listen_address == "0.0.0.0:19400"
    assert str(cfg.sysfs) == "/sys"
    assert "rdma" in cfg.enabled_collectors


def test_simulate_listens_on_loopback() -> None:
    assert config(["--simulate"]).listen_address == "127.0.0.1:19400"
    assert config(["--simulate", "--web.listen-address", ":9500"]).listen_address == ":9500"


def test_collector_switches() -> None:
    assert "rdma" not in config(["--no-collector.rdma"]).enabled_collectors
    assert config(["--collector.disable-defaults"]).enabled_collectors == ()
    assert config(["--collector.disable-defaults", "--collector.rdma"]).enabled_collectors == ("rdma",)


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    env = {env_name("--path.sysfs"): "/host/sys", env_name("--collector.rdma"): "off", "NODE_NAME": "gpu-7"}
    cfg = config([], env)
    assert str(cfg.sysfs) == "/host/sys" and "rdma" not in cfg.enabled_collectors and cfg.node_name == "gpu-7"
    assert str(config(["--path.sysfs", "/x"], env).sysfs) == "/x"


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(SystemExit, match="not host:port"):
        config(["--web.listen-address", "nonsense"])
    with pytest.raises(SystemExit, match="not true/false"):
        config([], {env_name("--simulate"): "maybe"})


@pytest.mark.parametrize(
    ("address", "expected"),
    [("0.0.0.0:19400", ("0.0.0.0", 19400)), (":80", ("0.0.0.0", 80)), ("[::1]:19400", ("::1", 19400))],
)
def test_parse_listen_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(address) == expected


def test_help_is_readable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--web.listen-address" in out and "CCL_EXPORTER_WEB_LISTEN_ADDRESS" in out
    assert "--collector.rdma, --no-collector.rdma" in out and "--path.sysfs" in out
