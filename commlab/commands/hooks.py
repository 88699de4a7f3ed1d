"""``commlab hooks``: per hook and wrapper, whether PyTorch's works on a backend and what auto runs."""
from __future__ import annotations


def _hooks(args) -> int:
    from commlab.commands import emit
    from commlab.hooks import registry

    backend = args.backend
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
    rows = registry.support_table(backend)
    works = {True: "yes", False: "no"}
    lines = [f"DDP communication hooks on {backend} (impl=auto: PyTorch's where it works, "
             "commlab's variant where it does not)",
             f"{'hook':<45} {'PyTorch works':<16} {'auto runs':<10} why"]
    for r in rows:
        lines.append(f"{r['name']:<45} {works.get(r['stock_works'], r['stock_works']):<16} "
                     f"{r['auto_impl']:<10} {r['why']}")
    emit(args, {"backend": backend, "hooks": rows}, "\n".join(lines))
    return 0


def register(sub) -> None:
    p = sub.add_parser("hooks", help="which hooks work on a backend, and which implementation runs")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl if this machine sees a CUDA GPU, else gloo")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.set_defaults(func=_hooks)
