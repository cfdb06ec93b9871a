"""Reverse-mode autodiff on the IR: forward Graph with a scalar loss -> training-step Graph.

Pre: a validated Graph with static shapes and a scalar (one-element) float loss output.
Post: a validated Graph that holds the forward nodes the loss needs (same order, same names; rules
may add optional outputs such as MaxPool's Indices), then the backward nodes in reverse order of
the forward, so file order is a valid schedule. Outputs: the loss, then ``<param>_grad`` for each
trainable initializer, in initializer order. With an optimizer (``passes/optimizer.py``) the
outputs are the loss, ``<param>_new`` and the optimizer state (``keep_grads`` adds the gradients);
each parameter's update is emitted as soon as its gradient is complete, so it dies early.

Trainable = TRAINABLE initializers (float, not BatchNormalization running stats) minus ``freeze``
patterns, restricted to those the loss depends on through differentiable inputs of ops with a
rule; LSTM/GRU/RNN nodes on such a path are first unrolled into primitive ops (passes/rnn.py).
Int/bool subgraphs and ops on constants pass through untouched. An op with no rule between a
trainable initializer and the loss is an error naming the node, the op and the supported ops;
nothing is built. Fan-out is summed with Add as each contribution arrives.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from passes.function_ops import inline_nodes, inline_with_origins
from passes.gradients import RULES, STOP_GRADIENT, BackwardContext, GradRule, supported_ops
from passes.gradients._emit import Emitter
from passes.optimizer import OptimizerOptions, OptimizerStep, StateSlot
from passes.onnx_import import op_schema
from passes.portable import portable_batchnorm, release_unread_outputs
from passes.rnn import is_recurrent, unroll_recurrent
from planner.errors import FREEZE_HINT, GraphError, ModelImportError, OpsetTooOldError, UsageError
from planner.graph import FLOAT_DTYPES, NO_TENSOR, Graph, GraphBuilder, Node, TensorKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOptions:
    loss: str | None = None  # loss output name; default: the first one-element float output
    freeze: tuple[str, ...] = ()  # fnmatch patterns of initializers that get no gradient
    optimizer: OptimizerOptions = field(default_factory=OptimizerOptions)
    keep_grads: bool = False  # with an optimizer, also output the gradients (they then live to the end)
    add_loss: str | None = None  # KIND[:OUTPUT] of passes/loss.py: append a loss to a model without one

    @classmethod
    def from_kwargs(
        cls, *, loss: str | None = None, freeze: Sequence[str] = (), optimizer: str = "none", lr: float = 0.01,
        momentum: float = 0.0, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
        weight_decay: float = 0.0, keep_grads: bool = False, add_loss: str | None = None,
    ) -> "TrainOptions":
        """Flat keyword form (CLI flags, JSON metadata) -> options; bad values raise UsageError."""
        opt = OptimizerOptions(kind=optimizer, lr=lr, momentum=momentum, beta1=beta1, beta2=beta2, eps=eps,
                               weight_decay=weight_decay)
        if add_loss is not None:
            from planner.gate import parse_loss

            parse_loss(add_loss)  # a bad spec fails before the model is read
            if loss is not None:
                raise UsageError(f"--loss {loss} picks a loss the model has and --add-loss {add_loss} adds one; "
                                 "give only one of them")
        return cls(loss=loss, freeze=tuple(freeze), optimizer=opt, keep_grads=keep_grads, add_loss=add_loss)

    def as_kwargs(self) -> dict:
        """Inverse of ``from_kwargs`` (JSON-serializable), e.g. to record how a model was made."""
        o = self.optimizer
        return {"loss": self.loss, "freeze": list(self.freeze), "optimizer": o.kind, "lr": o.lr,
                "momentum": o.momentum, "beta1": o.beta1, "beta2": o.beta2, "eps": o.eps,
                "weight_decay": o.weight_decay, "keep_grads": self.keep_grads,
                **({"add_loss": self.add_loss} if self.add_loss else {})}


@dataclass(frozen=True)
class TrainingStep:
    """The training graph and how its signature maps to the forward model."""

    graph: Graph
    loss: str  # loss output name
    params: tuple[str, ...]  # trainable initializers, in graph order
    grads: Mapping[str, str]  # param -> gradient tensor name (``<param>_grad``)
    updates: Mapping[str, str]  # param -> updated value output (``<param>_new``); empty without optimizer
    state: tuple[StateSlot, ...]  # optimizer state inputs/outputs with their initial values
    saved: Mapping[str, tuple[str, ...]]  # forward node -> forward tensors its gradient rule keeps
    forward_nodes: int  # graph.nodes[:forward_nodes] is the forward copy, the rest backward (+ update)


def training_graph(forward: Graph, **options) -> Graph:
    """Just the training Graph; ``options`` are ``TrainOptions.from_kwargs``'s keywords."""
    return build_training_graph(forward, TrainOptions.from_kwargs(**options)).graph


