"""Which process this is among the training processes, and the child processes spotray starts (torch only)."""
