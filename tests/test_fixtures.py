"""The committed ONNX fixtures (tests/fixtures) are sound: valid ONNX, run in ORT CPU, and their
stored torch loss and gradients agree with what ORT computes from the same file.

Regenerate them with tests/fixtures/make_fixtures.py (needs torch; these tests do not).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: name -> (opset, symbolic dims of the graph inputs, BatchNormalization exported in training mode)
EXPECTED = {
    "resnet": (17, {"batch"}, True),
    "mobilenetv2": (18, {"batch"}, False),
    "efficientnet": (18, {"batch"}, False),
    "vgg": (17, {"batch"}, True),
    "gpt2": (18, {"batch", "seq"}, False),
    "bert": (17, {"batch", "seq"}, False),
    "vit": (18, {"batch"}, False),
    "moe": (17, {"batch", "seq"}, False),
    "lstm": (17, {"batch", "seq"}, False),
    "llama": (18, {"batch", "seq"}, False),
    # gpt2 exported by torch's dynamo exporter (torch.export metadata, a folded tied copy)
    "gpt2_dynamo": (20, {"batch", "seq"}, False),
    # a hand-written decoder exported by the dynamo exporter at opset 23 (Attention, RMSNormalization)
    "decoder23": (23, {"batch", "seq"}, False),
}
MAX_IR_VERSION = 10


def _load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = onnx.load(str(FIXTURES / f"{name}.onnx"))
    with np.load(FIXTURES / f"{name}.npz") as data:
        record = {key: data[key] for key in data.files}
    return model, record


def _section(record: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in record.items() if k.startswith(prefix)}


def _loss(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (loss,) = session.run(["loss"], feeds)
    assert loss.shape == ()
    return float(loss)


def _input_dims(model: onnx.ModelProto) -> dict[str, list]:
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input}


def test_every_fixture_is_listed():
    assert sorted(p.stem for p in FIXTURES.glob("*.onnx")) == sorted(EXPECTED)
    assert sorted(p.stem for p in FIXTURES.glob("*.npz")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_valid_onnx_with_expected_header(name):
    model, _ = _load(name)
    onnx.checker.check_model(model, full_check=True)
    opset, symbolic, bn_train = EXPECTED[name]
    assert model.ir_version <= MAX_IR_VERSION
    assert {o.domain: o.version for o in model.opset_import} == {"": opset}
    assert [o.name for o in model.graph.output] == ["loss"]
    found = {d for dims in _input_dims(model).values() for d in dims if isinstance(d, str)}
    assert found == symbolic
    modes = [onnx.helper.get_node_attr_value(n, "training_mode") if any(
        a.name == "training_mode" for a in n.attribute) else 0
        for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert modes == [int(bn_train)] * len(modes)
    if bn_train:
        assert modes


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_record_matches_graph(name):
    """Inputs, dims and gradients in the npz line up with the graph's inputs and initializers."""
    model, record = _load(name)
    inputs = _section(record, "input:")
    assert sorted(inputs) == sorted(i.name for i in model.graph.input)
    dims = {k: int(v) for k, v in _section(record, "dim:").items()}
    assert set(dims) == EXPECTED[name][1]
    for key, shape in _input_dims(model).items():
        bound = [dims[d] if isinstance(d, str) else d for d in shape]
        assert list(inputs[key].shape) == bound, key
    inits = {t.name: t for t in model.graph.initializer}
    grads = _section(record, "grad:")
    assert grads and sorted(grads) == sorted(_section(record, "map:"))
    for key, grad in grads.items():
        assert key in inits, key
        assert inits[key].data_type == onnx.TensorProto.FLOAT
        assert grad.dtype == np.float32 and tuple(grad.shape) == tuple(inits[key].dims), key
        assert np.isfinite(grad).all()
    assert record["unmapped"].size == 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ort_loss_matches_torch(name):
    model, record = _load(name)
    loss = _loss(model, _section(record, "input:"))
    assert loss == pytest.approx(float(record["loss"]), rel=1e-4)


