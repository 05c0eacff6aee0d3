"""The status a TrainingRun shows, as typed data, declared once: what the controller writes and the CLI reads.

Each field is declared once, on these frozen dataclasses: its Python name, whose camelCase form is
its key in ``status`` (``next_attempt_time`` -> ``nextAttemptTime``), its type, and a
``StatusField`` with the description ``kubectl explain trainingrun.status`` prints and the OpenAPI
keywords the API server checks. From the declarations:

- ``to_status`` writes an object in the status' JSON form, leaving out what is None;
  ``RunStatus.to_patch`` is the controller's merge patch (see there);
- ``from_status`` reads it back. A reader takes a missing key as the field's default (None for most):
  a run the controller has not seen yet, a field not reported yet, a status an older controller
  wrote; it ignores keys it does not know. A value that does not match its declaration (a time
  that is not one, a number where a string belongs, a list that is not a list, a phase it does not
  know) is read as missing too, never an exception: ``read`` also says which (``Unreadable``), for
  the controller to report and rebuild (spotray/decisions/run_state.py ``RunState.from_status``);
- ``parse_date_time`` reads every time in it, ``format_date_time`` writes the controller's;
- controller/crd.py generates the CRD's status schema from them.

Who writes what: spotray/decisions/run_plan.py the phase, the attempts, the budgets and the conditions;
controller/run_store.py progress, lastCheckpoint, goodput and checkpointInterval from what the job
wrote in the store (the job's train/records/goodput.py and train/hf/checkpoint_interval.py write
the last two in this form, and tests/unit/test_status_model.py keeps their keys in step);
spotray/decisions/cost.py cost; controller/reconcile.py puts them together. The CLI (spotray/cli/run_status.py,
spotray/cli/watch.py, spotray/cli/logs.py) reads them.

Standard library only, besides the contract's own names.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Self

from spotray.contract.attempts import OUTCOMES
from spotray.contract.names import PHASES
from spotray.contract.spec import camel, field_type

DATE_TIME = "date-time"  # an RFC 3339 time, as Kubernetes writes them: "2026-01-02T03:04:05Z"

# What the API server accepts in a `date-time` field (RFC 3339): "T" and "Z" in either case,
# fractional seconds of any length, "Z" or an offset. Python keeps microseconds; the rest is dropped.
_DATE_TIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<fraction>\d+))?"
    r"(?:[Zz]|(?P<sign>[+-])(?P<hours>\d{2}):(?P<minutes>\d{2}))"
)


def parse_date_time(text: str) -> datetime:
    """A status time, in UTC: every RFC 3339 time the API server accepts, e.g. "2026-01-02T03:04:05Z",
    "2026-01-02T03:04:05.123456Z", "2026-01-02T05:04:05+02:00". Raises ValueError for anything else
    (a date alone, no offset, a leap second), TypeError for what is not a string."""
    if not isinstance(text, str):
        raise TypeError(f"a time must be a string, not {type(text).__name__}")
    found = _DATE_TIME.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time (write e.g. 2026-01-02T03:04:05Z)")
    fraction = found["fraction"] or ""
    offset = timedelta()
    if found["sign"]:
        offset = timedelta(hours=int(found["hours"]), minutes=int(found["minutes"]))
        offset = -offset if found["sign"] == "-" else offset
    try:
        local = datetime.fromisoformat(f"{found['date']}T{found['time']}")
        zone = timezone(offset)
    except ValueError as error:  # a day, an hour or an offset out of range; a leap second
        raise ValueError(f"{text!r} is not an RFC 3339 time: {error}") from None
    return local.replace(microsecond=int((fraction + "000000")[:6]), tzinfo=zone).astimezone(UTC)


def format_date_time(moment: datetime) -> str:
    """The one form the controller writes a time in: UTC, whole seconds, "2026-01-02T03:04:05Z"."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str | None) -> datetime | None:
    """A status time in any RFC 3339 form (``parse_date_time``); None when unset.

    A time read through ``RunStatus``/``RunState.from_status`` was checked there; an unchecked
    one (a RayJob's, a pod's, an annotation) goes through ``unchecked_timestamp``.
    """
    if not text:
        return None
    return parse_date_time(text)


