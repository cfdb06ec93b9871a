"""Step times of two models on a shared machine: run order, spread, and whether a difference is noise.

Pure functions (no ORT, no clock): ``passes/verify.py``'s timing child runs the models in the order
:func:`interleaved_order` gives for :func:`rounds_for` rounds; :func:`compare_times` summarises the
samples and says whether the measured overhead stands out of the run-to-run spread; and
:func:`machine_loaded` says whether other work competed for the CPUs while they ran.

On a loaded machine one run can take several times another (the gpt fixture at 80% read +768%,
llama at 60% +1169% and then -18.6%): a median alone hides that, so verify prints the spread and
says when the two models' step times cannot be told apart.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Timed rounds verify takes at least (each runs every model once), and at most.
MIN_ROUNDS = 7
#: Small models get more rounds for free, up to this many: quartiles of 7 samples move with one outlier.
MAX_ROUNDS = 31
#: Seconds of timed runs verify aims for (as estimated from the warm-up runs) before it stops adding
#: rounds above MIN_ROUNDS: zoo:gpt?batch=64 (about 0.13 s a round) gets 15 rounds, 1 s more than 7.
TIME_BUDGET_S = 2.0
#: The machine counts as loaded when the 1-minute load average, less verify's own single-threaded
#: run, reaches this fraction of the CPUs: past it the runs share cores, caches and memory bandwidth
#: with other work, which is what made the figures above swing.
LOADED_FRACTION = 0.5


def rounds_for(warmup_seconds: Sequence[float], min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
               budget_s: float = TIME_BUDGET_S) -> int:
    """How many timed rounds to run: as many as fit ``budget_s`` at the warm-up runs' pace (one
    round runs each model once), between ``min_rounds`` and ``max_rounds``. A first run is slower
    than the later ones (lazy kernel state), so this errs towards fewer rounds."""
    per_round = float(sum(warmup_seconds))
    fit = int(budget_s / per_round) if per_round > 0 else max_rounds
    return max(min_rounds, min(max_rounds, fit))


def interleaved_order(models: int, rounds: int) -> list[int]:
    """The models' indices in the order their timed runs go: every round runs each model once, and
    every other round in reverse (A B B A A B ...), so a load change hits all of them alike and no
    model always runs right after another one's."""
    order: list[int] = []
    for r in range(rounds):
        step = list(range(models))
        order += step if r % 2 == 0 else step[::-1]
    return order


@dataclass(frozen=True)
class Spread:
    """Five numbers of a set of samples (seconds): quartiles by linear interpolation."""

    low: float
    q1: float
    median: float
    q3: float
    high: float

    def as_dict(self) -> dict:
        return {"min": self.low, "q1": self.q1, "median": self.median, "q3": self.q3, "max": self.high}


def spread(samples: Sequence[float]) -> Spread:
    """The spread of ``samples`` (at least one)."""
    if not len(samples):
        raise ValueError("spread of no samples")
    low, q1, med, q3, high = (float(x) for x in np.percentile(np.asarray(samples, dtype=float), [0, 25, 50, 75, 100]))
    return Spread(low, q1, med, q3, high)


@dataclass(frozen=True)
class TimeComparison:
    """A planned model's step times against its reference's."""

    reference: Spread
    planned: Spread
    overhead: float  # planned median / reference median - 1: verify's "time_overhead"
    # the overheads the interquartile ranges allow: planned q1 / reference q3 - 1 to planned q3 /
    # reference q1 - 1; it holds 0 exactly when the two ranges overlap
    overhead_low: float
    overhead_high: float

    @property
    def within_noise(self) -> bool:
        """The two models' interquartile ranges overlap: the measured overhead, whatever its sign,
        is not told apart from the run-to-run spread."""
        return self.overhead_low <= 0.0 <= self.overhead_high


def compare_times(reference: Sequence[float], planned: Sequence[float]) -> TimeComparison:
    """Compare the two models' timed runs (seconds each)."""
    ref, got = spread(reference), spread(planned)
    tiny = 1e-12  # a run cannot take 0 s, but a clock can read it
    return TimeComparison(ref, got, got.median / max(tiny, ref.median) - 1.0,
                          got.q1 / max(tiny, ref.q3) - 1.0, got.q3 / max(tiny, ref.q1) - 1.0)


def machine_loaded(load_average: float, cpus: int, own: float = 1.0) -> bool:
    """Whether other work used at least :data:`LOADED_FRACTION` of ``cpus`` by ``load_average``
    (``os.getloadavg()``'s 1-minute figure), counting ``own`` runnable tasks as verify's."""
    return load_average - own >= LOADED_FRACTION * max(1, cpus)
