"""Two NCCL processes on the one GPU made to look like two hosts, and what their logs show.

NCCL tells hosts apart by a hash of the hostname and boot id; ``NCCL_HOSTID`` replaces that
string (NVIDIA/nccl src/misc/utils.cc ``getHostHash``), so two processes with two host ids are
two NCCL nodes: no P2P or SHM between them (transport/p2p.cc, shm.cc), ``nNodes 2``, traffic over
the network plugin. NCCL 2.30 also refuses two ranks on one GPU UUID unless
``NCCL_MULTI_RANK_GPU_ENABLE=1`` (init.cc); earlier releases check host hash and bus id only.
Both ranks still share the hostname and the machine's interfaces, which is what the analysis
has to cope with: the loopback rule (sockets on ``lo`` only: one node) must not outrank the
``nNodes 2`` NCCL prints.

Variants (each a torch.distributed job of two ranks, a few all-reduces, logs at
``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET`` in ``NCCL_DEBUG_FILE`` per rank):

* ``socket-lo``: ``NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo``: Socket between the "hosts", a real TCP
  fallback; ``analyze`` must say ``tcp_fallback`` (exit 3).
* ``socket-<if>``: the same on the machine's first non-loopback IPv4 interface (``=<if>``, exact),
  when it has one: the logs then show an address another host could reach.
* ``defaults``: no NCCL setting at all: whatever NCCL picks on this machine.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import re
import socket
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devtools.gpu_check.report import (
    FAILED,
    OK,
    SKIPPED,
    Report,
    clean_env,
    free_port,
    repo_env,
    run_command,
    run_together,
)

TWO_HOSTS_DIR = "two-hosts"
NCCL_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
HOST_ID = "gpu-check-host-{rank}"
RANKS = 2
# exporter.commands.analyze's exit codes
ANALYZE_FALLBACK = 3
ANALYZE_ANSWERS = (0, 3, 4)

WORKER = r"""
import os, sys
try:
    import torch
    import torch.distributed as dist
except ImportError as exc:
    print(f"GPU-CHECK-SKIP torch is not installed: {exc}", flush=True)
    sys.exit(3)
if not torch.cuda.is_available():
    print(f"GPU-CHECK-SKIP torch {torch.__version__} sees no CUDA device", flush=True)
    sys.exit(3)
if not dist.is_nccl_available():
    print(f"GPU-CHECK-SKIP torch {torch.__version__} was built without NCCL", flush=True)
    sys.exit(3)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
iterations = int(os.environ.get("GPU_CHECK_ITERATIONS", "5"))
torch.cuda.set_device(int(os.environ["GPU_CHECK_DEVICE"]))
dist.init_process_group("nccl", init_method=os.environ["GPU_CHECK_INIT"], rank=rank, world_size=world)
x = torch.ones(int(os.environ.get("GPU_CHECK_ELEMENTS", 1 << 20)), device="cuda")
for _ in range(iterations):
    dist.all_reduce(x)  # NCCL creates the communicator lazily: the first collective runs its init
