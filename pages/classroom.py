"""Allreduce for the classroom: real collectives, a ring allreduce step by step, and where
gradient averaging sits in a training step.  Thin: widgets in, commlab.teach.classroom, plotly out."""
import inspect

import pandas as pd
import streamlit as st

import lab_widgets
from commlab.analysis import ring as ring_cost
from commlab.config import ConfigError
from commlab.figures import classroom as figs
from commlab.teach import averaging, classroom, real_link

# Large text for a projector: Streamlit's own elements by CSS, the figures by figs.present, the
# tables as HTML (a dataframe draws on a canvas: zoomed, it outgrows its column and the page).
# A slider's value and ticks keep their size: the slider places them for it, above its thumb.
PRESENTATION_CSS = """<style>
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li,
[data-testid="stWidgetLabel"] p, [data-testid="stAlertContentInfo"] p,
[data-testid="stTable"] th, [data-testid="stTable"] td {font-size: 1.6rem;}
[data-testid="stSliderThumbValue"] p, [data-testid="stSliderTickBar"] p {font-size: inherit;}
h1 {font-size: 3.2rem !important;} h2, h3 {font-size: 2.3rem !important;}
[data-testid="stCode"] {zoom: 1.5;}
</style>"""


def chart(fig) -> None:
    st.plotly_chart(figs.present(fig, large))


def table(frame: pd.DataFrame) -> None:
    if large:
        st.table(frame.style.hide(axis="index").format(lambda v: f"{v:.4g}" if isinstance(v, float) else v))
    else:
        st.dataframe(frame, hide_index=True)


def side_by_side(n: int) -> list:
    """``n`` columns for panels a screen shows side by side; on a projector, one below the other,
    each as wide as the page."""
    return [st.container() for _ in range(n)] if large else st.columns(n)


def scheme_panel(trace: classroom.Trace, k: int) -> None:
    phase = trace.steps[k - 1].phase if k else "before anything moves"
    st.subheader(f"{trace.scheme.capitalize()} — step {k}/{len(trace.steps)}: {phase}")
    chart(figs.ring_diagram(trace, k))
    chart(figs.holdings_figure(trace, k))
    table(figs.transfers_table(trace, k))


def describe(result: classroom.CollectiveResult) -> tuple[str, str]:
    """(the call, what it leaves on the ranks) for one real collective."""
    n, op = result.world_size, (result.op or "").upper()
    return {
        "all_reduce": (f"dist.all_reduce(op={op})", "every rank ends with the same"),
        "broadcast": (f"dist.broadcast(src={result.src})",
                      f"rank {result.src}'s tensor everywhere"),
        "reduce": (f"dist.reduce(dst={result.dst}, op={op})",
                   f"only rank {result.dst} receives the result; what the other ranks hold "
                   "afterwards is scratch (Gloo leaves partial results there)"),
        "all_gather": ("dist.all_gather_single", f"every rank ends with all {n} tensors, "
                                                 "rank 0's first"),
        "reduce_scatter": (f"dist.reduce_scatter_single(op={op})",
                           f"rank r ends with chunk r of the reduced tensor (1/{n} of it)"),
    }[result.kind]


# ---------------------------------------------------------------------------- the three sections
def real_collectives() -> classroom.Collective | None:
    """Tab 1; returns the all_reduce job the inputs describe (None while they are invalid)."""
    c1, c2, c3, c4 = st.columns(4)
    world_size = c1.slider("Ranks (processes)", 1, classroom.MAX_WORLD_SIZE, 3)
    op = c2.selectbox("Reduce op (all_reduce, reduce, reduce_scatter)", classroom.OPS,
                      format_func=str.upper)
    src = c3.number_input("Broadcast from rank", 0, world_size - 1,
                          classroom.default_src(world_size), key=f"src_{world_size}")
    dst = c4.number_input("Reduce to rank", 0, world_size - 1, 0, key=f"dst_{world_size}")
    values = st.text_area("Each rank's tensor: one line per rank, numbers split by commas",
                          "\n".join(figs.fmt(v) for v in classroom.default_values(world_size)),
                          key=f"values_{world_size}", height=80 + 12 * world_size)
    try:
        jobs = [classroom.all_reduce_job(world_size, op, values),
                classroom.broadcast_job(world_size, src, values),
                classroom.reduce_job(world_size, op, dst, values),
                classroom.all_gather_job(world_size, values)]
    except ConfigError as e:
        lab_widgets.show_errors(e)
        return None
    try:
        jobs.append(classroom.reduce_scatter_job(world_size, op, values))
    except ConfigError as e:  # only this one needs a length that N divides: run the others
        st.info(f"reduce_scatter is left out: {e.errors['values']}.")
    if st.button("Run on real processes", type="primary"):
        with st.spinner(f"Starting {world_size} Gloo process(es): "
                        + ", ".join(j.kind for j in jobs) + " ..."):
            try:
                st.session_state["collectives"] = (jobs, classroom.run_collectives(jobs))
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The processes failed: {e}")
    if "collectives" in st.session_state:
        results = st.session_state["collectives"][1]
        for row in range(0, len(results), 2):
            for column, result in zip(side_by_side(2), results[row:row + 2]):
                call, what = describe(result)
                with column:
                    st.subheader(call)
                    table(figs.rank_table(result))
                    chart(figs.before_after_chart(result, what))
        reduced = results[0]
        st.markdown("**Order in which the ranks reported back from all_reduce:** "
                    + " → ".join(f"rank {r}" for r in reduced.arrival_order))
        chart(figs.arrival_chart(reduced))
        st.info(classroom.ARRIVAL_NOTE + " Press Run again and compare.")
    return jobs[0]


