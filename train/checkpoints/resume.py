"""Find and fetch the checkpoint to resume from.

``ResumeFetch`` is what every training process does: the download starts in the background from
the worker's first lines, and every rank ends on rank 0's choice.

The newest complete checkpoint is downloaded and verified; if that fails for a fault of the checkpoint
itself (``checkpoint_fault``: bytes that do not match the manifest, an object it lists gone, keys that
cannot be files here), the next older complete one is tried, with a warning naming the one skipped and
why. A fault of the store, the node or the code is raised instead. No complete checkpoint that can be
fetched means a fresh start, unless a *foreign* checkpoint (whole, but not signed with the run's key)
is newer than the one chosen: then the job refuses to start (``refuse_foreign_newer``, bad input), as
resuming below it, or from nothing, would train its steps again and write over it.

A checkpoint can also fetch and verify and still not load: the bytes are the ones written, but not
for the model this job builds, or files its loader refuses. The job passes a ``LoadCheck`` (the
Trainer's: train/hf/loadable.py) and rank 0 runs it on the checkpoint chosen, once the model is
built; one that fails is skipped like a corrupt one, with a warning, for the next older. When none
loads, the URI holds another job's checkpoints: ``UnloadableCheckpointError``, bad input, and no
fresh start on top of them.

``prefetch_in_background`` starts that download early, in the driver, when the workers will run on
the same machine: a worker's own fetch waits for it (``download_checkpoint`` locks the directory)
and reuses the verified copy.
"""

from __future__ import annotations

import errno
import logging
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from safetensors import SafetensorError

from spotray.contract.attempts import AttemptId
from spotray.contract.errors import (
    Cause,
    CorruptCheckpointError,
    ForeignCheckpointError,
    StoreRequestError,
    UnloadableCheckpointError,
    cause_of,
)
from spotray.contract.names import DEFAULT_CHECKPOINT_KEY_SECRET
from spotray.train.checkpoints.checkpoint import (
    NO_MANIFEST,
    VANISHED,
    CheckpointInfo,
    Manifest,
    complete_checkpoints,
    delete_other_copies,
    download_checkpoint,
    install_copy,
    latest_complete_checkpoint,
    list_checkpoints,
    log_incomplete,
    manifest_exists,
    verify_local_checkpoint,
)
from spotray.train.checkpoints.complete_from_copies import (
    Completion,
    plan_completion,
    upload_from_copies,
    write_completed_manifest,
)
from spotray.train.checkpoints.node_copies import NodeCopies
from spotray.train.checkpoints.shared_read import Share, exchange, node_layout, read_share
from spotray.train.processes.ranks import all_gather_objects, barrier, broadcast_from_rank0, world_rank
from spotray.train.records.attempt_records import write_fence
from spotray.train.storage.store import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """A verified local copy of a complete checkpoint: pass ``local_dir`` to ``Trainer.train``."""

    step: int
    local_dir: Path
    manifest: Manifest
    uri: str


# Raises UnloadableCheckpointError when the job cannot load this checkpoint; anything else it raises
# is not the checkpoint's fault (the node, the code) and ends the attempt.
LoadCheck = Callable[[ResumePoint], None]

# What reading a damaged or foreign file raises: safetensors' header checks, torch.load of a damaged
# archive (RuntimeError, EOFError), a weights_only load refusing a pickled object, bad JSON, a missing key.
_READ_ERRORS = (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError, KeyError, TypeError)
# Enough of a loader's message to say what it refused (weights_only's runs to a page).
_REASON_CHARS = 300
T = TypeVar("T")
# What a LoadCheck's refusal tells the user to do: the fallback is automatic, the URI is theirs.
UNLOADABLE_FIX = "the run goes on from an older checkpoint; if none loads, give the run a checkpoint URI of its own"


def read_or_refuse(name: str, load: Callable[[], T], fix: str = UNLOADABLE_FIX) -> T:
    """``load()``, for a ``LoadCheck``: what a damaged or foreign file raises becomes ``UnloadableCheckpointError``."""
    try:
        return load()
    except _READ_ERRORS as error:
        reason = " ".join(str(error).split())[:_REASON_CHARS]  # one line: load_state_dict's starts with a title
        raise UnloadableCheckpointError(f"{name} cannot be read ({type(error).__name__}: {reason})", fix) from error


