"""A run on a real link: each rank in a network namespace of its own, the namespaces joined by veths
to a bridge, every veth shaped by the kernel's token bucket (tc tbf) to the rate the run names.

    commlab run --real-link-mbps 100 --hook allreduce ...

The run's supervisor starts in a namespace of its own (``unshare --net``: as root, else in an
unprivileged user namespace, ``unshare --user --map-root-user --net``), the *hub*.  What it runs
(launch.json's command) is this module's link process, which makes the hub's bridge and one
namespace per rank (``unshare --net`` again): a node of a run on several
(``commlab.engine.launchers.nodes``), one rank each, at 10.213.0.K+1 on its ``eth0``, node 0
serving the rendezvous there.  Each rank's veth is shaped both ways (tbf on its hub end and on its
``eth0``), so that every rank sends and receives at the rate, as on a switch's ports.

No namespace is named (``ip netns add`` would leave one behind a killed process): each lives as
long as a process in it, so the supervisor's end, however it ends (a Stop, a crash, SIGKILL),
takes its processes down (PR_SET_PDEATHSIG), then the kernel removes the namespaces, and with
them the veths, the bridge and their qdiscs.  Nothing is ever configured in this machine's own
namespace.

A latency (``emulate_latency_us``) is netem's delay on each rank's own end of its veth where the
kernel has netem (then the hooks add none), else the emulated one, held in the hooks; launch.json
and the command's first line say which.  As each rank's
torchrun ends, its node records the kernel's own counters of its ``eth0`` in ``link.rankK.json``.
"""
from __future__ import annotations

import contextlib
import gzip
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from commlab.engine import procs, run_folder, store
from commlab.engine.commands import run_argv, supervisor_argv, worker_env
from commlab.engine.launchers.base import Launcher
from commlab.engine.launchers.nodes import Nodes

MODULE = "commlab.engine.launchers.reallink"
BRIDGE = "commlab0"
NODE_IF = "eth0"  # every rank's own namespace has its own names: the same one in each
SUBNET = "10.213.0.{}"
PORT = 29400
ASSUMED_HZ = 1000
QUEUE_S = 0.1  # what tbf queues past its burst, in time at the rate: a deeper queue only delays
MIN_BURST = 16 * 1024  # tbf cannot pass a packet larger than its bucket (a 64 KiB GSO one is split)
SETTLE_S = 30.0


