"""Window descent for phase 1: lower the memory over budget one peak at a time.

At tight budgets CP-SAT's own LNS on the whole phase-1 model crawls: every neighbourhood of the
remat model costs seconds of wall time (measured on RL250: about 2 s per 0.1 deterministic
seconds, with or without the LP, presolve or the cuts), and with the capacity as objective a
neighbourhood only counts as progress when it lowers every peak slot at once. Here the model
is built with the per-slot excess over the budget (RematModel ``excess_target``) and the
search is ours: take the slot with the most excess, free every variable of the nodes near its
step and of the buffers resident across those steps (with their inputs, so a recompute can
read them), fix the rest to the current solution, and let CP-SAT minimise the summed excess of
that small model. Any lower sum is kept. When no window around any slot over budget helps,
the windows widen. Each window is solved on one worker under a deterministic-time limit, so
the same start gives the same descent (only the wall-clock deadline cuts it short).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from planner.cpsat import RECOMPUTE, RematModel

log = logging.getLogger(__name__)
PARAMS: tuple = ()


@dataclass(frozen=True)
class WindowOptions:
    """Knobs of the descent; each says why it exists."""

    # Buffers freed together (with their inputs) around a peak slot.
    group: int = 4
    # Deterministic seconds per window solve (small models: most finish well within it).
    window_dtime: float = 2.0


@dataclass(frozen=True)
class Descent:
    values: dict[int, int]  # full assignment of the model's variables
    excess: tuple[int, int]  # (highest, summed) excess over the target, in memory units
    windows: int  # sub-models solved
    improved: int  # of which lowered the excess


def descend(model: RematModel, values: dict[int, int], deadline: float, seed: int = 0,
            wopt: WindowOptions = WindowOptions()) -> Descent:
    """Lower ``model``'s (highest, summed) excess from the solution ``values`` until it is
    zero, no neighbourhood helps, or ``deadline`` (time.perf_counter()) passes."""
    p = model.p
    load = model.slot_load(values)
    excess = _score(model, load)
    windows, improved = 0, 0
    stuck: set[int] = set()  # slots where no group helped since the last improvement
    while excess[0] > 0 and time.perf_counter() < deadline:
        over = [int(s) for s in np.argsort(-load, kind="stable") if load[s] > model.excess_units and int(s) not in stuck]
        if not over:
            break
        slot = over[0]
        groups = _groups(model, values, slot, wopt.group)
        better = None
        for nodes in groups:
            if time.perf_counter() >= deadline:
                break
            free = _free_vars(model, nodes)
            windows += 1
            res = _solve_window(model, values, free, deadline, seed, wopt.window_dtime)
            if res is None:
                continue
            new_load = model.slot_load(res)
            new_excess = _score(model, new_load)
            if new_excess < excess:
                better = (res, new_load, new_excess)
                break
        if better is None:
            stuck.add(slot)
            continue
        values, load, excess = better
        improved += 1
        stuck = set()
        log.debug("slot %d: excess %s after %d sub-models", slot, excess, windows)
    log.info("phase-1 descent on %s: %d sub-models, %d improved, excess %s", p.name, windows, improved, excess)
    return Descent(values, excess, windows, improved)


def _groups(model: RematModel, values: dict[int, int], slot: int, k: int) -> list[set[int]]:
    """Nodes to free for the peak ``slot``: buffers resident across it, largest first, in
    groups of ``k``, each with its inputs (a recompute must read them)."""
    p = model.p
    t = _step_of(model, slot)
    reads = set(p.pred_lists[t]) | {t}
    across: list[int] = []
    for x in model.inst:
        if x.node in reads or int(model.size[x.node]) == 0:
            continue
        if not isinstance(x.present, int) and not values.get(x.present.Index(), 0):
            continue
        if values.get(x.start.Index(), model.lower(x.start)) <= slot < values.get(x.end.Index(), model.lower(x.end)):
            across.append(x.node)
    across = sorted(set(across), key=lambda v: (-int(model.size[v]), v))
    out = []
    for i in range(0, len(across), k):
        nodes = set(across[i:i + k])
        nodes |= {u for v in list(nodes) for u in p.pred_lists[v]}
        out.append(nodes)
    return out


def _score(model: RematModel, load: np.ndarray) -> tuple[int, int]:
    """(highest excess, summed excess) over the target: lower is better, in that order."""
    over = np.maximum(0, load - model.excess_units)
    return int(over.max(initial=0)), int(over.sum())


def _step_of(model: RematModel, slot: int) -> int:
    """The step owning ``slot`` (its original runs in the step's last slot)."""
    return int(np.searchsorted(model.pos, slot))


def _free_vars(model: RematModel, nodes: set[int]) -> set[int]:
    """Every variable of the instances of ``nodes`` and of the reads touching them, and the
    excess and capacity variables."""
    free: set[int] = set()
    insts: set[int] = set()
    for v in nodes:
        for j in model.of_node[v]:
            insts.add(j)
            x = model.inst[j]
            free.update((x.start.Index(), x.end.Index()))
            if x.kind == RECOMPUTE:
                free.add(x.present.Index())
    for length, x in model.lengths:
        if x.node in nodes:
            free.add(length.Index())
    for c, _v, j, lit in model.reads:
        if not isinstance(lit, int) and (c in insts or j in insts):
            free.add(lit.Index())
    free.update(e.Index() for e in model.excess)
    free.update((model.excess_peak.Index(), model.cap.Index()))
    return free


def _solve_window(model: RematModel, values: dict[int, int], free: set[int], deadline: float,
                  seed: int, dtime: float) -> dict[int, int] | None:
    """Minimise the model's objective with every variable outside ``free`` fixed to ``values``."""
    sub = model.m.Clone()
    proto = sub.Proto()
    for idx in sorted(values):
        if idx in free:
            continue
        dom = proto.variables[idx].domain
        if len(dom) == 2:
            dom[0] = values[idx]
            dom[1] = values[idx]
        else:
            sub.Add(sub.GetIntVarFromProtoIndex(idx) == values[idx])
    # the highest excess first (a window at the peak slot must lower it), then the sum
    var = sub.GetIntVarFromProtoIndex
    sub.ClearObjective()
    sub.Minimize((model.horizon + 1) * var(model.excess_peak.Index())
                 + sum(var(e.Index()) for e in model.excess))
    sub.ClearHints()
    for idx in sorted(free):
        if idx in values:
            sub.AddHint(sub.GetIntVarFromProtoIndex(idx), values[idx])
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.num_workers = 1
    prm.random_seed = int(seed)
    prm.max_deterministic_time = float(dtime)
    for key, value in PARAMS:
        setattr(prm, key, value)
    prm.max_time_in_seconds = max(0.05, deadline - time.perf_counter())
    status = solver.Solve(sub)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return dict(enumerate(int(x) for x in solver.ResponseProto().solution))
