"""Human-facing summaries of a Liveness: the inspect table, its JSON form and the timeline plot; and
the text and Markdown tables of the bench commands."""
from __future__ import annotations

import io
import os
from typing import Any, Sequence

import numpy as np

from planner.errors import UsageError
from planner.graph import TensorKind
from planner.liveness import Liveness
from planner.units import format_bytes


def base_breakdown(lv: Liveness) -> dict[str, int]:
    g = lv.graph
    out = {k.value: 0 for k in (TensorKind.INPUT, TensorKind.TRAINABLE, TensorKind.FROZEN)}
    for t in g.tensors:
        if t.kind is not TensorKind.ACTIVATION:
            out[t.kind.value] += t.nbytes
    return out


def live_at_peak(lv: Liveness, top: int | None = None) -> list[dict[str, Any]]:
    """Buffers resident at the peak step, largest first, with their tensors and intervals."""
    g = lv.graph
    step_of = {int(n): s for s, n in enumerate(lv.order)}
    rows = []
    for b in lv.live_buffers(lv.peak_step)[:top]:  # None: all; 0 (--top 0): none
        root = g.tensors[int(lv.buffer_root[b])]
        # an in-place chain's buffer holds, at the peak, the last of its tensors made by then (a
        # Sigmoid's output written over a Relu's), not the one that allocated it
        made = [g.tensors[t] for t in lv.tensors_of(b)
                if g.tensors[t].producer in step_of and step_of[g.tensors[t].producer] <= lv.peak_step]
        t = max(made, key=lambda u: step_of[u.producer]) if made else root
        producer = g.nodes[t.producer]
        rows.append({
            "tensor": t.name,
            **({"in_place_of": root.name} if t.id != root.id else {}),
            "shape": list(t.shape),
            "dtype": t.dtype,
            "bytes": int(lv.buffer_size[b]),
            "producer": producer.name,
            "op_type": producer.op_type,
            "alloc_step": int(lv.alloc_step[b]),
            "free_step": int(lv.free_step[b]),
        })
    return rows


def inspect_dict(lv: Liveness, model: str, top: int = 20) -> dict[str, Any]:
    g = lv.graph
    step = lv.peak_step
    node = g.nodes[lv.order[step]] if g.nodes else None
    return {
        "schema": "memplan.inspect/1",
        "model": model,
        "nodes": len(g.nodes),
        "tensors": len(g.tensors),
        "base_bytes": lv.base_bytes,
        "base": base_breakdown(lv),
        "peak_bytes": lv.peak_bytes,
        "dynamic_peak_bytes": lv.dynamic_peak,
        "peak_step": step,
        "peak_node": node.name if node else None,
        "peak_op_type": node.op_type if node else None,
        "peak_scratch_bytes": int(lv.scratch[step]) if len(lv.scratch) else 0,
        # resident at every step, so at the peak too, but in no buffer live_at_peak lists
        "output_copy_bytes": int(lv.output_copy_bytes),
        "live_at_peak": live_at_peak(lv, top),
        "timeline_bytes": [int(x) for x in lv.memory],
    }


