"""Generate the Grafana dashboards from code: ``python dashboards/generate.py``.

Writes ``dashboards/<name>.json`` (importable as-is: a ``datasource`` variable, no hard-coded
datasource) and ``manifests/base/grafana-dashboards.yaml`` (one ConfigMap per dashboard,
labelled for the Grafana sidecar). ``--check`` reports drift instead (exit 1); the tests run it.

Built with grafana-foundation-sdk pinned to its Grafana 11.6 build (the package carries one
epoch per Grafana release; unpinned, pip picks the 10.1 build). Panel queries use only
documented ``ccl_*`` metrics and the recording rules of ``alerts/ccl-health-rules.yaml``.

Every dashboard has a ``cluster`` variable and every panel query selects ``cluster=~"$cluster"``
and keeps ``cluster`` in each ``by``/``on`` list; its "All" is ``.*``, which also matches series
without the label, so a single-cluster Prometheus needs nothing. State values (port states,
NVLink state, verdicts, probe and collector success) are shown as words with colours, from the
exporter's own tables; panels that match an alert link its runbook (``RUNBOOK_BASE_URL`` of
``alerts/sync.py``, the one place that URL is set).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Run as a script, this file must read this checkout's exporter/ and alerts/, not an installed copy.
sys.path.insert(0, str(REPO))

from grafana_foundation_sdk.builders.dashboard import (  # noqa: E402
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery  # noqa: E402
from grafana_foundation_sdk.builders.stat import Panel as Stat  # noqa: E402
from grafana_foundation_sdk.builders.statetimeline import Panel as StateTimeline  # noqa: E402
from grafana_foundation_sdk.builders.table import Panel as Table  # noqa: E402
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models.common import BigValueColorMode, BigValueGraphMode  # noqa: E402
from grafana_foundation_sdk.models.dashboard import (  # noqa: E402
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
    VariableOption,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat  # noqa: E402

from alerts.sync import RUNBOOK_BASE_URL  # noqa: E402
from exporter.collectors.nccl.families import VERDICTS  # noqa: E402
from exporter.sources.rdma import PHYSICAL_PORT_STATES, PORT_STATES  # noqa: E402

OUT = REPO / "dashboards"
CONFIGMAPS = REPO / "manifests" / "base" / "grafana-dashboards.yaml"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["ccl-health"]
TITLES = {
    "ccl-fleet.json": "CCL health / Fleet",
    "ccl-training-job.json": "CCL health / Training job",
    "ccl-node-fabric.json": "CCL health / Node fabric",
}

CLUSTER = 'cluster=~"$cluster"'
JOB = 'namespace="$namespace", job_name="$job_name"'

GREEN, YELLOW, ORANGE, RED, BLUE = "green", "yellow", "orange", "red", "blue"
# A value the exporter emits -> (the words shown, their colour).
States = Mapping[int | str, tuple[str, str]]


def _port_state_colour(state: str, physical: str) -> str:
    if state.startswith("ACTIVE") and physical == "LinkUp":
        return GREEN
    if state in ("INIT", "ARMED") or state.startswith("ACTIVE"):
        return ORANGE  # trained but not in service yet (waiting for the subnet manager), or not LinkUp
    return RED


# Port-state panels show 10 x ccl_rdma_port_state_id + ccl_rdma_port_physical_state_id (45 is
# ACTIVE / LinkUp): one value per (state, physical state) pair the kernel names.
assert max(PHYSICAL_PORT_STATES) < 10, "the port-state encoding needs physical states below 10"
PORT_STATE: States = {
    10 * state + physical: (f"{state_name} / {physical_name}", _port_state_colour(state_name, physical_name))
    for state, state_name in PORT_STATES.items()
    for physical, physical_name in PHYSICAL_PORT_STATES.items()
}
NVLINK_STATE: States = {1: ("up", GREEN), 0: ("down", RED)}
COLLECTOR_SUCCESS: States = {1: ("ok", GREEN), 0: ("failing", RED)}
PROBE_SUCCESS: States = {1: ("passed", GREEN), 0: ("failed", RED)}
TCP_FALLBACK: States = {0: ("no", GREEN), 1: ("TCP fallback", RED)}
GDR_DISABLED: States = {0: ("no", GREEN), 1: ("GPUDirect RDMA off", ORANGE)}
# The pods table shows ccl_nccl_tcp_fallback + 2 x ccl_nccl_gdr_disabled (both 1/0).
POD_TRANSPORT: States = {
    0: ("ok", GREEN),
    1: ("TCP fallback", RED),
    2: ("GPUDirect RDMA off", ORANGE),
    3: ("TCP fallback + GPUDirect RDMA off", RED),
}
_VERDICT_WORDS = {
    "rdma": ("RDMA", GREEN),
    "single_node": ("single node", BLUE),
    "tcp_fallback": ("TCP fallback", RED),
    "unknown": ("unknown", YELLOW),
}
assert set(_VERDICT_WORDS) == set(VERDICTS), "every ccl_nccl_verdict state needs its words here"
VERDICT: States = {verdict: _VERDICT_WORDS[verdict] for verdict in VERDICTS}


def _uid(filename: str) -> str:
    return hashlib.md5(filename.encode()).hexdigest()


def _sel(metric: str, *matchers: str) -> str:
    """``metric{cluster=~"$cluster", <matchers>}``: every selector of every panel goes through here."""
    return f"{metric}{{{', '.join((CLUSTER, *matchers))}}}"


def _runbook_links(alerts: tuple[str, ...]) -> list[DashboardLink]:
    return [
        DashboardLink(f"Runbook: {alert}").type(DashboardLinkType.LINK).url(f"{RUNBOOK_BASE_URL}{alert}.md")
        .target_blank(True)
        for alert in alerts
    ]


def _dashboard_url(filename: str, *params: str) -> str:
    """A link into another of these dashboards keeping the time range, data source and cluster."""
    common = ("${__url_time_range}", "${datasource:queryparam}", "${cluster:queryparam}")
    return f"/d/{_uid(filename)}?" + "&".join((*params, *common))


TO_NODE = ("node", "Node fabric of ${__value.raw}", _dashboard_url("ccl-node-fabric.json", "var-node=${__value.raw}"))
TO_JOB = ("job_name", "Training job ${__data.fields.namespace}/${__value.raw}",
          _dashboard_url("ccl-training-job.json", "var-namespace=${__data.fields.namespace}",
                         "var-job_name=${__value.raw}"))


def _mappings(states: States) -> list[ValueMap]:
    options = {str(value): ValueMappingResult(text=text, color=colour, index=i)
               for i, (value, (text, colour)) in enumerate(states.items())}
    return [ValueMap(options)]


def _query(expr: str, legend: str = "", instant: bool = False, ref: str = "A") -> Dataquery:
    query = Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        query = query.legend_format(legend)
    if instant:
        query = query.instant().format(PromQueryFormat.TABLE)
    return query


def _timeseries(title: str, unit: str, *targets: tuple[str, str], description: str = "",
                alerts: tuple[str, ...] = ()) -> Timeseries:
    panel = Timeseries().title(title).unit(unit).datasource(DATASOURCE).height(8).span(12).links(_runbook_links(alerts))
    if description:
        panel = panel.description(description)
    for i, (expr, legend) in enumerate(targets):
        panel = panel.with_target(_query(expr, legend, ref=chr(ord("A") + i)))
    return panel


def _state_timeline(title: str, expr: str, legend: str, states: States, alerts: tuple[str, ...] = ()) -> StateTimeline:
    return (StateTimeline().title(title).datasource(DATASOURCE).height(8).span(12).unit("none")
            .mappings(_mappings(states)).links(_runbook_links(alerts)).with_target(_query(expr, legend)))


def _table(title: str, expr: str, *, value: str | None, unit: str = "none", states: States | None = None,
           label_states: tuple[tuple[str, States], ...] = (), columns_link: tuple[tuple[str, str, str], ...] = (),
           alerts: tuple[str, ...] = (), description: str = "", width: int = 12) -> Table:
    """An instant query as a table without its Time column; ``value`` names the Value column
    (``None`` hides it: an info metric's 1 says nothing). ``states`` shows the values as words with
    colours, ``label_states`` a label column's values (column, states); ``columns_link`` makes a
    label column (column, title, url) a link into another dashboard."""
    organize: dict[str, Any] = {"excludeByName": {"Time": True}, "renameByName": {}}
    if value is None:
        organize["excludeByName"]["Value"] = True
    else:
        organize["renameByName"]["Value"] = value
    panel = (Table().title(title).datasource(DATASOURCE).height(8).span(width).unit(unit)
             .with_transformation(DataTransformerConfig(id_val="organize", options=organize))
             .links(_runbook_links(alerts)).with_target(_query(expr, instant=True)))
    coloured = ((value, states),) if value is not None and states is not None else ()
    for column, column_states in (*coloured, *label_states):
        panel = panel.override_by_name(column, [
            DynamicConfigValue("mappings", _mappings(column_states)),
            DynamicConfigValue("custom.cellOptions", {"type": "color-background"}),
        ])
    for column, link_title, url in columns_link:
        panel = panel.override_by_name(column, [DynamicConfigValue("links", [{"title": link_title, "url": url}])])
    return panel.description(description) if description else panel


def _stat(title: str, expr: str, description: str) -> Stat:
    return (Stat().title(title).description(description).datasource(DATASOURCE).height(4).span(6).unit("none")
            .graph_mode(BigValueGraphMode.NONE).with_target(_query(expr, instant=True)))


def _thresholds(*steps: Threshold) -> ThresholdsConfig:
    return ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(list(steps))


def _count_stat(title: str, expr: str, description: str) -> Stat:
    """A count where any value is normal (nodes, pods): no colour that would suggest otherwise."""
    return (_stat(title, expr, description).thresholds(_thresholds(Threshold(value=None, color="text")))
            .color_mode(BigValueColorMode.NONE))


def _problem_stat(title: str, expr: str, description: str, colour: str, alerts: tuple[str, ...]) -> Stat:
    """A count of things that are wrong: green at 0, ``colour`` from 1, with the alert's runbook."""
    return (_stat(title, expr, description)
            .thresholds(_thresholds(Threshold(value=None, color=GREEN), Threshold(value=1, color=colour)))
            .color_mode(BigValueColorMode.BACKGROUND).links(_runbook_links(alerts)))


def _state_stat(title: str, expr: str, description: str, states: States, alerts: tuple[str, ...]) -> Stat:
    return (_stat(title, expr, description).mappings(_mappings(states))
            .color_mode(BigValueColorMode.BACKGROUND).links(_runbook_links(alerts)))


def _datasource_variable() -> DatasourceVariable:
    return DatasourceVariable("datasource").label("Data source").type("prometheus")


def _cluster_variable() -> QueryVariable:
    # "All" (.*) by default: it also matches series without a cluster label, so on a Prometheus
    # that has none the variable offers only "All" and every panel still shows its data.
    return (_label_variable("cluster", "label_values(ccl_exporter_build_info, cluster)", "Cluster")
            .include_all(True).all_value(".*").current(VariableOption(selected=True, text="All", value="$__all"))
            .description("The cluster label of Thanos, Mimir or federation; only All where series have none."))


def _label_variable(name: str, query: str, label: str, multi: bool = False) -> QueryVariable:
    variable = (QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC))
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".*")
    return variable


