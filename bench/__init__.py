"""The benchmarks and campaigns (docs/benchmarks.md), run from the repository's root as
``python -m bench.<kind>.<name>`` (the Makefile's bench-* targets; ``make bench`` runs run_all.py):

- micro/: CPU micro-benchmarks, A vs B alternated, on this machine without a cluster;
- campaigns/: fault campaigns with a checker that judges every trial's history (chaos, nemesis);
- on_testbed/: on the test bed (testbed/): the controller at scale on kwok nodes, the TrainingRun on real pods;
- gpu/: what needs a GPU (the device machine).

common.py writes every result (bench/results/<name>.json) with its raw rounds, goal and commit.
"""
