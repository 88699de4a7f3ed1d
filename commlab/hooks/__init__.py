"""DDP communication hooks: which one runs, and commlab's variants where PyTorch's fail.

- ``registry``: config -> (state, hook), PyTorch's where it works on the backend; pure planning
  functions for the CLI and the UI.
- ``powersgd``: PowerSGD and batched PowerSGD that are safe on Gloo (PyTorch's state and algorithm).
- ``compress``: the bfloat16 hook and wrapper under names DDP does not refuse without NCCL.
- ``instrument``: byte counting and timing around any hook.

Nothing is imported here, so that ``registry``'s planning functions do not import torch.
"""
