"""``hydra/launcher=spotray``: the launcher's settings, registered with Hydra's config store."""

# No `from __future__ import annotations`: Hydra loads this module before it is in sys.modules, and
# dataclasses then cannot resolve string annotations (nor can OmegaConf, which reads the real types).
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class SpotrayLauncherConf:
    _target_: str = "hydra_plugins.hydra_spotray_launcher.spotray_launcher.SpotrayLauncher"
    template: str = "???"  # a TrainingRun manifest: each trial is its spec, its entrypoint + the job's overrides
    local: bool = True  # trials on this machine (spotray run SWEEP --local); false: a TrainingSweep on the cluster
    name: str | None = None  # the sweep's name; default: the job's name and a hash of the jobs
    parallel: int = 1  # trials at once
    early_stopping_min_steps: int | None = None  # successive halving's first rung; none: every trial runs to its end
    reduction_factor: int | None = None  # the best 1/factor of the trials at a rung go on; none: the sweep's default
    max_gpu_hours: float | None = None  # the trials' GPU-hours in all (spec.trials.maxGpuHours); none: no budget
    namespace: str | None = None  # local=false: the namespace (default: the template's, else the kubeconfig's)
    context: str | None = None  # local=false: the kubeconfig context
    kubeconfig: str | None = None  # local=false: the kubeconfig file
    timeout_s: float = 86400.0  # local=false: how long to wait for the sweep to finish
    poll_s: float = 10.0  # local=false: how often to read the sweep's status


ConfigStore.instance().store(group="hydra/launcher", name="spotray", node=SpotrayLauncherConf, provider="spotray")
