"""What data-parallel calibration (``--nproc``) does not merge yet, refused before any work.

A recipe check that depends on the recipe's parts: it sits above the recipe, not in
``common/distributed.py``, whose collectives the recipe's steps use.
"""

from __future__ import annotations

from quantkit.common import distributed
from quantkit.errors import QuantkitError
from quantkit.recipe import Recipe


def check_data_parallel(recipe: Recipe, resume: bool) -> None:
    """What data-parallel calibration does not merge yet, refused before any work (one line)."""
    n = distributed.world_size()
    transforms = [s.name for s in recipe.steps[:-1]] if len(recipe.steps) > 1 else []
    problems = []
    if transforms:
        problems.append(f"the transform steps ({', '.join(transforms)}) search on one rank's batches")
    if recipe.kv_cache is not None:
        problems.append("kv_cache: the KV observer's ranges are not merged")
    if recipe.calibration.offload:
        problems.append("calibration.offload keeps each rank's activations in the staging folder only rank 0 has")
    if recipe.mixed is not None:
        problems.append("mixed: the sensitivity search runs on one process")
    if resume:
        problems.append("--resume: the boundary holds rank 0's hidden states only")
    if problems:
        raise QuantkitError(f"--nproc: {n} ranks cannot run this conversion yet: {problems[0]}; use --nproc 1")
