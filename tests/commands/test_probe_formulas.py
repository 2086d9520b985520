"""nccl-tests arithmetic, table-tested against doc/PERFORMANCE.md's definitions."""

from __future__ import annotations

import pytest

from exporter.probe.formulas import algbw, align_size, busbw, busbw_factor, format_size, parse_size, size_sweep


@pytest.mark.parametrize(
    ("collective", "nranks", "factor"),
    [
        ("all_reduce", 1, 0.0),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_reduce", 16, 1.875),
        ("all_gather", 2, 0.5),
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("alltoall", 16, 0.9375),
        ("broadcast", 2, 1.0),
        ("broadcast", 64, 1.0),
        ("reduce", 8, 1.0),
        ("sendrecv", 2, 1.0),
    ],
)
def test_busbw_factor(collective: str, nranks: int, factor: float) -> None:
    assert busbw_factor(collective, nranks) == pytest.approx(factor)


def test_busbw_from_time() -> None:
    # 8 GiB all_reduce on 16 ranks in 0.05 s: algbw 171.8 GB/s, busbw x 1.875
    size = 8 * 1024**3
    assert algbw(size, 0.05) == pytest.approx(size / 0.05)
    assert busbw("all_reduce", size, 0.05, 16) == pytest.approx(size / 0.05 * 1.875)


@pytest.mark.parametrize("bad", [("all_reduce", 0), ("reduce", 0), ("nonsense", 2)])
def test_busbw_factor_rejects(bad: tuple[str, int]) -> None:
    with pytest.raises(ValueError):
        busbw_factor(*bad)


def test_algbw_rejects_non_positive_time() -> None:
    with pytest.raises(ValueError):
        algbw(1024, 0.0)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("1K", 1024),
        ("32M", 32 * 1024**2),
        ("4G", 4 * 1024**3),
        ("64k", 65536),
        ("16MiB", 16 * 1024**2),
        (" 2M ", 2 * 1024**2),
        ("0", 0),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-1K", "12T", "1 Gb/s", "128G"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size_round_trips() -> None:
    for size in (1, 1000, 1024, 65536, 3 * 1024**2, 8 * 1024**3):
        assert parse_size(format_size(size)) == size
    assert format_size(1024**2) == "1M"


def test_sweeps_like_nccl_tests() -> None:
    assert size_sweep(1024**2, 8 * 1024**2) == [1024**2, 2 * 1024**2, 4 * 1024**2, 8 * 1024**2]
    assert size_sweep(1000, 5000, step_factor=4) == [1000, 4000]
    assert size_sweep(1024, 4096, step_bytes=1024) == [1024, 2048, 3072, 4096]
    assert size_sweep(32 * 1024**2, 32 * 1024**2) == [32 * 1024**2]


@pytest.mark.parametrize(
    "args",
    [(0, 8), (16, 8), (8, 1024, 1.0), (8, 1024, 1.05), (1024, 2**35, 1.1)],
)
def test_sweep_rejects_bad_ranges(args: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError):
        size_sweep(*args)


@pytest.mark.parametrize(
    ("collective", "size", "nranks", "aligned"),
    [("all_reduce", 1001, 8, 1000), ("all_gather", 1000, 8, 992), ("alltoall", 4, 8, 32), ("broadcast", 3, 2, 4)],
)
def test_align_size(collective: str, size: int, nranks: int, aligned: int) -> None:
    assert align_size(collective, size, 4, nranks) == aligned
