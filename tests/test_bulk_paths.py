"""Bulk paths of the planner on large models: the CP-SAT hint written in one go, and the
baselines' plans simulated without a per-event Python walk where they only compute and free."""
from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from planner import baselines
from planner import simulate as sim_mod
from planner.cpsat import PlannerOptions, RematModel
from planner.plan import Event, Plan
from planner.problem import PlanningProblem
from planner.simulate import InvalidPlanError, Simulation
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


def _walked(monkeypatch, problem, plan, budget=None):
    """simulate() as the per-event walk gives it."""
    with monkeypatch.context() as mp:
        mp.setattr(sim_mod, "_computes_and_frees", lambda *a: None, raising=False)
        return sim_mod.simulate(problem, plan, budget)


def _same(a: Simulation, b: Simulation) -> None:
    for f in fields(Simulation):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert type(x) is type(y) and x == y, f.name


def _in_place_chain() -> PlanningProblem:
    """RL-like chain where every other node writes into its input's buffer (takes_over)."""
    n = 40
    preds = [[i - 1] if i else [] for i in range(n)] + [[n - 1]] + [[n - 1 - j, n + j] for j in range(n)]
    m = len(preds)
    over = [-1] * m
    for i in range(2, n, 2):
        over[i] = i - 1
    return PlanningProblem.build(size=[10 + (i + 1) // 2 % 7 for i in range(m)], cost=[1.0 + 0.1 * (i % 3) for i in range(m)],
                                 preds=preds, scratch=[i % 5 for i in range(m)], base_bytes=3, takes_over=over)


def test_baseline_plans_are_simulated_without_a_walk_of_their_events(benchmarks_dir, monkeypatch):
    """Chen's plan of the lstm fixture (batch=8, seq=128) has 650k events: walked one by one
    they took 2.5-4 s per problem, seconds past the --time-limit."""
    for p in (random_layered(benchmarks_dir, 100), _in_place_chain()):
        budget = int(0.7 * p.unplanned_peak)
        plans = [baselines.no_remat(p), baselines.chen_sqrt(p), baselines.greedy(p, budget).plan]
        want = [_walked(monkeypatch, p, plan) for plan in plans]
        _ = p.pred_lists, p.succ_lists  # cached before the walk is barred
        with monkeypatch.context() as mp:
            mp.setattr(PlanningProblem, "preds", lambda self, i: pytest.fail("walked the plan's events"))
            for plan, w in zip(plans, want):
                _same(sim_mod.simulate(p, plan), w)
                assert sim_mod.simulate(p, plan, w.peak_bytes).peak_bytes == w.peak_bytes
    p = _in_place_chain()
    plan = baselines.no_remat(p)
    assert any(e > 0 for e in np.asarray(p.takes_over))
    # a plan that breaks the model still gets the walk's message
    broken = Plan(tuple(e for e in plan.events if e != Event("free", 3)), "none")
    with pytest.raises(InvalidPlanError, match="never frees node 3"):
        sim_mod.simulate(p, broken)
    with pytest.raises(InvalidPlanError, match="over the budget of 5"):
        sim_mod.simulate(p, plan, 5)
    bad = Plan((Event("free", 0),) + plan.events, "none")
    with pytest.raises(InvalidPlanError, match="event 0: frees node 0"):
        sim_mod.simulate(p, bad)


@st.composite
def _problem_and_plan(draw):
    """A small DAG (scratch, pinned outputs, random ops, in-place writers) and a plan of computes and
    frees: a baseline's, then a few events dropped, repeated, moved or added."""
    n = draw(st.integers(2, 8))
    preds = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 3)))) if i else [] for i in range(n)]
    over = [draw(st.sampled_from([-1, *preds[i]])) if preds[i] else -1 for i in range(n)]
    try:
        p = PlanningProblem.build(
            size=draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)),
            cost=draw(st.lists(st.floats(0, 5, allow_nan=False).map(lambda c: round(c, 2)), min_size=n, max_size=n)),
            preds=preds, scratch=draw(st.lists(st.integers(0, 4), min_size=n, max_size=n)),
            pinned=[i == n - 1 or draw(st.booleans()) and not any(i in q for q in preds) for i in range(n)],
            recomputable=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
            base_bytes=draw(st.integers(0, 5)), takes_over=over)
    except Exception:  # noqa: BLE001 - a combination build() refuses (an in-place writer it does not allow)
        assume(False)
    base = draw(st.sampled_from([baselines.no_remat(p), baselines.chen_sqrt(p)]))
    events = list(base.events)
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, len(events)))
        how = draw(st.sampled_from(["drop", "repeat", "move", "add", "pair", "early"]))
        if how == "drop" and k < len(events):
            del events[k]
        elif how == "repeat" and k < len(events):
            events.insert(draw(st.integers(0, len(events))), events[k])
        elif how == "move" and k < len(events):
            events.insert(draw(st.integers(0, len(events) - 1)), events.pop(k))
        elif how == "add":
            events.insert(k, Event(draw(st.sampled_from(["compute", "free"])), draw(st.integers(0, n - 1))))
        elif how == "pair":  # a recompute (or a free and a compute again) of one node
            x = draw(st.integers(0, n - 1))
            pair = [Event("compute", x), Event("free", x)]
            events[k:k] = pair if draw(st.booleans()) else pair[::-1]
        elif how == "early":  # a free moved before the computes that still read it
            frees = [j for j, e in enumerate(events) if e.op == "free"]
            if frees:
                j = draw(st.sampled_from(frees))
                events.insert(draw(st.integers(0, j)), events.pop(j))
    budget = draw(st.one_of(st.none(), st.integers(0, 60)))
    return p, Plan(tuple(events), "none"), budget


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_problem_and_plan())
def test_the_array_path_agrees_with_the_walk_on_every_plan(case):
    """simulate()'s array path for plans of computes and frees gives the walk's Simulation where the
    walk accepts the plan, and hands every plan the walk refuses back to it (None)."""
    p, plan, budget = case
    fast = sim_mod._computes_and_frees(p, plan, budget)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim_mod, "_computes_and_frees", lambda *a: None)
        try:
            walked = sim_mod.simulate(p, plan, budget)
        except InvalidPlanError:
            assert fast is None
            return
    assert fast is not None  # a valid plan of computes and frees (costs are floats >= 0)
    _same(fast, walked)


