"""Status times in every form Kubernetes accepts, and a status the controller cannot read.

The rule: status parsing accepts every valid timestamp (RFC 3339 as Kubernetes' ``date-time``:
fractional seconds, ``Z`` or an offset); a status the controller cannot parse is reported in a
Warning Event and rebuilt from the facts, never an exception on every reconcile. Rebuilding is
conservative: it never starts a second attempt beside a running one, never spends a budget and
never fails the run on a status it could not read.
"""

from __future__ import annotations

import copy
import io
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from spotray.cli.run_status import describe_run, run_summary, status_table
from spotray.cli.watch import StatusFollower
from spotray.contract.attempts import AttemptRecords
from spotray.contract.names import ATTEMPT_LABEL, RUN_LABEL
from spotray.contract.status import RunStatus, Unreadable, format_date_time, parse_date_time
from spotray.contract.uris import parse_uri
from spotray.controller.config import ControllerConfig
from spotray.controller.reconcile import MEMORY, rayjob_view, reconcile
from spotray.decisions.conditions import conditions
from spotray.decisions.observation import Observation, RayJobView
from spotray.decisions.run_state import Plan, RunState
from spotray.decisions.vocabulary import Event
from spotray.local.progress import ProgressView
from tests.lifecycle_runs import NOW, LeftoverFacts, run
from tests.lifecycle_runs import planned as plan

pytestmark = pytest.mark.unit


def attempt(number: int, outcome: str, **fields: Any) -> dict[str, Any]:
    return {"attempt": number, "rayJob": f"r-a{number}", "outcome": outcome, "reason": "", "message": "", **fields}


# The same moment, 10.123456 s after NOW, in forms the API server accepts for a `date-time` field.
TEN_SECONDS_LATER = [
    ("2026-11-23T12:00:10.123456Z", 10.123456),
    ("2026-11-23T12:00:10.5Z", 10.5),
    ("2026-11-23T12:00:10.123456789Z", 10.123456),  # nanoseconds (Go's RFC3339Nano): microseconds kept
    ("2026-11-23T12:00:10+00:00", 10.0),
    ("2026-11-23T12:00:10.25+00:00", 10.25),
    ("2026-11-23T14:00:10+02:00", 10.0),
    ("2026-11-23T06:30:10.75-05:30", 10.75),
    ("2026-11-23t12:00:10z", 10.0),  # Kubernetes' check is case-insensitive
]


# ---------------------------------------------------------------------------------------------
# The one parser and the one form the controller writes.


@pytest.mark.parametrize(("text", "seconds"), TEN_SECONDS_LATER)
def test_the_parser_reads_every_date_time_the_api_server_accepts(text: str, seconds: float) -> None:
    parsed = parse_date_time(text)
    assert parsed.tzinfo is UTC
    assert parsed == NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-23",  # a date alone
        "2026-11-23T12:00:10",  # no offset
        "2026-11-23 12:00:10Z",  # a space: RFC 3339 allows it, the API server does not
        "20261123T120010Z",  # ISO 8601's basic form
        "2026-11-23T12:00:60Z",  # a leap second: the API server refuses it, and datetime cannot hold it
        "2026-11-23T24:00:00Z",
        "2026-02-30T12:00:00Z",
        "2026-11-23T12:00:10.Z",
        "2026-11-23T12:00:10+0200",
        "2026-11-23T12:00:10+99:00",
        "2026-11-23T12:00:10Z ",
        "soon",
        "",
    ],
)
def test_the_parser_refuses_what_is_not_an_rfc_3339_time(text: str) -> None:
    with pytest.raises(ValueError, match="is not an RFC 3339 time"):
        parse_date_time(text)


def test_the_parser_refuses_what_is_not_a_string() -> None:
    with pytest.raises(TypeError):
        parse_date_time(1764000000)  # type: ignore[arg-type]


def test_the_controller_writes_whole_seconds_in_utc_with_z() -> None:
    moment = datetime(2026, 11, 23, 14, 0, 10, 987654, tzinfo=UTC)
    assert format_date_time(moment) == "2026-11-23T14:00:10Z"
    assert format_date_time(parse_date_time("2026-11-23T16:00:10.5+02:00")) == "2026-11-23T14:00:10Z"


