"""Switch ONNX Runtime's memory pattern off from inside a model file.

Pre: an ONNX ModelProto. Post: a copy with one more graph input, ``MEM_PATTERN_OFF_INPUT`` of type
optional(tensor(float)), that no node reads and no caller feeds; IR version at least 8 (the first
with optional types). Every ORT session that loads the copy runs without a memory pattern, whatever
its session options say; nothing else about the model changes.

Why: under ORT's default session options the CPU arena and the memory pattern are on. The first run
allocates every tensor from the BFC arena, which grows by regions of 1, 2, 4, 8 ... MiB and keeps them;
it also traces the allocations, and from the second run on ORT takes one block of the traced peak from
the arena. The largest region the first run left is about half of what the regions hold, so the block
rarely fits: the arena adds a region twice as large and the process holds both (when one fits, the
block still lands on pages the first run never touched). Pinned plans at 70% peak at 1.9-2.6x their
plan that way (zoo:gpt?batch=64 2.2x, zoo:resnet?batch=32 1.9x, zoo:unet?batch=8 2.6x); without the
pattern, the arena still on, 0.97x, 1.23x and 1.33x (bench/results/ort_default_options_arena.md).

How: ORT turns the pattern off for a session when a graph input is not a tensor
(``SessionState::ResolveMemoryPatternFlag``), and it runs a model with no feed for an input of
optional type. ``enable_mem_pattern=False`` in the session options does the same from the caller's side.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

#: The marker input's name (passes/onnx_import.py drops it: it carries no data).
MEM_PATTERN_OFF_INPUT = "memplan_mem_pattern_off"
#: ONNX IR version that added optional types.
OPTIONAL_TYPE_IR = 8


def mark_mem_pattern_off(model: onnx.ModelProto) -> None:
    """Add the marker input to ``model`` in place (once; see the module docstring)."""
    if any(i.name == MEM_PATTERN_OFF_INPUT for i in model.graph.input):
        return
    scalar = helper.make_tensor_type_proto(TensorProto.FLOAT, [])
    model.graph.input.append(helper.make_value_info(MEM_PATTERN_OFF_INPUT, helper.make_optional_type_proto(scalar)))
    model.ir_version = max(model.ir_version, OPTIONAL_TYPE_IR)


def without_mem_pattern(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` that ORT runs without a memory pattern (``mark_mem_pattern_off`` on a copy)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    mark_mem_pattern_off(out)
    return out


def has_mem_pattern_off(model: onnx.ModelProto) -> bool:
    """Does ``model`` carry the marker input (made by ``without_mem_pattern``)?"""
    return any(i.name == MEM_PATTERN_OFF_INPUT and i.type.HasField("optional_type") for i in model.graph.input)
