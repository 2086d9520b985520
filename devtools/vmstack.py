"""The distributed metrics path on 127.0.0.1, from Debian's ``victoria-metrics`` package.

What a fleet too big for one Prometheus runs (docs/scaling.md), with real binaries:

```
 exporters ──scrape──▶ vmagent shard 0 ──remote write──▶ shard store 0 ◀── shard ruler 0 ─┐ shard-local
 (split by vmagent's    (cluster=<name>)      └──────────▶ global store ◀── global ruler ──┤ rules, and
  -promscrape.cluster)  vmagent shard 1 ──────────────────▶   ▲    ▲                       │ global rules
                                         └────────────▶ shard store 1 ◀── shard ruler 1 ─┤
                                                                                          ▼
                                                                  Alertmanager ──▶ webhook receiver
```

- Each ``vmagent`` scrapes its share of the targets (``-promscrape.cluster.membersCount`` /
  ``-promscrape.cluster.memberNum``: vmagent hashes each target's labels to one member), adds
  ``cluster=<name>`` to every sample (what an ``external_labels: {cluster: ...}`` does for a
  Prometheus shard) and remote-writes to its shard's store and to the global store.
- A shard's store (``victoria-metrics``) and its ruler (``vmalert``) stand for a Prometheus
  shard: the ruler evaluates the shard-local rules on that shard's series only, sends its
  recording rules back through the shard's vmagent (so they reach both stores, with
  ``cluster``) and its alerts to Alertmanager.
- The global ruler (``vmalert``) evaluates the cross-node rules on the global store, which
  holds every shard's series: the place of Thanos Ruler or Mimir's ruler.

Nothing listens beyond loopback; ``ShardedStack.stop()`` stops every process and waits for
its PID. Flags that matter for tests: the stores show samples after 1 s
(``-search.latencyOffset``, 30 s by default) and every writer flushes each second.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.stack import (
    ALERTMANAGER_NAMES,
    SCRAPE_JOB,
    Alertmanager,
    Intervals,
    ManagedProcess,
    QueryApi,
    ScrapeTarget,
    StackUnavailable,
    WebhookReceiver,
    alertmanager_config,
    find_binary,
    http_json,
    prometheus_config,
)

# Debian's names first, the upstream release tarballs' second.
VICTORIA_METRICS_NAMES = ("victoria-metrics", "victoria-metrics-prod")
VMAGENT_NAMES = ("vmagent", "vmagent-prod")
VMALERT_NAMES = ("vmalert", "vmalert-prod")
CLUSTER_LABEL = "cluster"


def _seconds(value: float) -> str:
    """A Go duration in whole milliseconds (VictoriaMetrics' flags take Go durations)."""
    return f"{max(1, round(value * 1000))}ms"


class VictoriaMetrics(QueryApi):
    """Single-node VictoriaMetrics: a store that takes remote write and answers PromQL (MetricsQL)."""

    name = "victoria-metrics"
    ready_path = "/health"

    def argv(self) -> list[str]:
        return [
            self.binary,
            f"-storageDataPath={self.workdir / 'data'}",
            f"-httpListenAddr={self.address}",
            "-search.latencyOffset=1s",  # samples are queryable one second after they arrive
            "-search.disableCache",
            "-loggerLevel=WARN",
        ]

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"


def scrape_config(
    targets: Sequence[ScrapeTarget], intervals: Intervals, other_jobs: Mapping[str, Sequence[ScrapeTarget]]
) -> dict[str, Any]:
    """vmagent's ``-promscrape.config``: the scrape part of ``prometheus_config`` (same jobs,
    ``honor_labels``, target labels), without what only Prometheus reads."""
    config = prometheus_config(targets, [], None, intervals, other_jobs=other_jobs)
    config.pop("rule_files")
    config["global"].pop("evaluation_interval")
    return config


class VmAgent(ManagedProcess):
    """One scrape shard: ``vmagent`` with cluster membership, remote-writing to ``write_urls``
    with ``labels`` added to every sample. It also takes remote write itself (``write_url``)
    and forwards it the same way, labels included."""

    def __init__(
        self,
        binary: str,
        workdir: Path,
        config: Mapping[str, Any],
        write_urls: Sequence[str],
        member: int,
        members: int,
        labels: Mapping[str, str],
        port: int | None = None,
    ) -> None:
        self.name = f"vmagent-{member}"
        self.member, self.members = member, members
        self.write_urls = list(write_urls)
        self.labels = dict(labels)
        super().__init__(binary, workdir, config, port)

    ready_path = "/health"

    def argv(self) -> list[str]:
        return [
            self.binary,
            f"-promscrape.config={self.config_path}",
            f"-promscrape.cluster.membersCount={self.members}",
            f"-promscrape.cluster.memberNum={self.member}",
            *(f"-remoteWrite.url={url}" for url in self.write_urls),
            *(f"-remoteWrite.label={name}={value}" for name, value in self.labels.items()),
            f"-remoteWrite.tmpDataPath={self.workdir / 'queue'}",
            "-remoteWrite.flushInterval=1s",
            f"-httpListenAddr={self.address}",
            "-loggerLevel=WARN",
        ]

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"

    def reload(self, config: Mapping[str, Any]) -> None:
        """A new scrape config, applied at once (vmagent rereads it on SIGHUP)."""
        self.write_config(config)
        if self.proc is not None and self.alive:
            os.kill(self.proc.pid, signal.SIGHUP)

    def scraped_targets(self) -> list[dict[str, str]]:
        """Labels of the targets this member scrapes (the others are another member's share)."""
        body = http_json(self.url + "/api/v1/targets")
        return [dict(target.get("labels", {})) for target in body.get("data", {}).get("activeTargets", [])]


@dataclass(frozen=True)
class RulerUrls:
    """Where a ruler reads series (``datasource``), writes recording rules (``write``) and sends
    alerts (``notifier``)."""

    datasource: str
    write: str
    notifier: str


class VmAlert(QueryApi):
    """A ruler: ``vmalert`` evaluating ``rule_files`` on ``urls.datasource``, writing recording
    rules to ``urls.write`` and alerts to ``urls.notifier``; ``labels`` are its
    ``-external.label``s. Its ``/api/v1/alerts`` and ``/api/v1/rules`` answer as Prometheus' do."""

    ready_path = "/health"

    def __init__(
        self,
        binary: str,
        workdir: Path,
        name: str,
        rule_files: Sequence[Path],
        urls: RulerUrls,
        intervals: Intervals,
        labels: Mapping[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.name = name
        self.rule_files = list(rule_files)
        self.urls = urls
        self.intervals = intervals
        self.labels = dict(labels or {})
        super().__init__(binary, workdir, None, port)

    def argv(self) -> list[str]:
        return [
            self.binary,
            *(f"-rule={path}" for path in self.rule_files),
            f"-datasource.url={self.urls.datasource}",
            # How far back an instant selector looks: Prometheus' 5-minute lookback in the
            # time-compressed tests is 5 scrape intervals.
            f"-datasource.queryStep={_seconds(5 * self.intervals.scrape_seconds)}",
            f"-remoteWrite.url={self.urls.write}",
            "-remoteWrite.flushInterval=1s",
            f"-notifier.url={self.urls.notifier}",
            f"-evaluationInterval={_seconds(self.intervals.evaluation_seconds)}",
            *(f"-external.label={name}={value}" for name, value in self.labels.items()),
            f"-external.url={self.url}",
            f"-httpListenAddr={self.address}",
            "-loggerLevel=WARN",
        ]


def _binary(names: Sequence[str], package: str) -> str:
    found = find_binary(names)
    if not found:
        raise StackUnavailable(f"{names[0]} is not installed (apt-get install {package})")
    return found


@dataclass
class Shard:
    """One scrape shard: its vmagent, its store and its ruler."""

    agent: VmAgent
    store: VictoriaMetrics
    ruler: VmAlert

    def nodes(self) -> set[str]:
        """The ``node`` of every ccl-exporter target this shard scrapes."""
        return {
            target["node"]
            for target in self.agent.scraped_targets()
            if target.get("job") == SCRAPE_JOB and "node" in target
        }


@dataclass
class ShardedStack:
    """``shards`` vmagent shards of one cluster scraping ``targets``, a store per shard and a
    global store, a ruler per shard (``local_rules``) and a global ruler (``global_rules``), an
    Alertmanager and a webhook receiver (see the module docstring)."""

    workdir: Path
    targets: Sequence[ScrapeTarget]
    local_rules: Sequence[Path]
    global_rules: Sequence[Path]
    cluster: str = "cluster-a"
    shards: int = 2
    intervals: Intervals = field(default_factory=Intervals)
    other_jobs: Mapping[str, Sequence[ScrapeTarget]] = field(default_factory=dict)
    receiver: WebhookReceiver | None = None
    alertmanager: Alertmanager | None = None
    store: VictoriaMetrics | None = None
    global_ruler: VmAlert | None = None
    shard_parts: list[Shard] = field(default_factory=list)

    def start(self) -> ShardedStack:
        binaries = {
            "victoria-metrics": _binary(VICTORIA_METRICS_NAMES, "victoria-metrics"),
            "vmagent": _binary(VMAGENT_NAMES, "victoria-metrics"),
            "vmalert": _binary(VMALERT_NAMES, "victoria-metrics"),
            "alertmanager": _binary(ALERTMANAGER_NAMES, "prometheus-alertmanager"),
        }
        try:
            self.receiver = WebhookReceiver().start()
            self.alertmanager = Alertmanager(
                binaries["alertmanager"],
                self.workdir / "alertmanager",
                alertmanager_config(self.receiver.url, self.intervals),
            )
            self.alertmanager.start()
            self.store = VictoriaMetrics(binaries["victoria-metrics"], self.workdir / "global-store")
            self.store.start()
            config = scrape_config(self.targets, self.intervals, self.other_jobs)
            for member in range(self.shards):
                folder = self.workdir / f"shard-{member}"
                store = VictoriaMetrics(binaries["victoria-metrics"], folder / "store")
                agent = VmAgent(
                    binaries["vmagent"],
                    folder / "vmagent",
                    config,
                    write_urls=[store.write_url, self.store.write_url],
                    member=member,
                    members=self.shards,
                    labels={CLUSTER_LABEL: self.cluster},
                )
                ruler = VmAlert(
                    binaries["vmalert"],
                    folder / "vmalert",
                    f"vmalert-shard-{member}",
                    self.local_rules,
                    # writes through the shard's vmagent: to both stores, with `cluster`
                    RulerUrls(datasource=store.url, write=agent.url, notifier=self.alertmanager.url),
                    intervals=self.intervals,
                    labels={CLUSTER_LABEL: self.cluster},
                )
                self.shard_parts.append(Shard(agent, store, ruler))
                for process in (store, agent, ruler):
                    process.start()
            self.global_ruler = VmAlert(
                binaries["vmalert"],
                self.workdir / "global-ruler",
                "vmalert-global",
                self.global_rules,
                RulerUrls(datasource=self.store.url, write=self.store.url, notifier=self.alertmanager.url),
                intervals=self.intervals,
            )
            self.global_ruler.start()
        except BaseException:
            self.stop()
            raise
        return self

    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Scrape ``targets`` from now on (every shard rereads the config and takes its share)."""
        self.targets = list(targets)
        config = scrape_config(self.targets, self.intervals, self.other_jobs)
        for shard in self.shard_parts:
            shard.agent.reload(config)

    def nodes_by_shard(self) -> list[set[str]]:
        return [shard.nodes() for shard in self.shard_parts]

    def wait_scraped(self, nodes: Iterable[str], timeout: float = 30.0) -> list[set[str]]:
        """The nodes of each shard once every one of ``nodes`` is some shard's target and has
        reached the global store."""
        wanted = set(nodes)
        store = self.store
        assert store is not None, "start() first"

        def placed() -> list[set[str]] | None:
            by_shard = self.nodes_by_shard()
            if not wanted <= set().union(*by_shard):
                return None
            up = store.query(f'max by (node) (up{{job="{SCRAPE_JOB}"}} == 1)')
            return by_shard if wanted <= {sample["metric"].get("node") for sample in up} else None

        found = store.wait_until(placed, timeout, f"targets {sorted(wanted)} scraped and stored")
        return found  # type: ignore[no-any-return]  # placed() gives the list or keeps waiting

    def processes(self) -> list[ManagedProcess]:
        found: list[ManagedProcess | None] = [self.global_ruler]
        for shard in self.shard_parts:
            found += [shard.ruler, shard.agent, shard.store]
        found += [self.store, self.alertmanager]
        return [process for process in found if process is not None]

    def stop(self) -> None:
        for process in self.processes():
            process.stop()
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None

    def __enter__(self) -> ShardedStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
