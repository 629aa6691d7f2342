"""An SFT plan made ready to train: its data loaded and tokenized, its eval split chosen, and
the trainer's learning-rate schedule given its length.

When the trainer's config has ``total_steps`` and the plan leaves it unset, ``rllm-core sft``
fills it with the run's optimizer steps (``epochs`` x steps per epoch), so a ``linear`` or
``cosine`` schedule ends with the run. The steps depend on how many examples survive
tokenizing, so the plan is resolved once to build the renderer (``prepare_plan`` gives the
trainer a provisional length, :data:`~rllm_core.run.components.PROVISIONAL_TOTAL_STEPS`, and
``plan check`` shows it with a note), then again with the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllm_core.plan import ResolvedPlan
from rllm_core.plan.schema import Plan
from rllm_core.sft.batches import split_eval, steps_per_epoch
from rllm_core.sft.data import (
    ChatExample,
    DataError,
    TokenExample,
    load_examples,
    read_run_episodes,
)
from rllm_core.sft.tokens import tokenize

__all__ = ["SftData", "load_sft_data"]


@dataclass
class SftData:
    """The tokenized examples of a run and what was dropped (``warnings``)."""

    train: list[TokenExample]
    held_out: list[TokenExample]
    warnings: list[str] = field(default_factory=list)

    def total_steps(self, plan: Plan) -> int:
        return steps_per_epoch(len(self.train), plan.sft.batch_size) * plan.sft.epochs


def load_sft_data(resolved: ResolvedPlan, renderer: Any) -> SftData:
    """Read, render and split the examples of ``resolved``'s ``[sft]`` section; raises
    :class:`~rllm_core.sft.data.DataError` naming the key and the file."""
    sft = resolved.plan.sft
    options = {"messages_field": sft.messages_field, "tools_field": sft.tools_field}
    source: Callable[[], Sequence[ChatExample | TokenExample]]
    if sft.from_run is not None:
        run_dir = sft.from_run
        source = lambda: list(read_run_episodes(run_dir, min_reward=sft.min_reward))  # noqa: E731
    elif sft.data is not None:
        data = sft.data
        source = lambda: load_examples(data, format=sft.format, **options)  # noqa: E731
    else:
        raise DataError("[sft]: set data (a file or folder of examples) or from_run (a run folder)")
    examples, report = tokenize(
        source(), renderer, max_length=sft.max_length, overlong=sft.overlong
    )
    warnings = report.warnings(sft.max_length, "[sft] data")
    held_out: list[TokenExample] = []
    if sft.eval_data is not None:
        raw = load_examples(sft.eval_data, format=sft.format, key="eval_data", **options)
        held_out, eval_report = tokenize(
            raw, renderer, max_length=sft.max_length, overlong=sft.overlong
        )
        warnings += eval_report.warnings(sft.max_length, "[sft].eval_data")
    elif sft.eval_fraction > 0:
        examples, held_out = split_eval(examples, sft.eval_fraction, resolved.plan.run.seed)
    if not examples:
        where = "from_run" if sft.from_run is not None else "data"
        value = sft.from_run if sft.from_run is not None else sft.data
        more = (
            (f" with reward >= {sft.min_reward}" if sft.min_reward is not None else "")
            if sft.from_run is not None
            else ""
        )
        raise DataError(
            f"[sft].{where} = {value!r}: no example{more} left to train on"
            + (f" ({'; '.join(warnings)})" if warnings else "")
        )
    return SftData(train=examples, held_out=held_out, warnings=warnings)