def test_the_reader_says_what_it_read_as_missing_with_its_path() -> None:
    status, problems = RunStatus.read(
        {
            "phase": "Running",
            "attempt": True,  # a boolean is no number
            "attempts": [{"attempt": 1, "outcome": "Running", "startTime": "2026-11-23T12:00:00.5Z"}, 3],
            "progress": {"step": -1, "loss": 2, "updateTime": "2026-11-23T12:00:00+00:00"},
            "goodput": {"stepsRedone": [4, "x"]},
            "someFutureField": "ignored",
        }
    )
    assert [(p.path, p.value) for p in problems] == [
        ("attempt", True),
        ("progress.step", -1),
        ("goodput.stepsRedone[1]", "x"),
        ("attempts[1]", 3),
    ]
    assert status.phase == "Running"
    assert status.attempt is None
    assert status.attempts is not None
    assert status.attempts[0].start_time == "2026-11-23T12:00:00.5Z"  # kept as written: valid
    assert status.progress is not None
    assert (status.progress.step, status.progress.loss) == (None, 2)
    assert status.goodput is not None
    assert status.goodput.steps_redone == (4,)
    assert RunStatus.read("not an object") == (RunStatus(), (Unreadable("", "not an object"),))
    long = str(Unreadable("phase", "x" * 500))
    assert long.startswith('phase: "xxx')
    assert long.endswith("...")
    assert len(long) < 220


# ---------------------------------------------------------------------------------------------
# Every time the lifecycle reads, in every form.


@pytest.mark.parametrize(("text", "seconds"), TEN_SECONDS_LATER)
def test_the_backoff_wait_reads_any_date_time(text: str, seconds: float) -> None:
    state = RunState.from_status(
        {
            "phase": "Resuming",
            "attempt": 1,
            "failures": 1,
            "nextAttemptTime": text,
            "attempts": [attempt(1, "Failed", startTime="2026-11-23T11:00:00.5Z", endTime="2026-11-23T11:59:50.5Z")],
        }
    )
    waiting = plan(Observation(run(), state, None), NOW)
    assert waiting.create_attempt is None
    assert waiting.requeue_after_s == pytest.approx(seconds)
    due = plan(Observation(run(), state, None), NOW + timedelta(seconds=seconds + 0.001))
    assert due.create_attempt == 2


@pytest.mark.parametrize(("text", "seconds"), TEN_SECONDS_LATER)
def test_the_start_deadline_reads_any_date_time(text: str, seconds: float) -> None:
    state = RunState.from_status(
        {"phase": "Pending", "attempt": 1, "attempts": [attempt(1, "Running", startTime=text)]}
    )
    job = RayJobView(job_status=None, deployment_status="Initializing")
    starts = NOW + timedelta(seconds=seconds)

    def at(later: float) -> Plan:
        observation = Observation(run(), state, job, AttemptRecords(), start_deadline_seconds=600)
        return plan(observation, starts + timedelta(seconds=later))

    assert at(599).state.phase == "Pending"
    ended = at(601).state.current
    assert ended is not None
    assert ended.reason == "StartDeadlineExceeded"


@pytest.mark.parametrize(("text", "seconds"), TEN_SECONDS_LATER)
def test_waiting_for_storage_and_its_condition_read_any_date_time(text: str, seconds: float) -> None:
    status = {
        "phase": "Running",
        "attempt": 1,
        "storageUnreachableSince": text,
        "attempts": [attempt(1, "Running", startTime="2026-11-23T11:00:00.5Z")],
    }
    state = RunState.from_status(status)
    since = NOW + timedelta(seconds=seconds)
    job = RayJobView("FAILED", "Failed", "exit 1", end_time=NOW)
    result = plan(Observation(run(), state, job, None, storage_patience_seconds=600), since + timedelta(seconds=601))
    assert result.create_attempt is None
    assert result.state.failures == 0
    assert "for 601 s" in result.state.message
    unreachable = {c.type: c for c in conditions(state, [], 1, since + timedelta(seconds=601), 600)}
    assert unreachable["StorageUnreachable"].status == "True"
    patient = {c.type: c for c in conditions(state, [], 1, since + timedelta(seconds=599), 600)}
    assert patient["StorageUnreachable"].status == "False"


