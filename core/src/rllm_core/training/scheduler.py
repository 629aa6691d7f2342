"""The trainer scheduler: rule S1, its journal in the object store, and the controller.

The trainer is the expensive part of an asynchronous run, so it runs only while there is
something to train. Rule S1 (:class:`S1Policy`), given the groups waiting in the sample
buffer (the backlog):

- start the trainer once the backlog reaches ``Q_on`` (by default all the age bound lets wait,
  see below);
- while it runs it trains round after round; once less than a batch waits it idles, and after
  idling ``idle_stop_s`` seconds (default: ``T_s``, how long the last incarnation took from
  start to ready) it stops with a cut: an idle trainer costs as much per second as starting a
  new one later, so it idles at most as long as a start-up takes;
- once the data has ended and less than a batch is left, it finishes: a running trainer writes
  a ``final`` cut, and the controller exits;
- after ``max_failures`` incarnations in a row fail without training a round, the controller
  raises :class:`~rllm_core.errors.SchedulerGaveUp`.

``Q_on`` is at most what the age bound lets wait: the sampler starts batch ``r`` only once
step ``r - 1 - lead`` is trained (``lead = max_policy_age // (mini_batches * epochs)``, the
hard age bound ``A_hard`` in steps), so with the trainer stopped at most ``(A_hard + 1) *
batch_size`` groups can wait; a larger threshold would never be reached. ``Q_on`` defaults to
that bound, so that each start-up is paid for with as many rounds as can wait; ``alpha`` takes
a fraction of it (rounded up, at least one batch) and ``q_on_groups`` sets it in groups.

The journal (:class:`SchedulerJournal`) holds one JSON object per record under
``<prefix>/journal/<n:012d>``, each written with ``put_if_absent`` so that two controllers
cannot both write record ``n``. It records the controller's decisions (one record each time
the action or the rule behind it changes, not every poll) and the lifecycle events of every
incarnation. A restarted controller replays it and continues where it left off
(:class:`SchedulerState`): the next incarnation number, the last measured start-up time, the
consecutive failure count, and, when the running incarnation is still there, its idle timer.
Timestamps are wall-clock seconds, so that another process can continue a timer.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rllm_core.errors import RllmError, SchedulerGaveUp
from rllm_core.plan.schema import waiting_groups_bound
from rllm_core.ports import ObjectStore, StopTrigger, TrainerLifecycle, TrainerReattach

if TYPE_CHECKING:
    from rllm_core.plan import Plan

__all__ = [
    "Action",
    "Controller",
    "Decision",
    "JournalConflictError",
    "S1Policy",
    "SchedulerInputs",
    "SchedulerJournal",
    "SchedulerOutcome",
    "SchedulerSettings",
    "SchedulerState",
]

Action = Literal["start", "stop", "finish", "wait"]

_INDEX_DIGITS = 12

LAUNCH_EVENTS = ("launched", "ready-timeout", "released", "converted")
"""Journal records of a trainer launched as a job of its own (:mod:`rllm_core.training.island`),
and of the convertible node it runs on (:mod:`rllm_core.training.nodes`)."""

_PLAN_KEYS = {
    "batch_groups": "[algorithm].batch_size",
    "max_policy_age": "[algorithm].max_policy_age",
    "versions_per_round": "[algorithm].mini_batches x epochs",
    "q_on_groups": "[scheduler].q_on_groups",
    "alpha": "[scheduler].alpha",
    "idle_stop_s": "[scheduler].idle_stop_s",
    "idle_fallback_s": "[scheduler].idle_fallback_s",
    "max_failures": "[scheduler].max_failures",
    "poll_s": "[scheduler].poll_s",
}
"""The plan key behind each setting, which the settings' errors name."""


