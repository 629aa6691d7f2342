"""The teacher of on-policy distillation, in a plan.

An advantage estimator whose spec has the trait ``teacher``
(:data:`~rllm_core.algorithms.distill.TEACHER_TRAIT`) holds, under its config key ``teacher``,
a table naming a trainer backend and that backend's keys. :func:`resolve_teacher` resolves it
as the component ``[algorithm].advantage.teacher`` (so the run builds it like every other),
filling ``logprob_temperature`` from ``[sampling].temperature`` and ``deterministic`` from
``[run].deterministic`` where the backend takes them from the run and the table does not set
them; it refuses a backend that cannot score tokens (the trait ``proximal_modes`` without
``"recompute"``: no :class:`~rllm_core.ports.LogprobScorer`) and the training and sampling keys
nothing reads in a teacher (:data:`TEACHER_IDLE_KEYS`).

:func:`tokenizer_issue` compares the teacher model's tokenizer with the student renderer's:
the teacher scores the student's token ids, so both must give every id the same token.
``plan check`` reports a difference as an error, and the run refuses to start on one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from rllm_core.algorithms.distill import TEACHER_KEY, TEACHER_TRAIT, teacher_where
from rllm_core.errors import ModelError, PlanIssue
from rllm_core.plan.schema import ComponentRef, Plan
from rllm_core.plugins.specs import Kind

__all__ = [
    "TEACHER_IDLE_KEYS",
    "resolve_teacher",
    "teacher_issues",
    "tokenizer_issue",
    "vocabulary",
]

TEACHER_IDLE_KEYS = (
    "learning_rate",
    "betas",
    "eps",
    "weight_decay",
    "max_grad_norm",
    "lr_schedule",
    "warmup_steps",
    "total_steps",
    "gradient_checkpointing",
    "max_batch_size",
    "prefix_cache_mb",
    "parallel",
)
"""Keys of a trainer backend that only training or sampling read: a teacher does neither, so
``plan check`` refuses them in its table."""


class _Resolver(Protocol):
    plan: Plan
    path: str
    components: dict[str, Any]
    issues: list[PlanIssue]
    manager: Any

    def resolve(self, ref: ComponentRef, kind: Kind, *, section: str, key: str | None) -> None: ...


def resolve_teacher(resolver: _Resolver) -> None:
    """Resolve the teacher of the plan's ``[algorithm].advantage``, when its estimator has
    one; see the module docstring."""
    advantage = resolver.components.get("[algorithm].advantage")
    if advantage is None or not advantage.spec.trait(TEACHER_TRAIT):
        return
    table = dict(getattr(advantage.config, TEACHER_KEY))
    plan = resolver.plan
    key = f"advantage.{TEACHER_KEY}"
    before = len(resolver.issues)
    for idle in sorted(set(table) & set(TEACHER_IDLE_KEYS)):
        resolver.issues.append(
            PlanIssue(
                path=resolver.path,
                section="algorithm",
                key=f"{key}.{idle}",
                value=table[idle],
                message="a teacher only scores the student's tokens: it never trains or samples,"
                " so nothing reads this key",
                hint="remove it from the teacher's table",
            )
        )
    try:
        spec = resolver.manager.get_record(Kind.TRAINER_BACKEND, table["name"]).spec
    except Exception:
        spec = None
    if spec is not None:
        run_keys = tuple(spec.trait("run_keys") or ())
        if "logprob_temperature" in run_keys and plan.sampling.temperature > 0:
            table.setdefault("logprob_temperature", plan.sampling.temperature)
        if "deterministic" in run_keys:
            table.setdefault("deterministic", plan.run.deterministic)
    resolver.resolve(
        ComponentRef.model_validate(table), Kind.TRAINER_BACKEND, section="algorithm", key=key
    )
    teacher = resolver.components.get(teacher_where())
    if teacher is None or len(resolver.issues) > before:
        return
    modes = teacher.spec.trait("proximal_modes")
    if modes is not None and "recompute" not in modes:
        resolver.issues.append(
            PlanIssue(
                path=resolver.path,
                section="algorithm",
                key=f"{key}.name",
                value=teacher.name,
                message=(
                    f"trainer backend {teacher.name!r} cannot score tokens (it computes no"
                    " logprobs of given tokens), which a teacher must"
                ),
                hint='use name = "torch" with the teacher\'s model',
            )
        )


def vocabulary(folder: Path) -> dict[str, int] | None:
    """Every token of the tokenizer in ``folder`` with its id (its ``tokenizer.json``'s
    vocabulary and added tokens); None without a readable ``tokenizer.json``."""
    try:
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = data.get("model") or {}
    vocab = model.get("vocab")
    out: dict[str, int] = {}
    if isinstance(vocab, dict):
        out.update({str(k): int(v) for k, v in vocab.items()})
    elif isinstance(vocab, list):  # unigram: [token, score] pairs in id order
        out.update({str(item[0]): index for index, item in enumerate(vocab)})
    for token in data.get("added_tokens") or ():
        out[str(token["content"])] = int(token["id"])
    return out


def _describe(student: dict[str, int], teacher: dict[str, int]) -> str:
    by_id_student = {v: k for k, v in student.items()}
    by_id_teacher = {v: k for k, v in teacher.items()}
    for token_id in sorted(set(by_id_student) | set(by_id_teacher)):
        mine, theirs = by_id_student.get(token_id), by_id_teacher.get(token_id)
        if mine != theirs:
            return (
                f"{len(student)} and {len(teacher)} tokens; id {token_id} is {mine!r} for the"
                f" student and {theirs!r} for the teacher"
            )
    return f"{len(student)} and {len(teacher)} tokens"


def tokenizer_issue(
    student_tokenizer: str | None, teacher_model: str | None, *, path: str
) -> PlanIssue | None:
    """An error when the tokenizer of the student (the renderer's ``tokenizer``) and the
    teacher's ``model`` give some id different tokens, naming both; None when they agree or
    either cannot be read here (a model not pulled yet is reported on its own key)."""
    from rllm_core.models import resolve_model, resolve_tokenizer

    if not student_tokenizer or not teacher_model:
        return None
    try:
        student_folder = resolve_tokenizer(student_tokenizer)
        teacher_folder = resolve_model(teacher_model)
    except ModelError:
        return None
    student, teacher = vocabulary(student_folder), vocabulary(teacher_folder)
    if student is None or teacher is None or student == teacher:
        return None
    return PlanIssue(
        path=path,
        section="algorithm",
        key=f"advantage.{TEACHER_KEY}.model",
        value=teacher_model,
        message=(
            f"the teacher's tokenizer ({teacher_folder}) differs from the student's"
            f" ({student_folder}): {_describe(student, teacher)}; the teacher scores the"
            " student's token ids, so both must mean the same tokens"
        ),
        hint="choose a teacher of the student's model family (the same tokenizer)",
    )


def teacher_issues(resolved: Any) -> list[PlanIssue]:
    """The tokenizer issue (:func:`tokenizer_issue`) of a resolved plan's teacher against its
    ``[renderer]``'s tokenizer; empty without a teacher."""
    teacher = resolved.get(teacher_where())
    renderer = resolved.get("[renderer]")
    if teacher is None or renderer is None:
        return []
    issue = tokenizer_issue(
        getattr(renderer.config, "tokenizer", None),
        getattr(teacher.config, "model", None),
        path=resolved.path,
    )
    return [issue] if issue is not None else []
