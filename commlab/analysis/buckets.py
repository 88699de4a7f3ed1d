"""DDP's bucket layouts as a run recorded them: rows in reduction order, DDP's own logged sizes
beside them, and why iteration 0 and the rebuilt layout differ."""
from __future__ import annotations

from commlab.analysis.units import human_bytes

MIB = 1024 * 1024  # DDP's bucket_cap_mb counts MiB
LAYOUTS = {"iter0": "iteration 0", "rebuilt": "after the rebuild"}


def bucket_layouts(buckets: dict) -> dict[str, list[dict]]:
    """Layout name -> one row per bucket, in the order DDP reduces them (bucket index order)."""
    cap = cap_bytes(buckets)
    out = {}
    for key, title in LAYOUTS.items():
        rows = sorted(buckets.get(key) or [], key=lambda b: b["index"])
        out[title] = [{"index": b["index"], "order": b["index"] + 1, "is_last": b["is_last"],
                       "bytes": b["bytes"], "numel": b["numel"], "cap_bytes": cap,
                       "over_cap": cap is not None and b["bytes"] > cap, "params": b["params"]}
                      for b in rows]
    return out


def bucket_table(rows: list[dict]) -> list[dict]:
    """A layout's buckets as table rows, in reduction order."""
    return [{"bucket": b["index"], "reduced": f"#{b['order']}" + (" (last)" if b["is_last"] else ""),
             "bytes": b["bytes"], "share of cap": b["bytes"] / b["cap_bytes"] if b["cap_bytes"] else None,
             "parameters": ", ".join(p["name"] for p in b["params"])} for b in rows]


def ddp_logged_sizes(buckets: dict) -> dict[str, dict]:
    """DDP's own log of bucket sizes (``_get_ddp_logging_data``) next to the recorded layouts.

    DDP logs the rebuilt sizes only once it has rebuilt, and the run folder holds the log as it
    stood when buckets.json was last written (after step 1 and at the end of the run)."""
    logged = buckets.get("ddp_logging") or {}
    out = {}
    for (key, title), field in zip(LAYOUTS.items(), ("bucket_sizes", "rebuilt_bucket_sizes")):
        try:
            sizes = [int(x) for x in str(logged.get(field)).split(",")] if logged.get(field) else None
        except ValueError:  # not DDP's comma-separated sizes: shown as not logged
            sizes = None
        recorded = [b["bytes"] for b in sorted(buckets.get(key) or [], key=lambda b: b["index"])]
        out[title] = {"field": field, "logged": sizes, "recorded": recorded,
                      "agrees": sizes == recorded if sizes else None}
    return out


def cap_bytes(buckets: dict) -> int | None:
    cap = buckets.get("bucket_cap_mb")
    return None if cap is None else int(cap * MIB)


def units_story(sharded: dict) -> str:
    """A sharded run's answer to the bucket layouts (meta.json's ``sharded``): FSDP2 has no
    buckets; each unit's parameters travel together, gathered and reduced whole."""
    mesh = sharded["mesh"]
    over = f"{mesh['shard']} ranks" + (f" in each of {mesh['replicate']} replicas" if "replicate" in mesh else "")
    between = {"none": "", "native": " FSDP all-reduces each unit's shard between the replicas.",
               "lab": " The lab's hook all-reduces each unit's shard between the replicas."}
    return (f"A sharded run has no DDP buckets: FSDP2 moves each unit's parameters together, the "
            f"units {', '.join(sharded['units'])} (each module fully_shard went on; the root, for any parameters "
            f"of its own), each sharded over {over}: it all-gathers a unit's parameters before the unit computes "
            f"and reduce-scatters its gradients after.{between[sharded['between_replicas']]} The "
            f"timeline below shows each unit's collectives.")


def bucket_story(buckets: dict) -> str:
    """One paragraph on why the two layouts differ, from what this run recorded."""
    first, rebuilt = buckets.get("iter0") or [], buckets.get("rebuilt") or []
    if not first:
        return ("No bucket layout was recorded: the run had not finished its first step, or it "
                "ran without instrumentation.")
    if not rebuilt:
        return ("Only iteration 0's layout is recorded: DDP rebuilds its buckets after the first "
                "iteration, and this run did not finish a second step.")
    n_params = sum(len(b["params"]) for b in first)
    by_index = sorted(rebuilt, key=lambda b: b["index"])
    first_ready = by_index[0]["params"][0]["name"] if by_index[0]["params"] else "?"
    if len(first) == 1:
        before = (f"At iteration 0 DDP had not yet seen the order in which backward produces the "
                  f"gradients, so it did not split them: all {n_params} parameters went into one "
                  f"bucket of {human_bytes(first[0]['bytes'])}.")
    else:
        before = (f"At iteration 0 DDP cut {n_params} parameters into {len(first)} buckets in "
                  f"the reverse order of model.parameters(), its guess at the order backward "
                  f"produces gradients.")
    same = [[p["name"] for p in b["params"]] for b in sorted(first, key=lambda b: b["index"])] == \
           [[p["name"] for p in b["params"]] for b in by_index]
    after = (f"After that iteration it rebuilt them in the order the gradients actually became "
             f"ready ({first_ready} first), starting a new bucket whenever the current one reached "
             f"the cap ({human_bytes(cap_bytes(buckets))}), so a bucket can exceed the cap by its last "
             f"tensor: {len(rebuilt)} bucket{'s' if len(rebuilt) != 1 else ''}.")
    if same:
        after += " That happens to give the same layout."
    return f"{before} {after}"
