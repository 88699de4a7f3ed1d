"""Every run in one sortable table, filtered by sweep, workload and hook; overlay several (smoothed,
on log axes, against step, time or bytes); two runs' settings side by side; a run's name, note,
metrics as CSV and communication ledger; delete one after a confirmation.
Thin: commlab.ui.runs' rows, overlays and diffs, lab_widgets' pickers, plotly out."""
import functools

import pandas as pd
import streamlit as st

import lab_widgets
from commlab.analysis import metrics
from commlab.api import Run
from commlab.figures import runs as figures
from commlab.ui import runs

COLUMNS = ["label", "name", "status", "sweep", "hook", "wrapper", "hook_impl", "backend", "world_size",
           "workload", "rank", "start_iter", "min_compression_rate", "use_error_feedback",
           "warm_start", "bucket_cap_mb", "steps", "steps_planned", "final_loss", "median_step_s",
           "bytes_per_step", "steady_compression_ratio", "compression_ratio", "heldout_loss",
           "heldout_accuracy", "heldout_bits_per_char", "overlap_share", "note", "run_id",
           "error", "skipped_lines"]
FORMATS = {"final_loss": "%.4f", "median_step_s": "%.4f", "bytes_per_step": "localized",
           "steady_compression_ratio": "%.2f", "compression_ratio": "%.2f", "steps": "localized",
           "steps_planned": "localized", "heldout_loss": "%.4f", "heldout_accuracy": "%.3f",
           "heldout_bits_per_char": "%.3f", "overlap_share": "%.2f"}
HELP = {"bytes_per_step": "bytes per rank and step handed to the collectives (median over the "
                          "steady steps)",
        "steady_compression_ratio": f"{metrics.STEADY_RATIO}: plain over sent bytes over the "
                                    "steady steps (what the Compression rule page predicts)",
        "compression_ratio": f"{metrics.CUMULATIVE_RATIO}: plain over sent bytes over every step, "
                             "warm-up included",
        "median_step_s": "seconds, median over the steady steps"}
LABELS = {"bytes_per_step": "bytes per step (B)", "median_step_s": "median step (s)",
          "steady_compression_ratio": "steady-state ratio", "compression_ratio": "ratio so far"}
FILTERS = {"sweep": "Sweep", "workload": "Workload", "hook": "Hook"}
X_TABS = {"step": "loss against step", "t": "against wall time", "sent_bytes": "against bytes sent"}

st.title("Runs")
if "deleted" in st.session_state:
    st.success(st.session_state.pop("deleted"))
rows = runs.run_table()
if not rows:
    lab_widgets.stop_without_runs("every run is listed here, also after the app restarts.")

# ---------------------------------------------------------------- filter and table
chosen = {}
offered = {column: values for column in FILTERS
           if (values := sorted({r[column] for r in rows if r.get(column)}))}  # no runs of a sweep: no sweep filter
for col, (column, values) in zip(st.columns(max(len(offered), 1)), offered.items()):
    chosen[column] = col.multiselect(FILTERS[column], values, key=f"filter_{column}",
                                     placeholder="all", format_func=str)
shown = runs.filter_rows(rows, **chosen)
st.caption(f"{len(shown):,} of {len(rows):,} runs shown. PowerSGD's settings are blank for runs "
           "of other hooks, which never read them.")
st.dataframe(pd.DataFrame(shown, columns=COLUMNS), hide_index=True, key="runs_table",
             column_config={k: st.column_config.NumberColumn(LABELS.get(k), format=FORMATS.get(k),
                                                             help=HELP.get(k))
                            for k in {*FORMATS, *HELP}})

picked = {r["run_dir"] for r in shown}
choices = [c for c in runs.run_choices() if c["path"] in picked]
if not choices:
    st.info("No run matches the filters.")
    st.stop()

# ---------------------------------------------------------------- overlays
st.subheader("Overlay")
overlaid = lab_widgets.pick_runs("Runs to overlay", choices,
                                 default=[r["run_dir"] for r in shown if r["steps"]][:3])
s1, s2, s3 = st.columns([2, 1, 1])
smoothing = s1.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key="smoothing",
                      help="An exponential moving average of the loss, as TensorBoard's (0: raw)")
log_y = s2.toggle("log loss axis", key="log_y")
log_x = s3.toggle("log x axis", key="log_x", help="Against step, time or bytes: all three")
if overlaid:
    frames = runs.overlay(overlaid)
    for tab, x in zip(st.tabs(list(X_TABS.values())), X_TABS):
        tab.plotly_chart(figures.loss_figure(frames, x, smoothing, log_y, log_x), key=f"overlay_{x}")

# ---------------------------------------------------------------- two runs' settings
st.subheader("Compare settings")
d1, d2 = st.columns(2)
by_path = {c["path"]: c for c in choices}
paths = list(by_path)
first = d1.selectbox("First run", paths, key="diff_a", format_func=lambda p: lab_widgets.run_name(by_path[p]))
second = d2.selectbox("Second run", paths, index=min(1, len(paths) - 1), key="diff_b",
                      format_func=lambda p: lab_widgets.run_name(by_path[p]))
every = st.toggle("every setting, not only those that differ", key="diff_every")
diff = runs.config_diff(first, second, every)
if diff:
    st.dataframe(pd.DataFrame(diff).style.apply(
        lambda row: ["font-weight: bold" if row["differs"] else ""] * len(row), axis=1),
        hide_index=True, key="diff_table", column_config={"differs": None})
else:
    st.caption("The two runs have the same settings.")

# ---------------------------------------------------------------- one run: name, note, CSV
st.subheader("One run")
one = lab_widgets.pick_run(choices, "Run")["path"]
run = Run(one)
notes = run.notes()
with st.form("notes"):
    name = st.text_input("Name", value=notes["name"], max_chars=80,
                         help="Shown before its settings in every run picker")
    note = st.text_area("Note", value=notes["note"], height=80)
    if st.form_submit_button("Save name and note"):
        run.set_notes(name, note)
        st.rerun()
# A callable: the file is made when the button is pressed, not on every load of the page.
st.download_button("Download metrics (CSV)", functools.partial(runs.metrics_csv, one),
                   file_name=f"{run.id}_metrics.csv", mime="text/csv", key="csv",
                   on_click="ignore", icon=":material/download:")
st.markdown("**Communication ledger**")
lab_widgets.show_ledger(runs.ledger_view(one), key="ledger")

with st.expander("Delete a run"):
    victim = lab_widgets.pick_run(choices, "Run to delete")["path"]
    victim_id = Run(victim).id
    if st.button("Delete…", key="delete"):
        st.session_state.confirm_delete = victim
    if st.session_state.get("confirm_delete") == victim:
        st.warning(f"Delete run {lab_widgets.literal(victim_id)} and every file in it? This cannot be undone.")
        yes, no = st.columns(2)
        if yes.button("Yes, delete it", type="primary", key="delete_yes"):
            del st.session_state.confirm_delete
            try:
                runs.delete_run(victim)
            except ValueError as e:
                st.error(lab_widgets.literal(e))
            else:
                st.session_state.deleted = f"Deleted run {lab_widgets.literal(victim_id)}."
                st.rerun()
        if no.button("Cancel", key="delete_no"):
            del st.session_state.confirm_delete
            st.rerun()
