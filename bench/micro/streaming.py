"""MosaicML ``StreamingDataset`` reading MDS shards from S3 against the same shards on local disk.

The dataset: ``--samples`` random samples of ``--sample-bytes`` each, written once with MDSWriter
(4 MiB shards) to a local directory and uploaded to SeaweedFS. Each measurement is a fresh process
that iterates one full epoch with shuffling on: the S3 side starts from an empty cache (every shard
is downloaded while iterating), the local side reads the directory in place. The sides alternate
for ``--rounds`` rounds; the ratio is median(S3 samples/s) / median(local samples/s). Goal >= 0.8.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine_details, write_result
from spotray.contract.uris import parse_uri
from spotray.train.hf.data import NUM_CANONICAL_NODES
from spotray.train.storage.local_s3 import LocalS3Server
from spotray.train.storage.mds_dataset import write_mds_dataset
from spotray.train.storage.store import S3ObjectStore

BUCKET = "bench-streaming"
COLUMNS = {"sample_id": "int", "payload": "bytes"}


def samples(count: int, size: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(0)
    return [{"sample_id": i, "payload": rng.bytes(size)} for i in range(count)]


def read_epoch(remote: str | None, local: str) -> None:
    """Child process: iterate one epoch, print samples/s as JSON."""
    from streaming import StreamingDataset  # noqa: PLC0415 (only the measuring child needs it)

    from spotray.train.hf.streaming_memory import release_streaming_memory  # noqa: PLC0415

    release_streaming_memory(Path(local))
    dataset = StreamingDataset(
        remote=remote, local=local, shuffle=True, shuffle_seed=7, batch_size=32, num_canonical_nodes=NUM_CANONICAL_NODES
    )
    started = time.perf_counter()
    count = sum(1 for _ in dataset)
    print(json.dumps({"samples": count, "samples_per_s": count / (time.perf_counter() - started)}))


def measure(remote: str | None, local: Path, env: dict[str, str]) -> float:
    code = f"from bench.micro.streaming import read_epoch; read_epoch({remote!r}, {str(local)!r})"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900, check=True
    )
    return float(json.loads(result.stdout.strip().splitlines()[-1])["samples_per_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40_000)
    parser.add_argument("--sample-bytes", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"s3": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="spotray-bench-streaming-") as tmp:
        root = Path(tmp)
        with LocalS3Server(root / "s3") as server:
            server.create_bucket(BUCKET)
            store = S3ObjectStore(parse_uri(f"s3://{BUCKET}/mds"), server.config)
            data = samples(args.samples, args.sample_bytes)
            write_mds_dataset(store, data, COLUMNS)
            local_copy = root / "local-mds"
            store.download_files([(info.key, local_copy / info.key) for info in store.list()])
            env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
            env.update(server.env())
            for index in range(args.rounds):
                order = ("s3", "local") if index % 2 == 0 else ("local", "s3")
                for side in order:
                    if side == "s3":
                        rate = measure(f"s3://{BUCKET}/mds", root / f"cache-{index}", env)
                    else:
                        rate = measure(None, local_copy, env)
                    rates[side].append(rate)
                    print(f"  round {index + 1} {side:5s} {rate:,.0f} samples/s", flush=True)
    ratio = statistics.median(rates["s3"]) / statistics.median(rates["local"])
    print(f"S3 / local samples/s: {ratio:.3f}")
    write_result(
        "streaming_s3_vs_local",
        ratio,
        ">= 0.8",
        "the same MDS shards read by StreamingDataset from local disk",
        "python -m bench.micro.streaming",
        {
            "samples_per_s": {side: [round(r) for r in values] for side, values in rates.items()},
            "samples": args.samples,
            "sample_bytes": args.sample_bytes,
            "dataset_mb": round(args.samples * args.sample_bytes / 1e6, 1),
            **machine_details(),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