def _folded_copies(model: onnx.ModelProto, keys: list[str]) -> dict[str, list[str]]:
    """Initializer -> the float initializers without a gradient that hold it transposed: the
    dynamo exporter's folded copy of a tied weight (gpt2_dynamo's LM head reads ``val_NNN`` =
    wte.T). A run that moves the weight moves its copies too; the other fixtures have none."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
              if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    return {key: [name for name, value in values.items() if name not in keys and key in values
                  and np.array_equal(value, values[key].T)] for key in keys}


def _feedable(model: onnx.ModelProto, names: list[str]) -> ort.InferenceSession:
    """A session where the named initializers are also graph inputs, so runs can override them."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    for name in names:
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shapes[name]))
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT warns once per initializer that is also an input
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_stored_gradients_match_ort_finite_differences(name):
    """Per initializer, ORT's central difference along the stored gradient g equals |g|.

    The step moves the loss by about 1e-4 (float32 loss error ~1e-6, so ~2% noise) and is capped
    at 5% of the initializer's norm, which covers gradients that are exactly zero in theory (a
    conv bias before a training-mode BN, an attention key bias): there only the noise bound
    applies. Measured worst case 3.2% (BN nets with ReLU kinks); a gradient keyed to the wrong
    initializer, transposed, or missing a tied use is off by 50% or more. A folded copy of a tied
    weight (gpt2_dynamo) moves with it, transposed.
    """
    model, record = _load(name)
    feeds = _section(record, "input:")
    grads = _section(record, "grad:")
    copies = _folded_copies(model, sorted(grads))
    session = _feedable(model, sorted(grads) + sorted(c for cs in copies.values() for c in cs))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    noise = 2e-6  # absolute loss error allowed per evaluation
    for key in sorted(grads):
        grad = grads[key].astype(np.float64)
        norm = float(np.linalg.norm(grad))
        direction = grad / norm if norm > 0 else np.full(grad.shape, grad.size ** -0.5)
        step = min(1e-4 / max(norm, 1e-12), 0.05 * float(np.linalg.norm(values[key])))
        ends = []
        for sign in (1.0, -1.0):
            moved = values[key] + sign * step * direction
            moved = moved.astype(np.float32)
            tied = {copy: moved.T for copy in copies[key]}
            (loss,) = session.run(["loss"], {**feeds, key: moved, **tied})
            ends.append(float(loss))
        slope = (ends[0] - ends[1]) / (2 * step)
        assert abs(slope - norm) <= 0.1 * norm + noise / step, (key, slope, norm)


def test_folded_copy_only_in_the_dynamo_export():
    """gpt2_dynamo's one folded copy is of the tied wte (stored as ``model.lm_head.weight``),
    which the npz maps to torch's canonical name; the TorchScript fixtures have no copies."""
    found = {}
    for name in sorted(EXPECTED):
        model, record = _load(name)
        found.update({(name, k): v for k, v in _folded_copies(model, sorted(_section(record, "grad:"))).items() if v})
    assert list(found) == [("gpt2_dynamo", "model.lm_head.weight")]
    assert len(found["gpt2_dynamo", "model.lm_head.weight"]) == 1
    _, record = _load("gpt2_dynamo")
    assert str(record["map:model.lm_head.weight"]) == "model.transformer.wte.weight"


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if e[1]))
def test_symbolic_dims_take_other_sizes(name):
    """The dynamic fixtures run at batch 3 (and seq 8): their dims are really symbolic."""
    model, record = _load(name)
    feeds = {}
    for key, arr in _section(record, "input:").items():
        shape = _input_dims(model)[key]
        arr = np.concatenate([arr, arr[:1]], axis=0) if shape[0] == "batch" else arr
        feeds[key] = arr[:, :8] if len(shape) > 1 and shape[1] == "seq" else arr
    loss = _loss(model, feeds)
    assert np.isfinite(loss) and loss > 0
