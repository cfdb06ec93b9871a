"""memplan's graph IR: tensors and nodes with dense integer ids, nodes in schedule order.

The IR is ONNX-free on purpose: the planner only needs sizes, producers, consumers and op types;
the passes (``passes/``) translate to and from ONNX. Everything is immutable; passes build new
graphs with :class:`GraphBuilder`.

Invariants checked by :meth:`Graph.validate`:
  * ``tensors[i].id == i`` and ``nodes[j].id == j`` (dense ids);
  * every node input is a graph input, an initializer, or the output of an earlier node
    (so the node order is a valid schedule and the graph is acyclic);
  * every tensor is produced at most once; graph outputs exist.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import gc
import math
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from planner.errors import GraphError

#: Missing optional input (ONNX's empty name).
NO_TENSOR = -1

#: Node attributes named ``memplan.*`` are memplan's own notes for autodiff, not ONNX attributes:
#: the exporter leaves them out. PADDING_IDX on a Gather: torch's ``nn.Embedding(padding_idx=k)``,
#: whose row k gets no gradient (only the FX record of a torch.export-based file tells it).
INTERNAL_ATTR_PREFIX = "memplan."
PADDING_IDX = "memplan.padding_idx"


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was after): for passes that make a
    few objects per node of a graph of a few hundred thousand and no cycles, where the collections
    their count sets off walk every object again and again (passes/rewrite.py apply_schedule: 2.5
    of 6 CPU seconds on the lstm fixture's plan of 733k events)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class TensorKind(enum.Enum):
    """Where a tensor's memory comes from."""

    INPUT = "input"  # fed by the caller at run time; part of the constant base
    TRAINABLE = "trainable"  # float initializer that gets a gradient; constant base
    FROZEN = "frozen"  # any other initializer (ints, BN running stats, frozen weights); constant base
    ACTIVATION = "activation"  # produced by a node; dynamic memory


#: Bits per element of each element type (sub-byte types round up per tensor).
DTYPE_BITS: Mapping[str, int] = MappingProxyType(
    {
        "float64": 64, "float32": 32, "float16": 16, "bfloat16": 16,
        "float8e4m3fn": 8, "float8e4m3fnuz": 8, "float8e5m2": 8, "float8e5m2fnuz": 8,
        "float8e8m0": 8, "float4e2m1": 4,
        "int64": 64, "int32": 32, "int16": 16, "int8": 8, "int4": 4, "int2": 2,
        "uint64": 64, "uint32": 32, "uint16": 16, "uint8": 8, "uint4": 4, "uint2": 2,
        "bool": 8, "complex64": 64, "complex128": 128,
        # Strings have no fixed size; we count a pointer per element (what ORT stores inline).
        "string": 64,
    }
)

FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
#: Half-precision floats: Adam keeps their state in float32 (passes/optimizer.py); ORT's CPU provider
#: has few kernels for them (passes/verify.py).
HALF_DTYPES = frozenset({"float16", "bfloat16"})


def tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    """Exact byte size of a dense tensor (sub-byte element types packed, rounded up)."""
    try:
        bits = DTYPE_BITS[dtype]
    except KeyError:
        raise GraphError(f"unknown element type {dtype!r}; known: {', '.join(sorted(DTYPE_BITS))}") from None
    return (math.prod(shape) * bits + 7) // 8


@dataclass(frozen=True, slots=True)
class Tensor:
    id: int  # dense index into Graph.tensors
    name: str  # unique name (the ONNX value name)
    dtype: str  # element type, a key of DTYPE_BITS
    shape: tuple[int, ...]  # static shape; () is a scalar
    kind: TensorKind
    producer: int = NO_TENSOR  # id of the producing node, NO_TENSOR for inputs/initializers

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.dtype, self.shape)

    @property
    def is_constant_base(self) -> bool:
        """Alive for the whole run (inputs and initializers)."""
        return self.kind is not TensorKind.ACTIVATION


