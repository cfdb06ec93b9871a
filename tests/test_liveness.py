"""Liveness model: hand-built graphs with known answers, then ORT itself as the oracle."""
import numpy as np
import pytest

from passes.onnx_export import export_model
from passes.verify import measure_peak
from planner.graph import GraphBuilder
from planner.liveness import analyze

F = "float32"


def chain(ops, n=1024, shape_out=None):
    """x -> op0 -> op1 -> ... -> y; every tensor n floats."""
    b = GraphBuilder()
    prev = b.input("x", F, (n,))
    for i, op in enumerate(ops):
        (prev,) = b.node(op, [prev], [(f"t{i}", F, (n,))])
    b.output(prev)
    return b.build()


def test_chain_holds_two_buffers_and_base():
    g = chain(["Neg"] * 5)
    lv = analyze(g)
    assert lv.base_bytes == 4096
    assert lv.dynamic.tolist() == [4096, 8192, 8192, 8192, 8192]
    assert lv.peak_bytes == 4096 + 8192


def test_views_share_buffers_and_outputs_live_to_end():
    b = GraphBuilder()
    x = b.input("x", F, (256,))
    shape = b.initializer("shape", np.array([16, 16], np.int64))
    (a,) = b.node("Neg", [x], [("a", F, (256,))])
    (v,) = b.node("Reshape", [a, shape], [("v", F, (16, 16))])
    (c,) = b.node("Neg", [v], [("c", F, (16, 16))])
    (d,) = b.node("Neg", [c], [("d", F, (16, 16))])
    b.output(a)
    b.output(d)
    lv = analyze(b.build())
    assert lv.buffer_of[a] == lv.buffer_of[v]
    assert lv.free_step[lv.buffer_of[a]] == 3  # a is an output: resident to the end
    assert lv.dynamic.tolist() == [1024, 1024, 2048, 3072]


def test_unread_output_stays_to_end_and_where_scratch():
    b = GraphBuilder()
    x = b.input("x", F, (100,))
    cond = b.initializer("cond", np.array([True]))
    (a,) = b.node("Neg", [x], [("a", F, (100,))])
    b.node("Neg", [a], [("dead", F, (100,))])
    (w,) = b.node("Where", [cond, a, x], [("w", F, (100,))])
    (y,) = b.node("Neg", [w], [("y", F, (100,))])
    b.output(y)
    lv = analyze(b.build())
    # step 2: a, dead, w + Where's 2x scratch; step 3: dead, w, y
    assert lv.dynamic.tolist() == [400, 800, 400 * 3 + 800, 1200]
    assert lv.peak_step == 2


def test_custom_order_changes_peak():
    b = GraphBuilder()
    x = b.input("x", F, (10,))
    (big_a,) = b.node("Tile", [x], [("big_a", F, (1000,))])
    (a,) = b.node("ReduceSum", [big_a], [("a", F, (10,))])
    (big_b,) = b.node("Tile", [x], [("big_b", F, (1000,))])
    (c,) = b.node("ReduceSum", [big_b], [("c", F, (10,))])
    (y,) = b.node("Add", [a, c], [("y", F, (10,))])
    b.output(y)
    g = b.build()
    assert analyze(g).dynamic_peak == 4 * (1000 + 10 + 10)
    assert analyze(g, order=[0, 2, 1, 3, 4]).dynamic_peak == 4 * (1000 + 1000 + 10)
    with pytest.raises(Exception, match="before it is produced"):
        analyze(g, order=[1, 0, 2, 3, 4])


MiB = 2**20


def _diamond(n):
    """Fan-out, view, Where scratch and a dead branch: the behaviours the model claims."""
    b = GraphBuilder(opsets={"": 17})
    x = b.input("x", F, (n,))
    cond = b.initializer("cond", np.array([True]))
    shape = b.initializer("shape", np.array([n // 4, 4], np.int64), trainable=False)
    (a,) = b.node("Neg", [x], [("a", F, (n,))])
    (v,) = b.node("Reshape", [a, shape], [("v", F, (n // 4, 4))])
    (c,) = b.node("Sigmoid", [v], [("c", F, (n // 4, 4))])
    b.node("Neg", [c], [("dead", F, (n // 4, 4))])
    (w,) = b.node("Where", [cond, c, v], [("w", F, (n // 4, 4))])
    (r,) = b.node("Relu", [w], [("r", F, (n // 4, 4))])
    (y,) = b.node("Add", [r, v], [("y", F, (n // 4, 4))])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("make", [lambda: chain(["Relu", "Neg", "Tanh", "Add"][:3], n=2 * MiB), lambda: _diamond(2 * MiB)])
def test_predicted_peak_matches_ort(make):
    g = make()
    feeds = {"x": np.random.default_rng(0).standard_normal(g.tensors[g.inputs[0]].shape).astype(np.float32)}
    measured = measure_peak(export_model(g), feeds).peak_bytes
    predicted = analyze(g).dynamic_peak
    assert predicted == pytest.approx(measured, rel=0.03)
