"""commlab in the browser: ``streamlit run app.py``.

Navigation over the files in pages/ (the number in a file's name orders it); the sidebar says
where runs are kept and what this machine would run on.
"""
from pathlib import Path

import streamlit as st

from commlab.engine.machine import describe

st.set_page_config(page_title="commlab", layout="wide")

PAGES = sorted(Path(__file__).parent.joinpath("pages").glob("[0-9]*_*.py"),
               key=lambda p: int(p.name.split("_", 1)[0]))
nav = st.navigation([st.Page(str(p), title=p.stem.split("_", 1)[1].replace("_", " "))
                     for p in PAGES])

with st.sidebar:
    machine = describe()
    st.caption("Runs folder")
    st.code(machine["runs_dir"], language=None)
    st.caption(f"Backend here: **{machine['backend']}** ({machine['gpus']} CUDA GPU(s) seen) · "
               f"torch {machine['torch']}")
nav.run()
