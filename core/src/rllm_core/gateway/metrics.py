"""What the gateway reports about itself: event-loop lag, requests in flight and served, status
counts, denied requests.

:class:`LoopLagMonitor` wakes every ``interval_s`` and records how late it woke: a loop blocked by
slow synchronous work (a long render, a big trace read) shows up as lag, which delays every
request on that loop. The last ``window`` samples give the p50/p99 figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter, deque
from dataclasses import dataclass

__all__ = ["Denial", "GatewayMetrics", "LoopLagMonitor", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, by the nearest-rank method; 0.0 for
    no values."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values))))
    return sorted_values[rank - 1]


class LoopLagMonitor:
    """Samples the lag of the event loop it runs on."""

    def __init__(self, *, interval_s: float = 0.1, window: int = 1200) -> None:
        self.interval_s = interval_s
        self._samples: deque[float] = deque(maxlen=window)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            expected = clock() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._samples.append(max(0.0, clock() - expected))

    def record(self, lag_s: float) -> None:
        """Add one lag sample (the monitor's own loop does this; tests may too)."""
        self._samples.append(max(0.0, lag_s))

    def summary(self) -> dict[str, float | int]:
        """p50, p99 and max lag in milliseconds over the window, and the sample count."""
        values = sorted(self._samples)
        return {
            "p50_ms": round(percentile(values, 0.50) * 1000, 3),
            "p99_ms": round(percentile(values, 0.99) * 1000, 3),
            "max_ms": round((values[-1] if values else 0.0) * 1000, 3),
            "samples": len(values),
        }


@dataclass(frozen=True)
class Denial:
    """One request refused for its bearer token (a 401 or a 403).

    ``seq`` numbers denials from 1 in the order they happened (``seq`` of the last one equals
    :attr:`GatewayMetrics.denied`). ``reason`` is ``missing_token``, ``invalid_token``,
    ``session_closed`` (a session token whose session was released), ``other_session`` (a
    session token on another session's path) or ``admin_only`` (a session token on a route that
    needs the admin token). ``session_id`` is the session the token belongs to, when it is a
    genuine session token. ``path`` is cut to 200 characters.
    """

    seq: int
    at: float
    status: int
    reason: str
    method: str
    path: str
    session_id: str | None


class GatewayMetrics:
    """Counters the HTTP layer updates on every request; :attr:`model_calls` counts the
    requests that reached a model route (chat completions, completions, responses) past auth.

    Denied requests: :attr:`denied` counts them all, :attr:`denied_by_reason` by
    :attr:`Denial.reason`, and :meth:`denials_after` returns the last ``keep_denials`` of them,
    so a reader that polls (from any thread) sees each once::

        seen = 0
        for denial in metrics.denials_after(seen):
            seen = denial.seq
    """

    def __init__(self, *, keep_denials: int = 256) -> None:
        self.started_at = time.time()
        self.in_flight = 0
        self.served = 0
        self.model_calls = 0
        self.status_counts: Counter[int] = Counter()
        self.lag = LoopLagMonitor()
        self.denied = 0
        self.denied_by_reason: Counter[str] = Counter()
        self._denials: deque[Denial] = deque(maxlen=keep_denials)

    def record_denial(
        self, *, status: int, reason: str, method: str, path: str, session_id: str | None
    ) -> Denial:
        """Count one denied request and keep it among the recent ones."""
        self.denied += 1
        self.denied_by_reason[reason] += 1
        denial = Denial(
            seq=self.denied,
            at=time.time(),
            status=status,
            reason=reason,
            method=method,
            path=path[:200],
            session_id=session_id,
        )
        self._denials.append(denial)
        return denial

    def denials_after(self, seq: int = 0) -> list[Denial]:
        """The kept denials numbered above ``seq``, oldest first (those pushed out of the last
        ``keep_denials`` are counted but gone)."""
        return [d for d in list(self._denials) if d.seq > seq]

    def request_started(self) -> None:
        self.in_flight += 1

    def request_finished(self, status: int) -> None:
        self.in_flight -= 1
        self.served += 1
        self.status_counts[status] += 1

    def snapshot(self) -> dict[str, object]:
        return {
            "uptime_s": round(time.time() - self.started_at, 3),
            "in_flight": self.in_flight,
            "requests_served": self.served,
            "model_calls": self.model_calls,
            "status_counts": {str(k): v for k, v in sorted(self.status_counts.items())},
            "event_loop_lag": self.lag.summary(),
            "denied": {
                "total": self.denied,
                "by_reason": dict(sorted(self.denied_by_reason.items())),
            },
        }
