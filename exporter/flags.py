"""Command-line flags that an environment variable can also set, for every ``ccl-exporter`` command.

A flag's variable is named after it: ``--path.sysfs`` is ``CCL_EXPORTER_PATH_SYSFS``,
``--collector.rdma`` is ``CCL_EXPORTER_COLLECTOR_RDMA``. The variable replaces the flag's default;
the flag given on the command line wins over both. ``Flag`` declares one with a value,
``Switch`` one without (true/false in its variable), ``on_off_flag`` a ``--x`` / ``--no-x`` pair.

Flags that several commands share are declared here once (``SYSFS``, ``PROBE_RESULTS``); a
collector declares its own in its ``CollectorSpec``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "CCL_EXPORTER_"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

ArgumentGroup = argparse.ArgumentParser | argparse._ArgumentGroup


def parse_listen_address(address: str) -> tuple[str, int]:
    """A ``--web.listen-address``: ``host:port``, ``:port`` or ``[v6]:port`` → (host, port); raises ValueError."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"listen address {address!r} is not host:port")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def env_name(flag: str) -> str:
    """The environment variable that sets ``--flag.name-x``: ``CCL_EXPORTER_FLAG_NAME_X``."""
    return ENV_PREFIX + flag.lstrip("-").replace(".", "_").replace("-", "_").upper()


def env_bool(environ: Mapping[str, str], flag: str, default: bool) -> bool:
    """The flag's variable read as true/false; ``default`` when unset, SystemExit when neither."""
    raw = environ.get(env_name(flag))
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise SystemExit(f"ccl-exporter: {env_name(flag)}={raw!r} is not true/false")


@dataclass(frozen=True)
class Flag:
    """A flag with a value. ``also_env`` names one more variable that sets the default (a
    Kubernetes downward-API name such as ``NODE_NAME``); the flag's own variable wins over it."""

    name: str
    default: object
    help: str
    dest: str
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    also_env: str | None = None

    def default_in(self, environ: Mapping[str, str]) -> object:
        fallback = self.default if self.also_env is None else environ.get(self.also_env, self.default)
        return environ.get(env_name(self.name), fallback)

    def add_to(self, group: ArgumentGroup, environ: Mapping[str, str], help: str | None = None) -> None:
        """Add the flag; ``help`` replaces its help text where a command words it its own way."""
        extra: dict[str, Any] = {}
        if self.type is not None:
            extra["type"] = self.type
        if self.choices is not None:
            extra["choices"] = list(self.choices)
        group.add_argument(
            self.name,
            default=self.default_in(environ),
            help=self.help if help is None else help,
            dest=self.dest,
            **extra,
        )


@dataclass(frozen=True)
class Switch:
    """A flag without a value, off unless given (or its variable says true).

    ``lenient_env``: a variable that is not one of the true words means false instead of being an
    error (``preflight --allow-unknown-transport`` has always read its variable so)."""

    name: str
    help: str
    dest: str
    lenient_env: bool = False

    def default_in(self, environ: Mapping[str, str]) -> bool:
        if self.lenient_env:
            return environ.get(env_name(self.name), "false").lower() in _TRUE
        return env_bool(environ, self.name, False)

    def add_to(self, group: ArgumentGroup, environ: Mapping[str, str]) -> None:
        group.add_argument(
            self.name, action="store_true", default=self.default_in(environ), dest=self.dest, help=self.help
        )


def on_off_flag(
    group: ArgumentGroup, environ: Mapping[str, str], name: str, help: str, dest: str, default: bool
) -> None:
    """``--x`` / ``--no-x``. Parsed as None when neither the flag nor its variable was given (the
    caller decides then, e.g. from ``--collector.disable-defaults``)."""
    group.add_argument(
        name,
        action=argparse.BooleanOptionalAction,
        default=None if env_name(name) not in environ else env_bool(environ, name, default),
        dest=dest,
        help=help,
    )


class EnvHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's environment variable next to its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action) or ""
        long_flags = [o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")]
        if long_flags and long_flags[0] not in ("--help", "--version"):
            text += f" [env {env_name(long_flags[0])}]"
        return text


# Flags of more than one command.
SYSFS = Flag("--path.sysfs", "/sys", "sysfs mount point", dest="sysfs")
LOG_LEVEL = Flag(
    "--log.level",
    "info",
    "debug, info, warning or error",
    dest="log_level",
    choices=("debug", "info", "warning", "error"),
)
DEFAULT_PROBE_RESULTS = "/var/lib/ccl-exporter/probe-results"
PROBE_RESULTS = Flag(
    "--path.probe-results",
    DEFAULT_PROBE_RESULTS,
    "folder the result file is written to (the exporter's hostPath)",
    dest="probe_results",
)
