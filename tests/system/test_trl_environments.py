"""TRL's environment_factory protocol: an environment whose public methods are its tools,
``reset(**row)`` (which may return the prompt), an optional ``get_reward()`` (the environment
owns the reward), one factory or a dict of them routed by the rows' ``environment`` column."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.rewards.scoring import score_rollout
from groupwise.rollout.multiturn import with_observation
from groupwise.tools.calls import ToolCall, format_tool_call
from groupwise.tools.environment import (
    PLACEHOLDER_PROMPT,
    EnvironmentFactories,
    MethodEnvironment,
    ToolLimits,
    environment_reward,
)

# The run's defaults: 10 s a call, 256 tokens of output (16 characters each), 8 calls.
LIMITS = ToolLimits(timeout_s=10.0, max_output_chars=4096, max_tool_calls=8, slow_call_s=None)


class Counter:
    def reset(self, **kwargs):
        self.count = 0
        self.reset_with = kwargs

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: Value to add.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)

    def _private(self) -> None:
        """Not a tool."""


class Echo:
    def reset(self, **kwargs):
        return " Shout something."

    def shout(self, text: str) -> str:
        """Shout.

        Args:
            text: What to shout.
        """
        return text.upper()


def test_methods_are_tools_and_run_in_process_on_the_instance():
    env = MethodEnvironment(Counter(), LIMITS)
    assert env.toolbox.names == ["increment"]  # not reset, get_reward or _private
    env.reset({"prompt": "p", "environment": "counter", "x": 1})
    assert env.instance.reset_with == {"prompt": "p", "x": 1}  # the routing column is not passed
    step = env.step(format_tool_call(ToolCall("increment", {"step": 2})))
    assert step.messages == [{"role": "tool", "name": "increment", "content": "2"}]
    assert not step.done
    bad = env.step(format_tool_call(ToolCall("decrement", {"step": 1})))
    assert bad.tool_errors == 1
    assert env.instance.count == 2  # the in-process call changed the instance's own state
    state = env.state()
    assert (state["tool_calls"], state["tool_errors"], state["environment"]) == (2, 1, env.instance)
    assert env.step("no call").done


def test_placeholder_prompt_is_not_passed_to_reset():
    env = MethodEnvironment(Counter(), LIMITS)
    env.reset({"prompt": [dict(m) for m in PLACEHOLDER_PROMPT]})
    assert env.instance.reset_with == {}


def test_pools_reuse_instances_and_route_rows_by_name():
    built = []

    def make_counter():
        built.append("c")
        return Counter()

    factories = EnvironmentFactories({"counter": make_counter, "echo": Echo}, LIMITS)
    assert built == ["c"]  # probed once
    assert [t.__name__ for t in factories.tools["counter"]] == ["increment"]
    assert [t.__name__ for t in factories.tools["echo"]] == ["shout"]
    rows = [{"environment": "counter"}, {"environment": "echo"}]
    envs = factories.take(rows, [2, 1])
    assert [type(e.instance).__name__ for e in envs] == ["Counter", "Counter", "Echo"]
    assert built == ["c", "c"]  # a second concurrent counter was needed
    again = factories.take(rows, [2, 1])
    assert [e.instance for e in again] == [e.instance for e in envs]  # reused, none built
    assert factories.last == [e.instance for e in again]
    with pytest.raises(ConfigError, match="not among the environments"):
        factories.take([{"environment": "unknown"}], [1])


def test_environment_rewards_one_per_class_and_none_for_other_environments():
    factories = EnvironmentFactories({"a": Counter, "b": Counter, "echo": Echo}, LIMITS)
    assert [f.__name__ for f in factories.reward_funcs] == ["Counter"]
    counter = Counter()
    counter.reset()
    counter.increment(3)
    assert factories.reward_funcs[0](environments=[counter, Echo()]) == [3.0, None]


def test_async_get_reward_is_awaited():
    class Judge:
        async def get_reward(self) -> float:
            return 0.5

    assert environment_reward(Judge)(environments=[Judge()]) == [0.5]


def test_reset_text_is_appended_to_the_last_message():
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "Hi."}]
    assert with_observation(prompt, " Go.")[-1] == {"role": "user", "content": "Hi. Go."}
    assert prompt[-1]["content"] == "Hi."  # the row is left untouched
    assert with_observation("Hi.", " Go.") == "Hi. Go."
    assert with_observation(prompt, None) is prompt


def test_environment_owns_reward_and_data(tmp_path):
    class Guess:
        def reset(self, **kwargs):
            return "Guess the word."

        def guess(self, word: str) -> str:
            """Guess.

            Args:
                word: The guess.
            """
            return "nope"

        def get_reward(self) -> float:
            return 1.0

    args = tiny_config(tmp_path, max_steps=1, reward_weights=None)
    trainer = GRPOTrainer("tiny-random", args=args, environment_factory=Guess)
    assert trainer.reward_func_names == ["Guess"]
    assert trainer.reward_weights.tolist() == [1.0]
    assert [t.__name__ for t in trainer.tools] == ["guess"]
    trainer.train()
    assert trainer.log_history[-1]["rewards/Guess/mean"] == pytest.approx(1.0)
    assert len(trainer.environments) == args.completions_per_step
    # The prompt the model saw is the reset text in the empty user turn, with the tool shown.
    rows = [{"prompt": [dict(m) for m in PLACEHOLDER_PROMPT]}]
    rollout = trainer.engine.generate([[1]], [2], rows=rows)
    shown = trainer.tokenizer.decode(rollout.prompt_ids[0])
    assert "Guess the word." in shown and "guess(word" in shown


def test_reward_weights_cover_the_reward_funcs_only(tmp_path):
    def zero(completions, **kwargs):
        return [0.0] * len(completions)

    rows = [{"prompt": "Say a word"}] * 8
    args = tiny_config(tmp_path, reward_weights=[0.5])
    trainer = GRPOTrainer("tiny-random", zero, rows, args=args, environment_factory=Counter)
    assert trainer.reward_func_names == ["zero", "Counter"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]


def test_reward_sources_and_datasets_are_required(tmp_path):
    args = tiny_config(tmp_path)
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer("tiny-random", None, [{"prompt": "x"}] * 8, args=args)
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer("tiny-random", lambda completions, **k: [0.0] * len(completions), args=args)
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        GRPOTrainer("tiny-random", args=args, environment_factory={"a": Counter, "b": Counter})


def test_rows_with_only_an_environment_column(tmp_path):
    rows = [{"environment": "counter"}, {"environment": "echo"}] * 4
    # 8 prompts per step: every row, so both environments are in the batch
    args = tiny_config(tmp_path, max_steps=1, num_generations=2, per_device_train_batch_size=16)
    trainer = GRPOTrainer("tiny-random", args=args, train_dataset=rows,
                          environment_factory={"counter": Counter, "echo": Echo})  # fmt: skip
    trainer.train()
    kinds = {type(e).__name__ for e in trainer.environments}
    assert kinds == {"Counter", "Echo"}
    # Echo's rollouts are not scored by Counter's reward (None -> skipped, not 0).
    assert trainer.log_history[-1]["rewards/Counter/frac_none"] == pytest.approx(0.5)


def test_environments_column_reaches_reward_functions():
    seen = {}

    def reward(completions, environments, **kwargs):
        seen["environments"] = environments
        return [0.0] * len(completions)

    class Rollout:  # the fields score_rollout reads
        group_ids = torch.tensor([0, 0])
        texts = ["a", "b"]
        conversations = None
        completion_ids = torch.tensor([[1], [2]])
        lengths = torch.tensor([1, 1])
        env_states = [{"environment": "e0"}, {"environment": "e1"}]

    from groupwise.rewards.scoring import RewardScorer

    score_rollout(RewardScorer([reward]), [{"prompt": "p"}], Rollout())
    assert seen["environments"] == ["e0", "e1"]


def test_environment_owned_data_requires_max_steps(tmp_path):
    # TRL's test_environment_owned_data_requires_max_steps: without train_dataset there is no
    # dataset to count epochs over, so max_steps must be given, even at its default value.
    class Guess:
        def reset(self, **kwargs):
            return "Guess the word."

        def get_reward(self) -> float:
            return 1.0

    unset = GRPOConfig(output_dir=str(tmp_path / "a"), model="tiny-random")
    assert unset.max_steps == -1 and not unset.is_set("max_steps")  # TRL's default
    with pytest.raises(ConfigError, match=r"max_steps must be set.*max_steps=-1 \(default\)"):
        GRPOTrainer("tiny-random", args=unset, environment_factory=Guess)
    epochs = GRPOConfig(output_dir=str(tmp_path / "b"), num_train_epochs=2)  # max_steps=-1
    with pytest.raises(ConfigError, match=r"max_steps must be set.*max_steps=-1"):
        GRPOTrainer("tiny-random", args=epochs, environment_factory=Guess)
    given = GRPOConfig(output_dir=str(tmp_path / "c"), max_steps=100)
    trainer = GRPOTrainer("tiny-random", args=given, environment_factory=Guess)
    assert trainer.args.max_steps == 100
    # With a dataset the default stays a default: nothing to refuse.
    rows = [{"prompt": "Say a word"}] * 8
    GRPOTrainer("tiny-random", args=unset, train_dataset=rows, environment_factory=Guess)


def test_rollouts_of_one_prompt_may_reset_to_different_text(tmp_path):
    # TRL's grpo_2048.py: each environment starts its own random board, so the rollouts of one
    # dataset row see different reset text. Each rollout's prompt holds its own environment's
    # text; the group still shares the row (and the reward baseline).
    boards = iter(range(1000))

    class Board:
        def reset(self, **kwargs):
            self.board = f" Board {next(boards)}."
            return self.board

        def get_reward(self) -> float:
            return float(self.board.endswith("1."))

    rows = [{"prompt": [{"role": "user", "content": "Play."}]}] * 8
    args = tiny_config(tmp_path, max_steps=1, reward_weights=None)
    trainer = GRPOTrainer("tiny-random", args=args, train_dataset=rows, environment_factory=Board)
    trainer.train()
    assert "rewards/Board/mean" in trainer.log_history[-1]
    counts = [3, 2]
    rollout = trainer.engine.generate([[1], [1]], counts, rows=rows[:2])
    seen = [e.board for e in trainer.environments]
    assert len(set(seen)) == 5
    assert rollout.group_ids.tolist() == [0, 0, 0, 1, 1]
    decode = trainer.tokenizer.decode
    for i, board in enumerate(seen):
        group = rollout.group_ids[i]
        prompt = rollout.prompt_ids[group][rollout.prompt_mask[group].bool()]
        assert "Play." in decode(prompt) and board not in decode(prompt)
        # The rest of the rollout's prompt (the end of its board, the assistant header) leads
        # its completion as context: in the sequence the model continued, not in the loss.
        n = int(rollout.lengths[i])
        first = int(rollout.loss_mask[i, :n].nonzero()[0])  # the policy's first token
        assert first > 0 and bool(rollout.completion_mask[i, :first].all())
        head = decode(torch.cat([prompt, rollout.completion_ids[i, :first]]))
        assert f"Play.{board}" in head and head.endswith("<|im_start|>assistant\n")


def test_share_group_prompts_moves_each_rollouts_own_prompt_into_its_completion():
    from groupwise.rollout import Rollout
    from groupwise.rollout.multiturn import share_group_prompts

    class Tok:
        pad_token_id = 0

    # Three conversations, each with its own prompt: the first two are one row's rollouts.
    own = [[5, 6, 7], [5, 6, 8, 9], [3]]
    rollout = Rollout(
        prompt_ids=torch.zeros(3, 4, dtype=torch.long),
        prompt_mask=torch.ones(3, 4, dtype=torch.long),
        completion_ids=torch.tensor([[11, 12, 0], [13, 0, 0], [14, 15, 16]]),
        completion_mask=torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]]),
        truncated=torch.tensor([False, False, True]),
        group_ids=torch.tensor([0, 1, 2]),
        texts=["a", "b", "c"],
        sampling_logprobs=torch.tensor([[-1.0, -2.0, 0], [-3.0, 0, 0], [-4.0, -5.0, -6.0]]),
        loss_mask=torch.tensor([[1, 0, 0], [1, 0, 0], [1, 1, 1]]),  # 12: an inserted token
    )
    shared = share_group_prompts(rollout, own, [2, 1], Tok())
    assert shared.group_ids.tolist() == [0, 0, 1]
    assert shared.prompt_ids.tolist() == [[5, 6], [0, 3]]
    assert shared.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert shared.completion_ids.tolist() == [[7, 11, 12], [8, 9, 13], [14, 15, 16]]
    assert shared.completion_mask.tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 1]]
    assert shared.loss_mask.tolist() == [[0, 1, 0], [0, 0, 1], [1, 1, 1]]
    logps = [[0.0, -1.0, -2.0], [0.0, 0.0, -3.0], [-4.0, -5.0, -6.0]]
    assert shared.sampling_logprobs.tolist() == logps
    assert shared.truncated.tolist() == [False, False, True] and shared.texts == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="share no leading token"):
        share_group_prompts(rollout, [[1], [2], [3]], [2, 1], Tok())
