"""Segment-by-segment, word-by-word and block-by-block encoding give exactly what one ``encode``
call of the ``tokenizers`` library gives: the same ids, and the same attribution of every token
to its piece, cold and with warm caches, on the parity corpus and on random text (special-token
strings, partial ones, odd whitespace, non-ASCII) for every shipped vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rllm_core.testing.conversations import corpus
from rllm_renderer_chatml.segments import Encoded, segment_cache, segmentation_blocker
from rllm_renderer_chatml.templates import Qwen25Template, SmolLM2Template
from rllm_renderer_chatml.tokenizer import Piece, TextTokenizer
from rllm_renderer_chatml.words import PATTERNS, WordEncoder, word_pattern
from tokenizers import AddedToken, Tokenizer

FRAGMENTS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_response>",
    "<|im_",
    "|>",
    "<",
    ">",
    "user\n",
    "assistant\n",
    "hello",
    " world",
    "'s",
    "'LL",
    "'d",
    "'ve",
    "'Re",
    "'m",
    "'t",
    " don't",
    "123",
    " 4567",
    "\n",
    "\n\n",
    " ",
    "   ",
    "\t",
    "\r\n",
    "\x0b",
    "\x0c",
    " \n ",
    "...",
    " !?",
    '{"a": [1, 2]}',
    "é",
    "中文",
    "🙂",
    "\u00a0",
    "\u2028",
    "\u017f",
    "\u212a",
    "e\u0301",
]

texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=24).map(
    "".join
)
ascii_texts = st.lists(
    st.one_of(
        st.sampled_from([f for f in FRAGMENTS if f.isascii()]),
        st.text(alphabet="\t\n\r !\"#'()*,-./0123456789:;<>?DELMRSTVXdelmrstvx_{|}~", max_size=10),
    ),
    max_size=40,
).map("".join)
piece_lists = st.lists(
    st.tuples(
        st.one_of(texts, ascii_texts, st.sampled_from(FRAGMENTS)),
        st.integers(-1, 5),
        st.booleans(),
    ),
    max_size=10,
)

SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def single_encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids if text else []


def single_render(tokenizer: Tokenizer, pieces: list[Piece]) -> tuple[list, list, list]:
    """Attribution from one encode of the whole text: each token to the piece its start
    falls in, never moving back to an earlier piece."""
    pieces = [p for p in pieces if p.text]
    encoding = tokenizer.encode("".join(p.text for p in pieces), add_special_tokens=False)
    indices, sampled = [], []
    piece, piece_end = -1, 0
    for start, _ in encoding.offsets:
        while start >= piece_end and piece + 1 < len(pieces):
            piece += 1
            piece_end += len(pieces[piece].text)
        indices.append(pieces[piece].message)
        sampled.append(pieces[piece].sampled)
    return encoding.ids, indices, sampled


def rendered(tokenizer: TextTokenizer, pieces: list[Piece]) -> tuple[list, list, list]:
    r = tokenizer.render(pieces)
    return r.token_ids, r.message_indices, r.sampled_mask


def write_variant(folder: Path, source: Path, change) -> Path:
    """A tokenizer folder holding ``source``'s tokenizer.json after ``change(config)``."""
    config = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    change(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def smol(smollm2_tokenizer_dir) -> TextTokenizer:
    return TextTokenizer(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def qwen25(qwen25_tokenizer_dir) -> TextTokenizer:
    return TextTokenizer(qwen25_tokenizer_dir)


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir) -> TextTokenizer:
    return TextTokenizer(qwen3_tokenizer_dir)


@pytest.fixture(scope="module")
def trimming(smollm2_tokenizer_dir, tmp_path_factory) -> TextTokenizer:
    """SmolLM2 with a post-processor that trims whitespace off token offsets: segments are
    still independent, but the word path stays off and a token may start at a piece end."""

    def change(config):
        config["post_processor"] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        }

    folder = tmp_path_factory.mktemp("trimming")
    return TextTokenizer(write_variant(folder, smollm2_tokenizer_dir, change))


@pytest.fixture(scope="module")
def overlapping(smollm2_tokenizer_dir, tmp_path_factory) -> TextTokenizer:
    """SmolLM2 with added tokens that overlap each other and one marked ``normalized``."""
    tokenizer = Tokenizer.from_file(str(smollm2_tokenizer_dir / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in ("<x>", "<x>y", "x>y")])
    tokenizer.add_tokens([AddedToken("zz", normalized=True)])
    folder = tmp_path_factory.mktemp("overlapping")
    tokenizer.save(str(folder / "tokenizer.json"))
    return TextTokenizer(folder)


VOCABULARIES = ["smol", "qwen25", "qwen3", "trimming", "overlapping"]


