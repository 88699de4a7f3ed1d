"""The torchft export: DiLoCo as torchft runs it, replica groups joined through a lighthouse."""
from __future__ import annotations

from commlab.config import RunConfig
from commlab.tune.export.outer_loop import diloco_what, require_outer_loop
from commlab.tune.export.preamble import header
from commlab.tune.export.target import Target
from commlab.tune.export.text import comment

TORCHFT_WHY = ("torchft (pip install torchft; 0.2.0 has this API) runs each replica group as a job of "
               "its own (its own torchrun line, ranks within it sharded or replicated as you like) "
               "and joins the groups through a lighthouse: start `torchft_lighthouse --min_replicas "
               "1 --quorum_tick_ms 100 --join_timeout_ms 10000` on one machine and set "
               "TORCHFT_LIGHTHOUSE=http://<that machine>:29510, and REPLICA_GROUP_ID to each group's "
               "index, in every job's environment.")
# init_sync=False: torchft's default heals every group but replica 0 at its first quorum, which
# DiLoCo holds at the first sync, after H local steps; the lab's DiLoCo has no such step, and
# with it off torchft's DiLoCo is the lab's bit for bit on 2 groups (docs/hooks.md, "DiLoCo's
# torchft export"; tests/test_diloco.py).
TORCHFT_SAME_START = ("init_sync=False: every group must build `model` with the same parameters "
                      "(torch.manual_seed(...) before it, or the same checkpoint loaded), as the "
                      "loop export's broadcast from rank 0 does; torchft's init_sync=True would "
                      "instead heal every group but replica 0 at the first sync, after its first "
                      "{h} steps: they would take replica 0's parameters and inner optimizer state, "
                      "and the first outer step would be replica 0's pseudo-gradient alone. A "
                      "group that joins later (a restart) still heals from the others.")


def torchft_snippet(cfg: RunConfig, target: Target, source: str | None = None) -> str:
    """torchft's ``DiLoCo(manager, model_fragments, inner_optimizer, outer_optimizer, sync_every)``
    with the run's outer SGD: the outer step runs from the inner optimizer's step hook."""
    require_outer_loop(cfg, "torchft")
    notes_ = [diloco_what(cfg), TORCHFT_WHY, TORCHFT_SAME_START.format(h=cfg.sync_every)]
    if cfg.outer_precision != "fp32":
        notes_.append(f"torchft cannot send the pseudo-gradient in {cfg.outer_precision}: its "
                      "allreduce sends float32, or with should_quantize=True fp8 through Triton "
                      "kernels on CUDA; this snippet sends float32 (the loop export sends "
                      f"{cfg.outer_precision}).")
    pg = "ProcessGroupBabyNCCL" if target.backend == "nccl" else "ProcessGroupGloo"
    text = comment(header(cfg, target, source)[:1] + notes_ + [
        "Paste after `model` (not wrapped in DistributedDataParallel) and its `optimizer` are made."])
    text += ("import os\nfrom datetime import timedelta\n\nimport torch\n"
             f"from torchft import Manager, {pg}\nfrom torchft.local_sgd import DiLoCo\n\n")
    text += (f"outer_optimizer = torch.optim.SGD(model.parameters(), lr={cfg.outer_lr!r}, "
             f"momentum={cfg.outer_momentum!r}, nesterov={cfg.outer_nesterov!r})\n")
    text += ("manager = Manager(\n"
             f"    pg={pg}(timeout=timedelta(seconds=60)),\n"
             "    min_replica_size=1,\n"
             "    load_state_dict=lambda sd: (model.load_state_dict(sd[\"model\"]), "
             "optimizer.load_state_dict(sd[\"optimizer\"])),\n"
             "    state_dict=lambda: {\"model\": model.state_dict(), \"optimizer\": optimizer.state_dict()},\n"
             "    replica_id=f\"replica_{os.environ['REPLICA_GROUP_ID']}\",\n"
             "    use_async_quorum=False,  # DiLoCo needs a synchronous quorum\n"
             "    init_sync=False,  # every group starts from the same parameters: see above\n"
             ")\n")
    text += (f"diloco = DiLoCo(manager, [model], optimizer, outer_optimizer, sync_every={cfg.sync_every!r}, "
             "should_quantize=False)\n")
    text += comment(["Train inside it: the outer step runs after every sync_every-th optimizer.step().",
                     "  with diloco:",
                     "      for x, y in batches:",
                     "          optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()"])
    return text
