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

import copy
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load as safetensors_load

from bench.campaigns.nemesis import RayHeads
from spotray.contract.sweep import (
    LINEAGE_ANNOTATION,
    OBJECTIVE_STEPS_ANNOTATION,
    PARAMS_ANNOTATION,
    PROMOTED_ANNOTATION,
    STOPPED_ANNOTATION,
    parse_sweep,
)
from spotray.contract.uris import parse_uri
from spotray.decisions.sweep_plan import decide
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore
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


class HeadPerRayJob:
    """Each RayJob of a namespace gets a Ray head of its own, as each KubeRay RayJob gets a RayCluster
    of its own. A trial stopped at its rung gets SIGTERM, which drains its Ray cluster (a spot
    notice's drain: Ray never takes a drained node back); on the session's shared head that drain
    left every later job unschedulable ("Job supervisor actor could not be scheduled"). Heads come
    warm from bench/campaigns/nemesis.py's pool (a kwok head pod is Ready at once), and go when their job ended.
    """

    def __init__(self, testbed: tb.Testbed, namespace: str, heads: RayHeads) -> None:
        self.testbed, self.namespace, self.heads = testbed, namespace, heads
        self.routed: dict[str, tb.RayHead] = {}  # RayJob name -> its head
        self.released: set[str] = set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="head-per-rayjob", daemon=True)

    def head_of(self, rayjob: str) -> tb.RayHead:
        return self.routed[rayjob]

    def _follow(self) -> None:
        while not self.stopping.wait(1.0):
            listed = self.testbed.kubectl("get", "rayjobs", "-n", self.namespace, "-o", "json", check=False)
            if listed.returncode != 0:
                continue  # the API server restarting: look again in a second
            jobs = {job["metadata"]["name"]: job for job in json.loads(listed.stdout)["items"]}
            for name in sorted(set(jobs) - set(self.routed)):
                head = self.heads.take()
                self.routed[name] = head
                self.testbed.bridge_ray_job(self.namespace, name, head.address, timeout=120)
                # KubeRay may have tried before the bridge knew the head, and backed off: a change looks again.
                self.testbed.kubectl("annotate", "--overwrite", "rayjob", name, "-n", self.namespace,
                                     f"test.spotray.dev/ray-head={head.address}", check=False)  # fmt: skip
            for name, head in self.routed.items():
                status = (jobs.get(name) or {}).get("status") or {}
                over = name not in jobs or status.get("jobStatus") in ("SUCCEEDED", "FAILED", "STOPPED")
                if over and name not in self.released:
                    self.released.add(name)
                    self.heads.release(head)

    def __enter__(self) -> HeadPerRayJob:
        self.heads.fill()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        self.heads.stop()


@pytest.fixture
def head_per_rayjob(
    testbed: tb.Testbed, s3_server: LocalS3Server, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HeadPerRayJob]:
    """For the campaign tests whose trials train and stop at rungs: a head per RayJob, none shared."""
    shared = testbed.default_ray_head()
    testbed.set_default_ray_head(None)  # a RayJob not yet routed waits for its own head
    pod_env = {**s3_server.env(), "PYTHONPATH": str(ROOT)}
    try:
        with HeadPerRayJob(testbed, namespace, RayHeads(tmp_path_factory.mktemp("heads"), pod_env, warm=2)) as router:
            yield router
    finally:
        testbed.set_default_ray_head(shared)