def unchecked_timestamp(value: object) -> datetime | None:
    """A time from a field anyone may write (an annotation, a RayJob's or a pod's status), as RFC 3339
    text or as the Kubernetes client's datetime; None when it is missing or not a time."""
    if isinstance(value, datetime):
        return value
    try:
        return parse_timestamp(str(value)) if value else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Unreadable:
    """A value in a status that does not match its declaration, read as missing: where, and what it was."""

    path: str  # relative to the object read: "phase", "attempts[1].startTime"; "" for the object itself
    value: Any

    @property
    def shown(self) -> str:
        """The value as JSON, cut to 200 characters."""
        try:
            shown = json.dumps(self.value, sort_keys=True, default=repr)
        except ValueError:  # a circular structure: not from JSON, but never an exception here
            shown = repr(self.value)
        return shown if len(shown) <= 200 else shown[:197] + "..."

    def __str__(self) -> str:
        return f"{self.path}: {self.shown}" if self.path else self.shown


@dataclass(frozen=True)
class StatusField:
    """What the declaration of one status field says beyond its Python name and type."""

    description: str  # `kubectl explain trainingrun.status` prints it
    openapi: dict[str, Any]  # keywords of its CRD schema: minimum, format, enum, pattern, ...
    items: str | None = None  # a list: what one item is (its description)
    required: bool = False  # the API server refuses an object without it; a reader still takes it as missing
    clearable: bool = False  # RunStatus.to_patch writes it as null when None, which removes it


def status_field(
    description: str,
    *,
    default: Any = None,
    items: str | None = None,
    required: bool = False,
    clearable: bool = False,
    **openapi: Any,
) -> Any:
    """A dataclass field of the status, with its ``StatusField``."""
    declared = StatusField(description, openapi, items=items, required=required, clearable=clearable)
    return dataclasses.field(default=default, metadata={"status": declared})


def declaration(field: dataclasses.Field[Any]) -> StatusField:
    """The ``StatusField`` of one field of a status dataclass."""
    declared: StatusField = field.metadata["status"]
    return declared


@dataclass(frozen=True)
class StatusObject:
    """An object in the status: its fields' camelCase keys, both ways."""

    @classmethod
    def from_status(cls, data: Mapping[str, Any]) -> Self:
        """Read from the status' JSON form: a missing key (or a null) gives the field's default, and
        so does a value that does not match its declaration (see ``read``)."""
        return cls.read(data)[0]

    @classmethod
    def read(cls, data: Any, path: str = "") -> tuple[Self, tuple[Unreadable, ...]]:
        """Like ``from_status``, and every value read as missing because it did not match its declaration."""
        problems: list[Unreadable] = []
        return _read(cls, data, path, problems), tuple(problems)

    def to_status(self) -> dict[str, Any]:
        """The status' JSON form; a field that is None is left out, and so is a value outside its
        declared enum (an attempt's outcome not known yet, ""): the API server would refuse the
        whole status for it, and a reader takes the field as missing either way."""
        return {key.key: _encode(value) for key in _keys(type(self)) if _written(key, value := getattr(self, key.name))}


@dataclass(frozen=True)
class _Key:
    """How one field is read: its Python name, its key, the object type it holds (one or a list) or
    else the plain type of its values, and what its declaration allows of them."""

    name: str
    key: str
    holds: type[StatusObject] | None
    many: bool
    clearable: bool
    plain: type | None = None  # str, int, float or bool, for a field that holds no object
    enum: tuple[Any, ...] | None = None
    minimum: float | None = None
    date_time: bool = False

    def decode(self, raw: Any, path: str, problems: list[Unreadable]) -> Any:
        """The field's value, or None (its default) when ``raw`` does not match, with the problem noted."""
        if self.many:
            if not isinstance(raw, list | tuple):
                problems.append(Unreadable(path, raw))
                return None
            items = (self._one(item, f"{path}[{index}]", problems) for index, item in enumerate(raw))
            return tuple(item for item in items if item is not None)
        return self._one(raw, path, problems)

    def _one(self, raw: Any, path: str, problems: list[Unreadable]) -> Any:
        if self.holds is not None:
            if not isinstance(raw, Mapping):
                problems.append(Unreadable(path, raw))
                return None
            return _read(self.holds, raw, path, problems)
        if not self._fits(raw):
            problems.append(Unreadable(path, raw))
            return None
        return raw

    def _fits(self, raw: Any) -> bool:
        plain = self.plain
        if plain is float:
            fits = isinstance(raw, int | float) and not isinstance(raw, bool)
        elif plain is int:
            fits = isinstance(raw, int) and not isinstance(raw, bool)
        else:
            fits = plain is None or isinstance(raw, plain)
        if not fits:
            return False
        if self.enum is not None and raw not in self.enum:
            return False
        if self.minimum is not None and raw < self.minimum:
            return False
        if self.date_time:
            try:
                parse_date_time(raw)
            except ValueError:
                return False
        return True