def build_training_graph(forward: Graph, options: TrainOptions | None = None) -> TrainingStep:
    """The training step of ``forward``. Where a gradient needs a newer opset than the model's
    (OpsetTooOldError), the model is upgraded to it first (passes/opset_upgrade.py) and a warning
    says so."""
    from passes.opset_upgrade import with_upgrades

    options = options or TrainOptions()
    return with_upgrades(forward, lambda f: _build_training_graph(f, options))[1]


#: The oldest opset gradients are written in; older models are upgraded first. ORT supports opset 7
#: and up; before, opset 7-10 models got gradient nodes their opset lacks (Expand before 8,
#: ConstantOfShape before 9, Pad with a pads input before 11), which the checker refused.
MIN_OPSET = 11


def _build_training_graph(forward: Graph, options: TrainOptions) -> TrainingStep:
    if forward.opsets.get("", MIN_OPSET) < MIN_OPSET:
        raise OpsetTooOldError(f"memplan writes gradients in operators of opset {MIN_OPSET} (Expand, "
                               "ConstantOfShape, Pad and Slice with their inputs, Resize)", MIN_OPSET)
    name = options.loss
    if options.add_loss is not None:
        from passes.loss import append_loss

        forward, name = append_loss(forward, options.add_loss)
    loss = _pick_loss(forward, name)
    candidates = [t.id for t in forward.tensors if t.kind is TensorKind.TRAINABLE
                  and not any(fnmatch.fnmatchcase(t.name, p) for p in options.freeze)]
    # LSTM/GRU/RNN have no rule: the ones gradients flow through are unrolled into primitive ops
    # (tensor ids are kept, so ``loss`` and ``candidates`` stay valid).
    forward = unroll_recurrent(forward, _recurrent_to_unroll(forward, loss, candidates))
    # Ops with an ONNX function body but no rule (Attention, RMSNormalization, RotaryEmbedding of
    # opset 23): the ones gradients flow through are written as their bodies, whose ops have rules
    # (tensor ids are kept, as above).
    forward, active = _with_bodies(forward, loss, candidates)
    _refuse_dropped_outputs(forward, loss, active)
    _refuse_dropped_inputs(forward, loss, active)
    on_path, useful = _backward_reach(forward, loss, active)
    params = [t for t in candidates if useful[t]]
    if not params:
        if options.freeze and _trains_without_freezing(forward, loss):
            # the model has weights to train; the user's --freeze patterns took every one of them
            raise UsageError(f"--freeze {' '.join(options.freeze)} freezes every weight the loss "
                             f"{forward.tensors[loss].name!r} depends on; there is nothing left to train "
                             "(narrow the patterns)")
        only = _undifferentiated(forward, loss, candidates)
        # the --loss hint only where there is another scalar to name: a model without weights was
        # told to name "another scalar output" it did not have, and not what it could do instead
        others = [repr(forward.tensors[t].name) for t in forward.outputs if t != loss
                  and forward.tensors[t].dtype in FLOAT_DTYPES and int(np.prod(forward.tensors[t].shape)) == 1]
        raise ModelImportError(
            f"loss {forward.tensors[loss].name!r} depends on " + (only or "no trainable initializer")
            + (f" (frozen: {', '.join(options.freeze)})" if options.freeze else "")
            + "; there is nothing to train, so the model has no training step"
            + (f" (name another scalar output as the loss with --loss: {', '.join(others)})" if others else "")
            + f"; plan or check its forward run instead ({FORWARD_RUN})"
        )
    step = _Builder(forward, loss, params, active, on_path, options).run()
    # Batch statistics in primitive ops: ORT's CUDA provider refuses training-mode BatchNormalization.
    graph = portable_batchnorm(step.graph)
    if graph is not step.graph:
        step = dataclasses.replace(step, graph=graph,
                                   forward_nodes=step.forward_nodes + len(graph.nodes) - len(step.graph.nodes))
    # Outputs nothing reads (a Split half the loss does not use, an inactive Dropout's mask): ORT
    # would hold them to the end of the run.
    graph, origins = release_unread_outputs(step.graph)
    if graph is not step.graph:
        step = dataclasses.replace(step, graph=graph,
                                   forward_nodes=sum(1 for o in origins if o < step.forward_nodes))
    # The function ops ORT runs as their bodies (losses, HardSwish, ...), as it runs them: the
    # bodies hold buffers the one node does not show (passes/function_ops.py).
    graph, origins = inline_with_origins(step.graph)
    if graph is not step.graph:
        step = dataclasses.replace(step, graph=graph,
                                   forward_nodes=sum(1 for o in origins if o < step.forward_nodes))
    return step


