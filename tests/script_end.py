"""The last lines of the training scripts the tests write and run under torchrun, once their
results are written."""

# Gloo's worker threads may still hold the last collectives' work, with tensors whose release takes
# the GIL: in the interpreter's finalization that aborts the process ("terminate called without an
# active exception", SIGABRT; pytorch/pytorch#179291), which a script here did once in about five
# runs of the suite under load, after writing its results.  So the scripts end as the lab's ranks
# do, without the finalization.  (A Python callback of commlab's own on a future is waited for at
# exit instead: ``commlab.hooks.futures``, tests/test_futures.py.)
END = """
import os as _os, sys as _sys
_sys.stdout.flush(); _sys.stderr.flush(); _os._exit(0)
"""
