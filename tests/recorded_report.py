"""The README's main job's evaluation as report.json holds it, built in a second instead of the
main job's minutes: SmolLM2's measured slices under 4-bit weights (evaluation/smollm2_measured.json,
benchmarks/eval.py on the embedded model), judged by the default thresholds with the Chinese slices
not gated (the base card says en), and the rest shaped as the main job writes it: a clean GPTQ
checkpoint's integrity pass (every part at the record's own allowance, -1 dB), a footprint priced
for an assumed GPU, length buckets, worst examples with Chinese text, and the warnings and
long-context notes the evaluation's own code words (context.py, kernels/). The renderers read only this
dict (``report.markdown``, ``report.render_html``, ``model_card.render``)."""
from __future__ import annotations

import json
from pathlib import Path

from quantkit.evaluation.context import Reach
from quantkit.evaluation.report import SCHEMA_VERSION
from quantkit.evaluation.verdict import Thresholds, decide
from quantkit.kernels import backend_for_format, collecting_fallbacks
from quantkit.serving.memory_account import plan
from quantkit.workflows.model_card import CardFacts, render

MEASURED = json.loads((Path(__file__).parent / "evaluation" / "smollm2_measured.json").read_text())
SMOLLM2 = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               vocab_size=49152, intermediate_size=1536, max_position_embeddings=8192, head_dim=64)
KINDS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
         "mlp.up_proj", "mlp.down_proj")
NOT_GATED = "not gated (model card languages: en)"
NO_KERNEL_FORMAT = "format-without-kernels"   # a format no backend has a kernel for: the fallback warning


def _integrity() -> dict:
    modules = {f"model.layers.{i}.{k}": {"sqnr_db": 19.5 + 0.01 * i, "expected_sqnr_db": 19.5 + 0.01 * i,
                                         "recon_excess_db": -1.0, "recon_unit_excess_db": -1.0, "gain": 1.0,
                                         "tensor_rel_error": 0.106}
               for i in range(30) for k in KINDS}
    return {"modules": modules, "tensors": {}, "fallback": {}, "transformed": [], "notes": [], "seconds": 21.4,
            "flagged": []}


def _buckets(kl: float) -> list[dict]:
    edges = [(0, 64), (64, 128), (128, 256), (256, 512), (512, 1024), (1024, 2048)]
    return [{"start": a, "end": b, "tokens": 40 * (b - a), "kl_mean": kl * (1 + i / 10)} for i, (a, b) in enumerate(edges)]


def _examples() -> dict:
    return {"numbers-en": [{"id": "numbers-en-7", "kl_mean": 0.912, "worst_token_kl": 6.25, "position": 88,
                            "context": "The company reported revenue of 4,250 million", "token": " yuan"}],
            "numbers-zh": [{"id": "numbers-zh-3", "kl_mean": 0.734, "worst_token_kl": 5.5, "position": 57,
                            "context": "四年多来，他", "token": "说"},
                           {"id": "pd-extract-10", "f1_base": 1.0, "f1_cand": 0.0,
                            "prompt": "请列出下面句子中的所有数字，用逗号分隔。\n\n陈峰玖今年５６岁，１９６８年他为救人被火车轧断了双腿。",
                            "baseline": "陈峰玖今年５６岁，１９６８年他为救人被", "candidate": "陈峰玖今年１６８年他为救人被火车"}],
            "code-en": [{"id": "generation", "agreement": 0.0,
                         "prompt": "```python\ndef _siftdown(heap, startpos, pos):\n    newitem = heap[pos]",
                         "baseline": " right\n    newitem = heap[pos - 1]", "candidate": " end of the list"}]}


def _reach() -> tuple[list[str], list[str]]:
    """The long slices' warnings and notes as context.py writes them for the main job on a CPU
    with little memory free: windows of 4096 of the 8192 positions, texts shorter than that."""
    reach = Reach(8192, "the model's max_position_embeddings", 4096, 9.6, 3.1)
    warnings = reach.record("long-en", [3100, 5200], 4095) + reach.record("long-zh", [2900], 2899)
    return [reach.notes()[0], *warnings, fallback_sentence()], reach.notes()


def fallback_sentence() -> str:
    """kernels/'s warning for a format a backend has no kernel for, as it words it."""
    with collecting_fallbacks() as reasons:
        backend_for_format(NO_KERNEL_FORMAT, "triton", explicit=False)
    return reasons[0]


def main_job_data(lang: str = "en") -> dict:
    """report.json's dict of the main job (``meta.lang``: ``lang``)."""
    slices = {name: dict(values) for name, values in MEASURED["candidates"]["w4a16-g64"].items()}
    verdict = decide(slices, not_gated={n: NOT_GATED for n in slices if n.endswith("-zh")}).to_dict()
    footprint = plan(dict(SMOLLM2), "80GiB", 8192, weights="int4", kv="fp16").to_dict()
    footprint |= {"candidate_bytes_on_disk": 105_000_000, "gpu_mem_assumed": True}
    warnings, notes = _reach()
    return {
        "schema_version": SCHEMA_VERSION, "decision": verdict["decision"], "verdict": verdict,
        "meta": {"baseline": "SmolLM2-135M-Instruct", "candidate": "out/smollm2-w4a16-gptq", "max_len": 8192,
                 "max_len_source": "the model's max_position_embeddings", "seconds_total": 402.7,
                 "languages": {"gating": ["en"], "source": "model card"}, "lang": lang,
                 "long_context_notes": notes},
        "engine": None, "slices": slices, "public": {n: True for n in slices},
        "languages": {n: n.rsplit("-", 1)[1] for n in slices}, "lm_eval": None,
        "kl_by_position": {"long-en": _buckets(0.35), "long-zh": _buckets(0.5)}, "kl_by_position_variants": {},
        "worst_examples": _examples(), "footprint": footprint,
        "module_errors": {f"model.layers.{i}.{k}": 19.5 for i in range(30) for k in KINDS},
        "integrity": _integrity(), "mixed": None, "thresholds": Thresholds().to_dict(), "warnings": warnings,
    }


def main_job_card(data: dict, lang: str) -> str:
    """The main job's model card with ``data``'s verdict, in ``lang``."""
    facts = CardFacts(base_model="SmolLM2-135M-Instruct", recipe="w4a16-g64-gptq",
                      groups=[{"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                                  "strategy": "group", "group_size": 64},
                               "input_activations": None, "format": "pack-quantized"}],
                      ignore=["lm_head"], kv_cache=None, shard_bytes=105_000_000, shards=1,
                      calibration={"num_samples": 128, "num_tokens": 35846,
                                   "source": {"name": "embedded", "format": "jsonl", "sha256": "0" * 64}},
                      base_front={"license": "apache-2.0", "language": ["en"]}, verdict=data["verdict"], lang=lang)
    return render(facts)
