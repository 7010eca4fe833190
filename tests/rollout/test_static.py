"""The static engine (rollout/static.py) against the reference decode loop (rollout/hf.py).

In fp32 the two compute the same numbers up to the order of additions, so greedy completions are
the same tokens and, with the same random stream, sampled completions are too: with finished rows
kept in the batch (``compact=False`` vs ``drop_finished=False``) and with finished rows dropped
after every token (``compact=True, eos_check_every=1`` vs the reference's default).
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import sampling, static_engine_options
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rollout import generate
from groupwise.rollout.static import StaticEngine, packing_available, supports

COUNTS = [3, 1, 4]


def _prompts(tokenizer):
    texts = ["What is 2 + 2?", "Name a colour of the sky at noon, please", "x"]
    return [tokenizer(t)["input_ids"] for t in texts]


def _engine(model, tokenizer, **kwargs):
    kwargs.setdefault("dtype", torch.float32)
    params = sampling(10, temperature=0.0)
    return StaticEngine(model, tokenizer, params, **static_engine_options(**kwargs))


def _eos_midway(model, tokenizer, prompts):
    """Declare a token of prompt 0's greedy path (its 3rd) an EOS token, so some rows finish
    early and others do not (the EOS handling is exercised)."""
    free = generate(model, tokenizer, prompts, 1, sampling(10, temperature=0.0))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, int(free.completion_ids[0, 2])]


def _same(a, b):
    assert a.group_ids.tolist() == b.group_ids.tolist()
    assert a.completion_mask.tolist() == b.completion_mask.tolist()
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.truncated, b.truncated)
    assert a.texts == b.texts
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)


@pytest.mark.parametrize("compact", [True, False])
def test_greedy_equals_the_reference_loop(tiny_model, tokenizer, compact):
    prompts = _prompts(tokenizer)
    _eos_midway(tiny_model, tokenizer, prompts)
    params = sampling(10, temperature=0.0)
    reference = generate(tiny_model, tokenizer, prompts, COUNTS, params)
    assert reference.lengths.tolist() != [10] * 8  # some rows stop early, some do not
    assert bool(reference.truncated.any())
    out = _engine(tiny_model, tokenizer, compact=compact, eos_check_every=3).generate(
        prompts, COUNTS
    )
    _same(out, reference)


def test_sampled_rows_equal_the_reference_with_finished_rows_kept(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    _eos_midway(tiny_model, tokenizer, prompts)
    params = sampling(10, temperature=1.3)
    reference = generate(
        tiny_model,
        tokenizer,
        prompts,
        COUNTS,
        params,
        torch.Generator().manual_seed(3),
        drop_finished=False,
        return_logprobs=True,
    )
    engine = _engine(tiny_model, tokenizer, compact=False, eos_check_every=4)
    out = engine.generate(prompts, COUNTS, params, torch.Generator().manual_seed(3))
    _same(out, reference)
    torch.testing.assert_close(
        out.sampling_logprobs, reference.sampling_logprobs, atol=1e-5, rtol=0
    )


def test_sampled_rows_equal_the_reference_with_finished_rows_dropped(tiny_model, tokenizer):
    # Dropping finished rows after every token draws the reference's random numbers.
    prompts = _prompts(tokenizer)
    free = generate(tiny_model, tokenizer, prompts, 1, sampling(10, temperature=0.0))
    # A token sampled often enough at T = 3 to end some rows early.
    tiny_model.generation_config.eos_token_id = [int(t) for t in free.completion_ids[:, 1]]
    params = sampling(10, temperature=3.0)
    reference = generate(
        tiny_model, tokenizer, prompts, COUNTS, params, torch.Generator().manual_seed(5)
    )
    engine = _engine(tiny_model, tokenizer, compact=True, eos_check_every=1)
    out = engine.generate(prompts, COUNTS, params, torch.Generator().manual_seed(5))
    _same(out, reference)


def test_sampling_logprobs_equal_the_trainers(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    params = sampling(8, temperature=0.7)
    engine = _engine(tiny_model, tokenizer)
    out = engine.generate(prompts, 2, params, torch.Generator().manual_seed(1))
    with torch.no_grad():
        trainer, _ = completion_logprobs(
            tiny_model,
            out.prompt_ids,
            out.prompt_mask,
            out.completion_ids,
            out.completion_mask,
            temperature=0.7,
            group_size=2,
        )
    mask = out.completion_mask.bool()
    assert (out.sampling_logprobs - trainer)[mask].abs().max() < 1e-5
    assert (out.sampling_logprobs[~mask] == 0).all()


def test_weights_are_packed_only_in_a_dtype_the_cpu_can_pack(tiny_model, tokenizer, monkeypatch):
    """oneDNN packs bf16 weights only on CPUs with the instructions for it (AVX512-BW/VL/DQ or
    AVX-NE-CONVERT): elsewhere the default engine stays dense, and asking for packing says why."""
    bf16_packs = packing_available(torch.bfloat16)
    fp32_packs = packing_available(torch.float32)
    engine = _engine(tiny_model, tokenizer, dtype=torch.bfloat16)
    assert engine.decoder.layers[0].qkv.is_mkldnn == bf16_packs
    if bf16_packs:
        assert _engine(
            tiny_model, tokenizer, dtype=torch.bfloat16, pack_weights=True
        ).decoder.packed
    # A CPU without bf16 support, whatever this one has: dense by default, a clear error when
    # packing is asked for; fp32 weights still pack where the build can.
    import groupwise.rollout.static as static

    monkeypatch.setattr(
        static,
        "packing_available",
        lambda dtype=torch.float32: fp32_packs and dtype == torch.float32,
    )
    assert not _engine(tiny_model, tokenizer, dtype=torch.bfloat16).decoder.layers[0].qkv.is_mkldnn
    with pytest.raises(ValueError, match=r"pack_weights=True: .*torch.bfloat16"):
        _engine(tiny_model, tokenizer, dtype=torch.bfloat16, pack_weights=True)
    assert _engine(tiny_model, tokenizer).decoder.layers[0].qkv.is_mkldnn == fp32_packs


def test_bf16_copy_is_close_and_records_logprobs(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    params = sampling(8, temperature=1.0)
    engine = StaticEngine(
        tiny_model, tokenizer, params, **static_engine_options(dtype=torch.bfloat16)
    )
    dtypes = {name: t.dtype for name, t in engine.decoder.named_tensors()}
    assert dtypes["layers.0.qkv"] == dtypes["layers.1.down"] == dtypes["embed"] == torch.bfloat16
    assert dtypes["layers.0.ln1"] == dtypes["norm"] == torch.float32  # the fp32 residual stream
    out = engine.generate(prompts, 4, params, torch.Generator().manual_seed(0))
    with torch.no_grad():
        trainer, _ = completion_logprobs(
            tiny_model,
            out.prompt_ids,
            out.prompt_mask,
            out.completion_ids,
            out.completion_mask,
            group_size=4,
        )
    gap = (out.sampling_logprobs - trainer)[out.completion_mask.bool()].abs()
    assert 0 < gap.max() < 0.1  # bf16 numerics: close to the fp32 trainer, not equal
    assert gap.mean() < 0.02


@pytest.mark.parametrize("packed", [False, True])
def test_sync_copies_the_policys_new_weights_in_place(tiny_model, tokenizer, packed):
    if packed and not packing_available():
        pytest.skip("this torch build cannot pre-pack weights for oneDNN")
    engine = _engine(tiny_model, tokenizer, pack_weights=packed)
    assert engine.decoder.layers[0].qkv.is_mkldnn == packed
    storage = {id(t) for t in vars(engine.decoder.layers[0]).values()}
    prompts = _prompts(tokenizer)
    before = engine.generate(prompts, 1)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    stale = engine.generate(prompts, 1)
    assert torch.equal(stale.completion_ids, before.completion_ids)  # nothing pushed yet
    engine.sync(tiny_model)
    after = engine.generate(prompts, 1)
    reference = generate(tiny_model, tokenizer, prompts, 1, sampling(10, temperature=0.0))
    _same(after, reference)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    assert {id(t) for t in vars(engine.decoder.layers[0]).values()} == storage  # in place
    layer = tiny_model.model.layers[1]
    q, k, v = (getattr(layer.self_attn, f"{n}_proj").weight for n in "qkv")
    state = engine.decoder.hf_state()
    assert torch.equal(state["model.layers.1.self_attn.k_proj.weight"], k)
    assert torch.equal(torch.cat([q, k, v]), dict(engine.decoder.named_tensors())["layers.1.qkv"])
    for name, param in tiny_model.named_parameters():
        assert torch.equal(state[name], param), name


def _qwen2(bias_scale=0.5):
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:  # non-zero biases, so a dropped bias shows
            for n in "qkv":
                getattr(layer.self_attn, f"{n}_proj").bias.normal_(0, bias_scale)
    return model


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(2)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.normal_(1, 0.3)
            layer.self_attn.k_norm.weight.normal_(1, 0.3)
    return model


def _llama_scaled_rope():
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(config)


def _llama_attention_bias():
    """Llama with attention_bias=True: q, k, v and o projections all carry a bias."""
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        attention_bias=True, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(4)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # biases large enough to change the tokens if one were dropped
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):
                param.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("build", [_qwen2, _qwen3, _llama_scaled_rope, _llama_attention_bias])
def test_other_llama_family_decoders_match_transformers(build, tokenizer):
    model = build().eval()
    prompts = [[5, 17, 301, 44], [9, 9, 100], [250]]
    params = sampling(12, temperature=0.0)
    engine = StaticEngine(model, tokenizer, params, **static_engine_options(dtype=torch.float32))
    reference = generate(model, tokenizer, prompts, [2, 1, 1], sampling(12, temperature=0.0))
    out = engine.generate(prompts, [2, 1, 1])
    assert torch.equal(out.completion_ids, reference.completion_ids)
    params = sampling(12, temperature=1.0)
    out = engine.generate(prompts, [2, 1, 1], params, torch.Generator().manual_seed(0))
    with torch.no_grad():
        trainer, _ = completion_logprobs(
            model,
            out.prompt_ids[out.group_ids],
            out.prompt_mask[out.group_ids],
            out.completion_ids,
            out.completion_mask,
        )
    assert (out.sampling_logprobs - trainer)[out.completion_mask.bool()].abs().max() < 1e-4


def test_unsupported_models_are_refused_with_the_reason(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128))
    assert "gpt2" in supports(model)
    with pytest.raises(ValueError, match="static engine cannot decode this model.*gpt2"):
        StaticEngine(model, tokenizer, sampling(4), **static_engine_options())
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            hidden_act="gelu",
        )
    )
    assert "gelu" in supports(llama)


def test_rejects_bad_counts_and_empty_prompts(tiny_model, tokenizer):
    engine = _engine(tiny_model, tokenizer)
    with pytest.raises(ValueError, match="one count >= 1 per prompt"):
        engine.generate(_prompts(tokenizer), [1, 0, 2])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[1, 2], []], 1)


def test_compiled_step_gives_the_same_greedy_tokens(tiny_model, tokenizer):
    prompts = _prompts(tokenizer)
    _eos_midway(tiny_model, tokenizer, prompts)
    eager = _engine(tiny_model, tokenizer).generate(prompts, COUNTS)
    compiled = _engine(tiny_model, tokenizer, compile=True).generate(prompts, COUNTS)
    _same(compiled, eager)


def test_a_tied_head_beside_lora_on_the_embedding_stays_the_bare_weight(tokenizer):
    """peft adapts embed_tokens and leaves the tied lm_head on the bare weight: the static copy
    is built untied and decodes with the policy's own logits, before and after a sync."""
    import peft

    model = peft.get_peft_model(
        _qwen3(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"])
    )
    with torch.no_grad():  # a non-zero adapter, so the merged embedding differs from the head
        for name, param in model.named_parameters():
            if "lora_embedding_B" in name or "lora_B" in name:
                param.normal_(0, 0.5)
    model.eval()
    prompts = [[5, 17, 301, 44], [9, 9, 100], [250]]
    greedy = sampling(12, temperature=0.0)
    engine = StaticEngine(model, tokenizer, greedy, **static_engine_options(dtype=torch.float32))
    assert not engine.decoder.tied
    reference = generate(model, tokenizer, prompts, [2, 1, 1], greedy)
    assert torch.equal(engine.generate(prompts, [2, 1, 1]).completion_ids, reference.completion_ids)
    with torch.no_grad():  # train the embedding's adapter further, then sync
        for name, param in model.named_parameters():
            if "lora_embedding_A" in name:
                param.add_(torch.randn_like(param))
    engine.sync(model)
    reference = generate(model, tokenizer, prompts, [2, 1, 1], greedy)
    assert torch.equal(engine.generate(prompts, [2, 1, 1]).completion_ids, reference.completion_ids)


def test_prefill_in_chunks_of_prompts_gives_the_same_rollout(tiny_model, tokenizer, monkeypatch):
    """PREFILL_TOKENS bounds the prefill's activations; one prompt per forward (a bound below
    any prompt's width) decodes the same tokens as all prompts in one forward."""
    import groupwise.rollout.static as static

    prompts = _prompts(tokenizer)
    whole = _engine(tiny_model, tokenizer).generate(prompts, COUNTS)
    monkeypatch.setattr(static, "PREFILL_TOKENS", 1)
    chunked = _engine(tiny_model, tokenizer).generate(prompts, COUNTS)
    _same(whole, chunked)
    torch.testing.assert_close(
        chunked.sampling_logprobs, whole.sampling_logprobs, atol=1e-5, rtol=0
    )
