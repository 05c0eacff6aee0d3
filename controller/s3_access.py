"""Which Secret, S3 endpoint and directory a run may use: the controller's half of least privilege (pure).

Whoever can create a TrainingRun names a Secret in ``spec.checkpoint.secretRef``. Without a rule,
that would let them read every Secret of the namespace (the controller injects it into pods that
run their image) and point the controller's own S3 requests anywhere (the Secret's
``AWS_ENDPOINT_URL``). So:

- a Secret is used (read for the controller's S3 requests, injected into the run's pods) only when
  it says so, with the label ``spotray.dev/s3-credentials=true``, or when the operator named it:
  the chart's ``s3.existingSecret`` (the default Secret) or ``s3.allowedSecrets``;
- the controller sends S3 requests only to AWS S3 (no endpoint) or to an endpoint the operator
  allowed: the chart's ``s3.endpoint`` or ``s3.allowedEndpoints``;
- a run that names no Secret is read without credentials (unsigned requests): the controller's
  own identity (IRSA, an instance profile) never reads a bucket on a run's behalf;
- a ``file://`` checkpoint URI is read on the controller's own file system, so only strictly inside
  a directory the operator listed (the chart's ``controller.fileRoots``: a shared volume mounted in
  the controller), never elsewhere: ``checkpoint.uri: /`` made it list its whole file system.

A refusal of the Secret or the endpoint makes the run wait, with a message that names the fix, and
spends no attempt; a directory refused leaves the run's store unread (controller/run_store.py).
docs/security.md has the whole threat model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from spotray.contract.names import S3_OPT_IN_LABEL


@dataclass(frozen=True)
class SecretView:
    """What the controller reads of a Secret: its labels, and its data once it may be used."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    data: dict[str, str] = field(default_factory=dict, repr=False)


def normalized_endpoint(url: str) -> str:
    """scheme://host[:port], lower case, no path or trailing slash: the form endpoints are compared in."""
    parts = urlsplit(url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def secret_refusal(
    namespace: str, name: str, secret: SecretView | None, *, default_secret: str | None, allowed: tuple[str, ...]
) -> str | None:
    """Why the run may not use the Secret ``name`` (a message naming the fix), or None when it may."""
    if secret is None:
        return (
            f"waiting for Secret {name} in namespace {namespace} (spec.checkpoint.secretRef): create it with "
            f"`kubectl create secret generic {name} -n {namespace} --from-literal=AWS_ACCESS_KEY_ID=... "
            f"--from-literal=AWS_SECRET_ACCESS_KEY=...` (and AWS_ENDPOINT_URL for MinIO), then "
            f"`kubectl label secret {name} -n {namespace} {S3_OPT_IN_LABEL}=true`"
        )
    if secret.labels.get(S3_OPT_IN_LABEL) == "true" or name == default_secret or name in allowed:
        return None
    return (
        f"Secret {name} in namespace {namespace} is not marked for use by spotray, so the controller "
        f"neither reads it nor gives it to the run's pods: if it holds this run's S3 credentials, "
        f"`kubectl label secret {name} -n {namespace} {S3_OPT_IN_LABEL}=true` (or list it in the chart's "
        "s3.allowedSecrets)"
    )


def endpoint_refusal(endpoint: str | None, secret_name: str | None, *, allowed: tuple[str, ...]) -> str | None:
    """Why the controller may not send requests to ``endpoint``, or None (AWS S3, or an allowed one)."""
    if not endpoint:
        return None
    if normalized_endpoint(endpoint) in {normalized_endpoint(e) for e in allowed}:
        return None
    source = f"AWS_ENDPOINT_URL of Secret {secret_name}" if secret_name else "the S3 endpoint"
    return (
        f"the S3 endpoint {normalized_endpoint(endpoint)} ({source}) is not one the controller may "
        f"connect to (allowed: {', '.join(sorted(allowed)) or 'AWS S3 only'}): add it to the chart's "
        "s3.allowedEndpoints, or fix the Secret"
    )


def file_uri_refusal(uri: str, resolved: str, roots: tuple[str, ...]) -> str | None:
    """Why the controller may not read the file:// checkpoint URI ``uri`` (naming the setting), or None.

    ``resolved``: its directory with symbolic links and ``..`` resolved; ``roots``: the operator's
    directories, resolved likewise. Allowed: a directory strictly inside one of them (a root itself
    holds every run's directory); a root that resolves to ``/`` allows nothing.
    """
    if any(root.strip("/") and resolved.startswith(root.rstrip("/") + "/") for root in roots):
        return None
    seen = f" ({resolved}, its links resolved)" if resolved != uri.removeprefix("file://").rstrip("/") else ""
    return (
        f"spec.checkpoint.uri {uri}{seen} is not inside a directory the controller may read: it reads "
        f"file:// URIs on its own file system, and only inside the directories of SPOTRAY_FILE_ROOTS "
        f"(the chart's controller.fileRoots: {', '.join(roots) or 'none'})"
    )
