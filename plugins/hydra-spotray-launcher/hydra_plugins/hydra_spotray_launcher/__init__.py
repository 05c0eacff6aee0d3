"""A Hydra launcher that runs a --multirun as a spotray TrainingSweep (README.md)."""
