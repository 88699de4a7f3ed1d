"""commlab.tune.export: config files that load back identical, snippets that run or name only what exists.

The plain-DDP snippet is pasted into a minimal training script and run under torchrun on two Gloo
ranks (one bucket, where PyTorch's PowerSGD hook works on Gloo).  The Lightning and Accelerate
snippets are compiled, every attribute they name is looked up in the installed package, and the
objects they build are handed a stand-in model to see which hook, wrapper and state they register.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from commlab import cli
from commlab.config import HOOKS, RunConfig
from commlab.hooks import registry
from commlab.tune import export
from commlab.tune.export import ExportRefused, Target

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "powersgd_fp16": RunConfig(hook="powersgd", wrapper="fp16", matrix_approximation_rank=2,
                               start_powerSGD_iter=2, min_compression_rate=1.5, random_seed=7),
    "powersgd_plain": RunConfig(hook="powersgd", matrix_approximation_rank=1, start_powerSGD_iter=3,
                                use_error_feedback=False, warm_start=False),
    "fp16": RunConfig(hook="fp16"),
    "allreduce": RunConfig(hook="allreduce"),
    "noop": RunConfig(hook="noop"),
}


# --------------------------------------------------------------------------- config files
@pytest.mark.parametrize("cfg", [
    RunConfig(),
    RunConfig(hook="batched_powersgd", wrapper="bf16", matrix_approximation_rank=4,
              start_powerSGD_iter=50, min_compression_rate=3.5, use_error_feedback=False,
              orthogonalization_epsilon=1e-8, batch_tensors_with_same_shape=True, world_size=3,
              bucket_cap_mb=0.25, workload="wide", steps=17, lr=1e-4, optimizer="sgd",
              save_grads_at=[1, 5], error_every=4, emulate_bandwidth_gbps=2.5,
              emulate_latency_us=30.0, runs_dir="/tmp/some where"),
])
def test_json_and_toml_load_back_to_the_identical_config(cfg, tmp_path):
    # ... less the runs folder, a path of the exporting machine: the loading one uses its own.
    target = Target()
    here = dataclasses.replace(cfg, runs_dir=RunConfig().runs_dir)
    assert RunConfig.from_json(export.render(cfg, "json", target).text) == here
    assert RunConfig.from_toml(export.render(cfg, "toml", target).text) == here
    for fmt, suffix in (("json", ".json"), ("toml", ".toml")):
        path = tmp_path / f"c{suffix}"
        path.write_text(export.render(cfg, fmt, target).text)
        assert RunConfig.load(path) == here
        assert "runs_dir" not in path.read_text()


@pytest.mark.timeout(900)
def test_powersgd_defaults_are_pytorchs():
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    from commlab.hook_specs import TORCH_POWERSGD_DEFAULTS

    params = inspect.signature(PowerSGDState.__init__).parameters
    assert {k: params[k].default for k in TORCH_POWERSGD_DEFAULTS} == TORCH_POWERSGD_DEFAULTS


def test_every_hook_and_wrapper_named_exists_in_torch():
    import importlib

    from commlab.config import HOOKS, WRAPPERS
    from commlab.hooks import registry

    for hook in HOOKS:
        for wrapper in WRAPPERS:
            for piece in registry.pieces(hook, wrapper, "nccl"):
                # a hook PyTorch has none of is commlab's (test_export_matrix checks commlab.hooks)
                assert piece.module is None or hasattr(importlib.import_module(piece.module), piece.attr)


def test_state_spells_out_every_non_default_and_the_two_tuned_settings():
    from commlab.hook_specs import spec

    cfg = CONFIGS["powersgd_fp16"]
    assert spec("powersgd").state.spelled(cfg) == {
        "matrix_approximation_rank": 2, "start_powerSGD_iter": 2, "min_compression_rate": 1.5,
        "random_seed": 7}
    assert spec("powersgd").state.spelled(RunConfig(hook="powersgd", start_powerSGD_iter=1000)) == {
        "matrix_approximation_rank": 1, "start_powerSGD_iter": 1000}


# --------------------------------------------------------------------------- snippets name what exists
def _snippet_names(text: str) -> None:
    """Every ``alias.attr`` the snippet names exists once its own imports ran."""
    tree = ast.parse(text)
    namespace: dict = {}
    exec(compile(ast.Module([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))],
                            type_ignores=[]), "<imports>", "exec"), namespace)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in namespace:
            assert hasattr(namespace[node.value.id], node.attr), ast.unparse(node)


# --------------------------------------------------------------------------- Lightning
@pytest.mark.timeout(900)  # importing Lightning takes minutes on a loaded machine
def test_lightning_snippet_builds_a_strategy_that_registers_the_hook_on_cuda_only():
    import torch
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import DDPStrategy
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    text = export.render(CONFIGS["powersgd_fp16"], "lightning", Target(nnodes=2, nproc_per_node=4)).text
    comments = " ".join(line[2:] for line in text.splitlines() if line.startswith("# "))
    assert export.LIGHTNING_CUDA_ONLY in comments
    _snippet_names(text)
    tree = ast.parse(text)
    ddp_params = inspect.signature(DistributedDataParallel.__init__).parameters
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        name = ast.unparse(call.func)
        target = {"DDPStrategy": DDPStrategy, "Trainer": Trainer}.get(name)
        if target:
            params = inspect.signature(target.__init__).parameters
            for kw in call.keywords:  # DDPStrategy hands what it does not name on to DDP
                assert kw.arg in params or (target is DDPStrategy and kw.arg in ddp_params), kw.arg
    assert {"ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper"} <= set(
        inspect.signature(DDPStrategy.__init__).parameters)

    # Everything but the Trainer, which wants GPUs: then register on a stand-in DDP model.
    body = [n for n in tree.body if not (isinstance(n, ast.Assign) and n.targets[0].id == "trainer")]
    namespace: dict = {}
    exec(compile(ast.Module(body, type_ignores=[]), "<lightning>", "exec"), namespace)
    strategy = namespace["strategy"]
    registered = []
    for device, expected in (("cpu", 0), ("cuda", 1)):
        model = mock.Mock(spec=DistributedDataParallel)
        model.register_comm_hook.side_effect = lambda state, hook: registered.append((state, hook))
        strategy.model = model
        strategy.parallel_devices = [torch.device(device, 0)]
        strategy._register_ddp_hooks()
        assert len(registered) == expected, device
    state, hook = registered[0]
    assert isinstance(state, powerSGD_hook.PowerSGDState)
    assert (state.matrix_approximation_rank, state.start_powerSGD_iter,
            state.min_compression_rate) == (2, 2, 1.5)
    assert hook.__name__ == "fp16_compress_wrapper_hook"

    # Exported for Gloo, the strategy is commlab's, which registers on CPU as well.
    text = export.render(CONFIGS["powersgd_fp16"], "lightning", Target(backend="gloo")).text
    tree = ast.parse(text)
    body = [n for n in tree.body if not (isinstance(n, ast.Assign) and n.targets[0].id == "trainer")]
    namespace = {}
    exec(compile(ast.Module(body, type_ignores=[]), "<lightning>", "exec"), namespace)
    strategy, registered = namespace["strategy"], []
    model = mock.Mock(spec=DistributedDataParallel)
    model.register_comm_hook.side_effect = lambda state, hook: registered.append((state, hook))
    strategy.model, strategy.parallel_devices = model, [torch.device("cpu", 0)]
    strategy._register_ddp_hooks()
    ((state, hook),) = registered
    assert type(strategy).__name__ == "AnyDeviceDDPStrategy" and isinstance(strategy, DDPStrategy)
    assert state.start_powerSGD_iter == 2 and hook.__name__ == "fp16_compress_wrapper_hook"

    # Its localsgd_subgroup_size is for a PostLocalSGDState still without subgroups, and a count.
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState

    from commlab.hooks.lightning_ddp import AnyDeviceDDPStrategy
    with pytest.raises(ValueError, match="ddp_comm_state must be a PostLocalSGDState with subgroup=None"):
        AnyDeviceDDPStrategy(ddp_comm_state=None, localsgd_subgroup_size=2)
    with pytest.raises(ValueError, match="localsgd_subgroup_size must be a whole number of at least 1"):
        AnyDeviceDDPStrategy(ddp_comm_state=PostLocalSGDState(None, None, 1), localsgd_subgroup_size=0)


# --------------------------------------------------------------------------- Accelerate
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name,hook_name", [
    ("powersgd_fp16", "fp16_compress_wrapper_hook"), ("fp16", "fp16_compress_hook")])
def test_accelerate_snippet_registers_the_hook_wrapper_and_state(name, hook_name):
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    text = export.render(CONFIGS[name], "accelerate", Target()).text
    _snippet_names(text)
    tree = ast.parse(text)
    fields = inspect.signature(DistributedDataParallelKwargs).parameters
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and ast.unparse(n.func) == "DistributedDataParallelKwargs"):
        assert {kw.arg for kw in call.keywords} <= set(fields)
    members = set(DDPCommunicationHookType.__members__)
    assert {"NO", "FP16", "BF16", "POWER_SGD", "BATCHED_POWER_SGD"} <= members
    # Everything but the Accelerator and prepare(), which want a launched job; the prepared model a
    # stand-in.  Accelerate registers the hooks it names; the snippet registers PowerSGD's itself.
    body = [n for n in tree.body if not (isinstance(n, ast.Assign) and ast.unparse(n.value).startswith(
        ("Accelerator(", "accelerator.prepare(")))]
    model = mock.Mock()
    namespace: dict = {"model": model}
    exec(compile(ast.Module(body, type_ignores=[]), "<accelerate>", "exec"), namespace)
    namespace["ddp_kwargs"].register_comm_hook(model)
    (call,) = model.register_comm_hook.call_args_list
    state, hook = call.args or (call.kwargs["state"], call.kwargs["hook"])
    assert hook.__name__ == hook_name
    if CONFIGS[name].hook in ("powersgd", "batched_powersgd"):
        assert isinstance(state, powerSGD_hook.PowerSGDState)
        assert (state.matrix_approximation_rank, state.start_powerSGD_iter,
                state.min_compression_rate) == (2, 2, 1.5)
    else:
        assert state is None


def test_accelerate_says_a_wrapped_allreduce_as_the_compress_hook():
    cfg = RunConfig(hook="allreduce", wrapper="fp16")
    assert export.accelerate_members(cfg) == ("FP16", "NO")
    assert export.accelerate_members(RunConfig(hook="powersgd", wrapper="bf16")) == ("POWER_SGD", "BF16")
    assert export.accelerate_members(RunConfig(hook="topk")) is None


@pytest.mark.parametrize("hook", ["noop", "topk", "quantize_pertensor", "post_localsgd"])
def test_accelerate_registers_a_hook_it_cannot_name_on_the_prepared_model(hook):
    text = export.render(RunConfig(hook=hook), "accelerate", Target()).text
    assert "DDPCommunicationHookType" not in text.split("# Hooks:")[1]  # named in a comment only
    assert f"DDPCommunicationHookType cannot name {registry.hook_name(hook)}" in " ".join(
        ln[2:] for ln in text.splitlines() if ln.startswith("# "))
    prepare = text.index("accelerator.prepare(model, optimizer)")
    register = text.index("model.register_comm_hook(")
    assert prepare < register  # on the prepared model: its DistributedDataParallel


# --------------------------------------------------------------------------- the new hooks' snippets
# Every setting the new hooks read, none at its default, and what each hook's snippet must spell:
# written out here, not read from commlab.hooks.compressors.STATES.
SETTINGS = dict(compress_ratio=0.125, qsgd_levels=5, sparsify_threshold=0.25, compressor_momentum=0.75,
                dgc_clip_norm=2.5, terngrad_clip_sigmas=1.5, sparse_error_feedback=False,
                quantization_bucket_size=96, start_localSGD_iter=9, post_local_gradient_allreduce=False, localsgd_subgroup_size=2,
                averager_period=3, averager_warmup_steps=9, seed=11, world_size=4)
SPELLED = {
    "topk": ["TopKState(", "compress_ratio=0.125", "use_error_feedback=False"],
    "randomk": ["RandomKState(", "compress_ratio=0.125"],
    "qsgd": ["QSGDState(", "levels=5"],
    "terngrad": ["TernGradState(", "clip_sigmas=1.5"],
    "signsgd": ["SignSGDState("],
    "ef_signsgd": ["EFSignSGDState("],
    "onebit": ["OneBitState("],
    "threshold": ["ThresholdState(", "threshold=0.25", "use_error_feedback=False"],
    "dgc": ["DGCState(", "compress_ratio=0.125", "momentum=0.75", "clip_norm=2.5"],
    "natural": ["NaturalState("],
    "signum": ["SignumState(", "momentum=0.75"],
}
NEW_HOOKS = [*SPELLED, "quantize_pertensor", "quantize_perchannel", "post_localsgd"]
# Hyperparameters some hook reads: no other hook's snippet may name them.
ONLY = {"compress_ratio=": ("topk", "randomk", "dgc"), "levels=": ("qsgd",), "clip_norm=": ("dgc",),
        "clip_sigmas=": ("terngrad",),
        "bucket_size=": ("quantize_perchannel",), "start_localSGD_iter=": ("post_localsgd",)}


@pytest.mark.parametrize("hook", NEW_HOOKS)
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_each_new_hooks_snippets_build_its_state_with_the_runs_settings(hook, backend):
    cfg = RunConfig(hook=hook, **SETTINGS)
    texts = {fmt: export.render(cfg, fmt, Target(backend=backend, nproc_per_node=2, nnodes=2)).text
             for fmt in ("ddp", "lightning", "accelerate")}
    for fmt, text in texts.items():
        compile(text, f"<{fmt}>", "exec")
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        for word, hooks in ONLY.items():
            assert (word in code) == (hook in hooks), (fmt, word)
        if hook in SPELLED:
            assert f"state = commlab_hooks.{SPELLED[hook][0]}\n    process_group=None," in code
            assert all(w in code for w in SPELLED[hook][1:]) and "random_seed=11" in code, (fmt, code)
            assert f"commlab_hooks.{hook}_hook" in code and '"comm_hook_state"' in text
            assert "PyTorch has no" in text and "pip install commlab" in text
        elif hook.startswith("quantize"):
            assert "state =" not in code and f"commlab_hooks.quantization_{hook[9:]}_hook" in code
            assert "keeps no state" in text
        if hook == "quantize_perchannel":  # its own argument, bound in a function DDP can log
            assert "def quantization_perchannel_hook(process_group, bucket):" in code
            assert ("\n    return commlab_hooks.quantization_perchannel_hook(process_group, bucket, "
                    "bucket_size=96)\n") in code
    ddp, lightning, accelerate = texts.values()
    if hook in SPELLED or hook.startswith("quantize"):
        state = "None" if hook.startswith("quantize") else "state"
        assert f"ddp_model.register_comm_hook({state}, " in ddp
        assert f"\nmodel.register_comm_hook({state}, " in accelerate
        assert ("ddp_comm_state=state" in lightning) == (state == "state")
    if hook == "post_localsgd":
        for text, model in ((ddp, "ddp_model"), (accelerate, "model")):
            assert "subgroup, _ = dist.new_subgroups(group_size=2)\n" in text
            assert ("PostLocalSGDState(\n    process_group=None,\n    subgroup=subgroup,\n"
                    "    start_localSGD_iter=9,\n    post_local_gradient_allreduce=False,\n)") in text
            assert "averagers.PeriodicModelAverager(\n    period=3,\n    warmup_steps=9,\n)" in text
            assert f"#   averager.average_parameters({model}.parameters())\n" in text
            assert f"{model}.register_comm_hook(state, post_localSGD.post_localSGD_hook)" in text
            assert '"localsgd_steps": (state.iter, averager.step)' in text
        assert text.index("accelerator.prepare(") < text.index("dist.new_subgroups")  # group first
        # Lightning: no group yet when the snippet runs; the strategy makes the subgroups and
        # Lightning's own averager steps (its warm-up is start_localSGD_iter, equal here).
        assert "subgroup=None," in lightning and "new_subgroups(" not in lightning.split("# Hooks:")[1]
        assert "model_averaging_period=3,\n    localsgd_subgroup_size=2,\n" in lightning
        assert "strategy = AnyDeviceDDPStrategy(" in lightning and "averagers." not in lightning


@pytest.mark.parametrize("hook", list(SPELLED))
def test_a_compressor_snippets_state_is_the_state_the_lab_builds(hook):
    from commlab.hooks import registry

    cfg = RunConfig(hook=hook, **SETTINGS)
    tree = ast.parse(export.render(cfg, "ddp", Target(backend="gloo")).text)
    body = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
            or (isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "state")]
    namespace: dict = {}
    exec(compile(ast.Module(body, type_ignores=[]), "<ddp>", "exec"), namespace)
    lab = registry.choose(cfg, "gloo").state

    def settings_of(state):
        return {k: v for k, v in vars(state).items() if isinstance(v, (bool, int, float, type(None)))}

    assert type(namespace["state"]) is type(lab) and settings_of(namespace["state"]) == settings_of(lab)


@pytest.mark.parametrize("fmt", ["torchrun", "slurm"])
def test_launch_lines_of_the_new_hooks_name_the_hook_and_what_it_needs(fmt):
    for hook in NEW_HOOKS:
        text = export.render(RunConfig(hook=hook, **SETTINGS), fmt, Target(nproc_per_node=2)).text
        assert f"commlab export: {hook}" in text and "torchrun" in text
        assert ("pip install commlab" in text) == (hook != "post_localsgd")  # PyTorch's hook there


# --------------------------------------------------------------------------- every refusal
def test_lightning_refuses_an_averager_warmup_it_cannot_carry_and_the_other_formats_carry_it():
    cfg = RunConfig(hook="post_localsgd", start_localSGD_iter=5, averager_warmup_steps=9)
    with pytest.raises(ExportRefused, match=r"Lightning cannot express averager_warmup_steps=9 with "
                                            r"start_localSGD_iter=5: .*_enable_model_averaging"):
        export.render(cfg, "lightning", Target())
    for fmt in ("ddp", "accelerate", "trainer"):
        assert "warmup_steps=9," in export.render(cfg, fmt, Target()).text


def test_post_local_sgd_is_refused_where_its_subgroups_cannot_cut_the_targets_ranks():
    cfg = RunConfig(hook="post_localsgd", localsgd_subgroup_size=2)
    for fmt in ("ddp", "lightning", "accelerate", "trainer", "torchrun", "slurm"):
        with pytest.raises(ExportRefused, match=r"localsgd_subgroup_size=2 does not divide the "
                                                r"target's 3 ranks \(1 node\(s\) × 3 process"):
            export.render(cfg, fmt, Target(nproc_per_node=3))
        export.render(cfg, fmt, Target(nproc_per_node=3, nnodes=2))  # 6 ranks: 3 subgroups
    for fmt in ("json", "toml"):  # a config file names no target
        export.render(cfg, fmt, Target(nproc_per_node=3))


# --------------------------------------------------------------------------- launch lines
def _args_of(script: str, command: str) -> list[list[str]]:
    """Run the script in bash with ``command`` replaced by a function that prints its arguments."""
    fake = f'{command}() {{ printf "%s\\0" "$@"; printf "\\n"; }}\n'
    body = script.replace("srun torchrun", "torchrun")
    proc = subprocess.run(["bash", "-c", fake + body], capture_output=True, text=True,
                          env={**os.environ, "HEAD_NODE": "node0", "SLURM_NNODES": "3",
                               "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "x"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split("\0")[:-1] for line in proc.stdout.splitlines() if line]


@pytest.mark.slow
def test_torchrun_lines_quote_user_input_and_cover_one_and_several_nodes():
    target = Target(nproc_per_node=4, script="my train.py", script_args=["--note", "a; rm -rf ~"])
    text = export.render(CONFIGS["powersgd_fp16"], "torchrun", target).text
    one, several = _args_of(text, "torchrun")
    assert one == ["--standalone", "--nnodes", "1", "--nproc-per-node", "4", "my train.py",
                   "--note", "a; rm -rf ~"]
    assert several == ["--nnodes", "2", "--nproc-per-node", "4", "--rdzv-id", "commlab",
                       "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29500", "my train.py",
                       "--note", "a; rm -rf ~"]
    given = export.render(CONFIGS["fp16"], "torchrun",
                          Target(nnodes=3, rdzv_endpoint="10.1.2.3:29400")).text
    assert "--rdzv-endpoint 10.1.2.3:29400" in given and "--nnodes 3" in given


@pytest.mark.slow
def test_slurm_script_is_valid_bash_with_one_torchrun_per_node(tmp_path):
    target = Target(nnodes=3, nproc_per_node=8, job_name="psgd-r2", partition="gpu",
                    script_args=["--out", "$HOME/x"])
    text = export.render(CONFIGS["powersgd_fp16"], "slurm", target).text
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --gpus-per-node=8\n" in text
    assert "#SBATCH --partition=gpu\n" in text and "#SBATCH --job-name=psgd-r2\n" in text
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    fake_scontrol = 'scontrol() { echo node7; }\n'
    (args,) = _args_of(fake_scontrol + text, "torchrun")
    assert args == ["--nnodes", "3", "--nproc-per-node", "8", "--rdzv-id", "42", "--rdzv-backend",
                    "c10d", "--rdzv-endpoint", "node7:29500", "train.py", "--out", "$HOME/x"]
    with pytest.raises(ValueError, match="job_name"):
        export.render(CONFIGS["fp16"], "slurm", Target(job_name="x\n#SBATCH --evil"))


def test_notes_warn_where_pytorchs_hook_fails_and_about_emulation():
    cfg = RunConfig(hook="powersgd", emulate_bandwidth_gbps=1.0, emulate_latency_us=10.0)
    gloo = export.render(cfg, "ddp", Target(backend="gloo"))
    assert any("Gloo" in n or "gloo" in n for n in gloo.notes)
    assert any("emulated 1 Gb/s, 10 µs" in n for n in gloo.notes)
    assert "emulated 1 Gb/s, 10 µs" in gloo.text  # the snippet says it too, as a comment
    assert not export.render(RunConfig(hook="powersgd"), "ddp", Target(backend="nccl")).notes


# --------------------------------------------------------------------------- CLI
def _cli(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_exports_from_a_run_folder_a_file_and_run_options(tmp_path, capsys):
    cfg = CONFIGS["powersgd_fp16"]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(cfg.to_json())
    rc, out, _ = _cli(capsys, "export", str(run_dir), "--format", "json")
    assert rc == 0 and RunConfig.from_json(out) == cfg
    rc, out, _ = _cli(capsys, "export", str(run_dir), "--format", "toml",
                      "--matrix-approximation-rank", "4")
    assert rc == 0 and RunConfig.from_toml(out) == cfg.with_overrides(matrix_approximation_rank=4)

    settings = tmp_path / "s.toml"
    settings.write_text(cfg.to_toml())
    rc, out, _ = _cli(capsys, "export", "--config", str(settings), "--format", "ddp", "--json")
    payload = json.loads(out.splitlines()[-1])
    assert rc == 0 and payload["text"] == export.render(cfg, "ddp", Target()).text

    rc, out, _ = _cli(capsys, "export", "--hook", "powersgd", "--matrix-approximation-rank", "2",
                      "--start-powersgd-iter", "10", "--format", "slurm", "--nnodes", "2",
                      "--output", str(tmp_path / "job.sbatch"))
    assert rc == 0 and "--rdzv-backend c10d" in (tmp_path / "job.sbatch").read_text()


def test_cli_exports_a_run_whose_workload_and_runs_folder_are_not_of_this_machine(tmp_path, capsys):
    cfg = RunConfig(hook="powersgd", workload="not_installed_here.model:make", world_size=8,
                    backend="nccl", runs_dir="/home/someone/runs")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    rc, out, _ = _cli(capsys, "export", str(run_dir), "--format", "ddp")
    assert rc == 0 and "commlab_hooks" not in out  # for NCCL, PyTorch's hook
    rc, out, _ = _cli(capsys, "export", str(run_dir), "--format", "json")
    assert rc == 0 and "/home/someone" not in out and json.loads(out)["workload"] == cfg.workload
    assert "not_installed_here" not in sys.modules


def test_cli_exports_lightning_for_the_backend_that_runs_here_and_names_the_flag(capsys, monkeypatch):
    """Lightning's Trainer wants the accelerator the machine has: without --target-backend a
    Lightning export is for the run's backend ("auto": Gloo without a GPU for every rank); every
    other format stays production's NCCL."""
    from commlab import devices

    def lightning(*flags):
        rc, out, err = _cli(capsys, "export", "--hook", "powersgd", "--format", "lightning", *flags)
        assert rc == 0, err
        return out

    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    text = lightning()
    assert "Trainer(accelerator='cpu', devices=2, num_nodes=1, strategy=strategy, max_steps=200)" in text
    assert "--target-backend nccl" in text and "AnyDeviceDDPStrategy(" in text
    assert "trainer.fit(Model(), stand_in_data())" in text and "#   python train.py\n" in text
    assert "#   torchrun --standalone --nnodes 1 --nproc-per-node 2 train.py\n" in text
    assert "accelerator='gpu'" in lightning("--target-backend", "nccl").split("# Hooks:")[1]
    assert "accelerator='cpu'" in lightning("--backend", "gloo", "--world-size", "2").split("# Hooks:")[1]
    rc, out, _ = _cli(capsys, "export", "--hook", "powersgd", "--format", "ddp")
    assert rc == 0 and "works on nccl" in out  # PyTorch's hook: the other formats' default is NCCL

    monkeypatch.setattr(devices, "gpu_count", lambda: 8)
    text = lightning()
    assert "accelerator='gpu'" in text.split("# Hooks:")[1] and "--target-backend gloo" in text
    assert "accelerator='cpu'" in lightning("--backend", "gloo").split("# Hooks:")[1]


