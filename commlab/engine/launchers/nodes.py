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
from dataclasses import asdict, dataclass
from pathlib import Path

from commlab import files
from commlab.config import ConfigError
from commlab.engine import claims, procs, run_folder, status_file, store
from commlab.engine.launchers.base import Launcher
from commlab.engine.run_state import GOING, RunStatus
from commlab.engine.stop_request import STOP_GRACE_S, request_stop

NODES = "nodes"  # in a run folder: node K's records, K > 0
IFNAME_ENV = "GLOO_SOCKET_IFNAME"
JOIN_TIMEOUT_S = 600.0  # torchrun's own default for its c10d rendezvous
JOIN_GRACE_S = 5.0  # past the join timeout (counted from torchrun's start), for torchrun to end by itself
# What torchrun's log says when the nodes cannot meet, and what it means; read in its last CAUSE_BYTES.
CAUSES = (("Address already in use", "port {port} on {host} is held by another process: node 0 could not serve "
                                     "the rendezvous there (give a free port)"),
          ("Name or service not known", "{host!r} does not resolve on node {rank}: give node 0's address as it "
                                        "reaches it"))
CAUSE_BYTES = 256 * 1024
BAD_ENDS = (RunStatus.FAILED, RunStatus.STOPPED, RunStatus.STALLED)  # a node's end that ends the others (not finished, diverged)
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# What node 0's run folder holds before its launch.json: its claim, its reserve, status starting, its
# settings (a run from before the claim file)
_PREPARING = {claims.NODE_CLAIM, store.RESERVE, "status.json", "config.json"}


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
        elif self.run_id in claims.LAB_FOLDERS:
            e["run_id"] = (f"{self.run_id!r} names {claims.LAB_FOLDERS[self.run_id]} in the runs folder: "
                           "give the run an id of its own")
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
        if "rdzv_endpoint" not in e:
            if self.node_rank == 0 and "ifname" not in e:
                e |= self._served_here_errors(host, int(port))
            elif self.node_rank > 0 and not _resolves(host):
                e["rdzv_endpoint"] = f"{host!r} does not resolve on this node: give node 0's address as it reaches it"
        return e

    def _served_here_errors(self, host: str, port: int) -> dict[str, str]:
        """Node 0's rendezvous store listens on this node's address only (never on every
        interface), so the endpoint every agent dials must be that address, at a port no other
        process holds (torchrun would fail there, and its agent's end read as node 1's absence)."""
        mine = self.local_addr or interface_address(self.ifname)
        try:
            theirs = socket.gethostbyname(host)
        except OSError:
            return {"rdzv_endpoint": f"{host!r} does not resolve here: give node 0's address ({mine})"}
        if theirs == mine:
            if held := _held(mine, port):
                return {"rdzv_endpoint": f"port {port} on {mine} is held by another process ({held}): give a free port"}
            return {}
        return {"rdzv_endpoint": (f"{host!r} is {theirs} here, but node 0 serves the rendezvous on "
                                  f"{mine} only (the address of {self.ifname!r}, or --local-addr): give "
                                  f"--rdzv-endpoint {mine}:PORT, or --local-addr {theirs} if {theirs} is "
                                  "how the other nodes reach this one")}

    def records(self, run_dir: Path) -> Path:
        """Where this node's supervisor keeps its records: node 0 the run folder, node K its own."""
        return records(run_dir, self.node_rank)

    # A place (``commlab.engine.commands``): the c10d rendezvous at node 0's endpoint, which node 0
    # serves, waiting ``join_timeout_s`` for the rest; the ranks on the named interface.
    def rendezvous_args(self) -> list[str]:
        wait = f"{self.join_timeout_s:g}"
        return ["--rdzv-endpoint", self.rdzv_endpoint, "--local-addr", str(self.local_addr),
                "--rdzv-id", self.run_id,
                "--rdzv-conf", f"is_host={int(self.node_rank == 0)},join_timeout={wait},read_timeout={wait}"]

    def env(self) -> dict:
        return {"MASTER_ADDR": str(self.local_addr), "GLOO_SOCKET_IFNAME": self.ifname,
                procs.STORE_ADDR_ENV: str(self.local_addr)}

    def as_dict(self) -> dict:
        return asdict(self)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def _answers(host: str, port: int) -> bool:
    """Whether a connection to ``host:port`` is accepted (within a second)."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def _held(addr: str, port: int) -> str | None:
    """Why ``port`` cannot be listened on at ``addr`` as torch's store does (SO_REUSEADDR), or None."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def records(run_dir: Path, node_rank: int) -> Path:
    return Path(run_dir) if node_rank == 0 else Path(run_dir) / NODES / str(node_rank)


