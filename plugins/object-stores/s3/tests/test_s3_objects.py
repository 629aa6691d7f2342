"""The ``s3`` object store against moto's S3 server: the conformance suite, the layout in the
bucket, create-if-absent across processes, errors and retries."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from rllm_core.errors import ObjectNotFoundError, StorageError
from rllm_core.kit.retry import RetrySettings
from rllm_core.testing.suites.storage import ObjectStoreConformance
from rllm_object_store_s3.objects import PUT_ID, S3Credentials, S3ObjectStore

NO_WAIT = RetrySettings(retries=2, retry_backoff_s=0.0)


def _store(endpoint, bucket, **options):
    options.setdefault("retry", NO_WAIT)
    return S3ObjectStore(
        bucket,
        credentials=S3Credentials(endpoint.access_key_id, endpoint.secret_access_key),
        endpoint_url=endpoint.url,
        region=endpoint.region,
        **options,
    )


def _factory_source(endpoint, bucket, prefix):
    return textwrap.dedent(
        f"""
        from rllm_object_store_s3.objects import S3Credentials, S3ObjectStore

        def open_store(location):
            return S3ObjectStore(
                {bucket!r},
                credentials=S3Credentials({endpoint.access_key_id!r},
                                          {endpoint.secret_access_key!r}),
                endpoint_url={endpoint.url!r},
                region={endpoint.region!r},
                prefix={prefix!r},
            )
        """
    )


class TestS3ObjectStore(ObjectStoreConformance):
    @pytest.fixture
    def object_store(self, s3_server, s3_bucket):
        store = _store(s3_server, s3_bucket)
        yield store
        store.close()

    @pytest.fixture
    def subprocess_factory_source(self, s3_server, s3_bucket):
        return _factory_source(s3_server, s3_bucket, "crash-test")


class TestS3ObjectStoreUnderAPrefix(ObjectStoreConformance):
    @pytest.fixture
    def object_store(self, s3_server, s3_bucket):
        # Objects outside the prefix, before and after it in key order, must stay invisible.
        outside = _store(s3_server, s3_bucket)
        for key in ("a", "runs/p", "runs/q0", "runs/q-x", "runs/r", "z"):
            outside.put(key, b"outside")
        outside.close()
        store = _store(s3_server, s3_bucket, prefix="runs/q/")
        yield store
        store.close()


def test_keys_live_under_the_prefix_in_the_bucket(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket, prefix="runs/q")
    plain = _store(s3_server, s3_bucket)
    store.put("cuts/000010.json", b"{}")
    assert plain.list() == ["runs/q/cuts/000010.json"]
    assert plain.get("runs/q/cuts/000010.json") == b"{}"
    assert store.list("cuts/", start_after="cuts/000009.json") == ["cuts/000010.json"]
    assert repr(store) == (
        f"S3ObjectStore(bucket={s3_bucket!r}, prefix='runs/q', endpoint_url={s3_server.url!r})"
    )


def test_put_if_absent_tags_the_object_it_creates(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket)
    assert store.put_if_absent("lock", b"mine") is True
    head = store._client.head_object(Bucket=s3_bucket, Key="lock")
    assert len(head["Metadata"][PUT_ID]) == 32


def test_a_key_too_long_for_s3_is_refused(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket, prefix="p" * 200)
    key = "/".join(["x" * 200] * 5)
    with pytest.raises(ValueError, match="1024 bytes S3 allows"):
        store.put(key, b"x")
    assert store.list() == []


def test_listing_follows_every_page(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket, page_size=7)
    keys = [f"many/{i:03d}" for i in range(30)]
    for key in reversed(keys):
        store.put(key, b"")
    store.put("other", b"")
    assert store.list("many/") == keys
    assert store.list("many/", start_after="many/009") == keys[10:]
    assert store.list(start_after="many/") == [*keys, "other"]


_WRITER = """
import sys
exec(sys.argv[1])
store = open_store("")
won = [store.put_if_absent(f"round/{r}", sys.argv[2].encode()) for r in range(int(sys.argv[3]))]
print("".join("1" if w else "0" for w in won))
"""


def test_one_writer_process_creates_each_key(s3_server, s3_bucket):
    writers, rounds = 4, 30
    source = _factory_source(s3_server, s3_bucket, "race")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, source, f"writer-{w}", str(rounds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(writers)
    ]
    outcomes = [p.communicate(timeout=120)[0].strip() for p in processes]
    assert [p.returncode for p in processes] == [0] * writers
    store = _store(s3_server, s3_bucket, prefix="race")
    assert store.list("round/") == sorted(f"round/{r}" for r in range(rounds))
    for r in range(rounds):
        winners = [w for w in range(writers) if outcomes[w][r] == "1"]
        assert len(winners) == 1, f"round {r}: writers {winners} were each told they created it"
        assert store.get(f"round/{r}") == f"writer-{winners[0]}".encode()


# ---------------------------------------------------------------- errors


def test_missing_object_names_bucket_and_key(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket, prefix="runs")
    with pytest.raises(ObjectNotFoundError, match=rf"get of key 'nope' in s3://{s3_bucket}/runs/"):
        store.get("nope")


def test_missing_bucket_says_to_create_it(s3_server):
    store = _store(s3_server, "no-such-bucket-here")
    for call in (
        lambda: store.put("k", b"x"),
        lambda: store.get("k"),
        lambda: store.delete("k"),
        lambda: store.list(),
        lambda: store.put_if_absent("k", b"x"),
    ):
        with pytest.raises(StorageError, match="bucket 'no-such-bucket-here' does not exist"):
            call()


def test_unreachable_endpoint_is_retried_then_reported(s3_server):
    waits = []
    store = S3ObjectStore(
        "bucket",
        credentials=S3Credentials("k", "s"),
        endpoint_url="http://127.0.0.1:9",
        retry=RetrySettings(retries=2, retry_backoff_s=0.5),
        timeout_s=2,
        sleep=waits.append,
    )
    with pytest.raises(StorageError, match=r"failed after 3 attempt\(s\).*check endpoint_url"):
        store.put("k", b"x")
    assert len(waits) == 2


def test_a_lost_answer_still_reports_the_creator(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket)
    real_put = store._client.put_object
    from botocore.exceptions import ReadTimeoutError

    def put_then_lose_the_answer(**arguments):
        real_put(**arguments)
        store._client.put_object = real_put
        raise ReadTimeoutError(endpoint_url=s3_server.url)

    store._client.put_object = put_then_lose_the_answer
    assert store.put_if_absent("lock", b"mine") is True
    assert store.put_if_absent("lock", b"again") is False
    assert store.get("lock") == b"mine"


def test_a_lost_request_does_not_claim_another_writers_object(s3_server, s3_bucket):
    store = _store(s3_server, s3_bucket)
    rival = _store(s3_server, s3_bucket)
    real_put = store._client.put_object
    from botocore.exceptions import EndpointConnectionError

    def lose_the_request_while_a_rival_writes(**arguments):
        store._client.put_object = real_put
        assert rival.put_if_absent("lock", b"rival") is True
        raise EndpointConnectionError(endpoint_url=s3_server.url)

    store._client.put_object = lose_the_request_while_a_rival_writes
    assert store.put_if_absent("lock", b"mine") is False
    assert store.get("lock") == b"rival"


def test_a_conditional_write_conflict_is_retried(s3_server, s3_bucket):
    waits = []
    store = _store(s3_server, s3_bucket, sleep=waits.append)
    real_put = store._client.put_object
    from botocore.exceptions import ClientError

    def conflict_once(**arguments):
        store._client.put_object = real_put
        raise ClientError(
            {
                "Error": {"Code": "ConditionalRequestConflict", "Message": "in flight"},
                "ResponseMetadata": {"HTTPStatusCode": 409},
            },
            "PutObject",
        )

    store._client.put_object = conflict_once
    assert store.put_if_absent("lock", b"mine") is True
    assert len(waits) == 1
    assert store.get("lock") == b"mine"
