"""CP-SAT member of the allocator's portfolio: one NoOverlap per maximal section.

All buffers alive in one section overlap in time, so a placement is valid exactly when, in every
section, their offset intervals are disjoint; sections whose buffers are a subset of a
neighbour's add nothing, so only maximal ones get a constraint. Compared with a NoOverlap2D over
(time, offset) this hands CP-SAT's disjunctive propagation the cliques directly; it solves some
instances the skyline search finds hard (and the other way round), which is why both run.

Deterministic: one worker, a fixed seed and a *deterministic* time budget (wall time only cuts).
"""
from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from planner import clock, interrupt
from planner.alloc_search import Reduced, SearchStatus, _Static


def maximal_sections(red: Reduced) -> list[np.ndarray]:
    """Buffer sets of the sections not contained in a neighbour's: a buffer starts *and* one ends there.

    Adjacent sections differ by the buffers that end before the boundary and start after it, so
    a section is inside its left neighbour iff nothing starts in it, inside its right one iff
    nothing ends in it (and a subset of a farther section is a subset of the one in between).
    """
    st = _Static(red)
    starts = np.bincount(red.first, minlength=red.num_sections)
    ends = np.bincount(red.stop - 1, minlength=red.num_sections)
    keep = np.flatnonzero((starts > 0) & (ends > 0))
    return [np.sort(st.sec_buf[st.sec_ptr[s]:st.sec_ptr[s + 1]]) for s in keep.tolist()]


def cpsat_pack(
    red: Reduced, capacity: int, det_time: float, wall_time: float, seed: int = 0,
) -> tuple[SearchStatus, np.ndarray | None]:
    """Decide whether ``red`` packs into ``capacity`` units with CP-SAT (reduced units)."""
    if wall_time <= 0:
        return SearchStatus.UNKNOWN, None
    model = cp_model.CpModel()
    offsets = [model.new_int_var(0, capacity - int(z), f"offset_{i}") for i, z in enumerate(red.size.tolist())]
    for i, a in enumerate(red.align.tolist()):
        if a > 1:
            slot = model.new_int_var(0, capacity // a, f"slot_{i}")
            model.add(offsets[i] == a * slot)
    intervals = [
        model.new_fixed_size_interval_var(offsets[i], int(z), f"buffer_{i}") for i, z in enumerate(red.size.tolist())
    ]
    for members in maximal_sections(red):
        model.add_no_overlap([intervals[i] for i in members.tolist()])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    if clock.on_work_clock():  # ``wall_time`` is the work clock's seconds left: deterministic ones
        clock.limit_solver(solver.parameters, min(det_time, wall_time))
    else:
        solver.parameters.max_deterministic_time = det_time
        solver.parameters.max_time_in_seconds = wall_time
    status = interrupt.solve(solver, model)
    clock.charge(solver.response_proto.deterministic_time)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SearchStatus.FOUND, np.array([solver.value(v) for v in offsets], np.int64)
    if status == cp_model.INFEASIBLE:
        return SearchStatus.INFEASIBLE, None
    return SearchStatus.UNKNOWN, None
