"""A real Slurm cluster for the tests, in a temporary folder: one node, or two on this machine.

Debian's ``slurm-wlm`` and ``munge`` (the README's test command installs them; this module installs
nothing) started as root: ``munged`` with a key made here and its own socket, ``slurmctld`` and
``slurmd`` with a ``slurm.conf`` of their own (free ports, state, spool, logs and pid files under the
folder), so nothing of the machine's own /etc is read or written.  With ``nodes=2`` the two
``slurmd`` serve nodes ``n1`` and ``n2`` each in a network namespace of its own, on a veth ``eth0``
to a bridge (``tests/veth_nodes.py``), as two machines on a network: a job's tasks run there (slurmd's
children), so the interface they name (``--ifname eth0``), the rendezvous at n1's address and
Gloo's sockets are a cluster's, not loopback's.  slurmctld and munged stay in this namespace, which
joins the bridge on a veth of its own (the nodes reach the controller at its address there; the
clients here too); that veth, the nodes' and their namespaces go with the cluster.  The clients (``sbatch``,
``squeue``, ``scancel``, ``scontrol``) find it through ``SLURM_CONF`` in ``env``.

``stop`` cancels every job, waits for the queue to empty, then ends the three daemons by their pid
files and waits until each is gone: no daemon, no job, no job step left.  Without the packages the
Slurm tests skip, except under CI (the ``CI`` variable, which ``.ci/run`` sets), where they fail.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from veth_nodes import HOST, VethNodes, free_subnet

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol")
READY_S = 60


def missing() -> list[str]:
    return [p for p in (*DAEMONS, *CLIENTS) if not shutil.which(p, path=os.environ.get("PATH", "") + ":/usr/sbin")]


def skip_or_fail() -> None:
    """Skip without the packages; under CI fail: CI installs them (the README's test command)."""
    gone = missing()
    if not gone:
        return
    why = (f"Slurm is not installed here ({', '.join(gone)} missing): "
           "apt-get install -y --no-install-recommends slurm-wlm munge")
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def namespaces_or_skip() -> None:
    """Several nodes live in network namespaces: without them (no root, no unprivileged user
    namespace, no iproute2) skip, naming why; under CI fail."""
    from commlab.engine.launchers import reallink

    prefix, why = reallink.privilege()
    if prefix is None or os.geteuid() != 0:  # slurmctld here must join the nodes' bridge: root's alone
        why = why if prefix is None else "not root (slurmctld joins the nodes' bridge from this namespace)"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"the test cluster's nodes need network namespaces: {why}")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


