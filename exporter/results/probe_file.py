"""The probe result file: a versioned JSON document, written atomically, read defensively.

Its own module, beside the probe and the reader, because both sides depend on it: the probe
(``exporter.probe``) writes it and the exporter's source (``exporter.sources.probe_results``)
reads it, and neither imports the other.

Writers: ``ccl-exporter probe`` (source ``job`` by default, ``scheduled`` when the exporter
runs it) and ``ccl-exporter preflight`` (source ``preflight``). They write into
``--path.probe-results``, a hostPath shared with the exporter's DaemonSet on the node, one file
per (source, namespace, pod, pod UID): ``<source>-<namespace>-<pod>-<pod uid>.json``, so a newer
run of the same pod object replaces the older file and no other pod's run ever does. The pod's
identity comes from the downward API (``CCL_POD_NAMESPACE``, ``CCL_POD_NAME``, ``CCL_POD_UID``;
see ``exporter.probe.runner.Identity``); the reader uses a pod's result only when its UID is that
pod's on this node and the file has the name its content gives (``exporter.sources.probe_results``).

Reader: ``exporter.sources.probe_results``. A file that is not valid JSON, has another schema,
misses a field or holds a number no result can have (not finite, beyond a float, negative)
raises ``MalformedResult`` with the reason; nothing else escapes the parser.

Schema ``ccl-probe-result/v1`` (all sizes bytes, bandwidths bytes/s, times seconds)::

    {"schema": "ccl-probe-result/v1", "source": "scheduled" | "preflight" | "job",
     "started_at": <unix>, "finished_at": <unix>, "hostname": str,
     "namespace": str, "pod": str, "pod_uid": str (optional, "" when absent), "job_name": str,
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
import math
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
MAX_UID_CHARS = 128  # a Kubernetes UID is 36; a static pod's config hash 32
MAX_INTEGER = 2**63 - 1  # sizes, counts and ranks: what int64 holds

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
    pod_uid: str = ""  # metadata.uid of the pod that ran it (downward API); "" for node-wide results
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
    """``<source>[-<namespace>-<pod>[-<pod uid>]].json``, safe as a file name: one name per pod
    object, so the runs of two pods (even two of the same name) never replace each other's file."""
    parts = [result.source]
    if result.pod:
        parts += [result.namespace or "default", result.pod]
        if result.pod_uid:
            parts.append(result.pod_uid)
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


def _float(obj: dict[str, Any], key: str, where: str) -> float:
    """A finite number (JSON allows integers no float holds, and writers may put NaN or Infinity)."""
    value = _get(obj, key, _NUMBER, where)
    try:
        number = float(value)
    except OverflowError:
        raise MalformedResult(f"{where}: {key!r} is beyond a float") from None
    if not math.isfinite(number):
        raise MalformedResult(f"{where}: {key!r} is not finite")
    return number


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    """An integer of 0 to ``MAX_INTEGER``."""
    value: int = _get(obj, key, int, where)
    if not 0 <= value <= MAX_INTEGER:
        raise MalformedResult(f"{where}: {key!r} is out of range")
    return value


def _row(obj: Any, where: str) -> Row:
    if not isinstance(obj, dict):
        raise MalformedResult(f"{where}: not an object")
    row = Row(
        size_bytes=_count(obj, "size_bytes", where),
        count=_count(obj, "count", where),
        type=_get(obj, "type", str, where),
        time_seconds=_float(obj, "time_seconds", where),
        algbw_bytes_per_second=_float(obj, "algbw_bytes_per_second", where),
        busbw_bytes_per_second=_float(obj, "busbw_bytes_per_second", where),
        wrong=_count(obj, "wrong", where),
    )
    if row.time_seconds < 0 or row.busbw_bytes_per_second < 0:
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
    pod_uid = _get(doc, "pod_uid", str, "result") if "pod_uid" in doc else ""  # older writers had none
    if len(pod_uid) > MAX_UID_CHARS:
        raise MalformedResult(f"result: 'pod_uid' is longer than {MAX_UID_CHARS} characters")
    return ProbeResult(
        source=source,
        started_at=_float(doc, "started_at", "result"),
        finished_at=_float(doc, "finished_at", "result"),
        hostname=_get(doc, "hostname", str, "result"),
        namespace=_get(doc, "namespace", str, "result"),
        pod=_get(doc, "pod", str, "result"),
        pod_uid=pod_uid,
        job_name=_get(doc, "job_name", str, "result"),
        backend=_get(doc, "backend", str, "result"),
        world_size=_count(doc, "world_size", "result"),
        nnodes=_count(doc, "nnodes", "result"),
        scope=_get(doc, "scope", str, "result"),
        transport=transport,
        collectives=tuple(collectives),
        checks=tuple(checks),
        error=_get(doc, "error", _OPT_STR, "result"),
    )
