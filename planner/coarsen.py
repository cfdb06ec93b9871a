"""Shrink a problem before solving: fuse single-use chains into one node, and expand plans back.

A chain v1 -> v2 -> ... -> vk fuses when each v(j+1) comes right after vj in the order, reads only
vj, and is vj's only reader (and they agree on pinning/recompute/swap). The fused node reads v1's
inputs, outputs vk's buffer, costs the sum, and gets scratch so that its step needs at least what
every member step needed:
    scratch = max_j(extra_j) - size(vk),  extra_1 = size(v1) + scratch(v1),
                                          extra_j = size(v(j-1)) + size(vj) + scratch(vj),
(v(j-1) is freed right after vj runs). So a plan for the coarse problem expands into a fine plan
whose peak is no higher; the fine plan is still replayed by simulate().

The ONNX importer folds zero-copy views and shape subgraphs before this (they move no bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.plan import Event, Plan
from planner.problem import PlanningProblem


@dataclass(frozen=True)
class Coarsening:
    fine: PlanningProblem
    coarse: PlanningProblem
    groups: tuple[tuple[int, ...], ...]  # fine nodes of each coarse node, in chain order

    def expand(self, plan: Plan) -> Plan:
        """The fine event list of a coarse plan (a fused compute runs its chain, freeing as it goes)."""
        events: list[Event] = []
        # each coarse event's fine events, made once (events are values): a plan recomputes and
        # frees the same nodes over and over (lstm fixture, batch 8: 330 thousand fine events)
        runs: dict[int, tuple[Event, ...]] = {}
        others: dict[Event, Event] = {}
        for ev in plan.events:
            if ev.op != "compute":
                fine = others.get(ev)
                if fine is None:
                    fine = others[ev] = Event(ev.op, self.groups[ev.node][-1])
                events.append(fine)
                continue
            run = runs.get(ev.node)
            if run is None:
                members = self.groups[ev.node]
                chain = [Event("compute", members[0])]
                for prev, cur in zip(members, members[1:]):
                    chain += (Event("compute", cur), Event("free", prev))
                run = runs[ev.node] = tuple(chain)
            events.extend(run)
        return Plan(tuple(events), plan.strategy)


def coarsen(p: PlanningProblem) -> Coarsening:
    """Fuse every single-use chain of ``p`` (module docstring); identity when there is none."""
    groups: list[list[int]] = []
    for v in range(p.n):
        prev = v - 1
        if groups and groups[-1][-1] == prev and _fusable(p, prev, v):
            groups[-1].append(v)
        else:
            groups.append([v])
    group_of = np.empty(p.n, dtype=np.int64)
    for g, members in enumerate(groups):
        group_of[members] = g
    size, cost, scratch, preds, names, ids = [], [], [], [], [], []
    for members in groups:
        head, tail = members[0], members[-1]
        extra = [int(p.size[head]) + int(p.scratch[head])]
        extra += [int(p.size[a]) + int(p.size[b]) + int(p.scratch[b]) for a, b in zip(members, members[1:])]
        size.append(int(p.size[tail]))
        scratch.append(max(0, max(extra) - int(p.size[tail])))
        cost.append(float(p.cost[members].sum()))
        preds.append(sorted({int(group_of[u]) for u in p.pred_lists[head]}))
        names.append(p.names[head] if head == tail else f"{p.names[head]}..{p.names[tail]}")
        ids.append(p.node_ids[tail])
    tails = [m[-1] for m in groups]
    coarse = PlanningProblem.build(
        size=size, cost=cost, preds=preds, name=p.name, names=names, node_ids=ids,
        base_bytes=p.base_bytes, scratch=scratch, pinned=p.pinned[tails],
        recomputable=p.recomputable[tails], swappable=p.swappable[tails],
        transfer=None if p.transfer is None else p.transfer[tails], copy_overlap=p.copy_overlap,
        time_unit=p.time_unit, backward=None if p.backward is None else p.backward[tails],
        late_base_bytes=p.late_base_bytes,
    )
    return Coarsening(p, coarse, tuple(tuple(m) for m in groups))


def _fusable(p: PlanningProblem, a: int, b: int) -> bool:
    return (
        p.pred_lists[b] == (a,)
        and p.succ_lists[a] == (b,)
        and not p.pinned[a]
        and p.recomputable[a] == p.recomputable[b]
        and p.swappable[a] == p.swappable[b]
        and (p.backward is None or p.backward[a] == p.backward[b])
    )
