"""A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library, and rendering of
template text pieces into attributed token ids.

A template produces its output as :class:`Piece` objects, each a run of text that belongs to
one message (or to the scaffold) and is or is not sampled by the model. The pieces are joined
and encoded in one call, so the ids are exactly those of encoding the whole rendered string
(what ``apply_chat_template(..., tokenize=True)`` does); each token is then attributed to the
piece its first character comes from. A token that straddles two pieces (rare: only where the
tokenizer merges text across a piece boundary) belongs to the earlier piece.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from rllm_core.types import RenderedTokens
from tokenizers import Tokenizer

__all__ = ["Piece", "TextTokenizer", "load_chat_template"]


class Piece(NamedTuple):
    """A run of rendered text: ``message`` is the index of the message it belongs to (``-1``
    for scaffold) and ``sampled`` whether the model produced it."""

    text: str
    message: int
    sampled: bool = False


def load_chat_template(folder: str | os.PathLike[str]) -> str | None:
    """The chat template of a tokenizer folder: ``chat_template.jinja`` when present, else the
    ``chat_template`` key of ``tokenizer_config.json``; ``None`` when there is none."""
    root = Path(folder)
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = root / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, str):
            return template
    return None


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> Tokenizer:
    return Tokenizer.from_file(path)


class TextTokenizer:
    """Plain-text encoding and decoding with a tokenizer folder's ``tokenizer.json``.

    Special-token text inside the input (``<|im_end|>``) becomes its single id, as in
    ``apply_chat_template``; no BOS/EOS is ever added. Loaded tokenizers are shared between
    instances that name the same unchanged file.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder).expanduser()
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer folder {str(self.folder)!r} has no tokenizer.json; point `tokenizer`"
                " at a Hugging Face tokenizer folder (one saved with save_pretrained)"
            )
        self._tokenizer = _load(str(path.resolve()), path.stat().st_mtime_ns)

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def token_id(self, token: str) -> int | None:
        """The id of a token given by its text, or ``None`` when the vocabulary lacks it."""
        return self._tokenizer.token_to_id(token)

    def require_token(self, token: str) -> int:
        """The id of a token the template needs; raises when the vocabulary lacks it."""
        found = self._tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(
                f"the tokenizer in {str(self.folder)!r} has no token {token!r}; this template"
                " needs a ChatML vocabulary (SmolLM2, Qwen2.5, Qwen3)"
            )
        return found

    def render(self, pieces: Sequence[Piece]) -> RenderedTokens:
        """Encode the joined text of ``pieces`` and attribute every token to its piece."""
        pieces = [p for p in pieces if p.text]
        encoding = self._tokenizer.encode("".join(p.text for p in pieces), add_special_tokens=False)
        indices: list[int] = []
        sampled: list[bool] = []
        piece, piece_end = -1, 0
        for start, _ in encoding.offsets:
            while start >= piece_end and piece + 1 < len(pieces):
                piece += 1
                piece_end += len(pieces[piece].text)
            indices.append(pieces[piece].message)
            sampled.append(pieces[piece].sampled)
        return RenderedTokens(token_ids=encoding.ids, message_indices=indices, sampled_mask=sampled)
