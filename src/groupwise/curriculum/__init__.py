"""Curricula: the protocol (:mod:`.base`), the GDRO curricula (:mod:`.gdro`, built from the
difficulty classifier :mod:`.bins`, the adversaries :mod:`.adversary`, the square-root law
:mod:`.allocation` and :mod:`.diagnostics`) and predictive selection with adaptive group size
(:mod:`.select`); their typed options are in :mod:`groupwise.sections.curriculum`, the one place
each option is declared and checked; :mod:`.scope` warns at start when a GDRO curriculum cannot
act (``CurriculumWarning``).

``CURRICULA`` maps the ``curriculum`` option to a class with ``from_options(options, dist)``
(``options``: the run's ``curriculum`` section with ``num_generations`` and ``seed``, typed as the
class's ``options_type`` when it names one, else a mapping); adding a curriculum is one module
here and one line below.
"""

from ..sections.curriculum import GDROOptions, SelectOptions
from .adversary import (
    PromptGDRO,
    RolloutGDRO,
    best_response_arm,
    exact_budget_arms,
    sample_exact_budget_arms,
)
from .allocation import shrunk_rate, sqrt_allocation
from .base import (
    Curriculum,
    GlobalBatchCurriculum,
    GlobalRows,
    NoCurriculum,
    Outcome,
    Plan,
    PromptBatch,
)
from .bins import DifficultyClassifier, bin_of, default_edges
from .diagnostics import lead_lag, variance_proxy, weighted_standard_error
from .gdro import GDROCurriculum, PromptGDROCurriculum, RolloutGDROCurriculum
from .scope import CurriculumWarning
from .select import (
    SelectCurriculum,
    best_k,
    informative_probability,
    keep_probability,
    knapsack_allocation,
    retry_probability,
    selection_weights,
    weighted_choice,
)

CURRICULA: dict[str, type] = {
    "none": NoCurriculum,
    "prompt_gdro": PromptGDROCurriculum,
    "rollout_gdro": RolloutGDROCurriculum,
    "select": SelectCurriculum,
}

__all__ = [
    "CURRICULA",
    "Curriculum",
    "CurriculumWarning",
    "DifficultyClassifier",
    "GDROCurriculum",
    "GDROOptions",
    "GlobalBatchCurriculum",
    "GlobalRows",
    "NoCurriculum",
    "Outcome",
    "Plan",
    "PromptBatch",
    "PromptGDRO",
    "PromptGDROCurriculum",
    "RolloutGDRO",
    "RolloutGDROCurriculum",
    "SelectCurriculum",
    "SelectOptions",
    "best_k",
    "best_response_arm",
    "bin_of",
    "default_edges",
    "exact_budget_arms",
    "informative_probability",
    "keep_probability",
    "knapsack_allocation",
    "lead_lag",
    "retry_probability",
    "sample_exact_budget_arms",
    "selection_weights",
    "shrunk_rate",
    "sqrt_allocation",
    "variance_proxy",
    "weighted_choice",
    "weighted_standard_error",
]
