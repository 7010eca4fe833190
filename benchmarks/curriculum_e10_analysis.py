"""The analysis of the curriculum experiment E10 (``benchmarks/curriculum_e10.py``), frozen
before any of its runs: endpoints, the group-sequential graphical test, the estimates.
Plain numpy and scipy (``curriculum_e10_stats.py`` holds the sequential statistics).

- **Primary endpoint, tokens (per run).** The sampled two-digit accuracy averaged over the
  generated-token budget: trapezoid over (tokens, accuracy) from the warm start's point at 0,
  cut at the budget (:func:`token_endpoint`; E9 averaged to each run's last evaluation, which a
  generation of four optimizer steps or DAPO's extra draws can overshoot by a large share).
- **Primary endpoint, wall-clock (per pair).** The sampled two-digit accuracy averaged over the
  baseline run's training time: each run's curve drawn against its own cumulative training
  seconds (evaluation excluded), from the warm start's point at 0 to the baseline's total; a
  curve that ends sooner holds its last value, one that ends later is cut (linear
  interpolation) (:func:`average_over`). Each hypothesis is tested on both endpoints: the token
  hypothesis first; its wall-clock twin inherits its level when it is rejected (a fixed
  sequence inside the graph), so the two share the family's error rate.
- **Comparisons.** Per part, each hypothesis (curriculum, baseline) is a paired t test of the
  per-seed difference of the endpoint (curriculum minus baseline; both arms of a seed share its
  pool), one-sided (curriculum better).
- **Looks and boundaries.** After ``LOOKS`` (3 and 5) seeds per arm. A hypothesis tested at
  local level a has efficacy boundaries from the Lan-DeMets O'Brien-Fleming spending function
  at a on the Z scale, at information fractions n / 5, mapped to the paired t with n - 1
  degrees of freedom by equal nominal p. Futility, non-binding: at a look before the last, a
  token hypothesis with t below ``FUTILITY_T`` (0.5) stops.
- **Multiplicity.** Familywise one-sided ``ALPHA`` (0.025) per part over its token and
  wall-clock hypotheses, by the graphical procedure (Bretz et al. 2009) in its group-sequential
  form (Maurer and Bretz 2013): the token hypotheses start with equal shares of the level (as
  Holm's); a rejected token hypothesis passes its share to its wall-clock twin, and a rejected
  wall-clock hypothesis passes its share to the other token hypotheses equally (so a share
  reaches another curriculum only once both endpoints of a pair are rejected).
- **Reported per hypothesis**, whichever way it falls: the naive mean difference and 95% t
  interval; the repeated confidence interval at the hypothesis' final level (valid at any
  look); the stage-wise-ordering p-value and the median-unbiased estimate (the naive mean is
  biased upwards by stopping at a boundary); the state: *pays* (rejected), *not shown*
  (futility, or the last look without crossing), *continue*.
- **Key secondaries** (naive paired mean and 95% t interval, no multiplicity adjustment):
  sampled and greedy two-digit accuracy at the budget, pass@8 and mean@8 on 64 problems,
  one-digit accuracy at the budget (forgetting), informative groups per rollout.
"""

from __future__ import annotations

from collections.abc import Sequence

import curriculum_e10_stats as seq
import numpy as np
from curriculum_e9_analysis import paired_t

LOOKS = (3, 5)  # seeds per arm at each look
ALPHA = 0.025  # familywise, one-sided, per part
FUTILITY_T = 0.5
PAYS, NOT_SHOWN, CONTINUE = "pays", "not shown", "continue"
ENDPOINTS = ("tokens", "wall")


def token_endpoint(run: dict, warm_accuracy: float) -> float:
    """The sampled two-digit accuracy averaged over the token budget: the curve against
    generated tokens, cut at the budget (a run's last generation, or DAPO's last draws, may
    overshoot it), so every arm is averaged over the same tokens."""
    return average_over([0.0] + [p["tokens"] for p in run["points"]],
                        [warm_accuracy] + [float(np.mean(p["sampled"])) for p in run["points"]],
                        run["budget"])  # fmt: skip


