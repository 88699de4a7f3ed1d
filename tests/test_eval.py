"""Held-out evaluation (fast tier): the held-out sets never overlap training data, the evaluation's
figures, the user-workload contract's optional third item, the run folder's evals.jsonl, and the
checks a resumed run meets before anything starts."""
from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

from commlab import workloads
from commlab.config import ConfigError, RunConfig
from commlab.engine import checkpoint, run_folder, store
from commlab.hook_specs import SPECS


def _rows(t: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in t.reshape(t.shape[0], -1)}


def test_charlm_holds_out_other_standard_library_files():
    train, rest = workloads.stdlib_files()
    assert train and rest and not set(train) & set(rest)
    text = workloads.stdlib_text()
    # the training text is the first files' bytes, exactly as before held-out text existed
    assert text == b"".join(p.read_bytes() for p in train)[:workloads.TRAIN_BYTES]
    held = workloads.stdlib_held_out_text()
    assert held == b"".join(p.read_bytes() for p in rest)[:len(held)] and len(held) > 10_000
    w = workloads.load("charlm")
    xs, ys = zip(*workloads.held_out(w))
    x = torch.cat(xs)
    assert x.shape[0] == workloads.EVAL_SEQUENCES and w.eval_metric == "bits_per_char"
    for row, nxt in zip(x[:8], torch.cat(ys)[:8]):
        window = bytes(row.tolist())
        assert window in held and bytes(nxt.tolist())[-1:] in held
    assert torch.equal(torch.cat(ys)[:, :-1], x[:, 1:])  # next-character targets


@pytest.mark.parametrize("name", ["mlp", "cnn", "wide"])
def test_generated_held_out_samples_are_never_trained_on(name):
    make = workloads.BUILTIN[name]
    small = {"width": 64, "depth": 2} if name == "wide" else {}  # the same streams, a small model
    held = workloads.held_out(make(seed=3, **small))
    held_rows = _rows(torch.cat([x for x, _ in held]))
    assert len(held_rows) == sum(len(x) for x, _ in held)  # no duplicates either
    for rank in (0, 1, 63):  # the first ranks and the last a run may have
        train = make(rank=rank, world_size=64, seed=3, **small).batches()
        seen = _rows(torch.cat([x for x, _ in itertools.islice(train, 20)]))
        assert not seen & held_rows, f"rank {rank} trains on held-out samples"
    again = workloads.held_out(make(seed=3, **small))  # fixed: the same set at every evaluation
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(held, again))


def test_evaluate_reports_loss_accuracy_and_bits_per_char():
    model = torch.nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))
    x = torch.tensor([[2.0, 0, 0], [0, 2.0, 0], [2.0, 0, 0], [0, 0, 1.0]])
    y = torch.tensor([0, 1, 1, 0])
    batches = [(x[:3], y[:3]), (x[3:], y[3:])]  # unequal batches: weighted by targets
    model.train()
    out = workloads.evaluate(model, batches)
    assert model.training  # left as it was
    expected = float(torch.nn.functional.cross_entropy(model(x).detach(), y))
    assert out["loss"] == pytest.approx(expected)
    assert out["accuracy"] == 0.75  # the tie in the last row goes to class 0, as argmax does
    bpc = workloads.evaluate(model, batches, "bits_per_char")
    assert set(bpc) == {"loss", "bits_per_char"}
    assert bpc["bits_per_char"] == pytest.approx(expected / math.log(2))
    reg = workloads.evaluate(model, [(x, torch.zeros(4, 2))])
    assert set(reg) == {"loss"}


def _two(**kw):
    return torch.nn.Linear(4, 3), lambda: iter([(torch.randn(2, 4), torch.tensor([0, 1]))])


def test_a_users_workload_may_add_held_out_batches(monkeypatch):
    import types

    mod = types.ModuleType("h10_user_workloads")
    mod.two = _two
    mod.three = lambda: (*_two(), lambda: [(torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]))])
    mod.bad_third = lambda: (*_two(), 42)
    mod.bad_shape = lambda: (*_two(), lambda: [(torch.randn(5, 4), torch.zeros(5, 7))])
    monkeypatch.setitem(__import__("sys").modules, "h10_user_workloads", mod)
    old = workloads.load("h10_user_workloads:two")
    assert old.eval_batches is None and workloads.held_out(old) is None
    assert workloads.check("h10_user_workloads:two") is None
    new = workloads.load("h10_user_workloads:three")
    assert workloads.check("h10_user_workloads:three") is None
    assert set(workloads.evaluate(new.model, workloads.held_out(new))) == {"loss", "accuracy"}
    with pytest.raises(ValueError, match="eval_batches"):
        workloads.load("h10_user_workloads:bad_third")
    assert "held-out batch" in workloads.check("h10_user_workloads:bad_shape")


def test_evals_jsonl_is_read_leniently(tmp_path):
    folder = run_folder.RunFolder(tmp_path)
    assert folder.evals() == [] and folder.checkpoint_step() is None and folder.resumed_from() is None
    rows = [{"step": 9, "loss": 1.5, "eval_s": 0.01, "accuracy": 0.5},
            {"step": 19, "loss": 1.25, "eval_s": 0.02, "bits_per_char": 1.8}]
    (tmp_path / "evals.jsonl").write_text(
        json.dumps(rows[0]) + "\nnot json\n" + json.dumps({"step": "x", "loss": 1}) + "\n"
        + json.dumps(rows[1]) + "\n")
    assert folder.evals() == rows
    assert run_folder.heldout(rows) == {"heldout_loss": 1.25, "heldout_accuracy": None,
                                   "heldout_bits_per_char": 1.8}


