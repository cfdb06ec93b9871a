"""planner/lowering.py: the lowered problem's own accounting against the model's (liveness.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from passes import alloc_counter
from passes.autodiff import training_graph
from passes.onnx_import import import_model
from passes.verify import ALLOCATOR, measure_peak
from planner.baselines import no_remat
from planner.liveness import analyze
from planner.lowering import lower
from planner.plan import Event, Plan
from planner.simulate import simulate
from tests.helpers import parse_model

# e dies at the ReduceSum; the Reshape copies the sum into the graph output y (a view into a
# graph output is a buffer of its own, allocated when the Reshape runs, liveness.py)
SUM_INTO_OUTPUT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 64] x) => (float[64] y)
<int64[1] axes = {0}, int64[1] shape = {64}>
{
  e = Exp(x)
  s = ReduceSum<keepdims = 1>(e, axes)
  y = Reshape(s, shape)
}
"""


def _lowered_at_the_models_peak(text: str, dynamic: int):
    """The model of ONNX ``text``, its liveness, problem and lowering, where the model peaks at its
    base + ``dynamic`` bytes and the problem, unplanned, peaks there too."""
    graph = import_model(parse_model(text))
    lv = analyze(graph)
    assert lv.peak_bytes == graph.base_bytes + dynamic
    problem, lowering = lower(graph)
    assert problem.unplanned_peak == lv.peak_bytes
    assert simulate(problem, no_remat(problem)).peak_bytes == lv.peak_bytes
    return graph, lv, problem, lowering


def test_a_view_copied_into_a_graph_output_is_counted_when_it_runs():
    """A ReduceSum and the Reshape copying its sum into a graph output were one problem node: the
    copy was counted at the ReduceSum's step, with the input that dies there (16 KiB + two
    256-byte buffers, where ORT never holds more than 16 KiB + one)."""
    graph, lv, problem, lowering = _lowered_at_the_models_peak(SUM_INTO_OUTPUT, 64 * 64 * 4 + 256)
    # the Reshape is a problem node of its own, holding the graph output
    (k,) = [i for i, grp in enumerate(lowering.groups) if [graph.nodes[n].op_type for n in grp] == ["Reshape"]]
    assert problem.pinned[k] and problem.size[k] == 256


def test_the_mlp_training_steps_problem_peaks_at_the_models_own_peak():
    """zoo:mlp's bias gradients are each a ReduceSum and a Reshape into the graph output: the
    problem's unplanned peak was 348032 bytes, the model's 347520."""
    graph = training_graph(import_model("zoo:mlp"))
    lv = analyze(graph)
    problem, lowering = lower(graph)
    assert problem.unplanned_peak == lv.peak_bytes == 347520
    # and step by step: each problem node made of consecutive graph nodes holds what ORT holds there
    step_of = {n: s for s, n in enumerate(lv.order)}
    for i, grp in enumerate(lowering.groups):
        steps = [step_of[n] for n in grp]
        if steps and steps == list(range(steps[0], steps[0] + len(steps))):
            assert int(problem.unplanned_memory[i]) == int(np.max(lv.memory[steps])), problem.names[i]


def test_a_node_making_only_a_small_unread_output_holds_it_from_its_own_step():
    """zoo:cnn --forward: each batch-norm statistic nobody reads gets a 1-element sink Slice, whose
    64-byte output nobody reads either; under 0.1% of the peak, it was counted in the constant
    base from the start, and the problem peaked 256 bytes over the model at its first Conv, before
    any sink runs. Such a node now holds its output itself, pinned, from its step on."""
    import cli

    graph, _ = cli._graph_to_plan("zoo:cnn?batch=1", {}, True)
    lv = analyze(graph)
    problem, lowering = lower(graph)
    assert problem.unplanned_peak == lv.peak_bytes == 157496
    assert lowering.dangling_bytes == 0 and problem.base_bytes == graph.base_bytes + lv.output_copy_bytes
    sinks = [i for i, n in enumerate(problem.names) if n.endswith("__sink")]
    assert len(sinks) == 4 and all(problem.pinned[sinks]) and not any(problem.swappable[sinks])
    assert list(problem.size[sinks]) == [64] * 4
    assert problem.memory_floor <= lv.peak_bytes
    assert simulate(problem, no_remat(problem)).peak_bytes == lv.peak_bytes


