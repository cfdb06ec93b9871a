"""Plan and SolveResult: what a strategy returns, and the ``memplan.plan/1`` JSON form of it.

A plan is an ordered event list over a PlanningProblem (node ids = schedule positions):
  * ``compute i``  runs node i (first time or again); its inputs must be resident;
  * ``free i``     releases node i's output buffer;
  * ``swap_out i`` copies i's output to host; the device buffer is released when the copy ends;
  * ``swap_in i``  allocates i's buffer again and copies it back from host.
:func:`planner.simulate.simulate` replays the list; every returned plan passes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from planner.errors import UsageError
from planner.problem import PlanningProblem

SCHEMA = "memplan.plan/1"
OPS = ("compute", "free", "swap_out", "swap_in")
#: cpsat: optimal / feasible (a plan, gap > 0) / infeasible (proven over every plan, least memory
#: given) / timeout (no plan found: the time ran out, or the solver's model holds none that fits).
#: Baselines: feasible, or over_budget when their plan does not fit.
STATUSES = ("optimal", "feasible", "infeasible", "timeout", "over_budget")


@dataclass(frozen=True, slots=True)
class Event:
    op: str  # one of OPS
    node: int  # schedule position of the node whose output is computed / freed / moved

    def to_json(self, problem: PlanningProblem) -> dict[str, Any]:
        return {"op": self.op, "node": problem.node_ids[self.node]}


@dataclass(frozen=True)
class Plan:
    """An event schedule for one problem, and the strategy that produced it."""

    events: tuple[Event, ...]
    strategy: str

    @classmethod
    def of(cls, events: Sequence[tuple[str, int]] | Sequence[Event], strategy: str) -> "Plan":
        evs = tuple(e if isinstance(e, Event) else Event(e[0], int(e[1])) for e in events)
        return cls(evs, strategy)

    def counts(self, n: int) -> dict[str, list[int]]:
        """Per node: number of computes, of swap-ins and of swap-outs."""
        out: dict[str, list[int]] = {"compute": [0] * n, "swap_in": [0] * n, "swap_out": [0] * n}
        for e in self.events:
            if e.op in out:
                out[e.op][e.node] += 1
        return out

    def recomputed(self, n: int) -> list[int]:
        """The nodes computed more than once, in order."""
        return [i for i, c in enumerate(self.counts(n)["compute"]) if c > 1]

    def without_unread(self, problem: PlanningProblem) -> "Plan":
        """This plan less every recompute whose copy nothing reads before it is freed, with
        that free. Such a copy costs time and memory only, and the CP-SAT model holds no plan
        with one (a recompute nobody reads is absent there), so as a hint it is infeasible and
        CP-SAT spends its time repairing it (the tight greedy's plan for the resnet fixture at
        60%: 22 of them). One backward pass: a dropped copy reads nothing, so recomputes that
        only it read go too. Originals, swaps and graph outputs stay; memory and time can only
        go down."""
        events = self.events
        first = {}
        for k, ev in enumerate(events):
            if ev.op == "compute":
                first.setdefault(ev.node, k)
        # read[v]: the copy of v resident at this point (walking backward) is read later
        read = [bool(x) for x in problem.pinned]
        free_at = [-1] * problem.n  # index of the free that ends that copy
        drop: set[int] = set()
        for k in range(len(events) - 1, -1, -1):
            op, v = events[k].op, events[k].node
            if op == "free":
                read[v], free_at[v] = False, k
            elif op == "swap_out":
                read[v] = True
            elif op == "compute" and first[v] != k and not read[v] and free_at[v] >= 0:
                drop.update((k, free_at[v]))
            elif op == "compute":
                for u in problem.pred_lists[v]:
                    read[u] = True
        if not drop:
            return self
        return Plan(tuple(e for k, e in enumerate(events) if k not in drop), self.strategy)


@dataclass(frozen=True)
class SolverStats:
    wall_s: float = 0.0  # wall-clock seconds spent by the strategy (solver phases included)
    bound: float | None = None  # proven lower bound on added time (None: no bound known)
    gap: float | None = None  # (added_time - bound) / added_time; 0 when proven optimal
    seed: int | None = None
    workers: int | None = None
    phases: tuple[Mapping[str, Any], ...] = ()  # per CP-SAT phase: name, status, wall_s, objective
    clock: str = "wall"  # what the time limit counted: wall seconds, or "work" (planner/clock.py)
    wall_capped: bool = False  # on the work clock: its wall cap stopped the solve (planner/clock.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "bound": _num(self.bound),
            "gap": _num(self.gap),
            "seed": self.seed,
            "workers": self.workers,
            "clock": self.clock,
            **({"wall_capped": self.wall_capped} if self.clock == "work" else {}),
            "phases": [dict(p) for p in self.phases],
        }


@dataclass(frozen=True)
class SolveResult:
    """Outcome of one strategy at one budget. ``plan`` is None unless status is optimal/feasible."""

    status: str  # one of STATUSES
    strategy: str
    budget_bytes: int
    unplanned_peak_bytes: int
    base_bytes: int
    compute_time: float  # sum of every node's cost once (the unplanned run)
    plan: Plan | None = None
    peak_bytes: int | None = None  # simulated peak of ``plan``
    added_time: float | None = None  # simulated makespan - compute_time
    solver: SolverStats = field(default_factory=SolverStats)
    least_bytes: int | None = None  # when infeasible: least peak any plan reaches (or a lower bound)
    least_exact: bool = False  # least_bytes is exact (else a proven lower bound)
    # "any": least_bytes holds for plans in every node order; "given": for those in the problem's
    # own order only (a solve told not to reorder, --fixed-order)
    least_order: str = "any"
    best_bytes: int | None = None  # when timeout, or infeasible and not exact: peak of the lowest plan found
    note: str = ""
    # "given": the plan computes nodes first in the problem's order; "memory-aware:<start>": in
    # the order planner/reorder.py found from that start (bound and gap are then for that order);
    # "exact-search": the order of planner.least.least_plan_any_order's least-peak plan (a small
    # problem whose searched orders hold no plan within the budget); "reverse-walk": the order a
    # last resort's walk over every order took (planner/pebble.py; bound and gap, where given, are
    # for that order: planning._in_plan_order); "kept-set": the order of planner/kept_set.py's
    # plan (a last resort after the walks found none)
    order: str = "given"

    @property
    def ok(self) -> bool:
        return self.plan is not None

    def to_json(self, problem: PlanningProblem, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``memplan.plan/1`` object (see DESIGN.md, plan.json)."""
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "model": problem.name,
            "strategy": self.strategy,
            "status": self.status,
            "budget_bytes": self.budget_bytes,
            "unplanned_peak_bytes": self.unplanned_peak_bytes,
            "peak_bytes": self.peak_bytes,
            "base_bytes": self.base_bytes,
            "compute_time": _num(self.compute_time),
            "added_time": _num(self.added_time),
            "added_time_pct": _num(None if self.added_time is None else _pct(self.added_time, self.compute_time)),
            "time_unit": problem.time_unit,
            "solver": self.solver.to_json(),
            "order": self.order,
        }
        # every outcome has every key, null where it does not apply: a timed-out JSON graph's lacked
        # least_bytes, recomputed and swapped, a plan's least_bytes and note, so a CI job reading
        # obj["recomputed"] failed with a KeyError on one outcome
        known = self.least_bytes is not None
        out["least_bytes"] = self.least_bytes
        out["least_exact"] = self.least_exact if known else None
        out["least_order"] = self.least_order if known else None
        out["best_peak_bytes"] = self.best_bytes
        out["note"] = self.note or None
        out["recomputed"] = out["swapped"] = None
        out["schedule"] = []
        if self.plan is not None:
            counts = self.plan.counts(problem.n)
            out["recomputed"] = [problem.node_ids[i] for i, c in enumerate(counts["compute"]) if c > 1]
            out["swapped"] = [problem.node_ids[i] for i, c in enumerate(counts["swap_in"]) if c > 0]
            out["schedule"] = [e.to_json(problem) for e in self.plan.events]
        if extra:
            out.update(extra)
        return out


def _pct(added: float, base: float) -> float:
    return 0.0 if base <= 0 else 100.0 * added / base


def _num(x: float | None) -> float | int | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    if isinstance(x, float) and x.is_integer() and abs(x) < 2**53:
        return int(x)
    return x


def plan_from_json(obj: Mapping[str, Any], problem: PlanningProblem) -> Plan:
    """Read the schedule of a ``memplan.plan/1`` object back into a Plan over ``problem``."""
    if obj.get("schema") != SCHEMA:
        raise UsageError(f"plan has schema {obj.get('schema')!r}; expected {SCHEMA!r} (write it with memplan plan -o)")
    pos = {nid: i for i, nid in enumerate(problem.node_ids)}
    events = []
    for k, ev in enumerate(obj.get("schedule", [])):
        op, node = ev.get("op"), ev.get("node")
        if op not in OPS:
            raise UsageError(f"plan event {k} has op {op!r}; expected one of {', '.join(OPS)}")
        if node not in pos:
            raise UsageError(f"plan event {k} names node {node!r}, which {problem.name!r} does not have")
        events.append(Event(op, pos[node]))
    return Plan(tuple(events), str(obj.get("strategy", "file")))
