from quantkit.calibration.dedup import NearDuplicateIndex, exact_key, minhash, occurrences


def test_exact_key_ignores_case_width_and_spacing():
    assert exact_key("Hello  World\n") == exact_key("hello world")
    assert exact_key("ＡＢＣ１２３") == exact_key("abc123")  # NFKC folds full-width forms
    assert exact_key("hello world") != exact_key("hello word")


def test_occurrences_keep_the_first_and_count_the_copies():
    kept, copies = occurrences(["a b", "c", "A  B", "c ", "d", "a b"])
    assert kept == [0, 1, 4] and copies == [3, 2, 1]


def test_near_duplicates_by_token_shingles(tokenizer, real_units):
    doc = " ".join(real_units["en"][:30])
    edited = doc.replace(real_units["en"][7], "A different sentence is put here instead.")
    other = " ".join(real_units["en"][30:60])
    ids = lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    index = NearDuplicateIndex(0.8)
    index.add(minhash(ids(doc)))
    assert index.is_near_duplicate(minhash(ids(edited)))
    assert not index.is_near_duplicate(minhash(ids(other)))


def test_minhash_estimates_jaccard():
    a = list(range(0, 1000))
    b = list(range(500, 1500))  # 5-gram sets overlap by ~1/3
    sim = (minhash(a) == minhash(b)).mean()
    assert 0.15 < sim < 0.5
    assert (minhash(a) == minhash(list(a))).all()
