"""Which NIC each GPU's NCCL network traffic leaves through, as the log shows it.

A NET channel line names the network device by its index, ``via NET/IB/3``: the fourth device of
the ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ...`` line of the process that logs it (the
order NCCL made its network devices in). The GPU is the logging rank's (the ``[send]`` line's
source, the ``[receive]`` line's destination), or, with PXN (``NET/IB/3(5)``), the proxy rank's:
its GPU is the one that talks to the NIC. A rank's GPU is named by the ``busId`` of its init line
(2.5+), so it is found on the host whatever the container's own device numbering is; before
2.18.3 the channel line's own ``[busId]`` does as well.

Only networks of the RDMA class with an IB device list count (NCCL's IB transport and the IBext
plugins, which print the same list); a line whose device or GPU the log does not name is left out.
Each use keeps the host of the process that logged it: busIds repeat on every node of a
homogeneous cluster, so only the caller knows which hosts are the node it looks at.
``/GDRDMA`` on the lines tells whether GPUDirect RDMA carries that GPU's traffic on that NIC.
"""

from __future__ import annotations

from typing import NamedTuple

from exporter.nccl.facts import Connection, connection_class
from exporter.nccl.networks import RDMA
from exporter.nccl.state import StreamState

MAX_NIC_USES = 256  # (GPU, NIC) pairs reported per stream
_MIN_BUS_ID_DIGITS = 4  # a [busId] on a channel line (2.5-2.18.1); NVML indexes (2.18.3+) are shorter


class NicUse(NamedTuple):
    """GPU ``gpu_bus_id`` (NCCL's busId, ``18000``) of a process on host ``host`` sends or receives
    through RDMA device ``device``."""

    host: str  # as the line prefix names it ("" without one): a log may hold several nodes' lines
    gpu_bus_id: str
    device: str
    gdr: str  # "true": every line shows /GDRDMA; "false": none does; "mixed"


def _gpu_of(state: StreamState, connection: Connection) -> str | None:
    """The busId of the GPU whose traffic the line carries to or from its NIC."""
    event = connection.event
    rank = event.proxy_rank if event.proxy_rank is not None else event.logging_rank
    comm = state.communicators.get(connection.comm) if connection.comm else None
    if comm is not None and rank in comm.rank_bus:
        return comm.rank_bus[rank]
    if event.proxy_rank is not None:
        return None
    own = event.dst_id if event.direction == "receive" else event.src_id
    return own.lower() if own is not None and len(own) >= _MIN_BUS_ID_DIGITS else None


def nic_uses(state: StreamState) -> tuple[NicUse, ...]:
    """Every (GPU, RDMA NIC) pair the stream's NET channel lines show, sorted."""
    flags: dict[tuple[str, str, str], set[bool]] = {}
    for connection in state.connections.values():
        event = connection.event
        if event.kind != "net" or event.net_device is None or connection_class(connection) != RDMA:
            continue
        devices = connection.process.ib_devices
        if not devices:
            continue
        device = next((d.device for d in devices if d.index == event.net_device), None)
        gpu = _gpu_of(state, connection)
        if device is None or gpu is None:
            continue
        key = (connection.process.host or "", gpu, device)
        if key in flags or len(flags) < MAX_NIC_USES:
            flags.setdefault(key, set()).add(event.gdr)
    return tuple(
        NicUse(host, gpu, device, "mixed" if len(seen) > 1 else ("true" if True in seen else "false"))
        for (host, gpu, device), seen in sorted(flags.items())
    )
