"""Each pod's own network bytes: the kubelet's Summary API (``GET /stats/summary``).

The kubelet serves ``/stats/summary`` on its authenticated port (10250), as metrics-server and
the OpenTelemetry kubelet-stats receiver read it: a bearer token (the pod's service account,
allowed ``get`` on ``nodes/stats``) and TLS, verified against a CA file unless told otherwise.
Its ``pods[].network`` holds, per pod, the byte counters of the interfaces in the pod's network
namespace (cAdvisor's or the container runtime's, whichever the kubelet uses), the same numbers
kube-prometheus reads from ``/metrics/cadvisor`` as ``container_network_*_bytes_total``; for a
hostNetwork pod they are the host's interfaces, where the runtime reports them at all.

``pod_networks`` parses an answer into ``PodNetwork`` records: bytes summed over the pod's
interfaces, leaving out loopback and the host side of pod networking (veth pairs, bridges,
overlays and tunnels, which only a hostNetwork pod sees and which would count forwarded pod
traffic twice). A hostile or broken answer never grows memory without bound: the body, the
pods and each pod's interfaces are capped, malformed pods are counted and skipped.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_TOKEN_FILE = SERVICE_ACCOUNT / "token"
DEFAULT_CA_FILE = SERVICE_ACCOUNT / "ca.crt"
MAX_RESPONSE_BYTES = 32 * 1024 * 1024  # a busy node's summary is well under 1 MiB
MAX_PODS = 2048  # kubelet's maxPods is 110 by default, 250 at most in managed offerings
MAX_INTERFACES = 64
MAX_NAME_CHARS = 253
MAX_TOKEN_BYTES = 64 * 1024
MAX_COUNTER = 2**64

# Interfaces that are not the pod's own traffic: loopback, and the host side of pod networking
# (veth pairs, CNI bridges, overlay and tunnel devices), seen only by hostNetwork pods.
HOST_SIDE_INTERFACE = re.compile(
    r"lo|veth.+|cali.+|cilium.+|lxc.+|flannel.+|cni.+|docker.+|vxlan.+|genev_sys.+|tunl.+|kube-ipvs.+"
    r"|nodelocaldns|ovn-k8s.+|antrea-.+"
)


class KubeletStatsUnavailable(Exception):
    """No kubelet to ask: no address configured (not in a cluster)."""


class KubeletStatsError(Exception):
    """The kubelet was asked and gave no usable answer (refused, 401/403, TLS, timeout, garbage)."""


@dataclass(frozen=True)
class PodNetwork:
    """One pod's network bytes, summed over its own interfaces (``interfaces`` names them)."""

    namespace: str
    pod: str
    transmit_bytes: int
    receive_bytes: int
    interfaces: tuple[str, ...]


@dataclass(frozen=True)
class PodNetworks:
    """What one summary said: the pods that report network bytes, and how many pods' entries
    were malformed (skipped) or beyond ``MAX_PODS``."""

    pods: tuple[PodNetwork, ...]
    malformed: int = 0


def is_host_side(interface: str) -> bool:
    return HOST_SIDE_INTERFACE.fullmatch(interface) is not None


