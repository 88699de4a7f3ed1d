"""What a step would cost on a cluster: the alpha-beta model fed by runs measured here.
Thin: widgets in, commlab.tune.whatif, plotly out."""
import pandas as pd
import streamlit as st

import lab_widgets
from commlab.analysis import metrics
from commlab.api import open_run
from commlab.figures import whatif as figs
from commlab.tune import baseline as baselines
from commlab.tune import held_to_real, payoff, whatif
from commlab.tune.sweep import list_sweeps
from commlab.ui import runs

st.title("What if")
st.caption("Predicted step time T = compute + arithmetic + (1 − overlap) · Σ collectives, with a ring "
           "allreduce of S bytes on N workers costing 2(N−1)·α + 2(N−1)/N·S/β and an allgather of s "
           "bytes from each (N−1)·α + (N−1)·s/β; post-local SGD adds one allreduce of the "
           "parameters every period. Compute, the hook's arithmetic and the overlap (the share of "
           "communication hidden behind backward at traced steps; 0 untraced) are measured in the "
           "runs, each hook's bytes are its own count. On this machine loopback is fast next to "
           "compression's arithmetic; on a cluster it is not.")

sweeps, choices = [s for s in list_sweeps() if not s.damage()], runs.run_choices()
if not choices:
    st.info("No runs yet: a sweep (page **Sweep**) gives the model what it needs — a plain "
            "allreduce baseline and PowerSGD settings of the same job.")
    st.stop()
kinds = (["a sweep"] if sweeps else []) + ["runs"]
kind = st.radio("Measure from", kinds, horizontal=True)
if kind == "a sweep":
    chosen = st.selectbox("Sweep", sweeps, format_func=lambda s: f"{s.id} ({s.status()})").runs()
else:
    # By default a baseline run with the newest of its job: speed-ups and break-evens need it.
    newest = [open_run(c["path"]) for c in choices[:50]]
    default = [str(r.path) for r in whatif.with_a_baseline(newest)]
    paths = lab_widgets.pick_runs("Runs", choices, default=default)
    chosen = [open_run(p) for p in paths]
damaged = [r for r in chosen if r.damage()]
for r in damaged:
    st.warning(lab_widgets.literal(f"Left out run {r.id}: {r.damage()}"))
chosen = [r for r in chosen if r not in damaged]
profiles = whatif.profiles_from_runs(chosen)
if not profiles:
    st.warning("None of these runs has steady steps to measure (runs too short, or PowerSGD never "
               f"started compressing; the first {metrics.WARMUP_STEPS} steps are start-up).")
    st.stop()

st.subheader("What each hook costs per step, measured")
st.dataframe(pd.DataFrame([{
    "hook": p.label, "compute ms": p.compute_s * 1e3, "arithmetic ms": p.arithmetic_s * 1e3,
    "bytes per step (B)": p.payload_bytes, "collectives/step": p.collectives,
    "collective": p.collective, "overlap share": p.overlap_share, "measured over": p.measured_over, "run": p.run_id} for p in profiles]), hide_index=True,
    column_config={"bytes per step (B)": st.column_config.NumberColumn(
        format="localized", help="bytes per rank and step the hook hands to the collectives")})
if any(p.measured_over != "loopback" for p in profiles):
    st.caption("Rows measured over an emulated link: the emulated link's time was taken off the "
               "hook's time to leave its arithmetic.")

held = held_to_real.table(sorted({p.hook for p in profiles}))
st.subheader("The model held to a real link")
if held:
    st.dataframe(pd.DataFrame(held), hide_index=True)
    st.caption(f"The what-if's (and the emulated link's) step over a real link's of the same rate, "
               f"median and range over the passes of {held_to_real.MEASURED} ({held_to_real.SOURCE}). "
               "Below 1 the model is faster than the real link; outside 20% the difference stays, "
               "and the predictions below carry it.")
else:
    st.caption("None of these hooks was held to a real link: "
               + held_to_real.beside(profiles[0].hook, None, "whatif") + ".")

c0, c1, c2, c3 = st.columns(4)
against = c0.selectbox("Judged against", baselines.BASELINES, format_func=baselines.title,
                       key="whatif_against", help="The allreduce the speed-ups and break-evens are "
                       "against (fp32, or a 16-bit one); its run must be among those measured.")
latency = c1.number_input("Latency per hop α, µs", 0.0, 10_000.0, whatif.DEFAULT_LATENCY_US)
bandwidth = c2.select_slider("Bandwidth for the workers chart, Gb/s", whatif.BANDWIDTHS_GBPS, 10)
workers = c3.select_slider("Workers for the bandwidth chart", whatif.WORLD_SIZES, 64)
# One curve and one answer per setting: the median over its seeds (the tables below keep each run).
rows = whatif.over_seeds(whatif.predict(profiles, whatif.WORLD_SIZES, whatif.BANDWIDTHS_GBPS, latency))
c1, c2 = st.columns(2)
c1.plotly_chart(figs.workers_figure(rows, bandwidth))
c2.plotly_chart(figs.bandwidth_figure(rows, workers))
st.plotly_chart(figs.winner_map(whatif.winners(rows, against), baselines.title(against)))
st.caption(f"Assumptions: {figs.ASSUMPTION}.")

base = whatif.baseline_profile(profiles, against)
st.subheader("Where compression pays off")
if base:
    paid = [p for n in (8, 64, 1024) for p in payoff.by_setting(profiles, n, latency, against)]
    st.dataframe(pd.DataFrame([{"hook": p.label, "workers": p.world_size, "pays here?": p.sentence(),
                                "break-even (Gb/s)": p.break_even_gbps, "seeds": p.seeds,
                                "lowest (Gb/s)": p.low_gbps, "highest (Gb/s)": p.high_gbps}
                               for p in paid]), hide_index=True)
    st.caption(f"Against {baselines.title(against)} (each seed against its own seed's run), at "
               f"{latency:g} µs per hop: where the what-if model's step-time curves cross; the median "
               "over a setting's seeds, and their range.")
else:
    st.info(f"No {baselines.title(against)} run among these: measure one to see where each hook "
            "beats it.")

checked = whatif.checks(chosen)
st.subheader("The model against measured runs")
if checked:
    st.plotly_chart(figs.check_figure(checked))
    st.dataframe(pd.DataFrame(checked), hide_index=True)
else:
    st.caption("To check the model here, run the same settings on the real link and over emulated "
               "links (`python benchmarks/whatif_check.py` does it): each emulated run is then "
               "predicted from its real-link twin.")