def _dashboard(filename: str, description: str) -> Dashboard:
    board = (Dashboard(TITLES[filename]).uid(_uid(filename)).description(description)
             .tags(TAGS).timezone("utc").refresh("30s").time("now-6h", "now").editable())
    for other, title in TITLES.items():
        if other != filename:
            board = board.link(DashboardLink(title).type(DashboardLinkType.LINK).url(f"/d/{_uid(other)}")
                               .icon("dashboard").include_vars(True).keep_time(True))
    return board.with_variable(_datasource_variable()).with_variable(_cluster_variable())


def _rate(by: str, metric: str, *matchers: str) -> str:
    """A counter's per-second rate over ``$__rate_interval``, summed by cluster and ``by``."""
    return f"sum by (cluster, {by}) (rate({_sel(metric, *matchers)}[$__rate_interval]))"


# The per-link NVLink panels: the exporter exports per-link series only when asked.
PER_LINK_ONLY = ("Per link: only where the exporter runs with --collector.nvml.nvlink-granularity=link "
                 "(the default, gpu, exports the per-GPU series above).")


def _nvlinks_down(*matchers: str) -> str:
    """NVLinks down per GPU, from the per-GPU series the exporter keeps in either NVLink mode."""
    return f"({_sel('ccl_nvlink_gpu_links', *matchers)} - {_sel('ccl_nvlink_gpu_links_active', *matchers)})"


