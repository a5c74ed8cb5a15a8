"""``quantkit plan``: the deployment footprint (``deployment_plan``) printed, or an engine's launch config."""

from __future__ import annotations

from typing import Optional

import typer
import yaml

from quantkit.cli.console import fail
from quantkit.common.jsonio import dumps_strict
from quantkit.errors import QuantkitError


def plan_command(
    model: Optional[str] = typer.Argument(None, help="Model folder or config.json (default: the embedded SmolLM2-135M-Instruct)."),
    gpu_mem: str = typer.Option("80GiB", "--gpu-mem", help="GPU memory, e.g. 80GiB, 24GB."),
    max_len: Optional[int] = typer.Option(None, "--max-len", help="Context length per request (default: 8192, or the model's max_position_embeddings when shorter)."),
    weights: Optional[str] = typer.Option(None, "--weights", help="Weight type after quantization: int4, int8, fp8, bf16..."),
    kv: str = typer.Option("fp16", "--kv", help="KV-cache type: fp16, bf16, fp8, int8, or a quantized-KV option as quantkit eval --kv names it (fp8-token-head, int8-kivi, fp8-tensor:k, ...)."),
    group_size: int = typer.Option(128, "--group-size", help="Group size for the scale overhead of 4-bit weights."),
    utilization: float = typer.Option(0.9, "--utilization", help="Fraction of GPU memory the server may use."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    emit: Optional[str] = typer.Option(None, "--emit", help="Print a launch config from the memory account instead: vllm (YAML for vllm serve --config, then the same as a command line)."),
):
    """Deployment footprint: weight bytes, KV bytes per token, and concurrency at a GPU size and context."""
    from quantkit.workflows.deployment_plan import PlanRequest, deployment_plan

    try:
        done = deployment_plan(PlanRequest(model, gpu_mem, max_len, weights, kv, group_size, utilization, emit))
    except QuantkitError as e:
        fail(str(e))
    fp, note = done.footprint, done.note
    if done.launch_config is not None:   # --emit: the launch config as YAML, then as its command line
        typer.echo(yaml.safe_dump(done.launch_config, sort_keys=False).rstrip())
        typer.echo(f"# {done.command_line}")
        if note:
            typer.echo(f"# note: {note}")
        return
    if as_json:
        typer.echo(dumps_strict(fp.to_dict(), indent=2))
        return
    gib = 2**30
    typer.echo(f"layers {fp.layers}, kv_heads {fp.kv_heads}, head_dim {fp.head_dim}; "
               f"{fp.params_total:,} parameters ({fp.params_quantizable:,} in decoder Linear layers)")
    typer.echo(f"weights: {fp.weights_before} {fp.weight_bytes_before / gib:.2f} GiB -> {fp.weights_after} "
               f"{fp.weight_bytes_after / gib:.2f} GiB (+{fp.scale_bytes / gib:.3f} GiB scales)")
    fixed = f" (of which {fp.kv_bytes_fixed / 2**20:g} MiB whatever its length)" if fp.kv_bytes_fixed else ""
    typer.echo(f"KV cache ({fp.kv_dtype}): {fp.kv_bytes_per_token / 1024:g} KiB per token, "
               f"{fp.kv_bytes_per_request / gib:.3f} GiB per {fp.max_len}-token request{fixed}")
    typer.echo(f"concurrency at {fp.gpu_mem_bytes / gib:g} GiB x {fp.utilization:g}: {fp.concurrency} requests")
    if note:
        typer.echo(f"note: {note}")
