"""What the controller reads from a run's checkpoint URI: markers, progress, the last complete checkpoint.

Why read S3 instead of having the job report to the API server: the checkpoint manifests in S3
are the only truth about what a resume would use (a checkpoint is complete when its manifest is
there and matches its files), the job needs no Kubernetes credentials, and the status stays right
even when the job died mid-report. The cost is one LIST and a few small GETs per run and reconcile.

Credentials come from the run's Secret (``spec.checkpoint.secretRef``, or the chart's default),
the same one the pods get by reference, once controller/s3_access.py allows it; the endpoint from
that Secret's ``AWS_ENDPOINT_URL`` or the controller's ``SPOTRAY_S3_ENDPOINT``, once allowed. A run
with no Secret is read with unsigned requests: never with the controller's own identity. A
``file://`` URI is read only inside the operator's ``SPOTRAY_FILE_ROOTS`` (``file_access_refusal``).
Every object read is bounded in bytes and JSON values (spotray/contract/bounded_json.py): the run's
owner writes them, and the controller serves every run of the cluster.

At a thousand runs this is on the hot path, so a Secret as read is remembered for
``SECRET_TTL_S`` (rotated credentials are used within that), and runs that reach S3 the same way
share one boto3 client (making one costs tens of milliseconds of CPU).

With checkpoint keys on, the store is opened with the run's key (``run_checkpoint_key``), so the
status's last checkpoint is one the run's jobs signed: a bucket writer's forged checkpoint, which no
resume takes, does not show as the run's either.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TYPE_CHECKING

from kubernetes.client import ApiException

from spotray.contract.attempts import AttemptId
from spotray.contract.checkpoint_key import CHECKPOINT_KEY_ENV, CheckpointKey
from spotray.contract.errors import Cause, SpotrayError
from spotray.contract.names import CHECKPOINT_KEY_SECRET_DATA_KEY
from spotray.contract.spec import TrainingRun
from spotray.contract.status import (
    CheckpointInterval,
    Goodput,
    IntervalLoss,
    LastCheckpoint,
    Progress,
    ResumeRead,
    format_date_time,
)
from spotray.contract.sweep import objective_values
from spotray.contract.uris import parse_uri
from spotray.controller import metrics
from spotray.controller.config import ControllerConfig
from spotray.controller.kube import Cluster
from spotray.controller.s3_access import SecretView, endpoint_refusal, file_uri_refusal, secret_refusal
from spotray.train.checkpoints.checkpoint import latest_complete_checkpoint
from spotray.train.records.goodput import Tally, attempts_from_progress, kept_up_to, ledger_of, tally
from spotray.train.records.progress_log import (
    MAX_PROGRESS_BYTES,
    AttemptProgress,
    WorkerHosts,
    parse_attempt_progress,
    read_attempt_progress,
)
from spotray.train.storage.store import ObjectStore, RetryPolicy, S3ObjectStore, StoreConfig, make_s3_client, open_store

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)


def s3_access_refusal(run: TrainingRun, secret: SecretView | None, config: ControllerConfig) -> tuple[str, str] | None:
    """(Event reason, message) when the run may not use its Secret or its endpoint; None when it may.

    ``secret`` is the run's Secret as read (None: missing); a run that names none always may.
    """
    name = run.spec.checkpoint.secret_ref or config.s3_secret
    if name is None:
        return None
    refused = secret_refusal(
        run.namespace, name, secret, default_secret=config.s3_secret, allowed=config.allowed_s3_secrets
    )
    if refused is not None:
        return ("SecretMissing" if secret is None else "SecretNotAllowed", refused)
    assert secret is not None
    endpoint = secret.data.get("AWS_ENDPOINT_URL")
    refused = endpoint_refusal(endpoint, name, allowed=config.s3_endpoints_allowed)
    return ("EndpointNotAllowed", refused) if refused is not None else None


SECRET_TTL_S = 60.0


@functools.lru_cache(maxsize=64)
def _shared_client(config: StoreConfig) -> S3Client:
    return make_s3_client(config)


def file_access_refusal(run: TrainingRun, config: ControllerConfig) -> str | None:
    """Why the controller may not read the run's file:// checkpoint URI (s3_access.file_uri_refusal), or
    None: an s3:// URI, or a directory inside ``config.file_roots``.

    Resolved at every opening of the run's store: the run's pods write to the shared volume, a
    symbolic link included, and a link made since the last look must not lead the controller out.
    """
    uri = parse_uri(run.spec.checkpoint.uri)
    if uri.scheme != "file":
        return None
    roots = tuple(os.path.realpath(root) for root in config.file_roots)
    return file_uri_refusal(str(uri), os.path.realpath(uri.prefix), roots)


def store_config(run: TrainingRun, cluster: Cluster, config: ControllerConfig) -> StoreConfig:
    """How the controller reaches the run's store; raises SpotrayError when s3_access refuses it."""
    refused_directory = file_access_refusal(run, config)
    if refused_directory is not None:
        raise SpotrayError(
            refused_directory,
            "use an s3:// URI, or one inside those directories (on the shared volume the run's pods mount); "
            "the controller reads nothing of this run until then",
        )
    # The controller's environment gives settings (region, endpoint), never credentials.
    base = replace(
        StoreConfig.from_env(),
        access_key_id=None,
        secret_access_key=None,
        session_token=None,
        # One try per request, each waiting at most 5 s for a byte, so that CONTROLLER_RETRY's 5 s
        # deadline holds against a store that accepts and never answers: a read ends within about
        # 12 s, where botocore's own four tries of a 10 s read made it 40 s
        # (tests/integration/test_silent_s3.py).
        connect_timeout_s=2.0,
        read_timeout_s=5.0,
        request_attempts=1,
    )
    endpoint = config.s3_endpoint or base.endpoint_url
    secret_name = run.spec.checkpoint.secret_ref or config.s3_secret
    if secret_name is None:
        return replace(base, endpoint_url=endpoint, anonymous=True)
    secret = cluster.read_secret(run.namespace, secret_name, max_age_s=SECRET_TTL_S)
    refused = s3_access_refusal(run, secret, config)
    if refused is not None:
        raise SpotrayError(refused[1], "the controller reads nothing for this run until then")
    assert secret is not None
    return replace(
        base,
        endpoint_url=secret.data.get("AWS_ENDPOINT_URL") or endpoint,
        region=secret.data.get("AWS_REGION") or base.region,
        access_key_id=secret.data.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=secret.data.get("AWS_SECRET_ACCESS_KEY"),
        session_token=secret.data.get("AWS_SESSION_TOKEN"),
    )


