"""The compression-rate rule against hand arithmetic and against PyTorch's PowerSGDState stats."""
import json
import math

import pytest

from commlab.analysis import shapes
from commlab.analysis.ring import wire_bytes as ring_wire_bytes
from commlab.analysis.rule import apply_rule, decide, matrix_view


def test_matrix_view_flattens_trailing_dimensions():
    assert matrix_view((16, 3, 5, 5)) == (16, 75)
    assert matrix_view((10,)) == (10, 1)


@pytest.mark.parametrize("shape, rank, rate, compressed, after", [
    ((256, 64), 1, 2.0, True, 320),          # (256+64)*1*2 = 640 < 16384
    ((256, 64), 4, 2.0, True, 1280),
    ((8, 8), 4, 2.0, False, 64),             # (8+8)*4*2 = 128 >= 64
    ((8, 8), 1, 2.0, True, 16),              # 32 < 64
    ((8, 8), 2, 2.0, False, 64),             # 64 is not < 64: the inequality is strict
    ((4096,), 1, 2.0, False, 4096),          # a vector is 4096 x 1: (4097)*1*2 >= 4096
    ((4096,), 1, 0.5, True, 4097),           # below rate 1 torch 2.13 compresses vectors too
    ((3, 1000), 8, 1.0, False, 3000),        # r = min(n, m, rank) = 3: 1003*3 = 3009 >= 3000
    ((16, 3, 5, 5), 2, 2.0, True, 182),     # 16 x 75: (16+75)*2*2 = 364 < 1200; (16+75)*2
])
def test_decide(shape, rank, rate, compressed, after):
    d = decide("w", shape, rank, rate)
    assert (d.compressed, d.numel_after) == (compressed, after)
    assert d.numel_before == math.prod(shape)


def test_summary_ratio():
    s = apply_rule([("a", (256, 64)), ("b", (64,))], 1, 2.0)
    assert s.numel_before == 256 * 64 + 64
    assert s.numel_after == 320 + 64
    assert s.predicted_ratio == pytest.approx(s.numel_before / s.numel_after)


def test_ring_bytes():
    assert ring_wire_bytes(1000, 4) == pytest.approx(1500)
    assert ring_wire_bytes(1000, 1) == 0


def test_rule_from_meta_model_of_1_5_billion_parameters():
    named = shapes.from_reference("gpt2-xl (1.5B, meta device)")
    assert 1.4e9 < shapes.total_numel(named) < 1.7e9
    s = apply_rule(named, 4, 2.0)
    assert s.compressed_count > 48 * 4


def test_checkpoint_shapes_without_loading(tmp_path):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16))
    torch.save({"model": model.state_dict(), "epoch": 3}, tmp_path / "ck.pt")
    named = dict(shapes.from_checkpoint(tmp_path / "ck.pt"))
    assert named["0.weight"] == (16, 32)
    assert "1.running_mean" in named


@pytest.mark.slow  # the person's module:function is built in a child process
def test_cli_rule_builds_a_module_in_a_child_and_names_what_ended_it(capsys):
    from commlab import cli

    assert cli.main(["rule", "--module", "commlab.workloads:mlp", "--matrix-approximation-rank", "1",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [d["name"] for d in out["layers"]] == [n for n, _ in shapes.from_workload("mlp")]
    assert cli.main(["rule", "--module", "os:abort", "--matrix-approximation-rank", "1"]) == 2
    assert "SIGABRT" in capsys.readouterr().err
