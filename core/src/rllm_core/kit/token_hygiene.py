"""Datums a managed training service would reject, dropped before the step instead.

A remote trainer fails a whole ``forward_backward`` on one bad datum: a token id outside the
model's vocabulary (a sampler on another tokenizer, a corrupted trace) or a datum with no
sampled token to train (every completion of the episode came back empty). :func:`screen`
keeps the others, names each dropped datum's session in a warning, and counts the drops as
metrics; when nothing is left the backend skips the optimizer step and the weight sync.

The bound on token ids is :class:`VocabBound`: ``vocab_size`` when the plan sets it, else the
length of the model's tokenizer (``len(tokenizer)``, every id it can decode, added tokens
included): the one ``tokenizer`` names (a run fills it with ``[renderer].tokenizer``), else
the one the service's SDK gives for the model it trains.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field

from rllm_core.plugins.specs import PlanPath
from rllm_core.types import Datum

__all__ = ["Dropped", "Screened", "TokenHygieneSettings", "VocabBound", "screen"]


class TokenHygieneSettings(BaseModel):
    """The ``vocab_size`` and ``tokenizer`` keys of a managed trainer backend's config."""

    vocab_size: int | None = Field(
        None,
        ge=1,
        description=(
            "Size of the model's vocabulary: a datum holding a token id at or above it is"
            " dropped before the step, with a warning naming its session. Unset: the length of"
            " the tokenizer (tokenizer, else the one the service names for the model)."
        ),
    )
    tokenizer: Annotated[str | None, PlanPath(or_name=True, expects="tokenizer")] = Field(
        None,
        description=(
            "The model's tokenizer (a catalog name, a folder or a Hub id), whose length bounds"
            " the token ids when vocab_size is unset; a run fills it with [renderer].tokenizer."
        ),
    )


class VocabBound:
    """The token-id bound a backend screens with (see the module docstring), resolved at the
    first call and kept: ``vocab_size``, else ``len()`` of the tokenizer ``tokenizer`` names,
    else ``len()`` of ``sdk_tokenizer()`` (the service SDK's tokenizer of the trained model).
    Raises ``RuntimeError`` naming ``[trainer].vocab_size`` when no tokenizer can be loaded."""

    def __init__(
        self,
        vocab_size: int | None,
        tokenizer: str | None,
        sdk_tokenizer: Callable[[], Any],
        service: str,
    ) -> None:
        self._value = vocab_size
        self._tokenizer = tokenizer
        self._sdk_tokenizer = sdk_tokenizer
        self._service = service
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            if self._value is None:
                self._value = self._resolve()
            return self._value

    def _resolve(self) -> int:
        if self._tokenizer is not None:
            from rllm_core.models import resolve_tokenizer

            try:
                from transformers import AutoTokenizer

                folder = resolve_tokenizer(self._tokenizer)
                return len(AutoTokenizer.from_pretrained(str(folder)))
            except Exception as exc:
                raise RuntimeError(
                    f"cannot load the tokenizer {self._tokenizer!r} ([trainer].tokenizer) to"
                    f" bound the token ids sent to {self._service}: {exc}; fix the tokenizer or"
                    " set [trainer].vocab_size"
                ) from exc
        try:
            return len(self._sdk_tokenizer())
        except Exception as exc:
            raise RuntimeError(
                f"{self._service} gave no tokenizer for the model to bound the token ids sent"
                f" to it ({type(exc).__name__}: {exc}); set [trainer].vocab_size or"
                " [trainer].tokenizer (a run fills it with [renderer].tokenizer)"
            ) from exc


@dataclass(frozen=True, slots=True)
class Dropped:
    """One datum left out of a step: its index in the call, its session, and why."""

    index: int
    session_id: str
    reason: str
    kind: str


@dataclass(frozen=True)
class Screened:
    """The datums to send and those dropped, in call order."""

    kept: list[Datum]
    dropped: list[Dropped]

    def metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>/dropped_datums``, ``<prefix>/dropped_out_of_vocab`` and
        ``<prefix>/dropped_empty``: counts over the call."""
        return {
            f"{prefix}/dropped_datums": float(len(self.dropped)),
            f"{prefix}/dropped_out_of_vocab": float(
                sum(1 for d in self.dropped if d.kind == "out_of_vocab")
            ),
            f"{prefix}/dropped_empty": float(sum(1 for d in self.dropped if d.kind == "empty")),
        }


def screen(
    datums: Sequence[Datum], *, vocab_size: int | None, service: str, trains_actions: bool = True
) -> Screened:
    """Split ``datums`` into those ``service`` can train and those it would fail on, warning
    once per dropped datum. ``trains_actions=False`` (supervised steps, scoring) keeps datums
    without an action token."""
    kept: list[Datum] = []
    dropped: list[Dropped] = []
    for index, datum in enumerate(datums):
        session = str(datum.metadata.get("session_id") or "?")
        bad = _bad_token(datum.token_ids, vocab_size)
        if bad is not None:
            position, token = bad
            limit = f"outside [0, {vocab_size})" if vocab_size is not None else "negative"
            reason = (
                f"token id {token} at position {position} is {limit}, the vocabulary of the"
                " model the service trains"
            )
            dropped.append(Dropped(index, session, reason, "out_of_vocab"))
        elif trains_actions and not any(datum.action_mask):
            dropped.append(
                Dropped(index, session, "it has no sampled token (empty completions)", "empty")
            )
        else:
            kept.append(datum)
    for item in dropped:
        warnings.warn(
            f"dropped datum {item.index} of session {item.session_id!r} before the {service}"
            f" step: {item.reason}",
            RuntimeWarning,
            stacklevel=3,
        )
    return Screened(kept, dropped)


def _bad_token(token_ids: Sequence[int], vocab_size: int | None) -> tuple[int, int] | None:
    for position, token in enumerate(token_ids):
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            return position, token
    return None
