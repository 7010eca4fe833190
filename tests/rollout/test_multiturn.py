"""Multi-turn rollouts (rollout/multiturn.py): conversations on the KV cache, the loss mask,
log-prob equivalence with one forward, tools through the trainer, evaluation and resume."""

import collections
import json
import math
from dataclasses import dataclass

import pytest
import torch

from conftest import TargetToken, sampling, tiny_config, turn_limits
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.grpo import policy_loss
from groupwise.data.prompts import prompt_text
from groupwise.errors import ConfigError
from groupwise.evaluation import evaluate_model
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rollout import HFEngine
from groupwise.rollout.multiturn import (
    MultiTurnEngine,
    TurnRenderer,
    converse,
)
from groupwise.tasks.arithmetic import arithmetic_dataset
from groupwise.tools import EnvStep, ToolBox, ToolEnvironment, calculator
from groupwise.tools.prompting import prompt_text_with_tools, template_supports_tools
from groupwise.trainer.metrics import conversation_logs
from groupwise.wiring.rollout import build_interaction


class Scripted:
    """An environment that replies ``reply N`` to each turn and is done after ``turns``."""

    def __init__(self, turns: int = 3, role: str = "tool") -> None:
        self.turns, self.role, self.seen = turns, role, []

    def reset(self, row):
        self.seen = []

    def step(self, message: str) -> EnvStep:
        self.seen.append(message)
        done = len(self.seen) >= self.turns
        reply = [{"role": self.role, "content": f"reply {len(self.seen)}"}]
        return EnvStep(reply, done, tool_calls=1, tool_errors=int(len(self.seen) == 2))

    def state(self):
        return {"tool_calls": len(self.seen), "tool_errors": int(len(self.seen) >= 2)}


# A stop string that ends turns after a few tokens of the tiny random model's output.
STOP = ("e",)


def _prompts(tokenizer):
    texts = ["What is 2 + 2?", "Name a colour.", "Count to three."]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _converse(model, tokenizer, counts=(2, 1, 3), greedy=False, reencode=False, turns=3,
              budget=40, logprobs=True):  # fmt: skip
    envs = [Scripted(turns) for _ in range(sum(counts))]
    for env in envs:
        env.reset({})
    params = sampling(max_completion_length=budget, temperature=0.0 if greedy else 1.0)
    generator = None if greedy else torch.Generator().manual_seed(0)
    return converse(
        model, tokenizer, _prompts(tokenizer), list(counts), envs, TurnRenderer(tokenizer, True),
        params, turn_limits(4, STOP), generator,
        return_logprobs=logprobs, reencode=reencode,
    )  # fmt: skip


def test_loss_mask_marks_exactly_the_inserted_tokens(tiny_model, tokenizer):
    rollout, _ = _converse(tiny_model, tokenizer)
    render = TurnRenderer(tokenizer, True)
    for i, conversation in enumerate(rollout.conversations):
        n = int(rollout.completion_mask[i].sum())
        ids = rollout.completion_ids[i, :n].tolist()
        mask = rollout.loss_mask[i, :n].tolist()
        # Rebuild the mask by hand: walk the conversation; each reply is the rendered text.
        expected, pos = [], 0
        for k, message in enumerate(conversation):
            if message["role"] == "assistant":
                nxt = next((j for j in range(pos, n) if mask[j] == 0), n)
                expected += [1] * (nxt - pos)
                pos = nxt
            else:
                ended_eos = ids[pos - 1] == tokenizer.eos_token_id
                text = render([message], ended_eos)
                inserted = tokenizer(text, add_special_tokens=False)["input_ids"]
                assert ids[pos : pos + len(inserted)] == inserted, (i, k)
                expected += [0] * len(inserted)
                pos += len(inserted)
        assert pos == n and mask == expected
        assert rollout.env_states[i]["turns"] == sum(m["role"] == "assistant" for m in conversation)
    assert (rollout.loss_mask == 0).logical_and(rollout.completion_mask == 1).any()


