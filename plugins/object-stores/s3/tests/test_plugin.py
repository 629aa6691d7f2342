"""The entry module: what it registers, building from plan keys, and where credentials come
from."""

from __future__ import annotations

import pydantic
import pytest
from rllm_core.errors import PlanError, StorageError
from rllm_core.plugins import PluginManager
from rllm_object_store_s3 import objects, plugin
from rllm_object_store_s3.objects import S3ObjectStore


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="s3", distribution="rllm-object-store-s3")
    return pm


@pytest.fixture
def no_aws_environment(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_builds_from_plan_keys_against_the_endpoint_they_name(manager, s3_server, s3_bucket):
    store = manager.get("object_store", "s3").build(
        s3_server.store_config(s3_bucket, prefix="runs/q/")
    )
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.endpoint_url) == (s3_bucket, "runs/q", s3_server.url)
    store.put("k", b"v")
    assert store.get("k") == b"v"
    store.close()


def test_credentials_from_the_variables_the_plan_names(
    manager, s3_server, s3_bucket, monkeypatch, no_aws_environment
):
    monkeypatch.setenv("MY_KEY", s3_server.access_key_id)
    monkeypatch.setenv("MY_SECRET", s3_server.secret_access_key)
    values = {
        "bucket": s3_bucket,
        "endpoint_url": s3_server.url,
        "access_key_id_env": "MY_KEY",
        "secret_access_key_env": "MY_SECRET",
    }
    store = manager.get("object_store", "s3").build(values)
    store.put("k", b"v")
    assert store._credentials.source == "$MY_KEY and $MY_SECRET"
    assert store._credentials.session_token is None
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    store = manager.get("object_store", "s3").build(values)
    assert store._credentials.session_token == "token"
    assert store._credentials.source == "$MY_KEY and $MY_SECRET and $AWS_SESSION_TOKEN"


def test_missing_credentials_name_the_variable_to_set(manager, no_aws_environment):
    spec = manager.get("object_store", "s3")
    with pytest.raises(PlanError) as caught:
        spec.build({"bucket": "rl-bucket", "secret_access_key_env": "R2_SECRET"})
    message = str(caught.value)
    assert "$AWS_ACCESS_KEY_ID is not set" in message
    assert "export AWS_ACCESS_KEY_ID=" in message
    assert "$R2_SECRET is not set" in message
    assert [issue.key for issue in caught.value.issues] == [
        "access_key_id_env",
        "secret_access_key_env",
    ]


def test_aws_config_files_and_profiles_are_never_read(
    manager, s3_server, s3_bucket, tmp_path, monkeypatch, no_aws_environment
):
    config = tmp_path / "config"
    config.write_text("[default]\nendpoint_url = http://127.0.0.1:9\n[profile p]\nregion = x\n")
    credentials = tmp_path / "credentials"
    credentials.write_text("[default]\naws_access_key_id = from-file\naws_secret_access_key = f\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    # A session made now, with all of the above in sight.
    monkeypatch.setattr(objects, "_shared_session", None)
    spec = manager.get("object_store", "s3")
    with pytest.raises(PlanError, match=r"\$AWS_ACCESS_KEY_ID is not set"):
        spec.build({"bucket": s3_bucket})
    store = spec.build(s3_server.store_config(s3_bucket))
    store.put("k", b"v")
    assert store.list() == ["k"]


def test_refused_credentials_say_where_they_came_from(
    manager, s3_server, s3_bucket, monkeypatch, no_aws_environment
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    store = manager.get("object_store", "s3").build(
        {"bucket": s3_bucket, "endpoint_url": s3_server.url}
    )
    with s3_server.checking_credentials():
        with pytest.raises(StorageError) as caught:
            store.put("k", b"v")
        message = str(caught.value)
        assert "HTTP 403 InvalidAccessKeyId" in message
        assert "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY" in message
        assert f"put of key 'k' in s3://{s3_bucket}/ at {s3_server.url}" in message
        with pytest.raises(StorageError, match="grant s3:ListBucket"):
            store.exists("k")


def test_secrets_do_not_show_in_the_config(manager):
    config = manager.get("object_store", "s3").validate_config(
        {"bucket": "rl-bucket", "access_key_id": "AKIA1", "secret_access_key": "hush"}
    )
    assert "hush" not in repr(config)
    assert "hush" not in str(config.model_dump(mode="json"))


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"bucket": "b"},
        {"bucket": "a/b"},
        {"bucket": "rl-bucket", "path": "p"},
        {"bucket": "rl-bucket", "prefix": "/abs"},
        {"bucket": "rl-bucket", "prefix": "a//b"},
        {"bucket": "rl-bucket", "prefix": "a/../b"},
        {"bucket": "rl-bucket", "endpoint_url": "127.0.0.1:9000"},
        {"bucket": "rl-bucket", "access_key_id_env": "NOT A NAME"},
        {"bucket": "rl-bucket", "timeout_s": 0},
        {"bucket": "rl-bucket", "retries": -1},
    ],
)
def test_bad_plan_keys_are_rejected(manager, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("object_store", "s3").validate_config(values)


def test_prefix_is_a_folder(manager):
    spec = manager.get("object_store", "s3")
    assert spec.validate_config({"bucket": "rl-bucket", "prefix": "runs/q/"}).prefix == "runs/q"
    assert spec.validate_config({"bucket": "rl-bucket", "prefix": ""}).prefix == ""