def test_a_condition_keeps_its_fractional_transition_time_while_it_holds() -> None:
    state = RunState.from_status(
        {"phase": "Running", "attempt": 1, "attempts": [attempt(1, "Running", startTime="2026-11-23T11:00:00.5Z")]}
    )
    first = conditions(state, [], 1, NOW)
    fractional = [
        replace(c, last_transition_time="2026-11-23T11:00:00.5Z") if c.type == "Progressing" else c for c in first
    ]
    later = {c.type: c for c in conditions(state, fractional, 2, NOW + timedelta(minutes=5))}
    assert later["Progressing"].last_transition_time == "2026-11-23T11:00:00.5Z"


@pytest.mark.parametrize(
    "end_time", ["2026-11-23T11:59:58.5Z", "2026-11-23T11:59:58+00:00", "2026-11-23T13:59:58.5+02:00"]
)
def test_a_rayjobs_end_time_in_any_form_is_read_and_the_failure_settles(end_time: str) -> None:
    view = rayjob_view({"status": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "endTime": end_time}})
    assert view is not None
    assert view.end_time is not None
    assert abs((view.end_time - (NOW - timedelta(seconds=1.5))).total_seconds()) <= 0.5
    state = RunState.from_status({"phase": "Running", "attempt": 1, "attempts": [attempt(1, "Running")]})
    settling = plan(Observation(run(), state, view, AttemptRecords(), settle_seconds=5), NOW)
    assert settling.requeue_after_s is not None
    assert settling.state.failures == 0


# ---------------------------------------------------------------------------------------------
# The lifecycle's decisions on a status it could not read in full (pure: spotray/decisions/run_plan.py).


def test_unreadable_values_are_reported_in_one_warning_event_and_gone_from_the_state_planned() -> None:
    state = RunState.from_status({**RUNNING_STATUS, "phase": "Exploded", "message": 42})
    assert [p.path for p in state.unreadable] == ["phase", "message"]
    assert RunState.from_status({"progress": {"updateTime": 1}, "attempts": [{"attempt": "x"}]}).unreadable_keys == {
        "progress",
        "attempts",
    }
    result = plan(Observation(run(), state, RayJobView("RUNNING", "Running")), NOW)
    first, *rest = result.events
    assert (first.type, first.reason) == ("Warning", "StatusUnreadable")
    assert 'status.phase: "Exploded"' in first.message
    assert "status.message: 42" in first.message
    assert [e.reason for e in rest] == []
    assert result.state.phase == "Running"
    again = RunState.from_status(result.state.to_status())
    assert again.unreadable == ()
    assert plan(Observation(run(), again, RayJobView("RUNNING", "Running")), NOW).events == ()


def test_an_unreadable_backoff_waits_a_whole_backoff_from_now() -> None:
    status = {
        "phase": "Resuming",
        "attempt": 1,
        "failures": 1,
        "nextAttemptTime": "2026-13-01T00:00:00Z",
        "attempts": [attempt(1, "Failed")],
    }
    result = plan(Observation(run(), RunState.from_status(status), None), NOW)
    assert result.create_attempt is None
    assert result.state.next_attempt_time == "2026-11-23T12:00:10Z"
    assert result.requeue_after_s == 10
    assert plan(Observation(run(), result.state, None), NOW + timedelta(seconds=11)).create_attempt == 2


def test_a_current_attempt_whose_entry_is_lost_is_placed_from_status_attempt() -> None:
    status = {**RUNNING_STATUS, "attempts": [RUNNING_STATUS["attempts"][0], "?"]}
    state = RunState.from_status(status, "r")
    assert state.history_lost
    assert state.current is not None
    assert (state.current.attempt, state.current.ray_job, state.current.outcome) == (2, "r-a2", "")
    gone = plan(Observation(run(), state, None), NOW)
    assert gone.create_attempt is None, "its RayJob is gone: attempt 2 is judged, never run again under its number"
    assert gone.state.current is not None
    assert (gone.state.current.attempt, gone.state.current.outcome) == (2, "Interrupted")
    assert (gone.state.preemptions, gone.state.failures) == (1, 0), "not counted: the status may have counted it"
    later = plan(Observation(run(), gone.state, None), NOW + timedelta(minutes=5))
    assert later.create_attempt == 3


