from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.calibration.allocate import allocate


def test_traffic_follows_counts_with_floors():
    got = allocate({"a": 900, "b": 90, "c": 10}, 100, min_per_cell=2)
    assert got == {"a": 89, "b": 9, "c": 2}


def test_balanced_is_equal_up_to_capacity():
    assert allocate({"a": 900, "b": 90, "c": 10}, 100, "balanced", 2) == {"a": 45, "b": 45, "c": 10}


def test_takes_everything_when_source_is_small():
    assert allocate({"a": 3, "b": 4}, 100, min_per_cell=2) == {"a": 3, "b": 4}


def test_too_few_samples_cover_largest_cells_first():
    assert allocate({"a": 5, "b": 50, "c": 20, "d": 1}, 2, min_per_cell=2) == {"a": 0, "b": 1, "c": 1, "d": 0}


def test_capacity_shifts_the_remainder():
    got = allocate({"a": 50, "b": 50}, 40, min_per_cell=1, capacity={"a": 5, "b": 50})
    assert got == {"a": 5, "b": 35}


counts = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=2), st.integers(1, 5000), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(counts, st.integers(1, 2000), st.sampled_from(["traffic", "sqrt", "balanced"]), st.integers(0, 4))
def test_allocation_invariants(source, n, policy, floor):
    got = allocate(source, n, policy, floor)
    assert sum(got.values()) == min(n, sum(source.values()))
    assert all(0 <= got[c] <= source[c] for c in source)
    if n >= floor * len(source):
        assert all(got[c] >= min(floor, source[c]) for c in source)
    if policy == "traffic" and n >= floor * len(source):
        # Cells above their floor are within one sample of the water-filled ideal: no cell
        # above its floor is more than 1 sample richer (per unit weight) than another.
        free = [c for c in source if got[c] > min(floor, source[c]) and got[c] < source[c]]
        if free:
            rates = [got[c] / source[c] for c in free]
            assert max(rates) - min(rates) <= max(1 / source[c] for c in free) + 1e-9
