"""The Pod Security Standards' "restricted" profile, checked on a pod spec (as rendered, before admission).

The same rules the API server's PodSecurity admission enforces (kubernetes.io/docs/concepts/security/
pod-security-standards), for the fields our pods use; the e2e tests run in namespaces labelled
`pod-security.kubernetes.io/enforce=restricted`, where the real admission has the last word.
"""

from __future__ import annotations

from typing import Any

ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in ``pod`` (a PodSpec) the restricted profile refuses; empty when it complies."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"volume {volume['name']} is of type {sorted(kinds)}")
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities do not drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as uid 0")
        seccomp = (context.get("seccompProfile") or pod_context.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp!r}, not RuntimeDefault or Localhost")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            problems.append(f"{name}: uses a hostPort")
    return problems
