"""memplan's error hierarchy. Messages are one line: what is wrong, the value seen, and the fix.

The CLI maps them to exit codes (see cli.py): UsageError -> 2, ModelImportError -> 3,
BudgetInfeasibleError -> 1, SolverTimeoutError -> 4.
"""


#: The one line said for a MemoryError, which carries no message of its own.
OUT_OF_MEMORY = "out of host memory; try a smaller model size or batch"


class PlannerError(Exception):
    """Base class of every error memplan raises on purpose."""


class UsageError(PlannerError):
    """A command-line value is malformed (budget unit, option range, missing file argument)."""


class UnknownDimError(UsageError):
    """``--dim`` names (``dims``) that match no symbolic input dim or option of a model. ``detail`` is
    the message after its ``--dim `` head, so that a caller that knows where the names came from (a
    check config entry's own dims) can say so instead."""

    def __init__(self, dims: list[str], detail: str):
        super().__init__(f"--dim {detail}")
        self.dims = tuple(dims)
        self.detail = detail


class GraphError(PlannerError):
    """An IR invariant is broken (a bug in a pass, or a malformed input graph)."""


class ModelImportError(PlannerError):
    """The input model cannot be read or turned into a Graph."""


class OpsetTooOldError(ModelImportError):
    """A gradient needs an operator version newer than the model's default-domain opset
    (``opset``): autodiff upgrades the model and tries again (passes/opset_upgrade.py)."""

    def __init__(self, reason: str, opset: int):
        super().__init__(f"{reason}; export the model with opset >= {opset}")
        self.reason = reason
        self.opset = opset


class BudgetInfeasibleError(PlannerError):
    """No plan reaches the requested budget; ``least_bytes`` says what any plan can reach, and
    ``best_bytes`` what the lowest plan found peaks at (None: none found, or the least is exact)."""

    def __init__(self, message: str, least_bytes: int | None = None, best_bytes: int | None = None):
        super().__init__(message)
        self.least_bytes = least_bytes
        self.best_bytes = best_bytes


class SolverTimeoutError(PlannerError):
    """The solver found no plan within its time limit; ``best_bytes``: what the lowest plan found
    (over the budget) peaks at, None when none was found."""

    def __init__(self, message: str, best_bytes: int | None = None):
        super().__init__(message)
        self.best_bytes = best_bytes


#: How to freeze the weights before a node memplan cannot differentiate. --freeze is an option of
#: train-graph and train only: plan, inspect, verify and check, which said "with --freeze PATTERN"
#: too, answered it with "No such option"; they take the training step train-graph writes as it is.
FREEZE_HINT = ("with --freeze PATTERN of memplan train-graph or train (plan, inspect, verify and check: "
               "memplan train-graph MODEL --freeze PATTERN -o STEP.onnx, then give them STEP.onnx)")


def first_line(err: BaseException) -> str:
    """The first non-blank line of ``err``'s message, or its type's name where it has none (ORT and
    onnx errors are multi-line; one with an empty message made ``str(err).splitlines()[0]`` an
    IndexError, a traceback in place of the one-line error)."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)

