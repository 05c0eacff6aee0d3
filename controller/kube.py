"""The few Kubernetes calls the controller makes, over the official client, with 404/409 made explicit.

Every call carries a request timeout (``REQUEST_TIMEOUT``: connect, read): a half-open connection
to the API server must fail one reconcile, which is retried, not hang it and its run for ever.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from spotray.contract.names import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    RAY_GROUP,
    RAY_VERSION,
    RAYCLUSTER_PLURAL,
    RAYJOB_PLURAL,
    VERSION,
)
from spotray.contract.status import format_date_time
from spotray.contract.sweep import SWEEP_PLURAL
from spotray.controller.s3_access import SecretView
from spotray.decisions.vocabulary import Event, RayJobRefusal

log = logging.getLogger(__name__)

COMPONENT = "spotray-controller"
# (connect, read) seconds for every API call.
REQUEST_TIMEOUT = (5.0, 30.0)


class RayJobRefusedError(Exception):
    """The API server answered a RayJob create with an error other than 409: it did not create it."""

    def __init__(self, refusal: RayJobRefusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


def refusal_of(error: ApiException) -> RayJobRefusal:
    """The API server's metav1.Status in ``error`` (its reason and words), or what the client saw."""
    try:
        answer = json.loads(error.body or "")
    except (TypeError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        answer = {}
    return RayJobRefusal(
        code=error.status,
        reason=str(answer.get("reason") or error.reason or "Error"),
        message=str(answer.get("message") or error.body or error.reason or ""),
    )


class Cluster:
    """TrainingRuns, RayJobs, Secrets and Events in one API server."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self._secrets: dict[tuple[str, str], tuple[float, SecretView]] = {}  # (namespace, name) -> (read at, it)
        self._secrets_lock = threading.Lock()

    def _get(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A custom object, or None when it does not exist."""
        try:
            found = self.custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return cast(dict[str, Any], found)

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(GROUP, VERSION, PLURAL, namespace, name)

    def list_runs(self, namespaces: tuple[str, ...]) -> dict[tuple[str, str], str]:
        """(namespace, name) -> resourceVersion of every TrainingRun in ``namespaces`` (all when empty)."""
        custom, timeout = self.custom, REQUEST_TIMEOUT
        if namespaces:
            pages = [
                custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _request_timeout=timeout)
                for ns in namespaces
            ]
        else:
            pages = [custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=timeout)]
        return {
            (item["metadata"]["namespace"], item["metadata"]["name"]): item["metadata"]["resourceVersion"]
            for page in pages
            for item in cast(dict[str, Any], page).get("items", [])
        }

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> bool:
        """Merge ``status`` into the run's; with ``resource_version``, only into the object as it was then.

        False (nothing written) when it changed since: edited, or deleted and created again under the
        same name, whose status a write meant for the deleted one took over, attempts and budgets
        spent included (issue #69). The API server checks a status patch's resourceVersion (409); a
        uid in the patch would be ignored, as the status subresource keeps the object's metadata.
        """
        patch: dict[str, Any] = {"status": status}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, patch, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status == 409 and resource_version:
                return False
            raise
        return True

    # -- sweeps: a TrainingSweep and its trials, which are TrainingRuns (controller/sweep_reconcile.py)

    def get_sweep(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(GROUP, VERSION, SWEEP_PLURAL, namespace, name)

    def patch_sweep_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, SWEEP_PLURAL, name, {"status": status}, _request_timeout=REQUEST_TIMEOUT
        )

    def list_labelled_runs(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The TrainingRuns in ``namespace`` that carry all of ``labels`` (one LIST)."""
        return self._list_labelled(GROUP, VERSION, PLURAL, namespace, labels)

    def _list_labelled(
        self, group: str, version: str, plural: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        page = self.custom.list_namespaced_custom_object(
            group,
            version,
            namespace,
            plural,
            label_selector=",".join(f"{key}={value}" for key, value in labels.items()),
            _request_timeout=REQUEST_TIMEOUT,
        )
        return list(cast(dict[str, Any], page).get("items", []))

    def create_run(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a TrainingRun; None when created, else the one that already has its name (its owner
        is the caller's to check). Any other refusal is raised as the ``ApiException`` it is."""
        return self._create_or_namesake(GROUP, VERSION, PLURAL, body)

    def _create_or_namesake(
        self,
        group: str,
        version: str,
        plural: str,
        body: dict[str, Any],
        refused: Callable[[ApiException], Exception] | None = None,
    ) -> dict[str, Any] | None:
        """Create a custom object; None when created, else the object that already has its name (409).
        Gone between the 409 and the read: "exists" with no owner, and the next reconcile retries.
        Any other answer to the create is raised, as ``refused(error)`` when given (not the read's)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(
                group, version, namespace, plural, body, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status != 409:
                if refused is None:
                    raise
                raise refused(error) from error
            existing = self._get(group, version, plural, namespace, name)
            return existing if existing is not None else {"metadata": {"name": name}}
        return None

    def patch_run(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch of a TrainingRun's metadata and spec (a trial stopped or resumed)."""
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, patch, _request_timeout=REQUEST_TIMEOUT
        )

    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, namespace, name)

    def list_rayjobs(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The RayJobs in ``namespace`` that carry all of ``labels`` (one LIST; the chart's role allows it)."""
        return self._list_labelled(RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, namespace, labels)

    def create_rayjob(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create it; None when created, else the RayJob that already has its name.

        The caller decides whether that one is its own (the owner reference's UID), never this.
        Raises ``RayJobRefusedError`` when the API server answers with any other error (a quota, an
        admission policy, the schema): the caller decides what that means for the run.
        """
        return self._create_or_namesake(
            RAY_GROUP, RAY_VERSION, RAYJOB_PLURAL, body, refused=lambda error: RayJobRefusedError(refusal_of(error))
        )

    def create_network_policy(self, body: dict[str, Any]) -> list[str] | None:
        """The run's NetworkPolicy: see ``_create_for_run`` (one left by an earlier attempt is the run's)."""
        policies = self.networking
        return self._create_for_run(
            "NetworkPolicy", policies.create_namespaced_network_policy, policies.read_namespaced_network_policy, body
        )

    def create_checkpoint_key_secret(self, body: dict[str, Any]) -> None:
        """The checkpoint key (controller/checkpoint_key_secret.py), unless a Secret of its name is there: that one
        is the key, whoever made it, and is neither read nor replaced. Any other answer raises
        ``RayJobRefusedError``: the run's RayJob waits for it."""
        name = body["metadata"]["name"]
        try:
            # A dict body is sent as it is (the client serializes dicts and models alike).
            secrets: Any = self.core
            secrets.create_namespaced_secret(body["metadata"]["namespace"], body, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status != 409:
                refusal = refusal_of(error)
                raise RayJobRefusedError(replace(refusal, message=f"Secret {name}: {refusal.message}")) from error

    def _create_for_run(
        self, kind: str, create: Callable[..., Any], read: Callable[..., Any], body: dict[str, Any]
    ) -> list[str] | None:
        """Create ``body``, an object the controller makes for a run under the run's name; None when
        created, else the owner UIDs of the one that already has its name: the caller decides whether
        it is the run's (controller/ownership.py).

        Raises ``RayJobRefusedError`` on any other answer: the run's RayJob waits for it.
        """
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            # A dict body is sent as it is (the client serializes dicts and models alike).
            create(namespace, body, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status != 409:
                refusal = refusal_of(error)
                raise RayJobRefusedError(replace(refusal, message=f"{kind} {name}: {refusal.message}")) from error
        else:
            return None
        return self._owner_uids(read, namespace, name)

    def _owner_uids(self, read: Callable[..., Any], namespace: str, name: str) -> list[str]:
        """The owner UIDs of the object ``read`` returns (a typed read of the client: its models are
        the same in every client version the controller supports); [] when it is gone since (the next
        reconcile creates it again). Only its metadata is looked at."""
        try:
            found = read(name, namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status == 404:
                return []
            raise
        return [str(reference.uid) for reference in (found.metadata.owner_references or [])]

    def delete_rayjob(self, namespace: str, name: str) -> None:
        self._delete_ray_object(RAYJOB_PLURAL, namespace, name)

    def annotate_rayjob(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._annotate_ray_object(RAYJOB_PLURAL, namespace, name, annotations)

    # The run's own RayCluster, kept across its attempts (controller/config.py ray_cluster_per_run).
    def get_ray_cluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(RAY_GROUP, RAY_VERSION, RAYCLUSTER_PLURAL, namespace, name)

    def create_ray_cluster(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create it; None when created, else the RayCluster that already has its name (see ``create_rayjob``)."""
        return self._create_or_namesake(
            RAY_GROUP, RAY_VERSION, RAYCLUSTER_PLURAL, body, refused=lambda error: RayJobRefusedError(refusal_of(error))
        )

    def delete_ray_cluster(self, namespace: str, name: str) -> None:
        self._delete_ray_object(RAYCLUSTER_PLURAL, namespace, name)

    def annotate_ray_cluster(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._annotate_ray_object(RAYCLUSTER_PLURAL, namespace, name, annotations)

    def delete_ray_cluster_worker(self, namespace: str, name: str, group: str, pod: str) -> None:
        """Ask KubeRay to delete worker ``pod`` of the RayCluster's first worker group ``group`` and make a new one.

        A JSON patch of ``scaleStrategy.workersToDelete`` (the replicas unchanged), tested against the
        group's name: the controller may patch a run's RayCluster but not delete pods. A RayCluster
        already gone is no error.
        """
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": group},
            {"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy", "value": {"workersToDelete": [pod]}},
        ]
        try:
            self.custom.patch_namespaced_custom_object(
                RAY_GROUP,
                RAY_VERSION,
                namespace,
                RAYCLUSTER_PLURAL,
                name,
                patch,
                _content_type="application/json-patch+json",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def _delete_ray_object(self, plural: str, namespace: str, name: str) -> None:
        """Delete a RayJob or RayCluster; one already gone is no error."""
        try:
            self.custom.delete_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def _annotate_ray_object(self, plural: str, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge ``annotations`` into a RayJob's or RayCluster's; one already gone is no error."""
        try:
            self.custom.patch_namespaced_custom_object(
                RAY_GROUP,
                RAY_VERSION,
                namespace,
                plural,
                name,
                {"metadata": {"annotations": annotations}},
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def list_attempt_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The pods that carry all of ``labels`` (one LIST), as plain dicts."""
        page = self.core.list_namespaced_pod(
            namespace,
            label_selector=",".join(f"{key}={value}" for key, value in labels.items()),
            _request_timeout=REQUEST_TIMEOUT,
        )
        return [self.core.api_client.sanitize_for_serialization(pod) for pod in page.items]

    def list_scheduled_events(self, namespace: str) -> list[dict[str, Any]]:
        """The scheduler's "Scheduled" Events in ``namespace`` (one LIST): which node each pod went to."""
        page = self.core.list_namespaced_event(
            namespace, field_selector="reason=Scheduled,involvedObject.kind=Pod", _request_timeout=REQUEST_TIMEOUT
        )
        return [self.core.api_client.sanitize_for_serialization(event) for event in page.items]

    def node_created(self, name: str) -> datetime | None:
        """When the Node named ``name`` was created; None when there is no such Node."""
        try:
            node = self.core.read_node(name, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        created: datetime | None = node.metadata.creation_timestamp if node.metadata else None
        return created

    def read_secret(self, namespace: str, name: str, max_age_s: float = 0.0) -> SecretView | None:
        """The Secret's labels and decoded data; None when it does not exist. Whether its data may be
        used is controller/s3_access.py's decision, made before any use.

        ``max_age_s``: a copy read that recently will do (a missing Secret is never remembered).
        """
        key, now = (namespace, name), time.monotonic()
        with self._secrets_lock:
            seen = self._secrets.get(key)
        if seen is not None and now - seen[0] < max_age_s:
            return seen[1]
        secret = self._read_secret(namespace, name)
        with self._secrets_lock:
            if secret is None:
                self._secrets.pop(key, None)
            else:
                self._secrets[key] = (now, secret)
        return secret

    def _read_secret(self, namespace: str, name: str) -> SecretView | None:
        try:
            secret = self.core.read_namespaced_secret(name, namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        data = {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}
        labels = secret.metadata.labels if secret.metadata else None
        return SecretView(name, dict(labels or {}), data)

    def post_event(self, run: dict[str, Any], event: Event, now: datetime) -> None:
        """A core/v1 Event on the TrainingRun: what `kubectl describe trainingrun` shows."""
        meta = run["metadata"]
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": COMPONENT},
            "firstTimestamp": format_date_time(now),
            "lastTimestamp": format_date_time(now),
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(
                meta["namespace"],
                body,  # type: ignore[arg-type] # a dict is accepted
                _request_timeout=REQUEST_TIMEOUT,
            )
        except (ApiException, OSError) as error:  # an event is a courtesy: never fail a reconcile over one
            log.warning(
                "could not post event %s on %s: %s", event.reason, meta["name"], getattr(error, "reason", error)
            )
