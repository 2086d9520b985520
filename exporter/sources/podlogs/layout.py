"""Where pod logs and NCCL debug files live, and which pod a folder speaks for.

Pod logs: ``<root>/<namespace>_<pod>_<uid>/<container>/<n>.log`` (``n`` the container's
restart count) and its rotations ``<n>.log.<timestamp>[.gz]``. NCCL debug files:
``<root>/<namespace>_<pod>_<uid>/<any file, up to 2 folders deep>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SOURCE_POD_LOG = "pod_log"
SOURCE_DEBUG_FILE = "nccl_debug_file"
SOURCES = (SOURCE_POD_LOG, SOURCE_DEBUG_FILE)  # the order in which each poll serves them

# (namespace, pod, uid or "") → True: a pod of this node (with that UID when one is given);
# False: the node's pod list is complete and has no such pod (or another UID); None: no
# complete pod list, nothing can be told.
PodKnown = Callable[[str, str, str], "bool | None"]


@dataclass(frozen=True, order=True)
class StreamKey:
    """One log stream: a container run's CRI log, or one NCCL debug file."""

    source: str  # SOURCE_POD_LOG | SOURCE_DEBUG_FILE
    namespace: str
    pod: str
    pod_uid: str  # the pod's UID, from its folder's name
    container: str  # "" for debug files
    name: str  # restart count for pod logs ("0"), path below the pod folder for debug files

    @property
    def generation(self) -> int:
        """The container restart count of a pod-log stream (0 for debug files)."""
        return int(self.name) if self.source == SOURCE_POD_LOG and self.name.isdigit() else 0

    def text(self) -> str:
        """The stream's name in the saved state file."""
        return "/".join((self.source, self.namespace, self.pod, self.pod_uid, self.container, self.name))


def parse_pod_folder(name: str) -> tuple[str, str, str] | None:
    """``<namespace>_<pod>_<uid>`` → (namespace, pod, uid). Neither name may contain ``_``."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def parse_debug_folder(name: str) -> tuple[str, str, str] | None:
    """The NCCL debug-file folder: ``<namespace>_<pod>_<uid>`` → (namespace, pod, uid), the form
    a ``subPathExpr`` from the downward API gives, which binds the folder to one pod object.
    ``<namespace>_<pod>`` → (namespace, pod, ""): parsed so that the scanner can count it
    (``pod_uid_missing``); a folder without a UID speaks for no pod."""
    parts = name.split("_")
    if len(parts) not in (2, 3) or not all(parts):
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def pod_log_generation(file_name: str) -> tuple[str, str] | None:
    """``3.log`` → ("3", ""), ``3.log.20260101-120000`` → ("3", "20260101-120000").

    Compressed rotations (``.gz``, see ``pod_log_compressed_generation``), kubelet's
    ``.tmp`` files and anything else → None.
    """
    head, sep, rest = file_name.partition(".log")
    if not sep or not head.isdigit():
        return None
    if rest == "":
        return head, ""
    stamp = rest[1:]
    if rest.startswith(".") and stamp and all(ch.isdigit() or ch == "-" for ch in stamp):
        return head, stamp
    return None


def pod_log_compressed_generation(file_name: str) -> tuple[str, str] | None:
    """``3.log.20260101-120000.gz`` → ("3", "20260101-120000"); anything else → None."""
    if not file_name.endswith(".gz"):
        return None
    parsed = pod_log_generation(file_name[: -len(".gz")])
    return parsed if parsed is not None and parsed[1] else None


def pod_known_on_node(pods: Any) -> PodKnown:
    """The ``pod_known`` predicate from the node's pod list: any object with
    ``lookup(namespace, pod)`` → a record with ``uid``, or None, and ``is_authoritative()``
    (``exporter.sources.kube.PodMetadataSource``). Answers None while the list is not
    complete (no API access, not synced yet): what to do then is the caller's to say (pod logs
    are read as named, tenant-written folders and result files wait)."""

    def pod_known(namespace: str, pod: str, uid: str = "") -> bool | None:
        if not pods.is_authoritative():
            return None
        record = pods.lookup(namespace, pod)
        if record is None:
            return False
        listed_uid = getattr(record, "uid", "") or ""
        return not uid or not listed_uid or uid == listed_uid

    return pod_known


def is_pod_folder_name(name: str) -> bool:
    return parse_pod_folder(name) is not None


def is_debug_folder_name(name: str) -> bool:
    return parse_debug_folder(name) is not None


def is_pod_log_name(name: str) -> bool:
    return pod_log_generation(name) is not None or pod_log_compressed_generation(name) is not None


def is_debug_file_name(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(".gz")
