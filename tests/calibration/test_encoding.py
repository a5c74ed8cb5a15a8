import numpy as np
import pytest

from quantkit.calibration.encoding import (Affixes, count_tokens, encode_ids, special_affixes,
                                           tokenizer_fingerprint, truncate, with_affixes)


@pytest.fixture(scope="module")
def bos_tokenizer():
    """A Llama-style tokenizer that adds <s> by default (SmolLM2's adds nothing)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = "a b c hello world the cat sat".split()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_bos_rules(bos_tokenizer, tokenizer):
    aff = special_affixes(bos_tokenizer)
    assert aff.prefix == (1,) and aff.suffix == () and aff.prefix_text == "<s>"
    assert with_affixes(encode_ids(bos_tokenizer, ["hello world"])[0], aff) == [1, 6, 7]
    # A template that already wrote the BOS does not get a second one.
    assert with_affixes(encode_ids(bos_tokenizer, ["<s> hello world"])[0], aff) == [1, 6, 7]
    assert count_tokens(bos_tokenizer, ["hello world", "<s> hello world"], 10, aff).tolist() == [3, 3]
    assert special_affixes(tokenizer) == Affixes((), ())


def test_truncate_keeps_an_eos_suffix():
    aff = Affixes((1,), (2,))
    assert truncate([1, 5, 6, 7, 2], 3, aff) == [1, 5, 2]
    assert truncate([1, 5, 2], 3, aff) == [1, 5, 2]
    assert truncate([1, 5, 6, 7], 2, Affixes((1,), ())) == [1, 5]


def test_prefix_counting_is_exact_up_to_max_len(tokenizer, real_units):
    texts = [" ".join(real_units["en"][i:i + n]) for i, n in ((0, 2), (10, 40), (60, 200))] + \
            ["".join(real_units["zh"][:300]), "\n\n".join(real_units["code"][:20])]
    exact = np.array([len(ids) for ids in encode_ids(tokenizer, texts)])
    for max_len in (64, 512, 4096):
        got = count_tokens(tokenizer, texts, max_len, Affixes((), ()))
        assert (np.minimum(got, max_len) == np.minimum(exact, max_len)).all()
        assert ((got > max_len) == (exact > max_len)).all()


def test_fingerprint_tells_tokenizers_apart(tokenizer, bos_tokenizer):
    a, b = tokenizer_fingerprint(tokenizer), tokenizer_fingerprint(bos_tokenizer)
    assert a["vocab_size"] == 49152 and a["sha256"] != b["sha256"]
    assert tokenizer_fingerprint(tokenizer) == a
