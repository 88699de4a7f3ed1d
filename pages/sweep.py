"""A PowerSGD sweep beside an allreduce baseline: start it, watch it, stop it, read its front.
Thin: widgets in, commlab.tune.sweep (which runs in its own process), plotly out."""
import streamlit as st

import lab_widgets
from commlab.config import ConfigError, RunConfig, default_runs_dir, settings
from commlab.figures.sweep import pareto_figure
from commlab.tune import pareto
from commlab.tune import sweep as sw
from commlab.ui import form

# What the form shows first: a short job, PowerSGD from step 10.
PRESET = RunConfig(workload="mlp", steps=60, start_powerSGD_iter=10)
# The job every run of the sweep shares (the rest keeps its defaults); the axes come from the table.
JOB = ("workload", "steps", "world_size", "emulate_bandwidth_gbps", "emulate_latency_us")
# The sweep shown, kept across reruns; no widget has this key (Streamlit refuses to set one that has).
CHOSEN = "chosen_sweep"


def spec_form() -> sw.SweepSpec | None:
    table = {s.name: s for s in settings()}
    with st.form("sweep_form"):
        job = {name: form.widget(table[name], value=getattr(PRESET, name), prefix="sweep_",
                                 titled=True).draw(col)
               for col, name in zip(st.columns(len(JOB)), JOB)}
        axes = {s.name: form.axis_widget(s, PRESET).draw(col)
                for col, s in zip(st.columns(len(sw.AXES)), sw.AXES)}
        baseline = st.checkbox("Plain allreduce baseline first", True)
        if not st.form_submit_button("Start sweep", type="primary"):
            return None
    try:
        values = {s.name: axes[s.name] if s.choices else sw.axis_values(s, axes[s.name])
                  for s in sw.AXES}  # several choices picked, or comma-separated text
        return sw.SweepSpec(base=RunConfig.from_dict(job, "the sweep's job"), baseline=baseline,
                            **values)
    except ConfigError as e:
        lab_widgets.show_errors(e)
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
    rec = pareto.recommend(table, tolerance)
    st.success(f"**Recommendation** ({rec.rule}): {lab_widgets.literal(rec.text)}")
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
        st.session_state[CHOSEN] = str(started.path)
    except ConfigError as e:
        lab_widgets.show_errors(e)

sweeps = sw.list_sweeps()
if not sweeps:
    st.info(f"No sweeps yet in `{default_runs_dir()}`: choose a grid above and start one.")
    st.stop()
paths = [str(s.path) for s in sweeps]
chosen = st.session_state.get(CHOSEN)
current = st.selectbox("Sweep", sweeps, index=paths.index(chosen) if chosen in paths else 0,
                       format_func=lambda s: f"{s.id} ({s.status()}, "
                                             f"{len(s.state().get('runs', []))} run(s) started)")
if current.damage():  # the others stay listed and usable
    st.error(current.damage())
    st.stop()
if current.is_running():
    live(current)
else:
    st.caption(f"Status: **{lab_widgets.literal(current.status())}**")
results(current)
