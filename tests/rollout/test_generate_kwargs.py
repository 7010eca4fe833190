"""The hf engine's transformers path: generation_kwargs beyond the sampling options (beam
search, length penalty) generate through ``model.generate``."""

import pytest
import torch

from conftest import sampling
from groupwise.rollout import generate
from groupwise.rollout import hf as hf_module
from groupwise.rollout.hf import HFEngine, generate_with_transformers


def _prompts(tokenizer):
    prompts = [tokenizer.encode(t) for t in ("What is 3 + 4?", "Hi", "Name a colour, please.")]
    assert len({len(p) for p in prompts}) == 3  # left padding is exercised
    return prompts


def test_greedy_without_options_is_the_token_loop(tiny_model, tokenizer):
    # With no beam options generate() is greedy decoding: the same completions, EOS and masks
    # as the token loop. An EOS on prompt 1's 2nd token
    # ends its rows early.
    prompts = _prompts(tokenizer)
    params = sampling(7, temperature=0.0)
    free = generate(tiny_model, tokenizer, prompts, 2, params)
    eos = int(free.completion_ids[2, 1])
    tiny_model.generation_config.eos_token_id = eos
    loop = generate(tiny_model, tokenizer, prompts, 2, params)
    out = generate_with_transformers(tiny_model, tokenizer, prompts, 2, params, {})
    first = free.completion_ids[2].tolist().index(eos)  # <= 1 (an earlier repeat ends it)
    assert loop.lengths.tolist()[2:4] == [first + 1, first + 1]
    assert out.lengths.tolist() == loop.lengths.tolist()
    assert torch.equal(out.completion_mask, loop.completion_mask)
    assert torch.equal(out.completion_ids, loop.completion_ids)
    assert out.truncated.tolist() == loop.truncated.tolist()
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert torch.equal(out.prompt_ids, loop.prompt_ids)
    assert out.texts == loop.texts
    assert out.sampling_logprobs is None


def test_beam_search_gives_a_group_per_prompt_ending_at_eos(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    params = sampling(6, temperature=1.0, top_k=50)
    beams = {"num_beams": 2, "length_penalty": -0.1}
    free = generate_with_transformers(tiny_model, tokenizer, prompts, [3, 1, 2], params, beams)
    assert free.group_ids.tolist() == [0, 0, 0, 1, 2, 2]
    assert free.completion_ids.shape == (6, 6)
    # Rows sampled with their own beams differ within a group.
    assert len({tuple(r) for r in free.completion_ids[:3].tolist()}) > 1
    eos = int(free.completion_ids[0, 1])
    tiny_model.generation_config.eos_token_id = eos
    gen = torch.Generator().manual_seed(3)
    out = generate_with_transformers(tiny_model, tokenizer, prompts, [3, 1, 2], params, beams, gen)
    rows = zip(out.completion_ids.tolist(), out.completion_mask.tolist(), strict=True)
    for row, (ids, mask) in enumerate(rows):
        n = sum(mask)
        assert mask == [1] * n + [0] * (len(mask) - n)  # a prefix, EOS included
        assert eos not in ids[: n - 1]  # the first EOS ends the completion
        assert bool(out.truncated[row]) == (ids[n - 1] != eos)
        assert all(t == tokenizer.pad_token_id for t in ids[n:])
        if not out.truncated[row]:
            assert n < 6 or ids[5] == eos
    # A seeded generator makes the rollout reproducible, and the global RNG is untouched.
    state = torch.get_rng_state()
    again = generate_with_transformers(
        tiny_model, tokenizer, prompts, [3, 1, 2], params, beams, torch.Generator().manual_seed(3)
    )
    assert torch.equal(again.completion_ids, out.completion_ids)
    assert torch.equal(torch.get_rng_state(), state)


def test_engine_routes_through_generate_with_kwargs(tiny_model, tokenizer, monkeypatch):
    calls = []
    real = tiny_model.generate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_model, "generate", spy)
    params = sampling(4, temperature=0.9, top_p=0.8)
    engine = HFEngine(tiny_model, tokenizer, params, generate_kwargs={"num_beams": 2})
    out = engine.generate(_prompts(tokenizer), 2)
    assert out.completion_ids.shape[0] == 6
    (kwargs,) = calls
    assert kwargs["input_ids"].shape[0] == 6  # one row per completion
    assert (kwargs["num_beams"], kwargs["num_return_sequences"]) == (2, 1)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"]) == (0.9, 0.8, 0)
    assert kwargs["max_new_tokens"] == 4 and kwargs["do_sample"] is True
    monkeypatch.undo()
    # Without generate_kwargs (and generate not replaced) the token loop decodes.
    loop_calls = []
    monkeypatch.setattr(hf_module, "call_generate", lambda *a, **k: loop_calls.append(a))
    HFEngine(tiny_model, tokenizer, params).generate(_prompts(tokenizer), 2)
    assert loop_calls == []
    with pytest.raises(ValueError, match="log-probs"):
        HFEngine(tiny_model, tokenizer, params, records_logprobs=True, generate_kwargs={"a": 1})
