"""The planner: never over budget, optimal on small cases, plans round-trip, rules for comparison."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import group_for
from quantkit.recipe import load_recipe
from quantkit.config.scheme import QuantArgs
from quantkit.sensitivity import FormatUnit, Sensitivity
from quantkit.sensitivity.plan_groups import planned_recipe
from quantkit.sensitivity.planner import Plan, edge_layers, evaluate_choice, plan, uniform

CANDS = {"W4": QuantArgs(num_bits=4, group_size=32), "W8": QuantArgs(num_bits=8, strategy="channel"), "KEEP": None}


def sensitivity(rows: list[dict[str, tuple[int, float]]], layers: list[int] | None = None) -> Sensitivity:
    """Units ``u0, u1, ...``: per candidate (bytes, damage); a candidate absent does not fit."""
    units = [FormatUnit(f"model.layers.{(layers or range(len(rows)))[i]}.u{i}", (f"model.layers.{i}.u{i}",),
                        ((8, 32),), (layers or list(range(len(rows))))[i]) for i in range(len(rows))]
    nbytes = {u.name: {c: b for c, (b, _) in r.items()} for u, r in zip(units, rows)}
    scores = {"diag": {u.name: {c: d for c, (_, d) in r.items() if CANDS[c] is not None} for u, r in zip(units, rows)}}
    return Sensitivity({"dtype": "float32"}, CANDS, units, nbytes, scores, "diag")


def brute_force(sens: Sensitivity, cap: int) -> float:
    names = [u.name for u in sens.units]
    best = float("inf")
    for combo in itertools.product(*[list(sens.nbytes[n]) for n in names]):
        if sum(sens.nbytes[n][c] for n, c in zip(names, combo)) <= cap:
            best = min(best, sum(sens.damage(n, c) for n, c in zip(names, combo)))
    return best


rows_strategy = st.lists(
    st.fixed_dictionaries({"W4": st.tuples(st.integers(10, 200), st.floats(0.0, 1.0))},
                          optional={"W8": st.tuples(st.integers(201, 500), st.floats(0.0, 0.1)),
                                    "KEEP": st.tuples(st.integers(501, 2000), st.just(0.0))}),
    min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(rows=rows_strategy, frac=st.floats(0.0, 1.2))
def test_never_over_budget_and_optimal(rows, frac):
    sens = sensitivity(rows)
    low = sum(min(b for b, _ in r.values()) for r in rows)
    high = sum(max(b for b, _ in r.values()) for r in rows)
    cap = int(low + frac * (high - low))
    p = plan(sens, budget_bytes=cap)
    assert p.nbytes <= cap
    assert p.nbytes == sum(sens.nbytes[u][c] for u, c in p.choice.items())
    # byte steps are exact at these sizes (spare < RESOLUTION): the table's optimum is the optimum
    assert p.predicted_kl == pytest.approx(brute_force(sens, cap), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries({"W4": st.tuples(st.integers(10**6, 2 * 10**6), st.floats(0, 1)),
                                            "W8": st.tuples(st.integers(3 * 10**6, 4 * 10**6), st.floats(0, 0.1))}),
                     min_size=1, max_size=40),
       bits=st.floats(0.5, 20.0))
def test_bits_budget_never_exceeded_with_coarse_steps(rows, bits):
    """Many large units: steps of many bytes, each option's extra rounded up, still within budget."""
    sens = sensitivity(rows)
    try:
        p = plan(sens, budget_bits=bits)
    except QuantkitError as e:
        assert "below the smallest plan" in str(e)
        assert sum(r["W4"][0] for r in rows) * 8 > bits * sens.params()
        return
    assert p.bits_per_weight <= bits and p.nbytes * 8 <= bits * sens.params()


