"""Launch a real DDP run and watch it live.  Thin: widgets in, commlab.ui.form and commlab.ui.runs, plotly out."""
import streamlit as st

from commlab import api
from commlab.config import (
    BACKENDS,
    HOOKS,
    IMPLS,
    OPTIMIZERS,
    POWERSGD_HOOKS,
    WRAPPERS,
    RunConfig,
    default_runs_dir,
)
from commlab.figures import runs as figures
from commlab.ui import form, runs
from commlab.workloads import BUILTIN, DESCRIPTIONS

DEFAULTS = RunConfig()
REFRESH_S = 0.5
slots = {}  # field -> the empty slot under its widget, where its error goes


def field(name: str, widget, label: str, **kwargs):
    value = widget(label, key=kwargs.pop("key", f"f_{name}"), help=form.HELP.get(name), **kwargs)
    slots[name] = st.empty()
    return value


def number(name: str, label: str, **kwargs):
    # No min_value: the package's messages, not the browser's clamping, say what is wrong.
    default = getattr(DEFAULTS, name)
    return field(name, st.number_input, label, value=default, step=1 if isinstance(default, int)
                 else None, format=None if isinstance(default, int) else "%g", **kwargs)


def settings() -> dict:
    v = {"runs_dir": default_runs_dir()}
    hook_col, powersgd_col, workload_col, more_col = st.columns(4)
    with hook_col.container(border=True):
        st.markdown("**Hook and wrapper**")
        v["hook"] = field("hook", st.selectbox, "hook", options=HOOKS, index=HOOKS.index(DEFAULTS.hook))
        v["wrapper"] = field("wrapper", st.selectbox, "compress wrapper", options=WRAPPERS)
        v["impl"] = field("impl", st.selectbox, "implementation", options=IMPLS)
    with hook_col.container(border=True):
        st.markdown("**Job**")
        v["world_size"] = number("world_size", "ranks")
        v["backend"] = field("backend", st.selectbox, "backend", options=BACKENDS)
        v["bucket_cap_mb"] = number("bucket_cap_mb", "bucket cap (MiB)")
        v["steps"] = number("steps", "steps")
    off = v["hook"] not in POWERSGD_HOOKS
    with powersgd_col.container(border=True):
        st.markdown("**PowerSGD settings**" + (" (read only by the PowerSGD hooks)" if off else ""))
        for name in ("matrix_approximation_rank", "start_powerSGD_iter", "min_compression_rate",
                     "orthogonalization_epsilon", "random_seed"):
            v[name] = number(name, name, disabled=off)
        for name in ("use_error_feedback", "warm_start", "batch_tensors_with_same_shape"):
            v[name] = field(name, st.checkbox, name, value=getattr(DEFAULTS, name), disabled=off)
    with workload_col.container(border=True):
        st.markdown("**Workload**")
        own = st.radio("workload", ["built-in", "my module:function"], key="f_workload_kind",
                       help=form.HELP["workload"]) != "built-in"
        if own:
            v["workload"] = field("workload", st.text_input, "module:function",
                                  placeholder="mymodel:make", key="f_workload_own")
        else:
            v["workload"] = field("workload", st.selectbox, "built-in workload",
                                  options=list(BUILTIN), key="f_workload_builtin",
                                  index=list(BUILTIN).index(DEFAULTS.workload),
                                  format_func=lambda k: f"{k}: {DESCRIPTIONS[k]}")
        v["batch_size"] = number("batch_size", "batch size per rank")
        v["lr"] = number("lr", "learning rate")
        v["optimizer"] = field("optimizer", st.selectbox, "optimizer", options=OPTIMIZERS,
                               index=OPTIMIZERS.index(DEFAULTS.optimizer))
        v["seed"] = number("seed", "seed")
    with more_col.container(border=True):
        st.markdown("**Instrumentation and an emulated link**")
        v["instrument"] = field("instrument", st.checkbox, "instrument (bytes, buckets, errors)",
                                value=DEFAULTS.instrument)
        v["error_every"] = number("error_every", "error_every (steps)")
        v["save_grads_at"] = field("save_grads_at", st.text_input, "save_grads_at (steps)")
        v["stall_timeout_s"] = number("stall_timeout_s", "stall_timeout_s")
        v["emulate_bandwidth_gbps"] = number("emulate_bandwidth_gbps", "emulate_bandwidth_gbps")
        v["emulate_latency_us"] = number("emulate_latency_us", "emulate_latency_us")
    return v


