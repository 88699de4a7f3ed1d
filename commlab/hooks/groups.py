"""The process group a hook's collectives span: the one its state names, or every rank."""
import torch.distributed as dist


def group_of(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    """``process_group``, or the default group for None, as PyTorch's hooks read a state's."""
    return process_group if process_group is not None else dist.group.WORLD
