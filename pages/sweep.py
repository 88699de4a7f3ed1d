"""A sweep of one hook's own settings beside an allreduce baseline (fp32, fp16 or bf16), every
setting with N seeds: start it, watch it, stop or resume it, read its front, the noise-aware
recommendation and whether each setting pays on your cluster.
Thin: widgets in, commlab.tune.sweep (which runs in its own process), plotly out."""
import streamlit as st

import lab_widgets
from commlab.config import ConfigError, RunConfig, default_runs_dir, settings
from commlab.engine.run_state import RunStatus
from commlab.figures.sweep import curves_figure, pareto_figure
from commlab.tune import baseline as baselines
from commlab.tune import pareto, quality
from commlab.tune import sweep as sw
from commlab.ui import form

# What the form shows first: a short job, PowerSGD from step 10, held out every 10 steps, three seeds.
PRESET = RunConfig(workload="mlp", steps=60, start_powerSGD_iter=10, eval_every=10)
# The job every run of the sweep shares (the rest keeps its defaults); the axes come from the table.
# (replicas: HSDP's, read when the job's sharding axis lists hsdp)
JOB = ("workload", "steps", "world_size", "replicas", "eval_every", "emulate_bandwidth_gbps", "emulate_latency_us")
# The sweep shown, kept across reruns; no widget has this key (Streamlit refuses to set one that has).
CHOSEN = "chosen_sweep"
TABLE = {s.name: s for s in settings()}
NAMES = {s.name: s.label for s in settings()} | {"repeats": "seeds per setting", "against": "judged against"}
BASELINE_HELP = ("The allreduce every setting is judged against: the recommendation's rule, the "
                 "bytes ratio, the speed-up and the break-even. Han et al. (2024) argue for a 16-bit "
                 "one: fp16 and bf16 halve the bytes for free on most models.")


def _named(field: str) -> str:
    label = NAMES.get(field, field)
    return f"{label} ({field})" if label != field else field


def hook_picker() -> str:
    """The hook swept, outside the form: the axes below follow it at once."""
    hooks = list(sw.SWEPT_HOOKS)
    return st.selectbox("Hook to sweep", hooks, index=hooks.index(sw.DEFAULT_HOOK), key="sweep_hook",
                        help=f"{form.help_text(TABLE['hook'])}\n\nThe sweep varies this hook's own "
                             "settings; an allreduce (fp32, fp16 or bf16) is the baseline it is "
                             "compared with.")


def spec_form(hook: str) -> sw.SweepSpec | None:
    slots: dict = {}
    hook_axes = sw.hook_axes(hook)
    # the job's axes (sharding) beside the hook's: the baselines too run at each value picked
    drawn = (*hook_axes, *sw.JOB_AXES)
    with st.form("sweep_form"):
        job = {}
        for col, name in zip(st.columns(len(JOB)), JOB):
            job[name] = form.widget(TABLE[name], value=getattr(PRESET, name), prefix="sweep_",
                                    titled=True).draw(col)
            slots[name] = col.empty()
        axes = {}
        if not hook_axes:
            st.caption(f"{hook} has no settings to sweep: each seed runs it once beside the baseline.")
        for col, s in zip(st.columns(len(drawn)), drawn):
            axes[s.name] = form.axis_widget(s, PRESET).draw(col)
            slots[s.name] = col.empty()
        c1, c2, c3, c4 = st.columns(4)
        repeats = c1.number_input("Seeds per setting", value=sw.DEFAULT_REPEATS, step=1, key="sweep_repeats",
                                  help="Every setting, the baseline included, runs with this many "
                                       "seeds (initial weights and data order); 3 or more let the "
                                       "recommendation tell a difference from seed noise.")
        slots["repeats"] = c1.empty()
        tolerance = c2.number_input("X: tolerance, % of the baseline's loss", value=sw.DEFAULT_TOLERANCE_PCT,
                                    step=0.5, key="sweep_tolerance", format="%g")
        slots["tolerance_pct"] = c2.empty()
        against = c3.selectbox("Judged against", baselines.BASELINES, format_func=baselines.title,
                               key="sweep_against", help=BASELINE_HELP + " A 16-bit baseline runs "
                               "after fp32 allreduce, which calibrates the what-if model.")
        slots["against"] = c3.empty()
        baseline = c4.checkbox("Baselines first", True)
        submitted = st.form_submit_button("Start sweep", type="primary")
    if not submitted:
        return None
    errors: dict[str, str] = {}
    values = {}
    for s in drawn:  # several choices picked, or comma-separated text
        try:
            values[s.name] = axes[s.name] if s.choices else sw.axis_values(s, axes[s.name])
        except ConfigError as e:
            errors |= e.errors
    try:
        base = RunConfig.from_dict({**job, "hook": hook}, "the sweep's job")
    except ConfigError as e:
        errors |= e.errors
        base = None
    spec = None
    if base is not None:  # checked even when an axis did not parse: every bad field at once
        spec = sw.SweepSpec(base=base, baseline=baseline, tolerance_pct=float(tolerance),
                            repeats=int(repeats), against=against, **values)
        try:
            sw.grid(spec)
        except ConfigError as e:
            errors = e.errors | errors
    if errors:
        refuse(errors, slots)
        return None
    return spec


