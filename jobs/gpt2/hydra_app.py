"""The GPT-2 example as a Hydra app: its settings are Hydra's config, so a sweep is one command line.

    python jobs/gpt2/hydra_app.py max_steps=30                      # one run, as python -m spotray.jobs.gpt2
    python jobs/gpt2/hydra_app.py --multirun hydra/launcher=spotray \\
        hydra.launcher.template=jobs/gpt2/hydra_trainingrun.yaml learning_rate=1e-3,3e-3

With ``hydra/launcher=spotray`` (plugins/hydra-spotray-launcher) each job is a trial of a
TrainingSweep: a resumable TrainingRun of its own, on this machine or, with
``hydra.launcher.local=false``, on a cluster. A trial runs this file with its job's overrides; Hydra
turns them into the job's flags here. Needs hydra-core (``pip install hydra-core``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from spotray.jobs.gpt2.config import Gpt2JobConfig
from spotray.jobs.gpt2.driver import main


@dataclass
class Gpt2Settings:
    """The job's flags that a sweep varies, with the job's defaults (python -m spotray.jobs.gpt2 --help)."""

    max_steps: int = Gpt2JobConfig.max_steps
    batch_size: int = Gpt2JobConfig.batch_size
    n_layer: int = Gpt2JobConfig.n_layer
    n_embd: int = Gpt2JobConfig.n_embd
    learning_rate: float = Gpt2JobConfig.learning_rate
    dropout: float = Gpt2JobConfig.dropout
    seed: int = Gpt2JobConfig.seed


ConfigStore.instance().store(name="gpt2", node=Gpt2Settings)


def job_flags(settings: DictConfig) -> list[str]:
    """The job's command-line flags from Hydra's config (max_steps=30 -> --max-steps=30)."""
    return [f"--{field.name.replace('_', '-')}={settings[field.name]}" for field in fields(Gpt2Settings)]


@hydra.main(version_base=None, config_name="gpt2")
def app(settings: DictConfig) -> int:
    code = main(job_flags(settings))
    if code:
        sys.exit(code)  # the run's exit code is what the controller judges an attempt by
    return code


if __name__ == "__main__":
    app()