def test_logprobs_equal_one_forward_over_the_whole_conversation(tiny_model, tokenizer):
    rollout, _ = _converse(tiny_model, tokenizer)
    rows = torch.arange(rollout.completion_ids.shape[0])
    prompt_ids = rollout.prompt_ids[rollout.group_ids]
    prompt_mask = rollout.prompt_mask[rollout.group_ids]
    with torch.no_grad():
        logps, _ = completion_logprobs(
            tiny_model, prompt_ids, prompt_mask, rollout.completion_ids, rollout.completion_mask
        )
    trained = rollout.loss_mask.bool()
    assert rows.numel() == 6 and trained.sum() > 0
    torch.testing.assert_close(logps[trained], rollout.sampling_logprobs[trained], atol=2e-5,
                               rtol=0)  # fmt: skip
    assert torch.all(rollout.sampling_logprobs[~trained] == 0)


def test_cached_continuation_equals_re_encoding(tiny_model, tokenizer):
    cached, timing = _converse(tiny_model, tokenizer, greedy=True)
    again, _ = _converse(tiny_model, tokenizer, greedy=True, reencode=True)
    assert torch.equal(cached.completion_ids, again.completion_ids)
    assert torch.equal(cached.loss_mask, again.loss_mask)
    assert cached.texts == again.texts
    assert timing["insert_s"] > 0


def test_budget_and_turn_limits(tiny_model, tokenizer):
    rollout, _ = _converse(tiny_model, tokenizer, turns=10, budget=12)
    assert rollout.completion_ids.shape[1] <= 12
    assert bool(rollout.truncated.all())  # 10 turns never fit in 12 tokens
    rollout, _ = _converse(tiny_model, tokenizer, turns=10, budget=200)
    # max_turns (4) ends the conversations that were not cut by the budget
    assert all(s["turns"] <= 4 for s in rollout.env_states)
    finished = ~rollout.truncated
    assert finished.any()
    assert all(rollout.env_states[i]["turns"] == 4 for i in finished.nonzero().flatten().tolist())


def test_masked_tokens_get_exactly_zero_gradient(tiny_model, tokenizer):
    """d loss / d logp is zero on tool tokens for every loss type, with the KL term on."""
    rollout, _ = _converse(tiny_model, tokenizer)
    inserted = (rollout.loss_mask == 0) & (rollout.completion_mask == 1)
    advantages = torch.linspace(-1, 1, rollout.completion_ids.shape[0])
    for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo", "cispo"):
        logps = rollout.sampling_logprobs.clone().requires_grad_(True)
        loss, _ = policy_loss(
            logps, rollout.sampling_logprobs, rollout.sampling_logprobs - 0.1, advantages,
            rollout.loss_mask.float(), loss_type=loss_type, beta=0.04, max_completion_length=40,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, logps)
        assert torch.all(grad[inserted] == 0), loss_type
        assert grad[rollout.loss_mask.bool()].abs().sum() > 0, loss_type


class HandWritten:
    """An engine that returns a fixed rollout: the conversation written by hand."""

    def __init__(self, rollout):
        self.rollout = rollout

    def generate(self, prompt_ids, counts, params=None, generator=None, rows=None):
        return self.rollout

    def sync(self, policy):
        pass


