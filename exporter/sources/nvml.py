"""GPUs and NVLinks through NVML, via the real ``pynvml`` module (distribution nvidia-ml-py).

What is read, and how often:

- Once per GPU (discovery, repeated for a GPU whose read failed): index, UUID, name, PCI bus
  id, minor number (``/dev/nvidia<minor>``), NVLink count (``NVML_FI_DEV_NVLINK_LINK_COUNT``),
  and per active link the remote end (``nvmlDeviceGetNvLinkRemoteDeviceType`` +
  ``nvmlDeviceGetNvLinkRemotePciInfo_v2``). A link that comes up later has its remote end read
  when it does.
- Every scrape: ONE ``nvmlDeviceGetFieldValues`` call per GPU holding, for every link
  (scopeId = link): state, speed (MB/s), data TX/RX (KiB), and the replay, recovery and CRC
  flit error counters; the CRC data counter uses NVML's per-link field ids, which exist for
  links 0-11 only.

Each value carries its own ``nvmlReturn``: NOT_SUPPORTED (or INVALID_ARGUMENT, which older
drivers answer for field ids they do not know) leaves the value ``None`` and the series out,
never a zero. A GPU whose call fails (``GPU_IS_LOST`` included) is reported in
``NvmlReading.problems`` and left out; the other GPUs are read as usual. No NVML library on
the node raises ``NvmlUnavailable``; init is retried on the next read, because a GPU
operator may install the driver after the exporter started.

Every NVML call goes through ``PynvmlBackend._call``: one place that looks functions up by
name, decodes bytes, and logs a missing function once.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Protocol

log = logging.getLogger(__name__)

# Field ids from nvml.h (the same numbers nvidia-ml-py names NVML_FI_DEV_NVLINK_*).
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, scopeId = link
FI_NVLINK_THROUGHPUT_DATA_RX = 139  # KiB, scopeId = link
FI_NVLINK_ERROR_DL_REPLAY = 161  # scopeId = link
FI_NVLINK_ERROR_DL_RECOVERY = 162  # scopeId = link
FI_NVLINK_ERROR_DL_CRC = 163  # flow-control (flit) CRC errors, scopeId = link
FI_NVLINK_GET_SPEED = 164  # MB/s, scopeId = link
FI_NVLINK_GET_STATE = 165  # 0 inactive, 1 active, 2 sleep, 3 active with traffic disabled
# CRC data errors have one field id per link, and only for links 0-11.
FI_NVLINK_CRC_DATA_BY_LINK = (39, 40, 41, 42, 43, 44, 102, 103, 104, 105, 106, 107)

NVLINK_STATE_ACTIVE = 1
KIB = 1024
MEGABYTE = 1_000_000  # NVML's link speed is in MB/s (26562 for a 26.562 GB/s NVLink4 link)

# nvmlNvLinkDeviceType_t → the remote_type label value
REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "nvswitch", 0xFF: "unknown"}
ERROR_KINDS = ("crc_flit", "crc_data", "replay", "recovery")

# nvmlReturn_t values the layer tells apart.
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_GPU_IS_LOST = 15
UNSUPPORTED_RETURNS = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT})
# After nvmlInit fails (no driver, library not mounted), the next try waits this long: a driver
# installed after the exporter started is found within it, and a node without one does not look
# for the library on every scrape of every collector that asks for GPUs.
INIT_RETRY_SECONDS = 30.0


class NvmlUnavailable(Exception):
    """No usable NVML on this node: no library, no driver, or a driver/library mismatch."""


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    # The /dev/nvidia<minor> number (nvmlDeviceGetMinorNumber): how NVIDIA's DRA driver names a GPU
    # ("gpu-<minor>"); None when NVML cannot say.
    minor: int | None = None


@dataclass(frozen=True)
class NvLinkRemote:
    kind: str  # gpu, nvswitch, ibmnpu, unknown
    pci_bus_id: str


@dataclass(frozen=True)
class NvLinkReading:
    link: int
    active: bool | None = None
    speed_bytes_per_second: int | None = None
    transmit_bytes: int | None = None
    receive_bytes: int | None = None
    errors: dict[str, int] = field(default_factory=dict)  # ERROR_KINDS that were readable
    remote: NvLinkRemote | None = None


@dataclass(frozen=True)
class GpuReading:
    gpu: GpuIdentity
    links: tuple[NvLinkReading, ...]


@dataclass
class NvmlReading:
    gpus: list[GpuReading] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None


class NvmlBackend(Protocol):
    """Where GPU facts come from: real NVML (``PynvmlBackend``) or another backend the node supplies."""

    def read(self) -> NvmlReading:
        """Every GPU with its links; raises ``NvmlUnavailable``."""
        ...

    def gpus(self) -> list[GpuIdentity]:
        """The GPUs found at discovery (no per-call NVML cost); raises ``NvmlUnavailable``."""
        ...

    def compute_processes(self) -> dict[str, list[GpuProcess]]:
        """GPU UUID → compute processes on it; raises ``NvmlUnavailable``."""
        ...

    def close(self) -> None: ...


# --- field requests and decoding (pure) -------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    link: int
    what: str  # state, speed, tx, rx, or an ERROR_KINDS entry


def field_request(link_count: int) -> tuple[list[tuple[int, int]], list[_Slot]]:
    """The (fieldId, scopeId) pairs of one scrape of a GPU, and what each one means."""
    pairs: list[tuple[int, int]] = []
    slots: list[_Slot] = []

    def add(field_id: int, scope: int, link: int, what: str) -> None:
        pairs.append((field_id, scope))
        slots.append(_Slot(link, what))

    for link in range(link_count):
        add(FI_NVLINK_GET_STATE, link, link, "state")
        add(FI_NVLINK_GET_SPEED, link, link, "speed")
        add(FI_NVLINK_THROUGHPUT_DATA_TX, link, link, "tx")
        add(FI_NVLINK_THROUGHPUT_DATA_RX, link, link, "rx")
        add(FI_NVLINK_ERROR_DL_CRC, link, link, "crc_flit")
        if link < len(FI_NVLINK_CRC_DATA_BY_LINK):
            add(FI_NVLINK_CRC_DATA_BY_LINK[link], 0, link, "crc_data")
        add(FI_NVLINK_ERROR_DL_REPLAY, link, link, "replay")
        add(FI_NVLINK_ERROR_DL_RECOVERY, link, link, "recovery")
    return pairs, slots


# nvmlFieldValue_t as nvml.h lays it out: fieldId, scopeId (u32), timestamp, latencyUsec (i64),
# valueType, nvmlReturn (u32), then the 8-byte value union. Decoding the array's raw bytes is
# much faster than pynvml's per-attribute structure access (see bench/nvml_scrape.py).
_FIELD_VALUE = struct.Struct("=IIqqII8s")
# nvmlValueType_t → how the union holds it (double, uint, ulong, ulonglong, longlong, int, ushort)
_UNION_FORMATS = {t: struct.Struct("=" + f) for t, f in enumerate("dIQQqiH")}

# One decoded value: (nvmlReturn, number or None)
Decoded = tuple[int, "int | float | None"]


def _decode_union(value_type: int, raw: bytes) -> int | float | None:
    union = _UNION_FORMATS.get(value_type)
    return None if union is None else union.unpack_from(raw)[0]


def decode_field_values(values: Any) -> list[Decoded]:
    """(nvmlReturn, value) per entry of a ``c_nvmlFieldValue_t`` array; value None unless SUCCESS."""
    if len(values) == 0:
        return []
    if ctypes.sizeof(values[0]) != _FIELD_VALUE.size:  # a binding with another layout: go slow
        return [_decode_slow(v) for v in values]
    return [
        (ret, _decode_union(value_type, raw) if ret == NVML_SUCCESS else None)
        for _fid, _scope, _ts, _lat, value_type, ret, raw in _FIELD_VALUE.iter_unpack(
            bytes(memoryview(values).cast("B"))
        )
    ]


_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _decode_slow(value: Any) -> Decoded:
    ret = int(value.nvmlReturn)
    member = _VALUE_MEMBERS.get(int(value.valueType))
    if ret != NVML_SUCCESS or member is None:
        return ret, None
    return ret, getattr(value.value, member)


def _as_int(value: int | float | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, float):
        if value != value or value < 0:  # NaN or negative: not a counter
            return None
        return int(value)
    return int(value) if value >= 0 else None


def links_from_values(
    link_count: int,
    slots: Sequence[_Slot],
    values: Sequence[Decoded],
    remotes: dict[int, NvLinkRemote | None] | None = None,
) -> tuple[list[NvLinkReading], list[str]]:
    """Turn one field-values answer into link readings; also return odd per-value errors."""
    per_link: dict[int, dict[str, int]] = {link: {} for link in range(link_count)}
    odd: list[str] = []
    for slot, (ret, value) in zip(slots, values, strict=False):
        if ret != NVML_SUCCESS:
            if ret not in UNSUPPORTED_RETURNS:
                odd.append(f"link {slot.link} {slot.what}: nvmlReturn {ret}")
            continue
        number = _as_int(value)
        if number is not None:
            per_link[slot.link][slot.what] = number
    links = []
    for link in range(link_count):
        got = per_link[link]
        state = got.get("state")
        links.append(
            NvLinkReading(
                link=link,
                active=None if state is None else state == NVLINK_STATE_ACTIVE,
                speed_bytes_per_second=None if "speed" not in got else got["speed"] * MEGABYTE,
                transmit_bytes=None if "tx" not in got else got["tx"] * KIB,
                receive_bytes=None if "rx" not in got else got["rx"] * KIB,
                errors={kind: got[kind] for kind in ERROR_KINDS if kind in got},
                remote=(remotes or {}).get(link),
            )
        )
    return links, odd


# --- the pynvml backend -------------------------------------------------------------------


@dataclass
class _Gpu:
    identity: GpuIdentity
    handle: Any
    link_count: int
    pairs: list[tuple[int, int]]
    slots: list[_Slot]
    # link → its remote end (None: NVML could not say); dropped when the link goes down
    remotes: dict[int, NvLinkRemote | None] = field(default_factory=dict)
    failed: bool = False


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class PynvmlBackend:
    """NVML through nvidia-ml-py: lazy locked init, cached discovery, one batch per GPU."""

    def __init__(self, module: ModuleType | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._module = module
        self._clock = clock
        self._lock = threading.RLock()
        self._initialized = False
        self._init_failure: tuple[str, float] | None = None  # (why, when) of the last failed nvmlInit
        self._gpus: list[_Gpu] | None = None
        self._missing_functions: set[str] = set()

    # The one choke point for NVML calls.
    def _nvml(self) -> ModuleType:
        if self._module is None:
            try:
                import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information
            except ImportError as exc:  # the dependency itself missing: same as no NVML
                raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {exc}") from exc
            self._module = pynvml
        return self._module

    def _call(self, name: str, *args: Any) -> Any:
        nvml = self._nvml()
        function: Callable[..., Any] | None = getattr(nvml, name, None)
        if function is None:
            raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        try:
            result = function(*args)
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_FUNCTION_NOT_FOUND and name not in self._missing_functions:
                self._missing_functions.add(name)
                log.info("NVML has no %s (driver older than this binding?)", name)
            raise
        return _text(result) if isinstance(result, bytes) else result

    def _ensure_init(self) -> None:
        if self._initialized:
            return
        now = self._clock()
        if self._init_failure is not None and now - self._init_failure[1] < INIT_RETRY_SECONDS:
            raise NvmlUnavailable(self._init_failure[0])
        nvml = self._nvml()
        try:
            self._call("nvmlInit")
        except nvml.NVMLError as exc:
            self._init_failure = (_explain_init_failure(nvml, exc), now)
            raise NvmlUnavailable(self._init_failure[0]) from exc
        except OSError as exc:  # a library that exists but does not load
            self._init_failure = (f"libnvidia-ml.so.1 did not load: {exc}", now)
            raise NvmlUnavailable(self._init_failure[0]) from exc
        self._init_failure = None
        self._initialized = True

    # Discovery.
    def _discover(self) -> list[_Gpu]:
        nvml = self._nvml()
        count = int(self._call("nvmlDeviceGetCount"))
        found = []
        for index in range(count):
            try:
                found.append(self._identify(index))
            except nvml.NVMLError as exc:
                log.warning("GPU %d: not identified: %s", index, exc)
                found.append(_unidentified(index))
        return found

    def _identify(self, index: int) -> _Gpu:
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        identity = GpuIdentity(
            index=index,
            uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
            name=_text(self._call("nvmlDeviceGetName", handle)),
            pci_bus_id=_text(pci.busId),
            minor=self._minor(handle),
        )
        link_count = self._link_count(handle)
        pairs, slots = field_request(link_count)
        return _Gpu(identity, handle, link_count, pairs, slots)

    def _minor(self, handle: Any) -> int | None:
        try:
            return int(self._call("nvmlDeviceGetMinorNumber", handle))
        except self._nvml().NVMLError:
            return None

    def _link_count(self, handle: Any) -> int:
        nvml = self._nvml()
        ((_, value),) = decode_field_values(self._call("nvmlDeviceGetFieldValues", handle, [FI_NVLINK_LINK_COUNT]))
        count = _as_int(value)
        if count is not None:
            return min(count, int(nvml.NVML_NVLINK_MAX_LINKS))
        # Older drivers: probe link states until NVML says the link does not exist.
        count = 0
        for link in range(int(nvml.NVML_NVLINK_MAX_LINKS)):
            try:
                self._call("nvmlDeviceGetNvLinkState", handle, link)
            except nvml.NVMLError:
                break
            count = link + 1
        return count

    def _remote(self, gpu: _Gpu, link: int) -> NvLinkRemote | None:
        nvml = self._nvml()
        try:
            kind = int(self._call("nvmlDeviceGetNvLinkRemoteDeviceType", gpu.handle, link))
        except nvml.NVMLError:
            kind = 0xFF
        try:
            pci = self._call("nvmlDeviceGetNvLinkRemotePciInfo", gpu.handle, link)
        except nvml.NVMLError:
            return None
        return NvLinkRemote(kind=REMOTE_TYPES.get(kind, "unknown"), pci_bus_id=_text(pci.busId))

    def _gpus_locked(self) -> list[_Gpu]:
        self._ensure_init()
        if self._gpus is None:
            self._gpus = self._discover()
        return self._gpus

    # The backend protocol.
    def gpus(self) -> list[GpuIdentity]:
        with self._lock:
            return [gpu.identity for gpu in self._gpus_locked() if gpu.handle is not None]

    def read(self) -> NvmlReading:
        with self._lock:
            gpus = self._gpus_locked()
            reading = NvmlReading()
            for position, gpu in enumerate(gpus):
                if gpu.failed:  # read failed last time: identify it afresh (a reset GPU, new handle)
                    try:
                        gpu = gpus[position] = self._identify(gpu.identity.index)
                    except self._nvml().NVMLError as exc:
                        reading.problems.append(f"GPU {gpu.identity.index} ({gpu.identity.uuid}): {exc}")
                        continue
                result = self._read_gpu(gpu, reading.problems)
                if result is not None:
                    reading.gpus.append(result)
            return reading

    def _read_gpu(self, gpu: _Gpu, problems: list[str]) -> GpuReading | None:
        nvml = self._nvml()
        label = f"GPU {gpu.identity.index} ({gpu.identity.uuid})"
        try:
            values = (
                decode_field_values(self._call("nvmlDeviceGetFieldValues", gpu.handle, gpu.pairs)) if gpu.pairs else []
            )
        except nvml.NVMLError as exc:
            gpu.failed = True
            problems.append(f"{label}: {exc}")
            return None
        if any(ret == NVML_ERROR_GPU_IS_LOST for ret, _ in values):
            gpu.failed = True
            problems.append(f"{label}: GPU is lost")
            return None
        gpu.failed = False
        links, odd = links_from_values(gpu.link_count, gpu.slots, values, gpu.remotes)
        if odd:
            problems.append(f"{label}: " + "; ".join(odd[:3]))
        links = self._fill_missing_state(gpu, links)
        # The remote end of a link is read once when the link is (or comes) up.
        changed = False
        for reading in links:
            if reading.active and reading.link not in gpu.remotes:
                gpu.remotes[reading.link] = self._remote(gpu, reading.link)
                changed = True
            elif reading.active is False and reading.link in gpu.remotes:
                del gpu.remotes[reading.link]
                changed = True
        if changed:
            links = [_with_remote(r, gpu.remotes) for r in links]
        return GpuReading(gpu.identity, tuple(links))

    def _fill_missing_state(self, gpu: _Gpu, links: list[NvLinkReading]) -> list[NvLinkReading]:
        """Drivers without the per-link state field: ask nvmlDeviceGetNvLinkState instead."""
        nvml = self._nvml()
        out = []
        for reading in links:
            if reading.active is None:
                try:
                    active = int(self._call("nvmlDeviceGetNvLinkState", gpu.handle, reading.link)) == 1
                except nvml.NVMLError:
                    active = None
                reading = replace(reading, active=active)
            out.append(reading)
        return out

    def compute_processes(self) -> dict[str, list[GpuProcess]]:
        nvml = self._nvml()
        with self._lock:
            result: dict[str, list[GpuProcess]] = {}
            for gpu in self._gpus_locked():
                if gpu.handle is None:
                    continue
                try:
                    processes = self._processes(gpu.handle)
                except nvml.NVMLError as exc:
                    log.warning("GPU %d: compute processes not readable: %s", gpu.identity.index, exc)
                    continue
                result[gpu.identity.uuid] = processes
            return result

    def _processes(self, handle: Any) -> list[GpuProcess]:
        """Newest versioned call first: ``_v3``, then ``_v2`` on drivers that lack it."""
        nvml = self._nvml()
        raw: list[Any] | None = None
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            try:
                raw = self._call(name, handle)
                break
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
        if raw is None:
            raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return [GpuProcess(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory) for p in raw]

    def close(self) -> None:
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            self._gpus = None
            try:
                self._call("nvmlShutdown")
            except Exception as exc:  # noqa: BLE001 - shutting down; say it and go on
                log.warning("nvmlShutdown failed: %s", exc)


def _unidentified(index: int) -> _Gpu:
    return _Gpu(GpuIdentity(index, "", "", ""), None, 0, [], [], failed=True)


def _with_remote(reading: NvLinkReading, remotes: dict[int, NvLinkRemote | None]) -> NvLinkReading:
    remote = remotes.get(reading.link)
    return reading if remote == reading.remote else replace(reading, remote=remote)


def _explain_init_failure(nvml: ModuleType, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    if value == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None):
        return (
            "libnvidia-ml.so.1 not found: no NVIDIA driver on this node, or the container lacks "
            "NVIDIA_VISIBLE_DEVICES=all / NVIDIA_DRIVER_CAPABILITIES=utility"
        )
    if value == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", None):
        return "the NVIDIA kernel driver is not loaded"
    if value == getattr(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", None):
        return "driver/library version mismatch: the driver was upgraded but its kernel module not reloaded"
    if value == getattr(nvml, "NVML_ERROR_NO_PERMISSION", None):
        return "no permission to open the NVIDIA device files"
    return f"nvmlInit failed: {exc}"


# --- helpers for other parts of the exporter ---------------------------------------------


def busy_gpus(backend: NvmlBackend) -> dict[str, list[GpuProcess]] | None:
    """GPU UUID → compute processes, for GPUs that run at least one; None without NVML.

    The probe scheduler's "are the GPUs idle" question: an empty dict means every GPU on
    the node is idle.
    """
    try:
        processes = backend.compute_processes()
    except NvmlUnavailable:
        return None
    return {uuid: procs for uuid, procs in processes.items() if procs}
