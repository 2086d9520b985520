"""Command-line flags: node_exporter style, each also settable by environment variable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.collectors import all_collectors
from exporter.commands import build_parser
from exporter.commands.serve import config_from_args
from exporter.flags import env_name, parse_listen_address


def config(argv: list[str], environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    args = build_parser(environ or {}).parse_args(["serve", *argv])
    return config_from_args(args, all_collectors())


def test_defaults() -> None:
    cfg = config([])
    assert cfg.listen_address == "0.0.0.0:19400"
    assert str(cfg.paths.sysfs) == "/sys"
    assert "rdma" in cfg.enabled_collectors


def test_serve_has_no_simulate_mode() -> None:
    """The simulated node is a development package (``python -m ccl_sim serve``), not a mode of serve."""
    with pytest.raises(SystemExit):
        build_parser({}).parse_args(["serve", "--simulate"])
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--web.listen-address" in out and "simulat" not in out.lower()


def sim_config(argv: list[str]):  # type: ignore[no-untyped-def]
    from ccl_sim.serve import build_parser as sim_parser
    from ccl_sim.serve import with_simulated_defaults

    return config_from_args(with_simulated_defaults(sim_parser({}).parse_args(["serve", *argv])), all_collectors())


def test_the_simulated_node_takes_every_serve_flag_and_listens_on_loopback() -> None:
    from ccl_sim.serve import build_parser as sim_parser

    def serve_flags(parser) -> set[str]:  # type: ignore[no-untyped-def]
        (sub,) = [a for a in parser._actions if a.dest == "command"]
        return {flag for action in sub.choices["serve"]._actions for flag in action.option_strings}

    assert serve_flags(build_parser({})) < serve_flags(sim_parser({}))
    assert serve_flags(sim_parser({})) - serve_flags(build_parser({})) == {"--seed", "--tick", "--job-ends-after"}
    assert sim_config([]).listen_address == "127.0.0.1:19400"
    assert sim_config(["--web.listen-address", ":9500"]).listen_address == ":9500"
    env = {"CCL_EXPORTER_WEB_LISTEN_ADDRESS": ":9600"}
    assert sim_parser(env).parse_args(["serve"]).listen_address == ":9600", "its variable still counts"
    (sub,) = [a for a in sim_parser({})._actions if a.dest == "command"]
    assert "(default: 127.0.0.1:19400)" in " ".join(sub.choices["serve"].format_help().split()), "--help says so"
    probe = sim_config(["--probe.interval=60", "--probe.backend=nccl"]).collector_settings["probe"]
    assert (probe.schedule.backend, probe.schedule.min_bytes, probe.schedule.max_bytes) == ("gloo", "64K", "1M")


def test_collector_switches() -> None:
    assert "rdma" not in config(["--no-collector.rdma"]).enabled_collectors
    assert config(["--collector.disable-defaults"]).enabled_collectors == ()
    assert config(["--collector.disable-defaults", "--collector.rdma"]).enabled_collectors == ("rdma",)


def test_environment_overrides_defaults_and_flags_override_environment() -> None:
    env = {env_name("--path.sysfs"): "/host/sys", env_name("--collector.rdma"): "off", "NODE_NAME": "gpu-7"}
    cfg = config([], env)
    assert str(cfg.paths.sysfs) == "/host/sys" and "rdma" not in cfg.enabled_collectors and cfg.node_name == "gpu-7"
    assert str(config(["--path.sysfs", "/x"], env).paths.sysfs) == "/x"


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(SystemExit, match="not host:port"):
        config(["--web.listen-address", "nonsense"])
    with pytest.raises(SystemExit, match="not true/false"):
        config([], {env_name("--collector.disable-defaults"): "maybe"})


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
