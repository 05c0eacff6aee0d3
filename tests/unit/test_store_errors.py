"""Fault classification and the messages users see; botocore exceptions are built by hand here."""

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from spotray.contract.errors import (
    BucketMissingError,
    StoreCredentialsError,
    StoreRequestError,
    StoreUnreachableError,
)
from spotray.contract.uris import parse_uri
from spotray.train.storage.store import StoreConfig, describe_failure, is_transient, transient_fault_summary

pytestmark = [pytest.mark.unit, pytest.mark.core]

CONFIG = StoreConfig(endpoint_url="http://127.0.0.1:9000", access_key_id="AKIAIOSFODNN7EXAMPLE", secret_access_key="s")
URI = parse_uri("s3://ckpts/run")


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="http://x"),
        ReadTimeoutError(endpoint_url="http://x"),
        client_error("SlowDown", 503),
        client_error("InternalError", 500),
        client_error("Whatever", 502),
        client_error("TooManyRequests", 429),
    ],
)
def test_transient(error: Exception) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        client_error("AccessDenied", 403),
        client_error("NoSuchBucket", 404),
        client_error("InvalidAccessKeyId", 403),
        client_error("NoSuchKey", 404),
        ValueError("x"),
    ],
)
def test_not_transient(error: Exception) -> None:
    assert not is_transient(error)


def test_a_transient_fault_is_named_as_the_store_answered() -> None:
    assert transient_fault_summary(client_error("SlowDown", 503)) == "503 SlowDown"
    unread = ClientError(
        {"Error": {"Code": "500", "Message": "Internal Server Error"}, "ResponseMetadata": {"HTTPStatusCode": 500}},
        "Op",
    )
    assert transient_fault_summary(unread) == "500 Internal Server Error"
    assert "Could not connect" in transient_fault_summary(EndpointConnectionError(endpoint_url="http://x"))


def test_missing_bucket_says_how_to_create_it() -> None:
    error = describe_failure(client_error("NoSuchBucket", 404), CONFIG, URI, "list s3://ckpts/run")
    assert isinstance(error, BucketMissingError)
    assert "bucket 'ckpts' does not exist at http://127.0.0.1:9000" in str(error)
    assert "s3 mb s3://ckpts" in str(error)
    assert "create_bucket=True" in str(error)


def test_head_bucket_404_is_a_missing_bucket() -> None:
    error = describe_failure(client_error("404", 404), CONFIG, URI, "check bucket s3://ckpts")
    assert isinstance(error, BucketMissingError)


@pytest.mark.parametrize("code", ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"])
def test_credentials(code: str) -> None:
    error = describe_failure(client_error(code, 403), CONFIG, URI, "write s3://ckpts/run/x")
    assert isinstance(error, StoreCredentialsError)
    assert "access key '...MPLE'" in str(error), "the key id by its last four characters"
    assert "AKIAIOSFODNN7EXAMPLE" not in str(error)
    assert "AWS_SECRET_ACCESS_KEY" in str(error)


def test_no_credentials_at_all() -> None:
    error = describe_failure(NoCredentialsError(), CONFIG, URI, "list")
    assert isinstance(error, StoreCredentialsError)
    assert "no S3 credentials" in str(error)


def test_unreachable_names_endpoint_variable() -> None:
    error = describe_failure(EndpointConnectionError(endpoint_url="http://127.0.0.1:9000"), CONFIG, URI, "list")
    assert isinstance(error, StoreUnreachableError)
    assert "http://127.0.0.1:9000" in str(error)
    assert "AWS_ENDPOINT_URL" in str(error)


def test_other_refusals_are_not_retried_blindly() -> None:
    error = describe_failure(client_error("InvalidArgument", 400), CONFIG, URI, "write")
    assert isinstance(error, StoreRequestError)
    assert "retrying will not help" in str(error)


def test_config_from_env_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://streaming:1")
    assert StoreConfig.from_env().endpoint_url == "http://streaming:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://aws:2")
    assert StoreConfig.from_env().endpoint_url == "http://aws:2"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://aws-s3:3")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    config = StoreConfig.from_env()
    assert config.endpoint_url == "http://aws-s3:3"
    assert config.region == "eu-west-1"


def test_the_secret_key_and_session_token_never_appear_in_a_repr() -> None:
    config = StoreConfig(access_key_id="AKIAIOSFODNN7EXAMPLE", secret_access_key="wJalrXUtnFEMI", session_token="tok3n")
    assert "wJalrXUtnFEMI" not in repr(config)
    assert "tok3n" not in repr(config)


def test_a_servers_error_text_is_bounded_before_it_reaches_a_message() -> None:
    hostile = ClientError(
        {"Error": {"Code": "InvalidRequest", "Message": "x" * 50_000}, "ResponseMetadata": {"HTTPStatusCode": 400}},
        "Op",
    )
    message = str(describe_failure(hostile, CONFIG, URI, "read s3://ckpts/run/a"))
    assert len(message) < 1_000
    assert "[cut]" in message
