"""The cluster as the CLI sees it: TrainingRuns and RayJobs in the current kube context.

``kubernetes`` is imported here only, and only by the cluster commands, so ``spotray checkpoints``
and ``spotray pull`` start fast and work on a laptop with no kube config at all. Every API fault
becomes a ``SpotrayError`` that says what to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from spotray.cli.cluster_options import KubeOptions
from spotray.cli.exit_codes import CommandFailedError, NotFoundError
from spotray.contract.errors import SpotrayError
from spotray.contract.names import (
    GROUP,
    KIND,
    PLURAL,
    RAY_GROUP,
    RAY_VERSION,
    RAYJOB_KIND,
    RAYJOB_PLURAL,
    SWEEP_KIND,
    VERSION,
)
from spotray.contract.sweep import SWEEP_PLURAL

FIELD_MANAGER = "spotray-cli"
_PLURALS = {KIND: PLURAL, SWEEP_KIND: SWEEP_PLURAL}
# (connect, read) seconds for every call: an API server that accepts the connection and never
# answers (a half-open link, a hung proxy) fails the command with the fix instead of hanging it.
REQUEST_TIMEOUT: tuple[float, float] = (10.0, 30.0)
# The label the batch Job controller puts on its pods; KubeRay's K8sJobMode submitter Job is named
# after the RayJob.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
CHUNK_BYTES = 4096
_CONTEXT_FIX = (
    "check that the cluster is up and that `kubectl get nodes` works; pick another cluster with "
    "--context NAME or --kubeconfig FILE (`kubectl config get-contexts` lists them)"
)


def _api_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        return str(error.reason)


class ClusterConnection:
    """A connection to one cluster and a default namespace."""

    def __init__(self, options: KubeOptions, request_timeout: tuple[float, float] = REQUEST_TIMEOUT) -> None:
        self.request_timeout = request_timeout
        try:
            contexts, current = config.list_kube_config_contexts(options.kubeconfig)  # type: ignore[no-untyped-call]
            self.api = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=options.kubeconfig, context=options.context
            )
        except (ConfigException, OSError) as error:
            raise SpotrayError(
                f"no usable kube config ({error})",
                "set KUBECONFIG or pass --kubeconfig FILE, and --context NAME for a context other than the current one",
            ) from None
        context = next((c for c in contexts if c["name"] == options.context), current) if options.context else current
        self.context_name = str((context or {}).get("name", "?"))
        self.namespace = options.namespace or (context or {}).get("context", {}).get("namespace") or "default"
        self.host = self.api.configuration.host
        self.custom = client.CustomObjectsApi(self.api)

    @contextmanager
    def _call(self, what: str, namespace: str, kind: str = KIND) -> Iterator[None]:
        """Run one API call; turn its faults into errors that name the fix."""
        try:
            yield
        except ApiException as error:
            raise self._describe(error, what, namespace, kind) from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise CommandFailedError(
                f"could not reach the Kubernetes API at {self.host} (context {self.context_name}) to {what}: {error}",
                _CONTEXT_FIX,
            ) from None

    def _describe(self, error: ApiException, what: str, namespace: str, kind: str) -> SpotrayError:
        message = _api_message(error)
        if error.status == 404 and "could not find the requested resource" in message:
            installer = "the KubeRay operator" if kind == RAYJOB_KIND else "the spotray controller and CRD (Helm chart)"
            return NotFoundError(
                f"the cluster (context {self.context_name}) has no {kind} resource type",
                f"install {installer}, or pick the right cluster with --context",
            )
        if error.status == 404:
            return NotFoundError(
                f"cannot {what}: {message} (namespace {namespace}, context {self.context_name})",
                "`spotray status -n NAMESPACE` lists the runs in a namespace; pass -n/--namespace or --context",
            )
        if error.status in (401, 403):
            resource = "pods/log" if kind == "Pod" else f"{PLURAL}.{GROUP}"
            return CommandFailedError(
                f"the cluster refused to let you {what}: {message}",
                f"check your credentials and RBAC: `kubectl auth can-i get {resource} -n {namespace}`",
            )
        if error.status in (400, 422):
            return SpotrayError(f"the cluster refused to {what}: {message}", "fix the manifest as the message says")
        return CommandFailedError(f"the cluster failed to {what}: {error.status} {message}", _CONTEXT_FIX)

    # -- TrainingRuns -----------------------------------------------------------------------

    def get_run(self, name: str, namespace: str | None = None, *, kind: str = KIND) -> dict[str, Any]:
        """A TrainingRun (or a TrainingSweep, with ``kind``)."""
        namespace = namespace or self.namespace
        with self._call(f"get {kind} {name}", namespace):
            run = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, _PLURALS[kind], name, _request_timeout=self.request_timeout
            )
        return cast("dict[str, Any]", run)

    def list_runs(
        self, namespace: str | None = None, labels: dict[str, str] | None = None, *, all_namespaces: bool = False
    ) -> list[dict[str, Any]]:
        """The TrainingRuns of the namespace, or of every namespace (those that carry all of ``labels``),
        by namespace and name."""
        namespace = namespace or self.namespace
        selector = ",".join(f"{key}={value}" for key, value in (labels or {}).items())
        with self._call("list TrainingRuns", "every namespace" if all_namespaces else namespace):
            if all_namespaces:
                listing = self.custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, label_selector=selector, _request_timeout=self.request_timeout
                )
            else:
                listing = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, label_selector=selector, _request_timeout=self.request_timeout
                )
        items: list[dict[str, Any]] = cast("dict[str, Any]", listing).get("items", [])
        return sorted(items, key=lambda item: (item["metadata"].get("namespace", ""), item["metadata"]["name"]))

    def delete_run(self, name: str, namespace: str | None = None, *, kind: str = KIND) -> None:
        """Delete a TrainingRun (or a TrainingSweep); its checkpoints stay in the store."""
        namespace = namespace or self.namespace
        with self._call(f"delete {kind} {name}", namespace, kind):
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, _PLURALS[kind], name, _request_timeout=self.request_timeout
            )

    def set_suspended(self, name: str, suspended: bool, namespace: str | None = None, *, kind: str = KIND) -> bool:
        """Set ``spec.suspend``; returns whether it changed (a merge patch, as ``kubectl patch --type merge``)."""
        namespace = namespace or self.namespace
        before = self.get_run(name, namespace, kind=kind)
        if bool(before.get("spec", {}).get("suspend", False)) == suspended:
            return False
        with self._call(f"{'suspend' if suspended else 'resume'} {kind} {name}", namespace, kind):
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                _PLURALS[kind],
                name,
                {"spec": {"suspend": suspended}},
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
                _request_timeout=self.request_timeout,
            )
        return True

    def apply_run(self, document: dict[str, Any], namespace: str) -> tuple[dict[str, Any], str]:
        """Server-side apply of a TrainingRun or a TrainingSweep (its ``kind``), like ``kubectl apply
        --server-side``; returns the object and what changed: created, configured or unchanged."""
        name, kind = document["metadata"]["name"], str(document.get("kind") or KIND)
        try:
            before: dict[str, Any] | None = self.get_run(name, namespace, kind=kind)
        except NotFoundError:
            before = None
        with self._call(f"apply {kind} {name}", namespace):
            after = self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                _PLURALS[kind],
                name,
                document,
                field_manager=FIELD_MANAGER,
                force=True,  # take over fields an earlier `kubectl apply` owned, as re-submitting means
                _content_type="application/apply-patch+yaml",
                _request_timeout=self.request_timeout,
            )
        after = cast("dict[str, Any]", after)
        if before is None:
            return after, "created"
        changed = after["metadata"].get("generation") != before["metadata"].get("generation")
        return after, "configured" if changed else "unchanged"

    # -- RayJobs ----------------------------------------------------------------------------

    def get_ray_job(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or self.namespace
        with self._call(f"get RayJob {name}", namespace, kind=RAYJOB_KIND):
            job = self.custom.get_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name, _request_timeout=self.request_timeout
            )
        return cast("dict[str, Any]", job)

    # -- Pods -------------------------------------------------------------------------------

    def submitter_pod(self, ray_job: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The newest pod of the RayJob's K8sJobMode submitter (the batch Job KubeRay names after the
        RayJob), or None: none yet, or the RayJob submits over HTTP."""
        namespace = namespace or self.namespace
        core = client.CoreV1Api(self.api)
        with self._call(f"list the submitter pods of RayJob {ray_job}", namespace, kind="Pod"):
            listing = core.list_namespaced_pod(
                namespace, label_selector=f"{JOB_NAME_LABEL}={ray_job}", _request_timeout=self.request_timeout
            )
        pods = [cast("dict[str, Any]", self.api.sanitize_for_serialization(p)) for p in listing.items]
        return max(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""), default=None)

    def pod_log(self, pod: str, container: str, *, follow: bool, namespace: str | None = None) -> Iterator[str]:
        """The container's log through the API server (``kubectl logs``), chunk by chunk; with ``follow``,
        until the container ends. A container that has not started is a NotFoundError that says so."""
        namespace = namespace or self.namespace
        core = client.CoreV1Api(self.api)
        # A followed log may be quiet for long: no timeout then (the client takes no read-only bound), as
        # `kubectl logs -f`; a plain read keeps both.
        timeout = None if follow else self.request_timeout
        try:
            with self._call(f"read the log of pod {pod}", namespace, kind="Pod"):
                response = cast(  # _preload_content=False: the raw response, read as it comes
                    "urllib3.HTTPResponse",
                    core.read_namespaced_pod_log(
                        pod, namespace, container=container, follow=follow, _preload_content=False,
                        _request_timeout=timeout,
                    ),
                )  # fmt: skip
                for chunk in response.stream(CHUNK_BYTES):
                    yield chunk.decode(errors="replace")
        except SpotrayError as error:
            if "is waiting to start" in str(error) or "ContainerCreating" in str(error):
                raise NotFoundError(f"pod {namespace}/{pod} has not started yet: {error}", "follow it: -f") from None
            raise
