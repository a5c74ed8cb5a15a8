"""GPTQ (Frantar et al., 2022, "GPTQ: Accurate Post-Training Quantization for GPTs").

For a linear with weight ``W`` ``[rows, cols]`` and calibration inputs ``x``, GPTQ minimises
the layer-output error ``||W x - Q x||^2`` column by column, against the Hessian of that
objective, ``H = 2/T * sum_t x_t x_t^T``. One concept per module:

- ``hessian``: accumulating ``H`` from calibration inputs (``accumulate_hessian``), and GPTAQ's
  ``dXXT`` from the float model's inputs of the same tokens (``accumulate_asymmetry``).
- ``gptaq``: GPTAQ's correction of the solve, aiming at the float model's output (``Asymmetry``).
- ``solve``: one weight against one Hessian: dead columns, act-order, the Cholesky factor of
  the damped inverse Hessian, and the result's health figures (``gptq_quantize_weight``).
- ``columns``: the column loop with per-block error propagation, and each column's grid.
- ``stack``: linears that read one input solved as one stacked weight, and their report figures.
- ``collect``: Hessians collected in one layer pass per sub-group (``collect_hessians``).
- ``lockstep``: all sub-groups in one pass, each linear solved in its pre-hook once every
  calibration batch has reached it.
- ``float_inputs``: the float model's inputs of a layer's linears, captured for GPTAQ.
- ``algorithm``: ``GPTQ``, the registered quantizer, which picks the schedule.

Example:
    >>> import torch
    >>> from quantkit.config.scheme import QuantArgs
    >>> x, W = torch.randn(16, 128), torch.randn(32, 128)     # 16 tokens into a 128 -> 32 linear
    >>> H, n = accumulate_hessian(x, None, 0)
    >>> res = gptq_quantize_weight(W, H, QuantArgs(num_bits=4, group_size=64))
    >>> res.q.shape, res.scale.shape            # codes [out, in], scales [out, in // 64]
    (torch.Size([32, 128]), torch.Size([32, 2]))
"""

from quantkit.quantizers.gptq.algorithm import GPTQ
from quantkit.quantizers.gptq.collect import HessianSet, collect_hessians
from quantkit.numerics.gram import fold_gram, gram
from quantkit.quantizers.gptq.gptaq import Asymmetry
from quantkit.quantizers.gptq.hessian import GPTQ_PRECISION, RunningHessian, accumulate_asymmetry, accumulate_hessian
from quantkit.quantizers.gptq.solve import GPTQResult, InverseHessian, SolveSettings, gptq_quantize_weight, inverse_hessian_factor

__all__ = ["Asymmetry", "GPTQ", "GPTQResult", "GPTQ_PRECISION", "HessianSet", "InverseHessian", "RunningHessian",
           "SolveSettings", "accumulate_asymmetry", "accumulate_hessian", "collect_hessians", "fold_gram", "gram", "gptq_quantize_weight",
           "inverse_hessian_factor"]
