"""The engine flags are checked before anything starts, and the deployment length against both
models' configs."""
from __future__ import annotations

import json

import pytest

from quantkit.errors import QuantkitError
from quantkit.serving.deployment import deployment_length
from quantkit.serving.engine_options import ENDPOINT_TOP_K, ENGINE_TOP_K, EngineOptions


def test_top_k_defaults_to_what_each_kind_of_server_returns():
    assert EngineOptions(engine="vllm").k == ENGINE_TOP_K == 50
    assert EngineOptions(endpoint="http://a", baseline_endpoint="http://b").k == ENDPOINT_TOP_K == 20
    assert EngineOptions(engine="vllm", top_k=7).k == 7
    assert not EngineOptions().wanted and EngineOptions(endpoint="http://a").wanted


@pytest.mark.parametrize("opts, message", [
    (EngineOptions(engine="sglang"), "--engine: 'sglang'"),
    (EngineOptions(engine="vllm", endpoint="http://a"), "--engine: give either"),
    (EngineOptions(baseline_endpoint="http://b"), "--endpoint: needed"),
    (EngineOptions(endpoint="http://a", baseline_endpoint="http://b", python="/x"), "--engine-python: only with"),
    (EngineOptions(engine="vllm", top_k=101), "--top-k: expected 1-100, got 101"),
    (EngineOptions(engine="vllm", path_tokens=-1), "--path-tokens: expected 0 or more"),
])
def test_a_combination_that_cannot_run_names_its_flag(opts, message):
    with pytest.raises(QuantkitError, match=message):
        opts.check()


def _model(path, limit):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": limit}))
    return path


def test_the_deployment_length_is_the_baselines_and_a_cap_below_it_is_refused(tmp_path):
    base, cand = _model(tmp_path / "base", 8192), _model(tmp_path / "cand", 1024)
    assert deployment_length(base, base, None, None) == (8192, "the baseline's max_position_embeddings")
    assert deployment_length(base, cand, 1024, "--max-len") == (1024, "--max-len")
    with pytest.raises(QuantkitError, match=r"--max-len: 2048 exceeds the candidate's max_position_embeddings \(1024"):
        deployment_length(base, cand, 2048, "--max-len")
    with pytest.raises(QuantkitError, match="exceeds the baseline's"):
        deployment_length(cand, base, 2048, None)
