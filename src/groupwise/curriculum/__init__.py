"""Curricula: the protocol (:mod:`.base`), the GDRO curricula (:mod:`.gdro`) and predictive
selection with adaptive group size (:mod:`.select`).

``CURRICULA`` maps the ``curriculum`` option to a class with ``from_options(options, dist)``;
adding a curriculum is one module here and one line below.
"""

from .base import (
    Curriculum,
    GlobalBatchCurriculum,
    GlobalRows,
    NoCurriculum,
    Outcome,
    Plan,
    PromptBatch,
)
from .gdro import (
    DifficultyClassifier,
    GDROCurriculum,
    PromptGDRO,
    PromptGDROCurriculum,
    RolloutGDRO,
    RolloutGDROCurriculum,
    best_response_arm,
    bin_of,
    default_edges,
    exact_budget_arms,
    lead_lag,
    sample_exact_budget_arms,
    shrunk_rate,
    sqrt_allocation,
    variance_proxy,
    weighted_standard_error,
)
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
    "DifficultyClassifier",
    "GDROCurriculum",
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
