"""Evaluation: n samples per prompt, unbiased pass@k, per-difficulty / per-task breakdowns and a
paired bootstrap comparison of two checkpoints.

Generation and aggregation are separate. :func:`evaluate_model` generates and scores, and
returns one :class:`PromptResult` per prompt; everything after that (:func:`aggregate`,
:func:`compare`, :func:`format_table`, :func:`save_json`) is a pure function of those results,
so it can be tested, or re-run on saved results, with plain lists.

Definitions (per prompt, then averaged over prompts, every prompt weighted equally):

- a sample is *correct* when the ``correct_reward`` function returned a value
  ``>= correct_threshold`` (default ``1 - 1e-6``: "the reward is 1", with room for float32
  rounding; a None / NaN reward is not correct);
- ``pass@k``: the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` of the probability that at
  least one of k samples is correct (:func:`groupwise.algo.advantages.pass_at_k`);
- ``mean@k``: the fraction of the *first k* samples that are correct. Samples are i.i.d., so
  every mean@k estimates the same per-sample accuracy; a smaller k is a noisier estimate, as if
  only k samples had been drawn. ``mean@n`` is ``c / n``, i.e. ``accuracy``;
- ``format_rate``: the fraction of samples whose ``format_reward`` value is
  ``>= correct_threshold``;
- ``greedy_accuracy``: the fraction of prompts whose single greedy completion is correct.

Sampling noise is seeded per batch (from ``seed`` and the batch's first row index), so two
checkpoints evaluated with the same rows, seed and batch size draw the same uniforms for the
same prompts: common random numbers, which make the paired comparison sharper. One checkpoint
evaluated twice gives identical results.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .algo.advantages import pass_at_k
from .data.prompts import tokenize_prompts
from .files import atomic_write_text
from .rewards.basic import correctness_index
from .rewards.scoring import RewardScorer, score_rollout
from .rollout import HFEngine, Rollout, RolloutEngine, SamplingParams, plain_sampling

DEFAULT_THRESHOLD = 1.0 - 1e-6


# --------------------------------------------------------------------------------------------
# Configuration and per-prompt results


def default_ks(n: int) -> list[int]:
    """Powers of two below ``n``, and ``n`` itself: ``8 -> [1, 2, 4, 8]``, ``6 -> [1, 2, 4, 6]``."""
    ks = [k for k in (2**i for i in range(20)) if k < n]
    return ks + [n] if n >= 1 else []


def check_ks(ks: Sequence[int], n: int) -> list[int]:
    """Sorted, de-duplicated ks; ValueError unless every k is an integer with 1 <= k <= n."""
    out = set()
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise ValueError(f"pass@k: k must be an integer, got {k!r}")
        if not 1 <= k <= n:
            raise ValueError(f"pass@k: need 1 <= k <= n = {n} (samples per prompt), got k={k}")
        out.add(int(k))
    return sorted(out)


@dataclass
class EvalConfig:
    """How to evaluate. ``n`` samples per prompt at ``temperature``/``top_p``/``top_k``; with
    ``greedy`` also one greedy completion per prompt (``n=0, greedy=True``: greedy only)."""

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_completion_length: int = 256
    max_prompt_length: int | None = 512
    greedy: bool = False
    ks: list[int] | None = None  # None: default_ks(n)
    correct_reward: str | None = None  # None: the is_correctness one, else the only non-format
    correct_threshold: float = DEFAULT_THRESHOLD
    format_reward: str | None = None  # None: "format_reward" if present, else no format rate
    seed: int = 0
    batch_size: int = 8  # prompts per generation call (each generates n rows)

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")
        if self.n == 0 and not self.greedy:
            raise ValueError("n = 0 samples and greedy=False: nothing to evaluate")
        if self.n > 0 and self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 for sampling (got {self.temperature}); "
                "use greedy=True for a greedy completion"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_completion_length < 1:
            raise ValueError(
                f"max_completion_length must be >= 1, got {self.max_completion_length}"
            )
        self.ks = check_ks(self.ks, self.n) if self.ks is not None else default_ks(self.n)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_completion_length=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=0.0,  # off: evaluation has no min_p or repetition penalty
            repetition_penalty=1.0,
        )


@dataclass
class PromptResult:
    """Everything :func:`aggregate` and :func:`compare` need about one prompt.

    ``correct`` holds one bool per sample, in sampling order (n = len, c = sum). Rates and means
    are over this prompt's samples; NaN where undefined (no samples, or a reward that was None
    for every sample). ``greedy_*`` are None when no greedy completion was generated."""

    prompt_id: str
    correct: list[bool] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)  # per-function mean over samples
    mean_length: float = math.nan
    truncated_rate: float = math.nan
    format_rate: float = math.nan
    difficulty: Any = None
    task: Any = None
    greedy_correct: bool | None = None
    greedy_length: float | None = None

    @property
    def n(self) -> int:
        return len(self.correct)

    @property
    def c(self) -> int:
        return sum(bool(x) for x in self.correct)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["n"], out["c"] = self.n, self.c
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PromptResult:
        """Inverse of :meth:`to_dict`; ``n`` and ``c`` are derived, and checked if present."""
        names = {f.name for f in fields(cls)}
        result = cls(**{k: v for k, v in data.items() if k in names})
        result.correct = [bool(x) for x in result.correct]
        for key in ("n", "c"):
            if key in data and int(data[key]) != getattr(result, key):
                raise ValueError(
                    f"prompt {result.prompt_id!r}: {key}={data[key]} disagrees with 'correct' "
                    f"({getattr(result, key)})"
                )
        return result


def _as_results(results: Sequence[PromptResult | Mapping[str, Any]]) -> list[PromptResult]:
    return [r if isinstance(r, PromptResult) else PromptResult.from_dict(r) for r in results]


@dataclass
class EvalResult:
    per_prompt: list[PromptResult]
    summary: dict[str, Any]
    config: EvalConfig
    reward_names: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "reward_names": list(self.reward_names),
            "summary": self.summary,
            "per_prompt": [r.to_dict() for r in self.per_prompt],
        }


def prompt_id(row: Mapping[str, Any]) -> str:
    """The row's ``id`` column if it has one, else a hash of its prompt (stable across runs)."""
    if row.get("id") is not None:
        return str(row["id"])
    text = json.dumps(row["prompt"], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Generation and scoring


def _resolve_reward(
    names: list[str], wanted: str | None, default: str | None, role: str
) -> int | None:
    if wanted is not None:
        if wanted not in names:
            raise ValueError(f"{role} {wanted!r} is not one of the reward functions {names}")
        return names.index(wanted)
    if default in names:
        return names.index(default)
    return None


def _batch_seed(seed: int, begin: int) -> int:
    digest = hashlib.sha256(f"groupwise-eval-{seed}-{begin}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def _score(
    scorer: RewardScorer, rows: Sequence[Mapping[str, Any]], rollout: Rollout
) -> torch.Tensor:
    """Per-function rewards [N, F] (NaN for None), called as in ``GRPOTrainer.score``."""
    return score_rollout(scorer, rows, rollout)[1]


def _nanmean(values: torch.Tensor) -> float:
    valid = ~torch.isnan(values)
    return float(values[valid].double().mean()) if bool(valid.any()) else math.nan


def as_engine(model: torch.nn.Module | RolloutEngine, tokenizer: Any) -> RolloutEngine:
    """An engine as is; a model wrapped in the Hugging Face / torch engine."""
    if isinstance(model, torch.nn.Module):
        return HFEngine(model, tokenizer, EvalConfig().sampling_params())  # calls pass their own
    return model


def prompt_render(engine: RolloutEngine) -> Callable[[Any], str] | None:
    """How ``engine`` wants prompts rendered: a multi-turn engine shows its tools in them."""
    return getattr(engine, "prompt_text", None)


@torch.no_grad()
def reward_means(
    engine: RolloutEngine,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    scorer: Callable[[Sequence[Mapping[str, Any]], Rollout], tuple[torch.Tensor, torch.Tensor]],
    names: Sequence[str],
    params: SamplingParams,
    *,
    batch_size: int = 64,
    max_prompt_length: int | None = None,
) -> dict[str, float]:
    """One completion per row (greedy when ``params`` is): the mean total reward over the rows
    where some function applied (``eval/reward``) and each function's mean over the rows where
    it applied (``eval/rewards/<name>/mean``). ``scorer(rows, rollout) -> (total [N], per
    function [N, F])``."""
    totals = torch.zeros(len(names))
    counts = torch.zeros(len(names))
    reward_sum, reward_count = 0.0, 0
    for begin in range(0, len(rows), batch_size):
        batch = [rows[i] for i in range(begin, min(begin + batch_size, len(rows)))]
        ids = tokenize_prompts(
            [r["prompt"] for r in batch], tokenizer, max_prompt_length, prompt_render(engine)
        )
        rewards, per_func = scorer(batch, engine.generate(ids, 1, params, rows=batch))
        valid = ~torch.isnan(per_func)
        totals += torch.where(valid, per_func, 0.0).sum(0)
        counts += valid.sum(0)
        reward_sum += float(torch.nansum(rewards))
        reward_count += int((~torch.isnan(rewards)).sum())
    result = {"eval/reward": reward_sum / max(reward_count, 1), "eval/num_prompts": len(rows)}
    for name, total, count in zip(names, totals, counts, strict=True):
        result[f"eval/rewards/{name}/mean"] = float(total / count) if count else float("nan")
    return result


def evaluate_model(
    model: torch.nn.Module | RolloutEngine,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    reward_funcs: Sequence[Callable[..., Any]],
    config: EvalConfig | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    **overrides: Any,
) -> EvalResult:
    """Generate ``config.n`` samples (and a greedy completion if ``config.greedy``) per row,
    score them with ``reward_funcs`` and aggregate.

    ``overrides`` replace fields of ``config`` (e.g. ``n=4, ks=[1, 4]``). ``progress(done,
    total)`` is called after each batch. Correctness is decided by the ``correct_reward``
    function (default: the first function marked ``is_correctness``, else the only function
    other than ``format_reward``); if neither applies, a ValueError asks for
    ``correct_reward``."""
    config = config if config is not None else EvalConfig()
    if overrides:
        base = asdict(config)
        if "n" in overrides and "ks" not in overrides:
            base["ks"] = None  # the ks that were derived from the old n may not fit the new one
        config = EvalConfig(**{**base, **overrides})
    rows = list(rows)
    if not rows:
        raise ValueError("evaluate_model needs at least one row")
    scorer = RewardScorer(reward_funcs)
    names = scorer.names
    flagged = correctness_index(scorer.funcs)
    others = [name for name in names if name != "format_reward"]
    default_correct = (
        names[flagged] if flagged is not None else others[0] if len(others) == 1 else None
    )
    correct_j = _resolve_reward(names, config.correct_reward, default_correct, "correct_reward")
    if correct_j is None:
        raise ValueError(f"which reward defines correctness? Set correct_reward to one of {names}")
    format_j = _resolve_reward(names, config.format_reward, "format_reward", "format_reward")
    threshold = config.correct_threshold
    engine = as_engine(model, tokenizer)
    render = prompt_render(engine)
    device = getattr(engine, "device", torch.device("cpu"))
    results: list[PromptResult] = []

    for begin in range(0, len(rows), config.batch_size):
        batch = rows[begin : begin + config.batch_size]
        ids = tokenize_prompts(
            [r["prompt"] for r in batch], tokenizer, config.max_prompt_length, render
        )
        batch_results = [
            PromptResult(prompt_id=prompt_id(r), difficulty=r.get("difficulty"), task=r.get("task"))
            for r in batch
        ]
        if config.n > 0:
            generator = torch.Generator(device=device).manual_seed(_batch_seed(config.seed, begin))
            rollout = engine.generate(
                ids, config.n, config.sampling_params(), generator, rows=batch
            )
            per_func = _score(scorer, batch, rollout)
            lengths = rollout.lengths.cpu().double()
            truncated = rollout.truncated.cpu().double()
            group_ids = rollout.group_ids.cpu()
            for p, result in enumerate(batch_results):
                sel = group_ids == p
                values = per_func[sel]
                # NaN >= threshold is False: a None reward is not correct.
                result.correct = (values[:, correct_j] >= threshold).tolist()
                result.rewards = {name: _nanmean(values[:, j]) for j, name in enumerate(names)}
                result.mean_length = float(lengths[sel].mean())
                result.truncated_rate = float(truncated[sel].mean())
                if format_j is not None:
                    result.format_rate = float((values[:, format_j] >= threshold).double().mean())
        if config.greedy:
            params = plain_sampling(config.max_completion_length, 0.0)
            rollout = engine.generate(ids, 1, params, rows=batch)
            per_func = _score(scorer, batch, rollout)
            for p, result in enumerate(batch_results):
                result.greedy_correct = bool(per_func[p, correct_j] >= threshold)
                result.greedy_length = float(rollout.lengths[p])
        results.extend(batch_results)
        if progress is not None:
            progress(len(results), len(rows))

    summary = aggregate(results, config.ks)
    summary["correct_reward"] = names[correct_j]
    summary["format_reward"] = names[format_j] if format_j is not None else None
    return EvalResult(per_prompt=results, summary=summary, config=config, reward_names=names)


# --------------------------------------------------------------------------------------------
# Aggregation


def _mean(values: Sequence[float | None]) -> float:
    kept = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return math.fsum(kept) / len(kept) if kept else math.nan


def _metrics(results: list[PromptResult], ks: list[int]) -> dict[str, Any]:
    sampled = [r for r in results if r.n > 0]
    out: dict[str, Any] = {"num_prompts": len(results)}
    if sampled:
        for k in ks:
            out[f"pass@{k}"] = _mean([pass_at_k(r.n, r.c, k) for r in sampled])
        for k in ks:
            out[f"mean@{k}"] = _mean([sum(r.correct[:k]) / k for r in sampled])
        out["accuracy"] = _mean([r.c / r.n for r in sampled])
        out["format_rate"] = _mean([r.format_rate for r in sampled])
        out["mean_length"] = _mean([r.mean_length for r in sampled])
        out["truncated_rate"] = _mean([r.truncated_rate for r in sampled])
    greedy = [r.greedy_correct for r in results if r.greedy_correct is not None]
    if greedy:
        out["greedy_accuracy"] = _mean([float(g) for g in greedy])
    names = list(dict.fromkeys(name for r in sampled for name in r.rewards))
    for name in names:
        out[f"rewards/{name}"] = _mean([r.rewards.get(name) for r in sampled])
    return out


def _group_key(value: Any) -> tuple[int, float, str]:
    # Numeric levels sort numerically (2 before 10), anything else after them, by text.
    try:
        return (0, float(value), str(value))
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _breakdown(results: list[PromptResult], attr: str, ks: list[int]) -> dict[str, Any]:
    groups: dict[Any, list[PromptResult]] = {}
    for r in results:
        value = getattr(r, attr)
        if value is not None:
            groups.setdefault(value, []).append(r)
    return {str(v): _metrics(groups[v], ks) for v in sorted(groups, key=_group_key)}


def aggregate(
    per_prompt: Sequence[PromptResult | Mapping[str, Any]], ks: Sequence[int]
) -> dict[str, Any]:
    """Summary of per-prompt results: ``{"ks", "overall", "by_difficulty", "by_task"}``.

    Each of ``overall`` and the groups ``by_difficulty[str(level)]`` / ``by_task[str(task)]``
    holds ``num_prompts``, ``pass@k`` and ``mean@k`` for every k, ``accuracy`` (= mean@n),
    ``format_rate``, ``mean_length``, ``truncated_rate``, ``rewards/<name>`` (the sampled metrics
    only when there are samples), and ``greedy_accuracy`` when greedy results exist. Metrics
    are means over prompts; NaN values (undefined for a prompt) are skipped, and a metric that
    is undefined for every prompt is NaN. Prompts without a difficulty (task) are left out of
    ``by_difficulty`` (``by_task``). ValueError if some k exceeds a prompt's sample count."""
    results = _as_results(per_prompt)
    if not results:
        raise ValueError("aggregate: no per-prompt results")
    sampled = [r.n for r in results if r.n > 0]
    ks = check_ks(ks, min(sampled) if sampled else 0)
    return {
        "ks": ks,
        "overall": _metrics(results, ks),
        "by_difficulty": _breakdown(results, "difficulty", ks),
        "by_task": _breakdown(results, "task", ks),
    }


# --------------------------------------------------------------------------------------------
# Output


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3f}"
    return str(value)


