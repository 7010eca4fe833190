"""User code named in a config: ``module:attribute`` or ``path/to/file.py:attribute``.

Reward functions, tools and environments can be the user's own functions in YAML or on the
command line (``--reward_funcs mymodule:short``, ``--tools tools.py:search``), as TRL users pass
callables in Python. One resolver for all of them, so each names the option, the spec and what
went wrong in the same words.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError


def is_import_spec(spec: str) -> bool:
    """Whether ``spec`` reads as ``module:attribute`` or ``file.py:attribute``."""
    target, sep, attr = spec.rpartition(":")
    return bool(sep and target and attr.isidentifier())


def _load_file(path: Path, option: str, spec: str) -> Any:
    if not path.is_file():
        raise ConfigError(f"{option}: {spec!r}: file {str(path)!r} does not exist")
    name = f"groupwise_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:  # the same file named twice: one module
        return sys.modules[name]
    spec_obj = importlib.util.spec_from_file_location(name, path)
    if spec_obj is None or spec_obj.loader is None:
        raise ConfigError(f"{option}: {spec!r}: {str(path)!r} cannot be loaded as Python")
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules[name] = module  # so pickling and dataclasses find it
    try:
        spec_obj.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ConfigError(
            f"{option}: {spec!r}: running {str(path)!r} failed ({type(err).__name__}: {err})"
        ) from err
    return module


def import_callable(spec: str, option: str) -> Callable[..., Any]:
    """The callable ``spec`` names (``module:attribute`` or ``file.py:attribute``); a
    :class:`ConfigError` naming ``option`` and ``spec`` when it cannot be found or called."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(Path(target).expanduser(), option, spec)
        where = f"file {target!r}"
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise ConfigError(
                f"{option}: {spec!r}: cannot import module {target!r} ({err}); is it on "
                "PYTHONPATH, or give a file path (path/to/file.py:function)"
            ) from err
        where = f"module {target!r}"
    value = getattr(module, attr, None)
    if value is None:
        raise ConfigError(f"{option}: {spec!r}: {where} has no function {attr!r}")
    if not callable(value):
        raise ConfigError(
            f"{option}: {spec!r}: {attr!r} in {where} is a {type(value).__name__}, not a function"
        )
    return value
