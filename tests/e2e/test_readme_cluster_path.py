"""The README's cluster path, run as written on real pods (issue 72, item 1).

Every command of the README's section 3 is read out of the README (testbed/readme_path.py) and run in
bash, in order, on a test bed of its own: a bare cluster (KubeRay, no chart) whose two real nodes are
labelled as EKS labels its on-demand and spot nodes, since the path installs with the EKS values
file. Only the README's placeholders are filled in (the registry, the keys, the S3 endpoint, the
bucket). What the test bed needs besides is added, each addition named below:

- ``docker build`` and ``docker push``: there is no Docker engine here; `make testbed` built the same
  Dockerfile's images and loaded them into the nodes, so the line is not run;
- the reader's S3 bucket is the chart's MinIO: the `helm install` gets ``minio.enabled=true`` (whose
  root keys come from the same Secret, which MinIO needs in the release's namespace too), the test
  bed's image values (no registry: the images are on the nodes) and the test bed's network blocks
  (KubeRay runs on the host, outside the pod network);
- the TrainingRun is fitted to this machine's two small nodes (one worker of 500m, 40 steps) between
  the README's ``sed`` and its ``kubectl apply``.

The run must end Succeeded, and `spotray pull` must verify its last checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import cluster_demo, readme_path
from tests.e2e.conftest import ROOT, tb

pytestmark = [pytest.mark.e2e, pytest.mark.campaign]

NAMESPACE = "team"  # the README's
RELEASE_NAMESPACE = "spotray"  # the README's
RUN = "gpt2-demo"  # jobs/gpt2/trainingrun.yaml's
STEPS = 40
COMMAND_TIMEOUT_S = 1200
# How EKS managed node groups label their nodes (charts/spotray/examples/eks.yaml's preset).
EKS_ON_DEMAND = {"eks.amazonaws.com/capacityType": "ON_DEMAND"}
EKS_SPOT = {"eks.amazonaws.com/capacityType": "SPOT"}


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tb.Testbed]:
    """The test bed with KubeRay and two real nodes labelled as EKS does, and nothing of spotray."""
    workdir = tmp_path_factory.mktemp("readme-path")
    nodes = [
        tb.real.RealNode("real-ondemand-0", 1, labels=EKS_ON_DEMAND),
        tb.real.RealNode("real-spot-0", 2, labels=EKS_SPOT),
    ]
    with tb.Testbed(workdir, nodes=[], real_nodes=nodes) as testbed:
        yield testbed


def fitted(document: dict[str, Any]) -> dict[str, Any]:
    """The README's TrainingRun on this machine: one small worker, a short run (as testbed/cluster_demo.py
    fits the demo's), nothing else changed."""
    spec = document["spec"]
    spec["entrypoint"] = (
        f"python -m spotray.jobs.gpt2 --max-steps {STEPS} --batch-size 8 --workdir {cluster_demo.POD_JOB_DIR}"
    )
    spec["head"] = {"cpu": "250m", "memory": "4Gi"}  # the driver and Ray Train's controller: about 2 GB
    spec["workers"] |= {"replicas": 1, "cpu": "500m", "memory": "3Gi"}
    return document


def run(command: str, env: dict[str, str], cwd: Path, stdin: str | None = None) -> str:
    print(f"$ {command}", flush=True)
    done = subprocess.run(
        ["bash", "-c", command], env=env, cwd=cwd, input=stdin, capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip
    print(done.stdout[-4000:], done.stderr[-4000:], sep="\n", flush=True)
    assert done.returncode == 0, f"{command}\nexited {done.returncode}: {done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.timeout(COMMAND_TIMEOUT_S + 900)
def test_the_readmes_cluster_path_installs_trains_and_pulls_as_written(
    bare_cluster: tb.Testbed, tmp_path: Path
) -> None:
    bed = bare_cluster
    commands = readme_path.cluster_path_commands()
    assert commands[0].startswith("docker build "), commands[0]
    refs = {name: image["ref"].rsplit(":", 1)[0] for name, image in tb.real.images_manifest().items()}
    keys = {"AWS_ACCESS_KEY_ID": cluster_demo.ROOT_USER, "AWS_SECRET_ACCESS_KEY": cluster_demo.ROOT_PASSWORD}
    values = {
        readme_path.REGISTRY: refs["spotray"].removesuffix("/spotray"),
        readme_path.ACCESS_KEY: f"AWS_ACCESS_KEY_ID={keys['AWS_ACCESS_KEY_ID']}",
        readme_path.SECRET_KEY: f"AWS_SECRET_ACCESS_KEY={keys['AWS_SECRET_ACCESS_KEY']}",
        readme_path.S3_ENDPOINT: f"http://spotray-minio.{RELEASE_NAMESPACE}.svc.cluster.local:9000",
        readme_path.BUCKET: "spotray",  # the chart's MinIO makes it (minio.buckets)
    }
    # Where the reader stands: a clone's charts/ and jobs/, and room for ./model.
    (tmp_path / "charts").symlink_to(ROOT / "charts")
    (tmp_path / "jobs").symlink_to(ROOT / "jobs")
    tools = [tb.binary("kubectl").parent, tb.binary("helm").parent, Path(sys.executable).parent]
    env = {
        **os.environ,
        "KUBECONFIG": str(bed.kubeconfig),
        "PATH": os.pathsep.join([*map(str, tools), os.environ["PATH"]]),
    }
    # The test bed's additions before the path: MinIO's volume, and its root keys in the release's namespace.
    bed.apply(cluster_demo.minio_volume(bed))
    bed.kubectl("create", "namespace", RELEASE_NAMESPACE)
    bed.kubectl("create", "secret", "generic", "s3-credentials", "-n", RELEASE_NAMESPACE,
                *(f"--from-literal={k}={v}" for k, v in keys.items()))  # fmt: skip
    for command in commands[1:]:
        filled = readme_path.fill(command, values)
        if filled.startswith("helm install "):
            additions = [
                *cluster_demo.image_values(), "--set", "minio.enabled=true", "--wait", "--timeout", "10m",
                "--set", f"networkPolicy.kuberayIPBlocks={{{tb.real.FABRIC_PREFIX}.0/24}}",
                "--set", f"networkPolicy.minioIPBlocks={{{tb.real.FABRIC_PREFIX}.0/24}}",
            ]  # fmt: skip
            filled = filled.split(" #")[0] + " " + shlex.join(additions)
        elif " | kubectl apply " in filled:
            produce, apply = filled.split(" | ", 1)
            document = fitted(yaml.safe_load(run(produce, env, tmp_path)))
            run(apply, env, tmp_path, stdin=yaml.safe_dump(document))
            continue
        elif filled.startswith("spotray pull "):
            minio = cluster_demo.pods(bed, RELEASE_NAMESPACE, "app.kubernetes.io/component=minio")[0]
            env |= {"AWS_ENDPOINT_URL": f"http://{minio['status']['podIP']}:9000", "AWS_REGION": "us-east-1", **keys}
        run(filled, env, tmp_path)
    status = json.loads(bed.kubectl("get", "trainingrun", RUN, "-n", NAMESPACE, "-o", "json").stdout)["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=2)
    pulled = tmp_path / "model"
    assert (pulled / "model.safetensors").exists(), sorted(p.name for p in pulled.iterdir())