torch.cuda.synchronize()
want = float(world ** iterations)
got = x[0].item()
print(f"GPU-CHECK-RESULT rank {rank}/{world} all_reduce x{iterations} value {got} want {want} "
      f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
dist.destroy_process_group()
sys.exit(0 if got == want else 1)
"""


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str]
    meaning: str
    must_fall_back: bool


def ipv4_interfaces() -> list[tuple[str, str]]:
    """(name, address) of every interface with an IPv4 address, in index order."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
            found.append((name, socket.inet_ntoa(packed[20:24])))
    return found


def variants(interfaces: Sequence[tuple[str, str]]) -> tuple[list[Variant], str | None]:
    """The variants to run; the second value says why the non-loopback one is left out, if it is."""
    socket_only = {"NCCL_IB_DISABLE": "1"}
    chosen = [Variant("socket-lo", {**socket_only, "NCCL_SOCKET_IFNAME": "lo"}, "IB disabled, sockets on lo", True)]
    external = [(n, a) for n, a in interfaces if n != "lo" and not a.startswith("127.")]
    why = None
    if external:
        name, address = external[0]
        chosen.append(
            Variant(
                f"socket-{name}",
                {**socket_only, "NCCL_SOCKET_IFNAME": f"={name}"},
                f"IB disabled, sockets on {name} ({address})",
                True,
            )
        )
    else:
        why = "this machine has no IPv4 interface but loopback"
    chosen.append(Variant("defaults", {}, "no NCCL setting: NCCL's own choice", False))
    return chosen, why


def run_ranks(
    folder: Path,
    gpu: int,
    env: Mapping[str, str],
    timeout: float,
    python: str = sys.executable,
    iterations: int = 5,
    elements: int = 1 << 20,
) -> tuple[list[int], list[str]]:
    """Two worker processes as two NCCL hosts on GPU ``gpu``; NCCL's log of rank r in
    ``folder/rank<r>.nccl.log``, the rest of its output in ``rank<r>.out.log``. Exit codes and outputs."""
    folder.mkdir(parents=True, exist_ok=True)
    init = f"tcp://127.0.0.1:{free_port()}"
    commands = []
    for rank in range(RANKS):
        rank_env = clean_env(
            {
                **NCCL_LOG_ENV,
                "NCCL_DEBUG_FILE": str(folder / f"rank{rank}.nccl.log"),
                "NCCL_HOSTID": HOST_ID.format(rank=rank),
                "NCCL_MULTI_RANK_GPU_ENABLE": "1",
                **env,
                "RANK": str(rank),
                "WORLD_SIZE": str(RANKS),
                "GPU_CHECK_INIT": init,
                "GPU_CHECK_DEVICE": str(gpu),
                "GPU_CHECK_ITERATIONS": str(iterations),
                "GPU_CHECK_ELEMENTS": str(elements),
                "PYTHONUNBUFFERED": "1",
            }
        )
        commands.append(([python, "-c", WORKER], rank_env))
    results = run_together(commands, timeout)
    for rank, (_, out) in enumerate(results):
        (folder / f"rank{rank}.out.log").write_text(out)
    return [code for code, _ in results], [out for _, out in results]


def skip_reason(outputs: Sequence[str]) -> str | None:
    for out in outputs:
        for line in out.splitlines():
            if "GPU-CHECK-SKIP " in line:
                return line.split("GPU-CHECK-SKIP ", 1)[1]
    return None


def run_variant(report: Report, variant: Variant, gpu: int, base: Path, python: str) -> Path | None:
    """One variant's job; the folder holding its rank logs, None when no NCCL log was written."""
    step = f"two hosts {variant.name}"
    timeout = report.timeout(90)
    if timeout is None:
        report.out_of_time(step)
        return None
    folder = base / TWO_HOSTS_DIR / variant.name
    codes, outputs = run_ranks(folder, gpu, variant.env, timeout, python)
    logs = rank_logs(folder)
    if all(code == 3 for code in codes):
        report.add(step, SKIPPED, skip_reason(outputs) or "the workers could not start NCCL")
        return None
    settings = " ".join(f"{k}={v}" for k, v in variant.env.items()) or "no NCCL_* setting"
    if any(code != 0 for code in codes):
        report.add(step, FAILED, f"exit codes {codes} ({settings}); see {TWO_HOSTS_DIR}/{variant.name}/")
    else:
        report.add(step, OK, f"{RANKS} ranks, NCCL_HOSTID per rank, {settings}; {len(logs)} rank logs")
    return folder if logs else None


def rank_logs(folder: Path) -> list[Path]:
    return sorted(folder.glob("rank*.nccl.log"))


# --- what the logs show --------------------------------------------------------------------------

_PREFIX_RE = re.compile(
    r"^(?:\[[^\]]*\] )?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?:INFO|WARN)"
)
_SOCKET_RE = re.compile(r"NET/Socket ?: Using((?: \[\d+\][^\s:]+:\S+)+)")
_NNODES_RE = re.compile(r"nRanks (\d+) nNodes (\d+)")
_NETWORK_RE = re.compile(r"(?:Using network|Assigned NET plugin) (\S+(?: \S+)?)(?: to comm)?$")
_VERSION_RE = re.compile(r"NCCL version (\S+)")


def log_facts(paths: Sequence[Path]) -> dict[str, Any]:
    """What a human checks first in NCCL's logs: hostnames and processes, NCCL version, nNodes,
    the network and the interfaces NCCL's sockets use, and the warnings."""
    hosts: set[str] = set()
    pids: set[str] = set()
    versions: set[str] = set()
    nnodes: set[str] = set()
    networks: set[str] = set()
    interfaces: set[str] = set()
    warnings = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            prefix = _PREFIX_RE.match(line)
            if prefix is None:
                continue
            hosts.add(prefix.group("host"))
            pids.add(f"{prefix.group('host')}:{prefix.group('pid')}")
            warnings += " NCCL WARN " in line
            for pattern, into in ((_VERSION_RE, versions), (_NETWORK_RE, networks)):
                found = pattern.search(line)
                if found:
                    into.add(found.group(1))
            found_nodes = _NNODES_RE.search(line)
            if found_nodes:
                nnodes.add(found_nodes.group(2))
            socket_line = _SOCKET_RE.search(line)
            if socket_line:
                interfaces.update(re.findall(r"\[\d+\]([^\s:]+:[^\s<]+)", socket_line.group(1)))
    return {
        "hostnames": sorted(hosts),
        "processes": len(pids),
        "nccl_versions": sorted(versions),
        "nnodes": sorted(nnodes),
        "networks": sorted(networks),
        "socket_interfaces": sorted(interfaces),
        "warnings": warnings,
    }


def analyze(
    report: Report, step: str, logs: Sequence[Path], out_json: Path, must_fall_back: bool
) -> dict[str, Any] | None:
    """``ccl-exporter analyze --json`` on ``logs`` together (one job); its JSON in ``out_json``."""
    if not logs:
        report.add(step, SKIPPED, "no NCCL log to analyze")
        return None
    code, text = run_command(
        [sys.executable, "-m", "exporter", "analyze", "--json", *map(str, logs)], timeout=120, env=repo_env()
    )
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(text)
    try:
        verdict = json.loads(text.strip().splitlines()[-1]) if code in ANALYZE_ANSWERS else None
    except (ValueError, IndexError):
        verdict = None
    if verdict is None:
        report.add(step, FAILED, f"exit {code}: {text.strip()[-200:]}")
        return None
    said = (
        f"exit {code}, verdict {verdict.get('verdict')}, network {verdict.get('network')}, nodes {verdict.get('nodes')}"
    )
    if must_fall_back and code != ANALYZE_FALLBACK:
        report.add(step, FAILED, f"{said}: two hosts on Socket must be a TCP fallback (exit 3)")
    else:
        report.add(step, OK, said)
    return dict(verdict)


def explain(name: str, meaning: str, facts: Mapping[str, Any], verdict: Mapping[str, Any] | None) -> str:
    """One finding: what ``analyze`` said about a variant and what in the logs made it say so."""
    hosts = facts["hostnames"]
    same = "one hostname for both ranks" if len(hosts) == 1 else f"{len(hosts)} hostnames"

    def listed(key: str, empty: str) -> str:
        return ", ".join(facts[key]) or empty

    shown = (
        f"{facts['processes']} processes, {same} ({listed('hostnames', 'none')}), "
        f"NCCL {listed('nccl_versions', '?')}, nNodes {'/'.join(facts['nnodes']) or 'not printed'}, "
        f"network {listed('networks', 'not printed')}, "
        f"NCCL sockets on {listed('socket_interfaces', 'no NET/Socket line')}, {facts['warnings']} warnings"
    )
    if verdict is None:
        return f"`{name}` ({meaning}): the logs show {shown}; analyze gave no verdict."
    reasons = verdict.get("reasons") or ["(no reason given)"]
    return (
        f"`{name}` ({meaning}): analyze says **{verdict.get('verdict')}** (network {verdict.get('network')}, "
        f"nodes {verdict.get('nodes')}, ranks {verdict.get('nranks')}). The logs show {shown}. "
        f"Its reason: {reasons[0]}"
    )
