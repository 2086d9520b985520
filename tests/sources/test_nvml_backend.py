"""``PynvmlBackend`` when NVML cannot start: the reason, and how often it tries again.

The module handed in stands where nvidia-ml-py would: the backend only calls ``nvmlInit`` and reads
the error codes the binding defines. The binding against a real library (a fake libnvidia-ml
built with gcc) is tests/collectors/test_nvml.py.
"""

from __future__ import annotations

import types

import pytest

from exporter.sources.nvml import INIT_RETRY_SECONDS, NvmlUnavailable, PynvmlBackend


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def binding(*outcomes: int | None) -> types.SimpleNamespace:
    """A binding whose nvmlInit fails with each error code in ``outcomes`` in turn (None: succeeds)."""
    calls: list[int | None] = []

    def nvml_init() -> None:
        outcome = outcomes[min(len(calls), len(outcomes) - 1)]
        calls.append(outcome)
        if outcome is not None:
            raise NVMLError(outcome)

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_ERROR_FUNCTION_NOT_FOUND=13,
        nvmlInit=nvml_init,
        nvmlDeviceGetCount=lambda: 0,
        nvmlShutdown=lambda: None,
        calls=calls,
    )


def test_a_failed_start_is_tried_again_after_the_retry_interval_not_on_every_read() -> None:
    nvml = binding(12, 12, None)
    now = [100.0]
    backend = PynvmlBackend(nvml, clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(5):
        with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1 not found"):
            backend.read()
        now[0] += 1.0
    assert len(nvml.calls) == 1, "the library is looked for once in the interval"

    now[0] = 100.0 + INIT_RETRY_SECONDS
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1 not found"):
        backend.read()
    assert len(nvml.calls) == 2

    now[0] += INIT_RETRY_SECONDS
    assert backend.read().gpus == [], "a driver that came meanwhile is found at the next try"
    assert len(nvml.calls) == 3
    backend.read()
    assert len(nvml.calls) == 3, "started once"


def test_each_try_gives_its_own_reason() -> None:
    nvml = binding(12, 9)
    now = [0.0]
    backend = PynvmlBackend(nvml, clock=lambda: now[0])  # type: ignore[arg-type]
    with pytest.raises(NvmlUnavailable, match="not found"):
        backend.gpus()
    now[0] += INIT_RETRY_SECONDS
    with pytest.raises(NvmlUnavailable, match="kernel driver is not loaded"):
        backend.gpus()
    with pytest.raises(NvmlUnavailable, match="kernel driver is not loaded"):
        backend.gpus()
    assert nvml.calls == [12, 9]
