"""NCCL log intelligence, pure: text in, events and verdicts out (no I/O, no clock, no globals).

    analyzer = LogAnalyzer()
    for line in lines:
        analyzer.feed(line)
    verdict = analyzer.result()      # Verdict; .to_json() is the `analyze --json` object

One analyzer follows one log stream (a container's log, or one job's NCCL debug files).
"""

from exporter.nccl.analyzer import LogAnalyzer
from exporter.nccl.networks import RDMA, TCP, network_class
from exporter.nccl.state import Limits
from exporter.nccl.verdict import CommunicatorSummary, NcclWarning, Verdict

__all__ = ["RDMA", "TCP", "CommunicatorSummary", "Limits", "LogAnalyzer", "NcclWarning", "Verdict", "network_class"]
