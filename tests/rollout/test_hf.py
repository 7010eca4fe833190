import torch
from scipy.stats import chisquare

from conftest import sampling
from groupwise.rollout import SamplingParams, generate, left_pad, sample_next_token

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
DRAWS = 40_000


def _frequencies(params: SamplingParams, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    tokens = sample_next_token(LOGITS.expand(DRAWS, -1).clone(), params, gen)
    return torch.bincount(tokens, minlength=LOGITS.numel()).double()


def test_sampled_frequencies_match_softmax_chi_square():
    counts = _frequencies(sampling(256, temperature=1.0))
    expected = torch.softmax(LOGITS.double(), -1) * DRAWS
    _, p_value = chisquare(counts.numpy(), expected.numpy())
    assert p_value > 1e-3, (counts, expected)


def test_temperature_sharpens_distribution_chi_square():
    counts = _frequencies(sampling(256, temperature=0.5), seed=1)
    expected = torch.softmax(LOGITS.double() / 0.5, -1) * DRAWS
    _, p_value = chisquare(counts.numpy(), expected.numpy())
    assert p_value > 1e-3


def test_top_k_keeps_only_k_most_likely_tokens():
    counts = _frequencies(sampling(256, temperature=1.0, top_k=2), seed=2)
    assert counts[2:].sum() == 0
    # Renormalised over the top two: p0 = e^2 / (e^2 + e^1) = 0.7311.
    expected = torch.tensor([0.7310585786, 0.2689414214], dtype=torch.double) * DRAWS
    _, p_value = chisquare(counts[:2].numpy(), expected.numpy())
    assert p_value > 1e-3


def test_top_p_keeps_smallest_prefix_reaching_p():
    # softmax(LOGITS) = [0.5535, 0.2036, 0.1235, 0.0749, 0.0276, 0.0037]; top_p = 0.7:
    # mass before token 0 is 0 (kept), before token 1 is 0.5535 (kept), before token 2 is
    # 0.7571 >= 0.7 (dropped).
    counts = _frequencies(sampling(256, temperature=1.0, top_p=0.7), seed=3)
    assert counts[2:].sum() == 0
    probs = torch.softmax(LOGITS.double(), -1)[:2]
    _, p_value = chisquare(counts[:2].numpy(), (probs / probs.sum() * DRAWS).numpy())
    assert p_value > 1e-3


def test_zero_probability_token_never_sampled():
    logits = torch.tensor([0.0, float("-inf"), 0.0, float("-inf")]).expand(5000, -1).clone()
    tokens = sample_next_token(logits, sampling(256), torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 2}


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 4.9, 0.0]])
    assert sample_next_token(logits, sampling(256, temperature=0.0)).tolist() == [1, 0]


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def _prompts(tokenizer):
    questions = ["What is 3 + 4?", "Name a colour.", "Tell me a long story about a cat please"]
    return [
        tokenizer(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )["input_ids"]
        for q in questions
    ]


def test_greedy_matches_transformers_generate(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    out = generate(tiny_model, tokenizer, prompts, 2, sampling(12, temperature=0.0))
    for i, prompt in enumerate(prompts):
        reference = tiny_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(prompt) :].tolist()
        for row in (2 * i, 2 * i + 1):  # both members of the group
            length = int(out.lengths[row])
            assert out.completion_ids[row, :length].tolist() == reference
    assert out.group_ids.tolist() == [0, 0, 1, 1, 2, 2]


def test_stops_at_eos_and_masks_the_rest(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)[:1]
    free = generate(tiny_model, tokenizer, prompts, 1, sampling(10, temperature=0.0))
    assert bool(free.truncated[0]) and int(free.lengths[0]) == 10
    # Declare the greedy path's 4th token to be EOS: generation must stop right there.
    eos = int(free.completion_ids[0, 3])
    first = free.completion_ids[0].tolist().index(eos)
    tiny_model.generation_config.eos_token_id = eos
    out = generate(tiny_model, tokenizer, prompts, 1, sampling(10, temperature=0.0))
    assert int(out.lengths[0]) == first + 1  # EOS itself is part of the completion
    assert not bool(out.truncated[0])
    assert out.completion_mask[0].tolist() == [1] * (first + 1)
    assert (
        out.completion_ids[0, : first + 1].tolist() == free.completion_ids[0, : first + 1].tolist()
    )


