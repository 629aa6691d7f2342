"""SFT examples as token sequences and datums.

A chat example is rendered with the plan's renderer, as the gateway renders prompts during a
run, and trained on the tokens the renderer marks as sampled (``RenderedTokens.sampled_mask``:
assistant content and its closing token), except those of an assistant message marked
``"trainable": false``; system, user and tool messages and the template's scaffold are context
only. So an SFT run and an RL run of the same renderer see the same
tokens.

An example longer than ``[sft].max_length`` is truncated to its first ``max_length`` tokens
and their masks (``overlong = "truncate"``, the default), or dropped (``"drop"``); either way
the report counts it, and the run warns.

A supervised :class:`~rllm_core.types.Datum` has ``action_mask`` = the trained tokens,
``observation_mask`` all false, and ``logprobs`` and ``advantages`` all 0.0: the NLL objective
(:mod:`rllm_core.algorithms.nll`) and a backend's supervised path read neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rllm_core.ports import Renderer
from rllm_core.sft.data import ChatExample, TokenExample
from rllm_core.types import Datum

__all__ = ["Overlong", "TokenizeReport", "supervised_datum", "tokenize"]

Overlong = Literal["truncate", "drop"]


@dataclass
class TokenizeReport:
    """What tokenizing kept, cut and dropped, by the examples' origins: ``truncated`` were
    over ``max_length`` and kept cut to it; ``too_long`` were over it and dropped (with
    ``overlong = "drop"``, or when their first ``max_length`` tokens held nothing to train);
    ``untrained`` had no trained token at all."""

    kept: int = 0
    truncated: list[str] = field(default_factory=list)
    too_long: list[str] = field(default_factory=list)
    untrained: list[str] = field(default_factory=list)

    def warnings(self, max_length: int | None, what: str) -> list[str]:
        out = []
        if self.truncated:
            out.append(
                f"{what}: {len(self.truncated)} example(s) longer than [sft].max_length ="
                f" {max_length} tokens were truncated to their first {max_length} tokens"
                f" (first: {self.truncated[0]}); raise max_length to train on them whole, or"
                ' set [sft].overlong = "drop" to leave them out'
            )
        if self.too_long:
            out.append(
                f"{what}: {len(self.too_long)} example(s) longer than [sft].max_length ="
                f" {max_length} tokens were dropped (first: {self.too_long[0]}); raise"
                " max_length to keep them"
            )
        if self.untrained:
            out.append(
                f"{what}: {len(self.untrained)} example(s) had no assistant token to train on"
                " (none, or all marked trainable: false) and were dropped"
                f" (first: {self.untrained[0]})"
            )
        return out


def render_example(renderer: Renderer, example: ChatExample) -> TokenExample:
    """``example`` rendered, trained on the sampled tokens of every assistant message not in
    ``example.untrained`` (the renderer attributes each token to its message)."""
    rendered = renderer.render(list(example.messages), tools=list(example.tools) or None)
    skip = example.untrained
    return TokenExample(
        token_ids=tuple(rendered.token_ids),
        trained=tuple(
            bool(m) and i not in skip
            for m, i in zip(rendered.sampled_mask, rendered.message_indices, strict=True)
        ),
        origin=example.origin,
    )


def tokenize(
    examples: Iterable[ChatExample | TokenExample],
    renderer: Renderer | None,
    *,
    max_length: int | None,
    overlong: Overlong = "truncate",
) -> tuple[list[TokenExample], TokenizeReport]:
    """Every example as tokens (chat examples rendered with ``renderer``). One longer than
    ``max_length`` keeps its first ``max_length`` tokens and their masks (``"truncate"``) or
    is dropped (``"drop"``); one with nothing to train, truncated or not, is dropped."""
    report = TokenizeReport()
    out = []
    for example in examples:
        if isinstance(example, ChatExample):
            if renderer is None:
                raise ValueError("chat examples need a renderer")
            example = render_example(renderer, example)
        if max_length is not None and len(example.token_ids) > max_length:
            if overlong == "drop" or not any(example.trained[:max_length]):
                report.too_long.append(example.origin)
                continue
            report.truncated.append(example.origin)
            example = TokenExample(
                token_ids=example.token_ids[:max_length],
                trained=example.trained[:max_length],
                origin=example.origin,
            )
            out.append(example)
        elif not any(example.trained):
            report.untrained.append(example.origin)
        else:
            out.append(example)
    report.kept = len(out)
    return out, report


def supervised_datum(examples: Sequence[TokenExample], *, packed: bool = False) -> Datum:
    """One datum of ``examples`` (one, or several packed into one row: their tokens in order,
    ``metadata["packed_lengths"]`` listing each one's length)."""
    tokens = [t for e in examples for t in e.token_ids]
    trained = [m for e in examples for m in e.trained]
    n = len(tokens)
    metadata: dict = {"origins": [e.origin for e in examples]}
    if packed:
        metadata["packed_lengths"] = [len(e.token_ids) for e in examples]
    return Datum(
        token_ids=tokens,
        logprobs=[0.0] * n,
        advantages=[0.0] * n,
        action_mask=trained,
        observation_mask=[False] * n,
        metadata=metadata,
    )
