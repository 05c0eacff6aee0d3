"""What a run leaves beside its checkpoints: attempt records and the fence, progress, goodput, events, the plot."""
