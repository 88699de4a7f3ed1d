"""What a workload is called, told without importing torch: the built-in names and what each is,
and whether a ``module:function`` is spelled as one.  The settings check, the forms and the
launcher ask here (a run's start pays for no import it does not need); ``commlab.workloads``
builds them.
"""
from __future__ import annotations

DESCRIPTIONS = {
    "charlm": "character-level transformer language model on Python's standard library source",
    "mlp": "multilayer perceptron classifying synthetic data from a random linear teacher",
    "cnn": "small convnet classifying procedurally generated pictures of four shapes",
    "wide": "four 1024x1024 linear layers, small batch: communication dominates the step",
}
BUILTIN_NAMES = tuple(DESCRIPTIONS)
SPEC_CHARS = 256  # no module:function is longer


def spec_error(spec: str) -> str | None:
    """Why this is not a workload's name, or None, said of the name (its caller quotes it).  It
    imports and runs nothing, so that a server may ask; ``workloads.check`` runs the workload, in a
    child process (``commlab.engine.workload_probe``)."""
    if spec in BUILTIN_NAMES:
        return None
    if len(spec) > SPEC_CHARS:
        return f"is {len(spec):,} characters long: no module:function is longer than {SPEC_CHARS}"
    module_name, colon, fn_name = spec.partition(":")
    if not colon:
        return (f"is not a workload; use a built-in ({', '.join(BUILTIN_NAMES)}) or module:function "
                "for your own")
    if not (all(part.isidentifier() for part in module_name.split(".")) and fn_name.isidentifier()):
        return ("is not module:function: both must be Python names (a dotted module path, e.g. "
                "mypackage.models:make)")
    return None
