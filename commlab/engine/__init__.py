"""Running things: the torchrun command, the supervisor that owns it, the worker loop each rank runs, the run folder, and the processes."""
