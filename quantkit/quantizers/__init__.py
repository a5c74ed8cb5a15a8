"""Quantizers: what turns a layer's weights into codes and scales. One file (or folder) per
algorithm, registered by ``@register_algorithm`` (``quantkit.steps``); listed here so that
importing the folder registers every one."""

from quantkit.quantizers import gptq, learned_rounding, rtn

__all__ = ["gptq", "learned_rounding", "rtn"]
