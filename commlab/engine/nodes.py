"""A run on several nodes: where a node stands in it, and the files the nodes tell each other by.

    commlab run ... --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29400 --run-id exp1 --ifname eth0
    commlab run ... --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29400 --run-id exp1 --ifname eth0

Each node's ``commlab run`` starts a supervisor of its own, which owns that node's torchrun agent;
the agents meet in one torchrun c10d rendezvous at the endpoint, which node 0 serves.  The run
folder ``RUN_ID`` in the shared runs folder is the run's: node 0 writes its first files (as a run on
one node does), global rank 0 the rest; node K (K > 0) keeps its supervisor's records (status,
supervisor.json, torchrun's log) in ``RUN_ID/nodes/K/``.  A PID means nothing on another machine,
so the nodes end each other through the folder, never by signal:

    RUN_ID/stop.json             a Stop pressed on any node: every node's supervisor ends its agent
    RUN_ID/status.json           node 0's record of the run: ended badly, the other nodes end too
    RUN_ID/nodes/K/status.json   node K's record: ended badly, node 0 ends the run with its reason

Several nodes are the one case where loopback cannot be the default: the network interface the
ranks talk on is named (``ifname``: a flag, or GLOO_SOCKET_IFNAME), refused by name when missing or
not on this machine, and this node's address is that interface's unless given.
"""
from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from commlab.engine import procs, status_file, store
from commlab.engine.run_state import RunStatus

NODES = "nodes"  # in a run folder: node K's records, K > 0
STOP = "stop.json"
IFNAME_ENV = "GLOO_SOCKET_IFNAME"
JOIN_TIMEOUT_S = 600.0  # torchrun's own default for its c10d rendezvous
STOP_GRACE_S = 30.0  # for every node's supervisor to see a Stop and end its agent
BAD_ENDS = (RunStatus.FAILED, RunStatus.STOPPED, RunStatus.STALLED)  # a node's end that ends the others (not finished, diverged)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class Nodes:
    """This node's place in a run of ``nnodes`` nodes (``world_size`` ranks on each)."""

    nnodes: int
    node_rank: int
    rdzv_endpoint: str  # host:port of node 0, reached by every node
    run_id: str  # the run folder's name in the shared runs folder, and the rendezvous id
    ifname: str  # the interface the ranks talk on (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)
    local_addr: str | None = None  # this node's address as the others reach it: None, the interface's
    join_timeout_s: float = JOIN_TIMEOUT_S

    @classmethod
    def given(cls, nnodes: int | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
              run_id: str | None = None, ifname: str | None = None, local_addr: str | None = None,
              join_timeout_s: float | None = None, env: dict | None = None) -> Nodes | None:
        """From a person's flags: None for one node (no flag given); else the node, checked and its
        address resolved.  ConfigError naming every flag that is wrong."""
        from commlab.config import ConfigError

        extra = {"node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint, "run_id": run_id, "ifname": ifname,
                 "local_addr": local_addr, "join_timeout_s": join_timeout_s}
        if (nnodes or 1) == 1:
            if given := [k for k, v in extra.items() if v is not None]:
                raise ConfigError({k: "only for a run on several nodes (--nnodes 2 or more)" for k in given})
            return None
        ifname = ifname or (os.environ if env is None else env).get(IFNAME_ENV)
        node = cls(nnodes, node_rank if node_rank is not None else -1, rdzv_endpoint or "", run_id or "",
                   ifname or "", local_addr, JOIN_TIMEOUT_S if join_timeout_s is None else join_timeout_s)
        if errors := node.errors():
            raise ConfigError(errors)
        return node if local_addr else cls(**{**asdict(node), "local_addr": interface_address(ifname)})

    def errors(self) -> dict[str, str]:
        e = {}
        if not isinstance(self.nnodes, int) or self.nnodes < 2:
            e["nnodes"] = f"must be a whole number of at least 2 for a run on several nodes, got {self.nnodes!r}"
        elif not 0 <= self.node_rank < self.nnodes:
            e["node_rank"] = (f"name this node's place, 0 to {self.nnodes - 1} (node 0 serves the "
                              f"rendezvous), got {self.node_rank if self.node_rank >= 0 else 'none'}")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            e["rdzv_endpoint"] = (f"give HOST:PORT of node 0 that every node reaches (a free TCP port "
                                  f"there), got {self.rdzv_endpoint or 'none'!r}")
        if not _ID.fullmatch(self.run_id):
            e["run_id"] = (f"give every node the same run id (letters, digits and . _ -; it names the "
                           f"run folder in the shared runs folder), got {self.run_id or 'none'!r}")
        if not self.ifname:
            e["ifname"] = ("name the network interface the ranks talk on (--ifname or "
                           f"{IFNAME_ENV}; `ip -brief address` lists them): on several nodes the lab "
                           "cannot default to loopback")
        elif self.ifname not in interfaces():
            e["ifname"] = (f"{self.ifname!r} is not a network interface of this machine (it has "
                           f"{', '.join(sorted(interfaces()))})")
        elif not self.local_addr and not interface_address(self.ifname):
            e["ifname"] = f"{self.ifname!r} has no IPv4 address: give this node's address (--local-addr)"
        if not self.join_timeout_s > 0:
            e["join_timeout_s"] = f"must be a positive number of seconds, got {self.join_timeout_s!r}"
        if self.node_rank == 0 and not {"rdzv_endpoint", "ifname"} & e.keys():
            e |= self._served_here_errors(host)
        return e

    def _served_here_errors(self, host: str) -> dict[str, str]:
        """Node 0's rendezvous store listens on this node's address only (never on every
        interface), so the endpoint every agent dials must be that address."""
        mine = self.local_addr or interface_address(self.ifname)
        try:
            theirs = socket.gethostbyname(host)
        except OSError:
            return {"rdzv_endpoint": f"{host!r} does not resolve here: give node 0's address ({mine})"}
        if theirs == mine:
            return {}
        return {"rdzv_endpoint": (f"{host!r} is {theirs} here, but node 0 serves the rendezvous on "
                                  f"{mine} only (the address of {self.ifname!r}, or --local-addr): give "
                                  f"--rdzv-endpoint {mine}:PORT, or --local-addr {theirs} if {theirs} is "
                                  "how the other nodes reach this one")}

    def records(self, run_dir: Path) -> Path:
        """Where this node's supervisor keeps its records: node 0 the run folder, node K its own."""
        return records(run_dir, self.node_rank)

    def as_dict(self) -> dict:
        return asdict(self)


