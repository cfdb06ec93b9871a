"""ONNX Runtime's refusals, said as memplan's one-line errors.

The one a user can act on is a missing kernel: ORT's CPU provider has no bfloat16 kernel for most
ops (and no float16 one for some), and says so with "Could not find an implementation for
Relu(14) node with name 'Relu_2'". memplan says which op, on which provider, and what to do.
"""
from __future__ import annotations

import re

from planner.errors import PlannerError

_MISSING = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")


class MissingKernelError(PlannerError):
    """The execution provider has no kernel for an op of the model (with its element types)."""


def missing_kernel(text: str, provider: str, advice: str) -> MissingKernelError | None:
    """The error for ORT's message ``text`` when it is a missing kernel, else None."""
    m = _MISSING.search(text)
    if m is None:
        return None
    op, version, node = m.groups()
    return MissingKernelError(
        f"ONNX Runtime's {provider} has no kernel for {op} (opset {version}, node {node!r}) with this model's "
        f"element types (bfloat16 has almost none on the CPU); {advice}")