def _ports_not_active(by: str, *matchers: str) -> str:
    """Ports whose logical state is not ACTIVE (4) or ACTIVE_DEFER (5), from the exporter's series."""
    return f"max by ({by}) ({_sel('ccl_rdma_port_state_id', *matchers)}) < 4"


def _port_state(by: str, *matchers: str) -> str:
    """10 x logical state + physical state per port (see PORT_STATE)."""
    return (f"max by ({by}) ({_sel('ccl_rdma_port_state_id', *matchers)}) * 10"
            f" + on ({by}) max by ({by}) ({_sel('ccl_rdma_port_physical_state_id', *matchers)})")


# ---- GPU <-> NIC topology panels (node and job dashboards) ----

AFFINITY_HELP = ("Classes as nvidia-smi topo -m names them: PIX one PCIe switch between GPU and NIC, PXB several "
                 "switches, PHB through the host bridge, NODE across host bridges of one NUMA node, SYS across "
                 "NUMA nodes (the CPU interconnect). PIX/PXB are local: GPUDirect RDMA by default.")


def _affinity_matrix(node: str) -> Table:
    """GPU x NIC matrix: one row per GPU, one column per RDMA NIC, the class in each cell."""
    matrix = DataTransformerConfig(
        id_val="groupingToMatrix",
        options={"rowField": "gpu", "columnField": "device", "valueField": "affinity", "emptyValue": "null"},
    )
    panel = _table("GPU x NIC affinity (rows: GPU, columns: NIC)",
                   f"max by (cluster, gpu, device, affinity) ({_sel('ccl_topology_gpu_nic_info', node)})",
                   value=None, width=24,
                   description="Read along a GPU's row: its NIC under the same PCIe switch shows PIX; on an HGX/DGX "
                               "node each GPU has exactly one, the NICs of its socket show NODE and the other "
                               "socket's SYS. An empty cell: sysfs does not tell. " + AFFINITY_HELP)
    return panel.with_transformation(matrix)


