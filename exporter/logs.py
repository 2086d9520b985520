"""How ``serve`` and ``webhook`` write their log: ``--log.level`` and ``--log.format``.

``text`` (the default): ``<time> <LEVEL> <logger>: <message>``, one line per record.

``json``: one JSON object per line with the keys of exporter-toolkit's JSON log (promslog, Go's
``log/slog``), so that a log pipeline parses this exporter as it parses node_exporter:
``time`` (RFC 3339, UTC, milliseconds), ``level`` (``DEBUG``, ``INFO``, ``WARN``, ``ERROR``),
``source`` (``file.py:line``), ``msg``; and ``logger`` (the Python logger, e.g.
``exporter.collectors.rdma``), ``exception`` (the traceback) where there is one. Every character
outside ASCII is escaped, so a message carrying what a tenant wrote (a pod name, an NCCL line,
bytes that are not UTF-8) stays one line of valid JSON.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

from exporter.flags import Flag

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMAT = Flag(
    "--log.format",
    "text",
    "text (time level logger: message) or json (one object per line: time, level, source, msg, logger)",
    dest="log_format",
    choices=FORMATS,
)
# slog's level names, each from the Python level up (CRITICAL has none of its own there).
_LEVELS = ((logging.ERROR, "ERROR"), (logging.WARNING, "WARN"), (logging.INFO, "INFO"))


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (see the module's docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
        entry = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": _level_name(record.levelno),
            "source": f"{record.filename}:{record.lineno}",
            "msg": record.getMessage(),
            "logger": record.name,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=True, separators=(",", ":"))


def _level_name(levelno: int) -> str:
    for threshold, name in _LEVELS:
        if levelno >= threshold:
            return name
    return "DEBUG"


def formatter_for(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"--log.format: {log_format!r} is not one of {', '.join(FORMATS)}")


def configure_logging(level: str, log_format: str) -> None:
    """The root logger at ``level``, writing to stderr in ``log_format`` (as ``logging.basicConfig``:
    nothing changes where the root logger has a handler already)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_for(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler])
