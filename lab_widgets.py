"""Streamlit pieces every page shares: one error display, one run picker, one launcher picker.

It lives beside ``app.py`` because ``commlab`` never imports Streamlit; ``streamlit run`` puts this
folder on ``sys.path`` (and the tests do the same for AppTest).
"""
from __future__ import annotations

import re
import threading

import pandas as pd
import streamlit as st

from commlab.config import ConfigError
from commlab.engine.run_folder import RunFolder

# The run the pages show, whichever page chose it; Launch sets it to the run it starts.
RUN_KEY = "watch"


def _warm_imports() -> None:
    # torch takes seconds to import; the pages that build models (Compression rule, Low-rank
    # error) would each pay it on a first visit. Imported once, in the background, while the
    # person reads the first page (Python's import lock makes a page that needs it meanwhile wait).
    import commlab.analysis.shapes  # noqa: F401  (torch and the workloads)


# Once per server process: every page imports this module, Python runs its body once.
threading.Thread(target=_warm_imports, name="commlab-warm-imports", daemon=True).start()


LAUNCHERS = ("this machine", "Slurm")


def launcher(prefix: str):
    """Where runs start: this machine, or Slurm where ``sbatch`` is found here (then the job's
    nodes, time limit, partition and interface).  Returns (``SlurmJob`` or None, errors by field)."""
    import os

    from commlab.engine.launchers import nodes, slurm

    if not slurm.available():
        return None, {}
    where = st.radio("Launcher", LAUNCHERS, horizontal=True, key=f"{prefix}_launcher",
                     help="Slurm submits each run as a batch job (sbatch) and follows it here: "
                          "pending in the queue, running, its end; Stop cancels the job. The runs "
                          "folder must be shared with the compute nodes.")
    if where == LAUNCHERS[0]:
        return None, {}
    c1, c2, c3, c4 = st.columns(4)
    count = c1.number_input("Nodes", min_value=1, value=1, step=1, key=f"{prefix}_nodes")
    limit = c2.text_input("Time limit", slurm.SlurmJob.time_limit, key=f"{prefix}_time_limit")
    partition = c3.text_input("Partition (empty: the cluster's default)", key=f"{prefix}_partition")
    ifname = c4.text_input("Interface between nodes", os.environ.get(nodes.IFNAME_ENV, ""),
                           key=f"{prefix}_ifname", help="needed on several nodes: `ip -brief address` lists them")
    try:
        return slurm.SlurmJob.given(int(count), limit, partition, ifname), {}
    except ConfigError as e:
        return None, e.errors


def show_errors(errors: ConfigError | dict[str, str], slots: dict | None = None) -> None:
    """Every problem, each under its field's name (in the field's own slot when the page has one)."""
    errors = errors.errors if isinstance(errors, ConfigError) else errors
    for name, msg in errors.items():
        target = (slots or {}).get(name)
        (target if target is not None else st).error(f"**{name}**: {msg}")


# What makes markdown of text: links and images ([ ]), HTML and autolinks (< >), code, emphasis,
# LaTeX, strikethrough, tables; an underscore only at a word's edge (inside one it emphasizes
# nothing); a heading, list or quote only at a line's start. Plain words, ids and paths stay as
# they are.
_MARKDOWN = re.compile(r"([\\`*\[\]<>$~|])|(?<!\w)(_)|(_)(?!\w)|(?m:^)(\s*)([#+\-])")


def literal(text) -> str:
    """A string from a run folder (an error, a label, an id, a workload name) for an element that
    renders markdown: every markdown character escaped, so that it shows as the text it is and
    an image link in it makes the browser fetch nothing."""
    return _MARKDOWN.sub(lambda m: f"{m[4] or ''}\\{m[1] or m[2] or m[3] or m[5]}", str(text))


def run_name(run: dict) -> str:
    """How every picker names a run (a ``commlab.ui.runs`` row): what tells it apart, then its status."""
    return f"{run['label']} — {run['status']}"


