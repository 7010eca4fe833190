"""A ``generate`` the user replaced on the model (rollout/hf.py ``replaced_generate``) writes the
completions, as in TRL: the hf engine and the multi-turn engine call it (one call per turn on
the conversations still going) and keep its tokens up to the first EOS; an unpatched model keeps
groupwise's own decode loop."""

from unittest.mock import patch

import pytest
import torch
from transformers import GenerationMixin

from conftest import sampling, tiny_config, turn_limits
from groupwise import GRPOTrainer
from groupwise.rollout import HFEngine, generate
from groupwise.rollout import hf as hf_module
from groupwise.rollout.hf import completion_lengths, replaced_generate
from groupwise.rollout.multiturn import MultiTurnEngine, TurnRenderer, converse
from groupwise.runtime.models import tiny_random_model
from groupwise.tools import EnvStep


def _prompts(tokenizer):
    prompts = [tokenizer.encode(t) for t in ("What is 3 + 4?", "Hi")]
    assert len({len(p) for p in prompts}) == 2  # left padding is exercised
    return prompts


class Scripted:
    """``generate`` replacement: returns ``input_ids`` followed by the next scripted block of
    completion rows (one block per call), and records each call's keyword arguments."""

    def __init__(self, *blocks: list[list[int]]) -> None:
        self.blocks, self.calls = list(blocks), []

    def __call__(self, input_ids, **kwargs):
        self.calls.append({"input_ids": input_ids.clone(), **kwargs})
        block = self.blocks[len(self.calls) - 1]
        assert len(block) == input_ids.shape[0], (len(block), input_ids.shape)
        completion = torch.tensor(block, dtype=input_ids.dtype, device=input_ids.device)
        return torch.cat([input_ids, completion], dim=-1)


def test_completion_lengths_cut_after_the_first_eos_or_before_trailing_padding():
    eos, pad = 2, 0
    tokens = torch.tensor([
        [5, 2, 7, 2, 9],  # EOS at 1: length 2, ended
        [5, 6, 7, 8, 9],  # no EOS, no padding: the budget, truncated
        [5, 0, 7, 0, 0],  # no EOS, trailing padding: length 3 (the inner 0 is a token), ended
        [0, 0, 0, 0, 0],  # only padding: empty, ended
        [5, 6, 0, 0, 2],  # an EOS after padding still ends it there: length 5, ended
    ])  # fmt: skip
    lengths, finished = completion_lengths(tokens, [eos], pad)
    assert lengths.tolist() == [2, 5, 3, 0, 5]
    assert finished.tolist() == [True, False, True, True, True]
    lengths, finished = completion_lengths(tokens, [eos], None)  # no padding token
    assert lengths.tolist() == [2, 5, 5, 5, 5]
    assert finished.tolist() == [True, False, False, False, True]


def test_replaced_generate_is_detected_on_the_instance_the_class_and_wrapped_models(
    tiny_model, tokenizer
):
    assert not replaced_generate(tiny_model)
    with patch.object(tiny_model, "generate", side_effect=lambda **kw: None):
        assert replaced_generate(tiny_model)
    assert not replaced_generate(tiny_model)
    with patch("transformers.generation.utils.GenerationMixin.generate"):
        assert replaced_generate(tiny_model)  # TRL's class-level patch of generate

    class Override(type(tiny_model)):
        def generate(self, *args, **kwargs):
            return super().generate(*args, **kwargs)

    assert replaced_generate(Override(tiny_model.config))
    assert not replaced_generate(torch.nn.Linear(2, 2))  # no generate at all

    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, target_modules=["q_proj"])
    wrapped = peft.get_peft_model(tiny_random_model(seed=0), config)
    assert not replaced_generate(wrapped)  # PEFT's own generate is the library's
    with patch.object(wrapped.get_base_model(), "generate", side_effect=lambda **kw: None):
        assert replaced_generate(wrapped)
    assert GenerationMixin.generate.__module__ == "transformers.generation.utils"


def test_hf_engine_keeps_the_patched_generates_tokens_up_to_eos(tiny_model, tokenizer):
    eos = tokenizer.eos_token_id
    script = Scripted([
        [11, 12, eos, 13, 14],  # EOS at 2: 13 and 14 are dropped
        [21, 22, 23, 24, 25],  # no EOS: the budget, truncated
        [31, eos, eos, eos, eos],  # generate's padding after EOS
        [41, 42, 43, eos, 44],
    ])  # fmt: skip
    params = sampling(5, temperature=0.7, top_p=0.9)
    # records_logprobs: the generate path has no sampler log-probs to record (pi_old is the
    # policy's).
    engine = HFEngine(tiny_model, tokenizer, params, torch.Generator().manual_seed(0),
                      records_logprobs=True)  # fmt: skip
    prompts = _prompts(tokenizer)
    with patch.object(tiny_model, "generate", side_effect=script):
        out = engine.generate(prompts, 2)
    (call,) = script.calls
    width = max(len(p) for p in prompts)
    expected_ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])
    assert torch.equal(call["input_ids"], expected_ids.repeat_interleave(2, dim=0))
    lengths = [len(prompts[0])] * 2 + [len(prompts[1])] * 2
    assert call["attention_mask"].sum(dim=1).tolist() == lengths
    assert call["max_new_tokens"] == 5 and call["do_sample"] is True
    assert (call["temperature"], call["top_p"]) == (0.7, 0.9)
    assert out.completion_ids.tolist() == [
        [11, 12, eos, eos, eos],
        [21, 22, 23, 24, 25],
        [31, eos, eos, eos, eos],
        [41, 42, 43, eos, eos],
    ]
    assert out.completion_mask.tolist() == [[1, 1, 1, 0, 0], [1] * 5, [1, 1, 0, 0, 0],
                                            [1, 1, 1, 1, 0]]  # fmt: skip
    assert out.truncated.tolist() == [False, True, False, False]
    assert out.group_ids.tolist() == [0, 0, 1, 1]
    assert out.sampling_logprobs is None
    assert out.texts[0] == tokenizer.decode([11, 12], skip_special_tokens=True)


