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
HERE = Path(__file__).resolve()


def address(k: int) -> str:
    """Node K's address on the bridge's /24 (node 0's serves the rendezvous)."""
    return SUBNET.format(k + 1)


class VethNodes:
    """Node K runs ``commands[K]`` in its own namespace on its veth ``ifnames[K]`` at ``address(K)``.
    A context manager: at its end every process still in one of its namespaces is ended (a run's
    detached supervisor included), which removes them."""

    def __init__(self, folder: Path, commands: list[list[str]], ifnames: list[str], env: dict | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.spec = self.folder / "veth-nodes.json"
        store.write_json(self.spec, {
            "nodes": [{"address": address(k), "ifname": ifnames[k], "command": list(argv),
                       "log": str(self.folder / f"node{k}.out")} for k, argv in enumerate(commands)],
            "result": str(self.folder / "veth-counters.json"),
            "namespaces": str(self.folder / "veth-namespaces.json")})
        self.hub = subprocess.Popen(["unshare", "--net", sys.executable, str(HERE), "hub", str(self.spec)],
                                    env={**(env or os.environ)}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)

    def wait(self, timeout: float) -> list[int]:
        """Every node's exit code (the hub's, then each node's as it recorded them)."""
        self.hub_output = self.hub.communicate(timeout=timeout)[0]
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
