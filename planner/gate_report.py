"""The gate's verdicts as a terminal table, one JSON object, JUnit XML and a Markdown table.

Every form carries the same columns: model, budget, unplanned peak, fits as is, fits with a plan
(and its added time), headroom (budget minus the peak that counts), result. JUnit has one
testcase per model and budget: a ``<failure>`` when the budget is not met, an ``<error>`` when the
model could not be loaded, the numbers in bytes in the failure text. The Markdown suits a CI job
summary (``$GITHUB_STEP_SUMMARY``).
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Any, Sequence

from planner.gate import EXIT_BAD_MODEL, EXIT_FAILED, EXIT_OK, Verdict, exit_code
from planner.units import format_bytes

SCHEMA = "memplan.check/1"
HEADER = ("model", "budget", "unplanned peak", "fits as is", "fits with plan", "headroom", "result")


def _size(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


def _yes_no(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


#: What may tell apart rows of the same model and budget (config entries differing only there), as
#: the row names say it.
_TELLS = (lambda i: f"device={i.device}", lambda i: f"ort-arena={i.ort_arena or 'off'}",
          lambda i: "plan" if i.plan else "no-plan", lambda i: "deterministic" if i.deterministic else "wall-clock",
          lambda i: f"time-limit={i.time_limit:g}s")


def row_names(verdicts: Sequence[Verdict]) -> list[str]:
    """Each verdict's model name as the reports print it, unique per budget: rows of the same
    name and budget (entries that differ only in device, ort_arena, plan, ...) get what differs
    between them in parentheses, and rows alike in all of that their place, #1, #2, ... A name
    no other row shares stays as it is, so CI's history of a testcase keeps its name."""
    names = [v.item.name for v in verdicts]
    groups: dict[tuple[str, str], list[int]] = {}
    for k, v in enumerate(verdicts):
        groups.setdefault((v.item.name, v.budget), []).append(k)
    for rows in (rows for rows in groups.values() if len(rows) > 1):
        tells = [show for show in _TELLS if len({show(verdicts[k].item) for k in rows}) > 1]
        extras = {k: tuple(show(verdicts[k].item) for show in tells) for k in rows}
        alike, place = Counter(extras.values()), Counter()
        for k in rows:
            place[extras[k]] += 1
            more = [*extras[k], *([f"#{place[extras[k]]}"] if alike[extras[k]] > 1 else [])]
            names[k] = f"{names[k]} ({', '.join(more)})"
    return names


def cells(v: Verdict, name: str | None = None) -> tuple[str, ...]:
    """One verdict as the report columns (HEADER order), in words; ``name`` as row_names gives it."""
    share = v.budget.strip().endswith("%") and v.budget_bytes is not None
    budget = f"{v.budget} ({_size(v.budget_bytes)})" if share else v.budget
    peak = _size(v.unplanned_peak)
    if v.item.ort_arena and v.unplanned_arena is not None:
        peak += f" (arena {_size(v.unplanned_arena)})"
    return (name or v.item.name, budget, peak, _yes_no(v.fits_as_is), v.plan_note, _size(v.headroom), v.outcome.upper())


def counts(verdicts: Sequence[Verdict]) -> dict[str, int]:
    out = {"checked": len(verdicts), "passed": 0, "failed": 0, "errors": 0}
    for v in verdicts:
        out[{"pass": "passed", "fail": "failed", "error": "errors"}[v.outcome]] += 1
    return out


def summary_line(verdicts: Sequence[Verdict]) -> str:
    c = counts(verdicts)
    return f"{c['passed']} of {c['checked']} passed, {c['failed']} failed, {c['errors']} errors"


