"""How far PowerSGD's low-rank gradients lie from the exact ones: the optimum (truncated SVD)
against one power iteration on a run's saved gradients, and the error the run measured.
Thin: widgets in, commlab.analysis.lowrank over the run folder, commlab.figures.lowrank out."""
import streamlit as st

from commlab.analysis import lowrank
from commlab.api import list_runs, open_run
from commlab.config import default_runs_dir
from commlab.figures import lowrank as figs

HOW_TO = """Make a PowerSGD run that saves the exact mean gradient of a few steps and measures the
error as it goes, from a terminal in the lab's folder:

```
python -m commlab run --hook powersgd --workload mlp --steps 60 --start-powersgd-iter 10 \\
    --matrix-approximation-rank 2 --error-every 5 --save-grads-at 30,31,32
```

or from Python: `commlab.api.run(RunConfig(hook="powersgd", save_grads_at=[30, 31, 32], error_every=5))`.
`--save-grads-at` names the steps whose gradients are saved (consecutive steps show warm start);
`--error-every K` measures the approximation error every K steps."""


@st.cache_data(show_spinner="Singular values and power iterations…")
def analysed(run_dir: str, step: int, names: tuple, random_seed: int,
             epsilon: float) -> list[lowrank.LayerError]:
    return lowrank.step_errors(open_run(run_dir).grads(step), names, random_seed,
                               lowrank.MAX_RANK, epsilon)


@st.cache_data(show_spinner="Warm start at every rank…")
def warm_by_rank(run_dir: str, steps: tuple, name: str, random_seed: int, epsilon: float) -> list[float]:
    return lowrank.warm_errors_by_rank(lowrank.layer_over_steps(open_run(run_dir).grads, steps, name),
                                       random_seed, lowrank.MAX_RANK, epsilon)


@st.cache_data(show_spinner="Warm start over consecutive steps…")
def warm_started(run_dir: str, steps: tuple, name: str, rank: int, random_seed: int,
                 epsilon: float) -> lowrank.WarmStart:
    return lowrank.warm_start(name, lowrank.layer_over_steps(open_run(run_dir).grads, steps, name),
                              rank, random_seed, epsilon)


def has_errors(run) -> bool:
    path = run.file("errors.jsonl")
    return path.exists() and path.stat().st_size > 0


def offline_section(run, cfg: dict) -> None:
    st.subheader("Optimum against PowerSGD, on a saved step")
    steps = run.grad_steps()
    if not steps:
        st.info("This run saved no gradients. Start one with `--save-grads-at` (or "
                "`RunConfig.save_grads_at`) to compare PowerSGD with the optimum.")
        return
    names, all_matrices = lowrank.layers_to_analyse(run.layers())
    if all_matrices:
        st.caption("At this run's settings PowerSGD compresses no layer; every matrix is shown.")
    c1, c2 = st.columns(2)
    step = c1.selectbox("Saved step", steps, index=len(steps) - 1)
    rank = c2.slider("Rank to compare at", 1, lowrank.MAX_RANK,
                     min(int(cfg.get("matrix_approximation_rank", 1)), lowrank.MAX_RANK))
    seed, epsilon = int(cfg.get("random_seed", 0)), float(cfg.get("orthogonalization_epsilon", 0.0))
    layers = analysed(str(run.path), step, tuple(names), seed, epsilon)
    if not layers:
        st.info("None of this run's compressed layers is in the saved gradients.")
        return
    st.caption("Each layer's exact mean gradient M at this step, approximated at rank 1…32: solid, "
               "the truncated SVD (the best any rank-r method can do); dashed, PowerSGD's one "
               f"power iteration from a fresh Q drawn with the run's random_seed ({seed}). "
               "Error feedback's residual is not in the saved gradient, so it is left out here.")
    st.plotly_chart(figs.error_vs_rank(layers, int(cfg.get("matrix_approximation_rank", rank))))
    st.dataframe(figs.error_table(layers, rank), hide_index=True)

    chosen = st.selectbox("Layer", [le.name for le in layers])
    layer = next(le for le in layers if le.name == chosen)
    chain, upto = lowrank.warm_start_steps(steps, step)
    warm = warm_by_rank(str(run.path), tuple(upto), chosen, seed, epsilon) if len(upto) > 1 else None
    st.plotly_chart(figs.layer_by_rank(layer, warm, upto))
    st.plotly_chart(figs.spectrum(layer, rank))
    if len(chain) < 2:
        st.caption(f"Warm start carries Q from one step to the next: step {step} has no saved "
                   "neighbour. Save consecutive steps to see it.")
        return
    ws = warm_started(str(run.path), tuple(chain), chosen, rank, seed, epsilon)
    st.caption(f"Warm start over the consecutive saved steps {chain[0]}–{chain[-1]}, as if "
               "compression began at the first: one Q drawn there and carried on (Q = MᵀP), "
               "against a fresh Q every step. The run itself began at start_powerSGD_iter and "
               "its Q also saw error feedback's residual.")
    st.plotly_chart(figs.warm_start_figure(ws))
    st.dataframe(figs.warm_start_table(ws), hide_index=True)


def measured_section(run) -> None:
    st.subheader("Measured during the run")
    records = run.error_records()
    if not records:
        st.info("This run did not measure the approximation error. Start one with "
                "`--error-every K` (or `RunConfig.error_every`) to record it every K steps.")
        return
    rows = lowrank.measured_rows(records)
    st.caption("The hook's output against the exact mean gradient (from one extra allreduce), "
               "error feedback included; zero before start_powerSGD_iter, where the hook is a "
               "plain allreduce.")
    st.plotly_chart(figs.measured_figure(rows, lowrank.ef_residual_norms(records)))
    st.dataframe(figs.measured_table(rows), hide_index=True)


st.title("Low-rank error")
runs_dir = default_runs_dir()
runs = [r for r in list_runs(runs_dir) if r.grad_steps() or has_errors(r)]
if not runs:
    st.info(f"No run in `{runs_dir}` has saved gradients or measured errors yet.")
    st.markdown(HOW_TO)
    st.stop()

by_id = {r.id: r for r in runs}
run = by_id[st.selectbox("Run", list(by_id), format_func=lambda i: f"{i} ({by_id[i].status()})")]
cfg = run.config_dict()
st.caption(f"hook {cfg.get('hook')} · rank {cfg.get('matrix_approximation_rank')} · "
           f"start_powerSGD_iter {cfg.get('start_powerSGD_iter')} · error feedback "
           f"{cfg.get('use_error_feedback')} · warm start {cfg.get('warm_start')} · "
           f"workload {cfg.get('workload')} · saved steps {run.grad_steps() or 'none'}")
offline_section(run, cfg)
measured_section(run)
