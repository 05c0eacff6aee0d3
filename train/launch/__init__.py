"""The Ray and torchrun glue: the launcher, the spot-notice drain, the crash-loop guard, an elastic global batch."""
