"""The dtype each checkpoint is served in comes from the host the engine runs on: the capability
fake (a stand-in engine Python that reports another host's /proc/cpuinfo) drives both branches, an
AMX host and one without, through the same code the real engine takes."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from quantkit.serving.capabilities import Capabilities, serving_dtype
from quantkit.serving.client import EngineError
from quantkit.serving.contract import ServeOptions
from quantkit.serving.vllm import find_engine, server_command

XEON_AMX = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            "flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n\n"
            "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
EPYC = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
        "flags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni avx512_bf16\n")
FORMATS = {"w8a8": "int-quantized", "w4a16": "pack-quantized", "fp8": "float-quantized", "float": None}


def test_cpuinfo_reads_the_first_processor_and_both_amx_tiles():
    xeon, epyc = Capabilities.from_cpuinfo(XEON_AMX), Capabilities.from_cpuinfo(EPYC)
    assert (xeon.device, xeon.amx, xeon.avx512_bf16) == ("Intel(R) Xeon(R) Platinum 8480+", True, True)
    assert (epyc.amx, epyc.avx512_bf16, epyc.cuda, epyc.fp8) == (False, True, False, False)
    assert "AMX yes" in xeon.describe() and "AMX no" in epyc.describe()
    # one tile without the other is not the AMX int8 path vLLM dispatches on
    assert not Capabilities.from_cpuinfo("flags : amx_bf16 amx_tile").amx


@pytest.mark.parametrize("caps, expected", [
    (Capabilities.from_cpuinfo(XEON_AMX), {"w8a8": "bfloat16", "w4a16": "bfloat16", "fp8": "float32", "float": "float32"}),
    (Capabilities.from_cpuinfo(EPYC), {"w8a8": "float32", "w4a16": "bfloat16", "fp8": "float32", "float": "float32"}),
    (Capabilities("cuda", "NVIDIA H100", compute_capability=(9, 0)), dict.fromkeys(FORMATS, "auto")),
])
def test_the_dtype_per_format_follows_the_host(caps, expected):
    got = {name: serving_dtype(caps, fmt) for name, fmt in FORMATS.items()}
    assert {name: c.dtype for name, c in got.items()} == expected
    assert all(c.reason for c in got.values())
    assert serving_dtype(caps, "int-quantized", "float16").dtype == "float16"


def test_fp8_tensor_cores_from_compute_capability_8_9():
    assert Capabilities("cuda", "H100", compute_capability=(9, 0)).fp8
    assert Capabilities("cuda", "L40S", compute_capability=(8, 9)).fp8
    assert not Capabilities("cuda", "A100", compute_capability=(8, 0)).fp8


def _fake_engine(tmp_path: Path, cpuinfo: str) -> Path:
    """An engine Python that answers quantkit's probe as vLLM 0.32 on the host ``cpuinfo`` describes."""
    script = tmp_path / "python"
    answer = json.dumps({"vllm": "0.32.0", "torch": "2.13.0+cpu", "capabilities": {"platform": "cpu", "cpuinfo": cpuinfo}})
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import sys
        assert sys.argv[1] == "-c" and "capabilities" in sys.argv[2]
        print({answer!r})
    """))
    script.chmod(0o755)
    return script


def _checkpoint(tmp_path: Path, name: str, fmt: str | None) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    cfg = {"max_position_embeddings": 2048} | ({"quantization_config": {"format": fmt}} if fmt else {})
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("host, w8a8_dtype", [(XEON_AMX, "bfloat16"), (EPYC, "float32")])
def test_the_engine_reports_its_host_and_the_server_command_follows_it(tmp_path, host, w8a8_dtype):
    engine = find_engine(_fake_engine(tmp_path, host))
    assert engine.capabilities == Capabilities.from_cpuinfo(host) and engine.version == "0.32.0"
    w8a8 = _checkpoint(tmp_path, "w8a8", "int-quantized")
    cmd = server_command(engine, w8a8, 8000, ServeOptions(max_model_len=1024))
    assert cmd[cmd.index("--dtype") + 1] == w8a8_dtype and "--enforce-eager" in cmd
    # a dtype the user names wins on any host
    cmd = server_command(engine, w8a8, 8000, ServeOptions(max_model_len=1024, dtype="float16"))
    assert cmd[cmd.index("--dtype") + 1] == "float16"


def test_an_engine_python_that_is_not_vllms_is_one_line(tmp_path):
    with pytest.raises(EngineError, match=r"--engine-python: .*/bin/true: not vLLM's Python"):
        find_engine("/bin/true")