def interfaces() -> dict:
    import psutil

    return psutil.net_if_addrs()


def interface_address(ifname: str) -> str | None:
    return next((a.address for a in interfaces().get(ifname, ()) if a.family == socket.AF_INET), None)


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


def known_cause(log: Path, node: Nodes) -> str | None:
    """Why the nodes could not meet, as torchrun's log says it (its last ``CAUSE_BYTES``), in a
    person's words; None when it says nothing known."""
    try:
        with files.open_regular(log) as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - CAUSE_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    host, _, port = node.rdzv_endpoint.rpartition(":")
    return next((said.format(host=host, port=port, rank=node.node_rank) for seen, said in CAUSES if seen in text), None)


def not_joined(run_dir: Path, node: Nodes) -> list[int]:
    """The nodes whose supervisor never came up (no supervisor.json): they never joined."""
    return [k for k in range(node.nnodes) if not (records(Path(run_dir), k) / "supervisor.json").exists()]


class OnNodes(Launcher):
    """This node's part of a run on several: its records in the run folder named by the run id
    (node 0's are the run folder itself), its agent at the shared rendezvous."""

    name = "nodes"

    def __init__(self, node: Nodes, owner: str | None = None, resume=None):
        super().__init__(owner, resume)
        self.node = self.place = node

    @classmethod
    def owns(cls, info: dict) -> bool:
        return bool(info.get("nodes")) and not info.get("slurm")

    @classmethod
    def of_record(cls, info: dict) -> OnNodes:
        return cls(Nodes(**info["nodes"]))

    def errors(self, cfg) -> dict[str, str]:
        if self.resume is not None:
            return {"nnodes": "a run on several nodes starts cold, from step 0 (no resume, no warm ranks)"}
        return {}

    def whole(self, cfg) -> Path:
        """The run's folder: named by the run id in the shared runs folder."""
        return Path(cfg.runs_dir, self.node.run_id).resolve()

    def make_folder(self, cfg) -> Path:
        return node_dir(cfg, self.node, self.whole(cfg))

    def records(self, cfg, records: Path) -> dict:
        whole = self.whole(cfg)
        return {**super().records(cfg, whole), "nodes": self.node.as_dict(),
                "run_dir": str(whole) if whole != records.resolve() else None}  # node K's: the run's folder

    def ask_to_stop(self, folder: run_folder.RunFolder, grace_s: float) -> None:
        """Every node's supervisor ends its own agent on the request; a PID is local, the folder shared."""
        whole = Path(folder.launch_info().get("run_dir") or folder.path)
        request_stop(whole)
        node0 = run_folder.RunFolder(whole)
        procs.wait_until(lambda: node0.status() not in GOING and folder.status() not in GOING,
                         grace_s + STOP_GRACE_S)

    def describe(self, cfg, info: dict) -> str:
        return (f"node {self.node.node_rank} of {self.node.nnodes}, {cfg.world_size} {info['backend']} rank(s) "
                f"here, {cfg.world_size * self.node.nnodes} in all")

    def ended_elsewhere(self, run_dir: Path) -> dict | None:
        return ended_elsewhere(run_dir, self.node)

    def never_started(self, run_dir: Path) -> dict | None:
        """The cause torchrun's log names, when it names one it knows; else the nodes that never
        came up, or for node K, that node 0 never answered in time."""
        if cause := known_cause(records(run_dir, self.node.node_rank) / "launcher.log", self.node):
            return {"status": RunStatus.FAILED, "error": cause}
        wait, missing = f"{self.node.join_timeout_s:g} s", not_joined(run_dir, self.node)
        if self.node.node_rank and 0 in missing:  # what node K can tell of node 0's endpoint
            host, _, port = self.node.rdzv_endpoint.rpartition(":")
            return {"status": RunStatus.FAILED, "error": (
                f"node 0 did not join within {wait}: {self.node.rdzv_endpoint} accepts connections but no "
                "rendezvous answered there (another process holds that port, or node 0 has not started)"
                if _answers(host, int(port)) else f"node 0 did not join within {wait} (nothing listens at "
                f"{self.node.rdzv_endpoint}: node 0 has not started, or its endpoint is another)")}
        return {"status": RunStatus.FAILED, "error": "; ".join(
            f"node {k} did not join within {wait}" for k in missing)} if missing else None

    def join_deadline_s(self) -> float | None:
        # torchrun's client waits without end on an endpoint that accepts and never answers
        return self.node.join_timeout_s + JOIN_GRACE_S


