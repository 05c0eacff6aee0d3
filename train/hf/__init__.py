"""The Hugging Face side: the on_save callback, the worker around the Trainer, streaming data, the auto interval."""
