"""Trainer scheduler simulation: trainer hours and sample latency under three policies.

A discrete-event simulation on simulated time of a pool of sampler nodes fed by a bursty,
seeded trace (periods of load, when every sampler rolls out group after group, and quiet
periods with nothing to roll out), and one trainer. Three policies:

- ``always-on``: a trainer node of its own, up from the first second to the last, training
  whenever a batch waits;
- ``s1-separate``: the same trainer node, started and stopped by rule S1
  (:class:`rllm_core.training.scheduler.Controller`, journal included);
- ``s1-convert``: no trainer node: S1 converts one of the samplers into the trainer and back
  (:class:`rllm_core.training.nodes.NodePool` through
  :class:`~rllm_core.training.nodes.ConvertingTrainer`), so that while it trains the pool
  samples with one node fewer, and the trajectories in flight on it are kept or cut.

The scheduler and node classes are the project's own, driven by the simulated clock: the
controller's clock and sleep, and every call of the lifecycle and of the converter, move the
simulation forward by the time that step takes. The age bound is the pipeline's: samplers
start no rollout while ``(max_policy_age // versions_per_round + 1) x batch`` groups wait or
are in flight.

Figures: trainer hours (from a start call to the end of the stop, or, converting, from the
moment the node stops taking trajectories until it samples again), node hours (the samplers'
and the trainer's machines over the whole run), groups produced and trained, trajectories cut
by conversions, incarnations, and sample latency: from a group's arrival in the buffer to the
end of the round that trains it (mean, p95 and max, minutes; the max is a part batch that
waited through a quiet period). Groups left under a batch when the data ends are counted, not
trained.

Run from the repository root::

    .venv/bin/python benchmarks/scheduler_sim.py            # a table
    .venv/bin/python benchmarks/scheduler_sim.py --json     # one JSON object
    .venv/bin/python benchmarks/scheduler_sim.py --hours 72 --seed 3 --samplers 8

Exits 1 when a policy loses a group (one produced that is neither trained nor left under a
batch at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from _tables import right_aligned
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.training.nodes import ConvertingTrainer, Node, NodeClass, NodePool
from rllm_core.training.scheduler import Controller, SchedulerSettings

POLICIES = ("always-on", "s1-separate", "s1-convert")


@dataclass(frozen=True)
class Setup:
    """The simulated pool, trainer and trace (times in seconds)."""

    hours: float = 24.0
    seed: int = 0
    samplers: int = 4
    rollout_s: float = 90.0
    """Mean time one sampler node takes to roll out a group (log-normal, sigma 0.5)."""
    load_min: tuple[float, float] = (20.0, 120.0)
    quiet_min: tuple[float, float] = (30.0, 180.0)
    batch_groups: int = 8
    max_policy_age: int = 1
    startup_s: float = 300.0
    """Trainer start to ready: machine, weights, optimizer state, newest cut."""
    round_s: float = 60.0
    cut_s: float = 45.0
    release_s: float = 20.0
    """A converted node loading the newest policy release back into its sampler."""
    free_sampler_s: float = 10.0
    grace_s: float = 30.0
    poll_s: float = 10.0

    def settings(self) -> SchedulerSettings:
        return SchedulerSettings(
            batch_groups=self.batch_groups,
            max_policy_age=self.max_policy_age,
            poll_s=self.poll_s,
        )


def load_periods(setup: Setup) -> list[tuple[float, float]]:
    """The trace: (start, end) of each load period, seeded, alternating with quiet ones."""
    rng = random.Random(setup.seed)
    end, now, periods = setup.hours * 3600.0, 0.0, []
    while now < end:
        length = rng.uniform(*setup.load_min) * 60.0
        periods.append((now, min(now + length, end)))
        now += length + rng.uniform(*setup.quiet_min) * 60.0
    return periods


@dataclass
class Sampler:
    """A sampler node: whether it takes trajectories, and the one in flight (its id and when
    it finishes)."""

    rng: random.Random
    admitting: bool = True
    rollout: tuple[int, float] | None = None


@dataclass
class World:
    """The simulated pool and sample buffer; time moves only through :meth:`advance_to`."""

    setup: Setup
    periods: list[tuple[float, float]]
    now: float = 0.0
    samplers: dict[str, Sampler] = field(default_factory=dict)
    buffer: deque[float] = field(default_factory=deque)
    """Arrival times of the groups waiting to be trained, oldest first."""
    produced: int = 0
    trained: int = 0
    cut: int = 0
    latencies: list[float] = field(default_factory=list)
    trainer_s: float = 0.0
    incarnations: int = 0
    _events: list[tuple[float, int, str, str]] = field(default_factory=list)
    _ids: int = 0

    def __post_init__(self) -> None:
        for i in range(self.setup.samplers):
            self.samplers[f"node-{i}"] = Sampler(rng=random.Random(f"{self.setup.seed}/{i}"))
        for start, _ in self.periods:
            self._push(start, "load", "")
        self.end = self.periods[-1][1]
        self.cap = self.setup.settings().max_backlog_groups

    def _push(self, at: float, kind: str, node: str) -> int:
        self._ids += 1
        heapq.heappush(self._events, (at, self._ids, kind, node))
        return self._ids

    def loading(self, at: float) -> bool:
        return any(start <= at < end for start, end in self.periods)

    def in_flight(self) -> int:
        return sum(s.rollout is not None for s in self.samplers.values())

    def kick(self) -> None:
        """Start a rollout on every idle admitting sampler, as far as load and the bound allow."""
        for name, sampler in self.samplers.items():
            if not (sampler.admitting and sampler.rollout is None and self.loading(self.now)):
                continue
            if len(self.buffer) + self.in_flight() >= self.cap:
                return
            mean, sigma = self.setup.rollout_s, 0.5
            duration = sampler.rng.lognormvariate(math.log(mean) - sigma**2 / 2, sigma)
            finish = self.now + duration
            sampler.rollout = (self._push(finish, "done", name), finish)

    def advance_to(self, at: float) -> None:
        while self._events and self._events[0][0] <= at:
            when, event, kind, name = heapq.heappop(self._events)
            self.now = max(self.now, when)
            if kind == "done":
                sampler = self.samplers[name]
                if sampler.rollout is None or sampler.rollout[0] != event:
                    continue  # the rollout was cut
                sampler.rollout = None
                self.buffer.append(self.now)
                self.produced += 1
            self.kick()
        self.now = max(self.now, at)

    async def sleep(self, seconds: float) -> None:
        self.advance_to(self.now + seconds)

    def backlog(self) -> int:
        return len(self.buffer)

    def data_ended(self) -> bool:
        return self.now >= self.end and self.in_flight() == 0

    def train(self) -> bool:
        """One round: the oldest batch, trained once the round's time has passed."""
        batch = self.setup.batch_groups
        if len(self.buffer) < batch:
            return False
        self.advance_to(self.now + self.setup.round_s)
        for _ in range(batch):
            self.latencies.append(self.now - self.buffer.popleft())
        self.trained += batch
        self.kick()
        return True


