"""Encoding rendered text segment by segment, with the segments' encodings cached.

A ``tokenizers`` pipeline first cuts its input at every added token (``<|im_start|>``,
``<|im_end|>``, ...) and then normalizes, pre-tokenizes and encodes each piece of text between
two added tokens on its own. The ids of a text are therefore the ids of its *segments* and
added tokens, in order, and a segment seen before (a message rendered on an earlier turn) need
not be encoded again. :class:`SegmentEncoder` splits a text the way the tokenizer does, takes
each segment's ids and token start offsets from a bounded LRU cache keyed by the segment's text,
and encodes only the segments it has not seen.

That equality needs three things, checked once per tokenizer by :func:`segmentation_blocker`:
every added token is matched as written (no ``lstrip``, ``rstrip`` or ``single_word``, which
make a match depend on the text around it); special tokens are extracted
(``encode_special_tokens`` off); and no stage treats the first segment of a text differently
from the others (a ``Metaspace`` pre-tokenizer that prepends only to the first one, a
post-processor that trims offsets after a prefix space). A tokenizer that fails the check gets
every text encoded whole. A segment the cache has not seen is encoded word by word when
:mod:`rllm_renderer_chatml.words` can (plain ASCII text, a tokenizer it recognizes), else by the
tokenizer.

Added tokens marked ``normalized`` are matched by the tokenizer after normalization, inside each
segment; the split here uses only the others, and each segment goes through the tokenizer, which
finds the normalized ones itself. Among added tokens that overlap, the tokenizer takes the
leftmost match and, of those starting there, the longest: the split does the same.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from tokenizers import Tokenizer

from rllm_renderer_chatml.pipeline import components, pipeline
from rllm_renderer_chatml.words import WordEncoder, word_pattern

__all__ = [
    "DEFAULT_CACHE_TOKENS",
    "Encoded",
    "SegmentEncoder",
    "TokenCache",
    "Unit",
    "segment_cache",
    "segmentation_blocker",
    "trims_offsets",
]

DEFAULT_CACHE_TOKENS = 1_000_000
"""Token ids a renderer's cache holds by default (some tens of MB when full)."""

K = TypeVar("K")
V = TypeVar("V")


class Encoded:
    """A segment's token ids and, once someone needed them, where each token starts in the
    segment (in characters, made non-decreasing: never before the token it follows)."""

    __slots__ = ("ids", "starts")

    def __init__(self, ids: list[int], starts: list[int] | None = None) -> None:
        self.ids = ids
        self.starts = starts


Unit = tuple[int, str, Encoded]
"""``(base, text, encoded)``: an added token or a segment, where it starts in the whole text,
its text and its encoding."""


def trims_offsets(tokenizer: Tokenizer) -> bool:
    """Whether the post-processor trims whitespace off token offsets, which can put a
    token's start at the very end of its text."""
    post = pipeline(tokenizer)["post_processor"]
    return any(stage.get("trim_offsets") for stage in components(post))


def segmentation_blocker(tokenizer: Tokenizer) -> str | None:
    """Why ``tokenizer`` cannot be encoded segment by segment, or ``None`` when it can."""
    if tokenizer.encode_special_tokens:
        return "it encodes special-token text as plain text (encode_special_tokens)"
    for token in tokenizer.get_added_tokens_decoder().values():
        if token.lstrip or token.rstrip or token.single_word:
            return f"the added token {token.content!r} is matched depending on its neighbours"
    config = pipeline(tokenizer)
    for stage in components(config["pre_tokenizer"]):
        if stage.get("type") == "Metaspace" and stage.get("prepend_scheme") == "first":
            return "its Metaspace pre-tokenizer prepends to the first segment only"
    for stage in components(config["post_processor"]):
        if stage.get("trim_offsets") and stage.get("add_prefix_space"):
            return "its post-processor trims offsets differently in the first segment"
    return None


class TokenCache(Generic[K, V]):
    """Values by key, least recently used evicted first, holding at most ``max_tokens`` token
    ids in all as counted by ``size`` (0: nothing is kept; a value larger than the budget is
    never kept). Thread-safe."""

    def __init__(self, max_tokens: int = DEFAULT_CACHE_TOKENS, *, size: Callable[[V], int]) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.size = size
        self.tokens = 0
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # evicted by another thread since: the value still holds
                return found
        return found

    def put(self, key: K, value: V) -> None:
        size = self.size(value)
        if not self.max_tokens or size > self.max_tokens:
            return
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self.tokens -= self.size(previous)
            self._entries[key] = value
            self.tokens += size
            while self.tokens > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self.tokens -= self.size(evicted)


