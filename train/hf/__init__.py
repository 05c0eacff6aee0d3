"""The Hugging Face side: the on_save callback, the spot notice, progress, streaming data, the auto interval."""