def test_the_run_s_rayjobs_place_the_current_attempt_when_the_status_cannot() -> None:
    state = RunState.from_status({"phase": "Running", "attempts": "?"}, "r")
    assert state.current is None
    assert state.history_lost
    seen = state.with_attempts_seen([1, 4, 3], "r")
    assert seen.current is not None
    assert (seen.current.attempt, seen.current.ray_job, seen.current.outcome) == (4, "r-a4", "")
    assert seen.with_attempts_seen([2], "r") == seen  # never back


def test_an_attempt_of_unknown_outcome_that_succeeded_ends_the_run() -> None:
    status = {**RUNNING_STATUS, "attempts": [*RUNNING_STATUS["attempts"][:1], attempt(2, "")]}
    result = plan(Observation(run(), RunState.from_status(status), RayJobView("SUCCEEDED", "Complete")), NOW)
    assert result.state.phase == "Succeeded"
    assert result.create_attempt is None


def test_an_attempt_of_unknown_outcome_is_suspended_without_counting() -> None:
    status = {**RUNNING_STATUS, "attempts": [*RUNNING_STATUS["attempts"][:1], attempt(2, "Bogus")]}
    result = plan(Observation(run(suspend=True), RunState.from_status(status), None), NOW)
    assert result.state.phase == "Suspended"
    assert result.state.current is not None
    assert result.state.current.outcome == "Suspended"
    assert result.delete_rayjob == "r-a2"
    assert (result.state.preemptions, result.state.failures) == (1, 0)


def test_an_older_attempt_of_unknown_outcome_leaves_the_history_not_the_budgets() -> None:
    status = {**RUNNING_STATUS, "attempts": [attempt(1, "Nope"), RUNNING_STATUS["attempts"][1]]}
    state = RunState.from_status(status)
    assert [a.attempt for a in state.attempts] == [2]
    assert state.preemptions == 1
    assert [p.path for p in state.unreadable] == ["attempts[0].outcome"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"failures": 2}, "2 failures exceed spec.retry.maxFailures=1"),
        ({"preemptions": 3}, "3 preemptions exceed spec.retry.maxPreemptions=2"),
        ({"attempts": [attempt(1, "Failed", reason="BadInput")]}, "the job refused its input"),
    ],
)
def test_an_unreadable_phase_after_the_last_allowed_attempt_neither_fails_nor_starts(
    change: dict[str, Any], why: str
) -> None:
    status = {"phase": 0, "attempt": 1, "preemptions": 0, "failures": 1, "attempts": [attempt(1, "Failed")], **change}
    result = plan(Observation(run(), RunState.from_status(status), None), NOW)
    assert result.create_attempt is None
    assert result.state.phase == "Resuming"
    assert why in result.state.message
    assert [e.reason for e in result.events] == ["StatusUnreadable", "RetryBudgetSpent"]
    again = plan(Observation(run(), RunState.from_status(result.state.to_status()), None), NOW + timedelta(hours=1))
    assert again.create_attempt is None
    assert again.events == (), "said once"
    assert again.state.phase == "Resuming"


# ---------------------------------------------------------------------------------------------
# The reconcile path, over a fake API server.


