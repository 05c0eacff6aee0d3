"""The chart's MinIO tenants hook (charts/spotray/files/minio-tenants.sh) against a real MinIO.

Each tenant namespace gets a MinIO user that can do what spotray's store does in its own bucket
(check, list, small records, multipart uploads, hashed downloads, deletes) and nothing anywhere
else: not another tenant's bucket, not listing buckets, not making one. The hook can run again at
every upgrade: a second run changes nothing, a rotated key takes effect, and a namespace taken off
the list loses its user. The e2e test (tests/e2e/test_chart_install.py) runs the same script as
the installed chart's Job would, from the objects helm put in the cluster.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from spotray.contract.errors import SpotrayError
from tests.minio import ROOT_PASSWORD, ROOT_USER, Minio, minio_server, run_tenants_script

pytestmark = pytest.mark.integration

TEAM_A, TEAM_B = "spotray-tenant-team-a", "spotray-tenant-team-b"
KEYS = {TEAM_A: "a" * 40, TEAM_B: "b" * 40}
PAIRS = [f"{TEAM_A}=team-a", f"{TEAM_B}=team-b-runs"]


@pytest.fixture(scope="module")
def minio(tmp_path_factory: pytest.TempPathFactory) -> Minio:  # type: ignore[misc]
    with minio_server(tmp_path_factory.mktemp("minio")) as server:
        yield server


def root_env(minio: Minio, password: str = ROOT_PASSWORD) -> dict[str, str]:
    return {"MINIO_URL": minio.url, "MINIO_ROOT_USER": ROOT_USER, "MINIO_ROOT_PASSWORD": password}


def client(minio: Minio, user: str, key: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=minio.url,
        aws_access_key_id=user,
        aws_secret_access_key=key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )


def error_code(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ClientError) as refused:
        call()
    return str(refused.value.response["Error"]["Code"])


def test_each_tenant_does_what_spotray_does_in_its_own_bucket_and_nothing_elsewhere(
    minio: Minio, tmp_path: Path
) -> None:
    result = run_tenants_script(tmp_path, PAIRS, KEYS, root_env(minio))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"tenant {TEAM_A}: bucket team-a only" in result.stdout
    assert f"tenant {TEAM_B}: bucket team-b-runs only" in result.stdout

    own = minio.store("s3://team-a/runs/demo", TEAM_A, KEYS[TEAM_A])
    own.check()
    own.put_bytes("progress.json", b"{}")
    big = tmp_path / "model.safetensors"
    big.write_bytes(bytes(range(256)) * (20 * 4096))  # 20 MiB: a multipart upload (16 MiB parts)
    own.upload_files([(big, "checkpoint-10/model.safetensors")])
    assert {i.key for i in own.list()} == {"progress.json", "checkpoint-10/model.safetensors"}
    assert own.get_bytes("progress.json") == b"{}"
    hashes = own.download_files([("checkpoint-10/model.safetensors", tmp_path / "back")])
    assert hashes[tmp_path / "back"] == hashlib.sha256(big.read_bytes()).hexdigest()
    own.delete(["checkpoint-10/model.safetensors"])
    assert [i.key for i in own.list()] == ["progress.json"]

    # Another tenant's bucket, through spotray's store: a refusal that names the fix.
    with pytest.raises(SpotrayError, match=r"refused the credentials \(access key '\.\.\.am-a'\)") as refused:
        minio.store("s3://team-b-runs/runs/x", TEAM_A, KEYS[TEAM_A]).check()
    assert "may read and write s3://team-b-runs" in str(refused.value)
    a = client(minio, TEAM_A, KEYS[TEAM_A])
    assert error_code(lambda: a.put_object(Bucket="team-b-runs", Key="x", Body=b"x")) == "AccessDenied"
    assert error_code(lambda: a.get_object(Bucket="team-b-runs", Key="x")) == "AccessDenied"
    # MinIO answers ListBuckets with the buckets a user may use: the others stay unnamed.
    assert [bucket["Name"] for bucket in a.list_buckets()["Buckets"]] == ["team-a"]
    assert error_code(lambda: a.create_bucket(Bucket="team-a-second")) == "AccessDenied"
    assert error_code(lambda: a.delete_bucket(Bucket="team-a")) == "AccessDenied"
    assert error_code(lambda: a.put_bucket_policy(Bucket="team-a", Policy="{}")) == "AccessDenied"
    # ... and the other tenant the same, the other way round.
    b = client(minio, TEAM_B, KEYS[TEAM_B])
    assert error_code(lambda: b.get_object(Bucket="team-a", Key="runs/demo/progress.json")) == "AccessDenied"
    b.put_object(Bucket="team-b-runs", Key="runs/x/progress.json", Body=b"{}")


def test_running_again_changes_nothing_a_rotated_key_takes_effect_and_a_dropped_namespace_loses_its_user(
    minio: Minio, tmp_path: Path
) -> None:
    for _ in range(2):
        result = run_tenants_script(tmp_path, PAIRS, KEYS, root_env(minio))
        assert result.returncode == 0, result.stdout + result.stderr
    client(minio, TEAM_A, KEYS[TEAM_A]).put_object(Bucket="team-a", Key="kept", Body=b"kept")
    client(minio, TEAM_B, KEYS[TEAM_B]).put_object(Bucket="team-b-runs", Key="runs/x/progress.json", Body=b"{}")

    rotated = {TEAM_A: "c" * 40}
    result = run_tenants_script(tmp_path, PAIRS[:1], rotated, root_env(minio))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"tenant {TEAM_B}: removed (no longer in minio.tenants)" in result.stdout
    b = client(minio, TEAM_B, KEYS[TEAM_B])
    assert error_code(lambda: b.put_object(Bucket="team-b-runs", Key="x", Body=b"x")) == "InvalidAccessKeyId"
    old = client(minio, TEAM_A, KEYS[TEAM_A])
    assert error_code(lambda: old.get_object(Bucket="team-a", Key="kept")) in {"SignatureDoesNotMatch", "AccessDenied"}
    # The bucket and its objects stay: taking a namespace off the list never deletes checkpoints.
    assert client(minio, TEAM_A, rotated[TEAM_A]).get_object(Bucket="team-a", Key="kept")["Body"].read() == b"kept"
    root = client(minio, ROOT_USER, ROOT_PASSWORD)
    assert root.get_object(Bucket="team-b-runs", Key="runs/x/progress.json")["Body"].read() == b"{}"


def test_the_longest_namespace_name_makes_a_valid_user(minio: Minio, tmp_path: Path) -> None:
    namespace = "n" + "-x" * 30 + "z"  # 63 characters, the most a namespace name has
    user = f"spotray-tenant-{namespace}"
    # The bucket is the namespace's name by default, which is a valid bucket name too.
    result = run_tenants_script(tmp_path, [f"{user}={namespace}"], {user: "d" * 40}, root_env(minio))
    assert result.returncode == 0, result.stdout + result.stderr
    minio.store(f"s3://{namespace}/runs/x", user, "d" * 40).put_bytes("p", b"1")


def test_wrong_root_credentials_or_a_missing_key_fail_with_the_fix(minio: Minio, tmp_path: Path) -> None:
    result = run_tenants_script(tmp_path, PAIRS, KEYS, root_env(minio, password="not-the-root-password"))
    assert result.returncode != 0
    assert "cannot log in to MinIO" in result.stderr
    assert "s3.existingSecret" in result.stderr
    result = run_tenants_script(tmp_path, PAIRS, {TEAM_A: KEYS[TEAM_A]}, root_env(minio))
    assert result.returncode != 0
    assert f"no secret key for {TEAM_B}" in result.stderr
