"""The RDMA sysfs reader: parsers, per-value failure isolation, fixture trees."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from exporter.sources.rdma import parse_rate, parse_state, read_rdma
from exporter.sources.sysfs import parse_uint, read_attribute


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN\n", (1, "DOWN")),
        ("5: LinkUp", (5, "LinkUp")),
        ("ACTIVE", (None, None)),
        ("x: ACTIVE", (None, None)),
        ("4: A: B", (None, None)),
        ("", (None, None)),
        (None, (None, None)),
    ],
)
def test_parse_state(text: str | None, expected: tuple[int | None, str | None]) -> None:
    assert parse_state(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400 Gb/sec (4X NDR)", 50_000_000_000),
        ("200 Gb/sec (4X HDR)", 25_000_000_000),
        ("100 Gb/sec (4X EDR)", 12_500_000_000),
        ("56 Gb/sec (4X FDR)", 7_000_000_000),
        ("40 Gb/sec (4X FDR10)", 5_000_000_000),
        ("2.5 Gb/sec (1X SDR)", 312_500_000),
        ("10 Gb/sec (4X SDR)", 1_250_000_000),
        ("fast", None),
        ("", None),
        (None, None),
        ("-5 Gb/sec", None),
    ],
)
def test_parse_rate(text: str | None, expected: int | None) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("18446744073709551615", 2**64 - 1),
        ("18446744073709551616", None),
        ("N/A (no PMA)", None),
        ("-3", None),
        ("garbage", None),
        (" 12 ", 12),
        ("１２", None),  # noqa: RUF001 - FULLWIDTH digits on purpose
        (None, None),
    ],
)
def test_parse_uint(text: str | None, expected: int | None) -> None:
    assert parse_uint(text) == expected


def test_reads_every_device_of_the_fixture(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    reading = read_rdma(fixture_tree("sysfs_rdma"))
    assert reading.problems == []
    assert [d.name for d in reading.devices] == ["hfi1_0", "irdma0", "mlx4_0", "mlx5_0", "mlx5_1", "mlx5_2"]
    ports = {(p.device, p.port): p for p in reading.ports()}
    ndr = ports[("mlx5_0", 1)]
    assert ndr.transmit_bytes == 12884901888123 * 4  # 4-octet words, above 2^32
    assert ndr.rate_bytes_per_second == 50_000_000_000
    assert ndr.link_layer == "InfiniBand" and ndr.netdev == "ib0"
    assert ndr.errors["symbol_error"] == 1 and "port_xmit_data" not in ndr.errors
    assert ndr.hw_counters["local_ack_timeout_err"] == 9
    roce = ports[("mlx5_1", 1)]
    assert roce.link_layer == "Ethernet" and roce.netdev == "eth2"
    assert roce.hw_counters["np_cnp_sent"] == 1234
    down = ports[("mlx5_2", 1)]
    assert (down.state_id, down.physical_state_id) == (1, 3)
    assert "port_rcv_errors" not in down.errors  # "N/A (no PMA)" is skipped, not zero
    legacy = ports[("mlx4_0", 1)]
    assert legacy.transmit_bytes == 987654321012 * 4  # counters_ext/port_xmit_data_64 wins over the 32-bit file
    assert legacy.transmit_packets == 5555555555
    assert legacy.cast_packets[("unicast", "receive")] == 6666666000
    assert ports[("irdma0", 1)].transmit_bytes is None


def test_malformed_device_never_hides_the_healthy_one(fixture_tree) -> None:  # type: ignore[no-untyped-def]
    reading = read_rdma(fixture_tree("sysfs_rdma_malformed"))
    by_device = {d.name: d for d in reading.devices}
    healthy = by_device["mlx5_0"].ports[0]
    assert healthy.state_id == 4 and healthy.transmit_bytes == 400
    broken = by_device["mlx5_1"]
    assert broken.firmware_version is None and broken.board_id is None
    port = broken.ports[0]
    assert port.state_id is None and port.rate_bytes_per_second is None
    assert port.transmit_bytes is None  # "garbage"
    assert port.receive_bytes == 200  # its sibling value still read
    assert port.transmit_packets is None  # a folder, not a file
    assert "link_downed" not in port.errors  # "-3"
    assert by_device["bnxt_re0"].ports == ()
    problems = " ".join(reading.problems)
    assert "bnxt_re0: no ports/ folder" in problems
    assert "mlx5_1/1: unreadable or malformed state" in problems
    assert "unexpected port entry 'lo'" in problems


def test_unreadable_values_are_skipped_one_by_one(fixture_tree, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """EACCES/EINVAL cannot be produced with chmod as root, so os.open/os.read fail on demand."""
    import os

    import exporter.sources.sysfs as sysfs

    root = fixture_tree("sysfs_rdma")
    fail_open = {"symbol_error": errno.EACCES, "np_cnp_sent": errno.EOPNOTSUPP}
    fail_read = {"port_xmit_data": errno.EINVAL}
    real_open, real_read = os.open, os.read
    fds: dict[int, str] = {}

    def fake_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = os.path.basename(path)  # counter files are opened by name relative to their folder (dir_fd)
        if name in fail_open:
            raise OSError(fail_open[name], os.strerror(fail_open[name]), path)
        fd = real_open(path, flags, *args, **kwargs)
        fds[fd] = name
        return fd

    def fake_read(fd, n):  # type: ignore[no-untyped-def]
        if fds.get(fd) in fail_read:
            raise OSError(fail_read[fds[fd]], os.strerror(fail_read[fds[fd]]))
        return real_read(fd, n)

    monkeypatch.setattr(sysfs.os, "open", fake_open)
    monkeypatch.setattr(sysfs.os, "read", fake_read)
    ports = {(p.device, p.port): p for p in read_rdma(root).ports()}
    ndr = ports[("mlx5_0", 1)]
    assert ndr.transmit_bytes is None and ndr.receive_bytes == 12884901777456 * 4
    assert "symbol_error" not in ndr.errors and ndr.errors["link_downed"] == 2
    assert "np_cnp_sent" not in ports[("mlx5_1", 1)].hw_counters
    assert ports[("mlx5_1", 1)].hw_counters["rp_cnp_handled"] == 1200


def test_absent_class_is_reported(tmp_path: Path) -> None:
    reading = read_rdma(tmp_path)
    assert not reading.class_present and reading.devices == []


def test_read_attribute_handles_missing_and_folders(tmp_path: Path) -> None:
    assert read_attribute(tmp_path / "missing") is None
    assert read_attribute(tmp_path) is None
    big = tmp_path / "big"
    big.write_text("1" * 10_000)
    assert read_attribute(big) == "1" * 4096  # one bounded read


def test_only_the_default_gid_names_the_network_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An InfiniBand port's GID table (and a RoCE port's unused entries) answer EINVAL for ndevs,
    up to 256 entries a port: only index 0, the default GID, is read; then device/net."""
    import os

    import exporter.sources.sysfs as sysfs

    device = tmp_path / "class" / "infiniband" / "mlx5_0"
    port = device / "ports" / "1"
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")
    for index in range(256):
        (port / "gid_attrs" / "ndevs" / str(index)).write_text("" if index != 7 else "not-this-one\n")
    (device / "device" / "net" / "ib0").mkdir(parents=True)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(sysfs.os, "open", counting_open)
    [ib] = read_rdma(tmp_path).ports()
    assert ib.netdev == "ib0"
    assert len([path for path in opened if "ndevs" in path]) <= 2  # the folder (held reads) and index 0
