"""The liveness model's forward peak against ORT's measured peak, on every zoo model."""
import pytest

import models
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from passes.verify import measure_peak
from planner.liveness import analyze

# Sizes whose dynamic peak is a few MiB: large enough for VmHWM, small enough for CI.
SPECS = {
    "mlp": "zoo:mlp?batch=4096&hidden=512",
    "cnn": "zoo:cnn?batch=64",
    "resnet": "zoo:resnet?batch=64",
    "unet": "zoo:unet?batch=32",
    "gpt": "zoo:gpt?batch=16&seq=64&vocab=2048",
}


def test_every_zoo_model_is_covered():
    assert set(SPECS) == set(models.ZOO)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_forward_peak_within_5_percent(name):
    graph = import_model(SPECS[name])
    predicted = analyze(graph).dynamic_peak
    assert predicted >= 2 * 2**20, "test size too small to measure"
    model = export_model(graph)
    measured = measure_peak(model, models.example_feeds(model, seed=0)).peak_bytes
    assert measured == pytest.approx(predicted, rel=0.05)
