"""Small shared helpers for tests: inline ONNX text -> ModelProto."""
from __future__ import annotations

import onnx
import onnx.parser


def parse_model(text: str, ir_version: int = 8) -> onnx.ModelProto:
    """Parse ONNX textual syntax (onnx.parser) into a ModelProto ORT can load."""
    model = onnx.parser.parse_model(text)
    model.ir_version = ir_version
    return model
