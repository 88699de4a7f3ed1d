"""The settings table: every RunConfig field, walked one by one, is settable from the CLI, the Launch
form and a config file, and has help, so that a new setting cannot be forgotten in any of them.

Each field gets a valid value other than its default, made from its row (its choices, its kind),
not from a list kept here.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

from commlab import cli
from commlab.commands.run import config_from_args
from commlab.commands.sweep import spec_from_args
from commlab.config import GROUPS, RunConfig, applies, default_runs_dir, settings
from commlab.tune import sweep as sw
from commlab.ui import form

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = [f.name for f in dataclasses.fields(RunConfig)]
ROWS = {s.name: s for s in settings()}
# The settings the app sets itself, not the Launch form: a new one must be added here on purpose.
NOT_ON_THE_FORM = {"runs_dir"}  # the folder the app was started with, shown in its sidebar


def other_value(s):
    """A valid value of the setting that is not its default."""
    if s.choices:
        return next(c for c in s.choices if c != s.default)
    if s.kind == "bool":
        return not s.default
    if s.kind == "int":
        return s.default + 3
    if s.kind == "float":  # half a unit up, or halfway to the top where that is past it (a momentum)
        return s.default + 0.5 if s.bounds.error(s.default + 0.5) is None else (s.default + s.bounds.hi) / 2
    if s.kind == "list[int]":
        return [2, 5]
    options = form.widget(s).kwargs.get("options")  # the workload: the form's built-ins
    return next(o for o in options if o != s.default) if options else s.default + "-other"


def cli_words(s, value) -> list[str]:
    if s.kind == "bool":
        return [s.flag if value else "--no-" + s.flag[2:]]
    return [s.flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]


def parse(*argv: str, command: str = "run"):
    return cli.build_parser().parse_args([command, *argv])


def shown(w: form.Widget):
    """What the widget returns untouched: the value it was given to show."""
    return w.kwargs["options"][w.kwargs["index"]] if w.element == "selectbox" else w.kwargs["value"]


# --------------------------------------------------------------------------- every field
def test_the_table_is_every_field_in_order():
    assert [s.name for s in settings()] == FIELDS
    assert {g for column in form.COLUMNS for g in column} == set(GROUPS)


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_has_help_a_group_a_flag_and_allowed_values(name):
    s = ROWS[name]
    assert len(s.help.split()) >= 5, f"{name} needs help a person can act on"
    assert s.group in GROUPS and s.flag == "--" + name.lower().replace("_", "-")
    assert s.choices is None or s.default in s.choices
    if s.choices:
        assert RunConfig(**{name: "no-such-value"}).errors(gpu_count=0)[name].startswith("unknown")


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_is_settable_from_the_cli(name):
    s = ROWS[name]
    value = other_value(s)
    expected = RunConfig(**{name: value})
    assert expected.errors(gpu_count=0) == {}, "the test's value must be a valid one"
    assert config_from_args(parse(*cli_words(s, value))) == expected
    for alias in s.aliases:  # every spelling, and a boolean's --no- form of each
        words = cli_words(dataclasses.replace(s, flag=alias), value)
        assert config_from_args(parse(*words)) == expected


@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_is_settable_from_the_form(name):
    s = ROWS[name]
    if not s.form:
        assert name in NOT_ON_THE_FORM
        cfg, errors = form.config_from_form({})
        assert errors == {} and getattr(cfg, name) == RunConfig().to_dict()[name]
        return
    assert s in form.form_settings(s.group)
    value = other_value(s)
    w = form.widget(s, value=value)
    # The table's help, then the setting's exact name (the label is for reading); the workload
    # picker adds what each built-in is.
    assert w.name == name and w.label and w.kwargs["help"].startswith(form.help_text(s))
    assert form.help_text(s).startswith(s.help) and f"`{name}`" in form.help_text(s)
    cfg, errors = form.config_from_form({name: shown(w)})
    assert errors == {} and cfg == RunConfig(**{name: value})


@pytest.mark.parametrize("fmt", ["json", "toml"])
@pytest.mark.parametrize("name", FIELDS)
def test_each_setting_is_settable_from_a_config_file(name, fmt, tmp_path):
    value = other_value(ROWS[name])
    path = RunConfig(**{name: value}).save(tmp_path / f"settings.{fmt}")
    loaded = RunConfig.load(path)
    assert getattr(loaded, name) == value and loaded == RunConfig(**{name: value})
    # and through the CLI, where flags override the file
    args = parse("--config", str(path), "--steps", "7")
    assert config_from_args(args) == RunConfig(**{name: value}).with_overrides(steps=7)


def test_the_cli_help_lists_every_setting_with_its_help(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100000")  # one line per option: the help is not wrapped
    with pytest.raises(SystemExit):
        parse("--help")
    text = capsys.readouterr().out
    for s in settings():
        assert s.flag in text, s.name
        assert s.help in text.replace("%%", "%"), s.name


# --------------------------------------------------------------------------- spellings in use
def test_the_spellings_readme_and_tests_use_keep_working(tmp_path):
    args = parse("--start-powersgd-iter", "9", "--matrix-approximation-rank", "2", "--no-error-feedback",
                 "--no-warm-start", "--save-grads-at", "10,11", "--runs-dir", str(tmp_path))
    assert config_from_args(args) == RunConfig(
        start_powerSGD_iter=9, matrix_approximation_rank=2, use_error_feedback=False,
        warm_start=False, save_grads_at=[10, 11], runs_dir=str(tmp_path))
    path = RunConfig(hook="powersgd", world_size=3, warm_start=False).save(tmp_path / "my_run.toml")
    assert config_from_args(parse("--config", str(path), "--world-size", "4", "--warm-start")) == \
        RunConfig(hook="powersgd", world_size=4)
    # the flags left out leave the file's values, also the defaults'
    assert config_from_args(parse("--config", str(path))) == RunConfig.load(path)


# --------------------------------------------------------------------------- the sweep's axes
def test_every_sweepable_setting_is_an_axis_of_the_sweep_and_its_cli():
    axes = [s for s in settings() if s.sweepable]
    assert {s.name for s in sw.AXES} == {s.name for s in axes} and axes
    for s in axes:
        assert s.kind in sw.AXIS_TYPES, f"{s.name}: a sweep axis is a number or a name"
        values = [other_value(s), s.default]
        # An axis is swept with a hook that reads it (another hook's axis is refused by name); the
        # job's (no hook reads them: sharding) with any hook, the baselines too at each value.
        job = s in sw.JOB_AXES
        spec = spec_from_args(parse("--hook", sw.DEFAULT_HOOK if job else sw.axis_hooks(s.name)[0], s.flag,
                                    ",".join(map(str, values)), command="sweep"))
        assert (spec.job_axes() if job else spec.axes())[s.name] == values
        assert all(getattr(c, s.name) in values for c in sw.grid(spec)[1:])
        w = form.axis_widget(s, RunConfig())
        assert w.kwargs["help"] == form.help_text(s) and w.kwargs["help"].startswith(s.help)


def test_the_sweep_keeps_its_defaults_and_its_stored_form():
    spec = spec_from_args(parse(command="sweep"))
    assert spec == sw.SweepSpec() and spec.axes() == {
        "matrix_approximation_rank": [1, 2, 4], "start_powerSGD_iter": [20],
        "min_compression_rate": [2.0], "wrapper": ["none"]}
    stored = sw.SweepSpec(matrix_approximation_rank=[2], wrapper=["fp16"]).to_dict()
    assert list(stored) == ["base", "matrix_approximation_rank", "start_powerSGD_iter",
                            "min_compression_rate", "wrapper", "baseline", "tolerance_pct", "repeats",
                            "against", "max_repeats", "added"]
    assert sw.SweepSpec.from_dict(stored) == sw.SweepSpec(matrix_approximation_rank=[2],
                                                          wrapper=["fp16"])
    with pytest.raises(TypeError, match="not a sweep axis: steps"):
        sw.SweepSpec(steps=[1, 2])


# --------------------------------------------------------------------------- the page
def test_the_launch_page_draws_every_form_setting_with_its_key_label_and_help(monkeypatch, tmp_path):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("COMMLAB_RUNS_DIR", str(tmp_path))
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    # Each hook shows the settings that apply to it and no others (allreduce first: the default).
    for hook in ("allreduce", "powersgd", "post_localsgd", "topk"):
        at.selectbox(key="f_hook").set_value(hook).run()
        assert not at.exception, [e.value for e in at.exception]
        drawn = {w.key: w for w in at.main if getattr(w, "key", None)}
        for s in settings():
            if s.form:
                w = form.widget(s)
                assert (w.key in drawn) == applies(s, hook), (hook, s.name)
                if w.key in drawn:
                    assert drawn[w.key].label == w.label and drawn[w.key].help == w.kwargs["help"]
                    assert drawn[w.key].help.startswith(s.help)
    assert default_runs_dir() == str(tmp_path)
