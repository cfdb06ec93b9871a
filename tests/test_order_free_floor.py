"""What memplan claims about the least memory when it may plan in another node order.

The floor of one order counts every pinned output made before a step (a weight gradient stays to
the end), so it depends on the order: a memory-aware order that makes the pinned outputs last can
plan below the given order's floor. The claims of a solve that may reorder hold over every order
(PlanningProblem.order_free_floor); with --fixed-order they say they cover the given order only."""
from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner.planning as planning
from cli import _infeasible_error
from planner.cpsat import PlannerOptions
from planner.least import least_plan_any_order
from planner.pebble import DepthFirstPlan
from planner.planning import solve
from planner.problem import PlanningProblem, last_pinned_bound
from planner.reorder import permute
from planner.simulate import simulate
from tests.test_memory_floor import exact_least_peak

ONE = PlannerOptions(time_limit=5, workers=1, seed=0, work_limit=True)


def gradient_first() -> PlanningProblem:
    """a (10 B) -> g (100, pinned: a weight gradient) and a -> b (50) -> c (50). In this order g
    is resident while c runs: 200 bytes. Made last (a, b, c, g), g costs a's 10 bytes kept
    until then: the peak is 110."""
    return PlanningProblem.build(size=[10, 100, 50, 50], cost=[1, 1, 1, 1], preds=[[], [0], [0], [2]],
                                 pinned=[False, True, False, False], name="gradient_first")


@st.composite
def pinned_dags(draw) -> PlanningProblem:
    """Small DAGs with a few pinned outputs anywhere (graph outputs, weight gradients)."""
    n = draw(st.integers(3, 6))
    preds: list[list[int]] = [[]]
    for i in range(1, n):
        preds.append(draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=2, unique=True)))
    return PlanningProblem.build(size=draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)),
                                 cost=[1] * n, preds=preds,
                                 pinned=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                                 scratch=draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)),
                                 base_bytes=draw(st.integers(0, 20)), name="pinned")


def topological_orders(p: PlanningProblem):
    for order in itertools.permutations(range(p.n)):
        at = {v: k for k, v in enumerate(order)}
        if all(at[u] < at[v] for v in range(p.n) for u in p.pred_lists[v]):
            yield list(order)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pinned_dags())
def test_no_order_plans_below_the_order_free_floor(p):
    floor = p.order_free_floor
    assert floor <= p.memory_floor
    least = min(exact_least_peak(permute(p, order)) for order in topological_orders(p))
    assert floor <= least


def test_the_floor_of_the_given_order_is_not_claimed_for_every_order():
    p = gradient_first()
    assert p.memory_floor == 200 and p.order_free_floor == 110
    assert min(exact_least_peak(permute(p, o)) for o in topological_orders(p)) == 110


def test_a_budget_below_the_given_orders_floor_gets_a_plan_in_another_order():
    p = gradient_first()
    # the memory-aware order is not tried for its unplanned peak (a gain of 45% < 60%), but for
    # the budget, which no plan in the given order reaches
    opt = replace(ONE, reorder_min_gain=0.6)
    res = solve(p, 150, "cpsat", opt)
    assert res.plan is not None and res.order.startswith("memory-aware")
    assert simulate(p, res.plan, 150).peak_bytes <= 150
    # before: "infeasible: the least memory any plan reaches is 200 bytes"
    fixed = solve(p, 150, "cpsat", replace(opt, reorder=False))
    assert fixed.status == "infeasible" and fixed.least_bytes == 200 and fixed.least_exact
    assert fixed.least_order == "given"
    assert "in the given node order reaches is 200" in str(_infeasible_error(fixed, 150, None))


def test_an_infeasible_claim_holds_over_every_order():
    p = gradient_first()
    res = solve(p, 100, "cpsat", replace(ONE, reorder_min_gain=0.6))
    assert res.status == "infeasible" and res.least_order == "any"
    assert res.least_bytes == 110 and res.least_exact  # the least over every order (the given one's: 200)
    msg = str(_infeasible_error(res, 100, None))
    assert msg.startswith("infeasible: the least memory any plan reaches") and "given node order" not in msg


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pinned_dags())
def test_the_any_order_search_finds_the_least_over_every_order(p):
    peak, plan = least_plan_any_order(p)
    assert peak == min(exact_least_peak(permute(p, order)) for order in topological_orders(p))
    assert simulate(p, plan, peak).peak_bytes == peak


