"""RunConfig: validation messages, unknown keys, JSON/TOML round trips, CLI exit code 2."""
import json
import subprocess
import sys

import pytest

from commlab.config import HOOKS, ConfigError, RunConfig


def errors_of(**kw):
    return RunConfig(**kw).errors(gpu_count=0)


def test_defaults_are_valid():
    assert errors_of() == {}


@pytest.mark.parametrize("kw, field, words", [
    (dict(matrix_approximation_rank=0), "matrix_approximation_rank", "at least 1"),
    (dict(hook="powersgd", start_powerSGD_iter=1), "start_powerSGD_iter", "rebuilds its buckets"),
    (dict(min_compression_rate=0), "min_compression_rate", "above 0"),
    (dict(min_compression_rate=-1.5), "min_compression_rate", "above 0"),
    (dict(world_size=0), "world_size", "at least 1"),
    (dict(backend="nccl", world_size=2), "world_size", "GPUs"),
    (dict(hook="ring"), "hook", "valid hooks are: allreduce, fp16, bf16, powersgd, batched_powersgd, noop"),
    (dict(wrapper="int8"), "wrapper", "valid wrappers are: none, fp16, bf16"),
    (dict(hook="noop", wrapper="fp16"), "wrapper", "cannot wrap noop"),
    (dict(steps=0), "steps", "at least 1"),
    (dict(lr=float("nan")), "lr", "finite"),
    (dict(lr=0.0), "lr", "above 0"),
    (dict(lr=float("inf")), "lr", "finite"),
    (dict(bucket_cap_mb=0), "bucket_cap_mb", "above 0"),
    # A user's module is run only by the workload probe, in a child (tests/test_inputs.py): here
    # only its spelling is checked.
    (dict(workload="my model:make"), "workload", "must be Python names"),
    (dict(workload="resnet"), "workload", "charlm, mlp, cnn, wide"),
    (dict(instrument=False, emulate_bandwidth_gbps=1.0), "emulate_bandwidth_gbps", "needs instrument on"),
    (dict(instrument=False, error_every=5), "error_every", "needs instrument on"),
])
def test_refusals_name_the_field_and_what_is_allowed(kw, field, words):
    errs = errors_of(**kw)
    assert field in errs, errs
    assert words in errs[field]


def test_start_iter_below_two_allowed_when_error_feedback_and_warm_start_are_off():
    assert errors_of(hook="powersgd", start_powerSGD_iter=0, use_error_feedback=False,
                     warm_start=False) == {}


def test_check_raises_with_every_error():
    with pytest.raises(ConfigError) as e:
        RunConfig(steps=0, lr=-1).check(gpu_count=0)
    assert set(e.value.errors) == {"steps", "lr"}


def test_unknown_keys_are_refused():
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"hook": "allreduce", "learning_rate": 0.1})
    assert "learning_rate" in e.value.errors
    assert "valid settings are" in e.value.errors["learning_rate"]


def test_types_are_checked():
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict({"steps": "many", "use_error_feedback": "maybe"})
    assert set(e.value.errors) == {"steps", "use_error_feedback"}


@pytest.mark.parametrize("fmt", ["json", "toml"])
def test_round_trip(tmp_path, fmt):
    cfg = RunConfig(hook="powersgd", wrapper="bf16", matrix_approximation_rank=4,
                    start_powerSGD_iter=7, min_compression_rate=1.5, use_error_feedback=False,
                    save_grads_at=[3, 1], runs_dir=str(tmp_path))
    path = cfg.save(tmp_path / f"c.{fmt}")
    assert RunConfig.load(path) == cfg


def test_parse_errors_say_where(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hook": "allreduce",\n "steps": }')
    with pytest.raises(ConfigError) as e:
        RunConfig.load(bad)
    assert "line 2" in e.value.errors["file"]
    badt = tmp_path / "bad.toml"
    badt.write_text('hook = "allreduce"\nsteps = = 3\n')
    with pytest.raises(ConfigError) as e:
        RunConfig.load(badt)
    assert "line 2" in e.value.errors["file"]


def test_runs_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    assert RunConfig().runs_dir == str(tmp_path)


def test_every_hook_name_is_accepted():
    for hook in HOOKS:
        assert "hook" not in errors_of(hook=hook)


@pytest.mark.slow
def test_cli_refuses_bad_input_with_exit_code_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "commlab", "run", "--matrix-approximation-rank", "0",
                          "--hook", "powersgd", "--runs-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    payload = json.loads(out.stdout.strip().splitlines()[-1])
    assert "matrix_approximation_rank" in payload["errors"]
    assert not any(tmp_path.iterdir()), "nothing may be created for refused settings"


def test_a_recorded_config_reads_a_setting_added_since_as_what_the_run_did(tmp_path):
    """A TernGrad run recorded before terngrad_clip_sigmas existed ran unclipped: read back, exported
    and resumed, it stays unclipped; a config a person writes gets today's default."""
    from commlab.engine.run_folder import RunFolder

    old = RunConfig(hook="terngrad").to_dict()
    del old["terngrad_clip_sigmas"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert RunFolder(tmp_path).config().terngrad_clip_sigmas == 0.0
    assert RunConfig.from_dict(old).terngrad_clip_sigmas == 2.5
    assert RunConfig.recorded({**old, "terngrad_clip_sigmas": 1.5}).terngrad_clip_sigmas == 1.5