def test_an_unpatched_model_keeps_the_token_loop(tiny_model, tokenizer, monkeypatch):
    calls = []
    monkeypatch.setattr(hf_module, "call_generate", lambda *a, **k: calls.append(a))
    params = sampling(6, temperature=1.0)
    prompts = _prompts(tokenizer)
    engine = HFEngine(tiny_model, tokenizer, params, torch.Generator().manual_seed(5))
    out = engine.generate(prompts, 3)
    loop = generate(tiny_model, tokenizer, prompts, 3, params, torch.Generator().manual_seed(5))
    assert calls == []
    assert torch.equal(out.completion_ids, loop.completion_ids)
    assert torch.equal(out.completion_mask, loop.completion_mask)
    assert out.texts == loop.texts


class Continue:
    """An environment that continues (replies ``ok``) while the turn says ``again``."""

    def reset(self, row):
        self.turns = []

    def step(self, message: str) -> EnvStep:
        self.turns.append(message)
        return EnvStep([{"role": "tool", "content": "ok"}], "again" not in message)

    def state(self):
        return {"turns_seen": len(self.turns)}


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_multi_turn_calls_generate_once_per_turn_on_the_rows_still_going(tiny_model, tokenizer):
    eos = tokenizer.eos_token_id
    again, bye, done = _ids(tokenizer, " again"), _ids(tokenizer, " bye"), _ids(tokenizer, " done")
    width = 6
    first = [row + [eos] + [77] * (width - len(row) - 1) for row in (again, bye, again)]
    second = [done + [eos] + [88] * (width - len(done) - 1)] * 2
    script = Scripted(first, second)
    prompts = _prompts(tokenizer)
    envs = [Continue() for _ in range(3)]
    for env in envs:
        env.reset({})
    render = TurnRenderer(tokenizer, True)
    with patch.object(tiny_model, "generate", side_effect=script):
        rollout, _ = converse(
            tiny_model, tokenizer, prompts, [2, 1], envs, render,
            sampling(40, temperature=1.0), turn_limits(3),
            torch.Generator().manual_seed(0), return_logprobs=True,
        )  # fmt: skip
    # One call with every prompt x rollout row, then one with the two rows that continued.
    assert [c["input_ids"].shape[0] for c in script.calls] == [3, 2]
    inserted = _ids(tokenizer, render([{"role": "tool", "content": "ok"}], True))
    conversations = {
        0: again + [eos] + inserted + done + [eos],
        1: bye + [eos],
        2: again + [eos] + inserted + done + [eos],
    }
    row_prompts = [prompts[0], prompts[0], prompts[1]]
    # The second call sees each continuing conversation so far, left-padded.
    seen = [row_prompts[r] + again + [eos] + inserted for r in (0, 2)]
    longest = max(len(s) for s in seen)
    assert script.calls[1]["input_ids"].tolist() == [[eos] * (longest - len(s)) + s for s in seen]
    assert script.calls[1]["max_new_tokens"] == 40 - len(again) - 1 - len(inserted)
    for r, tokens in conversations.items():
        n = int(rollout.completion_mask[r].sum())
        assert rollout.completion_ids[r, :n].tolist() == tokens
        trained = [1] * (len(again) + 1) + [0] * len(inserted) + [1] * (len(done) + 1)
        if r != 1:
            assert rollout.loss_mask[r, :n].tolist() == trained
    assert [m["role"] for m in rollout.conversations[0]] == ["assistant", "tool", "assistant"]
    assert rollout.conversations[1] == [{"role": "assistant", "content": " bye"}]
    assert rollout.truncated.tolist() == [False, False, False]
    assert rollout.sampling_logprobs is None  # pi_old comes from the policy


@pytest.mark.parametrize("tools", [[], ["calculator"]])
def test_training_trains_on_the_patched_generates_completions(tmp_path, tokenizer, tools):
    # Through the trainer, single-turn and with the calculator tool (multi-turn engine), one
    # step: the reward sees exactly the scripted tokens cut after EOS, from one generate call on
    # all 4 rows (no turn makes a tool call).
    eos = tokenizer.eos_token_id
    short, long = _ids(tokenizer, " four"), _ids(tokenizer, " four, I think")
    assert len(long) > len(short)
    seen = []

    def reward(prompts, completions, completion_ids, **kwargs):
        seen.extend(completion_ids)
        return [float(len(ids)) for ids in completion_ids]

    args = tiny_config(tmp_path, max_steps=1, tools=tools, num_generations=2,
                       per_device_train_batch_size=4, max_completion_length=12)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", reward, [{"prompt": "2 + 2?"}] * 4, args)
    assert isinstance(trainer.engine, MultiTurnEngine) == bool(tools)
    rows = [short + [eos] + [99] * len(long), long + [eos] + [98] * len(short)] * 2
    script = Scripted(rows)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with patch.object(trainer.model, "generate", side_effect=script):
        trainer.train()
    assert [c["input_ids"].shape[0] for c in script.calls] == [4]
    assert sorted(map(tuple, seen)) == sorted(
        [tuple(short + [eos])] * 2 + [tuple(long + [eos])] * 2
    )
    # Rewards differ within each group: the policy was updated on those completions.
    after = trainer.model.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
