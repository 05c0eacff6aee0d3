"""``spotray checkpoints RUN`` and ``spotray pull RUN DIR``: what a run has saved, and a verified copy of it.

A pull downloads into a hidden directory next to DIR, checks every file's size and SHA-256
against the checkpoint's manifest, and only then renames it to DIR: whatever happens, DIR either
holds a whole, verified checkpoint or does not exist.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotray.cli.exit_codes import CommandFailedError, NotFoundError
from spotray.cli.output import emit, human_age, human_bytes, render_data, render_table
from spotray.cli.target import RunLocation, open_run_store
from spotray.contract.attempts import EXIT_OK
from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV
from spotray.contract.errors import CorruptCheckpointError, SpotrayError
from spotray.contract.names import (
    CHECKPOINT_KEY_SECRET_DATA_KEY,
    DEFAULT_CHECKPOINT_KEY_SECRET,
)
from spotray.train.checkpoints.checkpoint import CheckpointInfo, download_checkpoint, list_checkpoints
from spotray.train.storage.store import ObjectStore


def checkpoint_record(store: ObjectStore, info: CheckpointInfo) -> dict[str, Any]:
    """One checkpoint for ``-o json|yaml``."""
    created = info.manifest.created_at if info.manifest else None
    return {
        "step": info.step,
        "uri": str(store.uri.join(info.prefix)),
        "complete": info.complete,
        "problem": info.problem,
        "sizeBytes": info.size_bytes,
        "files": info.file_count,
        "created": datetime.fromtimestamp(created, UTC).isoformat() if created else None,
        "worldSize": info.manifest.world_size if info.manifest else None,
    }


def checkpoints_table(infos: list[CheckpointInfo], now: float) -> str:
    rows = [
        (
            info.step,
            human_bytes(info.size_bytes),
            info.file_count,
            human_age(now - info.manifest.created_at) if info.manifest else "-",
            "complete" if info.complete else f"incomplete: {info.problem}",
        )
        for info in infos
    ]
    return render_table(("step", "size", "files", "age", "state"), rows)


def list_command(location: RunLocation, fmt: str) -> int:
    store = open_run_store(location)
    infos = list_checkpoints(store)
    if fmt != "table":
        emit(render_data([checkpoint_record(store, info) for info in infos], fmt))
    elif infos:
        emit(checkpoints_table(infos, datetime.now(UTC).timestamp()))
    else:
        emit(f"no checkpoints under {store.uri} yet")
    return EXIT_OK


def choose_checkpoint(store: ObjectStore, infos: list[CheckpointInfo], step: int | None) -> CheckpointInfo:
    """The checkpoint asked for (or the newest complete one), refusing any that is not complete."""
    listing_hint = "`spotray checkpoints RUN` lists the checkpoints and says which are complete"
    if not infos:
        raise NotFoundError(
            f"there are no checkpoints under {store.uri}",
            "check RUN (a run writes its first checkpoint after spec.checkpoint.everySteps steps)",
        )
    if step is None:
        complete = [info for info in infos if info.complete]
        if not complete:
            newest = infos[0]
            raise CommandFailedError(
                f"there is no complete checkpoint under {store.uri}: the newest, {newest.prefix}, "
                f"is incomplete ({newest.problem})",
                f"wait for its upload to finish and try again; {listing_hint}",
            )
        return complete[0]
    chosen = next((info for info in infos if info.step == step), None)
    if chosen is None:
        steps = ", ".join(str(info.step) for info in infos)
        raise NotFoundError(f"there is no checkpoint-{step} under {store.uri} (steps: {steps})", listing_hint)
    if not chosen.complete:
        raise CommandFailedError(
            f"{chosen.prefix} under {store.uri} is incomplete: {chosen.problem}",
            f"pull a complete one: leave out --step for the newest; {listing_hint}",
        )
    return chosen


def pull_command(location: RunLocation, step: int | None, dest: Path) -> int:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise SpotrayError(f"{dest} already exists and is not an empty directory", "give a new DIR, or remove it first")
    store = open_run_store(location)
    info = choose_checkpoint(store, list_checkpoints(store), step)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        fetched = download_checkpoint(store, info, staging)
        fetched.rename(dest)  # replaces an empty DIR; atomic on one filesystem
    except CorruptCheckpointError as error:
        raise CorruptCheckpointError(
            f"{store.uri.join(info.prefix)} is corrupt: {error.problem}",
            "pull an older checkpoint with --step (`spotray checkpoints RUN` lists them) and delete this one",
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    emit(
        f"pulled {info.prefix} ({info.file_count} files, {human_bytes(info.size_bytes)}) "
        f"from {store.uri.join(info.prefix)} into {dest}"
    )
    emit("every file verified against the checkpoint's manifest (size and SHA-256)")
    emit(signature_line(store, info, location))
    return EXIT_OK


def signature_line(store: ObjectStore, info: CheckpointInfo, location: RunLocation) -> str:
    """What the pull could say of who wrote the manifest (spotray/contract/checkpoint_key.py)."""
    signed = info.manifest is not None and info.manifest.signed
    if store.checkpoint_key is not None:
        return f"its manifest is signed with the run's key ({CHECKPOINT_KEY_ENV}): no writer without the key made it"
    if not signed:
        return (
            "its manifest is not signed (the run had no checkpoint key): "
            "it is only as trustworthy as everyone who can write to the bucket"
        )
    # Without the run (a URI): the namespace's key, unless the run's spec.checkpoint.keySecret named another.
    secret = location.key_secret or DEFAULT_CHECKPOINT_KEY_SECRET
    namespace = f" -n {location.namespace}" if location.namespace else ""  # the Secret is in the run's namespace
    return (
        f"its manifest is signed, but the signature was NOT checked: {CHECKPOINT_KEY_ENV} is not set. For a "
        f"TrainingRun: export {CHECKPOINT_KEY_ENV}=$(kubectl get secret {secret}{namespace} "
        f"-o jsonpath='{{.data.{CHECKPOINT_KEY_SECRET_DATA_KEY}}}' | base64 -d) and pull again"
    )
