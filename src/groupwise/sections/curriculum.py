"""The curriculum's options: the field groups the curricula's typed options are made of
(:class:`GDROFields`, :class:`SelectFields`; :mod:`groupwise.curriculum.options` adds the mean
group size and the seed and checks them) and the section that holds them all
(:class:`CurriculumSection`). Each field is declared once, here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .base import Section, require


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
    comments in ``groupwise.config``)."""

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
    (:mod:`groupwise.curriculum.options`) also need the mean group size and the seed
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
