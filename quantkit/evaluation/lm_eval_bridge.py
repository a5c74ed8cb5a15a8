"""Run lm-eval tasks (local YAML, offline) on an in-memory model, baseline and candidate.

lm-eval's built-in tasks download from the hub; ``eval/lm_eval_tasks/`` holds offline
ones (``dataset_path: json`` with ``data_files`` relative to that folder, which is why the
run happens with it as the working directory).

In the verdict each task is a slice ``lm-eval:<task>`` with one measure,
``lm_eval_acc_drop``: the largest baseline-minus-candidate drop over the task's scores
(metrics lm-eval marks higher-is-better whose values lie in [0, 1]: acc, acc_norm,
exact_match, pass_at_1, ...). lm-eval slices have no language and always gate.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.evaluation.causal_lm import model_device
from quantkit.evaluation.slices import eval_dir


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


def task_manager(tasks: list[str], include_path: str | Path | None = None):
    """lm-eval's TaskManager over the local folder; unknown task names are a user error."""
    from lm_eval.tasks import TaskManager

    include = Path(include_path or tasks_dir()).resolve()
    manager = TaskManager(include_path=str(include), include_defaults=False)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise QuantkitError(f"{include}: unknown lm-eval task {unknown[0]!r} "
                            f"(local tasks: {', '.join(sorted(manager.all_tasks))})")
    return include, manager


def run_lm_eval(model, tokenizer, tasks: list[str], include_path: str | Path | None = None,
                limit: int | None = None, batch_size: int = 8, max_length: int | None = None,
                directions: dict | None = None) -> dict[str, dict]:
    """``{task: {metric: value}}`` for one model (lm-eval's ``simple_evaluate`` on an ``HFLM``);
    ``directions``, when given, receives ``{task: {metric: higher_is_better}}``."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    include, manager = task_manager(tasks, include_path)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
              device=str(model_device(model)), max_length=max_length)
    with _cwd(include):
        out = simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=limit,
                              log_samples=False, bootstrap_iters=0)
    hib = out.get("higher_is_better") or {}
    results = {}
    for task, metrics in out["results"].items():
        vals = {k.split(",")[0]: float(v) for k, v in metrics.items()
                if isinstance(v, (int, float)) and not k.startswith("alias") and "stderr" not in k}
        # the task's declared metrics only (lm-eval adds counts such as sample_len)
        results[task] = {k: v for k, v in vals.items() if k in hib[task]} if hib.get(task) else vals
    if directions is not None:
        directions.update({t: dict(d) for t, d in hib.items()})
    return results


def compare_lm_eval(baseline, candidate, tokenizer, tasks: list[str], **kw) -> dict[str, dict]:
    """``{task: {metric: {"base", "cand", "drop", "higher_is_better"}}}``."""
    directions: dict = {}
    rb = run_lm_eval(baseline, tokenizer, tasks, directions=directions, **kw)
    rc = run_lm_eval(candidate, tokenizer, tasks, **kw)
    return {t: {m: {"base": rb[t][m], "cand": rc[t].get(m), "drop": rb[t][m] - rc[t].get(m, float("nan")),
                    "higher_is_better": directions.get(t, {}).get(m)}
                for m in rb[t]} for t in rb}


def lm_eval_measures(compared: dict[str, dict]) -> dict[str, dict]:
    """``{"lm-eval:<task>": {"lm_eval_acc_drop": worst drop}}`` over the task's scores.

    >>> lm_eval_measures({"mmlu": {"acc": {"base": 0.5, "cand": 0.25, "drop": 0.25, "higher_is_better": True},
    ...                             "ppl": {"base": 9.0, "cand": 12.0, "drop": -3.0, "higher_is_better": False}}})
    {'lm-eval:mmlu': {'lm_eval_acc_drop': 0.25}}
    """
    out = {}
    for task, metrics in compared.items():
        drops = [r["drop"] for r in metrics.values()
                 if r.get("higher_is_better") and r.get("cand") is not None
                 and 0.0 <= r["base"] <= 1.0 and 0.0 <= r["cand"] <= 1.0]
        out[f"lm-eval:{task}"] = {"lm_eval_acc_drop": max(drops)} if drops else {}
    return out
