"""``python -m commlab.tune.sweep SWEEP_DIR``: execute a sweep in this (detached) process."""
import sys

from commlab.tune.sweep import Sweep, execute

execute(Sweep(sys.argv[1]))