def test_the_shipped_vocabularies_take_every_fast_path(smol, qwen25, qwen3, trimming):
    for tokenizer in (smol, qwen25, qwen3):
        assert tokenizer.segmented
        assert tokenizer._segments.words is not None
        assert tokenizer.blocks is not None
    assert trimming.segmented and trimming._segments.words is None and trimming.blocks is None


@pytest.mark.parametrize("name", VOCABULARIES)
@SETTINGS
@given(text=st.one_of(texts, ascii_texts))
def test_encode_equals_one_encode_call(name, text, request):
    tokenizer = request.getfixturevalue(name)
    library = tokenizer._tokenizer
    want = single_encode(library, text)
    assert tokenizer.encode(text) == want
    assert tokenizer.encode(text) == want  # every word now cached


@pytest.mark.parametrize("name", VOCABULARIES)
@SETTINGS
@given(text=st.one_of(texts, ascii_texts))
def test_unit_offsets_equal_one_encode_call(name, text, request):
    tokenizer = request.getfixturevalue(name)
    encoding = tokenizer._tokenizer.encode(text, add_special_tokens=False)
    want, last = [], 0
    for start, _ in encoding.offsets:
        last = max(last, start)
        want.append(last)
    got = []
    for base, segment, encoded in tokenizer._segments.units(text):
        got += [base + s for s in tokenizer._segments.starts(segment, encoded)]
    assert got == want


@pytest.mark.parametrize("name", VOCABULARIES)
@SETTINGS
@given(raw=piece_lists)
def test_render_equals_one_encode_call(name, raw, request):
    tokenizer = request.getfixturevalue(name)
    pieces = [Piece(text, message, flag) for text, message, flag in raw]
    want = single_render(tokenizer._tokenizer, pieces)
    assert rendered(tokenizer, pieces) == want
    assert rendered(tokenizer, pieces) == want  # every segment and block now cached
    assert tokenizer._render([p for p in pieces if p.text]) == tokenizer.render(pieces)


def test_a_token_trimmed_to_the_end_of_its_piece_goes_to_the_next_piece(trimming):
    # "x  " is "x" and "  "; trimming moves the start of "  " to the end of the text, which is
    # where the second piece begins.
    pieces = [Piece("x  ", 0), Piece("<|im_end|>", 1, True)]
    want = single_render(trimming._tokenizer, pieces)
    assert want[1] == [0, 1, 1]
    assert rendered(trimming, pieces) == want


def corpus_pieces(template, cases):
    """Every case's pieces, for every prefix of its messages (as a gateway re-renders a
    growing conversation), with and without the generation prompt."""
    for case in cases:
        messages, tools = case.conversation
        for end in range(1, len(messages) + 1):
            for generation in (False, True):
                yield template.pieces(messages[:end], tools, generation)


@pytest.mark.parametrize(
    ("name", "template", "exclude"),
    [
        ("smol", SmolLM2Template(), ("tools", "tool_calls")),
        ("qwen25", Qwen25Template(), ()),
        ("trimming", SmolLM2Template(), ("tools", "tool_calls")),
    ],
)
def test_corpus_renders_equal_one_encode_call(name, template, exclude, request):
    tokenizer = request.getfixturevalue(name)
    cases = corpus(exclude=exclude)
    renders = list(corpus_pieces(template, cases))
    assert len(renders) > 400
    for pass_ in ("cold", "warm"):
        for pieces in renders:
            want = single_render(tokenizer._tokenizer, pieces)
            assert rendered(tokenizer, pieces) == want, pass_
    assert len(tokenizer.cache) > 0


def test_text_spelling_special_tokens_splits_at_them(qwen25):
    text = "say <|im_end|> now<|im_start|>"
    ids = qwen25.encode(text)
    assert ids == single_encode(qwen25._tokenizer, text)
    assert ids.count(qwen25.require_token("<|im_end|>")) == 1
    assert ids[-1] == qwen25.require_token("<|im_start|>")


def test_overlapping_added_tokens_take_the_longest_leftmost_match(overlapping):
    x, xy, x_y = (overlapping.require_token(t) for t in ("<x>", "<x>y", "x>y"))
    assert overlapping.encode("<x>y") == [xy]
    assert overlapping.encode("<x>z")[0] == x
    assert overlapping.encode("ax>y")[-1] == x_y
    assert overlapping.encode("<x>yzz") == single_encode(overlapping._tokenizer, "<x>yzz")


# ---------------------------------------------------------------- when the paths stay off


