"""--log.format: text as before, or one JSON object per line with exporter-toolkit's keys, for
``serve`` and ``webhook`` (flag and environment variable), hostile messages kept to one line."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import pytest

from exporter.commands import build_parser
from exporter.logs import FORMATS, JsonFormatter, formatter_for
from tests.conftest import ExporterProcess
from tests.http.test_web_config import pki  # noqa: F401 - pki is a fixture
from tests.webhook.test_webhook_https import Webhook

KEYS = ["time", "level", "source", "msg", "logger"]
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _record(level: int, msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("the collector broke")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord(
        "exporter.collectors.rdma", level, "/x/exporter/collectors/rdma.py", 42, msg, args, exc_info
    )


def test_a_json_line_has_exporter_toolkits_keys() -> None:
    line = JsonFormatter().format(_record(logging.INFO, "listening on %s:%d", "0.0.0.0", 19400))
    entry = json.loads(line)
    assert list(entry) == KEYS
    assert line.startswith('{"time":"'), "compact, as slog writes it"
    assert TIME.match(entry["time"])
    assert entry["level"] == "INFO" and entry["source"] == "rdma.py:42"
    assert entry["msg"] == "listening on 0.0.0.0:19400" and entry["logger"] == "exporter.collectors.rdma"


@pytest.mark.parametrize(
    ("level", "name"),
    [
        (logging.DEBUG, "DEBUG"),
        (logging.INFO, "INFO"),
        (logging.WARNING, "WARN"),
        (logging.ERROR, "ERROR"),
        (logging.CRITICAL, "ERROR"),
        (5, "DEBUG"),
        (25, "INFO"),
    ],
)
def test_levels_are_slogs_names(level: int, name: str) -> None:
    assert json.loads(JsonFormatter().format(_record(level, "x")))["level"] == name


def test_an_exception_goes_into_the_same_line() -> None:
    line = JsonFormatter().format(_record(logging.ERROR, "collector %s failed", "rdma", exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["exception"].startswith("Traceback") and "RuntimeError: the collector broke" in entry["exception"]


@pytest.mark.parametrize(
    "hostile", ["two\nlines", "nul\x00byte", "not utf-8 \udcff\udcfe", "\u2028sep", '"}{"', "é" * 3]
)
def test_what_a_tenant_wrote_stays_one_line_of_json(hostile: str) -> None:
    line = JsonFormatter().format(_record(logging.WARNING, "pod %s: %s", "ns/p", hostile))
    assert "\n" not in line and line.isascii()
    line.encode("utf-8")  # writable to any stream
    assert json.loads(line)["msg"] == f"pod ns/p: {hostile}"


def test_text_is_as_before_and_a_wrong_format_is_refused() -> None:
    line = formatter_for("text").format(_record(logging.WARNING, "x"))
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING exporter\.collectors\.rdma: x$", line)
    with pytest.raises(ValueError, match="logfmt"):
        formatter_for("logfmt")


@pytest.mark.parametrize("command", ["serve", "webhook"])
def test_both_commands_take_the_flag_and_its_variable(command: str) -> None:
    assert build_parser(environ={}).parse_args([command, "--log.format=json"]).log_format == "json"
    assert build_parser(environ={"CCL_EXPORTER_LOG_FORMAT": "json"}).parse_args([command]).log_format == "json"
    assert build_parser(environ={}).parse_args([command]).log_format == "text"
    with pytest.raises(SystemExit):
        build_parser(environ={}).parse_args([command, "--log.format=logfmt"])
    assert set(FORMATS) == {"text", "json"}


def _json_lines(output: str) -> list[dict[str, str]]:
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "something was logged"
    entries = [json.loads(line) for line in lines]  # every line is JSON
    for entry in entries:
        assert list(entry)[:5] == KEYS, entry
    return entries


def test_serve_logs_json(exporter_process: type[ExporterProcess]) -> None:
    process = exporter_process("--log.format=json", simulated=True)
    entries = _json_lines(process.stop())
    assert any(e["level"] == "INFO" and e["logger"].startswith("exporter") for e in entries)


def test_the_webhook_logs_json(tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("CCL_EXPORTER_LOG_FORMAT", "json")
    webhook = Webhook(tmp_path, pki)
    entries = _json_lines(webhook.stop())
    assert any("webhook listening on https://" in e["msg"] for e in entries)
