"""Llama 4: experts held transposed and called with routed copies of every token.

transformers' ``Llama4TextExperts`` holds ``gate_up_proj`` ``[experts, hidden, 2 x inter]`` (the
gate half, then the up half, along the last dimension) and ``down_proj`` ``[experts, inter,
hidden]``, without biases, and combines them as ``act(gate) * up``. Its block does not hand the
experts a top-k: it repeats every token once per expert, scales expert e's copy by the token's
router score (zero where the token is not routed to e) and sums the experts' outputs. The trace
finds everything else: the layers, the shared expert, the router (an ``nn.Linear`` whose output
reaches a top-k, kept in the model's dtype) and, in the multimodal wrapper, the language model.
"""

from quantkit.arch.families.registry import register_family
from quantkit.arch.spec import ExpertLayout, MoESpec

register_family(
    "Llama4ForCausalLM", "Llama4ForConditionalGeneration",
    moe=MoESpec(block="feed_forward", checkpoint_block="feed_forward", experts="experts", router="router",
                layout=ExpertLayout(transposed=True), call="routed_copies"),
)