# A reconcile must not hang on an unreachable S3 server: give up after a few seconds, report it in
# the status, and try again at the next reconcile.
CONTROLLER_RETRY = RetryPolicy(deadline_s=5.0, first_delay_s=0.2, max_delay_s=1.0)


class CheckpointKeyUnreadableError(SpotrayError):
    """The API server did not answer the read of a run's checkpoint key: try again at the next reconcile."""

    cause = Cause.INFRASTRUCTURE


def run_checkpoint_key(run: TrainingRun, cluster: Cluster, config: ControllerConfig) -> CheckpointKey | None:
    """The run's checkpoint key (controller/checkpoint_key_secret.py made it), so that the status counts only
    checkpoints the run's jobs signed, as their resumes do; None when the run has none: keys off, a
    run begun before them, or a controller that may not read it (``rbac.secretsByName``), which then
    reports what the store shows."""
    if not config.run_checkpoint_keys:
        return None
    name = run.checkpoint_key_secret
    try:
        # Immutable: a copy read a while ago is the same key (a namesake run's new one comes in time).
        secret = cluster.read_secret(run.namespace, name, max_age_s=SECRET_TTL_S)
    except ApiException as error:
        if error.status == HTTPStatus.FORBIDDEN:
            return None
        raise CheckpointKeyUnreadableError(
            f"cannot read the run's checkpoint key, Secret {run.namespace}/{name}: {error.status} {error.reason}",
            "nothing to do if it passes: the API server is asked again at the next reconcile",
        ) from None
    if secret is None:
        return None
    return CheckpointKey.from_env({CHECKPOINT_KEY_ENV: secret.data.get(CHECKPOINT_KEY_SECRET_DATA_KEY, "")})


