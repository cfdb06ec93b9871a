"""Zoo option handling: presets, validation, and the ``zoo:NAME?k=v&...`` spec syntax.

Every model takes ``size`` (a preset: ``small`` or ``large``), ``batch`` and ``seed`` plus its own
sizes; explicit options override the preset. Validation happens before any weight is drawn and each
failure is one :class:`UsageError` line naming the option, the value seen and the legal choices.
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Union

import onnx

from models._builder import SPEC_KEY
from planner.errors import UsageError

OptionValue = Union[int, float, str]

#: The presets every model offers. ``small``: runs in ORT on CPU in well under a second, activations
#: of a few MiB (tests). ``large``: one forward pass holds 64-400 MiB of activations (calibration).
SIZES = ("small", "large")

PREFIX = "zoo:"

#: The largest value an integer size option (batch, layers, widths) takes: far past any model
#: a machine holds, and short of the sizes whose shapes alone exhaust host memory (batch 10^11).
MAX_OPTION = 1 << 20

_INT = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry; calling it with keyword options builds the model.

    ``presets[size]`` holds a value for every option except ``size`` (so it also defines the option
    names and their types); ``choices`` lists the legal values of string options; ``minimum``
    overrides the default lower bound 1 of integer options and ``maximum`` gives the few that have
    an upper bound below MAX_OPTION (flags); ``make`` gets the resolved options. ``steps[key]``
    gives, from the resolved options, the step the legal values of an integer option come in
    (``hw`` a multiple of 2**depth); ``bounded[key]`` describes, from them, the legal values of one
    the others bound in a way no step says (``heads`` dividing ``dim``).
    """

    name: str
    summary: str
    presets: Mapping[str, Mapping[str, OptionValue]]
    make: Callable[[Mapping[str, OptionValue]], onnx.ModelProto]
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    minimum: Mapping[str, int] = field(default_factory=lambda: {"seed": 0})
    maximum: Mapping[str, int] = field(default_factory=dict)
    steps: Mapping[str, Callable[[Mapping[str, OptionValue]], int]] = field(default_factory=dict)
    bounded: Mapping[str, Callable[[Mapping[str, OptionValue]], str]] = field(default_factory=dict)

    @property
    def option_names(self) -> list[str]:
        return sorted(["size", *self.presets["small"]])

    def resolve(self, options: Mapping[str, OptionValue]) -> dict[str, OptionValue]:
        """Check ``options`` and merge them over their preset; returns every option's value."""
        for key in sorted(options):
            if key not in self.option_names:
                raise UsageError(
                    f"zoo:{self.name} has no option {key!r}; options: {', '.join(self.option_names)}"
                )
        size = options.get("size", "small")
        if size not in SIZES:
            raise UsageError(f"zoo:{self.name} option size={size!r} is not one of: {', '.join(SIZES)}")
        resolved = dict(self.presets[size])
        for key in sorted(options):
            if key != "size":
                resolved[key] = self._check(key, options[key])
        resolved["size"] = size
        return resolved

    def _check(self, key: str, value: OptionValue) -> OptionValue:
        if key in self.choices:
            if value not in self.choices[key]:
                raise UsageError(
                    f"zoo:{self.name} option {key}={value!r} is not one of: {', '.join(self.choices[key])}"
                )
            return value
        low, high = self.minimum.get(key, 1), self.maximum.get(key, None if key == "seed" else MAX_OPTION)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            # a numpy integer (from a batch sweep's np.arange) is an integer: it was refused with
            # "must be an integer ..., got np.int64(4)"
            value = int(value)
        in_range = isinstance(value, int) and value >= low and (high is None or value <= high)
        if isinstance(value, bool) or not in_range:
            legal = f">= {low}" if high is None else f"in {low}..{high}"
            raise UsageError(f"zoo:{self.name} option {key} must be an integer {legal}, got {value!r}")
        return value

    def growth_step(self, key: str, options: Mapping[str, OptionValue]) -> int:
        """The step in which option ``key`` can grow from it (its other options ``options``): its
        legal values are that step's multiples. A UsageError names the legal values of an option that
        cannot grow so (a string, a flag, one the others bound)."""
        resolved = self.resolve(options)
        if key == "size" or key in self.choices:
            legal = SIZES if key == "size" else self.choices[key]
            raise UsageError(f"zoo:{self.name} option {key} is one of: {', '.join(legal)}; --max-batch cannot grow it")
        if key in self.maximum:
            raise UsageError(f"zoo:{self.name} option {key} takes only {self.minimum.get(key, 1)}.."
                             f"{self.maximum[key]}; --max-batch cannot grow it")
        if key in self.bounded:
            raise UsageError(f"zoo:{self.name} option {key} takes only {self.bounded[key](resolved)}; "
                             "--max-batch grows only an option with no upper bound")
        return self.steps[key](resolved) if key in self.steps else 1

    def __call__(self, **options: OptionValue) -> onnx.ModelProto:
        resolved = self.resolve(options)
        model = self.make(resolved)
        props = {p.key: p.value for p in model.metadata_props}
        props[SPEC_KEY] = format_spec(self.name, resolved)
        onnx.helper.set_model_props(model, dict(sorted(props.items())))
        return model


def require(ok: bool, model: str, message: str) -> None:
    """Raise a UsageError about a combination of options (``dim`` not divisible by ``heads``...)."""
    if not ok:
        raise UsageError(f"zoo:{model}: {message}")


def convert_value(text: str) -> OptionValue:
    """Spec value text -> int, float or str (in that order of preference)."""
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def parse_spec(spec: str, zoo: Mapping[str, ZooModel]) -> tuple[str, dict[str, OptionValue]]:
    """``zoo:gpt?batch=32&layers=4`` -> ("gpt", {"batch": 32, "layers": 4}); the ``zoo:`` is optional.

    The options are validated (names and values) but not merged with the preset, so that
    ``parse_spec(format_spec(name, options))`` gives back exactly ``(name, options)``.
    """
    body = spec[len(PREFIX):] if spec.startswith(PREFIX) else spec
    name, _, query = body.partition("?")
    if name not in zoo:
        raise UsageError(f"unknown zoo model {name!r} in {spec!r}; choose one of: {', '.join(sorted(zoo))}")
    options: dict[str, OptionValue] = {}
    for pair in query.split("&") if query else []:
        key, eq, text = pair.partition("=")
        if not eq or not key or not text:
            raise UsageError(f"zoo spec {spec!r}: {pair!r} is not KEY=VALUE (write e.g. zoo:{name}?batch=8&seed=1)")
        if key in options:
            raise UsageError(f"zoo spec {spec!r}: option {key!r} given twice")
        options[key] = convert_value(text)
    zoo[name].resolve(options)
    return name, options


def format_spec(name: str, options: Mapping[str, OptionValue]) -> str:
    """The inverse of parse_spec: ("gpt", {"batch": 32}) -> "zoo:gpt?batch=32"."""
    query = "&".join(f"{key}={value}" for key, value in options.items())
    return f"{PREFIX}{name}" + (f"?{query}" if query else "")