#: The flags that plan a model's forward run, where it has no training step to plan.
FORWARD_RUN = "plan --forward; check and inspect without --train"


# ---- analysis ---------------------------------------------------------------------------------
def _pick_loss(graph: Graph, name: str | None) -> int:
    if name is not None:
        tid = graph.by_name.get(name)
        if tid is None or tid not in graph.output_set:
            outs = ", ".join(graph.tensors[t].name for t in graph.outputs)
            raise UsageError(f"loss {name!r} is not an output of {graph.name!r}; outputs: {outs}")
    else:
        scalars = [t for t in graph.outputs if graph.tensors[t].dtype in FLOAT_DTYPES
                   and int(np.prod(graph.tensors[t].shape)) == 1]
        if not scalars:
            outs = ", ".join(f"{graph.tensors[t].name}{list(graph.tensors[t].shape)}" for t in graph.outputs)
            # a forward model as exported for inference: the flags below fix it (exit 2), as a bad
            # --add-loss is; it said exit 3, a bad model
            raise UsageError(
                f"{graph.name!r} has no scalar float output to use as the loss (outputs: {outs}); "
                "add one with --add-loss cross-entropy, mse or mean (e.g. --add-loss cross-entropy:logits), "
                "or in the model (e.g. SoftmaxCrossEntropyLoss or ReduceMean of a squared error); or plan its "
                f"forward run instead ({FORWARD_RUN})"
            )
        tid = scalars[0]
        if len(scalars) > 1:
            # two scalar outputs (a loss and a metric, an auxiliary loss): the first may not be the one
            others = ", ".join(repr(graph.tensors[o].name) for o in scalars[1:])
            log.warning("training %r as the loss, the first of the scalar float outputs (also %s); "
                        "name the loss with --loss OUTPUT", graph.tensors[tid].name, others)
    t = graph.tensors[tid]
    if t.dtype not in FLOAT_DTYPES or int(np.prod(t.shape)) != 1:
        raise UsageError(f"loss {t.name!r} must be a one-element float tensor, got {t.dtype}{list(t.shape)}")
    return tid


def _rule(node: Node) -> GradRule | None:
    """The gradient rule of a default-domain node (a com.microsoft Gelu is not ONNX's Gelu)."""
    return RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None


def _rule_inputs(graph: Graph, node: Node) -> list[int]:
    """Input slots that can carry a gradient: the rule's, or every float input for unknown ops."""
    rule = _rule(node)
    if rule is not None:
        slots = rule.differentiable(node)
    else:
        slots = range(len(node.inputs))
    return [i for i in slots if node.inputs[i] != NO_TENSOR and graph.tensors[node.inputs[i]].dtype in FLOAT_DTYPES]


def _rule_outputs(graph: Graph, node: Node) -> list[int]:
    rule = _rule(node)
    return [k for k, t in enumerate(node.outputs)
            if t != NO_TENSOR and graph.tensors[t].dtype in FLOAT_DTYPES and (rule is None or rule.carries(k))]


def _trains_without_freezing(forward: Graph, loss: int) -> bool:
    """Some trainable initializer reaches ``loss`` through differentiable ops (--freeze aside)."""
    every = [t.id for t in forward.tensors if t.kind is TensorKind.TRAINABLE]
    active = _forward_activity(forward, every)
    _, useful = _backward_reach(forward, loss, active)
    return any(useful[t] for t in every)


