"""Launch a real DDP run and watch it live.  Thin: widgets in, commlab.ui.form and commlab.ui.runs, plotly out."""
import streamlit as st

import lab_widgets
from commlab import api
from commlab.analysis import metrics, units
from commlab.config import ConfigError
from commlab.figures import runs as figures
from commlab.tune import held_to_real
from commlab.ui import definitions, form, runs

REFRESH_S = 0.5
slots = {}  # field -> the empty slot under its widget, where its error goes


def field(w: form.Widget):
    value = w.draw(st)
    slots[w.name] = st.empty()
    return value


def settings() -> dict:
    """The form, generated from the settings table: one bordered group per section."""
    v = {}
    for column, groups in zip(st.columns(len(form.COLUMNS)), form.COLUMNS):
        for group in groups:
            drawn = form.form_settings(group, v)  # the hook's own settings, once it is chosen
            if not drawn:
                continue
            with column.container(border=True):
                st.markdown(form.heading(group))
                for s in drawn:
                    if not form.shown(s, v):  # the hook's own settings, under the hook just chosen
                        continue
                    # The workload: a built-in or the person's own module:function, chosen first.
                    own = s.name == "workload" and st.radio(
                        s.label, form.WORKLOAD_KINDS, key="f_workload_kind",
                        help=s.help) != form.WORKLOAD_KINDS[0]
                    v[s.name] = field(form.widget(s, own_workload=own))
                    if s.name == "hook" and (definition := definitions.explain(v["hook"])):
                        with st.expander(f"What {v['hook']} sends, against its paper and GRACE"):
                            st.markdown(definition)
    return v


def launch_area(cfg, errors: dict) -> None:
    job, job_errors = lab_widgets.launcher("launch")
    errors = {**errors, **job_errors}
    for name, msg in errors.items():
        if name in slots:  # under its widget, which names it
            slots[name].error(msg)
    lab_widgets.show_errors({k: m for k, m in errors.items() if k not in slots})
    if errors:
        st.error(f"Fix {len(errors)} setting(s) before launch: "
                 + ", ".join(f"**{k}**" for k in errors))
    else:
        plan = form.preview(cfg)
        st.info(f"Backend **{plan['backend']}** ({plan['backend_reason']}). Hook implementation: "
                f"**{plan['hook_impl']}**: {plan['hook_reason']}.")
        if plan["warning"]:
            st.warning(plan["warning"])
    if st.button("Launch", type="primary", disabled=bool(errors), key="launch"):
        draft = st.session_state.setdefault("draft", form.new_draft())
        try:
            run, started = form.launch(cfg, form.request_id(cfg, draft), slurm=job)
        except ConfigError as e:  # found only at launch (a workload edited since the check)
            lab_widgets.show_errors(e)
            return
        except (RuntimeError, OSError) as e:  # the run could not be started (a full disk, a spawn)
            st.error(f"The run could not be started: {e}")
            return
        st.session_state.draft = form.new_draft()
        st.session_state[lab_widgets.RUN_KEY] = str(run.path)
        st.session_state.notice = (f"Started run {run.id}." if started else
                                   f"A run with exactly these settings is already going "
                                   f"({run.id}): watching it instead of starting a second.")
        st.session_state.fold_form = True
        st.rerun()


def watch_panel(choices: list[dict]) -> None:
    if not choices:
        st.info("No runs yet. Choose the settings above and press **Launch**: the run's "
                "loss, step time and bytes appear here as it goes.")
        return
    if "notice" in st.session_state:
        st.success(st.session_state.pop("notice"))
    chosen = lab_widgets.pick_run(choices, "Watching")
    path, running = chosen["path"], chosen["status"] in api.GOING
    views = st.session_state.setdefault("views", {})
    if path not in views:
        views[path] = runs.LiveView(path)
    view = views[path]
    st.fragment(run_every=REFRESH_S if running else None)(panel)(view, running)


