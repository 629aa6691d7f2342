"""Rule S1, its journal and the controller, on a fake clock: the trainer starts at Q_on, stops
after idling T_s (the measured start-up time), finishes with a final cut when the data ends,
continues across a controller restart from the journal, gives up after repeated failures and
stops with the trigger it is asked for."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.errors import SchedulerGaveUp
from rllm_core.plan.load import parse_plan
from rllm_core.ports import TrainerLifecycle, TrainerReattach
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.training.pipeline import RoundThrottle
from rllm_core.training.scheduler import (
    Controller,
    JournalConflictError,
    S1Policy,
    SchedulerInputs,
    SchedulerJournal,
    SchedulerSettings,
)

PREFIX = "runs/r1/scheduler"
EPOCH = 1_700_000_000.0


class Crash(BaseException):
    """The controller's process dies (nothing in it catches this)."""


@dataclass
class World:
    """A fake clock and a sample buffer: groups arrive at given times, rounds take them."""

    arrivals: list[float]
    batch: int
    now: float = EPOCH
    trained: int = 0
    crash_at: float | None = None

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if self.crash_at is not None and self.now >= self.crash_at:
            self.crash_at = None
            raise Crash

    def arrived(self) -> int:
        return sum(t <= self.now for t in self.arrivals)

    def backlog(self) -> int:
        return self.arrived() - self.trained

    def data_ended(self) -> bool:
        return self.arrived() == len(self.arrivals)


@dataclass
class FakeTrainer:
    """Records each call with the time it began; start-up, rounds and cuts take time."""

    world: World
    startup_s: float = 30.0
    round_s: float = 5.0
    cut_s: float = 2.0
    fail_starts: set[int] = field(default_factory=set)
    calls: list[tuple[str, Any, float]] = field(default_factory=list)
    on_round: Any = None

    async def start(self, incarnation: int) -> None:
        self.calls.append(("start", incarnation, self.world.now))
        self.world.advance(self.startup_s)
        if incarnation in self.fail_starts:
            raise RuntimeError(f"out of memory in incarnation {incarnation}")

    async def train_round(self) -> bool:
        if self.world.backlog() < self.world.batch:
            return False
        self.calls.append(("round", self.world.trained, self.world.now))
        self.world.advance(self.round_s)
        self.world.trained += self.world.batch
        if self.on_round is not None:
            self.on_round()
        return True

    async def stop(self, trigger: str) -> None:
        self.calls.append(("stop", trigger, self.world.now))
        self.world.advance(self.cut_s)

    def named(self, name: str) -> list[tuple[Any, float]]:
        return [(arg, t) for call, arg, t in self.calls if call == name]


@dataclass
class RemoteTrainer(FakeTrainer):
    """A trainer on its own machine: it outlives a crashed controller."""

    alive: bool = True

    async def reattach(self, incarnation: int) -> bool:
        self.calls.append(("reattach", incarnation, self.world.now))
        return self.alive


def controller(
    store: MemoryObjectStore, world: World, trainer: Any, config: SchedulerSettings
) -> Controller:
    return Controller(
        lifecycle=trainer,
        settings=config,
        store=store,
        prefix=PREFIX,
        backlog=world.backlog,
        data_ended=world.data_ended,
        clock=lambda: world.now,
        sleep=world.sleep,
    )


def journal(store: MemoryObjectStore) -> list[dict[str, Any]]:
    return SchedulerJournal(store, PREFIX).read()


def kinds(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["kind"] == kind]


def test_fakes_satisfy_the_ports() -> None:
    world = World(arrivals=[], batch=1)
    assert isinstance(FakeTrainer(world), TrainerLifecycle)
    assert not isinstance(FakeTrainer(world), TrainerReattach)
    assert isinstance(RemoteTrainer(world), TrainerReattach)


