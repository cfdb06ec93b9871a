"""Function ops as ORT runs them: their ONNX function bodies, written into the Graph itself.

ORT's CPU provider has no kernel for the ops of ``onnx_export.ORT_INLINED_OPS`` (the losses,
HardSwish, Mish, GroupNormalization, ...): it runs their function bodies, and so does every file
memplan writes (export writes the body in the node's place). A body holds buffers the node alone
does not show: SoftmaxCrossEntropyLoss transposes its logits, takes LogSoftmax and transposes back,
two buffers of the logits' size at once; HardSwish and Mish keep a temporary of their output's size
(measured with passes/alloc_counter.py: 2.0x what the one-node model counted at those steps). A plan
made on the one-node graph could run over its budget where a loss or an activation made the peak.

``inline_functions`` writes those bodies into the Graph, so the liveness model, the planner and the
rewrite see the ops ORT runs (a body's nodes can be recomputed on their own) and the exported file
has nothing left to inline. Tensor ids of the input graph are kept (new ones are appended); body
nodes and tensors are named ``<node>/<k>_<op>`` and ``<node>/<name>``; Constant nodes of a body
become initializers (as import folds them). A node whose body onnx cannot build or check stays as it
is (``onnx_export.function_body`` says so in a warning). One body is ours: a cross-entropy of [N, C]
scores is LogSoftmax over the classes and the NegativeLogLikelihoodLoss body, without the two
transposed copies (the same bits; ``_Inliner._rows_of_classes``).
"""
from __future__ import annotations

from typing import Collection

import numpy as np
from onnx import helper, numpy_helper

from passes.onnx_export import ORT_INLINED_OPS, attribute_proto, function_body, ir_version_for, tensor_value_info
from passes.onnx_import import import_model
from planner.graph import FLOAT_DTYPES, NO_TENSOR, Graph, GraphAppender, Node, TensorKind, fresh_name


def inlined_here(node: Node) -> bool:
    """Whether ORT runs ``node`` as its function body."""
    return node.op_type in ORT_INLINED_OPS and node.domain in ("", "ai.onnx")


def inline_functions(graph: Graph) -> Graph:
    """``graph`` with every node of ``ORT_INLINED_OPS`` replaced by its function body; a graph
    without one is returned as it is."""
    return inline_with_origins(graph)[0]


def inline_with_origins(graph: Graph) -> tuple[Graph, list[int]]:
    """``inline_functions`` and, per node of the result, the id of the node it came from."""
    return inline_nodes(graph, [n.id for n in graph.nodes if inlined_here(n)])


def inline_nodes(graph: Graph, nodes: Collection[int]) -> tuple[Graph, list[int]]:
    """``graph`` with the nodes of ids ``nodes`` written as their ONNX function bodies (a node
    onnx builds no body for stays as it is), and per node of the result the id of the node it came
    from. Autodiff differentiates the bodies of ops it has no rule for (Attention,
    RMSNormalization, RotaryEmbedding: passes/autodiff.py)."""
    if not nodes:
        return graph, list(range(len(graph.nodes)))
    inliner = _Inliner(graph)
    return inliner.run(set(nodes)), inliner.origins


