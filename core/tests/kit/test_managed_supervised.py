"""Supervised steps and logprob scoring on a managed service's ``cross_entropy`` loss: the datum
checks, the token-mean weights, the NLL and logprobs read back (and refused when they do not
fit what was sent), against a fake training client."""

from __future__ import annotations

from array import array
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from rllm_core.kit.managed import ManagedServiceSettings, ServiceCalls
from rllm_core.kit.managed.supervised import (
    build_supervised_batch,
    check_datum,
    compute_logprobs,
    forward_backward_supervised,
    scored_logprobs,
    supervised_nll,
)
from rllm_core.testing.managed import BAD_SUPERVISED_DATUMS, supervised_datum

SETTINGS = ManagedServiceSettings(retries=2, retry_backoff_s=0.0, request_timeout_s=1.0)

# Three trained targets over two datums: the token-mean weight is 1/3.
PROMPT_THEN_TWO = supervised_datum([1, 2, 3, 4], [False, False, True, True])
ONE_THEN_PROMPT = supervised_datum([5, 6, 7], [False, True, False])


def sdk_datum(datum, weights):
    return {"input": datum.token_ids[:-1], "targets": datum.token_ids[1:], "weights": weights}


def logprobs(*values: float) -> dict[str, array]:
    """A service's per-datum output: ``logprobs`` as a tensor-like with ``tolist()``."""
    return {"logprobs": array("d", values)}


class Training:
    """A training client whose requests answer with ``outputs``, after raising ``errors``."""

    def __init__(self, outputs, metrics=None, errors=()) -> None:
        self.outputs = outputs
        self.metrics = metrics or {}
        self.errors = list(errors)
        self.requests: list[tuple[str, list, str]] = []

    def _answer(self, method: str, datums: list, loss: str) -> Future:
        self.requests.append((method, datums, loss))
        if self.errors:
            raise self.errors.pop(0)
        future: Future = Future()
        future.set_result(SimpleNamespace(loss_fn_outputs=self.outputs, metrics=self.metrics))
        return future

    def forward_backward(self, datums, loss):
        return self._answer("forward_backward", datums, loss)

    def forward(self, datums, loss):
        return self._answer("forward", datums, loss)


def calls() -> ServiceCalls:
    return ServiceCalls("Svc", SETTINGS, transient=lambda e: isinstance(e, ConnectionError))


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([], r"datum 3 has 0 token\(s\); a datum needs at least 2 tokens"),
        ([7], r"datum 3 has 1 token\(s\)"),
        ([1, -2], "datum 3 has token id -2 at position 1; token ids are non-negative integers"),
        ([1, 2.0], "datum 3 has token id 2.0 at position 1"),
        ([True, 2], "datum 3 has token id True at position 0"),
        ([1, "2"], "datum 3 has token id '2' at position 1"),
    ],
)
def test_a_datum_that_cannot_be_sent_is_named_with_what_is_wrong(tokens, message):
    datum = supervised_datum(tokens, [False] * len(tokens))
    with pytest.raises(ValueError, match=message):
        check_datum(3, datum)
    with pytest.raises(ValueError, match=message):
        check_datum(3, datum, trainable=False)


def test_a_first_token_action_is_refused_only_for_training():
    datum = supervised_datum([1, 2, 3], [True, True, False])
    with pytest.raises(ValueError, match="datum 0 marks its first token as an action"):
        check_datum(0, datum)
    check_datum(0, datum, trainable=False)
    check_datum(0, supervised_datum([0, 2], [False, True]))


def test_the_batch_weights_the_trained_targets_by_one_over_their_count():
    batch = build_supervised_batch([PROMPT_THEN_TWO, ONE_THEN_PROMPT], sdk_datum)
    third = 1.0 / 3.0
    assert batch.trained_tokens == 3
    assert batch.masks == [[False, True, True], [True, False]]
    assert batch.sdk_datums == [
        {"input": [1, 2, 3], "targets": [2, 3, 4], "weights": [0.0, third, third]},
        {"input": [5, 6], "targets": [6, 7], "weights": [third, 0.0]},
    ]


@pytest.mark.parametrize(("datums", "message"), BAD_SUPERVISED_DATUMS)
def test_a_batch_refuses_what_the_service_would_fail_on(datums, message):
    with pytest.raises(ValueError, match=message):
        build_supervised_batch(datums, sdk_datum)