def test_where_the_orders_searched_hold_no_plan_the_exact_search_gives_one(monkeypatch):
    p = gradient_first()
    monkeypatch.setattr(planning, "memory_order", lambda *a, **k: None)  # no other order searched
    monkeypatch.setattr(planning, "repaired_order", lambda *a, **k: None)
    res = solve(p, 150, "cpsat", ONE)
    # optimal in the order of the exact search's plan (a, b, c, g): CP-SAT searched it next
    assert res.status == "optimal" and res.order == "exact-search" and res.solver.gap == 0
    assert simulate(p, res.plan, 150).peak_bytes == res.peak_bytes == 110
    assert "the exact search over every order's plans found the least peak, 110 bytes" in res.note
    below = solve(p, 109, "cpsat", ONE)
    assert below.status == "infeasible" and below.least_bytes == 110 and below.least_exact


def _no_search_over_orders(monkeypatch) -> None:
    """Leave the floor as the only word on orders not searched: no exact search (as past 20
    nodes), no reverse or depth-first walk, no long greedy run."""
    monkeypatch.setattr(planning, "least_plan_any_order", lambda *a, **k: None)
    monkeypatch.setattr(planning, "reverse_pebble", lambda *a, **k: None)
    monkeypatch.setattr(planning, "depth_first_plan", lambda *a, **k: DepthFirstPlan(None, False))
    monkeypatch.setattr(planning, "long_run", lambda *a, **k: None)


def test_a_budget_only_the_orders_not_searched_may_fit_gets_no_infeasible_claim(monkeypatch):
    p = gradient_first()
    monkeypatch.setattr(planning, "memory_order", lambda *a, **k: None)
    monkeypatch.setattr(planning, "repaired_order", lambda *a, **k: None)
    monkeypatch.setattr(planning, "least_plan_any_order", lambda *a, **k: None)  # as past 20 nodes
    walked = solve(p, 150, "cpsat", ONE)  # the reverse walk over every order finds the plan
    assert walked.status == "optimal" and walked.order == "reverse-walk"  # (in that plan's order)
    assert simulate(p, walked.plan, 150).peak_bytes == walked.peak_bytes <= 150
    monkeypatch.setattr(planning, "reverse_pebble", lambda *a, **k: None)  # and where it does not
    monkeypatch.setattr(planning, "depth_first_plan", lambda *a, **k: DepthFirstPlan(None, False))
    monkeypatch.setattr(planning, "long_run", lambda *a, **k: None)  # nor the long greedy run
    res = solve(p, 150, "cpsat", ONE)
    # before: "infeasible: the least memory any plan reaches is 200 bytes", with a plan at 110
    assert res.status == "timeout" and res.plan is None and res.least_bytes is None and res.best_bytes == 200
    assert "none in the node orders searched (they reach no lower than 200 bytes)" in res.note
    assert "no plan in any order reaches below 110 bytes" in res.note
    below = solve(p, 100, "cpsat", ONE)  # below every order's floor: proven
    assert below.status == "infeasible" and below.least_bytes == 110 and not below.least_exact


def gradient_behind_its_input() -> PlanningProblem:
    """a (100 B) feeds g (100, pinned: a weight gradient) and b (20), which feeds h (50, pinned).
    Made last, h holds g but not a (170 bytes); but g and b, both resident then, were made with
    a resident: whichever of them came later, 220 bytes, in every order."""
    return PlanningProblem.build(size=[100, 100, 20, 50], cost=[1] * 4, preds=[[], [0], [0], [2]],
                                 pinned=[False, True, False, True], name="gradient_behind_its_input")


def test_the_outputs_resident_when_the_last_is_made_were_made_with_their_inputs(monkeypatch):
    """The floor over every order took the last pinned output made (h: 170 bytes) and the steps
    alone (200), so at 210 bytes a problem past the exact search's size had no plan and no proof
    ("timeout": exit 4). One level further down (planner.problem.last_pinned_bound): 220, the
    least peak in every order; the budget is infeasible."""
    p = gradient_behind_its_input()
    least = min(exact_least_peak(permute(p, order)) for order in topological_orders(p))
    assert p.order_free_floor == least == 220  # before: 200
    _no_search_over_orders(monkeypatch)
    res = solve(p, 210, "cpsat", ONE)
    assert res.status == "infeasible" and res.plan is None and res.least_bytes == 220


