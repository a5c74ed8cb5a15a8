"""A kernel backend that cannot load: a warning, a reason in ``backend_fallbacks()``, and a line
among the evaluation report's warnings; a backend asked for by name still fails, saying why."""
import json
import logging
import sys

import pytest
from tiny import FAST, TINY_THRESHOLDS, _take

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
    monkeypatch.setattr(kernels, "_fallbacks", [])
    monkeypatch.delenv("QUANTKIT_BACKEND", raising=False)


def test_cuda_default_falls_back_with_a_warning(broken_triton, caplog):
    with caplog.at_level(logging.INFO, logger="quantkit"):
        assert kernels.select_backend("cpu") == "torch"
        assert kernels.backend_fallbacks() == []   # the CPU's default is the torch reference anyway
        assert kernels.select_backend("cuda", record=False) == "torch"   # inspect's question
        assert kernels.backend_fallbacks() == []
        assert kernels.select_backend("cuda") == "torch"
        assert kernels.select_backend("cuda") == "torch"
    [reason] = kernels.backend_fallbacks()
    assert "triton could not load" in reason and "quantkit.kernels" in reason and "torch reference" in reason
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [reason]   # once per reason


def test_requested_triton_fails_saying_why(broken_triton, monkeypatch):
    monkeypatch.setenv("QUANTKIT_BACKEND", "triton")
    assert kernels.select_backend("cuda") == "triton"
    with pytest.raises(QuantkitError, match=r"'triton' is not available .*could not load: .*quantkit\.kernels"):
        kernels.get_backend("pack-quantized", "triton")


def test_fallback_is_in_the_report_warnings(broken_triton, base, tok, tmp_path):
    kernels.select_backend("cuda")   # as quantkit.load(..., device="cuda") does
    [reason] = kernels.backend_fallbacks()
    suite = [_take(s, 2) for s in load_suite("numbers-en")]
    r = evaluate(base, base, tok, suite=suite, max_len=256, thresholds=TINY_THRESHOLDS, options=FAST,
                 progress=False)
    data = json.loads((r.save(tmp_path / "eval") / "report.json").read_text())
    assert reason in data["warnings"]