def panel(view: runs.LiveView, was_running: bool) -> None:
    view.poll()
    status = view.status()
    if was_running and status["status"] not in api.GOING:
        st.rerun()  # a full rerun stops the refresh and lists the run's new status
    h = view.headline()
    impl = view.implementation()
    planned = "?" if h["steps_planned"] is None else f"{h['steps_planned']:,}"  # a damaged config
    st.markdown(f"**Status: {lab_widgets.literal(status['status'])}** · {h['steps_done']:,} of "
                f"{planned} steps done")
    if status.get("slurm"):
        job = status["slurm"]
        st.caption(f"Slurm job {lab_widgets.literal(job['job_id'])}: {lab_widgets.literal(job['state'])}"
                   + (f" (reason: {lab_widgets.literal(job['reason'])})" if job.get("reason") not in (None, "None") else ""))
    if status["status"] == api.RunStatus.STOPPED:  # the person pressed Stop: news, not a failure
        st.caption(f"Stopped by the user after {h['steps_done']:,} steps.")
    elif status.get("error") and status["status"] not in api.GOING:
        st.error(lab_widgets.literal(status["error"]))
    ran = "ran" if impl["ran"] else "will run (planned: rank 0 has not reported yet)"
    shown = {k: lab_widgets.literal(impl[k]) for k in ("backend", "owner", "hook_impl", "hook_reason")}
    st.caption(f"Hook implementation that {ran} on {shown['backend']}: **{shown['owner']}** "
               f"({shown['hook_impl']}). Why: {shown['hook_reason']}."
               + (f" Loss: {lab_widgets.literal(impl['loss'])}." if impl["loss"] else ""))
    if impl["warning"]:
        st.warning(lab_widgets.literal(impl["warning"]))
    if caught := view.pitfalls():
        st.warning(lab_widgets.literal("PowerSGD's pitfalls caught in this run:\n\n" + "\n\n".join(caught)))
    # A lost run's supervisor is gone, but torchrun or workers may outlive it: Stop ends them.
    if status["status"] in api.STOPPABLE and st.button("Stop", key="stop"):
        api.open_run(view.run.path).stop()
        st.rerun()
    if not view.rows:
        if status["status"] in api.GOING:
            st.info("Waiting for the first step: starting the ranks takes a few seconds "
                    "(longer on a busy machine).")
        else:
            st.info(f"The run ended ({status['status']}) before its first step: nothing was measured.")
        return
    cols = st.columns(4)
    cols[0].metric("loss", f"{h['loss']:.4f}")
    ran = view.run.config_dict()
    # over the emulated link, the step is a model's: say how far it was from a real link
    cols[1].metric("median step time", units.seconds(h["median_step_s"]), help=held_to_real.beside(
        ran.get("hook", ""), ran["emulate_bandwidth_gbps"] * 1000, "emulated")
        if ran.get("emulate_bandwidth_gbps") else None)
    if h["bytes_per_step"] is not None:
        cols[2].metric("bytes per step (median)", units.human_bytes(h["bytes_per_step"]),
                       help=f"{h['bytes_per_step']:,.0f} bytes per rank and step handed to the "
                       f"collectives; plain allreduce would send {h['plain_bytes_per_step']:,} bytes")
    if h["compression_ratio"] is not None:
        steady = h["steady_compression_ratio"]
        cols[3].metric(metrics.STEADY_RATIO, "–" if steady is None else f"{steady:.2f}×",
                       help="Plain over sent bytes over the steady steps only (warm-up and "
                       "PowerSGD's allreduce steps left out): the ratio the hook runs at. "
                       f"{metrics.CUMULATIVE_RATIO.capitalize()}, every step included: "
                       f"{h['compression_ratio']:.2f}×.")
    st.caption(f"Last point on the charts: step {h['step']:,} (steps count from 0) · "
               f"loss {h['loss']:.4f}")
    st.plotly_chart(figures.live_figure(view.frame()), key="live")
    with st.expander("Communication ledger: every collective by kind and size", icon=":material/receipt_long:"):
        lab_widgets.show_ledger(runs.ledger_view(view.run.path), key="ledger")


st.title("Launch and watch")
# The form is folded while a run goes, so that the live panel is in view; the expander is
# keyed, so its state can only be set before it is drawn (hence the flag and the rerun).
choices = runs.run_choices()
if st.session_state.pop("fold_form", False) or "form_open" not in st.session_state:
    st.session_state.form_open = not (choices and choices[0]["status"] in api.GOING)
with st.expander("New run", key="form_open", on_change="rerun", icon=":material/tune:"):
    values = settings()
    config, problems = form.config_from_form(values)
    launch_area(config, problems)
st.subheader("Live")
watch_panel(choices)