def _forward_activity(graph: Graph, params: Sequence[int]) -> list[bool]:
    """active[t]: float tensor t depends on a trainable initializer through differentiable slots."""
    active = [False] * len(graph.tensors)
    for t in params:
        active[t] = True
    for node in graph.nodes:
        if _stops_gradient(node):
            continue
        if any(active[node.inputs[i]] for i in _rule_inputs(graph, node)):
            for k in _rule_outputs(graph, node):
                active[node.outputs[k]] = True
    return active


def _refuse_dropped_outputs(graph: Graph, loss: int, active: list[bool]) -> None:
    """Refuse a loss that depends, differentiably, on a float output whose gradient the node's rule
    does not build (SoftmaxCrossEntropyLoss's log_prob, LayerNormalization's Mean): that part of
    the gradient would be left out without a word (fuzzed, stop 49: log_prob in a label-smoothing
    loss gave a gradient 116% off). Only where those outputs' own inputs are active: LayerNorm's Mean
    of an input that depends on no weight has no gradient to leave out, though Y reads a weight
    (fuzzed, --ops multi seed 4: BatchNormalization's running mean of LogSoftmax(x) was refused)."""
    dropped: dict[int, tuple[Node, int]] = {}
    for node in graph.nodes:
        rule = _rule(node)
        if rule is None or _stops_gradient(node):
            continue
        sources = _rule_inputs(graph, node) if rule.left_out_from is None else \
            [i for i in rule.left_out_from if i < len(node.inputs) and node.inputs[i] != NO_TENSOR]
        if not any(active[node.inputs[i]] for i in sources):
            continue
        for k, t in enumerate(node.outputs):
            if t != NO_TENSOR and graph.tensors[t].dtype in FLOAT_DTYPES and not rule.carries(k):
                dropped[t] = (node, k)
    if not dropped:
        return
    seeded = _forward_activity(graph, list(dropped))
    _, useful = _backward_reach(graph, loss, [a or b for a, b in zip(active, seeded)], strict=False)
    for t, (node, k) in dropped.items():
        if useful[t]:
            carried = ", ".join(str(j) for j in _rule(node).grad_outputs or ())
            raise ModelImportError(
                f"loss {graph.tensors[loss].name!r} depends on output {k} ({graph.tensors[t].name!r}) of node "
                f"{node.name!r} ({node.op_type}), and memplan builds that op's gradient through output "
                f"{carried} only; compute the loss from that output, or freeze the weights before the node "
                f"{FREEZE_HINT}"
            )


#: Float input slots whose derivative is zero wherever it is defined (CastLike's input only
#: names a type; OneHot's indices and depth pick positions; a training-mode BatchNormalization's
#: Y reads neither the mean nor the variance it is given, and in inference mode its rule
#: differentiates both): building none loses nothing.
_ZERO_DERIVATIVE = {"CastLike": (1,), "OneHot": (0, 1), "BatchNormalization": (3, 4)}


def _refuse_dropped_inputs(graph: Graph, loss: int, active: list[bool]) -> None:
    """Refuse a loss that depends, differentiably, on a node whose float input computed from the
    trainable weights is one its rule builds no gradient for (a Clip bound, a Pad value, a loss's
    class weights): that part of the gradient would be left out without a word (BatchNormalization's
    mean and variance were so until they got theirs: NFNet's weight standardization, exported by
    torch's dynamo exporter, trained 1.7 off torch). A trainable initializer read there directly
    (ReLU6's Clip bounds as initializers) is a constant of the model's, not a computation: it
    gets no gradient, as before."""
    dropped = []
    for node in graph.nodes:
        rule = _rule(node)
        if rule is None or _stops_gradient(node):
            continue
        carried = set(rule.differentiable(node)) | set(_ZERO_DERIVATIVE.get(node.op_type, ()))
        dropped.extend((node, i) for i, t in enumerate(node.inputs)
                       if i not in carried and t != NO_TENSOR and active[t]
                       and graph.tensors[t].dtype in FLOAT_DTYPES and graph.tensors[t].kind is not TensorKind.TRAINABLE)
    if not dropped:
        return
    _, useful = _backward_reach(graph, loss, [True] * len(graph.tensors), strict=False)
    for node, i in dropped:
        if any(useful[node.outputs[k]] for k in _rule_outputs(graph, node)):
            raise ModelImportError(
                f"loss {graph.tensors[loss].name!r} depends on the trainable weights through input {i} "
                f"({graph.tensors[node.inputs[i]].name!r}) of node {node.name!r} ({node.op_type}), computed from "
                "them, and memplan builds no gradient through that input; compute it from constants, or freeze "
                f"the weights it reads {FREEZE_HINT}"
            )