def test_sampled_rollout_shapes_and_masks(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    gen = torch.Generator().manual_seed(0)
    out = generate(tiny_model, tokenizer, prompts, 4, sampling(8, temperature=1.0), gen)
    assert out.completion_ids.shape == (12, 8)
    assert out.completion_mask.shape == (12, 8)
    assert len(out.texts) == 12
    # Random tiny model never emits EOS in 8 tokens with a 49k vocabulary (p ~ 1e-4 per token).
    assert out.truncated.all()
    # Sampling differs across the group: the shared cache does not collapse the G samples.
    assert len({tuple(r.tolist()) for r in out.completion_ids[:4]}) == 4
    again = generate(
        tiny_model, tokenizer, prompts, 4, sampling(8, 1.0), torch.Generator().manual_seed(0)
    )
    assert torch.equal(out.completion_ids, again.completion_ids)  # seeded: reproducible


def test_groups_of_different_sizes(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    out = generate(tiny_model, tokenizer, prompts, [1, 3, 2], sampling(6, temperature=0.0))
    assert out.group_ids.tolist() == [0, 1, 1, 1, 2, 2]
    same = generate(tiny_model, tokenizer, prompts, 1, sampling(6, temperature=0.0))
    for row, prompt in enumerate(out.group_ids.tolist()):
        assert torch.equal(out.completion_ids[row], same.completion_ids[prompt])


def test_keeping_finished_rows_gives_the_same_greedy_completions(tiny_model, tokenizer):
    # Make EOS the greedy choice for some rows only: prompt 0's 3rd greedy token becomes EOS.
    prompts = _prompts(tokenizer)
    free = generate(tiny_model, tokenizer, prompts, 1, sampling(10, temperature=0.0))
    tiny_model.generation_config.eos_token_id = int(free.completion_ids[0, 2])
    dropped = generate(tiny_model, tokenizer, prompts, 2, sampling(10, temperature=0.0))
    kept = generate(
        tiny_model, tokenizer, prompts, 2, sampling(10, temperature=0.0), drop_finished=False
    )
    assert dropped.lengths.tolist() != [10] * 6  # some rows finished early
    assert dropped.lengths.tolist() == kept.lengths.tolist()
    assert torch.equal(dropped.completion_ids, kept.completion_ids)
    assert torch.equal(dropped.truncated, kept.truncated)


def test_sampling_logprobs_match_the_trainers_logprobs(tiny_model, tokenizer):
    # The sampler's record of log softmax(logits / T) for each drawn token equals what the
    # trainer computes for the same completions (same numerics: fp32 both).
    from groupwise.policy.logprobs import completion_logprobs

    prompts = _prompts(tokenizer)
    params = sampling(8, temperature=0.7)
    gen = torch.Generator().manual_seed(1)
    out = generate(tiny_model, tokenizer, prompts, 2, params, gen, return_logprobs=True)
    assert out.sampling_logprobs.shape == out.completion_ids.shape
    with torch.no_grad():
        trainer_logps, _ = completion_logprobs(
            tiny_model,
            out.prompt_ids,
            out.prompt_mask,
            out.completion_ids,
            out.completion_mask,
            temperature=0.7,
            group_size=2,
        )
    torch.testing.assert_close(out.sampling_logprobs, trainer_logps, atol=1e-4, rtol=1e-4)
    assert (out.sampling_logprobs[out.completion_mask == 0] == 0).all()
    assert generate(tiny_model, tokenizer, prompts, 2, params, gen).sampling_logprobs is None


def _varied_model():
    """A small random Llama whose greedy paths vary from token to token (the tiny-random
    model's repeat one token), for EOS tokens that end rows at chosen positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        eos_token_id=3,
    )
    return LlamaForCausalLM(config)


VARIED_PROMPTS = [[20, 21, 22], [30, 31], [40, 41, 42, 43, 44]]


def _first_eos_lengths(free_ids: torch.Tensor, eos: set[int]) -> list[int]:
    """Each row's completion length when ``eos`` ends it: up to its first EOS, included."""
    out = []
    for row in free_ids.tolist():
        hits = [i for i, token in enumerate(row) if token in eos]
        out.append(hits[0] + 1 if hits else len(row))
    return out


def test_checking_for_eos_every_k_tokens_gives_the_every_token_completions(tokenizer):
    # Two EOS tokens from the greedy paths, so rows end at different times: before the first
    # check at k = 8, between two checks, and never (the budget).
    tiny_model, prompts = _varied_model(), VARIED_PROMPTS
    budget = 20
    free = generate(tiny_model, tokenizer, prompts, 1, sampling(budget, temperature=0.0))
    eos = {int(free.completion_ids[0, 2]), int(free.completion_ids[1, 10])}
    expected = _first_eos_lengths(free.completion_ids, eos)
    assert expected[0] <= 3 and 8 < expected[1] <= 11 and expected[2] == budget, expected
    tiny_model.generation_config.eos_token_id = sorted(eos)
    runs = {
        (k, drop): generate(
            tiny_model,
            tokenizer,
            prompts,
            2,
            sampling(budget, temperature=0.0),
            drop_finished=drop,
            return_logprobs=True,
            eos_check_every=k,
        )
        for k in (1, 8)
        for drop in (True, False)
    }
    reference = runs[(1, True)]
    assert reference.lengths.tolist() == [n for n in expected for _ in range(2)]
    for out in runs.values():
        assert out.lengths.tolist() == reference.lengths.tolist()
        assert torch.equal(out.completion_ids, reference.completion_ids)
        assert torch.equal(out.completion_mask, reference.completion_mask)
        assert torch.equal(out.truncated, reference.truncated)
        torch.testing.assert_close(out.sampling_logprobs, reference.sampling_logprobs)
        # After EOS: padding, outside the completion, no log-prob.
        for row, n in enumerate(out.lengths.tolist()):
            assert int(out.completion_ids[row, n - 1]) in eos or n == budget
            assert (out.completion_ids[row, n:] == tokenizer.pad_token_id).all()
            assert out.completion_mask[row, n:].sum() == 0
            assert (out.sampling_logprobs[row, n:] == 0).all()
    assert out.truncated.tolist() == [False, False, False, False, True, True]


def test_rows_that_ended_decode_on_until_the_next_check(tokenizer, monkeypatch):
    # Every row ends at its 3rd token: the every-token loop stops after 2 decode steps; with a
    # check every 8 tokens the loop runs on to the 8th token (7 decode steps), its extra tokens
    # discarded.
    import groupwise.rollout.hf as hf

    tiny_model, prompts = _varied_model(), VARIED_PROMPTS[:1]
    free = generate(tiny_model, tokenizer, prompts, 1, sampling(20, temperature=0.0))
    eos = int(free.completion_ids[0, 2])
    assert eos not in free.completion_ids[0, :2].tolist()
    tiny_model.generation_config.eos_token_id = eos
    calls = []
    decode = hf.decode_one
    monkeypatch.setattr(hf, "decode_one", lambda *a: calls.append(1) or decode(*a))
    steps = {}
    for k in (1, 8):
        calls.clear()
        out = generate(
            tiny_model, tokenizer, prompts, 3, sampling(20, temperature=0.0), eos_check_every=k
        )
        steps[k] = len(calls)
        assert out.lengths.tolist() == [3, 3, 3]
        assert out.completion_ids.shape[1] == 3  # cut to the longest completion
    assert steps == {1: 2, 8: 7}


def test_the_hf_engine_passes_its_eos_check_interval_to_the_loop(tiny_model, tokenizer):
    from unittest import mock

    from groupwise.rollout import HFEngine

    with mock.patch("groupwise.rollout.hf.generate", wraps=generate) as spy:
        HFEngine(tiny_model, tokenizer, sampling(4, temperature=0.0), eos_check_every=3).generate(
            _prompts(tokenizer), 1
        )
    assert spy.call_args.kwargs["eos_check_every"] == 3
