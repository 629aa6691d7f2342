"""Encoding plain ASCII text word by word, with every word's ids cached.

A byte-level BPE tokenizer (SmolLM2's, Qwen's) cuts a segment of text into *words* with one
regular expression, then encodes each word on its own. Chat text repeats its words, so
:class:`WordEncoder` does the cut itself and looks each word's ids up in a cache, asking the
tokenizer only for words it has not seen: several times faster than the tokenizer's whole
pipeline on a message of a few hundred words.

It takes only what it can do exactly:

- Pipelines it recognizes stage by stage (:func:`word_pattern`): a byte-level pre-tokenizer
  whose regular expression is one of :data:`PATTERNS` (GPT-2's, used by SmolLM2, and Qwen's),
  a normalizer that leaves ASCII unchanged (none, or Unicode normal forms), a BPE model without
  dropout or word affixes, no added tokens matched after normalization, and a post-processor
  that reports offsets untrimmed.
- Segments of printable ASCII, tabs and line breaks (:meth:`WordEncoder.eligible`). On these
  characters ``\\p{L}``, ``\\p{N}`` and ``\\s`` have one unambiguous meaning, and the patterns'
  ASCII translations behave exactly as the originals; anything else is left to the tokenizer.

A word's ids are those of encoding the word alone: the expressions have no look-behind, and
their only look-ahead, ``(?!\\S)``, cannot change how a whitespace-only word cuts, so the word
cuts alone as it did in its text. Each token of ASCII byte-level text spans as many characters
as its vocabulary string has, which gives token start offsets without asking the tokenizer.
"""

from __future__ import annotations

import re
from itertools import accumulate, chain, islice
from typing import Any

from tokenizers import Tokenizer

from rllm_renderer_chatml.pipeline import pipeline

__all__ = ["DEFAULT_CACHE_WORDS", "PATTERNS", "WordEncoder", "word_pattern"]

DEFAULT_CACHE_WORDS = 200_000
"""Words a :class:`WordEncoder` keeps by default (a few tens of MB when full)."""

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# On the eligible characters (tab, line feed, carriage return, space to tilde) a letter is
# A-Z or a-z, a number 0-9, whitespace one of tab, LF, CR and space.
PATTERNS: dict[str, str] = {
    _GPT2: r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\t\n\r A-Za-z0-9]+"
    r"|[\t\n\r ]+(?![^\t\n\r ])|[\t\n\r ]+",
    _QWEN: r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]"
    r"| ?[^\t\n\r A-Za-z0-9]+[\r\n]*|[\t\n\r ]*[\r\n]+|[\t\n\r ]+(?![^\t\n\r ])|[\t\n\r ]+",
}
"""Pre-tokenizer expressions handled, each with its translation for eligible text."""

_ELIGIBLE = re.compile(r"[\t\n\r -~]*")
_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}
# Encoding a handful of new words one by one is cheaper than the whole segment; past this,
# the segment goes to the tokenizer in one call and its words are cached from the offsets.
_ONE_BY_ONE = 8
_LONGEST_WORD = 64


def _stages(node: Any, key: str) -> list[dict[str, Any]] | None:
    """The stages of a pipeline part (``[]`` for none, ``None`` when malformed)."""
    if node is None:
        return []
    if not isinstance(node, dict):
        return None
    if node.get("type") == "Sequence":
        inner = node.get(key)
        return inner if isinstance(inner, list) else None
    return [node]