def inspect_table(info: dict[str, Any]) -> str:
    b = info["base"]
    lines = [
        f"model        {info['model']}  ({info['nodes']} nodes, {info['tensors']} tensors)",
        f"constant     {format_bytes(info['base_bytes'])}  (inputs {format_bytes(b['input'])}, "
        f"trainable {format_bytes(b['trainable'])}, frozen {format_bytes(b['frozen'])})",
        f"peak         {format_bytes(info['peak_bytes'])} "
        + (f"at step {info['peak_step']} ({info['peak_node']}, {info['peak_op_type']})" if info["peak_node"] is not None
           else "(no node runs: the constants" + (" and ORT's copies of the initializers that are outputs)"
                                                    if info["dynamic_peak_bytes"] else " alone)"))
        + f" = constant + {format_bytes(info['dynamic_peak_bytes'])} dynamic"
        + (f" incl. {format_bytes(info['peak_scratch_bytes'])} kernel scratch" if info["peak_scratch_bytes"] else "")
        + (f" {'and' if info['peak_scratch_bytes'] else 'incl.'} {format_bytes(info['output_copy_bytes'])} of ORT's "
           "copies of the initializers that are outputs" if info["output_copy_bytes"] and info["peak_node"] is not None
           else ""),
        "",
        f"largest tensors live at the peak ({len(info['live_at_peak'])} shown):",
    ]
    # the name last and in full: it is what --json, --explain and the ONNX file call the tensor, so
    # a user copies it (cut to 48 characters, "<name> (in place of <other>)" lost <other>, and
    # torch's long names that differ only near the end read the same); last, no width pads the rest
    header = ("shape", "dtype", "size", "producer", "steps", "tensor")
    rows = [
        ("x".join(map(str, r["shape"])) or "scalar", r["dtype"], format_bytes(r["bytes"]),
         r["op_type"], f"{r['alloc_step']}-{r['free_step']}",
         r["tensor"] + (f" (in place of {r['in_place_of']})" if "in_place_of" in r else ""))
        for r in info["live_at_peak"]
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header[:-1])]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    lines.append("  " + fmt.format(*header))
    for r in rows:
        lines.append("  " + fmt.format(*r))
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart, as the bench commands print their tables."""
    body = [tuple(header)] + [tuple(r) for r in rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in body)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; a ``|`` in a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


#: Image formats a plot is written in, by the file's extension; a file without one gets a PNG.
PLOT_FORMATS = ("png", "svg", "pdf")


def plot_format(option: str, path: str) -> str:
    """The format ``path``'s extension names (``--plot t.svg`` wrote PNG bytes into t.svg, and
    ``t.jpg`` too); a path without an extension gets a PNG. Checked before any work."""
    name = os.path.basename(path)
    ext = name.rpartition(".")[2].lower() if "." in name.lstrip(".") else ""
    if not ext:
        return "png"
    if ext not in PLOT_FORMATS:
        raise UsageError(f"{option} {path}: cannot write a .{ext} image; end the name in "
                         + ", ".join(f".{f}" for f in PLOT_FORMATS) + " (no extension writes a PNG)")
    return ext


def save_figure(fig: Any, fmt: str) -> bytes:
    """``fig`` in ``fmt``, the same bytes for the same figure: no creation date in an SVG or PDF,
    and SVG's element ids hashed with a fixed salt (matplotlib draws a random one per run)."""
    import matplotlib

    buf = io.BytesIO()
    metadata = {"png": None, "svg": {"Date": None}, "pdf": {"CreationDate": None}}[fmt]
    with matplotlib.rc_context({"svg.hashsalt": "memplan"}):
        fig.savefig(buf, format=fmt, metadata=metadata)
    return buf.getvalue()


def timeline_plot(lv: Liveness, title: str, fmt: str = "png") -> bytes:
    """Resident memory over steps as a ``fmt`` image (PLOT_FORMATS): constant base shaded, peak marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mib = 2.0**20
    steps = np.arange(len(lv.dynamic))
    fig, ax = plt.subplots(figsize=(9, 4), dpi=110)
    ax.fill_between(steps, 0, lv.base_bytes / mib, step="mid", color="#c9d6e3", label="constant (inputs, weights)")
    ax.fill_between(steps, lv.base_bytes / mib, lv.memory / mib, step="mid", color="#4c78a8",
                    label="activations + scratch")
    p = lv.peak_step
    ax.plot([p], [lv.peak_bytes / mib], marker="v", color="#e45756", markersize=9)
    ax.annotate(f"peak {format_bytes(lv.peak_bytes)} @ step {p}", (p, lv.peak_bytes / mib),
                textcoords="offset points", xytext=(6, 6), color="#e45756")
    ax.set_xlabel("step (node in execution order)")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_title(title)
    ax.set_ylim(0, lv.peak_bytes / mib * 1.15 + 1e-9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    data = save_figure(fig, fmt)
    plt.close(fig)
    return data
