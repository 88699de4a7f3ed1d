"""DDP's bucket layouts of a run, at iteration 0 and after the rebuild, side by side.
Thin: a run chosen, commlab.ui.live's layouts and story, plotly out."""
import streamlit as st

from commlab.api import open_run
from commlab.figures import runs as figures
from commlab.ui import live

st.title("Buckets")
choices = live.watch_choices()
if not choices:
    st.info("No runs yet. Launch one on **Launch and watch**: its bucket layouts appear here "
            "once it has done two steps (DDP rebuilds its buckets after the first).")
    st.page_link("pages/1_Launch_and_watch.py", label="Launch and watch", icon=":material/play_arrow:")
    st.stop()

paths = [c["path"] for c in choices]
by_path = {c["path"]: c for c in choices}
current = st.session_state.get("watch")
path = st.selectbox("Run", paths, index=paths.index(current) if current in paths else 0,
                    format_func=lambda p: f"{by_path[p]['label']} — {by_path[p]['status']}")
buckets = open_run(path).buckets()
st.write(live.bucket_story(buckets))
if not buckets:
    st.stop()

layouts = live.bucket_layouts(buckets)
st.plotly_chart(figures.buckets_figure(layouts, live.cap_bytes(buckets)), key="buckets")
st.caption("One bar per bucket, split into its parameters (the same colour in both layouts); "
           "buckets top to bottom in the order DDP reduces them; the dashed line is the cap "
           f"({live.cap_bytes(buckets):,} bytes = bucket_cap_mb {buckets['bucket_cap_mb']:g}).")
for col, (title, rows) in zip(st.columns(len(layouts)), layouts.items()):
    col.markdown(f"**{title}**")
    if rows:
        col.dataframe(live.bucket_table(rows), hide_index=True,
                      column_config={"share of cap": st.column_config.NumberColumn(format="percent")})
    else:
        col.caption("not recorded")
for title, log in live.ddp_logged_sizes(buckets).items():
    if log["logged"] is None:
        st.caption(f"DDP's log has no {log['field']} yet ({title}).")
    else:
        verdict = "agrees with" if log["agrees"] else "differs from"
        st.caption(f"DDP's own {log['field']} {log['logged']} {verdict} the {title} layout "
                   f"recorded in the hook {log['recorded']}.")