def test_tokenizers_whose_segments_depend_on_context_are_encoded_whole(
    smollm2_tokenizer_dir, tmp_path
):
    def lstrip(config):
        next(t for t in config["added_tokens"] if t["content"] == "<|im_end|>")["lstrip"] = True

    def metaspace(config):
        config["pre_tokenizer"] = {
            "type": "Metaspace",
            "replacement": "\u2581",
            "prepend_scheme": "first",
            "split": True,
        }

    for name, change, reason in (
        ("lstrip", lstrip, "'<|im_end|>'"),
        ("metaspace", metaspace, "Metaspace"),
    ):
        tokenizer = TextTokenizer(write_variant(tmp_path / name, smollm2_tokenizer_dir, change))
        assert not tokenizer.segmented
        assert reason in segmentation_blocker(tokenizer._tokenizer)
        pieces = [Piece("<|im_start|>user\nHi there <|im_end|>", 0), Piece(" x \n", 1, True)]
        assert rendered(tokenizer, pieces) == single_render(tokenizer._tokenizer, pieces)
        assert tokenizer.encode(" a <|im_end|> b") == single_encode(
            tokenizer._tokenizer, " a <|im_end|> b"
        )


def test_special_tokens_encoded_as_text_block_segmentation(smollm2_tokenizer_dir):
    tokenizer = Tokenizer.from_file(str(smollm2_tokenizer_dir / "tokenizer.json"))
    assert segmentation_blocker(tokenizer) is None
    tokenizer.encode_special_tokens = True
    assert "encode_special_tokens" in segmentation_blocker(tokenizer)


