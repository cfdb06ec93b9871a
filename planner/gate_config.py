"""What `memplan check` checks: MODEL arguments, or a config file listing models and budgets.

The config is the ``[tool.memplan]`` table of a ``pyproject.toml``, or the top level of a
``memplan.toml`` (same keys). Without ``--config`` it is looked for from the current folder
upward, stopping at the repository root (a folder holding ``.git``); in each folder
``memplan.toml`` wins over ``pyproject.toml``, and a ``pyproject.toml`` without ``[tool.memplan]``
is passed over. Defaults sit at the top; each ``[[...check]]`` entry names one model::

    [tool.memplan]
    device = "h100"          # default device profile
    time_limit = 30          # seconds per plan
    deterministic = true     # count time_limit in CP-SAT's deterministic seconds: same verdict anywhere
    ort_arena = "next-power-of-two"  # judge what ORT's arena needs (or "same-as-requested")
    budget = "8GiB"          # default budget(s) of entries that give none
    [[tool.memplan.check]]
    model = "zoo:gpt?layers=4"      # or a path, relative to the config file's folder
    budget = ["2GiB", "60%"]        # one testcase per budget
    train = true
    dims = { batch = 32 }
    [[tool.memplan.check]]
    model = "models/classifier.onnx"  # ends in logits: add_loss gives its training step a loss
    budget = "4GiB"
    add_loss = "cross-entropy:logits"

Every problem is a UsageError naming the file, the entry and the key, raised before any model is
loaded. Command-line options override the config for every entry; what they override is still
checked (a typo in it would wait for the job that runs without the option).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from planner.errors import UsageError
from planner.gate import (DEFAULT_DEVICE, DEFAULT_TIME_LIMIT, LOSSES, ORT_ARENA_CHOICES, CheckItem, check_shared,
                          make_item, parse_loss)
from planner.units import MAX_DIM

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

CONFIG_NAMES = ("memplan.toml", "pyproject.toml")
#: Keys an entry may set; the top level may set them all (as defaults) except model and name.
ENTRY_KEYS = ("model", "name", "budget", "train", "add_loss", "loss", "dims", "device", "time_limit", "plan", "deterministic",
              "ort_arena")
DEFAULT_KEYS = ("budget", "train", "add_loss", "dims", "device", "time_limit", "plan", "deterministic", "ort_arena")


@dataclass(frozen=True)
class Overrides:
    """What the command line says; it beats the config. None / empty / False mean "not given"."""

    budgets: tuple[str, ...] = ()
    train: bool = False
    add_loss: str | None = None
    loss: str | None = None  # the scalar output to train, for models with several
    dims: Mapping[str, int] = field(default_factory=dict)
    device: str | None = None
    time_limit: float | None = None
    no_plan: bool = False
    deterministic: bool = False
    ort_arena: str | None = None


def collect_items(
    models: Sequence[str], cli: Overrides, config: str | None, cwd: Path
) -> tuple[tuple[CheckItem, ...], Path | None]:
    """The items to check and the config file they came from (None for MODEL arguments)."""
    if models:
        if config:
            raise UsageError("give MODEL arguments or --config, not both; the config lists its own models")
        options = {"train": cli.train, "add_loss": cli.add_loss, "loss": cli.loss, "dims": dict(cli.dims), "device": cli.device or DEFAULT_DEVICE,
                   "time_limit": cli.time_limit or DEFAULT_TIME_LIMIT, "plan": not cli.no_plan,
                   "deterministic": cli.deterministic, "ort_arena": cli.ort_arena}
        loose = tuple(cli.dims) if len(models) > 1 else ()  # --dim for several models at once
        return tuple(make_item(m, cli.budgets, loose_dims=loose, **options) for m in models), None
    path = Path(config) if config else find_config(cwd)
    if path is None:
        raise UsageError(
            f"no MODEL given and no memplan.toml or pyproject.toml with [tool.memplan] found from {cwd} upward; "
            "run memplan check MODEL --budget B, or add a config (see the README)"
        )
    return load_config(path, cli), path


def find_config(start: Path) -> Path | None:
    """The nearest memplan.toml, or pyproject.toml holding [tool.memplan], up to the repository root."""
    start = start.resolve()
    for folder in (start, *start.parents):
        own = folder / "memplan.toml"
        if own.is_file():
            return own
        project = folder / "pyproject.toml"
        if project.is_file() and _mentions_memplan(project):
            return project
        if (folder / ".git").exists():
            return None
    return None


def _mentions_memplan(path: Path) -> bool:
    """Whether ``path`` holds a [tool.memplan] table. An unrelated (even broken) pyproject.toml is
    passed over unparsed; one that only names tool.memplan (a comment, a string) is passed over too,
    so the search goes on upward. A file that mentions it and is not valid TOML is taken, and
    read_table says what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise UsageError(f"{path}: cannot read ({err.strerror})") from None
    if "tool.memplan" not in text:
        return False
    if tomllib is None:  # pragma: no cover - read_table explains
        return True
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return True
    tool = data.get("tool")
    return isinstance(tool, dict) and "memplan" in tool


