"""DDP's bucket layouts of a run, at iteration 0 and after the rebuild, side by side, and its traced
steps' timeline (a sharded run's by unit: it has no buckets).
Thin: a run chosen with lab_widgets' picker, commlab.analysis.buckets' layouts and story, plotly out."""
import streamlit as st

import lab_widgets
from commlab.analysis import buckets, units
from commlab.api import open_run
from commlab.figures import runs as figures
from commlab.figures import timeline as timeline_figures
from commlab.ui import runs

st.title("Buckets")
choices = runs.run_choices()
if not choices:
    lab_widgets.stop_without_runs("its bucket layouts appear here once it has done two steps "
                                  "(DDP rebuilds its buckets after the first).")

run = open_run(lab_widgets.pick_run(choices)["path"])
if damage := run.damage("buckets.json"):
    st.warning(lab_widgets.literal(damage))
    st.stop()
recorded = run.buckets()
sharded = run.meta().get("sharded")
st.write(lab_widgets.literal(buckets.units_story(sharded) if sharded else buckets.bucket_story(recorded)))
if recorded:
    layouts = buckets.bucket_layouts(recorded)
    st.plotly_chart(figures.buckets_figure(layouts, buckets.cap_bytes(recorded)), key="buckets")
    st.caption("One bar per bucket, split into its parameters (the same colour in both layouts); "
               "buckets top to bottom in the order DDP reduces them; the dashed line is the cap "
               f"({units.human_bytes(buckets.cap_bytes(recorded))} = bucket_cap_mb "
               f"{recorded['bucket_cap_mb']:g}).")
    for col, (title, rows) in zip(st.columns(len(layouts)), layouts.items()):
        col.markdown(f"**{title}**")
        if rows:
            col.dataframe(buckets.bucket_table(rows), hide_index=True,
                          column_config={"share of cap": st.column_config.NumberColumn(format="percent")})
        else:
            col.caption("not recorded")
    for title, log in buckets.ddp_logged_sizes(recorded).items():
        if log["logged"] is None and log["recorded"]:
            # The hook saw the layout; DDP's log was saved before DDP wrote this field into it.
            st.caption(f"DDP's log, as saved in the run folder, does not hold {log['field']}: the "
                       f"{title} layout drawn above is the one the hook recorded.")
        elif log["logged"] is None:
            st.caption(f"DDP's log has no {log['field']} yet ({title}): nothing to compare.")
        else:
            verdict = "agrees with" if log["agrees"] else "differs from"
            st.caption(f"DDP's own {log['field']} {log['logged']} {verdict} the {title} layout "
                       f"recorded in the hook {log['recorded']}.")

st.subheader("One step, rank by rank")
traced = run.timeline()
if traced.get("steps"):
    step = st.selectbox("traced step", list(traced["steps"]), key="trace_step")
    st.plotly_chart(timeline_figures.step_figure(traced, step), key="timeline")
    st.caption(timeline_figures.caption(traced))
else:
    st.caption("No step of this run was traced (trace_steps; it needs instrument on).")
if (trace := run.trace()) is not None:
    st.download_button("Download trace.json (Perfetto, chrome://tracing)", trace,
                       file_name=f"{run.id}-trace.json", mime="application/json")
# torch_profiler: every operator of the traced steps, recorded with the instrumentation off too
for path in run.profiler_traces():
    st.download_button(f"Download torch.profiler trace {path.name}", path.read_bytes(),
                       file_name=f"{run.id}-{path.name}", mime="application/json", key=path.name)
