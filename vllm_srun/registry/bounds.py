"""The bounds an approximate model's figures are held to, by kind of output, and the operator's
own (`--bound NAME=VALUE`, a models file's `bounds:`), by the names `/v1/models` reports.

`bounds_for(check, dtype, overrides)` is what a check holds a model to; `parse_bound` and
`check_overrides` refuse an unknown name or a bad value, naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_srun.errors import ConfigError


@dataclass(frozen=True)
class Bound:
    """`figure` must be at least (or, `at_most`, at most) `limit`. `default` is the built-in
    limit where the operator set this one (None: the built-in applies, or there is none)."""

    figure: str
    limit: float
    at_most: bool = False
    default: float | None = None
    by_operator: bool = False

    def holds(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit

    def words(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.limit}"

    def loosened(self) -> bool:
        """Set by the operator and more permissive than the built-in one."""
        if self.default is None:
            return False
        return self.limit > self.default if self.at_most else self.limit < self.default

    def accepting(self, value: float) -> float:
        """The limit, at six places, that `value` would meet (rounded towards passing)."""
        scaled = value * 1e6
        return (math.ceil(scaled) if self.at_most else math.floor(scaled)) / 1e6


@dataclass(frozen=True)
class Figure:
    """A figure the checks report: whether a bound on it is a ceiling, and its possible range."""

    at_most: bool
    low: float
    high: float


_SHARE = Figure(at_most=False, low=0.0, high=1.0)
_CORRELATION = Figure(at_most=False, low=-1.0, high=1.0)
_DELTA = Figure(at_most=True, low=0.0, high=1.0)
FIGURES: dict[str, Figure] = {
    "min_cosine": _CORRELATION,
    "mean_cosine": _CORRELATION,
    "neighbour_overlap": _SHARE,
    "min_kendall_tau": _CORRELATION,
    "mean_kendall_tau": _CORRELATION,
    "label_agreement": _SHARE,
    "token_agreement": _SHARE,
    "span_agreement": _SHARE,
    "max_probability_delta": _DELTA,
    "p99_probability_delta": _DELTA,
}


def _at_least(figure: str, limit: float) -> Bound:
    return Bound(figure, limit)


def _at_most(figure: str, limit: float) -> Bound:
    return Bound(figure, limit, at_most=True)


EMBEDDING_BF16 = (_at_least("min_cosine", 0.9995), _at_least("neighbour_overlap", 0.95))
EMBEDDING_INT8 = (
    _at_least("min_cosine", 0.99),
    _at_least("mean_cosine", 0.997),
    _at_least("neighbour_overlap", 0.95),
)
# A tagger is held per token by share and by the 99th percentile of its probability change:
# one token's rounding at a near tie is reported (max_probability_delta), not decisive.
BOUNDS: dict[str, tuple[Bound, ...]] = {
    "classify": (_at_least("label_agreement", 0.995), _at_most("max_probability_delta", 0.02)),
    "token": (
        _at_least("token_agreement", 0.995),
        _at_most("p99_probability_delta", 0.02),
        _at_least("span_agreement", 0.99),
    ),
    "rerank": (_at_least("min_kendall_tau", 0.98),),
}
# The figures each check reports, by the names /v1/models shows: any may be bounded.
REPORTED: dict[str, tuple[str, ...]] = {
    "embeddings": ("min_cosine", "mean_cosine", "neighbour_overlap"),
    "rerank": ("min_kendall_tau", "mean_kendall_tau"),
    "classify": ("label_agreement", "max_probability_delta"),
    "token": ("token_agreement", "p99_probability_delta", "max_probability_delta", "span_agreement"),
}


def default_bounds(check: str, dtype: str) -> tuple[Bound, ...]:
    """The built-in bounds of a kind of output at `dtype`: embedders' depend on the dtype."""
    if check == "embeddings":
        return EMBEDDING_INT8 if dtype == "int8" else EMBEDDING_BF16
    return BOUNDS[check]


def bounds_for(check: str, dtype: str, overrides: Mapping[str, float] | None = None) -> tuple[Bound, ...]:
    """The bounds in force: the built-in ones, each replaced by the operator's where set, then
    the operator's on figures without a built-in bound. An override on a figure this kind of
    output does not report is refused, naming it."""
    overrides = dict(overrides or {})
    stray = sorted(set(overrides) - set(REPORTED[check]))
    if stray:
        raise ConfigError(
            f"bound {stray[0]!r} does not apply to a {check} check (its figures: {', '.join(REPORTED[check])})"
        )
    out = []
    for bound in default_bounds(check, dtype):
        limit = overrides.pop(bound.figure, None)
        if limit is None:
            out.append(bound)
        else:
            out.append(Bound(bound.figure, limit, bound.at_most, default=bound.limit, by_operator=True))
    for name, limit in overrides.items():
        out.append(Bound(name, limit, FIGURES[name].at_most, by_operator=True))
    return tuple(out)


def check_bound(name: str, value: object, *, field: str) -> float:
    """`value` as the limit of the bound `name`, or a ConfigError naming `field`."""
    figure = FIGURES.get(name)
    if figure is None:
        raise ConfigError(f"{field}: {name!r} is not a bound (bounds: {', '.join(FIGURES)})")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{field}: {value!r} is not a number")
    try:
        limit = float(value)
    except ValueError:
        raise ConfigError(f"{field}: {value!r} is not a number") from None
    if not figure.low <= limit <= figure.high:  # NaN fails this too
        raise ConfigError(
            f"{field}: {value} is out of range: {name} is between {figure.low} and {figure.high}"
        )
    return limit


def parse_bound(text: str) -> tuple[str, float]:
    """`NAME=VALUE` (a `--bound`) as (name, limit); a ConfigError saying why not otherwise
    (argparse names the option)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"{text!r}: give NAME=VALUE, e.g. min_cosine=0.995")
    return name, check_bound(name, value.strip(), field=name)


def check_overrides(bounds: Mapping[str, object], *, field: str = "bounds") -> tuple[tuple[str, float], ...]:
    """A models file's `bounds:` mapping, checked: (name, limit) pairs."""
    return tuple((name, check_bound(name, value, field=f"{field}.{name}")) for name, value in bounds.items())


def acceptance(bound: Bound, value: float) -> str:
    """The option that would accept `value` under `bound`, in both places the operator sets it."""
    limit = bound.accepting(value)
    return f"--bound {bound.figure}={limit} or `bounds: {{{bound.figure}: {limit}}}` in --models"
