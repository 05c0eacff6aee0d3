"""Benchmarks that need a GPU (the device machine): say so and exit 0 without CUDA."""