@dataclass(frozen=True)
class SchedulerSettings:
    """The settings of rule S1 and its controller.

    ``batch_groups`` is the number of groups one round trains (``[algorithm].batch_size``),
    ``max_policy_age`` and ``versions_per_round`` (``mini_batches * epochs``) give the age
    bound. The start threshold is ``q_on_groups`` when set, else ``alpha`` (default 1) times
    what the age bound lets wait, rounded up and at least one batch; ``idle_stop_s`` defaults
    to the measured start-up time (``idle_fallback_s`` before one was measured). ``poll_s`` is
    how often the controller looks at the backlog while nothing happens. Invalid settings
    raise ``ValueError`` naming the plan key each comes from.
    """

    batch_groups: int
    max_policy_age: int = 0
    versions_per_round: int = 1
    q_on_groups: int | None = None
    alpha: float | None = None
    idle_stop_s: float | None = None
    idle_fallback_s: float = 60.0
    max_failures: int = 3
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        for name, value, least in (
            ("batch_groups", self.batch_groups, 1),
            ("max_policy_age", self.max_policy_age, 0),
            ("versions_per_round", self.versions_per_round, 1),
            ("max_failures", self.max_failures, 1),
        ):
            if value < least:
                raise ValueError(f"{_PLAN_KEYS[name]} = {value}: use at least {least}")
        for name, seconds in (
            ("idle_stop_s", self.idle_stop_s),
            ("idle_fallback_s", self.idle_fallback_s),
            ("poll_s", self.poll_s),
        ):
            if seconds is not None and not seconds > 0:
                raise ValueError(f"{_PLAN_KEYS[name]} = {seconds}: use a positive number")
        if self.alpha is not None:
            if not 0 < self.alpha <= 1:
                raise ValueError(
                    f"[scheduler].alpha = {self.alpha}: use a fraction of what the age bound"
                    " lets wait, above 0 and at most 1"
                )
            if self.q_on_groups is not None:
                raise ValueError(
                    f"[scheduler].q_on_groups = {self.q_on_groups} and [scheduler].alpha ="
                    f" {self.alpha} both set the start threshold: keep one"
                )
        q_on, most = self.q_on, self.max_backlog_groups
        if q_on < self.batch_groups:
            raise ValueError(
                f"[scheduler].q_on_groups = {q_on} is less than one batch ([algorithm].batch_size"
                f" = {self.batch_groups} groups): the trainer would start with nothing to train;"
                f" use at least {self.batch_groups}"
            )
        if q_on > most:
            raise ValueError(
                f"[scheduler].q_on_groups = {q_on} is more than the {most} groups the age bound"
                f" lets wait ([algorithm].batch_size {self.batch_groups} x ([algorithm]"
                f".max_policy_age {self.max_policy_age} // {self.versions_per_round} versions a"
                f" step + 1)), so the trainer would never start: use at most {most}, or raise"
                " max_policy_age"
            )

    @property
    def q_on(self) -> int:
        """The backlog, in groups, that starts the trainer."""
        if self.q_on_groups is not None:
            return self.q_on_groups
        alpha = 1.0 if self.alpha is None else self.alpha
        return max(self.batch_groups, math.ceil(round(alpha * self.max_backlog_groups, 9)))

    @property
    def max_backlog_groups(self) -> int:
        """The most groups that can wait while the trainer is stopped (the module docstring)."""
        return waiting_groups_bound(self.batch_groups, self.max_policy_age, self.versions_per_round)

    @classmethod
    def from_plan(cls, plan: Plan) -> SchedulerSettings:
        """Settings from a plan's ``[algorithm]`` and ``[scheduler]`` sections."""
        algorithm, section = plan.algorithm, plan.scheduler
        return cls(
            batch_groups=algorithm.batch_size,
            max_policy_age=algorithm.max_policy_age,
            versions_per_round=algorithm.mini_batches * algorithm.epochs,
            q_on_groups=section.q_on_groups,
            alpha=section.alpha,
            idle_stop_s=section.idle_stop_s,
            idle_fallback_s=section.idle_fallback_s,
            max_failures=section.max_failures,
            poll_s=section.poll_s,
        )


@dataclass(frozen=True)
class SchedulerInputs:
    """What a decision is made from. ``idle_s`` is how long the running trainer has found
    less than a batch (0 while it trains or is stopped); ``startup_s`` is ``T_s``, the last
    measured start-up time (None before one was measured); ``incarnation`` is the running
    one, or the last one when none runs (0 before the first)."""

    backlog_groups: int
    idle_s: float
    startup_s: float | None
    data_ended: bool
    running: bool
    incarnation: int


@dataclass(frozen=True)
class Decision:
    """What S1 decided, the rule behind it (a stable name) and why, in words."""

    action: Action
    rule: str
    reason: str
    inputs: SchedulerInputs

    def __str__(self) -> str:
        return f"{self.action}: {self.reason}"

    def to_record(self) -> dict[str, Any]:
        return {
            "kind": "decision",
            "action": self.action,
            "rule": self.rule,
            "reason": self.reason,
            "inputs": asdict(self.inputs),
        }


