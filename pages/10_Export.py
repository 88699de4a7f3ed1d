"""Export a run's settings, or settings entered here, for production: config files, snippets, scripts.
Thin: widgets in, commlab.tune.export, one copy-ready block and one download button per format."""
import shlex

import streamlit as st

from commlab.api import list_runs
from commlab.config import HOOKS, WRAPPERS, ConfigError, RunConfig
from commlab.tune import export

TITLES = {"json": "JSON", "toml": "TOML", "ddp": "Plain DDP", "lightning": "Lightning",
          "accelerate": "Accelerate", "torchrun": "torchrun", "slurm": "SLURM"}


def settings_form() -> RunConfig | None:
    d = RunConfig()
    c1, c2, c3 = st.columns(3)
    hook = c1.selectbox("Hook", HOOKS, index=HOOKS.index("powersgd"))
    wrapper = c2.selectbox("Compress wrapper", WRAPPERS, disabled=hook == "noop")
    world_size = c3.number_input("Processes (world size)", 1, 4096, d.world_size)
    values = {"hook": hook, "wrapper": "none" if hook == "noop" else wrapper, "world_size": world_size}
    if hook in ("powersgd", "batched_powersgd"):
        c1, c2, c3 = st.columns(3)
        values["matrix_approximation_rank"] = c1.number_input("matrix_approximation_rank", 1, 1024,
                                                              d.matrix_approximation_rank)
        values["start_powerSGD_iter"] = c2.number_input("start_powerSGD_iter", 0, 10**9,
                                                        d.start_powerSGD_iter)
        values["min_compression_rate"] = c3.number_input("min_compression_rate", 0.01, 1e6,
                                                         d.min_compression_rate)
        c1, c2, c3 = st.columns(3)
        values["use_error_feedback"] = c1.checkbox("use_error_feedback", d.use_error_feedback)
        values["warm_start"] = c2.checkbox("warm_start", d.warm_start)
        values["batch_tensors_with_same_shape"] = c3.checkbox("batch_tensors_with_same_shape",
                                                              d.batch_tensors_with_same_shape)
        c1, c2, _ = st.columns(3)
        values["orthogonalization_epsilon"] = c1.number_input("orthogonalization_epsilon", 0.0, 1.0,
                                                              d.orthogonalization_epsilon, format="%g")
        values["random_seed"] = c2.number_input("random_seed", 0, 2**31 - 1, d.random_seed)
    values["bucket_cap_mb"] = st.number_input("DDP bucket_cap_mb", 0.01, 4096.0, 25.0)
    try:
        return RunConfig.from_dict(values, "these settings").check()
    except ConfigError as e:
        for field, msg in e.errors.items():
            st.error(f"**{field}**: {msg}")
        return None


def target_form() -> export.Target | None:
    with st.expander("Where it will run (torchrun, SLURM, Lightning, Accelerate)"):
        c1, c2, c3 = st.columns(3)
        nnodes = c1.number_input("Nodes", 1, 4096, 1)
        nproc = c2.number_input("Processes per node (0: the run's world size)", 0, 1024, 0)
        backend = c3.selectbox("Production backend", ["nccl", "gloo"],
                               help="decides which warnings apply to PyTorch's own hooks")
        c1, c2 = st.columns(2)
        script = c1.text_input("Training script", "train.py")
        script_args = c2.text_input("Its arguments (shell words)", "")
        c1, c2, c3, c4 = st.columns(4)
        endpoint = c1.text_input("Rendezvous endpoint (host:port)", "",
                                 help="empty: the script reads $HEAD_NODE")
        job_name = c2.text_input("Job name", "commlab")
        time_limit = c3.text_input("SLURM time limit", "01:00:00")
        partition = c4.text_input("SLURM partition", "")
    try:
        target = export.Target(nnodes=nnodes, nproc_per_node=nproc or None, backend=backend,
                               script=script, script_args=shlex.split(script_args),
                               rdzv_endpoint=endpoint or None, job_name=job_name,
                               time_limit=time_limit, partition=partition or None)
    except ValueError as e:
        st.error(f"Script arguments: {e}")
        return None
    for field, msg in target.errors().items():
        st.error(f"**{field}**: {msg}")
    return None if target.errors() else target


st.title("Export")
st.caption("The chosen settings for production, with PyTorch's own hooks: a config file that loads "
           "back into commlab, a snippet for plain DDP, Lightning or Accelerate, and launch lines "
           "for torchrun and SLURM. Every block has a copy button at its top right.")

runs = list_runs()
source = st.radio("Settings from", ["a run", "settings entered here"], index=0 if runs else 1,
                  horizontal=True)
cfg, source_id = None, None
if source == "a run":
    if not runs:
        st.info("No runs yet: start one on **Launch and watch** or **Sweep**, or enter settings here.")
    else:
        run = st.selectbox("Run", runs, format_func=lambda r: f"{r.id} ({r.status()})")
        cfg, source_id = run.config(), run.id
        st.caption(f"Settings of run `{run.id}`: {cfg.label()}")
else:
    cfg = settings_form()

target = target_form()
if cfg is not None and target is not None:
    general = export.notes(cfg, target)
    for note in general:
        st.warning(note)
    tabs = st.tabs([TITLES[f] for f in export.FORMATS])
    for tab, fmt in zip(tabs, export.FORMATS):
        with tab:
            try:
                out = export.render(cfg, fmt, target, source_id)
            except export.ExportRefused as e:
                st.error(str(e))
                continue
            for note in out.notes:
                if note not in general:
                    st.warning(note)
            st.download_button(f"Download {out.filename}", out.text, file_name=out.filename,
                               mime=out.mime, key=f"download_{fmt}")
            st.code(out.text, language=out.language)
