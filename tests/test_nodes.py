"""A run on several nodes (``commlab.engine.launchers.nodes``), tested as two nodes on this machine: each its
own ``commlab run`` and supervisor, naming the loopback interface, node 1's agent at 127.0.0.2.
One torchrun c10d rendezvous, one run folder in the shared runs folder; a Stop pressed on either
node, a rank failing on either, and a node that never joins end the run everywhere with the
reason."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlab.api import RunConfig, launch
from commlab.config import ConfigError
from commlab.engine import procs
from commlab.engine.commands import run_argv
from commlab.engine.launchers.nodes import Nodes
from commlab.engine.store import GOING

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 300


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(rank: int, endpoint: str, run_id: str, join_timeout_s: float = 120) -> Nodes:
    return Nodes.given(2, rank, endpoint, run_id, "lo", "127.0.0.1" if rank == 0 else "127.0.0.2",
                       join_timeout_s)


# ---------------------------------------------------------------------------- refused by name
def test_several_nodes_name_the_interface_or_are_refused_by_name(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.raises(ConfigError) as e:
        Nodes.given(2, 0, "node0:29400", "exp1")
    assert "ifname" in e.value.errors and "GLOO_SOCKET_IFNAME" in e.value.errors["ifname"]
    with pytest.raises(ConfigError) as e:
        Nodes.given(2, 2, "node0", "bad id!", "no-such-if0")
    assert set(e.value.errors) == {"node_rank", "rdzv_endpoint", "run_id", "ifname"}
    assert "'no-such-if0' is not a network interface of this machine" in e.value.errors["ifname"]
    with pytest.raises(ConfigError) as e:  # node flags on one node: refused, loopback stays
        Nodes.given(1, 0, ifname="lo")
    assert set(e.value.errors) == {"node_rank", "ifname"}
    assert Nodes.given() is None
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    node = Nodes.given(2, 1, "127.0.0.1:29400", "exp1")
    assert (node.ifname, node.local_addr) == ("lo", "127.0.0.1")  # the interface's address
    # Node 0's store listens on its own address only: an endpoint elsewhere would never be answered.
    assert Nodes.given(2, 0, "127.0.0.1:29400", "exp1").local_addr == "127.0.0.1"
    with pytest.raises(ConfigError) as e:
        Nodes.given(2, 0, "127.0.0.2:29400", "exp1")
    assert set(e.value.errors) == {"rdzv_endpoint"}
    assert "node 0 serves the rendezvous on 127.0.0.1 only" in e.value.errors["rdzv_endpoint"]
    assert Nodes.given(2, 0, "127.0.0.2:29400", "exp1", local_addr="127.0.0.2").local_addr == "127.0.0.2"
    with pytest.raises(ConfigError, match="does not resolve here"):
        Nodes.given(2, 0, "no-such-host.invalid:29400", "exp1")


@pytest.mark.parametrize("rank", [0, 1])
def test_one_run_id_given_twice_at_once_on_a_node_is_refused_the_second_time(tmp_path, rank):
    """The moment between the first command's claim and its config.json: the second is refused
    (before the claim file, both found no config.json and went on into one folder)."""
    from commlab.engine.launchers.nodes import node_dir

    cfg = RunConfig(workload="mlp", runs_dir=str(tmp_path))
    node = _node(rank, "127.0.0.1:29400", "exp1")
    run_dir = tmp_path / "exp1"
    if rank:  # node 1 compares its settings with node 0's
        run_dir.mkdir()
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert node_dir(cfg, node, run_dir) == node.records(run_dir)
    with pytest.raises(ConfigError, match="'exp1' is taken"):
        node_dir(cfg, node, run_dir)


def test_a_node_s_torchrun_joins_node_0_s_rendezvous():
    node = _node(1, "10.0.0.1:29400", "exp1", 30)
    argv = run_argv(2, "/shared/runs/exp1", "py", node)
    assert argv[:14] == ["py", "-m", "commlab.engine.torchrun", "--nnodes", "2", "--nproc-per-node", "2",
                         "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400",
                         "--local-addr", "127.0.0.2", "--rdzv-id"]
    assert "is_host=0,join_timeout=30,read_timeout=30" in argv
    assert argv[-3:] == ["-m", "commlab.engine.worker", "/shared/runs/exp1"]
    assert "is_host=1,join_timeout=30,read_timeout=30" in run_argv(2, "r", "py", _node(0, "127.0.0.1:1", "x", 30))


# ---------------------------------------------------------------------------- two nodes here
def _cli(runs: Path, rank: int, endpoint: str, run_id: str, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "commlab", "run", "--workload", "mlp", "--world-size", "2",
            "--runs-dir", str(runs), "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint,
            "--run-id", run_id, "--ifname", "lo", "--json", *extra]
    if rank:
        argv += ["--local-addr", "127.0.0.2"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_two_nodes_on_loopback_train_one_run_of_four_ranks(tmp_path):
    endpoint, steps = f"127.0.0.1:{_port()}", 12
    t0 = time.monotonic()
    # node 1 first: it waits in the rendezvous for node 0, which makes the run folder
    nodes = [_cli(tmp_path, k, endpoint, "two-nodes", "--steps", str(steps), "--hook", "powersgd",
                  "--start-powersgd-iter", "2") for k in (1, 0)]
    outs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in nodes]
    took = time.monotonic() - t0
    assert [p.returncode for p in nodes] == [0, 0], outs
    said = [json.loads(out) for out, _ in outs]
    run = tmp_path / "two-nodes"
    assert said[0]["run_dir"] == said[1]["run_dir"] == str(run.resolve())
    assert said[0]["status"] == said[1]["status"] == "finished" and said[0]["steps"] == steps
    meta = json.loads((run / "meta.json").read_text())
    assert meta["world_size"] == 4  # 2 nodes x 2 ranks, one process group
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(steps))  # rank 0 alone wrote, once a step
    # each node's supervisor owned its own agent, and says so in its own records
    sup0, sup1 = (json.loads((f / "supervisor.json").read_text()) for f in (run, run / "nodes" / "1"))
    assert sup0["pid"] != sup1["pid"] and len(sup0["worker_pids"]) == len(sup1["worker_pids"]) == 2
    assert json.loads((run / "nodes" / "1" / "status.json").read_text())["status"] == "finished"
    assert [p.name for p in tmp_path.iterdir()] == ["two-nodes"]  # one run in the runs folder
    print(f"two nodes x 2 ranks, {steps} steps: {took:.1f} s from the commands to their return")


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_two_nodes_in_network_namespaces_on_veths_train_one_run_through_their_interfaces(tmp_path):
    """Each node's ``commlab run`` in a network namespace of its own, its only interface besides
    ``lo`` a veth to a bridge (tests/veth_nodes.py): ``--ifname`` names that veth, node 1 reaches
    the rendezvous at node 0's veth address, this node's address is read from the interface, and
    Gloo binds there; the kernel's count of each veth holds the gradients that crossed it."""
    from veth_nodes import VethNodes, address

    from commlab.engine.launchers import reallink

    if (why := reallink.privilege())[0] is None:
        if os.environ.get("CI"):
            pytest.fail(f"no network namespaces under CI: {why[1]}")
        pytest.skip(f"no network namespaces here: {why[1]}")
    steps, endpoint = 12, f"{address(0)}:29400"  # a namespace of its own: the port is free there
    commands = [[sys.executable, "-m", "commlab", "run", "--workload", "mlp", "--world-size", "1",
                 "--steps", str(steps), "--eval-every", "0", "--runs-dir", str(tmp_path / "runs"),
                 "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint", endpoint, "--run-id", "on-veths",
                 "--ifname", f"node{k}", "--json"] for k in (0, 1)]
    t0 = time.monotonic()
    with VethNodes(tmp_path / "nodes", commands, ifnames=["node0", "node1"],
                   env={**os.environ, "PYTHONPATH": str(ROOT)}) as nodes:
        codes = nodes.wait(RUN_TIMEOUT_S)
        took = time.monotonic() - t0
        outs = [nodes.output(k) for k in (0, 1)]
        assert codes == [0, 0], (nodes.hub_output, outs)
        said = [json.loads(out[out.index("{"):]) for out in outs]
        veths = nodes.counters()
        assert procs.wait_until(lambda: not nodes.processes(), 30), [p.cmdline() for p in nodes.processes()]
    run = tmp_path / "runs" / "on-veths"
    assert said[0]["status"] == said[1]["status"] == "finished" and said[0]["steps"] == steps
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == list(range(steps))
    assert json.loads((run / "meta.json").read_text())["world_size"] == 2
    # each node's torchrun took its address from its veth, and node 1 met node 0 at node 0's
    node0, node1 = (json.loads((f / "launch.json").read_text())["nodes"] for f in (run, run / "nodes" / "1"))
    assert (node0["ifname"], node0["local_addr"]) == ("node0", address(0))
    assert (node1["ifname"], node1["local_addr"], node1["rdzv_endpoint"]) == ("node1", address(1), endpoint)
    # the gradients crossed the veths (mlp: 340,008 bytes a step each way on 2 ranks), nothing on lo could
    assert all(veths[v]["tx_bytes"] > steps * 340_008 < veths[v]["rx_bytes"] for v in ("node0", "node1")), veths
    print(f"two nodes in namespaces on veths, {steps} steps: {took:.1f} s; veths {veths}")


