"""One log stream in, its verdict out: :class:`LogAnalyzer` ties the reader (lines → state), the
summaries (what a communicator about to be evicted showed) and the decision (state → verdict)
together.
"""

from __future__ import annotations

from exporter.nccl.decision import decide
from exporter.nccl.reader import StreamReader
from exporter.nccl.state import Limits
from exporter.nccl.summaries import summarize_evicted
from exporter.nccl.verdict import Verdict


class LogAnalyzer(StreamReader):
    """Feed lines of one log stream; ask for the verdict at any time.

    One analyzer follows one log stream (a container's log, or one or more NCCL debug files of one
    job) in which many processes interleave. Every structure is capped by :class:`Limits`; what a
    cap drops is counted in ``overflow``. ``feed`` never raises; ``result`` is cached until the next
    line that changes the state.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits or Limits(), summarize_evicted)

    def result(self) -> Verdict:
        """The verdict for everything fed so far (cached until the next relevant line)."""
        if self._cached is None:
            try:
                self._cached = decide(self)
            except Exception:  # noqa: BLE001 - never let a reasoning bug escape to a scrape
                self._count("internal_errors")
                self._cached = Verdict.unknown(("internal error while deciding; see overflow",))
        return self._cached
