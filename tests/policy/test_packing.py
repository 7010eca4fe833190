"""Padding-free packing (policy/packing.py): the layout by hand, and packed log-probs equal to
the padded forward's (and to full logits through model.forward) on every architecture the tests
build: Llama (sdpa and eager), Qwen2 (attention bias), Qwen3 (q/k norms), Gemma2 (eager,
soft-capped logits, sliding-window layers), GPT-2 (learned positions) and Nemotron-H (a Mamba-2
layer: packing falls back to the padded forward)."""

import pytest
import torch
import transformers

from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.variants import LOSSES
from groupwise.policy import update
from groupwise.policy.batches import trimmed_completions
from groupwise.policy.logprobs import completion_logprobs, full_logits_logprobs
from groupwise.policy.loss import GRPOLoss
from groupwise.policy.packing import first_fit_decreasing, is_flash, pack_rows
from groupwise.rollout import Rollout
from groupwise.runtime.models import tiny_random_model


def _batch(vocab: int = 500, group: int = 3, width: int = 9, seed: int = 1):
    """Two left-padded prompts (3 and 5 tokens), ``group`` right-padded completions each:
    sequences of 12, 4, 5 | 6, 11, 7 tokens, which pack into rows of 12 as [12], [11], [7, 5],
    [6, 4]: two rows hold two sequences each."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (2, 5), generator=g)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    completion_ids = torch.randint(3, vocab, (2 * group, width), generator=g)
    lengths = torch.tensor([9, 1, 2, 1, 6, 2][: 2 * group])
    completion_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return prompt_ids * prompt_mask, prompt_mask, completion_ids * completion_mask, completion_mask


# -- the layout -------------------------------------------------------------------------------


def test_first_fit_decreasing_by_hand():
    # Longest first: 7 opens bin 0 (room 1), 5 bin 1 (room 3), 4 bin 2 (room 4), 3 -> bin 1
    # (room 0), 2 -> bin 2 (room 2), 1 -> bin 0 (room 0).
    bins = first_fit_decreasing([7, 2, 4, 1, 5, 3], budget=8)
    assert bins == [[0, 3], [4, 5], [2, 1]]
    assert first_fit_decreasing([3, 9], budget=4) == [[1], [0]]  # too long: a bin of its own


def test_pack_rows_by_hand():
    # Sequence 0: prompt [5, 6] + completion [7, 8, 9]; sequence 1: prompt [4] + completion
    # [3]; sequence 2: prompt [1, 2] + completion [] (nothing to predict). Budget 5: FFD puts
    # 0 (5 tokens) in row 0, then 1 and 2 (2 tokens each, ties in order) in row 1, whose last
    # slot is a padding block of its own (position 0).
    prompt_ids = torch.tensor([[5, 6], [0, 4], [1, 2]])
    prompt_mask = torch.tensor([[1, 1], [0, 1], [1, 1]])
    completion_ids = torch.tensor([[7, 8, 9], [3, 0, 0], [0, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    packed = pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask, pad_id=99)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9], [4, 3, 1, 2, 99]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 1, 0]]
    # Completion tokens 7, 8, 9 are predicted from flat slots 1, 2, 3; token 3 (row 1,
    # column 1) from the slot before it, 5 + 0 = 5.
    assert packed.predict.tolist() == [1, 2, 3, 5]
    assert packed.flash_kwargs == {}
    one = pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask, one_row=True)
    assert one.input_ids.tolist() == [[5, 6, 7, 8, 9, 4, 3, 1, 2]]
    assert one.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0, 1]]
    assert one.predict.tolist() == [1, 2, 3, 5]
    assert one.flash_kwargs["cu_seq_lens_q"].tolist() == [0, 5, 7, 9]
    assert one.flash_kwargs["max_length_k"] == 5


def test_pack_rows_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match="padding_free needs a non-empty prompt"):
        pack_rows(torch.tensor([[0]]), torch.tensor([[0]]), torch.tensor([[3]]), torch.ones(1, 1))


# -- packed log-probs equal padded ones, on every architecture --------------------------------


def _llama(attn: str):
    return tiny_random_model(seed=0, vocab_size=500, attn_implementation=attn)


def _qwen2():
    config = transformers.Qwen2Config(
        vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    return transformers.Qwen2ForCausalLM(config)


def _qwen3():
    config = transformers.Qwen3Config(
        vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    )  # fmt: skip
    return transformers.Qwen3ForCausalLM(config)


def _gemma2():
    # A sliding window (4) shorter than the sequences: the window must stay inside each block.
    config = transformers.Gemma2Config(
        vocab_size=500, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=4,
        final_logit_softcapping=3.0, attn_implementation="eager",
    )  # fmt: skip
    return transformers.Gemma2ForCausalLM(config)


def _gpt2():
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=500)
    )


def _nemotron_h():
    config = transformers.NemotronHConfig(
        vocab_size=500, hidden_size=16,
        layers_block_type=["linear_attention", "full_attention", "mlp"],
        mamba_num_heads=8, mamba_head_dim=4, ssm_state_size=16, n_groups=1, chunk_size=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, intermediate_size=32,
    )  # fmt: skip
    return transformers.NemotronHForCausalLM(config)


ARCHITECTURES = {
    "llama-sdpa": lambda: _llama("sdpa"),
    "llama-eager": lambda: _llama("eager"),
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma2": _gemma2,
    "gpt2": _gpt2,
    "nemotron-h": _nemotron_h,
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_packed_logprobs_equal_padded_on_every_architecture(name):
    torch.manual_seed(0)
    model = ARCHITECTURES[name]().eval()
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    rows = torch.arange(6) // 3
    layout = pack_rows(prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask)
    assert layout.input_ids.shape == (4, 12)  # sequences do share rows
    kwargs = dict(temperature=0.7, chunk_size=4)
    padded, padded_entropy = completion_logprobs(
        model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask, **kwargs
    )
    # Packed, from per-row prompts and from shared prompts (group_size 3).
    shapes = ((prompt_ids[rows], prompt_mask[rows], 1), (prompt_ids, prompt_mask, 3))
    for p_ids, p_mask, group in shapes:
        packed, packed_entropy = completion_logprobs(
            model, p_ids, p_mask, completion_ids, completion_mask, group_size=group,
            padding_free=True, **kwargs,
        )  # fmt: skip
        torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(packed_entropy, padded_entropy, atol=1e-5, rtol=1e-5)
    # And both against full logits through model.forward (the reference implementation).
    expected = full_logits_logprobs(
        model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask, 0.7
    )
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-5)
    assert (padded[completion_mask == 1] != 0).all()


@pytest.mark.parametrize("impl", ["chunked", "checkpoint", "naive"])
def test_packed_gradients_equal_padded(impl):
    model = _llama("sdpa")
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch()
    rows = torch.arange(6) // 3
    upstream = torch.randn(completion_ids.shape, generator=torch.Generator().manual_seed(3))

    def grads(padding_free):
        model.zero_grad()
        logp, entropy = completion_logprobs(
            model, prompt_ids[rows], prompt_mask[rows], completion_ids, completion_mask,
            chunk_size=4, impl=impl, entropy_grad=True, padding_free=padding_free,
        )  # fmt: skip
        ((logp * upstream).sum() + 0.3 * entropy.sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    padded, packed = grads(False), grads(True)
    assert padded.keys() == packed.keys()
    for name in padded:
        torch.testing.assert_close(packed[name], padded[name], atol=1e-5, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in packed.values())


def test_flash_models_pack_into_one_row():
    model = _llama("sdpa")
    assert not is_flash(model)
    model.config._attn_implementation = "flash_attention_2"
    assert is_flash(model)


# -- one update, padded and packed: the same loss and gradients for every loss_type ----------

PLAIN_ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1)} for i in range(8)]
LENGTHS = [12, 1, 2, 1, 9, 1, 1, 2]  # a long tail: most completions short, one at the limit


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer(tmp_path, name, **options):
    # String prompts (no chat template): 6 to 7 tokens, so short sequences share rows.
    args = tiny_config(
        tmp_path / name, beta=0.04, max_completion_length=12, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, **options,
    )  # fmt: skip
    trainer = GRPOTrainer("tiny-random", _zero_reward, PLAIN_ROWS, args=args)
    grads = []

    def record_instead_of_stepping():  # the optimizer must not move the weights between losses
        grads.append({n: p.grad.clone() for n, p in trainer.policy.model.named_parameters()})

    trainer.policy.network.step = record_instead_of_stepping
    return trainer, grads


def _long_tailed_rollout(trainer) -> Rollout:
    rollout = trainer.engine.generate(trainer.prompts.next().prompt_ids, 4)
    width = rollout.completion_ids.shape[1]
    wanted = torch.tensor(LENGTHS)[:, None] > torch.arange(width)[None, :]
    mask = rollout.completion_mask * wanted
    assert (mask.sum(1) >= 1).all() and mask.sum(1).max() >= 9
    return Rollout(
        rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids * mask, mask,
        rollout.truncated, rollout.group_ids, rollout.texts,
    )  # fmt: skip


def test_packed_update_equals_padded_for_every_loss_type(tmp_path):
    padded, padded_grads = _trainer(tmp_path, "padded")
    packed, packed_grads = _trainer(tmp_path, "packed", padding_free=True)
    rollout = _long_tailed_rollout(padded)
    layouts = [
        pack_rows(rollout.prompt_ids[rollout.group_ids[rows]],
                  rollout.prompt_mask[rollout.group_ids[rows]],
                  *trimmed_completions(rollout, rows)[:2])
        for rows in update.micro_batches_of(padded.policy.options, rollout)
    ]  # fmt: skip
    assert len(layouts) == 2 and all(p.input_ids.shape[0] < 4 for p in layouts)  # rows shared
    advantages = torch.randn(8, generator=torch.Generator().manual_seed(0))
    for loss_type in LOSSES:
        options = GRPOConfig(loss_type=loss_type, beta=0.04, max_completion_length=12)
        loss = GRPOLoss(options.sections().loss, 12)
        stats = {}
        for name, trainer in (("padded", padded), ("packed", packed)):
            # need_old: pi_old from the forward too, as with num_iterations > 1
            inputs = update.prepare(trainer.policy, rollout, advantages, None, need_old=True)
            assert all(ref is not None for ref in inputs.ref_logprobs)
            stats[name] = update.update(trainer.policy, inputs, loss)
        assert stats["packed"].sums.keys() == stats["padded"].sums.keys()
        for key, value in stats["padded"].sums.items():
            assert stats["packed"].sums[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        assert abs(stats["padded"].sums["loss"]) > 1e-4
        for name, grad in padded_grads[-1].items():
            torch.testing.assert_close(
                packed_grads[-1][name], grad, atol=1e-6, rtol=1e-4, msg=f"{loss_type}: {name}"
            )
    assert len(packed_grads) == len(LOSSES)
