"""Which process this is among the training processes, the child processes spotray starts, and the
file by which a draining node's workers tell its preStop hook they are done (torch only)."""