def segment_cache(max_tokens: int = DEFAULT_CACHE_TOKENS) -> TokenCache[str, Encoded]:
    """A cache of segment encodings by segment text."""
    return TokenCache(max_tokens, size=_encoded_size)


def _encoded_size(encoded: Encoded) -> int:
    return len(encoded.ids)


def _starts(offsets: list[tuple[int, int]]) -> list[int]:
    out = []
    last = 0
    for start, _ in offsets:
        last = start if start > last else last
        out.append(last)
    return out


class SegmentEncoder:
    """Cuts text into :data:`Unit` s, added tokens and the segments between them, and
    encodes the segments through ``cache`` (and the word cache when the tokenizer allows it).

    Built only for a tokenizer :func:`segmentation_blocker` accepts. The units' ids, joined,
    then equal ``tokenizer.encode(text, add_special_tokens=False).ids``, and a token's start
    (its unit's base plus :meth:`starts`) equals its start in that encoding, made
    non-decreasing in the same way.
    """

    def __init__(self, tokenizer: Tokenizer, cache: TokenCache[str, Encoded]) -> None:
        self.tokenizer = tokenizer
        self.cache = cache
        pattern = word_pattern(tokenizer)
        self.words = WordEncoder(tokenizer, pattern) if pattern is not None else None
        added = {
            token.content: token_id
            for token_id, token in tokenizer.get_added_tokens_decoder().items()
            if not token.normalized and token.content
        }
        self._added = {text: Encoded([i], [0]) for text, i in added.items()}
        # Longest first: at the leftmost position where tokens match, the longest one wins.
        ordered = sorted(added, key=lambda t: (-len(t), t))
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self.firsts = frozenset(t[0] for t in added)
        """The characters an added token starts with."""
        # When no added token holds, past its own first character, a character an added
        # token starts with, no match can run across the start of another: a text that
        # continues with an added token encodes on its own, whatever follows.
        self.clean_boundaries = self._pattern is not None and not any(
            c in self.firsts for t in added for c in t[1:]
        )

    def starts_with_added(self, text: str) -> bool:
        """Whether non-empty ``text`` begins with an added token."""
        return (
            text[0] in self.firsts
            and self._pattern is not None
            and self._pattern.match(text) is not None
        )

    def segment(self, text: str, *, store: bool = True) -> Encoded:
        """The encoding of one segment: from the cache, or encoded (and cached if ``store``)."""
        found = self.cache.get(text)
        return self._encode_new(text, store) if found is None else found

    def _encode_new(self, text: str, store: bool) -> Encoded:
        words = self.words
        if words is not None and words.eligible(text):
            found = Encoded(words.encode(text))
        else:
            encoding = self.tokenizer.encode(text, add_special_tokens=False)
            found = Encoded(encoding.ids, _starts(encoding.offsets))
        if store:
            self.cache.put(text, found)
        return found

    def starts(self, text: str, encoded: Encoded) -> list[int]:
        """The start offsets of a segment's tokens, worked out (and kept) on first use."""
        if encoded.starts is None:
            starts = None
            if self.words is not None and self.words.eligible(text):
                starts = self.words.starts(encoded.ids, len(text))
            if starts is None:
                starts = _starts(self.tokenizer.encode(text, add_special_tokens=False).offsets)
            encoded.starts = starts
        return encoded.starts

    def units(self, text: str, *, store: bool = True) -> list[Unit]:
        """The units of ``text`` in order; new segments are cached if ``store``."""
        out: list[Unit] = []
        append = out.append
        get = self.cache.get
        pos = 0
        if self._pattern is not None:
            added = self._added
            for match in self._pattern.finditer(text):
                start = match.start()
                if start > pos:
                    piece = text[pos:start]
                    append((pos, piece, get(piece) or self._encode_new(piece, store)))
                token = match.group()
                append((start, token, added[token]))
                pos = match.end()
        if pos < len(text):
            piece = text[pos:] if pos else text
            append((pos, piece, get(piece) or self._encode_new(piece, store)))
        return out

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, through the caches but adding no segment to them."""
        ids: list[int] = []
        pos = 0
        if self._pattern is not None:
            added = self._added
            for match in self._pattern.finditer(text):
                start = match.start()
                if start > pos:
                    ids += self.segment(text[pos:start], store=False).ids
                ids += added[match.group()].ids
                pos = match.end()
        if pos < len(text):
            ids += self.segment(text[pos:] if pos else text, store=False).ids
        return ids