def _undifferentiated(graph: Graph, loss: int, candidates: Sequence[int]) -> str:
    """Where a loss reads trainable initializers only through inputs no rule differentiates (a
    Clip bound, a Pad value): which, for the no-trainable-initializer error."""
    ancestors = _loss_ancestors(graph, loss)
    read = [t for t in candidates if any(t in graph.nodes[n].inputs for n in ancestors)]
    if not read:
        return ""
    names = ", ".join(repr(graph.tensors[t].name) for t in read[:3]) + (", ..." if len(read) > 3 else "")
    return (f"the trainable initializers {names} only through inputs memplan builds no gradient for "
            "(such as a Clip bound or a Pad value)")


def _backward_reach(graph: Graph, loss: int, active: list[bool],
                    strict: bool = True) -> tuple[list[int], list[bool]]:
    """Nodes on a differentiable path to the loss (forward order) and the tensors that need grads.
    ``strict``: refuse a node on the path without a gradient rule."""
    useful = [False] * len(graph.tensors)
    useful[loss] = True
    on_path: list[int] = []
    for node in reversed(graph.nodes):
        if _stops_gradient(node):
            continue
        if not any(useful[node.outputs[k]] for k in _rule_outputs(graph, node)):
            continue
        wanted = [node.inputs[i] for i in _rule_inputs(graph, node) if active[node.inputs[i]]]
        if not wanted:
            continue
        if _rule(node) is None and strict:
            _no_rule(graph, node)
        on_path.append(node.id)
        for t in wanted:
            useful[t] = True
    return on_path[::-1], useful


def _recurrent_to_unroll(graph: Graph, loss: int, params: Sequence[int]) -> list[int]:
    """Recurrent nodes the loss depends on that read a tensor depending on a trainable one."""
    active = _forward_activity(graph, params)
    ancestors = _loss_ancestors(graph, loss)
    return [n.id for n in graph.nodes if is_recurrent(n) and n.id in ancestors
            and any(active[t] for t in n.inputs if t != NO_TENSOR)]


#: nested bodies written out at most this deep (a body's own ops without a rule but with a body)
BODY_DEPTH = 4


def _with_bodies(graph: Graph, loss: int, params: Sequence[int]) -> tuple[Graph, list[bool]]:
    """``graph`` with the nodes on a differentiable path from a trainable tensor to the loss that
    have no gradient rule but an ONNX function body written as that body (a body's own such ops
    too, BODY_DEPTH deep), and the result's forward activity. A node onnx builds no body for
    stays, and the build says it has no rule. GreaterOrEqual has a body too, but no gradient flows
    through its boolean output: it stays."""
    for _ in range(BODY_DEPTH):
        active = _forward_activity(graph, params)
        on_path, _ = _backward_reach(graph, loss, active, strict=False)
        which = [i for i in on_path if _has_body(graph, graph.nodes[i])]
        if not which:
            return graph, active
        inlined, origins = inline_nodes(graph, which)
        if len(origins) == len(graph.nodes):  # onnx wrote none of them
            return graph, active
        graph = inlined
    return graph, _forward_activity(graph, params)


def _has_body(graph: Graph, node: Node) -> bool:
    """An op of the default domain with no rule whose ONNX schema at the model's opset has a
    function body."""
    if node.domain not in ("", "ai.onnx") or node.op_type in RULES or node.op_type in STOP_GRADIENT:
        return False
    schema = op_schema(node.op_type, graph.opsets.get("", MIN_OPSET))
    return schema is not None and (schema.has_function or schema.has_context_dependent_function)