def node_topology_panels(node: str) -> list[Table]:
    """Node fabric dashboard: where GPUs and NICs sit, what pods were given and what NCCL uses."""
    return [
        _affinity_matrix(node),
        _table("Nearest NIC per GPU",
               f"max by (cluster, gpu, device, affinity) ({_sel('ccl_topology_gpu_nearest_nic_info', node)})",
               value=None,
               description="The NIC(s) nearest to each GPU and their class; absent for a GPU whose distance to "
                           "some NIC is unknown."),
        _table("RDMA NICs given to pods",
               "max by (cluster, namespace, pod, device, source, resource) "
               f"({_sel('ccl_pod_rdma_device_info', node)})",
               value=None, alerts=("CclPodFewerRdmaNicsThanGpus",),
               description="Per pod: the NICs from device plugins, DRA claims (source dra) and Multus "
                           "(source multus)."),
        _table("NCCL: the NIC each GPU's traffic uses",
               "max by (cluster, namespace, pod, gpu, device, affinity, gdr) "
               f"({_sel('ccl_nccl_nic_affinity', node)})",
               value=None, width=24, alerts=("CclNcclNicAffinityCrossed",),
               description="From the pods' NCCL logs. A far class (PHB, NODE, SYS) on a GPU whose nearest NIC is "
                           "PIX/PXB is a crossed rail (alert CclNcclNicAffinityCrossed). " + AFFINITY_HELP),
    ]


def job_topology_panels() -> list[Table]:
    """Training-job dashboard: each pod's GPU -> NIC path with its class."""
    return [
        _table("GPU -> NIC path per pod (class)",
               f"max by (cluster, pod, node, gpu, device, affinity, gdr) ({_sel('ccl_nccl_nic_affinity', JOB)})",
               value=None, width=24, alerts=("CclNcclNicAffinityCrossed",),
               description="Which NIC each GPU's NCCL traffic leaves through, from the pods' NCCL logs, and the "
                           "PCIe class of that path on the pod's node. Expected: PIX (or PXB) for every GPU; "
                           "gdr true. " + AFFINITY_HELP),
    ]


UNKNOWN_SHARE_HELP = ("Where detection is blind: the share of each namespace's GPU pods whose NCCL verdict is unknown "
                      "(their logs do not show the network: NCCL_DEBUG is not INFO, or NCCL has not initialised "
                      "yet). A TCP fallback of those pods is never paged from the log, only suspected from their "
                      "traffic. Pods that never use NCCL across nodes are unknown by nature.")