@dataclass(frozen=True, slots=True)
class Node:
    id: int  # dense index into Graph.nodes == position in the schedule
    name: str  # unique node name
    op_type: str
    inputs: tuple[int, ...]  # tensor ids; NO_TENSOR for a missing optional input
    outputs: tuple[int, ...]  # tensor ids; NO_TENSOR for an omitted optional output
    domain: str = ""  # "" is the default ONNX domain
    # Attribute values as plain Python (int, float, str, bytes, lists of those, numpy arrays).
    attrs: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)


@dataclass(frozen=True)
class Graph:
    tensors: tuple[Tensor, ...]
    nodes: tuple[Node, ...]  # schedule order
    inputs: tuple[int, ...]  # graph inputs, in signature order
    outputs: tuple[int, ...]  # graph outputs, in signature order
    # Initializer values by tensor id (numpy arrays). Not compared: graphs compare structurally.
    values: Mapping[int, np.ndarray] = field(default_factory=dict, compare=False)
    opsets: Mapping[str, int] = field(default_factory=lambda: {"": 17}, compare=False)
    name: str = "graph"

    # ---- derived views -------------------------------------------------------------------
    @property
    def onnx_opset(self) -> int:
        """The default (ai.onnx) domain's opset version, 17 where none is given."""
        return int(self.opsets.get("", self.opsets.get("ai.onnx", 17)))

    @cached_property
    def by_name(self) -> Mapping[str, int]:
        return MappingProxyType({t.name: t.id for t in self.tensors})

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """consumers[t] = ids of the nodes reading tensor t, ascending (each node once)."""
        acc: list[list[int]] = [[] for _ in self.tensors]
        for node in self.nodes:
            for t in dict.fromkeys(node.inputs):
                if t != NO_TENSOR:
                    acc[t].append(node.id)
        return tuple(tuple(c) for c in acc)

    @cached_property
    def output_set(self) -> frozenset[int]:
        return frozenset(self.outputs)

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[self.by_name[name]]
        except KeyError:
            raise GraphError(f"no tensor named {name!r} in graph {self.name!r}") from None

    def initializers(self) -> list[Tensor]:
        return [t for t in self.tensors if t.kind in (TensorKind.TRAINABLE, TensorKind.FROZEN)]

    def names(self) -> set[str]:
        """Every tensor and node name, as a new set: what ``fresh_name`` must steer around."""
        return {t.name for t in self.tensors} | {n.name for n in self.nodes}

    @property
    def base_bytes(self) -> int:
        """Bytes alive for the whole run: graph inputs and initializers."""
        return sum(t.nbytes for t in self.tensors if t.is_constant_base)

    # ---- checks --------------------------------------------------------------------------
    def validate(self) -> "Graph":
        """Raise GraphError if an invariant from the module docstring is broken; return self."""
        for i, t in enumerate(self.tensors):
            if t.id != i:
                raise GraphError(f"tensor {t.name!r} has id {t.id}, expected {i}")
        if len(self.by_name) != len(self.tensors):
            raise GraphError("tensor names are not unique")
        if len({n.name for n in self.nodes}) != len(self.nodes):  # plans name the nodes they compute
            seen: set[str] = set()
            twice = next(n.name for n in self.nodes if n.name in seen or seen.add(n.name))
            raise GraphError(f"node name {twice!r} is used twice")
        ready = [t.kind is not TensorKind.ACTIVATION for t in self.tensors]
        for j, node in enumerate(self.nodes):
            if node.id != j:
                raise GraphError(f"node {node.name!r} has id {node.id}, expected {j}")
            for t in node.inputs:
                if t != NO_TENSOR and not ready[t]:
                    raise GraphError(
                        f"node {node.name!r} ({node.op_type}) reads {self.tensors[t].name!r} before it is "
                        "produced: the graph has a cycle or is not in topological order"
                    )
            for t in node.outputs:
                if t == NO_TENSOR:
                    continue
                if ready[t]:
                    raise GraphError(f"tensor {self.tensors[t].name!r} is produced twice (again by {node.name!r})")
                if self.tensors[t].producer != j:
                    raise GraphError(f"tensor {self.tensors[t].name!r} does not record {node.name!r} as producer")
                ready[t] = True
        for t in self.outputs:
            if not ready[t]:
                raise GraphError(f"graph output {self.tensors[t].name!r} is never produced")
        return self

    def summary(self) -> str:
        return f"{self.name}: {len(self.nodes)} nodes, {len(self.tensors)} tensors"