# each op after the Concat runs in place (liveness.py): ORT keeps the chain in one 16 KiB buffer
IN_PLACE_CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[32, 64] x, float[32, 64] z) => (float[64] y)
<int64[1] axes = {0}>
{
  c = Concat<axis = 0>(x, z)
  s1 = Softmax(c)
  s2 = Softmax(s1)
  r1 = Relu(s2)
  r2 = Relu(r1)
  y = ReduceSum<keepdims = 0>(r2, axes)
}
"""

# the Relu does not run right after the Add (the Mul between), so it takes over a's buffer only
# where it reads it last (PlanningProblem.takes_over); the Sigmoid runs in place on the Relu's
IN_PLACE_CHAIN_APART = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[64, 64] x, float[64, 64] z) => (float[64] y, float[64, 64] w)
<int64[1] axes = {0}>
{
  a = Add(x, z)
  w = Mul(x, z)
  r = Relu(a)
  s = Sigmoid(r)
  y = ReduceSum<keepdims = 0>(s, axes)
}
"""


def test_an_in_place_chain_of_any_length_is_one_buffer():
    """Concat -> Softmax -> Softmax -> Relu -> Relu was lowered as pairs (Concat, Softmax),
    (Softmax, Relu), (Relu), each a buffer of its own: the problem peaked at 49160 bytes where
    the model (and ORT, passes/verify.measure_peak: 16640 dynamic bytes) holds 33032."""
    graph, lv, problem, lowering = _lowered_at_the_models_peak(IN_PLACE_CHAIN, 64 * 64 * 4 + 256)
    assert problem.memory_floor <= lv.peak_bytes
    (k,) = [i for i, grp in enumerate(lowering.groups) if len(grp) > 1]
    assert [graph.nodes[n].op_type for n in lowering.groups[k]] == ["Concat", "Softmax", "Softmax", "Relu", "Relu"]
    assert problem.size[k] == 64 * 64 * 4 and lowering.buffers[k] == (graph.by_name["r2"],)


def test_an_in_place_chain_apart_from_its_input_takes_the_input_over():
    """Add, Mul, Relu(Add), Sigmoid(Relu): the (Relu, Sigmoid) group was never credited with the
    Add's buffer its Relu takes over (a group with an in-place member was skipped), and the problem
    peaked at 81928 bytes, the model (and ORT: 33024 dynamic bytes) at 65800."""
    graph = import_model(parse_model(IN_PLACE_CHAIN_APART))
    lv = analyze(graph)
    problem, lowering = lower(graph)
    assert problem.unplanned_peak == lv.peak_bytes
    assert simulate(problem, no_remat(problem)).peak_bytes == lv.peak_bytes
    assert problem.memory_floor <= lv.peak_bytes
    ops = [[graph.nodes[n].op_type for n in grp] for grp in lowering.groups]
    assert problem.takes_over[ops.index(["Relu", "Sigmoid"])] == ops.index(["Add"])


# the MaxPool's Y dies at the Neg, its Indices only at the Mul, after the Exp of x: ORT frees
# each output after its own last reader
OUTPUTS_APART = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 16, 16] x) => (float[1, 4, 8, 8] y2, int64[1, 4, 8, 8] i2)
{
  y, i = MaxPool<kernel_shape = [2, 2], strides = [2, 2]>(x)
  y2 = Neg(y)
  z = Exp(x)
  w = Neg(z)
  i2 = Mul(i, i)
}
"""


def test_a_nodes_outputs_are_each_freed_after_their_own_last_reader():
    """The MaxPool's Y (1 KiB) and Indices (2 KiB) were one problem buffer, held until the Indices'
    last read: the problem peaked at 16384 bytes, the model (and ORT: 11264 dynamic bytes) at
    15360. The solvers still count them as one buffer; simulate() and the unplanned peak do not."""
    graph, lv, problem, _ = _lowered_at_the_models_peak(OUTPUTS_APART, 11264)
    (k,) = [i for i, ps in enumerate(problem.parts) if ps]
    assert sorted(b for b, _ in problem.parts[k]) == [1024, 2048]
    assert problem.one_buffer_peak == lv.peak_bytes + 1024
    assert problem.order_free_floor <= problem.memory_floor <= lv.peak_bytes
    # the MaxPool made again for the Mul (a recompute, or a swap-in: simulate()'s walk) holds a Y
    # nobody reads then only while it runs: at the Mul, the base (4096), y2 (1024), w (4096), the
    # Indices (2048) and i2 (2048); counted as one buffer, 1024 bytes more
    mul = max(problem.succ_lists[k])
    cases = [(problem, ("compute", k), ("free", k)),
             (problem.with_swap([1.0] * problem.n), ("swap_in", k), ("swap_out", k))]
    for q, make, drop in cases:
        events = [(e.op, e.node) for e in no_remat(q).events]
        events.remove(("free", k))
        events.insert(events.index(("compute", k + 1)) + 1, drop)  # after the Neg, Y's reader
        events.insert(events.index(("compute", mul)), make)
        events.append(("free", k))
        sim = simulate(q, Plan(tuple(Event(op, v) for op, v in events), "again"))
        assert sim.peak_bytes == 13312 and sim.memory[events.index(("compute", mul))] == 13312


@pytest.mark.skipif(alloc_counter.library() is None, reason="no C compiler to build the counter")
def test_ort_frees_a_nodes_outputs_each_after_its_own_last_reader():
    """What ORT allocates for OUTPUTS_APART (passes/verify.measure_peak): the problem's peak."""
    model = parse_model(OUTPUTS_APART)
    graph = import_model(model)
    problem, _ = lower(graph)
    measured = measure_peak(model, {"x": np.ones((1, 4, 16, 16), np.float32)}, repeats=1)
    assert measured.method == ALLOCATOR
    assert problem.unplanned_peak == graph.base_bytes + measured.peak_bytes