def shared_input_tail(cheap: int = 3) -> PlanningProblem:
    """``cheap`` bias-like gradients, each c (10 B, pinned) from its own u (10), then the first
    layer's tail: dY (100) feeds dW (100, pinned) and r (20), which feeds db (20, pinned).
    Whichever of dW and r is made later holds dY and the other (r, or db): 220 bytes, in every
    order; made last, the c's cost only what they hold."""
    size, preds, pinned = [], [], []
    for _ in range(cheap):
        u = len(size)
        size += [10, 10]
        preds += [[], [u]]
        pinned += [False, True]
    y = len(size)
    size += [100, 100, 20, 20]
    preds += [[], [y], [y], [y + 2]]
    pinned += [False, True, False, True]
    return PlanningProblem.build(size=size, cost=[1] * len(size), preds=preds, pinned=pinned,
                                 name="shared_input_tail")


def test_the_floor_reaches_the_shared_input_tail_behind_cheap_outputs_made_last(monkeypatch):
    """bench/fuzz_e2e.py seed 7 at 12356 bytes exited 4 ("no plan in any order reaches below
    12328"): the pinned-outputs search, 3 levels down, spent them making cheap gradients last
    and never reached the step that makes the first layer's weight gradient or its bias's
    ReduceSum with their shared input resident (12520, the peak). Here 3 cheap outputs hide the
    tail the same way: the floor said 200 (160 from the outputs, 3 levels down), where every
    order needs 220; searched deeper, 220: a budget below is infeasible past the exact search."""
    p = shared_input_tail()
    least, _ = least_plan_any_order(p, runtime=True)
    assert least == 220
    assert p.order_free_floor == least  # before: 200
    assert last_pinned_bound(p) == least > last_pinned_bound(p, max_work=None) == 160
    _no_search_over_orders(monkeypatch)
    res = solve(p, 219, "cpsat", ONE)
    assert res.status == "infeasible" and res.plan is None and res.least_bytes == 220


def test_the_pinned_outputs_made_last_bound_every_order_on_the_mlp_training_step():
    """zoo:mlp's training step peaks at 347520 bytes (the first layer's bias-gradient ReduceSum,
    its 4 KiB input and every other gradient resident). The floor over every order took the loss
    (64 B made from a 64 B input) as the last pinned output made, 343488 bytes, so at 99%
    (344045) the solve had no plan and no proof: exit 4 on a 37-node step. With the loss and the
    head's bias gradient made last, the others still cost 347392: infeasible. (Since the Reshape
    copying each bias gradient into its graph output is a problem node of its own, that copy may be
    made last apart from its ReduceSum's 4 KiB input: 345856, still above 99%. Searched deeper,
    past the copies made last, that ReduceSum's step: 347520, the peak, the least of every order.)"""
    import cli
    from passes.plan_model import lower_graph, plan_graph
    from planner.liveness import analyze
    from planner.units import share_of

    graph, _ = cli._graph_to_plan("zoo:mlp", {}, False)
    own = analyze(graph).peak_bytes
    problem, _ = lower_graph(graph)
    assert own == 347520 and problem.memory_floor == own
    assert problem.order_free_floor == own  # before: 343488, then 345856 (3 levels down)
    budget = share_of(own, 0.99)
    pm = plan_graph(graph, budget, options=PlannerOptions(time_limit=2, workers=1, seed=0, work_limit=True))
    assert not pm.ok and pm.result.status == "infeasible" and pm.result.least_bytes == own



@st.composite
def dags_with_companions(draw) -> PlanningProblem:
    """pinned_dags where some unpinned nodes make a pinned companion (the graph output of an
    ONNX node whose other output dies: PlanningProblem.companion) right after them."""
    n = draw(st.integers(3, 7))
    preds: list[list[int]] = [[]]
    pinned, companion = [draw(st.booleans())], [False]
    for i in range(1, n):
        if not pinned[i - 1] and not companion[i - 1] and draw(st.booleans()):
            preds.append([i - 1])
            pinned.append(True)
            companion.append(True)
            continue
        preds.append(draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=2, unique=True)))
        pinned.append(draw(st.booleans()))
        companion.append(False)
    return PlanningProblem.build(size=draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)),
                                 cost=[1] * n, preds=preds, pinned=pinned, companion=companion,
                                 scratch=draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)),
                                 base_bytes=draw(st.integers(0, 20)), name="companions")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags_with_companions())
def test_no_order_plans_below_the_order_free_floor_with_companions(p):
    found = least_plan_any_order(p)
    assert found is not None and p.order_free_floor <= found[0]