def word_pattern(tokenizer: Tokenizer) -> str | None:
    """The ASCII translation of ``tokenizer``'s word-cutting expression when its pipeline is
    one :class:`WordEncoder` handles exactly (see the module docstring), else ``None``."""
    if any(t.normalized for t in tokenizer.get_added_tokens_decoder().values()):
        return None
    config = pipeline(tokenizer)
    normalizers = _stages(config["normalizer"], "normalizers")
    if normalizers is None or any(s.get("type") not in _NORMALIZERS for s in normalizers):
        return None
    model = config["model"]
    if (
        model["type"] != "BPE"
        or model["dropout"] is not None
        or model["continuing_subword_prefix"]
        or model["end_of_word_suffix"]
    ):
        return None
    post = _stages(config["post_processor"], "processors")
    if post is None or any(s.get("trim_offsets") for s in post):
        return None
    stages = _stages(config["pre_tokenizer"], "pretokenizers") or []
    byte_level = stages[-1] if stages else {}
    if byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space"):
        return None
    if len(stages) == 1 and byte_level.get("use_regex", True):
        return PATTERNS[_GPT2]
    if len(stages) == 2 and not byte_level.get("use_regex", True):
        split = stages[0]
        regex = (split.get("pattern") or {}).get("Regex")
        if (
            split.get("type") == "Split"
            and split.get("behavior") == "Isolated"
            and not split.get("invert")
            and regex in PATTERNS
        ):
            return PATTERNS[regex]
    return None


class WordEncoder:
    """Encodes eligible text through a cache of word ids (at most ``max_words`` words; the
    oldest half is dropped when it fills). Build it with the pattern :func:`word_pattern`
    returned for ``tokenizer``.

    :meth:`encode` returns exactly ``tokenizer.encode(text, add_special_tokens=False).ids``
    for eligible text that holds no added token; :meth:`starts` the start offsets of those
    tokens.
    """

    def __init__(
        self, tokenizer: Tokenizer, pattern: str, *, max_words: int = DEFAULT_CACHE_WORDS
    ) -> None:
        self.tokenizer = tokenizer
        self.max_words = max_words
        self._words = re.compile(pattern).findall
        self._cache: dict[str, list[int]] = {}
        self._lengths: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._cache)

    @staticmethod
    def eligible(text: str) -> bool:
        """Whether ``text`` is printable ASCII, tabs and line breaks only."""
        return text.isascii() and _ELIGIBLE.fullmatch(text) is not None

    def encode(self, text: str) -> list[int]:
        """The ids of eligible ``text`` (which must hold no added token)."""
        words = self._words(text)
        parts = list(map(self._cache.get, words))
        if None in parts:
            missing = [n for n, part in enumerate(parts) if part is None]
            if len(missing) > _ONE_BY_ONE:
                return self._encode_whole(text, words)
            encode = self.tokenizer.encode
            found: dict[str, list[int]] = {}
            for n in missing:
                part = found.get(words[n])
                if part is None:
                    part = found[words[n]] = encode(words[n], add_special_tokens=False).ids
                parts[n] = part
            self._remember(found)
        return list(chain.from_iterable(parts))  # type: ignore[arg-type]

    def _encode_whole(self, text: str, words: list[str]) -> list[int]:
        """Encode ``text`` in one call and cache its words' ids, read from the offsets, when
        every token lies inside one word."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids = encoding.ids
        offsets = encoding.offsets
        found: dict[str, list[int]] = {}
        token = end = 0
        for word in words:
            end += len(word)
            first = token
            while token < len(ids) and offsets[token][0] < end:
                token += 1
            if token > first and offsets[token - 1][1] > end:
                return ids
            found[word] = ids[first:token]
        if token == len(ids) and end == len(text):
            self._remember(found)
        return ids

    def _remember(self, found: dict[str, list[int]]) -> None:
        cache = self._cache
        for word, ids in found.items():
            if len(word) <= _LONGEST_WORD:
                cache[word] = ids
        if len(cache) > self.max_words:
            for word in list(islice(cache, len(cache) - self.max_words // 2)):
                cache.pop(word, None)

    def starts(self, ids: list[int], length: int) -> list[int] | None:
        """Start offsets (in characters) of the tokens of eligible text of ``length``
        characters encoded as ``ids``; ``None`` when the tokens' spans do not add up to it."""
        lengths = self._lengths
        for token in ids:
            if token not in lengths:
                lengths[token] = len(self.tokenizer.id_to_token(token) or "")
        starts = list(accumulate((lengths[t] for t in ids), initial=0))
        return starts[:-1] if starts[-1] == length else None
