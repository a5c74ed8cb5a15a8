"""``quantkit convert``: the flags parsed into a ``ConvertRequest``, ``convert_checkpoint`` called,
what it did printed. SIGTERM cleans up as Ctrl-C does."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import List, Optional

import typer

from quantkit.cli.console import fail, human, layer_progress, say
from quantkit.errors import QuantkitError


def convert(
    model: Optional[str] = typer.Argument(None, help="Local Hugging Face model folder (default: the embedded SmolLM2-135M-Instruct)."),
    recipe: str = typer.Option("w4a16-g64", "--recipe", "-r", help="Recipe file, shipped recipe name (recipes/) or preset name."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output folder (default: out/<model>-<recipe>)."),
    calib: Optional[str] = typer.Option(None, "--calib", help="Calibration data: sampler output folder, JSONL/CSV/Parquet log or text file."),
    group_size: Optional[int] = typer.Option(None, "--group-size", help="Override the weight group size."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Keep a module in high precision (name or 're:' pattern); repeatable."),
    num_samples: Optional[int] = typer.Option(None, "--num-samples", help="Calibration samples (overrides the recipe)."),
    max_seq_len: Optional[int] = typer.Option(None, "--max-seq-len", help="Calibration sequence length (overrides the recipe)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the output folder if it exists."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted conversion to --out from its last "
                                "complete layer (same bytes as an uninterrupted run); starts afresh, saying why, "
                                "when the model, recipe, calibration or quantkit differ."),
    device: str = typer.Option("cpu", "--device", help="Device for the per-layer work (cpu, cuda)."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Mixed precision: plan one format per module "
                                         "from measured sensitivity within this many bits per weight (scales and "
                                         "zero points counted); the recipe's mixed: section, or its defaults. "
                                         "'go': the smallest plan whose verdict is GO (converts and evaluates "
                                         "several plans, bisecting the budget)."),
    sensitivity: Optional[str] = typer.Option(None, "--sensitivity", help="Plan from this sensitivity.json (a "
                                              "previous mixed conversion's) instead of searching again."),
    no_eval: bool = typer.Option(False, "--no-eval", help="Skip the evaluation report after converting."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow model code from the model folder."),
    nproc: Optional[str] = typer.Option(None, "--nproc", help="Data-parallel calibration on this many local ranks "
                                        "(launches torchrun; gloo on the CPU, NCCL on GPUs): each runs a share of the "
                                        "calibration batches, statistics are all-reduced, rank 0 writes."),
    lang: str = typer.Option("en", "--lang", help="Language of the model card (README.md in the output) and of the "
                             "evaluation report: en or zh. The card's front matter and report.json are the same in both."),
    model_free: bool = typer.Option(False, "--model-free", help="Quantize the safetensors shards tensor by tensor, "
                                    "no model built (recipes that need no data): memory bounded by the largest "
                                    "tensor; taken by itself for a folder transformers cannot build."),
    targets: Optional[str] = typer.Option(None, "--targets", help="Model-free: a regular expression over module "
                                          "names choosing the 2-D weights to quantize (default: every decoder-layer "
                                          "linear but norms, routers, gates and vision towers); implies --model-free."),
):
    """Quantize a model layer by layer into a compressed-tensors checkpoint."""
    from quantkit.common import distributed
    from quantkit.workflows.convert_checkpoint import ConvertRequest, Reporters, convert_checkpoint

    request = ConvertRequest(model, recipe, out, calib, group_size, tuple(ignore or ()), num_samples, max_seq_len,
                             overwrite, resume, device, budget, sensitivity, not no_eval, trust_remote_code, nproc,
                             lang, model_free or targets is not None, targets)
    terminated: list[int] = []

    def on_sigterm(signum, frame):   # cleans up as Ctrl-C does
        terminated.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:   # not the main thread (an embedding application): leave its handler
        previous = None
    try:
        done = convert_checkpoint(request, Reporters(layer_progress, say))
    except QuantkitError as e:
        fail(str(e))
    except KeyboardInterrupt as e:
        _interrupted(e, signal.SIGTERM if terminated else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        distributed.shutdown()
    _print_outcome(done)


def _print_outcome(done) -> None:
    from quantkit.cli.eval_command import print_evaluated

    if done.launched_exit is not None:
        raise typer.Exit(code=done.launched_exit)
    if done.path is None:          # a rank that does not write
        return
    s = done.summary
    typer.echo(
        f"done: {s['quantized_modules']} modules in {s['layers']} layers {s['formats']}; "
        f"{human(s['bytes_before'])} -> {human(s['bytes_after'])} ({s['ratio']:.2f}x smaller); "
        f"{s['seconds']:.1f} s; peak memory {human(s['peak_rss_bytes'])}; written to {done.path}"
    )
    for note in done.notes:
        say(note)
    if done.search is not None:
        _print_search(done.search, done.path)
    if done.evaluation is not None:
        print_evaluated(done.evaluation)


def _print_search(search, path: Path) -> None:
    """``--budget go``'s trials, then the plan it kept."""
    for t in search.trials:
        typer.echo(f"  budget {t.budget_bits:.3f}: plan {t.bits_per_weight:.3f} bits per weight, "
                   f"{t.nbytes} bytes, predicted KL {t.predicted_kl:.4g}: {t.decision}"
                   + (f" (same plan as {t.same_plan_as:.3f})" if t.same_plan_as is not None else ""))
    f = search.found
    if f is None:
        typer.echo(f"smallest GO: none up to {search.high_bits:.3f} bits per weight; report in {path / 'eval'}")
        return
    below = "the cheapest plan" if f.budget_bits == search.low_bits else \
        f"GO; {search.tolerance_bits} bits less is not"
    typer.echo(f"smallest GO: {f.bits_per_weight:.3f} bits per weight ({f.nbytes} bytes of planned weights; "
               f"{below}); report in {path / 'eval'}")


def _interrupted(e: KeyboardInterrupt, sig: signal.Signals) -> None:
    from quantkit.workflows.convert import ConversionInterrupted

    if isinstance(e, ConversionInterrupted):
        typer.echo(f"interrupted ({sig.name}) after {e.layers_done} of {e.num_layers} layers; {e.folder} is kept: "
                   "rerun the same command with --resume to continue (without it, the folder is removed)", err=True)
    else:
        typer.echo(f"interrupted ({sig.name})", err=True)
    raise typer.Exit(code=128 + sig)
