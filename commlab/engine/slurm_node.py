"""One node's task of a lab run submitted to Slurm (``commlab.engine.launchers.slurm.node_main``).

    srun --ntasks-per-node=1 python -m commlab.engine.slurm_node RUN_DIR      (the run's job.sbatch)
"""
from __future__ import annotations

import sys
from pathlib import Path

from commlab.engine.launchers.slurm import node_main

if __name__ == "__main__":
    raise SystemExit(node_main(Path(sys.argv[1])))