def test_settings_default_and_bound_q_on() -> None:
    assert SchedulerSettings(batch_groups=4).q_on == 4
    assert (
        SchedulerSettings(batch_groups=4, max_policy_age=2, versions_per_round=1).max_backlog_groups
        == 12
    )
    assert (
        SchedulerSettings(batch_groups=4, max_policy_age=3, versions_per_round=2).max_backlog_groups
        == 8
    )
    with pytest.raises(
        ValueError, match=r"\[scheduler\].q_on_groups = 9 is more than the 8 groups"
    ) as info:
        SchedulerSettings(batch_groups=4, max_policy_age=1, q_on_groups=9)
    assert "use at most 8, or raise max_policy_age" in str(info.value)
    with pytest.raises(ValueError, match=r"\[scheduler\].q_on_groups = 3 is less than one batch"):
        SchedulerSettings(batch_groups=4, q_on_groups=3)
    with pytest.raises(ValueError, match=r"\[scheduler\].poll_s = 0: use a positive number"):
        SchedulerSettings(batch_groups=4, poll_s=0)


def test_q_on_defaults_to_what_the_age_bound_lets_wait_and_alpha_takes_a_fraction() -> None:
    def settings(**keys: Any) -> SchedulerSettings:
        return SchedulerSettings(batch_groups=4, max_policy_age=2, versions_per_round=1, **keys)

    assert settings().q_on == settings().max_backlog_groups == 12, "A_hard + 1 = 3 batches"
    assert settings(alpha=0.5).q_on == 6
    assert settings(alpha=0.4).q_on == 5, "rounded up"
    assert settings(alpha=0.1).q_on == 4, "at least one batch"
    assert settings(alpha=1.0).q_on == 12
    assert settings(q_on_groups=8).q_on == 8
    with pytest.raises(ValueError, match=r"\[scheduler\].alpha = 0: use a fraction"):
        settings(alpha=0)
    with pytest.raises(ValueError, match=r"q_on_groups = 8 and \[scheduler\].alpha = 0.5"):
        settings(q_on_groups=8, alpha=0.5)


def test_settings_from_a_plan() -> None:
    plan = parse_plan(
        {
            "run": {"pipeline": "async"},
            "algorithm": {"batch_size": 4, "max_policy_age": 4, "mini_batches": 2},
            "scheduler": {"q_on_groups": 12, "idle_fallback_s": 90, "max_failures": 5},
        }
    )
    config = SchedulerSettings.from_plan(plan)
    assert (config.q_on, config.max_backlog_groups) == (12, 12)
    assert (config.idle_stop_s, config.idle_fallback_s, config.max_failures) == (None, 90.0, 5)
    assert config.poll_s == 1.0
    plan = parse_plan(
        {
            "run": {"pipeline": "async"},
            "algorithm": {"batch_size": 4, "max_policy_age": 4, "mini_batches": 2},
            "scheduler": {"alpha": 0.5},
        }
    )
    assert SchedulerSettings.from_plan(plan).q_on == 6


def test_policy_decisions_carry_their_inputs() -> None:
    policy = S1Policy(SchedulerSettings(batch_groups=4, max_policy_age=1, q_on_groups=8))

    def decide(**changes: Any) -> tuple[str, str]:
        base = dict(
            backlog_groups=0,
            idle_s=0.0,
            startup_s=None,
            data_ended=False,
            running=False,
            incarnation=2,
        )
        inputs = SchedulerInputs(**(base | changes))
        decision = policy.decide(inputs)
        assert decision.inputs == inputs
        return decision.action, decision.reason

    assert decide(backlog_groups=7) == ("wait", "7 groups pending < q_on 8")
    assert decide(backlog_groups=8)[0] == "start"
    assert decide(backlog_groups=4, running=True, idle_s=500.0) == (
        "wait",
        "4 groups pending: training",
    )
    assert decide(backlog_groups=3, running=True, idle_s=59.0) == (
        "wait",
        "idle 59.0 s < 60.0 s (idle_fallback_s, no start-up measured yet) with 3 groups pending",
    )
    assert decide(backlog_groups=3, running=True, idle_s=20.0, startup_s=20.0) == (
        "stop",
        "idle 20.0 s >= 20.0 s (measured start-up time) with 3 groups pending",
    )
    assert decide(backlog_groups=4, data_ended=True)[0] == "start", "data ended: below Q_on trains"
    assert decide(backlog_groups=3, data_ended=True, running=True) == (
        "finish",
        "data ended, 3 groups pending (a batch is 4): a final cut, then exit",
    )


