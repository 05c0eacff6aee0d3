"""The run's decisions: pure functions of facts, shared by the controller and local mode.

What a TrainingRun does next (run_plan.py and the modules beside it: its phases, its attempts' ends
and budgets), what a TrainingSweep tries, promotes or exploits next (sweep_plan.py, from its trials
as facts: sweep_trials.py), and what a run cost (cost.py). Nothing here reads a cluster, a store or
a clock: the callers gather the facts (controller/reconcile.py, spotray/local/local_run.py), pass
``now``, and apply what comes back, so every decision is a unit test.

It imports the contract alone (and Optuna for the sweep's sampler), and the job side never
imports it: tests/unit/test_layering.py.
"""