def fleet() -> Dashboard:
    node = 'node=~"$node"'
    return (
        _dashboard("ccl-fleet.json",
                   "Which training jobs run off their fabric, which nodes have fabric faults, "
                   "probe bandwidth across nodes.")
        .with_variable(_label_variable("node", f"label_values(ccl_exporter_build_info{{{CLUSTER}}}, node)", "Node",
                                       multi=True))
        .with_row(Row("Training jobs"))
        .with_panel(_problem_stat("Jobs on TCP fallback",
                                  f"count({_sel('job_name:ccl_nccl_tcp_fallback:max')} == 1) or vector(0)",
                                  "Multi-node jobs whose NCCL inter-node traffic runs over TCP sockets on RDMA nodes.",
                                  RED, ("CclNcclTcpFallback",)))
        .with_panel(_problem_stat("Jobs without GPUDirect RDMA",
                                  f"count({_sel('job_name:ccl_nccl_gdr_disabled:max')} == 1) or vector(0)",
                                  "Jobs whose inter-node channels stage data through host memory.",
                                  ORANGE, ("CclNcclGdrDisabled",)))
        .with_panel(_problem_stat("Nodes with RDMA ports down",
                                  "count(count by (cluster, node) "
                                  f"({_ports_not_active('cluster, node, device, port', node)})) or vector(0)",
                                  "Nodes with at least one RDMA port not ACTIVE. Spare ports count too, so this "
                                  "can be above 0 on a healthy fleet: the alert only pages for in-service ports.",
                                  ORANGE, ("CclRdmaPortDown",)))
        .with_panel(_problem_stat("Nodes with NVLinks down",
                                  "count(count by (cluster, node) "
                                  f"({_nvlinks_down(node)} > 0)) or vector(0)",
                                  "Nodes with at least one NVLink down. PCIe GPUs without NVLink count too; the "
                                  "alert only fires where other links of the node are up.",
                                  ORANGE, ("CclNvlinkDown",)))
        .with_panel(_table("Jobs on TCP fallback", f"{_sel('job_name:ccl_nccl_tcp_fallback:max')} == 1", value=None,
                           columns_link=(TO_JOB,), alerts=("CclNcclTcpFallback",)))
        .with_panel(_table("Jobs without GPUDirect RDMA", f"{_sel('job_name:ccl_nccl_gdr_disabled:max')} == 1",
                           value=None, columns_link=(TO_JOB,), alerts=("CclNcclGdrDisabled",)))
        .with_panel(_table("Multi-node jobs (nodes per job)", f"{_sel('job_name:ccl_nccl_nodes:count')} > 1",
                           value="Nodes", columns_link=(TO_JOB,),
                           description="Jobs known from NCCL logs that span more than one node, and how many."))
        .with_panel(_table("GPU pods per node", _sel("node:ccl_gpu_pods:count", node), value="GPU pods",
                           columns_link=(TO_NODE,)))
        .with_panel(_timeseries("GPU pods without an NCCL verdict, share by namespace", "percentunit",
                                (_sel("namespace:ccl_nccl_verdict_unknown:ratio"), "{{namespace}}"),
                                alerts=("CclNcclVerdictsUnknown",), description=UNKNOWN_SHARE_HELP))
        .with_panel(_table("GPU pods without an NCCL verdict (unknown), by namespace",
                           f"sort_desc({_sel('namespace:ccl_nccl_verdict_unknown:ratio')})", value="Unknown",
                           unit="percentunit", alerts=("CclNcclVerdictsUnknown",), description=UNKNOWN_SHARE_HELP))
        .with_row(Row("Nodes with fabric problems"))
        .with_panel(_table("RDMA ports not ACTIVE",
                           f"({_port_state('cluster, node, device, port', node)}) and on (cluster, node, device, port) "
                           f"({_ports_not_active('cluster, node, device, port', node)})",
                           value="State", states=PORT_STATE, columns_link=(TO_NODE,), alerts=("CclRdmaPortDown",),
                           description="Logical / physical state of every port that is not ACTIVE (spare ports too)."))
        .with_panel(_table("RDMA error counters rising (last hour)",
                           "sum by (cluster, node, device, port, counter) (increase("
                           + _sel("ccl_rdma_port_errors_total", node,
                                  'counter=~"symbol_error|link_downed|link_error_recovery|port_rcv_errors|'
                                  'local_link_integrity_errors|excessive_buffer_overrun_errors|'
                                  'port_rcv_remote_physical_errors|port_xmit_discards"')
                           + "[1h])) > 0",
                           value="Increase (1h)", columns_link=(TO_NODE,), alerts=("CclRdmaPortErrorsIncreasing",)))
        .with_panel(_table("NVLink errors rising (last hour)",
                           "sum by (cluster, node, gpu, error) "
                           f"(increase({_sel('ccl_nvlink_gpu_errors_total', node)}[1h])) > 0",
                           value="Increase (1h)", columns_link=(TO_NODE,), alerts=("CclNvlinkErrorsIncreasing",)))
        .with_panel(_table("Exporter collectors failing",
                           f"max by (cluster, node, collector) ({_sel('ccl_exporter_collector_success', node)}) == 0",
                           value="Status", states=COLLECTOR_SUCCESS, columns_link=(TO_NODE,),
                           alerts=("CclExporterCollectorFailing", "CclExporterCollectorUnavailable")))
        .with_row(Row("Probe bus bandwidth and traffic"))
        .with_panel(_timeseries("Probe bus bandwidth (best size per run)", "Bps",
                                (_sel("node:ccl_probe_bus_bandwidth_bytes_per_second:max", node),
                                 "{{node}} {{collective}} {{scope}} {{source}}"),
                                alerts=("CclProbeBusBandwidthBelowFloor",)))
        .with_panel(_timeseries("Probe bus bandwidth, 7-day median", "Bps",
                                # Recorded once an hour: the last two hourly values, as the alert reads it.
                                (f'max_over_time({_sel("node:ccl_probe_bus_bandwidth_bytes_per_second:median7d", node)}[2h])',
                                 "{{node}} {{collective}} {{scope}} {{source}}"),
                                alerts=("CclProbeBusBandwidthBelowBaseline",)))
        .with_panel(_timeseries("RDMA throughput per node", "Bps",
                                (_sel("node:ccl_rdma_transmit_bytes:rate5m", node), "{{node}} tx"),
                                (_sel("node:ccl_rdma_receive_bytes:rate5m", node), "{{node}} rx")))
        .with_panel(_timeseries("NVLink throughput per node", "Bps",
                                (_sel("node:ccl_nvlink_transmit_bytes:rate5m", node), "{{node}} tx"),
                                (_sel("node:ccl_nvlink_receive_bytes:rate5m", node), "{{node}} rx")))
    )


def _with_panels(dashboard: Dashboard, panels: list[Table]) -> Dashboard:
    for panel in panels:
        dashboard = dashboard.with_panel(panel)
    return dashboard


