"""Bulk paths of the planner on large models: the CP-SAT hint written in one go, and the
baselines' plans simulated without a per-event Python walk where they only compute and free."""
from __future__ import annotations

from planner import baselines
from planner.cpsat import PlannerOptions, RematModel
from tests.helpers import random_layered

ONE = PlannerOptions(time_limit=10, workers=1, seed=0)


def _hint_one_by_one(m: RematModel, values: dict[int, int]) -> tuple[list[int], list[int]]:
    """The hint as AddHint per variable gives it (fixed variables left out)."""
    m.m.ClearHints()
    proto = m.m.Proto()
    for idx in sorted(values):
        dom = proto.variables[idx].domain
        if len(dom) == 2 and dom[0] == dom[1]:
            continue
        m.m.AddHint(m.m.GetIntVarFromProtoIndex(idx), values[idx])
    hint = proto.solution_hint
    return list(hint.vars), list(hint.values)


def test_apply_hint_gives_the_per_variable_hint_in_one_bulk_write(benchmarks_dir, monkeypatch):
    p = random_layered(benchmarks_dir, 100)
    budget = int(0.7 * p.unplanned_peak)
    start = baselines.greedy(p, budget)
    m = RematModel(p, budget, ONE, [start.plan])
    m.set_objective_time()
    values = m.hint_from_plan(start.plan)
    assert values is not None
    want = _hint_one_by_one(m, values)
    assert len(want[0]) > 100  # and some fixed variables were left out
    assert len(want[0]) < len(values)
    calls = []
    monkeypatch.setattr(m.m, "AddHint", lambda *a: calls.append(a))
    monkeypatch.setattr(m.m, "add_hint", lambda *a: calls.append(a))
    m.apply_hint({i: v for i, v in reversed(values.items())})  # the order given does not matter
    hint = m.m.Proto().solution_hint
    assert (list(hint.vars), list(hint.values)) == want
    assert calls == []  # no per-variable AddHint
    m.apply_hint(values)  # applied again: replaces the hint, as before
    assert (list(hint.vars), list(hint.values)) == want
