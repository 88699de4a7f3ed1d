"""Allreduce for the classroom: real collectives, a ring allreduce step by step, and where
gradient averaging sits in a training step.  Thin: widgets in, commlab.classroom, plotly out."""
import inspect

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from commlab import classroom
from commlab.config import ConfigError

st.title("Classroom: allreduce")
st.caption("Every number on this page comes from real processes on this machine, except the "
           "ring walk-through, which is checked against them.")


def show_errors(e: ConfigError) -> None:
    for field, msg in e.errors.items():
        st.error(f"**{field}**: {msg}")


def fmt(values) -> str:
    return ", ".join(f"{x:g}" for x in values)


def rank_table(result: dict) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r["rank"], "before": fmt(r["before"]), "after": fmt(r["after"]),
                          "finished (ms after first)": r["finished_ms"]} for r in result["ranks"]])


def before_after_chart(result: dict, title: str) -> go.Figure:
    labels = [f"rank {r['rank']}" + (f"[{i}]" if len(r["before"]) > 1 else "")
              for r in result["ranks"] for i in range(len(r["before"]))]
    fig = go.Figure([
        go.Bar(name="before", x=labels, y=[x for r in result["ranks"] for x in r["before"]]),
        go.Bar(name="after", x=labels, y=[x for r in result["ranks"] for x in r["after"]])])
    fig.update_layout(title=title, barmode="group", height=320, margin=dict(t=40, b=10))
    return fig


def arrival_chart(result: dict) -> go.Figure:
    by_rank = {r["rank"]: r["finished_ms"] for r in result["ranks"]}
    order = result["arrival_order"]
    fig = go.Figure(go.Bar(x=[by_rank[r] for r in order], y=[f"rank {r}" for r in order],
                           orientation="h", text=[f"{by_rank[r]:.2f} ms" for r in order]))
    fig.update_layout(title="When each rank finished (first at the top)", height=60 + 40 * len(order),
                      xaxis_title="ms after the first rank", yaxis_autorange="reversed",
                      margin=dict(t=40, b=10))
    return fig


real_tab, ring_tab, grad_tab = st.tabs(["1 · Real collectives", "2 · Ring allreduce, step by step",
                                        "3 · Where gradient averaging sits"])

# ---------------------------------------------------------------------------- 1. real collectives
with real_tab:
    c1, c2, c3 = st.columns(3)
    world_size = c1.slider("Ranks (processes)", 1, classroom.MAX_WORLD_SIZE, 3)
    op = c2.selectbox("Reduce op for all_reduce", classroom.OPS, format_func=str.upper)
    src = c3.number_input("Broadcast from rank", 0, world_size - 1, 0)
    default_text = "\n".join(fmt(v) for v in classroom.default_values(world_size))
    values_text = st.text_area("Each rank's tensor: one line per rank, numbers split by commas",
                               default_text, key=f"values_{world_size}", height=80 + 12 * world_size)
    try:
        jobs = [classroom.all_reduce_job(world_size, op, values_text),
                classroom.broadcast_job(world_size, src, values_text)]
    except ConfigError as e:
        show_errors(e)
        jobs = None
    if st.button("Run on real processes", type="primary", disabled=jobs is None):
        with st.spinner(f"Starting {world_size} Gloo process(es), calling dist.all_reduce, then "
                        "dist.broadcast ..."):
            try:
                st.session_state["collectives"] = (jobs[0], classroom.run_collectives(jobs))
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The processes failed: {e}")
    run = st.session_state.get("collectives")
    if run:
        reduced, broadcast = (r.to_dict() for r in run[1])
        left, right = st.columns(2)
        with left:
            st.subheader(f"dist.all_reduce(op={reduced['op'].upper()})")
            st.dataframe(rank_table(reduced), hide_index=True)
            st.plotly_chart(before_after_chart(reduced, "all_reduce: every rank ends with the same"))
        with right:
            st.subheader(f"dist.broadcast(src={broadcast['src']})")
            st.dataframe(rank_table(broadcast), hide_index=True)
            st.plotly_chart(before_after_chart(broadcast, f"broadcast: rank {broadcast['src']}'s "
                                                          "tensor everywhere"))
        st.markdown("**Order in which ranks reported back from all_reduce:** "
                    + " → ".join(f"rank {r}" for r in reduced["arrival_order"]))
        st.plotly_chart(arrival_chart(reduced))
        st.info(classroom.ARRIVAL_NOTE + " Press Run again and compare.")

