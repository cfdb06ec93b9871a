"""Append a standard loss to a forward model that has none (``--add-loss KIND[:OUTPUT]``).

Models exported for inference end in logits or predictions, not in a loss, yet their training step
is what has to fit. ``append_loss`` adds one of three losses on one float output and makes the
scalar loss the graph's only output, as in a training step, where the predictions die once the
loss has read them:

  * ``cross-entropy``: SoftmaxCrossEntropyLoss (mean) of the output, scores of shape [N, C, ...],
    against a new int64 input ``<output>_labels`` of shape [N, ...] (an op of opset 12: an older
    model is upgraded first, passes/opset_upgrade.py);
  * ``cross-entropy-last``: the same with the classes on the last axis (a language model's logits
    [batch, seq, vocab], labels [batch, seq]), read as rows of scores through a Reshape (a view);
  * ``mse``: mean squared error against a new input ``<output>_target`` of the output's shape;
  * ``mean``: the mean of the output (no new input; its gradient is a constant).

The loss's own tensors are a few of the output's size at most, so the step's memory is that of
training the model with any loss of the same kind.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from planner.errors import OpsetTooOldError, UsageError
from planner.gate import parse_loss
from planner.graph import FLOAT_DTYPES, Graph, GraphAppender, Tensor, TensorKind


def append_loss(graph: Graph, text: str) -> tuple[Graph, str]:
    """(graph with the loss of ``text`` appended and as its only output, the loss's name)."""
    kind, name = parse_loss(text)
    out = _pick_output(graph, name, text)
    return _Appender(graph).run(kind, out)


def loss_output(graph: Graph, text: str) -> str:
    """``text`` as ``KIND:OUTPUT``, naming the output ``append_loss`` picks in ``graph``: ``plan
    --max-batch`` names it once, at batch 2, since at batch 1 an output [batch, 1] has one element
    and is taken for a loss the model already has."""
    kind, name = parse_loss(text)
    return f"{kind}:{_pick_output(graph, name, text).name}"


def _pick_output(graph: Graph, name: str | None, text: str) -> Tensor:
    floats = [graph.tensors[t] for t in graph.outputs if graph.tensors[t].dtype in FLOAT_DTYPES]
    if name is not None:
        match = [t for t in (graph.tensors[i] for i in graph.outputs) if t.name == name]
        if not match:
            outs = ", ".join(graph.tensors[t].name for t in graph.outputs)
            raise UsageError(f"--add-loss {text!r}: {name!r} is not an output of {graph.name!r}; outputs: {outs}")
        if match[0].dtype not in FLOAT_DTYPES:
            raise UsageError(f"--add-loss {text!r}: output {name!r} is {match[0].dtype}; a loss needs a float output")
        return match[0]
    scalars = [t.name for t in floats if t.nbytes and all(d == 1 for d in t.shape)]
    if scalars:
        raise UsageError(f"--add-loss {text!r}: {graph.name!r} already ends in a scalar, {scalars[0]!r}, which is "
                         "its loss: drop --add-loss (or name the output to put a loss on, --add-loss KIND:OUTPUT)")
    if not floats:
        outs = ", ".join(f"{t.name} ({t.dtype})" for t in (graph.tensors[o] for o in graph.outputs))
        raise UsageError(f"--add-loss {text!r}: {graph.name!r} has no float output (outputs: {outs}), so there is "
                         "nothing a loss can train through")
    if len(floats) != 1:
        outs = ", ".join(f"{t.name}{list(t.shape)}" for t in floats) or "none"
        raise UsageError(f"--add-loss {text!r}: {graph.name!r} has {len(floats)} float outputs ({outs}); "
                         f"name the one to train, e.g. --add-loss {parse_loss(text)[0]}:"
                         f"{floats[0].name}")
    return floats[0]


#: SoftmaxCrossEntropyLoss's first opset.
SCE_OPSET = 12


class _Appender(GraphAppender):

    def _reshape(self, x: int, shape: tuple[int, ...], dtype: str) -> int:
        src = self.tensors[x]
        rows = int(np.prod(src.shape)) // (shape[-1] if len(shape) > 1 else 1)
        known = (rows, shape[-1]) if len(shape) > 1 else (rows,)
        const = self.add_const(f"{src.name}_rows_shape", np.array(shape, np.int64))
        out = self.add_tensor(f"{src.name}_rows", dtype, known)
        self.add_node("add_loss.rows", "Reshape", [x, const], [out])
        return out

    def run(self, kind: str, out: Tensor) -> tuple[Graph, str]:
        self.nodes = list(self.g.nodes)
        inputs = list(self.g.inputs)
        loss = self.add_tensor("loss", out.dtype, ())
        if kind in ("cross-entropy", "cross-entropy-last"):
            if self.g.opsets.get("", 0) < SCE_OPSET:  # autodiff upgrades the model and comes back
                raise OpsetTooOldError(f"--add-loss {kind} appends SoftmaxCrossEntropyLoss (opset {SCE_OPSET})",
                                       SCE_OPSET)
            last = kind == "cross-entropy-last"
            axis = len(out.shape) - 1 if last else 1
            if len(out.shape) < 2 or out.shape[axis] < 2:
                where = "[..., C]" if last else "[N, C, ...]"
                raise UsageError(f"--add-loss {kind}: output {out.name!r} has shape {list(out.shape)}; "
                                 f"it needs class scores of shape {where} with C >= 2 (or use mse)")
            labels = self.add_tensor(f"{out.name}_labels", "int64", out.shape[:axis] + out.shape[axis + 1:],
                                  TensorKind.INPUT)
            inputs.append(labels)
            scores, targets = out.id, labels
            if last and len(out.shape) > 2:  # rows of C scores: a view, no copy
                scores = self._reshape(out.id, (-1, out.shape[-1]), out.dtype)
                targets = self._reshape(labels, (-1,), "int64")
            self.add_node("add_loss.cross_entropy", "SoftmaxCrossEntropyLoss", [scores, targets], [loss],
                       {"reduction": "mean"})
        else:
            x = out.id
            if kind == "mse":
                target = self.add_tensor(f"{out.name}_target", out.dtype, out.shape, TensorKind.INPUT)
                inputs.append(target)
                diff = self.add_tensor(f"{out.name}_error", out.dtype, out.shape)
                self.add_node("add_loss.error", "Sub", [out.id, target], [diff])
                x = self.add_tensor(f"{out.name}_squared_error", out.dtype, out.shape)
                self.add_node("add_loss.square", "Mul", [diff, diff], [x])
            self.add_node("add_loss.mean", "ReduceMean", [x], [loss], {"keepdims": 0})
        self.g = dataclasses.replace(self.g, inputs=tuple(inputs), outputs=(loss,))
        return self.finish(), self.tensors[loss].name
