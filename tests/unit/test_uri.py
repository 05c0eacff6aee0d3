import pytest

from spotray.contract.errors import InvalidUriError
from spotray.contract.uris import StorageUri, parse_uri

pytestmark = [pytest.mark.unit, pytest.mark.core]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://bucket/runs/a", StorageUri("s3", "bucket", "runs/a")),
        ("s3://bucket/runs/a/", StorageUri("s3", "bucket", "runs/a")),
        ("s3://bucket", StorageUri("s3", "bucket", "")),
        ("s3a://my.bucket-1/x", StorageUri("s3", "my.bucket-1", "x")),
        ("file:///mnt/nfs/runs", StorageUri("file", "", "/mnt/nfs/runs")),
        ("/mnt/nfs/runs/", StorageUri("file", "", "/mnt/nfs/runs")),
    ],
)
def test_parse_valid(text: str, expected: StorageUri) -> None:
    assert parse_uri(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("s3:/bucket/x", "names no bucket"),
        ("s3:///x", "names no bucket"),
        ("s3://Bucket_Upper/x", "not a valid S3 bucket name"),
        ("s3://ab/x", "not a valid S3 bucket name"),
        ("s3://bucket/x?versionId=1", "query or fragment"),
        ("gs://bucket/x", "scheme 'gs'"),
        ("bucket/x", "scheme 'none'"),
        ("file://relative/path", "absolute path"),
    ],
)
def test_parse_invalid_names_problem_and_fix(text: str, says: str) -> None:
    with pytest.raises(InvalidUriError) as caught:
        parse_uri(text)
    message = str(caught.value)
    assert says in message
    assert "fix:" in message


def test_join_and_str_round_trip() -> None:
    uri = parse_uri("s3://bucket/runs")
    assert str(uri.join("checkpoint-10", "model.safetensors")) == "s3://bucket/runs/checkpoint-10/model.safetensors"
    assert str(parse_uri("s3://bucket").join("a/")) == "s3://bucket/a"
    assert str(parse_uri("/data/runs").join("checkpoint-1")) == "file:///data/runs/checkpoint-1"
    for text in ("s3://bucket/runs/a", "file:///mnt/x"):
        assert str(parse_uri(text)) == text
