"""Resume at GPU speed (issue #18): process start to the end of the first step, resuming against a fresh start.

Each side is a new process (no Ray: the GPU machines of the `device` tool have none), timed by the
parent from the process start to the end of its first training step (CUDA synchronized):

- ``fresh``:   imports, the model built from config, one step;
- ``serial``:  the resume as it was before issue #18: download and verify the newest complete
  checkpoint (``fetch_resume_checkpoint``), then build the model, then the stock ``Trainer`` loads
  weights and optimizer state through host memory, then one step;
- ``overlap``: the resume now: ``ResumeFetch`` downloads in the background while the model is built,
  and ``AsyncSaveTrainer`` (a ``DirectLoadTrainer``) reads weights and optimizer state straight onto
  the device.

The checkpoint (the Trainer's layout, written once by a ``prepare`` process) is in a SeaweedFS on the
same machine. Sides alternate for ``--rounds`` rounds; ratio = median(overlap) / median(fresh), with
median(serial) / median(fresh) beside it. Goals (issue #18, one H100): at most 1.2 at GPT-2 124M
(1.5 GB) and at most 1.5 at 1.5B (18 GB). Results: ``gpu_resume.json`` (124M) and
``gpu_resume_1.5b.json``; with ``--cpu`` the same measurement on this machine's CPU,
``resume_overlap_cpu.json``.

On a machine lent by the `device` tool, after ``make bench-gpu-carry``:

    run(command="mkdir -p /tmp/site /tmp/bin && tar -xJf .device/site.tar.xz -C /tmp/site
         && xz -dc .device/weed.xz > /tmp/bin/weed && chmod +x /tmp/bin/weed
         && PYTHONPATH=/tmp/site:. PATH=/tmp/bin:$PATH python3 -m bench.gpu.gpu_resume
         --models 124m --rounds 2 --out $OUT", carry=[".device"])

124M with ``--rounds 2`` took 2.5 minutes on an H200. One model per call (1.5B: ``--rounds 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import machine_details, scratch_dir, write_result

BUCKET = "gpu-resume"
SIDES = ("fresh", "serial", "overlap")
FIRST_STEP = "FIRST-STEP-DONE"
GOALS = {"124m": "<= 1.2", "1.5b": "<= 1.5"}
BLOCK = 1024  # tokens per sample on a GPU


# ------------------------------------------------------------------------------------ the child side


def child(mode: str, uri: str, workdir: Path, size_name: str, use_cpu: bool) -> None:
    """One process of one side: what a resumed (or fresh) worker does until its first step ends."""
    import torch  # noqa: PLC0415 - imports are part of what is timed
    from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: PLC0415

    from bench.gpu.gpu_checkpoint import SIZES, RandomTokens  # noqa: PLC0415
    from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer  # noqa: PLC0415
    from spotray.train.checkpoints.resume import ResumeFetch, ResumePoint, fetch_resume_checkpoint  # noqa: PLC0415
    from spotray.train.hf.callback import S3CheckpointCallback  # noqa: PLC0415
    from spotray.train.storage.store import open_store  # noqa: PLC0415

    on_gpu = torch.cuda.is_available() and not use_cpu

    class FirstStep(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if on_gpu:
                torch.cuda.synchronize()
            print(FIRST_STEP, flush=True)
            if mode != "prepare":
                control.should_training_stop = True  # never False: that would undo the Trainer's own stop

    store = open_store(uri)
    dest = workdir / "resume"
    fetch = ResumeFetch(store, dest) if mode == "overlap" else None
    point: ResumePoint | None = fetch_resume_checkpoint(store, dest) if mode == "serial" else None
    size = SIZES[size_name]
    block = BLOCK if on_gpu else 128  # a CPU step at 1024 tokens and the GPU batch would take minutes
    model = build_model(size)
    if fetch is not None:
        point = fetch.wait()
    if mode in ("serial", "overlap") and point is None:
        raise SystemExit(f"{mode}: no checkpoint to resume from in {uri}")
    args = TrainingArguments(
        output_dir=str(workdir / "checkpoints"),
        max_steps=(point.step if point else 0) + 1,
        per_device_train_batch_size=size.batch if on_gpu else 1,
        learning_rate=1e-4,
        bf16=on_gpu,
        optim="adamw_torch_fused" if on_gpu else "adamw_torch",
        save_strategy="steps" if mode == "prepare" else "no",
        save_steps=1,
        logging_steps=1,
        use_cpu=not on_gpu,
        report_to=[],
        disable_tqdm=True,
    )
    callbacks: list[TrainerCallback] = [FirstStep()]
    if mode == "prepare":
        callbacks.insert(0, S3CheckpointCallback(uri, store=store, keep=1, staging_dir=workdir / "staging"))
    trainer_class = Trainer if mode == "serial" else AsyncSaveTrainer
    trainer = trainer_class(model=model, args=args, train_dataset=RandomTokens(block), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(point.local_dir) if point else None)


def build_model(size: Any) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415

    config = GPT2Config(n_layer=size.n_layer, n_embd=size.n_embd, n_head=size.n_head, n_positions=BLOCK)
    return GPT2LMHeadModel(config)


# ----------------------------------------------------------------------------------- the parent side


def run_side(command: list[str], env: dict[str, str], log_path: Path) -> float:
    """Seconds from starting ``command`` until it prints that its first step ended."""
    started = time.perf_counter()
    with log_path.open("w") as log_file:
        child_process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True)
        assert child_process.stdout is not None
        try:
            for line in child_process.stdout:
                if line.strip() == FIRST_STEP:
                    return time.perf_counter() - started
            raise RuntimeError(f"{command[3:]} ended before its first step; see {log_path}")
        finally:
            child_process.kill()
            child_process.wait()


def measure(size_name: str, args: argparse.Namespace, root: Path, server: Any) -> dict[str, Any]:
    from spotray.contract.uris import parse_uri  # noqa: PLC0415
    from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint  # noqa: PLC0415
    from spotray.train.storage.store import S3ObjectStore  # noqa: PLC0415

    env = {**os.environ, **server.env(), "PYTHONUNBUFFERED": "1"}
    uri = f"s3://{BUCKET}/{size_name}"

    def command(mode: str, workdir: Path, checkpoint_uri: str = uri) -> list[str]:
        flags = ["--cpu"] if args.cpu else []
        child_args = [mode, checkpoint_uri, str(workdir), size_name]
        return [sys.executable, "-m", "bench.gpu.gpu_resume", "--child", *child_args, *flags]

    prepare_dir = root / f"{size_name}-prepare"
    started = time.perf_counter()
    subprocess.run(command("prepare", prepare_dir), env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"{size_name}: checkpoint written in {time.perf_counter() - started:.1f}s", flush=True)
    shutil.rmtree(prepare_dir, ignore_errors=True)
    info = latest_complete_checkpoint(S3ObjectStore(parse_uri(uri), server.config))
    assert info is not None
    assert info.manifest is not None
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    for round_index in range(args.rounds):
        order = SIDES if round_index % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            workdir = root / f"{size_name}-{side}-{round_index}"  # empty: nothing cached on this "node"
            checkpoint_uri = f"{uri}-fresh-{round_index}" if side == "fresh" else uri  # fresh: an empty prefix
            log_path = root / f"{size_name}-{side}-{round_index}.log"
            seconds[side].append(run_side(command(side, workdir, checkpoint_uri), env, log_path))
            shutil.rmtree(workdir, ignore_errors=True)
            print(
                f"{size_name} round {round_index + 1} {side:>7}: first step after {seconds[side][-1]:.2f}s", flush=True
            )
    medians = {side: statistics.median(values) for side, values in seconds.items()}
    return {
        "seconds": {side: [round(s, 3) for s in values] for side, values in seconds.items()},
        "medians": {side: round(value, 3) for side, value in medians.items()},
        "overlap_vs_fresh": round(medians["overlap"] / medians["fresh"], 4),
        "serial_vs_fresh": round(medians["serial"] / medians["fresh"], 4),
        "checkpoint_gb": round(info.manifest.total_bytes / 1e9, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["124m"], choices=["124m", "350m", "1.5b", "3b", "tiny"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="measure on the CPU (this machine); no GPU needed")
    parser.add_argument("--out", type=Path, default=None, help="also copy the result files here (device: $OUT)")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "URI", "WORKDIR", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, uri, workdir, size_name = args.child
        child(mode, uri, Path(workdir), size_name, args.cpu)
        return 0
    import torch  # noqa: PLC0415

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_resume: no CUDA device here; nothing measured (use the device tool, or --cpu)")
        return 0
    from spotray.train.storage.local_s3 import LocalS3Server  # noqa: PLC0415

    results = {}
    with scratch_dir("bench-gpu-resume-") as root, LocalS3Server(root / "s3") as server:
        server.create_bucket(BUCKET)
        for size_name in args.models:
            results[size_name] = measure(size_name, args, root, server)
    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    written = []
    for size_name, figures in results.items():
        name = (
            "resume_overlap_cpu" if args.cpu else ("gpu_resume" if size_name == "124m" else f"gpu_resume_{size_name}")
        )
        written.append(
            write_result(
                name,
                figures["overlap_vs_fresh"],
                GOALS.get(size_name, "<= 1.2"),
                "a fresh start of the same model (process start to the end of its first step)",
                "python -m bench.gpu.gpu_resume " + " ".join(sys.argv[1:]),
                {**figures, "model": size_name, "device": device, **machine_details()},
            )
        )
        print(
            f"{size_name} ({figures['checkpoint_gb']} GB): overlap/fresh {figures['overlap_vs_fresh']}, "
            f"serial/fresh {figures['serial_vs_fresh']}"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for path in written:
            shutil.copy(path, args.out / path.name)
        (args.out / "gpu_resume_all.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