def ring_walkthrough(job: classroom.Collective | None) -> None:
    if job is None:
        st.warning("Fix the tensors in tab 1 first: the ring walks through those inputs.")
        return
    n, op, length = job.world_size, job.op, len(job.values[0])
    ring, naive = classroom.ring_trace(job.values, op), classroom.naive_trace(job.values, op)
    st.markdown(
        f"The {length}-element tensor is cut into **{n} chunks**. "
        f"**Reduce-scatter** ({n - 1} steps): every rank passes one chunk to its right-hand "
        f"neighbour, which combines it ({op}) with its own copy; afterwards each rank owns one "
        f"finished chunk. **All-gather** ({n - 1} steps): the finished chunks go once more round "
        f"the ring. **{ring_cost.steps(n)} steps** in all, and each rank sends 2(N−1)/N · S = "
        f"{ring_cost.factor(n):.2f} · S bytes: here S = {length * classroom.ITEMSIZE} B, so "
        f"{max(ring.bytes_sent)} B per rank, where the naive scheme (everyone sends everything "
        f"to rank 0, which sends the result back) makes rank 0 send {max(naive.bytes_sent)} B.")
    if 1 < n and length < n:
        st.warning(f"{length} element(s) for {n} chunks: some chunks are empty, and the ring "
                   f"cannot spread the load. Give every rank at least {n} elements.")
    if n == 1:
        st.info("With one rank there is nothing to send: the result is the input.")
    else:
        k = st.slider("Step", 0, len(ring.steps), 0,
                      help="0 is before anything moves; the arrow keys walk through the steps. "
                           "The diagrams' own ▶ Play walks through every step by itself.")
        left, right = side_by_side(2)
        with left:
            scheme_panel(ring, k)
        with right:
            scheme_panel(naive, k)
        st.subheader("Bytes each rank sends")
        chart(figs.bytes_chart(ring, naive))
        size_mb = st.number_input("Tensor size for this table (MB)", 1.0, 1e5, 100.0)
        table(figs.costs_table(size_mb, n))
        st.caption("Both take 2(N−1) steps, but a ring step moves S/N over every link at once "
                   "while a naive step pushes all of S through rank 0's link: if a link moves "
                   "one message at a time, the ring finishes N times sooner.")
    st.subheader("Does the simulation match the real all_reduce?")
    real = real_result_for(job)
    if real is None:
        st.info("Not run on real processes with these inputs yet (tab 1 runs them too).")
        if st.button("Run dist.all_reduce on these inputs"):
            with st.spinner(f"Starting {n} Gloo process(es) ..."):
                try:
                    st.session_state["ring_check"] = (job, classroom.run_collectives([job])[0])
                except (RuntimeError, TimeoutError) as e:
                    st.error(f"The processes failed: {e}")
            real = real_result_for(job)
    if real is not None:
        same, err = classroom.compare_with_real(ring, real)
        (st.success if same else st.error)(
            f"The ring simulation {'equals' if same else 'differs from'} dist.all_reduce on {n} "
            f"real rank(s): largest difference {err:.3g} (float32 sums taken in another order "
            "may differ in the last bit).")


def real_result_for(job: classroom.Collective) -> classroom.CollectiveResult | None:
    """The real all_reduce of exactly these inputs, if tab 1 or the ring tab has run it."""
    jobs, results = st.session_state.get("collectives", ((), ()))
    if job in jobs:
        return results[jobs.index(job)]
    checked = st.session_state.get("ring_check")
    return checked[1] if checked and checked[0] == job else None