def _read(cls: type[StatusObject], data: Any, path: str, problems: list[Unreadable]) -> Any:
    if not isinstance(data, Mapping):
        problems.append(Unreadable(path, data))
        return cls()
    values = {}
    for key in _keys(cls):
        raw = data.get(key.key)
        if raw is None:
            continue
        value = key.decode(raw, f"{path}.{key.key}" if path else key.key, problems)
        if value is not None:
            values[key.name] = value
    return cls(**values)


# Each class's keys, worked out once: every reconcile reads a whole status, and get_type_hints is slow.
_KEYS: dict[type[StatusObject], tuple[_Key, ...]] = {}


def _keys(cls: type[StatusObject]) -> tuple[_Key, ...]:
    if cls not in _KEYS:
        hints = typing.get_type_hints(cls)
        keys = []
        for field in dataclasses.fields(cls):
            held = field_type(hints[field.name])
            many = typing.get_origin(held) is tuple
            inner = typing.get_args(held)[0] if many else held
            holds = inner if isinstance(inner, type) and issubclass(inner, StatusObject) else None
            declared = declaration(field)
            enum = declared.openapi.get("enum")
            keys.append(
                _Key(
                    field.name,
                    camel(field.name),
                    holds,
                    many,
                    declared.clearable,
                    plain=_plain_type(inner) if holds is None else None,
                    enum=tuple(enum) if enum is not None else None,
                    minimum=declared.openapi.get("minimum"),
                    date_time=declared.openapi.get("format") == DATE_TIME,
                )
            )
        _KEYS[cls] = tuple(keys)
    return _KEYS[cls]


def _plain_type(python_type: Any) -> type | None:
    """The type a value of a field that holds no object must have: str, int, float, bool, or dict (a
    JSON object kept as it is); None: anything."""
    if typing.get_origin(python_type) is dict:
        return dict
    return python_type if python_type in (str, int, float, bool) else None


def _written(key: _Key, value: Any) -> bool:
    return value is not None and (key.enum is None or value in key.enum)


def _encode(value: Any) -> Any:
    if isinstance(value, StatusObject):
        return value.to_status()
    if isinstance(value, tuple):
        return [_encode(item) for item in value]
    return value


@dataclass(frozen=True)
class Progress(StatusObject):
    """status.progress: the job's latest progress, from its progress object in the store."""

    step: int | None = status_field("The latest completed training step.", minimum=0)
    total_steps: int | None = status_field("Steps the run trains for in all.", minimum=0)
    loss: float | None = status_field("The training loss at step.")
    steps_per_second: float | None = status_field("Recent training speed.")
    update_time: str | None = status_field("When step was reached.", format=DATE_TIME)
    upload_stalled_since: str | None = status_field(
        "Checkpoint uploads have retried a store fault since then (unset while they flow).", format=DATE_TIME
    )
    upload_stall_fault: str | None = status_field("The store's answer the stalled uploads retry, e.g. 503 SlowDown.")


@dataclass(frozen=True)
class LastCheckpoint(StatusObject):
    """status.lastCheckpoint: the latest complete checkpoint in the store."""

    step: int | None = status_field("The training step the checkpoint holds.", minimum=0)
    uri: str | None = status_field("Where the checkpoint is, under spec.checkpoint.uri.")
    time: str | None = status_field("When the checkpoint completed.", format=DATE_TIME)


@dataclass(frozen=True)
class IntervalLoss(StatusObject):
    """The mean training loss over the checkpoint interval that ends at a step: a sweep's objective there."""

    step: int | None = status_field("The step the interval ends at (a checkpoint's).", minimum=1)
    loss: float | None = status_field("The mean of the losses logged in the interval.")


