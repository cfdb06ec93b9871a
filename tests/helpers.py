"""Small shared helpers for tests: inline ONNX text -> ModelProto; the order ORT runs nodes in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import onnx.parser
import onnxruntime as ort

from planner.problem import PlanningProblem, load_remat_json

ROOT = Path(__file__).resolve().parents[1]


def memplan(*args, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The command line in a process of its own, from the repository root (real exit code,
    stdout, stderr); ``env`` adds to the environment."""
    proc = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env})
    return proc.returncode, proc.stdout, proc.stderr


def draw_dag(draw, n_max: int, size_max: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Hypothesis draws for a random DAG of 2..``n_max`` nodes: (preds, size, cost); every node
    after the first reads 1-3 earlier ones."""
    import hypothesis.strategies as st

    n = draw(st.integers(2, n_max))
    preds: list[list[int]] = [[]]
    for i in range(1, n):
        preds.append(draw(st.lists(st.integers(0, i - 1), min_size=1, max_size=3, unique=True)))
    size = draw(st.lists(st.integers(1, size_max), min_size=n, max_size=n))
    cost = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    return preds, size, cost


def random_dag(rng, n_max: int, takes) -> tuple[list[list[int]], list[int], list[list[int]], list[bool], list[int]]:
    """A random small DAG for planner property tests, drawn from ``rng`` (numpy): 3..``n_max``
    nodes, each after the first reading 1-2 earlier ones, sizes 1-11, the last node pinned and
    others at random where nobody reads them; a node writes into the buffer of an input only it
    reads (``takes_over``, its size then that input's) where ``takes(rng)`` says so.
    (preds, size, readers, pinned, takes_over)."""
    n = int(rng.integers(3, n_max + 1))
    preds = [[]] + [sorted({int(x) for x in rng.integers(0, i, size=int(rng.integers(1, 3)))}) for i in range(1, n)]
    size = [int(x) for x in rng.integers(1, 12, size=n)]
    readers = [[w for w in range(n) if v in preds[w]] for v in range(n)]
    pinned = [i == n - 1 or (not readers[i] and bool(rng.integers(2))) for i in range(n)]
    over = [-1] * n
    for w in range(n):
        alone = [v for v in preds[w] if readers[v] == [w] and not pinned[v] and v not in over]
        if alone and takes(rng):
            over[w] = alone[0]
            size[w] = size[alone[0]]
    return preds, size, readers, pinned, over


def parse_model(text: str, ir_version: int = 8) -> onnx.ModelProto:
    """Parse ONNX textual syntax (onnx.parser) into a ModelProto ORT can load."""
    model = onnx.parser.parse_model(text)
    model.ir_version = ir_version
    return model


def run_order(model: onnx.ModelProto, feeds, tmp_path, options: ort.SessionOptions | None = None) -> list[str]:
    """Node names in the order ORT ran them (from its profile), with ``options`` (default: the
    planned session options)."""
    from passes.verify import planned_session_options

    so = options if options is not None else planned_session_options()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "profile")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    suffix = "_kernel_time"
    return [e["name"][: -len(suffix)] for e in events if e.get("cat") == "Node" and e["name"].endswith(suffix)]


def random_layered(benchmarks_dir: Path, n: int) -> PlanningProblem:
    """The random layered graph of ``n`` nodes (RL100, RL250, ...) from the shared remat benchmarks."""
    hits = sorted((benchmarks_dir / "remat").glob(f"random_layered_n{n}_*.json"))
    assert hits, f"no random_layered_n{n}_*.json in {benchmarks_dir / 'remat'}"
    return load_remat_json(hits[0])


def memory_ordered_with_greedy(benchmarks_dir: Path, n: int, fraction: float):
    """RL``n`` at ``fraction`` of its unplanned peak in its memory-aware order: (problem in that
    order, budget in bytes, the greedy's plan there as a baselines.Candidate, which fits)."""
    from planner.baselines import greedy
    from planner.reorder import memory_order, permute

    p = random_layered(benchmarks_dir, n)
    budget = p.budget_for(fraction)
    order, _ = memory_order(p, 0.05, budget)
    q = permute(p, order)
    start = greedy(q, budget)
    assert start is not None and start.sim.peak_bytes <= budget
    return q, budget, start


def spy_plan_graph(monkeypatch, read) -> list:
    """Record ``read(options)`` for every passes.plan_model.plan_graph call, which then plans as
    usual: what a command hands the planner."""
    import passes.plan_model as plan_model

    seen, real = [], plan_model.plan_graph

    def spy(graph, budget, **kwargs):
        seen.append(read(kwargs["options"]))
        return real(graph, budget, **kwargs)

    monkeypatch.setattr(plan_model, "plan_graph", spy)
    return seen


def feasible_as_hinted(model, values: dict[int, int], seconds: float = 10) -> bool:
    """Is the CP-SAT remat ``model`` (planner.cpsat.RematModel) feasible with each variable of
    ``values`` (by proto index) fixed to its value, i.e. is that hint a solution of the model?"""
    from ortools.sat.python import cp_model

    fixed = model.m.Clone()
    fixed.ClearHints()
    fixed.ClearObjective()
    for idx, value in values.items():
        fixed.Add(fixed.get_int_var_from_proto_index(idx) == value)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = seconds
    return solver.Solve(fixed) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
