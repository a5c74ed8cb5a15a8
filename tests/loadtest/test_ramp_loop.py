"""The ramp loop's policy against a modelled server: it climbs, stops at the knee, the SLO, errors
or the time limit, keeps the steps it completed when a step fails, and sends a baseline and a
candidate the very same requests."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from quantkit.loadtest.lengths import LogNormal
from quantkit.loadtest.ramp import RampPolicy
from quantkit.loadtest.requests import LengthModel, RequestStream
from quantkit.loadtest.slo import parse_slo
from quantkit.serving.client import EngineError
from quantkit.workflows.loadtest import Ramp, run_ramp


def modelled_server(slots: int, tpot: float = 0.02, ttft: float = 0.1, fail_at: int | None = None,
                    errors_at: int | None = None):
    """A server with ``slots`` decoding slots, simulated: the client keeps ``c`` requests in
    flight; up to ``slots`` are served at once, each stream at ``tpot``; the others wait for a slot
    (their TTFT grows, TPOT stays)."""
    calls = []

    def run(requests, c, left):
        calls.append((c, requests))
        if fail_at is not None and c >= fail_at:
            raise EngineError("http://127.0.0.1:1: cannot connect (connection refused)")
        client, server = [0.0] * c, [0.0] * slots   # when each client / server slot is next free
        timings = []
        for i, r in enumerate(requests):
            k = min(range(c), key=client.__getitem__)
            j = min(range(slots), key=server.__getitem__)
            start = client[k]
            begin = max(start, server[j])
            end = begin + ttft + r.output_tokens * tpot
            client[k] = server[j] = end
            ok = not (errors_at is not None and c >= errors_at and i % 2 == 0)
            timings.append({"ok": ok, "output_tokens": r.output_tokens, "ttft": begin - start + ttft, "tpot": tpot,
                            "itl": tpot, "e2e": end - start, "start": start, "end": end})
        return timings, max(t["end"] for t in timings), "modelled"
    return run, calls


def _stream(seed: int = 0, spread: float = 0.6) -> RequestStream:
    rows = [list(range(100 + i, 140 + i)) for i in range(20)]
    return RequestStream(rows, LengthModel(LogNormal(math.log(60), 0.5), LogNormal(math.log(20), spread), 512), seed)


def test_the_ramp_stops_past_the_knee_and_recommends_seventy_percent():
    run, calls = modelled_server(slots=8)
    # even output lengths: the steps' throughput differs by the server alone
    ramp = run_ramp(Ramp("candidate"), run, _stream(spread=0.01), RampPolicy(), parse_slo("ttft=10s"))
    d = ramp.to_dict()
    assert [s["concurrency"] for s in d["steps"]] == [1, 2, 4, 8, 16]
    assert d["knee"] == 8 and d["recommended_concurrency"] == 5 and d["complete"]
    assert d["stopped"] == "passed the knee at concurrency 8"
    # each step: a warm-up wave of one request a slot, then the measured ones
    assert [len(r) for _, r in calls] == [1 + 16, 2 + 16, 4 + 16, 8 + 16, 16 + 32]
    assert [s["requests"] for s in d["steps"]] == [16, 16, 16, 16, 32]


def test_an_slo_broken_at_p99_for_two_steps_stops_the_ramp():
    run, _ = modelled_server(slots=256, tpot=0.08)
    ramp = run_ramp(Ramp("candidate"), run, _stream(), RampPolicy(), parse_slo("tpot=50ms"))
    assert len(ramp.steps) == 2 and ramp.stopped.startswith("the SLO broken at P99 for 2 steps (tpot)")
    assert all(s["goodput_rps"] == 0 for s in ramp.steps)


def test_errors_past_their_share_stop_the_ramp():
    run, _ = modelled_server(slots=256, errors_at=4)
    ramp = run_ramp(Ramp("candidate"), run, _stream(), RampPolicy(), parse_slo("ttft=10s"))
    assert ramp.steps[-1]["concurrency"] == 4 and ramp.stopped.startswith("errors: ")


def test_the_time_limit_ends_the_ramp_before_the_next_step():
    run, calls = modelled_server(slots=256)
    ramp = run_ramp(Ramp("candidate"), run, _stream(), RampPolicy(max_seconds=1e-9), parse_slo("ttft=10s"))
    assert calls == [] and ramp.steps == [] and ramp.stopped.startswith("--max-minutes spent")


def test_a_failing_step_keeps_the_completed_ones_and_the_ramp_is_incomplete():
    run, _ = modelled_server(slots=256, fail_at=4)
    ramp = Ramp("candidate")
    with pytest.raises(EngineError):
        run_ramp(ramp, run, _stream(), RampPolicy(), parse_slo("ttft=10s"))
    assert [s["concurrency"] for s in ramp.steps] == [1, 2] and not ramp.complete


def test_a_baseline_and_a_candidate_get_the_same_requests():
    a, b = _stream(seed=3), _stream(seed=3)
    first, second = a.take(40), b.take(40)
    assert first == second and a.too_long == b.too_long
    assert first != _stream(seed=4).take(40)
    assert all(len(r.prompt) == r.prompt_tokens and r.prompt_tokens + r.output_tokens <= 512 for r in first)


def test_the_report_of_a_ramp_cut_short_says_incomplete_and_keeps_its_steps(tmp_path):
    from types import SimpleNamespace

    from quantkit.common.outputs import OutputPolicy
    from quantkit.loadtest import loadtest_report as report
    from quantkit.workflows.loadtest import length_model, report_data

    run, _ = modelled_server(slots=4)
    ramps = [run_ramp(Ramp("baseline"), run, _stream(), RampPolicy(), parse_slo("ttft=10s")), Ramp("candidate")]
    fast, _ = modelled_server(slots=8, tpot=0.01, fail_at=4)
    with pytest.raises(EngineError):
        run_ramp(ramps[1], fast, _stream(), RampPolicy(), parse_slo("ttft=10s"))
    ramps[1].stopped = "the server failed: connection refused"
    traffic = SimpleNamespace(prompt_tokens=[50, 60, 80, 200, 900], output_tokens=[5, 9, 20, 40, 300])
    _, lengths = length_model(traffic, 512)
    data = report_data({"complete": False, "slo": parse_slo("ttft=10s").to_dict(), "lengths": lengths,
                        "max_model_len": 512, "ramps": ramps})
    assert data["knee"] is None and [s["concurrency"] for s in data["steps"]] == [1, 2]
    assert data["ramps"][0]["knee"] == 4 and data["ramps"][0]["recommended_concurrency"] == 2
    # a ramp without a knee is compared at its last step
    base_knee = next(s for s in data["ramps"][0]["steps"] if s["concurrency"] == 4)
    assert data["speedup"]["output_tokens_per_s_at_knee"] == pytest.approx(
        data["steps"][-1]["output_tokens_per_s"] / base_knee["output_tokens_per_s"])
    out = report.save(data, tmp_path / "lt", OutputPolicy("loadtest"))
    md = (out / "report.md").read_text()
    assert md.splitlines()[2].startswith("- INCOMPLETE") and "candidate: no knee found" in md
    assert "stopped: the server failed: connection refused (incomplete)" in md
    assert "<li class='bad'>INCOMPLETE" in (out / "report.html").read_text()


def test_prompts_cut_from_a_chinese_log_tokenize_back_to_their_drawn_length():
    from quantkit.inputs.embedded_model import default_tokenizer
    from quantkit.loadtest.requests import prompt_ids

    tokenizer = default_tokenizer()
    from quantkit.loadtest.traffic import read_traffic

    traffic = read_traffic(Path(__file__).resolve().parents[2] / "calibration" / "default.jsonl", tokenizer)
    rows = prompt_ids(traffic.prompts[:200], tokenizer)
    stream = RequestStream(rows, LengthModel(LogNormal(math.log(300), 1.0), LogNormal(math.log(20), 0.5), 2048),
                           seed=1, tokenizer=tokenizer)
    requests = stream.take(60)
    assert all(isinstance(r.prompt, str) for r in requests)
    assert [len(tokenizer(r.prompt)["input_ids"]) for r in requests] == [r.prompt_tokens for r in requests]
    # the log is half Chinese: cuts inside a character's bytes happen, and are moved, not sent
    assert stream.no_clean_cut < 10 and any("\u4e00" <= ch <= "\u9fff" for r in requests for ch in r.prompt)


def test_every_step_measures_the_same_lengths_with_new_prompts():
    run, calls = modelled_server(slots=8)
    run_ramp(Ramp("candidate"), run, _stream(), RampPolicy(), parse_slo("ttft=10s"))
    measured = [reqs[c:c + 16] for c, reqs in calls]
    shapes = [[(r.prompt_tokens, r.output_tokens) for r in m] for m in measured]
    assert len(shapes) == 5 and all(s == shapes[0] for s in shapes)
    assert len({tuple(map(tuple, (r.prompt for r in m))) for m in measured}) == len(measured)   # new windows
    # the warm-up wave is not among them
    assert [(r.prompt_tokens, r.output_tokens) for r in calls[-1][1][:calls[-1][0]]] != shapes[0][:calls[-1][0]]