def refuse(errors: dict[str, str], slots: dict) -> None:
    """Every bad field named, under its widget and in one line; nothing starts."""
    for name, msg in errors.items():
        if name in slots:
            slots[name].error(lab_widgets.literal(msg))
    lab_widgets.show_errors({k: m for k, m in errors.items() if k not in slots})
    st.error(f"Fix {len(errors)} setting(s) before the sweep starts: "
             + ", ".join(f"**{lab_widgets.literal(_named(k))}**" for k in errors))


@st.fragment(run_every=1.0)
def live(sweep: sw.Sweep) -> None:
    """The progress bar and the Stop button of a running sweep; one full rerun when it ends."""
    p = sweep.progress()
    if p.sweep_status != RunStatus.RUNNING:
        if st.session_state.pop(f"watching_{sweep.id}", False):
            st.rerun()
        return
    st.session_state[f"watching_{sweep.id}"] = True
    st.progress(p.fraction, text=p.line())
    if st.button("Stop sweep", key=f"stop_{sweep.id}"):
        sweep.request_stop()
        st.toast("Stopping: the current run ends, finished runs are kept.")


def cluster_inputs() -> quality.Cluster:
    st.markdown("**Predicted times** are for this cluster (the What-if page's model, fed by each run):")
    c1, c2, c3 = st.columns(3)
    world = c1.number_input("Workers", value=quality.Cluster.world_size, step=1, key="predict_world")
    bw = c2.number_input("Bandwidth, Gb/s", value=quality.Cluster.bandwidth_gbps, format="%g",
                         key="predict_bw")
    lat = c3.number_input("Latency per hop, µs", value=quality.Cluster.latency_us, format="%g",
                          key="predict_lat")
    cluster = quality.Cluster(int(world), float(bw), float(lat))
    if cluster.errors():  # named, and the default cluster shown until fixed
        lab_widgets.show_errors(cluster.errors())
        st.caption(f"Showing the default cluster ({quality.Cluster().text()}) until these are fixed.")
        return quality.Cluster()
    return cluster


def judging(sweep: sw.Sweep) -> tuple[str, float]:
    """The baseline judged against and the tolerance X, the sweep's own unless changed here."""
    planned = sweep.spec().against
    c1, c2 = st.columns([1, 3])
    against = c1.selectbox("Judge against", baselines.BASELINES, baselines.BASELINES.index(planned),
                           format_func=baselines.title, key=f"judge_{sweep.id}",
                           help=BASELINE_HELP + f" This sweep ran {baselines.title(planned)}"
                                + ("" if planned == baselines.BASELINE else " and fp32 allreduce") + ".")
    tolerance = c2.slider("X: a setting qualifies when its loss is within X% of the baseline's, beyond "
                          "the seed noise", 0.0, 50.0, float(sweep.spec().tolerance_pct), 0.5)
    return against, tolerance


def recommendation(rec: pareto.Recommendation, table, title: str) -> None:
    said = f"**Recommendation** (against {title}): {lab_widgets.literal(rec.text)}"
    if rec.decided and rec.label and not table[table["label"] == rec.label]["baseline"].iloc[0]:
        st.success(said)
    elif rec.decided:
        st.info(said)
    else:
        st.warning(said)
    if rec.here:
        said = f"**On your cluster**: {lab_widgets.literal(rec.here)}."
        (st.warning if "SLOWER" in rec.here else st.markdown)(said)
    st.caption(f"Rule: {lab_widgets.literal(rec.rule)}.")


