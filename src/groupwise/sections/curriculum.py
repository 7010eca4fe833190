"""The curriculum's options: the field groups (:class:`GDROFields`, :class:`SelectFields`), the
section that holds them all (:class:`CurriculumSection`), the choices each option takes, and
the curricula's typed options made of those groups (:class:`GDROOptions`, :class:`SelectOptions`:
the mean group size and the seed added, and checked). Each field and each choice is declared
once, here, with its option; the curricula import them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ..errors import ConfigError
from .base import Section, at_least, choice, field_values, in_unit, positive, require


@dataclass(frozen=True)
class GroupSizeFields:
    """What the GDRO and select curricula share: the group size bounds around num_generations
    and the reward above which a rollout counts as correct."""

    rollout_min: int
    rollout_max: int
    gdro_correct_threshold: float


@dataclass(frozen=True)
class GDROFields(GroupSizeFields):
    """The ``gdro_*`` and ``rollout_*`` options of the GDRO curricula (their meaning: the help
    comments in ``groupwise.config.grpo_config``)."""

    # the classifier
    gdro_num_bins: int
    gdro_bin_edges: tuple[float, ...] | None
    gdro_window: int
    gdro_hysteresis: float
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
    rollout_allocator: str
    rollout_variance: str
    rollout_variance_prior: float
    rollout_dual_lr: float
    rollout_score_decay: float
    rollout_arm_choice: str
    rollout_mu_update: str


@dataclass(frozen=True)
class SelectFields(GroupSizeFields):
    """The ``select_*`` options of predictive selection that the select curriculum reads."""

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


@dataclass(frozen=True)
class CurriculumSection(Section, GDROFields, SelectFields):
    """The curriculum, every curriculum's options, and the top-up of predictive selection (read
    by the step, not the curriculum); a curriculum's typed options
    (:mod:`groupwise.sections.curriculum`) also need the mean group size and the seed
    (:meth:`with_run`)."""

    name: ClassVar[str] = "curriculum"
    curriculum: str
    select_top_up: bool
    select_top_up_first: int

    def with_run(self, num_generations: int, seed: int) -> dict[str, Any]:
        """This section's values with the two run-wide ones the curricula read."""
        values = {f: getattr(self, f) for f in self.field_names()}
        return {**values, "num_generations": num_generations, "seed": seed}

    def validate(self) -> None:
        first = self.select_top_up_first
        require(self, ("select_top_up_first", first >= 2, ">= 2 (a group of one has no variance)"))


# The choices of the curricula's options, checked by their typed options below.
# Rollout-GDRO's allocator (``rollout_allocator``) and the square-root law's variance
# (``rollout_variance``).
ALLOCATORS = ("sqrt", "bandit")
VARIANCE_MODES = ("prompt", "bin")
# What Prompt-GDRO's EMA is fed (``prompt_signal``), how it picks its arm and updates mu.
PROMPT_SIGNALS = ("pg_loss", "failure_rate")
ARM_CHOICES = ("sample", "greedy")
MU_UPDATES = ("best_response", "expected", "realized")
# The difficulty classifier's signal and what it does with a prompt never seen.
CLASSIFIER_SIGNALS = ("rollout_fraction", "any_correct")
UNSEEN_MODES = ("unseen", "hardest", "difficulty")
# The select curriculum's rule and group-size allocator (``select_rule``, ``select_allocator``).
SELECT_RULES = ("best_k", "legacy")
SELECT_ALLOCATORS = ("knapsack", "sqrt", "uniform")

_Options = TypeVar("_Options", bound="CurriculumOptions")


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
        return cls(**field_values(cls, config, f"curriculum {cls.__name__}"))


@dataclass(frozen=True)
class GDROOptions(CurriculumOptions, GDROFields):
    """The ``gdro_*`` and ``rollout_*`` options of the GDRO curricula
    (:class:`~groupwise.sections.GDROFields`); ``num_generations`` is the mean rollout budget and
    ``seed`` seeds Rollout-GDRO's arm draws."""

    def validate(self) -> None:
        for name, valid in (
            ("rollout_allocator", ALLOCATORS),
            ("rollout_variance", VARIANCE_MODES),
            ("rollout_arm_choice", ARM_CHOICES),
            ("rollout_mu_update", MU_UPDATES),
            ("gdro_signal", PROMPT_SIGNALS),
            ("gdro_classifier_signal", CLASSIFIER_SIGNALS),
            ("gdro_unseen", UNSEEN_MODES),
        ):
            choice(self, name, valid)
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
        # The ranges the classifier and Prompt-GDRO (eqs. 12-15) accept.
        require(
            self,
            ("gdro_num_bins", self.gdro_num_bins >= 1, ">= 1"),
            ("gdro_window", self.gdro_window >= 0, ">= 0 (0: all history)"),
            ("rollout_variance_prior", self.rollout_variance_prior >= 0, ">= 0 (pseudo-rollouts)"),
            ("gdro_hysteresis", self.gdro_hysteresis >= 0, ">= 0"),
            ("gdro_eta", self.gdro_eta >= 0, ">= 0"),
            ("gdro_gamma", 0 <= self.gdro_gamma <= 1, "in [0, 1]"),
            ("gdro_ema_beta", 0 < self.gdro_ema_beta <= 1, "in (0, 1]"),
            ("gdro_weight_cap", self.gdro_weight_cap > 0, "> 0"),
        )


@dataclass(frozen=True)
class SelectOptions(CurriculumOptions, SelectFields):
    """The ``select_*`` options of predictive selection (:class:`~groupwise.sections.SelectFields`):
    ``rollout_min``/``rollout_max`` bound the group size around ``num_generations``, and a
    rollout is correct above ``gdro_correct_threshold``."""

    def validate(self) -> None:
        choice(self, "select_allocator", SELECT_ALLOCATORS)
        choice(self, "select_rule", SELECT_RULES)
        at_least(self, 1, "select_oversample", optional=True)
        in_unit(self, "select_keep", "select_keep_floor")
        require(self, ("select_discount", 0.0 < self.select_discount <= 1.0, "in (0, 1]"))
        positive(self, "select_prior_strength")
        positive(self, "select_retry_half_life", unit=" skips")
        in_unit(self, "select_uniform_mix")
        if self.curriculum == "select":
            _check_budget(self, "curriculum=select", "the mean group size")
