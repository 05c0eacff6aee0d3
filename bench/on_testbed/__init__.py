"""Benchmarks on the test bed (testbed/): the controller at scale on kwok nodes, and the TrainingRun on real pods."""