def node_dir(cfg, node: Nodes, run_dir: Path) -> Path:
    """This node's records folder in ``run_dir``, the run folder named by the run id (made here if
    this node is first); ConfigError when this node's records are there already (an id used
    before), or when node 0's settings differ."""
    if why := _not_this_run(run_dir, node):
        raise ConfigError({"run_id": f"{node.run_id!r} is taken: {run_dir} {why} (give each run an id of its own)"})
    path = node.records(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    # Of two commands given one id at the same moment, one is refused; a run from before the claim
    # file has its config.json.
    taken = not claims.take(path / claims.NODE_CLAIM) or (path / "config.json").exists()
    if taken:
        raise ConfigError({"run_id": f"{node.run_id!r} is taken: {run_dir} already holds node "
                                     f"{node.node_rank}'s records (give each run an id of its own)"})
    theirs = store.read_json(run_dir / "config.json") if node.node_rank else None
    if theirs and (differ := sorted(k for k, v in cfg.to_dict().items() if k != "runs_dir" and theirs.get(k) != v)):
        raise ConfigError({"run_id": f"node 0 started {node.run_id!r} with other settings: "
                                     f"{', '.join(differ)} differ (every node gives the same)"})
    if node.node_rank == 0:
        store.make_reserve(path)
    return path


def _not_this_run(run_dir: Path, node: Nodes) -> str | None:
    """Why the folder the run id names is not this run's to write in, before anything is written
    there; None when it is new, or holds only what this run's nodes wrote.  Node 0 makes a new
    folder (other nodes' records aside); node K joins node 0's run of as many nodes (its launch.json
    says so), one node 0 is preparing, or waits in a new folder for node 0."""
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        return "is not a folder of its own"
    held = sorted(set(os.listdir(run_dir)) - {NODES}) if run_dir.exists() else []
    if not held:
        return None
    if node.node_rank == 0:
        if claims.NODE_CLAIM in held or "config.json" in held:
            return "already holds node 0's records"
        return f"holds what is not a run's ({', '.join(held[:3])})"
    if "launch.json" not in held:
        return None if set(held) <= _PREPARING else f"holds what is not a run's ({', '.join(held[:3])})"
    nodes = store.read_json(run_dir / "launch.json", {}).get("nodes")
    if not nodes:
        return "holds a run on one node"
    if nodes.get("nnodes") != node.nnodes:
        return f"holds a run of {nodes.get('nnodes')} nodes, not {node.nnodes}"
    return None