def _guarded_softmaxes(graph: Graph) -> dict[int, int]:
    """Softmaxes whose masked rows a Where zeroes: ``Ps = Where(rows, 0, P)`` with ``P = Softmax(z)``
    (through Casts to its own type) read by nothing else, and ``rows`` true or false along whole
    rows (size 1 on the softmax axis, or IsNaN of P: a softmax row is NaN whole or not at all).
    ONNX's Attention body guards fully masked rows so. Where node id -> Softmax node id.

    Differentiated node by node, the step kept both P and Ps (two attention-sized buffers per
    layer), and a fully masked row gave NaN gradients (P's NaN row times Where's zero gradient).
    Read as one op, the Where passes its gradient through and the Softmax's rule reads Ps in place
    of P: the same gradient in every other row, 0 in a zeroed one (its output is constant)."""
    if graph.onnx_opset < 13:  # before, Softmax flattened to 2D around its axis
        return {}
    readers, outputs = graph.consumers, graph.output_set

    def made_by(t: int) -> Node | None:
        return None if graph.tensors[t].producer == NO_TENSOR else graph.nodes[graph.tensors[t].producer]

    out = {}
    for where in graph.nodes:
        if where.op_type != "Where" or where.domain not in ("", "ai.onnx") or len(where.inputs) != 3:
            continue
        rows, zero, x = where.inputs
        zero_value = graph.values.get(zero)
        if zero_value is None or np.any(np.asarray(zero_value) != 0) or x in outputs \
                or graph.tensors[where.outputs[0]].shape != graph.tensors[x].shape:
            continue
        chain, node = [x], made_by(x)  # x, then back through same-type Casts to the Softmax's output
        while node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx") \
                and graph.tensors[node.inputs[0]].dtype == graph.tensors[chain[-1]].dtype:
            chain.append(node.inputs[0])
            node = made_by(chain[-1])
        if node is None or node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
            continue
        nan_test = made_by(rows)
        is_nan = nan_test is not None and nan_test.op_type == "IsNaN" and nan_test.inputs[0] in chain \
            and set(readers[rows]) == {where.id} and rows not in outputs
        rank = len(graph.tensors[x].shape)
        axis = int(node.attrs.get("axis", -1)) % rank
        shape = (1,) * (rank - len(graph.tensors[rows].shape)) + tuple(graph.tensors[rows].shape)
        if not (is_nan or shape[axis] == 1):
            continue
        # each tensor of the chain read only by the next (and by the IsNaN)
        allowed = [{where.id}] + [{made_by(t).id} for t in chain[:-1]]
        if any(set(readers[t]) - ({nan_test.id} if is_nan else set()) != ok or t in outputs
               for t, ok in zip(chain, allowed)):
            continue
        out[where.id] = node.id
    return out


def _stops_gradient(node: Node) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in STOP_GRADIENT


def _no_rule(graph: Graph, node: Node) -> None:
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    body = (" (onnx built no function body for it to differentiate: see the warning above)"
            if _has_body(graph, node) else "")
    raise ModelImportError(
        f"no gradient rule for node {node.name!r} ({op}){body} on the path from the trainable weights to the "
        f"loss; supported ops: {', '.join(supported_ops())}, and those with an ONNX function body (Attention, "
        "RMSNormalization, RotaryEmbedding, Swish, ReduceLogSum, CenterCropPad); freeze the weights before it "
        f"{FREEZE_HINT}"
    )


def _loss_ancestors(graph: Graph, loss: int) -> set[int]:
    """Nodes the loss depends on (any input, differentiable or not)."""
    needed = {loss}
    keep: set[int] = set()
    for node in reversed(graph.nodes):
        if any(t in needed for t in node.outputs):
            keep.add(node.id)
            needed.update(t for t in node.inputs if t != NO_TENSOR)
    return keep


