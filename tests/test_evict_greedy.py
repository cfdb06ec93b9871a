"""The eviction greedy's choice of victim (planner.greedy._pick_victim) against the walks it
replaced: one redoable / next_need / recompute-cost walk per candidate, their memos shared. Same
victim and same count of nodes walked at every eviction, so the same plan and the same work-clock
charges, on random DAGs (some nodes not recomputable) at several budgets and on RL100, with the
recompute cost's depth bound at its default and at 2 (where chains pass it)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner import clock, greedy
from planner.chain_greedy import next_need, redoable
from planner.problem import PlanningProblem
from tests.helpers import random_layered


def _walked_victim(candidates, t_now, resident, gone, reads, preds, recomputable, cost, size):
    """The victim, and the nodes the walks visited, as evict_greedy's make_room found them before
    _pick_victim (which counts each candidate once more, as the walk of redoable starts there)."""
    memo: dict[int, float] = {}
    needs: dict[int, int | None] = {}
    again: dict[int, bool] = {}

    def redo_cost(v: int, depth: int = 0) -> float:
        if v in memo:
            return memo[v]
        c = float(cost[v])
        if depth < greedy.REDO_DEPTH:
            c += sum(redo_cost(u, depth + 1) for u in preds[v] if not resident[u])
        memo[v] = c
        return c

    best, victim = None, -1
    for v in candidates:
        if not redoable(v, preds, resident, recomputable, again):
            continue
        nxt = next_need(v, reads, gone, t_now, needs)
        if nxt is None:
            key = (-1.0, v)
        else:
            key = (redo_cost(v) / (max(1, int(size[v])) * max(1, nxt - t_now + 1)), v)
        if best is None or key < best:
            best, victim = key, v
    return victim, len(memo) + len(needs) + len(again)


def _random_problem(seed: int) -> PlanningProblem:
    """A forward chain with skip edges and a backward half reading it in reverse (long recompute
    chains), random sizes and costs, a few nodes not recomputable."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(8, 40))
    preds: list[list[int]] = [[]]
    for i in range(1, m):
        preds.append(sorted({i - 1, *rng.integers(max(0, i - 5), i, size=int(rng.integers(0, 3))).tolist()}))
    for j in range(m):  # backward node j reads forward node m-1-j and the backward node before it
        preds.append([m - 1 - j] + ([m + j - 1] if j else []))
    n = len(preds)
    recomputable = (rng.random(n) > 0.1).tolist()
    return PlanningProblem.build(size=rng.integers(1, 50, size=n).tolist(), cost=rng.random(n).round(3).tolist(),
                                 preds=preds, scratch=rng.integers(0, 4, size=n).tolist(),
                                 recomputable=recomputable, pinned=[False] * (n - 1) + [True], name=f"rand{seed}")


def _run(p: PlanningProblem, budget: int):
    with clock.work_clock():
        plan = greedy.evict_greedy(p, budget)
        return (None if plan is None else plan.events), clock.now()


@pytest.mark.parametrize("depth", [greedy.REDO_DEPTH, 2])
def test_victims_and_charges_are_the_per_candidate_walks(monkeypatch, benchmarks_dir, depth):
    monkeypatch.setattr(greedy, "REDO_DEPTH", depth)
    bounded = []  # evictions where a chain passed the depth bound
    seen = []  # every eviction weighed
    pick, redo_cost = greedy._pick_victim, greedy._redo_cost

    def both(*args):
        got, want = pick(*args), _walked_victim(*args)
        assert got == want
        seen.append(got)
        return got

    def spy(*args):
        bounded.append(args[0])
        return redo_cost(*args)

    problems = [_random_problem(seed) for seed in range(40)] + [random_layered(benchmarks_dir, 100)]
    plans = 0
    for p in problems:
        for frac in (0.5, 0.6, 0.7, 0.8, 0.9):
            budget = max(p.memory_floor, p.budget_for(frac))
            with monkeypatch.context() as mp:
                mp.setattr(greedy, "_pick_victim", _walked_victim)
                want = _run(p, budget)
            with monkeypatch.context() as mp:
                mp.setattr(greedy, "_pick_victim", both)
                mp.setattr(greedy, "_redo_cost", spy)
                got = _run(p, budget)
            assert got == want, (p.name, frac)
            plans += got[0] is not None
    assert plans > 50 and len(seen) > 1000
    assert any(v >= 0 for v, _ in seen) and any(v < 0 for v, _ in seen)
    assert bool(bounded) == (depth == 2)  # the depth-bounded walk taken where, and only where, it counts


def test_same_plan_and_charge_on_the_lstm_fixture(monkeypatch):
    """The unrolled lstm fixture (batch 2, seq 8): long freed recurrences."""
    from cli import _graph_to_plan
    from passes.plan_model import lower_graph

    fixture = Path(__file__).parent / "fixtures" / "lstm.onnx"
    graph, _ = _graph_to_plan(str(fixture), {"batch": 2, "seq": 8}, forward=False)
    p, _ = lower_graph(graph)
    plans = 0
    for frac in (0.6, 0.7, 0.8, 0.9):
        budget = p.budget_for(frac)
        with monkeypatch.context() as mp:
            mp.setattr(greedy, "_pick_victim", _walked_victim)
            want = _run(p, budget)
        assert _run(p, budget) == want, frac
        plans += want[0] is not None
    assert plans >= 2
