"""The hook table (commlab/hook_specs.py) against what it describes: every setting it names is in
the settings table, every module and function it names exists, each hook reads no setting its row
does not declare (the hook is built on a config that notes what is read), and the rest of the lab
asks it rather than comparing hook names."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch.distributed as dist

import commlab.hooks as library
from commlab.config import HOOK_GROUPS, RunConfig, applies, label_of, settings
from commlab.hook_row import Capability
from commlab.hook_specs import (
    ALLGATHER,
    ALLREDUCE,
    FAMILIES,
    HOOKS,
    POWERSGD_SETTINGS,
    SPECS,
    WRAPPER_SPECS,
)
from commlab.hooks import registry

ROOT = Path(__file__).resolve().parents[1]
NAMES = {s.name for s in settings()}


def _named_settings(spec) -> set[str]:
    names = set(spec.reads()) | set(spec.label.short_names) | set(spec.label.named_when_changed)
    return names | ({spec.starts} if spec.starts else set())


@pytest.mark.parametrize("hook", HOOKS)
def test_every_setting_a_row_names_is_in_the_settings_table(hook):
    assert _named_settings(SPECS[hook]) <= NAMES
    assert SPECS[hook].family in FAMILIES and SPECS[hook].collective in (ALLREDUCE, ALLGATHER)


def test_powersgd_settings_are_the_table_s_powersgd_group_in_pytorch_s_order():
    assert POWERSGD_SETTINGS == tuple(s.name for s in settings() if s.group == "powersgd")


@pytest.mark.parametrize("hook", HOOKS)
def test_every_function_and_class_a_row_names_exists(hook):
    spec = SPECS[hook]
    for commlab in (False, True):
        module = importlib.import_module(spec.module(commlab))
        assert callable(getattr(module, spec.attr)), (hook, module)
        if spec.state:
            assert isinstance(getattr(module, spec.state.attr), type), (hook, module)
    if spec.averaging and spec.averaging.averager:
        averager = spec.averaging.averager
        assert isinstance(getattr(importlib.import_module(averager.module or spec.module(True)), averager.attr), type)
    for name in (spec.attr, *spec.exports) if spec.variant else ():
        assert name in library.__all__ and getattr(library, name) is not None
    if spec.blocking:  # named from its capability: the variant must hold the twin by that name
        assert callable(getattr(importlib.import_module(spec.variant), spec.blocking)), hook


def test_every_row_is_one_hookspec_call_and_no_capability_names_a_hook():
    """The table is read as PyTorch's DDPCommHookType is: one constructor a row, what a hook is said
    by what it does (a capability), never by which hook it is."""
    tree = ast.parse((ROOT / "commlab" / "hook_specs.py").read_text())
    table = next(n.value for n in tree.body if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "SPECS")
    rows = table.generators[0].iter.elts
    assert len(rows) == len(SPECS) and all(ast.unparse(r.func) == "HookSpec" for r in rows)
    for capability in Capability:  # its words say what (its text may name a collective: allreduce)
        assert not {capability.name.lower(), *capability.name.lower().split("_")} & set(SPECS), capability


def test_wrappers_exist_where_their_rows_say():
    for w in WRAPPER_SPECS.values():
        assert callable(getattr(importlib.import_module(w.stock), w.attr))
        if w.variant:
            assert w.attr in library.__all__


@pytest.mark.parametrize("hook", [h for h, s in SPECS.items() if s.variant == "commlab.hooks.compressors"])
def test_a_compressor_s_row_says_the_collective_its_state_issues(hook):
    from commlab.hooks import compressors

    cls = getattr(compressors, SPECS[hook].state.attr)
    assert cls.collective == SPECS[hook].collective


class _Noting(RunConfig):
    """A RunConfig that notes the name of every setting read of it."""

    def __getattribute__(self, name):
        seen = object.__getattribute__(self, "__dict__").get("_seen")
        if seen is not None and name in NAMES:
            seen.add(name)
        return object.__getattribute__(self, name)


@pytest.fixture
def one_rank_group(tmp_path):
    """A Gloo group of this one process (no process started): post-local SGD's subgroups need one."""
    store = tmp_path / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("impl", ["auto", "stock", "commlab"])
def test_building_a_hook_reads_only_what_its_row_declares(hook, impl, one_rank_group):
    if impl == "stock" and SPECS[hook].commlab_only:
        return
    cfg = _Noting(hook=hook, impl=impl, overlap=False)  # off its default: the binding is read
    cfg._seen = seen = set()
    choice = registry.choose(cfg, "gloo")
    assert choice.spec is SPECS[hook]
    # The plan reads the hook, its wrapper and its implementation; the rest is the row's.
    assert seen - {"hook", "wrapper", "impl"} <= set(SPECS[hook].reads()), hook


def test_the_form_shows_each_hook_its_own_settings_and_no_others():
    by_name = {s.name: s for s in settings()}
    assert not [s for s in settings() if s.group in ("powersgd", "localsgd", "compressors")
                and applies(s, "allreduce")]
    assert {s.name for s in settings() if s.group in HOOK_GROUPS and applies(s, "powersgd")} == {
        "hook", "impl", "wrapper", "overlap", *POWERSGD_SETTINGS}
    assert applies(by_name["seed"], "allreduce") and applies(by_name["compress_ratio"], "topk")
    assert not applies(by_name["wrapper"], "topk") and not applies(by_name["overlap"], "fp16")


def test_labels_name_the_values_a_hook_s_own_settings_take():
    assert label_of(RunConfig(hook="powersgd").to_dict()) == "powersgd r=1 start=20"
    assert label_of(RunConfig(hook="powersgd", min_compression_rate=4.0).to_dict()) == \
        "powersgd r=1 start=20 rate=4"
    assert label_of(RunConfig(hook="topk", compress_ratio=0.05).to_dict()) == "topk compress_ratio=0.05"
    assert label_of({"hook": "gone_since"}) == "gone_since"  # a stored config of a hook no longer here


# Where the lab once branched on hook names: no module outside the hook package compares one.
def _hook_name_comparisons(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for v in values:
                    if isinstance(v, ast.Constant) and v.value in SPECS:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_outside_the_hook_table_compares_hook_names():
    modules = [p for p in (ROOT / "commlab").rglob("*.py") if p.name != "hook_specs.py"]
    modules += list((ROOT / "pages").glob("*.py")) + [ROOT / "app.py", ROOT / "lab_widgets.py"]
    assert [c for p in modules for c in _hook_name_comparisons(p)] == []
