"""PowerSGD's compression rule on any model's shapes, or a run's (on HSDP, each rank's shards): which
layers it compresses and what a step sends.  Thin: widgets in, commlab.analysis.shapes,
commlab.ui.rule_view and commlab.analysis.rule, commlab.figures.rule out."""
import os
import tempfile

import streamlit as st

import lab_widgets
from commlab.analysis import shapes, units
from commlab.analysis.rule import IN_BY_OUT_NOTE, apply_rule
from commlab.config import default_runs_dir
from commlab.engine import workload_probe
from commlab.figures import rule as figs
from commlab.ui import rule_view
from commlab.workload_names import DESCRIPTIONS
from commlab.workloads import CONTRACT, MODELS

SOURCES = ("Built-in workload", "Reference model", "Your module:function", "Uploaded checkpoint", "A run")


@st.cache_data(show_spinner="Building the model on the meta device…")
def workload_shapes(spec: str) -> list:
    return shapes.from_workload(spec)


@st.cache_data(show_spinner="Building your model in a separate process…")
def own_shapes(spec: str, stamp: tuple) -> tuple:  # stamp: a new answer once the module is edited
    return workload_probe.described(spec)


@st.cache_data(show_spinner="Building the reference model on the meta device…")
def reference_shapes(name: str) -> list:
    return shapes.from_reference(name)


@st.cache_data(show_spinner="Reading the checkpoint's shapes…", max_entries=4)
def checkpoint_shapes(file_id: str, _upload) -> list:
    # torch.load memory-maps only real files: the upload goes to disk first.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "checkpoint.pt")
        with open(path, "wb") as f:
            f.write(_upload.getbuffer())
        return shapes.from_checkpoint(path)


def run_shapes() -> tuple[list, dict, rule_view.Recorded]:
    """The rows a run recorded the rule on (its layers, or on HSDP its shards); stops the page
    with a message when no run recorded one."""
    choices = rule_view.choices()
    if not choices:
        st.info(f"No run in `{default_runs_dir()}` has recorded its rule yet: a run writes it as it starts.")
        st.stop()
    run = rule_view.recorded(lab_widgets.pick_run(choices)["path"])
    if run.on_shards:
        st.caption("This run's hook between HSDP's replicas applied the rule to each rank's dim-0 shard "
                   "of every parameter (a shard of a weight is still a matrix: its rows × the rest), so the "
                   "rows below are those shards, as the run recorded them.")
    elif not run.applied:
        st.caption("This run's hook does not apply PowerSGD's rule: the rows below are its layers, "
                   "as PowerSGD would see them.")
    return run.shapes, run.layouts, run


def chosen_shapes() -> tuple[list, dict, rule_view.Recorded | None]:
    """The shapes of whatever the person picked, the layouts of a person's model
    (``analysis.rule.layouts``) and, for a run, what it recorded; stops the page with a message when
    there are none."""
    source = st.radio("Shapes from", SOURCES, horizontal=True)
    if source == SOURCES[4]:
        return run_shapes()
    if source == SOURCES[0]:
        spec = st.selectbox("Workload", list(MODELS), format_func=lambda k: f"{k} — {DESCRIPTIONS[k]}")
        return workload_shapes(spec), {}, None
    if source == SOURCES[1]:
        return reference_shapes(st.selectbox("Reference model", list(shapes.REFERENCE_MODELS))), {}, None
    if source == SOURCES[2]:
        spec = st.text_input("module:function", placeholder="mypackage.train:workload", help=CONTRACT)
        if not spec.strip():
            st.info("Name a function in an importable module (the folder the lab started in is on "
                    "the path). Its model is built once, in a separate process, for its shapes.")
            st.stop()
        return (*own_shapes(spec.strip(), workload_probe.source_stamp(spec.strip())), None)
    upload = st.file_uploader("A state_dict checkpoint", type=["pt", "pth", "bin", "ckpt"])
    if upload is None:
        st.info("Upload a checkpoint saved with torch.save(model.state_dict(), path); only its "
                "tensors' shapes are read.")
        st.stop()
    return checkpoint_shapes(upload.file_id, upload), {}, None


