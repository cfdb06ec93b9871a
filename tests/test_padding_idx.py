"""torch's ``nn.Embedding(padding_idx=k)`` gives row k no gradient; an ONNX Gather has no such
notion. A torch.export-based file says it in the FX record of the Gather (``aten.embedding(%w, %ids,
k)``), and memplan's training step then leaves that row out too (ConvBERT's pad id 1, read as an
ordinary token by the fixture inputs: worst gradient error 1.6 -> 8.7e-07 in the dynamo export).
The oracle is the same step without the record, whose other rows must be the same."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from passes import gradcheck
from passes.autodiff import build_training_graph
from passes.onnx_export import export_model
from passes.onnx_import import TORCH_FX_NODE, import_model
from planner.graph import PADDING_IDX

RNG = np.random.default_rng(3)
VALUES = {"emb.weight": RNG.standard_normal((5, 3)), "c": RNG.standard_normal((2, 4, 3))}
IDS = np.array([[1, 4, 1, 0], [2, 1, 3, 3]], np.int64)


def _embedding(record: str | None) -> onnx.ModelProto:
    """ids -> Gather(emb.weight) -> times a fixed tensor -> sum of squares, the Gather carrying the
    FX record ``record`` (None: none, as a TorchScript export)."""
    nodes = [helper.make_node("Gather", ["emb.weight", "ids"], ["h"], name="node_embedding"),
             helper.make_node("Mul", ["h", "c"], ["m"], name="node_mul"),
             helper.make_node("Mul", ["m", "m"], ["z"], name="node_sq"),
             helper.make_node("ReduceSum", ["z"], ["loss"], name="node_sum", keepdims=0)]
    if record is not None:
        entry = nodes[0].metadata_props.add()
        entry.key, entry.value = TORCH_FX_NODE, (
            f"%embedding : [num_users=1] = call_function[target=torch.ops.aten.embedding.default](args = {record}, "
            "kwargs = {})")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in VALUES.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _weight_grad(model: onnx.ModelProto) -> np.ndarray:
    step = build_training_graph(import_model(model))
    _, grads = gradcheck.run_training_step(step, {"ids": IDS})
    return grads["emb.weight"]


@pytest.mark.parametrize("pad", [1, 0])
def test_the_padding_row_of_a_torch_embedding_gets_no_gradient(pad):
    plain = _weight_grad(_embedding(None))
    got = _weight_grad(_embedding(f"(%p_emb_weight, %args_0, {pad})"))
    assert np.abs(plain[pad]).max() > 1e-2  # the row is read, so it would get one
    np.testing.assert_array_equal(got[pad], 0.0)
    others = [r for r in range(5) if r != pad]
    np.testing.assert_allclose(got[others], plain[others], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("record", [None, "(%p_emb_weight, %args_0)", "(%p_emb_weight, %args_0, -1)"])
def test_an_embedding_without_a_padding_row_trains_every_row(record):
    """No record (TorchScript), no padding_idx, or torch's -1 for none: every row read gets its
    gradient."""
    got = _weight_grad(_embedding(record))
    assert np.abs(got[[0, 1, 2, 3, 4]]).min(axis=1).max() > 1e-2
    assert all(np.abs(got[r]).max() > 1e-3 for r in range(5))


def test_the_padding_note_is_memplans_own_and_not_written_to_onnx():
    graph = import_model(_embedding("(%p_emb_weight, %args_0, 1)"))
    gather = next(n for n in graph.nodes if n.op_type == "Gather")
    assert gather.attr(PADDING_IDX) == 1
    proto = export_model(build_training_graph(graph).graph)
    onnx.checker.check_model(proto, full_check=True)
    assert not [a.name for n in proto.graph.node for a in n.attribute if a.name.startswith("memplan")]
