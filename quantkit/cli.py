"""The ``quantkit`` command line. Each command forwards to a typed Python function."""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import typer

# imported, not guarded: an ImportError here is a bug or a missing dependency, and must say so
# rather than leave the commands out of the help ("No such command"); these modules load
# transformers only when a command runs
from quantkit.calibration.cli import calibrate_command
from quantkit.common.disk_space import disk_full_error, is_disk_full
from quantkit.errors import QuantkitError
from quantkit.evaluation.cli import eval_command, plan_command
from quantkit.workflows.cli import loadtest_command
from quantkit.common.outputs import OutputPolicy
from quantkit.common.jsonio import dumps_strict

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Post-training quantization for LLMs: convert, inspect, calibrate, evaluate.")


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=2)


def _args_text(d: dict) -> str:
    """'float8 block 128x128', 'float8 group g32 e8m0', 'int3 group g64' from a QuantArgs dict."""
    text = f"{d['type']}{d['num_bits']} {d['strategy']}" + (f" g{d['group_size']}" if d["group_size"] else "")
    if d.get("block_structure"):
        text += " {}x{}".format(*d["block_structure"])
    return text + (" e8m0" if d.get("scale_dtype") == "torch.uint8" else "")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _progress(iterable, total):
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc="quantizing layers", unit="layer", file=sys.stderr)


