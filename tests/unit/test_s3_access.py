"""Which Secret and endpoint a run may use (controller/s3_access.py), and what the controller's reads get."""

from __future__ import annotations

import pytest

from spotray.contract.errors import SpotrayError
from spotray.contract.names import S3_OPT_IN_LABEL
from spotray.contract.spec import TrainingRun, parse_training_run
from spotray.controller.config import ControllerConfig
from spotray.controller.run_store import s3_access_refusal, store_config
from spotray.controller.s3_access import SecretView, endpoint_refusal, normalized_endpoint

pytestmark = pytest.mark.unit

ENDPOINT = "http://minio.storage:9000"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}


def run(secret_ref: str | None = "team-s3") -> TrainingRun:
    checkpoint = {"uri": "s3://bucket/runs/r", **({"secretRef": secret_ref} if secret_ref else {})}
    document = {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "r", "namespace": "ml"},
        "spec": {"entrypoint": "python -m spotray.jobs.gpt2", "checkpoint": checkpoint},
    }
    return parse_training_run(document)


def config(**env: str) -> ControllerConfig:
    return ControllerConfig.from_env({"SPOTRAY_S3_ENDPOINT": ENDPOINT, **env})


class OneSecret:
    """The one call store_config makes of the cluster."""

    def __init__(self, secret: SecretView | None) -> None:
        self.secret = secret

    def read_secret(self, namespace: str, name: str, max_age_s: float = 0.0) -> SecretView | None:
        return self.secret


def labelled(data: dict[str, str] | None = None) -> SecretView:
    return SecretView("team-s3", {S3_OPT_IN_LABEL: "true"}, {**CREDENTIALS, **(data or {})})


def test_a_labelled_secret_with_an_allowed_endpoint_is_used() -> None:
    assert s3_access_refusal(run(), labelled({"AWS_ENDPOINT_URL": ENDPOINT + "/"}), config()) is None
    used = store_config(run(), OneSecret(labelled()), config())  # type: ignore[arg-type]
    assert (used.access_key_id, used.endpoint_url, used.anonymous) == ("AKIAIOSFODNN7EXAMPLE", ENDPOINT, False)


def test_a_missing_secret_says_how_to_create_and_label_it() -> None:
    reason, message = s3_access_refusal(run(), None, config()) or ("", "")
    assert reason == "SecretMissing"
    assert "kubectl create secret generic team-s3 -n ml" in message
    assert f"kubectl label secret team-s3 -n ml {S3_OPT_IN_LABEL}=true" in message


def test_a_secret_without_the_label_is_neither_read_nor_injected() -> None:
    unlabelled = SecretView("team-s3", {"team": "ml"}, CREDENTIALS)
    reason, message = s3_access_refusal(run(), unlabelled, config()) or ("", "")
    assert reason == "SecretNotAllowed"
    assert "not marked for use by spotray" in message
    with pytest.raises(SpotrayError, match="not marked"):
        store_config(run(), OneSecret(unlabelled), config())  # type: ignore[arg-type]
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in repr(unlabelled)


@pytest.mark.parametrize(
    "settings", [{"SPOTRAY_S3_SECRET": "team-s3"}, {"SPOTRAY_ALLOWED_S3_SECRETS": "other, team-s3"}]
)
def test_a_secret_the_operator_named_needs_no_label(settings: dict[str, str]) -> None:
    assert s3_access_refusal(run(), SecretView("team-s3", {}, CREDENTIALS), config(**settings)) is None


def test_an_endpoint_the_operator_did_not_allow_is_refused_before_any_request() -> None:
    forged = labelled({"AWS_ENDPOINT_URL": "http://169.254.169.254/latest"})
    reason, message = s3_access_refusal(run(), forged, config()) or ("", "")
    assert reason == "EndpointNotAllowed"
    assert "http://169.254.169.254" in message
    assert "s3.allowedEndpoints" in message
    with pytest.raises(SpotrayError):
        store_config(run(), OneSecret(forged), config())  # type: ignore[arg-type]
    allowed = config(SPOTRAY_ALLOWED_S3_ENDPOINTS="http://169.254.169.254")
    assert s3_access_refusal(run(), forged, allowed) is None


def test_a_run_with_no_secret_is_read_unsigned_never_with_the_controllers_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIACONTROLLERSOWN00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "controllers-own-secret")
    used = store_config(run(secret_ref=None), OneSecret(None), config())  # type: ignore[arg-type]
    assert used.anonymous
    assert (used.access_key_id, used.secret_access_key) == (None, None)


@pytest.mark.parametrize(
    ("url", "normal"),
    [("HTTP://MinIO:9000/", "http://minio:9000"), ("https://s3.example.com/bucket/key", "https://s3.example.com")],
)
def test_endpoints_are_compared_by_scheme_host_and_port(url: str, normal: str) -> None:
    assert normalized_endpoint(url) == normal
    assert endpoint_refusal(url, "s", allowed=(normal,)) is None
    assert endpoint_refusal(None, "s", allowed=()) is None  # AWS S3 itself
