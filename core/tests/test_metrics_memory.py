"""The memory figures of a metrics line: ``system/rss_gb`` and ``system/rss_now_gb``."""

from __future__ import annotations

import sys

import pytest
from reference.metrics_lines import empty_step_metrics
from rllm_core.run.metrics import memory_metrics

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _line():
    return empty_step_metrics(step=1, rollout_s=1.0, train_s=1.0, step_s=2.0, weight_version=0)


@linux_only
def test_step_metrics_report_peak_and_current_rss_in_gb():
    line = _line()
    with open("/proc/self/status") as status:
        fields = dict(row.split(":", 1) for row in status if ":" in row)
    peak_kb = int(fields["VmHWM"].split()[0])
    now = line["system/rss_now_gb"]
    assert isinstance(line["system/rss_gb"], float) and isinstance(now, float)
    # A live pytest process holds tens of MB at least and far less than a TB.
    assert 0.01 < now <= line["system/rss_gb"] < 1000
    # The same high-water mark the kernel shows, within what the process grew since.
    assert abs(line["system/rss_gb"] - peak_kb * 1024 / 1e9) < 0.05


@linux_only
def test_peak_rss_follows_a_large_allocation():
    before = memory_metrics()["system/rss_gb"]
    block = bytearray(200 * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    after = memory_metrics()
    del block
    assert after["system/rss_gb"] >= before
    assert after["system/rss_gb"] >= after["system/rss_now_gb"] > 0.2
