"""Built-in model zoo: ONNX forward models ending in a scalar loss, seeded weights.

``zoo:NAME?key=value&...`` names a model and its options (see :func:`parse_spec`). Every model takes
``size`` (``small``: tiny, for tests; ``large``: 64-400 MiB of forward activations, for calibration),
``batch`` and ``seed``, plus its own sizes (``ZOO[name].option_names``). Every model has graph inputs
``x`` (float32 images/features, or int64 token ids for gpt) and ``labels`` (int64), and the scalar
float32 ``loss`` as its first output. Models use opset 17 (gpt with ``gelu=op``: 20) and IR version
10, so onnxruntime 1.31 loads them; the option set they were built with is in the metadata entry
``memplan.zoo.spec``.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

import onnx

from models import cnn, gpt, mlp, resnet, unet
from models._registry import OptionValue, ZooModel, format_spec
from models._registry import parse_spec as _parse_spec
from models.feeds import example_feeds
from planner.errors import UsageError

#: name -> builder; ``ZOO["gpt"](batch=8, layers=4)`` builds a model.
ZOO: Mapping[str, ZooModel] = MappingProxyType(
    {m.MODEL.name: m.MODEL for m in (cnn, gpt, mlp, resnet, unet)}
)


def build(name: str, **options: OptionValue) -> onnx.ModelProto:
    """Build zoo model ``name``; UsageError names an unknown model, option or bad value."""
    if name not in ZOO:
        raise UsageError(f"unknown zoo model {name!r}; choose one of: {', '.join(sorted(ZOO))}")
    return ZOO[name](**options)


def parse_spec(spec: str) -> tuple[str, dict[str, OptionValue]]:
    """``"zoo:gpt?batch=32&layers=4"`` -> ``("gpt", {"batch": 32, "layers": 4})``, validated."""
    return _parse_spec(spec, ZOO)


def load_spec(spec: str) -> onnx.ModelProto:
    """Parse a ``zoo:`` spec and build the model it names."""
    name, options = parse_spec(spec)
    return build(name, **options)


def with_dims(spec: str, dims: Mapping[str, int]) -> tuple[str, dict[str, int]]:
    """(``spec`` with the ``--dim`` values that name one of its model's int options moved into it,
    the other dims). A zoo model has no symbolic dims: ``zoo:gpt`` with ``--dim batch=32`` (or a
    check config's ``dims = { batch = 32 }``) is ``zoo:gpt?batch=32``, where before the dim was
    dropped with a warning and the model planned at its default batch. A dim the name sets to
    another value is refused."""
    name, options = parse_spec(spec)
    model, rest, moved = ZOO[name], {}, False
    for key, value in dims.items():
        if key == "size" or key not in model.option_names:
            rest[key] = value
            continue
        if key in options and options[key] != value:
            raise UsageError(f"{spec} sets {key}={options[key]} and a dim sets {key}={value}; keep one")
        options[key], moved = value, True
    return (format_spec(name, options) if moved else spec), rest


__all__ = ["ZOO", "ZooModel", "build", "example_feeds", "format_spec", "load_spec", "parse_spec", "with_dims"]
