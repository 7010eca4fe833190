"""Does the ``select`` curriculum reach a target accuracy with fewer generated tokens than
uniform GRPO? (An experiment, not a test: hours of CPU, resumable, results committed beside it.)

Design (fixed before any experiment seed of this regime ran):

- **Model and task.** SmolLM2-135M-Instruct after a shared warm start: ``SFT_STEPS`` (10) AdamW
  steps (learning rate 1e-5, 16 examples a step) of supervised fine-tuning on the worked answers
  (``<think> 3 + 4 = 7 </think> <answer> 7 </answer>``, the prompt's one-shot format) of every
  1-digit ``+``/``-`` training problem with a non-negative result. Then accuracy reward only and
  a KL term to the warm start (``RUN_OPTIONS``: ``beta`` 0.04, groupwise's and DeepSeekMath's
  default) in both arms. The task is two-operand addition at 1, 2 and 3 digits: the 1-digit
  level is solved and feeds all-correct groups, 2-digit is the learnable level and the primary
  endpoint, 3-digit feeds all-wrong groups. A pool of 64 training prompts per level (192), drawn
  per seed and identical for both arms of that seed.
- **Why this regime** (the eighth; the earlier ones are kept in ``results_curriculum/regime-1/``
  to ``regime-7/``, and ``docs/benchmarks.md`` tells their story). Regime 1 (a 20-step GRPO warm
  start, ``+``/``-``) left the 1-digit level unsolved, so ``select`` trained there, away from the
  endpoint; regimes 2-5 solved it with a second GRPO phase and found 2-digit subtraction not
  learnable at this scale; regime 6 (addition only, the GRPO warm start) passed its go/no-go, but
  its warm start could not be rebuilt on another CPU: GRPO samples, so the first logit that
  rounds differently (AVX2 against AVX-512 kernels) sends the warm start elsewhere, and the
  weights (540 MB) are not committed. A supervised warm start samples nothing: a rebuild on other
  kernels differs by rounding only, and is accepted by behaviour (``WARM_TOLERANCE``), so the
  experiment can run on any machine. Regime 7's 20 supervised steps started the 2-digit level
  too high (0.42) and nearly deterministic, and uniform's rise within the budget was 0.15; 10
  steps (chosen on the warm start's own figures before its pilot: 1-digit pass rate 0.955, 2-digit
  greedy accuracy 0.27, against 0.906 / 0.30 after 6 steps and 0.42 after 20) start it
  near where regime 6's warm start did (0.32), which rose by 0.28.
- **Arms.** ``uniform`` (GRPO, 4 prompts x 4 rollouts per step) and ``select`` (the predictive
  selector with its defaults: GRESO's keep rule, best-k on the posterior, over-sampling 4,
  group sizes 2..8 with mean 4). Nothing of either arm is tuned on the experiment's seeds.
- **Budget.** Equal generated completion tokens per arm: ``BUDGET_STEPS`` (50) steps of 16
  completions as long as the pilot pool's worked answers (``tokens_per_step``: 449.2 tokens, a
  count of the tokenizer's, so 22,458 tokens). 50 steps is regime 6's: its 200-step pilot rose
  in 40 steps and then sat on a plateau, where a target is crossed by evaluation noise rather
  than by learning speed. 16 paired seeds. Skipped candidates cost nothing (they are never
  generated); dropped rollouts would count.
- **Evaluation.** Greedy on a fixed 128-problem 2-digit set at every tenth of the budget; at
  B/2 and B on 400 two-digit (the 128 are its first rows) + every held-out one-digit (24) + 100
  three-digit.
- **Primary endpoint.** Generated tokens until the 128-problem accuracy first reaches the target
  (linear interpolation between evaluations), the target being the accuracy the uniform pilot
  reached at 60% of the budget. Paired t-test on log(tokens select / tokens uniform) over seeds.
  A run that never reaches it is censored at the budget (counted as the budget, which favours
  the arm that missed; the report says how many). Secondary: 2-digit greedy accuracy at B/2
  (paired bootstrap over seeds x problems) and informative groups per rollout. The goals are
  judged at ``PLANNED_SEEDS`` pairs, not earlier and not by adding seeds until an interval
  decides; before then ``report``'s goal lines say "yet". ``report`` also prints, as exploratory
  and outside the fixed design (added after six seeds, when one evaluation proved able to move
  the first crossing by most of the budget), the 128-problem accuracy averaged over the budget
  (:func:`curve_mean`), paired t interval; and, to size the next experiment, how much of the
  seed-to-seed spread of the accuracy difference at B/2 and B is the choice of evaluation
  problems and how much training's own (:func:`difference_spread`).
- **Pilot and go/no-go** (``pilot``, seed 0, not an experiment seed): each of seed 0's 192 pool
  prompts sampled 16 times at temperature 1 by the warm start gives the real pass-rate
  distribution and from it the ceiling of any pre-rollout selector (the informative-group rate
  of an oracle keeping the best quarter, against uniform's); one uniform run over the budget
  gives the learning curve and the target. Proceed only if the 1-digit pass rate is at least
  ``ONE_DIGIT_GOAL``, uniform's 2-digit accuracy rises by >= 0.25 within the budget and the
  best-quarter ceiling is >= 2x.

Stages write to ``benchmarks/results_curriculum/`` (committed): ``warm.json``, ``pilot.json``,
``runs.jsonl`` (one line per finished run; a rerun skips what is done, so the experiment can
run in parts). Model weights go to ``--work`` (default ``runs/curriculum-work``) and are rebuilt
(a few minutes) when absent. A rebuild on a CPU with other kernels has another digest than
``warm.json``'s: ``run`` measures its 128-problem accuracy once (``warm.json``, ``rebuilds``)
and accepts it within ``WARM_TOLERANCE`` of the recorded one, refusing it otherwise; every run
records its warm start's digest and ``report`` pairs only runs from the same one (``rebuild``
asks the question without running). ``report`` and ``levels`` read another regime's results
with ``--results``.

    python benchmarks/curriculum.py pilot              # the warm start, pass rates, uniform pilot
    python benchmarks/curriculum.py run --seeds 1-16   # about 26 minutes per run (2 cores)
    python benchmarks/curriculum.py report             # the tables from what has finished
    python benchmarks/curriculum.py levels             # which levels each arm trains on
    python benchmarks/curriculum.py rebuild --work /tmp/w  # would this machine's rebuild do?
    python benchmarks/curriculum.py report --results benchmarks/results_curriculum/regime-1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.curriculum import GlobalRows, PromptBatch, SelectCurriculum, SelectOptions
from groupwise.data.prompts import tokenize_prompts
from groupwise.evaluation import evaluate_model
from groupwise.rewards import accuracy_reward
from groupwise.runtime.models import load_model_and_tokenizer
from groupwise.tasks.arithmetic import arithmetic_dataset, arithmetic_split_size

RESULTS = Path(__file__).resolve().parent / "results_curriculum"
LEVELS = (1, 2, 3)  # operand digits; the difficulty column is digits * 10 + 2 operands
POOL_PER_LEVEL = 64
PILOT_SEED = 0  # the pilot's pool and run; experiment seeds start at 1
WARM_SEED = 1000
MARKS = tuple(round(0.1 * k, 1) for k in range(1, 11))  # evaluations at tenths of the budget
BIG_MARKS = (0.5, 1.0)  # the whole evaluation set (533 problems)
BUDGET_STEPS = 50  # uniform-equivalent steps of 16 completions (4 prompts x 4 rollouts)
TARGET_MARK = 0.6  # the target is the uniform pilot's 2-digit accuracy here
SAMPLES_PER_PROMPT = 16  # the pilot's pass-rate measurement
PLANNED_SEEDS = 16  # paired seeds the experiment runs (``run``'s default --seeds)
# What ``select`` is asked to show: at most this ratio of uniform's tokens to the target, with
# the interval below 1.0, and at least this ratio of uniform's informative groups per rollout.
GOAL_TOKEN_RATIO = 0.6
GOAL_INFORMATIVE_RATIO = 1.5
ONE_DIGIT_GOAL = 0.9  # the warm start's 1-digit pass rate at temperature 1 (go/no-go)
TASK_OPS = "+"  # the pools and the evaluation
WARM_OPS = "+-"  # the warm start's fine-tuning problems (non-negative results)
SFT_STEPS = 10  # the warm start's fine-tuning: AdamW steps of SFT_BATCH worked answers
SFT_BATCH = 16
SFT_LR = 1e-5
# A rebuild on other kernels differs from the recorded warm start by rounding only; it is
# accepted when its 128-problem greedy accuracy is within 4 problems of the recorded one.
WARM_TOLERANCE = 4 / 128

BASE_OPTIONS: dict[str, Any] = dict(
    # the loss and schedule the recorded results were measured with (TRL's defaults differ)
    loss_type="grpo",
    use_bias_correction_kl=False,
    lr_scheduler_type="constant",
    gradient_checkpointing=False,
    logging_steps=1,
    num_generations=4,
    per_device_train_batch_size=16,  # 4 prompts x 4 rollouts per step
    max_completion_length=48,
    temperature=1.0,
    learning_rate=1e-5,
    beta=0.0,
    rollout_min=2,
    rollout_max=8,
    disable_tqdm=True,
    save_strategy="no",
    max_steps=10_000,  # the token budget stops a run, never this
)

# Both arms and the uniform pilot (not the warm start): a KL term to the warm start, k3 estimator.
RUN_OPTIONS: dict[str, Any] = dict(beta=0.04)

ARMS: dict[str, dict[str, Any]] = {
    "uniform": {},
    "select": {"curriculum": "select"},
}

# Two-sided 95% quantiles of Student's t, df = 1..15.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
        2.201, 2.179, 2.160, 2.145, 2.131]  # fmt: skip


# --------------------------------------------------------------------------------------------
# Data


def problems(
    n: int | None, split: str, seed: int, digits: int, ops: str = TASK_OPS
) -> list[dict]:
    """``n`` distinct seeded two-operand problems of ``digits`` digits with operators from
    ``ops`` whose result is not negative (``None``: every such problem of the split)."""
    size = arithmetic_split_size(digits, 2, 2, ops, split, 0.25)
    if n is None and size is None:
        raise ValueError(f"the {digits}-digit {split} split is too large to take whole")
    want = size if n is None else min(size or 3 * n, 3 * n)
    rows = arithmetic_dataset(want, split, seed=seed, digits=digits, ops=ops)
    rows = [row for row in rows if float(row["answer"]) >= 0]
    if n is not None and len(rows) < n:
        raise ValueError(f"only {len(rows)} non-negative {digits}-digit {ops!r} {split} "
                         f"problems, {n} wanted")  # fmt: skip
    return rows if n is None else rows[:n]


def pool_rows(seed: int) -> list[dict]:
    return [row for digits in LEVELS for row in problems(POOL_PER_LEVEL, "train", seed, digits)]


def eval_rows() -> list[dict]:
    """400 two-digit problems (the first 128 are the frequent evaluation), then every held-out
    1-digit problem there is and 100 three-digit; fixed for the whole experiment."""
    return problems(400, "eval", 7, 2) + problems(None, "eval", 7, 1) + problems(100, "eval", 7, 3)


ONE_DIGIT_EVAL = len(problems(None, "eval", 7, 1))
FREQUENT = slice(0, 128)


def level_part(level: int, size: int) -> slice:
    """Where a level's problems sit in a whole evaluation of ``size`` problems: 400 two-digit,
    the one-digit ones, 100 three-digit (the regimes differ in the one-digit count)."""
    return {2: slice(0, 400), 1: slice(400, size - 100), 3: slice(size - 100, size)}[level]


def greedy_correct(model, tokenizer, rows: list[dict]) -> list[bool]:
    """Per problem: is the greedy completion correct (``model``: a model or a run's engine)."""
    result = evaluate_model(
        model, tokenizer, rows, [accuracy_reward], n=0, greedy=True,
        max_completion_length=BASE_OPTIONS["max_completion_length"], batch_size=64,
    )  # fmt: skip
    return [bool(r.greedy_correct) for r in result.per_prompt]


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------
# Stages


def weights_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def built_once(folder: Path, recorded: dict | None, build) -> dict:
    """Weights built by ``build(folder) -> record`` unless ``folder`` holds them already. The
    record keeps a digest of the weights, so a rebuild that differs (CPU kernels, library
    versions) is noticed; the first record is kept."""
    if (folder / "config.json").exists():
        if recorded is None:
            raise SystemExit(f"{folder} exists but its record in {RESULTS / 'warm.json'} does "
                             f"not: remove {folder} to rebuild")  # fmt: skip
        return recorded
    start = time.perf_counter()
    record = {**build(folder), "seconds": round(time.perf_counter() - start, 1),
              "digest": weights_digest(folder)}  # fmt: skip
    if recorded is None:
        return record
    if recorded["digest"] != record["digest"]:
        print(f"warning: the rebuilt {folder.name} differs from the recorded one (digest "
              f"{record['digest']} vs {recorded['digest']}); the recorded figures are kept",
              flush=True)  # fmt: skip
    return recorded


def worked_answer(row: dict) -> str:
    """The completion the warm start is fine-tuned on, in the prompt's own one-shot format."""
    answer = row["answer"]
    return f"<think> {row['expression']} = {answer} </think> <answer> {answer} </answer>"


def completion_ids(tokenizer, row: dict) -> list[int]:
    return tokenizer(worked_answer(row) + tokenizer.eos_token, add_special_tokens=False)[
        "input_ids"
    ]


def supervised_batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict:
    """Right-padded (prompt + completion) ids with the loss on the completion tokens only."""
    length = max(len(p) + len(c) for p, c in examples)
    ids = torch.full((len(examples), length), pad_id)
    labels = torch.full((len(examples), length), -100)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for i, (prompt, completion) in enumerate(examples):
        both = prompt + completion
        ids[i, : len(both)] = torch.tensor(both)
        mask[i, : len(both)] = 1
        labels[i, len(prompt) : len(both)] = torch.tensor(completion)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def supervised_order(n: int, steps: int, batch: int, seed: int) -> list[list[int]]:
    """Each step's example indices: seeded epochs without replacement, fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    order: list[int] = []
    batches = []
    for _ in range(steps):
        picked = []
        while len(picked) < batch:
            order = order or rng.permutation(n).tolist()
            picked.append(order.pop())
        batches.append(picked)
    return batches


def fine_tune(folder: Path) -> dict:
    """The warm start: SmolLM2-135M-Instruct fine-tuned (``SFT_STEPS`` AdamW steps of
    ``SFT_BATCH``, cross-entropy on the completion) on the worked answers of every 1-digit
    ``+``/``-`` training problem with a non-negative result (seed ``WARM_SEED``)."""
    print(f"fine-tuning the warm start into {folder} ({SFT_STEPS} steps)", flush=True)
    torch.manual_seed(WARM_SEED)
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    rows = problems(None, "train", WARM_SEED, 1, ops=WARM_OPS)
    examples = [
        (tokenize_prompts([row["prompt"]], tokenizer, None)[0], completion_ids(tokenizer, row))
        for row in rows
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    model.train()
    losses = []
    for picked in supervised_order(len(examples), SFT_STEPS, SFT_BATCH, WARM_SEED):
        batch = supervised_batch([examples[i] for i in picked], tokenizer.pad_token_id)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 5))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"steps": SFT_STEPS, "learning_rate": SFT_LR, "batch": SFT_BATCH, "rows": len(rows),
            "loss": losses, "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # fmt: skip


def tokens_per_step(tokenizer) -> float:
    """The budget's unit: 16 completions of the pilot pool's mean worked-answer length (a
    count fixed by the tokenizer, the same on every machine)."""
    lengths = [len(completion_ids(tokenizer, row)) for row in pool_rows(PILOT_SEED)]
    return BASE_OPTIONS["per_device_train_batch_size"] * statistics.mean(lengths)


def warm_start(work: Path) -> tuple[Path, dict]:
    """The shared warm start (:func:`fine_tune`), built once into ``work``; its record (with a
    digest of the weights) in ``results_curriculum/warm.json``."""
    meta_path = RESULTS / "warm.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    folder = work / f"warm-supervised-{SFT_STEPS}"
    meta["supervised"] = built_once(folder, meta.get("supervised"), fine_tune)
    if "tokens_per_step" not in meta:
        _, tokenizer = load_model_and_tokenizer(str(folder))
        meta["tokens_per_step"] = tokens_per_step(tokenizer)
    write_json(meta_path, meta)
    return folder, meta


def recorded_digest(meta: dict) -> str:
    """The digest of the warm start the pilot measured (earlier regimes: the 1-digit phase)."""
    return (meta.get("supervised") or meta["one_digit"])["digest"]


def sampled_correct(model, tokenizer, rows: list[dict]) -> list[int]:
    """Correct samples out of SAMPLES_PER_PROMPT per row at temperature 1 (``model``: a model
    or a run's engine), with the pilot's sampling seed."""
    result = evaluate_model(
        model, tokenizer, rows, [accuracy_reward], n=SAMPLES_PER_PROMPT,
        ks=[1], greedy=False, temperature=1.0,
        max_completion_length=BASE_OPTIONS["max_completion_length"], seed=PILOT_SEED,
        batch_size=8,
    )  # fmt: skip
    return [int(r.c) for r in result.per_prompt]


class StepLogs:
    """Base of the experiment's callbacks: :meth:`new_step` is true once per training step's log
    row. The end-of-training row repeats the last step's metrics (as in TRL), so it is not one."""

    def __init__(self) -> None:
        self.trainer: GRPOTrainer | None = None
        self.last_step = -1

    def new_step(self, state, logs: dict | None) -> bool:
        if not logs or "compute/generated_tokens_total" not in logs:
            return False
        if state.global_step == self.last_step:
            return False
        self.last_step = state.global_step
        return True


def pass_rates(warm: Path) -> list[int]:
    """Correct samples out of SAMPLES_PER_PROMPT per pilot-pool prompt, at temperature 1."""
    model, tokenizer = load_model_and_tokenizer(str(warm))
    return sampled_correct(model, tokenizer, pool_rows(PILOT_SEED))


def informative_estimate(c: np.ndarray, n: int, g: int = 4) -> np.ndarray:
    """Unbiased per-prompt estimate of P(a group of g is not all alike) = 1 - p^g - (1-p)^g
    from c correct of n samples: C(c, g) / C(n, g) is the U-statistic for p^g."""
    all_right = np.array([math.comb(int(k), g) for k in c]) / math.comb(n, g)
    all_wrong = np.array([math.comb(int(n - k), g) for k in c]) / math.comb(n, g)
    return 1.0 - all_right - all_wrong


def selection_ceiling(counts: list[int], n: int = SAMPLES_PER_PROMPT, keep: float = 0.25) -> dict:
    """Informative groups per rollout of an oracle that keeps the best ``keep`` share of the
    pool, against uniform's (the analytic ceiling of pre-rollout selection). The oracle's
    ranking and its rate come from disjoint halves of the samples (cross-fitted, both ways),
    so ranking noise does not inflate the ceiling; the plug-in figure is printed beside it."""
    c = np.asarray(counts)
    uniform = float(informative_estimate(c, n).mean())
    rng = np.random.default_rng(0)
    half = n // 2
    # Split each prompt's c successes of n into two halves of n/2 (hypergeometric).
    first = rng.hypergeometric(c, n - c, half)
    second = c - first
    best = max(1, int(round(keep * len(c))))
    crossed = []
    for rank, rate in ((first, second), (second, first)):
        order = np.argsort(-informative_estimate(rank, half), kind="stable")[:best]
        crossed.append(float(informative_estimate(rate[order], half).mean()))
    plug_in = np.sort(informative_estimate(c, n))[::-1][:best].mean()
    p = c / n
    return {
        "uniform_informative": uniform,
        "best_quarter_ratio": float(np.mean(crossed)) / uniform if uniform > 0 else math.nan,
        "best_quarter_ratio_plug_in": float(plug_in) / uniform if uniform > 0 else math.nan,
        "share_all_wrong": float((c == 0).mean()),
        "share_all_right": float((c == n).mean()),
        "mean_pass_rate_by_level": {
            f"{d}-digit": float(p[i * POOL_PER_LEVEL : (i + 1) * POOL_PER_LEVEL].mean())
            for i, d in enumerate(LEVELS)
        },
    }


class TokenBudget(StepLogs):
    """Stops training once the run's generated completion tokens reach ``budget``; evaluates
    greedily at each fraction of the budget in MARKS (the whole set at BIG_MARKS, the
    frequent 128 otherwise)."""

    def __init__(self, budget: int, rows: list[dict]) -> None:
        super().__init__()
        self.budget, self.rows = budget, rows
        self.marks = list(MARKS)
        self.points: list[dict] = []
        self.step_seconds = 0.0
        self.last: dict[str, float] = {}
        self.groups: list[list[list[int]]] = []

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if not self.new_step(state, logs):
            return
        self.last = dict(logs)
        self.step_seconds += logs.get("time/step", 0.0)
        self.groups.append(self.step_groups())
        tokens = logs["compute/generated_tokens_total"]
        while self.marks and tokens >= self.marks[0] * self.budget:
            mark = self.marks.pop(0)
            rows = self.rows if mark in BIG_MARKS else self.rows[FREQUENT]
            greedy = greedy_correct(self.trainer.engine, self.trainer.tokenizer, rows)
            self.trainer.model.train()
            self.points.append({"mark": mark, "tokens": tokens, "step": state.global_step,
                                "greedy": [int(x) for x in greedy]})  # fmt: skip
            print(f"  {mark:.1f} B: step {state.global_step}, 2-digit "
                  f"{np.mean(greedy[FREQUENT]):.3f}", flush=True)  # fmt: skip
        if not self.marks:
            control.should_training_stop = True

    def step_groups(self) -> list[list[int]]:
        """The last step's groups as [digits, rollouts, correct]: which levels the arm trained
        on, and how many of those groups were informative."""
        rows, _, rewards, _, _, group_ids, _ = self.trainer.records.last_batch
        groups = []
        for g, row in enumerate(rows):
            member = group_ids == g
            if member.any():
                correct = int((rewards[member] > 0.5).sum())
                groups.append([int(row["difficulty"]) // 10, int(member.sum()), correct])
        return groups


def run_arm(
    arm: str, seed: int, warm: Path, warm_digest: str, budget: int, rows: list[dict]
) -> dict:
    """One run of ``arm`` from the warm start in ``warm`` (its digest, ``warm_digest``, goes in
    the result, so runs pair only with runs from the same weights)."""
    budget_cb = TokenBudget(budget, rows)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            **{**BASE_OPTIONS, **RUN_OPTIONS, **ARMS[arm], "seed": seed, "output_dir": tmp}
        )
        trainer = GRPOTrainer(
            str(warm), ["accuracy"], pool_rows(seed), args=args, callbacks=[budget_cb]
        )
        budget_cb.trainer = trainer
        trainer.train()
    last = budget_cb.last
    return {
        "arm": arm,
        "seed": seed,
        "warm": warm_digest,
        "budget": budget,
        "tokens": last["compute/generated_tokens_total"],
        "rollouts": last["compute/rollouts_total"],
        "optimizer_steps": last["compute/optimizer_steps_total"],
        "informative_per_rollout": last["compute/informative_groups_per_rollout_total"],
        "step_seconds": round(budget_cb.step_seconds, 1),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "points": budget_cb.points,
        "groups": budget_cb.groups,
    }


def read_runs(results: Path = RESULTS) -> list[dict]:
    path = results / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_warm(run: dict, meta: dict) -> str:
    """The digest of the warm start ``run`` started from: runs recorded before digests were
    kept used the recorded one."""
    return run.get("warm", recorded_digest(meta))


def run_start(run: dict, meta: dict) -> float:
    """The 128-problem 2-digit accuracy of ``run``'s warm start (its curve's first point)."""
    digest = run_warm(run, meta)
    if digest == recorded_digest(meta):
        return meta["eval"]["frequent"]
    return meta["rebuilds"][digest]["frequent"]


def append_run(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with (RESULTS / "runs.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")


# --------------------------------------------------------------------------------------------
# Endpoints


def curve(run: dict, start: float) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, frequent-set 2-digit accuracy), from the warm start's accuracy ``start``."""
    tokens = [0.0] + [p["tokens"] for p in run["points"]]
    acc = [start] + [float(np.mean(p["greedy"][FREQUENT])) for p in run["points"]]
    return np.array(tokens, float), np.array(acc)


def tokens_to(run: dict, target: float, start: float) -> tuple[float, bool]:
    """Generated tokens at which the accuracy first reaches ``target`` (linear interpolation
    between evaluations; ``start``: the accuracy at 0 tokens); (budget, False) when it never
    does."""
    tokens, acc = curve(run, start)
    for k in range(1, len(acc)):
        if acc[k] >= target:
            if acc[k - 1] >= target:
                return float(tokens[k - 1]), True
            frac = (target - acc[k - 1]) / (acc[k] - acc[k - 1])
            return float(tokens[k - 1] + frac * (tokens[k] - tokens[k - 1])), True
    return float(run["budget"]), False


def curve_mean(run: dict, start: float) -> float:
    """The 128-problem accuracy averaged over the generated tokens (the area under the
    trapezoidal curve from the warm start to the last evaluation, over its tokens): a summary of
    the whole curve that, unlike the first crossing of a target, no single evaluation decides."""
    tokens, acc = curve(run, start)
    area = float(np.sum((acc[1:] + acc[:-1]) / 2 * np.diff(tokens)))
    return area / float(tokens[-1])


def accuracy_at(run: dict, mark: float, level: int = 2) -> np.ndarray:
    """Per problem of ``level`` digits: greedy correct at ``mark`` (a BIG_MARKS evaluation)."""
    greedy = next(p for p in run["points"] if p["mark"] == mark)["greedy"]
    return np.array(greedy[level_part(level, len(greedy))], float)


def t_test(values: list[float]) -> dict:
    """Mean, spread and 95% t interval of paired values (past 16 pairs the table's last
    quantile, a slightly wider interval)."""
    n = len(values)
    mean = statistics.mean(values)
    if n < 2:
        return {"n": n, "mean": mean}
    sd = statistics.stdev(values)
    se = sd / math.sqrt(n)
    half = T975[min(n - 2, len(T975) - 1)] * se
    return {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half}


def verdict(
    estimate: float, low: float, high: float, goal: float, lower_is_better: bool,
    complete: bool = False,
) -> str:
    """Whether a ratio with its 95% interval meets ``goal`` (``lower_is_better``: at most the
    goal, with the interval below 1.0; otherwise at least the goal, with the interval above 1.0),
    and whether the interval already rules the goal out. Once the planned pairs are all in
    (``complete``), an interval that neither meets nor rules out the goal is a final "not met":
    the design stops there rather than adding seeds until the interval decides."""
    if lower_is_better:
        met, ruled_out = estimate <= goal and high < 1.0, low > goal
    else:
        met, ruled_out = estimate >= goal and low > 1.0, high < goal
    if met:
        return f"met ({estimate:.2f}x, interval {low:.2f}-{high:.2f})"
    if ruled_out:
        return (f"not met, and ruled out: the whole interval ({low:.2f}-{high:.2f}) is "
                f"{'above' if lower_is_better else 'below'} {goal:.2f}x")  # fmt: skip
    undecided = f"{estimate:.2f}x, interval {low:.2f}-{high:.2f} includes {goal:.2f}x"
    if complete:
        return f"not met ({undecided}; the planned pairs are complete: neither shown nor ruled out)"
    return f"not met yet ({undecided})"


def power(effect: float, sd: float, n: int, draws: int = 200_000, seed: int = 0) -> float:
    """Power of the two-sided 5% paired t-test (:func:`t_test`) for a true mean ``effect`` with
    spread ``sd`` over ``n`` pairs: the share of ``draws`` simulated experiments (normal log
    ratios) whose t statistic passes the critical value. Exact up to simulation error (about
    0.001 at the default draws), where a normal approximation of the noncentral t is far off
    at a few pairs (3 pairs, effect 0.8 standard errors: 0.0002 against the true 0.079)."""
    if n < 2 or sd <= 0:
        return math.nan
    crit = T975[min(n - 2, len(T975) - 1)]
    samples = np.random.default_rng(seed).normal(effect, sd, size=(draws, n))
    t_stat = samples.mean(axis=1) / (samples.std(axis=1, ddof=1) / math.sqrt(n))
    return float(np.mean(np.abs(t_stat) > crit))


def difference_spread(diffs: list[np.ndarray]) -> dict:
    """Where the seed-to-seed spread of a paired accuracy difference comes from. ``diffs``: per
    seed, select - uniform per problem (-1, 0 or 1) on one evaluation set. ``between``: the
    standard deviation over seeds of the per-seed mean difference; ``problems``: the part the
    choice of evaluation problems contributes, sqrt(mean over seeds of var_j(d_j) / n) (the
    standard error of a seed's mean over its n problems); the rest, sqrt(between^2 -
    problems^2), is training's own seed-to-seed noise, which a larger evaluation set does not
    shrink."""
    means = [float(d.mean()) for d in diffs]
    between = statistics.stdev(means)
    problems = math.sqrt(statistics.mean(float(d.var(ddof=1)) / len(d) for d in diffs))
    return {"between": between, "problems": problems,
            "training": math.sqrt(max(0.0, between**2 - problems**2))}  # fmt: skip


def bootstrap(diffs: list[np.ndarray], seed: int = 0, n_boot: int = 4000) -> tuple[float, float]:
    """95% interval of the mean difference, resampling seeds and problems within a seed."""
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(n_boot):
        picked = rng.integers(0, len(diffs), len(diffs))
        means.append(np.mean([diffs[i][rng.integers(0, len(diffs[i]), len(diffs[i]))].mean()
                              for i in picked]))  # fmt: skip
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# --------------------------------------------------------------------------------------------
# Commands


def command_pilot(work: Path) -> None:
    warm, meta = warm_start(work)
    rows = eval_rows()
    if "eval" not in meta:
        model, tokenizer = load_model_and_tokenizer(str(warm))
        greedy = greedy_correct(model, tokenizer, rows)
        meta["eval"] = {
            "frequent": float(np.mean(greedy[FREQUENT])),
            **{f"{d}-digit": float(np.mean(greedy[level_part(d, len(rows))])) for d in LEVELS},
        }
        write_json(RESULTS / "warm.json", meta)
    print(json.dumps({"warm_start": meta}), flush=True)
    budget = int(round(BUDGET_STEPS * meta["tokens_per_step"]))
    pilot_path = RESULTS / "pilot.json"
    pilot = json.loads(pilot_path.read_text()) if pilot_path.exists() else {}
    if "pass_counts" not in pilot:
        start = time.perf_counter()
        pilot["pass_counts"] = pass_rates(warm)
        pilot["pass_seconds"] = round(time.perf_counter() - start, 1)
        pilot["ceiling"] = selection_ceiling(pilot["pass_counts"])
        write_json(pilot_path, pilot)
    print(json.dumps({"ceiling": pilot["ceiling"]}), flush=True)
    if "uniform" in pilot and pilot["uniform"]["budget"] != budget:
        # A pilot at another budget stays on record; its target does not apply to this one.
        earlier = {k: pilot.pop(k) for k in ("uniform", "target", "go") if k in pilot}
        pilot.setdefault("earlier_pilots", []).append(earlier)
        write_json(pilot_path, pilot)
    if "uniform" not in pilot:
        print(f"uniform pilot run: budget {budget} generated tokens", flush=True)
        pilot["uniform"] = run_arm("uniform", PILOT_SEED, warm, weights_digest(warm), budget, rows)
        write_json(pilot_path, pilot)
    run = pilot["uniform"]
    tokens, acc = curve(run, meta["eval"]["frequent"])
    at_target = next(p for p in run["points"] if p["mark"] == TARGET_MARK)
    pilot["target"] = float(np.mean(at_target["greedy"][FREQUENT]))
    rise = float(accuracy_at(run, 1.0).mean()) - meta["eval"]["2-digit"]
    ceiling = pilot["ceiling"]["best_quarter_ratio"]
    one_digit = pilot["ceiling"]["mean_pass_rate_by_level"]["1-digit"]
    pilot["go"] = {"one_digit_pass_rate": one_digit, "two_digit_rise": rise,
                   "best_quarter_ratio": ceiling,
                   "proceed": bool(one_digit >= ONE_DIGIT_GOAL and rise >= 0.25
                                   and ceiling >= 2.0)}  # fmt: skip
    write_json(pilot_path, pilot)
    print("uniform pilot, 128-problem 2-digit accuracy by tokens: "
          + ", ".join(f"{t:.0f}: {a:.3f}" for t, a in zip(tokens, acc, strict=True)))  # fmt: skip
    print(json.dumps({"target": pilot["target"], "go": pilot["go"]}), flush=True)


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    if PILOT_SEED in seeds:
        raise SystemExit(f"seed {PILOT_SEED} is the pilot's; experiment seeds start at 1")
    return seeds


def measure_rebuild(warm: Path, digest: str, meta: dict, rows: list[dict]) -> float:
    """The 128-problem 2-digit greedy accuracy of a warm start other than the recorded one,
    measured once and kept in ``warm.json`` under ``rebuilds`` with the CPU's kernels."""
    if digest not in meta.get("rebuilds", {}):
        model, tokenizer = load_model_and_tokenizer(str(warm))
        greedy = greedy_correct(model, tokenizer, rows[FREQUENT])
        meta.setdefault("rebuilds", {})[digest] = {
            "frequent": float(np.mean(greedy)),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        write_json(RESULTS / "warm.json", meta)
    return meta["rebuilds"][digest]["frequent"]


def within_tolerance(accuracy: float, meta: dict) -> bool:
    return abs(accuracy - meta["eval"]["frequent"]) <= WARM_TOLERANCE + 1e-9


def accepted_warm_start(warm: Path, meta: dict, rows: list[dict], target: float,
                        force: bool) -> str:  # fmt: skip
    """The digest of the warm start in ``warm`` if runs may start from it. The recorded weights
    may; a rebuild on other kernels (AVX2 against AVX-512) differs from them by rounding, so it
    is judged by behaviour: its 128-problem greedy accuracy (measured once, kept in
    ``warm.json`` under ``rebuilds``) within ``WARM_TOLERANCE`` of the recorded one. Further
    off, the pilot's pass rates and target belong to other weights and it is refused (``--force``
    runs it anyway). Either way a pair is two arms from one digest (:func:`command_report`)."""
    digest = weights_digest(warm)
    recorded = recorded_digest(meta)
    if digest == recorded:
        return digest
    rebuilt = measure_rebuild(warm, digest, meta, rows)
    message = (
        f"the warm start in {warm} (digest {digest}, 128-problem 2-digit accuracy "
        f"{rebuilt:.3f}) is not the recorded one (digest {recorded}, accuracy "
        f"{meta['eval']['frequent']:.3f}) on which the pilot fixed the pass rates and the "
        f"target {target:.3f}"
    )
    if within_tolerance(rebuilt, meta):
        print(f"{message}; within {WARM_TOLERANCE * 128:.0f} of the 128 problems of it, so "
              "it is used (its runs pair with each other)", flush=True)  # fmt: skip
        return digest
    if not force:
        raise SystemExit(f"{message}: more than {WARM_TOLERANCE * 128:.0f} of the 128 problems "
                         "apart, its runs would not be comparable. Run where the warm start "
                         "rebuilds closer, or --force")  # fmt: skip
    print(f"warning: {message}; running anyway (--force)", flush=True)
    return digest


def command_run(work: Path, seeds: list[int], arms: list[str], force: bool) -> None:
    pilot_path = RESULTS / "pilot.json"
    pilot = json.loads(pilot_path.read_text()) if pilot_path.exists() else {}
    if "go" not in pilot:
        raise SystemExit("run the pilot first: python benchmarks/curriculum.py pilot")
    if not pilot["go"]["proceed"] and not force:
        raise SystemExit(f"the pilot said no-go ({pilot['go']}); change the regime, or --force")
    warm, meta = warm_start(work)
    budget = int(round(BUDGET_STEPS * meta["tokens_per_step"]))
    rows = eval_rows()
    digest = accepted_warm_start(warm, meta, rows, pilot["target"], force)
    done = {(r["arm"], r["seed"]) for r in read_runs() if run_warm(r, meta) == digest}
    for seed in seeds:  # seeds outermost: every finished seed is a complete pair
        for arm in arms:
            if (arm, seed) in done:
                continue
            print(f"{arm} seed {seed}: budget {budget} generated tokens", flush=True)
            result = run_arm(arm, seed, warm, digest, budget, rows)
            append_run(result)
            print(json.dumps({k: v for k, v in result.items() if k != "points"}), flush=True)


def command_rebuild(work: Path) -> None:
    """Build the warm start into ``work`` (another folder than the experiment's) and measure it
    against the recorded one: what ``run`` would decide on this machine."""
    if (RESULTS / "warm.json").exists() and "eval" not in json.loads(
        (RESULTS / "warm.json").read_text()
    ):
        raise SystemExit("run the pilot first: python benchmarks/curriculum.py pilot")
    warm, meta = warm_start(work)
    digest = weights_digest(warm)
    accuracy = (meta["eval"]["frequent"] if digest == recorded_digest(meta)
                else measure_rebuild(warm, digest, meta, eval_rows()))  # fmt: skip
    verdict = "accepted" if within_tolerance(accuracy, meta) else "refused"
    print(json.dumps({"digest": digest, "recorded": recorded_digest(meta),
                      "frequent": accuracy, "recorded_frequent": meta["eval"]["frequent"],
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "run": verdict}))  # fmt: skip


def command_report(results: Path = RESULTS) -> None:
    meta = json.loads((results / "warm.json").read_text())
    pilot = json.loads((results / "pilot.json").read_text())
    print(f"warm start: {json.dumps(meta.get('eval'))}")
    print(f"pool pass rates (16 samples, seed {PILOT_SEED}): {json.dumps(pilot['ceiling'])}")
    if "go" not in pilot:
        print("the uniform pilot has not finished")
        return
    target = pilot["target"]
    print(f"target: 2-digit accuracy {target:.3f} (uniform pilot at {TARGET_MARK:.0%} of the "
          f"budget); go/no-go {json.dumps(pilot['go'])}")  # fmt: skip
    # A pair: both arms of one seed from one warm start (runs name theirs by digest).
    by = {(r["arm"], r["seed"], run_warm(r, meta)): r for r in read_runs(results)}
    seeds = sorted({(s, w) for _, s, w in by if all((a, s, w) in by for a in ARMS)})
    unpaired = sorted(f"{a} {s} (warm {w})" for a, s, w in by if (s, w) not in seeds)
    if unpaired:
        print(f"runs without their pair yet: {', '.join(unpaired)}")
    if not seeds:
        print("no finished seed pair yet")
        return
    print(f"\npairs (seed, warm start): {seeds}")
    print(f"{'seed':>4} {'arm':8} {'tokens to target':>17} {'2-digit B/2':>11} {'2-digit B':>9} "
          f"{'1-dig B':>7} {'3-dig B':>7} {'inform/rollout':>14} {'steps':>5}")  # fmt: skip
    log_ratios, gains, final_gains, inform_ratios, curve_gains = [], [], [], [], []
    censored = {a: 0 for a in ARMS}
    for s, w in seeds:
        reached, area = {}, {}
        for arm in ARMS:
            r = by[(arm, s, w)]
            start = run_start(r, meta)
            reached[arm], hit = tokens_to(r, target, start)
            area[arm] = curve_mean(r, start)
            censored[arm] += not hit
            print(f"{s:>4} {arm:8} {reached[arm]:>16.0f}{'' if hit else '+'} "
                  f"{accuracy_at(r, 0.5).mean():>11.3f} {accuracy_at(r, 1.0).mean():>9.3f} "
                  f"{accuracy_at(r, 1.0, 1).mean():>7.3f} "
                  f"{accuracy_at(r, 1.0, 3).mean():>7.3f} "
                  f"{r['informative_per_rollout']:>14.3f} {r['optimizer_steps']:>5}")  # fmt: skip
        log_ratios.append(math.log(reached["select"] / reached["uniform"]))
        chosen, uniform = by[("select", s, w)], by[("uniform", s, w)]
        gains.append(accuracy_at(chosen, 0.5) - accuracy_at(uniform, 0.5))
        final_gains.append(accuracy_at(chosen, 1.0) - accuracy_at(uniform, 1.0))
        inform_ratios.append(chosen["informative_per_rollout"] / uniform["informative_per_rollout"])
        curve_gains.append(area["select"] - area["uniform"])
    test = t_test(log_ratios)
    print(f"\nprimary: tokens to target, select / uniform: {math.exp(test['mean']):.3f}x"
          + (f" (95% interval {math.exp(test['low']):.3f}-{math.exp(test['high']):.3f}, "
             f"log-ratio spread {test['sd']:.3f})" if "sd" in test else "")
          + f"; runs that never reached it (counted at the budget): {censored}")  # fmt: skip
    if "sd" in test:
        for speedup in (1.35, 1 / 0.6):
            print(f"  power of {len(seeds)} seeds for a {speedup:.2f}x speed-up at the observed "
                  f"spread: {power(math.log(speedup), test['sd'], len(seeds)):.0%}"
                  + (f" ({PLANNED_SEEDS} seeds: "
                     f"{power(math.log(speedup), test['sd'], PLANNED_SEEDS):.0%})"
                     if len(seeds) < PLANNED_SEEDS else ""))  # fmt: skip
    low, high = bootstrap(gains)
    print(
        f"secondary: 2-digit accuracy at B/2, select - uniform: "
        f"{np.mean([g.mean() for g in gains]):+.3f} (paired bootstrap {low:+.3f}, {high:+.3f})"
    )
    ratio = t_test(inform_ratios)
    print(
        f"informative groups per rollout, select / uniform: {ratio['mean']:.3f}x"
        + (f" (95% interval {ratio['low']:.3f}-{ratio['high']:.3f})" if "sd" in ratio else "")
    )
    area = t_test(curve_gains)
    print(
        "exploratory (not the design's endpoint): 2-digit accuracy averaged over the budget "
        f"(area under the 128-problem curve), select - uniform: {area['mean']:+.3f}"
        + (f" (95% t interval {area['low']:+.3f}, {area['high']:+.3f})" if "sd" in area else "")
    )
    if len(seeds) > 1:
        parts = []
        for name, whole in (("B/2", gains), ("B", final_gains)):
            for rows in (FREQUENT, slice(None)):
                spread = difference_spread([d[rows] for d in whole])
                parts.append(f"{name} on {len(whole[0][rows])} problems {spread['between']:.3f} "
                             f"(problems {spread['problems']:.3f}, training "
                             f"{spread['training']:.3f})")  # fmt: skip
        print("spread over seeds of the 2-digit accuracy difference, select - uniform, and its "
              f"sources: {'; '.join(parts)}")  # fmt: skip
    if "sd" in test:
        complete = len(seeds) >= PLANNED_SEEDS
        tokens = [math.exp(test[k]) for k in ("mean", "low", "high")]
        informative = [ratio[k] for k in ("mean", "low", "high")]
        fewer_tokens = verdict(*tokens, GOAL_TOKEN_RATIO, lower_is_better=True, complete=complete)
        more_informative = verdict(*informative, GOAL_INFORMATIVE_RATIO, lower_is_better=False,
                                   complete=complete)  # fmt: skip
        print(f"goal, at most {GOAL_TOKEN_RATIO:.2f}x uniform's tokens to the target: "
              f"{fewer_tokens}")  # fmt: skip
        print(f"goal, at least {GOAL_INFORMATIVE_RATIO:.2f}x uniform's informative groups per "
              f"rollout: {more_informative}")


def replay_levels(pass_rate: np.ndarray, arm: str, seed: int, steps: int = BUDGET_STEPS) -> dict:
    """Which levels an arm trains on when every prompt keeps the warm start's measured pass
    rate (no learning: the picture of the first steps). ``select`` is groupwise's own
    SelectCurriculum with the experiment's options, driven as the trainer drives it (a seeded
    epoch sampler, ``choose`` among the over-sampled candidates, ``plan``, ``observe_global``);
    outcomes are Bernoulli draws. Returns per level the share of groups and the informative
    groups, and the informative groups per rollout."""
    rng = np.random.default_rng(seed)
    rows = [{"prompt": str(i), "difficulty": d * 10 + 2}
            for d in LEVELS for i in range(POOL_PER_LEVEL)]  # fmt: skip
    level = np.repeat(np.arange(len(LEVELS)), POOL_PER_LEVEL)
    prompts = BASE_OPTIONS["per_device_train_batch_size"] // BASE_OPTIONS["num_generations"]
    select = None
    if arm == "select":
        values = {**GRPOConfig().to_dict(), "curriculum": "select", "seed": seed,
                  **{k: BASE_OPTIONS[k] for k in ("num_generations", "rollout_min", "rollout_max")}}
        select = SelectCurriculum(SelectOptions.from_config(values))  # fmt: skip
    order: list[int] = []
    groups = np.zeros(len(LEVELS))
    informative = np.zeros(len(LEVELS))
    rollouts = 0
    for _ in range(steps):
        drawn = select.candidates(prompts) if select else prompts
        indices = []
        while len(indices) < drawn:
            order = order or rng.permutation(len(rows)).tolist()
            indices.append(order.pop())
        if select is None:
            counts = [BASE_OPTIONS["num_generations"]] * prompts
        else:
            picked = select.choose(indices, [rows[i] for i in indices], prompts)
            indices = [indices[k] for k in picked]
            batch = PromptBatch(indices, slice(0, prompts), [rows[i] for i in indices],
                                [[0]] * prompts)  # fmt: skip
            plan = select.plan(batch)
            counts = list(plan.counts)
        prompt, correct = [], []
        for j, (index, n) in enumerate(zip(indices, counts, strict=True)):
            k = int(rng.binomial(n, pass_rate[index]))
            groups[level[index]] += 1
            informative[level[index]] += 0 < k < n
            rollouts += n
            prompt += [j] * n
            correct += [1.0] * k + [0.0] * (n - k)
        if select is not None:
            select.observe_global(plan, GlobalRows(prompt, correct, [0.0] * len(prompt), correct))
    return {"share": (groups / groups.sum()).tolist(), "informative": informative.tolist(),
            "informative_per_rollout": float(informative.sum() / rollouts)}  # fmt: skip


def command_levels(results: Path = RESULTS, repeats: int = 20) -> None:
    """Per level, the groups each arm trained on: replayed from the pilot's measured pass rates,
    and measured in the finished runs that recorded their groups."""
    pilot = json.loads((results / "pilot.json").read_text())
    meta = json.loads((results / "warm.json").read_text())
    pass_rate = np.asarray(pilot["pass_counts"], float) / SAMPLES_PER_PROMPT
    names = " / ".join(f"{d}-digit" for d in LEVELS)
    print(f"replay from the pilot's pass rates ({repeats} random seeds, {BUDGET_STEPS} steps, "
          f"no learning): share of groups and informative groups per run by level "
          f"({names})")  # fmt: skip
    for arm in ARMS:
        runs = [replay_levels(pass_rate, arm, seed) for seed in range(repeats)]
        share = np.mean([r["share"] for r in runs], axis=0)
        inform = np.mean([r["informative"] for r in runs], axis=0)
        rate = np.mean([r["informative_per_rollout"] for r in runs])
        print(f"  {arm:8} share {' / '.join(f'{x:.2f}' for x in share)}; informative groups "
              f"{' / '.join(f'{x:.1f}' for x in inform)}; per rollout {rate:.3f}")  # fmt: skip
    recorded = [r for r in read_runs(results) if r.get("groups")]
    if recorded:
        print("measured in the runs (share of groups; informative groups by level), over the "
              "whole run and over its first fifth (the cold start) and the rest:")  # fmt: skip
    for r in recorded:
        # Runs recorded before the end-of-training row was skipped repeat the last step.
        steps = r["groups"][: int(r["optimizer_steps"])]
        fifth = len(steps) // 5
        parts = []
        for name, part in (("all", steps), ("first fifth", steps[:fifth]),
                           ("rest", steps[fifth:])):  # fmt: skip
            groups, inform = level_counts(part)
            parts.append(f"{name}: share {' / '.join(f'{x:.2f}' for x in groups / groups.sum())}, "
                         f"informative {' / '.join(f'{x:.0f}' for x in inform)}")  # fmt: skip
        print(f"  seed {r['seed']} {r['arm']:8} warm {run_warm(r, meta)[:7]} " + "; ".join(parts))


def level_counts(steps: list[list[list[int]]]) -> tuple[np.ndarray, np.ndarray]:
    """Per level, the groups and the informative groups (correctness not all alike) in ``steps``
    (each a list of [digits, rollouts, correct])."""
    groups, inform = np.zeros(len(LEVELS)), np.zeros(len(LEVELS))
    for step in steps:
        for digits, n, correct in step:
            groups[LEVELS.index(digits)] += 1
            inform[LEVELS.index(digits)] += 0 < correct < n
    return groups, inform


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["pilot", "run", "report", "levels", "rebuild"])
    parser.add_argument("--seeds", default=f"1-{PLANNED_SEEDS}",
                        help="experiment seeds, e.g. 1-16 or 1,3")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--work", default="runs/curriculum-work", help="model weights")
    parser.add_argument("--force", action="store_true",
                        help="run despite a no-go pilot or a warm start other than the recorded")
    parser.add_argument("--results", default=str(RESULTS), help="report/levels: results folder")
    opts = parser.parse_args(argv)
    if opts.stage == "pilot":
        command_pilot(Path(opts.work))
    elif opts.stage == "run":
        command_run(Path(opts.work), parse_seeds(opts.seeds), opts.arms.split(","), opts.force)
    elif opts.stage == "levels":
        command_levels(Path(opts.results))
    elif opts.stage == "rebuild":
        command_rebuild(Path(opts.work))
    else:
        command_report(Path(opts.results))


if __name__ == "__main__":
    main(sys.argv[1:])
