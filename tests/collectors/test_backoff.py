"""The restart back-off of background collectors (``exporter.backoff``): it doubles while a task
keeps failing and starts over once the task has run long enough to count as recovered."""

from __future__ import annotations

import asyncio

import pytest

from exporter.backoff import RestartBackoff, supervise


def test_the_delay_doubles_up_to_the_maximum_while_runs_fail_at_once() -> None:
    backoff = RestartBackoff(initial=1.0, maximum=8.0, healthy_after_seconds=30.0)
    assert [backoff.failed(0.1) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_a_run_that_lasted_resets_the_delay() -> None:
    backoff = RestartBackoff(initial=1.0, maximum=60.0, healthy_after_seconds=30.0)
    assert [backoff.failed(0.1) for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert backoff.failed(29.9) == 60.0  # not long enough: still failing
    assert backoff.failed(30.0) == 1.0  # it had recovered: a new failure starts over
    assert backoff.failed(0.1) == 2.0


@pytest.mark.parametrize("bad", [{"initial": 0}, {"initial": 2, "maximum": 1}, {"healthy_after_seconds": 0}])
def test_nonsense_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartBackoff(**bad)


def test_supervise_restarts_with_the_backoff_and_resets_after_a_long_run() -> None:
    """A collector that crashes three times at once, then runs for ten minutes and crashes again,
    then returns: the fourth restart waits the first delay again, not the longest."""
    now = [0.0]
    slept: list[float] = []
    runs = iter([0.0, 0.0, 0.0, 600.0, 0.0, None])  # how long each run lasts; None: it returns

    async def run() -> None:
        lasts = next(runs)
        if lasts is None:
            return
        now[0] += lasts
        raise RuntimeError("a hostile file")

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    asyncio.run(
        supervise("inspector", run, RestartBackoff(healthy_after_seconds=60.0), clock=lambda: now[0], sleep=sleep)
    )
    assert slept == [1.0, 2.0, 4.0, 1.0, 2.0]


def test_supervise_lets_cancellation_through() -> None:
    async def run() -> None:
        await asyncio.sleep(3600)

    async def main() -> None:
        task = asyncio.create_task(supervise("nccl", run))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