class S1Policy:
    """Rule S1 (the module docstring): a pure function of :class:`SchedulerInputs`."""

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings

    def idle_limit(self, startup_s: float | None) -> tuple[float, str]:
        """The idle time that stops the trainer, and where it comes from."""
        if self.settings.idle_stop_s is not None:
            return self.settings.idle_stop_s, "idle_stop_s"
        if startup_s is not None:
            return startup_s, "measured start-up time"
        return self.settings.idle_fallback_s, "idle_fallback_s, no start-up measured yet"

    def decide(self, inputs: SchedulerInputs) -> Decision:
        batch, backlog = self.settings.batch_groups, inputs.backlog_groups
        pending = f"{backlog} groups pending"

        def decision(action: Action, rule: str, reason: str) -> Decision:
            return Decision(action=action, rule=rule, reason=reason, inputs=inputs)

        if inputs.data_ended and backlog < batch:
            ending = "a final cut, then exit" if inputs.running else "exit"
            return decision(
                "finish", "data-ended", f"data ended, {pending} (a batch is {batch}): {ending}"
            )
        if not inputs.running:
            if inputs.data_ended:
                return decision(
                    "start", "data-ended-backlog", f"data ended with {pending}: train them"
                )
            if backlog >= self.settings.q_on:
                return decision("start", "backlog", f"{pending} >= q_on {self.settings.q_on}")
            return decision("wait", "below-q-on", f"{pending} < q_on {self.settings.q_on}")
        if backlog >= batch:
            return decision("wait", "training", f"{pending}: training")
        limit, source = self.idle_limit(inputs.startup_s)
        idle = f"idle {inputs.idle_s:.1f} s"
        if inputs.idle_s >= limit:
            return decision("stop", "idle", f"{idle} >= {limit:.1f} s ({source}) with {pending}")
        return decision("wait", "idling", f"{idle} < {limit:.1f} s ({source}) with {pending}")


class JournalConflictError(RllmError):
    """Another controller wrote the journal record this one was about to write."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass
class SchedulerState:
    """What the journal says, record by record (:meth:`apply`): the same replayed after a
    restart as built live."""

    records: int = 0
    incarnation: int = 0
    running: bool = False
    trained: bool = False
    """Whether the running (or last) incarnation has trained a round."""
    rounds: int = 0
    """Rounds the running (or last) incarnation has trained, as of its last record."""
    started_at: float | None = None
    idle_since: float | None = None
    startup_s: float | None = None
    failures: int = 0
    failed: list[str] = field(default_factory=list)
    """``incarnation n: error`` for each failure of the current streak."""
    last_decision: tuple[str, str] | None = None

    def apply(self, record: dict[str, Any]) -> None:
        self.records += 1
        kind, ts = record["kind"], float(record["ts"])
        if kind == "decision":
            self.last_decision = (record["action"], record["rule"])
            return
        if kind == "gave-up":
            # An operator who restarts after a give-up has dealt with it: a new streak begins.
            self.failures, self.failed = 0, []
            return
        incarnation = int(record["incarnation"])
        if kind == "started":
            self.incarnation, self.running, self.trained = incarnation, True, False
            self.rounds, self.started_at, self.idle_since = 0, ts, None
        elif kind == "ready":
            self.startup_s = float(record["startup_s"])
        elif kind == "training":
            self.trained, self.idle_since = True, None
            self.rounds = int(record["rounds"])
            self.failures, self.failed = 0, []
        elif kind == "idle":
            self.idle_since = ts
            self.rounds = int(record["rounds"])
        elif kind in ("stopped", "failed", "lost"):
            self.running, self.idle_since = False, None
            self.rounds = int(record["rounds"])
            if kind != "stopped" and not self.trained:
                self.failures += 1
                self.failed.append(f"incarnation {incarnation}: {record.get('error', kind)}")
        elif kind in LAUNCH_EVENTS:
            pass  # what a launched incarnation's job did; started/failed/stopped carry the state
        else:
            raise ValueError(f"journal record {record['n']} has an unknown kind {kind!r}")


class SchedulerJournal:
    """The records under ``<prefix>/journal/`` of ``store`` (the module docstring)."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.next_index = 0

    def key(self, index: int) -> str:
        return f"{self.prefix}/journal/{index:0{_INDEX_DIGITS}d}"

    def read(self) -> list[dict[str, Any]]:
        """Every record in order; later appends continue after the last one."""
        keys = self.store.list(f"{self.prefix}/journal/")
        records = [json.loads(self.store.get(key)) for key in keys]
        for expected, record in enumerate(records):
            if record.get("n") != expected:
                raise ValueError(
                    f"scheduler journal {self.prefix}/journal/ has record {record.get('n')!r}"
                    f" where record {expected} belongs: it was written by something else;"
                    " give the scheduler a prefix of its own"
                )
        self.next_index = len(records)
        return records

    def append(self, record: dict[str, Any]) -> dict[str, Any]:
        """Write ``record`` as the next one; returns it with its number ``n``."""
        record = {"n": self.next_index, **record}
        key = self.key(self.next_index)
        data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        if not self.store.put_if_absent(key, data):
            raise JournalConflictError(
                f"scheduler journal record {key} was written by another controller: two"
                f" controllers drive the trainer of {self.prefix}; stop all but one, then"
                " restart it (it replays the journal)",
                key=key,
            )
        self.next_index += 1
        return record


