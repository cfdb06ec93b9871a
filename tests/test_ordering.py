"""Ordering edges (passes/ordering.py): values unchanged, and ORT keeps them at every optimisation level."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from passes.onnx_export import export_model
from passes.ordering import OrderingEdges, constant_shape_input, dynamic_nodes
from planner.graph import GraphBuilder

F = "float32"
LEVELS = ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"]


def gated_model(gated_op: str):
    """x -> A = Sigmoid(x); B = gated_op(x) gated after A (B does not read A); Y = A + B.

    ``Reshape``: B's constant target shape is gated. ``Exp``: B reads x through a view.
    """
    b = GraphBuilder()
    x = b.input("x", F, (4, 4))
    flat = b.initializer("flat", np.array([4, 4], np.int64), trainable=False)
    edges = OrderingEdges(b, {"x", "flat", "a", "bx", "y", "A", "B", "Y"})
    (a,) = b.node("Sigmoid", [x], [("a", F, (4, 4))], name="A")
    inputs = [x, flat] if gated_op == "Reshape" else [x]
    shape = (1, (4, 4)) if gated_op == "Reshape" else None
    inputs = edges.route(inputs, a, "B__order", shape)
    (bx,) = b.node(gated_op, inputs, [("bx", F, (4, 4))], name="B")
    (y,) = b.node("Add", [a, bx], [("y", F, (4, 4))], name="Y")
    b.output(y)
    return b.build()


def optimized(model: onnx.ModelProto, level: str, path) -> onnx.ModelProto:
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.optimized_model_filepath = str(path)
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


def ancestors(model: onnx.ModelProto, tensor: str) -> set[str]:
    producer = {o: n for n in model.graph.node for o in n.output}
    seen, stack = set(), [tensor]
    while stack:
        t = stack.pop()
        if t not in seen and t in producer:
            seen.add(t)
            stack.extend(i for i in producer[t].input if i)
    return seen


@pytest.mark.parametrize("gated_op", ["Reshape", "Exp"])
def test_edge_keeps_values_and_survives_every_optimisation_level(gated_op, tmp_path):
    g = gated_model(gated_op)
    b_node = next(n for n in g.nodes if n.name == "B")
    if gated_op == "Reshape":  # gated through its target shape: no view a fusion could remove
        assert g.tensors[b_node.inputs[0]].name == "x"
        assert g.nodes[g.tensors[b_node.inputs[1]].producer].op_type == "Add"
    else:
        assert g.nodes[g.tensors[b_node.inputs[0]].producer].op_type == "Reshape"
    model = export_model(g)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    want = 1 / (1 + np.exp(-x)) + (x if gated_op == "Reshape" else np.exp(x))
    for level in LEVELS:
        opt = optimized(model, level, tmp_path / f"{level}.onnx")
        # "a" still comes before whatever now computes Y's B-side input
        y_producer = next(n for n in opt.graph.node if "y" in n.output)
        b_side = [i for i in y_producer.input if i != "a"]
        assert b_side and all("a" in ancestors(opt, i) for i in b_side), level
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        got = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_a_scalar_read_after_a_gate_keeps_the_edge_at_every_level(dtype, tmp_path):
    """A scalar's view had an empty target shape, which ORT folds whatever the gate (a pinned Adam
    step's counter ran first under ORT's defaults: 1.49x its plan; fuzzed, stop 49). A scalar is
    read through a copy plus Size(gate) * 0 instead: the edge survives, the value is unchanged."""
    b = GraphBuilder()
    x = b.input("x", F, (4, 4))
    s = b.input("s", dtype, ())
    edges = OrderingEdges(b, {"x", "s", "a", "t", "y", "A", "T", "Y"})
    (a,) = b.node("Sigmoid", [x], [("a", F, (4, 4))], name="A")
    # read as a pinned model reads a graph input: hidden behind the first input, then pinned after A
    (read,) = edges.route(edges.route([s], x, "T__hide"), a, "T__order")
    (t,) = b.node("Cast", [read], [("t", F, ())], name="T", attrs={"to": onnx.TensorProto.FLOAT})
    (y,) = b.node("Add", [a, t], [("y", F, (4, 4))], name="Y")
    b.output(y)
    model = export_model(b.build())
    xv = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    sv = np.asarray(True) if dtype == "bool" else np.asarray(3, dtype=dtype)
    for level in LEVELS:
        opt = optimized(model, level, tmp_path / f"{level}.onnx")
        y_producer = next(n for n in opt.graph.node if "y" in n.output)
        s_side = [i for i in y_producer.input if i != "a"]  # t, or what computes it once ORT is done
        assert s_side and all("a" in ancestors(opt, i) for i in s_side), level
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        got = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, {"x": xv, "s": sv})[0]
        np.testing.assert_allclose(got, 1 / (1 + np.exp(-xv)) + float(sv), rtol=1e-6)


def test_zeros_and_targets_are_shared_per_gate():
    b = GraphBuilder()
    x = b.input("x", F, (2, 3))
    edges = OrderingEdges(b, {"x"})
    (a,) = b.node("Neg", [x], [("a", F, (2, 3))], name="A")
    v1 = edges.view(x, a, "e1")
    v2 = edges.view(x, a, "e2")
    s1 = edges.gated_shape(a, (3, 2), "e3")
    s2 = edges.gated_shape(a, (3, 2), "e4")
    (y,) = b.node("Add", [v1, v2], [("y", F, (2, 3))], name="Y")
    b.output(y)
    b.output(s1)
    g = b.build()
    ops = [n.op_type for n in g.nodes]
    # one Size per gate, one Mul per zero shape (vector for views, scalar for targets), one Add per
    # (gate, target) and one Reshape per view
    assert ops.count("Size") == 1 and ops.count("Mul") == 2 and ops.count("Add") == 2 and ops.count("Reshape") == 2
    assert s1 == s2


def test_dynamic_nodes_and_constant_shape_input():
    b = GraphBuilder()
    x = b.input("x", F, (2, 3))
    fed = b.input("fed", "int64", (2,))
    shape = b.initializer("shape", np.array([3, 2], np.int64), trainable=False)
    w = b.initializer("w", np.ones((2, 3), np.float32))
    (c,) = b.node("Neg", [w], [("c", F, (2, 3))], name="C")  # constants only
    (d,) = b.node("Add", [x, c], [("d", F, (2, 3))], name="D")
    (r,) = b.node("Reshape", [d, shape], [("r", F, (3, 2))], name="R")
    (e,) = b.node("Reshape", [r, fed], [("e", F, (3, 2))], name="E")  # target not a constant
    b.output(e)
    g = b.build()
    assert dynamic_nodes(g) == [False, True, True, True]
    assert constant_shape_input(g, g.nodes[2]) == (1, (3, 2))
    assert constant_shape_input(g, g.nodes[3]) is None and constant_shape_input(g, g.nodes[1]) is None


def test_a_scalar_and_a_one_element_vector_of_zeros_are_distinct_constants():
    # both hold the single value 0: one constant for both gave the scalar's Size(G) * 0 a shape
    # [1] (or a 1-D view's target a scalar), and ORT rejects the model
    b = GraphBuilder()
    x = b.input("x", F, (4,))
    s = b.input("s", F, ())
    edges = OrderingEdges(b, {"x", "s", "a", "v", "w", "y", "z"})
    (a,) = b.node("Sigmoid", [x], [("a", F, (4,))])
    (v,) = edges.route([x], a, "v__order")  # a rank-1 view: target zeros of shape [1]
    (w,) = edges.route([s], a, "w__order")  # a scalar: Size(a) * 0 as a scalar
    (y,) = b.node("Add", [a, v], [("y", F, (4,))])
    (z,) = b.node("Neg", [w], [("z", F, ())])
    b.output(y)
    b.output(z)
    g = b.build()
    consts = [t for t in g.tensors if t.name.startswith("memplan__order_const")]
    assert sorted(g.values[t.id].shape for t in consts) == [(), (1,)]
    sess = ort.InferenceSession(export_model(g).SerializeToString(), providers=["CPUExecutionProvider"])
    xv, sv = np.arange(4, dtype=np.float32), np.array(2.5, np.float32)
    got_y, got_z = sess.run(None, {"x": xv, "s": sv})
    np.testing.assert_allclose(got_y, 1 / (1 + np.exp(-xv)) + xv, rtol=1e-6)
    assert got_z.shape == () and got_z == -2.5