def sweep_object(testbed: tb.Testbed, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        testbed.kubectl("get", "trainingsweep", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def trials(testbed: tb.Testbed, namespace: str, sweep: str) -> list[dict[str, Any]]:
    listed = testbed.kubectl("get", "trainingruns", "-n", namespace, "-l", f"spotray.dev/sweep={sweep}", "-o", "json")
    return sorted(json.loads(listed.stdout)["items"], key=lambda run: run["metadata"]["name"])


def sweep_end(testbed: tb.Testbed, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    """The sweep's status once it ended (Succeeded or Failed); its trials' facts printed either way."""

    def ended() -> dict[str, Any] | None:
        status = sweep_object(testbed, namespace, name).get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    try:
        found: dict[str, Any] = tb.wait_until("the sweep to end", ended, timeout=timeout, interval=2)
    finally:
        print(yaml.safe_dump(sweep_object(testbed, namespace, name).get("status")))
        for trial in trials(testbed, namespace, name):
            print(trial["metadata"]["name"], trial["metadata"].get("annotations"), yaml.safe_dump(trial.get("status")))
    return found


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
    # Through the CLI, as a user would: checked here, then applied (spotray/cli/submit.py).
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
    head_per_rayjob: HeadPerRayJob,
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

    status = sweep_end(testbed, namespace, "lr", timeout=900)
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

    # spotray plot SWEEP: every trial's curve from its own prefix in S3, the decisions marked.
    png = tmp_path / "lr.png"
    plotted = cli(testbed, s3_server.env())("plot", "lr", "-n", namespace, "--output", str(png))
    assert plotted.returncode == 0, plotted.stderr
    assert "3 of 3 trial(s) with progress" in plotted.stdout, plotted.stdout
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.campaign
def test_a_hydra_multirun_with_local_false_is_a_sweep_the_controller_runs(
    testbed: tb.Testbed,
    head_per_rayjob: HeadPerRayJob,
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


# Eight rates, high to low: early in training the higher rates have the lower loss (as in
# tests/integration/test_local_sweep.py), so trial 1 always goes past the rung, trial 2 (second of two
# there) is stopped at it and promoted once six or more trials reached it, and most of the rest stop.
EIGHT_RATES = [0.03, 0.01, 0.003, 0.001, 0.0003, 0.0001, 0.00003, 0.00001]


def reclaim_the_node_of(testbed: tb.Testbed, router: HeadPerRayJob, namespace: str, trial: str) -> list[str]:
    """A cloud takes the spot node the trial's worker is on: every pod there is disrupted and every
    job with a pod there dies (the test bed's jobs run on its Ray head). Returns the node's name and
    the RayJobs hit."""
    run = json.loads(testbed.kubectl("get", "trainingrun", trial, "-n", namespace, "-o", "json").stdout)
    rayjob = run["status"]["attempts"][-1]["rayJob"]
    job = json.loads(testbed.kubectl("get", "rayjob", rayjob, "-n", namespace, "-o", "json").stdout)
    cluster = job["status"]["rayClusterName"]
    pods = json.loads(testbed.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    labels = [(p["metadata"]["labels"], p["spec"].get("nodeName")) for p in pods]
    node = next(
        n for lab, n in labels if lab.get("ray.io/cluster") == cluster and lab.get("ray.io/node-type") == "worker"
    )
    hit_clusters = {lab.get("ray.io/cluster") for lab, n in labels if n == node}
    testbed.preempt_node(node)
    hit = []
    for job in json.loads(testbed.kubectl("get", "rayjobs", "-n", namespace, "-o", "json").stdout)["items"]:
        status = job.get("status") or {}
        if status.get("rayClusterName") in hit_clusters and status.get("jobId"):
            router.head_of(job["metadata"]["name"]).kill_job(status["jobId"])
            hit.append(job["metadata"]["name"])
    return [node, *hit]


def final_weights(s3_server: LocalS3Server, uri: str) -> dict[str, Any]:
    store = S3ObjectStore(parse_uri(uri), s3_server.config, RetryPolicy())
    latest = latest_complete_checkpoint(store)
    assert latest is not None, f"no complete checkpoint under {uri}"
    return safetensors_load(store.get_bytes(f"{latest.prefix}/model.safetensors"))


@pytest.mark.campaign
@pytest.mark.timeout(2400)
def test_eight_trials_with_asha_through_reclaims_and_a_controller_kill_end_as_if_undisturbed(
    testbed: tb.Testbed,
    head_per_rayjob: HeadPerRayJob,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture imported above
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture imported above
    training_sweep_crd: None,
    tmp_path: Path,
) -> None:
    """Issue 40's campaign: a sweep of 8 trials with successive halving, two spot reclaims (one after
    a trial's first checkpoint, one before another's) and the controller SIGKILLed mid-sweep. Every
    trial is made once; no reclaim counts as a failure; the trial stopped at the rung and promoted
    later ends with the same weights as the same trial run alone, undisturbed."""
    controller = start_controller()
    manifest = sweep_manifest("asha", tmp_path)
    manifest["spec"]["parameters"]["lr"]["values"] = EIGHT_RATES
    manifest["spec"]["trials"] = {"max": len(EIGHT_RATES), "parallel": 2}
    manifest["spec"]["template"]["retry"]["maxPreemptions"] = 5
    testbed.apply(manifest, namespace=namespace)
    reclaimed: list[list[str]] = []

    def trial_status(name: str) -> dict[str, Any]:
        found = [t for t in trials(testbed, namespace, "asha") if t["metadata"]["name"] == name]
        return (found[0].get("status") or {}) if found else {}

    try:
        # Reclaim 1: trial 1 past its first complete checkpoint (it resumes from step 10).
        tb.wait_until("trial 1's first checkpoint", lambda: "lastCheckpoint" in trial_status("asha-t1"), 600, 2)
        reclaimed.append(reclaim_the_node_of(testbed, head_per_rayjob, namespace, "asha-t1"))
        # The controller killed as the reclaim lands, and started again: it reads back what it missed.
        controller.stop(signal.SIGKILL)
        controller = start_controller()
        # Reclaim 2: trial 5 training, before its first checkpoint (it starts over from step 0).
        tb.wait_until(
            "trial 5 training",
            lambda: (
                (trial_status("asha-t5").get("progress") or {}).get("step", 0) >= 2
                and "lastCheckpoint" not in trial_status("asha-t5")
            ),
            900,
            1,
        )
        reclaimed.append(reclaim_the_node_of(testbed, head_per_rayjob, namespace, "asha-t5"))

        def ended() -> dict[str, Any] | None:
            status = sweep_object(testbed, namespace, "asha").get("status") or {}
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        status = tb.wait_until("the sweep to end", ended, timeout=1500, interval=3)
    finally:
        for node in {hit[0] for hit in reclaimed}:
            testbed.restore_node(node)
        print("reclaimed (node, RayJobs hit):", reclaimed)
        print(yaml.safe_dump(sweep_object(testbed, namespace, "asha").get("status")))
        for trial in trials(testbed, namespace, "asha"):
            print(trial["metadata"]["name"], trial["metadata"].get("annotations"), yaml.safe_dump(trial.get("status")))
    found = {t["metadata"]["name"]: t for t in trials(testbed, namespace, "asha")}
    assert sorted(found) == [f"asha-t{n}" for n in range(1, 9)], "each trial made once"
    assert all(t["status"].get("failures", 0) == 0 for t in found.values()), "no reclaim counted as a failure"
    assert found["asha-t1"]["status"]["preemptions"] >= 1
    assert found["asha-t5"]["status"]["preemptions"] >= 1
    assert status["phase"] == "Succeeded", status
    assert status["best"]["trial"] in (1, 2), status
    assert status["trials"]["suspended"] >= 4, "most trials stop at the rung"
    promoted = found["asha-t2"]
    assert promoted["metadata"]["annotations"].get(PROMOTED_ANNOTATION) == "10", promoted["metadata"]
    assert promoted["status"]["phase"] == "Succeeded"

    # Trial 2 alone, undisturbed, from scratch: the same final weights.
    alone = copy.deepcopy(promoted)
    alone_spec = alone["spec"]
    alone_spec["suspend"] = False
    alone_spec["checkpoint"]["uri"] += "-alone"
    alone_spec["entrypoint"] = alone_spec["entrypoint"].replace(f"{tmp_path}/job-", f"{tmp_path}/alone-")
    testbed.apply({"apiVersion": alone["apiVersion"], "kind": alone["kind"], "metadata": {"name": "alone"},
                   "spec": alone_spec}, namespace=namespace)  # fmt: skip

    def alone_done() -> dict[str, Any] | None:
        listed = json.loads(testbed.kubectl("get", "trainingrun", "alone", "-n", namespace, "-o", "json").stdout)
        status = listed.get("status") or {}
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    assert tb.wait_until("trial 2 alone", alone_done, timeout=600, interval=3)["phase"] == "Succeeded"
    ours = final_weights(s3_server, promoted["spec"]["checkpoint"]["uri"])
    theirs = final_weights(s3_server, alone_spec["checkpoint"]["uri"])
    assert sorted(ours) == sorted(theirs)
    for key, tensor in ours.items():
        assert torch.equal(tensor, theirs[key]), f"{key} differs: the stop at the rung and the resume lost something"


@pytest.mark.campaign
@pytest.mark.timeout(1500)
def test_population_based_training_on_the_controller_copies_the_donors_checkpoint_into_the_worse_trial(
    testbed: tb.Testbed,
    head_per_rayjob: HeadPerRayJob,
    namespace: str,
    s3_secret: str,  # noqa: F811 - the fixture imported above
    s3_server: LocalS3Server,
    start_controller: Callable[..., ControllerProcess],  # noqa: F811 - the fixture imported above
    training_sweep_crd: None,
    tmp_path: Path,
) -> None:
    """Two trials, compared every 10 of 30 steps: at step 10 the worse one (the lower rate) is stopped,
    then resumed with checkpoint.startFrom naming the better one's checkpoint and the better one's rate
    perturbed; its job copies that checkpoint and its next attempt resumes from the donor's step. The
    controller is killed once mid-sweep. Neither the stop nor the copy counts as a preemption or failure."""
    document = sweep_manifest("pbt", tmp_path)
    document["spec"]["parameters"] = {"lr": {"type": "float", "low": 1e-5, "high": 3e-2, "log": True}}
    document["spec"]["search"] = {"algorithm": "random", "seed": 1}  # about 2.7e-3 and 1.4e-4
    document["spec"]["trials"] = {"max": 2, "parallel": 2}
    del document["spec"]["earlyStopping"]
    document["spec"]["populationBased"] = {"intervalSteps": 10, "quantile": 0.25, "resampleProbability": 0}
    controller = start_controller()
    testbed.apply(document, namespace=namespace)
    tb.wait_until("the two trials", lambda: len(trials(testbed, namespace, "pbt")) == 2, 60)
    controller.stop(signal.SIGKILL)
    controller = start_controller()

    status = sweep_end(testbed, namespace, "pbt", timeout=1200)
    found = {t["metadata"]["name"]: t for t in trials(testbed, namespace, "pbt")}
    assert status["phase"] == "Succeeded"
    assert status["trials"]["succeeded"] == 2
    assert status["exploits"] >= 1
    for trial in found.values():
        assert (trial["status"]["failures"], trial["status"]["preemptions"]) == (0, 0), trial["status"]
    # One of the two exploits the other at step 10 (the worse there), with the donor's rate x0.8 or x1.2.
    initial = dict(decide(parse_sweep(document).spec, []).start)
    [(number, first)] = [
        (int(name[-1]), exploit)
        for name, trial in found.items()
        for exploit in json.loads(trial["metadata"]["annotations"].get(LINEAGE_ANNOTATION, "[]"))
        if exploit["step"] == 10
    ]
    assert status["lineage"][0] == {k: first[k] for k in ("step", "donor", "donorStep", "values")} | {"trial": number}
    donor_rate = initial[first["donor"]]["lr"]
    assert (first["donor"], first["before"]) == (3 - number, initial[number]), first
    assert first["values"]["lr"] in (float(f"{donor_rate * 0.8:.6g}"), float(f"{donor_rate * 1.2:.6g}"))
    exploited = found[f"pbt-t{number}"]
    resumed = [a.get("resumedFrom") for a in exploited["status"]["attempts"]]
    assert first["donorStep"] in resumed, exploited["status"]["attempts"]
    last = json.loads(exploited["metadata"]["annotations"][LINEAGE_ANNOTATION])[-1]
    assert exploited["spec"]["checkpoint"]["startFrom"].endswith(
        f"/pbt-t{last['donor']}/checkpoint-{last['donorStep']}"
    )
    described = cli(testbed, s3_server.env())("status", "pbt", "-n", namespace)
    assert described.returncode == 0, described.stderr
    assert f"exploited t{first['donor']}@" in described.stdout, described.stdout
