"""Chaos campaign, cheap trials: SIGKILL at a random moment of an upload, a prune, a download; a stale
attempt racing the fence; a corrupted newest checkpoint; a node lost while a checkpoint whose upload
was killed is only in the nodes' copies. Each against a real S3 server (SeaweedFS).

Every trial starts from a known set of complete checkpoints under a fresh prefix, injects one fault
at a random point, and then checks what a resuming attempt would see:
- every checkpoint that lists as complete downloads and verifies (no torn checkpoint is complete);
- the resume point is at most one checkpoint interval behind the newest checkpoint whose upload
  had begun (nothing older than that is ever lost);
- a superseded attempt completes no checkpoint after the fence moved, and prunes nothing;
- the checkpoint the running attempt resumed from, and the one just uploaded, survive pruning.

Then full runs (bench/campaigns/chaos_runs.py): a real ``spotray run --local`` hit by one or two faults at
random steps (a worker, the driver, the head, a spot notice, the upload process, a 30 s S3 outage),
checked against an uninterrupted run: Succeeded, the budgets spent are the faults', the same batch
at every step, the same final weights, nothing complete lost at any restart.

    .venv/bin/python -m bench.campaigns.chaos --trials 200 --full-runs 20     # make chaos
    .venv/bin/python -m bench.campaigns.chaos --trials 0 --full-runs 3        # only a few full runs
    .venv/bin/python -m bench.campaigns.chaos --trials 40 --full-runs 0 --cheap-kinds node-lost-copies-only
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench.campaigns import chaos_runs
from bench.common import machine_details, write_result
from spotray.contract.attempts import AttemptId
from spotray.contract.errors import CorruptCheckpointError
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.checkpoint import (
    MANIFEST_NAME,
    FileEntry,
    complete_checkpoints,
    download_checkpoint,
    file_sha256,
    prune_checkpoints,
    upload_checkpoint,
)
from spotray.train.checkpoints.node_copies import NodeCopies, ShareRecord
from spotray.train.checkpoints.resume import ResumeFetch, fetch_resume_checkpoint
from spotray.train.records.attempt_records import SupersededError, write_fence
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import RetryPolicy, S3ObjectStore, StoreConfig

BUCKET = "chaos"
INTERVAL = 10  # steps between checkpoints in every trial
FILE_BYTES = 2 << 20
FILES = 4
_FORK = multiprocessing.get_context("fork")


@dataclass(frozen=True)
class Trial:
    kind: str  # a cheap trial's kind, or "run:" and the faults of a full run
    passed: bool
    steps_lost: int
    problem: str = ""
    faults: tuple[str, ...] = ()  # the faults injected (a cheap trial's is its kind)
    landed: str = ""  # where the fault landed: what the store or the node held when it struck


# The window every commit protocol must survive: a checkpoint's files all written, its manifest not yet.
MANIFEST_WINDOW = "all files, manifest pending"


def checkpoint_state(store: S3ObjectStore, step: int) -> str:
    """How far checkpoint-``step`` got in the store: what an upload killed at this moment had done."""
    names = {info.key.rsplit("/", 1)[-1] for info in store.list(f"checkpoint-{step}/")}
    if MANIFEST_NAME in names:
        return "manifest written"
    files = len(names)
    if files == 0:
        return "no file yet"
    return MANIFEST_WINDOW if files == FILES else f"files {files}/{FILES}"


def checkpoints_left(store: S3ObjectStore, steps: list[int]) -> str:
    """Which of ``steps`` a prune killed at this moment had left, a torn one (files, no manifest) marked."""
    states = [f"{step}: {checkpoint_state(store, step)}" for step in steps]
    return "; ".join(states)


def store_for(config: StoreConfig, prefix: str) -> S3ObjectStore:
    return S3ObjectStore(parse_uri(f"s3://{BUCKET}/{prefix}"), config, RetryPolicy(deadline_s=20))


def local_checkpoint(root: Path, step: int, seed: int) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed * 1000 + step)
    for index in range(FILES):
        (path / f"shard-{index}.bin").write_bytes(rng.randbytes(FILE_BYTES))
    return path


def seed_checkpoints(store: S3ObjectStore, root: Path, steps: list[int], attempt: AttemptId | None = None) -> None:
    for step in steps:
        upload_checkpoint(store, local_checkpoint(root, step, 1), step, 1, attempt=attempt)


def killed_at_random(target: Callable[[], object], max_delay_s: float, rng: random.Random) -> float:
    """Run ``target`` in a forked child and SIGKILL it at a random moment; returns the delay used."""
    child = _FORK.Process(target=target)
    child.start()
    delay = rng.uniform(0, max_delay_s)
    child.join(timeout=delay)
    if child.is_alive():
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    return delay


def check_complete_ones_verify(store: S3ObjectStore, scratch: Path) -> str:
    for info in complete_checkpoints(store):
        try:
            download_checkpoint(store, info, scratch / "verify")
        except CorruptCheckpointError as error:
            return f"checkpoint-{info.step} lists as complete but does not verify: {error.problem}"
    return ""


def resume_step(store: S3ObjectStore, scratch: Path) -> int | None:
    point = fetch_resume_checkpoint(store, scratch / "resume")
    return point.step if point else None


def judge(kind: str, store: S3ObjectStore, scratch: Path, newest_begun: int, floor: int) -> Trial:
    """The common checks: complete means verified; resume no older than ``floor`` (one interval back)."""
    problem = check_complete_ones_verify(store, scratch)
    step = resume_step(store, scratch)
    if not problem and (step is None or step < floor):
        problem = f"resumes from {step}, older than checkpoint-{floor}: more than one interval lost"
    lost = newest_begun - (step or 0)
    return Trial(kind, not problem, lost, problem)


# ----------------------------------------------------------------------------------- trial kinds


def checkpoint_30_to_upload(config: StoreConfig, prefix: str, scratch: Path) -> tuple[S3ObjectStore, AttemptId, Path]:
    """Attempt 1 holds the fence, checkpoints 10 and 20 are complete, and checkpoint-30 is ready to go up."""
    store = store_for(config, prefix)
    attempt = AttemptId("chaos", 1)
    write_fence(store, attempt)
    seed_checkpoints(store, scratch / "seed", [10, 20], attempt)
    return store, attempt, local_checkpoint(scratch / "next", 30, 2)


def trial_kill_upload(config: StoreConfig, prefix: str, scratch: Path, rng: random.Random) -> Trial:
    store, attempt, source = checkpoint_30_to_upload(config, prefix, scratch)

    def upload() -> None:
        child_store = store_for(config, prefix)
        upload_checkpoint(child_store, source, 30, 1, attempt=attempt)
        prune_checkpoints(child_store, keep=1, attempt=attempt, just_uploaded=30)

    killed_at_random(upload, 1.5, rng)
    landed = f"checkpoint-30 {checkpoint_state(store, 30)}; older: {checkpoints_left(store, [10, 20])}"
    return replace(judge("kill-upload", store, scratch, newest_begun=30, floor=20), landed=landed)


def trial_kill_before_manifest(config: StoreConfig, prefix: str, scratch: Path, _rng: random.Random) -> Trial:
    """The upload killed exactly between its last file and its manifest (the commit), which a kill at a
    random moment rarely hits: the child kills itself as it is about to write the manifest."""
    store, attempt, source = checkpoint_30_to_upload(config, prefix, scratch)

    def upload_until_the_manifest() -> None:
        child_store = store_for(config, prefix)
        put_bytes = child_store.put_bytes

        def killed_at_the_commit(key: str, data: bytes) -> None:
            if key.endswith(f"/{MANIFEST_NAME}"):
                os.kill(os.getpid(), signal.SIGKILL)
            put_bytes(key, data)

        child_store.put_bytes = killed_at_the_commit  # type: ignore[method-assign]
        upload_checkpoint(child_store, source, 30, 1, attempt=attempt)

    child = _FORK.Process(target=upload_until_the_manifest)
    child.start()
    child.join()
    landed = f"checkpoint-30 {checkpoint_state(store, 30)}"
    return replace(judge("kill-before-manifest", store, scratch, newest_begun=30, floor=20), landed=landed)


def trial_kill_prune(config: StoreConfig, prefix: str, scratch: Path, rng: random.Random) -> Trial:
    store = store_for(config, prefix)
    seed_checkpoints(store, scratch / "seed", [10, 20, 30])
    killed_at_random(lambda: prune_checkpoints(store_for(config, prefix), keep=1, just_uploaded=30), 0.3, rng)
    landed = checkpoints_left(store, [10, 20])
    return replace(judge("kill-prune", store, scratch, newest_begun=30, floor=30), landed=landed)


def trial_kill_download(config: StoreConfig, prefix: str, scratch: Path, rng: random.Random) -> Trial:
    store = store_for(config, prefix)
    seed_checkpoints(store, scratch / "seed", [10, 20])
    dest = scratch / "dest"
    killed_at_random(lambda: fetch_resume_checkpoint(store_for(config, prefix), dest), 0.6, rng)
    on_disk = sum(1 for path in dest.rglob("*") if path.is_file()) if dest.exists() else 0
    landed = f"{on_disk} files on disk"
    # A second attempt on the same node reuses or replaces what the killed download left.
    point = fetch_resume_checkpoint(store, dest)
    if point is None or point.step != 20:
        return Trial("kill-download", False, 20, f"after a killed download the resume point is {point}", landed=landed)
    leftovers = [p.name for p in dest.iterdir() if p.name.startswith("checkpoint-") and p.name != "checkpoint-20"]
    if leftovers:
        return Trial(
            "kill-download", False, 0, f"a torn download was taken as a checkpoint: {leftovers}", landed=landed
        )
    return Trial("kill-download", True, 0, landed=landed)


def trial_stale_attempt(config: StoreConfig, prefix: str, scratch: Path, rng: random.Random) -> Trial:
    """Attempt 1 still uploads checkpoint-30 while attempt 2 starts and claims the fence."""
    store = store_for(config, prefix)
    old, new = AttemptId("chaos", 1), AttemptId("chaos", 2)
    write_fence(store, old)
    seed_checkpoints(store, scratch / "seed", [10, 20], old)
    source = local_checkpoint(scratch / "next", 30, 2)
    result = _FORK.SimpleQueue()

    def old_attempt_uploads() -> None:
        child_store = store_for(config, prefix)
        try:
            upload_checkpoint(child_store, source, 30, 1, attempt=old)
            prune_checkpoints(child_store, keep=1, attempt=old, just_uploaded=30)
            result.put("completed")
        except SupersededError:
            result.put("superseded")

    child = _FORK.Process(target=old_attempt_uploads)
    child.start()
    time.sleep(rng.uniform(0, 1.0))
    write_fence(store, new)  # as the new attempt's driver does before fit() ...
    fenced_at = time.time()
    landed = f"fence moved with checkpoint-30 {checkpoint_state(store, 30)}"
    resumed = resume_step(store, scratch)  # ... then its rank 0 picks the resume point and records it
    write_fence(store, new, resumed_from=resumed)
    child.join()
    outcome = result.get()
    names = {info.step: info for info in complete_checkpoints(store)}
    if resumed is not None and resumed not in names:
        return Trial("stale-attempt", False, 30, f"checkpoint-{resumed}, being resumed from, was deleted")
    late = names.get(30)
    if outcome == "superseded" and late is not None and late.manifest and late.manifest.created_at > fenced_at:
        return Trial("stale-attempt", False, 0, "a superseded attempt completed checkpoint-30 after the fence")
    return replace(judge("stale-attempt", store, scratch, newest_begun=30, floor=20), landed=landed)


def trial_corrupt_newest(config: StoreConfig, prefix: str, scratch: Path, rng: random.Random) -> Trial:
    """The newest checkpoint has the right sizes and bad bytes; keep=1; the next checkpoint must survive."""
    store = store_for(config, prefix)
    seed_checkpoints(store, scratch / "seed", [10, 20])
    shard = f"checkpoint-20/shard-{rng.randrange(FILES)}.bin"
    store.put_bytes(shard, bytes(FILE_BYTES))  # same size, wrong bytes
    landed = shard
    resumed = resume_step(store, scratch)
    if resumed != 10:
        return Trial(
            "corrupt-newest", False, 20, f"resumed from {resumed}, not the verified checkpoint-10", landed=landed
        )
    upload_checkpoint(store, local_checkpoint(scratch / "next", 15, 3), 15, 1)  # trained on from 10
    prune_checkpoints(store, keep=1, just_uploaded=15)
    after = resume_step(store, scratch / "again")
    if after != 15:
        return Trial(
            "corrupt-newest", False, 15 - (after or 0), f"after pruning, resumes from {after}, not 15", landed=landed
        )
    return Trial("corrupt-newest", True, 5, landed=landed)


def plant_ring_copies(store: S3ObjectStore, source: Path, step: int, root: Path) -> list[NodeCopies]:
    """What the ring of two nodes leaves of the save of ``step`` (train/checkpoints/node_copies.py): node 0's
    share is the first half of the files, node 1's the rest, and each node holds both shares and their records."""
    names = sorted(path.name for path in source.iterdir())
    shares = [names[: len(names) // 2], names[len(names) // 2 :]]
    nodes = [NodeCopies(root / f"node-{node}") for node in (0, 1)]
    for copies in nodes:
        copies.keep_own(step, source)  # hard links: both shares, as its own and its neighbour's
        for node, share in enumerate(shares):
            files = {name: FileEntry((source / name).stat().st_size, file_sha256(source / name)) for name in share}
            resume = {"global_step": step} if node == 0 else {}
            copies.keep_record(ShareRecord(step, "save-a", node, 2, 2, str(store.uri), files, resume))
    return nodes


def trial_node_lost_copies_only(config: StoreConfig, prefix: str, scratch: Path, rng: random.Random) -> Trial:
    """checkpoint-30's upload killed at a random moment, one node (or both) lost with its copies, and the
    next start, itself killed at a random moment half the time, completes it from what is left: with a
    node left it must resume from 30; with none, from 20 (every copy but the store's gone)."""
    store, _, source = checkpoint_30_to_upload(config, prefix, scratch)
    nodes = plant_ring_copies(store, source, 30, scratch / "copies")
    killed_at_random(lambda: upload_checkpoint(store_for(config, prefix), source, 30, 1), 0.4, rng)
    state = checkpoint_state(store, 30)
    lost = rng.choice(["node 0", "node 1", "both nodes"])
    for node, copies in enumerate(nodes):
        if lost in (f"node {node}", "both nodes"):
            shutil.rmtree(copies.root)
    left = next((copies for node, copies in enumerate(nodes) if lost not in (f"node {node}", "both nodes")), None)
    attempt = AttemptId("chaos", 2)
    write_fence(store, attempt)  # the next attempt's driver claims the URI before its workers start

    def next_start() -> None:
        ResumeFetch(store_for(config, prefix), scratch / "resume-node", attempt, left).wait()

    start_killed = rng.random() < 0.5
    if start_killed:
        killed_at_random(next_start, 0.5, rng)
    next_start()  # a start after the killed one, or the only one
    landed = f"checkpoint-30 {state}; {lost} lost" + ("; the next start killed once" if start_killed else "")
    floor = 20 if left is None else 30
    return replace(judge("node-lost-copies-only", store, scratch, newest_begun=30, floor=floor), landed=landed)


KINDS: dict[str, Callable[[StoreConfig, str, Path, random.Random], Trial]] = {
    "kill-upload": trial_kill_upload,
    "kill-before-manifest": trial_kill_before_manifest,
    "kill-prune": trial_kill_prune,
    "kill-download": trial_kill_download,
    "stale-attempt": trial_stale_attempt,
    "corrupt-newest": trial_corrupt_newest,
    "node-lost-copies-only": trial_node_lost_copies_only,
}


def report(number: int, trial: Trial) -> None:
    mark = "ok  " if trial.passed else "FAIL"
    landed = f" [{trial.landed}]" if trial.landed else ""
    print(f"{mark} {number:4d} {trial.kind:30s} steps lost {trial.steps_lost:3d}{landed} {trial.problem}", flush=True)


def cheap_trials(count: int, rng: random.Random, work: Path, kinds: list[str] | None = None) -> list[Trial]:
    trials: list[Trial] = []
    with LocalS3Server(work / "s3") as server:
        server.create_bucket(BUCKET)
        for number in range(count):
            kind = rng.choice(sorted(kinds or KINDS))
            scratch = work / f"trial-{number}"
            try:
                trial = KINDS[kind](server.config, f"trial-{number}", scratch, rng)
            except Exception as error:  # noqa: BLE001 - a trial that raises is a failed trial, not the end
                trial = Trial(kind, False, 0, f"raised {type(error).__name__}: {error}"[:500])
            shutil.rmtree(scratch, ignore_errors=True)
            trials.append(replace(trial, faults=(kind,)))
            report(number, trials[-1])
    return trials


def full_run_trials(
    count: int, rng: random.Random, work: Path, choices: list[str]
) -> tuple[list[Trial], dict[str, list[int]]]:
    """``count`` full runs; also the steps lost at each restart, by the faults of its run."""
    if not count:
        return [], {}
    print("the uninterrupted reference run ...", flush=True)
    reference = chaos_runs.reference_run(work)
    print(f"  done in {reference.seconds:.0f} s", flush=True)
    trials: list[Trial] = []
    lost_by_faults: dict[str, list[int]] = {}
    for number in range(count):
        run = chaos_runs.full_run_trial(work, number, rng, reference, choices)
        kinds = tuple(fault.kind for fault in run.faults)
        name = "run:" + "+".join(f"{fault.kind}@{fault.step}" for fault in run.faults)
        problem = "; ".join(run.problems)[:1000]
        landed = "; ".join(run.injected)[:500]
        trials.append(Trial(name, not run.problems, max(run.steps_lost, default=0), problem, kinds, landed))
        lost_by_faults.setdefault("+".join(kinds), []).extend(run.steps_lost)
        report(number, trials[-1])
        print(f"       {run.seconds:.0f} s; injected: {'; '.join(run.injected)}; lost {run.steps_lost}", flush=True)
        if not run.problems:
            shutil.rmtree(work / f"run-{number}", ignore_errors=True)  # a failed run's files are kept to read
    return trials, lost_by_faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.campaigns.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="cheap trials (seconds each)")
    parser.add_argument("--full-runs", type=int, default=20, help="full local runs (a minute or two each)")
    parser.add_argument(
        "--full-run-kinds",
        default=",".join(chaos_runs.FULL_RUN_KINDS),
        help=f"comma-separated faults for the full runs, taking turns (default: all of {chaos_runs.FULL_RUN_KINDS})",
    )
    parser.add_argument(
        "--cheap-kinds",
        default=",".join(sorted(KINDS)),
        help=f"comma-separated kinds for the cheap trials, taking turns at random (default: all of {sorted(KINDS)})",
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--name", default="chaos", help="bench/results/<name>.json")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (failed runs are kept anyway)")
    args = parser.parse_args(argv)
    choices = [kind.strip() for kind in args.full_run_kinds.split(",") if kind.strip()]
    if unknown := sorted(set(choices) - set(chaos_runs.FULL_RUN_KINDS)):
        parser.error(f"unknown full-run faults {unknown}; choose from {chaos_runs.FULL_RUN_KINDS}")
    cheap_kinds = [kind.strip() for kind in args.cheap_kinds.split(",") if kind.strip()]
    if unknown := sorted(set(cheap_kinds) - set(KINDS)):
        parser.error(f"unknown cheap trial kinds {unknown}; choose from {sorted(KINDS)}")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="spotray-chaos-"))
    started = time.monotonic()
    cheap = cheap_trials(args.trials, rng, work, cheap_kinds)
    full, lost_by_faults = full_run_trials(args.full_runs, rng, work, choices)
    trials = cheap + full
    failed_runs = [t for t in full if not t.passed]
    if args.keep or failed_runs:
        print(f"kept {work} (the failed runs' logs, events and samples)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    passes = sum(t.passed for t in trials)
    lost: dict[str, list[int]] = {}
    for trial in cheap:
        lost.setdefault(trial.kind, []).append(trial.steps_lost)
    details = {
        "trials": len(trials),
        "passes": passes,
        "full_runs": len(full),
        "full_run_passes": sum(t.passed for t in full),
        "faults": dict(
            Counter(kind for t in cheap for kind in t.faults)
            + Counter(f"run:{kind}" for t in full for kind in t.faults)
        ),
        "max_steps_lost": {kind: max(values) for kind, values in lost.items()},
        # Where each cheap trial's fault landed (the store's or the node's state when it struck), and
        # how many landed in the window between a checkpoint's last file and its manifest.
        "landed": {
            kind: dict(Counter(t.landed for t in cheap if t.kind == kind)) for kind in sorted({t.kind for t in cheap})
        },
        "in_manifest_window": sum(MANIFEST_WINDOW in t.landed for t in cheap),
        "full_run_injected": [f"{t.kind}: {t.landed}" for t in full],
        "full_run_steps_lost_per_restart": lost_by_faults,
        "full_run_setup": {
            "steps": chaos_runs.MAX_STEPS,
            "checkpoint_every": chaos_runs.INTERVAL,
            "workers": 2,
            "s3_outage_s": chaos_runs.OUTAGE_S,
        },
        "checkpoint_interval_steps": INTERVAL,
        "failures": [f"{t.kind}: {t.problem}" for t in trials if not t.passed][:20],
        "seconds": round(time.monotonic() - started, 1),
        "seed": args.seed,
        **machine_details(),
    }
    path = write_result(
        args.name,
        ratio=passes / max(len(trials), 1),
        goal=">= 1.0",
        baseline="every trial passes its invariants (passes / trials)",
        command=" ".join([".venv/bin/python -m bench.campaigns.chaos", *(argv if argv is not None else sys.argv[1:])]),
        details=details,
    )
    print(f"{passes}/{len(trials)} trials passed in {details['seconds']} s; wrote {path}")
    return 0 if passes == len(trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
