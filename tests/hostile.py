"""What every hostile-bucket test checks after planting an honest checkpoint-10 and a checkpoint-20
whose manifest names a file outside it: the store behind them is the test's (in memory, or SeaweedFS)."""

from __future__ import annotations

from pathlib import Path

from spotray.train.checkpoints.checkpoint import list_checkpoints
from spotray.train.checkpoints.resume import fetch_resume_checkpoint
from spotray.train.storage.store import ObjectStore


def resume_skips_the_escaping_checkpoint(store: ObjectStore, tmp_path: Path, escaping_name: str) -> str:
    """checkpoint-20 is not complete, a resume takes checkpoint-10 and writes nothing outside its
    destination (under ``tmp_path``); returns why checkpoint-20 is not complete."""
    dest = tmp_path / "deep" / "er" / "resume"
    dest.mkdir(parents=True)
    newest = list_checkpoints(store)[0]
    assert newest.step == 20
    assert not newest.complete
    assert newest.problem is not None
    assert repr(escaping_name) in newest.problem

    resume = fetch_resume_checkpoint(store, dest)
    assert resume is not None
    assert resume.step == 10, "the honest checkpoint is used"
    written = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert written, "nothing was downloaded: the test proved nothing"
    assert all(dest in p.parents for p in written), f"files written outside {dest}: {written}"
    return newest.problem
