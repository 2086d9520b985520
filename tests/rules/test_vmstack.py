"""The distributed stack's helpers (devtools/vmstack.py): configs and command lines, and that
the real vmagent and vmalert accept what we give them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from devtools.stack import Intervals, ScrapeTarget
from devtools.vmstack import RulerUrls, VictoriaMetrics, VmAgent, VmAlert, scrape_config
from tests.conftest import require_tool

TARGETS = [
    ScrapeTarget("127.0.0.1:19401", {"node": "gpu-node-01"}),
    ScrapeTarget("127.0.0.1:19402", {"node": "gpu-node-02"}),
]


def _agent(tmp_path: Path, binary: str = "vmagent") -> VmAgent:
    return VmAgent(
        binary,
        tmp_path / "agent",
        scrape_config(TARGETS, Intervals(), {}),
        write_urls=["http://127.0.0.1:1/api/v1/write", "http://127.0.0.1:2/api/v1/write"],
        member=1,
        members=2,
        labels={"cluster": "east"},
    )


def test_scrape_config_is_prometheus_scrape_part_only() -> None:
    config = scrape_config(TARGETS, Intervals(scrape_seconds=2), {"kube-state-metrics": [ScrapeTarget("127.0.0.1:3")]})
    assert set(config) == {"global", "scrape_configs"}
    assert config["global"] == {"scrape_interval": "2000ms", "scrape_timeout": "2000ms"}
    (ours, other) = config["scrape_configs"]
    assert ours["job_name"] == "ccl-exporter" and ours["honor_labels"] is True
    assert [c["labels"] for c in ours["static_configs"]] == [{"node": "gpu-node-01"}, {"node": "gpu-node-02"}]
    assert other["job_name"] == "kube-state-metrics"


def test_command_lines_shard_label_and_stay_on_loopback(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    argv = agent.argv()
    assert "-promscrape.cluster.membersCount=2" in argv and "-promscrape.cluster.memberNum=1" in argv
    assert "-remoteWrite.label=cluster=east" in argv
    assert [a for a in argv if a.startswith("-remoteWrite.url=")] == [
        "-remoteWrite.url=http://127.0.0.1:1/api/v1/write",
        "-remoteWrite.url=http://127.0.0.1:2/api/v1/write",
    ]
    ruler = VmAlert(
        "vmalert",
        tmp_path / "ruler",
        "vmalert-global",
        [Path("a.yaml"), Path("b.yaml")],
        RulerUrls(datasource="http://127.0.0.1:3", write="http://127.0.0.1:3", notifier="http://127.0.0.1:4"),
        intervals=Intervals(),
    )
    ruler_argv = ruler.argv()
    assert [a for a in ruler_argv if a.startswith("-rule=")] == ["-rule=a.yaml", "-rule=b.yaml"]
    assert not [a for a in ruler_argv if a.startswith("-external.label")], "a global ruler adds no cluster"
    assert "-datasource.queryStep=5000ms" in ruler_argv
    store = VictoriaMetrics("victoria-metrics", tmp_path / "store")
    for process in (agent, ruler, store):
        listen = [a for a in process.argv() if a.startswith("-httpListenAddr=")]
        assert listen == [f"-httpListenAddr=127.0.0.1:{process.port}"]


def test_vmagent_accepts_the_scrape_config(tmp_path: Path) -> None:
    agent = _agent(tmp_path, require_tool("vmagent"))
    result = subprocess.run(
        [agent.binary, f"-promscrape.config={agent.config_path}", "-promscrape.config.dryRun", "-loggerLevel=ERROR"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
