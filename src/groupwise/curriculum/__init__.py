"""Curricula: the protocol (:mod:`.base`) and the GDRO curricula (:mod:`.gdro`).

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

CURRICULA: dict[str, type] = {
    "none": NoCurriculum,
    "prompt_gdro": PromptGDROCurriculum,
    "rollout_gdro": RolloutGDROCurriculum,
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
    "best_response_arm",
    "bin_of",
    "default_edges",
    "exact_budget_arms",
    "lead_lag",
    "sample_exact_budget_arms",
    "shrunk_rate",
    "sqrt_allocation",
    "variance_proxy",
    "weighted_standard_error",
]