def records(run_dir: Path, node_rank: int) -> Path:
    return Path(run_dir) if node_rank == 0 else Path(run_dir) / NODES / str(node_rank)


def interfaces() -> dict:
    import psutil

    return psutil.net_if_addrs()


def interface_address(ifname: str) -> str | None:
    return next((a.address for a in interfaces().get(ifname, ()) if a.family == socket.AF_INET), None)


def request_stop(run_dir: Path, why: str = "stopped by the user") -> None:
    store.write_json(Path(run_dir) / STOP, {"error": why, "host": procs.HOST, "at": time.time()})


def stop_request(run_dir: Path) -> dict | None:
    return store.read_json(Path(run_dir) / STOP)


def ended_elsewhere(run_dir: Path, node: Nodes) -> dict | None:
    """The ending another node's bad end calls for (a Stop pressed on any node is the run folder's
    ``stop_request``): node 0 reads every node's record, node K the run's (node 0's); None while
    they all go (or ended well)."""
    run_dir = Path(run_dir)
    others = ([(k, records(run_dir, k)) for k in range(1, node.nnodes)] if node.node_rank == 0
              else [(0, run_dir)])
    for k, folder in others:
        said = status_file.said(folder)
        if said.get("status") in BAD_ENDS:
            return {"status": said["status"], "error": f"node {k} ended the run: {said.get('error')}",
                    **({"failed_rank": said["failed_rank"]} if "failed_rank" in said else {}),
                    **({"traceback": said["traceback"]} if said.get("traceback") else {})}
    return None


def not_joined(run_dir: Path, node: Nodes) -> list[int]:
    """The nodes whose supervisor never came up (no supervisor.json): they never joined."""
    return [k for k in range(node.nnodes) if not (records(Path(run_dir), k) / "supervisor.json").exists()]
