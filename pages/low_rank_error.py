"""How far PowerSGD's low-rank gradients lie from the exact ones: the optimum (truncated SVD)
against one power iteration on a run's saved gradients, and the error the run measured.
Thin: widgets in, commlab.ui.lowrank_view over the run folder, commlab.figures.lowrank out."""
import streamlit as st

import lab_widgets
from commlab.analysis import lowrank
from commlab.config import default_runs_dir
from commlab.engine.store import Damaged
from commlab.figures import lowrank as figs
from commlab.ui import lowrank_view

# The runs folder is named in the command: a terminal's own folder may not be the lab's.
HOW_TO = """Make a PowerSGD run that saves the exact mean gradient of a few steps and measures the
error as it goes, from a terminal:

```
python -m commlab run --hook powersgd --workload mlp --steps 60 --start-powersgd-iter 10 \\
    --matrix-approximation-rank 2 --error-every 5 --save-grads-at 30,31,32 --runs-dir {runs_dir}
```

or from Python: `commlab.api.run(RunConfig(hook="powersgd", save_grads_at=[30, 31, 32], error_every=5))`.
`--save-grads-at` names the steps whose gradients are saved (consecutive steps show warm start);
`--error-every K` measures the approximation error every K steps."""

analysed = st.cache_data(show_spinner="Singular values and power iterations…")(lowrank_view.step_errors)
warm_by_rank = st.cache_data(show_spinner="Warm start at every rank…")(lowrank_view.warm_by_rank)
warm_started = st.cache_data(show_spinner="Warm start over consecutive steps…")(lowrank_view.warm_start)


def offline_section(path: str, run: lowrank_view.Inputs) -> None:
    st.subheader("Optimum against PowerSGD, on a saved step")
    steps = run.steps
    if not steps:
        st.info("This run saved no gradients. Start one with `--save-grads-at` (or "
                "`RunConfig.save_grads_at`) to compare PowerSGD with the optimum.")
        return
    if run.all_matrices:
        st.caption("At this run's settings PowerSGD compresses no layer; every matrix is shown.")
    c1, c2 = st.columns(2)
    step = c1.selectbox("Saved step", steps, index=len(steps) - 1)
    rank = c2.slider("Rank to compare at", 1, lowrank.MAX_RANK, min(run.rank, lowrank.MAX_RANK))
    layers = analysed(path, step, tuple(run.names))
    if not layers:
        st.info("None of this run's compressed layers is in the saved gradients.")
        return
    st.caption("Each layer's exact mean gradient M at this step, approximated at rank 1…32: solid, "
               "the truncated SVD (the best any rank-r method can do); dashed, PowerSGD's one "
               f"power iteration from a fresh Q drawn with the run's random_seed ({run.random_seed}). "
               "Error feedback's residual is not in the saved gradient, so it is left out here.")
    names = [le.name for le in layers]
    picked = st.multiselect("Layers on the chart", names, default=names[:figs.SHOWN_LAYERS],
                            key="lowrank_layers", help=f"{len(names):,} compressed layers; the "
                            "table below lists them all")
    st.plotly_chart(figs.error_vs_rank([le for le in layers if le.name in picked], run.rank))
    st.dataframe(figs.error_table(layers, rank), hide_index=True)

    chosen = st.selectbox("Layer", [le.name for le in layers])
    layer = next(le for le in layers if le.name == chosen)
    chain, upto = lowrank.warm_start_steps(steps, step)
    warm = warm_by_rank(path, tuple(upto), chosen) if len(upto) > 1 else None
    st.plotly_chart(figs.layer_by_rank(layer, warm, upto))
    st.plotly_chart(figs.spectrum(layer, rank))
    if len(chain) < 2:
        st.caption(f"Warm start carries Q from one step to the next: step {step} has no saved "
                   "neighbour. Save consecutive steps to see it.")
        return
    ws = warm_started(path, tuple(chain), chosen, rank)
    st.caption(f"Warm start over the consecutive saved steps {chain[0]}–{chain[-1]}, as if "
               "compression began at the first: one Q drawn there and carried on (Q = MᵀP), "
               "against a fresh Q every step. The run itself began at start_powerSGD_iter and "
               "its Q also saw error feedback's residual.")
    st.plotly_chart(figs.warm_start_figure(ws))
    st.dataframe(figs.warm_start_table(ws), hide_index=True)


def measured_section(path: str) -> None:
    st.subheader("Measured during the run")
    rows, residual_norms = lowrank_view.measured(path)
    if not rows:
        st.info("This run did not measure the approximation error. Start one with "
                "`--error-every K` (or `RunConfig.error_every`) to record it every K steps.")
        return
    st.caption("The hook's output against the exact mean gradient (from one extra allreduce), "
               "error feedback included; zero before start_powerSGD_iter, where the hook is a "
               "plain allreduce.")
    st.plotly_chart(figs.measured_figure(rows, residual_norms))
    st.dataframe(figs.measured_table(rows), hide_index=True)


st.title("Low-rank error")
choices = lowrank_view.choices()
if not choices:
    st.info(f"No run in `{default_runs_dir()}` has saved gradients or measured errors yet.")
    st.markdown(HOW_TO.format(runs_dir=default_runs_dir()))
    st.stop()

path = lab_widgets.pick_run(choices)["path"]
run = lowrank_view.inputs(path)
cfg = run.config
st.caption(lab_widgets.literal(
    f"hook {cfg.get('hook')} · rank {cfg.get('matrix_approximation_rank')} · "
    f"start_powerSGD_iter {cfg.get('start_powerSGD_iter')} · error feedback "
    f"{cfg.get('use_error_feedback')} · warm start {cfg.get('warm_start')} · "
    f"workload {cfg.get('workload')} · saved steps {run.steps or 'none'}"))
if run.on_shards:
    st.caption(f"Sharded (HSDP, {cfg.get('replicas')} replicas): the lab's hook between the replicas "
               "compressed each rank's dim-0 shard of every parameter, so the layers here are those "
               "shards, and a bucket is a unit `fully_shard` went on.")
if caught := lowrank_view.pitfalls(path):
    st.warning(lab_widgets.literal("PowerSGD's pitfalls caught in this run:\n\n" + "\n\n".join(caught)))
try:
    offline_section(path, run)
except Damaged as e:  # a saved gradient file that is not one
    st.warning(lab_widgets.literal(f"damaged: {e}"))
measured_section(path)
