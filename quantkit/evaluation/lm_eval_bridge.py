"""Run lm-eval tasks (local YAML, offline) on an in-memory model, baseline and candidate.

lm-eval's built-in tasks download from the hub; ``eval/lm_eval_tasks/`` holds offline
ones (``dataset_path: json`` with ``data_files`` relative to that folder, which is why the
run happens with it as the working directory).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import QuantkitError
from .models import model_device
from .slices import eval_dir


def tasks_dir() -> Path:
    return eval_dir() / "lm_eval_tasks"


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_lm_eval(model, tokenizer, tasks: list[str], include_path: str | Path | None = None,
                limit: int | None = None, batch_size: int = 8, max_length: int | None = None) -> dict[str, dict]:
    """``{task: {metric: value}}`` for one model (lm-eval's ``simple_evaluate`` on an ``HFLM``)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    include = Path(include_path or tasks_dir()).resolve()
    manager = TaskManager(include_path=str(include), include_defaults=False)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise QuantkitError(f"{include}: unknown lm-eval task {unknown[0]!r} "
                            f"(local tasks: {', '.join(sorted(manager.all_tasks))})")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
              device=str(model_device(model)), max_length=max_length)
    with _cwd(include):
        out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                              log_samples=False, bootstrap_iters=0)
    results = {}
    for task, metrics in out["results"].items():
        results[task] = {k.split(",")[0]: float(v) for k, v in metrics.items()
                         if isinstance(v, (int, float)) and not k.startswith("alias") and "stderr" not in k}
    return results


def compare_lm_eval(baseline, candidate, tokenizer, tasks: list[str], **kw) -> dict[str, dict]:
    """``{task: {metric: {"base", "cand", "drop"}}}``."""
    rb = run_lm_eval(baseline, tokenizer, tasks, **kw)
    rc = run_lm_eval(candidate, tokenizer, tasks, **kw)
    return {t: {m: {"base": rb[t][m], "cand": rc[t].get(m), "drop": rb[t][m] - rc[t].get(m, float("nan"))}
                for m in rb[t]} for t in rb}
