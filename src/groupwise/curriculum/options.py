"""The curricula's options, typed: :class:`GDROOptions` (``prompt_gdro``, ``rollout_gdro``) and
:class:`SelectOptions` (``select``), each a frozen dataclass read from a run's ``GRPOConfig`` by
:meth:`~CurriculumOptions.from_config` and validated when made.

The fields carry the config options' own names, so every error names the option to change.
``GRPOConfig.validate`` builds both, so a bad value is refused when the config is made, whatever
the curriculum; the curricula's ``from_options`` builds the one it needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigError
from .adversary import ARM_CHOICES, MU_UPDATES, PROMPT_SIGNALS
from .allocation import ALLOCATORS, VARIANCE_MODES
from .bins import CLASSIFIER_SIGNALS, UNSEEN_MODES

# The select curriculum's rule and group-size allocator (``select_rule``, ``select_allocator``).
SELECT_RULES = ("best_k", "legacy")
SELECT_ALLOCATORS = ("knapsack", "sqrt", "uniform")

_Options = TypeVar("_Options", bound="CurriculumOptions")


def _check_choices(options: object, choices: Mapping[str, tuple[str, ...]]) -> None:
    for name, valid in choices.items():
        value = getattr(options, name)
        if value not in valid:
            raise ConfigError(f"{name}={value!r} is not one of {list(valid)}")


def _check_budget(options: GDROOptions | SelectOptions, what: str, mean: str) -> None:
    """1 <= rollout_min <= num_generations <= rollout_max, or an error naming the three."""
    n_min, mean_n, n_max = options.rollout_min, options.num_generations, options.rollout_max
    if not 1 <= n_min <= mean_n <= n_max:
        raise ConfigError(
            f"{what} needs 1 <= rollout_min <= num_generations ({mean}) <= rollout_max, "
            f"got {n_min}, {mean_n}, {n_max}"
        )


@dataclass(frozen=True)
class CurriculumOptions:
    """What every curriculum's options share: the curriculum they configure, the mean rollouts
    per prompt and the seed of the curriculum's own random draws (the same on every rank)."""

    curriculum: str
    num_generations: int
    seed: int

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~groupwise.errors.ConfigError` naming the first bad option."""

    @classmethod
    def from_config(cls: type[_Options], config: Any) -> _Options:
        """The options of a run: ``config`` is a ``GRPOConfig`` or its ``to_dict()``."""
        values = {}
        for f in dataclasses.fields(cls):
            if isinstance(config, Mapping):
                if f.name not in config:
                    raise ConfigError(
                        f"the options given to build curriculum {cls.__name__} lack {f.name} "
                        "(expected every GRPOConfig field, e.g. GRPOConfig(...).to_dict())"
                    )
                value = config[f.name]
            else:
                value = getattr(config, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)


@dataclass(frozen=True)
class GDROOptions(CurriculumOptions):
    """The ``gdro_*`` and ``rollout_*`` options of the GDRO curricula (their meaning: the help
    comments in ``groupwise.config``); ``num_generations`` is the mean rollout budget and
    ``seed`` seeds Rollout-GDRO's arm draws."""

    # the classifier
    gdro_num_bins: int
    gdro_bin_edges: tuple[float, ...] | None
    gdro_window: int
    gdro_hysteresis: float
    gdro_correct_threshold: float
    gdro_classifier_signal: str
    gdro_unseen: str
    # Prompt-GDRO (gdro_eta and gdro_gamma also drive Rollout-GDRO's bandits)
    gdro_eta: float
    gdro_gamma: float
    gdro_ema_beta: float
    gdro_clip: float | None
    gdro_weight_cap: float
    gdro_share_normalize: bool
    gdro_signal: str
    # Rollout-GDRO and the square-root law
    rollout_min: int
    rollout_max: int
    rollout_allocator: str
    rollout_variance: str
    rollout_variance_prior: float
    rollout_dual_lr: float
    rollout_score_decay: float
    rollout_arm_choice: str
    rollout_mu_update: str

    def validate(self) -> None:
        _check_choices(
            self,
            {
                "rollout_allocator": ALLOCATORS,
                "rollout_variance": VARIANCE_MODES,
                "rollout_arm_choice": ARM_CHOICES,
                "rollout_mu_update": MU_UPDATES,
                "gdro_signal": PROMPT_SIGNALS,
                "gdro_classifier_signal": CLASSIFIER_SIGNALS,
                "gdro_unseen": UNSEEN_MODES,
            },
        )
        if self.curriculum == "rollout_gdro":
            _check_budget(self, "rollout_gdro", "the mean budget")
        elif self.curriculum == "prompt_gdro":
            # Prompt-GDRO's curriculum runs Rollout-GDRO's bandits too (their mu is logged).
            _check_budget(self, "prompt_gdro (its Rollout-GDRO diagnostics)", "the mean budget")
        if (
            self.curriculum != "none"
            and self.gdro_signal == "failure_rate"
            and self.gdro_share_normalize
        ):
            raise ConfigError(
                "gdro_signal=failure_rate with gdro_share_normalize=true ranks bins by "
                "rarity, not difficulty (a mean failure rate divided by the bin's share, "
                "which is largest for the rarest bin); set gdro_share_normalize: false, or "
                "use gdro_signal: pg_loss"
            )
        if self.gdro_bin_edges is not None:
            edges = list(self.gdro_bin_edges)
            outside = [e for e in edges if not 0.0 < e < 1.0]
            if outside:
                raise ConfigError(
                    f"gdro_bin_edges {edges}: {outside} outside (0, 1); each edge is an accuracy "
                    "strictly between 0 and 1, e.g. [0.25, 0.5, 0.75]"
                )
            unsorted = [(a, b) for a, b in zip(edges, edges[1:], strict=False) if a >= b]
            if unsorted:
                a, b = unsorted[0]
                raise ConfigError(
                    f"gdro_bin_edges {edges} must be strictly increasing ({a} is followed by "
                    f"{b}), e.g. {sorted(set(edges))}"
                )
        if self.gdro_num_bins < 1:
            raise ConfigError(f"gdro_num_bins must be >= 1, got {self.gdro_num_bins}")
        if self.gdro_window < 0:
            raise ConfigError(f"gdro_window must be >= 0 (0: all history), got {self.gdro_window}")
        if self.rollout_variance_prior < 0:
            raise ConfigError(
                "rollout_variance_prior must be >= 0 (pseudo-rollouts), "
                f"got {self.rollout_variance_prior}"
            )
        # The ranges the classifier and Prompt-GDRO (eqs. 12-15) accept.
        for name, ok, why in (
            ("gdro_hysteresis", self.gdro_hysteresis >= 0, ">= 0"),
            ("gdro_eta", self.gdro_eta >= 0, ">= 0"),
            ("gdro_gamma", 0 <= self.gdro_gamma <= 1, "in [0, 1]"),
            ("gdro_ema_beta", 0 < self.gdro_ema_beta <= 1, "in (0, 1]"),
            ("gdro_weight_cap", self.gdro_weight_cap > 0, "> 0"),
        ):
            if not ok:
                raise ConfigError(f"{name} must be {why}, got {getattr(self, name)}")


@dataclass(frozen=True)
class SelectOptions(CurriculumOptions):
    """The ``select_*`` options of predictive selection (their meaning: the help comments in
    ``groupwise.config``), ``rollout_min``/``rollout_max`` as the group size bounds around
    ``num_generations``, and ``gdro_correct_threshold`` (a rollout is correct above it)."""

    rollout_min: int
    rollout_max: int
    gdro_correct_threshold: float
    select_rule: str
    select_oversample: int | None
    select_keep: float
    select_keep_floor: float
    select_discount: float
    select_prior_strength: float
    select_retry_half_life: float
    select_uniform_mix: float
    select_allocator: str
    select_equal_prompt_weight: bool

    def validate(self) -> None:
        _check_choices(self, {"select_allocator": SELECT_ALLOCATORS, "select_rule": SELECT_RULES})
        if self.select_oversample is not None and self.select_oversample < 1:
            raise ConfigError(f"select_oversample must be >= 1, got {self.select_oversample}")
        for name in ("select_keep", "select_keep_floor"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 < self.select_discount <= 1.0:
            raise ConfigError(f"select_discount must be in (0, 1], got {self.select_discount}")
        if self.select_prior_strength <= 0:
            raise ConfigError(
                f"select_prior_strength must be > 0, got {self.select_prior_strength}"
            )
        if self.select_retry_half_life <= 0:
            raise ConfigError(
                f"select_retry_half_life must be > 0 skips, got {self.select_retry_half_life}"
            )
        if not 0.0 <= self.select_uniform_mix <= 1.0:
            raise ConfigError(
                f"select_uniform_mix must be in [0, 1], got {self.select_uniform_mix}"
            )
        if self.curriculum == "select":
            _check_budget(self, "curriculum=select", "the mean group size")
