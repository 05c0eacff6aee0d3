"""The spec -> Ray Train mapping, the worker-side callbacks and the local runner's pure parts."""

import json
import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from spotray.contract.spec import RunContext, TrainingRun, parse_training_run
from spotray.local.local_run import EventCursor, needs_embedded_s3, ray_cpus_for
from spotray.local.progress import ProgressView, format_duration
from spotray.train.hf.data import DataPosition, EpochLoader
from spotray.train.hf.notice import PreemptionNoticeCallback
from spotray.train.launch.launcher import (
    build_run_config,
    build_scaling_config,
    driver_env_vars,
    ray_runs_on_this_machine,
    spotray_env_for_workers,
    start_autoscaling_coordinator,
    worker_group_start_tries,
)
from spotray.train.records.event_log import EventLog

pytestmark = pytest.mark.unit


def training_run(**spec: Any) -> TrainingRun:
    return parse_training_run(
        {
            "apiVersion": "spotray.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "llm"},
            "spec": {
                "entrypoint": "python -m spotray.jobs.gpt2",
                "checkpoint": {"uri": "s3://bucket/runs/llm"},
                **spec,
            },
        }
    )


def context(**spec: Any) -> RunContext:
    run = training_run(**spec)
    return RunContext(name=run.name, run_id="uid-1", attempt=2, spec=run.spec)


def test_cpu_workers_one_per_replica() -> None:
    scaling = build_scaling_config(context(workers={"replicas": 3, "cpu": "2"}))
    assert scaling.num_workers == 3
    assert scaling.use_gpu is False
    assert scaling.resources_per_worker == {"CPU": 2.0}


def test_gpu_workers_one_per_gpu_sharing_the_replica_cpus() -> None:
    scaling = build_scaling_config(context(workers={"replicas": 2, "gpu": 4, "cpu": "16"}))
    assert scaling.num_workers == 8
    assert scaling.use_gpu is True
    assert scaling.resources_per_worker == {"CPU": 4.0, "GPU": 1}


def test_min_replicas_below_replicas_make_an_elastic_group() -> None:
    scaling = build_scaling_config(context(workers={"replicas": 4, "minReplicas": 2, "gpu": 2, "cpu": "8"}), {})
    assert scaling.num_workers == (4, 8)
    assert scaling.elastic_resize_monitor_interval_s == 60.0  # Ray's own default
    quick = build_scaling_config(
        context(workers={"replicas": 3, "minReplicas": 1}), {"SPOTRAY_ELASTIC_RESIZE_CHECK_S": "5"}
    )
    assert quick.num_workers == (1, 3)
    assert quick.elastic_resize_monitor_interval_s == 5.0
    fixed = build_scaling_config(context(workers={"replicas": 3, "minReplicas": 3}), {})
    assert fixed.num_workers == 3


def test_run_config_is_stable_across_attempts_and_retries_workers_forever() -> None:
    run_config = build_run_config(context(), "/mnt/nfs/ray")
    assert run_config.name == "llm"
    assert run_config.storage_path == "/mnt/nfs/ray"
    assert run_config.failure_config.max_failures == -1