def test_starts_when_the_backlog_reaches_q_on() -> None:
    arrivals = [EPOCH + 10.0 * i for i in range(1, 9)] + [EPOCH + 5000.0] * 8
    world = World(arrivals=arrivals, batch=4)
    trainer = FakeTrainer(world)
    # Unset, q_on is the 8 groups the age bound lets wait (max_policy_age 1: two batches).
    config = SchedulerSettings(batch_groups=4, max_policy_age=1, poll_s=1.0)
    store = MemoryObjectStore()
    outcome = asyncio.run(controller(store, world, trainer, config).run())

    (incarnation, started), *_ = trainer.named("start")
    eighth = EPOCH + 80.0
    assert incarnation == 1
    assert eighth <= started <= eighth + config.poll_s
    start = next(r for r in kinds(journal(store), "decision") if r["action"] == "start")
    assert start["rule"] == "backlog" and start["inputs"]["backlog_groups"] == 8
    assert start["reason"] == "8 groups pending >= q_on 8"
    assert world.trained == 16
    assert outcome.ended == "finished" and outcome.trigger == "final"
    assert outcome.rounds == 4


def test_idle_stop_after_the_measured_start_up_time() -> None:
    # Four groups, then a long quiet spell, then four more: the trainer stops in between.
    arrivals = [EPOCH + 1.0] * 4 + [EPOCH + 1000.0] * 4
    world = World(arrivals=arrivals, batch=4)
    trainer = FakeTrainer(world, startup_s=30.0)
    config = SchedulerSettings(batch_groups=4, idle_fallback_s=600.0, poll_s=1.0)
    store = MemoryObjectStore()
    asyncio.run(controller(store, world, trainer, config).run())

    records = journal(store)
    assert [r["startup_s"] for r in kinds(records, "ready")] == [30.0, 30.0]
    idle = kinds(records, "idle")[0]["ts"]
    (trigger, stopped), *_ = trainer.named("stop")
    assert trigger == "scheduled"
    assert idle + 30.0 <= stopped <= idle + 30.0 + config.poll_s
    [stop] = [r for r in kinds(records, "decision") if r["action"] == "stop"]
    assert stop["inputs"]["startup_s"] == 30.0
    assert "(measured start-up time)" in stop["reason"]
    assert [i for i, _ in trainer.named("start")] == [1, 2]
    assert world.trained == 8


def test_idle_stop_s_overrides_the_measured_time() -> None:
    world = World(arrivals=[EPOCH] * 4 + [EPOCH + 1000.0] * 4, batch=4)
    trainer = FakeTrainer(world, startup_s=30.0)
    config = SchedulerSettings(batch_groups=4, idle_stop_s=100.0, poll_s=1.0)
    store = MemoryObjectStore()
    asyncio.run(controller(store, world, trainer, config).run())
    idle = kinds(journal(store), "idle")[0]["ts"]
    (_, stopped), *_ = trainer.named("stop")
    assert idle + 100.0 <= stopped <= idle + 101.0


def sampler_arrivals(rounds: int, batch: int, rollout_s: float, min_round_s: float) -> list[float]:
    """When a sampler's batches land in the buffer: each rolls out for ``rollout_s`` and starts
    as soon as its :class:`RoundThrottle` lets it (the trainer keeps up, so the age bound holds
    none back)."""
    now = EPOCH

    async def sleep(seconds: float) -> None:
        nonlocal now
        now += seconds

    throttle = RoundThrottle(min_round_s, clock=lambda: now, sleep=sleep)

    async def produce() -> list[float]:
        arrivals: list[float] = []
        for _ in range(rounds):
            await throttle.wait()
            throttle.started()
            arrivals += [now + rollout_s] * batch
        return arrivals

    return asyncio.run(produce())


