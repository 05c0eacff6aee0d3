"""A TrainingSweep on the test bed: the controller makes its trials (TrainingRuns it owns), reads each
trial's objective at the rung from the trial's status (which it records from the trial's progress in
S3), stops the trials below the cut on their checkpoint (suspended, never deleted), and survives being
killed mid-sweep: the restarted controller finds every decision in the trials and makes no trial twice.

- in make test, a smoke (about 40 s): trials made, owned and counted, a controller kill that makes no
  trial twice, and the trials gone with their sweep; its trials sleep instead of training;
- in make test-campaign, the whole story (about 4 minutes): three trials train GPT-2 for real on the
  test bed's Ray head (as tests/e2e/test_controller.py's runs do), one stops at its rung; and a Hydra
  multirun sent to the cluster by the launcher plugin (hydra.launcher.local=false).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotray.contract.sweep import (
    OBJECTIVE_STEPS_ANNOTATION,
    PARAMS_ANNOTATION,
    PROMOTED_ANNOTATION,
    STOPPED_ANNOTATION,
)
from spotray.train.storage.local_s3 import LocalS3Server
from tests.e2e.conftest import ROOT, tb
from tests.e2e.controller_harness import ControllerProcess, training_run
from tests.e2e.test_cli_cluster import cli
from tests.e2e.test_controller import s3_secret, start_controller, training_run_crd  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.restricted]

SWEEP_CRD = ROOT / "charts" / "spotray" / "crds" / "trainingsweeps.spotray.dev.yaml"
STEPS = 30
# lr 0.03 learns in 10 steps what the two small rates do not. Trials 1 and 2 race to the rung at step
# 10, and Optuna's pruner lets the first of fewer than 3 there go on when it is the best so far: so
# trial 2 finishes or stops there, by the race; trial 1 always finishes; trial 3, third at the rung
# and never the best, always stops there (the best third of three).
RATES = [0.03, 0.0001, 0.00003]


@pytest.fixture(scope="session")
def training_sweep_crd(testbed: tb.Testbed) -> None:
    testbed.kubectl("apply", "--server-side", "-f", str(SWEEP_CRD))
    testbed.kubectl("wait", "--for=condition=Established", "crd/trainingsweeps.spotray.dev", "--timeout=60s")


def sweep_manifest(name: str, tmp_path: Path) -> dict[str, Any]:
    """Three learning rates in a grid, two at a time, a rung at step 10 of 30."""
    entrypoint = (
        f"python -m spotray.jobs.gpt2 --max-steps {STEPS} --batch-size 8 --n-layer 1 --n-embd 32 --dropout 0 "
        f"--min-step-seconds 1 --learning-rate ${{lr}} --workdir {tmp_path}/job-${{lr}}"
    )
    template = training_run(name, tmp_path, max_steps=STEPS, entrypoint=entrypoint)["spec"]
    return {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingSweep",
        "metadata": {"name": name},
        "spec": {
            "template": template,
            "parameters": {"lr": {"type": "float", "values": RATES}},
            "search": {"algorithm": "grid"},
            "trials": {"max": len(RATES), "parallel": 2},
            "earlyStopping": {"minSteps": 10, "reductionFactor": 3},
        },
    }


def sweep_object(testbed: tb.Testbed, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        testbed.kubectl("get", "trainingsweep", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def trials(testbed: tb.Testbed, namespace: str, sweep: str) -> list[dict[str, Any]]:
    listed = testbed.kubectl("get", "trainingruns", "-n", namespace, "-l", f"spotray.dev/sweep={sweep}", "-o", "json")
    return sorted(json.loads(listed.stdout)["items"], key=lambda run: run["metadata"]["name"])


def test_a_sweep_makes_its_trials_once_whatever_the_controller_kills_and_they_go_with_it(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture imported above
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture imported above
    training_sweep_crd: None,
    tmp_path: Path,
) -> None:
    controller = start_controller()
    manifest = sweep_manifest("nap", tmp_path)
    manifest["spec"]["template"]["entrypoint"] = "python -c 'import time; time.sleep(300)'  # ${lr}"
    del manifest["spec"]["earlyStopping"]
    # Through the CLI, as a user would: checked here, then applied (spotray/submit.py).
    spotray = cli(testbed)
    (tmp_path / "nap.yaml").write_text(yaml.safe_dump(manifest))
    submitted = spotray("run", str(tmp_path / "nap.yaml"), "-n", namespace)
    assert submitted.returncode == 0, submitted.stderr
    assert "trainingsweep.spotray.dev/nap created" in submitted.stdout, submitted.stdout

    def running_two() -> dict[str, Any] | None:
        status = sweep_object(testbed, namespace, "nap").get("status") or {}
        return status if (status.get("trials") or {}).get("running") == 2 else None

    # What the CRD's schema cannot say is refused at once, with the fix, in the sweep's status.
    wrong = sweep_manifest("typo", tmp_path)
    wrong["spec"]["template"]["entrypoint"] = "python -m spotray.jobs.gpt2 --learning-rate ${learning_rate}"
    testbed.apply(wrong, namespace=namespace)

    def refused() -> dict[str, Any] | None:
        status = sweep_object(testbed, namespace, "typo").get("status") or {}
        return status if status.get("phase") == "Failed" else None

    message = tb.wait_until("the sweep with a typo refused", refused, timeout=30, interval=1)["message"]
    assert "${learning_rate} names no parameter (known: ['lr'])" in message, message
    assert trials(testbed, namespace, "typo") == []

    status = tb.wait_until("the sweep's first two trials", running_two, timeout=60, interval=1)
    assert (status["phase"], status["started"], status["limit"]) == ("Running", 2, 3)
    made = trials(testbed, namespace, "nap")
    assert [t["metadata"]["name"] for t in made] == ["nap-t1", "nap-t2"]
    for number, trial in enumerate(made, start=1):
        (owner,) = trial["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainingSweep", "nap", True)
        assert json.loads(trial["metadata"]["annotations"][PARAMS_ANNOTATION]) == {"lr": RATES[number - 1]}
        assert trial["spec"]["checkpoint"]["uri"].endswith(f"/nap/nap-t{number}")
    printed = testbed.kubectl("get", "trainingsweep", "nap", "-n", namespace).stdout
    assert "Running" in printed, printed
    shown = spotray("status", "nap", "-n", namespace)
    assert shown.returncode == 0, shown.stderr
    assert "2 of 3 started (2 running)" in shown.stdout, shown.stdout
    assert "nap-t2" in shown.stdout, shown.stdout

    # Killed and started again, twice: the trials are the state, and both slots are still taken.
    for _ in range(2):
        controller.stop(signal.SIGKILL)
        controller = start_controller()
        tb.wait_until("the restarted controller", controller.healthy, timeout=60, interval=1)
    running_two_again = tb.wait_until("the sweep's status again", running_two, timeout=30, interval=1)
    assert running_two_again["started"] == 2
    assert [t["metadata"]["name"] for t in trials(testbed, namespace, "nap")] == ["nap-t1", "nap-t2"]

    # Its trials are its own: deleting the sweep deletes them (the garbage collector, by owner).
    testbed.kubectl("delete", "trainingsweep", "nap", "-n", namespace)
    tb.wait_until("the trials to go with their sweep", lambda: trials(testbed, namespace, "nap") == [], 60)


@pytest.mark.campaign
def test_a_sweep_stops_the_trials_below_the_cut_at_its_rung_and_survives_a_controller_kill(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture imported above
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture imported above
    training_sweep_crd: None,
    tmp_path: Path,
) -> None:
    controller = start_controller()
    testbed.apply(sweep_manifest("lr", tmp_path), namespace=namespace)
    first_two = tb.wait_until(
        "the sweep's first two trials", lambda: len(found := trials(testbed, namespace, "lr")) == 2 and found, 60
    )
    assert [t["metadata"]["name"] for t in first_two] == ["lr-t1", "lr-t2"]
    assert all(t["metadata"]["ownerReferences"][0]["kind"] == "TrainingSweep" for t in first_two)
    assert first_two[0]["metadata"]["annotations"][OBJECTIVE_STEPS_ANNOTATION].startswith("10,30,")

    # Killed while its trials train: what it decided is in the trials, so the next one goes on from there.
    controller.stop(signal.SIGKILL)
    controller = start_controller()

    def ended() -> dict[str, Any] | None:
        status = sweep_object(testbed, namespace, "lr").get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    try:
        status = tb.wait_until("the sweep to end", ended, timeout=900, interval=2)
    finally:
        print(yaml.safe_dump(sweep_object(testbed, namespace, "lr").get("status")))
        for trial in trials(testbed, namespace, "lr"):
            print(trial["metadata"]["name"], trial["metadata"].get("annotations"), yaml.safe_dump(trial.get("status")))
    found = {t["metadata"]["name"]: t for t in trials(testbed, namespace, "lr")}
    assert sorted(found) == ["lr-t1", "lr-t2", "lr-t3"], "each trial made once"
    for trial in found.values():
        assert (trial["status"]["failures"], trial["status"]["preemptions"]) == (0, 0), trial["status"]
    for name, trial in found.items():
        annotations, phase = trial["metadata"]["annotations"], trial["status"]["phase"]
        recorded = [entry["step"] for entry in trial["status"]["intervalLosses"]]
        if trial["spec"].get("suspend"):
            # Stopped at the rung, on its checkpoint: suspended, never failed, its objective there recorded.
            assert (annotations[STOPPED_ANNOTATION], phase, recorded) == ("10", "Suspended", [10]), name
        else:
            assert (annotations[PROMOTED_ANNOTATION], phase, recorded) == ("10", "Succeeded", [10, STEPS])
    assert not found["lr-t1"]["spec"].get("suspend"), "the best rate is never stopped"
    assert found["lr-t3"]["spec"].get("suspend"), "the third at the rung, never the best, always stops"
    succeeded = 1 + (not found["lr-t2"]["spec"].get("suspend"))
    assert status["phase"] == "Succeeded"
    assert status["trials"] == {"running": 0, "suspended": 3 - succeeded, "succeeded": succeeded, "failed": 0}
    assert status["best"]["trial"] == 1
    final = found["lr-t1"]["status"]["intervalLosses"][-1]["loss"]
    assert status["best"]["loss"] == pytest.approx(final, abs=1e-5)
    printed = testbed.kubectl("get", "trainingsweep", "lr", "-n", namespace).stdout
    assert "Succeeded" in printed, printed


@pytest.mark.campaign
def test_a_hydra_multirun_with_local_false_is_a_sweep_the_controller_runs(
    testbed: tb.Testbed,
    ray_head: tb.RayHead,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture imported above
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture imported above
    training_sweep_crd: None,
    tmp_path: Path,
) -> None:
    """plugins/hydra-spotray-launcher with hydra.launcher.local=false: the launcher applies the sweep,
    the controller runs its trials on the test bed, and the launcher reads each job's result back:
    one trains and returns its loss, one is refused by the job (bad input) and fails its Hydra job."""
    start_controller()
    template = training_run("hydra", tmp_path, max_steps=10, entrypoint="python -m spotray.jobs.gpt2.hydra_app")
    (tmp_path / "template.yaml").write_text(yaml.safe_dump(template))
    command = [
        sys.executable, str(ROOT / "jobs" / "gpt2" / "hydra_app.py"), "--multirun", "hydra/launcher=spotray",
        "hydra.launcher.local=false", f"hydra.launcher.template={tmp_path / 'template.yaml'}",
        f"hydra.launcher.kubeconfig={testbed.kubeconfig}", f"hydra.launcher.namespace={namespace}",
        "hydra.launcher.name=hydra-e2e", "hydra.launcher.parallel=2", "hydra.launcher.poll_s=2",
        "hydra.launcher.timeout_s=600", f"hydra.sweep.dir={tmp_path / 'multirun'}",
        "max_steps=10", "batch_size=8", "n_layer=1", "n_embd=32", "dropout=0", "learning_rate=0.003,-1",
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=700, check=False, cwd=tmp_path)
    finally:
        for trial in trials(testbed, namespace, "hydra-e2e"):
            print(trial["metadata"]["name"], yaml.safe_dump(trial.get("status")))
        for scratch in (Path(tempfile.gettempdir()) / "spotray-gpt2").glob("hydra-e2e-t*"):
            shutil.rmtree(scratch, ignore_errors=True)
    output = result.stdout + result.stderr
    assert result.returncode != 0, "one job failed, so the multirun did: " + output[-3000:]
    assert f"TrainingSweep hydra-e2e created in namespace {namespace}" in output, output[-3000:]
    lines = [line for line in output.splitlines() if "spotray: job " in line]
    trained = next(line for line in lines if "learning_rate=0.003" in line)
    refused = next(line for line in lines if "learning_rate=-1" in line)
    assert " Succeeded, loss " in trained, output[-3000:]
    assert " Failed" in refused, output[-3000:]
    failed = refused.split("trial ")[1].split()[0]
    assert f"{failed} ended Failed (spotray status {failed} -n {namespace})" in output, "where to read why"
    status = sweep_object(testbed, namespace, "hydra-e2e")["status"]
    assert status["trials"] == {"running": 0, "suspended": 0, "succeeded": 1, "failed": 1}, status
    for trial in trials(testbed, namespace, "hydra-e2e"):
        assert trial["status"]["preemptions"] == 0, trial["status"]