def test_the_nll_is_the_mean_over_trained_targets_only():
    batch = build_supervised_batch([PROMPT_THEN_TWO, ONE_THEN_PROMPT], sdk_datum)
    # The untrained targets' -9.0 would change the mean if they were counted.
    outputs = [logprobs(-9.0, -1.0, -2.0), logprobs(-3.0, -9.0)]
    assert supervised_nll(outputs, batch, "Svc") == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        ([logprobs(-1.0, -1.0, -1.0)], "Svc returned outputs for 1 datums but 2 were sent"),
        (
            [logprobs(-1.0, -1.0, -1.0), {"loss": array("d", [1.0])}],
            r"Svc's cross_entropy output for datum 1 has no logprobs \(it has \['loss'\]\)",
        ),
        (
            [logprobs(-1.0, -1.0), logprobs(-1.0, -1.0)],
            "Svc returned 2 logprobs for datum 0, which has 3 target tokens",
        ),
    ],
)
def test_outputs_that_do_not_fit_the_request_are_refused(outputs, message):
    batch = build_supervised_batch([PROMPT_THEN_TWO, ONE_THEN_PROMPT], sdk_datum)
    with pytest.raises(RuntimeError, match=message):
        supervised_nll(outputs, batch, "Svc")
    with pytest.raises(RuntimeError, match=message):
        scored_logprobs(outputs, [PROMPT_THEN_TWO, ONE_THEN_PROMPT], "Svc")


def test_scored_logprobs_align_with_the_tokens():
    outputs = [logprobs(-0.5, -1.5, -2.5), logprobs(-3.0, -4.0)]
    assert scored_logprobs(outputs, [PROMPT_THEN_TWO, ONE_THEN_PROMPT], "Svc") == [
        [0.0, -0.5, -1.5, -2.5],
        [0.0, -3.0, -4.0],
    ]


def test_a_supervised_step_sends_one_request_and_reports_its_figures():
    training = Training(
        [logprobs(-9.0, -1.0, -2.0), logprobs(-3.0, -9.0)],
        metrics={"loss:sum": 2.0, "clock": 3, "note": "fine"},
        errors=[ConnectionResetError("reset")],
    )
    metrics = forward_backward_supervised(
        calls(), training, [PROMPT_THEN_TWO, ONE_THEN_PROMPT], sdk_datum, "svc"
    )
    assert metrics == {
        "nll": pytest.approx(2.0),
        "tokens": 3.0,
        "sequences": 2.0,
        "svc/loss:sum": 2.0,
        "svc/clock": 3.0,
        "svc/retries": 1.0,
    }
    assert [(method, loss) for method, _, loss in training.requests] == [
        ("forward_backward", "cross_entropy")
    ] * 2
    assert training.requests[-1][1][1]["weights"] == [pytest.approx(1 / 3), 0.0]


@pytest.mark.parametrize(("datums", "message"), BAD_SUPERVISED_DATUMS)
def test_invalid_datums_are_refused_before_anything_is_sent(datums, message):
    training = Training([])
    with pytest.raises(ValueError, match=message):
        forward_backward_supervised(calls(), training, datums, sdk_datum, "svc")
    assert training.requests == []


def test_logprobs_come_from_a_forward_pass_with_every_weight_zero():
    first_is_action = supervised_datum([1, 2, 3], [True, True, True])
    training = Training([logprobs(-0.5, -1.5), logprobs(-2.0)])
    scored = compute_logprobs(
        calls(), training, [first_is_action, supervised_datum([4, 5], [False, False])], sdk_datum
    )
    assert scored == [[0.0, -0.5, -1.5], [0.0, -2.0]]
    [(method, sent, loss)] = training.requests
    assert (method, loss) == ("forward", "cross_entropy")
    assert [d["weights"] for d in sent] == [[0.0, 0.0], [0.0]]


def test_scoring_nothing_sends_nothing_and_a_bad_datum_is_refused_before_sending():
    training = Training([])
    assert compute_logprobs(calls(), training, [], sdk_datum) == []
    with pytest.raises(ValueError, match=r"datum 1 has 1 token\(s\)"):
        compute_logprobs(
            calls(), training, [PROMPT_THEN_TWO, supervised_datum([4], [False])], sdk_datum
        )
    assert training.requests == []
