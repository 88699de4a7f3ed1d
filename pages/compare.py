"""Every algorithm side by side on one workload: quality, bytes, measured and predicted step time.
Thin: runs picked, commlab.tune.compare, a table and plotly out."""
import streamlit as st

import lab_widgets
from commlab.api import RunStatus, open_run
from commlab.figures import compare as figs
from commlab.figures.whatif import ASSUMPTION
from commlab.tune import baseline as baselines
from commlab.tune import compare, held_to_real, whatif
from commlab.tune.quality import Cluster
from commlab.ui import definitions, runs

MAX_DEFAULT = 12  # runs picked at first: every finished run of the workload, up to this many

st.title("Compare")
st.caption("One workload, every algorithm you ran on it, side by side as GRACE's tables compare "
           "compressors: quality, the bytes each rank handed over per step (the ratio is the "
           "baseline's bytes over them), the step time measured here, the step time the what-if "
           "model predicts on the cluster below, and whether each pays there against the baseline "
           "you choose: fp32 allreduce, or a 16-bit one. Run them with "
           "`commlab compare --workload W --hooks a,b,c --steps N [--against fp16]`, or from Launch "
           "and watch.")

finished = [c for c in runs.run_choices() if c["status"] == RunStatus.FINISHED]
if not finished:
    lab_widgets.stop_without_runs("finished runs of one workload, one per algorithm, compare here.")
workload_of = {c["path"]: open_run(c["path"]).config_dict().get("workload") for c in finished}
workloads = list(dict.fromkeys(workload_of.values()))
workload = st.selectbox("Workload", workloads)
mine = [c for c in finished if workload_of[c["path"]] == workload]
paths = lab_widgets.pick_runs("Runs", mine, default=[c["path"] for c in mine[:MAX_DEFAULT]])
if not paths:
    st.info("Pick one or more runs.")
    st.stop()

c0, c1, c2, c3 = st.columns(4)
against = c0.selectbox("Judged against", baselines.BASELINES, format_func=baselines.title,
                       help="The allreduce the ratio, the speed-up and the break-even are against: "
                            "Han et al. (2024) argue for a 16-bit one, since fp16 and bf16 halve the "
                            "bytes for free on most models. Its run must be among those picked.")
world = c1.select_slider("Predicted for workers", whatif.WORLD_SIZES, Cluster.world_size)
bandwidth = c2.select_slider("Link bandwidth, Gb/s", whatif.BANDWIDTHS_GBPS, Cluster.bandwidth_gbps)
latency = c3.number_input("Latency per hop α, µs", 0.0, 10_000.0, Cluster.latency_us)
cluster = Cluster(world, bandwidth, latency)
rows = compare.compare_runs([open_run(p) for p in paths], cluster, against)
basis = compare.bases(rows)
title = baselines.title(against)

st.caption(f"Quality: {basis} (lower is better). Predicted on {cluster.text()}: {ASSUMPTION}. "
           f"Ratio, speed-up and *pays here?* against **{title}**.")
st.caption("The predicted steps " + "; ".join(held_to_real.beside(h, bandwidth * 1000, "whatif")
                                            for h in dict.fromkeys(r["hook"] for r in rows)) + ".")
if why := compare.missing(rows, against):
    st.warning(lab_widgets.literal(why))
number = st.column_config.NumberColumn
st.dataframe(figs.table_frame(rows), hide_index=True, key="compare_table", column_config={
    "label": st.column_config.TextColumn("setting", help="the hook and its own settings"),
    "bytes_per_step": number("bytes per step", format="localized",
                             help="per rank and step, as an allreduce payload of the same wire "
                                  "bytes; median over the steady steps"),
    "compression_ratio": number(f"ratio vs {title}", format="%.1f×",
                                help=f"{title}'s bytes per step over the run's"),
    "pays": st.column_config.TextColumn(
        "pays here?", help=f"by the what-if model on {world} workers at {latency:g} µs per hop: the "
                           "link bandwidths on which it beats the baseline in step time, or never, "
                           "or always"),
    "speedup": number(f"speed-up vs {title}", format="%.2f×",
                      help=f"{title}'s predicted step time over the run's, on {cluster.text()}"),
    "quality": number("quality", format="%.3f", help=basis),
    "median_step_s": number("step here (s)", format="%.4f"),
    "predicted_step_s": number("predicted step (s)", format="%.4f"),
    "break_even_gbps": number("break-even (Gb/s)", format="%.3g"),
    "wire_bytes": number(f"sent per rank on {world}", format="localized",
                         help="bytes; an allgather's grow with the workers, an allreduce's do not"),
    "overlap_share": number("overlap share", format="percent"),
    "heldout_accuracy": number("held-out accuracy", format="percent"),
    "heldout_bits_per_char": number("held-out bits/char", format="%.3f"),
    "hook": st.column_config.TextColumn(
        "hook", help="a compressor's definition, against its paper and GRACE: under the table"),
    "basis": "quality from", "steady_steps": "steady steps", "run_id": "run"})

compressors = [h for h in dict.fromkeys(r["hook"] for r in rows) if definitions.explain(h)]
if compressors:
    with st.expander("The compressors compared: what each sends, against its paper and GRACE, "
                     "and where the lab keeps a choice of its own"):
        for hook in compressors:
            st.markdown(f"#### {hook}\n\n{definitions.explain(hook)}")

quality_title = "held-out loss" if basis.startswith("held-out") else "loss"
# One above the other, full width: each keeps its plot area beside a legend of up to 12 runs.
st.plotly_chart(figs.quality_figure(rows, "bytes_per_step", "bytes per step and rank",
                                    "Quality vs bytes per step", quality_title))
st.plotly_chart(figs.quality_figure(rows, "predicted_step_s", "predicted step time, s",
                                    f"Quality vs predicted step · {cluster.text()}", quality_title))
