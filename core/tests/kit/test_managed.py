"""Requests to a managed training service: statuses worth retrying, the wait an answer asks
for, and ServiceCalls' timeout, retries and counts, on fake futures."""

from __future__ import annotations

import asyncio
import ssl
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
from pydantic import ConfigDict, ValidationError
from rllm_core.kit.managed import (
    ManagedServiceSettings,
    ServiceCalls,
    lost_answer,
    retry_after_s,
    retryable_status,
    service_metrics,
)

SETTINGS = ManagedServiceSettings(retries=3, retry_backoff_s=0.0, request_timeout_s=0.01)


class Answer(Exception):
    """An error that carries an HTTP-like response with ``headers``."""

    def __init__(self, **headers: str) -> None:
        super().__init__("answer")
        self.response = SimpleNamespace(headers=headers)


def done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class Submitter:
    """Raises ``errors`` in turn when called, then returns a finished future of ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> Future:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return done("ok")


def calls() -> ServiceCalls:
    return ServiceCalls("Service", SETTINGS, transient=lambda e: isinstance(e, ConnectionError))


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        *[(code, True) for code in (408, 429, 500, 503, 599)],
        *[(code, False) for code in (None, 200, 400, 401, 404, 422)],
    ],
)
def test_retryable_statuses(status, retryable):
    assert retryable_status(status) is retryable


def test_retry_after_reads_a_number_of_seconds_from_the_answer():
    assert retry_after_s(Answer(**{"retry-after": "2.5"})) == 2.5
    assert retry_after_s(Answer(**{"retry-after": "-3"})) == 0.0
    assert retry_after_s(Answer(**{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None
    assert retry_after_s(Answer()) is None
    assert retry_after_s(ConnectionResetError()) is None


def test_service_metrics_keep_the_numbers_under_the_prefix_except_those_reported_apart():
    figures = {"loss:sum": 1.5, "clock_s": 2, "status": "ok", "grad": None, "step": 4}
    metrics = service_metrics(figures, "svc", besides={"step"})
    assert metrics == {"svc/loss:sum": 1.5, "svc/clock_s": 2.0}
    assert all(type(value) is float for value in metrics.values())
    assert service_metrics(None, "svc") == {} and service_metrics({}, "svc") == {}


def test_a_call_is_sent_again_while_it_fails_transiently_and_its_retries_are_listed():
    submit = Submitter(ConnectionResetError("reset"), ConnectionResetError("reset"))
    retries: list[int] = []
    assert calls().call(submit, "a step", retries) == "ok"
    assert submit.calls == 3 and retries == [1, 2]


def test_other_errors_and_the_bound_end_the_retries():
    bad = ValueError("bad request")
    submit = Submitter(bad)
    with pytest.raises(ValueError) as caught:
        calls().call(submit, "a step")
    assert caught.value is bad and submit.calls == 1
    errors = [ConnectionResetError(str(n)) for n in range(5)]
    submit = Submitter(*errors)
    with pytest.raises(ConnectionResetError) as caught:
        calls().call(submit, "a step")
    assert caught.value is errors[3] and submit.calls == 4


def test_a_wait_past_the_request_timeout_fails_once_with_the_key_to_raise():
    pending: list[Future] = []

    def submit() -> Future:
        pending.append(Future())
        return pending[-1]

    with pytest.raises(
        TimeoutError,
        match=r"Service did not finish a step within 0\.01 s.*"
        r"request_timeout_s",
    ):
        calls().call(submit, "a step")
    assert len(pending) == 1


def lost_in_a_wrapper() -> Exception:
    try:
        raise ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")
    except ssl.SSLError as exc:
        try:
            raise RuntimeError("request failed") from exc
        except RuntimeError as wrapped:
            return wrapped


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (ssl.SSLError(1, "bad record mac"), True),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), True),
        (TimeoutError("read timed out"), True),
        (lost_in_a_wrapper(), True),
        (ValueError("bad datum"), False),
        (ConnectionResetError("peer"), False),
    ],
)
def test_a_lost_answer_is_a_tls_error_or_a_timeout_among_the_causes(error, lost):
    assert lost_answer(error) is lost


def test_a_lost_answer_is_retried_only_for_an_idempotent_request():
    read = Submitter(ssl.SSLError(1, "bad record mac"), TimeoutError("read timed out"))
    retries: list[int] = []
    assert calls().call(read, "scoring", retries, idempotent=True) == "ok"
    assert read.calls == 3 and retries == [1, 2]
    step = Submitter(ssl.SSLError(1, "bad record mac"))
    with pytest.raises(ssl.SSLError):
        calls().call(step, "optim_step")
    assert step.calls == 1


def test_an_idempotent_request_is_sent_again_after_a_wait_past_the_request_timeout():
    pending: list[Future] = []

    def submit() -> Future:
        pending.append(Future() if len(pending) < 1 else done("ok"))
        return pending[-1]

    assert calls().call(submit, "loading a checkpoint", idempotent=True) == "ok"
    assert len(pending) == 2


def test_sampling_retries_a_lost_answer():
    service = calls()
    failures = [ssl.SSLError(1, "bad record mac"), TimeoutError()]

    async def once() -> str:
        if failures:
            raise failures.pop(0)
        return "sample"

    assert asyncio.run(service.sample(once, "a sampling request")) == "sample"
    assert service.take_sampler_retries() == 2


def test_sampling_retries_are_counted_until_taken():
    service = calls()
    failures = [ConnectionResetError(), ConnectionResetError()]

    async def once() -> str:
        if failures:
            raise failures.pop(0)
        return "sample"

    assert asyncio.run(service.sample(once, "a sampling request")) == "sample"
    assert service.take_sampler_retries() == 2
    assert service.take_sampler_retries() == 0


class HostedSettings(ManagedServiceSettings):
    model_config = ConfigDict(extra="forbid")

    model: str = "m"


def test_base_model_is_read_as_model_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match=r"rename the key: model = 'owner/x'"):
        settings = HostedSettings(base_model="owner/x")
    assert settings.model == "owner/x"
    with pytest.raises(ValidationError, match="both model and base_model are set"):
        HostedSettings(model="owner/x", base_model="owner/y")


def test_base_model_stays_unknown_to_settings_without_a_model_key():
    class Other(ManagedServiceSettings):
        model_config = ConfigDict(extra="forbid")

    with pytest.raises(ValidationError, match="base_model"):
        Other(base_model="owner/x")
