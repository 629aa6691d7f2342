"""Event-loop lag and the request counters behind ``/health`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import time

from rllm_core.gateway.metrics import GatewayMetrics, LoopLagMonitor, percentile


def test_percentile_is_the_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.5) == 7.0
    assert percentile([], 0.5) == 0.0


def test_a_blocked_loop_shows_up_as_lag():
    async def main() -> dict:
        monitor = LoopLagMonitor(interval_s=0.01)
        monitor.start()
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # synchronous work holding the loop
        await asyncio.sleep(0.05)
        await monitor.stop()
        return monitor.summary()

    summary = asyncio.run(main())
    assert summary["max_ms"] >= 150
    assert summary["p50_ms"] < 50
    assert summary["samples"] >= 5


def test_counters_track_in_flight_served_and_statuses():
    metrics = GatewayMetrics()
    for status in (200, 200, 404):
        metrics.request_started()
        metrics.request_finished(status)
    metrics.request_started()
    metrics.lag.record(0.002)
    metrics.lag.record(0.004)
    snapshot = metrics.snapshot()
    assert snapshot["in_flight"] == 1
    assert snapshot["requests_served"] == 3
    assert snapshot["status_counts"] == {"200": 2, "404": 1}
    assert snapshot["event_loop_lag"] == {"p50_ms": 2.0, "p99_ms": 4.0, "max_ms": 4.0, "samples": 2}