def test_the_cnns_problem_peaks_at_the_models_own_peak():
    """zoo:cnn's MaxPool Y was held until its Indices' last read: the problem's unplanned peak was
    792708 bytes, the model's 776324."""
    graph = training_graph(import_model("zoo:cnn"))
    lv = analyze(graph)
    problem, _ = lower(graph)
    assert problem.unplanned_peak == simulate(problem, no_remat(problem)).peak_bytes == lv.peak_bytes == 776324
    assert problem.one_buffer_peak == 792708


# the Reshape shares the MaxPool's Y (a view) but is a problem node of its own, its shape computed
# (a planned file's ordering edge, passes/ordering.py, read as ORT runs it); the Neg reads Y through it
VIEW_OF_A_PART = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4, 16, 16] x) => (float[1, 4, 8, 8] y2, int64[1, 4, 8, 8] i2)
<int64[4] zeros = {0, 0, 0, 0}>
{
  y, i = MaxPool<kernel_shape = [2, 2], strides = [2, 2]>(x)
  n = Size(y)
  s = Mul(n, zeros)
  r = Reshape(y, s)
  z = Exp(x)
  w = Neg(z)
  y2 = Neg(r)
  i2 = Mul(i, i)
}
"""


def test_a_reader_through_a_view_of_its_own_reads_the_buffer_it_shares():
    """ORT holds the MaxPool's Y until the Neg reading it through the Reshape. The Neg was named a
    reader of Y's part without reading the MaxPool in the problem, and build() refused the problem
    (replanning fuzz_e2e --ops multi seed 401's emitted model: "parts of node 41: ... readers must
    read node 41"); the MaxPool is the Neg's input too, and the problem peaks at the model's peak."""
    model = parse_model(VIEW_OF_A_PART)
    model.graph.value_info.append(onnx.helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [1, 4, 8, 8]))
    graph = import_model(model, fold=False)
    lv = analyze(graph)
    problem, lowering = lower(graph)
    assert problem.unplanned_peak == lv.peak_bytes
    ops = [[graph.nodes[n].op_type for n in grp] for grp in lowering.groups]
    pool, neg = ops.index(["MaxPool"]), ops.index(["Neg"], ops.index(["Neg"]) + 1)
    assert pool in problem.pred_lists[neg]
    assert (1024, (ops.index(["Size"]), ops.index(["Reshape"]), neg)) in problem.parts[pool]


# a training BatchNormalization whose running statistics the Sum reads
RUNNING_MEAN_READ = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[4, 3, 8] x) => (float[4, 3, 8] y2)
<float[3] scale = {1, 1, 1}, float[3] shift = {0, 0, 0}, float[3] mean = {0, 0, 0}, float[3] var = {1, 1, 1},
 int64[2] axes = {0, 2}>
{
  y, m, v = BatchNormalization<training_mode = 1>(x, scale, shift, mean, var)
  e = Exp(y)
  s = Unsqueeze(m, axes)
  u = Unsqueeze(v, axes)
  y2 = Sum(e, s, u)
}
"""


def test_a_batchnorm_that_moves_its_running_statistics_is_never_recomputed():
    """ORT writes the running statistics into the buffers it reads them from: a second run of the
    node reads them moved (and a session's outputs drift apart from its second run on)."""
    graph = import_model(parse_model(RUNNING_MEAN_READ))
    problem, lowering = lower(graph)
    heads = [graph.nodes[grp[0]].op_type if grp else None for grp in lowering.groups]
    assert not problem.recomputable[heads.index("BatchNormalization")]
    assert problem.recomputable[heads.index("Exp")]
