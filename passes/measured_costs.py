"""Per-node times measured on this machine: profile one training step in ONNX Runtime.

``memplan plan --costs measured`` prices recomputes with these instead of a device profile's
roofline. The graph to plan is exported as it is, run with the planned session options (no graph
optimisation, so every node keeps its name and kernel) and ORT's profiler on, and each node's time
is the median of its kernel times over the runs: ORT profiles the first run too, which pays for
allocation and cold caches, and the median leaves that one out.

``--costs PROFILE.json`` reads a profile the user made instead (``SessionOptions.enable_profiling``
on the model ``memplan train-graph`` writes): the same profile gives the same plan, which a fresh
measurement cannot promise.

Nodes the profile does not time (none under the planned options; some when a user's profile ran
with optimisations that fused them) get the device profile's estimate times the median ratio of
measured to estimated time over the nodes it does time, so the two scales never mix.
"""
from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from planner import interrupt
from planner.costs import ort_profile_providers, read_ort_profile
from planner.errors import UsageError, first_line
from planner.graph import Graph, Node

#: Profiled runs besides the first (warm-up) one; each node's time is the median over all of them.
RUNS = 5
#: A profile that times fewer of the graph's nodes than this share is of another model.
MIN_COVERAGE = 0.5


@dataclass(frozen=True)
class MeasuredCosts:
    """Seconds per graph node name, where it came from, and how many nodes it timed."""

    seconds: Mapping[str, float]  # node name -> seconds (only the timed nodes)
    source: str  # "measured on CPUExecutionProvider" or "profile PATH, run on CPUExecutionProvider"
    timed: int  # graph nodes with a time of their own
    total: int  # graph nodes

    def node_time(self, graph: Graph, estimate: Callable[[Graph, Node], float]) -> Callable[[Graph, Node], float]:
        """``node_time(graph, node)`` for lowering ``graph`` (the graph these times were taken on):
        the measured time, else ``estimate`` rescaled by the median measured/estimated ratio of the
        timed nodes."""
        seconds = self.seconds
        ratios = [seconds[n.name] / e for n in graph.nodes if n.name in seconds and seconds[n.name] > 0
                  for e in [estimate(graph, n)] if e > 0] if self.timed < self.total else []
        scale = statistics.median(ratios) if ratios else 1.0

        def node_time(g: Graph, node: Node) -> float:
            return seconds[node.name] if node.name in seconds else estimate(g, node) * scale

        return node_time


def map_to_graph(graph: Graph, per_ort_node: Mapping[str, float], source: str) -> MeasuredCosts:
    """Times per graph node: its own ORT node, or the sum over the ORT nodes of its function body
    (passes/onnx_export.py writes those as ``<name>/<k>_<op>``). Refuses a profile of another model."""
    names = {n.name for n in graph.nodes}
    body: dict[str, float] = {}
    for ort_name, sec in per_ort_node.items():
        head, sep, _ = ort_name.rpartition("/")
        if sep and head in names and ort_name not in names:
            body[head] = body.get(head, 0.0) + sec
    seconds = {}
    for node in graph.nodes:
        if node.name in per_ort_node:
            seconds[node.name] = float(per_ort_node[node.name])
        elif node.name in body:
            seconds[node.name] = body[node.name]
    total = len(graph.nodes)
    if total and len(seconds) < MIN_COVERAGE * total:
        raise UsageError(
            f"{source} times {len(seconds)} of the {total} nodes of the graph to plan; profile the model "
            "`memplan train-graph` writes (same --dim and --optimizer), or use --costs measured")
    return MeasuredCosts(seconds, source, len(seconds), total)


def read_profile(graph: Graph, path: str | os.PathLike) -> MeasuredCosts:
    """``--costs PROFILE.json``: an ORT profile (``enable_profiling``) of ``graph``'s model. The
    source ends "on CPUExecutionProvider" where the CPU provider ran every kernel it times, as a
    measurement on the CPU does (--swap refuses both)."""
    seconds = read_ort_profile(path, statistic="median")
    on = ort_profile_providers(path)
    where = f", run on {', '.join(sorted(on, key=lambda p: (p != 'CPUExecutionProvider', p)))}" if on else ""
    return map_to_graph(graph, seconds, f"profile {path}{where}")


def measure(graph: Graph, runs: int = RUNS, seed: int = 0, threads: int = 1) -> MeasuredCosts:
    """``--costs measured``: profile ``runs`` + 1 training steps of ``graph`` on this machine.

    CUDA where ORT has it and a GPU answers, else the CPU provider; ``threads`` intra-op threads
    (1 by default: the timings of a shared machine vary least so)."""
    import onnxruntime as ort

    import models
    from passes.onnx_export import export_model, write_model
    from passes.verify import planned_session_options

    feeds = models.example_feeds(export_model(graph, weights=False), seed=seed)
    wanted = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
    with tempfile.TemporaryDirectory(prefix="memplan-profile-") as tmp:
        model = str(Path(tmp) / "step.onnx")  # a file: over 2 GB its weights go beside it
        write_model(graph, model)
        so = planned_session_options()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "step")
        so.intra_op_num_threads = threads
        so.log_severity_level = 4
        ort.set_default_logger_severity(4)  # a GPU build on a machine without one: CPU, silently
        run = ort.RunOptions()  # terminated by a signal (interrupt.stopping): a step can take seconds
        run.log_severity_level = 4
        try:
            session = ort.InferenceSession(model, so, providers=wanted)
            with interrupt.stopping(lambda: setattr(run, "terminate", True)):
                for _ in range(runs + 1):
                    session.run(None, feeds, run)
        except Exception as err:  # noqa: BLE001 - ORT raises its own exception types
            if run.terminate:
                interrupt.deliver()  # the signal's handler raises (exit 130 or 143), not this error
            raise UsageError(f"--costs measured: ONNX Runtime could not run the training step "
                             f"({first_line(err)}); plan with --costs device (the --device profile's "
                             "estimates) instead") from None
        finally:
            ort.set_default_logger_severity(2)  # ORT's default (warnings)
        provider = session.get_providers()[0]
        per_node = read_ort_profile(session.end_profiling(), statistic="median")
    return map_to_graph(graph, per_node, f"measured on {provider}")
