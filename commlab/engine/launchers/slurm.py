"""Slurm as a launcher: a run submitted as a batch job, followed from the machine that submitted it.

    commlab run --launcher slurm --nodes 2 --ifname eth0 ...      (on a login node)

``submit`` writes the run folder's job script (``job.sbatch``: one ``srun`` task per node), submits
it with ``sbatch`` (an argv list, never a shell string) and records the job id in launch.json.  Each
task runs ``python -m commlab.engine.slurm_node RUN_DIR``: that node's supervisor, in the foreground,
owning its torchrun agent; on several nodes a run on several nodes (``commlab.engine.launchers.nodes``) with
the c10d rendezvous on the allocation's first node, on one node an ordinary run on loopback there.
The runs folder must be one folder that the login node and the compute nodes share, at the same
path, and so must the Python environment (the job runs this machine's ``sys.executable``).

A detached follower on the submitting machine (``python -m commlab.engine.launchers.slurm RUN_DIR``)
keeps status.json in step with the job, read with ``scontrol show job`` (no accounting daemon is
needed): ``pending`` with Slurm's reason while queued, ``starting`` once the job runs, then the
node supervisors take over (``running``, the end); when the job leaves, a run that did not record
its own end is given Slurm's (cancelled, time limit, failed to start, with the job's output).
Stop is the stop request every node's supervisor reads, plus ``scancel``.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from commlab.devices import ranks_forkable
from commlab.engine import procs, run_folder, status_file, store
from commlab.engine.commands import LOOPBACK, run_argv, worker_env
from commlab.engine.launchers import nodes
from commlab.engine.launchers.base import Launcher
from commlab.engine.run_state import FINAL, GOING, RunStatus
from commlab.engine.stop_request import STOP_GRACE_S, request_stop, stop_request
from commlab.engine.supervisor import supervise

SCRIPT = "job.sbatch"
POLL_S = 0.5
RDZV_PORT = 29400  # the rendezvous port on the allocation's first node (torchrun's docs use it)
# slurmctld not answering is not the job's end: its tasks train on under slurmd.  The follower waits,
# and gives up only once the run recorded its own end, or the job's time limit is this far past.
UNANSWERED_PAST_LIMIT_S = 300.0
RECORD_WAIT_S = 20.0  # after the job ends: time for the supervisors to record the run's end
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED")
SBATCH_SAFE = re.compile(r"[A-Za-z0-9._:-]+")


def sbatch_line_errors(values: dict) -> dict[str, str]:
    """Each value that cannot go in an ``#SBATCH`` line: sbatch reads those, not a shell, so no
    quoting can protect them (the lab's job scripts and the exported one)."""
    return {name: f"may hold letters, digits and . _ : - only, got {value!r}" for name, value in values.items()
            if value is not None and not SBATCH_SAFE.fullmatch(value)}


@dataclass(frozen=True)
class SlurmJob:
    """What the job asks Slurm for; every setting of the run means the same as on one machine."""

    nodes: int = 1
    time_limit: str = "01:00:00"
    partition: str | None = None
    ifname: str | None = None  # the interface the ranks talk on: needed on several nodes
    port: int = RDZV_PORT

    @classmethod
    def given(cls, nodes_: int | None = None, time_limit: str | None = None, partition: str | None = None,
              ifname: str | None = None, port: int | None = None, env: dict | None = None) -> SlurmJob:
        """From a person's flags or form; ConfigError naming each wrong field."""
        from commlab.config import ConfigError

        env = os.environ if env is None else env
        job = cls(nodes_ or 1, time_limit or cls.time_limit, partition or None,
                  ifname or env.get(nodes.IFNAME_ENV) or None, port or RDZV_PORT)
        if errors := job.errors():
            raise ConfigError(errors)
        return job

    def errors(self) -> dict[str, str]:
        e = {}
        if not available():
            e["launcher"] = "sbatch is not on PATH here: Slurm's launcher needs a machine that submits to Slurm"
        if not isinstance(self.nodes, int) or self.nodes < 1:
            e["nodes"] = f"must be a whole number of at least 1, got {self.nodes!r}"
        e |= sbatch_line_errors({"time_limit": self.time_limit, "partition": self.partition})
        if self.nodes > 1 and not self.ifname:
            e["ifname"] = ("name the network interface the ranks talk on between nodes (--ifname or "
                           f"{nodes.IFNAME_ENV}): on several nodes the lab cannot default to loopback")
        if not 0 < self.port < 65536:
            e["port"] = f"must be a TCP port, 1 to 65535, got {self.port!r}"
        return e

    def as_dict(self) -> dict:
        return asdict(self)


def available() -> bool:
    """Whether this machine submits to Slurm (``sbatch`` on PATH): the pages offer it then."""
    return shutil.which("sbatch") is not None


def script(run_dir: Path, cfg, job: SlurmJob, python: str = sys.executable, backend: str = "gloo") -> str:
    """The job script: one task per node, each that node's supervisor (``commlab.engine.slurm_node``).
    Not requeued: a requeued job would start the run over in its own folder.  ``backend``: the
    one the run resolved on the submitting machine; NCCL asks for a GPU per rank."""
    lines = ["#!/bin/bash", f"#SBATCH --nodes={job.nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={cfg.world_size}", f"#SBATCH --time={job.time_limit}",
             "#SBATCH --no-requeue"]
    if backend == "nccl":
        lines.append(f"#SBATCH --gpus-per-node={cfg.world_size}")
    if job.partition:
        lines.append(f"#SBATCH --partition={job.partition}")
    lines += [f"# commlab run {Path(run_dir).name}: one task per node runs that node's supervisor, which",
              f"# starts torchrun there with {cfg.world_size} rank(s); the run folder is on the shared runs folder.",
              "set -euo pipefail",
              "exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 "
              + " ".join(map(shlex.quote, [python, "-m", "commlab.engine.slurm_node", str(run_dir)]))]
    return "\n".join(lines) + "\n"


def sbatch_argv(folder: run_folder.RunFolder) -> list[str]:
    """sbatch's own argv: what holds a path is given here, not in an #SBATCH line."""
    # sbatch expands % in --output (%j the job id): a % of the path is written %%
    output = str(folder.path).replace("%", "%%") + "/slurm-%j.out"
    return ["sbatch", "--parsable", f"--job-name=commlab-{folder.id}"[:100], f"--chdir={folder.path}",
            f"--output={output}", str(folder.file(SCRIPT))]


def submit(folder: run_folder.RunFolder, cfg, job: SlurmJob, env: dict) -> str | None:
    """Write the script, submit it, record the job id and spawn the follower; returns the job id.
    ConfigError (the launcher's) with sbatch's own words when it refuses: nothing was submitted.
    When sbatch does not answer, the job may have been submitted: the run is recorded failed, saying
    so, and None returned.  A job submitted but not followed (the follower could not start) is
    cancelled."""
    from commlab.config import ConfigError

    folder.file(SCRIPT).write_text(script(folder.path.resolve(), cfg, job,
                                          backend=folder.launch_info().get("backend", "gloo")))
    status_file.record(folder.path, RunStatus.PENDING, step=None)
    # The settings before sbatch: the node tasks read them as they start, perhaps at once.
    store.write_json(folder.file("launch.json"), {**folder.launch_info(), "slurm": {"job": job.as_dict()}})
    try:
        done = subprocess.run(sbatch_argv(run_folder.RunFolder(folder.path.resolve())), env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        status_file.record(folder.path, RunStatus.FAILED, step=None, ended_at=time.time(), error=(
            "sbatch did not answer within 120 s (the job may have been submitted all the same: see squeue)"))
        return None
    if done.returncode:
        raise ConfigError({"launcher": f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}"})
    job_id = done.stdout.strip().split(";")[0]
    try:
        store.write_json(folder.file("launch.json"), {
            **folder.launch_info(), "slurm": {"job_id": job_id, "job": job.as_dict(), "submitted_at": time.time()}})
        me = str(folder.path.resolve())
        child = procs.spawn([sys.executable, "-m", "commlab.engine.launchers.slurm", me],
                            log=folder.file("supervisor.log"), env={**env, procs.OWNER_ENV: me}, detached=True)
        store.write_json(folder.file("launch.json"), {**folder.launch_info(), "supervisor": procs.identity(child.pid)})
    except BaseException:
        cancel(job_id)
        raise
    return job_id


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, timeout=60)


def job_state(job_id: str) -> dict | None:
    """``scontrol show job``'s fields (JobState, Reason, ExitCode, ...); {} once Slurm has
    forgotten the job (MinJobAge after its end); None when Slurm did not answer (a controller
    restarting, a timeout): not known, so asked again."""
    try:
        done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode:
        return {} if "invalid job id" in done.stderr.lower() else None
    return dict(w.split("=", 1) for w in done.stdout.split() if "=" in w)


# ---------------------------------------------------------------------------- the follower
def follow(run_dir: Path) -> int:
    folder = run_folder.RunFolder(run_dir)
    info = folder.launch_info()
    job_id, owner = info["slurm"]["job_id"], info.get("owner")
    cancelled_for = None
    while True:
        state = job_state(job_id)
        if state is None:
            if unanswered(folder, job_id, info["slurm"]):
                return 0
            time.sleep(POLL_S)
            continue
        js = state.get("JobState", "")
        said = status_file.said(folder.path)
        slurm = {"job_id": job_id, "state": js or "GONE", "reason": state.get("Reason")}
        if js == "PENDING" and said.get("slurm") != slurm:
            status_file.record(folder.path, RunStatus.PENDING, slurm=slurm)
        elif js not in ("", "PENDING", *ENDED) and said.get("status") == RunStatus.PENDING:
            status_file.record(folder.path, RunStatus.STARTING, slurm=slurm)
        elif not js or js in ENDED:
            record_end(folder, job_id, state, cancelled_for)
            return 0
        if owner and cancelled_for is None and not procs.alive(owner["pid"], owner["create_time"]):
            cancelled_for = (f"its {owner['what']} ended (process {owner['pid']}), so the run was "
                             "stopped with it")
            request_stop(folder.path, cancelled_for)
            cancel(job_id)
        time.sleep(POLL_S)


def unanswered(folder: run_folder.RunFolder, job_id: str, slurm: dict) -> bool:
    """Slurm did not answer (slurmctld restarting, or gone while the job's tasks run on): whether
    the following is over, because the run recorded its own end, or because the job's time limit is
    long past with none recorded (then recorded failed, saying so).  Else the run goes on as it says."""
    word = {"job_id": job_id, "state": "UNKNOWN", "reason": "slurmctld did not answer"}
    if status_file.said(folder.path).get("status") in FINAL:
        status_file.record(folder.path, slurm=word)
        return True
    limit = seconds(slurm["job"]["time_limit"])
    if limit is None or time.time() < slurm["submitted_at"] + limit + UNANSWERED_PAST_LIMIT_S:
        return False
    status_file.record(folder.path, RunStatus.FAILED, slurm=word, ended_at=time.time(), error=(
        f"Slurm did not answer for job {job_id}, and its time limit ({slurm['job']['time_limit']}) is past "
        "with no end recorded by the run"))
    return True


def seconds(time_limit: str) -> float | None:
    """An sbatch time limit ([D-]HH:MM:SS, MM:SS, MM) in seconds; None for one not read here."""
    days, _, rest = time_limit.rpartition("-")
    try:
        parts = [int(x) for x in rest.split(":")]
        if days:  # D-HH, D-HH:MM, D-HH:MM:SS
            h, m, sec = (parts + [0, 0])[:3]
        else:  # MM, MM:SS, HH:MM:SS
            h, m, sec = ([0, 0] + parts)[-3:] if len(parts) > 1 else (0, parts[0], 0)
        return ((int(days) if days else 0) * 24 + h) * 3600 + m * 60 + sec
    except ValueError:
        return None


def slurm_ended(job_id: str, state: dict, cancelled_for: str | None = None) -> dict | None:
    """A run's end in Slurm's words when Slurm ended the job (cancelled, its time limit, a deadline,
    preempted), from ``scontrol show job``'s fields; None when it did not say so.  While the job
    completes, JobState says COMPLETING and its Reason says why (TimeLimit)."""
    js = state.get("JobState", "GONE")
    if js == "COMPLETING" and state.get("Reason") == "TimeLimit":
        js = "TIMEOUT"
    if js == "CANCELLED":
        return {"status": RunStatus.STOPPED, "error": cancelled_for or (
            f"Slurm cancelled job {job_id} (scancel, or the cluster's administrator)")}
    if js in ("TIMEOUT", "DEADLINE", "PREEMPTED"):
        return {"status": RunStatus.STOPPED, "error": f"Slurm ended job {job_id}: {js} "
                                                      f"(time limit {state.get('TimeLimit', '?')})"}
    return None


def record_end(folder: run_folder.RunFolder, job_id: str, state: dict, cancelled_for: str | None = None,
               wait_s: float = RECORD_WAIT_S) -> None:
    """The run's end once the job has left (``state``: its last ``job_state``): what the
    supervisors recorded (given ``wait_s`` to record it), unless Slurm ended it (cancelled, time
    limit, a failure before or outside the ranks): then Slurm's reason."""
    js = state.get("JobState", "GONE")
    procs.wait_until(lambda: status_file.said(folder.path).get("status") in FINAL, wait_s, 0.2)
    said = status_file.said(folder.path).get("status")
    asked = stop_request(folder.path)
    slurm = {"job_id": job_id, "state": js, "reason": state.get("Reason"), "exit_code": state.get("ExitCode")}
    ending: dict = {}
    if js == "CANCELLED":
        if said != RunStatus.FAILED:  # a failure is not renamed by the cancel that came after it
            ending = slurm_ended(job_id, state, cancelled_for or (asked or {}).get("error"))
    elif ended := slurm_ended(job_id, state):
        ending = ended
    elif said not in FINAL:  # else the supervisors recorded the end, and Slurm's word adds no other
        ending = {"status": RunStatus.FAILED, "error": (
            f"Slurm job {job_id} ended {js} (reason {state.get('Reason')}, exit code "
            f"{state.get('ExitCode')}) before the run recorded an end"),
            "traceback": _tail(folder.file(f"slurm-{job_id}.out"))}
    # Slurm's word on the job is kept either way; an end only where the state machine allows it.
    if not (ending and status_file.record(folder.path, **ending, slurm=slurm, ended_at=time.time())):
        status_file.record(folder.path, slurm=slurm)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


class OnSlurm(Launcher):
    """A run submitted as a Slurm job, followed from here; on several nodes each node's task is that
    node's part of a run on several (``nodes.OnNodes``), which its supervisor asks."""

    name = "slurm"

    def __init__(self, job: SlurmJob, owner: str | None = None, resume=None, node: nodes.Nodes | None = None):
        super().__init__(owner, resume)
        self.job = job
        self.nodes = nodes.OnNodes(node) if node is not None else Launcher()  # what a node's supervisor asks

    @classmethod
    def owns(cls, info: dict) -> bool:
        return bool(job_of_record(info))

    @classmethod
    def of_record(cls, info: dict) -> OnSlurm:
        return cls(SlurmJob(**info["slurm"]["job"]), node=nodes.Nodes(**info["nodes"]) if info.get("nodes") else None)

    def start(self, folder: run_folder.RunFolder, cfg) -> None:
        submit(folder, cfg, self.job, procs.package_env())

    def start_failure(self, e: BaseException) -> str:
        return str(e)

    def ask_to_stop(self, folder: run_folder.RunFolder, grace_s: float) -> None:
        """Every node's supervisor ends its agent on the request; then Slurm ends the job."""
        request_stop(folder.path)
        cancel(job_of_record(folder.launch_info()))
        procs.wait_until(lambda: folder.status() not in GOING, grace_s + STOP_GRACE_S)

    def describe(self, cfg, info: dict) -> str:
        return (f"{self.job.nodes} node(s) x {cfg.world_size} {info['backend']} rank(s) of Slurm job "
                f"{info['slurm']['job_id']}")

    def ended_elsewhere(self, run_dir: Path) -> dict | None:
        return self.nodes.ended_elsewhere(run_dir)

    def terminated(self, run_dir: Path) -> dict:
        """A node's supervisor got SIGTERM: a Stop asked in the folder (then scancel), else Slurm's
        own (the time limit, scancel, preemption), asked of Slurm from the node."""
        if asked := stop_request(run_dir):
            return {"status": RunStatus.STOPPED, "error": asked.get("error") or "stopped by the user"}
        job_id = job_of_record(run_folder.RunFolder(run_dir).launch_info())
        return slurm_ended(job_id, job_state(job_id) or {}) or {
            "status": RunStatus.STOPPED, "error": f"Slurm ended job {job_id} (its tasks were sent SIGTERM)"}

    def never_started(self, run_dir: Path) -> dict | None:
        return self.nodes.never_started(run_dir)


def job_of_record(info: dict) -> str | None:
    return (info.get("slurm") or {}).get("job_id")


# ---------------------------------------------------------------------------- a node's task
def first_address() -> str:
    """The address of the allocation's first node, where node 0 serves the rendezvous: its NodeAddr
    in Slurm's configuration (a node's name need not resolve; its address is how Slurm reaches it)."""
    def scontrol(*args: str) -> str:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout

    first = scontrol("show", "hostnames", os.environ["SLURM_JOB_NODELIST"]).split()[0]
    fields = dict(w.split("=", 1) for w in scontrol("-o", "show", "node", first).split() if "=" in w)
    return fields.get("NodeAddr") or first


def node_main(run_dir: Path) -> int:
    """One node's task of the job (``commlab.engine.slurm_node``): this node's records, then its
    supervisor in the foreground, owning the node's torchrun agent, so that Slurm's signals reach it.
    The node's place comes from Slurm (SLURM_NNODES, SLURM_NODEID, the allocation's first node's
    address for the rendezvous); on several nodes a run on several nodes, on one an ordinary run on
    loopback."""
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
    place = node or LOOPBACK
    mine = {"command": run_argv(cfg.world_size, folder.path, sys.executable, place, fork=ranks_forkable()),
            "nodes": node.as_dict() if node else None}
    if records == folder.path:
        store.write_json(folder.file("launch.json"), {**folder.launch_info(), **mine})  # read again: submit writes it too
    else:
        records.mkdir(parents=True, exist_ok=True)
        store.write_json(records / "config.json", folder.config_dict())
        status_file.record(records, RunStatus.STARTING, step=None)
        store.write_json(records / "launch.json", {**{k: v for k, v in info.items() if k != "supervisor"},
                                                   **mine, "run_dir": str(folder.path)})
    os.environ.update(worker_env(cfg, dict(os.environ), place))
    os.environ[procs.OWNER_ENV] = str(Path(records).resolve())
    return supervise(Path(records))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return follow(Path(argv[0]))


if __name__ == "__main__":
    raise SystemExit(main())
