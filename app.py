"""commlab in the browser: ``streamlit run app.py``.

The navigation is the table below, in sections that follow the work; the sidebar says where runs
are kept and what this machine would run on.
"""
import streamlit as st

from commlab.engine.machine import describe

# section -> its pages: (file, title). The order here is the order in the sidebar.
SECTIONS = {
    "Run": [("pages/launch_and_watch.py", "Launch and watch"), ("pages/runs.py", "Runs")],
    "Understand": [("pages/compression_rule.py", "Compression rule"),
                   ("pages/low_rank_error.py", "Low-rank error"), ("pages/buckets.py", "Buckets")],
    "Teach": [("pages/classroom.py", "Classroom"), ("pages/bandwidth.py", "Bandwidth")],
    "Tune and export": [("pages/sweep.py", "Sweep"), ("pages/what_if.py", "What if"),
                        ("pages/compare.py", "Compare"), ("pages/export.py", "Export")],
}

st.set_page_config(page_title="commlab", layout="wide")
nav = st.navigation({section: [st.Page(file, title=title) for file, title in pages]
                     for section, pages in SECTIONS.items()})

with st.sidebar:
    machine = describe()
    st.caption("Runs folder")
    st.code(machine["runs_dir"], language=None)
    st.caption(f"Backend here: **{machine['backend']}** ({machine['gpus']} CUDA GPU(s) seen) · "
               f"torch {machine['torch']}")
nav.run()
