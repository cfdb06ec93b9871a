"""The CI memory-budget gate: does each model's step fit its budget, as is or with a plan?

Pure: models arrive through an injected ``load`` function and plans through an injected
:data:`PlanFn`, so this module never touches ONNX and never imports a solver. One
:class:`CheckItem` (a model with its options and one or more budgets) yields one :class:`Verdict`
per budget. A verdict passes when the unplanned peak fits the budget, or, with planning allowed,
when the plan's peak does. With ``ort_arena`` the figure judged is not the liveness peak but the
least limit ORT's BFC arena runs the step under (an injected ``arena`` function; the CLI replays
the arena, planner/arena.py), for the graph as is and for the plan. :func:`exit_code` folds the
verdicts into the command's exit status: 3 if any model could not be loaded (the gate cannot
vouch for it), else 1 if any budget is not met, else 0. Usage errors (exit 2) are raised before
any model is loaded, by whoever builds the items.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from planner.devices import device as device_profile
from planner.errors import (OUT_OF_MEMORY, BudgetInfeasibleError, GraphError, ModelImportError, PlannerError,
                            SolverTimeoutError, UsageError)
from planner.graph import Graph
from planner.liveness import analyze
from planner.units import Budget, format_bytes, parse_budget

log = logging.getLogger(__name__)

#: --ort-arena / ort_arena values: ORT's arena_extend_strategy, in the words of its docs.
ORT_ARENA_CHOICES = ("same-as-requested", "next-power-of-two")
#: Device profile used to price recompute and swap when neither the command line nor the config names one.
DEFAULT_DEVICE = "H100"
#: Seconds one plan may take; CI wants a bounded gate, and a feasible plan usually comes early.
DEFAULT_TIME_LIMIT = 30.0

EXIT_OK, EXIT_FAILED, EXIT_BAD_MODEL = 0, 1, 3

#: --add-loss / add_loss kinds: the losses passes/loss.py appends to a model that ends in predictions.
LOSSES = ("cross-entropy", "cross-entropy-last", "mse", "mean")


def parse_loss(text: str) -> tuple[str, str | None]:
    """``"mse:logits"`` -> ``("mse", "logits")``, ``"mean"`` -> ``("mean", None)``; a bad kind is a UsageError."""
    kind, _, output = str(text).partition(":")
    kind = kind.strip().lower()
    if kind not in LOSSES:
        raise UsageError(f"--add-loss {text!r}: the loss must be one of {', '.join(LOSSES)}, optionally "
                         "followed by :OUTPUT (e.g. cross-entropy:logits)")
    return kind, (output.strip() or None)


@dataclass(frozen=True)
class PlanOutcome:
    """What a planner reports for one graph and budget; the gate's only view of planning."""

    fits: bool  # the plan's (simulated) peak is within the budget
    # the plan's simulated peak; "infeasible": the lowest plan found (0 when none was)
    peak_bytes: int
    # added time / compute time of the unplanned step (0.125 = +12.5%); None when no plan fits (no
    # cost to report: 0.0 read as "fits for free" to a script)
    added_time_fraction: float | None
    status: str  # optimal | feasible | infeasible | timeout | no-planner | ...
    # with ort_arena: the least arena limit the plan runs under (not fitting: the least of those tried)
    arena_bytes: int | None = None
    # "infeasible": the least memory any plan reaches (proven; a lower bound where not exact); then
    # ``peak_bytes`` is the lowest plan found (0: none)
    least_bytes: int | None = None
    # no plan: what the planner said about it (a timeout's searches and the lowest peak they reached)
    note: str | None = None


#: ``plan_fn(graph, budget_bytes, device, time_limit) -> PlanOutcome``, called with
#: ``deterministic=True`` and ``ort_arena=CHOICE`` as well for items that ask for them. It may also raise
#: BudgetInfeasibleError or SolverTimeoutError; the gate turns those into a not-fitting outcome.
PlanFn = Callable[[Graph, int, str, float], PlanOutcome]


