"""Nodes of a test cluster, each in a network namespace of its own on a veth to a bridge, as the
nodes of a cluster are on their network: the interface a node names (``--ifname``), the rendezvous
address (node 0's veth address) and Gloo's socket binding are exercised as there, not on ``lo``.

The namespaces are made as the real link makes them (``commlab.engine.launchers.reallink``'s
``bridge_up``, ``in_namespace``, ``connect``, ``join``): a hub namespace holds the bridge, each node
a namespace of its own; none is named, each goes with its last process, and nothing is configured
in this machine's namespace.

    with VethNodes(tmp_path, [argv0, argv1], ifnames=["n0", "n1"]) as nodes:
        codes = nodes.wait(300)
        nodes.output(0), nodes.counters()  # node 0's stdout; the kernel's count of each veth

The hub is this file run as a script (``python tests/veth_nodes.py hub SPEC``), each node too
(``... node SPEC K``: joins its veth, then execs its command).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from commlab.engine import procs, store
from commlab.engine.launchers import reallink

SUBNET = "10.213.0.{}"
HOST = 254  # the caller's address on the bridge's /24, where it has one (host_ifname)
HERE = Path(__file__).resolve()


def address(k: int, subnet: str = SUBNET) -> str:
    """Node K's address on the bridge's /24 (node 0's serves the rendezvous)."""
    return subnet.format(k + 1)


def free_subnet() -> str:
    """A 10.213.X.0/24 that no interface of this (the caller's) namespace is in: for a bridge the
    caller joins (``host_ifname``), which another cluster of another test suite may be holding."""
    held = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    start = os.getpid() % 200
    for x in (1 + (start + i) % 250 for i in range(250)):
        if f" 10.213.{x}." not in held:
            return f"10.213.{x}.{{}}"
    raise RuntimeError("no free 10.213.X.0/24 in this namespace")


class VethNodes:
    """Node K runs ``commands[K]`` in its own namespace on its veth ``ifnames[K]`` at ``address(K)``.
    ``host_ifname``: the caller joins the bridge too, on a veth of that name in its own namespace at
    ``subnet``'s .254 (a daemon here that the nodes must reach, as a cluster's controller); that
    veth goes with the hub's namespace, as the nodes' do.  A context manager: at its end every
    process still in one of its namespaces is ended (a run's detached supervisor included), which
    removes them and their veths."""

    def __init__(self, folder: Path, commands: list[list[str]], ifnames: list[str], env: dict | None = None,
                 subnet: str = SUBNET, host_ifname: str | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.spec = self.folder / "veth-nodes.json"
        self.subnet, self.host_ifname = subnet, host_ifname
        store.write_json(self.spec, {
            "nodes": [{"address": address(k, subnet), "ifname": ifnames[k], "command": list(argv),
                       "log": str(self.folder / f"node{k}.out")} for k, argv in enumerate(commands)],
            "host": {"ifname": host_ifname, "pid": os.getpid()} if host_ifname else None,
            "result": str(self.folder / "veth-counters.json"),
            "namespaces": str(self.folder / "veth-namespaces.json")})
        with open(self.folder / "hub.out", "w") as out:
            # as root a network namespace, else one in an unprivileged user namespace (as the real link's)
            prefix, why = reallink.privilege()
            if prefix is None or (host_ifname and os.geteuid() != 0):
                raise RuntimeError(f"no network namespaces for the nodes here: {why}" if prefix is None else
                                   "a veth into this namespace (host_ifname) needs root")
            self.hub = subprocess.Popen([*prefix, sys.executable, str(HERE), "hub", str(self.spec)],
                                        env={**(env or os.environ)}, stdout=out, stderr=subprocess.STDOUT)
        if host_ifname:
            self._join_here(host_ifname)

    @property
    def host_address(self) -> str:
        return self.subnet.format(HOST)

    def _join_here(self, ifname: str) -> None:
        if not procs.wait_until(lambda: reallink.counters(ifname) is not None or self.hub.poll() is not None,
                                reallink.SETTLE_S, 0.02) or self.hub.poll() is not None:
            raise RuntimeError(f"the hub gave no veth {ifname}: {(self.folder / 'hub.out').read_text()}")
        for args in (["addr", "add", f"{self.host_address}/24", "dev", ifname], ["link", "set", ifname, "up"]):
            subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    def host_gone(self, timeout: float) -> bool:
        """Whether this namespace's veth (``host_ifname``) is gone, as it goes with the hub's namespace."""
        return not self.host_ifname or procs.wait_until(lambda: reallink.counters(self.host_ifname) is None, timeout)

    @property
    def hub_output(self) -> str:
        return (self.folder / "hub.out").read_text()

    def wait(self, timeout: float) -> list[int]:
        """Every node's exit code (the hub's, then each node's as it recorded them)."""
        self.hub.wait(timeout=timeout)
        return store.read_json(Path(store.read_json(self.spec)["result"]))["codes"]

    def output(self, k: int) -> str:
        return Path(store.read_json(self.spec)["nodes"][k]["log"]).read_text()

    def counters(self) -> dict[str, dict]:
        """The kernel's counters of each node's veth (by its name), read in its namespace as its command ended."""
        return store.read_json(Path(store.read_json(self.spec)["result"]))["veths"]

    def namespaces(self) -> set[str]:
        path = Path(store.read_json(self.spec)["namespaces"])
        return set((store.read_json(path) or {}).get("namespaces", ())) if path.exists() else set()

    def processes(self) -> list[psutil.Process]:
        """Processes still in one of the namespaces (a run's supervisor ends a moment after its command)."""
        made = self.namespaces()
        out = []
        for p in psutil.process_iter():
            try:
                if os.readlink(f"/proc/{p.pid}/ns/net") in made:
                    out.append(p)
            except OSError:
                pass
        return out

    def __enter__(self) -> VethNodes:
        return self

    def __exit__(self, *exc) -> None:
        if self.hub.poll() is None:
            procs.terminate([self.hub], grace_s=3.0)
        procs.terminate(self.processes(), grace_s=3.0)
        procs.wait_until(lambda: not self.processes(), 30)


# ---------------------------------------------------------------------------- the hub and the nodes
def hub(spec_path: Path) -> int:
    spec = store.read_json(spec_path)
    reallink.bridge_up()
    if host := spec["host"]:  # the caller's veth: its end here on the bridge, the other in the caller's namespace
        subprocess.run(["ip", "link", "add", "vhost", "type", "veth", "peer", "name", host["ifname"], "netns",
                        str(host["pid"])], check=True, capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "set", "vhost", "master", reallink.BRIDGE, "up"], check=True,
                       capture_output=True, timeout=30)
    children = []
    for k, node in enumerate(spec["nodes"]):
        children.append(reallink.in_namespace([sys.executable, str(HERE), "node", str(spec_path), str(k)],
                                              log=node["log"]))
        reallink.connect(k, children[-1], None, node["ifname"])
    # what the test ends if a node leaves a process behind (its namespaces, and this one)
    made = [os.readlink(f"/proc/{p}/ns/net") for p in (os.getpid(), *(c.pid for c in children))]
    store.write_json(Path(spec["namespaces"]), {"namespaces": made})
    while any(c.poll() is None for c in children):
        time.sleep(0.2)
    result = Path(spec["result"])
    store.write_json(result, {"codes": [c.returncode for c in children],
                              "veths": {node["ifname"]: store.read_json(result.with_suffix(f".node{k}.json"))
                                        for k, node in enumerate(spec["nodes"])}})
    return next((c.returncode for c in children if c.returncode), 0)


def node(spec_path: Path, k: int) -> int:
    """Node K: its veth joined, its command run and waited for (a SIGTERM passed on to it), then
    the kernel's count of its veth recorded (the veth goes with the namespace: read it from here)."""
    spec = store.read_json(spec_path)
    me = spec["nodes"][k]
    reallink.join(me["address"], me["ifname"])
    child = subprocess.Popen(me["command"])
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    code = child.wait()
    store.write_json(Path(spec["result"]).with_suffix(f".node{k}.json"), reallink.counters(me["ifname"]))
    return code


if __name__ == "__main__":
    what, path = sys.argv[1], Path(sys.argv[2])
    raise SystemExit(hub(path) if what == "hub" else node(path, int(sys.argv[3])))