class SeparateTrainer:
    """A trainer node of its own (the scheduler's lifecycle)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._since = 0.0

    async def start(self, incarnation: int) -> None:
        self._since = self.world.now
        self.world.incarnations += 1
        self.world.advance_to(self.world.now + self.world.setup.startup_s)

    async def train_round(self) -> bool:
        return self.world.train()

    async def stop(self, trigger: str) -> None:
        self.world.advance_to(self.world.now + self.world.setup.cut_s)
        self.world.trainer_s += self.world.now - self._since


class SimConverter:
    """Converts simulated sampler nodes (the pool's converter)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._since = 0.0

    async def stop_admitting(self, node: str) -> None:
        self._since = self.world.now
        self.world.samplers[node].admitting = False

    async def collect_finished(self, node: str, grace_s: float) -> int:
        rollout = self.world.samplers[node].rollout
        if rollout is None or rollout[1] > self.world.now + grace_s:
            return 0
        self.world.advance_to(rollout[1])
        return 1

    async def cut_unfinished(self, node: str) -> int:
        sampler = self.world.samplers[node]
        if sampler.rollout is None:
            return 0
        sampler.rollout = None
        self.world.cut += 1
        return 1

    async def release_sampler(self, node: str) -> None:
        self.world.advance_to(self.world.now + self.world.setup.free_sampler_s)

    async def start_trainer(self, node: str, incarnation: int) -> None:
        self.world.incarnations += 1
        self.world.advance_to(self.world.now + self.world.setup.startup_s)

    async def train_round(self, node: str) -> bool:
        return self.world.train()

    async def stop_trainer(self, node: str, trigger: str) -> None:
        self.world.advance_to(self.world.now + self.world.setup.cut_s)

    async def load_release(self, node: str) -> int:
        self.world.advance_to(self.world.now + self.world.setup.release_s)
        return 0

    async def start_sampler(self, node: str) -> None:
        self.world.samplers[node].admitting = True
        self.world.trainer_s += self.world.now - self._since
        self.world.kick()


async def always_on(world: World) -> None:
    trainer = SeparateTrainer(world)
    await trainer.start(1)
    while True:
        if await trainer.train_round():
            continue
        if world.data_ended() and world.backlog() < world.setup.batch_groups:
            await trainer.stop("final")
            return
        await world.sleep(world.setup.poll_s)


async def under_s1(world: World, lifecycle: Any) -> None:
    controller = Controller(
        lifecycle=lifecycle,
        settings=world.setup.settings(),
        store=MemoryObjectStore(),
        prefix="sim/scheduler",
        backlog=world.backlog,
        data_ended=world.data_ended,
        clock=lambda: world.now,
        sleep=world.sleep,
    )
    await controller.run()


def simulate(setup: Setup, policy: str) -> dict[str, Any]:
    periods = load_periods(setup)
    world = World(setup=setup, periods=periods)
    world.kick()
    began = time.perf_counter()
    if policy == "always-on":
        asyncio.run(always_on(world))
    elif policy == "s1-separate":
        asyncio.run(under_s1(world, SeparateTrainer(world)))
    else:
        gpu = NodeClass("gpu", spot=False, precision="bf16")
        pool = NodePool(
            nodes=[Node(name, gpu) for name in world.samplers],
            converter=SimConverter(world),
            grace_s=setup.grace_s,
        )
        asyncio.run(under_s1(world, ConvertingTrainer(pool)))
    latencies = sorted(world.latencies)
    hours = world.now / 3600.0
    trainer_hours = world.trainer_s / 3600.0
    separate = policy != "s1-convert"
    return {
        "policy": policy,
        "trainer_hours": trainer_hours,
        "trainer_share": trainer_hours / hours,
        "node_hours": setup.samplers * hours + (trainer_hours if separate else 0.0),
        "run_hours": hours,
        "incarnations": world.incarnations,
        "groups_produced": world.produced,
        "groups_trained": world.trained,
        "groups_left": len(world.buffer),
        "trajectories_cut": world.cut,
        "latency_mean_min": sum(latencies) / len(latencies) / 60.0 if latencies else 0.0,
        "latency_p95_min": _percentile(latencies, 0.95) / 60.0,
        "latency_max_min": (latencies[-1] if latencies else 0.0) / 60.0,
        "simulation_s": time.perf_counter() - began,
        "lost_groups": world.produced - world.trained - len(world.buffer),
    }


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 when there are none)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def run(setup: Setup) -> dict[str, Any]:
    periods = load_periods(setup)
    load_hours = sum(end - start for start, end in periods) / 3600.0
    return {
        "setup": asdict(setup),
        "trace": {"load_periods": len(periods), "load_hours": load_hours},
        "policies": {policy: simulate(setup, policy) for policy in POLICIES},
    }