def _counter(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNTER:
        return None
    return value


def _name(value: object) -> str | None:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS or not value.isprintable():
        return None
    return value


def _interfaces(network: Mapping[str, Any]) -> list[tuple[str, int, int]] | None:
    """(name, rx, tx) of a pod's interfaces; [] when the kubelet found none; None when malformed.

    The shape is ``NetworkStats`` of the kubelet's stats API (k8s.io/kubelet
    ``pkg/apis/stats/v1alpha1/types.go``): ``interfaces`` lists every interface and is left out
    when empty (``omitempty``); the default interface is inlined at the top level ("if found"),
    so with no interfaces at all the kubelet sends ``{"time": ..., "name": ""}``
    (``cadvisorInfoToNetworkStats`` in ``pkg/kubelet/stats/helper.go``; the CRI stats provider
    likewise). Older kubelets give only the default interface at the top level."""
    listed = network.get("interfaces")
    if listed is None or listed == []:
        if network.get("name") in (None, ""):
            return []  # no interface found: a pod without interface data, not a malformed one
        listed = [network]
    if not isinstance(listed, list) or len(listed) > MAX_INTERFACES:
        return None
    found: dict[str, tuple[int, int]] = {}
    for entry in listed:
        if not isinstance(entry, Mapping):
            return None
        name = _name(entry.get("name"))
        rx, tx = _counter(entry.get("rxBytes", 0)), _counter(entry.get("txBytes", 0))
        if name is None or rx is None or tx is None:
            return None
        found[name] = (rx, tx)  # an interface listed twice counts once
    return [(name, rx, tx) for name, (rx, tx) in sorted(found.items())]


def pod_networks(summary: object) -> PodNetworks:
    """The pods of a decoded ``/stats/summary`` answer that report network bytes."""
    if not isinstance(summary, Mapping) or not isinstance(summary.get("pods", []), list):
        raise KubeletStatsError("the kubelet's summary is not an object with a pods list")
    pods: dict[tuple[str, str], PodNetwork] = {}
    malformed = 0
    entries: list[Any] = summary.get("pods") or []
    if len(entries) > MAX_PODS:
        malformed += len(entries) - MAX_PODS
        entries = entries[:MAX_PODS]
    for entry in entries:
        ref = entry.get("podRef") if isinstance(entry, Mapping) else None
        namespace = _name(ref.get("namespace")) if isinstance(ref, Mapping) else None
        pod = _name(ref.get("name")) if isinstance(ref, Mapping) else None
        if namespace is None or pod is None:
            malformed += 1
            continue
        network = entry.get("network")
        if network is None:
            continue  # the kubelet has no network stats for it (yet, or a hostNetwork pod)
        interfaces = _interfaces(network) if isinstance(network, Mapping) else None
        if interfaces is None:
            malformed += 1
            continue
        if not interfaces:
            continue  # the kubelet found no interface in the pod's network namespace
        own = [i for i in interfaces if not is_host_side(i[0])]
        pods[(namespace, pod)] = PodNetwork(
            namespace,
            pod,
            transmit_bytes=sum(tx for _, _, tx in own),
            receive_bytes=sum(rx for _, rx, _ in own),
            interfaces=tuple(name for name, _, _ in own),
        )
    return PodNetworks(tuple(pods[key] for key in sorted(pods)), malformed)


@dataclass(frozen=True)
class KubeletStatsSettings:
    """Where the kubelet's summary is and how to authenticate: ``url`` ("" = not configured),
    a bearer token file (read on every request: projected tokens rotate), the CA of the kubelet's
    serving certificate, or no verification at all (kubelets with self-signed certificates)."""

    url: str = ""
    token_file: str = str(DEFAULT_TOKEN_FILE)
    ca_file: str = str(DEFAULT_CA_FILE)
    insecure_skip_verify: bool = False
    timeout_seconds: float = 3.0


class KubeletStatsClient:
    """Reads ``/stats/summary`` from the node's kubelet; see the module docstring."""

    def __init__(self, settings: KubeletStatsSettings) -> None:
        self.settings = settings

    def _context(self) -> ssl.SSLContext:
        if self.settings.insecure_skip_verify:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        try:
            return ssl.create_default_context(cafile=self.settings.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise KubeletStatsError(f"CA file {self.settings.ca_file}: {exc}") from exc

    def _token(self) -> str:
        if not self.settings.token_file:
            return ""
        try:
            with open(self.settings.token_file, "rb") as handle:
                token = handle.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            raise KubeletStatsError(f"bearer token file {self.settings.token_file}: {exc.strerror or exc}") from exc
        if len(token) > MAX_TOKEN_BYTES:
            raise KubeletStatsError(
                f"bearer token file {self.settings.token_file} is larger than {MAX_TOKEN_BYTES} bytes"
            )
        return token.decode("ascii", errors="replace").strip()

    def read(self) -> PodNetworks:
        url = self.settings.url
        if not url:
            raise KubeletStatsUnavailable("no kubelet address (--collector.podnetwork.kubelet-url)")
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        token = self._token()
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        context = self._context() if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_seconds, context=context) as answer:
                body = answer.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            hint = " (the service account needs get on nodes/stats)" if exc.code in (401, 403) else ""
            raise KubeletStatsError(f"{url}: HTTP {exc.code} {exc.reason}{hint}") from exc
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubeletStatsError(f"{url}: {reason}") from exc
        return summary_from_bytes(body, url)


def summary_from_bytes(body: bytes, where: str) -> PodNetworks:
    """The pods of a ``/stats/summary`` answer as the kubelet sent it (any bytes);
    ``KubeletStatsError`` says why it is not one (``where`` names the kubelet)."""
    if len(body) > MAX_RESPONSE_BYTES:
        raise KubeletStatsError(f"{where}: answer larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise KubeletStatsError(f"{where}: not JSON ({exc})") from exc
    return pod_networks(decoded)


def summary_document(pods: Iterable[tuple[str, str, Mapping[str, tuple[int, int]]]]) -> dict[str, Any]:
    """A ``/stats/summary`` answer in the kubelet's shape for (namespace, pod, {interface: (rx, tx)}):
    what a kubelet stand-in serves and the tests send. As the kubelet's cAdvisor path writes it
    (``cadvisorInfoToNetworkStats``): eth0 inlined as the default interface when there is one
    (``"name": ""`` otherwise), and ``interfaces`` only when there are some."""
    entries = []
    for namespace, pod, interfaces in pods:
        listed = [{"name": name, "rxBytes": rx, "txBytes": tx} for name, (rx, tx) in interfaces.items()]
        default = next((entry for entry in listed if entry["name"] == "eth0"), {"name": ""})
        network: dict[str, Any] = {"time": "2026-01-01T00:00:00Z", **default}
        if listed:
            network["interfaces"] = listed
        entries.append(
            {"podRef": {"name": pod, "namespace": namespace, "uid": f"uid-{namespace}-{pod}"}, "network": network}
        )
    return {"node": {"nodeName": "", "network": {}}, "pods": entries}