@dataclass(frozen=True)
class LostSeconds(StatusObject):
    """status.goodput.lostSeconds: the wall time that is not surviving step time, by cause (whole seconds)."""

    waiting_for_capacity: int | None = status_field(
        "From an attempt's RayJob being created to its workers training: nodes, pods, Ray.", minimum=0
    )
    start_up: int | None = status_field("The first attempt's time before its first step.", minimum=0)
    restarts: int | None = status_field(
        "Between a lost worker group's last step and the next group's first, less waiting.", minimum=0
    )
    redone_steps: int | None = status_field(
        "Time of steps trained again after a resume from an earlier checkpoint.", minimum=0
    )
    checkpoint_blocking: int | None = status_field(
        "Time the training loop waited for the saves of surviving steps.", minimum=0
    )
    other: int | None = status_field(
        "The rest: mostly after the last step (the final upload, shutting down).", minimum=0
    )


@dataclass(frozen=True)
class Goodput(StatusObject):
    """status.goodput: the run's goodput ledger (train/records/goodput.py ``Ledger.to_status`` writes it)."""

    ratio: float | None = status_field("Goodput: the time of the steps that survived over the wall time (0 to 1).")
    wall_seconds: int | None = status_field(
        "From the first attempt's creation to the latest step (or the end).", minimum=0
    )
    surviving_step_seconds: int | None = status_field("Time of the steps whose results the model carries.", minimum=0)
    lost_seconds: LostSeconds | None = status_field("The rest of the wall time, by cause.")
    steps_redone: tuple[int, ...] | None = status_field(
        "Steps trained again after each resume, in order.", items="Steps redone after one resume."
    )
    worker_restarts: int | None = status_field("Worker groups Ray Train restarted inside an attempt.", minimum=0)


@dataclass(frozen=True)
class Cost(StatusObject):
    """status.cost: what the run cost at the chart's prices (spotray/decisions/cost.py)."""

    currency: str | None = status_field("The prices' currency.")
    run: float | None = status_field("The wall time so far at the head's and every worker node's price (spot or not).")
    on_demand_same_steps: float | None = status_field("The surviving step time plus one start-up, on on-demand nodes.")
    saved_ratio: float | None = status_field("1 - run / onDemandSameSteps: what spot saved (negative: it cost more).")
    on_demand_seconds: int | None = status_field(
        "Of the wall time, the seconds the workers were on on-demand nodes (spot-then-on-demand's fallback), "
        "priced at onDemandPerHour in run.",
        minimum=0,
    )


@dataclass(frozen=True)
class CheckpointInterval(StatusObject):
    """status.checkpointInterval: everySteps: auto's latest choice (train/hf/checkpoint_interval.py writes it)."""

    steps: int | None = status_field("The interval in use, in steps.", minimum=1)
    target_seconds: float | None = status_field("The interval Young/Daly gives, in seconds of training.")
    checkpoint_seconds: float | None = status_field(
        "The measured cost of one checkpoint: how long the loop waits for it."
    )
    step_seconds: float | None = status_field("The measured time of one step.")
    mean_seconds_between_interruptions: float | None = status_field(
        "The estimated mean training time between interruptions."
    )
    interruptions: int | None = status_field(
        "Interruptions observed so far (lost attempts and worker groups).", minimum=0
    )
    observed_seconds: float | None = status_field("Training time observed so far, which the estimate rests on.")
    min_steps: int | None = status_field("The lower bound (spec.checkpoint.minEverySteps).", minimum=1)
    max_steps: int | None = status_field("The upper bound (spec.checkpoint.maxEverySteps).", minimum=1)


@dataclass(frozen=True)
class AttemptStartup(StatusObject):
    """status.attempts[].startup: where an attempt's start-up went, in seconds from its RayJob's creation.

    Each milestone is read once, when the attempt's first step is known: the pods' Ready times from the
    API server, the other two from the job's progress object (its clock). Clocks of different machines
    can disagree by a little; a milestone never shows as negative.
    """

    pods_ready: float | None = status_field(
        "Until every Ray pod of the attempt was Ready: scheduled, image, container, Ray started, probes passing.",
        minimum=0,
    )
    training_loop: float | None = status_field(
        "Until its worker group began the training loop: the submission, the driver, Ray Train's worker group.",
        minimum=0,
    )
    first_step: float | None = status_field(
        "Until its first logged step ended: the model built, the checkpoint fetched, the first batch.", minimum=0
    )