# ---------------------------------------------------------------------------- what the kernel offers
def kernel_hz() -> tuple[int, str]:
    """The kernel's timer frequency (CONFIG_HZ) and where it was read; ``ASSUMED_HZ`` where the
    kernel's configuration is not readable, said so."""
    for path in ("/proc/config.gz", f"/boot/config-{platform.release()}"):
        with contextlib.suppress(OSError):
            text = (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read()
            for line in text.splitlines():
                if line.startswith("CONFIG_HZ="):
                    return int(line.split("=")[1]), path
    return ASSUMED_HZ, f"assumed: CONFIG_HZ not readable from /proc/config.gz or /boot/config-{platform.release()}"


def burst_bytes(rate_mbps: float, hz: int) -> int:
    """tbf's bucket: what the rate brings in one timer tick (rate/HZ), never below ``MIN_BURST``.
    A smaller bucket caps the link below its rate (1 Gb/s with a 64 KB bucket ran slower than
    100 Mb/s); a larger one banks more of the rate while a rank computes and spends it at line
    speed on the next step's first bytes, which no switch port does (twice rate/HZ made top-k at
    50 Mb/s run faster than its bytes at the rate allow: docs/tuning.md)."""
    return max(MIN_BURST, math.ceil(rate_mbps * 1e6 / 8 / hz))


def shaping(rate_mbps: float, hz: int) -> list[str]:
    """tc's arguments after ``qdisc add dev IF root``: tbf at the rate, its bucket, its queue."""
    burst = burst_bytes(rate_mbps, hz)
    limit = burst + int(rate_mbps * 1e6 / 8 * QUEUE_S)
    return ["tbf", "rate", f"{rate_mbps:g}mbit", "burst", str(burst), "limit", str(limit)]


def qdiscs(tc: list[str], delay_us: float = 0.0) -> list[list[str]]:
    """The qdiscs of one end of a veth, each as tc's arguments after ``qdisc replace dev IF``: tbf
    (``tc``) at the root; with a delay, netem at the root and tbf under it, as the kernel's netem
    documentation chains them.  Only a rank's own end delays: a hop crosses two ends, and the
    latency is one hop's."""
    if not delay_us:
        return [["root", *tc]]
    return [["root", "handle", "1:", "netem", "delay", f"{delay_us:g}us"], ["parent", "1:1", "handle", "10:", *tc]]


def privilege() -> tuple[list[str] | None, str]:
    """The prefix that starts a process in a network namespace of its own, and how (root, or an
    unprivileged user namespace); None and why not where neither works."""
    missing = [t for t in ("unshare", "ip", "tc") if shutil.which(t) is None]
    if missing:
        return None, f"{', '.join(missing)} not on PATH (util-linux and iproute2 make the link)"
    tries = [(["unshare", "--net"], "root")] if os.geteuid() == 0 else []
    tries.append((["unshare", "--user", "--map-root-user", "--net"], "an unprivileged user namespace"))
    said = []
    for prefix, how in tries:
        done = subprocess.run([*prefix, "ip", "link", "add", "probe0", "type", "bridge"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return prefix, how
        said.append(f"{' '.join(prefix)}: {done.stderr.strip() or done.returncode}")
    return None, "neither root nor an unprivileged user namespace can make one here (" + "; ".join(said) + ")"


def qdisc_error(prefix: list[str], kind: list[str]) -> str | None:
    """What the kernel answers a qdisc of ``kind`` on a throwaway namespace's loopback; None: it
    has it.  The namespace ends with the probe, so nothing stays configured."""
    done = subprocess.run([*prefix, "tc", "qdisc", "add", "dev", "lo", "root", *kind],
                          capture_output=True, text=True, timeout=30)
    return None if done.returncode == 0 else (done.stderr.strip() or f"tc exited {done.returncode}")


# ---------------------------------------------------------------------------- the launcher
class RealLink(Launcher):
    """Every rank in a network namespace of its own on a link the kernel shapes (``real_link_mbps``),
    under one supervisor in a namespace of its own."""

    name = "reallink"

    @classmethod
    def owns(cls, info: dict) -> bool:
        return bool(info.get("real_link"))

    def errors(self, cfg) -> dict[str, str]:
        if not cfg.real_link_mbps:
            return {"real_link_mbps": "name the link's rate in Mb/s (1 to 10000) for a run in network namespaces"}
        if cfg.world_size < 2:
            return {"world_size": "a real link joins two ranks or more: give world_size 2 or more"}
        if cfg.emulate_bandwidth_gbps:
            return {"emulate_bandwidth_gbps": "the real link's rate is the bandwidth: an emulated one "
                                              "on top would be a second, slower link (set it to 0)"}
        prefix, how = privilege()
        if prefix is None:
            return {"real_link_mbps": f"a real link needs network namespaces: {how}"}
        if err := qdisc_error(prefix, shaping(cfg.real_link_mbps, ASSUMED_HZ)):
            return {"real_link_mbps": f"this kernel cannot shape a link with tc's tbf: {err}"}
        return {}

    def records(self, cfg, records: Path) -> dict:
        run_dir = records.resolve()
        prefix, how = privilege()
        hz, hz_from = kernel_hz()
        netem = qdisc_error(prefix, ["netem", "delay", "1ms"])
        delay_us = cfg.emulate_latency_us if netem is None else 0.0
        nodes = [self.node(cfg, run_dir.name, k) for k in range(cfg.world_size)]
        return {"command": [sys.executable, "-m", MODULE, str(run_dir)],
                # netem holds the latency on the wire: the hooks emulating it too would count it twice
                **({"rank_settings": {"emulate_latency_us": 0.0}} if delay_us else {}),
                "real_link": {
                    "rate_mbps": cfg.real_link_mbps, "hz": hz, "hz_from": hz_from,
                    "burst_bytes": burst_bytes(cfg.real_link_mbps, hz), "tc": shaping(cfg.real_link_mbps, hz),
                    "namespaces": prefix, "privilege": how, "bridge": BRIDGE,
                    "delay_us": delay_us, "latency": latency_said(cfg.emulate_latency_us, netem),
                    "nodes": [{"address": n.local_addr, "ifname": NODE_IF,
                               "command": run_argv(1, run_dir, sys.executable, n)} for n in nodes]}}

    @staticmethod
    def node(cfg, run_id: str, k: int) -> Nodes:
        """Rank K's node: one rank, in its own namespace, node 0 serving the rendezvous."""
        return Nodes(cfg.world_size, k, f"{SUBNET.format(1)}:{PORT}", run_id, NODE_IF, SUBNET.format(k + 1))

    def start(self, folder: run_folder.RunFolder, cfg) -> None:
        """The supervisor, detached, in the hub's namespace (unshare execs it: the PID is the supervisor's)."""
        me = str(folder.path.resolve())
        prefix = folder.launch_info()["real_link"]["namespaces"]
        child = procs.spawn([*prefix, *supervisor_argv(me)], log=folder.file("supervisor.log"),
                            env={**worker_env(cfg), procs.OWNER_ENV: me}, detached=True)
        store.write_json(folder.file("launch.json"), {**folder.launch_info(), "supervisor": procs.identity(child.pid)})

    def describe(self, cfg, info: dict) -> str:
        link = info["real_link"]
        return (f"{cfg.world_size} {info['backend']} rank(s), each in a network namespace of its own, on a "
                f"real {link['rate_mbps']:g} Mb/s link (tc tbf, burst {link['burst_bytes']} B at HZ "
                f"{link['hz']}; {link['privilege']}); latency: {link['latency']}")


def latency_said(latency_us: float, netem_error: str | None) -> str:
    """Which latency the run has, for a person: netem's delay on the wire where the kernel has
    netem, else the emulated one, in the hooks."""
    netem = f"netem absent from this kernel: {netem_error}" if netem_error else "netem present"
    if not latency_us:
        return f"none added ({netem})"
    if netem_error:
        return f"{latency_us:g} µs per ring hop, emulated in the hooks ({netem})"
    return f"{latency_us:g} µs per ring hop, netem's delay on each rank's link (the hooks add none)"


# ---------------------------------------------------------------------------- the link's processes
def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _shape(ifname: str, chain: list[list[str]]) -> None:
    for qdisc in chain:
        subprocess.run(["tc", "qdisc", "replace", "dev", ifname, *qdisc], check=True, capture_output=True,
                       timeout=30)


def _netns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def serve(run_dir: Path) -> int:
    """The link (launch.json's command, in the hub's namespace): the bridge, then one namespace per
    rank with its veth; waits for every rank's node and exits as the first that fails, else 0."""
    folder = run_folder.RunFolder(run_dir)
    link = folder.launch_info()["real_link"]
    bridge_up()
    children = []
    for k in range(len(link["nodes"])):
        env = dict(os.environ)
        if k:  # torchrun's record of failed ranks is node 0's (the ranks' own reports name the rest)
            env.pop(procs.TORCHRUN_RECORD_ENV, None)
        children.append(in_namespace([sys.executable, "-m", MODULE, "--node", str(run_dir), str(k)], env=env))
        connect(k, children[-1], link["tc"])
    return first_failure(children)


# The pieces of a link, each run in the namespace it configures; the launcher's processes above and
# below use them, and so do the tests that put nodes of a run on several nodes on veths
# (tests/veth_nodes.py): one way of making the link.
def bridge_up() -> None:
    """This (the hub's) namespace's loopback and its bridge, up."""
    _ip("link", "set", "lo", "up")
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("link", "set", BRIDGE, "up")


def in_namespace(argv: list[str], env: dict | None = None, log: str | os.PathLike | None = None):
    """``argv`` in a network namespace of its own (``unshare --net`` execs it: the PID is argv's),
    killed when this process ends, however it ends: the namespace goes with its last process."""
    return procs.spawn(["unshare", "--net", *argv], env=env, log=log, die_with_caller=True)


def first_failure(children: list) -> int:
    """Waits for every child; as the first fails, ends the others and returns its code; else 0."""
    while True:
        codes = [c.poll() for c in children]
        if failed := [c for c in codes if c]:
            procs.terminate([p for c in children for p in procs.tree(c.pid)], grace_s=3.0)
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def connect(k: int, child, tc: list[str] | None, ifname: str = NODE_IF) -> str:
    """Node K's veth: its hub end (``vK``, returned) on the bridge, shaped by ``tc`` (None: not
    shaped), its other end moved into the child's namespace as ``ifname`` once the child is in it
    (before its unshare the child is still in the hub's)."""
    hub = _netns(os.getpid())
    if not procs.wait_until(lambda: child.poll() is not None or _netns(child.pid) != hub, SETTLE_S, 0.01):
        raise RuntimeError(f"node {k}'s network namespace did not appear within {SETTLE_S:g} s")
    veth = f"v{k}"
    _ip("link", "add", veth, "type", "veth", "peer", "name", ifname, "netns", str(child.pid))
    _ip("link", "set", veth, "master", BRIDGE, "up")
    if tc:
        _shape(veth, qdiscs(tc))
    return veth


def join(address: str, ifname: str = NODE_IF, tc: list[str] | None = None, delay_us: float = 0.0) -> None:
    """In a node's namespace: its veth ``ifname`` once the hub has given it, addressed in the /24
    and up, shaped by ``tc`` (None: not shaped) and delayed by ``delay_us`` (netem); its loopback up."""
    if not procs.wait_until(lambda: counters(ifname) is not None, SETTLE_S, 0.01):
        raise RuntimeError(f"the veth {ifname} did not arrive within {SETTLE_S:g} s")
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", f"{address}/24", "dev", ifname)
    _ip("link", "set", ifname, "up")
    if tc:
        _shape(ifname, qdiscs(tc, delay_us))


def node(run_dir: Path, k: int) -> int:
    """Rank K's node, in its own namespace: its ``eth0`` once the hub has given it, addressed and
    shaped; then its torchrun, waited for, and the kernel's counters of ``eth0`` recorded."""
    folder = run_folder.RunFolder(run_dir)
    link, cfg = folder.launch_info()["real_link"], folder.config()
    me = link["nodes"][k]
    join(me["address"], NODE_IF, link["tc"], link.get("delay_us", 0.0))
    place = RealLink.node(cfg, folder.id, k)
    child = procs.spawn(me["command"], env=worker_env(cfg, dict(os.environ), place), die_with_caller=True)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # a Stop reaches torchrun, then the counters
    code = child.wait()
    record_counters(folder.path, k)
    return code


def counters(ifname: str = NODE_IF) -> dict[str, int] | None:
    """The kernel's counters of ``ifname`` in this process's namespace; None: no such interface.
    /proc/net/dev, not /sys/class/net: sysfs shows the namespace that mounted it (this machine's)."""
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == ifname:
            f = [int(x) for x in fields.split()]
            return {"rx_bytes": f[0], "rx_packets": f[1], "tx_bytes": f[8], "tx_packets": f[9]}
    return None


def record_counters(run_dir: Path, k: int) -> None:
    """This rank's ``eth0`` as the kernel counted it, into the run folder (a file per rank: the
    ranks end at the same moment)."""
    store.write_json(Path(run_dir) / f"link.rank{k}.json", {"rank": k, **counters(), "at": time.time()})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "--node":
        return node(Path(argv[1]), int(argv[2]))
    return serve(Path(argv[0]))


if __name__ == "__main__":
    raise SystemExit(main())
