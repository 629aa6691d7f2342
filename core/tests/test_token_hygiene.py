"""Token hygiene: datums a managed service would fail a whole step on (a token id outside the
vocabulary, a negative one, no sampled token) are dropped before the step, each with a warning
naming its session; the rest are kept in order and the drops are counted."""

from __future__ import annotations

import warnings

import pytest
from rllm_core.kit.token_hygiene import Dropped, TokenHygieneSettings, VocabBound, screen
from rllm_core.testing.tokenizers import hf_tokenizer
from rllm_core.types import Datum

VOCAB = 100


def datum(token_ids: list[int], actions: list[bool] | None = None, session: str = "") -> Datum:
    n = len(token_ids)
    actions = actions if actions is not None else [i > 0 for i in range(n)]
    return Datum(
        token_ids=token_ids,
        logprobs=[-0.5 if a else 0.0 for a in actions],
        advantages=[1.0] * n,
        action_mask=actions,
        observation_mask=[False] * n,
        metadata={"session_id": session} if session else {},
    )


def screened(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = screen(*args, **kwargs)
    return result, [str(w.message) for w in caught if w.category is RuntimeWarning]


def test_good_datums_pass_untouched_in_order():
    datums = [datum([1, 2, 3], session="a"), datum([4, 99], session="b")]
    result, said = screened(datums, vocab_size=VOCAB, service="svc")
    assert result.kept == datums and result.kept[0] is datums[0]
    assert result.dropped == [] and said == []
    assert result.metrics("svc") == {
        "svc/dropped_datums": 0.0,
        "svc/dropped_out_of_vocab": 0.0,
        "svc/dropped_empty": 0.0,
    }


def test_bad_datums_are_dropped_and_the_rest_kept_in_order():
    datums = [
        datum([1, 2, 3], session="ok-0"),
        datum([1, VOCAB, 3], session="big"),
        datum([1, 2], [False, False], session="empty"),
        datum([1, 2, 4], session="ok-1"),
        datum([-1, 2], session="negative"),
        datum([5, 6], session="ok-2"),
    ]
    result, said = screened(datums, vocab_size=VOCAB, service="svc")
    assert result.kept == [datums[0], datums[3], datums[5]]
    assert result.dropped == [
        Dropped(
            1,
            "big",
            "token id 100 at position 1 is outside [0, 100), the vocabulary of the model the"
            " service trains",
            "out_of_vocab",
        ),
        Dropped(2, "empty", "it has no sampled token (empty completions)", "empty"),
        Dropped(
            4,
            "negative",
            "token id -1 at position 0 is outside [0, 100), the vocabulary of the model the"
            " service trains",
            "out_of_vocab",
        ),
    ]
    assert result.metrics("tinker") == {
        "tinker/dropped_datums": 3.0,
        "tinker/dropped_out_of_vocab": 2.0,
        "tinker/dropped_empty": 1.0,
    }
    assert said == [
        "dropped datum 1 of session 'big' before the svc step: token id 100 at position 1 is"
        " outside [0, 100), the vocabulary of the model the service trains",
        "dropped datum 2 of session 'empty' before the svc step: it has no sampled token"
        " (empty completions)",
        "dropped datum 4 of session 'negative' before the svc step: token id -1 at position 0"
        " is outside [0, 100), the vocabulary of the model the service trains",
    ]


def test_the_first_bad_token_is_named():
    result, _ = screened([datum([1, 200, -3, 300])], vocab_size=VOCAB, service="svc")
    assert result.dropped[0].reason.startswith("token id 200 at position 1 ")


def test_an_out_of_vocabulary_datum_counts_once_even_without_actions():
    result, said = screened([datum([VOCAB], [False])], vocab_size=VOCAB, service="svc")
    assert [d.kind for d in result.dropped] == ["out_of_vocab"] and len(said) == 1


def test_without_a_vocabulary_size_only_negative_ids_are_dropped():
    datums = [datum([1, 10**9], session="huge"), datum([3, -7], session="negative")]
    result, said = screened(datums, vocab_size=None, service="svc")
    assert result.kept == [datums[0]]
    assert result.dropped[0].reason == (
        "token id -7 at position 1 is negative, the vocabulary of the model the service trains"
    )
    assert "session 'negative'" in said[0]


def test_a_datum_without_a_session_is_named_by_a_question_mark():
    _, said = screened([datum([1, 2], [False, False])], vocab_size=VOCAB, service="svc")
    assert said == [
        "dropped datum 0 of session '?' before the svc step: it has no sampled token"
        " (empty completions)"
    ]


def test_steps_that_train_no_actions_keep_datums_without_them():
    datums = [datum([1, 2], [False, False], session="prompt-only"), datum([1, VOCAB])]
    result, said = screened(datums, vocab_size=VOCAB, service="svc", trains_actions=False)
    assert result.kept == [datums[0]]
    assert [d.kind for d in result.dropped] == ["out_of_vocab"] and len(said) == 1


def test_nothing_kept_when_every_datum_is_bad():
    result, said = screened(
        [datum([1, 2], [False, False]), datum([VOCAB, 1])], vocab_size=VOCAB, service="svc"
    )
    assert result.kept == [] and len(result.dropped) == len(said) == 2
    assert result.metrics("svc")["svc/dropped_datums"] == 2.0


def test_the_vocab_size_setting():
    assert TokenHygieneSettings().vocab_size is None
    assert TokenHygieneSettings(vocab_size=151936).vocab_size == 151936
    with pytest.raises(ValueError, match="vocab_size"):
        TokenHygieneSettings(vocab_size=0)


def test_the_bound_is_vocab_size_when_set_and_nothing_is_loaded():
    def sdk_tokenizer():
        raise AssertionError("no tokenizer is loaded when vocab_size is set")

    assert VocabBound(151936, "unloadable", sdk_tokenizer, "svc")() == 151936


def test_without_vocab_size_the_bound_is_the_named_tokenizers_length(smollm2_tokenizer_dir):
    asked: list[int] = []
    bound = VocabBound(None, str(smollm2_tokenizer_dir), lambda: asked.append(1), "svc")
    assert bound() == bound() == len(hf_tokenizer(smollm2_tokenizer_dir)) == 49152
    assert asked == []


def test_without_a_tokenizer_key_the_bound_is_the_services_tokenizers_length(
    smollm2_tokenizer_dir,
):
    asked: list[int] = []

    def sdk_tokenizer():
        asked.append(1)
        return hf_tokenizer(smollm2_tokenizer_dir)

    bound = VocabBound(None, None, sdk_tokenizer, "svc")
    assert (bound(), bound(), asked) == (49152, 49152, [1])


def test_no_tokenizer_at_all_is_an_error_naming_the_keys(tmp_path):
    def sdk_tokenizer():
        raise ValueError("get_tokenizer() requires a tokenizer_model")

    with pytest.raises(RuntimeError, match=r"svc gave no tokenizer.*\[trainer\]\.vocab_size"):
        VocabBound(None, None, sdk_tokenizer, "svc")()
    with pytest.raises(
        RuntimeError, match=r"(?s)cannot load the tokenizer.*\[trainer\]\.vocab_size"
    ):
        VocabBound(None, str(tmp_path), sdk_tokenizer, "svc")()
