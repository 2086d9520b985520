"""Generate the Grafana dashboards from code: ``python dashboards/generate.py``.

Writes ``dashboards/<name>.json`` (importable as-is: a ``datasource`` variable, no hard-coded
datasource) and ``manifests/base/grafana-dashboards.yaml`` (one ConfigMap per dashboard,
labelled for the Grafana sidecar). ``--check`` reports drift instead (exit 1); the tests run it.

Built with grafana-foundation-sdk pinned to its Grafana 11.6 build (the package carries one
epoch per Grafana release; unpinned, pip picks the 10.1 build). Panel queries use only
documented ``ccl_*`` metrics and the recording rules of ``alerts/ccl-health-rules.yaml``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.table import Panel as Table
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableHide,
    VariableRefresh,
    VariableSort,
)

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "dashboards"
CONFIGMAPS = REPO / "manifests" / "base" / "grafana-dashboards.yaml"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["ccl-health"]

JOB = 'namespace="$namespace", job_name="$job_name"'


def _query(expr: str, legend: str = "", instant: bool = False, ref: str = "A") -> Dataquery:
    query = Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        query = query.legend_format(legend)
    if instant:
        query = query.instant().format(PromQueryFormat.TABLE)
    return query


def _timeseries(title: str, unit: str, *targets: tuple[str, str], description: str = "") -> Timeseries:
    panel = Timeseries().title(title).unit(unit).datasource(DATASOURCE).height(8).span(12)
    if description:
        panel = panel.description(description)
    for i, (expr, legend) in enumerate(targets):
        panel = panel.with_target(_query(expr, legend, ref=chr(ord("A") + i)))
    return panel


def _table(title: str, expr: str, description: str = "", width: int = 12) -> Table:
    panel = Table().title(title).datasource(DATASOURCE).height(8).span(width).with_target(_query(expr, instant=True))
    return panel.description(description) if description else panel


def _stat(title: str, expr: str, description: str) -> Stat:
    thresholds = ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=None, color="green"), Threshold(value=1, color="red")]
    )
    return (Stat().title(title).description(description).datasource(DATASOURCE).height(4).span(6)
            .thresholds(thresholds).with_target(_query(expr, instant=True)))


def _datasource_variable() -> DatasourceVariable:
    return DatasourceVariable("datasource").label("Data source").type("prometheus")


def _label_variable(name: str, query: str, label: str, multi: bool = False) -> QueryVariable:
    variable = (QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
                .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC))
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".*")
    return variable


def _dashboard(filename: str, title: str, description: str) -> Dashboard:
    return (Dashboard(title).uid(hashlib.md5(filename.encode()).hexdigest()).description(description)
            .tags(TAGS).timezone("utc").refresh("30s").time("now-6h", "now").editable()
            .with_variable(_datasource_variable()))


def fleet() -> Dashboard:
    node_sel = 'node=~"$node"'
    return (
        _dashboard("ccl-fleet.json", "CCL health / Fleet",
                   "Which training jobs run off their fabric, which nodes have fabric faults, probe bandwidth across nodes.")
        .with_variable(_label_variable("node", "label_values(ccl_exporter_build_info, node)", "Node", multi=True))
        .with_row(Row("Training jobs"))
        .with_panel(_stat("Jobs on TCP fallback", "count(job_name:ccl_nccl_tcp_fallback:max == 1) or vector(0)",
                          "Multi-node jobs whose NCCL inter-node traffic runs over TCP sockets on RDMA nodes."))
        .with_panel(_stat("Jobs without GPUDirect RDMA", "count(job_name:ccl_nccl_gdr_disabled:max == 1) or vector(0)",
                          "Jobs whose inter-node channels stage data through host memory."))
        .with_panel(_stat("Nodes with RDMA ports down",
                          f"count(count by (node) (node_device_port:ccl_rdma_port_active:bool{{{node_sel}}} == 0)) or vector(0)",
                          "Nodes with at least one RDMA port not ACTIVE (spare ports included)."))
        .with_panel(_stat("Nodes with NVLinks down",
                          f"count(count by (node) (ccl_nvlink_state{{{node_sel}}} == 0)) or vector(0)",
                          "Nodes with at least one NVLink down (PCIe GPUs without NVLink count too)."))
        .with_panel(_table("Jobs on TCP fallback", "job_name:ccl_nccl_tcp_fallback:max == 1"))
        .with_panel(_table("Jobs without GPUDirect RDMA", "job_name:ccl_nccl_gdr_disabled:max == 1"))
        .with_panel(_table("Multi-node jobs (nodes per job)", "job_name:ccl_nccl_nodes:count > 1",
                           "Jobs known from NCCL logs that span more than one node, and how many."))
        .with_panel(_table("GPU pods per node", f"node:ccl_gpu_pods:count{{{node_sel}}}"))
        .with_row(Row("Nodes with fabric problems"))
        .with_panel(_table("RDMA ports not ACTIVE", f"node_device_port:ccl_rdma_port_active:bool{{{node_sel}}} == 0"))
        .with_panel(_table("RDMA error counters rising (last hour)",
                           f"sum by (node, device, port, counter) (increase(ccl_rdma_port_errors_total{{{node_sel}, "
                           'counter=~"symbol_error|link_downed|link_error_recovery|port_rcv_errors|'
                           'local_link_integrity_errors|excessive_buffer_overrun_errors|port_rcv_remote_physical_errors|'
                           'port_xmit_discards"}[1h])) > 0'))
        .with_panel(_table("NVLink errors rising (last hour)",
                           f"sum by (node, gpu, link, error) (increase(ccl_nvlink_errors_total{{{node_sel}}}[1h])) > 0"))
        .with_panel(_table("Exporter collectors failing",
                           f"max by (node, collector) (ccl_exporter_collector_success{{{node_sel}}}) == 0"))
        .with_row(Row("Probe bus bandwidth and traffic"))
        .with_panel(_timeseries("Probe bus bandwidth (best size per run)", "Bps",
                                (f"node:ccl_probe_bus_bandwidth_bytes_per_second:max{{{node_sel}}}",
                                 "{{node}} {{collective}} {{scope}} {{source}}")))
        .with_panel(_timeseries("Probe bus bandwidth, 7-day median", "Bps",
                                (f"node:ccl_probe_bus_bandwidth_bytes_per_second:median7d{{{node_sel}}}",
                                 "{{node}} {{collective}} {{scope}} {{source}}")))
        .with_panel(_timeseries("RDMA throughput per node", "Bps",
                                (f"node:ccl_rdma_transmit_bytes:rate5m{{{node_sel}}}", "{{node}} tx"),
                                (f"node:ccl_rdma_receive_bytes:rate5m{{{node_sel}}}", "{{node}} rx")))
        .with_panel(_timeseries("NVLink throughput per node", "Bps",
                                (f"node:ccl_nvlink_transmit_bytes:rate5m{{{node_sel}}}", "{{node}} tx"),
                                (f"node:ccl_nvlink_receive_bytes:rate5m{{{node_sel}}}", "{{node}} rx")))
    )


def training_job() -> Dashboard:
    on_job_nodes = f"and on (node) job_name_node:ccl_nccl_pods:count{{{JOB}}}"
    return _with_in_job_collectives(
        _dashboard("ccl-training-job.json", "CCL health / Training job",
                   "One training job: its pods and nodes, NCCL networks and transports per communicator, "
                   "fabric throughput of its nodes, probe history.")
        .with_variable(_label_variable("namespace", "label_values(ccl_nccl_communicator_info, namespace)", "Namespace"))
        .with_variable(_label_variable("job_name", 'label_values(ccl_nccl_communicator_info{namespace="$namespace"}, job_name)',
                                       "Training job"))
        .with_row(Row("Transport"))
        .with_panel(_stat("TCP fallback", f"max(job_name:ccl_nccl_tcp_fallback:max{{{JOB}}})",
                          "1: inter-node NCCL traffic runs over TCP sockets."))
        .with_panel(_stat("GPUDirect RDMA disabled", f"max(job_name:ccl_nccl_gdr_disabled:max{{{JOB}}})",
                          "1: inter-node channels stage data through host memory."))
        .with_panel(_stat("Nodes", f"sum(job_name:ccl_nccl_nodes:count{{{JOB}}})", "Nodes the job's NCCL pods run on."))
        .with_panel(_stat("Pods", f"sum(job_name:ccl_nccl_pods:count{{{JOB}}})", "Pods of the job seen in NCCL logs."))
        .with_panel(_table("Pods and nodes (TCP fallback, GPUDirect off)",
                           f"max by (pod, node, job_kind) (ccl_nccl_tcp_fallback{{{JOB}}})"
                           f" + on (pod, node) group_left () 2 * max by (pod, node) (ccl_nccl_gdr_disabled{{{JOB}}})",
                           "Value: 0 healthy, 1 TCP fallback, 2 GPUDirect off, 3 both."))
        .with_panel(_table("Communicators (network per communicator)",
                           f"max by (pod, comm_id, nranks, nnodes, network, nccl_version) (ccl_nccl_communicator_info{{{JOB}}})"))
        .with_panel(_table("Connections per communicator by transport",
                           f"sum by (comm_id, transport, scope, gdr) (ccl_nccl_connections{{{JOB}}})", width=24))
        .with_panel(_timeseries("Connections by transport", "short",
                                (f"job_name_transport_scope:ccl_nccl_connections:sum{{{JOB}}}",
                                 "{{transport}} {{scope}} gdr={{gdr}}")))
        .with_panel(_timeseries("NCCL warnings", "short",
                                (f"sum by (pod, category) (increase(ccl_nccl_warnings_total{{{JOB}}}[$__rate_interval]))",
                                 "{{pod}} {{category}}")))
        .with_row(Row("Fabric throughput of the job's nodes"))
        .with_panel(_timeseries("RDMA throughput (job's nodes, total)", "Bps",
                                (f"job_name:ccl_rdma_transmit_bytes:rate5m{{{JOB}}}", "tx"),
                                (f"job_name:ccl_rdma_receive_bytes:rate5m{{{JOB}}}", "rx")))
        .with_panel(_timeseries("NVLink throughput (job's nodes, total)", "Bps",
                                (f"job_name:ccl_nvlink_transmit_bytes:rate5m{{{JOB}}}", "tx"),
                                (f"job_name:ccl_nvlink_receive_bytes:rate5m{{{JOB}}}", "rx")))
        .with_panel(_timeseries("RDMA throughput per node", "Bps",
                                (f"node:ccl_rdma_transmit_bytes:rate5m {on_job_nodes}", "{{node}} tx"),
                                (f"node:ccl_rdma_receive_bytes:rate5m {on_job_nodes}", "{{node}} rx")))
        .with_panel(_timeseries("NVLink throughput per node", "Bps",
                                (f"node:ccl_nvlink_transmit_bytes:rate5m {on_job_nodes}", "{{node}} tx"),
                                (f"node:ccl_nvlink_receive_bytes:rate5m {on_job_nodes}", "{{node}} rx")))
        .with_row(Row("Probe history on the job's nodes"))
        .with_panel(_timeseries("Probe bus bandwidth (best size per run)", "Bps",
                                (f"node:ccl_probe_bus_bandwidth_bytes_per_second:max {on_job_nodes}",
                                 "{{node}} {{collective}} {{scope}} {{source}}")))
        .with_panel(_timeseries("Probe success", "short",
                                (f"max by (node, collective, scope, source) (ccl_probe_success) {on_job_nodes}",
                                 "{{node}} {{collective}} {{scope}} {{source}}")))
    )


# Size classes whose bus bandwidth is bandwidth-bound (what CclJobBusBandwidthDegraded compares).
LARGE = 'size_class=~"10MB_100MB|100MB_1GB|ge_1GB"'


def _with_in_job_collectives(board: Dashboard) -> Dashboard:
    """The training-job dashboard's row of in-job collectives (NCCL Inspector, collector
    ``inspector``): bus bandwidth per collective and size class, with the job's transport
    verdict beside it, time spent in collectives, and large collectives against the floor."""
    by = "collective, scope, size_class"
    busbw = (f"sum by ({by}) (rate(ccl_nccl_collective_bus_bytes_total{{{JOB}}}[$__rate_interval]))"
             f" / sum by ({by}) (rate(ccl_nccl_collective_seconds_total{{{JOB}}}[$__rate_interval]))")
    node_rule = "job_name_node_collective:ccl_nccl_collective_bus_bandwidth_bytes_per_second"
    return (
        board.with_row(Row("In-job bus bandwidth (NCCL Inspector)"))
        .with_panel(_timeseries("In-job bus bandwidth per collective and size class", "Bps",
                                (busbw, "{{collective}} {{scope}} {{size_class}}"),
                                description="Bus bandwidth the job's collectives got, measured inside the job by "
                                "the NCCL Inspector: bus bytes (nccl-tests size x bus factor) over time, all its "
                                "pods together. Sizes under 10 MB are latency-bound.").span(16))
        .with_panel(_table("Transport verdict", f"max by (pod, node, verdict) (ccl_nccl_verdict{{{JOB}}} == 1)",
                           "The NCCL transport verdict of each pod of the job (from its NCCL log).", width=8))
        .with_panel(_timeseries("Time in collectives", "s",
                                (f"sum by (collective, size_class) "
                                 f"(rate(ccl_nccl_collective_seconds_total{{{JOB}}}[$__rate_interval]))",
                                 "{{collective}} {{size_class}}"),
                                description="Seconds per second the job's ranks spend in each kind of collective "
                                "(8 ranks each busy half the time: 4)."))
        .with_panel(_timeseries("Large collectives per node against the network floor", "Bps",
                                (f"{node_rule}:rate5m{{{JOB}, {LARGE}}}",
                                 "{{node}} {{collective}} {{scope}} {{size_class}}"),
                                (f"{node_rule}:floor{{{JOB}}}", "floor {{node}} {{collective}} {{scope}}"),
                                description="What CclJobBusBandwidthDegraded compares: the job's 5-minute bus "
                                "bandwidth per node, and the least its node's network should give (half the probe's "
                                "7-day median, or the scope's floor)."))
    )


def node_fabric() -> Dashboard:
    node = 'node="$node"'
    return (
        _dashboard("ccl-node-fabric.json", "CCL health / Node fabric",
                   "One node: per-port RDMA throughput, errors and congestion; per-link NVLink throughput, state and errors.")
        .with_variable(_label_variable("node", "label_values(ccl_exporter_build_info, node)", "Node"))
        .with_row(Row("RDMA ports"))
        .with_panel(_table("Ports", f"max by (device, port, link_layer, netdev, hca_type, firmware_version, board_id) "
                                    f"(ccl_rdma_port_info{{{node}}})", width=24))
        .with_panel(_table("Port state (4 ACTIVE) and physical state (5 LinkUp)",
                           f"max by (device, port) (ccl_rdma_port_state_id{{{node}}}) * 10"
                           f" + on (device, port) max by (device, port) (ccl_rdma_port_physical_state_id{{{node}}})",
                           "Value = 10 x state + physical state: 45 is ACTIVE/LinkUp."))
        .with_panel(_table("Port rate", f"max by (device, port) (ccl_rdma_port_rate_bytes_per_second{{{node}}})"))
        .with_panel(_timeseries("RDMA throughput per port", "Bps",
                                (f"sum by (device, port) (rate(ccl_rdma_port_transmit_bytes_total{{{node}}}[$__rate_interval]))",
                                 "{{device}}/{{port}} tx"),
                                (f"sum by (device, port) (rate(ccl_rdma_port_receive_bytes_total{{{node}}}[$__rate_interval]))",
                                 "{{device}}/{{port}} rx")))
        .with_panel(_timeseries("RDMA packets per port", "pps",
                                (f"sum by (device, port) (rate(ccl_rdma_port_transmit_packets_total{{{node}}}[$__rate_interval]))",
                                 "{{device}}/{{port}} tx"),
                                (f"sum by (device, port) (rate(ccl_rdma_port_receive_packets_total{{{node}}}[$__rate_interval]))",
                                 "{{device}}/{{port}} rx")))
        .with_panel(_timeseries("Port error counters", "short",
                                (f"sum by (device, port, counter) (rate(ccl_rdma_port_errors_total{{{node}, counter!=\"port_xmit_wait\"}}[$__rate_interval])) > 0",
                                 "{{device}}/{{port}} {{counter}}")))
        .with_panel(_timeseries("Congestion: CNPs, ECN marks, transmit wait", "short",
                                (f"sum by (device, port, counter) (rate(ccl_rdma_port_hw_counters_total{{{node}, "
                                 f"counter=~\"np_cnp_sent|rp_cnp_handled|np_ecn_marked_roce_packets\"}}[$__rate_interval]))",
                                 "{{device}}/{{port}} {{counter}}"),
                                (f"sum by (device, port) (rate(ccl_rdma_port_errors_total{{{node}, counter=\"port_xmit_wait\"}}[$__rate_interval]))",
                                 "{{device}}/{{port}} port_xmit_wait")))
        .with_panel(_timeseries("RDMA transport errors (hw counters)", "short",
                                (f"sum by (device, port, counter) (rate(ccl_rdma_port_hw_counters_total{{{node}, "
                                 f"counter=~\"out_of_sequence|local_ack_timeout_err|out_of_buffer|packet_seq_err|rnr_nak_retry_err\"}}[$__rate_interval]))",
                                 "{{device}}/{{port}} {{counter}}")))
        .with_row(Row("NVLink"))
        .with_panel(_table("GPUs", f"max by (gpu, name, uuid, pci_bus_id) (ccl_gpu_info{{{node}}})"))
        .with_panel(_table("Pods holding GPUs", f"max by (gpu, namespace, pod, container) (ccl_gpu_pod_info{{{node}}})"))
        .with_panel(_table("NVLink state (1 up, 0 down)", f"min by (gpu, link) (ccl_nvlink_state{{{node}}})"))
        .with_panel(_timeseries("NVLink errors", "short",
                                (f"sum by (gpu, link, error) (rate(ccl_nvlink_errors_total{{{node}}}[$__rate_interval])) > 0",
                                 "GPU {{gpu}} link {{link}} {{error}}")))
        .with_panel(_timeseries("NVLink transmit per link", "Bps",
                                (f"sum by (gpu, link) (rate(ccl_nvlink_transmit_bytes_total{{{node}}}[$__rate_interval]))",
                                 "GPU {{gpu}} link {{link}}")))
        .with_panel(_timeseries("NVLink receive per link", "Bps",
                                (f"sum by (gpu, link) (rate(ccl_nvlink_receive_bytes_total{{{node}}}[$__rate_interval]))",
                                 "GPU {{gpu}} link {{link}}")))
        .with_row(Row("Exporter"))
        .with_panel(_table("Collectors (1 ok)", f"max by (collector) (ccl_exporter_collector_success{{{node}}})"))
        .with_panel(_timeseries("Collector duration", "s",
                                (f"max by (collector) (ccl_exporter_collector_duration_seconds{{{node}}})", "{{collector}}")))
    )


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
