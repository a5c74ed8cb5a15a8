"""``quantkit sensitivity``: the flags parsed, ``measure_sensitivity`` called, the ranking printed."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from quantkit.cli.console import fail, say
from quantkit.errors import QuantkitError


def sensitivity_command(
    model: Optional[str] = typer.Argument(None, help="Local Hugging Face model folder (default: the embedded SmolLM2-135M-Instruct)."),
    recipe: str = typer.Option("w4a16-g64", "--recipe", "-r", help="Recipe: which linears are quantized, the "
                               "observer and activation order the candidates take, the calibration settings."),
    calib: Optional[str] = typer.Option(None, "--calib", help="Calibration data (default: the recipe's, else the bundled sample)."),
    candidates: Optional[List[str]] = typer.Option(None, "--candidate", help="A candidate format (W4_G128, W4_G64, "
                                                   "W4_G32, W8_CHANNEL, KEEP); repeatable (default: all)."),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="Calibration tokens the scores are formed on "
                                          "(default: the mixed: key's, 2048)."),
    exact_units: int = typer.Option(0, "--exact-units", help="Also measure this many units one at a time (exact KL) "
                                    "and print how well the scores rank them (a model pass per unit and format)."),
    top: int = typer.Option(10, "--top", help="Units shown per candidate."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write sensitivity.json here (plan from it with "
                                       "convert --sensitivity FILE --budget B)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it is an earlier sensitivity file."),
):
    """Rank the decoder's linears by how much each candidate format damages the model's output."""
    from quantkit.workflows.measure_sensitivity import SensitivityRequest, measure_sensitivity

    try:
        s, written = measure_sensitivity(SensitivityRequest(model, recipe, calib, tuple(candidates) if candidates else None,
                                                            tokens, exact_units, out, overwrite), log=say)
    except QuantkitError as e:
        fail(str(e))
    typer.echo(f"predicted KL (nats per token) of quantizing one unit, the rest float; method {s.method}, "
               f"{s.calibration['num_tokens']} tokens, {s.seconds['total']:.1f} s")
    for cand, args in s.candidates.items():
        if args is None:
            continue
        rows = s.ranking(cand)
        typer.echo(f"  {cand}: {len(rows)} units, total {sum(d for _, d in rows):.4g}")
        for name, d in rows[:top]:
            exact = s.exact.get(name, {}).get(cand)
            typer.echo(f"    {d:10.4g}  {name}" + (f"  (exact {exact:.4g})" if exact is not None else ""))
    if s.agreement:
        typer.echo(f"  Spearman with the exact KL ({s.agreement['units']} units): "
                   + "; ".join(f"{v}: " + ", ".join(f"{c} {r}" for c, r in per.items())
                               for v, per in s.agreement["spearman"].items()))
    if written is not None:
        typer.echo(f"written to {written}")
