"""Rewrites that keep a training graph runnable on every ONNX Runtime execution provider.

ORT's CUDA execution provider refuses ``BatchNormalization`` with ``training_mode=1`` (opset 14+):
the session fails to initialise with "!(is_training_mode_ && opset >= 14)" (measured on
onnxruntime-gpu 1.31.1, H200). The CPU provider runs it. So training graphs write the batch
statistics in primitive ops and normalise with an inference-mode ``BatchNormalization``, which
every provider runs:

    mean = ReduceMean(x, stat_axes, keepdims=1)             # [1, C, 1, ...]
    var  = ReduceSumSquare(x - mean, stat_axes) * (1 / m)   # biased, as ONNX and ORT CPU define it
    y    = BatchNormalization(x, scale, bias, mean[C], var[C], epsilon)        # inference mode
    running_mean = input_mean * momentum + mean * (1 - momentum)   (only where the output is used)
    running_var  = input_var  * momentum + var  * (1 - momentum)

Memory: the one full-size temporary, ``x - mean``, dies before ``y`` is made, so the step peak at
the node is the fused op's (x plus one full-size buffer). The gradient rule is untouched: it reads
x, scale and bias and recomputes the statistics itself (passes/gradients/norm.py).

Tensor ids of the input graph are kept (new tensors are appended); node ids shift, as they are
schedule positions.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from planner.graph import NO_TENSOR, Graph, GraphAppender, Node, TensorKind

#: The ONNX opset from which Reduce* take their axes as an input instead of an attribute.
_AXES_AS_INPUT = 18


def is_training_batchnorm(graph: Graph, node: Node) -> bool:
    return (node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
            and graph.opsets.get("", 17) >= 14 and int(node.attr("training_mode", 0)) == 1)


def portable_batchnorm(graph: Graph) -> Graph:
    """Every training-mode BatchNormalization -> batch statistics in primitive ops + inference BN.

    Outputs (y and the running statistics) keep their tensor ids and names; a graph without such a
    node is returned as it is.
    """
    if not any(is_training_batchnorm(graph, n) for n in graph.nodes):
        return graph
    return _Splitter(graph).run()


class _Splitter(GraphAppender):

    # -- helpers -----------------------------------------------------------------------------
    def _reduce(self, base: str, op: str, x: int, axes: list[int], out: int) -> None:
        if self.opset >= _AXES_AS_INPUT:
            self.add_node(base, op, [x, self.add_const(f"{base}.axes", np.array(axes, np.int64))], [out], {"keepdims": 1})
        else:
            self.add_node(base, op, [x], [out], {"axes": list(axes), "keepdims": 1})

    # -- the rewrite -------------------------------------------------------------------------
    def run(self) -> Graph:
        # a running statistic nobody reads and no graph output: its update is not written (ORT would
        # run it and hold its unread result to the end of the run)
        self.used = {t for n in self.g.nodes for t in n.inputs if t != NO_TENSOR} | set(self.g.outputs)
        self.unused: set[int] = set()  # running-statistic initializers only a dropped update read
        for node in self.g.nodes:
            if is_training_batchnorm(self.g, node):
                self._split(node)
            else:
                self.nodes.append(node)
        # ORT drops an initializer no node reads; it is no longer one here either (so the base holds
        # what ORT holds)
        read = {t for n in self.nodes for t in n.inputs} | set(self.g.outputs)
        for t in self.unused - read:
            if self.tensors[t].kind is TensorKind.FROZEN:
                self.tensors[t] = dataclasses.replace(self.tensors[t], kind=TensorKind.ACTIVATION)
                self.values.pop(t, None)
        return self.finish()

    def _split(self, node: Node) -> None:
        x, scale, bias = node.inputs[0], node.inputs[1], node.inputs[2]
        in_mean = node.inputs[3] if len(node.inputs) > 3 else NO_TENSOR
        in_var = node.inputs[4] if len(node.inputs) > 4 else NO_TENSOR
        y = node.outputs[0]
        run_mean = node.outputs[1] if len(node.outputs) > 1 else NO_TENSOR
        run_var = node.outputs[2] if len(node.outputs) > 2 else NO_TENSOR
        xt = self.tensors[x]
        dtype, shape = xt.dtype, xt.shape
        channels = shape[1]
        axes = [0, *range(2, len(shape))]
        count = int(np.prod([shape[a] for a in axes]))
        npdt = np.dtype(dtype)
        eps = float(node.attr("epsilon", 1e-5))
        momentum = float(node.attr("momentum", 0.9))
        stat_shape = [1, channels] + [1] * (len(shape) - 2)
        b = node.name

        mean = self.add_tensor(f"{b}.batch_mean", dtype, stat_shape)
        self._reduce(f"{b}.mean", "ReduceMean", x, axes, mean)
        centered = self.add_tensor(f"{b}.centered", dtype, shape)
        self.add_node(f"{b}.center", "Sub", [x, mean], [centered])
        sumsq = self.add_tensor(f"{b}.sumsq", dtype, stat_shape)
        self._reduce(f"{b}.sumsq", "ReduceSumSquare", centered, axes, sumsq)
        var = self.add_tensor(f"{b}.batch_var", dtype, stat_shape)
        self.add_node(f"{b}.var", "Mul", [sumsq, self.add_const(f"{b}.inv_count", np.array(1.0 / count, npdt))], [var])
        flat = self.add_const(f"{b}.channels", np.array([channels], np.int64))
        mean_c = self.add_tensor(f"{b}.batch_mean_c", dtype, [channels])
        self.add_node(f"{b}.mean_c", "Reshape", [mean, flat], [mean_c])
        var_c = self.add_tensor(f"{b}.batch_var_c", dtype, [channels])
        self.add_node(f"{b}.var_c", "Reshape", [var, flat], [var_c])
        # The original node's name stays on the normalisation (plans and saved-tensor maps use it).
        self.add_node("", "BatchNormalization", [x, scale, bias, mean_c, var_c], [y], {"epsilon": eps},
                   name=node.name)
        updates = [(out, running, stat) for out, running, stat in
                   ((run_mean, in_mean, mean_c), (run_var, in_var, var_c)) if out in self.used]
        self.unused.update(t for t in (in_mean, in_var) if t != NO_TENSOR and t not in {u[1] for u in updates})
        if not updates:
            return
        keep = self.add_const(f"{b}.momentum", np.array(momentum, npdt))
        blend = self.add_const(f"{b}.one_minus_momentum", np.array(1.0 - momentum, npdt))
        for out, running, stat in updates:
            kept = self.add_tensor(f"{self.tensors[out].name}.kept", dtype, [channels])
            self.add_node(f"{b}.keep", "Mul", [running, keep], [kept])
            new = self.add_tensor(f"{self.tensors[out].name}.new", dtype, [channels])
            self.add_node(f"{b}.blend", "Mul", [stat, blend], [new])
            self.add_node(f"{b}.running", "Add", [kept, new], [out])


def release_unread_outputs(graph: Graph) -> tuple[Graph, list[int]]:
    """``graph`` where no node output is left that no node reads and no graph output is: ORT holds
    such an output to the end of the run (a Split half the loss does not use, an inactive Dropout's
    mask). An optional one (passes/rewrite.py ``OPTIONAL_OUTPUTS``) is not written, so ORT never
    makes it; a required one gets a 1-element reader right after its node, so ORT frees it there.
    Also returns, per node of the result, the id of the node it came from (a reader: its producer's).
    """
    read = {t for n in graph.nodes for t in n.inputs if t != NO_TENSOR} | set(graph.outputs)
    if all(t == NO_TENSOR or t in read or graph.tensors[t].nbytes == 0 for n in graph.nodes for t in n.outputs):
        return graph, list(range(len(graph.nodes)))
    return _Releaser(graph, read).run()


class _Releaser(GraphAppender):

    def __init__(self, graph: Graph, read: set[int]):
        super().__init__(graph)
        self.read = read
        self.origins: list[int] = []
        self.bounds: dict[int, tuple[int, int]] = {}  # rank -> (starts, ends) of a 1-element Slice

    def run(self) -> tuple[Graph, list[int]]:
        from passes.rewrite import OPTIONAL_OUTPUTS

        for node in self.g.nodes:
            optional = OPTIONAL_OUTPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ()
            unread = [(k, t) for k, t in enumerate(node.outputs)
                      if t != NO_TENSOR and t not in self.read and self.tensors[t].nbytes > 0]
            drop = {k for k, _ in unread if k in optional}
            if drop and all(t == NO_TENSOR or k in drop for k, t in enumerate(node.outputs)):
                drop.discard(min(drop))  # a node writes some output: that one gets a reader
            if drop:
                node = dataclasses.replace(node, outputs=tuple(
                    NO_TENSOR if k in drop else t for k, t in enumerate(node.outputs)))
            self.nodes.append(node)
            for k, t in unread:
                if k not in drop:
                    self._sink(t)
            self.origins.extend([node.id] * (len(self.nodes) - len(self.origins)))
        return self.finish(), self.origins

    def _sink(self, t: int) -> None:
        from passes.rewrite import add_sink

        def node(stem: str, op: str, inputs: list[int], dtype: str, shape: tuple[int, ...], attrs: dict) -> None:
            self.add_node(stem, op, inputs, [self.add_tensor(stem, dtype, shape)], attrs or None)

        add_sink(self.tensors[t], self.bounds, self.add_const, node, self.opset)
