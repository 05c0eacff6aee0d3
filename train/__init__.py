"""The training side: what runs inside an attempt, by concern, lowest layer first.

- ``processes``: which process this is among the ranks, and the child processes spotray starts.
- ``storage``: object stores (S3, a directory), parallel hashed downloads, the embedded S3 server.
- ``records``: what a run leaves beside its checkpoints (attempt records, the fence, progress,
  goodput, the event log, the loss plot), read by the controller and the CLI.
- ``checkpoints``: the checkpoint format, its upload (in a process of its own, from several nodes)
  and the resume: async snapshots, the fetch, direct loads.
- ``launch``: the Ray and torchrun glue: the launcher, the spot-notice drain, the crash-loop guard,
  the global batch of an elastic run.
- ``hf``: the Hugging Face side: the ``on_save`` callback, the worker around the Trainer,
  MosaicML streaming data, the automatic checkpoint interval.

docs/architecture.md draws the layers; tests/unit/test_layering.py checks them.
"""