def training_job() -> Dashboard:
    on_job_nodes = f"and on (cluster, node) {_sel('job_name_node:ccl_nccl_pods:count', JOB)}"
    pod_transport = (f"(max by (cluster, pod, node, job_kind) ({_sel('ccl_nccl_tcp_fallback', JOB)})"
                     f" + on (cluster, pod, node) group_left () 2 * max by (cluster, pod, node) "
                     f"({_sel('ccl_nccl_gdr_disabled', JOB)}))"
                     f" * on (cluster, pod, node) group_left (verdict) max by (cluster, pod, node, verdict) "
                     f"({_sel('ccl_nccl_verdict', JOB)} == 1)")
    dashboard = _with_in_job_collectives(
        _dashboard("ccl-training-job.json",
                   "One training job: its pods and nodes, NCCL networks and transports per communicator, "
                   "fabric throughput of its nodes, probe history.")
        .with_variable(_label_variable("namespace", f"label_values(ccl_nccl_communicator_info{{{CLUSTER}}}, namespace)",
                                       "Namespace"))
        .with_variable(_label_variable("job_name",
                                       f'label_values(ccl_nccl_communicator_info{{{CLUSTER}, namespace="$namespace"}}, '
                                       "job_name)", "Training job"))
        .with_row(Row("Transport"))
        .with_panel(_state_stat("TCP fallback", f"max({_sel('job_name:ccl_nccl_tcp_fallback:max', JOB)})",
                                "Whether inter-node NCCL traffic of the job runs over TCP sockets.",
                                TCP_FALLBACK, ("CclNcclTcpFallback",)))
        .with_panel(_state_stat("GPUDirect RDMA disabled", f"max({_sel('job_name:ccl_nccl_gdr_disabled:max', JOB)})",
                                "Whether inter-node channels of the job stage data through host memory.",
                                GDR_DISABLED, ("CclNcclGdrDisabled",)))
        .with_panel(_count_stat("Nodes", f"sum({_sel('job_name:ccl_nccl_nodes:count', JOB)})",
                                "Nodes the job's NCCL pods run on."))
        .with_panel(_count_stat("Pods", f"sum({_sel('job_name:ccl_nccl_pods:count', JOB)})",
                                "Pods of the job seen in NCCL logs."))
        .with_panel(_table("Pods and nodes (TCP fallback, GPUDirect off)", pod_transport, value="Transport",
                           states=POD_TRANSPORT, label_states=(("verdict", VERDICT),), columns_link=(TO_NODE,),
                           alerts=("CclNcclTcpFallback", "CclNcclGdrDisabled"),
                           description="Transport: TCP fallback and GPUDirect RDMA off per pod; verdict: what "
                                       "the pod's NCCL log shows (rdma, single_node, tcp_fallback, unknown)."))
        .with_panel(_table("Communicators (network per communicator)",
                           "max by (cluster, pod, comm_id, nranks, nnodes, network, nccl_version) "
                           f"({_sel('ccl_nccl_communicator_info', JOB)})", value=None))
        .with_panel(_table("Connections per communicator by transport",
                           f"sum by (cluster, comm_id, transport, scope, gdr) ({_sel('ccl_nccl_connections', JOB)})",
                           value="Connections", width=24))
        .with_panel(_timeseries("Connections by transport", "none",
                                (_sel("job_name_transport_scope:ccl_nccl_connections:sum", JOB),
                                 "{{transport}} {{scope}} gdr={{gdr}}")))
        .with_panel(_timeseries("NCCL warnings", "none",
                                ("sum by (cluster, pod, category) "
                                 f"(increase({_sel('ccl_nccl_warnings_total', JOB)}[$__rate_interval]))",
                                 "{{pod}} {{category}}"),
                                description="Warnings per $__rate_interval window."))
        .with_row(Row("Fabric throughput of the job's nodes"))
        .with_panel(_timeseries("RDMA throughput (job's nodes, total)", "Bps",
                                (_sel("job_name:ccl_rdma_transmit_bytes:rate5m", JOB), "tx"),
                                (_sel("job_name:ccl_rdma_receive_bytes:rate5m", JOB), "rx")))
        .with_panel(_timeseries("NVLink throughput (job's nodes, total)", "Bps",
                                (_sel("job_name:ccl_nvlink_transmit_bytes:rate5m", JOB), "tx"),
                                (_sel("job_name:ccl_nvlink_receive_bytes:rate5m", JOB), "rx")))
        .with_panel(_timeseries("RDMA throughput per node", "Bps",
                                (f"{_sel('node:ccl_rdma_transmit_bytes:rate5m')} {on_job_nodes}", "{{node}} tx"),
                                (f"{_sel('node:ccl_rdma_receive_bytes:rate5m')} {on_job_nodes}", "{{node}} rx")))
        .with_panel(_timeseries("NVLink throughput per node", "Bps",
                                (f"{_sel('node:ccl_nvlink_transmit_bytes:rate5m')} {on_job_nodes}", "{{node}} tx"),
                                (f"{_sel('node:ccl_nvlink_receive_bytes:rate5m')} {on_job_nodes}", "{{node}} rx")))
        .with_row(Row("Probe history on the job's nodes"))
        .with_panel(_timeseries("Probe bus bandwidth (best size per run)", "Bps",
                                (f"{_sel('node:ccl_probe_bus_bandwidth_bytes_per_second:max')} {on_job_nodes}",
                                 "{{node}} {{collective}} {{scope}} {{source}}"),
                                alerts=("CclProbeBusBandwidthBelowFloor", "CclProbeBusBandwidthBelowBaseline")))
        .with_panel(_state_timeline("Probe success",
                                    "max by (cluster, node, collective, scope, source) "
                                    f"({_sel('ccl_probe_success')}) {on_job_nodes}",
                                    "{{node}} {{collective}} {{scope}} {{source}}", PROBE_SUCCESS,
                                    alerts=("CclProbeFailing",)))
    )
    return _with_panels(dashboard.with_row(Row("GPU to NIC paths")), job_topology_panels())


# Size classes whose bus bandwidth is bandwidth-bound (what CclJobBusBandwidthDegraded compares).
LARGE = 'size_class=~"10MB_100MB|100MB_1GB|ge_1GB"'