@dataclass(frozen=True)
class ResumeRead(StatusObject):
    """status.attempts[].resumeRead: where a resume on several nodes read its checkpoint, in bytes of its
    files over all the nodes (train/checkpoints/shared_read.py, node_copies.py)."""

    nodes: int = status_field("The nodes the attempt's worker group resumed on.", default=0, minimum=0)
    s3_bytes: int = status_field("Read from S3.", default=0, minimum=0)
    kept_bytes: int = status_field(
        "Read from the copies the nodes kept of their saves (spec.checkpoint.nodeCopies), not from S3.",
        default=0,
        minimum=0,
    )
    peer_bytes: int = status_field(
        "Sent from one node to another: each file read once, then shared.", default=0, minimum=0
    )
    completed_bytes: int = status_field(
        "Uploaded to S3 from the nodes' copies before the resume: the checkpoint it resumed from had not "
        "finished its upload when the attempt before ended (train/checkpoints/complete_from_copies.py).",
        default=0,
        minimum=0,
    )


@dataclass(frozen=True)
class AttemptStatus(StatusObject):
    """One entry of status.attempts; spotray/decisions/run_plan.py keeps its state in them.

    The defaults are what a reader sees for a key an entry lacks; the controller writes every field
    but endTime (until the attempt ends) and resumedFrom (until the job says where it started).
    """

    attempt: int = status_field("The attempt's number, counting from 1.", default=0, minimum=1)
    ray_job: str = status_field("Name of the attempt's RayJob.", default="")
    outcome: str = status_field("How the attempt ended (Running while it runs).", default="", enum=list(OUTCOMES))
    reason: str = status_field("A CamelCase word for the outcome, e.g. NodePreempted, JobFailed.", default="")
    message: str = status_field("The outcome in words.", default="")
    start_time: str | None = status_field("When the attempt's RayJob was created.", format=DATE_TIME)
    end_time: str | None = status_field("When the attempt ended.", format=DATE_TIME)
    resumed_from: int | None = status_field(
        "The checkpoint step the attempt resumed from; null when it started from scratch.", minimum=0, nullable=True
    )
    skipped_checkpoints: tuple[str, ...] | None = status_field(
        "Complete checkpoints newer than the one the attempt resumed from that it passed over, and why; "
        "absent when it resumed from the newest.",
        items="One passed over: checkpoint-<step>: why (bytes that do not match its manifest, a checkpoint "
        "this job cannot load).",
        maxItems=5,
    )
    startup: AttemptStartup | None = status_field(
        "Where the attempt's start-up went, in seconds from its RayJob's creation (controller/startup.py)."
    )
    resume_read: ResumeRead | None = status_field(
        "On several nodes, where the attempt's (latest) worker group read the checkpoint it resumed from."
    )
    capacity: str | None = status_field(
        "Where the attempt's workers asked to run: spot or on-demand (spec.workers.capacity).",
        enum=["spot", "on-demand"],
    )
    capacity_wait_since: str | None = status_field(
        "Since when the attempt's pods wait for capacity: the scheduler cannot place them (no node with room, "
        "a node pool scaling up, no spot node). No budget is spent meanwhile; unset once they are placed.",
        format=DATE_TIME,
    )
    capacity_waited_seconds: int | None = status_field(
        "Seconds the attempt's pods waited for capacity in waits that ended; its start deadline does not count them.",
        minimum=0,
    )
    ray_cluster: str | None = status_field(
        "The run's RayCluster the attempt ran on, when the controller keeps one across attempts "
        "(rayJob.clusterPerRun); absent when each attempt's RayJob has a cluster of its own."
    )


# Kubernetes' own limits on a condition's fields (metav1.Condition).
_CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
# A list of conditions holds one per type, which the API server merges the list by (server-side apply).
_ONE_PER_TYPE: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


@dataclass(frozen=True)
class Condition(StatusObject):
    """One of status.conditions, shaped exactly like metav1.Condition so that generic tools
    (kubectl wait, kstatus) read it."""

    type: str | None = status_field(
        "The condition's kind in CamelCase, e.g. Ready, Progressing, Preempted.",
        required=True,
        maxLength=316,
        pattern=_CONDITION_TYPE_PATTERN,
    )
    status: str | None = status_field("Whether the condition holds.", required=True, enum=["True", "False", "Unknown"])
    observed_generation: int | None = status_field(
        "The metadata.generation the condition was set for.", format="int64", minimum=0
    )
    last_transition_time: str | None = status_field("When status last changed.", required=True, format=DATE_TIME)
    reason: str | None = status_field(
        "A CamelCase word for the last transition, for programs.",
        required=True,
        maxLength=1024,
        minLength=1,
        pattern=_CONDITION_REASON_PATTERN,
    )
    message: str | None = status_field("The last transition in words, for people.", required=True, maxLength=32768)


