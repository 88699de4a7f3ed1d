"""The kernel's count of a run's bytes held to the ledger's: an instrument checked by another.

On a real link (``commlab.engine.launchers.reallink``) each rank's node records what the kernel
counted on its veth once the rank has ended (``link.rankK.json``: tx/rx bytes and packets).  What
a rank sent there is, term by term:

- the ledger's collectives as each rank sends them: a row's bytes times its bus factor (an
  allreduce 2(N-1)/N of S, an allgather (N-1)/N of its output; ``commlab.analysis.ring``);
  every rank sends the same, so rank 0's ledger is every rank's;
- DDP's broadcast of the model's parameters from rank 0 as it wraps the model (before any hook,
  so in no ledger): the root sends them to each other rank;
- TCP/IP's headers, ``HEADER_BYTES`` a packet as the veth counts packets (a veth hands on
  segments of up to 64 KiB, GSO, one header each: on a 1500-byte wire there would be a header
  every 1448 bytes, 4.6% more);
- the control traffic: Gloo's own protocol, a header for each message and the notifications
  between a ring's steps (measured: 410 to 480 bytes a collective, within ``GLOO_BYTES``),
  and once a run torchrun's rendezvous and store, Gloo's pairing, the lab's object collectives
  (the traced steps' gathers, the checkpoint's decision), within ``SETUP_BYTES``.

``compare`` lays the terms side by side per rank; ``agree`` says whether the kernel's payload
and the ledger's meet within the control traffic.
"""
from __future__ import annotations

from commlab.analysis import ring

HEADER_BYTES = 14 + 20 + 32  # Ethernet, IPv4, TCP with timestamps (Linux's default)
# Measured on 2-rank mlp runs at 100 Mb/s and 1 Gb/s (allreduce, fp16, PowerSGD; 5 to 300 steps):
# 9 to 15 KiB once, 410 to 480 bytes a collective; the bounds leave room on both.
SETUP_BYTES = 64 * 1024
GLOO_BYTES = 512
PARAM_BYTES = 4  # fp32: the built-in workloads' parameters


def ledger_sent(rows: list[dict]) -> float:
    """Bytes each rank sent for the ledger's collectives (every traffic: the hook's, the lab's)."""
    return sum(r["bytes"] * ring.bus_factor(r["collective"], r["ranks"]) for r in rows)


def compare(link: list[dict], rows: list[dict], world_size: int, num_parameters: int) -> list[dict]:
    """Per rank (``link``: the ranks' counters), the kernel's bytes against the ledger's (``rows``:
    ledger.json's), term by term; ``control``: what is left, the run's control traffic, and
    ``control_bound``: what it may be for the run's collectives."""
    ledger, collectives = ledger_sent(rows), sum(r["count"] for r in rows)
    out = []
    for c in sorted(link, key=lambda c: c["rank"]):
        headers = HEADER_BYTES * c["tx_packets"]
        broadcast = (world_size - 1) * num_parameters * PARAM_BYTES if c["rank"] == 0 else 0
        out.append({"rank": c["rank"], "kernel_bytes": c["tx_bytes"], "packets": c["tx_packets"],
                    "headers": headers, "ledger_bytes": ledger, "ddp_broadcast": broadcast,
                    "control": c["tx_bytes"] - headers - ledger - broadcast,
                    "control_bound": SETUP_BYTES + GLOO_BYTES * collectives})
    return out


def agree(rows: list[dict]) -> bool:
    """Whether every rank's kernel bytes are its ledger's, the broadcast and its headers, within
    the control traffic (never less: the kernel cannot carry fewer bytes than were sent)."""
    return all(0 <= r["control"] <= r["control_bound"] for r in rows)