# ---- JSON ---------------------------------------------------------------------------------------
def verdict_dict(v: Verdict, name: str | None = None) -> dict[str, Any]:
    """One result; ``name`` as row_names gives it (the JUnit testcase's, less its budget)."""
    p = v.plan
    return {
        "model": v.item.label or v.item.model,
        "name": name or v.item.name,
        "budget": v.budget,
        "budget_bytes": v.budget_bytes,
        "train": v.item.train,
        "dims": dict(v.item.dims),
        "device": v.item.device,
        "ort_arena": v.item.ort_arena,
        "unplanned_peak_bytes": v.unplanned_peak,
        "unplanned_arena_bytes": v.unplanned_arena,
        "fits_as_is": v.fits_as_is,
        "fits_with_plan": v.fits_with_plan,
        "plan": None if p is None else {
            "status": p.status, "fits": p.fits, "peak_bytes": p.peak_bytes or None, "arena_bytes": p.arena_bytes,
            # null unless the plan fits: a plan that does not meet the budget has no cost to report
            "added_time_fraction": p.added_time_fraction if p.fits else None,
            # every plan object has the same keys: null where the planner said nothing
            "note": p.note or None,
        },
        "peak_bytes": v.peak,
        # an infeasible budget: the least memory any plan reaches (also the top-level peak_bytes, which
        # headroom is taken from; the plan's peak_bytes is the lowest plan found, or null)
        "least_bytes": v.least,
        "headroom_bytes": v.headroom,
        "result": v.outcome,
        "error": v.error,
        "wall_s": round(v.wall_s, 3),
    }


