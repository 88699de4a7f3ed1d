"""The slurm export: an sbatch script, one task per node, each starting torchrun."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment, shell
from commlab.tune.export.torchrun import PORT_NOTE, RDZV_PORT, threads


def slurm_script(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """An sbatch script: one task per node, each starting torchrun, rendezvous on the first node."""
    procs = target.procs(cfg)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={target.job_name}",
             f"#SBATCH --nodes={target.nnodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={procs * target.threads_per_process}"]
    if target.backend == "nccl":
        lines.append(f"#SBATCH --gpus-per-node={procs}")
    lines.append(f"#SBATCH --time={target.time_limit}")
    if target.partition:
        lines.append(f"#SBATCH --partition={target.partition}")
    text = "\n".join(lines) + "\n" + comment(header(cfg, target, source)
                                             + [f"One task per node runs torchrun, which starts "
                                                f"{procs} process(es) there. {PORT_NOTE}"])
    text += "set -euo pipefail\n" + threads(target)
    text += 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
    ours = ('"$SLURM_NNODES"', '"$SLURM_JOB_ID"', f'"$head_node:{RDZV_PORT}"')
    argv = ["srun", "torchrun", "--nnodes", ours[0], "--nproc-per-node", str(procs),
            "--rdzv-id", ours[1], "--rdzv-backend", "c10d", "--rdzv-endpoint", ours[2],
            target.script, *target.script_args]
    return text + shell(argv, 1 + len(target.script_args), ours) + "\n"
