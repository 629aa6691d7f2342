"""A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library, and rendering of
template text pieces into attributed token ids.

A template produces its output as :class:`Piece` objects, each a run of text that belongs to
one message (or to the scaffold) and is or is not sampled by the model. The ids are exactly
those of encoding the joined text in one call (what ``apply_chat_template(..., tokenize=True)``
does); each token is attributed to the piece its first character comes from. A token that
straddles two pieces (rare: only where the tokenizer merges text across a piece boundary)
belongs to the earlier piece.

Rendering a conversation again with one more message encodes only the new text: a run of
pieces that starts with an added token (a ChatML turn) is rendered once and then taken from a
cache; within a new run, the text between two added tokens is looked up in a cache of segment
encodings (:mod:`rllm_renderer_chatml.segments`); and new plain-ASCII text is encoded through a
cache of word ids (:mod:`rllm_renderer_chatml.words`). Every path gives exactly the ids and
attribution of the single encode.
"""

from __future__ import annotations

import functools
import json
import os
import re
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from rllm_core.types import RenderedTokens
from tokenizers import Tokenizer

from rllm_renderer_chatml.segments import (
    DEFAULT_CACHE_TOKENS,
    Encoded,
    SegmentEncoder,
    TokenCache,
    Unit,
    segment_cache,
    segmentation_blocker,
    trims_offsets,
)

__all__ = ["Piece", "TextTokenizer", "load_chat_template"]


class Piece(NamedTuple):
    """A run of rendered text: ``message`` is the index of the message it belongs to (``-1``
    for scaffold), ``sampled`` whether the model produced it and ``literal`` whether it is
    message text (content, reasoning, tool calls, tool results) rather than the template's own
    markup: with literal control tokens on, control-token strings in it are encoded as
    ordinary text."""

    text: str
    message: int
    sampled: bool = False
    literal: bool = False


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


@functools.lru_cache(maxsize=16)
def _load_literal(path: str, mtime_ns: int) -> Tokenizer:
    """A second copy of the tokenizer that encodes special-token text as ordinary text; a
    copy, since the flag belongs to the tokenizer object and the first one is shared."""
    tokenizer = Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = True
    return tokenizer