class FakeCluster(LeftoverFacts):
    """The calls reconcile makes, over dicts; RayJobs as the API server would list them."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.run = body
        self.rayjobs: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.patches: list[dict[str, Any]] = []
        self.events: list[Event] = []
        self.lock = threading.Lock()

    def add_rayjob(self, number: int, job_status: str | None, deployment: str, **status: Any) -> None:
        name = f"{self.run['metadata']['name']}-a{number}"
        self.rayjobs[name] = {
            "metadata": {
                "name": name,
                "namespace": "ns",
                "labels": {RUN_LABEL: self.run["metadata"]["name"], ATTEMPT_LABEL: str(number)},
                "ownerReferences": [{"uid": self.run["metadata"]["uid"], "controller": True}],
            },
            "status": {"jobStatus": job_status, "jobDeploymentStatus": deployment, **status},
        }

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.run)

    def get_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.rayjobs.get(name))

    def list_rayjobs(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(job)
            for job in self.rayjobs.values()
            if all(job["metadata"]["labels"].get(key) == value for key, value in labels.items())
        ]

    def create_rayjob(self, body: dict[str, Any]) -> dict[str, Any] | None:
        name = body["metadata"]["name"]
        self.created.append(name)
        if name in self.rayjobs:
            return copy.deepcopy(self.rayjobs[name])
        self.rayjobs[name] = body
        return None

    def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str | None = None
    ) -> bool:
        self.patches.append(copy.deepcopy(status))
        merged = {**(self.run.get("status") or {}), **status}
        self.run["status"] = {key: value for key, value in merged.items() if value is not None}
        return True

    def delete_rayjob(self, namespace: str, name: str) -> None:
        self.deleted.append(name)
        self.rayjobs.pop(name, None)

    def post_event(self, body: dict[str, Any], event: Event, now: datetime) -> None:
        with self.lock:
            self.events.append(event)

    def read_secret(self, namespace: str, name: str, max_age_s: float = 0.0) -> None:
        return None

    def config(self, **settings: Any) -> ControllerConfig:
        """The controller's settings, with the directory holding the run's file:// checkpoints as a root."""
        checkpoints = Path(parse_uri(self.run["spec"]["checkpoint"]["uri"]).prefix)
        return ControllerConfig(file_roots=(str(checkpoints.parent),), **settings)

    def reconcile(self, config: ControllerConfig | None = None) -> float | None:
        cluster: Any = self
        try:
            return reconcile(cluster, config or self.config(), "ns", self.run["metadata"]["name"])
        finally:
            MEMORY.events.drain()

    def warnings(self, reason: str) -> list[str]:
        with self.lock:
            return [e.message for e in self.events if e.type == "Warning" and e.reason == reason]


_uids = iter(range(1_000_000))


def body(tmp_path: Path, status: dict[str, Any] | None, **spec: Any) -> dict[str, Any]:
    uid = f"uid-unreadable-{next(_uids)}"
    run_body: dict[str, Any] = {
        "apiVersion": "spotray.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "r", "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {
            "entrypoint": "python -m spotray.jobs.gpt2",
            "checkpoint": {"uri": f"file://{tmp_path / 'ckpt'}"},
            "retry": {"maxPreemptions": 2, "maxFailures": 1, "backoffSeconds": 10},
            **spec,
        },
    }
    if status is not None:
        run_body["status"] = status
    return run_body


def iso(moment: datetime, fraction: str = ".123456", offset: str = "Z") -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + offset


