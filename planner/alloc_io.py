"""MiniMalloc's CSV format: problems ``id,lower,upper,size[,alignment]``, solutions add ``offset``.

Lifespans are half-open ``[lower, upper)``. As in MiniMalloc's converter, ``buffer`` and
``buffer_id`` are accepted for ``id``, ``start``/``begin`` for ``lower``, and an ``end`` column
is inclusive (``upper = end + 1``); a ``hint`` column is ignored, two columns for one field are
refused. Reading is strict: every error names the file, the line and the value, and how to fix it.
"""
from __future__ import annotations

import csv
import io
import os
import re
from typing import Sequence

from planner.alloc import Buffer, check_buffers
from planner.errors import ModelImportError
from planner.fileio import atomic_write

#: An integer cell: an optional sign and ASCII digits.
_INTEGER = re.compile(r"[+-]?[0-9]+")

_ALIASES = {
    "id": ("id", "buffer", "buffer_id"),
    "lower": ("lower", "start", "begin"),
    "upper": ("upper",),
    "end": ("end",),
    "size": ("size",),
    "alignment": ("alignment",),
    "offset": ("offset",),
    "gaps": ("gaps",),
}
#: The largest time or size a row may give: sums of many stay within int64 in the solvers.
MAX_VALUE = 2**50
_FORMAT = "expected a header like 'id,lower,upper,size[,alignment]'"


def read_csv(path: str | os.PathLike) -> tuple[list[Buffer], list[int] | None]:
    """Buffers of a problem or solution file, and its offsets (None without an offset column)."""
    try:
        with open(path, newline="") as fh:
            text = fh.read()
    except FileNotFoundError:
        # the input file, as a missing model is: exit 3, not a usage error
        raise ModelImportError(f"{path}: no such file; give a CSV file with {_FORMAT[9:]}") from None
    except UnicodeDecodeError:
        raise ModelImportError(f"{path}: not a text file; {_FORMAT}") from None
    return parse_csv(text, str(path))


def parse_csv(text: str, name: str = "<csv>") -> tuple[list[Buffer], list[int] | None]:
    text = text.removeprefix("\ufeff")  # a byte-order mark, as spreadsheet exports write
    rows = [r for r in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in r)]
    if not rows:
        raise ModelImportError(f"{name}: empty file; {_FORMAT}")
    header = [h.strip().lower() for h in rows[0]]
    col = _columns(header, name)
    buffers, offsets = [], [] if "offset" in col else None
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise ModelImportError(f"{name} line {line}: {len(row)} fields, the header has {len(header)}")
        values = {key: row[i] for key, i in col.items()}
        buffer, offset = _buffer(values, f"{name} line {line}")
        buffers.append(buffer)
        if offsets is not None:
            offsets.append(offset)
    if not buffers:
        raise ModelImportError(f"{name}: no buffers after the header; add one row per buffer")
    try:
        check_buffers(buffers)  # duplicate ids
    except ModelImportError as err:
        raise ModelImportError(f"{name}: {err}") from None
    return buffers, offsets


def _columns(header: list[str], name: str) -> dict[str, int]:
    col: dict[str, int] = {}
    for i, h in enumerate(header):
        key = next((k for k, names in _ALIASES.items() if h in names), None)
        if key is None:
            continue  # a column memplan does not use (MiniMalloc ignores them too)
        field_of = {"end": "upper"}.get  # an inclusive end gives the upper
        clash = next((k for k in col if field_of(k, k) == field_of(key, key)), None)
        if clash is not None:
            # MiniMalloc refuses these ("Duplicate column names"); taking the first column
            # silently read 'id,lower,start,upper,size' without its start
            first = header[col[clash]]
            what = (f"column {h!r} appears twice" if first == h
                    else f"columns {first!r} and {h!r} both give the {field_of(key, key)}")
            raise ModelImportError(f"{name}: {what} in header {','.join(header)!r}; keep one of them")
        col[key] = i
    missing = [k for k in ("id", "lower", "size") if k not in col]
    if "upper" not in col and "end" not in col:
        missing.append("upper")
    if missing:
        raise ModelImportError(f"{name}: missing column(s) {', '.join(missing)} in header {','.join(header)!r}; {_FORMAT}")
    return col


def _buffer(values: dict[str, str], where: str) -> tuple[Buffer, int | None]:
    """One row as a checked Buffer (and its offset, if the file has them)."""
    if values.get("gaps", "").strip():
        raise ModelImportError(f"{where}: gaps are not supported; split the buffer in two")

    def integer(key: str) -> int:
        text = values[key].strip()
        # plain ASCII digits only: int() also takes '1_000' and other scripts' digits (fuzzed, stop 49)
        if not _INTEGER.fullmatch(text):
            raise ModelImportError(f"{where}: {key} {text!r} is not an integer")
        value = int(text)
        if abs(value) > MAX_VALUE:
            raise ModelImportError(f"{where}: {key} {value} is out of range (the largest allowed is 2**50)")
        return value

    buffer = Buffer(
        id=values["id"].strip(), lower=integer("lower"),
        upper=integer("upper") if "upper" in values else integer("end") + 1,
        size=integer("size"), alignment=integer("alignment") if "alignment" in values else 1,
    )
    try:
        check_buffers([buffer])
    except ModelImportError as err:
        raise ModelImportError(f"{where}: {err}") from None
    return buffer, integer("offset") if "offset" in values else None


def solution_csv(buffers: Sequence[Buffer], offsets: Sequence[int]) -> str:
    """The solution file: the problem's columns plus ``offset`` (alignment only if used)."""
    aligned = any(b.alignment != 1 for b in buffers)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "lower", "upper", "size", *(["alignment"] if aligned else []), "offset"])
    for b, off in zip(buffers, offsets):
        writer.writerow([b.id, b.lower, b.upper, b.size, *([b.alignment] if aligned else []), off])
    return out.getvalue()


def write_solution(path: str | os.PathLike, buffers: Sequence[Buffer], offsets: Sequence[int]) -> None:
    """Write the solution atomically (the file appears whole or not at all)."""
    atomic_write(path, solution_csv(buffers, offsets))
