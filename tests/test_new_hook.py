"""Adding a hook is one module and one row: a toy hook, written into a copy of the project as a
module of commlab.hooks and a row of the hook table and nothing else, appears in the hook table's
command, the settings (CLI and Launch form), the sweep's axes, the exports, the what-if and the
commlab.hooks library, and trains in a real 2-rank run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a copy of the project, its CLI and a real run

TOY_MODULE = '''"""A toy hook: an averaging allreduce whose state keeps a number of levels (for the test of a new hook)."""
import torch
import torch.distributed as dist

from commlab.hooks.groups import group_of


class ToyState:
    def __init__(self, process_group, levels):
        self.process_group, self.levels = process_group, levels


def toy_hook(state: ToyState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = group_of(state.process_group)
    tensor = bucket.buffer().div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda f: f.value()[0])
'''
# The row, written into the table's tuple (after its last row) as a person would add it.
TOY_ROW = '''    HookSpec("toy", COMPRESSOR, "toy_hook", None, f"{OURS}.toy",
             state=Build("ToyState", {"levels": "qsgd_levels"}), exports=("ToyState",)),
'''
END_OF_TABLE = "\n)}\n\nWRAPPER_SPECS"
CHECK = '''
import json, sys
from commlab.config import RunConfig, settings
from commlab.hook_specs import spec
from commlab.tune import export, sweep, whatif
from commlab.ui import form
import commlab.hooks as library

cfg = RunConfig(hook="toy", qsgd_levels=15)
assert not cfg.errors(), cfg.errors()
out = {
    "axes": [s.name for s in sweep.hook_axes("toy")],
    "form": [s.name for s in form.form_settings("compressors", {"hook": "toy"})],
    "exports": {fmt: export.render(cfg, fmt, export.Target(backend="gloo")).text
                for fmt in ("ddp", "lightning", "accelerate", "torchrun", "slurm")},
    "traffic": list(whatif.traffic(cfg.to_dict())),
    "library": library.toy_hook.__name__,
    "label": cfg.label(),
}
print(json.dumps(out))
'''


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "commlab"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "test-artifacts", "__pycache__", "*.egg-info", "build", ".whl"))
    (dest / "commlab" / "hooks" / "toy.py").write_text(TOY_MODULE)
    table = dest / "commlab" / "hook_specs.py"
    text = table.read_text()
    assert text.count(END_OF_TABLE) == 1
    table.write_text(text.replace(END_OF_TABLE, "\n" + TOY_ROW.rstrip("\n") + END_OF_TABLE))
    return dest


def _run(copy: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # The copy's commlab, not the installed one: it comes first on the path.
    env = {**os.environ, "PYTHONPATH": str(copy), "COMMLAB_RUNS_DIR": str(copy / "runs")}
    return subprocess.run([sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(900)
def test_a_toy_hook_is_one_module_and_one_row(tmp_path):
    copy = _copy(tmp_path)
    done = _run(copy, "-c", CHECK)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["axes"] == ["qsgd_levels", "wrapper"] and out["form"] == ["qsgd_levels"]
    for fmt, text in out["exports"].items():
        if fmt in ("ddp", "lightning", "accelerate"):
            assert "commlab_hooks.toy_hook" in text and "ToyState(" in text and "levels=15" in text, text
    assert out["traffic"] == ["all_reduce", 0, 1] and out["library"] == "toy_hook"
    assert out["label"] == "toy qsgd_levels=15"

    hooks = _run(copy, "-m", "commlab", "hooks", "--backend", "gloo")
    assert hooks.returncode == 0 and "toy_hook" in hooks.stdout, hooks.stdout + hooks.stderr
    help_text = _run(copy, "-m", "commlab", "run", "--help").stdout
    assert "toy" in help_text

    run = _run(copy, "-m", "commlab", "run", "--hook", "toy", "--workload", "mlp", "--steps", "4",
               "--world-size", "2", "--json")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["status"] == "finished" and result["hook_impl"] == "commlab", result
