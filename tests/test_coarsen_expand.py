"""Coarsening.expand (planner/coarsen.py) builds each fused node's run of events once and reuses
it; checked against the event-by-event expansion it replaced, on random chains and plans."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.coarsen import Coarsening, coarsen
from planner.plan import OPS, Event, Plan
from planner.problem import PlanningProblem


def reference_expand(c: Coarsening, plan: Plan) -> Plan:
    """The expansion as it was: a new event per fine event."""
    events: list[Event] = []
    for ev in plan.events:
        members = c.groups[ev.node]
        if ev.op != "compute":
            events.append(Event(ev.op, members[-1]))
            continue
        events.append(Event("compute", members[0]))
        for prev, cur in zip(members, members[1:]):
            events.append(Event("compute", cur))
            events.append(Event("free", prev))
    return Plan(tuple(events), plan.strategy)


@st.composite
def _coarse_plans(draw):
    n = draw(st.integers(1, 16))
    # mostly chains (v reads v-1 alone), so that nodes fuse, with some joins
    preds = [[]] + [[i - 1] if draw(st.integers(0, 3)) else
                    draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=3, unique=True))
                    for i in range(1, n)]
    size = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    p = PlanningProblem.build(size=size, cost=[1.0] * n, preds=preds)
    c = coarsen(p)
    events = draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, c.coarse.n - 1)), max_size=40))
    return c, Plan.of(events, "test")


@given(_coarse_plans())
@settings(max_examples=200, deadline=None, derandomize=True)
def test_expand_matches_reference(case):
    c, plan = case
    assert c.expand(plan) == reference_expand(c, plan)
