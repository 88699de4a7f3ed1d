"""Export a run's settings, or settings entered here, for production: config files, snippets, scripts.
Thin: widgets in, commlab.tune.export, one copy-ready block and one download button per format."""
import streamlit as st

import lab_widgets
from commlab.api import open_run
from commlab.config import RESOLVED_BACKENDS, ConfigError, RunConfig, settings
from commlab.tune import export
from commlab.ui import form, runs

TITLES = {"json": "JSON", "toml": "TOML", "ddp": "Plain DDP", "lightning": "Lightning",
          "accelerate": "Accelerate", "torchrun": "torchrun", "slurm": "SLURM"}
# What the form shows first: PowerSGD, the hook an export is usually for.
PRESET = RunConfig(hook="powersgd")


def settings_form() -> RunConfig | None:
    """The settings the exports render (the table marks them), three to a row."""
    values: dict = {}
    columns = st.columns(3)
    for i, s in enumerate(s for s in settings() if s.export):
        w = form.widget(s, values, value=getattr(PRESET, s.name), prefix="export_", titled=True)
        values[s.name] = w.draw(columns[i % len(columns)])
    cfg, errors = form.config_from_form(values)
    lab_widgets.show_errors(errors)
    return None if errors else cfg


def target_form() -> export.Target | None:
    d = export.Target()
    with st.expander("Where it will run (torchrun, SLURM, Lightning, Accelerate)"):
        c1, c2, c3 = st.columns(3)
        nnodes = c1.number_input("Nodes", 1, 4096, d.nnodes)
        nproc = c2.number_input("Processes per node (0: the run's world size)", 0, 1024, 0)
        backend = c3.selectbox("Production backend", RESOLVED_BACKENDS,
                               index=RESOLVED_BACKENDS.index(d.backend),
                               help="decides which warnings apply to PyTorch's own hooks")
        c1, c2 = st.columns(2)
        script = c1.text_input("Training script", d.script)
        script_args = c2.text_input("Its arguments (shell words)", "")
        c1, c2, c3, c4 = st.columns(4)
        endpoint = c1.text_input("Rendezvous endpoint (host:port)", "",
                                 help="empty: the script reads $HEAD_NODE")
        job_name = c2.text_input("Job name", d.job_name)
        time_limit = c3.text_input("SLURM time limit", d.time_limit)
        partition = c4.text_input("SLURM partition", "")
    try:
        target = export.Target.from_entries(
            nnodes=nnodes, nproc_per_node=nproc or None, backend=backend, script=script,
            script_args=script_args, rdzv_endpoint=endpoint, job_name=job_name,
            time_limit=time_limit, partition=partition)
    except ValueError as e:
        lab_widgets.show_errors({"script_args": str(e)})
        return None
    lab_widgets.show_errors(target.errors())
    return None if target.errors() else target


st.title("Export")
st.caption("The chosen settings for production, with PyTorch's own hooks: a config file that loads "
           "back into commlab, a snippet for plain DDP, Lightning or Accelerate, and launch lines "
           "for torchrun and SLURM. Every block has a copy button at its top right.")

choices = runs.run_choices()
source = st.radio("Settings from", ["a run", "settings entered here"], index=0 if choices else 1,
                  horizontal=True)
cfg, source_id = None, None
if source == "a run":
    if not choices:
        st.info("No runs yet: start one on **Launch and watch** or **Sweep**, or enter settings here.")
    else:
        run = open_run(lab_widgets.pick_run(choices)["path"])
        try:
            if damage := run.damage("config.json"):
                raise ConfigError({"config.json": damage})
            cfg, source_id = run.config(), run.id
        except ConfigError as e:  # a damaged run, or one whose settings no longer validate
            lab_widgets.show_errors({k: lab_widgets.literal(m) for k, m in e.errors.items()})
        else:
            st.caption(f"Settings of run {lab_widgets.literal(run.id)}: "
                       f"{lab_widgets.literal(cfg.label())}")
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