def _with_in_job_collectives(board: Dashboard) -> Dashboard:
    """The training-job dashboard's row of in-job collectives (NCCL Inspector, collector
    ``inspector``): bus bandwidth per collective and size class, with the job's transport
    verdict beside it, time spent in collectives, and large collectives against the floor."""
    by = "collective, scope, size_class"
    busbw = (f"{_rate(by, 'ccl_nccl_collective_bus_bytes_total', JOB)}"
             f" / {_rate(by, 'ccl_nccl_collective_seconds_total', JOB)}")
    node_rule = "job_name_node_collective:ccl_nccl_collective_bus_bandwidth_bytes_per_second"
    return (
        board.with_row(Row("In-job bus bandwidth (NCCL Inspector)"))
        .with_panel(_timeseries("In-job bus bandwidth per collective and size class", "Bps",
                                (busbw, "{{collective}} {{scope}} {{size_class}}"),
                                description="Bus bandwidth the job's collectives got, measured inside the job by "
                                "the NCCL Inspector: bus bytes (nccl-tests size x bus factor) over time, all its "
                                "pods together. Sizes under 10 MB are latency-bound.",
                                alerts=("CclJobBusBandwidthDegraded",)).span(16))
        .with_panel(_table("Transport verdict", f"max by (cluster, pod, node, verdict) ({_sel('ccl_nccl_verdict', JOB)} == 1)",
                           value=None, label_states=(("verdict", VERDICT),),
                           description="The NCCL transport verdict of each pod of the job (from its NCCL log).",
                           width=8))
        .with_panel(_timeseries("Time in collectives", "s",
                                (_rate("collective, size_class", "ccl_nccl_collective_seconds_total", JOB),
                                 "{{collective}} {{size_class}}"),
                                description="Seconds per second the job's ranks spend in each kind of collective "
                                "(8 ranks each busy half the time: 4)."))
        .with_panel(_timeseries("Large collectives per node against the network floor", "Bps",
                                (_sel(f"{node_rule}:rate5m", JOB, LARGE),
                                 "{{node}} {{collective}} {{scope}} {{size_class}}"),
                                (f"{_sel('node_collective:ccl_nccl_collective_bus_bandwidth_bytes_per_second:floor')}"
                                 " and on (cluster, node, collective, scope) "
                                 f"{_sel(f'{node_rule}:rate5m', JOB)}", "floor {{node}} {{collective}} {{scope}}"),
                                description="What CclJobBusBandwidthDegraded compares: the job's 5-minute bus "
                                "bandwidth per node, and the least its node's network should give: half the probe's "
                                "7-day median on the node (drawn), and never under the scope's fixed floor (20 GB/s "
                                "inter-node, 50 GB/s intra-node; not drawn).",
                                alerts=("CclJobBusBandwidthDegraded",)))
    )