def test_a_running_run_with_fractional_times_everywhere_reconciles(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    status = {
        "phase": "Running",
        "attempt": 2,
        "preemptions": 1,
        "failures": 0,
        "rayJob": "r-a2",
        "message": "attempt 2 running",
        "observedGeneration": 1,
        "storageUnreachableSince": iso(now - timedelta(seconds=30), ".5", "+00:00"),
        "progress": {"step": 5, "totalSteps": 10, "loss": 1.0, "updateTime": iso(now - timedelta(seconds=2))},
        "lastCheckpoint": {"step": 4, "uri": "file:///x/checkpoint-4", "time": iso(now - timedelta(seconds=3))},
        "attempts": [
            attempt(
                1,
                "Preempted",
                reason="NodeLost",
                startTime=iso(now - timedelta(hours=2)),
                endTime=iso(now - timedelta(hours=1), ".000001", "+01:00"),
            ),
            attempt(2, "Running", startTime=iso(now - timedelta(minutes=50), ".987654321")),
        ],
        "conditions": [
            {
                "type": "Progressing",
                "status": "True",
                "observedGeneration": 1,
                "lastTransitionTime": iso(now - timedelta(minutes=50)),
                "reason": "Running",
                "message": "attempt 2 running",
            }
        ],
    }
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(2, "RUNNING", "Running")
    fake.reconcile()
    assert fake.created == []
    assert fake.run["status"]["phase"] == "Running"
    assert fake.run["status"]["attempt"] == 2
    assert fake.warnings("StatusUnreadable") == []


def test_a_run_waiting_out_a_fractional_backoff_reconciles_and_waits(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    status = {
        "phase": "Resuming",
        "attempt": 1,
        "failures": 1,
        "preemptions": 0,
        "rayJob": "r-a1",
        "nextAttemptTime": iso(now + timedelta(seconds=300), ".25", "+00:00"),
        "attempts": [attempt(1, "Failed", startTime=iso(now - timedelta(minutes=5)), endTime=iso(now))],
    }
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(1, "FAILED", "Failed")
    wait = fake.reconcile()
    assert fake.created == []
    assert wait is not None
    assert 290 < wait <= 300.25


# ---------------------------------------------------------------------------------------------
# A status the controller cannot read: never an exception, an Event once, rebuilt from the facts.

RUNNING_STATUS: dict[str, Any] = {
    "phase": "Running",
    "attempt": 2,
    "preemptions": 1,
    "failures": 0,
    "rayJob": "r-a2",
    "message": "attempt 2 running",
    "attempts": [
        attempt(1, "Preempted", reason="NodeLost", startTime="2026-11-23T10:00:00Z", endTime="2026-11-23T11:00:00Z"),
        attempt(2, "Running", startTime="2026-11-23T11:00:10Z"),
    ],
}

MALFORMED: dict[str, tuple[dict[str, Any], str, str]] = {
    "a time that is not a time": ({"nextAttemptTime": "soon"}, "nextAttemptTime", "soon"),
    "a number where a time belongs": ({"storageUnreachableSince": 1764000000}, "storageUnreachableSince", "1764000000"),
    "an attempt's start that is not a time": (
        {"attempts": [RUNNING_STATUS["attempts"][0], {**RUNNING_STATUS["attempts"][1], "startTime": "yesterday"}]},
        "attempts[1].startTime",
        "yesterday",
    ),
    "an attempt's end that is a number": (
        {"attempts": [{**RUNNING_STATUS["attempts"][0], "endTime": 12}, RUNNING_STATUS["attempts"][1]]},
        "attempts[0].endTime",
        "12",
    ),
    "a transition time that is not a time": (
        {"conditions": [{"type": "Progressing", "status": "True", "lastTransitionTime": "noon", "reason": "Running"}]},
        "conditions[0].lastTransitionTime",
        "noon",
    ),
    "a progress time that is not a time": ({"progress": {"step": 3, "updateTime": "x"}}, "progress.updateTime", "x"),
    "a number where a string belongs": ({"message": 42}, "message", "42"),
    "a string where a number belongs": ({"preemptions": "one"}, "preemptions", "one"),
    "an attempts list that is not a list": ({"attempts": "garbage"}, "attempts", "garbage"),
    "an attempts list that is a number": ({"attempts": 7}, "attempts", "7"),
    "an attempt that is not an object": (
        {"attempts": [RUNNING_STATUS["attempts"][0], "attempt 2"]},
        "attempts[1]",
        "attempt 2",
    ),
    "a phase that is unknown": ({"phase": "Exploded"}, "phase", "Exploded"),
    "a phase that is a number": ({"phase": 3}, "phase", "3"),
    "an outcome that is unknown": (
        {"attempts": [RUNNING_STATUS["attempts"][0], {**RUNNING_STATUS["attempts"][1], "outcome": "Sideways"}]},
        "attempts[1].outcome",
        "Sideways",
    ),
    "conditions that are not a list": ({"conditions": {"type": "Ready"}}, "conditions", "Ready"),
    "progress that is not an object": ({"progress": "fast"}, "progress", "fast"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_the_lifecycle_reads_a_malformed_status_without_raising(case: str) -> None:
    change, _, _ = MALFORMED[case]
    state = RunState.from_status({**RUNNING_STATUS, **change})
    result = plan(Observation(run(), state, RayJobView("RUNNING", "Running")), NOW)
    assert result.create_attempt is None, "attempt 2 runs: no second one beside it"
    assert result.state.phase != "Failed"


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_a_malformed_status_is_reported_once_and_rebuilt_never_raised(case: str, tmp_path: Path) -> None:
    change, field, value = MALFORMED[case]
    fake = FakeCluster(body(tmp_path, {**RUNNING_STATUS, **change}))
    fake.add_rayjob(1, "FAILED", "Failed")
    fake.add_rayjob(2, "RUNNING", "Running")
    fake.reconcile()
    assert fake.created == [], "attempt 2 runs: no second one beside it, no old one again"
    assert fake.deleted == []
    warnings = fake.warnings("StatusUnreadable")
    assert len(warnings) == 1
    assert field in warnings[0]
    assert value in warnings[0]
    written = fake.run["status"]
    assert written["phase"] == "Running"
    assert written["attempt"] == 2
    assert written["failures"] == 0
    fake.reconcile()  # the status was rebuilt: nothing more to report, nothing created
    assert len(fake.warnings("StatusUnreadable")) == 1
    assert fake.created == []


def test_attempts_that_cannot_be_read_are_rebuilt_from_the_run_s_rayjobs(tmp_path: Path) -> None:
    """No attempt number anywhere in the status: the RayJobs the run owns say which attempt is current."""
    status = {"phase": "Running", "attempt": "two", "rayJob": 5, "attempts": {"oops": 1}}
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(1, "FAILED", "Failed")
    fake.add_rayjob(2, "RUNNING", "Running")
    fake.reconcile()
    assert fake.created == [], "neither attempt 1 again nor a third beside attempt 2"
    written = fake.run["status"]
    assert written["attempt"] == 2
    assert written["rayJob"] == "r-a2"
    assert written["attempts"][-1]["outcome"] == "Running"
    assert written["phase"] == "Running"
    assert len(fake.warnings("StatusUnreadable")) == 1


def test_an_unreadable_current_outcome_of_an_ended_attempt_spends_no_budget(tmp_path: Path) -> None:
    """Whether attempt 2's end was counted cannot be known: it is not counted again, and the run is not failed."""
    status = {
        **RUNNING_STATUS,
        "phase": "Resuming",
        "failures": 1,
        "attempts": [RUNNING_STATUS["attempts"][0], {**RUNNING_STATUS["attempts"][1], "outcome": 99}],
    }
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(1, "FAILED", "Failed")
    ended = datetime.now(UTC) - timedelta(minutes=1)
    fake.add_rayjob(2, "FAILED", "Failed", endTime=iso(ended, ".5", "+00:00"), message="exit 1")
    fake.reconcile()
    written = fake.run["status"]
    assert written["failures"] == 1
    assert written["phase"] != "Failed"
    assert written["attempts"][-1]["outcome"] in ("Failed", "Preempted")
    assert fake.created == []


def test_an_unknown_phase_with_its_budgets_spent_neither_fails_the_run_nor_starts_another(tmp_path: Path) -> None:
    status = {
        "phase": "Broken",
        "attempt": 2,
        "preemptions": 0,
        "failures": 2,
        "rayJob": "r-a2",
        "attempts": [attempt(1, "Failed"), attempt(2, "Failed")],
    }
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(1, "FAILED", "Failed")
    fake.add_rayjob(2, "FAILED", "Failed")
    fake.reconcile()
    fake.reconcile()
    assert fake.created == []
    assert fake.run["status"]["phase"] != "Failed"
    assert fake.run["status"]["failures"] == 2


def test_a_finished_run_with_an_unreadable_field_is_reported_and_cleaned_once(tmp_path: Path) -> None:
    status = {
        "phase": "Succeeded",
        "attempt": 1,
        "rayJob": "r-a1",
        "progress": {"step": 9, "updateTime": "later"},
        "attempts": [attempt(1, "Succeeded")],
    }
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(1, "SUCCEEDED", "Complete")
    fake.reconcile()
    fake.reconcile()
    assert len(fake.warnings("StatusUnreadable")) == 1
    assert fake.run["status"]["phase"] == "Succeeded"
    assert "progress" not in fake.run["status"]
    assert len(fake.patches) == 1
    assert fake.created == []


def test_an_unreadable_status_is_reported_while_the_run_waits_for_its_secret(tmp_path: Path) -> None:
    """Attempt 2's RayJob is gone, so its records decide, but the Secret to read them is missing: the run
    waits, and what it writes meanwhile is a status the API server accepts (no outcome it does not know)."""
    fake = FakeCluster(body(tmp_path, {**RUNNING_STATUS, "attempts": "garbage"}))
    fake.add_rayjob(1, "FAILED", "Failed")
    config = fake.config(s3_secret="missing-creds")
    fake.reconcile(config)
    fake.reconcile(config)
    assert fake.created == []
    assert len(fake.warnings("StatusUnreadable")) == 1
    (waiting,) = fake.warnings("WaitingForStorage")
    assert "waiting for Secret missing-creds" in waiting
    entries = fake.run["status"]["attempts"]
    assert [entry["attempt"] for entry in entries] == [2]
    assert "outcome" not in entries[0], "unknown until its RayJob says; never an outcome the CRD refuses"
    assert fake.run["status"]["failures"] == 0
    del fake.run["spec"]["retry"]  # any change; the Secret is still missing: still nothing created
    fake.reconcile(config)
    assert fake.created == []


def test_an_outcome_not_known_yet_is_never_written() -> None:
    state = RunState.from_status({**RUNNING_STATUS, "attempts": [attempt(2, "Sideways")]})
    assert state.current is not None
    assert state.current.outcome == ""
    assert "outcome" not in state.to_status()["attempts"][0]
    assert RunStatus(phase="Exploded").to_status() == {}


def test_counters_that_cannot_be_read_are_counted_from_the_attempts_never_more(tmp_path: Path) -> None:
    status = {**RUNNING_STATUS, "preemptions": -4, "failures": "many"}
    fake = FakeCluster(body(tmp_path, status))
    fake.add_rayjob(1, "FAILED", "Failed")
    fake.add_rayjob(2, "RUNNING", "Running")
    fake.reconcile()
    written = fake.run["status"]
    assert (written["preemptions"], written["failures"]) == (1, 0)
    assert written["phase"] == "Running"


# ---------------------------------------------------------------------------------------------
# The CLI reads the same status.

CLI_NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def cli_run(status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpt2", "namespace": "team-a", "creationTimestamp": "2026-01-01T11:00:00.5Z"},
        "spec": {},
        "status": status,
    }


def test_the_cli_shows_ages_of_fractional_and_offset_times() -> None:
    status = {
        "phase": "Running",
        "attempt": 1,
        "progress": {"step": 3, "totalSteps": 9, "loss": 2.0, "updateTime": "2026-01-01T11:59:55.5Z"},
        "lastCheckpoint": {"step": 2, "uri": "s3://b/c-2", "time": "2026-01-01T13:58:00+02:00"},
        "attempts": [attempt(1, "Running", startTime="2026-01-01T10:59:59.123456789Z")],
        "conditions": [
            {"type": "Progressing", "status": "True", "reason": "Running", "lastTransitionTime": "2026-01-01T11:50:00Z"}
        ],
    }
    text = describe_run(cli_run(status), CLI_NOW)
    assert "(updated 4s ago)" in text
    assert "(2m ago)" in text
    assert "60m ago" in text
    out = io.StringIO()
    follower = StatusFollower(ProgressView(stream=out), "gpt2", "team-a")
    follower.update(cli_run(status))
    assert follower.step == 3


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_the_cli_shows_a_malformed_status_without_raising(case: str) -> None:
    change, _, _ = MALFORMED[case]
    malformed = cli_run({**RUNNING_STATUS, **change})
    assert describe_run(malformed, CLI_NOW)
    assert status_table([malformed], CLI_NOW)
    assert run_summary(malformed)
    StatusFollower(ProgressView(stream=io.StringIO()), "gpt2", "team-a").update(malformed)


def test_budgets_patched_lower_than_the_attempts_kept_show_are_counted_from_the_attempts() -> None:
    """Whoever may patch trainingruns/status could reset the counters: the attempts kept still count."""
    attempts = [attempt(1, "Failed"), attempt(2, "Preempted"), attempt(3, "Failed"), attempt(4, "Running")]
    reset = RunState.from_status({**RUNNING_STATUS, "attempts": attempts, "failures": 1, "preemptions": 0})
    assert (reset.failures, reset.preemptions) == (2, 1)
    more = RunState.from_status({**RUNNING_STATUS, "attempts": attempts, "failures": 5, "preemptions": 7})
    assert (more.failures, more.preemptions) == (5, 7), "older attempts than the 20 kept counted too"