def _wait_steps(run_dir: Path, timeout: float = RUN_TIMEOUT_S) -> None:
    assert procs.wait_until(lambda: (run_dir / "metrics.jsonl").exists()
                            and (run_dir / "metrics.jsonl").stat().st_size > 0, timeout, 0.2)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_stop_on_node_1_ends_both_nodes(tmp_path):
    endpoint = f"127.0.0.1:{_port()}"
    cfg = RunConfig(workload="mlp", world_size=1, steps=100000, runs_dir=str(tmp_path))
    node0 = launch(cfg, node=_node(0, endpoint, "stopped"))
    node1 = launch(cfg, node=_node(1, endpoint, "stopped"))
    _wait_steps(node0.path)
    assert node1.stop() == "stopped"  # from node 1: no PID of node 0 is signalled from there
    assert node0.wait(60) == "stopped" and node1.wait(60) == "stopped"
    assert "stopped by the user (on " in node0.status_record()["error"]
    assert not node0.processes() and not node1.processes()


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_rank_failing_on_node_1_ends_the_run_on_node_0_with_its_reason(tmp_path):
    endpoint = f"127.0.0.1:{_port()}"
    cfg = RunConfig(workload="tests.misbehaving_workloads:crashing", world_size=1, steps=50,
                    runs_dir=str(tmp_path))
    node0 = launch(cfg, node=_node(0, endpoint, "crash"))
    node1 = launch(cfg, node=_node(1, endpoint, "crash"))
    assert node0.wait(RUN_TIMEOUT_S) == "failed" and node1.wait(60) in ("failed", "stopped")
    rec = node0.status_record()
    assert rec["failed_rank"] == 1 and "rank 1 ran out of data on purpose" in rec["error"], rec


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_node_that_never_joins_ends_the_run_naming_it(tmp_path):
    cfg = RunConfig(workload="mlp", world_size=1, steps=5, runs_dir=str(tmp_path))
    node0 = launch(cfg, node=_node(0, f"127.0.0.1:{_port()}", "alone", join_timeout_s=4))
    assert node0.wait(RUN_TIMEOUT_S) == "failed"
    assert node0.status_record()["error"] == "node 1 did not join within 4 s"
    assert node0.status() not in GOING