def test_training_on_a_conversation_equals_training_on_the_hand_written_completion(tmp_path):
    """One step on a multi-turn rollout updates the weights exactly as one step on a
    single-turn rollout holding the same tokens, with the tool text masked by hand."""
    rows = arithmetic_dataset(4, digits=1, ops="+")
    args = tiny_config(tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=40, max_turns=3, tools=["calculator"])  # fmt: skip
    reward = TargetToken()
    multi = GRPOTrainer("tiny-random", reward, rows[:2], args)
    env_rows = []
    multi.engine.make_env = lambda: Scripted(3)
    multi.engine.limits = turn_limits(3, STOP)
    multi.engine.stop.__init__(multi.tokenizer, STOP)
    record = multi.engine.generate

    def recording(*a, **k):
        out = record(*a, **k)
        env_rows.append(out)
        return out

    multi.engine.generate = recording
    multi.train()
    (rollout,) = env_rows
    assert (rollout.loss_mask != rollout.completion_mask).any()

    # By hand: the same tokens as one completion; the mask zero on every replied span.
    mask = rollout.completion_mask.clone()
    render = TurnRenderer(multi.tokenizer, True)
    for i, conversation in enumerate(rollout.conversations):
        ids = rollout.completion_ids[i].tolist()
        pos = 0
        for message in conversation:
            if message["role"] == "assistant":
                while pos < len(ids) and not _starts_reply(ids, pos, render, multi.tokenizer):
                    pos += 1
                continue
            inserted = multi.tokenizer(
                render([message], ids[pos - 1] == multi.tokenizer.eos_token_id),
                add_special_tokens=False,
            )["input_ids"]
            assert ids[pos : pos + len(inserted)] == inserted
            mask[i, pos : pos + len(inserted)] = 0
            pos += len(inserted)
    assert torch.equal(mask, rollout.loss_mask)
    by_hand = type(rollout)(
        prompt_ids=rollout.prompt_ids, prompt_mask=rollout.prompt_mask,
        completion_ids=rollout.completion_ids, completion_mask=rollout.completion_mask,
        truncated=rollout.truncated, group_ids=rollout.group_ids, texts=list(rollout.texts),
        loss_mask=mask,
    )  # fmt: skip
    single_args = tiny_config(tmp_path / "single", max_steps=1, per_device_train_batch_size=4,
                              num_generations=2, max_completion_length=40)  # fmt: skip
    single = GRPOTrainer("tiny-random", reward, rows[:2], single_args)
    single.engine = HandWritten(by_hand)
    single.train()
    for (name, p), q in zip(multi.model.named_parameters(), single.model.parameters(),
                            strict=True):  # fmt: skip
        assert torch.equal(p, q), name
    fresh = GRPOTrainer("tiny-random", reward, rows[:2], tiny_config(tmp_path / "fresh"))
    pairs = zip(multi.model.parameters(), fresh.model.parameters(), strict=True)
    moved = [not torch.equal(p, q) for p, q in pairs]
    assert any(moved)  # the step did update the weights


def _starts_reply(ids, pos, render, tokenizer) -> bool:
    for eos in (True, False):
        text = render([{"role": "tool", "content": "reply"}], eos)
        head = tokenizer(text, add_special_tokens=False)["input_ids"][:2]
        if ids[pos : pos + 2] == head:
            return True
    return False