def test_min_round_s_spaces_the_batches_so_s1_stops_the_trainer_between_them() -> None:
    # A short run whose sampler outpaces the trainer: without the throttle every batch waits
    # at once and the trainer never idles; with min_round_s above start-up + round + T_s
    # (30 + 5 + 30 s) it idles after each batch and S1 stops it before the next.
    config = SchedulerSettings(batch_groups=4, poll_s=1.0)
    outcomes = {}
    for min_round_s in (0.0, 120.0):
        world = World(arrivals=sampler_arrivals(4, 4, 2.0, min_round_s), batch=4)
        trainer = FakeTrainer(world, startup_s=30.0, round_s=5.0)
        asyncio.run(controller(MemoryObjectStore(), world, trainer, config).run())
        assert world.trained == 16
        outcomes[min_round_s] = (world.arrivals[::4], trainer)
    arrivals, trainer = outcomes[0.0]
    assert arrivals == [EPOCH + 2.0] * 4
    assert [t for t, _ in trainer.named("stop")] == ["final"]
    arrivals, trainer = outcomes[120.0]
    assert arrivals == [EPOCH + 2.0 + 120.0 * k for k in range(4)]
    assert [t for t, _ in trainer.named("stop")] == ["scheduled"] * 3 + ["final"]
    assert [t for t, _ in trainer.named("start")] == [1, 2, 3, 4]


def test_a_round_throttle_waits_only_for_what_is_left_of_min_round_s() -> None:
    now = 0.0
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        nonlocal now
        slept.append(seconds)
        now += seconds

    throttle = RoundThrottle(10.0, clock=lambda: now, sleep=sleep)

    async def rounds() -> None:
        nonlocal now
        await throttle.wait()  # the first round starts at once
        throttle.started()
        now += 4.0
        await throttle.wait()  # 6 s left of the first round's 10
        throttle.started()
        now += 15.0
        await throttle.wait()  # the second took longer than 10 s: no wait
        throttle.started()

    asyncio.run(rounds())
    assert slept == [6.0]
    assert throttle.waited_s == 6.0


def test_min_round_s_is_a_plan_key_and_negative_values_are_refused() -> None:
    from pydantic import ValidationError
    from rllm_core.plan.schema import SchedulerSection

    assert SchedulerSection().min_round_s == 0
    assert SchedulerSection(min_round_s=30).min_round_s == 30
    with pytest.raises(ValidationError, match="min_round_s"):
        SchedulerSection(min_round_s=-1)


def test_data_end_finishes_with_a_final_cut() -> None:
    world = World(arrivals=[EPOCH + i for i in range(12)], batch=4)
    trainer = FakeTrainer(world)
    store = MemoryObjectStore()
    outcome = asyncio.run(
        controller(store, world, trainer, SchedulerSettings(batch_groups=4)).run()
    )
    assert [t for t, _ in trainer.named("stop")] == ["final"]
    assert world.trained == 12
    assert outcome.ended == "finished" and outcome.trigger == "final"
    last = journal(store)[-1]
    assert last["kind"] == "stopped" and last["trigger"] == "final" and last["rounds"] == 3


def test_data_end_with_the_trainer_stopped_and_less_than_a_batch_exits_without_starting() -> None:
    world = World(arrivals=[EPOCH] * 3, batch=4)
    trainer = FakeTrainer(world)
    store = MemoryObjectStore()
    outcome = asyncio.run(
        controller(store, world, trainer, SchedulerSettings(batch_groups=4)).run()
    )
    assert trainer.calls == []
    assert outcome.ended == "finished" and outcome.trigger is None
    [finish] = [r for r in kinds(journal(store), "decision") if r["action"] == "finish"]
    assert finish["inputs"]["backlog_groups"] == 3 and finish["inputs"]["data_ended"] is True


def test_a_restarted_controller_continues_the_idle_timer_and_the_numbering() -> None:
    # Incarnation 1 trains a batch and idles; its controller dies 20 s into the idle spell.
    world = World(arrivals=[EPOCH] * 4 + [EPOCH + 5000.0] * 4, batch=4)
    trainer = RemoteTrainer(world, startup_s=30.0)
    config = SchedulerSettings(batch_groups=4, poll_s=1.0)
    store = MemoryObjectStore()
    first = controller(store, world, trainer, config)
    world.crash_at = EPOCH + 30.0 + 5.0 + 20.0
    with pytest.raises(Crash):
        asyncio.run(first.run())
    assert first.state.idle_since is not None and trainer.named("stop") == []
    idle = first.state.idle_since

    second = controller(store, world, trainer, config)
    asyncio.run(second.run())
    assert trainer.named("reattach") == [(1, EPOCH + 55.0)]
    (trigger, stopped), *_ = trainer.named("stop")
    assert trigger == "scheduled"
    assert idle + 30.0 <= stopped <= idle + 30.0 + config.poll_s, "the timer went on"
    assert [i for i, _ in trainer.named("start")] == [1, 2]
    assert [r["n"] for r in journal(store)] == list(range(len(journal(store))))