@dataclass(frozen=True)
class SchedulerOutcome:
    """How :meth:`Controller.run` ended: ``finished`` (the data ended) or ``stopped`` (a stop
    was requested, with ``trigger``); ``incarnation`` is the last one started."""

    ended: Literal["finished", "stopped"]
    trigger: StopTrigger | None
    incarnation: int
    rounds: int
    """Rounds trained by this controller (not by one before a restart)."""


class Controller:
    """Runs a trainer under rule S1, journaling every decision and lifecycle event.

    ``backlog`` returns the groups waiting to be trained: those in the sample buffer after the
    newest cut's watermark, so that after a failed incarnation it counts again what that one
    trained after its last cut. ``data_ended`` says whether the sampler has produced its last
    batch. ``clock`` returns wall-clock seconds and ``sleep``
    waits (both injected for tests and simulations). ``on_decision`` is called with each
    journaled decision.

    :meth:`run` replays the journal, then loops: while the trainer runs it trains round after
    round; whenever a round finds less than a batch it consults S1 (and pauses ``poll_s``
    when told to wait). A start or stop that raises, or a round that raises, ends the
    incarnation as failed. :meth:`request_stop` makes the trainer stop with a cut at the next
    round boundary (a start in flight finishes first) and :meth:`run` return.
    """

    def __init__(
        self,
        *,
        lifecycle: TrainerLifecycle,
        settings: SchedulerSettings,
        store: ObjectStore,
        prefix: str,
        backlog: Callable[[], int],
        data_ended: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.settings = settings
        self.policy = S1Policy(settings)
        self.journal = SchedulerJournal(store, prefix)
        self.backlog = backlog
        self.data_ended = data_ended
        self.clock = clock
        self.sleep = sleep
        self.on_decision = on_decision
        self.state = SchedulerState()
        self._stop_trigger: StopTrigger | None = None
        self._stop_requested = asyncio.Event()
        self._rounds = 0

    async def record_event(self, record: dict[str, Any]) -> None:
        """Journal a lifecycle event of the running incarnation's job (one of
        ``LAUNCH_EVENTS``), as the lifecycle saw it."""
        if record.get("kind") not in LAUNCH_EVENTS:
            raise ValueError(f"{record.get('kind')!r} is not one of {LAUNCH_EVENTS}")
        await self._record(record)

    def request_stop(self, trigger: StopTrigger) -> None:
        """Stop the trainer with a cut recording ``trigger`` at the next round boundary, and
        end :meth:`run`. Safe to call from a signal handler on the running loop."""
        if self._stop_trigger is None:
            self._stop_trigger = trigger
        self._stop_requested.set()

    async def run(self) -> SchedulerOutcome:
        for record in await asyncio.to_thread(self.journal.read):
            self.state.apply(record)
        if self.state.running:
            await self._reattach()
        while True:
            if self._stop_trigger is not None:
                return await self._requested_stop(self._stop_trigger)
            if self.state.running and await self._round():
                continue
            decision = await self._decide()
            if decision.action == "finish":
                if not self.state.running:
                    return self._outcome("finished", None)
                if await self._stop("final"):
                    return self._outcome("finished", "final")
            elif decision.action == "start":
                if not await self._start():
                    await self._pause()
            elif decision.action == "stop":
                await self._stop("scheduled")
            else:
                await self._pause()

    # ------------------------------------------------------------------ decisions

    def inputs(self) -> SchedulerInputs:
        """What S1 would decide from now."""
        state = self.state
        idle_s = 0.0
        if state.running and state.idle_since is not None:
            idle_s = max(0.0, self.clock() - state.idle_since)
        return SchedulerInputs(
            backlog_groups=self.backlog(),
            idle_s=idle_s,
            startup_s=state.startup_s,
            data_ended=self.data_ended(),
            running=state.running,
            incarnation=state.incarnation,
        )

    async def _decide(self) -> Decision:
        decision = self.policy.decide(self.inputs())
        if self.state.last_decision != (decision.action, decision.rule):
            await self._record(decision.to_record())
            if self.on_decision is not None:
                self.on_decision(decision)
        return decision

    # ------------------------------------------------------------------ lifecycle

    async def _start(self) -> bool:
        """Start the next incarnation; False when it failed."""
        incarnation = self.state.incarnation + 1
        began = self.clock()
        await self._record({"kind": "started", "incarnation": incarnation}, ts=began)
        try:
            await self.lifecycle.start(incarnation)
        except Exception as exc:
            await self._failed(incarnation, exc)
            return False
        await self._record(
            {"kind": "ready", "incarnation": incarnation, "startup_s": self.clock() - began}
        )
        return True

    async def _reattach(self) -> None:
        incarnation = self.state.incarnation
        alive = False
        if isinstance(self.lifecycle, TrainerReattach):
            try:
                alive = await self.lifecycle.reattach(incarnation)
            except Exception:
                alive = False
        if not alive:
            await self._record(
                {"kind": "lost", "incarnation": incarnation, "rounds": self.state.rounds}
            )
            await self._check_failures()

    async def _round(self) -> bool:
        """Train one round; False when there was nothing to train (or the trainer failed)."""
        state = self.state
        try:
            trained = await self.lifecycle.train_round()
        except Exception as exc:
            await self._failed(state.incarnation, exc)
            return False
        if trained:
            self._rounds += 1
            rounds = state.rounds + 1
            if state.idle_since is not None or not state.trained:
                await self._record(
                    {"kind": "training", "incarnation": state.incarnation, "rounds": rounds}
                )
            state.rounds = rounds
            return True
        if state.idle_since is None:
            await self._record(
                {"kind": "idle", "incarnation": state.incarnation, "rounds": state.rounds}
            )
        return False

    async def _stop(self, trigger: StopTrigger) -> bool:
        """Stop the running incarnation; False when it failed instead."""
        incarnation = self.state.incarnation
        try:
            await self.lifecycle.stop(trigger)
        except Exception as exc:
            await self._failed(incarnation, exc)
            return False
        await self._record(
            {
                "kind": "stopped",
                "incarnation": incarnation,
                "trigger": trigger,
                "rounds": self.state.rounds,
            }
        )
        return True

    async def _requested_stop(self, trigger: StopTrigger) -> SchedulerOutcome:
        running = self.state.running
        await self._record(
            Decision(
                action="stop",
                rule="requested",
                reason=f"{trigger} stop requested"
                + (": cut and exit" if running else "; no trainer running: exit"),
                inputs=self.inputs(),
            ).to_record()
        )
        if running:
            await self._stop(trigger)
        return self._outcome("stopped", trigger)

    async def _failed(self, incarnation: int, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        await self._record(
            {
                "kind": "failed",
                "incarnation": incarnation,
                "rounds": self.state.rounds,
                "error": error,
            }
        )
        await self._check_failures()

    async def _check_failures(self) -> None:
        state = self.state
        if state.failures < self.settings.max_failures:
            return
        failed = list(state.failed)
        await self._record({"kind": "gave-up", "failures": failed})
        raise SchedulerGaveUp(failures=failed, journal=f"{self.journal.prefix}/journal/")

    async def _pause(self) -> None:
        if self._stop_requested.is_set():
            return
        sleeper = asyncio.ensure_future(self.sleep(self.settings.poll_s))
        stopper = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
        if sleeper.done() and not sleeper.cancelled():
            sleeper.result()

    # ------------------------------------------------------------------ journal

    async def _record(self, record: dict[str, Any], *, ts: float | None = None) -> None:
        record = {**record, "ts": self.clock() if ts is None else ts}
        self.state.apply(await asyncio.to_thread(self.journal.append, record))

    def _outcome(
        self, ended: Literal["finished", "stopped"], trigger: StopTrigger | None
    ) -> SchedulerOutcome:
        return SchedulerOutcome(
            ended=ended, trigger=trigger, incarnation=self.state.incarnation, rounds=self._rounds
        )