def test_conversation_logs_by_hand():
    from groupwise.rollout import Rollout

    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    loss = torch.tensor([[1, 0, 0, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    rollout = Rollout(
        prompt_ids=torch.zeros(1, 1, dtype=torch.long), prompt_mask=torch.ones(1, 1),
        completion_ids=torch.zeros(3, 4, dtype=torch.long), completion_mask=mask,
        truncated=torch.zeros(3, dtype=torch.bool), group_ids=torch.zeros(3, dtype=torch.long),
        texts=["a", "b", "c"], loss_mask=loss, conversations=[[], [], []],
        env_states=[{"tool_calls": 2, "tool_errors": 1, "turns": 3},
                    {"tool_calls": 0, "tool_errors": 0, "turns": 1},
                    {"tool_calls": 1, "tool_errors": 0, "turns": 2}],
    )  # fmt: skip
    logs = conversation_logs(rollout, torch.tensor([1.0, 0.0, 0.5]))
    assert logs["tools/call_frequency"] == pytest.approx(1.0)
    assert logs["tools/call_rate"] == pytest.approx(2 / 3)
    assert logs["tools/failure_frequency"] == pytest.approx(1 / 3)
    assert logs["tools/accuracy_with_call"] == pytest.approx(0.75)
    assert logs["tools/accuracy_without_call"] == pytest.approx(0.0)
    assert logs["turns/mean"] == pytest.approx(2.0)
    assert logs["tokens/masked_fraction"] == pytest.approx(1 - 7 / 9)


# -- rendering and prompts ----------------------------------------------------------------------


def test_turn_renderer_uses_the_template_and_strips_a_written_eos(tokenizer):
    render = TurnRenderer(tokenizer, True)
    reply = [{"role": "tool", "content": "1081"}]
    assert render(reply, True) == "\n<|im_start|>tool\n1081<|im_end|>\n<|im_start|>assistant\n"
    assert render(reply, False) == (
        "<|im_end|>\n<|im_start|>tool\n1081<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = TurnRenderer(tokenizer, False)
    assert plain(reply, True) == "\n<tool_response>\n1081\n</tool_response>\n"


def test_turn_renderer_wraps_tool_output_for_templates_without_a_tool_role(tokenizer):
    strict = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    strict.chat_template = (
        "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('unknown role') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    text = TurnRenderer(strict, True)([{"role": "tool", "content": "7"}], True)
    assert (
        text == "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_default_tool_prompt_shows_instructions_and_the_worked_example(tokenizer):
    assert not template_supports_tools(tokenizer)  # SmolLM2: groupwise's default format
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "7*8?"}]
    toolbox = ToolBox([calculator])
    text = prompt_text_with_tools(prompt, tokenizer, toolbox.schemas)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call tools.")
    assert '"name": "calculator"' in text and "<tool_call>" in text
    # The example precedes the question, which comes last with the generation prompt.
    assert text.index("What is 12 * 34?") < text.index("7*8?")
    assert text.endswith("<|im_start|>user\n7*8?<|im_end|>\n<|im_start|>assistant\n")
    bare = prompt_text_with_tools(prompt, tokenizer, toolbox.schemas, examples=False)
    assert "12 * 34" not in bare
    assert prompt_text(prompt, tokenizer) not in (text, bare)


def test_a_template_with_tool_support_renders_the_schemas_itself(tokenizer):
    native = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    native.chat_template = (
        "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
        "</tools>\n{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    assert template_supports_tools(native)
    schemas = ToolBox([calculator]).schemas
    text = prompt_text_with_tools([{"role": "user", "content": "7*8?"}], native, schemas)
    assert text.startswith("<tools>calculator;</tools>\nuser: What is 12 * 34?")
    assert "You can call tools" not in text and text.endswith("user: 7*8?\nassistant:")


# -- options ----------------------------------------------------------------------------------


def test_tools_and_environment_options_are_checked():
    with pytest.raises(ConfigError, match="max_turns must be >= 1"):
        GRPOConfig(max_turns=0)
    with pytest.raises(ConfigError, match="tool_timeout must be > 0"):
        GRPOConfig(tool_timeout=0)
    with pytest.raises(ConfigError, match="give tools or an environment"):
        build_interaction(GRPOConfig(tools=["calculator"], environment="guess_number"))
    with pytest.raises(ConfigError, match="unknown environment 'maze'"):
        build_interaction(GRPOConfig(environment="maze"))
    with pytest.raises(ConfigError, match="calculater"):
        build_interaction(GRPOConfig(tools=["calculater"]))
    assert build_interaction(GRPOConfig()) is None
    interaction = build_interaction(GRPOConfig(tools=["calculator"]))
    assert [s["function"]["name"] for s in interaction.schemas] == ["calculator"]
    assert interaction.stop_strings == ("</tool_call>",)
    assert isinstance(interaction.make_env(), ToolEnvironment)


# -- through the trainer ------------------------------------------------------------------------


class AssistantTarget:
    """Reward = fraction of the assistant's tokens (all its turns) equal to a target token: the
    most frequent one of the first batch. Tool replies are not the policy's and do not count."""

    __name__ = "assistant_target"

    def __init__(self, tokenizer):
        self.tokenizer, self.target = tokenizer, None

    def __call__(self, prompts, completions, **kwargs):
        ids = [
            self.tokenizer(
                "".join(m["content"] for m in c if m["role"] == "assistant"),
                add_special_tokens=False,
            )["input_ids"]
            for c in completions
        ]
        if self.target is None:
            counts = collections.Counter(t for row in ids for t in row)
            self.target = counts.most_common(1)[0][0]
        return [sum(t == self.target for t in row) / max(len(row), 1) for row in ids]


def test_multi_turn_training_learns_and_logs_tool_metrics(tmp_path, tokenizer):
    # test_trainer's learning setup (one context, low temperature), in conversations.
    rows = [{"prompt": [{"role": "user", "content": "Say something"}]}] * 4
    reward = AssistantTarget(tokenizer)
    args = tiny_config(tmp_path, max_steps=12, max_completion_length=40, max_turns=2,
                       tools=["calculator"], learning_rate=1e-2, num_generations=8,
                       per_device_train_batch_size=16, temperature=0.1)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", reward, rows, args)
    assert isinstance(trainer.engine, MultiTurnEngine)
    # Every turn ends at a frequent character and the environment replies: several turns.
    trainer.engine.make_env = lambda: Scripted(2)
    trainer.engine.limits = turn_limits(2, STOP)
    trainer.engine.stop.__init__(trainer.tokenizer, STOP)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    for row in lines:
        for key in ("tools/call_frequency", "tools/call_rate", "tools/failure_frequency",
                    "turns/mean", "tokens/masked_fraction", "time/environment"):  # fmt: skip
            assert key in row, key
    assert lines[0]["turns/mean"] > 1.5 and lines[0]["tokens/masked_fraction"] > 0.3
    rewards = [row["reward"] for row in lines]
    assert rewards[0] < 0.2 and sum(rewards[-4:]) / 4 > 0.8, rewards


def low_tokens(prompts, completions, completion_ids, **kwargs):
    return [sum(t < 1000 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def test_resume_is_exact_with_tools(tmp_path):
    rows = arithmetic_dataset(8, digits=1, ops="+")

    def make(out, steps, **extra):
        args = tiny_config(out, max_steps=steps, max_completion_length=10, max_turns=2,
                           tools=["calculator"], save_steps=1, **extra)  # fmt: skip
        return GRPOTrainer("tiny-random", low_tokens, rows, args)  # stateless: resumable

    full = make(tmp_path / "a", 4)
    full.train()
    make(tmp_path / "b", 2).train()
    rest = make(tmp_path / "b", 4, resume_from_checkpoint="auto")
    rest.train()
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_evaluation_runs_the_environment_and_gives_pass_at_k(tiny_model, tokenizer):
    @dataclass
    class Always:
        """Ends after one turn: solved when the message has an even length (a mix)."""

        solved: bool = False

        def reset(self, row):
            self.solved = False

        def step(self, message):
            self.solved = len(message) % 2 == 0
            return EnvStep([], True)

        def state(self):
            return {"solved": self.solved}

    def solved(prompts, completions, env_state, **kw):
        return [float(s["solved"]) for s in env_state]

    solved.is_correctness = True
    engine = MultiTurnEngine(
        HFEngine(tiny_model, tokenizer, sampling(max_completion_length=6)), Always,
        turn_limits(2, STOP), tools=None, examples=True,
    )  # fmt: skip
    rows = arithmetic_dataset(3, digits=1, ops="+")
    result = evaluate_model(engine, tokenizer, rows, [solved], n=4, max_completion_length=6)
    # Solved: the turn ended (at STOP) inside the 6-token budget with an even length.
    correct = [r.correct for r in result.per_prompt]
    assert len(correct) == 3 and all(len(c) == 4 for c in correct)
    assert 0 < sum(map(sum, correct)) < 12, correct
    overall = result.summary["overall"]
    assert overall["pass@1"] == pytest.approx(sum(sum(c) / 4 for c in correct) / 3)
    expected = sum(1 - math.comb(4 - sum(c), 2) / math.comb(4, 2) for c in correct) / 3
    assert overall["pass@2"] == pytest.approx(expected)


@pytest.mark.parametrize(
    "options",
    [
        {"curriculum": "rollout_gdro"},  # uneven rollout counts per prompt
        {"curriculum": "select"},
        {"use_peft": True, "lora_r": 4, "learning_rate": 1e-3},
        {"dynamic_sampling": True, "max_num_gen_batches": 2},  # groups cut and joined
        {"steps_per_generation": 2, "loss_type": "dapo", "beta": 0.04},
    ],
    ids=["rollout_gdro", "select", "lora", "dynamic_sampling", "spg2_dapo_kl"],
)
def test_tools_work_with_curriculum_lora_dynamic_sampling_and_mini_batches(tmp_path, options):
    rows = arithmetic_dataset(8, digits=1, ops="+")
    args = tiny_config(tmp_path, max_steps=2, max_completion_length=30, max_turns=2,
                       tools=["calculator"], **options)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", low_tokens, rows, args)
    trainer.engine.make_env = lambda: Scripted(2)
    trainer.engine.limits = turn_limits(2, STOP)
    trainer.engine.stop.__init__(trainer.tokenizer, STOP)
    trainer.train()
    logs = trainer.log_history
    assert trainer.global_step == 2
    assert all(math.isfinite(row["loss"]) for row in logs if "loss" in row)
    assert any(row.get("tokens/masked_fraction", 0) > 0 for row in logs)


def test_ppo_refuses_tools(tmp_path):
    with pytest.raises(ConfigError, match="algorithm=grpo only"):
        GRPOConfig(algorithm="ppo", tools=["calculator"])


def _agent_rewards():
    """tests/fixtures/agent_rewards.py: rewards that read TRL's tool-call message shapes."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fixtures" / "agent_rewards.py"
    spec = importlib.util.spec_from_file_location("agent_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tool_conversation_reaches_rewards_in_trls_message_shapes(
    tiny_model, tokenizer, tmp_path, monkeypatch
):
    """One scripted conversation (a SQL tool call, its rows, the answer) through the multi-turn
    engine and a real tool, scored by agent rewards that read TRL's shapes: the assistant turn
    with parsed ``tool_calls`` (arguments a dict) and the tool turn with ``name`` and the
    returned rows. The same turns in other shapes (the call left as text, the arguments or the
    rows as JSON text) score differently, so the scores prove which shape the rewards saw."""
    import sqlite3
    from unittest.mock import patch

    from groupwise.rewards.scoring import RewardScorer, score_rollout

    agent = _agent_rewards()
    database = tmp_path / "genes.db"
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE interactions (gene_a TEXT, gene_b TEXT)")
        conn.execute("INSERT INTO interactions VALUES ('JNKK', 'MAPK8')")
    monkeypatch.setenv("GENES_DB", str(database))

    def query_genes(sql_command: str) -> list[tuple]:
        """Look gene pairs up in the interactions table (opened read-only).

        Args:
            sql_command: One SQL statement over interactions(gene_a, gene_b).
        """
        import os

        conn = sqlite3.connect(f"file:{os.environ['GENES_DB']}?mode=ro", uri=True)
        try:
            return conn.execute(sql_command).fetchall()
        finally:
            conn.close()

    sql = "SELECT * FROM interactions WHERE gene_a = 'JNKK'"
    call = json.dumps({"name": "query_genes", "arguments": {"sql_command": sql}})
    turns = [f"Let me check.\n<tool_call>\n{call}\n</tool_call>", "It does. Answer: yes"]
    eos = tokenizer.eos_token_id
    script = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in turns]

    def generate(input_ids, **kwargs):  # one scripted turn per call, as TRL's tool loop calls
        turn = torch.tensor([script.pop(0)], dtype=input_ids.dtype)
        return torch.cat([input_ids, turn], dim=-1)

    env = ToolEnvironment(ToolBox([query_genes]))  # a user tool: run in a forked child
    env.reset({})
    prompt = [{"role": "user", "content": "Does the gene JNKK interact with MAPK8?"}]
    prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    prompt_ids = list(getattr(prompt_ids, "input_ids", prompt_ids))
    with patch.object(tiny_model, "generate", side_effect=generate):
        rollout, _ = converse(
            tiny_model, tokenizer, [prompt_ids], [1], [env], TurnRenderer(tokenizer, True),
            sampling(200, temperature=1.0), turn_limits(4),
        )  # fmt: skip
    assert rollout.conversations[0] == [
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "query_genes", "arguments": {"sql_command": sql}},
                }
            ],
        },  # fmt: skip
        # the rows as returned (through the child's JSON, the tuples arrive as lists)
        {"role": "tool", "name": "query_genes", "content": [["JNKK", "MAPK8"]]},
        {"role": "assistant", "content": "It does. Answer: yes"},
    ]
    n = int(rollout.completion_mask[0].sum())
    seen = tokenizer.decode(rollout.completion_ids[0, :n].tolist())
    assert '[["JNKK", "MAPK8"]]' in seen  # the model is shown the rows as JSON
    # The completions log shows the turns as written and the rows as the model saw them.
    assert rollout.texts[0] == (
        f"Let me check.\n<tool_call>\n{call}\n</tool_call>\n"
        '[tool] [["JNKK", "MAPK8"]]\nIt does. Answer: yes'
    )
    rewards = [agent.answer_reward, agent.call_reward, agent.evidence_reward]
    rows = [{"prompt": prompt, "answer": "Yes"}]
    _, per_func = score_rollout(RewardScorer(rewards), rows, rollout)
    # answer: "Answer: yes" is right (+1.0); call: one query_genes call, arguments a dict,
    # with WHERE (+0.5); evidence: one query_genes reply holding one row, so "yes" (+1.5).
    assert per_func[0].tolist() == pytest.approx([1.0, 0.5, 1.5])

    def scores(conversation: list[dict]) -> list[float]:
        return [f([conversation], answer=["Yes"])[0] for f in rewards]

    ask, reply, final = rollout.conversations[0]
    # The call left in the text, the rows as JSON text in an unnamed tool turn: no call seen
    # (0.0), no readable rows (-0.5); only the answer (+1.0) is unchanged.
    as_text = [{"role": "assistant", "content": rollout.texts[0].split("\n[tool]")[0]},
               {"role": "tool", "content": '[["JNKK", "MAPK8"]]'}, final]  # fmt: skip
    assert scores(as_text) == [1.0, 0.0, -0.5]
    # Parsed calls but the arguments and the rows as JSON text: -0.5 for the unparsed
    # arguments, -0.5 for the reply that is no list of rows.
    function = ask["tool_calls"][0]["function"]
    as_json = [
        {**ask, "tool_calls": [{"type": "function", "function": {
            "name": function["name"], "arguments": json.dumps(function["arguments"])}}]},
        {**reply, "content": json.dumps(reply["content"])}, final,
    ]  # fmt: skip
    assert scores(as_json) == [1.0, -0.5, -0.5]
    assert env.state() == {"tool_calls": 1, "tool_errors": 0, "tools_used": ["query_genes"]}


def test_a_tool_list_cut_for_the_model_is_kept_as_the_text_it_saw(tokenizer):
    from groupwise.rollout.multiturn import _cut, _kept

    rows = [[i, "gene"] for i in range(40)]
    message = {"role": "tool", "name": "query", "content": rows}
    whole = _cut(message, tokenizer, 1000)
    assert whole == {"role": "tool", "name": "query", "content": json.dumps(rows)}
    assert _kept(message, whole) == message  # shown whole: the conversation keeps the list
    cut = _cut(message, tokenizer, 5)
    assert cut["content"].endswith("tokens]") and cut["name"] == "query"
    assert _kept(message, cut) == cut  # cut: the conversation keeps what the model saw
