"""Property: whatever recipe and calibration log a user writes, ``quantkit convert`` either
converts or exits with code 2 and one ``error:`` line; never a traceback, never a leftover.

Recipes are drawn from the keys a recipe may hold, each with values right and wrong (types,
ranges, combinations that cannot be stored); calibration logs mix good rows with malformed
ones. The model is a tiny random Llama, so a conversion takes a fraction of a second.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from model_factory import make_llama_dir, save_byte_tokenizer


def some(values) -> st.SearchStrategy:
    return st.sampled_from(values)


WEIGHTS = st.fixed_dictionaries({}, optional={
    "num_bits": some([2, 3, 4, 8, 9, 0, 4.0, True, "4"]),
    "type": some(["int", "float", "fp4"]),
    "symmetric": some([True, False, "no"]),
    "strategy": some(["tensor", "channel", "group", "token", "block"]),
    "group_size": some([16, 32, 48, 64, 0, -8, True, 32.0]),
    "dynamic": some([False, True, "local"]),
    "actorder": some([None, "group", "weight", "static"]),
    "observer": some(["minmax", "mse", "max"]),
})
ACTIVATIONS = st.fixed_dictionaries({}, optional={
    "num_bits": some([8, 4]), "type": some(["int", "float"]), "symmetric": st.booleans(),
    "strategy": some(["tensor", "token", "channel"]), "dynamic": st.booleans(),
})
SCHEME = st.one_of(
    some(["W4A16", "w8a16", "W8A8", "FP8", "FP8_DYNAMIC", "W4A16_ASYM", "W3A16", 8]),
    st.fixed_dictionaries({"weights": WEIGHTS}, optional={
        "input_activations": ACTIVATIONS, "targets": some([["Linear"], ["re:.*_proj$"], ["re:("], "Linear"]),
    }),
)
STEP = some(["rtn", "gptq", "smoothquant", "awq", "nope", {"gptq": {"block_size": 32}}, {"gptq": {"block_size": 0}},
             {"gptq": {"actorder": True}}, {"rtn": {"x": 1}}, {"smoothquant": {"alpha": 1.5}}, {"awq": {"grid": 2}},
             ["gptq"], 7])
RECIPE = st.fixed_dictionaries({}, optional={
    "version": some([1, 2, "1"]),
    "scheme": SCHEME,
    "group_size": some([16, 32, 48, 0, True]),
    "config_groups": st.dictionaries(some(["g", "h"]), SCHEME, max_size=2),
    "ignore": st.lists(some(["lm_head", "re:.*down_proj", "re:[", "model.layers.0.mlp.up_proj", "nothing", 3]),
                       max_size=3),
    "steps": st.lists(STEP, max_size=3),
    "algorithm": some(["rtn", "gptq", {"name": "gptq", "block_size": 16}, {"block_size": 16}]),
    "calibration": st.fixed_dictionaries({}, optional={
        "num_samples": some([0, 1, 4, 64]), "max_seq_len": some([4, 8, 32, 4096]), "seed": some([0, 3, "x"]),
        "batch_tokens": some([None, 0, 64]), "offload": st.booleans(),
    }),
    "output": st.fixed_dictionaries({}, optional={"max_shard_size": some([1024, 100, "2GB", "lots", 1 << 20])}),
    "colour": some(["blue"]),
})
# Recipes a careful user writes: every value in range, every combination storable.
GROUPED = st.fixed_dictionaries({"num_bits": some([4, 8]), "group_size": some([16, 32, 64])},
                                optional={"symmetric": st.booleans(), "observer": some(["minmax", "mse"]),
                                          "actorder": some(["group", "weight"])})
CHANNEL = st.fixed_dictionaries({"num_bits": some([4, 8]), "strategy": some(["channel", "tensor"])},
                                optional={"symmetric": st.booleans()})
SOUND = st.fixed_dictionaries({
    "scheme": st.one_of(some(["W8A16", "W8A8", "FP8", "FP8_DYNAMIC", "W4A16_ASYM"]),
                        st.fixed_dictionaries({"weights": st.one_of(GROUPED, CHANNEL)})),
    "steps": some([["rtn"], ["gptq"], [{"gptq": {"block_size": 16}}], ["awq", "rtn"], ["awq", "gptq"],
                   ["smoothquant", "rtn"], [{"smoothquant": {"alphas": [0.3, 0.6]}}, "gptq"]]),
}, optional={
    "ignore": st.lists(some(["lm_head", "re:.*down_proj", "model.layers.0.mlp.up_proj"]), max_size=2),
    "calibration": st.fixed_dictionaries({"num_samples": some([1, 4]), "max_seq_len": some([8, 32])}),
})
RECIPE_TEXT = st.one_of(
    SOUND.map(lambda r: yaml.safe_dump(r, sort_keys=False)),
    RECIPE.map(lambda r: yaml.safe_dump(r, sort_keys=False)),
    some(["", "- scheme: W4A16\n", "scheme: [W4A16\n", "just words\n", "\x00\xff", "scheme: W8A16\n"]),
)

TEXT = st.characters(exclude_categories=("Cs",))  # a lone surrogate cannot be written as UTF-8
GOOD_ROW = st.one_of(
    st.text(TEXT, min_size=1, max_size=80).map(lambda t: {"text": t}),
    st.tuples(st.text(TEXT, max_size=40), st.text(TEXT, max_size=40)).map(lambda p: {"prompt": p[0], "response": p[1]}),
    st.builds(lambda i: {"text": f"Order {i} ships on day {i % 7}.", "task_type": "logistics"}, st.integers(0, 999)),
)
BAD_LINE = some(["{not json", "[1, 2]", "null", "42", '{"text": 5}', '{"other": "x"}', '{"messages": "hi"}', ""])
LINE = st.one_of(GOOD_ROW.map(lambda r: json.dumps(r, ensure_ascii=False)), BAD_LINE)
CALIB = st.one_of(st.lists(GOOD_ROW.map(lambda r: json.dumps(r, ensure_ascii=False)), min_size=1, max_size=30),
                  st.lists(LINE, max_size=30))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    m = make_llama_dir(tmp_path_factory.mktemp("prop") / "model", vocab=260)
    return save_byte_tokenizer(m)


# Always with --calib: without it a recipe that needs data samples the embedded default log
# (seconds per example); a recipe that needs none then warns that --calib goes unused.
@settings(max_examples=60, deadline=None, database=None, phases=[Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(recipe=RECIPE_TEXT, lines=CALIB)
def test_convert_either_succeeds_or_fails_in_one_line(model, recipe, lines):
    from quantkit.cli import app

    work = Path(tempfile.mkdtemp(prefix="qk-prop-"))
    try:
        (work / "recipe.yaml").write_text(recipe, encoding="utf-8", errors="surrogateescape")
        (work / "calib.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        out = work / "out"
        args = ["convert", str(model), "--recipe", str(work / "recipe.yaml"), "--calib", str(work / "calib.jsonl"),
                "--out", str(out), "--no-eval"]
        r = CliRunner().invoke(app, args)
        assert "Traceback" not in r.output
        event("converted" if r.exit_code == 0 else "refused")  # pytest --hypothesis-show-statistics
        if r.exit_code == 0:
            assert (out / "config.json").exists() and (out / "quantization_log.json").exists()
            assert list(out.glob("*.safetensors")), sorted(p.name for p in out.iterdir())
        else:
            assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (r.exception, r.output)
            shown = [line for line in r.stderr.splitlines() if line.strip()]
            assert shown[-1].startswith("error:") and sum(s.startswith("error:") for s in shown) == 1, r.stderr
            assert not out.exists()
        assert sorted(p.name for p in work.iterdir()) == sorted(["recipe.yaml", "calib.jsonl"]
                                                                 + (["out"] if r.exit_code == 0 else []))
    finally:
        shutil.rmtree(work, ignore_errors=True)
