"""The torchrun export: the one-node line and the several-nodes line for the same job; the
rendezvous and thread settings the other launch exports share."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment, shell, words

# torchrun's default rendezvous port: any TCP port free on the first node that every node reaches.
RDZV_PORT = 29500
# With no endpoint given, the several-nodes line reads the first node's address from the shell.
HEAD_NODE_ENDPOINT = f'"$HEAD_NODE:{RDZV_PORT}"'
HEAD_NODE_CHECK = ': "${HEAD_NODE:?set HEAD_NODE to the address of the first node}"\n'
PORT_NOTE = (f"Port {RDZV_PORT} is torchrun's default: any TCP port free on the first node that every "
             "node reaches.")


def torchrun_argv(cfg: RunConfig, target: Target, nnodes: int, endpoint: str | None = None) -> list[str]:
    """torchrun's argv: standalone on one node, a c10d rendezvous at ``endpoint`` on several."""
    script = [target.script, *target.script_args]
    procs = ["--nproc-per-node", str(target.procs(cfg))]
    if nnodes == 1:
        return ["torchrun", "--standalone", "--nnodes", "1", *procs, *script]
    return ["torchrun", "--nnodes", str(nnodes), *procs, "--rdzv-id", target.job_name,
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint or HEAD_NODE_ENDPOINT, *script]


def torchrun_comment_lines(cfg: RunConfig, target: Target) -> list[str]:
    """The torchrun line, and where the target has several nodes the line for every node, as code
    lines of a comment (the Python exports' word on how to launch them)."""
    lines = ["  " + words(torchrun_argv(cfg, target, 1))]
    if target.nnodes > 1:
        lines += [f"  {target.nnodes} nodes, the same line on every node:",
                  "  " + words(torchrun_argv(cfg, target, target.nnodes, target.rdzv_endpoint),
                               () if target.rdzv_endpoint else (HEAD_NODE_ENDPOINT,))]
    return lines


def threads(target: Target) -> str:
    """The line that sets each process's compute threads, with why."""
    return (comment(["Compute threads per process (torchrun sets 1 when OMP_NUM_THREADS is unset); "
                     "processes × threads should not exceed a node's cores."])
            + f"export OMP_NUM_THREADS={target.threads_per_process}\n")


def torchrun_lines(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """The one-node line and the several-nodes line (run on every node) for the same job."""
    nodes, procs = max(target.nnodes, 2), target.procs(cfg)
    text = "#!/usr/bin/env bash\n" + comment(header(cfg, target, source)) + threads(target)
    script_len = 1 + len(target.script_args)
    text += (f"\n# One node, {procs} process(es):\n"
             + shell(torchrun_argv(cfg, target, 1), script_len) + "\n")
    text += "\n" + comment([f"{nodes} nodes, {procs} process(es) each: run this same line on "
                            "every node; the endpoint is a host:port of the first node that every "
                            "node reaches."] + ([] if target.rdzv_endpoint else [PORT_NOTE]))
    if not target.rdzv_endpoint:
        text += HEAD_NODE_CHECK
    argv = torchrun_argv(cfg, target, nodes, target.rdzv_endpoint)
    ours = () if target.rdzv_endpoint else (HEAD_NODE_ENDPOINT,)
    return text + shell(argv, script_len, ours) + "\n"
