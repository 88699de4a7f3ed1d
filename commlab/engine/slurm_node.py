"""One node's task of a lab run submitted to Slurm (``commlab.engine.slurm``).

    srun --ntasks-per-node=1 python -m commlab.engine.slurm_node RUN_DIR      (the run's job.sbatch)

The node's place comes from Slurm (SLURM_NNODES, SLURM_NODEID, the allocation's first node's
address for the rendezvous); on several nodes the run is a run on several nodes (``commlab.engine.nodes``), on one
an ordinary run on loopback.  This node's records are written, then its supervisor runs in the
foreground, owning the node's torchrun agent, so that Slurm's signals reach it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from commlab.engine import nodes, procs, run_folder, status_file, store
from commlab.engine.launch import torchrun_command, worker_env
from commlab.engine.run_state import RunStatus
from commlab.engine.slurm import SlurmJob
from commlab.engine.supervisor import supervise


def first_address() -> str:
    """The address of the allocation's first node, where node 0 serves the rendezvous: its NodeAddr
    in Slurm's configuration (a node's name need not resolve; its address is how Slurm reaches it)."""
    def scontrol(*args: str) -> str:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout

    first = scontrol("show", "hostnames", os.environ["SLURM_JOB_NODELIST"]).split()[0]
    fields = dict(w.split("=", 1) for w in scontrol("-o", "show", "node", first).split() if "=" in w)
    return fields.get("NodeAddr") or first


def node_main(run_dir: Path) -> int:
    """One node's task of the job: this node's records, then its supervisor in the foreground."""
    folder = run_folder.RunFolder(run_dir)
    cfg, info = folder.config(), folder.launch_info()
    job = SlurmJob(**info["slurm"]["job"])
    count, rank = int(os.environ["SLURM_NNODES"]), int(os.environ["SLURM_NODEID"])
    node = None
    if count > 1:
        node = nodes.Nodes(count, rank, f"{first_address()}:{job.port}", folder.id, str(job.ifname),
                           nodes.interface_address(str(job.ifname)))
    records = node.records(folder.path) if node else folder.path
    if node and (errors := node.errors()):  # this compute node lacks the interface, or serves elsewhere
        Path(records).mkdir(parents=True, exist_ok=True)
        status_file.record(records, RunStatus.FAILED, step=None, ended_at=time.time(),
                           error=f"node {rank} ({procs.HOST}) cannot take part: " + "; ".join(
                f"{k}: {v}" for k, v in errors.items()))
        return 1
    mine = {"command": torchrun_command(cfg, folder.path, sys.executable, node),
            "nodes": node.as_dict() if node else None}
    if records == folder.path:
        store.write_json(folder.file("launch.json"), {**folder.launch_info(), **mine})  # read again: submit writes it too
    else:
        records.mkdir(parents=True, exist_ok=True)
        store.write_json(records / "config.json", folder.config_dict())
        status_file.record(records, RunStatus.STARTING, step=None)
        store.write_json(records / "launch.json", {**{k: v for k, v in info.items() if k != "supervisor"},
                                                   **mine, "run_dir": str(folder.path)})
    os.environ.update(worker_env(cfg, dict(os.environ), node))
    os.environ[procs.OWNER_ENV] = str(Path(records).resolve())
    return supervise(Path(records))


if __name__ == "__main__":
    raise SystemExit(node_main(Path(sys.argv[1])))
