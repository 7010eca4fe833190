"""The hf engine and the trainer's log-probs on a hybrid Mamba / attention model (Nemotron-H):
its cache holds recurrent (conv + SSM) states next to keys and values."""

import pytest
import torch

from conftest import sampling
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rollout import generate
from groupwise.rollout.hf import prefill, repeat_cache_rows, select_cache_rows
from groupwise.runtime.kv_cache import has_recurrent_state

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "NemotronHConfig"):
    pytest.skip("this transformers has no Nemotron-H", allow_module_level=True)


@pytest.fixture()
def hybrid_model(tokenizer):
    """A randomly initialised Nemotron-H: one Mamba-2 layer, one attention layer, one MLP."""
    torch.manual_seed(0)
    config = transformers.NemotronHConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        layers_block_type=["linear_attention", "full_attention", "mlp"],
        mamba_num_heads=8,
        mamba_head_dim=4,
        ssm_state_size=16,
        n_groups=1,
        chunk_size=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        intermediate_size=32,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return transformers.NemotronHForCausalLM(config).eval()


def _prompts(tokenizer):
    prompts = [tokenizer.encode(t) for t in ("What is 3 + 4?", "Hi", "Name a colour, please.")]
    assert len({len(p) for p in prompts}) == 3  # left padding is exercised
    return prompts


def test_the_prompt_cache_has_recurrent_layers_and_repeats_them(hybrid_model, tokenizer):
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    _, cache, _ = prefill(hybrid_model, ids, torch.ones_like(ids))
    assert has_recurrent_state(cache)
    mamba = cache.layers[0]
    conv, ssm = mamba.conv_states[0].clone(), mamba.recurrent_states[0].clone()
    keys = cache.layers[1].keys.clone()
    repeat_cache_rows(cache, 2, 3)  # rows 0, 0, 0, 1, 1, 1
    rows = torch.tensor([0, 0, 0, 1, 1, 1])
    assert torch.equal(mamba.conv_states[0], conv[rows])
    assert torch.equal(mamba.recurrent_states[0], ssm[rows])
    assert torch.equal(cache.layers[1].keys, keys[rows])
    select_cache_rows(cache, torch.tensor([5, 0]))  # prompt 1's row, then prompt 0's
    assert torch.equal(mamba.recurrent_states[0], ssm[[1, 0]])
    assert torch.equal(cache.layers[1].keys, keys[[1, 0]])


def test_greedy_matches_transformers_generate_with_rows_leaving(hybrid_model, tokenizer):
    prompts = _prompts(tokenizer)
    free = generate(hybrid_model, tokenizer, prompts, 2, sampling(8, temperature=0.0))
    # Declare prompt 1's 3rd greedy token an EOS: its rows leave the batch (and the cache)
    # while the other prompts' rows decode on.
    eos = int(free.completion_ids[2, 2])
    hybrid_model.generation_config.eos_token_id = [tokenizer.eos_token_id, eos]
    out = generate(hybrid_model, tokenizer, prompts, 2, sampling(8, temperature=0.0))
    assert out.lengths.tolist()[2:4] == [3, 3]
    for i, prompt in enumerate(prompts):
        reference = hybrid_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt) :].tolist()
        for row in (2 * i, 2 * i + 1):
            length = int(out.lengths[row])
            assert out.completion_ids[row, :length].tolist() == reference[:length]
            assert length == len(reference)  # generate() stops at the same EOS


def test_sampling_logprobs_match_the_trainers_logprobs(hybrid_model, tokenizer):
    # The sampler's log-probs (prompt cache repeated, recurrent states included) equal the
    # trainer's, which encodes each row's prompt itself for a recurrent model.
    prompts = _prompts(tokenizer)
    params = sampling(6, temperature=0.7)
    out = generate(
        hybrid_model, tokenizer, prompts, 2, params, torch.Generator().manual_seed(0),
        return_logprobs=True,
    )  # fmt: skip
    with torch.no_grad():
        trainer_logps, _ = completion_logprobs(
            hybrid_model, out.prompt_ids, out.prompt_mask, out.completion_ids,
            out.completion_mask, temperature=0.7, group_size=2,
        )  # fmt: skip
    torch.testing.assert_close(out.sampling_logprobs, trainer_logps, atol=1e-4, rtol=1e-4)


def test_multi_turn_refuses_recurrent_models(hybrid_model):
    # Rows waiting for others decode masked padding mid-sequence, which a recurrent state
    # would absorb: the multi-turn engine names the model and refuses it.
    from groupwise.errors import ConfigError
    from groupwise.rollout.multiturn import _prefill

    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ConfigError, match="multi-turn rollouts do not support NemotronH"):
        _prefill(hybrid_model, ids, torch.ones_like(ids))
