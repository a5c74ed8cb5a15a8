"""The calibration set made ready for the layer loop: batches cut, every layer's inputs captured.

The embeddings (and whatever the base model runs before its layers) are onloaded for the
capture of layer 0's inputs and dropped after it. A resumed run recaptures the call arguments
(a cheap embedding pass) but takes the hidden states entering its first layer from the
boundary, and the batch size it used.
"""

from __future__ import annotations

from quantkit.common import distributed
from quantkit.errors import QuantkitError
from quantkit.pipeline import batches as _batches
from quantkit.pipeline.batches import CalibrationChunk, auto_batch_tokens, make_chunks, num_tokens_of
from quantkit.pipeline.capture import capture_inputs
from quantkit.pipeline.onload import dematerialize
from quantkit.pipeline.passes import CalibrationPasses
from quantkit.pipeline.state import Calibration, RunState
from quantkit.pipeline.store import ActivationStore, ArgumentStore


def prepare_calibration(state: RunState) -> Calibration:
    """Capture every layer's calibration inputs for ``state``'s run."""
    _onload_outer(state)
    batch_tokens = _batch_tokens(state)
    chunks = make_chunks(state.samples, min(batch_tokens, _batches.MICRO_BATCH_TOKENS),
                         packed=state.spec.packed_calibration)
    single_pass = sum(c.input_ids.numel() for c in chunks) <= batch_tokens
    _say_batches(state, chunks, single_pass)
    # data-parallel: every rank made the same batches (and took the same single_pass decision)
    # and runs its own share; on one rank that is all of them
    chunks = [chunks[j] for j in distributed.owned_batches(len(chunks), distributed.rank(), distributed.world_size())]
    if state.offload_dir is not None:
        state.offload_dir.mkdir(parents=True, exist_ok=True)
    device = state.options.device
    first, calls = [], ArgumentStore(state.offload_dir, device)
    for hidden_in, layer_calls in capture_inputs(state.model, state.spec.layers, chunks, device):
        first.append(hidden_in)
        calls.append(layer_calls)
    dematerialize(state.model)   # the embeddings only fed the capture: the layers never use them
    hidden = _hidden_states(state, first)
    float_hidden = _float_hidden_states(state, first)
    del first
    return Calibration(CalibrationPasses(chunks, hidden, calls, float_hidden), single_pass, batch_tokens)


def _onload_outer(state: RunState) -> None:
    """The embeddings and whatever else the base model runs before its layers; not the head."""
    layer_prefix, base = state.spec.layers + ".", state.spec.layers.rsplit(".", 1)[0] + "."
    outer = [n for n, _ in state.model.named_parameters() if n.startswith(base) and not n.startswith(layer_prefix)]
    state.model.load_state_dict({n: state.source.get(n) for n in outer if n in state.source}, strict=False,
                                assign=True)
    if getattr(state.config, "tie_word_embeddings", False):
        state.model.tie_weights()


def _batch_tokens(state: RunState) -> int:
    at = state.resumed
    if at is not None and at.batch_tokens is not None:
        batch_tokens = at.batch_tokens   # auto_batch_tokens reads the free memory: it can differ now
    else:
        batch_tokens = state.recipe.calibration.batch_tokens or auto_batch_tokens(
            state.config, state.options.device, float_inputs=state.quantizer.needs_float_inputs)
    # every rank must make the same batches and the same lockstep decision (free memory differs)
    return distributed.smallest(batch_tokens)


def _say_batches(state: RunState, chunks: list[CalibrationChunk], single_pass: bool) -> None:
    if state.options.log is None:
        return
    samples = state.samples
    rows = sum(c.input_ids.shape[0] for c in chunks)
    ranks = distributed.world_size()
    state.say(f"calibration: {len(samples)} samples, {num_tokens_of(samples)} tokens in {rows} rows, "
              f"{len(chunks)} batch{'es' if len(chunks) > 1 else ''} per layer"
              f"{', all in one pass' if single_pass else ''}{f', shared by {ranks} ranks' if ranks > 1 else ''}")


def _float_hidden_states(state: RunState, first: list) -> ActivationStore | None:
    """The float model's hidden states entering the first layer, when the quantizer asks for them:
    the captured ones (the layers before are the same), offloaded beside the quantized ones."""
    if not state.quantizer.needs_float_inputs:
        return None
    if state.start > 0:
        raise QuantkitError("algorithm.gptaq: a resumed run has no float-model activations to continue from; "
                            "start the conversion again without --resume")
    folder = None if state.offload_dir is None else state.offload_dir / "float"
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    return ActivationStore(first, folder, state.options.device)


def _hidden_states(state: RunState, first: list) -> ActivationStore:
    """The hidden states entering the run's first layer: the captured ones, or a resumed boundary's."""
    start, device = state.start, state.options.device
    if start == 0:
        hidden = ActivationStore(first, state.offload_dir, device)
    elif state.offload_dir is not None:
        hidden = ActivationStore.on_disk(state.offload_dir, len(first), start, device)
    else:
        hidden = ActivationStore(state.options.book.hidden_states(device), None, device, generation=start)
    if hidden.count != len(first):
        raise RuntimeError(f"resume: {hidden.count} saved calibration batches, {len(first)} now")
    return hidden