def test_a_restarted_controller_counts_a_lost_incarnation_and_starts_the_next() -> None:
    world = World(arrivals=[EPOCH] * 8, batch=4)
    trainer = FakeTrainer(world, startup_s=30.0)
    store = MemoryObjectStore()
    config = SchedulerSettings(batch_groups=4, max_policy_age=1, poll_s=1.0)
    world.crash_at = EPOCH + 10.0  # during incarnation 1's start-up
    with pytest.raises(Crash):
        asyncio.run(controller(store, world, trainer, config).run())
    second = controller(store, world, trainer, config)
    asyncio.run(second.run())
    [lost] = kinds(journal(store), "lost")
    assert lost["incarnation"] == 1
    assert [i for i, _ in trainer.named("start")] == [1, 2]
    assert world.trained == 8
    assert second.state.failures == 0, "incarnation 2 trained, which ends the streak"


def test_failure_count_continues_across_a_restart_then_gives_up() -> None:
    world = World(arrivals=[EPOCH] * 4, batch=4)
    trainer = FakeTrainer(world, startup_s=10.0, fail_starts={1, 2, 3})
    store = MemoryObjectStore()
    config = SchedulerSettings(batch_groups=4, max_failures=3, poll_s=1.0)
    # Two failed starts (10 s each, a 1 s pause after each), then the process dies.
    world.crash_at = EPOCH + 21.5
    with pytest.raises(Crash):
        asyncio.run(controller(store, world, trainer, config).run())
    assert [i for i, _ in trainer.named("start")] == [1, 2]

    second = controller(store, world, trainer, config)
    with pytest.raises(SchedulerGaveUp) as info:
        asyncio.run(second.run())
    assert [i for i, _ in trainer.named("start")] == [1, 2, 3]
    error = info.value
    assert error.exit_code == 3
    assert error.failures == [
        f"incarnation {n}: RuntimeError: out of memory in incarnation {n}" for n in (1, 2, 3)
    ]
    message = str(error)
    assert "failed 3 times in a row without training a round" in message
    assert f"scheduler journal {PREFIX}/journal/" in message
    assert "then start the trainer again" in message
    assert journal(store)[-1]["kind"] == "gave-up"


def test_a_trained_round_ends_the_failure_streak() -> None:
    world = World(arrivals=[EPOCH] * 4 + [EPOCH + 500.0] * 4, batch=4)
    trainer = FakeTrainer(world, startup_s=10.0, fail_starts={1, 3})
    store = MemoryObjectStore()
    config = SchedulerSettings(batch_groups=4, max_failures=2, poll_s=1.0)
    asyncio.run(controller(store, world, trainer, config).run())
    assert [i for i, _ in trainer.named("start")] == [1, 2, 3, 4]
    assert world.trained == 8


def test_give_up_after_failed_rounds_names_each_failure() -> None:
    world = World(arrivals=[EPOCH] * 4, batch=4)

    class Broken(FakeTrainer):
        async def train_round(self) -> bool:
            raise ValueError("nan loss")

    config = SchedulerSettings(batch_groups=4, max_failures=2)
    with pytest.raises(SchedulerGaveUp, match="incarnation 1: ValueError: nan loss; incarnation 2"):
        asyncio.run(controller(MemoryObjectStore(), world, Broken(world), config).run())


