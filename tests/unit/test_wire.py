"""Bytes per host and step (benchmarks/wire.py): counted readings and Table 3's figure."""
import pytest

from benchmarks.wire import interface_bytes, per_host, table3


def test_a_host_read_by_several_workers_counts_once():
    readings = [{"steps": 10, "interfaces": {"eth0": 1000}},
                {"steps": 10, "interfaces": {"eth0": 1000}},   # eth0's second worker
                {"steps": 10, "interfaces": {"eth1": 3000}}]
    assert per_host(readings) == pytest.approx((100 + 300) / 2)
    assert per_host([{"steps": 5, "interfaces": {}}]) is None      # loopback only


def test_table3_for_each_routing():
    mb = 2 ** 20
    # 4 machines: dense keys 4 w (N-1)/N whichever way they go
    assert table3("rows", 8 * mb, [], [], 4) == pytest.approx(24 * mb)
    # a table of 100 MB touched at α = 0.01 per machine: rows 4 α w (N-1)/N, dense 4 w (N-1)/N
    assert table3("rows", 0, [100 * mb], [0.01], 4) == pytest.approx(3 * mb)
    assert table3("dense", 0, [100 * mb], [0.01], 4) == pytest.approx(300 * mb)


def test_interface_counters_exclude_loopback():
    counts = interface_bytes()
    assert "lo" not in counts and all(v >= 0 for v in counts.values())


def test_the_payload_is_the_bytes_less_each_packets_headers():
    from benchmarks.wire import FRAMING_BYTES
    readings = [{"steps": 2, "interfaces": {"eth0": 10_000}, "packets": {"eth0": 10}},
                {"steps": 2, "interfaces": {"eth1": 20_000}, "packets": {"eth1": 20}}]
    assert per_host(readings, payload=True) == pytest.approx(
        ((10_000 - 10 * FRAMING_BYTES) / 2 + (20_000 - 20 * FRAMING_BYTES) / 2) / 2)
    # readings of a run that counted no packets give no payload
    assert per_host([{"steps": 2, "interfaces": {"eth0": 10}}], payload=True) is None