def read_table(path: Path) -> dict[str, Any]:
    """The memplan table of a config file: [tool.memplan] of a pyproject.toml, else the top level."""
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise UsageError("reading a config needs Python 3.11+ or the tomli package; pip install tomli")
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: config file not found; check the --config path") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a folder; --config takes a .toml file") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot read config ({err.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: config is not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML ({err}); fix the file or point --config at another") from None
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("memplan")
        if not isinstance(table, dict):
            raise UsageError(f"{path}: no [tool.memplan] table; add one (see the README) or use memplan.toml")
        return table
    return data


def load_config(path: Path, cli: Overrides = Overrides()) -> tuple[CheckItem, ...]:
    """Validate a config file and turn its entries into CheckItems, command-line overrides applied."""
    table = read_table(path)
    prefix = "tool.memplan." if path.name == "pyproject.toml" else ""
    top = _Section(path, f"[{prefix[:-1]}]" if prefix else "top level", table)
    top.only(DEFAULT_KEYS + ("check",))
    defaults = {k: top.get(k) for k in DEFAULT_KEYS}
    # what is given for every entry is checked where it was written: the entries' errors named
    # [[check]] #1 for --device h300 or a top-level budget = "4 parsecs". A value the command line
    # overrides is checked too: device = "h300" passed with --device h100, a typo waiting in CI
    check_shared(cli.budgets, cli.device, plan=not cli.no_plan)
    check_shared(top.get("budget") or (), defaults["device"], where=top.where)
    entries = table.get("check")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise UsageError(
            f"{path}: needs at least one [[{prefix}check]] table with model = \"...\" and budget = \"...\""
        )
    items = []
    for i, entry in enumerate(entries, start=1):
        sec = _Section(path, f"[[{prefix}check]] #{i}", entry)
        sec.only(ENTRY_KEYS)
        model = sec.get("model")
        if model is None:
            raise UsageError(f"{sec.where}: missing key 'model' (a path to an .onnx file or zoo:NAME)")
        label = model
        if not model.startswith("zoo:") and not Path(model).is_absolute():
            model = str(path.parent / model)
        value = {k: defaults[k] if sec.get(k) is None else sec.get(k) for k in DEFAULT_KEYS}
        # the entry's own budget, device and loss, where the command line overrides them (make_item
        # checks them otherwise)
        check_shared(sec.get("budget") or () if cli.budgets else (), sec.get("device") if cli.device else None,
                     where=sec.where)
        loss = sec.get("loss")
        dims = {**(defaults["dims"] or {}), **(value["dims"] or {}), **cli.dims}
        # the top level's dims and --dim (with several entries) are for every model; an entry's own
        # dims are for its model, where one that matches nothing is a typo
        shared = set(defaults["dims"] or {}) | (set(cli.dims) if len(entries) > 1 else set())
        # a typo among the others is named as the entry's, unless one entry's --dim is not loose either
        loose = sorted(shared - set(value["dims"] or {}) if sec.get("dims") is not None else shared)
        budgets = cli.budgets or value["budget"] or ()
        items.append(make_item(
            model, budgets, where=sec.where, label=sec.get("name") or label,
            train=cli.train or bool(value["train"]), add_loss=cli.add_loss or value["add_loss"],
            loss=cli.loss or loss, dims=dims,
            loose_dims=loose, dims_where=sec.where if sec.get("dims") else "",
            cli_dims=tuple(sorted(cli.dims)) if len(entries) == 1 else (),
            device=cli.device or value["device"] or DEFAULT_DEVICE,
            time_limit=cli.time_limit or value["time_limit"] or DEFAULT_TIME_LIMIT,
            plan=not cli.no_plan and value["plan"] is not False,
            deterministic=cli.deterministic or value["deterministic"] is True,
            ort_arena=cli.ort_arena or value["ort_arena"],
        ))
    return tuple(items)


@dataclass(frozen=True)
class _Section:
    """One table of the config, with typed getters that name the file, table and key on error."""

    path: Path
    name: str
    table: Mapping[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path}: {self.name}"

    def only(self, allowed: Sequence[str]) -> None:
        unknown = sorted(set(self.table) - set(allowed))
        if unknown:
            hint = (" (memplan.toml has no [tool.memplan] header: its keys sit at the top level)"
                    if unknown[0] == "tool" and self.path.name != "pyproject.toml" else "")
            raise UsageError(f"{self.where}: unknown key {unknown[0]!r}{hint}; allowed keys: {', '.join(allowed)}")

    def get(self, key: str) -> Any:
        """The value of ``key`` (None when absent), checked against what the key takes."""
        if key not in self.table:
            return None
        value = self.table[key]
        ok, want = _CHECKS[key](value)
        if not ok:
            raise UsageError(f"{self.where}: {key} must be {want}, got {value!r}")
        if key == "budget":
            return tuple(str(b) for b in (value if isinstance(value, list) else [value]))
        return value


def _is_loss(v: str) -> bool:
    try:
        parse_loss(v)
    except UsageError:
        return False
    return True


def _is_budget(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool))


_CHECKS = {
    "model": lambda v: (isinstance(v, str) and bool(v.strip()), "a non-empty string (a path or zoo:NAME)"),
    "name": lambda v: (isinstance(v, str), "a string"),
    "budget": lambda v: (_is_budget(v) or (isinstance(v, list) and bool(v) and all(map(_is_budget, v))),
                         'a size such as "8GiB", a percentage such as "60%", or a list of them'),
    "train": lambda v: (isinstance(v, bool), "true or false"),
    "add_loss": lambda v: (isinstance(v, str) and _is_loss(v), " or ".join(f'"{k}[:OUTPUT]"' for k in LOSSES)),
    "loss": lambda v: (isinstance(v, str) and bool(v.strip()), "the name of the scalar output to train"),
    "plan": lambda v: (isinstance(v, bool), "true or false"),
    "deterministic": lambda v: (isinstance(v, bool), "true or false"),
    "device": lambda v: (isinstance(v, str) and bool(v.strip()), 'a device name such as "h100"'),
    # finite, as --time-limit: TOML's inf would leave a CI job's plans unbounded
    "time_limit": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf,
                             "a positive, finite number of seconds"),
    # at most MAX_DIM, as --dim: a larger one overflowed onnx's int64 dims (a traceback) or planned EiB
    "dims": lambda v: (isinstance(v, dict) and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 < x <= MAX_DIM for x in v.values()),
        f"a table of positive integers (each at most {MAX_DIM}), e.g. {{ batch = 32 }}"),
    "ort_arena": lambda v: (v in ORT_ARENA_CHOICES, " or ".join(f'"{c}"' for c in ORT_ARENA_CHOICES)),
    "check": lambda v: (True, ""),
}