# ---------------------------------------------------------------------------- 2. ring allreduce
with ring_tab:
    if jobs is None:
        st.warning("Fix the tensors in tab 1 first: the ring walks through those inputs.")
    else:
        values, n = [list(v) for v in jobs[0].values], world_size
        ring, naive = classroom.ring_trace(values, op), classroom.naive_trace(values, op)
        st.markdown(
            f"The {len(values[0])}-element tensor is cut into **{n} chunks**, one per rank. "
            f"**Reduce-scatter** ({n - 1} steps): each rank passes a chunk to its right-hand neighbour, "
            f"which {op}s it into its own copy; afterwards every rank owns one finished chunk. "
            f"**All-gather** ({n - 1} steps): the finished chunks travel once more round the ring. "
            f"**{2 * (n - 1)} steps** in all; each rank sends 2(N−1)/N · S = "
            f"{classroom.ring_bytes_per_rank(1, n):.2f} · S bytes.")
        if n == 1:
            st.info("With one rank there is nothing to send: the result is the input.")
        else:
            step = st.slider("Step", 0, len(ring.steps), 0,
                             help="0 is before anything moves; use the arrow keys to walk through")

            def holdings_figure(trace: classroom.Trace, k: int, title: str) -> go.Figure:
                held = trace.initial if k == 0 else trace.steps[k - 1].holdings
                who = ([[(r,)] * len(trace.chunks) for r in range(n)] if k == 0
                       else trace.steps[k - 1].contributors)
                text = [[f"{fmt(held[r][c]) or '—'}<br>from {'+'.join(map(str, who[r][c]))}"
                         for c in range(len(trace.chunks))] for r in range(n)]
                fig = go.Figure(go.Heatmap(
                    z=[[len(w) for w in who[r]] for r in range(n)], text=text, texttemplate="%{text}",
                    x=[f"chunk {c} [{a}:{b}]" for c, (a, b) in enumerate(trace.chunks)],
                    y=[f"rank {r}" for r in range(n)], zmin=1, zmax=n, colorscale="Blues",
                    colorbar=dict(title="ranks<br>folded in")))
                fig.update_layout(title=title, yaxis_autorange="reversed", height=120 + 45 * n,
                                  margin=dict(t=40, b=10))
                return fig

            def transfers_table(trace: classroom.Trace, k: int) -> pd.DataFrame:
                if k == 0:
                    return pd.DataFrame(columns=["from", "to", "chunk", "values", "bytes", "receiver"])
                return pd.DataFrame([{"from": t.src, "to": t.dst, "chunk": t.chunk,
                                      "values": fmt(t.values), "bytes": t.nbytes, "receiver": t.action}
                                     for t in trace.steps[k - 1].transfers])

            phase = ring.steps[step - 1].phase if step else "start"
            ring_col, naive_col = st.columns(2)
            with ring_col:
                st.subheader(f"Ring — step {step}/{len(ring.steps)}: {phase}")
                st.plotly_chart(holdings_figure(ring, step, "what each rank holds"))
                st.dataframe(transfers_table(ring, step), hide_index=True)
            with naive_col:
                naive_phase = naive.steps[step - 1].phase if step else "start"
                st.subheader(f"Naive — step {step}/{len(naive.steps)}: {naive_phase}")
                st.plotly_chart(holdings_figure(naive, step, "what each rank holds"))
                st.dataframe(transfers_table(naive, step), hide_index=True)

            st.subheader("Bytes each rank sends")
            sent = pd.DataFrame({"rank": range(n), "ring": ring.bytes_sent, "naive": naive.bytes_sent})
            fig = go.Figure([go.Bar(name=s, x=[f"rank {r}" for r in range(n)], y=sent[s])
                             for s in ("ring", "naive")])
            fig.update_layout(barmode="group", height=300, yaxis_title="bytes sent",
                              margin=dict(t=20, b=10))
            st.plotly_chart(fig)
            size_mb = st.number_input("Tensor size for the comparison below (MB)", 1.0, 1e5, 100.0)
            costs = pd.DataFrame([vars(c) for c in classroom.scheme_costs(size_mb * 1e6, n)])
            for col in ("message_bytes", "max_sent_bytes", "max_received_bytes", "serial_bytes"):
                costs[col.replace("bytes", "MB")] = costs.pop(col) / 1e6
            st.dataframe(costs, hide_index=True)
            st.caption("Both schemes take 2(N−1) steps, but a ring step moves S/N on every link at "
                       "once while a naive step pushes all of S through rank 0's link: with each link "
                       "moving one message at a time, the ring finishes N times sooner ('serial MB').")

        st.subheader("Does the simulation match the real all_reduce?")
        done = st.session_state.get("collectives")
        if done and done[0] == jobs[0]:
            same, err = classroom.compare_with_real(ring, done[1][0])
            (st.success if same else st.error)(
                f"Largest difference between the ring simulation and dist.all_reduce on {n} real "
                f"rank(s): {err:.3g} (float32 sums in a different order may differ in the last bit).")
        else:
            st.info("Run these inputs on real processes in tab 1; the simulation is then compared "
                    "with what dist.all_reduce returned.")

