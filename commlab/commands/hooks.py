"""``commlab hooks``: per hook and wrapper, whether PyTorch's works on a backend and what auto runs;
then each compressor's definition against its paper and GRACE (``--definitions``: as a markdown table)."""
from __future__ import annotations


def _hooks(args) -> int:
    from dataclasses import asdict

    from commlab.commands import emit
    from commlab.hook_specs import SPECS
    from commlab.hooks import registry
    from commlab.ui import definitions

    if args.definitions:
        print(definitions.table())
        return 0

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
    lines += ["", "The compressors: what each sends, against its paper and GRACE's code, and where the lab "
              "keeps a choice of its own (docs/hooks.md; `commlab hooks --definitions` as a table)"]
    lines += [definitions.plain(h) for h in definitions.defined()]
    defined = {h: asdict(SPECS[h].definition) for h in definitions.defined()}
    emit(args, {"backend": backend, "hooks": rows, "definitions": defined}, "\n".join(lines))
    return 0


def register(sub) -> None:
    p = sub.add_parser("hooks", help="which hooks work on a backend, and which implementation runs")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl if this machine sees a CUDA GPU, else gloo")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--definitions", action="store_true",
                   help="print only the compressors' definitions, as docs/hooks.md's markdown table")
    p.set_defaults(func=_hooks)
