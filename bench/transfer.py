"""Checkpoint transfer speed: our S3 client against s5cmd, both ways, on the same server and data.

A directory shaped like a Hugging Face checkpoint (a model file, an optimizer file twice its size,
small state files; ``--size-mb`` in all, random bytes) is uploaded and downloaded ``--rounds``
times by each side, alternating which goes first. s5cmd (Go, highly parallel) is the speed anchor
named in the issue. Ratios are s5cmd seconds / our seconds (our throughput as a fraction of
s5cmd's), medians over the rounds. Goal >= 0.8 both ways.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import machine_details, write_result
from train.local_s3 import LocalS3Server
from train.store import S3ObjectStore, download_dir, parse_uri, upload_dir

BUCKET = "bench-transfer"


def make_checkpoint_dir(root: Path, size_mb: int) -> Path:
    """Files in the proportions of an HF checkpoint with an Adam optimizer (1 : 2 plus small files)."""
    root.mkdir(parents=True)
    model_bytes = size_mb * 1024 * 1024 // 3
    chunk = os.urandom(8 * 1024 * 1024)
    for name, size in (("model.safetensors", model_bytes), ("optimizer.pt", 2 * model_bytes)):
        with (root / name).open("wb") as handle:
            for start in range(0, size, len(chunk)):
                handle.write(chunk[: min(len(chunk), size - start)])
    for name in ("config.json", "trainer_state.json", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        (root / name).write_bytes(os.urandom(4096))
    return root


def s5cmd_binary() -> str:
    beside = Path(sys.executable).parent / "s5cmd"
    return str(beside) if beside.exists() else "s5cmd"


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def run_s5cmd(server: LocalS3Server, *args: str) -> None:
    env = {**os.environ, **server.env()}
    subprocess.run(
        [s5cmd_binary(), "--endpoint-url", server.endpoint_url, *args], env=env, check=True, capture_output=True
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=300)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    try:
        source = make_checkpoint_dir(root / "source", args.size_mb)
        total_mb = sum(p.stat().st_size for p in source.iterdir()) / 1e6
        times: dict[str, list[float]] = {"ours_up": [], "s5cmd_up": [], "ours_down": [], "s5cmd_down": []}
        with LocalS3Server(root / "s3") as server:
            server.create_bucket(BUCKET)
            ours = S3ObjectStore(parse_uri(f"s3://{BUCKET}"), server.config)
            for round_index in range(args.rounds):
                prefix = f"round-{round_index}"

                def ours_up(prefix: str = prefix) -> None:
                    upload_dir(ours, source, f"{prefix}/ours")

                def s5cmd_up(prefix: str = prefix) -> None:
                    run_s5cmd(server, "cp", f"{source}/", f"s3://{BUCKET}/{prefix}/s5cmd/")

                def ours_down(prefix: str = prefix) -> None:
                    download_dir(ours, f"{prefix}/ours", root / "down-ours")

                def s5cmd_down(prefix: str = prefix) -> None:
                    run_s5cmd(server, "cp", f"s3://{BUCKET}/{prefix}/s5cmd/*", f"{root / 'down-s5cmd'}/")

                pairs = [("ours_up", ours_up), ("s5cmd_up", s5cmd_up)]
                for name, action in pairs if round_index % 2 == 0 else reversed(pairs):
                    times[name].append(timed(action))
                pairs = [("ours_down", ours_down), ("s5cmd_down", s5cmd_down)]
                for name, action in pairs if round_index % 2 == 0 else reversed(pairs):
                    target = root / ("down-ours" if name == "ours_down" else "down-s5cmd")
                    shutil.rmtree(target, ignore_errors=True)
                    target.mkdir()
                    times[name].append(timed(action))
                rates = {k: f"{total_mb / v[-1]:.0f} MB/s" for k, v in times.items()}
                print(f"round {round_index + 1}: {rates}")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    median = {k: statistics.median(v) for k, v in times.items()}
    version = subprocess.run([s5cmd_binary(), "version"], capture_output=True, text=True, check=False).stdout.strip()
    config = ours.config
    details_common = {
        "checkpoint_mb": round(total_mb, 1),
        "files": "model.safetensors (1/3), optimizer.pt (2/3), 5 small state files",
        "rounds": args.rounds,
        "our_settings": {
            "max_concurrency": config.max_concurrency,
            "multipart_chunk_mb": config.multipart_chunk_bytes // (1024 * 1024),
        },
        "s3_server": "SeaweedFS on 127.0.0.1, same machine",
        **machine_details(),
    }
    command = "make bench  (or: .venv/bin/python -m bench.transfer " + " ".join(sys.argv[1:]) + ")"
    for direction, word in (("up", "upload"), ("down", "download")):
        ratio = median[f"s5cmd_{direction}"] / median[f"ours_{direction}"]
        write_result(
            f"transfer_{word}",
            ratio,
            ">= 0.8",
            f"s5cmd {version} (default workers) on the same server and files",
            command,
            {
                **details_common,
                "ours_s": [round(t, 3) for t in times[f"ours_{direction}"]],
                "s5cmd_s": [round(t, 3) for t in times[f"s5cmd_{direction}"]],
                "ours_mb_per_s": round(total_mb / median[f"ours_{direction}"], 1),
                "s5cmd_mb_per_s": round(total_mb / median[f"s5cmd_{direction}"], 1),
            },
        )
        print(
            f"transfer_{word:<8} ours {total_mb / median[f'ours_{direction}']:.0f} MB/s, "
            f"s5cmd {total_mb / median[f's5cmd_{direction}']:.0f} MB/s, ratio {ratio:.2f} (goal >= 0.8)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
