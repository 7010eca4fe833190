"""Each option is declared once: ``GRPOConfig`` holds its default, its section checks it, and the
components a run builds from the sections take the options (or values read from them) with no
default of their own, as ``GRPOLoss(options: LossOptions, ...)`` does. A constructor default that
restates an option's default lets a component built in Python behave differently from one a
config built the day the two drift apart.

The check walks every class defined in the packages that hold the step's components and fails on
a keyword default equal to the default of the ``GRPOConfig`` option of the same name, or of the
option the parameter stands for (:data:`ALIASES`, or the option's name without its family prefix:
``window`` for ``gdro_window``, ``eos_check_every`` for ``static_eos_check_every``). A default
that is not an option (``generator=None``, ``share_floor=1e-3``) is fine.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from groupwise.config.grpo_config import GRPOConfig

PACKAGES = ("curriculum", "policy", "rollout")

# The option families whose prefix a component's parameter drops (``gdro_eta`` -> ``eta``).
PREFIXES = ("gdro_", "rollout_", "select_", "static_", "vllm_")

# Parameters named otherwise than the option they take, besides a dropped prefix.
ALIASES = {
    "mean_budget": "num_generations",
    "n_min": "rollout_min",
    "n_max": "rollout_max",
    "edges": "gdro_bin_edges",
    "prompt_signal": "gdro_signal",
    "max_observation_tokens": "max_tool_output_tokens",
    "examples": "tool_examples",
    "sleep_mode": "vllm_enable_sleep_mode",
    "max_model_len": "vllm_max_model_length",
    "target": "entropy_target",
    "delta": "entropy_coef_delta",
    "coef_min": "entropy_coef_min",
    "coef_max": "entropy_coef_max",
}

# Classes the walk must reach, so that it cannot pass by finding nothing.
EXPECTED = {
    "groupwise.curriculum.gdro.GDROCurriculum",
    "groupwise.curriculum.select.SelectCurriculum",
    "groupwise.curriculum.adversary.RolloutGDRO",
    "groupwise.curriculum.bins.DifficultyClassifier",
    "groupwise.policy.loss.GRPOLoss",
    "groupwise.rollout.base.SamplingParams",
    "groupwise.rollout.static.StaticEngine",
    "groupwise.rollout.multiturn.MultiTurnEngine",
}


def options_of(parameter: str, fields: set[str]) -> list[str]:
    """The ``GRPOConfig`` options a parameter of that name stands for."""
    names = [parameter, *(prefix + parameter for prefix in PREFIXES)]
    if parameter in ALIASES:
        names.append(ALIASES[parameter])
    return [name for name in names if name in fields]


def same_default(value: Any, default: Any) -> bool:
    """Whether a parameter's default restates an option's (False is not 0, nor 1.0 True)."""
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    try:
        return bool(value == default)
    except Exception:  # values whose == is not a truth value (arrays, tensors)
        return False


def component_classes() -> dict[str, type]:
    """Every class defined in a module of :data:`PACKAGES`, by qualified name."""
    classes = {}
    for package in PACKAGES:
        root = importlib.import_module(f"groupwise.{package}")
        modules = [root.__name__]
        modules += [m.name for m in pkgutil.walk_packages(root.__path__, f"{root.__name__}.")]
        for name in modules:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as err:
                if err.name != "vllm":  # the vLLM server's weight transfer subclasses vLLM's
                    raise
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == module.__name__:
                    classes[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return classes


def restated_defaults(classes: dict[str, type], defaults: dict[str, Any]) -> list[str]:
    """``Class(parameter=value)`` for each constructor default equal to its option's."""
    fields = set(defaults)
    found = []
    for qualified, cls in sorted(classes.items()):
        try:
            signature = inspect.signature(cls)
        except (TypeError, ValueError):  # no introspectable constructor
            continue
        for parameter in signature.parameters.values():
            if parameter.default is inspect.Parameter.empty:
                continue
            for option in options_of(parameter.name, fields):
                if same_default(parameter.default, defaults[option]):
                    found.append(
                        f"{qualified}({parameter.name}={parameter.default!r}) restates "
                        f"GRPOConfig.{option}={defaults[option]!r}"
                    )
    return found


def test_the_alias_map_names_options():
    fields = set(GRPOConfig.field_defaults())
    assert set(ALIASES.values()) <= fields, set(ALIASES.values()) - fields
    assert options_of("window", fields) == ["gdro_window"]
    assert options_of("mean_budget", fields) == ["num_generations"]


def test_the_check_finds_a_restated_default():
    class Restating:
        def __init__(self, window: int = 50, n_max: int = 3, generator: Any = None) -> None:
            pass

    defaults = GRPOConfig.field_defaults()
    found = restated_defaults({"Restating": Restating}, defaults)
    assert found == [
        f"Restating(window=50) restates GRPOConfig.gdro_window={defaults['gdro_window']}"
    ]


def test_no_component_constructor_restates_an_option_default():
    classes = component_classes()
    assert EXPECTED <= set(classes), EXPECTED - set(classes)
    found = restated_defaults(classes, GRPOConfig.field_defaults())
    assert not found, (
        "constructors that restate an option's default; take the value from the options "
        "(groupwise.sections) instead:\n" + "\n".join(found)
    )