@given(st.integers(1, 30), st.randoms(use_true_random=False))
@settings(max_examples=100, deadline=None, derandomize=True)
def test_pred_and_succ_lists_match_per_node_reference(n, rnd):
    """pred_lists / succ_lists, now sliced from Python lists, equal the per-node numpy reading
    they replaced (ints, ascending, one tuple per node)."""
    preds = [sorted(rnd.sample(range(i), rnd.randint(0, min(i, 4)))) for i in range(n)]
    p = PlanningProblem.build(size=[1] * n, cost=[1.0] * n, preds=preds)
    ref_preds = tuple(tuple(int(u) for u in p.preds(i)) for i in range(n))
    acc: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for u in p.preds(i):
            acc[int(u)].append(i)
    assert p.pred_lists == ref_preds and p.succ_lists == tuple(tuple(s) for s in acc)
    assert all(type(u) is int for ps in p.pred_lists + p.succ_lists for u in ps)


def _add_reads_one_call_at_a_time(self) -> None:
    """RematModel._add_reads before it bound the snake-case calls once (commit 0e8a69c), kept
    here as the reference the model it builds is compared against."""
    from planner.cpsat import ORIGINAL, SWAP_IN

    m, p = self.m, self.p
    self.reads = []
    used_by: dict[int, list] = {}
    over = self.takes_over
    for w in range(p.n):
        self._check_clock(w)
        for c in self.of_node[w]:
            cons = self.inst[c]
            if cons.kind == SWAP_IN:
                continue
            for v in p.pred_lists[w]:
                need = cons.start if over[w] == v else cons.start + cons.dur
                ids = self.of_node[v]
                if len(ids) == 1:
                    prov = self.inst[ids[0]]
                    ct = m.Add(prov.end >= need)
                    if cons.kind != ORIGINAL:
                        ct.OnlyEnforceIf(cons.present)
                    self.reads.append((c, v, ids[0], 1 if cons.kind == ORIGINAL else cons.present))
                    continue
                lits = []
                for j in ids:
                    prov = self.inst[j]
                    x = m.NewBoolVar(f"x{c}_{j}")
                    lits.append(x)
                    if prov.kind != ORIGINAL:
                        ready = prov.dur if (self.timed or prov.kind == SWAP_IN) else 0
                        m.AddImplication(x, prov.present)
                        m.Add(prov.start + ready <= cons.start).OnlyEnforceIf(x)
                        used_by.setdefault(j, []).append(x)
                    m.Add(prov.end >= need).OnlyEnforceIf(x)
                    if over[w] == v and prov.kind == ORIGINAL and v in self.swap_out:
                        m.Add(prov.end >= cons.start + cons.dur).OnlyEnforceIf([x, self.swap_out[v][0]])
                    self.reads.append((c, v, j, x))
                if cons.kind == ORIGINAL:
                    m.AddExactlyOne(lits)
                else:
                    m.Add(sum(lits) == cons.present)
    for j, inst in enumerate(self.inst):
        if inst.kind != ORIGINAL:
            lits = used_by.get(j, [])
            if lits:
                m.AddBoolOr(lits).OnlyEnforceIf(inst.present)
            else:
                m.Add(inst.present == 0)


@st.composite
def _read_problem(draw):
    """A random DAG, with swaps (ticks) or without (slots), and nodes taking over an input."""
    from tests.helpers import draw_dag

    preds, size, cost = draw_dag(draw, 9, 4)
    n = len(size)
    over = [-1] * n
    for i in range(1, n):
        same = [u for u in preds[i] if size[u] == size[i]]
        if same and draw(st.booleans()):
            over[i] = draw(st.sampled_from(same))
    # ticks need some cost: all-zero costs with swaps overflow the tick scale (a finding of its own)
    swap = sum(cost) > 0 and draw(st.booleans())
    return PlanningProblem.build(
        size=size, cost=cost, preds=preds, takes_over=over,
        recomputable=[draw(st.booleans()) or i == 0 for i in range(n)],
        transfer=[draw(st.integers(0, 5)) for _ in range(n)] if swap else None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_read_problem(), st.sampled_from([None, 0.7]))
def test_reads_build_the_same_model_as_one_call_at_a_time(p, share):
    budget = None if share is None else int(share * p.unplanned_peak)
    hints = [baselines.no_remat(p)]
    new = RematModel(p, budget, ONE, hints)
    old_reads = RematModel._add_reads
    RematModel._add_reads = _add_reads_one_call_at_a_time
    try:
        old = RematModel(p, budget, ONE, hints)
    finally:
        RematModel._add_reads = old_reads
    assert str(new.m.Proto()) == str(old.m.Proto())

    def key(reads):
        return [(c, v, j, lit if isinstance(lit, int) else lit.index) for c, v, j, lit in reads]
    assert key(new.reads) == key(old.reads)