st.title("Compression rule")
st.markdown(
    "PowerSGD views each gradient as an n×m matrix (`shape[0]` × the rest), takes "
    "r = min(n, m, rank), and compresses it only when **(n + m)·r·min_compression_rate < n·m**; "
    "a vector of length k is a k×1 matrix, so with min_compression_rate ≥ 1 it is never compressed "
    "(the documentation says never; below 1, torch 2.13 compresses it, and so does commlab). "
    "A compressed layer sends P and Q, (n + m)·r elements.")

try:
    named, layouts, run = chosen_shapes()
except ValueError as e:
    st.error(str(e))
    st.stop()
if layouts:
    st.info(IN_BY_OUT_NOTE)

c1, c2 = st.columns(2)
# A run's own settings to start from: at them the table is the rule the run recorded.
rank = c1.slider("matrix_approximation_rank", 1, 64, min(run.rank, 64) if run else 1)
rate = c2.slider("min_compression_rate", 0.1, 10.0, min(max(run.rate, 0.1), 10.0) if run else 2.0, 0.1)
summary = apply_rule(named, rank, rate, layouts)
if run and (rank, rate) == (run.rank, run.rate) and any(
        run.decisions[d.name] != d.compressed for d in summary.layers):
    st.warning("At the run's own settings this table differs from the decisions the run recorded "
               "(layers.json): the folder was written by another version of the rule.")
sent = figs.step_bytes(summary)

m1, m2, m3, m4 = st.columns(4)
m1.metric("Predicted compression ratio", f"{summary.predicted_ratio:.2f}×",
          help="Elements before over after, from the shapes alone; a run of the per-tensor "
          "PowerSGD hook measures the same ratio over its steady steps (the Runs page's "
          "steady-state compression ratio).")
m2.metric("Layers compressed", f"{summary.compressed_count:,} / {len(summary.layers):,}")
m3.metric("PowerSGD sends per step", units.human_bytes(sent["powersgd"]))
m4.metric("Plain allreduce sends", units.human_bytes(sent["allreduce"]))
# On shards the rows are every rank's of a replica: together they are the replica's, each rank its own.
whose = "Per replica (its ranks' shards together) and step" if run and run.on_shards else "Per rank and step"
st.caption(f"{whose}, in fp32: {summary.numel_after:,} elements × {figs.FP32_BYTES} B = "
           f"{sent['powersgd']:,} bytes with PowerSGD, against {summary.numel_before:,} elements × "
           f"{figs.FP32_BYTES} B = {sent['allreduce']:,} bytes with plain allreduce.")

g1, g2 = st.columns([3, 1])
many = len(summary.layers) > figs.TOP_N * 3
if st.session_state.get("rule_many") != many:
    # A widget keeps its value across reruns: a switch to a model with hundreds of layers would
    # otherwise keep the few-layer view and draw every bar.
    st.session_state.update(rule_many=many, rule_grouping=figs.GROUPINGS[1 if many else 0], rule_log=many)
grouping = g1.radio("Bars", figs.GROUPINGS, horizontal=True,
                    key="rule_grouping", help=f"A bar per layer, per kind of layer (block numbers "
                    f"starred), or the {figs.TOP_N} largest layers and the rest as one bar.")
log_y = g2.toggle("log scale", key="rule_log",
                  help="Layers differ by decades in size: a log axis shows the small ones too.")
fig = figs.savings_figure(summary, grouping)
if log_y:
    fig.update_yaxes(type="log")
st.plotly_chart(fig, key="rule_chart")
# Thousands separated; the counts wide enough for gpt2-xl's 80,411,200 (a narrow column cuts
# digits), n, m and r narrow: the decision and n·m stay on screen at 1400 px.
st.dataframe(figs.rule_frame(summary), hide_index=True, column_config={
    **{c: st.column_config.NumberColumn(format="localized", width="small") for c in ("n", "m", "r")},
    **{c: st.column_config.NumberColumn(format="localized", width="medium")
       for c in ("n·m", "(n+m)·r·rate", "elements before", "elements after", "saved")}})