def test_plan_json_round_trips(tmp_path):
    sens = sensitivity([{"W4": (10, 0.3), "W8": (20, 0.01)}, {"W4": (10, 0.1), "W8": (20, 0.05), "KEEP": (40, 0.0)}])
    p = plan(sens, budget_bytes=30)
    assert p.choice == {sens.units[0].name: "W8", sens.units[1].name: "W4"} and p.predicted_kl == pytest.approx(0.11)
    back = Plan.load(p.save(tmp_path / "plan.json"))
    assert back == p and back.to_dict() == json.loads((tmp_path / "plan.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**p.to_dict(), "kind": "x"}))
    with pytest.raises(QuantkitError, match="bad.json: not a quantkit plan"):
        Plan.load(bad)


def test_a_budget_below_every_plan_is_one_line():
    sens = sensitivity([{"W4": (10, 0.3)}])   # 80 bits over 8 x 32 weights: 0.3125 bits per weight
    with pytest.raises(QuantkitError) as e:
        plan(sens, budget_bits=0.3)
    assert "budget: 0.3 bits per weight is below the smallest plan of these candidates (0.3125 bits" in str(e.value)
    assert plan(sens, budget_bits=0.3125).nbytes == 10
    with pytest.raises(QuantkitError, match="candidate 'W3' is not in the sensitivity data"):
        plan(sens, budget_bits=40.0, candidates=["W3"])


def test_fixed_rules():
    rows = [{"W4": (100, 0.1), "W8": (200, 0.001)} for _ in range(6)]
    sens = sensitivity(rows)
    u = uniform(sens, "W4")
    assert u.nbytes == 600 and u.rule == "uniform W4"
    edge = edge_layers(sens, "W4", "W8", budget_bytes=900)
    assert edge.nbytes == 900
    assert [edge.choice[x.name] for x in sens.units] == ["W8", "W8", "W4", "W4", "W4", "W8"]   # 0, 5, then 1
    assert edge.rule.endswith("(3 layers)")


def test_planned_recipe_gives_every_unit_its_format_and_keeps_ignore(tiny_llama):
    from transformers import AutoConfig

    from quantkit.sensitivity import candidate, plan_units

    recipe = load_recipe("w4a16-g64-gptq")
    units, dtype = plan_units(AutoConfig.from_pretrained(tiny_llama), recipe)
    cands = {c: candidate(c).weights for c in ("W4_G32", "W8_CHANNEL", "KEEP")}
    nbytes = {u.name: {c: u.nbytes(a, dtype) for c, a in cands.items()} for u in units}
    sens = Sensitivity({}, cands, units, nbytes, {"diag": {u.name: {"W4_G32": 1.0, "W8_CHANNEL": 0.1} for u in units}},
                       "diag")
    choice = {u.name: "W4_G32" for u in units}
    choice[units[0].name], choice[units[3].name], choice[units[6].name] = "W8_CHANNEL", "KEEP", "W8_CHANNEL"
    r = planned_recipe(recipe, sens, evaluate_choice(sens, choice))
    assert set(r.groups) == {"w4_g32", "w8_channel"} and r.groups["w4_g32"].targets == ("Linear",)
    assert r.steps == recipe.steps and "lm_head" in r.ignore
    assert r.ignore[-1] == "model.layers.0.mlp.down_proj"
    for u in units:
        for m in u.members:
            got = group_for(m, "Linear", r.groups, list(r.ignore))
            want = {"W4_G32": "w4_g32", "W8_CHANNEL": "w8_channel", "KEEP": None}[choice[u.name]]
            assert got == want, m


def test_frontier_measured_never_above_the_rule_and_renders():
    from quantkit.sensitivity.sensitivity_report import frontier, frontier_png

    rows = [{"W4": (100, 0.1 * (i % 3 + 1) ** 2), "W8": (200, 0.001)} for i in range(9)]
    front = frontier(sensitivity(rows), low="W4", high="W8", steps=6)
    assert [p["bits"] for p in front["uniform"]] == [100 * 8 / 256, 200 * 8 / 256]
    for m, e in zip(front["measured"], front["first/last layers"]):
        assert m["bits"] <= e["bits"] and m["predicted_kl"] <= e["predicted_kl"] + 1e-12
    assert front["measured"][3]["predicted_kl"] < front["first/last layers"][3]["predicted_kl"]
    png = frontier_png({"frontier": front, "plan": {"bits_per_weight": 5.0, "predicted_kl": 0.5}, "measured_kl": 0.6})
    import base64
    assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