def node_fabric() -> Dashboard:
    node = 'node="$node"'
    dashboard = (
        _dashboard("ccl-node-fabric.json",
                   "One node: per-port RDMA throughput, errors and congestion; "
                   "per-link NVLink throughput, state and errors.")
        .with_variable(_label_variable("node", f"label_values(ccl_exporter_build_info{{{CLUSTER}}}, node)", "Node"))
        .with_row(Row("RDMA ports"))
        .with_panel(_table("Ports", "max by (cluster, device, port, link_layer, netdev, hca_type, firmware_version, "
                                    f"board_id) ({_sel('ccl_rdma_port_info', node)})", value=None, width=24))
        .with_panel(_table("Port state (logical / physical)", _port_state("cluster, device, port", node),
                           value="State", states=PORT_STATE, alerts=("CclRdmaPortDown",),
                           description="ACTIVE / LinkUp is healthy; INIT or ARMED with LinkUp waits for the "
                                       "subnet manager; DOWN / Polling has no link partner (cable, switch port)."))
        .with_panel(_table("Port rate",
                           f"max by (cluster, device, port) ({_sel('ccl_rdma_port_rate_bytes_per_second', node)})",
                           value="Rate", unit="Bps", alerts=("CclRdmaPortRateDegraded",)))
        .with_panel(_timeseries("RDMA throughput per port", "Bps",
                                (_rate("device, port", "ccl_rdma_port_transmit_bytes_total", node),
                                 "{{device}}/{{port}} tx"),
                                (_rate("device, port", "ccl_rdma_port_receive_bytes_total", node),
                                 "{{device}}/{{port}} rx")))
        .with_panel(_timeseries("RDMA packets per port", "pps",
                                (_rate("device, port", "ccl_rdma_port_transmit_packets_total", node),
                                 "{{device}}/{{port}} tx"),
                                (_rate("device, port", "ccl_rdma_port_receive_packets_total", node),
                                 "{{device}}/{{port}} rx")))
        .with_panel(_timeseries("Port error counters", "cps",
                                (_rate("device, port, counter", "ccl_rdma_port_errors_total", node) + " > 0",
                                 "{{device}}/{{port}} {{counter}}"),
                                alerts=("CclRdmaPortErrorsIncreasing",)))
        .with_panel(_timeseries("Congestion: CNPs, ECN marks, transmit wait", "cps",
                                (_rate("device, port, counter", "ccl_rdma_port_hw_counters_total", node,
                                       'counter=~"np_cnp_sent|rp_cnp_handled|np_ecn_marked_roce_packets"'),
                                 "{{device}}/{{port}} {{counter}}"),
                                (_rate("device, port", "ccl_rdma_port_transmit_wait_total", node),
                                 "{{device}}/{{port}} transmit wait (ticks)"),
                                alerts=("CclRoceCongestionHigh",)))
        .with_panel(_timeseries("RDMA transport errors (hw counters)", "cps",
                                (_rate("device, port, counter", "ccl_rdma_port_hw_counters_total", node,
                                       'counter=~"out_of_sequence|local_ack_timeout_err|out_of_buffer|'
                                       'packet_seq_err|rnr_nak_retry_err"'),
                                 "{{device}}/{{port}} {{counter}}")))
        .with_row(Row("NVLink"))
        .with_panel(_table("GPUs", f"max by (cluster, gpu, name, uuid, pci_bus_id) ({_sel('ccl_gpu_info', node)})",
                           value=None))
        .with_panel(_table("Pods holding GPUs",
                           f"max by (cluster, gpu, namespace, pod, container) ({_sel('ccl_gpu_pod_info', node)})",
                           value=None))
        .with_panel(_table("NVLinks down per GPU", f"max by (cluster, gpu) {_nvlinks_down(node)}",
                           value="Links down", alerts=("CclNvlinkDown",),
                           description="Per GPU, in either NVLink mode of the exporter (per link or per GPU)."))
        .with_panel(_timeseries("NVLink throughput per GPU", "Bps",
                                (_rate("gpu", "ccl_nvlink_gpu_transmit_bytes_total", node), "GPU {{gpu}} tx"),
                                (_rate("gpu", "ccl_nvlink_gpu_receive_bytes_total", node), "GPU {{gpu}} rx")))
        .with_panel(_timeseries("NVLink errors per GPU", "cps",
                                (_rate("gpu, error", "ccl_nvlink_gpu_errors_total", node) + " > 0",
                                 "GPU {{gpu}} {{error}}"),
                                alerts=("CclNvlinkErrorsIncreasing",),
                                description="Per GPU, in either NVLink mode of the exporter (per link or per GPU)."))
        .with_panel(_table("NVLink state", f"min by (cluster, gpu, link) ({_sel('ccl_nvlink_state', node)})",
                           value="State", states=NVLINK_STATE, alerts=("CclNvlinkDown",),
                           description=PER_LINK_ONLY))
        .with_panel(_timeseries("NVLink errors per link", "cps",
                                (_rate("gpu, link, error", "ccl_nvlink_errors_total", node) + " > 0",
                                 "GPU {{gpu}} link {{link}} {{error}}"),
                                alerts=("CclNvlinkErrorsIncreasing",), description=PER_LINK_ONLY))
        .with_panel(_timeseries("NVLink transmit per link", "Bps",
                                (_rate("gpu, link", "ccl_nvlink_transmit_bytes_total", node),
                                 "GPU {{gpu}} link {{link}}"), description=PER_LINK_ONLY))
        .with_panel(_timeseries("NVLink receive per link", "Bps",
                                (_rate("gpu, link", "ccl_nvlink_receive_bytes_total", node),
                                 "GPU {{gpu}} link {{link}}"), description=PER_LINK_ONLY))
        .with_row(Row("Exporter"))
        .with_panel(_table("Collectors",
                           f"max by (cluster, collector) ({_sel('ccl_exporter_collector_success', node)})",
                           value="Status", states=COLLECTOR_SUCCESS,
                           alerts=("CclExporterCollectorFailing", "CclExporterCollectorUnavailable")))
        .with_panel(_timeseries("Collector duration", "s",
                                ("max by (cluster, collector) "
                                 f"({_sel('ccl_exporter_collector_duration_seconds', node)})",
                                 "{{collector}}")))
    )
    return _with_panels(dashboard.with_row(Row("GPU and NIC topology")), node_topology_panels(node))


DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "ccl-fleet.json": fleet,
    "ccl-training-job.json": training_job,
    "ccl-node-fabric.json": node_fabric,
}


def render(build: Callable[[], Dashboard]) -> str:
    return json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def configmaps(rendered: dict[str, str]) -> str:
    docs = ["# Generated by `python dashboards/generate.py`; do not edit.\n"
            "# One ConfigMap per dashboard (a combined one would pass kubectl's annotation size limit);\n"
            "# the Grafana sidecar imports every ConfigMap labelled grafana_dashboard: \"1\".\n"]
    for filename, text in rendered.items():
        body = "".join(f"    {line}" for line in text.splitlines(keepends=True))
        docs.append(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
            f"  name: grafana-dashboard-{filename.removesuffix('.json')}\n"
            "  labels:\n    grafana_dashboard: \"1\"\n"
            f"data:\n  {filename}: |\n{body}"
        )
    return "---\n".join(docs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    rendered = {filename: render(build) for filename, build in DASHBOARDS.items()}
    wanted = {OUT / filename: text for filename, text in rendered.items()}
    wanted[CONFIGMAPS] = configmaps(rendered)
    drift = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in drift:
            print(f"{path.relative_to(REPO)} is out of date: run python dashboards/generate.py", file=sys.stderr)
        return 1 if drift else 0
    for path in drift:
        path.write_text(wanted[path])
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
