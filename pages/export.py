"""Export a run's settings, or settings entered here, for production: config files, snippets, scripts.
Thin: widgets in, commlab.tune.export, one copy-ready block and one download button per format.
Every bad field is named, as on Launch, and nothing is shown or downloads until it is fixed: no
widget clamps a value, so what the page shows is what an export would say."""
import streamlit as st

import lab_widgets
from commlab.api import open_run
from commlab.config import RESOLVED_BACKENDS, ConfigError, RunConfig, settings
from commlab.tune import export
from commlab.ui import form, runs

TITLES = {"json": "JSON", "toml": "TOML", "ddp": "Plain DDP", "lightning": "Lightning",
          "accelerate": "Accelerate", "trainer": "HF Trainer", "torchrun": "torchrun", "slurm": "SLURM",
          "loop": "DiLoCo: plain PyTorch", "torchft": "DiLoCo: torchft"}
# What the form shows first: PowerSGD, the hook an export is usually for.
PRESET = RunConfig(hook="powersgd")


def settings_form() -> RunConfig | None:
    """The settings the exports render (the table marks them) that apply to the hook chosen (the
    first), three to a row."""
    values: dict = {}
    columns = st.columns(3)
    for s in settings():
        if s.export and form.shown(s, values):
            w = form.widget(s, value=getattr(PRESET, s.name), prefix="export_", titled=True)
            values[s.name] = w.draw(columns[len(values) % len(columns)])
    # Checked as production reads the settings: the workload is never run (no probe), and this
    # machine's GPUs and runs folder do not count.
    try:
        cfg = RunConfig.from_dict(values, "the form")
    except ConfigError as e:
        cfg, errors = None, e.errors
    else:
        errors = export.export_errors(cfg)
    lab_widgets.show_errors(errors)
    return None if errors else cfg


def target_form() -> export.Target | None:
    d = export.Target()
    with st.expander("Where it will run (torchrun, SLURM, Lightning, Accelerate)"):
        c1, c2, c3 = st.columns(3)
        # No bounds: Target.errors names a bad value; a clamped widget would show one value and
        # export another.
        nnodes = c1.number_input("Nodes", value=d.nnodes, step=1)
        nproc = c2.number_input("Processes per node (0: the run's world size)", value=0, step=1)
        backend = c3.selectbox("Production backend", RESOLVED_BACKENDS,
                               index=RESOLVED_BACKENDS.index(d.backend),
                               help="decides which warnings apply to PyTorch's own hooks")
        c1, c2, c3 = st.columns(3)
        script = c1.text_input("Training script", d.script)
        script_args = c2.text_input("Its arguments (shell words)", "")
        threads = c3.number_input("Threads per process (OMP_NUM_THREADS)", value=d.threads_per_process,
                                  step=1, help="SLURM's --cpus-per-task is processes per node × this")
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
            time_limit=time_limit, partition=partition, threads_per_process=threads)
    except ValueError as e:
        lab_widgets.show_errors({"script_args": str(e)})
        return None
    lab_widgets.show_errors(target.errors())
    return None if target.errors() else target


st.title("Export")
st.caption("The chosen settings for production: a config file that loads back into commlab, a "
           "snippet for plain DDP, Lightning or Accelerate, and launch lines for torchrun and "
           "SLURM. Snippets use PyTorch's hooks where they work on the production backend and "
           "commlab's (commlab.hooks) where they fail or PyTorch has none, and say which; a tab "
           "that cannot carry the settings says why. Every block has a copy button at its top "
           "right.")

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
            if errors := export.export_errors(cfg):
                raise ConfigError(errors)
        except ConfigError as e:  # a damaged run, or one whose settings no longer validate
            lab_widgets.show_errors({k: lab_widgets.literal(m) for k, m in e.errors.items()})
        else:
            st.caption(f"Settings of run {lab_widgets.literal(run.id)}: "
                       f"{lab_widgets.literal(cfg.label())}")
else:
    cfg = settings_form()

target = target_form()
if (cfg is None and (source != "a run" or choices)) or target is None:
    st.error("Nothing to export until every field named above is fixed.")
elif cfg is not None:
    general = export.notes(cfg, target)
    for note in general:
        st.warning(note)
    formats = export.formats_for(cfg)
    tabs = st.tabs([TITLES[f] for f in formats])
    for tab, fmt in zip(tabs, formats):
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