def average_over(seconds: Sequence[float], accuracy: Sequence[float], horizon: float) -> float:
    """Accuracy averaged over [0, horizon] (seconds or tokens): the trapezoid area of the curve,
    held at its last value past its end, cut at ``horizon`` (linear interpolation), over
    ``horizon``."""
    t, a = np.asarray(seconds, float), np.asarray(accuracy, float)
    if horizon <= 0 or t[0] != 0.0 or np.any(np.diff(t) < 0):
        raise ValueError(f"need seconds non-decreasing from 0 and a positive horizon, got "
                         f"{t.tolist()} and {horizon}")  # fmt: skip
    if t[-1] < horizon:
        t, a = np.append(t, horizon), np.append(a, a[-1])
    cut = np.interp(horizon, t, a)
    keep = t < horizon
    t, a = np.append(t[keep], horizon), np.append(a[keep], cut)
    return float(np.sum((a[1:] + a[:-1]) / 2 * np.diff(t)) / horizon)


def wall_endpoint(run: dict, warm_accuracy: float, horizon: float) -> float:
    """The run's sampled two-digit accuracy averaged over ``horizon`` training seconds."""
    return average_over([0.0] + [p["seconds"] for p in run["points"]],
                        [warm_accuracy] + [float(np.mean(p["sampled"])) for p in run["points"]],
                        horizon)  # fmt: skip


def differences(runs: dict[int, dict], base: dict[int, dict], seeds: Sequence[int],
                endpoint: str, warm_accuracy: float) -> list[float]:  # fmt: skip
    """Per seed: the curriculum's endpoint minus the baseline's (wall-clock: over the baseline
    run's training seconds)."""
    out = []
    for s in seeds:
        if endpoint == "tokens":
            out.append(token_endpoint(runs[s], warm_accuracy) - token_endpoint(base[s],
                                                                               warm_accuracy))
        else:
            horizon = base[s]["step_seconds"]
            out.append(wall_endpoint(runs[s], warm_accuracy, horizon)
                       - wall_endpoint(base[s], warm_accuracy, horizon))  # fmt: skip
    return out


def secondary(runs: dict[int, dict], base: dict[int, dict], seeds: Sequence[int]) -> dict:
    """Naive paired differences of the key secondaries at the budget."""
    values = {
        "sampled_at_budget": lambda r: float(np.mean(r["points"][-1]["sampled"])),
        "greedy_at_budget": lambda r: float(np.mean(r["greedy_two"])),
        "pass_at_8": lambda r: float(np.mean(np.asarray(r["pass_counts"]) > 0)),
        "mean_at_8": lambda r: float(np.mean(r["pass_counts"])) / 8,
        "one_digit_at_budget": lambda r: float(np.mean(r["sampled_one"])),
        "informative_per_rollout": lambda r: float(r["informative_per_rollout"]),
    }
    out = {}
    for name, value in values.items():
        d = [value(runs[s]) - value(base[s]) for s in seeds]
        out[name] = paired_t(d) if len(d) > 1 else {"n": len(d), "mean": float(np.mean(d))}
    return out


def graph(hypotheses: Sequence[tuple[str, str]]) -> tuple[dict, dict]:
    """The part's graph: token hypotheses share the level; each passes all of it to its
    wall-clock twin; a wall-clock hypothesis passes its level equally to the other token
    hypotheses (all of it back to its twin's siblings; to nobody when alone)."""
    tokens = [name(h, "tokens") for h in hypotheses]
    walls = [name(h, "wall") for h in hypotheses]
    weights = {h: 1 / len(tokens) for h in tokens} | {h: 0.0 for h in walls}
    transitions: dict[str, dict[str, float]] = {h: {} for h in tokens + walls}
    for t, w in zip(tokens, walls, strict=True):
        transitions[t][w] = 1.0
        others = [o for o in tokens if o != t]
        for o in others:
            transitions[w][o] = 1 / len(others)
    return weights, transitions


def name(hypothesis: tuple[str, str], endpoint: str) -> str:
    return f"{hypothesis[0]} > {hypothesis[1]} ({endpoint})"