def open_run_store(run: TrainingRun, cluster: Cluster, config: ControllerConfig) -> ObjectStore:
    uri = parse_uri(run.spec.checkpoint.uri)
    reach = store_config(run, cluster, config)
    key = run_checkpoint_key(run, cluster, config)
    if uri.scheme != "s3":
        return open_store(uri, reach, CONTROLLER_RETRY, checkpoint_key=key)
    return S3ObjectStore(uri, reach, CONTROLLER_RETRY, client=_shared_client(reach), checkpoint_key=key)


@dataclass(frozen=True)
class StoreReport:
    """What S3 says about one attempt: status.progress, the step it resumed from, status.lastCheckpoint,
    status.goodput (the run's ledger so far) and status.checkpointInterval (everySteps: auto's choice)."""

    progress: Progress | None
    resumed_from: int | None
    last_checkpoint: LastCheckpoint | None
    goodput: Goodput | None = None
    checkpoint_interval: CheckpointInterval | None = None
    interval_losses: tuple[IntervalLoss, ...] = ()  # a sweep's trial: its objective at the steps asked for
    # The job's clock (unix seconds): when its worker group began the training loop, and its first logged step.
    training_loop_at: float | None = None
    first_step_at: float | None = None
    # A run with spares: its worker pods as Ray saw them (idle or busy), for controller/spare_placement.py.
    worker_hosts: WorkerHosts | None = None
    # Newer complete checkpoints the attempt passed over, and why ("checkpoint-40: ...").
    skipped_checkpoints: tuple[str, ...] = ()
    # On several nodes: where the resume read its checkpoint (S3, the nodes' copies, between nodes).
    resume_read: ResumeRead | None = None


@dataclass(frozen=True)
class _Remembered:
    etag: str
    read_at: float
    report: StoreReport


@dataclass(frozen=True)
class _EndedAttempt:
    """An ended attempt's part of the run's ledger, kept instead of its progress object's points.

    ``tallies`` hold for ``kept_after``: the lowest step any later attempt resumed from. A later
    attempt that resumes lower still (its newest checkpoint was unusable) makes it read again.
    """

    lowest_resume: float  # the lowest step this attempt's lifetimes resumed from (inf: it has none)
    kept_after: float
    tallies: tuple[Tally, ...]


