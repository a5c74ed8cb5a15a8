"""The quantized KV cache: checkpoint scales calibrated in ``quantkit convert``, and the KV
formats ``quantkit.load`` / ``quantkit eval --kv`` evaluate, one concept per file:

- ``kv_scheme.py``  the recipe's ``kv_cache:`` (FP8, ``tensor`` / ``attn_head``) and the
                    ``k_scale`` / ``v_scale`` layout compressed-tensors and vLLM read;
- ``observer.py``   post-rope K and V observed where the cache stores them (convert);
- ``long_rows.py``  the calibration source's longest rows, added for the KV observer;
- ``numerics.py``   what each cache holds: static FP8, per-token-head FP8 / INT8 (vLLM's
                    dynamic formats), KIVI's min-max groups (pure functions);
- ``kivi.py``       INT8 with K per channel and V per token, K's residual kept in full precision;
- ``options.py``    the table of evaluated options (``kv_option("int8-kivi:k")``), bytes per token;
- ``attention.py``  the attention function transformers calls (``quantkit_kv|sdpa`` / ``eager``);
- ``apply_option.py`` ``prepare_kv`` / ``apply_kv_option`` / ``weights_only`` on a loaded model.

Example:
    >>> opt = kv_option("fp8-head")
    >>> opt.format.static, opt.parts
    (True, ('k', 'v'))
"""

from quantkit.kv_cache.apply_option import PreparedKV, apply_kv_option, attention_modules, observe_absmax, prepare_kv, weights_only
from quantkit.kv_cache.attention import PLAN_ATTR, attention_name, kv_attention, use_kv_attention
from quantkit.kv_cache.numerics import fake_quantize_fp8, per_token_head
from quantkit.kv_cache.observer import MSE_GRID, MSE_MIN_RATIO, MSE_TOKENS, KVObserver, mse_range
from quantkit.kv_cache.options import FORMATS, KVFormat, KVOption, kv_option, kv_options
from quantkit.kv_cache.kv_scheme import KV_SCALE_NAMES, KVCacheScheme, KVStrategy, register_scales, scale_of, scale_shape

__all__ = [
    "FORMATS", "KV_SCALE_NAMES", "MSE_GRID", "MSE_MIN_RATIO", "MSE_TOKENS", "PLAN_ATTR", "KVCacheScheme",
    "KVFormat", "KVObserver", "KVOption", "KVStrategy", "PreparedKV", "apply_kv_option", "attention_modules",
    "attention_name", "fake_quantize_fp8", "kv_attention", "kv_option", "kv_options", "mse_range", "observe_absmax",
    "per_token_head", "prepare_kv", "register_scales", "scale_of", "scale_shape", "use_kv_attention",
    "weights_only",
]
