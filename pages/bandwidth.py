"""Collective bandwidth by message size (nccl-tests' columns: time, algbw, busbw, #wrong, out-of-place
and in-place; the memory-copy ceiling) and the noop headroom test.  Thin: widgets in,
commlab.teach.bench / commlab.teach.headroom, plotly out."""
import streamlit as st

import lab_widgets
from commlab.analysis.ring import bus_factor
from commlab.config import ConfigError
from commlab.figures import bench as figs
from commlab.teach import bench, headroom
from commlab.workloads import BUILTIN

SIZES = ["1KB", "4KB", "16KB", "64KB", "256KB", "1MB", "4MB", "16MB", "64MB"]


def bandwidth_section() -> None:
    c1, c2, c3 = st.columns(3)
    world_size = c1.slider("Ranks", 1, 8, 2)
    backend = c2.selectbox("Backend", bench.BACKENDS,
                           help="auto: NCCL when there is a GPU for every rank, Gloo otherwise")
    iters = c3.number_input("Timed iterations per size (0: chosen by size)", 0, 1000, 0)
    sizes = st.multiselect("Message sizes", SIZES, SIZES[:-1])
    collectives = st.multiselect("Collectives", bench.COLLECTIVES, bench.COLLECTIVES[:4])
    try:
        plan = bench.bench_plan(world_size, sizes, backend, iters or None, collectives=collectives)
    except ConfigError as e:
        lab_widgets.show_errors(e)
        return
    if st.button("Measure", type="primary"):
        progress = st.progress(0.0, text=f"Starting {world_size} process(es) on {plan.backend} ...")
        finished: list[bench.BenchRow] = []

        def on_row(row: bench.BenchRow) -> None:
            finished.append(row)
            progress.progress(len(finished) / (len(plan.sizes) * len(plan.collectives)),
                              text=f"{row.collective} {row.size}: busbw "
                                   f"{row.out_of_place.busbw_gbytes_s:.3f} GB/s")

        try:
            st.session_state["bench"] = bench.run_plan(plan, on_row=on_row)
        except (RuntimeError, TimeoutError) as e:
            st.error(f"The benchmark failed: {e}")
        progress.empty()
    result = st.session_state.get("bench")
    if result:
        table = figs.bench_table(result)
        factors = ", ".join(f"{c} × {bus_factor(c, result.world_size):.2f}"
                            for c in dict.fromkeys(r.collective for r in result.rows))
        st.markdown(f"**{result.world_size} rank(s) on {result.backend}**; busbw = algbw × the "
                    f"collective's bus factor (nccl-tests' PERFORMANCE.md): {factors}.")
        wrong = int(table[["out-of-place #wrong", "in-place #wrong"]].to_numpy().sum())
        (st.error if wrong else st.success)(
            f"#wrong: {wrong} element(s) differ from the exact answer over every collective, "
            "size and rank (each call checked once on a known pattern after the timed ones).")
        st.dataframe(table, hide_index=True)
        st.plotly_chart(figs.bandwidth_chart(table, result.backend))
        st.plotly_chart(figs.time_chart(table))
        st.caption("Out-of-place writes the result to a second buffer; torch.distributed's "
                   "all_reduce, broadcast and reduce work only in place, so their out-of-place "
                   "time includes copying into that buffer first (as torch's functional "
                   "collectives do). Time is averaged over iterations and ranks.")


def headroom_section() -> None:
    st.markdown(
        "PyTorch documents `noop_hook` for this test: it sends nothing, so a step with it costs "
        "the computation alone. *\"If only less than 10% speedup of training time can be observed "
        "after this hook is registered, it usually implies that allreduce is not a performance "
        "bottleneck\"* (the hook's documentation). One figure answers it: the **"
        f"{headroom.SAVED_LABEL}**, 1 − noop step / allreduce step, held against that "
        f"{headroom.THRESHOLD:.0%} (read as training time saved).")
    c1, c2, c3 = st.columns(3)
    workload = c1.selectbox("Workload", list(BUILTIN), index=list(BUILTIN).index("mlp"))
    steps = c2.slider("Steps per run", 10, 200, 40)
    world_size = c3.slider("Ranks", 1, 8, 2, key="headroom_ranks")
    if st.button("Compare noop with allreduce", type="primary"):
        with st.spinner(f"Two runs of {steps} steps, one after the other ..."):
            try:
                st.session_state["headroom"] = headroom.measure_headroom(workload, steps, world_size)
            except ConfigError as e:
                lab_widgets.show_errors(e)
            except (RuntimeError, TimeoutError) as e:
                st.error(f"A run failed: {e}")
    h = st.session_state.get("headroom")
    if h:
        c1, c2, c3 = st.columns(3)
        c1.metric("allreduce step", f"{h.step_s_allreduce * 1e3:.2f} ms")
        c2.metric("noop step", f"{h.step_s_noop * 1e3:.2f} ms")
        c3.metric(headroom.SAVED_LABEL, f"{h.saved:.0%}", help=headroom.SAVED_HELP)
        (st.warning if h.allreduce_is_bottleneck else st.success)(h.verdict)
        st.plotly_chart(figs.headroom_chart(h))
        st.caption(f"Median of steps {h.skip}–{h.steps - 1} of {h.workload} on {h.world_size} "
                   f"rank(s); runs {h.run_ids['allreduce']} and {h.run_ids['noop']}.")


st.title("Bandwidth")
st.caption("How fast the collectives move data here, measured as nccl-tests measures them: "
           "algbw = S / t, busbw = algbw × the collective's bus factor (what each rank's link "
           "carried), and #wrong, beside the machine's memory-copy rate measured in the same run "
           "as the ceiling.")
bandwidth_tab, headroom_tab = st.tabs(["Collective bandwidth", "Headroom (noop vs allreduce)"])
with bandwidth_tab:
    bandwidth_section()
with headroom_tab:
    headroom_section()