def test_the_worker_groups_start_is_bounded_by_the_runs_start_deadline() -> None:
    """Issue #69: Ray Train retried an unplaceable worker group for ever, the RayJob Running, its pods held."""
    default = replace(context(), start_deadline_seconds=None)
    assert worker_group_start_tries(default, {}) == (15, 60.0)  # the controller's 900 s, Ray Train's 60 s a try
    short = replace(context(), start_deadline_seconds=120)
    assert worker_group_start_tries(short, {}) == (2, 60.0)
    assert worker_group_start_tries(short, {"RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}) == (12, 10.0)
    assert worker_group_start_tries(replace(context(), start_deadline_seconds=30), {}) == (1, 60.0)  # at least one
    # The chart's startDeadlineSeconds 0 is "no deadline": Ray Train's own for ever.
    assert worker_group_start_tries(replace(context(), start_deadline_seconds=0), {}) == (-1, 60.0)
    bounded = build_run_config(context(), "/tmp/ray", start_tries=15)
    assert bounded.failure_config.controller_failure_limit == 15
    assert build_run_config(context(), "/tmp/ray").failure_config.controller_failure_limit == -1


def test_the_start_deadline_travels_to_the_job_in_its_run_context() -> None:
    sent = replace(context(), start_deadline_seconds=300.0)
    assert RunContext.from_env(sent.to_env()) == sent
    none = replace(context(), start_deadline_seconds=0.0)
    assert RunContext.from_env(none.to_env()) == none
    assert RunContext.from_env(context().to_env()).start_deadline_seconds is None
    assert "startDeadlineSeconds" not in context().to_env()["SPOTRAY_RUN"]


def test_a_notice_ends_a_fixed_size_attempt_but_an_elastic_group_restarts_smaller() -> None:
    """Nemesis trial 39: Ray Train's own restart after the drain deadline waited for ever on drained nodes."""
    fixed = build_run_config(context(workers={"replicas": 2}), "/tmp/ray")
    assert fixed.failure_config.max_preemption_failures == 0
    elastic = build_run_config(context(workers={"replicas": 3, "minReplicas": 1}), "/tmp/ray")
    assert elastic.failure_config.max_preemption_failures == -1
    # A spare is how a fixed-size group goes on after a notice: Ray Train restarts it there.
    spares = build_run_config(context(workers={"replicas": 2, "spareReplicas": 1}), "/tmp/ray")
    assert spares.failure_config.max_preemption_failures == -1


def test_a_ray_without_preemption_handling_gets_no_preemption_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyproject allows Ray >= 2.50, whose FailureConfig may not know max_preemption_failures."""
    from spotray.train.launch import launcher  # noqa: PLC0415

    monkeypatch.setattr(launcher, "PREEMPTION_ERROR", ())
    asked: dict[str, object] = {}
    monkeypatch.setattr(launcher, "FailureConfig", lambda **given: asked.update(given))
    monkeypatch.setattr(launcher, "RunConfig", lambda **_: None)
    build_run_config(context(workers={"replicas": 2}), "/tmp/ray")
    assert asked == {"max_failures": -1}


def test_only_spotray_settings_travel_to_workers_never_credentials() -> None:
    environ = {
        "SPOTRAY_RUN": "{}",
        "SPOTRAY_EVENTS": "/tmp/e.jsonl",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ACCESS_KEY_ID": "key",
        "PATH": "/bin",
    }
    assert spotray_env_for_workers(environ) == {"SPOTRAY_RUN": "{}", "SPOTRAY_EVENTS": "/tmp/e.jsonl"}


def test_epoch_loader_tracks_the_global_position_across_epochs() -> None:
    samples = [{"x": torch.tensor([i])} for i in range(10)]
    loader = EpochLoader(
        samples,
        batch_size=2,
        world_size=3,  # as if two more ranks consumed the same number of batches elsewhere
        start=DataPosition(epoch=4, sample_in_epoch=12),
        collate_fn=lambda batch: {"x": torch.cat([s["x"] for s in batch])},
    )
    seen = []
    for _ in loader:
        seen.append(loader.position)
    assert seen[0] == DataPosition(4, 18)
    assert seen[-1] == DataPosition(4, 12 + 5 * 6)
    next(iter(loader))
    assert loader.position == DataPosition(5, 6), "a new iteration is a new epoch"


def test_data_position_round_trip() -> None:
    assert DataPosition.from_dict(None) == DataPosition()
    assert DataPosition.from_dict(DataPosition(3, 96).to_dict()) == DataPosition(3, 96)


def hf_state(step: int, max_steps: int = 100) -> TrainerState:
    state = TrainerState()
    state.global_step = step
    state.max_steps = max_steps
    return state


class FakeSync:
    """Stands in for the S3 callback: the notice callback only needs flush(), leave() and the store."""

    def __init__(self) -> None:
        self.flushes = 0
        self.leaving = False

    def flush(self) -> None:
        self.flushes += 1

    def leave(self) -> None:
        self.leaving = True


def test_notice_saves_stops_and_is_checked_about_once_per_interval(tmp_path: Path) -> None:
    calls: list[int] = []
    notice_at = 9

    def notice() -> object | None:
        calls.append(state.global_step)
        return "drain" if state.global_step >= notice_at else None

    sync = FakeSync()
    callback = PreemptionNoticeCallback(
        sync,  # type: ignore[arg-type]
        events=EventLog(None),
        attempt=1,
        target_interval_s=0.0,  # interval of 1 step once calibrated
        calibration_steps=2,
        notice=notice,
    )
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    control = TrainerControl()
    for step in range(1, 12):
        state = hf_state(step)
        callback.on_step_end(args, state, control)
        if control.should_training_stop:
            break
    assert control.should_save
    assert control.should_training_stop
    assert state.global_step == notice_at
    assert calls == list(range(1, notice_at + 1))
    # On its way out: its emergency checkpoint never takes the URI from another run (issue #69).
    assert sync.leaving


def test_no_notice_check_on_the_last_step(tmp_path: Path) -> None:
    calls: list[int] = []
    callback = PreemptionNoticeCallback(
        FakeSync(),  # type: ignore[arg-type]
        events=EventLog(None),
        attempt=1,
        notice=lambda: calls.append(1),
    )
    control = TrainerControl()
    callback.on_step_end(TrainingArguments(output_dir=str(tmp_path), report_to=[]), hf_state(10, 10), control)
    assert calls == []
    assert not control.should_save


def test_embedded_s3_only_when_nothing_is_configured() -> None:
    run = training_run(data={"uri": "s3://bucket/data"})
    assert needs_embedded_s3(run, {})
    assert not needs_embedded_s3(run, {"AWS_ENDPOINT_URL": "http://minio:9000"})
    assert not needs_embedded_s3(training_run(checkpoint={"uri": "file:///mnt/nfs/x"}), {})


def test_local_ray_has_a_cpu_for_every_worker() -> None:
    assert ray_cpus_for(training_run(workers={"replicas": 64, "cpu": "1"})) == 64


def test_event_cursor_reads_only_new_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    cursor = EventCursor(path)
    assert cursor.new_events() == []
    path.write_text('{"event": "a"}\n{"event": "b"}\n{"event": "c", "cut')
    assert [e["event"] for e in cursor.new_events()] == ["a", "b"]
    with path.open("a") as handle:
        handle.write(' off": 1}\n')
    assert [e["event"] for e in cursor.new_events()] == ["c"]


def test_progress_line_shows_step_loss_rate_eta_and_checkpoint() -> None:
    view = ProgressView()
    view.attempt = 2
    view.on_event({"event": "step", "step": 10, "max_steps": 100, "loss": 2.5, "time": 100.0})
    view.on_event({"event": "step", "step": 20, "max_steps": 100, "loss": 2.25, "time": 105.0})
    view.on_event({"event": "checkpoint_complete", "step": 20, "uri": "s3://b/c"})
    line = view.line()
    assert "attempt 2" in line
    assert "step 20/100" in line
    assert "loss 2.250" in line
    assert "2.00 steps/s" in line
    assert "ETA 0:40" in line
    assert "checkpoint 20" in line
    assert format_duration(3725) == "1:02:05"


def test_job_configs_travel_to_workers_as_plain_values_and_back(tmp_path: Path) -> None:
    from spotray.jobs.cnn.train import CnnJobConfig  # noqa: PLC0415 (imports Ray Data: only this test needs it)
    from spotray.jobs.gpt2.config import Gpt2JobConfig  # noqa: PLC0415

    gpt2 = Gpt2JobConfig(workdir=tmp_path, events_path=tmp_path / "e.jsonl")
    plain = json.loads(json.dumps(gpt2.to_loop_config()))
    assert Gpt2JobConfig.from_loop_config(plain) == gpt2
    assert Gpt2JobConfig.from_loop_config({**plain, "events_path": None}).events_path is None
    cnn = CnnJobConfig(workdir=tmp_path, num_samples=30, image_size=16)
    assert CnnJobConfig.from_loop_config(json.loads(json.dumps(cnn.to_loop_config()))) == cnn


def test_driver_env_vars_leave_out_what_the_ray_job_already_sets() -> None:
    job_config = json.dumps({"runtime_env": {"env_vars": {"SPOTRAY_RUN": "{}", "OTHER": "1"}}})
    wanted = {"SPOTRAY_RUN": "{}", "SPOTRAY_EVENTS": "/tmp/e", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
    kept = driver_env_vars(wanted, {"RAY_JOB_CONFIG_JSON_ENV_VAR": job_config})
    assert kept == {"SPOTRAY_EVENTS": "/tmp/e", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1"}
    assert driver_env_vars(wanted, {}) == wanted  # not under a Ray job: everything


@pytest.mark.parametrize(
    ("address", "here"),
    [
        (None, True),  # ray.init starts a cluster on this machine
        ("127.0.0.1:6379", True),  # local mode
        ("localhost:6379", True),
        ("[::1]:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("raycluster-head-svc.ns.svc:6379", False),  # a RayJob on Kubernetes: workers on other pods
        ("10.244.0.7:6379", False),
    ],
)
def test_the_driver_prefetches_only_where_its_workers_run(address: str | None, here: bool) -> None:
    environ = {} if address is None else {"RAY_ADDRESS": address}
    assert ray_runs_on_this_machine(environ) is here


def test_starting_the_autoscaling_coordinator_early_is_skipped_where_ray_lacks_it_or_refuses(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A start-up shortcut, never a reason for an attempt to fail: Ray Train makes the actor itself then."""
    assert start_autoscaling_coordinator("ray.data._internal.no_such_module") is False

    def refuse() -> None:
        raise RuntimeError("Ray has not been started yet")

    refusing = types.SimpleNamespace(get_or_create_autoscaling_coordinator=refuse)
    monkeypatch.setitem(sys.modules, "refusing_ray_coordinator", refusing)
    assert start_autoscaling_coordinator("refusing_ray_coordinator") is False
    assert "Ray has not been started yet" in caplog.text