CONF = """\
ClusterName=commlabtest
SlurmctldHost={ctld_host}
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
KillWait=5
{node_lines}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
# (name, address) of each node: one node is "localhost", a name that resolves (the exported script's
# rendezvous is "$head_node:29500"); two are n1 and n2 on veths, whose addresses scontrol gives
# (NodeAddr), in a /24 of their own.
NODES = {1: (("localhost", "127.0.0.1"),), 2: (("n1", 1), ("n2", 2))}
NODE_IF = "eth0"  # every node's veth, in its own namespace: one name, as on a cluster's nodes


class SlurmCluster:
    def __init__(self, root: Path, nodes: int = 1):
        self.root = Path(root)
        self.on_veths = nodes > 1
        if self.on_veths:
            namespaces_or_skip()
        self.subnet = free_subnet() if self.on_veths else None
        self.nodes = tuple((name, addr if isinstance(addr, str) else self.subnet.format(addr))
                           for name, addr in NODES[nodes])
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self.veths: VethNodes | None = None

    @property
    def env(self) -> dict:
        """The environment of a client of this cluster (and of every job it runs: sbatch exports it)."""
        return {**os.environ, "SLURM_CONF": str(self.conf),
                "PATH": os.environ.get("PATH", "") + ":/usr/sbin"}

    def start(self) -> SlurmCluster:
        munge = self.munge_socket.parent
        for sub in ("state", "munge", *(f"spool-{name}" for name, _ in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(munge, 0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, *ports = _free_ports(1 + len(self.nodes))
        lines = [f"NodeName={name} NodeHostname={socket.gethostname()} NodeAddr={addr} Port={port} CPUs=2 "
                 "RealMemory=2000 State=UNKNOWN" for (name, addr), port in zip(self.nodes, ports)]
        # on veths the nodes reach slurmctld at this namespace's address on their bridge (a name of
        # this host's, "localhost", and that address: slurmctld takes the name as its own)
        ctld_host = f"localhost({self.subnet.format(HOST)})" if self.on_veths else "localhost"
        self.conf.write_text(CONF.format(ctld_port=ctld_port, ctld_host=ctld_host, root=self.root,
                                         munge_socket=self.munge_socket,
                                         node_lines="\n".join(lines),
                                         names=",".join(name for name, _ in self.nodes)))
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                                f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                                f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}"])
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")
        if self.on_veths:  # the bridge first: slurmctld reaches the nodes through it
            slurmd = shutil.which("slurmd", path=self.env["PATH"])
            self.veths = VethNodes(self.root / "veths", [[slurmd, "-D", "-N", name, "-f", str(self.conf)]
                                                         for name, _ in self.nodes],
                                   [NODE_IF] * len(self.nodes), env=self.env, subnet=self.subnet,
                                   host_ifname=f"clh{self.subnet.split('.')[2]}")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        if not self.on_veths:
            for name, _ in self.nodes:
                self._daemon(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(self._idle, "every node to be idle (sinfo)")
        return self

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")
        exe = shutil.which(argv[0], path=self.env["PATH"])
        self.procs[name] = subprocess.Popen([exe, *argv[1:]], stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()

    def _idle(self) -> bool:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}: {self.logs()}")
        if self.veths is not None and self.veths.hub.poll() is not None:
            raise RuntimeError(f"the nodes' hub exited with {self.veths.hub.returncode}: {self.logs()}")
        out = self.client(["sinfo", "-N", "-h", "-o", "%t"], check=False).split()
        return len(out) == len(self.nodes) and set(out) <= {"idle", "mix", "alloc"}

    def _wait(self, ready, what: str, timeout: float = READY_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster: no {what} after {timeout:.0f} s: {self.logs()}")
            time.sleep(0.2)

    def client(self, argv: list[str], check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> list[str]:
        return self.client(["squeue", "-h", "-o", "%i"], check=False).split()

    def job_state(self, job_id: str) -> dict:
        """``scontrol show job``'s fields (JobState, Reason, ExitCode, ...): with no accounting
        daemon there is no sacct record; slurmctld keeps a finished job for MinJobAge seconds."""
        out = self.client(["scontrol", "-o", "show", "job", job_id])
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted(self.root.glob("**/*.log")) + sorted(self.root.glob("*.out"))
                         if p.is_file())

    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            jobs = self.jobs()
            if jobs:
                self.client(["scancel", *jobs], check=False)
            deadline = time.monotonic() + 60
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.3)
        if self.veths is not None:  # the nodes' slurmd and job steps, then their namespaces and veths
            self.veths.__exit__(None, None, None)
            # this namespace's veth goes with the hub's namespace: nothing of the cluster stays in the kernel
            if not self.veths.host_gone(30):
                raise RuntimeError(f"the veth {self.veths.host_ifname} outlived the test cluster's namespaces")
        for name in reversed(self.procs):
            p = self.procs[name]
            if p.poll() is not None:
                continue
            # slurmd's job steps (slurmstepd) are its children: they end with their jobs above
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                for q in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
                    q.kill()
                p.wait()
        # slurmstepd processes are re-parented to the tests' process (the subreaper) if any outlived slurmd
        for q in psutil.Process().children(recursive=True):
            try:
                if q.name() == "slurmstepd":
                    q.kill()
            except psutil.Error:
                pass