def gradient_averaging() -> None:
    st.markdown(
        "In data-parallel training every rank holds a full copy of the model and computes "
        "gradients on its own slice of the data. **After `loss.backward()` and before "
        "`optimizer.step()`** the gradients are averaged with `dist.all_reduce`, so every copy "
        "takes the same step and the copies stay identical. DDP does it for you, bucket by "
        "bucket, overlapped with backward. By hand:")
    st.code("loss = loss_fn(model(x), y)\nloss.backward()\naverage_gradients(model)   # <- here\n"
            "optimizer.step()\n\n" + inspect.getsource(averaging.average_gradients),
            language="python")
    c1, c2, c3 = st.columns(3)
    ranks = c1.slider("Ranks", 2, classroom.MAX_WORLD_SIZE, 2, key="grad_ranks")
    steps = c2.slider("Steps", 5, 100, 30)
    lr = c3.select_slider("Learning rate", [0.01, 0.02, 0.05, 0.1, 0.2], 0.05)
    if st.button("Train on real processes", type="primary"):
        with st.spinner(f"Training on {ranks} Gloo processes: DDP, by hand, no allreduce ..."):
            try:
                st.session_state["grad_averaging"] = averaging.grad_averaging(ranks, steps, lr)
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The processes failed: {e}")
    demo = st.session_state.get("grad_averaging")
    if demo:
        (st.success if demo.max_grad_diff <= 1e-6 else st.error)(
            f"Largest |DDP gradient − hand-averaged gradient| over {demo.steps} steps and "
            f"{demo.world_size} ranks: {demo.max_grad_diff:.2e} (they must agree to 1e-6).")
        rows = pd.DataFrame(demo.rows)
        chart(figs.distance_chart(rows))
        st.caption("With the allreduce every rank applies the same averaged gradient, so the "
                   "distance stays exactly 0. Without it each rank follows its own data and the "
                   "replicas drift apart: they are no longer one model.")
        table(rows)


def real_link_section() -> None:
    st.markdown(
        f"The same training ({real_link.WORKLOAD}, {real_link.WORLD_SIZE} ranks, "
        f"{real_link.STEPS} steps) with plain **allreduce** and with **PowerSGD** (rank 2), each on a "
        f"real **{real_link.RATE_MBPS:g} Mb/s** link: every rank in a network namespace of its own, "
        "joined by veths to a bridge that the kernel's token bucket slows to the rate. Real TCP "
        "through the kernel; the kernel counts the bytes, and they are held to the lab's ledger.")
    # Whether namespaces can be made is asked on the press, not on every rerun: the probe makes one.
    if st.button(f"Run allreduce and PowerSGD on a real {real_link.RATE_MBPS:g} Mb/s link", type="primary"):
        if reason := real_link.why_not():
            st.warning(f"Not on this machine: {reason}.")
        else:
            bar = st.progress(0.0, "starting")
            try:
                st.session_state["real_link"] = real_link.demonstrate(progress=lambda f, what: bar.progress(f, what))
            except ConfigError as e:
                lab_widgets.show_errors(e)
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The demonstration failed: {e}")
            bar.empty()
    demo = st.session_state.get("real_link")
    if demo:
        for column, side in zip(side_by_side(len(demo.sides)), demo.sides):
            with column:
                st.subheader(side.hook)
                st.metric("step", f"{side.step_s * 1e3:.1f} ms")
                st.metric("on the wire a step", f"{side.wire_bytes / 1e3:.1f} KB",
                          help="what each rank sends a step, by the ledger: 2(N−1)/N of the hook's payload")
                (st.success if side.agree else st.error)(
                    f"The kernel counted {side.kernel[0]['kernel_bytes']:,} bytes leaving rank 0: the "
                    f"ledger's {side.kernel[0]['ledger_bytes']:,.0f}, DDP's broadcast, TCP/IP headers and "
                    f"{side.kernel[0]['control']:,.0f} of Gloo's control traffic"
                    + ("" if side.agree else " — more or less than the control traffic can be"))
        chart(figs.real_link_chart(demo))
        table(figs.real_link_table(demo))
        st.caption(f"Median of the steady steps; runs {', '.join(s.run_id for s in demo.sides)} (on the "
                   "Runs page). The two ran at the same time, each on a link of its own, sharing this "
                   "machine's cores; a step is more than its bytes at the rate by the computation "
                   "and PowerSGD's compression.")


st.title("Classroom: allreduce")
large = st.toggle("Presentation mode", key="presentation",
                  help="Large text and figures, for a projector in front of a class")
if large:
    st.markdown(PRESENTATION_CSS, unsafe_allow_html=True)
st.caption("Every number here comes from real processes on this machine, except the ring "
           "walk-through, which is checked against them.")
real_tab, ring_tab, grad_tab, link_tab = st.tabs(["1 · Real collectives",
                                                  "2 · Ring allreduce, step by step",
                                                  "3 · Where gradient averaging sits",
                                                  "4 · On a real 100 Mb/s link"])
with real_tab:
    job = real_collectives()
with ring_tab:
    ring_walkthrough(job)
with grad_tab:
    gradient_averaging()
with link_tab:
    real_link_section()