@dataclass(frozen=True)
class RunStatus(StatusObject):
    """A TrainingRun's whole status. Every field is None until someone writes it."""

    phase: str | None = status_field(
        "Pending (no attempt yet), Running, Resuming (a new attempt after a preemption or failure), "
        "Suspended, Succeeded or Failed (retries exhausted or the spec is invalid).",
        enum=list(PHASES),
    )
    attempt: int | None = status_field("The current (or last) attempt, counting from 1.", minimum=0)
    preemptions: int | None = status_field(
        "Spot preemptions so far, compared with spec.retry.maxPreemptions.", minimum=0
    )
    failures: int | None = status_field("Job failures so far, compared with spec.retry.maxFailures.", minimum=0)
    ray_job: str | None = status_field("Name of the current attempt's RayJob (<run>-a<attempt>).", clearable=True)
    message: str | None = status_field("The latest news in one line, for people.")
    next_attempt_time: str | None = status_field(
        "When the next attempt starts, while waiting out retry.backoffSeconds.", format=DATE_TIME, clearable=True
    )
    storage_unreachable_since: str | None = status_field(
        "Since when the ended attempt's records cannot be read from the checkpoint URI (no budget is "
        "spent meanwhile), or a finished run's last progress and checkpoint; unset once they can.",
        format=DATE_TIME,
        clearable=True,
    )
    observed_generation: int | None = status_field(
        "The metadata.generation this status describes.", format="int64", minimum=0
    )
    progress: Progress | None = status_field("The latest training progress the job reported.")
    last_checkpoint: LastCheckpoint | None = status_field(
        "The latest complete checkpoint, which the next attempt resumes from."
    )
    goodput: Goodput | None = status_field("The goodput ledger: where the run's wall time went (docs/goodput.md).")
    cost: Cost | None = status_field(
        "With the chart's prices: what the run cost so far, and an on-demand run of its steps."
    )
    checkpoint_interval: CheckpointInterval | None = status_field(
        "With spec.checkpoint.everySteps: auto, the interval in use and the numbers it came from "
        "(Young/Daly: about sqrt(2 x checkpoint cost x mean time between interruptions))."
    )
    interval_losses: tuple[IntervalLoss, ...] | None = status_field(
        "For a sweep's trial: the objective at each step its spotray.dev/objective-steps annotation lists "
        "and at its last step, once that step is in a complete checkpoint (spotray/decisions/sweep_plan.py reads it).",
        items="The mean loss over one checkpoint interval.",
    )
    attempts: tuple[AttemptStatus, ...] | None = status_field(
        "The last 20 attempts, oldest first (preemptions and failures count them all).",
        items="One attempt: one RayJob from start to end.",
    )
    conditions: tuple[Condition, ...] | None = status_field(
        "The run's conditions, one per type.",
        items="One aspect of the run's state, in the standard Kubernetes condition shape.",
        **_ONE_PER_TYPE,
    )

    @classmethod
    def of(cls, run: Mapping[str, Any]) -> RunStatus:
        """The status of a TrainingRun object (all None before the controller wrote one)."""
        return cls.from_status(run.get("status") or {})

    def attempt_entry(self, attempt: int) -> AttemptStatus:
        """The attempt's history entry; an empty one (no outcome) until the controller writes it."""
        return next((entry for entry in self.attempts or () if entry.attempt == attempt), AttemptStatus())

    def to_patch(self) -> dict[str, Any]:
        """The status as a merge patch, which keeps the stored value of every key it leaves out.

        Like ``to_status``, but a clearable field that is None is written as null, which removes
        it: the lifecycle unsets the next attempt's time once it starts, and the time since when
        the store is unreachable once it is back. A field that is None and not clearable keeps its
        stored value: progress stays as it was while the store is not read.
        """
        return {
            key.key: _encode(value)
            for key in _keys(RunStatus)
            if _written(key, value := getattr(self, key.name)) or (value is None and key.clearable)
        }