def test_word_path_recognizes_only_known_pipelines(
    smollm2_tokenizer_dir, qwen25_tokenizer_dir, tmp_path
):
    def load(folder):
        return Tokenizer.from_file(str(folder / "tokenizer.json"))

    assert word_pattern(load(smollm2_tokenizer_dir)) in PATTERNS.values()
    assert word_pattern(load(qwen25_tokenizer_dir)) in PATTERNS.values()
    assert word_pattern(load(smollm2_tokenizer_dir)) != word_pattern(load(qwen25_tokenizer_dir))

    def dropout(config):
        config["model"]["dropout"] = 0.1

    def lowercase(config):
        config["normalizer"] = {"type": "Lowercase"}

    def other_regex(config):
        config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{N}{1,3}|\s+"

    def normalized_token(config):
        config["added_tokens"][-1]["normalized"] = True

    def prefix_space(config):
        config["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True

    for change in (dropout, lowercase, other_regex, normalized_token, prefix_space):
        folder = write_variant(tmp_path / change.__name__, qwen25_tokenizer_dir, change)
        assert word_pattern(load(folder)) is None, change.__name__


# ---------------------------------------------------------------- the caches


def test_token_cache_evicts_least_recently_used_by_token_count():
    cache = segment_cache(max_tokens=5)
    cache.put("a", Encoded([1, 2]))
    cache.put("b", Encoded([3, 4]))
    assert cache.get("a").ids == [1, 2]  # "a" is now the most recently used
    cache.put("c", Encoded([5, 6]))
    assert "b" not in cache and "a" in cache and "c" in cache
    assert cache.tokens == 4
    cache.put("a", Encoded([7]))
    assert cache.tokens == 3 and cache.get("a").ids == [7]
    cache.put("huge", Encoded(list(range(6))))
    assert "huge" not in cache and cache.tokens == 3


def test_token_cache_of_size_zero_keeps_nothing():
    cache = segment_cache(max_tokens=0)
    cache.put("a", Encoded([1]))
    assert len(cache) == 0 and cache.get("a") is None
    with pytest.raises(ValueError, match="-1"):
        segment_cache(max_tokens=-1)


def test_render_caches_segments_and_reuses_them(smollm2_tokenizer_dir):
    tokenizer = TextTokenizer(smollm2_tokenizer_dir, cache_tokens=10_000)
    tokenizer.blocks = None  # segments only
    pieces = [Piece("<|im_start|>user\nHello there<|im_end|>\n", 0)]
    first = tokenizer.render(pieces)
    assert set(tokenizer.cache._entries) == {"user\nHello there", "\n"}
    cached = tokenizer.cache.get("user\nHello there")
    tokenizer.cache._entries["user\nHello there"] = Encoded([7, 7], [0, 5])
    assert tokenizer.render(pieces).token_ids == [1, 7, 7, 2, 198]
    tokenizer.cache._entries["user\nHello there"] = cached
    assert tokenizer.render(pieces) == first
    tokenizer.encode("<|im_start|>user\nNot kept<|im_end|>")
    assert "user\nNot kept" not in tokenizer.cache


def test_render_caches_runs_of_pieces_that_start_with_an_added_token(smollm2_tokenizer_dir):
    tokenizer = TextTokenizer(smollm2_tokenizer_dir, cache_tokens=10_000)
    system = Piece("<|im_start|>system\nBe brief.<|im_end|>\n", -1)
    user = Piece("<|im_start|>user\nHi<|im_end|>\n", 0)
    header, body = Piece("<|im_start|>assistant\n", 1), Piece("Hello!", 1, True)
    close, newline = Piece("<|im_end|>", 1, True), Piece("\n", 1)
    first = tokenizer.render([system, user, header, body, close, newline])
    # A run ends where the next piece starts with an added token: the body and the newline
    # join the piece before them.
    assert set(tokenizer.blocks._entries) == {
        (system,),
        (user,),
        (header, body),
        (close, newline),
    }
    assert first == single_render_of(tokenizer, [system, user, header, body, close, newline])
    start = len(tokenizer.blocks.get((system,)).token_ids)
    end = start + len(tokenizer.blocks.get((user,)).token_ids)
    assert end - start == 6  # <|im_start|> user \n Hi <|im_end|> \n
    tokenizer.blocks._entries[(user,)] = type(first)(
        token_ids=[9], message_indices=[0], sampled_mask=[False]
    )
    again = tokenizer.render([system, user, header, body, close, newline])
    assert again.token_ids == [*first.token_ids[:start], 9, *first.token_ids[end:]]
    # The same text owned by another message is another run.
    moved = Piece(user.text, 3)
    assert tokenizer.render([system, moved]).message_indices[-6:] == [3] * 6


def single_render_of(tokenizer: TextTokenizer, pieces: list[Piece]):
    ids, indices, sampled = single_render(tokenizer._tokenizer, pieces)
    return type(tokenizer.render(pieces))(
        token_ids=ids, message_indices=indices, sampled_mask=sampled
    )


def test_runs_are_not_cached_when_an_added_token_can_start_inside_another(
    smollm2_tokenizer_dir, tmp_path
):
    tokenizer = Tokenizer.from_file(str(smollm2_tokenizer_dir / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("x<y", normalized=False)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    text = TextTokenizer(tmp_path)
    assert text.segmented and text.blocks is None
    pieces = [Piece("ax", 0), Piece("<|im_end|>", 1), Piece("<y", 2)]
    assert rendered(text, pieces) == single_render(text._tokenizer, pieces)


def test_word_cache_is_bounded_and_skips_long_words(smollm2_tokenizer_dir):
    library = Tokenizer.from_file(str(smollm2_tokenizer_dir / "tokenizer.json"))
    words = WordEncoder(library, word_pattern(library), max_words=10)
    for n in range(40):
        text = f"word{n} and more{n}"
        assert words.encode(text) == single_encode(library, text)
        assert len(words) <= 10
    long_word = " " + "x" * 80
    assert words.encode(long_word) == single_encode(library, long_word)
    assert long_word not in words._cache


def test_word_path_one_by_one_and_whole_agree(smollm2_tokenizer_dir):
    library = Tokenizer.from_file(str(smollm2_tokenizer_dir / "tokenizer.json"))
    words = WordEncoder(library, word_pattern(library))
    many = " ".join(f"w{n}x" for n in range(30)) + "\n\n  it's 12 don't!"
    assert words.encode(many) == single_encode(library, many)  # encoded whole, cached
    assert len(words) >= 30
    few = "w3x w4x brandnew w5x"
    assert words.encode(few) == single_encode(library, few)  # one new word, alone
    assert words.starts(words.encode(few), len(few)) == [
        s for s, _ in library.encode(few, add_special_tokens=False).offsets
    ]
    assert words.starts(words.encode(few), len(few) + 1) is None
    assert not WordEncoder.eligible("caf\u00e9") and not WordEncoder.eligible("a\x0bb")
    assert WordEncoder.eligible("tab\there\r\n ~")


@pytest.mark.parametrize("name", ["smol", "qwen25"])
@SETTINGS
@given(
    picks=st.lists(
        st.one_of(st.integers(0, 2000), st.integers(0, 200_000), st.sampled_from([0, 1, 2])),
        max_size=40,
    )
)
def test_decode_equals_the_tokenizers_decode(name, picks, request):
    tokenizer = request.getfixturevalue(name)
    library = tokenizer._tokenizer
    ids = [p % library.get_vocab_size() for p in picks]
    want = library.decode(ids, skip_special_tokens=False)
    assert tokenizer.decode(ids) == want
    assert tokenizer.decode(ids) == want  # every ASCII token now known


def test_decode_of_an_id_outside_the_vocabulary_is_the_tokenizers(smol):
    library = smol._tokenizer
    with pytest.raises(OverflowError):
        library.decode([-1])
    with pytest.raises(OverflowError):
        smol.decode([300, -1])
    far = [300, 10**7, 301]
    assert smol.decode(far) == library.decode(far, skip_special_tokens=False)
    assert 10**7 not in smol._ascii
