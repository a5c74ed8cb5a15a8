"""QuantLinear: a Linear that computes from a checkpoint's packed tensors.

Its buffers are named and laid out exactly as in the compressed-tensors checkpoint
(``weight_packed``, ``weight_scale``, ``weight_zero_point``, ``weight_g_idx``, ``weight_shape``,
``weight``, ``input_scale``), so ``load_state_dict`` fills it straight from the shards. The
matrix product is delegated to a backend from ``quantkit.kernels`` ("torch" reference on
any device, "triton" on CUDA), chosen per module and visible as ``.backend``.
"""

from __future__ import annotations

import torch
from torch import nn

from quantkit.formats.packing import packed_cols
from quantkit.config.scheme import QuantScheme, fp4_kind
from quantkit.kernels import get_backend, record_fallback
from quantkit.kernels.dequant_linear import reference_only


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, scheme: QuantScheme,
                 dtype: torch.dtype = torch.float32, device=None, backend: str | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scheme = scheme
        self.format = scheme.format
        w, a = scheme.weights, scheme.input_activations
        self.num_bits = w.num_bits
        self.fallback: str | None = None    # why this module runs a slower backend than asked for
        self.symmetric = w.symmetric
        self.group_size = w.group_size if w.strategy == "group" else None
        self.weight_strategy = w.strategy
        self.input_dynamic = bool(a is not None and a.dynamic)
        self.input_strategy = a.strategy if a is not None else None
        self.dtype = dtype
        kw = {"device": device}
        if w.strategy == "group":
            scale_shape = (out_features, in_features // w.group_size)
        elif w.strategy == "channel":
            scale_shape = (out_features, 1)
        elif w.strategy == "block":
            scale_shape = (out_features // w.block_structure[0], in_features // w.block_structure[1])
        else:
            scale_shape = (1,)
        if fp4_kind(w) is not None:
            self._fp4_buffers(w, a, kw)
        else:
            self._buffers_for(w, a, scale_shape, dtype, kw)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, **kw), requires_grad=False)
        else:
            self.bias = None
        self.backend = backend or "torch"
        self._kernel = None
        self._cache: dict = {}

    def _fp4_buffers(self, w, a, kw) -> None:
        """The FP4 formats' tensors (formats/fp4_packed.py): packed nibbles, FP8 or E8M0 group scales,
        NVFP4's global scales."""
        out_f, in_f = self.out_features, self.in_features
        kind = fp4_kind(w)
        self.group_size = w.group_size
        scale_dtype = torch.float8_e4m3fn if kind == "nvfp4" else torch.uint8
        self.register_buffer("weight_packed", torch.empty((out_f, in_f // 2), dtype=torch.uint8, **kw))
        self.register_buffer("weight_scale", torch.empty((out_f, in_f // w.group_size), dtype=scale_dtype, **kw))
        self.register_buffer("weight_global_scale", torch.empty((1,), dtype=torch.float32, **kw)
                             if kind == "nvfp4" else None)
        self.register_buffer("input_global_scale", torch.empty((1,), dtype=torch.float32, **kw)
                             if a is not None and a.calibrated else None)
        self.weight_zero_point = self.weight_g_idx = self.input_scale = None

    def _buffers_for(self, w, a, scale_shape, dtype, kw) -> None:
        """The integer and FP8 formats' tensors."""
        in_features, out_features = self.in_features, self.out_features
        # MX scales are E8M0 exponents, one byte each
        self.register_buffer("weight_scale", torch.empty(scale_shape, dtype=torch.uint8 if w.is_mx else dtype, **kw))
        if self.format == "pack-quantized":
            self.register_buffer("weight_packed", torch.empty((out_features, packed_cols(in_features, w.num_bits)), dtype=torch.int32, **kw))
            self.register_buffer("weight_shape", torch.tensor([out_features, in_features], dtype=torch.int64, device=kw["device"]))
            if not w.symmetric:
                zp_shape = (packed_cols(out_features, w.num_bits), scale_shape[-1])
                self.register_buffer("weight_zero_point", torch.empty(zp_shape, dtype=torch.int32, **kw))
            else:
                self.weight_zero_point = None
        else:
            wdtype = torch.float8_e4m3fn if w.type == "float" else torch.int8
            self.register_buffer("weight", torch.empty((out_features, in_features), dtype=wdtype, **kw))
            self.weight_zero_point = None
        if w.actorder == "group":
            self.register_buffer("weight_g_idx", torch.empty((in_features,), dtype=torch.int32, **kw))
        else:
            self.weight_g_idx = None
        if a is not None and not a.dynamic:
            self.register_buffer("input_scale", torch.empty((1,), dtype=dtype, **kw))
        else:
            self.input_scale = None

    def set_backend(self, name: str) -> None:
        self.fallback = None
        if name == "triton" and reference_only(self):
            self.fallback = record_fallback(
                f"kernel backend: no Triton kernel computes {self.format} {self.num_bits}-bit "
                f"{self.weight_strategy} weights with {self.input_strategy or 'no'} activation "
                "quantization; those modules run the torch reference")
            name = "torch"
        self._kernel = get_backend(self.format, name)
        self.backend = name
        self._cache.clear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernel is None:
            self.set_backend(self.backend)
        return self._kernel(x, self)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}, "
                f"bits={self.num_bits}, group_size={self.group_size}, backend={self.backend}")