def no_planner(graph: Graph, budget_bytes: int, device: str, time_limit: float) -> PlanOutcome:
    """The honest default until a planner is wired in: no plan, so nothing fits *with* a plan."""
    return PlanOutcome(fits=False, peak_bytes=0, added_time_fraction=None, status="no-planner")


@dataclass(frozen=True)
class CheckItem:
    """One model to check: how to load it, how to judge it, and the budgets it must meet."""

    model: str  # MODEL spec the loader reads (config-relative paths already resolved)
    budgets: tuple[tuple[str, Budget], ...]  # (as written, parsed), in the order given
    label: str = ""  # how reports name the model; defaults to ``model``
    train: bool = False  # check the training step (forward + backward) instead of one forward run
    dims: tuple[tuple[str, int], ...] = ()  # symbolic input dims, sorted by name
    device: str = DEFAULT_DEVICE  # device profile the planner prices time on
    time_limit: float = DEFAULT_TIME_LIMIT  # seconds per plan
    add_loss: str | None = None  # KIND[:OUTPUT] appended to a model without a loss (implies train)
    loss: str | None = None  # the scalar output trained as the loss, of several (implies train)
    plan: bool = True  # False (--no-plan): only "fits as is" counts
    deterministic: bool = False  # time_limit counts CP-SAT's deterministic seconds (planner/clock.py)
    # judge ORT's arena need under this arena_extend_strategy, not the liveness peak (ORT_ARENA_CHOICES)
    ort_arena: str | None = None
    # dims given for several models at once (the config's top level, --dim with several models): one
    # that matches nothing in this model is warned about; any other is a usage error (a typo)
    loose_dims: tuple[str, ...] = ()
    # the config entry whose own dims table gave the dims not loose (empty: --dim gave them): a typo
    # there is named as the entry's, not as a --dim the command line never had
    dims_where: str = ""
    # the --dim names that are as much this model's as the entry's own dims (a config with one entry):
    # a typo among them is the command line's, one only in the entry's dims is the entry's
    cli_dims: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Report name: the label plus what changes the graph (training step, bound dims)."""
        extras = ((["train"] if self.train else []) + ([f"loss={self.add_loss}"] if self.add_loss else [])
                  + ([f"loss={self.loss}"] if self.loss else [])
                  + [f"{k}={v}" for k, v in self.dims])
        base = self.label or self.model
        return f"{base} [{', '.join(extras)}]" if extras else base


def make_item(model: str, budgets: Sequence[str], *, where: str = "", **options) -> CheckItem:
    """Validate and build a CheckItem; every problem is a UsageError naming ``where`` and the fix."""
    prefix = f"{where}: " if where else ""
    if not budgets:
        fix = 'add budget = "8GiB" (or "60%") to the entry, or give --budget' if where else "give --budget B"
        raise UsageError(f"{prefix}no budget for {model!r}; {fix} (e.g. 8GiB or 60%)")
    parsed = _parse_budgets(budgets, prefix, model, options.get("plan", True))
    if options.get("device"):  # checked with --no-plan too: a typo is not a pass; named as plan names it (H100)
        options["device"] = _check_device(options["device"], prefix)
    arena = options.get("ort_arena")
    if arena is not None and arena not in ORT_ARENA_CHOICES:
        raise UsageError(f"{prefix}ort_arena must be one of {', '.join(ORT_ARENA_CHOICES)}, got {arena!r}")
    if options.get("add_loss"):
        try:
            parse_loss(options["add_loss"])
        except UsageError as err:
            raise UsageError(f"{prefix}{err}") from None
        options["train"] = True  # a loss is only for the training step
    if options.get("loss"):
        if options.get("add_loss"):
            raise UsageError(f"{prefix}add_loss appends a loss and makes it the only output; loss names one the "
                             "model has: give only one of them")
        options["train"] = True
    dims = tuple(sorted(dict(options.pop("dims", {}) or {}).items()))
    loose = tuple(sorted(set(options.pop("loose_dims", ()) or ())))
    return CheckItem(model=model, budgets=tuple(parsed), dims=dims, loose_dims=loose, **options)


def check_shared(budgets: Sequence[str], device: str | None, *, where: str = "", plan: bool = True) -> None:
    """Validate budgets and a device given for every item at once (the command line, a config's
    top level), so that a bad one is named where it was written: make_item names the entry it
    builds (``[[check]] #1``), which need not hold the key at all."""
    prefix = f"{where}: " if where else ""
    _parse_budgets(budgets, prefix, "", plan)
    if device:
        _check_device(device, prefix)


def _parse_budgets(budgets: Sequence[str], prefix: str, model: str, plan: bool) -> list[tuple[str, Budget]]:
    """(text, Budget) per budget; a UsageError for a bad one, a share without a plan or one given twice."""
    parsed: list[tuple[str, Budget]] = []
    for text in budgets:
        try:
            budget = parse_budget(text)
        except UsageError as err:
            raise UsageError(f"{prefix}{err}") from None
        if budget.fraction is not None and not plan:
            raise UsageError(
                f"{prefix}budget {text!r} is a share of the unplanned peak and only means something with a "
                "plan; drop --no-plan (plan = false) or give an absolute size such as 8GiB"
            )
        same = next((t for t, b in parsed if b == budget), None)
        if same is not None:  # two verdicts, one JUnit testcase name: CI could not tell them apart
            also = f" (as {same!r} and {str(text)!r})" if same != str(text) else ""
            what = f" for {model!r}" if model else ""
            raise UsageError(f"{prefix}budget {text!r} is given twice{what}{also}; give each budget once")
        parsed.append((str(text), budget))
    return parsed


def _check_device(device: str, prefix: str) -> str:
    """The profile's own name for ``device`` (``h100`` -> ``H100``), as plan and train print it; a
    UsageError for an unknown one."""
    try:
        return device_profile(device).name
    except UsageError as err:  # in a config the key is device, not the option
        raise UsageError(f"{prefix}{str(err).replace('--device', 'device', 1) if prefix else err}") from None


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for one model and one budget."""

    item: CheckItem
    budget: str  # as written: "2GiB", "60%"
    budget_bytes: int | None  # resolved; None when the model could not be loaded
    unplanned_peak: int | None  # liveness peak of the graph as given; None on error
    plan: PlanOutcome | None  # None when no plan was attempted (fits as is, --no-plan, error)
    error: str | None = None  # why the model could not be loaded or judged (a GraphError, a MemoryError)
    # the error's kind, as JUnit's error type: ModelImportError, GraphError (a planner bug), MemoryError
    error_type: str | None = None
    wall_s: float = 0.0  # seconds spent on this verdict (load + liveness + plan)
    unplanned_arena: int | None = None  # with ort_arena: the least arena limit the graph as is runs under

    @property
    def fits_as_is(self) -> bool | None:
        need = self.unplanned_arena if self.item.ort_arena else self.unplanned_peak
        if need is None or self.budget_bytes is None:
            return None
        return need <= self.budget_bytes

    @property
    def fits_with_plan(self) -> bool | None:
        return None if self.plan is None else self.plan.fits

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.fits_as_is or self.fits_with_plan)

    @property
    def outcome(self) -> str:
        """pass, fail or error (a model that could not be loaded)."""
        return "error" if self.error is not None else "pass" if self.passed else "fail"

    @property
    def peak(self) -> int | None:
        """The peak that counts: the plan's when a plan was made, else the unplanned one; with
        ort_arena, the arena's least limit instead of the liveness peak."""
        if self.item.ort_arena:
            if self.plan is not None and self.plan.arena_bytes is not None:
                return self.plan.arena_bytes
            return self.unplanned_arena
        if self.least is not None:  # what any plan reaches at least: how far over the budget is
            return self.least
        if self.plan is not None and self.plan.peak_bytes > 0:
            return self.plan.peak_bytes
        return self.unplanned_peak

    @property
    def headroom(self) -> int | None:
        """Budget minus the peak that counts; negative when over."""
        if self.peak is None or self.budget_bytes is None:
            return None
        return self.budget_bytes - self.peak

    @property
    def least(self) -> int | None:
        """The least memory any plan reaches, where the planner proved the budget infeasible (a
        lower bound, not a plan's peak); None otherwise."""
        p = self.plan
        return p.least_bytes if p is not None and p.status == "infeasible" and p.least_bytes else None

    @property
    def plan_note(self) -> str:
        """Why there is or is not a plan, in words for the reports."""
        if self.error is not None:
            return "-"
        if self.plan is None:
            return "not needed" if self.fits_as_is else "not tried (--no-plan)"
        p = self.plan
        if p.fits:
            return f"yes, +{p.added_time_fraction * 100:.1f}% time ({p.status})"
        if p.status == "no-planner":
            return "unknown: no planner in this build"
        if self.item.ort_arena:
            best = f", best arena {format_bytes(p.arena_bytes)}" if p.arena_bytes is not None else ""
        elif self.least is not None:
            best = f", needs >= {format_bytes(self.least)}" + (
                f", lowest plan found {format_bytes(p.peak_bytes)}" if p.peak_bytes > 0 else "")
        else:
            best = f", best {format_bytes(p.peak_bytes)}" if p.peak_bytes > 0 else ""
        return f"no ({p.status}{best})"


def run_checks(
    items: Sequence[CheckItem],
    load: Callable[[CheckItem], Graph],
    plan_fn: PlanFn = no_planner,
    progress: Callable[[str], None] | None = None,
    arena: Callable[[Graph, CheckItem], int] | None = None,
    after_load: Callable[[list[CheckItem]], None] | None = None,
) -> list[Verdict]:
    """Judge every item against each of its budgets, in the given order.

    ``load`` turns an item into the graph to judge (forward or training step) and raises
    ModelImportError for a bad model; such an item yields error verdicts and the others still
    run, as does a GraphError or MemoryError in its load or in a plan (for that budget). Every item
    is loaded before the first plan, so a UsageError ``load`` raises (named after its model) ends
    the run before any planning. ``progress`` hears one line before each plan (plans are the slow part). ``arena(graph,
    item)``: the least limit ORT's arena runs ``graph`` under, for items with ``ort_arena``.
    ``after_load(failed)`` runs once every model was tried, before the first plan, with the items
    whose model could not be loaded; a UsageError it raises ends the run there (a usage error wins
    over a bad model).
    """
    if arena is None and any(item.ort_arena for item in items):
        raise UsageError("ort_arena needs an arena replay, which this build does not have")
    # Every model is loaded before any plan: a problem only the model reveals (an --add-loss
    # output it lacks, a loss that is not a scalar) is a usage error, and it must stop the gate
    # before minutes of planning on the models listed before it, not after.
    loaded = []
    for item in items:
        start = time.perf_counter()
        try:
            graph = load(item)
            peak = analyze(graph).peak_bytes
            need = arena(graph, item) if item.ort_arena else None
        except (ModelImportError, GraphError, MemoryError) as err:
            loaded.append((item, None, None, None, (_error_line(item, err), type(err).__name__),
                           time.perf_counter() - start))
            continue
        except UsageError as err:
            if item.model in str(err):  # the loader named it (--dim bacth ... of zoo:mlp): not twice
                raise
            raise UsageError(_error_line(item, err)) from None
        loaded.append((item, graph, peak, need, None, time.perf_counter() - start))
    if after_load is not None:
        after_load([item for item, *_, error, _ in loaded if error is not None])
    verdicts: list[Verdict] = []
    total = sum(len(item.budgets) for item in items)
    for item, graph, peak, need, error, load_s in loaded:
        if error is not None:
            line, kind = error
            verdicts.extend(Verdict(item, text, None, None, None, error=line, error_type=kind, wall_s=load_s)
                            for text, _ in item.budgets)
            continue
        log.info("%s: unplanned peak %s", item.name, format_bytes(peak))
        start = time.perf_counter() - load_s  # the first budget's time includes the load
        for text, budget in item.budgets:
            budget_bytes = budget.resolve(peak)  # a share is of the liveness peak, with ort_arena too
            plan = failed = kind = None
            if (need if item.ort_arena else peak) > budget_bytes and item.plan:
                if progress is not None:
                    progress(
                        f"[{len(verdicts) + 1}/{total}] {item.name} @ {text}: planning for "
                        f"{format_bytes(budget_bytes)} (limit {item.time_limit:g}"
                        f"{' deterministic' if item.deterministic else ''} s)"
                    )
                try:
                    plan = _plan(plan_fn, graph, budget_bytes, item)
                except (GraphError, MemoryError) as err:
                    # memplan failed, not the budget: an error verdict (exit 3, the JSON object
                    # still printed), where the CLI's handler said exit 1, "over budget", and no JSON
                    failed, kind = _error_line(item, err), type(err).__name__
            verdicts.append(Verdict(item, text, budget_bytes, peak, plan, error=failed, error_type=kind,
                                    wall_s=time.perf_counter() - start, unplanned_arena=need))
            start = time.perf_counter()
    return verdicts


def _error_line(item: CheckItem, err: Exception) -> str:
    """Why ``item`` could not be judged (a ModelImportError, a GraphError: an IR invariant memplan
    broke, a MemoryError), led by the model it is about where the line does not name it: with
    several models, a message naming only the graph ("'torch-jit-export' has no scalar float
    output", the graph name of every torch export in onnx's backend test data) did not say which
    file to fix."""
    text = str(err) if isinstance(err, PlannerError) else OUT_OF_MEMORY
    return text if item.model in text else f"{item.label or item.model}: {text}"


def _plan(plan_fn: PlanFn, graph: Graph, budget_bytes: int, item: CheckItem) -> PlanOutcome:
    """Call the planner; infeasible and timed-out solves are answers (does not fit), not crashes."""
    try:
        extra = {"deterministic": True} if item.deterministic else {}
        if item.ort_arena:
            extra["ort_arena"] = item.ort_arena
        outcome = plan_fn(graph, budget_bytes, item.device, item.time_limit, **extra)
    except BudgetInfeasibleError as err:
        return PlanOutcome(False, err.best_bytes or 0, None, "infeasible", least_bytes=err.least_bytes)
    except SolverTimeoutError as err:  # its message says what was searched and how low it got
        # the lowest plan found is the peak that counts, not the unplanned one (zoo:cnn at 489748 B:
        # headroom -280.31 KiB where the note said the lowest plan peaks at 536020 bytes)
        return PlanOutcome(False, getattr(err, "best_bytes", None) or 0, None, "timeout", note=str(err) or None)
    judged = outcome.arena_bytes if item.ort_arena else outcome.peak_bytes
    if outcome.fits and (judged is None or judged > budget_bytes):
        raise GraphError(
            f"{item.name}: the planner reported a fit at {judged} bytes"
            f"{' of arena' if item.ort_arena else ''}, over the budget of "
            f"{budget_bytes} bytes; this is a planner bug, please report it"
        )
    return outcome


def exit_code(verdicts: Iterable[Verdict]) -> int:
    """3 if any model could not be loaded or judged, else 1 if any budget is not met, else 0."""
    outcomes = {v.outcome for v in verdicts}
    if "error" in outcomes:
        return EXIT_BAD_MODEL
    return EXIT_FAILED if "fail" in outcomes else EXIT_OK


def model_errors(verdicts: Iterable[Verdict]) -> list[str]:
    """One line per model that could not be loaded (once, however many budgets it had)."""
    seen: dict[str, None] = {}
    for v in verdicts:
        if v.error is not None:
            seen.setdefault(v.error, None)
    return list(seen)
