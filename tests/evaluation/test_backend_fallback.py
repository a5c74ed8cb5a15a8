"""A kernel backend that cannot load or has no kernel for a format: a warning, the reason kept
with the model that runs the slower one, and a line among that model's evaluation report's
warnings (not another's); a backend asked for by name still fails, saying why."""
import json
import logging
import sys

import pytest
from tiny import FAST, TINY_THRESHOLDS, _take

import quantkit
import quantkit.kernels as kernels
from quantkit.errors import QuantkitError
from quantkit.evaluation import evaluate, load_suite


@pytest.fixture
def broken_triton(monkeypatch):
    """The registry as in a process whose triton modules fail to import. The real registry is
    loaded first: the torch reference registers on its module's first import, so a registry
    emptied before that import would stay without it for the tests that run after this one."""
    kernels._ensure_loaded()
    for name in ("fp8_gemm", "int4_gemm", "int8_gemm"):
        monkeypatch.setitem(sys.modules, f"quantkit.kernels.{name}", None)
        monkeypatch.delattr(kernels, name, raising=False)
    monkeypatch.setattr(kernels, "BACKENDS", {})
    monkeypatch.setattr(kernels, "_loaded", False)
    monkeypatch.setattr(kernels, "_triton_error", None)
    monkeypatch.setattr(kernels, "_warned", set())
    monkeypatch.delenv("QUANTKIT_BACKEND", raising=False)


def test_cuda_default_falls_back_with_a_warning(broken_triton, caplog):
    with caplog.at_level(logging.INFO, logger="quantkit"), kernels.collecting_fallbacks() as seen:
        assert kernels.select_backend("cpu") == "torch"
        assert seen == []   # the CPU's default is the torch reference anyway
        assert kernels.select_backend("cuda", record=False) == "torch"   # inspect's question
        assert seen == []
        assert kernels.select_backend("cuda") == "torch"
        assert kernels.select_backend("cuda") == "torch"
    [reason] = seen
    assert "triton could not load" in reason and "quantkit.kernels" in reason and "torch reference" in reason
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [reason]   # once per reason


def test_requested_triton_fails_saying_why(broken_triton, monkeypatch):
    monkeypatch.setenv("QUANTKIT_BACKEND", "triton")
    assert kernels.select_backend("cuda") == "triton"
    with pytest.raises(QuantkitError, match=r"'triton' is not available .*could not load: .*quantkit\.kernels"):
        kernels.get_backend("pack-quantized", "triton")


@pytest.fixture(scope="module")
def mxfp8_dir(base, tmp_path_factory):
    """The tiny model as an MXFP8 checkpoint: a format no Triton kernel computes."""
    root = tmp_path_factory.mktemp("fallback")
    base.save_pretrained(root / "src")
    return quantkit.quantize(root / "src", "mxfp8").save(root / "mxfp8")


def test_fallback_is_in_its_models_report_only(base, tok, mxfp8_dir, tmp_path):
    """The reason is the model's: its evaluation lists it, a later evaluation of other models in
    the same process does not (a process-wide list once handed it to every report after)."""
    cand = quantkit.load(mxfp8_dir)
    cand.model.layers[0].mlp.down_proj.set_backend("triton")   # as a CUDA default would ask
    [reason] = quantkit.runtime.loader.model_fallbacks(cand)
    assert "no Triton kernel computes" in reason and "torch reference" in reason
    suite = [_take(s, 2) for s in load_suite("numbers-en")]
    kw = dict(suite=suite, max_len=256, thresholds=TINY_THRESHOLDS, options=FAST, progress=False)
    first = json.loads((evaluate(base, cand, tok, **kw).save(tmp_path / "a") / "report.json").read_text())
    assert reason in first["warnings"]
    fresh = quantkit.load(mxfp8_dir)   # torch on the CPU, as asked: nothing slower than its default
    assert quantkit.runtime.loader.model_fallbacks(fresh) == []
    later = json.loads((evaluate(base, fresh, tok, **kw).save(tmp_path / "b") / "report.json").read_text())
    assert not [w for w in later["warnings"] if w.startswith("kernel backend")]


def test_device_fallback_is_kept_with_the_loaded_model(mxfp8_dir, monkeypatch):
    """The device's fallback (CUDA without triton) reaches ``quantkit_info`` of the model loaded then."""
    kernels._ensure_loaded()
    monkeypatch.setattr(kernels, "BACKENDS", {k: f for k, f in kernels.BACKENDS.items() if k[1] != "triton"})
    monkeypatch.setattr(kernels, "_triton_error", "planted")
    monkeypatch.delenv("QUANTKIT_BACKEND", raising=False)
    real = kernels.select_backend
    monkeypatch.setattr(quantkit.runtime.loader, "select_backend", lambda device, backend: real("cuda", backend))
    model = quantkit.load(mxfp8_dir)   # on the CPU, chosen as on CUDA: the torch reference, with the reason
    [reason] = model.quantkit_info["fallbacks"]
    assert "triton could not load" in reason
    assert quantkit.runtime.loader.model_fallbacks(model) == [reason]