# ---- emission ---------------------------------------------------------------------------------
class _Builder:
    """One training-graph construction: forward copy, backward sweep, optional optimizer, names."""

    def __init__(self, fwd: Graph, loss: int, params: list[int], active: list[bool], on_path: list[int],
                 options: TrainOptions):
        self.fwd, self.loss, self.params, self.active = fwd, loss, params, active
        self.on_path, self.options = on_path, options
        self.b = GraphBuilder(name=f"{fwd.name}_train", opsets=fwd.opsets)
        self.em = Emitter(self.b, fwd.onnx_opset)
        self.remap: dict[int, int] = {}
        self.values: dict[int, np.ndarray] = {}
        self.nodes: dict[int, Node] = {}
        self.grads: dict[int, int] = {}
        # how often each tensor is a value of self.grads (set only through _set_grad): a scan of
        # grads.values() per accumulated gradient was quadratic on unrolled graphs
        self.grad_refs: Counter[int] = Counter()
        self.saved: dict[str, tuple[str, ...]] = {}
        # Where(rows, 0, P) over P = Softmax(z) (Attention's body zeroes fully masked rows so):
        # Where node id -> the Softmax's; see _guarded_softmaxes
        self.guarded = _guarded_softmaxes(fwd)
        self.guarded_by = {softmax: where for where, softmax in self.guarded.items()}

    def run(self) -> TrainingStep:
        self._copy_forward()
        param_ids = [self.remap[p] for p in self.params]
        pending = self._count_contributions()
        opt = OptimizerStep(self.em, self.options.optimizer, param_ids)
        self._set_grad(self.remap[self.loss], self.em.const(np.ones(self.fwd.tensors[self.loss].shape,
                                                                    dtype=self.fwd.tensors[self.loss].dtype)))
        for nid in reversed(self.on_path):
            for t in self._backward(self.fwd.nodes[nid]):
                if t in pending:
                    pending[t] -= 1
                    if pending[t] == 0:
                        self.em.begin(self.b.tensor(t).name)
                        opt.update(t, self.grads[t])
        grads_out = not opt.enabled or self.options.keep_grads
        grad_names = self._name_gradients(param_ids, grads_out)
        self.b.output(self.remap[self.loss])
        if grads_out:
            for p in param_ids:
                self.b.output(self.grads[p])
        for t in opt.outputs():
            self.b.output(t)
        graph = _rename(self.b.build(), grad_names)
        names = [self.fwd.tensors[p].name for p in self.params]
        return TrainingStep(
            graph=graph,
            loss=self.fwd.tensors[self.loss].name,
            params=tuple(names),
            grads={n: f"{n}_grad" for n in names},
            updates=dict(opt.updates),
            state=tuple(opt.state),
            saved=self.saved,
            forward_nodes=len(self.nodes),
        )

    def _copy_forward(self) -> None:
        fwd, b = self.fwd, self.b
        keep = _loss_ancestors(fwd, self.loss)
        used = {t for nid in keep for t in fwd.nodes[nid].inputs if t != NO_TENSOR} | {self.loss}
        for t in fwd.inputs:
            self.remap[t] = b.input(fwd.tensors[t].name, fwd.tensors[t].dtype, fwd.tensors[t].shape)
        trainable = set(self.params)
        for t in fwd.tensors:
            if t.kind in (TensorKind.TRAINABLE, TensorKind.FROZEN) and t.id in used:
                self.remap[t.id] = b.initializer(t.name, fwd.values[t.id], trainable=t.id in trainable)
                if t.id not in trainable:
                    self.values[self.remap[t.id]] = np.asarray(fwd.values[t.id])
        on_path = set(self.on_path)
        for node in fwd.nodes:
            if node.id not in keep:
                continue
            outs: list = [None if t == NO_TENSOR else (fwd.tensors[t].name, fwd.tensors[t].dtype, fwd.tensors[t].shape)
                          for t in node.outputs]
            rule = _rule(node)
            if node.id in on_path and rule is not None and rule.extra_outputs is not None:
                value_of = lambda t: None if t == NO_TENSOR else fwd.values.get(t)  # noqa: E731
                for slot, (suffix, dtype, shape) in sorted(rule.extra_outputs(node, fwd.tensors.__getitem__,
                                                                                value_of).items()):
                    outs.extend([None] * (slot + 1 - len(outs)))
                    if outs[slot] is None:
                        outs[slot] = (self._free_name(f"{node.name}__{suffix}"), dtype, shape)
            ins = [NO_TENSOR if t == NO_TENSOR else self.remap[t] for t in node.inputs]
            new_outs = b.node(node.op_type, ins, outs, name=node.name, domain=node.domain, attrs=node.attrs)
            for old, new in zip(node.outputs, new_outs):
                if old != NO_TENSOR:
                    self.remap[old] = new
            self.nodes[node.id] = Node(len(self.nodes), node.name, node.op_type, tuple(ins), new_outs, node.domain,
                                       node.attrs)

    def _free_name(self, stem: str) -> str:
        """``stem`` (or ``stem_k``) unused by the forward model and the graph built so far."""
        name, k = stem, 0
        while name in self.fwd.by_name or self.b.has(name):
            name, k = f"{stem}_{k}", k + 1
        return name

    def _needed_slots(self, node: Node) -> list[int]:
        return [i for i in _rule_inputs(self.fwd, node) if self.active[node.inputs[i]]]

    def _count_contributions(self) -> dict[int, int]:
        """Per trainable parameter (new id): how many gradient terms will arrive."""
        counts = {self.remap[p]: 0 for p in self.params}
        for nid in self.on_path:
            node = self.fwd.nodes[nid]
            for i in self._needed_slots(node):
                t = self.remap[node.inputs[i]]
                if t in counts:
                    counts[t] += 1
        return counts

    def _set_grad(self, t: int, g: int) -> None:
        old = self.grads.get(t)
        if old is not None:
            self.grad_refs[old] -= 1
        self.grads[t] = g
        self.grad_refs[g] += 1

    def _backward(self, fwd_node: Node) -> list[int]:
        """Run one rule; accumulate its input gradients. Returns the tensors that got a term."""
        rule: GradRule = RULES[fwd_node.op_type]
        node = self.nodes[fwd_node.id]
        need = self._needed_slots(fwd_node)
        dys = tuple(self.grads.get(t) if t != NO_TENSOR and rule.carries(k) else None
                    for k, t in enumerate(node.outputs))
        self.em.begin(node.name)
        stand_in = {}
        if fwd_node.id in self.guarded_by:  # the Softmax reads the guarded probabilities
            stand_in = {node.outputs[0]: self.nodes[self.guarded_by[fwd_node.id]].outputs[0]}
        ctx = BackwardContext(node, self.em, dys, frozenset(need), self.values, stand_in=stand_in)
        try:
            # the guard passes its gradient through as it is (the Softmax's rule zeroes the guarded rows)
            result = {2: dys[0]} if fwd_node.id in self.guarded else rule.backward(ctx)
        except GraphError as err:  # a rule's own failure: name the node (it said only the emitter's words)
            raise GraphError(f"the gradient rule for {node.op_type} (node {node.name!r}) failed: {err}; this is "
                             "a memplan bug: please report it with the model") from err
        got = []
        for i in need:
            t, g = node.inputs[i], result.get(i)
            if g is None or self.em.shape(g) != self.em.shape(t):
                raise GraphError(
                    f"gradient rule for {node.op_type} (node {node.name!r}) returned "
                    f"{'nothing' if g is None else list(self.em.shape(g))} for input {i}, expected "
                    f"{list(self.em.shape(t))}"
                )
            if t not in self.grads:
                self._set_grad(t, g)
            elif sum(v == g for v in result.values()) == 1 and not self.grad_refs[g]:
                self._set_grad(t, self.em.accumulate(self.grads[t], g))
            else:
                self._set_grad(t, self.em.add(self.grads[t], g))
            got.append(t)
        self.saved[node.name] = tuple(self.b.tensor(t).name for t in ctx.saved)
        return got

    def _name_gradients(self, param_ids: list[int], outputs: bool) -> dict[int, str]:
        """``<param>_grad`` for parameters (an Identity where the tensor is shared or not a backward
        output, if gradients are outputs), ``<tensor>__grad`` for other gradients where free.
        Returns the renames."""
        n_forward = len(self.nodes)
        renames: dict[int, str] = {}
        taken: set[str] = set()  # names given by renames (the builder knows the others)
        for p in param_ids:
            g, name = self.grads[p], f"{self.b.tensor(p).name}_grad"
            if name in taken or self.b.has(name):
                raise ModelImportError(f"cannot name the gradient of {self.b.tensor(p).name!r}: the model already has a "
                                       f"tensor {name!r}, the name the step gives it; rename that tensor in the model")
            if self.b.tensor(g).producer >= n_forward and g not in renames:
                renames[g] = name
            elif outputs:
                self.em.begin(self.b.tensor(p).name)
                self._set_grad(p, self.em.unary("Identity", g, out_name=name))
            taken.add(name)
        for t in sorted(set(self.grads) - set(param_ids)):
            g = self.grads[t]
            name = f"{self.b.tensor(t).name}__grad"
            if self.b.tensor(g).producer >= n_forward and g not in renames and name not in taken \
                    and not self.b.has(name):
                renames[g] = name
                taken.add(name)
        return renames


def _rename(graph: Graph, names: Mapping[int, str]) -> Graph:
    if not names:
        return graph
    tensors = tuple(dataclasses.replace(t, name=names[t.id]) if t.id in names else t for t in graph.tensors)
    return dataclasses.replace(graph, tensors=tensors).validate()