@pytest.mark.parametrize("trigger", ["preempt", "manual"])
def test_a_stop_request_cuts_with_its_trigger_at_a_round_boundary(trigger: str) -> None:
    world = World(arrivals=[EPOCH] * 12, batch=4)
    trainer = FakeTrainer(world)
    store = MemoryObjectStore()
    config = SchedulerSettings(batch_groups=4, max_policy_age=2)
    control = controller(store, world, trainer, config)
    trainer.on_round = lambda: control.request_stop(trigger)  # type: ignore[arg-type]
    outcome = asyncio.run(control.run())
    assert len(trainer.named("round")) == 1, "the round in flight finishes, no other starts"
    assert [t for t, _ in trainer.named("stop")] == [trigger]
    assert outcome.ended == "stopped" and outcome.trigger == trigger
    stopped = kinds(journal(store), "stopped")
    assert [(r["trigger"], r["rounds"]) for r in stopped] == [(trigger, 1)]


def test_a_stop_request_wakes_a_waiting_controller() -> None:
    world = World(arrivals=[EPOCH + 1e6] * 4, batch=4)
    trainer = FakeTrainer(world)

    async def main() -> Any:
        control = controller(
            MemoryObjectStore(), world, trainer, SchedulerSettings(batch_groups=4, poll_s=3600.0)
        )

        async def sleep(seconds: float) -> None:
            await asyncio.Event().wait()

        control.sleep = sleep
        task = asyncio.ensure_future(control.run())
        await asyncio.sleep(0.05)
        control.request_stop("manual")
        return await asyncio.wait_for(task, 5.0)

    outcome = asyncio.run(main())
    assert outcome.ended == "stopped" and trainer.calls == []


def test_two_controllers_cannot_write_the_same_record() -> None:
    store = MemoryObjectStore()
    one, two = SchedulerJournal(store, PREFIX), SchedulerJournal(store, PREFIX)
    one.read(), two.read()
    one.append({"kind": "decision", "ts": EPOCH})
    with pytest.raises(JournalConflictError, match=f"{PREFIX}/journal/000000000000 was written"):
        two.append({"kind": "decision", "ts": EPOCH})
    assert json.loads(store.get(f"{PREFIX}/journal/000000000000"))["n"] == 0


def test_waits_are_journaled_once_per_rule() -> None:
    world = World(arrivals=[EPOCH + 3600.0] * 4, batch=4)
    store = MemoryObjectStore()
    config = SchedulerSettings(batch_groups=4, poll_s=60.0)
    asyncio.run(controller(store, world, FakeTrainer(world), config).run())
    decisions = [(r["action"], r["rule"]) for r in kinds(journal(store), "decision")]
    assert decisions == [
        ("wait", "below-q-on"),
        ("start", "data-ended-backlog"),
        ("finish", "data-ended"),
    ]


@settings(max_examples=40, deadline=None)
@given(
    bursts=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=400.0), st.integers(min_value=1, max_value=5)),
        min_size=1,
        max_size=24,
    ),
    startup_s=st.floats(min_value=1.0, max_value=120.0),
    round_s=st.floats(min_value=0.5, max_value=60.0),
    poll_s=st.sampled_from([0.5, 1.0, 5.0]),
)
def test_property_never_idles_past_t_s_and_trains_every_group(
    bursts: list[tuple[float, int]], startup_s: float, round_s: float, poll_s: float
) -> None:
    """Groups arrive in bursts (a gap, then a count); the total is a whole number of batches,
    as the sampler produces them."""
    batch = 2
    arrivals, now = [], EPOCH
    for gap, count in bursts:
        now += gap
        arrivals += [now] * count
    arrivals += [now] * (len(arrivals) % batch)
    world = World(arrivals=arrivals, batch=batch)
    trainer = FakeTrainer(world, startup_s=startup_s, round_s=round_s)
    store = MemoryObjectStore()
    config = SchedulerSettings(batch_groups=batch, max_policy_age=1, poll_s=poll_s)
    asyncio.run(controller(store, world, trainer, config).run())

    assert world.trained == len(arrivals), "every group is trained before finish"
    records = journal(store)
    idle_since = None
    for record in records:
        if record["kind"] == "idle":
            idle_since = record["ts"]
        elif record["kind"] == "training":
            idle_since = None
        elif record["kind"] == "stopped":
            if idle_since is not None:
                idled = record["ts"] - trainer.cut_s - idle_since
                assert idled <= startup_s + poll_s + 1e-6, "T_s is the measured start-up"
            idle_since = None
    assert records[-1]["kind"] == "stopped" and records[-1]["trigger"] == "final"
