"""Public verbs: ``calibrate`` (log -> calibration set + manifest + report) and
``load_calibration`` (anything -> token ids for the pipeline)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from quantkit.calibration.allocate import allocate
from quantkit.calibration.config import SamplerConfig
from quantkit.calibration.encoding import (encode_ids, special_affixes, tokenizer_fingerprint,
                                           truncate, with_affixes)
from quantkit.calibration.io import Malformed, RawLog, file_sha256, read_log, row_byte_limit, row_char_limit
from quantkit.calibration.manifest import RAW_TEXT, build_manifest, coverage_warnings, narrow_warning
from quantkit.calibration.render import Row, RowError, chat_renderer, render_record
from quantkit.calibration.report import report_html, report_json, report_markdown
from quantkit.common.i18n import DEFAULT_LANG, check_lang
from quantkit.calibration.sampler import build_pool, draw
from quantkit.calibration.output_folder import (MANIFEST_FILE, SAMPLES_FILE, is_sampler_output, json_bytes,
                                        read_output, samples_bytes, sha256, write_output)
from quantkit.calibration.tokenizer import resolve_tokenizer
from quantkit.errors import QuantkitError
from quantkit.common.outputs import OutputPolicy, existing_path
from quantkit.inputs.model_folder import read_config_json

log = logging.getLogger(__name__)

DEFAULT_LOG = Path(__file__).resolve().parents[2] / "calibration" / "default.jsonl"


@dataclass
class CalibrationResult:
    manifest: dict[str, Any]
    samples: list[dict[str, Any]]
    files: dict[str, bytes]        # the output folder's files (samples and manifest only without ``out``)
    out: Path | None

    @property
    def input_ids(self) -> list[list[int]]:
        return [s["input_ids"] for s in self.samples]


def default_log_path() -> Path:
    """The embedded business-traffic log (calibration/default.jsonl, see PROVENANCE.md)."""
    if not DEFAULT_LOG.is_file():
        raise QuantkitError(f"{DEFAULT_LOG}: embedded default calibration log missing "
                            "(rebuild it with calibration/build_default.py)")
    return DEFAULT_LOG


def calibrate(source: str | Path | None, tokenizer: Any = None, config: SamplerConfig | None = None,
              out: str | Path | None = None, overwrite: bool = False, lang: str = DEFAULT_LANG,
              **overrides: Any) -> CalibrationResult:
    """Draw a stratified calibration set from a traffic log and describe it.

    ``source`` is a JSONL/CSV/Parquet/.txt log or a saved HF datasets folder (``None``: the
    embedded default); ``tokenizer`` an object, a model folder, or ``None`` for the default
    model's; ``overrides`` are ``SamplerConfig`` fields. With ``out`` the set, manifest and
    reports are written there (atomically); an existing ``out`` is replaced only with ``overwrite``
    and only when it is an earlier calibration output, never when it holds the log being read
    (``quantkit.common.outputs``). ``lang`` ("en" or "zh") is the language of report.md and
    report.html; report.json and the manifest are the same in both.

    Example:
        >>> res = calibrate("logs.jsonl", "models/my-model", num_samples=256, max_len=4096,
        ...                 out="calib/")                                      # doctest: +SKIP
        >>> res.manifest["counts"]["selected"]                                 # doctest: +SKIP
        256
    """
    check_lang(lang, "lang")
    cfg = config or SamplerConfig()
    if overrides:
        cfg = SamplerConfig.from_dict({**cfg.to_dict(), **overrides})
    path = Path(source) if source is not None else default_log_path()
    _check_model_length(cfg, tokenizer)
    policy = None
    if out is not None:   # before any work: an output that may not be written fails first
        policy = OutputPolicy("calibrate", {"traffic log": path, "tokenizer model": existing_path(tokenizer)})
        policy.check(Path(out), overwrite)
    raw = read_log(path, row_byte_limit(cfg.max_len))
    rows_read = len(raw.records) + raw.malformed.total  # lines that were not even records count too
    # rendering only adds malformed rows: a log already over the limit is refused before the
    # tokenizer (and transformers) loads
    _check_share(path, raw, rows_read, cfg)
    tok = resolve_tokenizer(tokenizer)
    rows = _render(raw, tok, cfg)
    _check_malformed(path, raw, rows_read, len(rows), cfg)
    affixes = special_affixes(tok)
    pool = build_pool(rows, tok, cfg, affixes)
    if not pool.rows:
        raise QuantkitError(f"{path}: no rows left to sample ({pool.dropped_long} longer than max_len "
                            f"{cfg.max_len} were dropped by long_policy 'drop')")
    selection = draw(pool, tok, cfg, affixes)
    samples = []
    for k, (i, ids) in enumerate(zip(selection.indices, selection.ids)):
        row = pool.rows[i]
        samples.append({"id": k, "source_line": row.line, "task": pool.tasks[i],
                        "task_from": pool.task_from[i], "bucket": pool.labels[pool.buckets[i]],
                        "language": pool.languages[i], "tokens": len(ids),
                        "truncated": bool(pool.truncated[i]), "text": row.text, "input_ids": ids})
    source_info = {"name": path.name, "format": raw.kind, "sha256": file_sha256(path),
                   "bytes": path.stat().st_size if path.is_file() else None}
    manifest = build_manifest(source=source_info, tokenizer_info=tokenizer_fingerprint(tok), cfg=cfg,
                              rows_read=rows_read, malformed=raw.malformed, pool=pool,
                              selection=selection, warnings=coverage_warnings(pool, selection, cfg))
    sample_data = samples_bytes(samples)
    manifest["samples_file"] = SAMPLES_FILE
    manifest["samples_sha256"] = sha256(sample_data)
    files = {SAMPLES_FILE: sample_data, MANIFEST_FILE: json_bytes(manifest)}
    written = None
    if out is not None:  # reports (with their plots) only for a folder a person will read
        files.update({"report.md": report_markdown(manifest, lang).encode("utf-8"),
                      "report.html": report_html(manifest, lang).encode("utf-8"),
                      "report.json": json_bytes(report_json(manifest))})
        written = write_output(out, files, policy, overwrite)
    return CalibrationResult(manifest=manifest, samples=samples, files=files, out=written)


def _check_model_length(cfg: SamplerConfig, tokenizer: Any) -> None:
    """``max_len`` within the model's ``max_position_embeddings``, when ``tokenizer`` is a model
    folder whose config.json says it: samples longer than the model reads calibrate nothing."""
    folder = existing_path(tokenizer)
    if folder is None or not (folder / "config.json").is_file():
        return
    limit = read_config_json(folder).get("max_position_embeddings")
    if isinstance(limit, int) and cfg.max_len > limit:
        raise QuantkitError(f"--max-len: {cfg.max_len} tokens is above the model's max_position_embeddings "
                            f"{limit} ({folder / 'config.json'})")


def _render(raw: RawLog, tokenizer: Any, cfg: SamplerConfig) -> list[Row]:
    render_chat = chat_renderer(tokenizer)
    limit = row_char_limit(cfg.max_len)
    rows = []
    for line, record in raw.records:
        try:
            row = render_record(line, record, cfg.fields, render_chat)
        except RowError as err:
            raw.malformed.add(err.reason, line)
            continue
        if len(row.text) > limit:   # what a max_len-token sample can hold, and no more, is tokenised
            row = dataclasses.replace(row, text=row.text[:limit])
        rows.append(row)
    return rows


def _check_malformed(path: Path, raw: RawLog, rows_read: int, valid: int, cfg: SamplerConfig) -> None:
    _check_share(path, raw, rows_read, cfg)
    if valid == 0:
        raise QuantkitError(f"{path}: no usable rows (fields: {cfg.fields})")


def _check_share(path: Path, raw: RawLog, rows_read: int, cfg: SamplerConfig) -> None:
    if rows_read == 0:
        raise QuantkitError(f"{path}: no rows")
    share = raw.malformed.total / rows_read
    if share > cfg.max_malformed_share:
        raise QuantkitError(f"{path}: {100 * share:.1f}% of {rows_read} rows malformed (limit "
                            f"{100 * cfg.max_malformed_share:g}%): {raw.malformed.summary()}")


def load_calibration(source: str | Path | None, tokenizer: Any, num_samples: int, max_seq_len: int,
                     seed: int = 0, warn: Callable[[str], None] | None = None,
                     policy: str = "traffic", record: dict | None = None) -> list[list[int]]:
    """Token ids for calibration, BOS rules applied, each at most ``max_seq_len`` long.

    ``source``: a sampler output folder (its saved samples are used: a stratified subset when
    fewer are asked for), a JSONL/CSV/Parquet/.txt log or HF datasets folder (sampled on the
    fly with ``policy``, see allocate.py), or ``None``/``"default"`` for the embedded default log.
    ``warn`` receives one line for each thing the caller should know (malformed rows skipped
    under the limit, fewer samples than asked, another tokenizer, a sample of few task types:
    ``narrow_warning``); default: this module's logger.
    ``record``, if given, receives the drawn set's ``source`` (name, sha256) and
    ``sample_content`` (its rows' content hashes, never text): what an evaluation of the
    converted model leaves out of its business slices.

    Example:
        >>> ids = load_calibration("calib/", tok, num_samples=128, max_seq_len=2048, seed=0)  # doctest: +SKIP
    """
    warn = warn or log.warning
    tok = resolve_tokenizer(tokenizer)
    if source is None or str(source) == "default":
        source = default_log_path()
    path = Path(source)
    if not is_sampler_output(path):
        cfg = SamplerConfig(num_samples=num_samples, max_len=max_seq_len, seed=seed, policy=policy)
        res = calibrate(path, tok, cfg)
        bad = res.manifest["malformed"]
        skipped = Malformed({r: d["count"] for r, d in bad.items()}, {r: d["first_lines"] for r, d in bad.items()})
        if skipped.total:
            warn(f"{path}: {skipped.total} of {res.manifest['counts']['rows_read']} rows malformed and skipped "
                 f"(under the {100 * cfg.max_malformed_share:g}% limit): {skipped.summary()}")
        if len(res.samples) < num_samples:
            warn(f"{path}: {len(res.samples)} samples drawn, {num_samples} asked (the log has no more distinct rows)")
        _warn_narrow(path, res.samples, warn)
        if record is not None:
            record.update(source=res.manifest["source"], sample_content=res.manifest["sample_content"])
        return res.input_ids
    manifest, samples = read_output(path)
    if record is not None and manifest.get("sample_content") is not None:
        # the saved set's hashes: a superset of the subset drawn below when fewer are asked for
        record.update(source=manifest["source"], sample_content=manifest["sample_content"])
    chosen = _stratified_subset(samples, num_samples, seed)
    if len(chosen) < num_samples:
        warn(f"{path}: holds {len(chosen)} samples, {num_samples} asked; using all")
    _warn_narrow(path, chosen, warn)
    affixes = special_affixes(tok)
    same_tok = manifest["tokenizer"]["sha256"] == tokenizer_fingerprint(tok)["sha256"]
    if not same_tok:
        warn(f"{path}: sampled with another tokenizer ({manifest['tokenizer']['name_or_path']}); "
             "re-tokenising its texts")
    saved_len = manifest["config"]["max_len"]
    out = []
    for s in chosen:
        reuse = same_tok and (not s["truncated"] or max_seq_len <= saved_len)
        ids = s["input_ids"] if reuse else \
            with_affixes(encode_ids(tok, [s["text"]])[0], affixes)
        out.append(truncate(list(ids), max_seq_len, affixes))
    return out


def _warn_narrow(path: Path, samples: list[dict[str, Any]], warn: Callable[[str], None]) -> None:
    """The coverage report's narrow-set warning, for the samples a conversion takes."""
    message = narrow_warning([s["task"] for s in samples],
                             [s["task"] == RAW_TEXT and s.get("task_from") == "inferred" for s in samples])
    if message:
        warn(f"{path}: {message}")


def _stratified_subset(samples: list[dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """Keep the saved set's cell mix when fewer samples are asked for (at least one per cell)."""
    if n >= len(samples):
        return samples
    cells: dict[tuple[str, str], list[int]] = {}
    for k, s in enumerate(samples):
        cells.setdefault((s["task"], s["bucket"]), []).append(k)
    quotas = allocate({c: len(ix) for c, ix in cells.items()}, n, "traffic", 1)
    rng = np.random.default_rng(seed)
    keep = []
    for c in sorted(cells):
        ix = cells[c]
        keep += [ix[j] for j in sorted(rng.permutation(len(ix))[:quotas[c]])]
    return [samples[k] for k in sorted(keep)]
