"""Importing the torch-exported fixtures: shapes static, shape subgraphs folded, semantics kept."""
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from passes.onnx_export import check_model, export_model
from passes.onnx_import import import_model
from planner.liveness import analyze

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.onnx"))


def fixture(name):
    z = np.load(FIXTURES / f"{name}.npz")
    dims = {k[4:]: int(z[k]) for k in z.files if k.startswith("dim:")}
    feeds = {k[6:]: z[k] for k in z.files if k.startswith("input:")}
    return dims, feeds, float(z["loss"])


def test_all_twelve_fixtures_present():
    assert NAMES == ["bert", "decoder23", "efficientnet", "gpt2", "gpt2_dynamo", "llama", "lstm", "mobilenetv2",
                     "moe", "resnet", "vgg", "vit"]


@pytest.mark.parametrize("name", NAMES)
def test_import_keeps_semantics(name):
    dims, feeds, torch_loss = fixture(name)
    graph = import_model(FIXTURES / f"{name}.onnx", dims)
    assert all(n.op_type not in ("Shape", "Size", "ConstantOfShape", "Range") for n in graph.nodes), \
        "shape subgraphs should be folded once dims are bound"
    lv = analyze(graph)
    assert lv.peak_bytes > lv.base_bytes > 0
    model = export_model(graph)
    check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (loss,) = sess.run(["loss"], feeds)
    assert float(loss) == pytest.approx(torch_loss, rel=1e-4)
