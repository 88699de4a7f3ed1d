"""commlab: a laboratory for PyTorch's DDP communication hooks."""
__version__ = "0.1.0"