class _Inliner(GraphAppender):

    def run(self, which: set[int]) -> Graph:
        g = self.g
        self.by_name = {t.name: t.id for t in g.tensors}
        self.opsets = [helper.make_opsetid(d, v) for d, v in sorted(g.opsets.items())]
        self.taken = g.names()
        self.origins: list[int] = []
        for node in g.nodes:
            if node.id not in which or not self._inline(node):
                self.nodes.append(node)
            self.origins.extend([node.id] * (len(self.nodes) - len(self.origins)))
        return self.finish()

    def _inline(self, node: Node) -> bool:
        if node.op_type == "SoftmaxCrossEntropyLoss" and len(self.tensors[node.inputs[0]].shape) == 2:
            return self._rows_of_classes(node)
        name = lambda t: "" if t == NO_TENSOR else self.tensors[t].name  # noqa: E731
        proto = helper.make_node(node.op_type, [name(t) for t in node.inputs], [name(t) for t in node.outputs],
                                 name=node.name)
        proto.attribute.extend(attribute_proto(k, v) for k, v in sorted(node.attrs.items()))
        io_info = [tensor_value_info(self.tensors[t]) for t in (*node.inputs, *node.outputs) if t != NO_TENSOR]
        body, info = function_body(proto, io_info, self.opsets, self.taken)
        if len(body) == 1 and body[0] is proto:
            return False  # onnx could not build it: the node stays (and ORT inlines it late)
        # the body as a model of its own, read by our importer: shapes made static, Constants and
        # the shape arithmetic on static shapes folded, as import does to every model
        inputs = list(dict.fromkeys(t for t in node.inputs if t != NO_TENSOR))
        outputs = [t for t in node.outputs if t != NO_TENSOR]
        # constant inputs (a reduction's axes) go in with their values: the body's shapes need them
        known = [t for t in inputs if self._known(t)]
        model = helper.make_model(
            helper.make_graph(body, node.name, [tensor_value_info(self.tensors[t]) for t in inputs if t not in known],
                              [tensor_value_info(self.tensors[t]) for t in outputs], value_info=info,
                              initializer=[numpy_helper.from_array(np.asarray(self.g.values[t]), self.tensors[t].name)
                                           for t in known]),
            opset_imports=self.opsets)
        model.ir_version = ir_version_for(self.opsets)
        part = import_model(model)
        ids: dict[int, int] = {}
        for t in part.tensors:
            if t.name in self.by_name and (t.kind is TensorKind.INPUT or t.producer != NO_TENSOR
                                           or self.by_name[t.name] in known):
                ids[t.id] = self.by_name[t.name]  # the node's own inputs and outputs
            elif t.kind is TensorKind.ACTIVATION:
                ids[t.id] = self.add_tensor(t.name, t.dtype, t.shape)
            else:  # a folded constant
                ids[t.id] = self.add_const(t.name, part.values[t.id])
        for b in part.nodes:
            self.nodes.append(Node(len(self.nodes), fresh_name(b.name, self.node_names), b.op_type,
                                   tuple(NO_TENSOR if x == NO_TENSOR else ids[x] for x in b.inputs),
                                   tuple(NO_TENSOR if y == NO_TENSOR else ids[y] for y in b.outputs),
                                   b.domain, dict(b.attrs)))
        return True

    def _known(self, t: int) -> bool:
        """A frozen initializer that is not float: a shape, axes or indices a body's shapes read."""
        tensor = self.tensors[t]
        return tensor.kind is TensorKind.FROZEN and tensor.dtype not in FLOAT_DTYPES and t in self.g.values

    def _rows_of_classes(self, node: Node) -> bool:
        """SoftmaxCrossEntropyLoss of [N, C] scores as LogSoftmax over the classes, then
        NegativeLogLikelihoodLoss (its definition). The ONNX body reshapes the scores to [N, C, 1] and
        transposes them both ways around its LogSoftmax: two copies of the scores at once, which rows
        of classes (a classifier's, or a language model's logits as cross-entropy-last writes them)
        do not need. The same kernels on the same rows: the same bits (tests/test_function_ops.py)."""
        x = self.tensors[node.inputs[0]]
        if len(node.outputs) > 1 and node.outputs[1] != NO_TENSOR:
            log_prob = node.outputs[1]
        else:
            log_prob = self.add_tensor(f"{node.name}/log_prob", x.dtype, x.shape)
            self.by_name[self.tensors[log_prob].name] = log_prob
            self.taken.add(self.tensors[log_prob].name)
        self.add_node(f"{node.name}/LogSoftmax", "LogSoftmax", [x.id], [log_prob], {"axis": 1})
        self.taken.add(self.nodes[-1].name)
        nll = Node(-1, fresh_name(f"{node.name}/nll", self.node_names), "NegativeLogLikelihoodLoss",
                   (log_prob, *node.inputs[1:]), node.outputs[:1], "",
                   {k: v for k, v in node.attrs.items() if k in ("reduction", "ignore_index")})
        self.taken.add(nll.name)
        if not self._inline(nll):
            self.nodes.append(nll)
        return True