class GraphBuilder:
    """Mutable helper that assembles a Graph; used by importers, autodiff, rewrites and tests.

    Nodes are appended in schedule order. ``build()`` returns a validated, immutable Graph.
    """

    def __init__(self, name: str = "graph", opsets: Mapping[str, int] | None = None):
        self.name = name
        self.opsets = dict(opsets or {"": 17})
        self._tensors: list[Tensor] = []
        self._nodes: list[Node] = []
        self._values: dict[int, np.ndarray] = {}
        self._by_name: dict[str, int] = {}
        self._node_names: set[str] = set()
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    # tensors -------------------------------------------------------------------------------
    def _add(self, name: str, dtype: str, shape: Iterable[int], kind: TensorKind, producer: int) -> int:
        if name in self._by_name:
            raise GraphError(f"tensor name {name!r} is used twice")
        tid = len(self._tensors)
        self._tensors.append(Tensor(tid, name, dtype, tuple(map(int, shape)), kind, producer))
        self._by_name[name] = tid
        return tid

    def input(self, name: str, dtype: str, shape: Iterable[int]) -> int:
        tid = self._add(name, dtype, shape, TensorKind.INPUT, NO_TENSOR)
        self.inputs.append(tid)
        return tid

    def initializer(self, name: str, value: np.ndarray, trainable: bool | None = None) -> int:
        value = np.asarray(value)
        dtype = _numpy_dtype_name(value.dtype)
        if trainable is None:
            trainable = dtype in FLOAT_DTYPES
        kind = TensorKind.TRAINABLE if trainable else TensorKind.FROZEN
        tid = self._add(name, dtype, value.shape, kind, NO_TENSOR)
        self._values[tid] = value
        return tid

    def node(
        self,
        op_type: str,
        inputs: Sequence[int],
        outputs: Sequence[tuple[str, str, Iterable[int]] | None],
        *,
        name: str | None = None,
        domain: str = "",
        attrs: Mapping[str, Any] | None = None,
    ) -> tuple[int, ...]:
        """Append a node; ``outputs`` are (name, dtype, shape) triples (None = omitted output).

        Node names are unique: an unnamed node is ``<op>_<index>``, and a name taken already gets
        a ``_<k>`` suffix (a file's unnamed Identity became 'Identity_4' beside the file's own
        'Identity_4', and plans computed the wrong one; fuzzed, stop 49)."""
        nid = len(self._nodes)
        out_ids = tuple([
            NO_TENSOR if spec is None else self._add(spec[0], spec[1], spec[2], TensorKind.ACTIVATION, nid)
            for spec in outputs
        ])
        want = name or f"{op_type}_{nid}"
        unique, k = want, 0
        while unique in self._node_names:
            k += 1
            unique = f"{want}_{k}"
        self._node_names.add(unique)
        self._nodes.append(Node(nid, unique, op_type, tuple(inputs), out_ids, domain, dict(attrs or {})))
        return out_ids

    def output(self, tid: int) -> None:
        self.outputs.append(tid)

    def producer_node(self, tid: int) -> Node | None:
        """The node that made ``tid`` (None for inputs and initializers)."""
        nid = self._tensors[tid].producer
        return None if nid == NO_TENSOR else self._nodes[nid]

    def is_read(self, tid: int) -> bool:
        """Whether a node appended so far reads ``tid``."""
        return any(tid in n.inputs for n in self._nodes[max(0, self._tensors[tid].producer):])

    def replace_node(self, nid: int, inputs: Sequence[int], attrs: Mapping[str, Any]) -> None:
        """Give node ``nid`` other inputs and attributes (its outputs stay); the inputs must be made
        before it."""
        self._nodes[nid] = dataclasses.replace(self._nodes[nid], inputs=tuple(inputs), attrs=dict(attrs))

    def has(self, name: str) -> bool:
        return name in self._by_name

    def id(self, name: str) -> int:
        return self._by_name[name]

    def added(self, nid: int) -> Node:
        """The ``nid``-th node appended."""
        return self._nodes[nid]

    @property
    def nodes_added(self) -> int:
        """How many nodes were appended so far (the next node's id)."""
        return len(self._nodes)

    def value(self, tid: int) -> np.ndarray | None:
        """The value of initializer ``tid`` (None for any other tensor)."""
        return self._values.get(tid)

    def tensor(self, tid: int) -> Tensor:
        return self._tensors[tid]

    def build(self) -> Graph:
        graph = Graph(
            tensors=tuple(self._tensors),
            nodes=tuple(self._nodes),
            inputs=tuple(self.inputs),
            outputs=tuple(self.outputs),
            values=MappingProxyType(dict(self._values)),
            opsets=MappingProxyType(dict(self.opsets)),
            name=self.name,
        )
        return graph.validate()


