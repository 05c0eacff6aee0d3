"""CPU micro-benchmarks: A vs B alternated in one process tree, on this machine, no cluster."""
