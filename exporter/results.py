"""The probe result file: a versioned JSON document, written atomically, read defensively.

Its own module, beside the probe and the reader, because both sides depend on it: the probe
(``exporter.probe``) writes it and the exporter's source (``exporter.sources.probe_results``)
reads it, and neither imports the other.

Writers: ``ccl-exporter probe`` (source ``job`` by default, ``scheduled`` when the exporter
runs it) and ``ccl-exporter preflight`` (source ``preflight``). They write into
``--path.probe-results``, a hostPath shared with the exporter's DaemonSet on the node, one file
per (source, namespace, pod): a newer run of the same pod replaces the older file.

Reader: ``exporter.sources.probe_results``. A file that is not valid JSON, has another schema,
or misses a field raises ``MalformedResult`` with the reason; it never crashes the reader.

Schema ``ccl-probe-result/v1`` (all sizes bytes, bandwidths bytes/s, times seconds)::

    {"schema": "ccl-probe-result/v1", "source": "scheduled" | "preflight" | "job",
     "started_at": <unix>, "finished_at": <unix>, "hostname": str,
     "namespace": str, "pod": str, "job_name": str,
     "backend": "nccl" | "gloo" | "", "world_size": int, "nnodes": int,
     "scope": "intra_node" | "inter_node" | "",
     "transport": {"kind": "rdma" | "tcp" | "intra_node" | "unknown", "name": str,
                   "network": str | null, "gdr": bool | "mixed" | null, "reasons": [str]},
     "collectives": [{"collective": str, "error": str | null,
                      "rows": [{"size_bytes", "count", "type", "time_seconds",
                                "algbw_bytes_per_second", "busbw_bytes_per_second", "wrong"}]}],
     "checks": [{"check": str, "ok": bool, "message": str}],
     "error": str | null}
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from exporter.atomic_write import write_atomically

SCHEMA = "ccl-probe-result/v1"
# The collectives a probe runs (nccl-tests names), and the most sizes one sweep may have: what a
# result may hold, and what ``exporter.probe.formulas`` accepts.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall")
MAX_SWEEP_POINTS = 64
SOURCES = ("scheduled", "preflight", "job")
TRANSPORT_KINDS = ("rdma", "tcp", "intra_node", "unknown")
SUFFIX = ".json"
MAX_FILE_BYTES = 1024 * 1024  # a result is a few KiB; anything larger is not ours
MAX_ROWS = MAX_SWEEP_POINTS  # sizes per collective
MAX_CHECKS = 32
MAX_TEXT = 2000

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class MalformedResult(ValueError):
    """A result file that cannot be used, with the reason."""


@dataclass(frozen=True)
class Row:
    size_bytes: int
    count: int
    type: str
    time_seconds: float
    algbw_bytes_per_second: float
    busbw_bytes_per_second: float
    wrong: int


@dataclass(frozen=True)
class CollectiveResult:
    collective: str
    rows: tuple[Row, ...] = ()
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None and bool(self.rows) and all(r.wrong == 0 for r in self.rows)

    @property
    def average_busbw(self) -> float | None:
        """nccl-tests' ``# Avg bus bandwidth``: the mean busbw over the sweep's sizes."""
        if not self.rows:
            return None
        return sum(r.busbw_bytes_per_second for r in self.rows) / len(self.rows)


@dataclass(frozen=True)
class Check:
    check: str
    ok: bool
    message: str


@dataclass(frozen=True)
class Transport:
    """What the probe's traffic actually ran on, from the backend and NCCL's own log."""

    kind: str  # rdma | tcp | intra_node | unknown
    name: str  # "gloo/tcp", "net_ib", "net_socket", "p2p/shm", ...
    network: str | None = None  # NCCL's "Using network X"
    gdr: bool | str | None = None
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeResult:
    source: str
    started_at: float
    finished_at: float
    hostname: str = ""
    namespace: str = ""
    pod: str = ""
    job_name: str = ""
    backend: str = ""
    world_size: int = 0
    nnodes: int = 0
    scope: str = ""
    transport: Transport = field(default_factory=lambda: Transport("unknown", "unknown"))
    collectives: tuple[CollectiveResult, ...] = ()
    checks: tuple[Check, ...] = ()
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None and all(c.success for c in self.collectives) and all(c.ok for c in self.checks)

    def to_json(self) -> str:
        document = {"schema": SCHEMA, **asdict(self)}
        return json.dumps(document, indent=1, sort_keys=True) + "\n"


def result_filename(result: ProbeResult) -> str:
    """``<source>[-<namespace>-<pod>].json``, safe as a file name."""
    parts = [result.source]
    if result.pod:
        parts += [result.namespace or "default", result.pod]
    elif result.source != "scheduled" and result.hostname:
        parts.append(result.hostname)
    return "-".join(_UNSAFE.sub("_", p)[:100] for p in parts) + SUFFIX


def write_result(folder: Path, result: ProbeResult) -> Path:
    """Write atomically (temp file in the same folder, fsync, rename): readers see all or nothing."""
    target = folder / result_filename(result)
    write_atomically(target, result.to_json().encode(), mode=0o644, suffix=SUFFIX)
    return target


def unwritten_reason(folder: Path, exc: OSError) -> str:
    """Why ``write_result`` failed, in one line that says what to do (for the writers' logs)."""
    uid = os.geteuid()
    if exc.errno == errno.EROFS:
        return f"{folder} is on a read-only filesystem in this container (mount the probe-results hostPath there)"
    if exc.errno in (errno.EEXIST, errno.ENOTDIR) and not folder.is_dir():
        return f"{folder} is not a folder"
    if exc.errno == errno.EPERM and exc.filename2 is not None:
        name = Path(exc.filename2).name
        return f"{name} in {folder} belongs to another user; the folder's sticky bit keeps UID {uid} from replacing it"
    if exc.errno in (errno.EACCES, errno.EPERM):
        try:
            info = os.stat(folder)
            found = f"owner UID {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"
        except OSError:
            found = "its owner and mode unreadable"
        return (
            f"{folder} is not writable by UID {uid} ({found}): the exporter's DaemonSet makes it mode 1777 "
            "(its prepare-results init container; is the exporter running on this node?)"
        )
    return f"cannot write into {folder}: {exc.strerror or exc}"


# ---- parsing ---------------------------------------------------------------------------------


def _get(obj: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise MalformedResult(f"{where}: missing {key!r}")
    value = obj[key]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise MalformedResult(f"{where}: {key!r} is a boolean")
    if not isinstance(value, kinds):
        raise MalformedResult(f"{where}: {key!r} has type {type(value).__name__}")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise MalformedResult(f"{where}: {key!r} is longer than {MAX_TEXT} characters")
    if isinstance(value, float) and value != value:
        raise MalformedResult(f"{where}: {key!r} is NaN")
    return value


_NUMBER = (int, float)
_OPT_STR = (str, type(None))


def _row(obj: Any, where: str) -> Row:
    if not isinstance(obj, dict):
        raise MalformedResult(f"{where}: not an object")
    row = Row(
        size_bytes=_get(obj, "size_bytes", int, where),
        count=_get(obj, "count", int, where),
        type=_get(obj, "type", str, where),
        time_seconds=float(_get(obj, "time_seconds", _NUMBER, where)),
        algbw_bytes_per_second=float(_get(obj, "algbw_bytes_per_second", _NUMBER, where)),
        busbw_bytes_per_second=float(_get(obj, "busbw_bytes_per_second", _NUMBER, where)),
        wrong=_get(obj, "wrong", int, where),
    )
    if row.size_bytes < 0 or row.time_seconds < 0 or row.busbw_bytes_per_second < 0 or row.wrong < 0:
        raise MalformedResult(f"{where}: negative value")
    return row


def _list(obj: dict[str, Any], key: str, where: str, limit: int = MAX_ROWS) -> list[Any]:
    value: list[Any] = _get(obj, key, list, where)
    if len(value) > limit:
        raise MalformedResult(f"{where}: {key!r} has more than {limit} entries")
    return value


def parse_result(text: str) -> ProbeResult:
    """A ``ProbeResult`` from a file's text; ``MalformedResult`` says what is wrong."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise MalformedResult(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedResult("not a JSON object")
    schema = doc.get("schema")
    if schema != SCHEMA:
        raise MalformedResult(f"schema {schema!r} is not {SCHEMA!r}")
    source = _get(doc, "source", str, "result")
    if source not in SOURCES:
        raise MalformedResult(f"source {source!r} is not one of {', '.join(SOURCES)}")
    t = _get(doc, "transport", dict, "result")
    kind = _get(t, "kind", str, "transport")
    if kind not in TRANSPORT_KINDS:
        raise MalformedResult(f"transport kind {kind!r} is not one of {', '.join(TRANSPORT_KINDS)}")
    gdr = t.get("gdr")
    if gdr not in (True, False, None, "mixed"):
        raise MalformedResult(f"transport gdr {gdr!r} is not true, false, 'mixed' or null")
    transport = Transport(
        kind=kind,
        name=_get(t, "name", str, "transport"),
        network=_get(t, "network", _OPT_STR, "transport"),
        gdr=gdr,
        reasons=tuple(str(r)[:MAX_TEXT] for r in _list(t, "reasons", "transport")),
    )
    collectives = []
    for i, c in enumerate(_list(doc, "collectives", "result", limit=len(COLLECTIVES))):
        where = f"collectives[{i}]"
        if not isinstance(c, dict):
            raise MalformedResult(f"{where}: not an object")
        name = _get(c, "collective", str, where)
        if name not in COLLECTIVES:
            raise MalformedResult(f"{where}: collective {name[:50]!r} is not one of {', '.join(COLLECTIVES)}")
        collectives.append(
            CollectiveResult(
                collective=name,
                rows=tuple(_row(r, f"{where}.rows[{j}]") for j, r in enumerate(_list(c, "rows", where))),
                error=_get(c, "error", _OPT_STR, where),
            )
        )
    checks = []
    for i, c in enumerate(_list(doc, "checks", "result", limit=MAX_CHECKS)):
        where = f"checks[{i}]"
        if not isinstance(c, dict):
            raise MalformedResult(f"{where}: not an object")
        name = _get(c, "check", str, where)
        if not name or len(name) > 64:
            raise MalformedResult(f"{where}: check name is empty or longer than 64 characters")
        checks.append(Check(name, _get(c, "ok", bool, where), _get(c, "message", str, where)))
    return ProbeResult(
        source=source,
        started_at=float(_get(doc, "started_at", _NUMBER, "result")),
        finished_at=float(_get(doc, "finished_at", _NUMBER, "result")),
        hostname=_get(doc, "hostname", str, "result"),
        namespace=_get(doc, "namespace", str, "result"),
        pod=_get(doc, "pod", str, "result"),
        job_name=_get(doc, "job_name", str, "result"),
        backend=_get(doc, "backend", str, "result"),
        world_size=_get(doc, "world_size", int, "result"),
        nnodes=_get(doc, "nnodes", int, "result"),
        scope=_get(doc, "scope", str, "result"),
        transport=transport,
        collectives=tuple(collectives),
        checks=tuple(checks),
        error=_get(doc, "error", _OPT_STR, "result"),
    )
