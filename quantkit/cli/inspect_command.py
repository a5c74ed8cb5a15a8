"""``quantkit inspect``: a checkpoint's scheme, formats, sizes and kernel backend, printed."""

from __future__ import annotations

from pathlib import Path

import typer

from quantkit.cli.console import fail, human
from quantkit.common.jsonio import dumps_strict
from quantkit.errors import QuantkitError


def inspect(path: Path = typer.Argument(..., help="Quantized checkpoint folder."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Show a checkpoint's scheme, per-module formats and sizes, and the kernel backend."""
    try:
        from quantkit.runtime.checkpoint_info import inspect_checkpoint

        info = inspect_checkpoint(path)
    except QuantkitError as e:
        fail(str(e))
    if as_json:
        typer.echo(dumps_strict(info, indent=2))
        return
    typer.echo(f"{info['path']}: {info['architecture']}, format {info['format']}, steps {' -> '.join(info['steps']) or '?'}")
    for name, g in info["config_groups"].items():
        w, a = g["weights"], g["input_activations"]
        wdesc = _args_text(w) + ("" if w["symmetric"] else " asym") if w else "-"
        adesc = f"{_args_text(a)}{' dynamic' if a['dynamic'] else ' static'}" if a else "none"
        typer.echo(f"  {name}: targets {g['targets']}  weights {wdesc}  activations {adesc}  ({g['format']})")
    typer.echo(f"  kept in high precision: {', '.join(info['ignore']) or 'none'}")
    typer.echo(f"  modules by format: {info['modules_by_format']}")
    typer.echo(f"  size: {human(info['total_bytes'])} total, {human(info['quantized_bytes'])} in quantized modules")
    typer.echo(f"  backend: {info['backend']['cpu']} on CPU, {info['backend']['cuda']} on CUDA (override: QUANTKIT_BACKEND)")
    coverage = info["moe_coverage"]
    if coverage:
        from quantkit.pipeline.coverage import coverage_lines

        for line in coverage_lines(coverage["layers"], coverage["mode"], coverage["min_tokens"]):
            typer.echo(f"  {line}")


def _args_text(d: dict) -> str:
    """'float8 block 128x128', 'float8 group g32 e8m0', 'int3 group g64' from a QuantArgs dict."""
    text = f"{d['type']}{d['num_bits']} {d['strategy']}" + (f" g{d['group_size']}" if d["group_size"] else "")
    if d.get("block_structure"):
        text += " {}x{}".format(*d["block_structure"])
    return text + (" e8m0" if d.get("scale_dtype") == "torch.uint8" else "")