def to_json(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """One JSON-ready object: schema, status, exit code, counts and one result per model and budget."""
    code = exit_code(verdicts)
    return {
        "schema": SCHEMA,
        # in words, as plan's and verify's status: a CI job reads why the gate failed, not only that
        "status": {EXIT_OK: "ok", EXIT_FAILED: "over_budget", EXIT_BAD_MODEL: "model_error"}[code],
        "ok": code == 0,
        "exit_code": code,
        **counts(verdicts),
        "results": [verdict_dict(v, n) for v, n in zip(verdicts, row_names(verdicts))],
    }


# ---- text and Markdown tables -----------------------------------------------------------------
def to_table(verdicts: Sequence[Verdict]) -> str:
    """Aligned plain-text table for a terminal, with the summary line under it."""
    rows = [HEADER, *(cells(v, n) for v, n in zip(verdicts, row_names(verdicts)))]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([*lines, *_notes(verdicts), "", summary_line(verdicts)])


def _notes(verdicts: Sequence[Verdict]) -> list[str]:
    """What the planner said where it found no plan (a "timeout" may have ended long before its
    limit, every order it searched exhausted): one line per such row, under the table."""
    said = [f"{v.item.name} @ {v.budget}: {v.plan.note}" for v in verdicts
            if v.plan is not None and not v.plan.fits and v.plan.note]
    return ["", *said] if said else []


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


def _code(text: str, table: bool = True) -> str:
    """``text`` as a code span. A code span shows backslashes as they are (through _md,
    C:\\nets\\mlp.onnx read C:\\\\nets\\\\mlp.onnx); in a ``table`` cell GitHub reads \\| before the
    span, so pipes are escaped there; the fence is one backtick longer than any run of them inside."""
    fence = "`" * (1 + max(map(len, re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    escaped = text.replace("|", "\\|") if table else text
    return f"{fence}{pad}{escaped}{pad}{fence}"


def to_markdown(verdicts: Sequence[Verdict]) -> str:
    """A heading with the counts, a GitHub-flavoured table, and the load errors below it."""
    mark = {"PASS": "✅ pass", "FAIL": "❌ fail", "ERROR": "⚠️ error"}
    lines = [f"### memplan check: {summary_line(verdicts)}", "", "| " + " | ".join(HEADER) + " |",
             "|" + "---|" * len(HEADER)]
    for v, name in zip(verdicts, row_names(verdicts)):
        row = list(cells(v, name))
        row[-1] = mark[row[-1]]
        lines.append("| " + " | ".join([_code(row[0]), *map(_md, row[1:])]) + " |")
    said = _notes(verdicts)
    if said:
        lines += ["", "Why no plan was found:", ""] + [f"- {_md(line)}" for line in said[1:]]
    errors = {v.item.name: v.error for v in verdicts if v.error is not None}
    if errors:
        lines += ["", "Models that could not be loaded:", ""]
        lines += [f"- {_code(name, table=False)}: {_md(error or '')}" for name, error in errors.items()]
    return "\n".join(lines) + "\n"


# ---- JUnit XML --------------------------------------------------------------------------------
def _details(v: Verdict) -> str:
    """Every number behind a verdict, in bytes and in words, for a failure body."""
    lines = [
        f"model: {v.item.name}",
        f"budget: {v.budget} = {v.budget_bytes} bytes ({_size(v.budget_bytes)})",
        f"unplanned peak: {v.unplanned_peak} bytes ({_size(v.unplanned_peak)})",
    ]
    if v.item.ort_arena:
        lines.append(f"ORT arena ({v.item.ort_arena}): the unplanned step runs under a limit of {v.unplanned_arena} "
                     f"bytes ({_size(v.unplanned_arena)})")
    lines += [f"fits as is: {_yes_no(v.fits_as_is)}", f"fits with plan: {v.plan_note}"]
    if v.least is not None:
        lines.append(f"least any plan reaches: {v.least} bytes ({_size(v.least)}) or more")
        if v.plan is not None and v.plan.peak_bytes > 0:
            lines.append(f"lowest plan found: {v.plan.peak_bytes} bytes ({_size(v.plan.peak_bytes)})")
    elif v.plan is not None and v.plan.peak_bytes > 0:
        # a plan that does not fit has no cost to state (it was "added time 0.0%": free)
        added = (f", added time {v.plan.added_time_fraction * 100:.1f}%"
                 if v.plan.fits and v.plan.added_time_fraction is not None else "")
        lines.append(f"plan peak: {v.plan.peak_bytes} bytes ({_size(v.plan.peak_bytes)}), status {v.plan.status}{added}")
    if v.plan is not None and v.plan.note and not v.plan.fits:
        lines.append(f"planner: {v.plan.note}")
    if v.plan is not None and v.plan.arena_bytes is not None:
        lines.append(f"plan arena: runs under a limit of {v.plan.arena_bytes} bytes ({_size(v.plan.arena_bytes)})")
    lines.append(f"headroom: {v.headroom} bytes ({_size(v.headroom)})")
    lines.append(f"device: {v.item.device}, time limit {v.item.time_limit:g} s, train: {v.item.train}")
    return "\n".join(lines)


def _failure_message(v: Verdict) -> str:
    over = -(v.headroom or 0)
    what = "arena need" if v.item.ort_arena else "peak"
    if not v.item.ort_arena and v.least is not None:
        what = "the least peak any plan reaches,"
    return (f"{what} {_size(v.peak)} ({v.peak} bytes) is over the budget {v.budget} = {_size(v.budget_bytes)} "
            f"({v.budget_bytes} bytes) by {_size(over)}; unplanned peak {_size(v.unplanned_peak)}, "
            f"with a plan: {v.plan_note}")


#: Characters XML 1.0 cannot carry, even escaped (C0 controls but tab and newlines, surrogates,
#: U+FFFE/U+FFFF): ElementTree writes them as they are, and every JUnit reader then rejects the file.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml(text: str | None) -> str | None:
    """``text`` with each character XML 1.0 cannot hold written as its escape (ESC -> \\x1b)."""
    if text is None:
        return None
    return _NOT_XML.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def to_junit(verdicts: Sequence[Verdict]) -> str:
    """JUnit XML: one testsuite, one testcase per model and budget."""
    c = counts(verdicts)
    total_time = f"{sum(v.wall_s for v in verdicts):.3f}"
    stats = {"tests": str(c["checked"]), "failures": str(c["failed"]), "errors": str(c["errors"])}
    root = ET.Element("testsuites", {"name": "memplan check", **stats, "time": total_time})
    suite = ET.SubElement(root, "testsuite", {"name": "memplan check", **stats, "skipped": "0", "time": total_time})
    for v, name in zip(verdicts, row_names(verdicts)):  # unique names: CI tells testcases apart by them
        case = ET.SubElement(suite, "testcase", {
            "classname": "memplan.check", "name": _xml(f"{name} @ {v.budget}"), "time": f"{v.wall_s:.3f}",
        })
        if v.outcome == "error":
            ET.SubElement(case, "error", {"type": v.error_type or "Error", "message": _xml(v.error or "")}).text = _xml(v.error)
        elif v.outcome == "fail":
            ET.SubElement(case, "failure", {"type": "MemoryBudgetExceeded", "message": _xml(_failure_message(v))}).text = (
                _xml(_details(v))
            )
        else:
            ET.SubElement(case, "system-out").text = _xml(_details(v))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
