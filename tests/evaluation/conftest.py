import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import tiny_model, tiny_tokenizer  # noqa: E402

from quantkit.evaluation.slices import Slice, SuiteOptions, load_suite  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    # Tiny models gain nothing from two threads, and on a shared 2-core machine OpenMP's
    # spin-waiting made these tests 20x slower (1.6 s vs 35 s for the same evaluation).
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def base(tok):
    return tiny_model(len(tok))


def _take(sl: Slice, per_kind: int) -> Slice:
    seen: dict[str, int] = {}
    items = []
    for it in sl.items:
        if seen.get(it["kind"], 0) < per_kind:
            seen[it["kind"]] = seen.get(it["kind"], 0) + 1
            items.append(it)
    return Slice(sl.name, items, sl.public, sl.long_context, sl.source)


@pytest.fixture(scope="session")
def small_suite():
    """A few items of each shipped slice: fast, but every kind of measure present."""
    return [_take(s, 4) for s in load_suite("numbers-en,numbers-zh,code-en,names-zh,knowledge-en,long-en")]


# A random tiny model predicts near-uniformly, so its argmax flips on ties that a trained
# model does not have: top-1 and generation agreement get looser limits here; the KL
# limits stay the defaults.
TINY_THRESHOLDS = {"top1_agreement": {"review": 0.85, "nogo": 0.6},
                   "focus_top1_agreement": {"review": 0.85, "nogo": 0.6},
                   "gen_agreement": {"review": 0.2, "nogo": None}}

FAST = SuiteOptions(item_tokens=128, gen_prompts=2, gen_tokens=8, extract_tokens=8, code_tokens=16,
                    code_timeout_s=3.0, batch_tokens=1024)