class GraphAppender:
    """Base of the passes that rewrite a graph by appending: the input graph's tensors keep their
    ids (new ones are appended), nodes are re-listed in ``nodes`` (kept ones as they are, new ones
    added), and :meth:`finish` renumbers the nodes and points each activation at its producer."""

    def __init__(self, graph: Graph):
        self.g = graph
        self.tensors: list[Tensor] = list(graph.tensors)
        self.values = dict(graph.values)
        self.names = {t.name for t in graph.tensors}
        self.node_names = {n.name for n in graph.nodes}
        self.nodes: list[Node] = []  # ids fixed by finish()
        self.opset = graph.onnx_opset

    def add_tensor(self, base: str, dtype: str, shape: Iterable[int], kind: TensorKind = TensorKind.ACTIVATION) -> int:
        """A new tensor named ``base`` (or ``base_k``); its id."""
        tid = len(self.tensors)
        self.tensors.append(Tensor(tid, fresh_name(base, self.names), dtype, tuple(int(d) for d in shape), kind))
        return tid

    def add_const(self, base: str, value: np.ndarray) -> int:
        """A new initializer holding ``value``; its id."""
        value = np.asarray(value)
        tid = self.add_tensor(base, value.dtype.name, value.shape, TensorKind.FROZEN)
        self.values[tid] = value
        return tid

    def add_node(self, base: str, op: str, inputs: Iterable[int], outputs: Iterable[int], attrs=None,
                 name: str | None = None) -> None:
        """Append a default-domain node, named ``name`` or a fresh name from ``base``."""
        node_name = name if name is not None else fresh_name(base, self.node_names)
        self.nodes.append(Node(len(self.nodes), node_name, op, tuple(inputs), tuple(outputs), "", dict(attrs or {})))

    def finish(self) -> Graph:
        nodes = tuple(dataclasses.replace(n, id=i) for i, n in enumerate(self.nodes))
        producer = {t: n.id for n in nodes for t in n.outputs if t != NO_TENSOR}
        tensors = tuple(dataclasses.replace(t, producer=producer.get(t.id, NO_TENSOR))
                        if t.kind is TensorKind.ACTIVATION else t for t in self.tensors)
        return dataclasses.replace(self.g, tensors=tensors, nodes=nodes, values=dict(self.values)).validate()


def fresh_name(stem: str, taken: set[str]) -> str:
    """``stem`` (or ``stem_k``) not in ``taken``; records it."""
    name, k = stem, 0
    while name in taken:
        name, k = f"{stem}_{k}", k + 1
    taken.add(name)
    return name


def _numpy_dtype_name(dt: np.dtype) -> str:
    name = np.dtype(dt).name
    if name == "bool":
        return "bool"
    if name == "object":  # onnx's numpy_helper gives a STRING tensor as an object array of bytes
        return "string"
    if name in DTYPE_BITS:
        return name
    raise GraphError(f"initializer has unsupported numpy dtype {name!r}")
