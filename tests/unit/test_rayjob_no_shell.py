"""No spec field is expanded by a shell the user did not ask for (docs/security.md, issue 38).

The entrypoint is a shell command by design: Ray's job manager runs it with ``/bin/sh -c``, once,
as for ``ray job submit -- <entrypoint>``. Every other layer must pass the spec's text on as it is.
KubeRay's own K8sJobMode submitter runs one ``bash -c`` line with the entrypoint pasted in and the
runtime env (which holds the whole spec, in ``SPOTRAY_RUN``) in Go double quotes, where ``$(...)``,
backticks and ``$VAR`` still run: so the controller gives the submitter a command of its own, an
argv with no shell. The Ray containers get no command of ours: KubeRay's ``ray start`` line holds
only our rayStartParams and numbers it parses from resource quantities.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
import yaml

from spotray.contract.spec import parse_training_run
from spotray.controller.config import ControllerConfig
from spotray.controller.rayjob import build_rayjob
from tests.kubelet import container_argv

pytestmark = pytest.mark.unit

# Command substitution, backticks, breaking out of single quotes, and the kubelet's own $(VAR) and $$.
HOSTILE = "$(touch /tmp/pwned) `id` '; echo x; ' \"$HOME\" $(RAY_JOB_SUBMISSION_ID) $$ $"
SHELLS = {"sh", "bash", "dash", "zsh", "ash"}
SUBMITTER_MODULE = "spotray.train.launch.submitter"  # train/launch/submitter.py


def hostile_run(text: str) -> dict[str, Any]:
    """A TrainingRun with ``text`` in every field of free text."""
    return {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "entrypoint": f"python -m spotray.jobs.cnn --note {text}",
            "image": f"registry.example.com/spotray:{text}",
            "runtimeEnv": {"env_vars": {"NOTE": text, text: "key"}, "pip": [text]},
            # secretRef is not here: a Secret's name is a DNS subdomain, so the parser refuses such text.
            "checkpoint": {"uri": f"s3://bucket/runs/{text}"},
            "data": {"uri": f"s3://bucket/data/{text}"},
        },
    }


def build(mode: str = "K8sJobMode", text: str = HOSTILE) -> dict[str, Any]:
    config = ControllerConfig.from_env({"SPOTRAY_SUBMISSION_MODE": mode})
    return build_rayjob(parse_training_run(hostile_run(text)), 1, "uid-of-the-run", config)


def kuberay_env(
    container: dict[str, Any],
    dashboard: str = "tiny-a1-head-svc.default.svc.cluster.local:8265",
    submission_id: str = "tiny-a1-x7k2p",
) -> dict[str, str]:
    """The container's variables (the kubelet expands $(VAR) with them): ours, then what KubeRay adds."""
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    return {**env, "PYTHONUNBUFFERED": "1", "RAY_DASHBOARD_ADDRESS": dashboard, "RAY_JOB_SUBMISSION_ID": submission_id}


def is_shell(argv: list[str]) -> bool:
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in SHELLS


def test_the_spec_really_holds_the_hostile_text() -> None:
    rayjob = build()
    assert HOSTILE in rayjob["spec"]["entrypoint"]
    run_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])["env_vars"]
    assert run_env["NOTE"] == HOSTILE
    spec = json.loads(run_env["SPOTRAY_RUN"])["spec"]  # the whole spec, image and URIs included
    assert HOSTILE in spec["image"]
    assert HOSTILE in spec["checkpoint"]["uri"]


def test_the_submitter_has_its_own_argv_so_kuberay_builds_no_bash_line() -> None:
    (submitter,) = build()["spec"]["submitterPodTemplate"]["spec"]["containers"]
    # Without a command, KubeRay runs `/bin/bash -ce -- "<ray job submit ... -- <entrypoint> ...>"`.
    assert submitter.get("command"), "KubeRay would build its bash -c line"
    argv = container_argv(submitter, kuberay_env(submitter))
    assert not is_shell(argv), argv
    assert argv[:3] == ["python", "-m", SUBMITTER_MODULE]
    assert importlib.util.find_spec(SUBMITTER_MODULE) is not None


def test_the_entrypoint_and_runtime_env_reach_the_submitter_as_whole_argv_elements_unchanged() -> None:
    rayjob = build()
    (submitter,) = rayjob["spec"]["submitterPodTemplate"]["spec"]["containers"]
    argv = container_argv(submitter, kuberay_env(submitter))
    runtime_env = yaml.safe_load(rayjob["spec"]["runtimeEnvYAML"])
    assert argv[3:] == [
        "--runtime-env-json=" + json.dumps(runtime_env, sort_keys=True, separators=(",", ":")),
        "--",
        rayjob["spec"]["entrypoint"],
    ]
    assert json.loads(argv[3].removeprefix("--runtime-env-json="))["env_vars"]["NOTE"] == HOSTILE


def test_http_mode_hands_kuberay_the_entrypoint_as_it_is_and_runs_no_submitter() -> None:
    spec = build("HTTPMode")["spec"]
    assert spec["entrypoint"] == f"python -m spotray.jobs.cnn --note {HOSTILE}"
    assert "submitterPodTemplate" not in spec


def test_ray_containers_get_no_command_of_ours_and_their_hook_is_argv_without_spec_text() -> None:
    cluster = build()["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        assert HOSTILE not in json.dumps(group["rayStartParams"])
        for container in group["template"]["spec"]["containers"]:
            # With no command, KubeRay's `ray start` line is built from rayStartParams and the limits.
            assert "command" not in container
            assert "args" not in container
            hook = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            if hook:
                assert not is_shell(hook), hook
                assert HOSTILE not in json.dumps(hook)
