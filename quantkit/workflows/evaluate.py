"""Evaluating checkpoints from their folders: what ``quantkit eval`` runs (``evaluate_paths``) and
what ``quantkit convert`` runs on the checkpoint it wrote (``evaluate_checkpoint``). Both return
the ``EvalResult``; the faces print it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from quantkit.common.device import check_device
from quantkit.common.outputs import OutputPolicy, existing_path, written_by
from quantkit.config.validation import check_flag
from quantkit.errors import QuantkitError
from quantkit.evaluation.footprint import deployment_footprint
from quantkit.serving.engine_options import EngineOptions
from quantkit.evaluation.eval_section import check_eval_section
from quantkit.recipe import load_recipe
from quantkit.kv_cache import kv_options
from quantkit.evaluation.evaluator import EvalConfig, evaluate
from quantkit.evaluation.eval_result import integrity_only
from quantkit.evaluation.checkpoint import check_weights, is_quantized, load_model, load_tokenizer, module_errors, resolve_dir
from quantkit.evaluation.context import deployment_length
from quantkit.evaluation.integrity import check_checkpoint
from quantkit.evaluation.kv_options import candidate_kv
from quantkit.evaluation.languages import language_gate
from quantkit.evaluation.eval_section import EvalSection, suite_options
from quantkit.evaluation.slices import load_suite
from quantkit.evaluation.evaluator import evaluate_served
from quantkit.evaluation.served_pair import served_models
from quantkit.evaluation.business import read_business
from quantkit.inputs.embedded_model import cache_dir


def recipe_eval_section(recipe: str | None) -> dict:
    """The ``eval:`` section of the recipe ``--recipe`` names (checked), or none."""
    if not recipe:
        return {}
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
    fp = deployment_footprint(base_dir, cand_dir, o.gpu_mem, deployment_length(base, max_len)[0],
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

    suite, source, max_len, section, suite_opts, gate = resolved
    served = served_models(o.engine, base_dir, cand_dir, tok, max_len, source, o.device)
    fp = deployment_footprint(base_dir, cand_dir, o.gpu_mem, served.max_len)
    config = EvalConfig(suite=suite, max_len=served.max_len, max_len_source=served.max_len_source,
                        thresholds=section.get("thresholds"), options=suite_opts, calibration_log=o.calibration_log,
                        show_samples=o.show_samples or bool(section.get("show_samples")), footprint=fp,
                        module_errors=module_errors(cand_dir), progress=o.progress, meta=meta, languages=gate,
                        integrity=integrity, unsafe_code_exec=o.unsafe_code_exec,
                        calibration_sample=o.calibration_sample)
    return evaluate_served(served, tok, config)


def _check_calibration_flags(o: PathsOptions, suite_opts) -> None:
    """A bad --calib log or --calib-sample fails before any model loads."""

    if o.calibration_log:
        read_business(o.calibration_log, None, suite_opts.business_rows, o.calibration_sample)
    elif o.calibration_sample is not None:
        raise QuantkitError("--calib-sample: needs --calib (the log whose business rows it is checked against)")

@dataclass(frozen=True)
class Evaluated:
    """An evaluation and the folder its report was written to."""

    result: object          # EvalResult
    folder: Path


def evaluate_checkpoint(model, path: Path, recipe, calib: str | Path | None = None, lang: str = "en",
                        say: Callable[[str], None] = print) -> Evaluated:
    """What ``quantkit convert`` runs after writing ``path``: the report goes to ``path/eval``, in
    ``lang`` (convert's ``--lang``, which also sets the model card's).

    ``calib``, the user's traffic log the conversion drew its calibration set from, adds the
    business slices, without the drawn rows (their hashes are in ``path/quantization_log.json``).
    A sampler folder does not name its log: then a line says how to evaluate them."""
    log = _drawn_log(path, calib)
    if calib is not None and log is None:
        folder = Path(calib).is_dir()
        why = "a sampler folder does not name its log" if folder else "no calibration set was drawn from it"
        say(f"evaluation: no business slices from {calib} ({why}); add them with: quantkit eval "
                   f"--candidate {path} --calib LOG" + (f" --calib-sample {calib}" if folder else ""))
    slot = Path(path) / "eval"
    policy = OutputPolicy("eval", {"baseline model": model, "calibration log": log}, slot=slot)
    result = evaluate_paths(model, path, eval_section=dict(getattr(recipe, "eval", {}) or {}),
                            calibration_log=log, calibration_sample=path if log is not None else None)
    return Evaluated(result, result.save(slot, overwrite=True, policy=policy, lang=lang))


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


def report_output(out: Path | None, baseline, candidate, **inputs) -> tuple[Path, OutputPolicy]:
    """Where ``quantkit eval`` writes and the policy that guards it (outputs.py). Without ``--out``
    the report goes to ``CANDIDATE/eval``, the report slot of a checkpoint ``quantkit convert``
    wrote; into any other folder the user gave, quantkit writes nothing."""

    slot = Path(candidate) / "eval"
    ours = written_by(Path(candidate)) == "convert"
    if out is None:
        if not Path(candidate).is_dir():
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


@dataclass(frozen=True)
class EvalRequest:
    """Where ``quantkit eval`` reads and writes (each field is the flag of its name)."""

    baseline: str | Path | None
    candidate: str | Path
    out: Path | None = None          # None: CANDIDATE/eval, for a checkpoint quantkit convert wrote
    recipe: str | None = None        # its eval: section sets the suite, the thresholds and max_len
    overwrite: bool = False
    lang: str = "en"


def evaluate_to_folder(request: EvalRequest, options: PathsOptions) -> Evaluated:
    """``quantkit eval`` whole: where the report goes, checked before anything is read
    (``report_output``), the evaluation with the recipe's eval: section, the report written."""
    r = request
    out, policy = report_output(r.out, r.baseline, r.candidate, calib=options.calibration_log,
                                calib_sample=options.calibration_sample, recipe=r.recipe, suite=options.suite)
    policy.check(out, r.overwrite)   # a report that may not or cannot be written fails now
    result = evaluate_paths(r.baseline, r.candidate, dataclasses.replace(options, eval_section=recipe_eval_section(r.recipe)))
    return Evaluated(result, result.save(out, r.overwrite, policy, r.lang))

