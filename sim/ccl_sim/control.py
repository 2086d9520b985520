"""Drive the simulated node from outside: ``POST /-/sim/<action>`` (the simulated node only).

``python -m ccl_sim serve`` adds these routes so that ``make demo``, the end-to-end
tests and the fleet benchmark can change what the simulated node shows while real
Prometheus and Alertmanager watch it. They exist only on the simulated node, only act on the
simulated folder tree, and answer only requests from loopback addresses. A POST that a web
page made (its ``Origin``, or ``Referer`` when there is no ``Origin``, is anything but this
exporter's own loopback origin, e.g. ``http://127.0.0.1:19400``) is refused, so a page open in
a browser cannot drive the node; command-line clients send neither header. Namespace, pod,
container and job names must be Kubernetes names (DNS-1123), so none can reach outside
the simulated tree.

``GET /-/sim`` lists the actions. Each action takes its parameters from the query string
(``POST /-/sim/rdma-port-down?device=mlx5_3``) and answers a JSON object with ``action``,
``at`` (the wall-clock time just before the change was written, seconds since the epoch) and details.

Actions:

- ``rdma-port-down`` / ``rdma-port-up`` ``[device=mlx5_0]``: port state DOWN/Disabled (no traffic)
  or ACTIVE/LinkUp again.
- ``rdma-traffic-stop`` / ``rdma-traffic-start`` ``[device=<one>]``: the job's RDMA traffic stops
  (counters flat) or resumes, on one port or all of them.
- ``rdma-errors`` ``[device=mlx5_0] [counter=symbol_error] [count=10]``: an error counter of a port
  (a ``counters/`` or ``hw_counters/`` file) jumps by ``count`` (a flapping cable, retransmits).
- ``rdma-garbage`` ``[device=mlx5_0] [attribute=state]``: a port attribute becomes unparsable (a driver
  bug); the RDMA collector then reports a partial read (``ccl_exporter_collector_success`` 0).
- ``probe-result`` ``[busbw_gbps=150] [collective=all_reduce] [namespace=ccl-exporter] [pod=ccl-probe-0]``:
  a two-node probe Job's result file lands, its bus bandwidth peaking at ``busbw_gbps``.
- ``gpu-release`` / ``gpu-assign`` ``[namespace= pod= container=]``: the simulated GPUs are freed
  (no pod holds them, no traffic) or handed to a pod (default: the simulated training pod).
- ``nvlink-down`` / ``nvlink-up`` ``gpu=<index> link=<index>``: one NVLink goes inactive or back.
- ``nccl-job-start`` ``namespace= pod= job_name= [network=IB|Socket] [nnodes=2] [gdr=true]
  [rails=aligned|crossed]``: a training pod (PyTorchJob labels) starts and NCCL's init lines land
  in its log; ``rails=crossed``: each GPU's inter-node channels use a NIC on the other socket.
- ``nccl-job-restart`` ``namespace= pod= [network=Socket] [gdr=false] [placement=shown|open]``: the pod's
  container restarts and NCCL comes back on ``network`` -- by default the silent fallback to TCP
  sockets; ``placement=open``: an NCCL 2.18 log that does not show which nodes the communicator spans.
- ``nccl-job-stop`` ``namespace= pod=``: the pod is deleted (its log folder goes away).
- ``pod-traffic`` ``transmit_bytes_per_second= receive_bytes_per_second= [namespace= pod=]``: the
  pod's own network interface (the kubelet's Summary API) moves these bytes/s from the next tick
  on (default pod: the simulated training pod; every pod starts at a few kB/s of chatter).
- ``advance`` ``[seconds=1]``: advance the simulation immediately (besides its 1 s ticker).
- ``kube-status``: what the lifecycle hooks (``--collector.lifecycle``) wrote to the simulated API:
  each pod's ``ccl-health.io/fabric-ready`` condition, the pod Events, the node's conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from ccl_sim.clock import now
from ccl_sim.node import SimulatedNode

if TYPE_CHECKING:
    from exporter.http.endpoints import ExporterApp

Params = Mapping[str, str]
ActionFunc = Callable[[SimulatedNode, Params], dict[str, Any]]


class ActionError(ValueError):
    """A bad or inapplicable action request (answered 400 with the message)."""


# Kubernetes object names: a DNS-1123 label (namespaces, containers; also what a job name
# must be to serve as a label value) or a DNS-1123 subdomain (pods). Neither admits "/" or "..".
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_NAME_RULES = {
    "namespace": (re.compile(_DNS1123_LABEL), 63),
    "container": (re.compile(_DNS1123_LABEL), 63),
    "job_name": (re.compile(_DNS1123_LABEL), 63),
    "pod": (re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"), 253),
}


def _checked_name(name: str, value: str) -> str:
    """``value`` when it is a valid Kubernetes name for parameter ``name``; ActionError otherwise."""
    pattern, longest = _NAME_RULES[name]
    if len(value) > longest or not pattern.fullmatch(value):
        kind = "DNS-1123 subdomain" if name == "pod" else "DNS-1123 label"
        raise ActionError(
            f"{name} must be a Kubernetes name ({kind}: lowercase letters, digits and '-', "
            f"at most {longest} characters), got {value[:80]!r}"
        )
    return value


def _name(params: Params, name: str, default: str) -> str:
    return _checked_name(name, params.get(name, default))


def _part(node: SimulatedNode, kind: type) -> Any:
    for part in node.parts:
        if isinstance(part, kind):
            return part
    raise ActionError(f"the simulated node has no {kind.__name__}")


def _rdma(node: SimulatedNode) -> Any:
    from ccl_sim.rdma import SimRdma

    return _part(node, SimRdma)


def _rdma_devices(node: SimulatedNode, params: Params, default_all: bool) -> list[str]:
    rdma = _rdma(node)
    device = params.get("device")
    if device is None:
        return [spec.device for spec in rdma.ports] if default_all else [rdma.ports[0].device]
    try:
        rdma.port(device)
    except KeyError as exc:
        raise ActionError(str(exc.args[0])) from None
    return [device]


def rdma_port_down(node: SimulatedNode, params: Params) -> dict[str, Any]:
    devices = _rdma_devices(node, params, default_all=False)
    for device in devices:
        _rdma(node).set_port_state(device, "1: DOWN", "3: Disabled")
    return {"devices": devices, "state": "DOWN"}


def rdma_port_up(node: SimulatedNode, params: Params) -> dict[str, Any]:
    devices = _rdma_devices(node, params, default_all=False)
    for device in devices:
        _rdma(node).set_port_state(device, "4: ACTIVE", "5: LinkUp")
    return {"devices": devices, "state": "ACTIVE"}


def rdma_traffic(flowing: bool) -> ActionFunc:
    def action(node: SimulatedNode, params: Params) -> dict[str, Any]:
        devices = _rdma_devices(node, params, default_all=True)
        for device in devices:
            _rdma(node).set_traffic(device, flowing)
        return {"devices": devices, "traffic": "flowing" if flowing else "stopped"}

    return action


def _nvml(node: SimulatedNode) -> Any:
    nvml = getattr(node, "nvml", None)
    if nvml is None:
        raise ActionError("the simulated node has no simulated NVML")
    return nvml


def _int_param(params: Params, name: str) -> int:
    try:
        return int(params[name])
    except KeyError:
        raise ActionError(f"{name}= is required") from None
    except ValueError:
        raise ActionError(f"{name} must be an integer") from None


def gpu_release(node: SimulatedNode, params: Params) -> dict[str, Any]:
    _nvml(node).release()
    return {"gpus": "released"}


def gpu_assign(node: SimulatedNode, params: Params) -> dict[str, Any]:
    from ccl_sim.nvml import TRAINING_CONTAINER, TRAINING_NAMESPACE, TRAINING_POD

    namespace = _name(params, "namespace", TRAINING_NAMESPACE)
    pod = _name(params, "pod", TRAINING_POD)
    container = _name(params, "container", TRAINING_CONTAINER)
    _nvml(node).assign(namespace, pod, container)
    return {"gpus": "assigned", "namespace": namespace, "pod": pod, "container": container}


def nvlink_state(active: bool) -> ActionFunc:
    def action(node: SimulatedNode, params: Params) -> dict[str, Any]:
        gpu, link = _int_param(params, "gpu"), _int_param(params, "link")
        try:
            _nvml(node).set_link_active(gpu, link, active)
        except KeyError:
            raise ActionError(f"no simulated NVLink {link} on GPU {gpu}") from None
        return {"gpu": gpu, "link": link, "active": active}

    return action


def _pod_logs(node: SimulatedNode) -> Any:
    from ccl_sim.podlogs import SimPodLogs

    return _part(node, SimPodLogs)


def _required(params: Params, *names: str) -> list[str]:
    """The named parameters, all Kubernetes names; ActionError when one is missing or invalid."""
    missing = [name for name in names if not params.get(name)]
    if missing:
        raise ActionError(", ".join(f"{name}=" for name in missing) + " required")
    return [_checked_name(name, params[name]) for name in names]


def _network(params: Params, default: str) -> str:
    network = params.get("network", default)
    if network not in ("IB", "Socket"):
        raise ActionError("network must be IB or Socket")
    return network


def _flag(params: Params, name: str, default: bool) -> bool:
    raw = params.get(name)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false", "1", "0"):
        raise ActionError(f"{name} must be true or false")
    return raw.lower() in ("true", "1")


def nccl_job_start(node: SimulatedNode, params: Params) -> dict[str, Any]:
    from ccl_sim.podlogs import SimJob, pytorchjob_labels

    namespace, pod, job_name = _required(params, "namespace", "pod", "job_name")
    try:
        nnodes = int(params.get("nnodes", "2"))
    except ValueError:
        raise ActionError("nnodes must be an integer") from None
    rails = params.get("rails", "aligned")
    if rails not in ("aligned", "crossed"):
        raise ActionError("rails must be aligned or crossed")
    job = SimJob(
        namespace,
        pod,
        pytorchjob_labels(job_name),
        network=_network(params, "IB"),
        nnodes=max(1, nnodes),
        gdr=_flag(params, "gdr", True),
        rails=rails,
    )
    _pod_logs(node).start_job(job)
    return {"namespace": namespace, "pod": pod, "job_name": job_name, "network": job.network, "rails": rails}


def nccl_job_restart(node: SimulatedNode, params: Params) -> dict[str, Any]:
    namespace, pod = _required(params, "namespace", "pod")
    network = _network(params, "Socket")
    placement = params.get("placement", "shown")
    if placement not in ("shown", "open"):
        raise ActionError("placement must be shown or open")
    try:
        job = _pod_logs(node).restart_job(
            namespace,
            pod,
            network=network,
            gdr=_flag(params, "gdr", network == "IB"),
            placement_shown=placement == "shown",
        )
    except KeyError:
        raise ActionError(f"no running simulated pod {namespace}/{pod}") from None
    return {"namespace": namespace, "pod": pod, "network": job.network, "restarts": job.restarts}


def nccl_job_stop(node: SimulatedNode, params: Params) -> dict[str, Any]:
    namespace, pod = _required(params, "namespace", "pod")
    _pod_logs(node).stop_job(namespace, pod)
    return {"namespace": namespace, "pod": pod, "stopped": True}


def rdma_errors(node: SimulatedNode, params: Params) -> dict[str, Any]:
    device = _rdma_devices(node, params, default_all=False)[0]
    counter = params.get("counter", "symbol_error")
    rdma = _rdma(node)
    files = [name for (dev, name) in rdma.counters if dev == device and not name.endswith(("_data", "_packets"))]
    file = next((name for name in files if name.split("/", 1)[1] == counter), None)
    if file is None:
        raise ActionError(f"counter must be an error counter file of {device}, e.g. symbol_error (got {counter!r})")
    try:
        count = int(params.get("count", "10"))
    except ValueError:
        raise ActionError("count must be an integer") from None
    if not 0 < count <= 1_000_000:
        raise ActionError("count must be in 1..1000000")
    key = (device, file)
    rdma.counters[key] += count
    return {"device": device, "counter": counter, "value": rdma.counters[key]}


def rdma_garbage(node: SimulatedNode, params: Params) -> dict[str, Any]:
    device = _rdma_devices(node, params, default_all=False)[0]
    attribute = params.get("attribute", "state")
    if attribute not in ("rate", "state", "phys_state"):
        raise ActionError("attribute must be rate, state or phys_state")
    _rdma(node).write_port_attribute(device, attribute, "\x00garbage\x7f")
    return {"device": device, "attribute": attribute}


def probe_result(node: SimulatedNode, params: Params) -> dict[str, Any]:
    from ccl_sim.podlogs import sim_pod_uid
    from ccl_sim.probe import sweep
    from exporter.results.probe_file import CollectiveResult, ProbeResult, Transport, write_result

    try:
        peak = float(params.get("busbw_gbps", "150")) * 1e9
    except ValueError:
        raise ActionError("busbw_gbps must be a number") from None
    if not 0 < peak < 1e13:
        raise ActionError("busbw_gbps must be in (0, 10000)")
    collective = params.get("collective", "all_reduce")
    if collective not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall"):
        raise ActionError(f"unknown collective {collective!r}")
    at = now()
    namespace, pod = _name(params, "namespace", "ccl-exporter"), _name(params, "pod", "ccl-probe-0")
    result = ProbeResult(
        source="job",
        started_at=at - 60,
        finished_at=at,
        namespace=namespace,
        pod=pod,
        pod_uid=sim_pod_uid(namespace, pod),
        job_name="ccl-probe",
        backend="nccl",
        world_size=16,
        nnodes=2,
        scope="inter_node",
        transport=Transport("rdma", "net_ib", "IB", True),
        collectives=(CollectiveResult(collective, sweep(collective, peak, 8 << 20, 4 << 30)),),
    )
    path = write_result(node.paths.probe_results, result)
    return {"file": path.name, "collective": collective, "peak_busbw_bytes_per_second": peak}


def advance(node: SimulatedNode, params: Params) -> dict[str, Any]:
    try:
        seconds = float(params.get("seconds", "1"))
    except ValueError:
        raise ActionError("seconds must be a number") from None
    if not 0 < seconds <= 3600:
        raise ActionError("seconds must be in (0, 3600]")
    node.advance(seconds)
    return {"elapsed_seconds": node.elapsed_seconds}


def _rate_param(params: Params, name: str) -> float:
    try:
        value = float(params[name])
    except KeyError:
        raise ActionError(f"{name}= is required") from None
    except ValueError:
        raise ActionError(f"{name} must be a number") from None
    if not 0 <= value <= 1e12:
        raise ActionError(f"{name} must be in [0, 1e12] bytes/s")
    return value


def pod_traffic(node: SimulatedNode, params: Params) -> dict[str, Any]:
    from ccl_sim.nvml import TRAINING_NAMESPACE, TRAINING_POD

    if node.kubelet is None:
        raise ActionError("the simulated node has no kubelet")
    namespace = _name(params, "namespace", TRAINING_NAMESPACE)
    pod = _name(params, "pod", TRAINING_POD)
    transmit = _rate_param(params, "transmit_bytes_per_second")
    receive = _rate_param(params, "receive_bytes_per_second")
    node.kubelet.set_traffic(namespace, pod, transmit, receive)
    return {
        "namespace": namespace,
        "pod": pod,
        "transmit_bytes_per_second": transmit,
        "receive_bytes_per_second": receive,
    }


def kube_status(node: SimulatedNode, params: Params) -> dict[str, Any]:
    """What the lifecycle hooks wrote to the simulated API (changes nothing)."""
    if node.kube is None:
        raise ActionError("the simulated node has no API")
    return node.kube.status()


def builtin_actions() -> dict[str, ActionFunc]:
    return {
        "rdma-port-down": rdma_port_down,
        "rdma-port-up": rdma_port_up,
        "rdma-traffic-stop": rdma_traffic(False),
        "rdma-traffic-start": rdma_traffic(True),
        "rdma-errors": rdma_errors,
        "rdma-garbage": rdma_garbage,
        "probe-result": probe_result,
        "gpu-release": gpu_release,
        "gpu-assign": gpu_assign,
        "nvlink-down": nvlink_state(False),
        "nvlink-up": nvlink_state(True),
        "nccl-job-start": nccl_job_start,
        "nccl-job-restart": nccl_job_restart,
        "nccl-job-stop": nccl_job_stop,
        "pod-traffic": pod_traffic,
        "advance": advance,
        "kube-status": kube_status,
    }


@dataclass
class SimControl:
    """The simulated node plus a lock: the 1 s ticker and control actions never interleave."""

    node: SimulatedNode
    actions: dict[str, ActionFunc] = field(default_factory=builtin_actions)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.node.advance(seconds)

    def perform(self, name: str, params: Params) -> dict[str, Any]:
        action = self.actions.get(name)
        if action is None:
            raise ActionError(f"unknown action {name!r} (have {', '.join(sorted(self.actions))})")
        with self.lock:
            at = now()  # before the change: latencies measured from ``at`` never come out short
            details = action(self.node, params)
        return {"action": name, "at": at, **details}


def ticker_hook(control: SimControl, tick_seconds: float = 1.0) -> Callable[[ExporterApp], AsyncIterator[None]]:
    """A startup hook of the app (``exporter.http.endpoints.StartupHook``) that advances the node every
    ``tick_seconds`` in a worker thread while the server runs."""

    async def hook(app: ExporterApp) -> AsyncIterator[None]:
        async def ticker() -> None:
            while True:
                await asyncio.sleep(tick_seconds)
                await asyncio.to_thread(control.advance, tick_seconds)

        task = asyncio.create_task(ticker(), name="simulated-node")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return hook


def _from_loopback(request: web.Request) -> bool:
    try:
        return ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        return False


def _local_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return int(sockname[1]) if isinstance(sockname, tuple) and len(sockname) >= 2 else None


def _is_own_origin(url: str, port: int | None) -> bool:
    """Whether ``url`` (an Origin or a Referer) is this exporter on a loopback address."""
    try:
        parsed = urlsplit(url)
        host = (parsed.hostname or "").strip("[]")
        if parsed.scheme != "http" or port is None or parsed.port != port:
            return False
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cross_origin(request: web.Request) -> str | None:
    """Why a POST looks like a web page's (another origin), or None when it does not."""
    origin = request.headers.get("Origin")
    header, url = ("Origin", origin) if origin is not None else ("Referer", request.headers.get("Referer"))
    if url is None or _is_own_origin(url, _local_port(request)):
        return None
    return f"{header} {url[:100]!r} is not this exporter's loopback origin"


def add_control_routes(app: ExporterApp, control: SimControl) -> None:
    """``GET /-/sim`` and ``POST /-/sim/<action>``; call before the app starts."""

    async def list_actions(request: web.Request) -> web.Response:
        if not _from_loopback(request):
            return web.Response(text="simulation control answers loopback clients only\n", status=403)
        return web.json_response({"actions": sorted(control.actions)})

    async def perform(request: web.Request) -> web.Response:
        if not _from_loopback(request):
            return web.Response(text="simulation control answers loopback clients only\n", status=403)
        refused = _cross_origin(request)
        if refused is not None:
            return web.Response(text=f"simulation control refuses cross-origin requests: {refused}\n", status=403)
        action = request.match_info["action"]
        try:
            result = await asyncio.to_thread(control.perform, action, dict(request.query))
        except ActionError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(result)

    app.routes[("GET", "/-/sim")] = list_actions
    app.routes[("POST", "/-/sim/{action}")] = perform