def load_torch_file(path: Path) -> object:
    """A torch file as a check reads it: tensors only (``weights_only``), mapped rather than read."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


# Errors writing the local copy that come from the checkpoint's keys, not from the node: S3 keeps the
# keys ``x/y`` and ``x/y/z`` side by side, and a key's segment may be longer than a file's name.
_KEY_LAYOUT_ERRNOS = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})


def checkpoint_fault(error: BaseException) -> str | None:
    """Why ``error``, raised fetching one checkpoint, is that checkpoint's own fault; None when it is not.

    Its own fault (an older complete checkpoint may do, so resume skips it with this reason): bytes or
    a manifest that do not verify; the store refusing one of its objects for good (an object the
    manifest lists, gone while the manifest stays; a directory store says FileNotFoundError); keys
    that cannot be files on this node.

    Not its fault (the error is raised and ends the attempt with its cause): skipping would resume
    from an older step, or afresh, for a fault that no checkpoint can cure and that says nothing
    about this one. An infrastructure fault (``cause_of``: a store that does not answer or keeps
    failing, a connection cut or timed out), after which the next attempt finds the same newest
    checkpoint; the run's access (refused credentials, a missing bucket: every checkpoint would fail
    alike); the node's disk (full, read-only, denied); anything else, a bug.
    """
    if cause_of(error) is Cause.INFRASTRUCTURE:
        return None
    if isinstance(error, CorruptCheckpointError):
        return error.problem
    # The S3 store raises what failed the download, the local write included, as a StoreRequestError's cause.
    local = error if isinstance(error, OSError) else error.__cause__
    if isinstance(local, OSError):
        if local.errno in _KEY_LAYOUT_ERRNOS:
            return f"its keys cannot be files on this node ({local})"
        return str(local) if isinstance(local, FileNotFoundError) else None
    return error.problem if isinstance(error, StoreRequestError) else None


def fetch_resume_checkpoint(
    store: ObjectStore,
    dest_root: Path,
    check: LoadCheck | None = None,
    *,
    below_step: int | None = None,
    skipped: list[str] | None = None,
) -> ResumePoint | None:
    """Download the newest complete checkpoint that can be fetched and verifies into ``dest_root``; None if none can.

    With ``check``, also one the job can load (``loadable_or_older``); with ``below_step``, only older ones.
    Each complete checkpoint passed over for a fault of its own is added to ``skipped`` ("checkpoint-40:
    why"): the job reports them, so that the run's status says what it did not resume from (issue #69).
    """
    if check is not None:
        fetched = fetch_resume_checkpoint(store, dest_root, below_step=below_step, skipped=skipped)
        return loadable_or_older(store, dest_root, fetched, check, skipped)
    checkpoints = list_checkpoints(store)
    log_incomplete(store, checkpoints)

    def note_damaged_newer_than(step: int | None) -> None:
        if skipped is not None:
            skipped.extend(damaged_newer_than(checkpoints, step, below_step))

    for info in (c for c in checkpoints if c.complete):
        assert info.manifest is not None  # complete implies a parsed manifest
        if below_step is not None and info.step >= below_step:
            continue
        refuse_foreign_newer(store, checkpoints, info.step)
        try:
            local_dir = download_checkpoint(store, info, dest_root)
        except Exception as error:
            problem = checkpoint_fault(error)
            if problem is None:
                raise  # the store's, the node's or the code's: an older checkpoint would only hide it
            where = store.uri.join(info.prefix)
            if isinstance(error, StoreRequestError | FileNotFoundError) and not manifest_exists(store, info.prefix):
                log.info("skipping %s: deleted while being downloaded (pruned meanwhile)", where)
            else:
                log.warning("skipping %s: %s", where, problem)
                if skipped is not None:
                    skipped.append(f"{info.prefix}: {problem}")
            continue
        note_damaged_newer_than(info.step)
        return ResumePoint(info.step, local_dir, info.manifest, str(store.uri.join(info.prefix)))
    refuse_foreign_newer(store, checkpoints, None)
    note_damaged_newer_than(None)
    return None


def damaged_newer_than(checkpoints: list[CheckpointInfo], step: int | None, below_step: int | None = None) -> list[str]:
    """The checkpoints damaged as listed (a file of another size than its manifest says, a manifest that
    does not parse) newer than the one chosen (None: a fresh start), as ``skipped`` notes them: passed
    over like one that fails its download. An upload in flight or pruned is not damaged."""
    return [
        f"{c.prefix}: {c.problem}"
        for c in checkpoints
        if not c.complete and not c.foreign and c.problem not in (NO_MANIFEST, VANISHED)
        if (below_step is None or c.step < below_step) and (step is None or c.step > step)
    ]


def refuse_foreign_newer(store: ObjectStore, checkpoints: list[CheckpointInfo], step: int | None) -> None:
    """Raise ``ForeignCheckpointError`` (bad input) when a checkpoint newer than ``step`` (None: a fresh
    start) is foreign: its manifest is whole, but not signed with this run's key. Resuming from older,
    or from nothing, would train steps that checkpoint holds and then write over it; which key signed it
    is the user's to say (issue #69: a run created again got a new key and trained from step 0 over the
    old run's checkpoints, saying only "fresh start")."""
    foreign = [c for c in checkpoints if c.foreign and (step is None or c.step > step)]
    if not foreign:
        return
    newest = foreign[0]
    instead = "start from step 0" if step is None else f"resume from the older checkpoint-{step}"
    raise ForeignCheckpointError(
        f"{store.uri.join(newest.prefix)} {newest.problem}; this run would {instead} and write over it"
        + (f" (and {len(foreign) - 1} more like it)" if len(foreign) > 1 else ""),
        "run it with the key that signed it: on a cluster, spec.checkpoint.keySecret naming that key's Secret "
        f"(the namespace's {DEFAULT_CHECKPOINT_KEY_SECRET} unless the run named another; <run>-checkpoint-key for "
        "a run begun when each run had its own key); in local mode, that SPOTRAY_CHECKPOINT_KEY. Or give "
        "this run a checkpoint URI of its own. If nobody you trust wrote them, delete them "
        "(`spotray checkpoints URI` lists them)",
    )


def loadable_or_older(
    store: ObjectStore,
    dest_root: Path,
    point: ResumePoint | None,
    check: LoadCheck,
    skipped: list[str] | None = None,
) -> ResumePoint | None:
    """``point`` if ``check`` passes, else the newest older checkpoint that fetches and passes; None on a fresh start.

    Raises ``UnloadableCheckpointError`` (bad input) when checkpoints were there and none loads. Each
    one passed over is added to ``skipped`` (``fetch_resume_checkpoint``).
    """
    refused: list[str] = []
    while point is not None:
        try:
            check(point)
        except UnloadableCheckpointError as error:
            log.warning("skipping %s: this job cannot load it: %s", point.uri, error.problem)
            refused.append(f"checkpoint-{point.step}: {error.problem}")
            if skipped is not None:
                skipped.append(f"checkpoint-{point.step}: this job cannot load it: {error.problem}")
            point = fetch_resume_checkpoint(store, dest_root, below_step=point.step, skipped=skipped)
            continue
        return point
    if not refused:
        return None
    shown = "; ".join(refused[:3]) + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
    raise UnloadableCheckpointError(
        f"no complete checkpoint under {store.uri} can be loaded by this job ({shown})",
        "they were written for another model or by another job: give this run a checkpoint URI of its own, "
        "or run it with the settings that wrote them",
    )


def prefetch_in_background(store: ObjectStore, dest_root: Path) -> threading.Thread:
    """Fetch the checkpoint to resume from into ``dest_root`` in a background thread; best effort.

    A failure here is only logged: the workers fetch for themselves and report what goes wrong.
    """

    def prefetch() -> None:
        started = time.monotonic()
        try:
            point = fetch_resume_checkpoint(store, dest_root)
        except Exception as error:  # noqa: BLE001 - best effort: the workers' own fetch reports failures
            log.warning("prefetching the checkpoint to resume from failed (%s); the workers fetch it themselves", error)
            return
        if point is not None:
            log.info("prefetched checkpoint-%d into %s in %.1fs", point.step, dest_root, time.monotonic() - started)

    thread = threading.Thread(target=prefetch, name="spotray-resume-prefetch", daemon=True)
    thread.start()
    return thread


def node_resume_dir(workdir: Path) -> Path:
    """Where the processes of a node keep the one copy of the checkpoint they resumed from."""
    return workdir / "resume"


class ResumeFetch:
    """The checkpoint to resume from, fetched in the background while the worker builds its model.

    Started as early as the worker starts; ``wait`` (every rank, from the main thread) returns the
    same verified checkpoint on every rank, or None on a fresh start:

    - rank 0's thread downloads the newest complete checkpoint that verifies (an older one when the
      newest cannot be fetched or turns out corrupt: ``fetch_resume_checkpoint``);
    - every other rank's thread downloads the newest complete checkpoint it sees, betting that rank 0
      ends with the same one (a newest that cannot be fetched or a checkpoint landing meanwhile lose
      the bet);
    - ``wait`` broadcasts rank 0's choice; a rank that fetched another step downloads that one then.

    Collectives run only in the constructor and ``wait``, on the main thread: the threads only talk to
    the store. Ranks of one node share ``dest_root`` (``download_checkpoint`` lets one download and the
    others reuse it). On several nodes the checkpoint is read once per run, not once per node
    (train/checkpoints/shared_read.py): each node's leader reads a share of the newest complete
    checkpoint in the background, and ``wait`` exchanges the shares; when the leaders do not end on
    the same checkpoint with every share read, ``wait`` takes the one-node path above. With
    ``copies`` (the checkpoints each node kept when it saved: train/checkpoints/node_copies.py), a
    file some node still holds is read from that node's copy, not from S3.
    """

    def __init__(
        self, store: ObjectStore, dest_root: Path, attempt: AttemptId | None = None, copies: NodeCopies | None = None
    ) -> None:
        self.store = store
        self.dest_root = dest_root
        self.attempt = attempt
        self.copies = copies
        self.rank = world_rank()
        self.fetched: ResumePoint | None = None
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.skipped: list[str] = []  # rank 0: newer complete checkpoints not resumed from, and why
        self.fetch_s: float | None = None  # how long the background fetch took
        self.waited_s: float | None = None  # how long ``wait`` blocked on it: the part not hidden
        # Several nodes: where each node's copy came from (rank 0, once ``wait`` exchanged the shares).
        self.read: SharedReadCount | None = None
        self.layout = node_layout(dest_root, copies)
        self._listed: list[CheckpointInfo] = []
        self._share: Share | None = None
        self._fetch_in_background = self._fetch if self.layout.nodes == 1 else self._fetch_share
        # A save the nodes hold whole and the store does not (train/checkpoints/complete_from_copies.py): its files
        # are uploaded first (in the background), the fetch follows in ``wait``.
        self.completion = self._plan_completion()
        self.completed: Manifest | None = None  # rank 0: the manifest written for it
        self.completed_bytes = 0  # rank 0: what the nodes uploaded for it
        self._uploaded: tuple[str, int] | None = None  # a leader's upload for it: (what went wrong, bytes)
        target = self._upload_from_copies if self.completion is not None else self._fetch_in_background
        self._thread = threading.Thread(target=target, name="spotray-resume-fetch", daemon=True)
        self._thread.start()

    def _plan_completion(self) -> Completion | None:
        """Rank 0's plan to complete a checkpoint from the nodes' copies, on every rank; None when no
        node holds a record, or nothing is to complete (a collective when some node holds one)."""
        if not any(self.layout.records):
            return None
        plan = None
        if self.rank == 0:
            try:
                listed = list_checkpoints(self.store)
                plan = plan_completion(self.layout.records, self.layout.held, str(self.store.uri), listed)
            except Exception as error:  # noqa: BLE001 - no plan: the fetch lists again and says what a fault means
                log.warning("could not look for a checkpoint to complete from the nodes' copies: %s", error)
        agreed: Completion | None = broadcast_from_rank0(plan)
        return agreed

    def _upload_from_copies(self) -> None:
        """A node's first process: its files of the checkpoint to complete, from its copies."""
        assert self.completion is not None
        assert self.copies is not None
        if not self.layout.is_leader:
            return
        try:
            sent = upload_from_copies(self.store, self.completion, self.layout.node, self.copies, self.attempt)
            self._uploaded = ("", sent)
        except Exception as error:  # noqa: BLE001 - said in wait(); the resume goes on from the store's newest complete
            self._uploaded = (f"{type(error).__name__}: {error}", 0)

    def _finish_completion(self) -> None:
        """Every rank: rank 0 writes the completed checkpoint's manifest when every node's upload
        succeeded; the broadcast also holds every rank until then (their listing must see it)."""
        plan = self.completion
        assert plan is not None
        verdicts = [v for v in all_gather_objects(self._uploaded if self.layout.is_leader else None) if v is not None]
        problems = [problem for problem, _ in verdicts if problem]
        if self.rank == 0:
            try:
                if problems:
                    raise CorruptCheckpointError(problems[0], "")
                self.completed = write_completed_manifest(self.store, plan, self.attempt)
                self.completed_bytes = sum(sent for _, sent in verdicts)
                log.info(
                    "completed checkpoint-%d in the store from the nodes' copies (%d bytes uploaded)",
                    plan.step,
                    self.completed_bytes,
                )
            except Exception as error:  # noqa: BLE001 - the resume goes on from the store's newest complete checkpoint
                problem = (
                    error.problem if isinstance(error, CorruptCheckpointError) else f"{type(error).__name__}: {error}"
                )
                log.warning(
                    "checkpoint-%d, which the nodes hold, could not be completed in the store (%s): "
                    "the run resumes from the store's newest complete checkpoint",
                    plan.step,
                    problem,
                )
        broadcast_from_rank0(None)

    def _fetch(self) -> None:
        try:
            if self.rank == 0:
                self.fetched = fetch_resume_checkpoint(self.store, self.dest_root, skipped=self.skipped)
            else:
                newest = latest_complete_checkpoint(self.store)
                self.fetched = _fetch_agreed(self.store, newest, self.dest_root) if newest else None
        except BaseException as error:  # noqa: BLE001 - raised (or superseded) in wait()
            self.error = error
        self.fetch_s = time.monotonic() - self.started

    def _fetch_share(self) -> None:
        """Several nodes: a leader bets on the newest complete checkpoint and reads its node's share."""
        try:
            if self.layout.is_leader:
                self._listed = list_checkpoints(self.store)
                newest = next((c for c in self._listed if c.complete), None)
                if self.rank == 0:
                    log_incomplete(self.store, self._listed)
                    refuse_foreign_newer(self.store, self._listed, newest.step if newest else None)
                if newest is not None:
                    self._share = read_share(self.store, newest, self.dest_root, self.layout, self.copies)
        except BaseException as error:  # noqa: BLE001 - the one-node path in wait() says what it means
            self.error = error
        self.fetch_s = time.monotonic() - self.started

    def _finish_shared_read(self) -> None:
        """Several nodes, every rank: exchange the shares when every leader read its share of the same
        checkpoint (or all found none), and keep the copies when every node's verifies; otherwise rank 0
        chooses and fetches as on one node, and every other rank follows."""
        share = self._share
        bet = (share.info.step if share else None, self.error is None) if self.layout.is_leader else None
        leaders = [view for view in all_gather_objects(bet) if view is not None]
        steps = {step for step, _ in leaders}
        if len(steps) != 1 or not all(ok for _, ok in leaders):
            log.info("the nodes did not all read a share of the same checkpoint (%s): each fetches it whole", leaders)
            self._fetch_on_one_node()
            return
        step = steps.pop()
        if self.rank == 0:
            self.skipped.extend(damaged_newer_than(self._listed, step))
        if step is None:
            return  # a fresh start on every node
        group = dist.new_group(list(self.layout.leaders), backend="gloo")  # every rank makes it
        verdict = None
        if share is not None:
            digests = exchange(share, self.layout, group)
            verdict = (self._install_share(share, digests), share.s3_bytes, share.peer_bytes, share.kept_bytes)
        verdicts = [v for v in all_gather_objects(verdict) if v is not None]  # also: every copy is in place
        problems = [problem for problem, *_ in verdicts if problem]
        if problems:
            log.warning("checkpoint-%d did not verify on every node (%s): each fetches it whole", step, problems[0])
            self._fetch_on_one_node()
            return
        s3_bytes, peer_bytes, kept_bytes = (sum(v[i] for v in verdicts) for i in (1, 2, 3))
        completed = self.completed_bytes if self.completed is not None and self.completed.step == step else 0
        self.read = SharedReadCount(self.layout.nodes, s3_bytes, peer_bytes, kept_bytes, completed)
        log.info("checkpoint-%d on %d nodes: %s", step, self.layout.nodes, self.read)

    def _install_share(self, share: Share, digests: dict[str, str]) -> str:
        """Put the node's assembled copy in place if it verifies; what is wrong with it otherwise."""
        info = share.info
        assert info.manifest is not None
        try:
            if share.whole:
                verify_local_checkpoint(share.source, info.manifest, digests)
                local_dir = share.source
            else:
                local_dir = install_copy(self.dest_root, info, share.source, digests)
        except CorruptCheckpointError as error:
            return error.problem
        self.fetched = ResumePoint(info.step, local_dir, info.manifest, str(self.store.uri.join(info.prefix)))
        return ""

    def _fetch_on_one_node(self) -> None:
        """The one-node path: rank 0 chooses and fetches whole; every other rank fetches rank 0's choice."""
        self._share, self.fetched = None, None
        if self.rank == 0:
            self.error = None
            try:
                self.fetched = fetch_resume_checkpoint(self.store, self.dest_root, skipped=self.skipped)
            except BaseException as error:  # noqa: BLE001 - raised in wait()
                self.error = error

    def wait(self, check: LoadCheck | None = None) -> ResumePoint | None:
        """The checkpoint every rank resumes from; with ``check``, rank 0 makes sure the job can load it
        (call this once the model is built: a check compares the checkpoint with it)."""
        blocked_from = time.monotonic()
        self._thread.join()
        if self.completion is not None:
            self._finish_completion()
            self._fetch_in_background()  # not in the background any more: after the completion
        if self.layout.nodes > 1:
            self._finish_shared_read()
        self.waited_s = time.monotonic() - blocked_from
        if self.rank == 0 and self.error is not None:
            raise self.error
        chosen = self.fetched if self.rank == 0 else None
        if chosen is not None and check is not None:
            # The same verified bytes on every rank: rank 0's verdict holds for all.
            chosen = loadable_or_older(self.store, self.dest_root, chosen, check, self.skipped)
        if chosen is not None and self.attempt is not None:
            write_fence(self.store, self.attempt, resumed_from=chosen.step)
        step = broadcast_from_rank0(chosen.step if chosen else None)
        if self.rank != 0:
            chosen = self._agreed(step)
        if chosen is not None:
            barrier()  # every rank of the node is done downloading: the copies of other steps can go
            delete_other_copies(self.dest_root, chosen.step)
        return chosen

    def _agreed(self, step: int | None) -> ResumePoint | None:
        """On a rank other than 0: the checkpoint rank 0 chose, from the bet when it won."""
        if step is None:
            return None
        if self.fetched is not None and self.fetched.step == step:
            return self.fetched
        if self.error is not None and checkpoint_fault(self.error) is None:
            raise self.error  # the store or this node failed this rank: what the step is does not change that
        return _fetch_agreed(self.store, _find_complete(self.store, step), self.dest_root)


@dataclass(frozen=True)
class SharedReadCount:
    """Where the nodes' copies of a checkpoint came from, in bytes of its files."""

    nodes: int
    s3_bytes: int  # read from the store, by all nodes together
    peer_bytes: int  # received from another node
    kept_bytes: int = 0  # read from the copies the nodes kept when they saved (train/checkpoints/node_copies.py)
    # Uploaded from those copies first, to complete it in the store (train/checkpoints/complete_from_copies.py).
    completed_bytes: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def agree_on_resume_point(
    store: ObjectStore,
    dest_root: Path,
    attempt: AttemptId | None = None,
    check: LoadCheck | None = None,
    copies: NodeCopies | None = None,
) -> ResumePoint | None:
    """The same verified checkpoint on every rank, or None on a fresh start (``ResumeFetch``, waited for).

    With ``attempt``, rank 0 records the step in the fence (spotray/contract/attempts.py): pruning never
    deletes the checkpoint a running attempt resumed from. With ``check``, one the job can load. With
    ``copies``, what the nodes kept of their saves is read before S3.
    """
    return ResumeFetch(store, dest_root, attempt, copies).wait(check)


def _fetch_agreed(store: ObjectStore, info: CheckpointInfo, dest_root: Path) -> ResumePoint:
    try:
        local_dir = download_checkpoint(store, info, dest_root)
    except CorruptCheckpointError as error:
        # Rank 0 verifies these same bytes; a mismatch here is a bad copy on this node.
        raise CorruptCheckpointError(f"rank {world_rank()}: {error.problem}", error.fix) from error
    assert info.manifest is not None
    return ResumePoint(info.step, local_dir, info.manifest, str(store.uri.join(info.prefix)))


def _find_complete(store: ObjectStore, step: int) -> CheckpointInfo:
    for info in complete_checkpoints(store):
        if info.step == step:
            return info
    raise CorruptCheckpointError(
        f"checkpoint-{step}, chosen by rank 0 for resume, is no longer complete in {store.uri}",
        "something deleted it while the run started (another run with the same checkpoint URI?); "
        "give each run its own URI",
    )
