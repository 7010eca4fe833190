import collections
import dataclasses
import os
from typing import Any

import pytest
import torch

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.curriculum import Outcome
from groupwise.policy import update
from groupwise.rollout import SamplingParams
from groupwise.rollout.multiturn import TurnLimits
from groupwise.runtime.models import smollm2_tokenizer, tiny_random_model
from groupwise.sections import Sections
from groupwise.sections.curriculum import CurriculumOptions, GDROOptions, SelectOptions
from groupwise.trainer.base import PhaseTimer
from groupwise.trainer.metrics import StepResult


def pytest_configure(config):
    # Under pytest-xdist (make test) each worker is one of PYTEST_XDIST_WORKER_COUNT processes
    # sharing the machine: torch's intra-op threads get the worker's share of the cores, not all
    # of them in every worker (oversubscribed threads spin against each other).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.fixture(scope="session")
def tokenizer():
    tok = smollm2_tokenizer()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture()
def tiny_model():
    torch.manual_seed(0)
    return tiny_random_model(seed=0)


# Shared by the trainer tests (imported as ``from conftest import ...``: helpers that build
# configs are called from plain functions as well as tests, so they are functions, not fixtures).


def tiny_config(tmp_path, **overrides) -> GRPOConfig:
    """A 2-step GRPO config on the tiny-random model that learns TargetToken within a few steps;
    output in ``tmp_path/run``. The loss, schedule and cadences the trainer tests were written
    for are stated (TRL's defaults differ: dapo, linear decay, gradient checkpointing, a log
    line every 10 steps and a checkpoint every 500)."""
    values = dict(
        model="tiny-random",
        max_steps=2,
        learning_rate=1e-2,
        beta=0.0,
        loss_type="grpo",
        use_bias_correction_kl=False,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        logging_steps=1,
        save_steps=0,
        per_device_eval_batch_size=64,
        num_completions_to_print=0,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def select_config(tmp_path, **overrides) -> GRPOConfig:
    """``tiny_config`` with ``curriculum="select"`` for SELECT_ROWS: 3 steps of 3 prompts x 4
    rollouts (group sizes 2 to 8, 2 candidates drawn per slot), a checkpoint every 2 steps."""
    select = dict(
        max_steps=3, per_device_train_batch_size=12, max_completion_length=3, save_steps=2,
        curriculum="select", rollout_min=2, rollout_max=8, select_oversample=2,
    )  # fmt: skip
    return tiny_config(tmp_path, **{**select, **overrides})


SELECT_ROWS = [
    {"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1), "difficulty": i % 3}
    for i in range(12)
]


def first_token_parity(prompts, completions, completion_ids, **kwargs):
    """1 when a completion's first token id is even, else 0."""
    return [1.0 if ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


class TargetToken:
    """Reward = fraction of completion tokens equal to a target token: the most frequent token
    of the first batch scored (deterministic under the seed), so the signal starts non-zero and
    the tiny model can reach it."""

    __name__ = "target_token"

    def __init__(self):
        self.target = None

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        if self.target is None:
            counts = collections.Counter(t for ids in completion_ids for t in ids)
            self.target = counts.most_common(1)[0][0]
        return [sum(t == self.target for t in ids) / len(ids) for ids in completion_ids]


class PlainStepTrainer(GRPOTrainer):
    """The GRPO step in its plainest form: plan, generate, score, advantages, ``num_iterations``
    passes over one prepared batch, observe; no mini-batches per generation, no dynamic sampling,
    no top-up. The reference that steps_per_generation and dynamic sampling, when off, must
    reproduce bitwise."""

    def train_step(self):
        timer = PhaseTimer()
        batch = self.prompts.next()
        plan = self.curriculum.plan(batch)
        rollout = self.engine.generate(batch.prompt_ids, plan.local_counts)
        timer.mark("generation")
        scores = self.scorer(batch.rows, rollout)
        advantages = self.advantages(scores, rollout.group_ids)
        timer.mark("scoring")
        inputs = update.prepare(self.policy, rollout, advantages, plan.row_weights(rollout))
        for _ in range(self.args.num_iterations):
            stats = update.update(self.policy, inputs, self.loss)
        self.engine.sync(self.policy.model)
        timer.mark("update")
        self.global_step += self.args.num_iterations  # optimizer steps, as GRPOTrainer counts
        outcome = Outcome(
            rollout, scores.correctness, scores.rewards, stats.sequence_loss, stats.skipped
        )
        curriculum_logs = self.curriculum.observe(plan, outcome)
        result = StepResult(batch.rows, plan, rollout, scores, advantages, stats,
                            extra=(curriculum_logs,))  # fmt: skip
        return self.step_logs(result, timer)


# Options as a run reads them: GRPOConfig's defaults, checked by their sections. A test that builds
# a component by hand takes its options from here, so the component is configured as a run's is.


def options(**overrides: Any) -> Sections:
    """Every section of ``GRPOConfig(**overrides)``."""
    return GRPOConfig(**overrides).sections()


def gdro_options(**overrides: Any) -> GDROOptions:
    """The GDRO curricula's options: GRPOConfig's defaults (with ``curriculum: rollout_gdro``)
    and ``overrides`` by option name, checked as a run's are. Not through ``GRPOConfig`` itself,
    so values no batch would take are allowed (a mean budget ``num_generations=2.5``)."""
    return _curriculum_options(GDROOptions, {"curriculum": "rollout_gdro", **overrides})


def select_options(**overrides: Any) -> SelectOptions:
    """The select curriculum's options: GRPOConfig's defaults (with ``curriculum: select``) and
    ``overrides`` by option name, checked as a run's are (see :func:`gdro_options`)."""
    return _curriculum_options(SelectOptions, {"curriculum": "select", **overrides})


def _curriculum_options(kind: type[CurriculumOptions], overrides: dict[str, Any]) -> Any:
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(kind)})
    if unknown:
        raise TypeError(f"{kind.__name__} has no option {unknown}")
    return kind.from_config({**GRPOConfig().to_dict(), **overrides})


def sampling(
    max_completion_length: int, temperature: float | None = None, **overrides: Any
) -> SamplingParams:
    """The engines' sampling of ``max_completion_length`` tokens at ``temperature`` (0: greedy):
    GRPOConfig's sampling options (temperature, top_p, top_k, min_p, repetition_penalty) but for
    those given."""
    generation = options().generation
    values = {
        "temperature": generation.temperature if temperature is None else temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": generation.min_p or 0.0,  # the engines' 0.0 is GRPOConfig's null: off
        "repetition_penalty": generation.repetition_penalty,
    }
    return SamplingParams(max_completion_length, **{**values, **overrides})


def static_engine_options(**overrides: Any) -> dict[str, Any]:
    """``StaticEngine``'s keyword arguments that are run options (``eos_check_every``,
    ``cuda_graphs``) as GRPOConfig's defaults set them, with ``overrides``."""
    generation = options().generation
    return {
        "eos_check_every": generation.static_eos_check_every,
        "cuda_graphs": generation.static_cuda_graphs,
        **overrides,
    }


def vllm_engine_options(**overrides: Any) -> dict[str, Any]:
    """``build_vllm_engine``'s keyword arguments that are ``vllm_*`` run options, as GRPOConfig's
    defaults set them, with ``overrides``."""
    generation = options().generation
    return {
        "gpu_memory_utilization": generation.vllm_gpu_memory_utilization,
        "max_model_len": generation.vllm_max_model_length,
        "enable_prefix_caching": generation.vllm_enable_prefix_caching,
        "enable_sleep_mode": generation.vllm_enable_sleep_mode,
        **overrides,
    }


def turn_limits(max_turns: int | None = None, stop_strings: tuple[str, ...] = ()) -> TurnLimits:
    """A conversation's bounds: GRPOConfig's ``max_turns`` (unless given) and
    ``max_tool_output_tokens``, ending turns at ``stop_strings`` too."""
    tools = options().tools
    turns = tools.max_turns if max_turns is None else max_turns
    return TurnLimits(turns, tools.max_tool_output_tokens, stop_strings)