def pick_run(choices: list[dict], label: str = "Run") -> dict:
    """The one run picker, over ``commlab.ui.runs.run_choices()`` or a page's share of them.

    It shows the run last chosen on any page, else the first choice: running runs come first, so
    a reloaded page re-attaches to one. Returns the chosen row (path, label, status)."""
    by_path = {c["path"]: c for c in choices}
    paths = list(by_path)
    remembered = st.session_state.get(RUN_KEY)
    shown = paths.index(remembered) if remembered in by_path else 0
    path = st.selectbox(label, paths, index=shown, format_func=lambda p: run_name(by_path[p]))
    # Remember a choice, or the first run shown when none is remembered; a page that offers only
    # some runs (Low-rank error) does not make the others forget a run it merely leaves out.
    if path != paths[shown] or not (remembered and RunFolder(remembered).exists()):
        st.session_state[RUN_KEY] = path
    return by_path[path]


def pick_runs(label: str, choices: list[dict], default: list[str]) -> list[str]:
    """Several runs, named as ``pick_run`` names them; returns their paths."""
    by_path = {c["path"]: c for c in choices}
    # A default read from another listing may name a run deleted since.
    return st.multiselect(label, list(by_path), default=[p for p in default if p in by_path],
                          format_func=lambda p: run_name(by_path[p]))


def stop_without_runs(why: str) -> None:
    """A page that shows runs, on a machine with none yet: say what will appear, link to Launch."""
    st.info(f"No runs yet. Launch one on **Launch and watch**: {why}")
    st.page_link("pages/launch_and_watch.py", label="Launch and watch", icon=":material/play_arrow:")
    st.stop()


# The ledger table's column labels, formats and help (``commlab.ui.runs.ledger_view``'s columns).
LEDGER_TABLE = {
    "size_bytes": ("size S (B)", "localized", "nccl-tests' message size: the call's largest buffer "
                                               "(an allgather's output)"),
    "count": ("calls", "localized", None),
    "total_s": ("total latency (s)", "%.4f", "issue to completion, summed over the calls"),
    "mean_s": ("mean latency (s)", "%.6f", "total latency over the calls timed"),
    "algbw_gbytes_s": ("algbw (GB/s, gigabytes)", "%.4f", "S over the mean latency, in gigabytes (1e9 "
                       "bytes) a second as nccl-tests prints it; the lab's links are in gigabits (Gb/s)"),
    "busbw_gbytes_s": ("busbw (GB/s, gigabytes)", "%.4f", "algbw times the bus factor (nccl-tests' "
                       "PERFORMANCE.md), in gigabytes a second"),
    "bus_factor": ("bus factor", "%.3f", "allreduce 2(N-1)/N, allgather and reduce_scatter (N-1)/N, "
                                         "broadcast and reduce 1"),
    "bytes": ("bytes (S × calls)", "localized", None),
    "counted_bytes": ("counted bytes", "localized", "as metrics.jsonl counts them: the allreduce "
                                                    "payload that puts the same bytes on the wire"),
    "link_s": ("link time (s)", "%.4f", "the emulated link's own time for these calls: each lasts "
                                        "at least that long (metrics.jsonl's link_s)"),
    "link_share": ("link share", "%.2f", "link wait over total latency: what the link made of it"),
    "link_wait_s": ("link wait (s)", "%.4f", "what the link's hold added past the real completions: "
                                             "the calls' link time and their wait behind others on it"),
}


def show_ledger(view: dict, key: str) -> None:
    """A run's communication ledger (``commlab.ui.runs.ledger_view``): its totals by traffic, what
    each traffic is, and the sortable table."""
    from commlab.analysis import units

    if view["step"] is None:
        st.caption("No communication ledger: the run was not instrumented, or has no step yet.")
        return
    lines = []
    for traffic, t in view["totals"].items():
        link = (f", {t['link_share']:.0%} of it added by the emulated link"
                if view["emulated_link"] and t["link_share"] is not None else "")
        lines.append(f"- **{literal(traffic)}** ({literal(view['traffic'].get(traffic, ''))}): {t['count']:,} calls, "
                     f"{units.human_bytes(t['bytes'])}, {units.seconds(t['total_s'])} of latency{link}")
    st.caption(f"Rank 0's collectives up to step {view['step']:,}, by traffic, kind, ranks and "
               "message size; latency from issue to completion on the host's clock.")
    st.markdown("\n".join(lines))
    st.dataframe(pd.DataFrame(view["rows"], columns=view["columns"]), hide_index=True, key=key,
                 column_config={k: st.column_config.NumberColumn(label, format=fmt, help=help)
                                for k, (label, fmt, help) in LEDGER_TABLE.items()})