def analyse_part(runs: list[dict], warm_accuracy: float, hypotheses: Sequence[tuple[str, str]],
                 looks: Sequence[int] = LOOKS, alpha: float = ALPHA) -> dict:  # fmt: skip
    """One part: each hypothesis' t at every look its arms reached (a token hypothesis stops at
    futility; its wall-clock twin with it), the graphical test over them, and the estimates."""
    by_arm: dict[str, dict[int, dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    fractions = [n / looks[-1] for n in looks]
    paths: dict[str, list[float]] = {}
    dfs: dict[str, list[int]] = {}
    tests: dict[str, list[dict]] = {}
    futile: dict[str, int] = {}
    for h in hypotheses:
        mine, base = by_arm.get(h[0], {}), by_arm.get(h[1], {})
        for endpoint in ENDPOINTS:
            paths[name(h, endpoint)], dfs[name(h, endpoint)], tests[name(h, endpoint)] = [], [], []
        for k, n in enumerate(looks):
            seeds = list(range(1, n + 1))
            if not all(s in mine and s in base for s in seeds) or name(h, "tokens") in futile:
                break
            for endpoint in ENDPOINTS:
                t = paired_t(differences(mine, base, seeds, endpoint, warm_accuracy))
                paths[name(h, endpoint)].append(t["t"])
                dfs[name(h, endpoint)].append(t["df"])
                tests[name(h, endpoint)].append(t)
            if seq.futility_stop(tests[name(h, "tokens")][-1]["t"], k + 1, len(looks), FUTILITY_T):
                futile[name(h, "tokens")] = k + 1
    weights, transitions = graph(hypotheses)
    decided = seq.graphical_sequential_test(paths, dfs, weights, transitions, alpha, fractions)
    out: dict = {"fractions": fractions, "hypotheses": {}}
    for h in hypotheses:
        for endpoint in ENDPOINTS:
            key = name(h, endpoint)
            out["hypotheses"][key] = describe(tests[key], decided[key], fractions, looks,
                                              futile.get(name(h, "tokens")))  # fmt: skip
        seeds = [s for s in range(1, looks[-1] + 1)
                 if s in by_arm.get(h[0], {}) and s in by_arm.get(h[1], {})]  # fmt: skip
        if seeds:
            out["hypotheses"][name(h, "tokens")]["secondary"] = secondary(
                by_arm[h[0]], by_arm[h[1]], seeds)
    return out


def describe(tests: list[dict], decided: seq.HypothesisResult, fractions: Sequence[float],
             looks: Sequence[int], futile_at: int | None) -> dict:  # fmt: skip
    """A hypothesis' state and estimates at its last look: the naive test, its level in the
    final graph, the boundaries and alpha spent at that level, the repeated interval, the
    stage-wise p-value and the median-unbiased estimate."""
    if not tests:
        return {"state": CONTINUE, "looks": 0}
    k, last = len(tests), tests[-1]
    if decided.rejected:
        state = PAYS
    elif futile_at is not None or k == len(looks):
        state = NOT_SHOWN
    else:
        state = CONTINUE
    level = decided.local_alpha
    out = {"state": state, "looks": k, "seeds": last["n"], "naive": last, "level": level,
           "rejected_at_look": decided.look, "futility_at_look": futile_at}  # fmt: skip
    if level <= 0:  # a wall-clock twin whose token hypothesis was not rejected: never tested
        return out
    # The estimates at the look it crossed at (stopping there is what biases the naive mean),
    # else at its last look; the repeated interval is also given at the last look (valid too).
    at = decided.look or k
    test = tests[at - 1]
    z_bounds = list(decided.z_bounds)
    t_bounds = seq.t_boundaries(z_bounds, [n - 1 for n in looks])
    out["t_boundaries"] = t_bounds
    out["spent_alpha"] = seq.spent_alpha(fractions, level)
    est: dict = {"look": at, "seeds": test["n"], "mean": test["mean"], "t": test["t"],
                 "boundary": t_bounds[at - 1],
                 "repeated_ci": list(seq.repeated_ci(test["mean"], test["se"], t_bounds[at - 1]))}
    if test["se"] > 0:
        z_obs = seq.t_to_z(test["t"], test["df"])
        est["stagewise_p"] = seq.stagewise_p_value(at, z_obs, z_bounds, fractions)
        est["median_unbiased"] = seq.mean_difference_estimate(
            at, test["mean"], test["sd"], test["n"], z_bounds, fractions, test["df"])
    out["estimates"] = est
    out["repeated_ci_last"] = list(seq.repeated_ci(last["mean"], last["se"], t_bounds[k - 1]))
    return out


def analyse(runs: list[dict], meta: dict, hypotheses: dict[str, Sequence[tuple[str, str]]],
            looks: Sequence[int] = LOOKS) -> dict:  # fmt: skip
    """Every part (``hypotheses``: part -> (curriculum, baseline) pairs)."""
    if not meta:
        return {"parts": {}}
    warm = meta["sampled_accuracy"]
    return {"parts": {part: analyse_part([r for r in runs if r["part"] == part], warm, hyps,
                                         looks)
                      for part, hyps in hypotheses.items()}}  # fmt: skip


def power(delta: float, sd: float, level: float, looks: Sequence[int] = LOOKS,
          reps: int = 20_000, seed: int = 0) -> float:
    """The chance that a hypothesis tested at ``level`` is rejected when the per-seed paired
    differences are normal(delta, sd): simulated paired t paths against the boundaries, with
    the futility stop (the planning figure; the graph's recycling only adds to it)."""
    fractions = [n / looks[-1] for n in looks]
    bounds = seq.t_boundaries(seq.z_boundaries(fractions, level), [n - 1 for n in looks])
    d = np.random.default_rng(seed).normal(delta, sd, size=(reps, looks[-1]))
    going = np.ones(reps, bool)
    crossed = np.zeros(reps, bool)
    for k, n in enumerate(looks):
        x = d[:, :n]
        t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
        crossed |= going & (t >= bounds[k])
        going &= ~crossed & ~((t < FUTILITY_T) & (k < len(looks) - 1))
    return float(crossed.mean())


def design(sd: float, levels: Sequence[float], deltas: Sequence[float],
           looks: Sequence[int] = LOOKS) -> dict:  # fmt: skip
    """Per level: the Z and t boundaries, the alpha spent per look, and the power at each
    difference."""
    fractions = [n / looks[-1] for n in looks]
    out = {}
    for level in levels:
        z = seq.z_boundaries(fractions, level)
        out[f"{level:.5f}"] = {
            "z": z, "t": seq.t_boundaries(z, [n - 1 for n in looks]),
            "spent_alpha": seq.spent_alpha(fractions, level),
            "power": {f"{d:+.3f}": power(d, sd, level, looks) for d in deltas},
        }  # fmt: skip
    return out


def arms_needed(state: dict, hypotheses: dict[str, Sequence[tuple[str, str]]]) -> dict:
    """Per part, the arms of every (curriculum, baseline) pair whose token or wall-clock
    hypothesis is still in play."""
    out: dict[str, set[str]] = {}
    for part, hyps in hypotheses.items():
        found = state.get("parts", {}).get(part, {}).get("hypotheses", {})
        out[part] = {arm for h in hyps
                     if any(found.get(name(h, e), {}).get("state", CONTINUE) == CONTINUE
                            for e in ENDPOINTS)
                     for arm in h}  # fmt: skip
    return out


def summary(out: dict) -> list[str]:
    """One line per hypothesis."""
    lines = []
    for part, p in out.get("parts", {}).items():
        for key, h in p["hypotheses"].items():
            line = f"[{part}] {key}: {h['state']}"
            if h.get("looks"):
                n = h["naive"]
                line += (f" after {h['seeds']} seeds: {n['mean']:+.4f} (95% {n['low']:+.4f}, "
                         f"{n['high']:+.4f}), t {n['t']:.2f}")  # fmt: skip
                e = h.get("estimates")
                if e:
                    lo, hi = e["repeated_ci"]
                    line += (f"; level {h['level']:.4f}; at look {e['look']} ({e['seeds']} seeds):"
                             f" t {e['t']:.2f} against {e['boundary']:.2f}, repeated CI "
                             f"({lo:+.4f}, {hi:+.4f})")  # fmt: skip
                    if "median_unbiased" in e:
                        line += (f", stage-wise p {e['stagewise_p']:.4f}, median-unbiased "
                                 f"{e['median_unbiased']:+.4f}")  # fmt: skip
            lines.append(line)
    return lines
