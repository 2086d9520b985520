"""``ccl-exporter preflight``: is this pod's fabric what an RDMA training job needs?

Run as an init container of every training pod. Each check prints one line (``FAIL`` lines
name what is wrong and what was expected); the exit code is 1 when any check failed, so the
pod stays in ``Init:Error`` instead of training for days on TCP. The node's exporter serves the
result as ``ccl_preflight_result{check}`` for that pod and sets the pod's readiness condition
from it. It reaches the exporter two ways:

* the container's termination message (``--path.termination-message``, the kubelet's
  ``/dev/termination-log``; ``exporter.results.preflight_message``): no volume at all, and the pod it
  speaks for is the one whose status holds it;
* a result file in ``--path.probe-results`` (unless ``--no-write``; source ``preflight``, with
  the pod's namespace, name and UID from the downward API: ``CCL_POD_NAMESPACE``,
  ``CCL_POD_NAME``, ``CCL_POD_UID``, which the admission webhook sets, or ``POD_NAMESPACE``,
  ``POD_NAME``, ``POD_UID``; and ``JOB_NAME``), a hostPath the exporter reads (the UID must be the
  pod's on the node).

Checks (``--skip NAME`` drops one):

* ``rdma_devices``: ``<sysfs>/class/infiniband`` lists the expected devices;
* ``uverbs_devices``: ``<dev>/infiniband/uverbs*`` exist in the container (else verbs cannot open);
* ``port_state``, ``port_rate``, ``port_link_layer``: expected ports ACTIVE / LinkUp, at
  ``--expect-rate`` Gb/s or more, with ``--expect-link-layer``;
* ``gpudirect_rdma``: ``nvidia_peermem`` (or the older ``nv_peer_mem``) is loaded;
* ``nccl_env``: the environment does not force NCCL onto sockets (``NCCL_IB_DISABLE``,
  ``NCCL_NET=Socket``, ``NCCL_IB_HCA`` naming no device here, ``NCCL_SOCKET_IFNAME`` on a
  loopback/container bridge, ``NCCL_NET_GDR_LEVEL`` disabling GPUDirect);
* with ``--probe``: ``probe`` (the gang-wide probe ran with correct data), ``probe_transport``
  (``--require-transport``) and ``probe_bandwidth`` (``--min-busbw``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from exporter.commands.probe import add_probe_arguments, describe_transport, request_from_args
from exporter.flags import PROBE_RESULTS, SYSFS, Flag, Switch
from exporter.probe.runner import Identity, run_probe
from exporter.results.preflight_message import DEFAULT_TERMINATION_MESSAGE_PATH, render_report
from exporter.results.probe_file import Check, ProbeResult, Transport, unwritten_reason, write_result
from exporter.sources.rdma import RdmaPort, RdmaReading, read_rdma

ACTIVE, LINK_UP = 4, 5
HOST_CHECKS = (
    "rdma_devices",
    "uverbs_devices",
    "port_state",
    "port_rate",
    "port_link_layer",
    "gpudirect_rdma",
    "nccl_env",
)
PROBE_CHECKS = ("probe", "probe_transport", "probe_bandwidth")
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
# Interfaces other nodes cannot reach: NCCL bootstrap (and socket traffic) on them breaks multi-node.
LOCAL_ONLY_IFACES = ("lo", "docker", "virbr", "veth", "cni", "flannel.", "kube-bridge")
GBIT = 125_000_000  # bytes/s per Gb/s
GB = 1e9

DEV = Flag("--path.dev", "/dev", "devtmpfs mount point", dest="dev")
FABRIC_FLAGS = (
    Flag(
        "--expect-ports", "", "comma-separated DEVICE or DEVICE:PORT (default: every port present)", dest="expect_ports"
    ),
    Flag("--expect-rate", "", "minimum port rate in Gb/s, e.g. 400", dest="expect_rate"),
    Flag(
        "--expect-link-layer",
        "",
        "InfiniBand or Ethernet (RoCE)",
        dest="expect_link_layer",
        choices=("", "InfiniBand", "Ethernet"),
    ),
)
TERMINATION_MESSAGE = Flag(
    "--path.termination-message",
    DEFAULT_TERMINATION_MESSAGE_PATH,
    "file the result goes to as the container's termination message, for the exporter on the node "
    "(the container's terminationMessagePath; written only when it exists); empty: none",
    dest="termination_message",
)
ALLOW_UNKNOWN_TRANSPORT = Switch(
    "--allow-unknown-transport",
    "pass --require-transport when NCCL's log cannot tell the transport (by default preflight fails closed)",
    dest="allow_unknown_transport",
    lenient_env=True,
)


@dataclass(frozen=True)
class PortSpec:
    device: str
    port: int | None  # None: every port of the device

    @classmethod
    def parse(cls, text: str) -> PortSpec:
        device, sep, port = text.strip().partition(":")
        if not device or (sep and not port.isdigit()):
            raise ValueError(f"port {text!r} is not DEVICE or DEVICE:PORT (e.g. mlx5_0:1)")
        return cls(device, int(port) if sep else None)

    def __str__(self) -> str:
        return self.device if self.port is None else f"{self.device}:{self.port}"


def parse_rate_gbps(text: str) -> float:
    """``"400"``, ``"400G"``, ``"400Gb/s"`` → 400.0 (Gb/s, as sysfs ``rate`` and NHC's check_hw_ib)."""
    cleaned = text.strip().lower().removesuffix("/sec").removesuffix("/s").removesuffix("gb").removesuffix("g")
    try:
        value = float(cleaned)
    except ValueError:
        raise ValueError(f"rate {text!r} is not a number of Gb/s (e.g. 400 or 400G)") from None
    if value <= 0:
        raise ValueError(f"rate {text!r} must be positive")
    return value


def _ok(name: str, message: str) -> Check:
    return Check(name, True, message)


def _fail(name: str, message: str) -> Check:
    return Check(name, False, message)


def check_rdma_devices(reading: RdmaReading, sysfs: Path, expected: Sequence[PortSpec]) -> Check:
    names = [d.name for d in reading.devices]
    if not reading.class_present or not names:
        return _fail(
            "rdma_devices",
            f"no RDMA devices in {sysfs}/class/infiniband: the container sees no "
            "InfiniBand/RoCE/EFA device (host driver, device plugin or network attachment missing)",
        )
    missing = sorted({p.device for p in expected} - set(names))
    if missing:
        return _fail("rdma_devices", f"expected device(s) {', '.join(missing)} not present; have {', '.join(names)}")
    return _ok("rdma_devices", f"{len(names)} RDMA device(s): {', '.join(names)}")


def check_uverbs(dev: Path, needed: int) -> Check:
    try:
        found = sorted(n for n in os.listdir(dev / "infiniband") if n.startswith("uverbs"))
    except OSError:
        found = []
    if not found:
        return _fail(
            "uverbs_devices",
            f"no {dev}/infiniband/uverbs* in the container: verbs cannot open the "
            "RDMA devices, NCCL will fall back to sockets (request the RDMA device-plugin resource)",
        )
    if len(found) < needed:
        return _fail(
            "uverbs_devices", f"{len(found)} uverbs device(s) for {needed} expected RDMA devices: {', '.join(found)}"
        )
    return _ok("uverbs_devices", f"{len(found)} uverbs device(s): {', '.join(found)}")


def select_ports(reading: RdmaReading, expected: Sequence[PortSpec]) -> tuple[list[RdmaPort], list[str]]:
    """The ports to check (all when none are expected) and the expected ones that are missing."""
    ports = reading.ports()
    if not expected:
        return ports, []
    chosen: list[RdmaPort] = []
    missing: list[str] = []
    for spec in expected:
        matched = [p for p in ports if p.device == spec.device and spec.port in (None, p.port)]
        if not matched:
            missing.append(str(spec))
        chosen.extend(p for p in matched if p not in chosen)
    return chosen, missing


def _state_text(port: RdmaPort) -> str:
    state = port.state or port.state_id or "unreadable"
    physical = port.physical_state or port.physical_state_id or "unreadable"
    return f"{state}/{physical}"


def check_ports(
    reading: RdmaReading, expected: Sequence[PortSpec], rate_gbps: float | None, link_layer: str | None
) -> list[Check]:
    ports, missing = select_ports(reading, expected)
    checks: list[Check] = []
    down = [
        f"{p.device} port {p.port} is {_state_text(p)}"
        for p in ports
        if p.state_id != ACTIVE or p.physical_state_id != LINK_UP
    ]
    if missing:
        down = [f"port {m} not found" for m in missing] + down
    if not ports and not missing:
        checks.append(_fail("port_state", "no RDMA ports to check"))
    elif down:
        checks.append(_fail("port_state", "; ".join(down) + " (expected ACTIVE/LinkUp)"))
    else:
        checks.append(_ok("port_state", f"{len(ports)} port(s) ACTIVE/LinkUp"))
    if rate_gbps is not None:
        slow = [
            f"{p.device} port {p.port} runs at {p.rate_text or 'an unreadable rate'}"
            for p in ports
            if p.rate_bytes_per_second is None or p.rate_bytes_per_second < rate_gbps * GBIT
        ]
        if slow or not ports:
            detail = "; ".join(slow) or "no ports to check"
            checks.append(_fail("port_rate", f"{detail} (expected at least {rate_gbps:g} Gb/s)"))
        else:
            checks.append(_ok("port_rate", f"{len(ports)} port(s) at >= {rate_gbps:g} Gb/s"))
    if link_layer is not None:
        wrong = [
            f"{p.device} port {p.port} is {p.link_layer or 'unknown'}"
            for p in ports
            if (p.link_layer or "").lower() != link_layer.lower()
        ]
        if wrong or not ports:
            detail = "; ".join(wrong) or "no ports to check"
            checks.append(_fail("port_link_layer", f"{detail} (expected {link_layer})"))
        else:
            checks.append(_ok("port_link_layer", f"{len(ports)} port(s) on {link_layer}"))
    return checks


def check_gpudirect(sysfs: Path, procfs: Path) -> Check:
    for module in PEERMEM_MODULES:
        if (sysfs / "module" / module).is_dir():
            return _ok("gpudirect_rdma", f"{module} loaded ({sysfs}/module/{module})")
    try:
        with open(procfs / "modules", encoding="utf-8", errors="replace") as handle:
            loaded = {line.split(" ", 1)[0] for _, line in zip(range(100_000), handle, strict=False)}
    except OSError:
        loaded = set()
    for module in PEERMEM_MODULES:
        if module in loaded:
            return _ok("gpudirect_rdma", f"{module} loaded ({procfs}/modules)")
    return _fail(
        "gpudirect_rdma",
        "nvidia_peermem is not loaded (no /sys/module/nvidia_peermem, not in "
        "/proc/modules): NCCL cannot use GPUDirect RDMA and stages through host memory "
        "(load it on the host, or --skip gpudirect_rdma for DMA-BUF setups)",
    )


def _name_list(value: str) -> tuple[bool, list[str]]:
    """NCCL's interface/HCA list syntax: (exclude?, names without ``=`` and port suffixes)."""
    exclude = value.startswith("^")
    items = value.lstrip("^").split(",")
    return exclude, [i.strip().lstrip("=").split(":")[0] for i in items if i.strip()]


def check_nccl_env(environ: Mapping[str, str], device_names: Sequence[str], require_gdr: bool) -> Check:
    problems: list[str] = []
    ib_disable = environ.get("NCCL_IB_DISABLE", "").strip()
    if ib_disable and ib_disable not in ("0", ""):
        problems.append(f"NCCL_IB_DISABLE={ib_disable} turns InfiniBand/RoCE off: NCCL will use TCP sockets")
    net = environ.get("NCCL_NET", "").strip()
    if net.lower() == "socket":
        problems.append(f"NCCL_NET={net} forces the TCP socket transport")
    hca = environ.get("NCCL_IB_HCA", "").strip()
    if hca and device_names:
        exclude, names = _name_list(hca)
        if not exclude and not any(d.startswith(n) for n in names for d in device_names):
            problems.append(
                f"NCCL_IB_HCA={hca} matches no RDMA device here ({', '.join(device_names)}): "
                "NCCL will fall back to sockets"
            )
    ifname = environ.get("NCCL_SOCKET_IFNAME", "").strip()
    if ifname:
        exclude, names = _name_list(ifname)
        local = [n for n in names if not exclude and any(n.startswith(p) for p in LOCAL_ONLY_IFACES)]
        if local:
            problems.append(
                f"NCCL_SOCKET_IFNAME={ifname} selects {', '.join(local)}, which other nodes cannot "
                "reach: NCCL bootstrap across nodes fails or hangs"
            )
    gdr_level = environ.get("NCCL_NET_GDR_LEVEL", "").strip().upper()
    if require_gdr and gdr_level in ("0", "LOC"):
        problems.append(f"NCCL_NET_GDR_LEVEL={gdr_level} disables GPUDirect RDMA")
    if problems:
        return _fail("nccl_env", "; ".join(problems))
    return _ok("nccl_env", "NCCL environment does not force sockets")


def host_checks(
    sysfs: Path,
    dev: Path,
    procfs: Path,
    environ: Mapping[str, str],
    expected: Sequence[PortSpec],
    rate_gbps: float | None,
    link_layer: str | None,
    require_gdr: bool,
) -> list[Check]:
    reading = read_rdma(sysfs)
    checks = [check_rdma_devices(reading, sysfs, expected), check_uverbs(dev, len({p.device for p in expected}) or 1)]
    checks += check_ports(reading, expected, rate_gbps, link_layer)
    if require_gdr:
        checks.append(check_gpudirect(sysfs, procfs))
    checks.append(check_nccl_env(environ, [d.name for d in reading.devices], require_gdr))
    return checks


def probe_checks(
    result: ProbeResult, require_transport: str, min_busbw_gbs: float | None, allow_unknown_transport: bool = False
) -> list[Check]:
    checks = [
        _ok(
            "probe",
            f"{len(result.collectives)} collective(s) correct on {result.world_size} ranks, {result.nnodes} node(s)",
        )
        if result.success
        else _fail(
            "probe",
            result.error
            or "; ".join(f"{c.collective}: {c.error or 'wrong data'}" for c in result.collectives if not c.success),
        )
    ]
    if require_transport != "any":
        t: Transport = result.transport
        if t.kind == require_transport:
            checks.append(_ok("probe_transport", f"traffic ran on {describe_transport(result)}"))
        elif t.kind == "unknown":
            # "Cannot tell" fails closed: a job must not start on a fabric nobody could check.
            why = f" ({t.reasons[0]})" if t.reasons else ""
            if allow_unknown_transport:
                checks.append(
                    _ok(
                        "probe_transport",
                        f"cannot tell which transport the traffic used{why}; allowed by --allow-unknown-transport",
                    )
                )
            else:
                checks.append(
                    _fail(
                        "probe_transport",
                        f"cannot tell which transport the traffic used{why}; "
                        f"expected {require_transport} (pass --allow-unknown-transport to accept)",
                    )
                )
        else:
            why = f" — {t.reasons[0]}" if t.reasons else ""
            checks.append(
                _fail(
                    "probe_transport", f"traffic ran on {describe_transport(result)}, expected {require_transport}{why}"
                )
            )
    if min_busbw_gbs is not None:
        low = []
        for c in result.collectives:
            average = c.average_busbw
            if average is None or average < min_busbw_gbs * GB:
                shown = "no result" if average is None else f"{average / GB:.2f} GB/s"
                low.append(f"{c.collective} average busbw {shown}")
        if low or not result.collectives:
            checks.append(
                _fail(
                    "probe_bandwidth",
                    f"{'; '.join(low) or 'no collectives'} (expected at least {min_busbw_gbs:g} GB/s)",
                )
            )
        else:
            checks.append(_ok("probe_bandwidth", f"average busbw >= {min_busbw_gbs:g} GB/s"))
    return checks


def run_preflight(args: argparse.Namespace, environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> int:
    environ = os.environ if environ is None else environ
    out = sys.stdout if out is None else out
    try:
        expected = [PortSpec.parse(p) for p in args.expect_ports.split(",") if p.strip()]
        rate = parse_rate_gbps(args.expect_rate) if args.expect_rate else None
        skip = {s.strip() for item in args.skip for s in item.split(",") if s.strip()}
        unknown = skip - set(HOST_CHECKS) - set(PROBE_CHECKS)
        if unknown:
            raise ValueError(
                f"--skip {', '.join(sorted(unknown))}: known checks are {', '.join(HOST_CHECKS + PROBE_CHECKS)}"
            )
        request = request_from_args(args, environ) if args.probe else None
    except ValueError as exc:
        print(f"ccl-exporter preflight: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    checks = host_checks(
        Path(args.sysfs),
        Path(args.dev),
        Path(args.procfs),
        environ,
        expected,
        rate,
        args.expect_link_layer or None,
        args.require_gdr,
    )
    identity = Identity.from_env("preflight", environ)
    probe_result = None
    if request is not None:
        probe_result = run_probe(request, identity, environ)
        checks += probe_checks(probe_result, args.require_transport, args.min_busbw, args.allow_unknown_transport)
    checks = [c for c in checks if c.check not in skip]
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'} {check.check}: {check.message}", file=out)
    failed = [c for c in checks if not c.ok]
    print(f"preflight: {'FAILED' if failed else 'passed'} ({len(failed)} of {len(checks)} checks failed)", file=out)
    base = probe_result or ProbeResult(
        source="preflight",
        started_at=started,
        finished_at=time.time(),
        hostname=socket.gethostname(),
        namespace=identity.namespace,
        pod=identity.pod,
        pod_uid=identity.pod_uid,
        job_name=identity.job_name,
    )
    result = dataclasses.replace(base, checks=tuple(checks), finished_at=time.time())
    if args.termination_message:
        try:
            write_termination_message(Path(args.termination_message), render_report(result))
        except OSError as exc:
            print(
                "ccl-exporter preflight: termination message not written, so the exporter shows no "
                f"ccl_preflight_result and no PreflightPassed/PreflightFailed from it: {args.termination_message}: "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
    if args.write_results:
        try:
            write_result(Path(args.probe_results), result)
            if why := identity.unattributable():
                print(f"ccl-exporter preflight: result written with {why}", file=sys.stderr)
        except OSError as exc:
            # One line; the exit code stays that of the checks (a job on a good fabric still starts).
            print(
                "ccl-exporter preflight: result not written, so the exporter shows no ccl_preflight_result and no "
                f"PreflightPassed/PreflightFailed for this pod: {unwritten_reason(Path(args.probe_results), exc)}",
                file=sys.stderr,
            )
    return 1 if failed else 0


def write_termination_message(path: Path, text: str) -> bool:
    """Write the report into the container's termination-message file when it exists (the kubelet
    creates it, mode 0666, in every container of a pod); False when there is none (not in a pod).
    Never creates a file, never follows a symlink."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(text)
    return True


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], environ: Mapping[str, str]
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "preflight",
        help="init-container check: RDMA devices, ports, GPUDirect, NCCL env, optional gang-wide probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    paths = parser.add_argument_group("host paths")
    SYSFS.add_to(paths, environ)
    DEV.add_to(paths, environ)
    PROBE_RESULTS.add_to(paths, environ)
    fabric = parser.add_argument_group("expected fabric")
    for flag in FABRIC_FLAGS:
        flag.add_to(fabric, environ)
    fabric.add_argument(
        "--no-require-gdr",
        dest="require_gdr",
        action="store_false",
        help="do not require nvidia_peermem (GPUDirect RDMA)",
    )
    fabric.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CHECK",
        help=f"drop a check (repeatable or comma-separated): {', '.join(HOST_CHECKS + PROBE_CHECKS)}",
    )
    probe = parser.add_argument_group("gang-wide probe (optional)")
    probe.add_argument("--probe", action="store_true", help="also run a short probe across the job's pods")
    probe.add_argument(
        "--require-transport",
        choices=["any", "rdma", "tcp", "intra_node"],
        default="any",
        help="transport the probe's traffic must have used (from NCCL's own log)",
    )
    ALLOW_UNKNOWN_TRANSPORT.add_to(probe, environ)
    probe.add_argument("--min-busbw", type=float, default=None, help="minimum average busbw, GB/s (1e9 bytes/s)")
    add_probe_arguments(parser, environ)
    parser.add_argument("--no-write", dest="write_results", action="store_false", help="do not write a result file")
    TERMINATION_MESSAGE.add_to(parser, environ)
    parser.set_defaults(handler=lambda args: run_preflight(args))
    return parser