# ---------------------------------------------------------------------------- 3. gradient averaging
with grad_tab:
    st.markdown(
        "In data-parallel training every rank holds a full copy of the model and computes "
        "gradients on its own slice of the data. **After `loss.backward()` and before "
        "`optimizer.step()`** the gradients are averaged with `dist.all_reduce`, so every copy "
        "takes the same step and the copies stay identical. DDP does this for you, bucket by "
        "bucket, overlapping with backward. By hand it is:")
    st.code("loss = loss_fn(model(x), y)\nloss.backward()\naverage_gradients(model)   # <- here\n"
            "optimizer.step()\n\n" + inspect.getsource(classroom.average_gradients),
            language="python")
    g1, g2, g3 = st.columns(3)
    grad_ranks = g1.slider("Ranks", 2, classroom.MAX_WORLD_SIZE, 2, key="grad_ranks")
    grad_steps = g2.slider("Steps", 5, 100, 30)
    lr = g3.select_slider("Learning rate", [0.01, 0.02, 0.05, 0.1, 0.2], 0.05)
    if st.button("Train on real processes", type="primary"):
        with st.spinner(f"Training on {grad_ranks} Gloo processes: DDP, by hand, no allreduce ..."):
            try:
                st.session_state["grad_averaging"] = classroom.grad_averaging(
                    grad_ranks, grad_steps, lr)
            except (RuntimeError, TimeoutError) as e:
                st.error(f"The processes failed: {e}")
            except ConfigError as e:
                show_errors(e)
    demo = st.session_state.get("grad_averaging")
    if demo:
        rows = pd.DataFrame(demo.rows)
        (st.success if demo.max_grad_diff <= 1e-6 else st.error)(
            f"Largest |DDP gradient − hand-averaged gradient| over {demo.steps} steps and "
            f"{demo.world_size} ranks: {demo.max_grad_diff:.2e} (the two must agree to 1e-6).")
        fig = go.Figure([go.Scatter(x=rows["step"], y=rows[f"distance_{v}"], name=name,
                                    mode="lines+markers")
                         for v, name in (("no_allreduce", "no allreduce"),
                                         ("by_hand", "all_reduce by hand"), ("ddp", "DDP"))])
        fig.update_layout(title="How far apart the ranks' models are", xaxis_title="step",
                          yaxis_title="‖params(rank r) − params(rank 0)‖, farthest rank",
                          height=380, margin=dict(t=40, b=10))
        st.plotly_chart(fig)
        st.caption("With the allreduce every rank applies the same averaged gradient, so the "
                   "distance stays exactly 0. Without it each rank follows its own data and the "
                   "replicas drift apart: they are no longer one model.")
        st.dataframe(rows, hide_index=True)
