"""Allreduce for the classroom: real collectives, a ring allreduce step by step, and where
gradient averaging sits in a training step.  Thin: widgets in, commlab.teach.classroom, plotly out."""
import inspect

import pandas as pd
import streamlit as st

import lab_widgets
from commlab.analysis.ring import steps as ring_steps
from commlab.config import ConfigError
from commlab.figures import classroom as figs
from commlab.teach import classroom


def scheme_panel(trace: classroom.Trace, k: int) -> None:
    phase = trace.steps[k - 1].phase if k else "before anything moves"
    st.subheader(f"{trace.scheme.capitalize()} — step {k}/{len(trace.steps)}: {phase}")
    st.plotly_chart(figs.holdings_figure(trace, k))
    st.dataframe(figs.transfers_table(trace, k), hide_index=True)



# ---------------------------------------------------------------------------- the three sections
def real_collectives() -> classroom.Collective | None:
    """Tab 1; returns the all_reduce job the inputs describe (None while they are invalid)."""
    c1, c2, c3 = st.columns(3)
    world_size = c1.slider("Ranks (processes)", 1, classroom.MAX_WORLD_SIZE, 3)
    op = c2.selectbox("Reduce op for all_reduce", classroom.OPS, format_func=str.upper)
    src = c3.number_input("Broadcast from rank", 0, world_size - 1, 0)
    values = st.text_area("Each rank's tensor: one line per rank, numbers split by commas",
                          "\n".join(figs.fmt(v) for v in classroom.default_values(world_size)),
                          key=f"values_{world_size}", height=80 + 12 * world_size)
    try:
        jobs = [classroom.all_reduce_job(world_size, op, values),
                classroom.broadcast_job(world_size, src, values)]
    except ConfigError as e:
        lab_widgets.show_errors(e)
        return None
    if st.button("Run on real processes", type="primary"):
        with st.spinner(f"Starting {world_size} Gloo process(es): dist.all_reduce, then "
                        "dist.broadcast ..."):
            try:
                st.session_state["collectives"] = (jobs[0], classroom.run_collectives(jobs))
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The processes failed: {e}")
    if "collectives" in st.session_state:
        reduced, sent = st.session_state["collectives"][1]
        left, right = st.columns(2)
        with left:
            st.subheader(f"dist.all_reduce(op={reduced.op.upper()})")
            st.dataframe(figs.rank_table(reduced), hide_index=True)
            st.plotly_chart(figs.before_after_chart(reduced, "every rank ends with the same"))
        with right:
            st.subheader(f"dist.broadcast(src={sent.src})")
            st.dataframe(figs.rank_table(sent), hide_index=True)
            st.plotly_chart(figs.before_after_chart(sent, f"rank {sent.src}'s tensor everywhere"))
        st.markdown("**Order in which the ranks reported back from all_reduce:** "
                    + " → ".join(f"rank {r}" for r in reduced.arrival_order))
        st.plotly_chart(figs.arrival_chart(reduced))
        st.info(classroom.ARRIVAL_NOTE + " Press Run again and compare.")
    return jobs[0]


def ring_walkthrough(job: classroom.Collective | None) -> None:
    if job is None:
        st.warning("Fix the tensors in tab 1 first: the ring walks through those inputs.")
        return
    n, op = job.world_size, job.op
    ring, naive = classroom.ring_trace(job.values, op), classroom.naive_trace(job.values, op)
    st.markdown(
        f"The {len(job.values[0])}-element tensor is cut into **{n} chunks**. "
        f"**Reduce-scatter** ({n - 1} steps): every rank passes one chunk to its right-hand "
        f"neighbour, which combines it ({op}) with its own copy; afterwards each rank owns one "
        f"finished chunk. **All-gather** ({n - 1} steps): the finished chunks go once more round "
        f"the ring. **{ring_steps(n)} steps** in all, and each rank sends 2(N−1)/N · S = "
        f"{classroom.ring_bytes_per_rank(1, n):.2f} · S bytes. Beside it, the naive scheme: "
        "everyone sends everything to rank 0, which sends the result back.")
    if n == 1:
        st.info("With one rank there is nothing to send: the result is the input.")
    else:
        k = st.slider("Step", 0, len(ring.steps), 0,
                      help="0 is before anything moves; the arrow keys walk through the steps")
        left, right = st.columns(2)
        with left:
            scheme_panel(ring, k)
        with right:
            scheme_panel(naive, k)
        st.subheader("Bytes each rank sends")
        st.plotly_chart(figs.bytes_chart(ring, naive))
        size_mb = st.number_input("Tensor size for this table (MB)", 1.0, 1e5, 100.0)
        st.dataframe(figs.costs_table(size_mb, n), hide_index=True)
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
    for key, pick in (("collectives", lambda run: run[1][0]), ("ring_check", lambda run: run[1])):
        run = st.session_state.get(key)
        if run and run[0] == job:
            return pick(run)
    return None


def gradient_averaging() -> None:
    st.markdown(
        "In data-parallel training every rank holds a full copy of the model and computes "
        "gradients on its own slice of the data. **After `loss.backward()` and before "
        "`optimizer.step()`** the gradients are averaged with `dist.all_reduce`, so every copy "
        "takes the same step and the copies stay identical. DDP does it for you, bucket by "
        "bucket, overlapped with backward. By hand:")
    st.code("loss = loss_fn(model(x), y)\nloss.backward()\naverage_gradients(model)   # <- here\n"
            "optimizer.step()\n\n" + inspect.getsource(classroom.average_gradients),
            language="python")
    c1, c2, c3 = st.columns(3)
    ranks = c1.slider("Ranks", 2, classroom.MAX_WORLD_SIZE, 2, key="grad_ranks")
    steps = c2.slider("Steps", 5, 100, 30)
    lr = c3.select_slider("Learning rate", [0.01, 0.02, 0.05, 0.1, 0.2], 0.05)
    if st.button("Train on real processes", type="primary"):
        with st.spinner(f"Training on {ranks} Gloo processes: DDP, by hand, no allreduce ..."):
            try:
                st.session_state["grad_averaging"] = classroom.grad_averaging(ranks, steps, lr)
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The processes failed: {e}")
    demo = st.session_state.get("grad_averaging")
    if demo:
        (st.success if demo.max_grad_diff <= 1e-6 else st.error)(
            f"Largest |DDP gradient − hand-averaged gradient| over {demo.steps} steps and "
            f"{demo.world_size} ranks: {demo.max_grad_diff:.2e} (they must agree to 1e-6).")
        rows = pd.DataFrame(demo.rows)
        st.plotly_chart(figs.distance_chart(rows))
        st.caption("With the allreduce every rank applies the same averaged gradient, so the "
                   "distance stays exactly 0. Without it each rank follows its own data and the "
                   "replicas drift apart: they are no longer one model.")
        st.dataframe(rows, hide_index=True)


st.title("Classroom: allreduce")
st.caption("Every number here comes from real processes on this machine, except the ring "
           "walk-through, which is checked against them.")
real_tab, ring_tab, grad_tab = st.tabs(["1 · Real collectives",
                                        "2 · Ring allreduce, step by step",
                                        "3 · Where gradient averaging sits"])
with real_tab:
    job = real_collectives()
with ring_tab:
    ring_walkthrough(job)
with grad_tab:
    gradient_averaging()