def test_eval_every_is_a_setting():
    assert RunConfig().eval_every > 0 and RunConfig().eval_every < RunConfig().steps
    assert "eval_every" in RunConfig(eval_every=-1).errors()
    assert RunConfig(eval_every=0).errors() == {}


# ---------------------------------------------------------------------------- resume (no run)
def test_powersgd_state_round_trips_through_a_checkpoint(tmp_path):
    a = PowerSGDState(None, matrix_approximation_rank=2, random_seed=7)
    a.rng.randint(1_000_000_000)  # advanced, as a run advances it
    a.iter, a.error_dict, a.q_memory_dict = 12, {0: torch.randn(5)}, {1: torch.randn(3)}
    path = tmp_path / "s.pt"
    torch.save({"hook": checkpoint.hook_state(a, SPECS["powersgd"])}, path)
    b = PowerSGDState(None, matrix_approximation_rank=2, random_seed=7)
    checkpoint.restore_hook_state(b, torch.load(path, weights_only=True)["hook"])
    assert b.iter == 12 and torch.equal(b.error_dict[0], a.error_dict[0])
    assert torch.equal(b.q_memory_dict[1], a.q_memory_dict[1])
    assert b.rng.randint(1_000_000_000) == a.rng.randint(1_000_000_000)
    assert checkpoint.hook_state(None, SPECS["allreduce"]) is None


def test_a_compressor_state_round_trips_through_a_checkpoint(tmp_path):
    from commlab.hooks.compressors import RandomKState

    a = RandomKState(None, compress_ratio=0.1, random_seed=3)
    a.uniform(torch.zeros(4)), torch.rand(2, generator=a.shared_generator)  # advanced, as a run advances them
    a.iter, a.error_dict = 5, {0: torch.randn(6)}
    path = tmp_path / "s.pt"
    torch.save({"hook": checkpoint.hook_state(a, SPECS["randomk"])}, path)
    b = RandomKState(None, compress_ratio=0.1, random_seed=3)
    checkpoint.restore_hook_state(b, torch.load(path, weights_only=True)["hook"])
    assert b.iter == 5 and torch.equal(b.error_dict[0], a.error_dict[0])
    assert torch.equal(b.uniform(torch.zeros(4)), a.uniform(torch.zeros(4)))
    assert torch.equal(torch.rand(2, generator=b.shared_generator), torch.rand(2, generator=a.shared_generator))


def _finished_run(tmp_path, **cfg):
    run_dir = tmp_path / "first"
    run_dir.mkdir()
    store.write_json(run_dir / "config.json", RunConfig(runs_dir=str(tmp_path), **cfg).to_dict())
    store.write_json(run_dir / "status.json", {"status": "finished", "step": cfg.get("steps", 200) - 1})
    return run_dir


def _checkpoint_files(run_dir, cfg: RunConfig, step: int) -> None:
    """What a run of ``cfg`` saves after ``step``, written as its ranks would."""
    state = PowerSGDState(None)
    model = workloads.load(cfg.workload).model
    for rank in range(cfg.world_size):
        saved = {"rank": rank, "world_size": cfg.world_size, "step": step, "hook_name": cfg.hook,
                 "hook": checkpoint.hook_state(state, SPECS[cfg.hook]), "rng": torch.get_rng_state()}
        if rank == 0:
            saved |= {"model": model.state_dict(), "optimizer": {}}
        torch.save(saved, checkpoint.rank_file(run_dir, rank))


def test_a_resume_is_checked_before_anything_starts(tmp_path):
    run_dir = _finished_run(tmp_path, steps=10, hook="powersgd", world_size=2, workload="mlp")
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        checkpoint.resume_config(run_dir)
    store.write_json(run_dir / "checkpoint.json", {"step": 9, "world_size": 2})
    (run_dir / "checkpoint").mkdir()
    (run_dir / "checkpoint" / "rank0.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="checkpoint/rank0.pt cannot be read"):  # opened, not just seen
        checkpoint.resume_config(run_dir)
    _checkpoint_files(run_dir, RunConfig(hook="powersgd", world_size=2, workload="mlp"), step=9)
    (run_dir / "checkpoint" / "rank1.pt").unlink()
    with pytest.raises(ConfigError, match="checkpoint/rank1.pt is missing"):
        checkpoint.resume_config(run_dir)
    _checkpoint_files(run_dir, RunConfig(hook="powersgd", world_size=2, workload="mlp"), step=9)
    cfg = checkpoint.resume_config(run_dir)
    assert cfg.steps == 20 and cfg.hook == "powersgd"  # as many steps again by default
    assert checkpoint.resume_config(run_dir, steps=15, eval_every=5, hook=None).eval_every == 5
    with pytest.raises(ConfigError) as e:
        checkpoint.resume_config(run_dir, hook="allreduce", lr=0.1, steps=10)
    assert set(e.value.errors) == {"hook", "lr", "steps"}
    assert "must stay 'powersgd'" in e.value.errors["hook"]
    assert "more than the 10 steps" in e.value.errors["steps"]
    with pytest.raises(ConfigError, match="not a commlab run folder"):
        checkpoint.resume_config(tmp_path / "nowhere")
