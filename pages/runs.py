"""Every run in one sortable table; overlay several; delete one after a confirmation.
Thin: commlab.ui.runs' rows and overlays, lab_widgets' pickers, plotly out."""
import pandas as pd
import streamlit as st

import lab_widgets
from commlab.api import Run
from commlab.figures import runs as figures
from commlab.ui import runs

COLUMNS = ["label", "status", "hook", "wrapper", "hook_impl", "backend", "world_size", "workload",
           "rank", "start_iter", "min_compression_rate", "use_error_feedback", "warm_start",
           "bucket_cap_mb", "steps", "steps_planned", "final_loss", "median_step_s",
           "bytes_per_step", "compression_ratio", "run_id", "error", "skipped_lines"]
FORMATS = {"final_loss": "%.4f", "median_step_s": "%.4f", "bytes_per_step": "localized",
           "compression_ratio": "%.2f"}

st.title("Runs")
if "deleted" in st.session_state:
    st.success(st.session_state.pop("deleted"))
rows = runs.run_table()
if not rows:
    lab_widgets.stop_without_runs("every run is listed here, also after the app restarts.")

st.dataframe(pd.DataFrame(rows)[COLUMNS], hide_index=True, key="runs_table",
             column_config={k: st.column_config.NumberColumn(format=f) for k, f in FORMATS.items()})

choices = runs.run_choices()
chosen = lab_widgets.pick_runs("Overlay", choices, default=[r["run_dir"] for r in rows if r["steps"]][:3])
if chosen:
    frames = runs.overlay(chosen)
    for tab, x in zip(st.tabs(["loss against step", "against wall time", "against bytes sent"]),
                      ["step", "t", "sent_bytes"]):
        tab.plotly_chart(figures.loss_figure(frames, x), key=f"overlay_{x}")

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
