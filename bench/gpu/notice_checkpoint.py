"""The emergency checkpoint of a spot notice at GPT-2 124M on this machine's CPU, against a 15 s grace.

GKE gives a spot VM 15 s (more on other clouds) between the notice and the end. A GPT-2 124M
Trainer (the real model size: 12 layers, 768 wide, 50,257 tokens; 128-token blocks to keep CPU
steps short) trains with no periodic checkpoint; at step ``--notice-at`` the notice comes
(``PreemptionNoticeCallback`` with a notice that fires then). The Trainer saves at once, the
callback waits until the checkpoint is complete in S3 (SeaweedFS on loopback) and training stops.

Measured: seconds from the notice to the checkpoint complete in S3, for the async path (the one
the jobs use) and the Trainer's synchronous save, back to back, ``--rounds`` times each.
Written: ``bench/results/notice_checkpoint.json``, ratio = the async path's median / 15 s (goal <= 1).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

from bench.common import machine_details, scratch_dir, write_result
from bench.gpu.gpu_checkpoint import RandomTokens
from spotray.contract.attempts import AttemptId
from spotray.contract.uris import parse_uri
from spotray.train.checkpoints.async_checkpoint import AsyncSaveTrainer
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.hf.callback import S3CheckpointCallback
from spotray.train.hf.notice import PreemptionNoticeCallback
from spotray.train.records.event_log import EventLog, read_events
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.store import S3ObjectStore

BUCKET = "notice"
GRACE_S = 15.0


class NoticeAtStep:
    """A notice that comes once the trainer has done ``step`` steps (what SIGTERM or Ray's notice says)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.calls = 0

    def __call__(self) -> object | None:
        self.calls += 1
        return object() if self.calls >= self.step else None


def run_once(mode: str, server: LocalS3Server, args: argparse.Namespace, round_index: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"notice-{mode}-"))
    uri = f"s3://{BUCKET}/{mode}-{round_index}"
    store = S3ObjectStore(parse_uri(uri), server.config)
    events = EventLog(workdir / "events.jsonl")
    sync = S3CheckpointCallback(
        uri, store=store, staging_dir=workdir / "staging", events=events, async_save=mode == "async"
    )
    notice = PreemptionNoticeCallback(
        sync, events, attempt=AttemptId("notice-bench", 1), notice=NoticeAtStep(args.notice_at), calibration_steps=1
    )
    set_seed(0)
    config = GPT2Config(n_positions=args.block)  # type: ignore[no-untyped-call]  # GPT-2 124M otherwise
    trainer_class = AsyncSaveTrainer if mode == "async" else Trainer
    trainer = trainer_class(
        model=GPT2LMHeadModel(config),  # type: ignore[no-untyped-call]
        args=TrainingArguments(
            output_dir=str(workdir / "checkpoints"),
            max_steps=args.notice_at + 50,
            per_device_train_batch_size=2,
            save_strategy="no",
            use_cpu=True,
            report_to=[],
            disable_tqdm=True,
        ),
        train_dataset=RandomTokens(args.block, count=512, vocab=config.vocab_size),
        callbacks=[sync, notice],
    )
    trainer.train()
    assert notice.stopped_at_step is not None, "the notice did not stop training"
    latest = latest_complete_checkpoint(store)
    assert latest is not None
    assert latest.step == notice.stopped_at_step
    assert notice.noticed_at is not None
    logged = read_events(workdir / "events.jsonl")
    seconds = next(e["seconds"] for e in logged if e["event"] == "emergency_checkpoint")
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "seconds": seconds,
        "step": notice.stopped_at_step,
        "checkpoint_gb": round(latest.manifest.total_bytes / 1e9, 3) if latest.manifest else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--notice-at", type=int, default=4, help="the step at which the notice comes")
    parser.add_argument("--block", type=int, default=128, help="tokens per sample")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"async": [], "sync": []}
    with scratch_dir("notice-s3-") as s3_dir, LocalS3Server(s3_dir) as server:
        server.create_bucket(BUCKET)
        for round_index in range(args.rounds):
            for mode in ("async", "sync") if round_index % 2 == 0 else ("sync", "async"):
                started = time.monotonic()
                outcome = run_once(mode, server, args, round_index)
                results[mode].append(outcome)
                print(
                    f"round {round_index + 1} {mode:>5}: notice to complete in S3 {outcome['seconds']:.2f} s "
                    f"({outcome['checkpoint_gb']} GB; run {time.monotonic() - started:.0f} s)"
                )
    medians = {mode: statistics.median(r["seconds"] for r in runs) for mode, runs in results.items()}
    write_result(
        "notice_checkpoint",
        medians["async"] / GRACE_S,
        "<= 1",
        f"a {GRACE_S:.0f} s grace (GKE's spot notice): notice to a complete emergency checkpoint in S3",
        "python -m bench.gpu.notice_checkpoint " + " ".join(sys.argv[1:]),
        {
            "model": f"GPT-2 124M (12 x 768, vocab 50257), {args.block}-token blocks, batch 2, CPU",
            "median_seconds": {mode: round(value, 2) for mode, value in medians.items()},
            "rounds": results,
            "s3_server": "SeaweedFS on loopback, same machine",
            **machine_details(),
        },
    )
    print(
        f"\nnotice_checkpoint {medians['async'] / GRACE_S:.2f} of the 15 s grace "
        f"(async {medians['async']:.2f} s, sync {medians['sync']:.2f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
