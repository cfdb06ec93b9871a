"""Liveness intervals, the memory timeline and the peak of one run, under ORT's memory model.

The model (measured on CPU ORT 1.31 with the planned session options of passes/verify.py, i.e. arena,
memory pattern and memory reuse off, PRIORITY_BASED order; see tests/test_liveness.py and
tests/test_peak_accuracy.py):
  * graph inputs and initializers are the constant base, resident for the whole run;
  * run order (:func:`run_order`): PRIORITY_BASED is a topological sort that takes, of the ready
    nodes, Shape/Size first, then the lowest node index. A sorted file's next node is always ready,
    so the others run in file order, and each Shape/Size runs as soon as its input exists, wherever
    the file puts it (the rewriter's ordering edges read their gate through a Size: zoo:gpt at 70%
    held 11 of those 64-byte scalars at the peak, which file order did not count, and the written
    model peaked 704 bytes over the prediction, over its budget).
    But ORT inlines the function body of ops its CPU EP has no kernel for (SoftmaxCrossEntropyLoss,
    NegativeLogLikelihoodLoss, HardSwish, Mish, ...) with node indices after all others, so such a
    body ran late (the loss's log-probabilities lived to the end, and independent backward nodes ran
    early, e.g. every Relu mask right after the forward: +10-32% peak on the zoo's training steps).
    passes/onnx_export.py writes those bodies in place, so file order is again run order;
  * a node's outputs are allocated when it starts, while its inputs are still resident;
  * zero-copy views (Reshape, Identity, Squeeze, Unsqueeze, Flatten) share their input's buffer; a
    buffer is freed right after the last step that reads any of its views;
  * in place: IN_PLACE_OPS (Relu, Sigmoid, Tanh, Softmax, Clip, Cast, ScatterElements, ...) write over their
    input's buffer when this step is that buffer's last read (once), the buffer is dynamic and holds
    no graph output, and the shapes and element sizes match. ORT's allocation planner does this even
    with memory reuse off, which only stops it handing dead buffers to new tensors;
  * a graph output always gets a buffer of its own (ORT allocates outputs for the caller), even from
    a view or in-place op, and stays to the end; so does a buffer that nobody reads;
  * an initializer that is a graph output is copied into a buffer of its own for the caller when
    the run starts, held to the end (once, however often it is listed); a graph input that is a
    graph output is handed back as it is (measured with passes/alloc_counter.py);
  * kernel scratch lives only during its node: Where a temporary per branch of shape broadcast(cond,
    branch), Conv MLAS's im2col working buffer (all of it, a panel per thread, or none),
    ConvTranspose its column buffer, Softmax/LogSoftmax/Hardmax over an axis other than the last
    its input transposed there and back, Einsum its transposed operands and pairwise products
    (planner/einsum.py), ScatterElements an int64 copy of its indices, Dropout a bool
    mask when the graph takes none, fused LSTM/GRU/RNN their gate projections of every step
    (per direction), state and bias buffers and the final states the graph does not take,
    SoftmaxCrossEntropyLoss the temporaries of its function body, QLinearMatMul an int32 product
    of the output's element count
    (calibrated with ``session.collect_node_memory_stats_to_file`` and single-node runs);
  * every tensor and kernel working buffer ORT's allocator gives takes whole 64-byte lines;
  * function ops ORT runs as their bodies (losses, HardSwish, Mish, GroupNormalization) are counted
    here as one node, which misses the body's temporaries (2x at HardSwish); the graphs memplan plans
    have the bodies written in (passes/function_ops.py).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from planner.einsum import einsum_requests, einsum_scratch
from planner.errors import GraphError
from planner.graph import DTYPE_BITS, NO_TENSOR, Graph, Node, TensorKind, tensor_bytes

#: Ops whose output lives in host memory when the model runs on a device.
HOST_OPS = frozenset({"MemcpyToHost"})
#: Ops whose kernel scratch ORT's CPU kernel takes outside its allocator (ScatterElements' int64
#: index copy is a std::vector; Dropout's mask when the graph takes none): real memory, but not
#: allocator bytes (measured with passes/alloc_counter.py).
HEAP_SCRATCH_OPS = frozenset({"ScatterElements", "Dropout"})
#: Ops whose output is a zero-copy view of input 0.
VIEW_OPS = frozenset({"Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten"})
#: Ops whose CPU kernel may write output 0 over this input's buffer (ORT's KernelDef MayInplace;
#: measured on 1.31: Add, Mul, Sub, Div, Neg, Exp, Sqrt, Sign, Erf, ScatterND, BatchNormalization,
#: Transpose, ... never are). Cast is one, not a view, even to its own type: it copies into a buffer
#: of its own unless this is its input's last read (float->float of a tensor read again later, or of
#: a graph input or initializer, allocates; float->int32 on the last read does not).
IN_PLACE_OPS: Mapping[str, int] = MappingProxyType({
    op: 0 for op in ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "HardSigmoid", "Softplus",
                     "Softsign", "ThresholdedRelu", "Clip", "Softmax", "LogSoftmax", "Cast", "ScatterElements")
})


def _einsum_args(graph: Graph, node: Node) -> tuple[str, list, int, float]:
    """An Einsum node's equation, input shapes, output element count and element bytes
    (planner/einsum.py's einsum_scratch / einsum_requests)."""
    equation = node.attr("equation")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    y = graph.tensors[node.outputs[0]]
    shapes = [graph.tensors[t].shape for t in node.inputs if t != NO_TENSOR]
    return equation, shapes, math.prod(y.shape), DTYPE_BITS[y.dtype] / 8


@dataclass(frozen=True)
class MemoryModel:
    """How ORT allocates; one field per measured behaviour."""

    # MLAS's im2col panel: 16384 floats per thread for a Conv that expands its input a slice at a time
    # (see _conv_workspace for the Convs that expand all of it, or nothing). 131072 before: that was
    # two panels, calibrated on a 2-core machine's default of two intra-op threads.
    conv_workspace_per_thread: int = 65536
    # intra-op threads of the run the model describes (the working buffer is per thread).
    threads: int = 1
    # Where's CPU kernel first selects each branch into a temporary of shape broadcast(cond, branch),
    # then merges them into the output: 2x the output for a full-size condition (measured).
    where_branch_temporaries: bool = True
    # Dropout without its mask output still fills a bool mask: 1 byte per element (measured).
    dropout_mask_bytes: int = 1
    # SoftmaxCrossEntropyLoss runs as a function body whose log-probabilities (1x its input) are
    # resident during the node, as the log_prob output if requested, else as scratch (measured).
    sce_scratch_factor: int = 1
    # ORT's allocation planner runs IN_PLACE_OPS in place on their input's last use, whatever
    # enable_mem_reuse says (that only stops reusing dead buffers); False models a runtime that never does.
    in_place: bool = True
    # ScatterElements copies its indices into an int64 vector: 8 bytes per index (measured, int32 too).
    scatter_index_bytes: int = 8
    # MemcpyToHost's output lives in host memory: not device memory, unless we model a CPU run
    # (where ORT runs the swap nodes as plain copies in the same RAM).
    host_copies_resident: bool = False
    # ORT's execution frame asks its allocator for whole lines of kAllocAlignment (64) bytes per
    # tensor: 1001 floats take 4032 bytes, not 4004 (measured, tests/test_alloc_counter.py).
    # So are kernel working buffers from it (Where's branches, ConvTranspose's columns, a full im2col,
    # LRN's two; measured); ScatterElements' and Dropout's malloc'd ones are not (HEAP_SCRATCH_OPS).
    # 1 models a runtime that allocates exact bytes.
    alloc_line: int = 64
    # ORT copies an initializer that is a graph output into an output buffer when the run starts
    # and holds it to the end (measured: 2x the prediction on a model returning a weight). False
    # models a runtime that hands the initializer back as it is.
    initializer_output_copies: bool = True

    def output_copy_bytes(self, graph: Graph) -> int:
        """Bytes of the run-long copies of the initializers that are graph outputs."""
        if not self.initializer_output_copies:
            return 0
        return sum(self.buffer_bytes(graph.tensors[t].nbytes) for t in dict.fromkeys(graph.outputs)
                   if graph.tensors[t].kind in (TensorKind.TRAINABLE, TensorKind.FROZEN))

    def buffer_bytes(self, nbytes: int) -> int:
        """Bytes ORT allocates for a tensor of ``nbytes``."""
        line = self.alloc_line
        return -(-int(nbytes) // line) * line if line > 1 else int(nbytes)

    def view_source(self, graph: Graph, node: Node) -> int:
        """Tensor id whose buffer output 0 shares, or NO_TENSOR."""
        if not node.inputs or node.inputs[0] == NO_TENSOR:
            return NO_TENSOR
        src = node.inputs[0]
        if node.op_type in VIEW_OPS and node.domain == "":
            return src
        return NO_TENSOR

    def in_place_source(self, node: Node) -> int:
        """Input tensor id whose buffer output 0 may take over (if it dies here), or NO_TENSOR."""
        slot = IN_PLACE_OPS.get(node.op_type) if self.in_place and node.domain in ("", "ai.onnx") else None
        if slot is None or slot >= len(node.inputs):
            return NO_TENSOR
        return node.inputs[slot]

    def scratch(self, graph: Graph, node: Node) -> int:
        """Bytes a kernel allocates for itself during its own step."""
        op = node.op_type
        parts = self._requests(graph, node)
        if parts is not None:
            return sum(parts)
        if op == "Dropout" and (len(node.outputs) < 2 or node.outputs[1] == NO_TENSOR):
            return self.dropout_mask_bytes * math.prod(graph.tensors[node.outputs[0]].shape)
        if op == "Conv":
            return self._conv_workspace(graph, node)
        if op == "ConvTranspose":
            x, w = graph.tensors[node.inputs[0]], graph.tensors[node.inputs[1]]
            # one group's column buffer at a time: (C_out / group) * prod(kernel) * prod(input spatial)
            cols = w.shape[1] * math.prod(w.shape[2:]) * math.prod(x.shape[2:])
            return self.buffer_bytes(cols * x.nbytes // max(1, math.prod(x.shape)))
        if op == "ScatterElements":
            return self.scatter_index_bytes * math.prod(graph.tensors[node.inputs[1]].shape)
        if op == "Einsum" and node.domain in ("", "ai.onnx"):
            return einsum_scratch(*_einsum_args(graph, node), self.buffer_bytes)
        if op == "QLinearMatMul" and node.domain in ("", "ai.onnx"):
            # ORT's CPU kernel (quantize_linear_matmul.cc) multiplies into an int32 buffer of the
            # output's element count, then requantizes it into the output (measured, 2-4D)
            return self.buffer_bytes(4 * math.prod(graph.tensors[node.outputs[0]].shape))
        if op == "Attention" and node.domain in ("", "ai.onnx"):
            return self._attention_scratch(graph, node)
        if op == "SoftmaxCrossEntropyLoss":
            x = graph.tensors[node.inputs[0]].nbytes
            has_log_prob = len(node.outputs) > 1 and node.outputs[1] != NO_TENSOR
            return (self.sce_scratch_factor - (1 if has_log_prob else 0)) * self.buffer_bytes(x)
        return 0

    def scratch_parts(self, graph: Graph, node: Node) -> list[int]:
        """``scratch`` as the kernel's separate requests, in the order it makes them (an arena
        places each on its own): a fused LSTM / GRU / RNN's dozen, Where's two branch selections,
        LRN's scale and padded squares, a Softmax over an inner axis's two transposed copies (each
        measured on single-node models: as one lump of their sum the replay asked kNextPowerOfTwo's
        ladder for a region they need not share, a least limit 1.33x what ORT runs under); else
        the one lump."""
        parts = self._requests(graph, node)
        if parts is not None:
            return [b for b in parts if b > 0]
        lump = self.scratch(graph, node)
        return [lump] if lump > 0 else []

    def _requests(self, graph: Graph, node: Node) -> list[int] | None:
        """The separate working buffers of a kernel that takes several (``scratch`` sums them,
        ``scratch_parts`` lists them); None for the others."""
        op = node.op_type
        if op in ("LSTM", "GRU", "RNN") and node.domain in ("", "ai.onnx"):
            return self._recurrent_buffers(graph, node)
        if op == "Where" and self.where_branch_temporaries:
            return self._where_branches(graph, node)
        if op == "LRN" and len(graph.tensors[node.inputs[0]].shape) == 4:
            return self._lrn_buffers(graph, node)
        if op in ("Softmax", "LogSoftmax", "Hardmax"):
            return self._softmax_transposes(graph, node)
        return None

    def scratch_sequence(self, graph: Graph, node: Node) -> list[tuple[int, int, int]] | None:
        """For a kernel that makes working buffers before its output or frees them before it ends (Einsum,
        planner/einsum.py einsum_requests; Where): its requests in order, (+1, key, bytes) made, (-1, key, 0)
        freed, (0, -1, 0) where the output is made; None for the others (``scratch_parts``).

        Where's CPU kernel (where_op.cc) makes the X selection, then the Y selection, then its output
        to merge them into, and frees Y's, then X's, when it returns: the output lies above the two
        selections in an arena region, not below them (replayed output first, the gpt2 fixture's loss
        predicted 521824 where ORT needs 522336, kNextPowerOfTwo)."""
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Where" and self.where_branch_temporaries:
            x, y = self._where_branches(graph, node)
            return [(1, 0, x), (1, 1, y), (0, -1, 0), (-1, 1, 0), (-1, 0, 0)]
        if node.op_type != "Einsum":
            return None
        return einsum_requests(*_einsum_args(graph, node), self.buffer_bytes)

    def _attention_scratch(self, graph: Graph, node: Node) -> int:
        """ORT's CPU Attention (opset 23): the attention probabilities, batch x query heads x
        query length x key length (past keys included), in the output's type; beside them a copy
        of a boolean mask in that type or, causal without one, a query x key mask. Measured on
        single-node models (4D and 3D inputs, grouped key/value heads, float and boolean masks,
        causal, past keys, softcap): exact in each. Autodiff writes the Attention gradients flow
        through as its function body (passes/autodiff.py); this is the native kernel's."""
        def present(k: int) -> int:
            return node.inputs[k] if len(node.inputs) > k else NO_TENSOR

        q, k, y = (graph.tensors[t] for t in (node.inputs[0], node.inputs[1], node.outputs[0]))
        if len(q.shape) == 4:
            batch, heads, length = q.shape[:3]
            keys = k.shape[2]
        else:
            batch, length = q.shape[:2]
            heads, keys = int(node.attr("q_num_heads", 1)), k.shape[1]
        if present(4) != NO_TENSOR:
            keys += graph.tensors[present(4)].shape[2]
        mask = present(3)
        if mask != NO_TENSOR and graph.tensors[mask].dtype == "bool":
            beside = tensor_bytes(y.dtype, graph.tensors[mask].shape)
        else:
            beside = tensor_bytes(y.dtype, (length, keys)) if node.attr("is_causal", 0) else 0
        probs = self.buffer_bytes(tensor_bytes(y.dtype, (batch, heads, length, keys)))
        return probs + (self.buffer_bytes(beside) if beside else 0)

    def _where_branches(self, graph: Graph, node: Node) -> list[int]:
        """Where's CPU kernel (where_op.cc): the X selection, then the Y selection, each of shape
        broadcast(cond, branch), both held while it merges them into the output."""
        cond, a, b = (graph.tensors[t] for t in node.inputs[:3])
        dtype = graph.tensors[node.outputs[0]].dtype
        return [self.buffer_bytes(tensor_bytes(dtype, np.broadcast_shapes(cond.shape, x.shape))) for x in (a, b)]

    def _lrn_buffers(self, graph: Graph, node: Node) -> list[int]:
        """ORT's CPU LRN (lrn.cc): a scale buffer of x's size, then one image's squares padded by
        size - 1 channels."""
        x = graph.tensors[node.inputs[0]]
        _, c, h, w = x.shape
        per = x.nbytes // max(1, math.prod(x.shape))
        padded = per * (c + int(node.attr("size", 1)) - 1) * h * w
        return [self.buffer_bytes(x.nbytes), self.buffer_bytes(padded)]

    def _softmax_transposes(self, graph: Graph, node: Node) -> list[int]:
        """Softmax / LogSoftmax / Hardmax over one axis other than the last (opset 13 on): ORT's CPU
        kernel transposes it last and back, a temporary of the input's size each way (measured; a
        fuzzed plan ran 1.066x its prediction, stop 49)."""
        if node.domain not in ("", "ai.onnx") or graph.opsets.get("", 13) < 13:
            return []
        x = graph.tensors[node.inputs[0]]
        axis = int(node.attr("axis", -1)) % max(1, len(x.shape))
        return [self.buffer_bytes(x.nbytes)] * 2 if axis != len(x.shape) - 1 else []

    def _recurrent_buffers(self, graph: Graph, node: Node) -> list[int]:
        """The working buffers of ORT's fused LSTM / GRU / RNN CPU kernels (deep_cpu_lstm, deep_cpu_gru,
        rnn.cc) in the order the kernel takes them, all from its allocator and held while the node
        runs (measured per buffer on ORT 1.31 with single-node models: sequence length, batch, input
        and hidden sizes, each direction, with and without bias, sequence_lens, initial states,
        peepholes and each optional output; the same on 1, 2 and 4 threads).

        LSTM and GRU keep one helper per direction, both alive to the end: the input projections of
        every step (4 resp. 3 gates x seq x batch x hidden), the hidden (and LSTM's cell) state of one
        step, the biases (LSTM: one row per gate; GRU: one per batch row), for the reversed direction
        a reversed copy of the input and of the output sequence (the peephole weights are read where
        they are), and the sequence lengths when the graph gives none (int32 per batch row). A final
        state output (Y_h, LSTM's Y_c) the graph does not take is written to a temporary of its shape,
        taken first. RNN projects the input of one direction at a time into a seq x batch x hidden
        buffer, and runs into a temporary Y when Y is not taken.
        """
        line = self.buffer_bytes
        x = graph.tensors[node.inputs[0]]
        if len(x.shape) != 3:
            return []
        elem = x.nbytes // max(1, math.prod(x.shape))
        seq, batch, width = (x.shape[1], x.shape[0], x.shape[2]) if node.attr("layout", 0) else x.shape
        hidden = int(node.attr("hidden_size", 0) or 0)
        direction = node.attr("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        dirs = 2 if direction == "bidirectional" else 1

        def given(slot: int, outputs: bool = False) -> bool:
            ids = node.outputs if outputs else node.inputs
            return slot < len(ids) and ids[slot] != NO_TENSOR

        state = line(dirs * batch * hidden * elem)  # one final state of every direction
        steps = seq * batch * hidden * elem
        if node.op_type == "RNN":
            return [line(steps)] + ([] if given(0, True) else [line(dirs * steps)])
        lstm = node.op_type == "LSTM"
        row, step = line(hidden * elem), line(batch * hidden * elem)
        temporaries = ([] if given(1, True) else [state]) + ([] if not lstm or given(2, True) else [state])
        lengths = [] if given(4) else [line(batch * 4)]  # the sequence lengths, int32

        def helper(reverse: bool) -> list[int]:
            if lstm:  # zero state rows, batched hidden, cell and clipped cell, projections, fused biases
                parts = [row, row, step, step, step, line(4 * steps)] + ([row] * 4 if given(3) else [])
            else:  # current and initial hidden, biases, the recurrent product kept apart, projections
                linear_before_reset = bool(node.attr("linear_before_reset", 0))
                parts = [step, step] + ([step] * (4 if linear_before_reset else 3) if given(3) else [])
                parts += [step] * linear_before_reset + [line(3 * steps)]
            if reverse:
                parts += [line(seq * batch * width * elem), line(steps)]
            return parts

        reverse = [direction == "reverse"] if dirs == 1 else [False, True]
        if lstm:  # both helpers are made, then each runs (and takes its sequence lengths)
            return temporaries + [b for r in reverse for b in helper(r)] + lengths * dirs
        return temporaries + [b for r in reverse for b in helper(r) + lengths]  # GRU: made and run in turn

    def _conv_workspace(self, graph: Graph, node: Node) -> int:
        """MLAS's working buffer for a Conv (its MlasConvPrepare; temp bytes checked per node on ORT 1.31).

        None when the Conv is a plain GEMM: a pointwise kernel (1x1, stride 1, no padding), or one
        input channel per group with a kernel spanning the input's width (or its height, 1 wide).
        The whole im2col matrix (output pixels x channels per group x kernel elements) when a group
        has more filters than output pixels: that is the weight-gradient Conv of a training step,
        whose "kernel" is the output gradient (MiBs, where a fixed panel would say 128 KiB).
        Otherwise one fixed panel per thread, filled a slice of output pixels at a time: one per
        image and group, up to ``threads``, when there are several; up to ``threads`` for a single
        image (MLAS takes fewer for a small Conv, so that bound may be high).
        """
        x, w, y = (graph.tensors[t] for t in (node.inputs[0], node.inputs[1], node.outputs[0]))
        kernel, spatial = list(w.shape[2:]), list(x.shape[2:])
        strides = node.attr("strides") or [1] * len(kernel)
        pads = node.attr("pads") or [0] * (2 * len(kernel))
        dilations = node.attr("dilations") or [1] * len(kernel)
        k = w.shape[1] * math.prod(kernel)  # im2col rows: channels per group x kernel elements
        if all(s == 1 for s in strides) and not any(pads):
            if k == w.shape[1]:
                return 0
            if len(kernel) <= 2 and w.shape[1] == 1 and all(d == 1 for d in dilations):
                kh, kw = ([1] + kernel)[-2:]
                ih, iw = ([1] + spatial)[-2:]
                if kw == iw or (kh == ih and kw == 1):
                    return 0
        out_pixels = math.prod(y.shape[2:])
        group = node.attr("group") or 1
        if w.shape[0] // group > out_pixels:
            return self.buffer_bytes(out_pixels * k * y.nbytes // max(1, math.prod(y.shape)))
        slices = x.shape[0] * group
        return self.conv_workspace_per_thread * (min(self.threads, slices) if slices > 1 else self.threads)


@dataclass(frozen=True)
class Liveness:
    """Buffers and the memory timeline of one run in a given node order."""

    graph: Graph = field(repr=False)
    order: tuple[int, ...]  # node ids in execution order; step s runs node order[s]
    buffer_of: np.ndarray  # tensor id -> buffer id; -1 for the constant base (and views of it)
    buffer_root: np.ndarray  # buffer id -> tensor id that allocated it
    buffer_size: np.ndarray  # bytes
    alloc_step: np.ndarray  # first step the buffer is resident
    free_step: np.ndarray  # last step the buffer is resident (inclusive)
    scratch: np.ndarray  # per-step kernel scratch bytes
    dynamic: np.ndarray  # per-step dynamic bytes (buffers + scratch)
    base_bytes: int  # inputs + initializers
    model: MemoryModel = field(default_factory=MemoryModel, repr=False)
    # bytes counted in ``dynamic`` at every step: the copies of initializers that are graph outputs
    output_copy_bytes: int = 0

    def tensor_bytes(self, t: int) -> int:
        """Bytes ORT allocates for tensor ``t`` (its own buffer, if it had one)."""
        return self.model.buffer_bytes(self.graph.tensors[t].nbytes)

    @property
    def memory(self) -> np.ndarray:
        """Total resident bytes at each step (constant base included)."""
        return self.dynamic + self.base_bytes

    @property
    def peak_step(self) -> int:
        return int(np.argmax(self.dynamic)) if len(self.dynamic) else 0

    @property
    def dynamic_peak(self) -> int:
        # no node runs: ORT still copies the initializers that are graph outputs
        return int(self.dynamic.max()) if len(self.dynamic) else self.output_copy_bytes

    @property
    def allocator_dynamic_peak(self) -> int:
        """``dynamic_peak`` less the scratch of HEAP_SCRATCH_OPS: what ORT's allocator holds at most,
        the figure passes/alloc_counter.py counts."""
        heap = [self.scratch[s] if self.graph.nodes[n].op_type in HEAP_SCRATCH_OPS else 0
                for s, n in enumerate(self.order)]
        return int((self.dynamic - np.array(heap, dtype=np.int64)).max()) if len(self.dynamic) \
            else self.output_copy_bytes

    @property
    def peak_bytes(self) -> int:
        return self.base_bytes + self.dynamic_peak

    def live_buffers(self, step: int) -> np.ndarray:
        """Buffer ids resident at ``step``, largest first."""
        ids = np.nonzero((self.alloc_step <= step) & (self.free_step >= step))[0]
        return ids[np.argsort(-self.buffer_size[ids], kind="stable")]

    def tensors_of(self, buffer: int) -> list[int]:
        return [int(t) for t in np.nonzero(self.buffer_of == buffer)[0]]


def _in_place_input(graph: Graph, node: Node, model: MemoryModel, buffer_of: np.ndarray, reads_left: list[int],
                    pinned: list[bool], step: int) -> int:
    """The input whose buffer ``node``'s output 0 takes over at ``step``, or NO_TENSOR.

    ORT's rule: the kernel allows it, the input's buffer is dynamic, holds no graph output, and this
    is its last read (once, through any of its tensors); input and output have the same element size
    and shape.
    """
    t = model.in_place_source(node)
    if t == NO_TENSOR or not node.outputs or node.outputs[0] == NO_TENSOR:
        return NO_TENSOR
    b = buffer_of[t]
    if b < 0 or pinned[b] or reads_left[b] != step:
        return NO_TENSOR
    if sum(1 for u in node.inputs if u != NO_TENSOR and buffer_of[u] == b) != 1:
        return NO_TENSOR
    x, y = graph.tensors[t], graph.tensors[node.outputs[0]]
    if x.shape != y.shape or DTYPE_BITS[x.dtype] != DTYPE_BITS[y.dtype]:
        return NO_TENSOR
    return t


#: Ops PRIORITY_BASED runs as soon as they are ready (ORT's graph viewer: its high-priority ops).
EARLY_OPS = frozenset({"Shape", "Size"})


def run_order(graph: Graph) -> tuple[int, ...]:
    """The order ORT's PRIORITY_BASED sort runs a topologically sorted ``graph`` in: file order, with
    each Shape and Size moved to just after the node that makes the last of its inputs (those whose
    inputs are all constants or graph inputs first), several at once by node index."""
    n = len(graph.nodes)
    early = [node.op_type in EARLY_OPS and node.domain in ("", "ai.onnx") for node in graph.nodes]
    if not any(early):
        return tuple(range(n))
    made = [t.kind is not TensorKind.ACTIVATION for t in graph.tensors]
    waiting = [0] * n
    readers: dict[int, list[int]] = {}
    for v in range(n):
        if early[v]:
            ins = {t for t in graph.nodes[v].inputs if t != NO_TENSOR and not made[t]}
            waiting[v] = len(ins)
            for t in ins:
                readers.setdefault(t, []).append(v)
    ready = [v for v in range(n) if early[v] and not waiting[v]]
    heapq.heapify(ready)
    order: list[int] = []

    def run(v: int) -> None:
        order.append(v)
        for t in graph.nodes[v].outputs:
            for r in readers.get(t, ()):
                waiting[r] -= 1
                if not waiting[r]:
                    heapq.heappush(ready, r)

    while ready:
        run(heapq.heappop(ready))
    for v in range(n):
        if early[v]:
            continue
        run(v)
        while ready:
            run(heapq.heappop(ready))
    return tuple(order)


def analyze(graph: Graph, order: Sequence[int] | None = None, model: MemoryModel | None = None) -> Liveness:
    """Compute buffers, intervals and the timeline of ``graph`` run in ``order`` (default: the order
    ORT runs its file in, :func:`run_order`)."""
    model = model or MemoryModel()
    n = len(graph.nodes)
    order = run_order(graph) if order is None else tuple(int(i) for i in order)
    if sorted(order) != list(range(n)):
        raise GraphError("order must be a permutation of the node ids")

    nt = len(graph.tensors)
    last_read = np.full(nt, -1, dtype=np.int64)  # last step reading each tensor
    for s, nid in enumerate(order):
        for t in graph.nodes[nid].inputs:
            if t != NO_TENSOR:
                last_read[t] = s
    outputs = graph.output_set
    buffer_of = np.full(nt, -1, dtype=np.int64)
    roots: list[int] = []
    alloc: list[int] = []
    last: list[int] = []  # per buffer: last step reading any tensor in it
    reads_left: list[int] = []  # per buffer: last step any tensor in it will be read (known in advance)
    pinned: list[bool] = []  # per buffer: holds a graph output (ORT never lends it to another tensor)
    scratch = np.zeros(n, dtype=np.int64)
    end = n - 1
    resident = [t.kind is not TensorKind.ACTIVATION for t in graph.tensors]
    for s, nid in enumerate(order):
        node = graph.nodes[nid]
        for t in node.inputs:
            if t == NO_TENSOR:
                continue
            if not resident[t]:
                raise GraphError(
                    f"node {node.name!r} ({node.op_type}) at step {s} reads {graph.tensors[t].name!r} "
                    "before it is produced in this order"
                )
            b = buffer_of[t]
            if b >= 0:
                last[b] = max(last[b], s)
        src = model.view_source(graph, node)
        inplace = _in_place_input(graph, node, model, buffer_of, reads_left, pinned, s)
        for k, t in enumerate(node.outputs):
            if t == NO_TENSOR:
                continue
            resident[t] = True
            shared = src if k == 0 and src != NO_TENSOR else inplace if k == 0 else NO_TENSOR
            if shared != NO_TENSOR and t not in outputs:
                b = buffer_of[shared]  # view or in-place: shares the buffer (or the base, -1)
                buffer_of[t] = b
                if b >= 0:
                    reads_left[b] = max(reads_left[b], int(last_read[t]))
                continue
            if node.op_type in HOST_OPS and not model.host_copies_resident:
                continue  # host memory: buffer_of stays -1, like the constant base
            buffer_of[t] = len(roots)
            roots.append(t)
            alloc.append(s)
            last.append(-1)  # set by readers; -1 means nobody reads it
            reads_left.append(int(last_read[t]))
            pinned.append(t in outputs)
        scratch[s] = model.scratch(graph, node)
    for t in graph.outputs:
        if buffer_of[t] >= 0:
            last[buffer_of[t]] = end
    free = np.array([end if l < 0 else l for l in last], dtype=np.int64)
    alloc_a = np.array(alloc, dtype=np.int64)
    sizes = np.array([model.buffer_bytes(graph.tensors[t].nbytes) for t in roots], dtype=np.int64)
    delta = np.zeros(n + 1, dtype=np.int64)
    np.add.at(delta, alloc_a, sizes)
    np.add.at(delta, free + 1, -sizes)
    copies = model.output_copy_bytes(graph)
    dynamic = np.cumsum(delta[:n]) + scratch + copies
    return Liveness(
        graph=graph,
        order=order,
        buffer_of=buffer_of,
        buffer_root=np.array(roots, dtype=np.int64),
        buffer_size=sizes,
        alloc_step=alloc_a,
        free_step=free,
        scratch=scratch,
        dynamic=dynamic,
        base_bytes=graph.base_bytes,
        model=model,
        output_copy_bytes=copies,
    )
