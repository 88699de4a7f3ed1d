"""A PowerSGD sweep beside an allreduce baseline: start it, watch it, stop it, read its front.
Thin: widgets in, commlab.tune.sweep (which runs in its own process), plotly out."""
import streamlit as st

from commlab.config import ConfigError, RunConfig, default_runs_dir
from commlab.figures.sweep import pareto_figure
from commlab.tune import sweep as sw
from commlab.workloads import BUILTIN


def show_errors(e: ConfigError) -> None:
    for field, msg in e.errors.items():
        st.error(f"**{field}**: {msg}")


def spec_form() -> sw.SweepSpec | None:
    with st.form("sweep"):
        c1, c2, c3 = st.columns(3)
        workload = c1.selectbox("Workload", list(BUILTIN), index=list(BUILTIN).index("mlp"))
        steps = c2.number_input("Steps per run", 5, 100_000, 60)
        world_size = c3.number_input("Ranks", 1, 8, 2)
        c1, c2, c3, c4 = st.columns(4)
        ranks = c1.multiselect("matrix_approximation_rank", [1, 2, 4, 8, 16, 32], [1, 2, 4])
        starts = c2.text_input("start_powerSGD_iter (comma-separated)", "10")
        rates = c3.text_input("min_compression_rate (comma-separated)", "2")
        wrappers = c4.multiselect("Compress wrapper", ["none", "fp16", "bf16"], ["none"])
        c1, c2, c3 = st.columns(3)
        bandwidth = c1.number_input("Emulated bandwidth, Gb/s (0: off)", 0.0, 10_000.0, 0.0,
                                    help="every collective the hook issues completes no earlier "
                                         "than 2(N−1)·latency + 2(N−1)/N·bytes/bandwidth after it "
                                         "starts")
        latency = c2.number_input("Emulated latency per hop, µs", 0.0, 1e6, 0.0)
        baseline = c3.checkbox("Plain allreduce baseline first", True)
        if not st.form_submit_button("Start sweep", type="primary"):
            return None
    try:
        base = RunConfig(workload=workload, steps=steps, world_size=world_size,
                         emulate_bandwidth_gbps=bandwidth, emulate_latency_us=latency)
        return sw.SweepSpec(base=base, matrix_approximation_rank=ranks,
                            start_powerSGD_iter=sw.parse_list(starts, int, "start_powerSGD_iter"),
                            min_compression_rate=sw.parse_list(rates, float, "min_compression_rate"),
                            wrapper=wrappers, baseline=baseline)
    except ConfigError as e:
        show_errors(e)
        return None


@st.fragment(run_every=1.0)
def live(sweep: sw.Sweep) -> None:
    """The progress bar and the Stop button of a running sweep; one full rerun when it ends."""
    p = sweep.progress()
    if p.sweep_status != "running":
        if st.session_state.pop(f"watching_{sweep.id}", False):
            st.rerun()
        return
    st.session_state[f"watching_{sweep.id}"] = True
    st.progress(p.fraction, text=p.line())
    if st.button("Stop sweep", key=f"stop_{sweep.id}"):
        sweep.request_stop()
        st.toast("Stopping: the current run ends, finished runs are kept.")


def results(sweep: sw.Sweep) -> None:
    table = sweep.results()
    if not len(table):
        st.info("No run has started yet.")
        return
    tolerance = st.slider("X: a setting qualifies when its final loss is within X% of allreduce's",
                          0.0, 50.0, float(sweep.spec().tolerance_pct), 0.5)
    rec = sw.recommend(table, tolerance)
    st.success(f"**Recommendation** ({rec.rule}): {rec.text}")
    links = set(table["link"]) - {"loopback"}
    if links:
        st.warning(f"These runs used an **{', '.join(sorted(links))}** link: their times are the "
                   "emulated network's, not this machine's.")
    c1, c2 = st.columns(2)
    c1.plotly_chart(pareto_figure(table, "bytes_per_step", rec.run_id))
    c2.plotly_chart(pareto_figure(table, "time_s", rec.run_id))
    st.dataframe(table.drop(columns=["run_dir"]), hide_index=True)


st.title("Sweep")
st.caption("Every combination of the PowerSGD settings listed, each a run of its own after a plain "
           "allreduce baseline, one at a time. Final loss against bytes per step and against time, "
           "with the Pareto front: the settings nothing else beats on both.")

spec = spec_form()
if spec is not None:
    try:
        started = sw.start(spec)
        st.session_state["sweep"] = str(started.path)
    except ConfigError as e:
        show_errors(e)

sweeps = sw.list_sweeps()
if not sweeps:
    st.info(f"No sweeps yet in `{default_runs_dir()}`: choose a grid above and start one.")
    st.stop()
paths = [str(s.path) for s in sweeps]
chosen = st.session_state.get("sweep")
current = st.selectbox("Sweep", sweeps, index=paths.index(chosen) if chosen in paths else 0,
                       format_func=lambda s: f"{s.id} ({s.status()}, "
                                             f"{len(s.state().get('runs', []))} run(s) started)")
if current.is_running():
    live(current)
else:
    st.caption(f"Status: **{current.status()}**")
results(current)
