"""Byte quantities as users write them: ``512MiB``, ``8GiB``, ``1.5GB``, ``1048576``, ``60%``."""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from fractions import Fraction

from planner.errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
#: The units of a byte size, as messages list them (``_UNITS`` also takes k, m, g, t).
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*|%)\s*$")


@dataclass(frozen=True)
class Budget:
    """A budget: absolute bytes, or a fraction of the unplanned peak."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, unplanned_peak: int) -> int:
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return share_of(unplanned_peak, self.fraction)

    def __str__(self) -> str:
        return format_bytes(self.bytes) if self.bytes is not None else f"{self.fraction * 100:g}%"


def share_of(peak: int, fraction: float) -> int:
    """ceil(peak * fraction) in exact integers (Moccasin's budget convention), with ``fraction``
    read as the short decimal it was written as (0.9 -> 9/10): every command resolves "90%" of
    the same peak to the same bytes (check said 383554 where plan said 383555)."""
    num, den = _exact_fraction(fraction)
    return -((-int(peak) * num) // den)


def percent_fraction(text: str) -> float:
    """A percentage as written (``10.3``) -> its fraction of the peak (0.103), the double nearest
    the exact decimal: ``10.3 / 100`` is 0.10300000000000001, whose exact ceiling over a peak of
    1000 bytes is 104 bytes, not 103. ValueError for what is not a number."""
    return float(Fraction(text.strip()) / 100)


def _exact_fraction(x: float) -> tuple[int, int]:
    """A short decimal fraction of ``x`` (0.9 -> 9/10), so ceil(peak*0.9) has no float error."""
    text = repr(float(x))
    if "e" in text or "E" in text:
        return float(x).as_integer_ratio()
    whole, _, frac = text.partition(".")
    return int(whole + frac), 10 ** len(frac)


#: The largest byte size memplan takes (it fits an int64 with room for sums of a few).
MAX_BYTES = 2**62
#: The largest symbolic dim (--dim, a check config's dims): 2**40, so that sizes stay far inside
#: int64 (bytes x elements).
MAX_DIM = 1 << 40


def whole_bytes(value, what: str = "budget") -> int:
    """``value`` (a budget given to the library, not parsed from text) as a Python int of bytes.

    A numpy integer is taken as its int: kept as it was, it came back as plan.json's
    ``budget_bytes``, which json.dumps refuses. A float with a fraction (``peak * 0.8``) reached
    CP-SAT and failed there with a TypeError from ortools, nan with an AssertionError in the
    depth-first walk; a bool or a string failed on a comparison. UsageError names the value and the fix."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) \
            and float(value).is_integer():
        return int(value)
    fix = ("a whole number of bytes (for a share of a peak: planner.units.share_of(peak, 0.8), "
           "or parse_budget('80%').resolve(peak))")
    raise UsageError(f"{what} must be {fix}, got {value!r} ({type(value).__name__})")


def parse_bytes(text: str, what: str = "size") -> int:
    """Parse ``512MiB`` / ``1.5GB`` / ``4096`` into bytes; raise UsageError naming the problem."""
    m = _RE.match(str(text))
    if not m or m.group(2) == "%":
        raise UsageError(f"{what} {text!r} is not a byte size; write e.g. 4096, 512MiB, 8GiB or 1.5GB")
    unit = m.group(2).lower()
    if unit not in _UNITS:
        raise UsageError(
            f"{what} {text!r} has unknown unit {m.group(2)!r}; use {_UNIT_NAMES}"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if value > MAX_BYTES:
        raise UsageError(f"{what} {text!r} is more than any machine holds (at most 4 EiB, 2**62 bytes)")
    if round(value) < 1:
        raise UsageError(f"{what} {text!r} must be at least 1 byte")
    return int(round(value))


def parse_budget(text: str) -> Budget:
    """Parse a budget: a byte size, or a percentage in (0, 1000] of the unplanned peak."""
    m = _RE.match(str(text))
    if str(text).strip().endswith("%") and not (m and m.group(2) == "%"):
        raise UsageError(f"budget {text!r} is not a percentage; write e.g. 60% (of the unplanned peak, in (0, 1000])")
    if m and m.group(2) == "%":
        pct = float(m.group(1))
        if not 0 < pct <= 1000:
            raise UsageError(f"budget {text!r} must be a percentage in (0, 1000]")
        return Budget(fraction=percent_fraction(m.group(1)))
    if m and not m.group(2) and 0 < float(m.group(1)) <= 100:
        # a forgotten %, far more likely than a budget of a few bytes (which still reads as "70B")
        t = str(text).strip()
        also = f", or {t}B for bytes" if float(t).is_integer() else ""
        if float(t) < 1:  # 0.5 is more likely a fraction (50%) than half a percent
            raise UsageError(f"budget {text!r} has no unit; write {100 * float(t):g}% for that fraction of the "
                             f"unplanned peak (or {t}% if you meant {t} percent)")
        raise UsageError(f"budget {text!r} has no unit; write {t}% for a share of the unplanned peak{also}")
    if not m or m.group(2).lower() not in _UNITS:
        # "60 percent", "60pct": the byte-size message listed byte units only, not the 60% that was meant
        what = f"has unknown unit {m.group(2)!r}" if m else "is not a byte size or a percentage"
        raise UsageError(f"budget {text!r} {what}; write a percentage of the unplanned peak "
                         f"({m.group(1) if m else 60}%) or a byte size (4096, 512MiB, 1.5GiB; units {_UNIT_NAMES})")
    return Budget(bytes=parse_bytes(text, "budget"))


def share_up(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole``, rounded up to 0.1 ("98.9%" for 98.84%): what a budget
    of that share reaches. Rounded to nearest, a least of 343488 of 347520 bytes read "98.8%", and
    --budget 98.8% (343350 bytes) was called infeasible with that same figure as its least."""
    return f"{-(-1000 * int(part) // int(whole)) / 10:.1f}%"


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1.50 GiB, 12.0 MiB, 512 B."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def format_gap(gap: float | None) -> str:
    """A solver gap as a percentage; "-" when no bound is known. A gap that is not zero never
    prints as 0.00% (that reads as proven optimal): "<0.01%"."""
    if gap is None:
        return "-"
    if 0 < gap < 5e-5:
        return "<0.01%"
    return f"{100 * gap:.2f}%"