class StoreReports:
    """Each running attempt's report, read in full only when its progress object changed.

    A refresh first LISTs the attempt's progress object (one request); when its ETag is the one
    seen last time, nothing was trained since, so the progress, the checkpoint LIST and the manifest
    GET are not read again. A full read still happens every ``max_age_s`` (a checkpoint upload can
    finish after the last progress write) and whenever the caller says the attempt ended.
    """

    def __init__(self, max_age_s: float = 300.0, remembered: int = 10_000) -> None:
        self._max_age_s = max_age_s
        self._remembered = remembered
        self._seen: OrderedDict[AttemptId, _Remembered] = OrderedDict()
        self._ended: OrderedDict[AttemptId, _EndedAttempt] = OrderedDict()
        self._lock = threading.Lock()
        self.full_reads = 0

    def read(
        self,
        store: ObjectStore,
        attempt: AttemptId,
        *,
        ended: bool,
        requested: Mapping[int, float] | None = None,
        ended_at: float | None = None,
        objective_steps: Sequence[int] | None = None,
        every_steps: int | None = None,
    ) -> StoreReport:
        """The attempt's report; ``requested``: when each attempt was asked for (attempt -> unix time),
        ``ended_at``: when the attempt ended, if it did (the ledger's wall time ends there);
        ``objective_steps``: a sweep's trial's rungs, whose objective the report gives once each is in a
        complete checkpoint (``every_steps`` apart), with the last step's (None: no sweep's trial)."""
        key = attempt.progress_key
        etag = next((info.etag for info in store.list(key) if info.key == key), None)
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(attempt)
        # "" for an object that is not there yet: the attempt wrote nothing since, so that holds too.
        found = "" if etag is None else etag
        if (
            not ended
            and seen is not None
            and etag != ""  # an object whose store gives no ETag is read in full
            and seen.etag == found
            and now - seen.read_at < self._max_age_s
        ):
            metrics.STORE_READS.labels(kind="unchanged").inc()
            return seen.report
        raw = store.get_bytes(key, max_bytes=MAX_PROGRESS_BYTES) if etag is not None else None
        progress = parse_attempt_progress(raw, attempt, store.checkpoint_key) if raw is not None else None
        last_checkpoint = last_checkpoint_status(store)
        report = StoreReport(
            *progress_status(progress),
            last_checkpoint,
            goodput=self._goodput(store, progress, requested or {}, ended_at),
            checkpoint_interval=checkpoint_interval_status(progress),
            interval_losses=interval_losses_status(progress, objective_steps, last_checkpoint, every_steps),
            training_loop_at=progress.started if progress is not None else None,
            first_step_at=progress.points[0][2] if progress is not None and progress.points else None,
            worker_hosts=progress.current_worker_hosts if progress is not None else None,
            skipped_checkpoints=tuple(progress.skipped_checkpoints) if progress is not None else (),
            resume_read=ResumeRead(**progress.resume_read) if progress is not None and progress.resume_read else None,
        )
        metrics.STORE_READS.labels(kind="full").inc()
        with self._lock:
            self.full_reads += 1
            self._seen[attempt] = _Remembered(found, now, report)
            self._seen.move_to_end(attempt)
            while len(self._seen) > self._remembered:
                self._seen.popitem(last=False)
        return report

    def _goodput(
        self,
        store: ObjectStore,
        progress: AttemptProgress | None,
        requested: Mapping[int, float],
        ended_at: float | None,
    ) -> Goodput | None:
        """status.goodput: the ledger (train/records/goodput.py) of every attempt so far, the current one included."""
        if progress is None or not progress.points:
            return None
        current = attempts_from_progress([progress], requested)
        tallies = [tally(lt, kept) for lt, kept in zip(current, kept_up_to(current), strict=True)]
        kept_after = min((lt.resumed_from or 0 for lt in current), default=float("inf"))
        for number in range(progress.attempt - 1, 0, -1):
            earlier = self._ended_attempt(store, AttemptId(progress.run_id, number), requested, kept_after)
            tallies[:0] = earlier.tallies
            kept_after = min(kept_after, earlier.lowest_resume)
        starts = [at for t in tallies for at in (t.requested_at, t.started_at, t.first_point_at) if at is not None]
        first = min(starts, default=progress.points[0][2])
        last = max(progress.points[-1][2], ended_at or 0.0)
        return Goodput.from_status(ledger_of(tallies, first, last).to_status())

    def _ended_attempt(
        self, store: ObjectStore, attempt: AttemptId, requested: Mapping[int, float], kept_after: float
    ) -> _EndedAttempt:
        with self._lock:
            known = self._ended.get(attempt)
        if known is not None and known.kept_after == kept_after:
            return known
        found = read_attempt_progress(store, attempt)
        lifetimes = attempts_from_progress([found], requested) if found is not None else []
        kept = [min(k, kept_after) for k in kept_up_to(lifetimes)]
        entry = _EndedAttempt(
            lowest_resume=min((lt.resumed_from or 0 for lt in lifetimes), default=float("inf")),
            kept_after=kept_after,
            tallies=tuple(tally(lt, k) for lt, k in zip(lifetimes, kept, strict=True)),
        )
        with self._lock:
            self._ended[attempt] = entry
            self._ended.move_to_end(attempt)
            while len(self._ended) > self._remembered:
                self._ended.popitem(last=False)
        return entry


