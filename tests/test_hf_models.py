"""A user's model as it comes: Hugging Face's GPT-2 and BERT (config only, random weights, nothing
downloaded), unwrapped, through the lab's own launch path with PowerSGD on 2 Gloo ranks; the rule
reading GPT-2's Conv1D shapes in a child; the Hugging Face Trainer export pasted into a training
script on 2 Gloo ranks, its hook seen on every bucket of every step.

The in-process tests read real Hugging Face outputs with the functions the worker, the check and
the held-out evaluation call (``commlab.model_io`` through ``commlab.workloads``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from commlab import model_io, workloads
from commlab.analysis.rule import IN_BY_OUT, apply_rule, layouts, named_shapes
from commlab.api import RunConfig, run
from commlab.tune import export

ROOT = Path(__file__).resolve().parents[1]
GPT2 = "tests.hf_workloads:gpt2"


# ---------------------------------------------------------------------------- in process
def test_gpt2s_output_is_read_by_its_logits_and_labels_by_its_own_loss():
    work = workloads.load(GPT2, batch_size=2)
    work.model.eval()  # no dropout: the same output twice
    x, y = next(iter(work.batches()))
    out = work.model(x)
    assert type(out).__name__ == "CausalLMOutputWithCrossAttentions" and out.loss is None
    assert model_io.loss_error(out, (x, y)) is None
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 256), y.reshape(-1))
    assert torch.equal(model_io.compute_loss(out, (x, y)), ce)
    labelled = {"input_ids": x, "labels": x}
    own = work.model(**labelled)
    assert model_io.compute_loss(own, labelled) is own.loss
    assert model_io.loss_source(labelled, None).startswith("the model's own")
    # Hugging Face's return_dict=False: with labels the loss comes first, without them the logits.
    as_tuple = work.model(**labelled, return_dict=False)
    assert torch.equal(model_io.compute_loss(as_tuple, labelled), own.loss)
    plain = work.model(x, return_dict=False)
    assert torch.equal(model_io.compute_loss(plain, (x, y)), ce)


def test_a_dict_batch_without_labels_or_a_loss_is_refused_by_name():
    work = workloads.load(GPT2, batch_size=2)
    x, _ = next(iter(work.batches()))
    out = work.model(input_ids=x)
    msg = model_io.loss_error(out, {"input_ids": x})
    assert "without 'labels'" in msg and "loss(outputs, batch)" in msg
    with pytest.raises(ValueError, match="without 'labels'"):
        model_io.compute_loss(out, {"input_ids": x})
    # An output the lab cannot read is named with its fields.
    assert "got dict with fields hidden" in model_io.loss_error({"hidden": out.logits}, (x, x))


def test_a_workloads_own_loss_trains_and_evaluates_as_it_says():
    work = workloads.load("tests.hf_workloads:gpt2_smoothed", batch_size=2)
    work.model.eval()  # no dropout: the same output twice
    batch = next(iter(work.batches()))
    loss = work.loss_of(work.model, batch)
    from tests.hf_workloads import smoothed_loss

    assert torch.equal(loss, smoothed_loss(work.model(**batch), batch))
    held = workloads.held_out(work)
    result = workloads.evaluate(work.model, held, loss=work.loss)
    assert set(result) == {"loss"} and 4 < result["loss"] < 7  # ln 256 = 5.5 at random weights


def test_a_workloads_dict_must_name_only_what_the_contract_holds():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="'los'.*it may hold model, batches, eval_batches, loss"):
        workloads._by_name("m:f", {"model": model, "batches": list, "los": print})
    with pytest.raises(ValueError, match="'loss' must be callable, got int"):
        workloads._by_name("m:f", {"model": model, "batches": list, "loss": 3})


def test_conv1d_weights_are_named_in_by_out_and_decided_as_pytorch_views_them():
    from tests.hf_workloads import gpt2_model

    model = gpt2_model()
    found = layouts(model)
    assert set(found) == {f"transformer.h.{i}.{m}.weight" for i in range(2)
                          for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    rule = {d.name: d for d in apply_rule(named_shapes(model), 2, 2.0, found).layers}
    c_attn = rule["transformer.h.0.attn.c_attn.weight"]
    assert (c_attn.shape, c_attn.n, c_attn.m, c_attn.layout) == ((128, 384), 128, 384, IN_BY_OUT)
    assert rule["transformer.wte.weight"].layout == ""  # an embedding is rows × dim, as usual


# ---------------------------------------------------------------------------- real runs
@pytest.mark.slow
@pytest.mark.parametrize("workload, loss, metric", [
    ("gpt2", "cross-entropy (integer targets)", "heldout_accuracy"),
    ("bert", "the model's own (outputs.loss: the batch carries labels)", None),
])
def test_a_hugging_face_model_trains_unwrapped_with_powersgd_on_two_ranks(tmp_path, workload, loss, metric):
    r = run(RunConfig(workload=f"tests.hf_workloads:{workload}", hook="powersgd", matrix_approximation_rank=2,
                      start_powerSGD_iter=2, steps=8, eval_every=8, world_size=2, runs_dir=str(tmp_path)))
    s = r.summary()
    assert s["status"] == "finished", s["error"]
    assert r.meta()["loss"] == loss
    assert s["heldout_loss"] is not None and (metric is None or s[metric] is not None)
    layers = {d["name"]: d for d in r.layers()}
    predicted = apply_rule([(n, d["shape"]) for n, d in layers.items()], 2, 2.0).predicted_ratio
    assert s["steady_compression_ratio"] == pytest.approx(predicted, rel=1e-6)  # it compressed, as the rule says
    if workload == "gpt2":
        assert predicted == pytest.approx(437_760 / 12_928)
        assert layers["transformer.h.0.attn.c_attn.weight"]["layout"] == IN_BY_OUT


@pytest.mark.slow
def test_commlab_rule_reads_gpt2s_shapes_in_a_child_and_says_what_n_and_m_are():
    done = subprocess.run([sys.executable, "-m", "commlab", "rule", "--module", GPT2,
                           "--matrix-approximation-rank", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("transformer.h.0.attn.c_attn.weight"))
    assert line.split()[1:4] == ["128x384", "128", "384"] and line.endswith("compressed (n × m is in × out)")
    assert "predicted compression ratio 33.86" in done.stdout
    assert "PowerSGD's n × m is in features × out features" in done.stdout


# ---------------------------------------------------------------------------- Trainer
TRAINER_SCRIPT = textwrap.dedent('''
    import json, os, sys

    import torch
    from torch.nn.parallel import DistributedDataParallel

    from tests.hf_workloads import gpt2_model

    # Every hook call seen, by wrapping register_comm_hook: (bucket index, is it the last).
    calls = []
    register = DistributedDataParallel.register_comm_hook

    def counting(self, state, hook):
        def counted(state, bucket):
            calls.append((bucket.index(), bucket.is_last()))
            return hook(state, bucket)
        return register(self, state, counted)

    DistributedDataParallel.register_comm_hook = counting
    torch.manual_seed(0)
    model = gpt2_model()
    rows = torch.randint(0, 256, (48, 32), generator=torch.Generator().manual_seed(0))
    train_dataset = [{"input_ids": row, "labels": row} for row in rows]
    exec(compile(open(sys.argv[1]).read(), "exported", "exec"))
    if trainer.args.process_index == 0:
        json.dump({"calls": calls, "iter": state.iter, "compressing": state.iter > state.start_powerSGD_iter,
                   "wrapped": type(trainer.model_wrapped).__name__,
                   "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]},
                  open(sys.argv[2], "w"))
''')


@pytest.mark.slow
def test_the_trainer_export_puts_the_hook_on_every_bucket_of_a_trainer_run(tmp_path):
    """The export as pasted (its TrainingArguments given a few more arguments), commlab's
    Gloo-safe PowerSGD with several buckets: PyTorch's would hang there."""
    steps = 4
    cfg = RunConfig(hook="powersgd", matrix_approximation_rank=2, start_powerSGD_iter=2, bucket_cap_mb=0.05)
    text = export.render(cfg, "trainer", export.Target(backend="gloo")).text
    assert "import commlab.hooks as commlab_hooks" in text  # commlab's PowerSGD: PyTorch's hangs on Gloo
    more = (f'output_dir={str(tmp_path / "out")!r}, max_steps={steps}, per_device_train_batch_size=4, '
            'report_to="none", save_strategy="no", logging_steps=1')
    pasted = text.replace('output_dir="out"', more, 1)
    assert pasted != text
    (tmp_path / "exported.py").write_text(pasted)
    (tmp_path / "train.py").write_text(TRAINER_SCRIPT)
    out = tmp_path / "seen.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr",
                           "127.0.0.1", str(tmp_path / "train.py"), str(tmp_path / "exported.py"), str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen["wrapped"] == "DistributedDataParallel"
    steps_seen = [[]]
    for index, last in seen["calls"]:
        steps_seen[-1].append(index)
        if last:
            steps_seen.append([])
    assert steps_seen.pop() == []
    buckets = len(steps_seen[0])
    assert buckets >= 2 and steps_seen == [list(range(buckets))] * steps  # every bucket, every step
    assert seen["iter"] == steps and seen["compressing"]
    assert len(seen["losses"]) == steps and all(0 < x < 10 for x in seen["losses"])
