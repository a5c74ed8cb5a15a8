"""Acceptance 4 (KV cache): a KV-cache fault that only shows at long context gets NO-GO naming
the long-context slice, on its deepest position bucket, while the short slices pass.

The fault is a real checkpoint's: FP8 KV scales per head (``kv_cache: {strategy: attn_head}``)
calibrated on short rows (128 tokens) of a model whose keys carry massive values in their
lowest-frequency rotary pair (tiny.massive_key_model). Rotary embedding turns that pair further
the deeper the key sits, so past a thousand positions one of its channels exceeds what
calibration saw and clips at the scale's 448; short prompts never get there."""
import pytest
from tiny import FAST, TINY_THRESHOLDS, _take, massive_key_model

import quantkit
from quantkit.evaluation import evaluate, load_suite
from quantkit.evaluation.slices import SuiteOptions
from quantkit.evaluation.verdict import GO, NOGO

OPTS = SuiteOptions(**{**FAST.__dict__, "gen_prompts": 0})
MAX_LEN = 2560
RECIPE = {"config_groups": {"g": {"targets": ["re:.*mlp\\.down_proj$"], "weights": {"num_bits": 8}}},
          "kv_cache": {"strategy": "attn_head"}}


@pytest.fixture(scope="module")
def models(tok, tmp_path_factory):
    """The float model, its checkpoint calibrated on 8 rows of 128 tokens, and the same
    checkpoint calibrated on 2 rows of MAX_LEN tokens (Chinese text: not the long-en slice)."""
    root = tmp_path_factory.mktemp("kvfault")
    base = massive_key_model(len(tok))
    base.save_pretrained(root / "src")
    short = [tok(it["text"])["input_ids"][:128] for it in load_suite("numbers-en")[0].of_kind("text")[:8]]
    zh = tok(load_suite("long-zh")[0].items[0]["text"])["input_ids"]
    long_rows = [zh[:MAX_LEN], zh[MAX_LEN:2 * MAX_LEN]]
    short_ckpt = quantkit.quantize(str(root / "src"), RECIPE, calibration=short).save(root / "short")
    long_ckpt = quantkit.quantize(str(root / "src"), {**RECIPE, "calibration": {"max_seq_len": MAX_LEN}},
                                  calibration=long_rows).save(root / "long")
    return base, quantkit.load(short_ckpt).eval(), quantkit.load(long_ckpt).eval()


def run(base, cand, tok):
    suite = [_take(s, 3) for s in load_suite("numbers-en,code-en,names-zh,long-en")]
    return evaluate(base, cand, tok, suite=suite, max_len=MAX_LEN, thresholds=TINY_THRESHOLDS, options=OPTS,
                    progress=False)


def test_scales_calibrated_on_short_rows_clip_only_deep_in_the_context(models, tok):
    base, cand, _ = models
    r = run(base, cand, tok)
    assert r.decision == NOGO
    assert r.verdict.slices == {"numbers-en": GO, "code-en": GO, "names-zh": GO, "long-en": NOGO}
    nogo = {(x.slice, x.measure) for x in r.verdict.reasons if x.level == NOGO}
    assert nogo == {("long-en", "kl_last_bucket")}, [x.text() for x in r.verdict.reasons]
    # the slice's mean alone would pass: the deepest bucket is what catches it
    assert r.slices["long-en"]["kl_mean"] < 0.06 and r.slices["long-en"]["last_bucket_start"] == 2048
    buckets = [b["kl_mean"] for b in r.buckets["long-en"]]
    # the first buckets are as good as the short slices; the error grows past 1024 positions
    assert max(buckets[:4]) < 0.06 and buckets[-1] > 0.10 and buckets[-1] > 2.5 * max(buckets[:4])
    assert buckets[-1] > buckets[-2] > max(buckets[:4])


def test_the_same_scales_from_long_rows_pass(models, tok):
    """The control: the checkpoint is sound but for its calibration length; scales observed on
    rows as long as the deployment's see the turned pair and leave the long slice GO."""
    base, _, cand = models
    r = run(base, cand, tok)
    assert r.decision == GO, [x.text() for x in r.verdict.reasons]
    buckets = [b["kl_mean"] for b in r.buckets["long-en"]]
    assert buckets[-1] < 0.05 and buckets[-1] <= min(buckets[:4])
