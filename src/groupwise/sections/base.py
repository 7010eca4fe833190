"""What every section shares: the frozen, self-checking :class:`Section` and the checks its
``validate`` is written with, each error naming the option and the range it must lie in."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ..errors import ConfigError


def world_size_from_env() -> int:
    """The number of ranks torchrun announces (WORLD_SIZE), 1 for a single process."""
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def choice(options: object, name: str, valid: Any) -> None:
    """``name`` must be one of ``valid``."""
    value = getattr(options, name)
    if value not in valid:
        raise ConfigError(f"{name}={value!r} is not one of {list(valid)}")


def require(options: object, *checks: tuple[str, bool, str]) -> None:
    """Each check is (option, whether its value is good, what it must be): the first bad one
    raises "``option`` must be ``what``, got ``value``"."""
    for name, ok, expected in checks:
        if not ok:
            raise ConfigError(f"{name} must be {expected}, got {getattr(options, name)}")


def at_least(options: object, low: float, *names: str, optional: bool = False) -> None:
    """Each named option must be >= ``low`` (or, if ``optional``, None)."""
    for name in names:
        value = getattr(options, name)
        ok = (optional and value is None) or (value is not None and value >= low)
        require(options, (name, ok, f">= {low:g} or null" if optional else f">= {low:g}"))


def positive(options: object, *names: str, unit: str = "") -> None:
    """Each named option must be > 0 (``unit`` follows the bound in the error, e.g. seconds)."""
    require(options, *((n, getattr(options, n) > 0, f"> 0{unit}") for n in names))


def in_unit(options: object, *names: str) -> None:
    """Each named option must be in [0, 1]."""
    require(options, *((n, 0.0 <= getattr(options, n) <= 1.0, "in [0, 1]") for n in names))


def field_values(kind: type, config: Any, what: str) -> dict[str, Any]:
    """The values of ``kind``'s dataclass fields in ``config`` (an object, or a mapping such as
    ``GRPOConfig(...).to_dict()``; a mapping that lacks one is an error naming it and ``what`` was
    being built); lists become tuples, so the frozen result holds no mutable value."""
    values = {}
    for f in dataclasses.fields(kind):
        if isinstance(config, Mapping):
            if f.name not in config:
                raise ConfigError(
                    f"the options given to build {what} lack {f.name} "
                    "(expected every GRPOConfig field, e.g. GRPOConfig(...).to_dict())"
                )
            value = config[f.name]
        else:
            value = getattr(config, f.name)
        values[f.name] = tuple(value) if isinstance(value, list) else value
    return values


_Section = TypeVar("_Section", bound="Section")


@dataclass(frozen=True)
class Section:
    """A frozen group of options, checked when made (:meth:`validate`)."""

    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~groupwise.errors.ConfigError` naming the first bad option."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_config(cls: type[_Section], config: Any) -> _Section:
        """This section of ``config`` (a ``GRPOConfig``, or any object or mapping with the
        fields' names); lists become tuples."""
        return cls(**field_values(cls, config, f"the {cls.name} section"))
