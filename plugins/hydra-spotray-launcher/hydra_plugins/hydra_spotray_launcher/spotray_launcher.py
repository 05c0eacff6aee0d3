"""The launcher: Hydra's jobs become a TrainingSweep's trials, run locally or by the controller.

Hydra calls ``launch`` once per batch of jobs and waits for their results, so this launcher waits for
the sweep to end: locally it runs the sweep in this process (as ``spotray run SWEEP --local``); on a
cluster it applies the TrainingSweep, then reads its status until the sweep ends or ``timeout_s``
passes. Nothing is pickled and no task function travels: each trial runs the template's entrypoint
with its job's overrides, a command line like any other TrainingRun's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_spotray_launcher.sweep_document import (
    JobResult,
    default_sweep_name,
    job_line,
    job_results,
    sweep_document,
)
from omegaconf import DictConfig, OmegaConf, open_dict

from spotray.contract.names import FAILED, SUCCEEDED, SWEEP_KIND, SWEEP_LABEL
from spotray.contract.sweep import TrainingSweep, parse_sweep
from spotray.decisions.sweep_trials import SUSPENDED, TrialFacts, trial_facts

if TYPE_CHECKING:
    from spotray.cli.cluster_client import ClusterConnection

log = logging.getLogger(__name__)

DONE_PHASES = (SUCCEEDED, FAILED)  # a TrainingSweep's phases once it has ended


class SpotrayLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.where_to_look = "spotray status {trial}"  # what a failed job's error points at

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # The task function stays here: each trial runs the template's entrypoint, in its own process.
        self.config, self.hydra_context = config, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None, "Hydra calls setup before launch"
        jobs = [list(overrides) for overrides in job_overrides]
        document = self._sweep_document(jobs, initial_job_idx)
        sweep = parse_sweep(document, where=f"the sweep of {len(jobs)} Hydra job(s) from {self.settings['template']}")
        if self.settings["local"]:
            results = self._run_locally(sweep, jobs)
        else:
            results = self._run_on_cluster(document, sweep, jobs)
        for result in results:
            value = f", loss {result.value:.4f}" if result.value is not None else ""
            log.info("spotray: job %s: trial %s %s%s", job_line(result.overrides), result.trial, result.state, value)
        return [self._job_return(result, initial_job_idx + index) for index, result in enumerate(results)]

    def _sweep_document(self, jobs: list[list[str]], initial_job_idx: int) -> dict[str, Any]:
        template_path = Path(str(self.settings["template"]))
        if not template_path.is_file():
            raise ValueError(f"hydra.launcher.template: no file {template_path} (a TrainingRun manifest)")
        template: dict[str, Any] = yaml.safe_load(template_path.read_text())
        assert self.config is not None
        name = self.settings.get("name") or default_sweep_name(str(self.config.hydra.job.name), jobs)
        if self.settings.get("name") and initial_job_idx:
            name = f"{name}-{initial_job_idx}"  # a sweeper's later batch (max_batch_size): a sweep of its own
        document = sweep_document(
            template,
            jobs,
            name=name,
            parallel=int(self.settings["parallel"]),
            early_stopping_min_steps=self.settings.get("early_stopping_min_steps"),
            reduction_factor=self.settings.get("reduction_factor"),
            max_gpu_hours=self.settings.get("max_gpu_hours"),
        )
        if self.settings.get("namespace"):
            document["metadata"]["namespace"] = self.settings["namespace"]
        return document

    def _run_locally(self, sweep: TrainingSweep, jobs: list[list[str]]) -> list[JobResult]:
        from spotray.local.local_sweep import LocalSweep  # noqa: PLC0415 - needs spotray[ray] only when local
        from spotray.local.progress import ProgressView  # noqa: PLC0415

        assert self.config is not None
        workdir = Path(str(self.config.hydra.sweep.dir)) / "spotray" / sweep.name
        log.info("spotray: TrainingSweep %s, %d trial(s) on this machine, in %s", sweep.name, len(jobs), workdir)
        self.where_to_look = f"its log: {workdir}/{{trial}}.log"
        local = LocalSweep(sweep, workdir, progress=ProgressView())
        local.run()
        return _results(sweep, jobs, local.trials())

    def _run_on_cluster(self, document: dict[str, Any], sweep: TrainingSweep, jobs: list[list[str]]) -> list[JobResult]:
        from spotray.cli.cluster_client import ClusterConnection  # noqa: PLC0415
        from spotray.cli.cluster_options import KubeOptions  # noqa: PLC0415 - needs spotray[controller] only here

        options = KubeOptions(self.settings.get("kubeconfig"), self.settings.get("context"), sweep.namespace)
        cluster = ClusterConnection(options)
        _, verb = cluster.apply_run(document, cluster.namespace)
        log.info("spotray: TrainingSweep %s %s in namespace %s", sweep.name, verb, cluster.namespace)
        self.where_to_look = f"spotray status {{trial}} -n {cluster.namespace}"
        phase = self._wait_for_sweep(cluster, sweep.name)
        runs = cluster.list_runs(labels={SWEEP_LABEL: sweep.name})
        facts = [fact for run in runs if (fact := trial_facts(sweep.spec, run)) is not None]
        if phase not in DONE_PHASES:
            raise TimeoutError(
                f"TrainingSweep {sweep.name} is still {phase or 'not started'} after "
                f"hydra.launcher.timeout_s={self.settings['timeout_s']}: it goes on in the cluster "
                f"(spotray status {sweep.name}); run the same command again to wait for it once more"
            )
        return _results(sweep, jobs, facts)

    def _wait_for_sweep(self, cluster: ClusterConnection, name: str) -> str:
        """The sweep's phase once it ended, or the last one read when ``timeout_s`` passed. An API
        server that does not answer for a while is waited for as the sweep is (the trials go on)."""
        from spotray.cli.exit_codes import CommandFailedError  # noqa: PLC0415

        deadline = time.monotonic() + float(self.settings["timeout_s"])
        phase, said = "", ""
        while True:
            try:
                status = cluster.get_run(name, kind=SWEEP_KIND).get("status") or {}
                phase, message = str(status.get("phase") or ""), str(status.get("message") or "")
            except CommandFailedError as error:
                message = f"{error.problem}; reading it again in {self.settings['poll_s']} s"
            if message != said:
                log.info("spotray: TrainingSweep %s: %s", name, message)
                said = message
            if phase in DONE_PHASES or time.monotonic() >= deadline:
                return phase
            time.sleep(min(float(self.settings["poll_s"]), max(0.0, deadline - time.monotonic())))

    def _job_return(self, result: JobResult, index: int) -> JobReturn:
        assert self.config is not None
        assert self.hydra_context is not None
        sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(result.overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{result.trial or 'not-started'}"
            sweep_config.hydra.job.num = index
        job = JobReturn(
            overrides=list(result.overrides),
            cfg=OmegaConf.masked_copy(sweep_config, [str(key) for key in sweep_config if key != "hydra"]),
            hydra_cfg=sweep_config,
            task_name=str(sweep_config.hydra.job.name),
        )
        if result.state in (SUCCEEDED, SUSPENDED):  # stopped early at a rung: a result, not a failure
            job.status, job._return_value = JobStatus.COMPLETED, result.value
        else:
            if result.trial:
                what = f"trial {result.trial} ended {result.state} ({self.where_to_look.format(trial=result.trial)})"
            else:
                what = "the sweep never started its trial"
            job.status = JobStatus.FAILED
            job._return_value = RuntimeError(f"job {job_line(result.overrides)}: {what}")
        return job


def _results(sweep: TrainingSweep, jobs: list[list[str]], facts: Sequence[TrialFacts]) -> list[JobResult]:
    """Each job's result from the trials' facts (read locally or from the cluster alike)."""
    return job_results(jobs, [(sweep.trial_name(f.number), f.values, f.state, _objective(f)) for f in facts])


def _objective(facts: TrialFacts) -> float | None:
    """A trial's objective: at its end, or at the highest rung it reached when it was stopped there."""
    if facts.value is not None:
        return float(facts.value)
    return facts.rung_values[max(facts.rung_values)] if facts.rung_values else None
