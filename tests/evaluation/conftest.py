import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import _take, tiny_model, tiny_tokenizer  # noqa: E402

from quantkit.evaluation.slices import load_suite  # noqa: E402


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


@pytest.fixture(scope="session")
def small_suite():
    """A few items of each shipped slice: fast, but every kind of measure present."""
    return [_take(s, 4) for s in load_suite("numbers-en,numbers-zh,code-en,names-zh,knowledge-en,long-en")]
