"""Allreduce bandwidth by message size (algbw, busbw, the memory-copy ceiling) and the noop
headroom test.  Thin: widgets in, commlab.teach.bench / commlab.teach.headroom, plotly out."""
import streamlit as st

import lab_widgets
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
    try:
        plan = bench.bench_plan(world_size, sizes, backend, iters or None)
    except ConfigError as e:
        lab_widgets.show_errors(e)
        return
    if st.button("Measure", type="primary"):
        progress = st.progress(0.0, text=f"Starting {world_size} process(es) on {plan.backend} ...")
        finished: list[bench.BenchRow] = []

        def on_row(row: bench.BenchRow) -> None:
            finished.append(row)
            progress.progress(len(finished) / len(plan.sizes),
                              text=f"{row.size}: busbw {row.busbw_gbps:.3f} GB/s")

        try:
            st.session_state["bench"] = bench.run_plan(plan, on_row=on_row)
        except (RuntimeError, TimeoutError) as e:
            st.error(f"The benchmark failed: {e}")
        progress.empty()
    result = st.session_state.get("bench")
    if result:
        table = figs.bench_table(result)
        st.markdown(f"**{result.world_size} rank(s) on {result.backend}**; busbw = algbw × "
                    f"2(N−1)/N = algbw × {bench.bus_factor(result.world_size):.2f}")
        st.plotly_chart(figs.bandwidth_chart(table, result.backend))
        st.plotly_chart(figs.time_chart(table))
        st.dataframe(table, hide_index=True)


def headroom_section() -> None:
    st.markdown(
        "PyTorch documents `noop_hook` for this test: it sends nothing, so a step with it costs "
        "the computation alone. If switching from `allreduce` to `noop` speeds a step up by "
        "**less than about 10%**, allreduce is not the bottleneck and compressing gradients "
        "would save little.")
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
        # The delta is the change in step time from allreduce to noop: -comm_share, not -speedup.
        c2.metric("noop step", f"{h.step_s_noop * 1e3:.2f} ms", f"{-h.comm_share:.0%} vs allreduce",
                  delta_color="off")
        c3.metric("communication share", f"{h.comm_share:.0%}")
        (st.warning if h.allreduce_is_bottleneck else st.success)(h.verdict)
        st.plotly_chart(figs.headroom_chart(h))
        st.caption(f"Median of steps {h.skip}–{h.steps - 1} of {h.workload} on {h.world_size} "
                   f"rank(s); runs {h.run_ids['allreduce']} and {h.run_ids['noop']}.")


st.title("Bandwidth")
st.caption("How fast allreduce moves data here, measured as nccl-tests measures it: algbw = S / t, "
           "busbw = algbw · 2(N−1)/N (what each rank's link carried in a ring), beside the "
           "machine's memory-copy rate measured in the same run as the ceiling.")
bandwidth_tab, headroom_tab = st.tabs(["Allreduce bandwidth", "Headroom (noop vs allreduce)"])
with bandwidth_tab:
    bandwidth_section()
with headroom_tab:
    headroom_section()