def per_setting(table, runs, title: str, cluster: quality.Cluster) -> None:
    st.markdown(f"**Per setting** (target loss {_num(runs['target'].iloc[0])}: {title}'s plus X%; "
                "*to target*: where each seed first reached it, mean over the seeds that did; "
                f"ratio, speed-up and *pays here?* against **{title}**, on {cluster.text()})")
    # What a person reads first, first (a 1400 px window shows about eight columns); losses to
    # the four digits the seeds' spread leaves meaningful.
    shown = table.assign(qualities=[", ".join(_num(q) for q in qs) for qs in table["qualities"]])
    st.dataframe(shown[["label", "quality_mean", "quality_std", "bytes_per_step", "bytes_ratio", "pays",
                        "speedup", "seeds", "qualities", "broken", "time_s", "predicted_s",
                        "reached", "reach_step", "reach_time_s", "reach_predicted_s", "reach_bytes",
                        "pareto_bytes", "pareto_predicted"]],
                 hide_index=True, column_config={
                     "label": "setting", "qualities": "loss per seed",
                     "quality_mean": st.column_config.NumberColumn("loss mean", format="%.4g"),
                     "quality_std": st.column_config.NumberColumn("± sd", format="%.2g"),
                     "broken": "failed seeds",
                     "bytes_per_step": st.column_config.NumberColumn("bytes/step", format="%,.0f"),
                     "bytes_ratio": st.column_config.NumberColumn(
                         f"bytes ratio vs {title}", format="%.1f",
                         help=f"{title}'s bytes per step over the setting's"),
                     "speedup": st.column_config.NumberColumn(
                         f"speed-up vs {title}", format="%.2f",
                         help=f"{title}'s predicted step time over the setting's, on {cluster.text()} "
                              "(median over its seeds, each against its own seed's baseline run)"),
                     "pays": st.column_config.TextColumn(
                         "pays here?", help="by the what-if model at these workers and latency: the "
                                            "link bandwidth below which it beats the baseline in step "
                                            "time, or never, or always: the verdict most of its "
                                            "seeds give, the median break-even and its range"),
                     "time_s": st.column_config.NumberColumn("measured s", format="%.2f"),
                     "predicted_s": st.column_config.NumberColumn("predicted s", format="%.3f"),
                     "reach_step": st.column_config.NumberColumn("to target: step", format="%.0f"),
                     "reach_time_s": st.column_config.NumberColumn("measured s", format="%.2f"),
                     "reach_predicted_s": st.column_config.NumberColumn("predicted s", format="%.3f"),
                     "reach_bytes": st.column_config.NumberColumn("bytes", format="%,.0f")})


def results(sweep: sw.Sweep) -> None:
    against, tolerance = judging(sweep)
    cluster = cluster_inputs()
    runs = sweep.results(tolerance, cluster, against)
    if not len(runs):  # said as the sweep's state has it: an ended sweep never "has not started"
        st.info("No run has started yet." if sweep.status() == RunStatus.RUNNING else
                f"This sweep ({lab_widgets.literal(sweep.status())}) recorded no run.")
        return
    title = baselines.title(against)
    table = pareto.by_setting(runs)
    rec = sweep.recommend(runs, tolerance)
    recommendation(rec, table, title)
    step = sw.next_step(sweep, rec)
    if step:
        st.info(f"**Next**: {lab_widgets.literal(step['text'])}")
    basis = set(runs["quality_basis"].dropna())
    if quality.TRAINING in basis:
        st.caption(f"Quality basis: {lab_widgets.literal(quality.BASIS_TEXT[quality.TRAINING])}.")
    links = set(table["link"]) - {"loopback"}
    if links:
        st.warning(f"These runs used an **{', '.join(sorted(links))}** link: their measured times are "
                   "the emulated network's, not this machine's.")
    if not pareto.comparable(table).any():
        st.info("The charts appear once a setting has a finished seed.")
    else:
        c1, c2 = st.columns(2)
        c1.plotly_chart(pareto_figure(table, "bytes_per_step", rec.label, runs))
        c2.plotly_chart(pareto_figure(table, "predicted_s", rec.label, runs, cluster.text()))
        st.plotly_chart(curves_figure(runs, runs["target"].iloc[0]))
    per_setting(table, runs, title, cluster)
    if rec.verdicts:
        st.markdown(f"**Each setting against {title}**")
        st.dataframe(rec.verdicts, hide_index=True)
    with st.expander("Every run"):
        # Columns empty throughout (the axes of hooks these runs do not use) are left out.
        st.dataframe(runs.drop(columns=["run_dir", "curve", "payoff"]).dropna(axis=1, how="all"), hide_index=True)


def _num(x) -> str:
    return "-" if x is None or x != x else f"{x:.4g}"


st.title("Sweep")
st.caption("Every combination of the chosen hook's settings listed (PowerSGD's rank, top-k's k, QSGD's "
           "levels, local SGD's period...), each run with several seeds after a plain allreduce "
           "baseline, one run at a time. Held-out loss against bytes per step and against the time "
           "predicted on your cluster, with the Pareto front: the settings nothing else beats on both.")

job, job_errors = lab_widgets.launcher("sweep")
spec = spec_form(hook_picker())
if spec is not None and job_errors:
    refuse(job_errors, {})
elif spec is not None:
    try:
        started = sw.start(spec, slurm=job)
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
    status = current.status()
    st.caption(f"Status: **{lab_widgets.literal(status)}**")
    if status in (RunStatus.STOPPED, RunStatus.LOST, RunStatus.FAILED):
        done = sum(r.status() == RunStatus.FINISHED for r in current.runs())
        left = len(current.configs()) - done
        how = {RunStatus.STOPPED: "was stopped", RunStatus.LOST: "lost its process",
               RunStatus.FAILED: f"failed ({current.state().get('error')})"}[status]
        st.info(f"This sweep {lab_widgets.literal(how)} with {done} run(s) finished and {left} to go. "
                f"Resume runs those {left}; the finished ones are kept.")
        if st.button("Resume sweep", key=f"resume_{current.id}"):
            try:
                sw.start_resume(current)
                st.session_state[CHOSEN] = str(current.path)
                st.rerun()
            except ConfigError as e:
                lab_widgets.show_errors(e)
results(current)
