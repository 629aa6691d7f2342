"""A fake trainer and a task source for tests that run the real training loop: the gateway,
a scripted sampler, the toy renderer and the single-turn harness are real; only training is
faked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reference.toy_renderer import ToyChatRenderer
from rllm_core.errors import VerifierCrashed
from rllm_core.plan.resolve import ResolvedComponent
from rllm_core.plugins.specs import Kind
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Grade, HarnessOutcome, Task

TOY = ToyChatRenderer()


class FakeTrainer:
    """Records its calls; its state is a file holding the weight version.

    ``forward_backward`` reports ``loss`` as ``loss`` when given, else the weight version, and
    raises on call number ``crash_on``.
    """

    def __init__(self, *, loss: float | None = None, crash_on: int | None = None) -> None:
        self.weight_version = 0
        self.trained = 0
        self.saved: list[str] = []
        self.calls: list[tuple[str, Any]] = []
        self.loss = loss
        self.crash_on = crash_on

    def sampler(self) -> ScriptedSampler:
        return ScriptedSampler(lambda request: "4", renderer=TOY)

    def forward_backward(self, datums: Any, objective: Any) -> dict:
        self.trained += 1
        if self.trained == self.crash_on:
            raise RuntimeError("the trainer fell over")
        self.calls.append(("forward_backward", (list(datums), objective)))
        loss = float(self.weight_version) if self.loss is None else self.loss
        return {"loss": loss, "action_tokens": float(len(datums))}

    def compute_logprobs(self, datums: Any) -> list[list[float]]:
        self.calls.append(("compute_logprobs", self.weight_version))
        return [[-0.5] * len(d.token_ids) for d in datums]

    def optim_step(self) -> dict:
        self.weight_version += 1
        self.calls.append(("optim_step", self.weight_version))
        return {"grad_norm": 0.0, "step": float(self.weight_version)}

    def save_state(self, path: str) -> None:
        self.saved.append(path)
        Path(path).mkdir(parents=True)
        (Path(path) / "version").write_text(str(self.weight_version))

    def load_state(self, path: str) -> None:
        self.weight_version = int((Path(path) / "version").read_text())


class CrashingSource:
    """Two train tasks; gradings after the first ``good`` ones raise ``VerifierCrashed``.
    Rewards alternate so that every group has a learning signal."""

    def __init__(self, good: int = 10**6) -> None:
        self.good = good
        self.graded = 0

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(task_id=f"t{i}", instruction=f"What is {i} + 2?") for i in range(2)]

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        self.graded += 1
        if self.graded > self.good:
            raise VerifierCrashed(
                f"task {task.task_id}: tests/test.sh exited 3 without writing a reward file."
                " Output tail:\nchecker exploded",
                task_id=task.task_id,
                exit_code=3,
                output="checker exploded",
            )
        return Grade(reward=float(self.graded % 2))


class Spec:
    """The least a resolved component needs to build: a kind, a name and a factory."""

    def __init__(self, kind: Kind, name: str) -> None:
        self.kind = kind
        self.name = name

    def build(self, config: Any) -> Any:
        return f"{self.kind.value}:{self.name}"


# The plan entries every build needs, training or sampling only.
SAMPLING_KINDS = {
    "[trainer]": Kind.TRAINER_BACKEND,
    "[renderer]": Kind.RENDERER,
    "[harness]": Kind.HARNESS,
    "[tasks]": Kind.TASK_SOURCE,
    "[trace_store]": Kind.TRACE_STORE,
}


def spec_components(
    kinds: dict[str, Kind], names: dict[str, str] | None = None
) -> dict[str, ResolvedComponent]:
    """A resolved component per plan entry of ``kinds``, each a ``Spec`` building
    ``"<kind>:<name>"`` (``names`` by entry, else ``x``)."""
    names = names or {}
    return {
        where: ResolvedComponent(
            where=where, spec=Spec(kind, names.get(where, "x")), config=None, provider="test"
        )
        for where, kind in kinds.items()
    }