@app.command()
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
    flags = ConvertFlags(model, recipe, out, calib, group_size, ignore or [], num_samples, max_seq_len, overwrite,
                         resume, device, budget, sensitivity, no_eval, trust_remote_code, nproc, lang,
                         model_free or targets is not None, targets)
    terminated: list[int] = []

    def on_sigterm(signum, frame):   # cleans up as Ctrl-C does
        terminated.append(signum)
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:   # not the main thread (an embedding application): leave its handler
        previous = None
    try:
        _convert(flags)
    except QuantkitError as e:
        _fail(str(e))
    except KeyboardInterrupt as e:
        _interrupted(e, signal.SIGTERM if terminated else signal.SIGINT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        from quantkit.common import distributed
        distributed.shutdown()


@dataclass(frozen=True)
class ConvertFlags:
    """``quantkit convert``'s command line, as given."""

    model: str | None
    recipe: str
    out: Path | None
    calib: str | None
    group_size: int | None
    ignore: list[str]
    num_samples: int | None
    max_seq_len: int | None
    overwrite: bool
    resume: bool
    device: str
    budget: str | None
    sensitivity: str | None
    no_eval: bool
    trust_remote_code: bool
    nproc: str | None
    lang: str
    model_free: bool = False
    targets: str | None = None


def _convert(f: ConvertFlags) -> None:
    """Check the flags and the recipe, prepare the output, convert (or search the smallest GO
    plan), save, say what was written, evaluate."""
    # the flags and the recipe are checked before the pipeline's modules (transformers) load:
    # a refused command answers in about the time Python takes to import torch
    from quantkit.common import distributed
    from quantkit.workflows.model_card import check_lang

    check_lang(f.lang)
    ranks = distributed.parse_nproc(f.nproc, f.device)
    launched = distributed.launched_ranks()
    if ranks is not None and launched > 1 and ranks != launched:
        raise QuantkitError(f"--nproc: {ranks}, but torchrun started {launched} ranks; give one or the other")
    r = _convert_recipe(f)
    go = r.mixed is not None and r.mixed.smallest_go is not None   # --budget go, or the recipe's key
    from quantkit.workflows import convert as api
    from quantkit.workflows.model_free import model_free_reason
    from quantkit.formats.writer import prepare_output

    model_name = Path(f.model).name if f.model else "smollm2-135m-instruct"
    out = f.out or Path("out") / f"{model_name}-{r.name}"
    device = distributed.initialize(f.device)   # joins torchrun's process group, if it started this one
    writes = distributed.is_writer()
    inputs = api.conversion_inputs(f.model, r, f.recipe, f.calib)
    free = model_free_reason(f.model, r, f.model_free, f.trust_remote_code)
    if writes:
        prepare_output(out, f.overwrite, OutputPolicy("convert", inputs))
    if free is not None:
        return _convert_model_free(f, r, out, inputs, free)
    if ranks is not None and ranks > 1 and launched == 1:
        _launch(ranks, out)   # the ranks check and convert again; this process only waits
    progress, say = _reporters(f, r, out, writes)
    if go:
        q = _smallest_go(f, r, out, device, progress, say)
    else:
        options = api.ConvertOptions(f.ignore, out.parent, out, f.resume, device, progress, say, f.trust_remote_code,
                                     f.lang)
        q = api.convert(f.model, r, f.calib, options, inputs)
    if not writes:
        return
    path = q.save(out, overwrite=f.overwrite)
    _say_done(q.summary(), path)
    if go:
        _say_smallest_go(path)
        _card_with_verdict(path, f.lang)   # the search evaluated the plan it kept
    elif not f.no_eval:
        _maybe_eval(f.model, path, r, f.calib, f.lang)


def _convert_model_free(f: ConvertFlags, r, out: Path, inputs: dict, reason: str) -> None:
    """``--model-free`` (or a folder transformers cannot build): the shards quantized tensor by
    tensor; no evaluation, which would build the model this path avoids."""
    from quantkit.workflows.model_free import ASKED, ModelFreeOptions, check_flags, convert_model_free

    check_flags({"--resume": f.resume, "--nproc": f.nproc is not None, "--sensitivity": f.sensitivity is not None,
                 "--device": f.device != "cpu"})
    progress, say = _reporters(f, r, out, True)
    if reason != ASKED:
        say(f"model-free: {reason}; the shards are quantized tensor by tensor instead (--model-free)")
    if f.calib is not None:
        say(f"warning: --calib: a model-free conversion takes no calibration data (recipe '{r.name}'); not used")
    options = ModelFreeOptions(f.targets, f.ignore, out.parent, out, progress, say, f.lang)
    q = convert_model_free(f.model, r, options, inputs)
    path = q.save(out, overwrite=f.overwrite)
    _say_done(q.summary(), path)
    if not f.no_eval:
        say(f"evaluation skipped: it builds the model a model-free conversion avoids (run quantkit eval {path})")


def _convert_recipe(f: ConvertFlags):
    """The recipe with the flags' overrides; every key, the eval: section included, checked."""
    from quantkit.evaluation.section import check_eval_section
    from quantkit.recipe import load_recipe

    go = f.budget is not None and f.budget.strip().lower() == "go"
    return load_recipe(f.recipe, check_eval=check_eval_section).with_overrides(
        f.group_size, None, f.num_samples, f.max_seq_len, f.calib, budget_bits=None if go else _budget(f.budget),
        sensitivity=f.sensitivity, smallest_go=go)


def _reporters(f: ConvertFlags, r, out: Path, writes: bool):
    """The layer loop's progress bar (after a banner) and the log lines, both on stderr; a rank
    other than 0 computes with rank 0 and says nothing."""
    if not writes:
        return None, lambda line: None
    banner = (f"quantkit convert: {f.model or 'embedded default (SmolLM2-135M-Instruct)'} -> {out} "
              f"[recipe {r.name}, steps {' -> '.join(st.name for st in r.steps)}]")

    def progress(iterable, total):
        # printed once the model, recipe and data are checked: a bad input's stderr is its error line
        typer.echo(banner, err=True)
        return _progress(iterable, total)

    return progress, lambda line: typer.echo(line, err=True)


def _say_done(s: dict, path: Path) -> None:
    typer.echo(
        f"done: {s['quantized_modules']} modules in {s['layers']} layers {s['formats']}; "
        f"{_human(s['bytes_before'])} -> {_human(s['bytes_after'])} ({s['ratio']:.2f}x smaller); "
        f"{s['seconds']:.1f} s; peak memory {_human(s['peak_rss_bytes'])}; written to {path}"
    )


def _launch(nproc: int, out: Path) -> None:
    """Run this command again under torchrun on ``nproc`` local ranks; exit with its status.

    No process of the run outlives this one (``launch.run_ranks``), and no staging folder for
    ``out`` that a stopped rank left behind."""
    import os
    import shutil
    import tempfile

    from quantkit.common.distributed import free_port, launch_argv
    from quantkit.workflows.launch import remove_dead_staging, run_ranks

    # torchrun's logs and the ranks' temporary files (a rank other than 0 records its layers in a
    # private folder) live in one folder of the run's, removed however the run ends: a rank
    # stopped before it cleaned up leaves nothing in the user's temporary folder
    started = time.time()
    run = Path(tempfile.mkdtemp(prefix="quantkit-torchrun-"))
    (run / "logs").mkdir()
    (run / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(run / "tmp"))
    env.setdefault("OMP_NUM_THREADS", "1")   # torchrun's own default for several ranks, without its warning
    try:
        code = run_ranks([sys.executable, *launch_argv(nproc, sys.argv[1:], free_port(), str(run / "logs"))], env)
    finally:
        remove_dead_staging(out, started)
        shutil.rmtree(run, ignore_errors=True)
    raise typer.Exit(code=code)


def _budget(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise QuantkitError(f"--budget: expected bits per weight (e.g. 4.5) or 'go', got {text!r}") from None


def _smallest_go(f: ConvertFlags, r, out: Path, device: str, progress, say):
    """``--budget go``: plans converted and evaluated until the smallest GO is found (smallest_go.py)."""
    from quantkit.workflows.convert import ConvertOptions
    from quantkit.workflows.smallest_go import RESULT_FILE, smallest_go

    if f.no_eval:
        raise QuantkitError("--budget go: needs the evaluation (it decides which plan is GO); drop --no-eval")
    if f.resume:
        raise QuantkitError("--budget go: --resume continues one conversion, not a search; drop --resume")

    def verdict(folder: Path) -> str:
        report = _evaluate(f.model, folder, r, f.calib, f.lang)
        return json.loads((report / "report.json").read_text(encoding="utf-8"))["decision"]

    options = ConvertOptions(ignore=f.ignore, device=device, progress=progress, trust_remote_code=f.trust_remote_code,
                             lang=f.lang)
    q, search = smallest_go(f.model, r, f.calib, evaluate=verdict, workdir=out.parent, log=say, options=options)
    if search.found is None:
        say(f"smallest GO: no plan up to {search.high_bits:.3f} bits per weight is GO; writing the "
            f"{search.high_bits:.3f}-bit plan ({search.trials[0].decision}) and its report ({RESULT_FILE})")
    return q


def _say_smallest_go(path: Path) -> None:
    from quantkit.workflows.smallest_go import RESULT_FILE

    data = json.loads((path / RESULT_FILE).read_text(encoding="utf-8"))
    for t in data["trials"]:
        typer.echo(f"  budget {t['budget_bits']:.3f}: plan {t['bits_per_weight']:.3f} bits per weight, "
                   f"{t['nbytes']} bytes, predicted KL {t['predicted_kl']:.4g}: {t['decision']}"
                   + (f" (same plan as {t['same_plan_as']:.3f})" if t["same_plan_as"] is not None else ""))
    f = data["found"]
    if f is None:
        typer.echo(f"smallest GO: none up to {data['high_bits']:.3f} bits per weight; report in {path / 'eval'}")
        return
    below = "the cheapest plan" if f["budget_bits"] == data["low_bits"] else \
        f"GO; {data['tolerance_bits']} bits less is not"
    typer.echo(f"smallest GO: {f['bits_per_weight']:.3f} bits per weight ({f['nbytes']} bytes of planned weights; "
               f"{below}); report in {path / 'eval'}")


def _interrupted(e: KeyboardInterrupt, sig: signal.Signals) -> None:
    from quantkit.workflows.convert import ConversionInterrupted

    if isinstance(e, ConversionInterrupted):
        typer.echo(f"interrupted ({sig.name}) after {e.layers_done} of {e.num_layers} layers; {e.folder} is kept: "
                   "rerun the same command with --resume to continue (without it, the folder is removed)", err=True)
    else:
        typer.echo(f"interrupted ({sig.name})", err=True)
    raise typer.Exit(code=128 + sig)


def _evaluate(model, path: Path, recipe, calib: str | None, lang: str | None = None) -> Path:
    """The evaluation convert runs on a checkpoint it wrote (after the conversion, or for each plan
    of ``--budget go``); its report folder, in ``--lang`` as the model card."""
    from quantkit.evaluation import evaluate_checkpoint

    return evaluate_checkpoint(model, path, recipe, calib, lang or "en")


def _maybe_eval(model, path: Path, recipe, calib: str | None, lang: str | None = None) -> None:
    _evaluate(model, path, recipe, calib, lang)
    _card_with_verdict(path, lang)


def _card_with_verdict(path: Path, lang: str | None = None) -> None:
    """The checkpoint's model card rendered again, now with its evaluation's verdict, in ``lang``
    (None: the language it was written in)."""
    from quantkit.workflows.model_card import write_card

    write_card(path, lang=lang)


@app.command()
def inspect(path: Path = typer.Argument(..., help="Quantized checkpoint folder."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Show a checkpoint's scheme, per-module formats and sizes, and the kernel backend."""
    try:
        from quantkit.runtime.checkpoint_info import inspect_checkpoint

        info = inspect_checkpoint(path)
    except QuantkitError as e:
        _fail(str(e))
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
    typer.echo(f"  size: {_human(info['total_bytes'])} total, {_human(info['quantized_bytes'])} in quantized modules")
    typer.echo(f"  backend: {info['backend']['cpu']} on CPU, {info['backend']['cuda']} on CUDA (override: QUANTKIT_BACKEND)")
    coverage = info["moe_coverage"]
    if coverage:
        from quantkit.pipeline.coverage import coverage_lines

        for line in coverage_lines(coverage["layers"], coverage["mode"], coverage["min_tokens"]):
            typer.echo(f"  {line}")


@app.command("sensitivity")
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
    try:
        from quantkit.workflows.convert import sensitivity
        from quantkit.config.validation import check_flag
        from quantkit.config.mixed import MixedSettings

        if tokens is None:
            tokens = MixedSettings().tokens
        check_flag(MixedSettings, "tokens", tokens, "--tokens")
        from quantkit.recipe import load_recipe
        from quantkit.sensitivity.search import SearchOptions

        policy = None
        if out is not None and not out.parent.is_dir():
            raise QuantkitError(f"--out: {out.parent} is not a folder")
        r = load_recipe(recipe)
        if out is not None:
            from quantkit.workflows.convert import conversion_inputs
            policy = OutputPolicy("sensitivity", conversion_inputs(model, r, recipe, calib))
            policy.check(out, overwrite, is_file=True)
        s = sensitivity(model, r, calib, candidates=candidates, options=SearchOptions(tokens, exact_units=exact_units),
                        log=lambda line: typer.echo(line, err=True))
    except QuantkitError as e:
        _fail(str(e))
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
    if out is not None:
        try:
            typer.echo(f"written to {s.save(out, overwrite, policy)}")
        except QuantkitError as e:
            _fail(str(e))


app.command("calibrate")(calibrate_command)
app.command("eval")(eval_command)
app.command("plan")(plan_command)
app.command("loadtest")(loadtest_command)


def main() -> None:
    """The ``quantkit`` command: every failure the user can fix is one ``error:`` line and exit 2,
    a usage mistake (an unknown flag, a missing argument) included."""
    try:   # recent typer vendors click and exports no usage-error type of its own
        from typer._click.exceptions import NoArgsIsHelpError, UsageError
    except ImportError:
        from click.exceptions import NoArgsIsHelpError, UsageError

    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as e:
        typer.echo(e.ctx.get_help() if e.ctx is not None else e.format_message(), err=True)
        code = 2
    except UsageError as e:
        ctx = e.ctx
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        typer.echo(f"error: {e.format_message()}{hint}", err=True)
        code = 2
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        typer.echo("interrupted", err=True)
        code = 130
    except QuantkitError as e:
        typer.echo(f"error: {e}", err=True)
        code = 2
    except OSError as e:
        if not is_disk_full(e):
            raise
        typer.echo(f"error: {disk_full_error(Path(e.filename or '.').parent)}", err=True)
        code = 2
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