def test_cli_refuses_what_a_format_cannot_express(tmp_path, capsys):
    rc, out, err = _cli(capsys, "export", "--hook", "post_localsgd", "--averager-warmup-steps", "5",
                        "--format", "lightning")
    assert rc == 2 and "Lightning cannot express averager_warmup_steps=5" in err and not out
    rc, out, _ = _cli(capsys, "export", "--hook", "post_localsgd", "--localsgd-subgroup-size", "2",
                      "--nproc-per-node", "3", "--format", "slurm", "--json")
    assert rc == 2 and "does not divide the target's 3 ranks" in json.loads(out)["error"]
    rc, out, _ = _cli(capsys, "export", "--hook", "nope", "--format", "ddp", "--json")
    assert rc == 2 and "hook" in json.loads(out)["errors"]
    rc, _, err = _cli(capsys, "export", str(tmp_path), "--format", "ddp")
    assert rc == 2 and "not a commlab run folder" in err


# --------------------------------------------------------------------------- the page
@pytest.mark.timeout(900)
def test_export_page_works_with_no_runs(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600).run()
    at.switch_page("pages/export.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Export"
    texts = [c.value for c in at.code]
    assert len(texts) == len(export.FORMATS)
    default = RunConfig.from_dict({"hook": "powersgd", "wrapper": "none", "world_size": 2})
    assert RunConfig.from_json(texts[0]) == default
    hook = next(s for s in at.selectbox if s.label == "Hook")
    assert set(hook.options) == set(HOOKS)  # the picker offers every hook, the new ones too
    for name, state in (("dgc", "DGCState("), ("quantize_perchannel", "bucket_size=512"),
                        ("post_localsgd", "PeriodicModelAverager(")):
        next(s for s in at.selectbox if s.label == "Hook").set_value(name).run()
        assert not at.exception and not at.error, name
        assert state in at.code[list(export.FORMATS).index("ddp")].value, name
    # A cell the target cannot carry: its tab says why, the others still export.
    next(n for n in at.number_input if n.key == "export_averager_warmup_steps").set_value(5).run()
    assert not at.exception
    assert any("Lightning cannot express averager_warmup_steps=5" in e.value for e in at.error)
    assert len(at.code) == len(export.FORMATS) - 1


@pytest.mark.timeout(900)
def test_export_page_names_every_bad_field_and_exports_nothing_until_fixed(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600).run()
    at.switch_page("pages/export.py").run()
    def inputs():  # the settings' widgets by field name (keyed export_<name>), the target's by label
        return {n.key.removeprefix("export_") if (n.key or "").startswith("export_") else n.label: n
                for n in at.number_input}

    bad = ("world_size", "matrix_approximation_rank", "Nodes", "Threads per process (OMP_NUM_THREADS)")
    for name in bad:
        inputs()[name].set_value(0)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert all(inputs()[name].value == 0 for name in bad)  # what was typed, not a clamped value
    errors = " ".join(e.value for e in at.error)
    for name in ("world_size", "matrix_approximation_rank", "nnodes", "threads_per_process"):
        assert f"**{name}**" in errors, (name, errors)
    assert "Nothing to export" in errors
    assert not at.code and not at.get("download_button")  # no text, no download with bad values
    for name in bad:
        inputs()[name].set_value(2 if name == "world_size" else 1)
    at.run()
    assert json.loads(at.code[0].value)["world_size"] == 2 and at.get("download_button")


def test_export_page_exports_the_run_the_picker_remembers(runs_dir, powersgd_run, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(runs_dir))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["watch"] = str(powersgd_run.path)  # chosen on another page
    at.run()
    at.switch_page("pages/export.py").run()
    assert not at.exception, [e.value for e in at.exception]
    exported = json.loads(at.code[0].value)
    stored = powersgd_run.config_dict()
    assert {k: exported[k] for k in ("hook", "matrix_approximation_rank", "start_powerSGD_iter")} == \
           {k: stored[k] for k in ("hook", "matrix_approximation_rank", "start_powerSGD_iter")}
    assert any(powersgd_run.id in c.value for c in at.caption)
