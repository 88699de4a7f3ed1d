"""The Low-rank error page without Streamlit: which runs have something to compare, and
commlab.analysis.lowrank's comparisons on one run folder's saved gradients and measured errors.

The functions take the run folder's path and plain values, so that a page can cache what they
return by their arguments; each reads the run's random_seed and orthogonalization_epsilon from its
config, because those are what the run drew and orthogonalized its Q with."""
from __future__ import annotations

import dataclasses

from commlab.analysis import lowrank
from commlab.config_fields import lab_between_replicas
from commlab.engine import run_folder
from commlab.ui import runs


def choices(runs_dir: str | None = None) -> list[dict]:
    """The run picker's choices (``runs.run_choices``) that saved gradients or measured the error."""
    return [c for c in runs.run_choices(runs_dir) if _has_data(run_folder.RunFolder(c["path"]))]


def _has_data(run: run_folder.RunFolder) -> bool:
    errors = run.file("errors.jsonl")
    return bool(run.grad_steps()) or (errors.exists() and errors.stat().st_size > 0)


@dataclasses.dataclass
class Inputs:
    """What the comparisons take from one run."""

    config: dict  # as stored in the run folder
    steps: list[int]  # the steps whose exact mean gradient was saved
    names: list[str]  # the layers to compare
    all_matrices: bool  # the run's rule compressed no layer, so ``names`` is every matrix
    rank: int  # the run's matrix_approximation_rank
    random_seed: int
    epsilon: float  # orthogonalization_epsilon
    on_shards: bool = False  # HSDP with the lab's hook: the layers are each rank's shards


def inputs(run_dir: str) -> Inputs:
    run = run_folder.RunFolder(run_dir)
    cfg = run.config_dict()
    names, all_matrices = lowrank.layers_to_analyse(run.layers())
    return Inputs(cfg, run.grad_steps(), names, all_matrices,
                  int(cfg.get("matrix_approximation_rank", 1)), *_drawn_with(cfg),
                  lab_between_replicas(run.config()))


def _drawn_with(cfg: dict) -> tuple[int, float]:
    return int(cfg.get("random_seed", 0)), float(cfg.get("orthogonalization_epsilon", 0.0))


def step_errors(run_dir: str, step: int, names: tuple[str, ...]) -> list[lowrank.LayerError]:
    """Each layer's saved gradient at ``step`` against rank 1..MAX_RANK: the truncated SVD and one
    power iteration from a fresh Q."""
    run = run_folder.RunFolder(run_dir)
    seed, epsilon = _drawn_with(run.config_dict())
    return lowrank.step_errors(run.grads(step), names, seed, lowrank.MAX_RANK, epsilon)


def warm_by_rank(run_dir: str, steps: tuple[int, ...], name: str) -> list[float]:
    """One layer's error at the last of ``steps`` at every rank, Q carried over the steps before."""
    run = run_folder.RunFolder(run_dir)
    seed, epsilon = _drawn_with(run.config_dict())
    return lowrank.warm_errors_by_rank(lowrank.layer_over_steps(run.grads, steps, name), seed,
                                       lowrank.MAX_RANK, epsilon)


def warm_start(run_dir: str, steps: tuple[int, ...], name: str, rank: int) -> lowrank.WarmStart:
    """One layer over consecutive saved steps: Q carried on against a fresh Q every step."""
    run = run_folder.RunFolder(run_dir)
    seed, epsilon = _drawn_with(run.config_dict())
    return lowrank.warm_start(name, lowrank.layer_over_steps(run.grads, steps, name), rank, seed,
                              epsilon)


def pitfalls(run_dir: str) -> list[str]:
    """The PowerSGD pitfalls the run caught, one line each (``runs.pitfall_lines``)."""
    return runs.pitfall_lines(run_folder.RunFolder(run_dir).pitfalls())


def measured(run_dir: str) -> tuple[list[dict], list[tuple[int, float]]]:
    """(rows, residual norms): the errors the run measured, one row per step and layer or bucket,
    and the norm of error feedback's memory wherever it was recorded."""
    records = run_folder.RunFolder(run_dir).error_records()
    return lowrank.measured_rows(records), lowrank.ef_residual_norms(records)