def _render(header: list[str], body: list[list[str]]) -> str:
    """Aligned columns: the first left-aligned, the others right-aligned; a rule under the
    header."""
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells)

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(row) for row in body)])


def format_table(summary: Mapping[str, Any], task: str | None = None) -> str:
    """Plain-text table: one line for all prompts, then one per difficulty and per task; one
    column per metric (NaN or missing shows as ``-``). Numbers are right-aligned. With the
    ``task`` named, each difficulty level is also said in words (arithmetic's 12: "1-digit
    operands, 2 operands")."""
    from .tasks import level_name

    def level(key: str) -> str:
        words = level_name(task, key) if task else ""
        known = words and not words.startswith("difficulty")
        return f"difficulty={key} ({words})" if known else f"difficulty={key}"

    lines: list[tuple[str, Mapping[str, Any]]] = [("all", summary["overall"])]
    lines += [(level(k), m) for k, m in summary.get("by_difficulty", {}).items()]
    lines += [(f"task={k}", m) for k, m in summary.get("by_task", {}).items()]
    columns = list(dict.fromkeys(key for _, metrics in lines for key in metrics))
    header = ["group", *(c.replace("num_prompts", "prompts") for c in columns)]
    body = [[label, *(_cell(m.get(c)) for c in columns)] for label, m in lines]
    return _render(header, body)


