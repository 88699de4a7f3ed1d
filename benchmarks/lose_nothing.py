"""The faults of "resume and sweeps that lose nothing", each made for real and timed from the fault to
the final word (a refusal's exit, a run's final status), as a table:

    python benchmarks/lose_nothing.py [--keep DIR]

Two short 2-rank ``mlp`` runs (PowerSGD and allreduce) are made first; each resume attack tampers
with a copy of one, as tests/test_lose_nothing.py does.  The full-disk case mounts a small tmpfs in
a user namespace of its own (``unshare -Urm``) and is left out where there is none.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from commlab.api import RunConfig, run  # noqa: E402
from commlab.engine.launch import Run  # noqa: E402
from commlab.tune import sweep as sw  # noqa: E402

ROWS: list[tuple[str, str, float]] = []


def row(attack: str, outcome: str, seconds: float) -> None:
    ROWS.append((attack, outcome, seconds))
    print(f"{attack:<44} {seconds:7.1f} s  {outcome}", flush=True)


def commlab(*argv: str, timeout: float = 600) -> tuple[int, str, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "commlab", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - t0


def resume_attacks(work: Path) -> None:
    base = dict(workload="mlp", steps=6, world_size=2, runs_dir=str(work / "runs"), eval_every=0)
    psgd = run(RunConfig(hook="powersgd", start_powerSGD_iter=2, **base), timeout=600)
    plain = run(RunConfig(**base), timeout=600)

    def tampered(source: Run, name: str, change) -> Path:
        dest = work / "attacks" / name
        shutil.copytree(source.path, dest)
        change(dest)
        return dest

    def retag(**changes):
        def change(folder: Path):
            cfg = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(json.dumps({**cfg, **changes}))
        return change

    def truncate(folder: Path):
        f = folder / "checkpoint" / "rank0.pt"
        f.write_bytes(f.read_bytes()[:1000])

    def swap(folder: Path):
        a, b = folder / "checkpoint" / "rank0.pt", folder / "checkpoint" / "rank1.pt"
        a.rename(folder / "x"), b.rename(a), (folder / "x").rename(b)

    attacks = [("truncated rank0.pt", psgd, truncate), ("rank0.pt and rank1.pt swapped", psgd, swap),
               ("another model's checkpoint (cnn on mlp)", psgd, retag(workload="cnn")),
               ("another world size (3 on 2)", psgd, retag(world_size=3)),
               ("PowerSGD checkpoint resumed as allreduce", psgd, retag(hook="allreduce")),
               ("allreduce checkpoint resumed as PowerSGD", plain, retag(hook="powersgd")),
               ("damaged checkpoint.json", psgd,
                lambda f: (f / "checkpoint.json").write_text('{"step": "x"}'))]
    for i, (what, source, change) in enumerate(attacks):
        folder = tampered(source, f"a{i}", change)
        rc, out, secs = commlab("run", "--resume", str(folder), "--runs-dir", str(work / "attacks"), "--json")
        said = json.loads(out.strip().splitlines()[-1]).get("errors", {}) if rc == 2 else {}
        row(what, f"exit {rc}: {next(iter(said.values()), out[-200:])[:150]}", secs)


def sweep_killed(work: Path) -> None:
    runs = work / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "commlab", "sweep", "--workload", "mlp", "--steps",
                             "100000", "--matrix-approximation-rank", "1", "--no-baseline", "--repeats",
                             "1", "--runs-dir", str(runs)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    while True:
        going = [Run(p) for p in runs.glob("2*") if (p / "config.json").exists()]
        if going and going[0].metrics_records():
            break
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    status = going[0].wait(120)
    row("kill -9 of a running sweep", f"its run {status}: {going[0].status_record().get('error')}",
        time.monotonic() - t0)
    sweep = sw.list_sweeps(runs)[0]
    t0 = time.monotonic()
    resumed = subprocess.Popen([sys.executable, "-m", "commlab", "sweep", "--resume", sweep.id, "--runs-dir",
                                str(runs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    while not [r for r in sweep.runs() if r.path != going[0].path and r.is_running()]:
        time.sleep(0.2)
    at_once = sum(Run(p).is_running() for p in runs.glob("2*") if (p / "config.json").exists())
    row("--resume of the killed sweep", f"{at_once} run going (the killed one ended first)",
        time.monotonic() - t0)
    sweep.request_stop()
    resumed.wait(120)


def sweeps_at_once(work: Path) -> None:
    at = time.time() + 20
    script = textwrap.dedent(f"""
        import time
        from commlab.config import ConfigError, RunConfig
        from commlab.tune import sweep as sw
        spec = sw.SweepSpec(base=RunConfig(workload="mlp", runs_dir={str(work / 'race')!r}), repeats=1)
        time.sleep(max(0.0, {at} - time.time()))
        try:
            sw.create(spec); print("created", flush=True)
        except ConfigError:
            print("refused", flush=True)
        time.sleep(4)""")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(3)]
    said = sorted(p.communicate(timeout=300)[0].strip() for p in procs)
    row("three sweeps created at one instant", f"{said.count('created')} created, {said.count('refused')} "
        f"refused; {len(sw.list_sweeps(work / 'race'))} sweep folder", max(0.0, time.time() - at - 4))


def workload_check_daemon(work: Path) -> None:
    import psutil

    from commlab.engine import workload_probe

    pid_file = work / "daemon.pid"
    os.environ["COMMLAB_TEST_PID_FILE"] = str(pid_file)
    t0 = time.monotonic()
    msg = workload_probe.error(RunConfig(workload="tests.misbehaving_workloads:forks_a_daemon"))
    secs = time.monotonic() - t0
    pid = int(pid_file.read_text())
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    row("a setsid child forked by make() in the check", f"check said {msg!r}; child alive after: {alive}", secs)


def refusals(work: Path) -> None:
    for what, argv in [("--trace-steps -1", ["--trace-steps=-1"]),
                       ("--trace-steps 1,99999999999999999999999", ["--trace-steps", "1,99999999999999999999999"]),
                       ("--trace-steps 1,5 --no-instrument", ["--trace-steps", "1,5", "--no-instrument"])]:
        rc, out, secs = commlab("run", *argv, "--runs-dir", str(work / "refused"), "--json")
        said = json.loads(out.strip().splitlines()[-1]).get("errors", {})
        row(what, f"exit {rc}: {said.get('trace_steps', out[-150:])[:120]}", secs)


def full_disk(work: Path) -> None:
    unshare = shutil.which("unshare")
    if not unshare or subprocess.run([unshare, "-Urm", "true"], capture_output=True).returncode:
        row("full disk while the checkpoint is written", "left out: no user namespaces here", 0.0)
        return
    script = textwrap.dedent("""
        import json, os, time
        from pathlib import Path
        from commlab.api import RunConfig, launch
        from commlab.engine import store
        disk = Path(os.environ["DISK"]); store.MIN_FREE_BYTES = 0
        r = launch(RunConfig(workload="wide", steps=400, world_size=2, runs_dir=str(disk / "runs"),
                             stall_timeout_s=600, eval_every=0))
        while not store.read_jsonl(r.file("metrics.jsonl")) and r.is_running():
            time.sleep(0.1)
        with open(disk / "filler", "wb") as f:
            st = os.statvfs(disk); f.write(b"x" * max(0, st.f_bavail * st.f_frsize - 3 * 2**20))
        r.wait(600)
        rec = r.status_record()
        last = r.file("metrics.jsonl").stat().st_mtime
        left = [p.name for p in r.file("checkpoint").iterdir()] if r.file("checkpoint").exists() else []
        print(json.dumps({"rec": rec, "after_last_step": rec["ended_at"] - last, "left": left}))""")
    body = (f"mkdir -p /tmp/commlab-disk && mount -t tmpfs -o size=60m none /tmp/commlab-disk && "
            f"DISK=/tmp/commlab-disk {sys.executable} -c \"$0\"")
    out = subprocess.run([unshare, "-Urm", "sh", "-c", body, script], capture_output=True, text=True,
                         timeout=900, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    got = json.loads(out.stdout.strip().splitlines()[-1])
    row("full disk while the checkpoint is written",
        f"{got['rec']['status']}: {got['rec']['error']}; left in checkpoint/: {got['left']}",
        got["after_last_step"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", help="a folder for the runs (default: a temporary one, removed)")
    args = p.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="commlab-lose-nothing-"))
    try:
        for part in (resume_attacks, sweep_killed, sweeps_at_once, workload_check_daemon, refusals,
                     full_disk):
            part(work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n| attack | after | seconds from the fault |\n|---|---|---|")
    for attack, outcome, secs in ROWS:
        print(f"| {attack} | {outcome} | {secs:.1f} |")


if __name__ == "__main__":
    main()