class TextTokenizer:
    """Plain-text encoding and decoding with a tokenizer folder's ``tokenizer.json``.

    Special-token text inside the input (``<|im_end|>``) becomes its single id, as in
    ``apply_chat_template``; no BOS/EOS is ever added. Loaded tokenizers are shared between
    instances that name the same unchanged file.

    Two caches, each holding up to ``cache_tokens`` token ids (0 keeps nothing): :attr:`cache`
    the encodings of text segments, :attr:`blocks` the rendered runs of pieces (``None`` when
    the tokenizer does not allow it). :attr:`segmented` is false for a tokenizer whose
    pipeline does not allow encoding segment by segment; its texts are encoded whole.
    """

    def __init__(
        self, folder: str | os.PathLike[str], *, cache_tokens: int = DEFAULT_CACHE_TOKENS
    ) -> None:
        self.folder = Path(folder).expanduser()
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer folder {str(self.folder)!r} has no tokenizer.json; point `tokenizer`"
                " at a Hugging Face tokenizer folder (one saved with save_pretrained)"
            )
        self._path = (str(path.resolve()), path.stat().st_mtime_ns)
        self._tokenizer = _load(*self._path)
        self.cache = segment_cache(cache_tokens)
        blocked = segmentation_blocker(self._tokenizer)
        self._segments = None if blocked else SegmentEncoder(self._tokenizer, self.cache)
        self._trims = trims_offsets(self._tokenizer)
        self.blocks: TokenCache[tuple[Piece, ...], RenderedTokens] | None = None
        if self._segments is not None and self._segments.clean_boundaries and not self._trims:
            self.blocks = TokenCache(cache_tokens, size=_rendered_size)
        decoder = self._tokenizer.get_added_tokens_decoder().values()
        self.control_tokens = frozenset(t.content for t in decoder if t.special and t.content)
        """The control tokens: added tokens marked special (``<|im_start|>``, ``<|im_end|>``,
        ...), which literal pieces may spell but never produce."""
        self._control = _alternation(self.control_tokens)
        self._added_ids = frozenset(self._tokenizer.get_added_tokens_decoder())
        self._ascii: dict[int, str] | None = {} if _byte_level_decoder(self._tokenizer) else None
        self._added = _alternation(t.content for t in decoder if not t.normalized and t.content)

    @property
    def segmented(self) -> bool:
        """Whether text is encoded segment by segment through the caches."""
        return self._segments is not None

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        if self._segments is not None:
            return self._segments.encode(text)
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: Sequence[int]) -> str:
        ids = list(token_ids)
        texts = self._ascii
        if texts is not None:
            try:
                return "".join(map(texts.__getitem__, ids))
            except KeyError:
                self._learn_ascii(ids)
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _learn_ascii(self, ids: list[int]) -> None:
        """Remember the ids among ``ids`` whose text is ASCII on its own (for :meth:`decode`):
        a byte-level decoder joins the tokens' bytes and reads them as UTF-8, so a run of such
        tokens decodes to their texts joined. Added tokens are always left to the tokenizer."""
        texts = self._ascii
        assert texts is not None
        for token in set(ids).difference(texts):
            if token in self._added_ids or len(texts) >= _MAX_ASCII_TOKENS:
                continue
            try:
                text = self._tokenizer.decode([token], skip_special_tokens=False)
            except Exception:  # an id outside the vocabulary: the tokenizer's call reports it
                continue
            if text.isascii() and (text or self._tokenizer.id_to_token(token) is not None):
                texts[token] = text

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

    def _units(self, text: str) -> list[Unit]:
        if self._segments is not None:
            return self._segments.units(text)
        if not text:
            return []
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        starts, last = [], 0
        for start, _ in encoding.offsets:
            last = max(last, start)
            starts.append(last)
        return [(0, text, Encoded(encoding.ids, starts))]

    def render(self, pieces: Sequence[Piece], *, literal: bool = False) -> RenderedTokens:
        """Encode the joined text of ``pieces`` and attribute every token to its piece.

        Runs of pieces that start with an added token (a ChatML turn and what follows it up
        to the next turn) encode on their own, so each run's result is cached whole (in
        :attr:`blocks`, keyed by its pieces) when the tokenizer allows it.

        With ``literal``, a control token spelled inside a literal piece is not that token:
        the text between two tokens of the template's own markup is encoded with special
        tokens read as text (see :meth:`_literal_units`). Pieces without such a spelling
        encode exactly as without ``literal``.
        """
        pieces = [p for p in pieces if p.text]
        if literal and self._control is not None:
            search = self._control.search
            if any(p.literal and search(p.text) for p in pieces):
                return self._render(pieces, self._literal_units(pieces))
        blocks = self.blocks
        if blocks is None or not pieces:
            return self._render(pieces)
        starts_with_added = self._segments.starts_with_added  # type: ignore[union-attr]
        firsts = self._segments.firsts  # type: ignore[union-attr]
        ids: list[int] = []
        indices: list[int] = []
        sampled: list[bool] = []
        first = 0
        for n in range(1, len(pieces) + 1):
            if n < len(pieces) and (
                pieces[n].text[0] not in firsts or not starts_with_added(pieces[n].text)
            ):
                continue
            key = tuple(pieces[first:n])
            block = blocks.get(key)
            if block is None:
                block = self._render(key)
                blocks.put(key, block)
            ids += block.token_ids
            indices += block.message_indices
            sampled += block.sampled_mask
            first = n
        return RenderedTokens(token_ids=ids, message_indices=indices, sampled_mask=sampled)

    def _literal_units(self, pieces: Sequence[Piece]) -> list[Unit]:
        """The units of the joined text of ``pieces`` when control tokens spelled in literal
        pieces are text.

        Added tokens are matched only in the runs of pieces that spell no control token
        (each run on its own, so no match starts in one piece and ends in a forged one); the
        text between two matches is a segment as usual, and a segment that overlaps a forged
        piece is encoded by a copy of the tokenizer that reads special-token text as text
        (it still matches the added tokens that are not special, ``<tool_call>`` say)."""
        control = self._control
        assert control is not None
        text = "".join(p.text for p in pieces)
        matches: list[tuple[int, int]] = []
        forged: list[tuple[int, int]] = []
        pos = run = 0
        for p in pieces:
            end = pos + len(p.text)
            if p.literal and control.search(p.text):
                if self._added is not None:
                    matches += [m.span() for m in self._added.finditer(text, run, pos)]
                forged.append((pos, end))
                run = end
            pos = end
        if self._added is not None:
            matches += [m.span() for m in self._added.finditer(text, run, len(text))]
        literal_tokenizer = _load_literal(*self._path)
        units: list[Unit] = []
        pos = 0
        for start, end in [*matches, (len(text), len(text))]:
            if start > pos:
                piece = text[pos:start]
                if any(a < start and pos < b for a, b in forged):
                    encoding = literal_tokenizer.encode(piece, add_special_tokens=False)
                    units.append((pos, piece, Encoded(encoding.ids, _starts(encoding.offsets))))
                elif self._segments is not None:
                    units.append((pos, piece, self._segments.segment(piece)))
                else:
                    encoding = self._tokenizer.encode(piece, add_special_tokens=False)
                    units.append((pos, piece, Encoded(encoding.ids, _starts(encoding.offsets))))
            if end > start:
                token = text[start:end]
                token_id = self._tokenizer.token_to_id(token)
                assert token_id is not None
                units.append((start, token, Encoded([token_id], [0])))
            pos = end
        return units

    def _render(self, pieces: Sequence[Piece], units: list[Unit] | None = None) -> RenderedTokens:
        """:meth:`render` of non-empty pieces, unit by unit (``units``: the units of their
        joined text, when already cut)."""
        if units is None:
            units = self._units("".join(p.text for p in pieces))
        # Tokens are attributed to spans: neighbouring pieces of one message with the same
        # sampled flag (a turn's header, its text and its close) form one span, as their
        # tokens are attributed alike. A token belongs to the span its start falls in, so only
        # a unit that crosses a span end needs its tokens' start offsets, and the attribution
        # lists are written a span at a time.
        ends: list[int] = []
        owners: list[tuple[int, bool]] = []
        end = 0
        for p in pieces:
            end += len(p.text)
            owner = (p.message, p.sampled)
            if owners and owners[-1] == owner:
                ends[-1] = end
            else:
                ends.append(end)
                owners.append(owner)
        ids: list[int] = []
        indices: list[int] = []
        sampled: list[bool] = []
        last = len(owners) - 1
        span = count = 0
        trims = self._trims
        for base, text, encoded in units:
            while span < last and base >= ends[span]:
                message, flag = owners[span]
                indices += [message] * count
                sampled += [flag] * count
                span += 1
                count = 0
            unit_ids = encoded.ids
            ids += unit_ids
            n = len(unit_ids)
            unit_end = base + len(text)
            if span == last or unit_end < ends[span] or (unit_end == ends[span] and not trims):
                count += n
                continue
            starts = encoded.starts
            if starts is None:
                assert self._segments is not None
                starts = self._segments.starts(text, encoded)
            done = 0
            while done < n:
                upto = n if span == last else bisect_left(starts, ends[span] - base, done)
                count += upto - done
                done = upto
                if done < n:
                    message, flag = owners[span]
                    indices += [message] * count
                    sampled += [flag] * count
                    span += 1
                    count = 0
        if count:
            message, flag = owners[span]
            indices += [message] * count
            sampled += [flag] * count
        return RenderedTokens(token_ids=ids, message_indices=indices, sampled_mask=sampled)


def _starts(offsets: list[tuple[int, int]]) -> list[int]:
    out, last = [], 0
    for start, _ in offsets:
        last = max(last, start)
        out.append(last)
    return out


def _alternation(tokens: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern matching any of ``tokens``, the longest first where several start at one
    place (the tokenizer's rule); ``None`` for no tokens."""
    ordered = sorted(set(tokens), key=lambda t: (-len(t), t))
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


_MAX_ASCII_TOKENS = 1 << 20


def _byte_level_decoder(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` decodes with a byte-level decoder alone (no other stage)."""
    decoder = tokenizer.decoder
    if decoder is None:
        return False
    return json.loads(decoder.__getstate__()).get("type") == "ByteLevel"


def _rendered_size(rendered: RenderedTokens) -> int:
    return len(rendered.token_ids)
