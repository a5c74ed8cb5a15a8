"""``quantkit loadtest``: the flags parsed, ``loadtest_to_folder`` called (workflows/loadtest.py), the
report's summary printed, one progress bar per ramp."""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from quantkit.cli.console import fail
from quantkit.common.i18n import check_lang
from quantkit.errors import QuantkitError
from quantkit.loadtest.ramp import RampPolicy
from quantkit.loadtest.slo import parse_slo


def loadtest_command(
    model: Optional[str] = typer.Argument(None, help="The checkpoint (or model folder) to load-test (default: the embedded SmolLM2-135M-Instruct); its tokenizer renders the traffic."),
    traffic: Path = typer.Option(..., "--traffic", help="Your traffic log (as quantkit calibrate reads it): prompt and reply lengths are fitted to it, prompts are taken from it."),
    slo: str = typer.Option(..., "--slo", help="Latency objective goodput counts against, e.g. ttft=2s,tpot=50ms (ttft, tpot, itl, e2e)."),
    out: Path = typer.Option(..., "--out", "-o", help="Report folder (report.json, report.md, report.html)."),
    engine: Optional[str] = typer.Option(None, "--engine", help="Start the server here on 127.0.0.1: vllm, with the launch config of quantkit plan --emit vllm."),
    engine_python: Optional[Path] = typer.Option(None, "--engine-python", help="The Python of vLLM's own environment (default: $QUANTKIT_VLLM_PYTHON, else .venv-vllm/bin/python)."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Load a server you run instead (http://host:port, #NAME after it to name the model)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Also ramp this model (with --engine) with the same requests, first; the report states the speedup."),
    baseline_endpoint: Optional[str] = typer.Option(None, "--baseline-endpoint", help="The baseline on a server you run (with --endpoint)."),
    max_minutes: float = typer.Option(30.0, "--max-minutes", help="Time limit of each ramp; the step under way when it runs out is not counted."),
    max_concurrency: int = typer.Option(256, "--max-concurrency", help="The last concurrency step."),
    min_requests: int = typer.Option(16, "--min-requests", help="Requests a step's figures come from, at least (2 a slot at high concurrency), after a warm-up wave."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", help="Context the server serves (default: the model's max_position_embeddings)."),
    gpu_mem: str = typer.Option("80GiB", "--gpu-mem", help="GPU memory for the launch config's account (vLLM on a GPU)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the drawn requests (the same for the baseline and the candidate)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it holds an earlier quantkit loadtest report."),
    lang: str = typer.Option("en", "--lang", help="Language of report.md and report.html: en or zh (report.json is the same)."),
):
    """Ramp concurrency against the served checkpoint on your traffic's lengths until the capacity
    knee; report TTFT/TPOT/ITL percentiles, throughput, goodput under the SLO and the speedup."""
    from quantkit.loadtest import loadtest_report as report
    from quantkit.workflows.loadtest import LoadtestInterrupted, LoadtestOptions, loadtest_to_folder

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        check_lang(lang)
        opts = LoadtestOptions(model, traffic, parse_slo(slo), out, engine, engine_python, endpoint, baseline,
                               baseline_endpoint, RampPolicy(max_concurrency=max_concurrency, min_requests=min_requests,
                                                             max_seconds=max_minutes * 60),
                               max_model_len, gpu_mem, seed, overwrite)
        bar = StepBars(opts.policy)
        try:
            data, path = loadtest_to_folder(opts, lang, bar)
        finally:
            bar.close()
    except QuantkitError as e:
        fail(str(e))
    except LoadtestInterrupted as e:
        if e.written is not None:
            typer.echo(f"incomplete report (the steps that completed): {e.written / 'report.html'}", err=True)
        fail(str(e), 130 if isinstance(e.cause, KeyboardInterrupt) else 2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    typer.echo(f"load test: {path / 'report.html'}")
    for line in report.summary_lines(data, report.WORDS.bind(lang)):
        typer.echo(f"  {line}")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class StepBars:
    """A progress bar per ramp, one tick a step, the running step and the last step's figures
    beside it (the steps a ramp may take at most as its total: it usually stops before)."""

    def __init__(self, policy: RampPolicy) -> None:
        self.total, self.bar, self.role = len(list(policy.concurrencies())), None, None

    def __call__(self, ramp, concurrency: int, step: dict | None) -> None:
        from tqdm.auto import tqdm

        if ramp.role != self.role:
            self.close()
            self.role = ramp.role
            self.bar = tqdm(total=self.total, desc=f"load test: {ramp.role}", unit="step", file=sys.stderr)
        if step is None:
            self.bar.set_postfix_str(f"concurrency {concurrency} running")
            return
        self.bar.update(1)
        self.bar.set_postfix_str(f"concurrency {concurrency}: {step['output_tokens_per_s']:.3g} output tok/s, "
                                 f"goodput {step['goodput_rps']:.3g} req/s")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