def launch_area(cfg, errors: dict) -> None:
    for name, msg in errors.items():
        (slots[name] if name in slots else st).error(msg)
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
        run, started = form.launch(cfg, form.request_id(cfg, draft))
        st.session_state.draft = form.new_draft()
        st.session_state.watch = str(run.path)
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
    paths = [c["path"] for c in choices]
    by_path = {c["path"]: c for c in choices}
    current = st.session_state.get("watch")
    path = st.selectbox("Watching", paths, index=paths.index(current) if current in paths else 0,
                        format_func=lambda p: f"{by_path[p]['label']} — {by_path[p]['status']}")
    st.session_state.watch = path
    views = st.session_state.setdefault("views", {})
    if path not in views:
        views[path] = runs.LiveView(path)
    view = views[path]
    running = by_path[path]["status"] == "running"
    st.fragment(run_every=REFRESH_S if running else None)(panel)(view, running)


def panel(view: runs.LiveView, was_running: bool) -> None:
    view.poll()
    status = view.status()
    if was_running and status["status"] != "running":
        st.rerun()  # a full rerun stops the refresh and lists the run's new status
    h = view.headline()
    impl = view.implementation()
    st.markdown(f"**Status: {status['status']}** · step {h['step'] if h['step'] is not None else '–'}"
                f" of {h['steps_planned']}")
    if status.get("error") and status["status"] != "running":
        st.error(status["error"])
    ran = "ran" if impl["ran"] else "will run (planned: rank 0 has not reported yet)"
    st.caption(f"Hook implementation that {ran} on {impl['backend']}: **{impl['owner']}** "
               f"({impl['hook_impl']}). Why: {impl['hook_reason']}.")
    if impl["warning"]:
        st.warning(impl["warning"])
    # A lost run's supervisor is gone, but torchrun or workers may outlive it: Stop ends them.
    if status["status"] in ("running", "lost") and st.button("Stop", key="stop"):
        api.open_run(view.run.path).stop()
        st.rerun()
    if not view.rows:
        if status["status"] == "running":
            st.info("Waiting for the first step: starting the ranks takes a few seconds "
                    "(longer on a busy machine).")
        else:
            st.info(f"The run ended ({status['status']}) before its first step: nothing was measured.")
        return
    cols = st.columns(4)
    cols[0].metric("loss", f"{h['loss']:.4f}")
    cols[1].metric("median step time", f"{h['median_step_s'] * 1000:.1f} ms")
    if h["bytes_per_step"] is not None:
        cols[2].metric("bytes per step (median)", f"{h['bytes_per_step']:,.0f}",
                       help=f"plain allreduce would send {h['plain_bytes_per_step']:,} bytes")
    if h["compression_ratio"] is not None:
        cols[3].metric("compression ratio", f"{h['compression_ratio']:.2f}")
    st.caption(f"Last step shown: {h['step']} · loss {h['loss']:.4f}")
    st.plotly_chart(figures.live_figure(view.frame()), key="live")


st.title("Launch and watch")
# The form is folded while a run goes, so that the live panel is in view; the expander is
# keyed, so its state can only be set before it is drawn (hence the flag and the rerun).
choices = runs.watch_choices()
if st.session_state.pop("fold_form", False) or "form_open" not in st.session_state:
    st.session_state.form_open = not (choices and choices[0]["status"] == "running")
with st.expander("New run", key="form_open", on_change="rerun", icon=":material/tune:"):
    values = settings()
    config, problems = form.config_from_form(values)
    launch_area(config, problems)
st.subheader("Live")
watch_panel(choices)
