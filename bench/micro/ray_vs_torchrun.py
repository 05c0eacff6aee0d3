"""Ray Train + HF Trainer (with S3 checkpoint sync) against the same job under plain torchrun DDP.

Both sides run the same code (``python -m spotray.jobs.gpt2``: GPT-2 from config, MosaicML streaming from
S3, checkpoints synced to S3 every ``--save-steps``) with the same number of CPU workers; only the
launcher differs. torchrun side: ``torchrun --standalone --nproc-per-node N -m spotray.jobs.gpt2``. Ray
side: the job's own Ray Train launcher on a local Ray cluster started beforehand (cluster start is
not counted; a RayJob finds its cluster running too). Speed is steps/s after the first ``--skip``
steps, read from the job's step events. The sides alternate for ``--rounds`` rounds; each round's
ratio compares two runs made back to back, under the same load on this shared machine, and the
result is the median of the rounds' ratios. Goal >= 0.95 (Ray's own figure: within 2.5% of DDP).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import uuid
from pathlib import Path

from bench.common import machine_details, write_result
from bench.micro.jobs import PYTHON, gpt2_command, python_env, steps_per_second
from spotray.local.local_ray import LocalRayCluster
from spotray.train.storage.local_s3 import LocalS3Server

BUCKET = "bench-ray"


def run_once(launcher: str, root: Path, env: dict[str, str], data_uri: str, args: argparse.Namespace) -> float:
    workdir = root / f"{launcher}-{uuid.uuid4().hex[:6]}"
    workdir.mkdir()
    job = gpt2_command(
        f"s3://{BUCKET}/{workdir.name}",
        data_uri,
        workdir,
        workers=args.workers,
        max_steps=args.steps,
        save_steps=args.save_steps,
    )
    torchrun = [str(Path(PYTHON).with_name("torchrun")), "--standalone", f"--nproc-per-node={args.workers}"]
    command = [*torchrun, *job] if launcher == "torchrun" else [PYTHON, *job]
    with (workdir / "job.log").open("wb") as log:
        result = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900, check=False)
    if result.returncode != 0:
        tail = (workdir / "job.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{launcher} run failed ({result.returncode}); its log ends with:\n{tail}")
    rate = steps_per_second(workdir / "events.jsonl", args.skip)
    print(f"  {launcher:8s} {rate:.2f} steps/s", flush=True)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--save-steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=10, help="steps left out of the timing (warm-up)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"ray": [], "torchrun": []}
    with tempfile.TemporaryDirectory(prefix="spotray-bench-ray-") as tmp:
        root = Path(tmp)
        with LocalS3Server(root / "s3") as server:
            server.create_bucket(BUCKET)
            env = python_env(server.env())
            with LocalRayCluster(num_cpus=args.workers, log_path=root / "ray.log", env=server.env()) as cluster:
                ray_env = {**env, "RAY_ADDRESS": cluster.address}
                data_uri = f"s3://{BUCKET}/data"
                for index in range(args.rounds):
                    print(f"round {index + 1}/{args.rounds}", flush=True)
                    order = ("ray", "torchrun") if index % 2 == 0 else ("torchrun", "ray")
                    for launcher in order:
                        side_env = ray_env if launcher == "ray" else env
                        rates[launcher].append(run_once(launcher, root, side_env, data_uri, args))
    round_ratios = [ray / torchrun for ray, torchrun in zip(rates["ray"], rates["torchrun"], strict=True)]
    ratio = statistics.median(round_ratios)
    print(f"ray / torchrun steps/s: {ratio:.3f}")
    path = write_result(
        "ray_vs_torchrun",
        ratio,
        ">= 0.95",
        f"the same job under torchrun DDP ({args.workers} CPU workers, gloo), S3 sync on both sides",
        "python -m bench.micro.ray_vs_torchrun",
        {
            "steps_per_s": {name: [round(r, 3) for r in values] for name, values in rates.items()},
            "round_ratios": [round(r, 3) for r in round_ratios],
            "workers": args.workers,
            "steps": args.steps,
            "timed_after_step": args.skip,
            "save_steps": args.save_steps,
            "model": "GPT-2 2 layers x 128, byte vocab, global batch 16",
            **machine_details(),
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
