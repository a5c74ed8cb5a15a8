"""``quantkit calibrate LOGS --model M --n 512 --max-len L --out DIR``: a thin typer face over
``quantkit.calibration.calibrate``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from quantkit.cli.console import fail
from quantkit.calibration.config import DEFAULT_LENGTH_EDGES, FieldMap, SamplerConfig
from quantkit.common.i18n import DEFAULT_LANG, check_lang
from quantkit.errors import QuantkitError


def _edges(value: Optional[str]) -> tuple[int, ...]:
    if not value:
        return DEFAULT_LENGTH_EDGES
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise QuantkitError(f"--edges: expected comma-separated token counts, got {value!r}") from None


def calibrate_command(
    logs: Optional[Path] = typer.Argument(None, help="Traffic log: JSONL, CSV, Parquet, .txt or a saved HF datasets "
                                                      "folder (default: the embedded business-traffic sample)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="HF model folder or .gguf whose tokenizer and "
                                                                    "chat template are used (default: the embedded model)."),
    n: int = typer.Option(512, "--n", help="Number of calibration samples."),
    max_len: int = typer.Option(2048, "--max-len", help="Deployment's maximum context in tokens; longer rows are "
                                                        "truncated (counted) or dropped (--long drop)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: samples.jsonl, manifest.json, report.*"),
    seed: int = typer.Option(0, "--seed", help="Random seed: one seed, byte-identical outputs."),
    policy: str = typer.Option("traffic", "--policy", help="Samples per (task x length) cell: traffic (shares of the "
                                                          "log's rows, repeats counted), sqrt (square root of "
                                                          "them) or balanced (equal cells)."),
    min_per_cell: int = typer.Option(2, "--min-per-cell", help="Floor per non-empty (task x length) cell."),
    edges: Optional[str] = typer.Option(None, "--edges", help="Length-bucket upper edges in tokens, e.g. "
                                                              "64,256,1024 (max-len always closes the last)."),
    long: str = typer.Option("truncate", "--long", help="Rows over max-len: truncate or drop."),
    max_malformed: float = typer.Option(0.05, "--max-malformed", help="Fail when a larger share of rows is malformed."),
    near_dup: float = typer.Option(0.8, "--near-dup", help="Estimated Jaccard similarity that makes a near duplicate."),
    text_field: str = typer.Option("text", "--text-field", help="Column holding raw text."),
    messages_field: str = typer.Option("messages", "--messages-field", help="Column holding chat messages."),
    prompt_field: str = typer.Option("prompt", "--prompt-field", help="Column holding the prompt."),
    completion_field: str = typer.Option("completion", "--completion-field", help="Column holding the completion."),
    task_field: str = typer.Option("task", "--task-field", help="Column holding a task label ('' to always infer)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it holds an earlier quantkit calibrate output."),
    lang: str = typer.Option(DEFAULT_LANG, "--lang", help="Language of report.md and report.html: en or zh "
                                                          "(report.json and the manifest are the same in both)."),
) -> None:
    """Draw a calibration set covering every task type and length range of a traffic log, with a
    manifest and a coverage report (Markdown, HTML, JSON)."""
    from quantkit.calibration.calibration_set import calibrate

    try:
        check_lang(lang)
        cfg = SamplerConfig(
            num_samples=n, max_len=max_len, seed=seed, policy=policy, min_per_cell=min_per_cell,
            length_edges=_edges(edges), long_policy=long, near_dup_threshold=near_dup,
            max_malformed_share=max_malformed,
            fields=FieldMap(messages=messages_field, prompt=prompt_field, completion=completion_field,
                            text=text_field, task=task_field or None))
        start = time.perf_counter()
        result = calibrate(logs, model, cfg, out=out, overwrite=overwrite, lang=lang)
    except QuantkitError as exc:
        fail(str(exc))
    c = result.manifest["counts"]
    typer.echo(f"calibrate: {c['selected']} samples from {c['pool']} distinct rows "
               f"({c['rows_read']} read, {c['malformed']} malformed, {c['duplicates_exact']} exact and "
               f"{c['duplicates_near']} near duplicates, {c['truncated_selected']} truncated) "
               f"in {len(result.manifest['cells'])} cells; {time.perf_counter() - start:.1f} s -> {result.out}")
    for warning in result.manifest["warnings"]:
        typer.echo(f"warning: {warning}", err=True)