FIGURES = (
    ("trainer hours", lambda r: f"{r['trainer_hours']:.2f}"),
    ("trainer share of the run", lambda r: f"{r['trainer_share']:.2f}"),
    ("node hours (samplers + trainer)", lambda r: f"{r['node_hours']:.1f}"),
    ("run hours", lambda r: f"{r['run_hours']:.2f}"),
    ("trainer incarnations", lambda r: f"{r['incarnations']}"),
    ("groups produced", lambda r: f"{r['groups_produced']}"),
    ("groups trained", lambda r: f"{r['groups_trained']}"),
    ("groups left under a batch", lambda r: f"{r['groups_left']}"),
    ("trajectories cut", lambda r: f"{r['trajectories_cut']}"),
    ("latency mean, min", lambda r: f"{r['latency_mean_min']:.1f}"),
    ("latency p95, min", lambda r: f"{r['latency_p95_min']:.1f}"),
    ("latency max, min", lambda r: f"{r['latency_max_min']:.1f}"),
)


def render(results: dict[str, Any]) -> str:
    setup, trace = results["setup"], results["trace"]
    lines = [
        f"Trainer scheduler simulation: {setup['hours']:g} h trace (seed {setup['seed']}),"
        f" {trace['load_periods']} load periods, {trace['load_hours']:.1f} h of load",
        f"  {setup['samplers']} sampler nodes, a group every {setup['rollout_s']:g} s per node"
        f" under load; batch {setup['batch_groups']} groups, max_policy_age"
        f" {setup['max_policy_age']}; trainer start-up {setup['startup_s']:g} s, round"
        f" {setup['round_s']:g} s, cut {setup['cut_s']:g} s; poll {setup['poll_s']:g} s",
    ]
    policies = results["policies"]
    lines.extend(
        right_aligned(
            ["figure", *policies],
            [[title, *(cell(r) for r in policies.values())] for title, cell in FIGURES],
            left=1,
        )
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--hours", type=float, default=Setup.hours, help="length of the trace")
    parser.add_argument("--seed", type=int, default=Setup.seed, help="seed of the trace")
    parser.add_argument(
        "--samplers", type=int, default=Setup.samplers, help="sampler nodes in the pool"
    )
    args = parser.parse_args(argv)
    if args.hours <= 0 or args.samplers < 2:
        parser.error("--hours must be positive and --samplers at least 2 (one may convert)")
    results = run(Setup(hours=args.hours, seed=args.seed, samplers=args.samplers))
    print(json.dumps(results, indent=2) if args.json else render(results))
    lost = any(r["lost_groups"] for r in results["policies"].values())
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