def format_comparison(result: Mapping[str, Any]) -> str:
    """Plain-text table of :func:`compare`'s output: metric, a, b, b - a and the 95% CI."""
    header = ["metric", "a", "b", "b - a", "95% CI"]
    body = [
        [
            name,
            _cell(m["a"]),
            _cell(m["b"]),
            f"{m['diff']:+.3f}",
            f"[{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]",
        ]
        for name, m in result["metrics"].items()
    ]
    return _render(header, body)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return _jsonable(obj.item())
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (PromptResult, EvalResult)):
        return _jsonable(obj.to_dict())
    if isinstance(obj, EvalConfig):
        return _jsonable(asdict(obj))
    return obj


def save_json(summary: Any, path: str | Path) -> None:
    """Write ``summary`` (a dict, an :class:`EvalResult`, ...) as JSON, atomically
    (:mod:`groupwise.files`). NaN and inf become null (strict JSON)."""
    atomic_write_text(path, json.dumps(_jsonable(summary), indent=2, allow_nan=False) + "\n")


# --------------------------------------------------------------------------------------------
# Paired comparison


def compare(
    per_prompt_a: Sequence[PromptResult | Mapping[str, Any]],
    per_prompt_b: Sequence[PromptResult | Mapping[str, Any]],
    ks: Sequence[int],
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired difference ``b - a`` over the same prompts, with a paired bootstrap 95% CI.

    For each metric (``pass@k`` for every k, ``accuracy`` = c/n, and ``greedy_accuracy`` when
    both sides have greedy results) the per-prompt differences ``d_i = b_i - a_i`` are averaged;
    the CI is the 2.5 / 97.5 percentile of the mean of ``d`` over ``n_boot`` resamplings of the
    prompts with replacement (numpy ``default_rng(seed)``; the same resampled prompts for every
    metric). Identical inputs give exactly 0 and CI [0, 0]. ValueError if the two lists do not
    hold the same prompt ids in the same order, or a k exceeds a prompt's sample count."""
    a, b = _as_results(per_prompt_a), _as_results(per_prompt_b)
    if not a:
        raise ValueError("compare: no per-prompt results")
    ids_a, ids_b = [r.prompt_id for r in a], [r.prompt_id for r in b]
    if ids_a != ids_b:
        if len(ids_a) != len(ids_b):
            detail = f"{len(ids_a)} vs {len(ids_b)} prompts"
        else:
            i = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y)
            detail = f"first difference at position {i}: {ids_a[i]!r} vs {ids_b[i]!r}"
        raise ValueError(f"compare needs the same prompts in the same order ({detail})")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    ks = check_ks(ks, min(r.n for r in a + b)) if ks else []
    if any(r.n == 0 for r in a + b):
        per_metric: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    else:
        per_metric = {
            f"pass@{k}": (
                np.array([pass_at_k(r.n, r.c, k) for r in a]),
                np.array([pass_at_k(r.n, r.c, k) for r in b]),
            )
            for k in ks
        }
        per_metric["accuracy"] = (
            np.array([r.c / r.n for r in a]),
            np.array([r.c / r.n for r in b]),
        )
    if all(r.greedy_correct is not None for r in a + b):
        per_metric["greedy_accuracy"] = (
            np.array([float(r.greedy_correct) for r in a]),
            np.array([float(r.greedy_correct) for r in b]),
        )
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(a), size=(n_boot, len(a)))
    metrics = {}
    for name, (va, vb) in per_metric.items():
        d = vb - va
        boot = d[index].mean(axis=1)
        low, high = np.percentile(boot, [2.5, 97.5])
        metrics[name] = {
            "a": float(va.mean()),
            "b": float(vb.mean()),
            "diff": float(d.mean()),
            "ci_low": float(low),
            "ci_high": float(high),
        }
    return {"num_prompts": len(a), "n_boot": n_boot, "seed": seed, "metrics": metrics}