def progress_status(progress: AttemptProgress | None) -> tuple[Progress | None, int | None]:
    """(status.progress, the step the attempt resumed from) from the attempt's progress object.

    An attempt that resumed and has not logged a step yet is at its resume point: that, not the
    previous attempt's last report, which can be steps behind (its last write before it was cut
    short) or ahead (the steps lost with it). One that resumed at the last step finishes with none.
    """
    if progress is None:
        return None, None
    if progress.last_step is None:
        if progress.resumed_from is None:
            return None, None
        started = progress.started or progress.updated
        at_resume = Progress(
            step=progress.resumed_from,
            total_steps=progress.max_steps,
            update_time=format_date_time(datetime.fromtimestamp(started, UTC)) if started else None,
        )
        return at_resume, progress.resumed_from
    speed = progress.steps_per_second()
    stall = progress.upload_stall
    status = Progress(
        step=progress.last_step,
        total_steps=progress.max_steps,
        loss=_finite(progress.last_loss),
        steps_per_second=round(speed, 3) if speed is not None else None,
        update_time=format_date_time(datetime.fromtimestamp(progress.updated, UTC)),
        upload_stalled_since=format_date_time(datetime.fromtimestamp(stall.since, UTC)) if stall else None,
        upload_stall_fault=stall.fault if stall else None,
    )
    return status, progress.resumed_from


def _finite(loss: float | None) -> float | None:
    """A loss as the status shows it: rounded, and None when NaN or infinite (training diverged). JSON has no
    NaN, and the API server refuses a patch that holds one; the progress object keeps the fact."""
    return round(loss, 6) if loss is not None and math.isfinite(loss) else None


def checkpoint_interval_status(progress: AttemptProgress | None) -> CheckpointInterval | None:
    """status.checkpointInterval: everySteps: auto's latest choice, which the job wrote in the status' form."""
    if progress is None or progress.checkpoint_interval is None:
        return None
    return CheckpointInterval.from_status(progress.checkpoint_interval)


def interval_losses_status(
    progress: AttemptProgress | None,
    steps: Sequence[int] | None,
    last_checkpoint: LastCheckpoint | None,
    every_steps: int | None,
) -> tuple[IntervalLoss, ...]:
    """status.intervalLosses' new entries: the objective at each of ``steps`` and at the attempt's step
    target, from this attempt's logged losses, for the steps up to its newest complete checkpoint.
    ``steps`` None: the run is no sweep's trial, and nothing is recorded.

    Only this attempt's points count: a step from before its resume has its entry from the attempt
    that trained it (reconcile.py merges the entries into those stored). Nothing without a fixed
    checkpoint interval: a trial's rungs are on checkpoints of one (spotray/contract/sweep.py).
    """
    if progress is None or steps is None or not every_steps or last_checkpoint is None:
        return ()
    losses = {step: loss for step, loss, _ in progress.points}
    wanted = [*steps, *([progress.max_steps] if progress.max_steps else [])]
    found = objective_values(losses, wanted, last_checkpoint.step, every_steps)
    finite = {step: loss for step, mean in found.items() if (loss := _finite(mean)) is not None}
    return tuple(IntervalLoss(step=step, loss=loss) for step, loss in sorted(finite.items()))


def last_checkpoint_status(store: ObjectStore) -> LastCheckpoint | None:
    info = latest_complete_checkpoint(store)
    if info is None or info.manifest is None:
        return None
    return LastCheckpoint(
        step=info.step,
        uri=str(store.uri.join(info.prefix)),
        time=format_date_time(datetime.fromtimestamp(info.manifest.created_at, UTC)),
    )
