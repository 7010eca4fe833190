"""The planner's per-component figures against what torch allocates on a CPU.

Each test runs the part of a step one component stands for (building the model, the backward
pass, an AdamW step, the chunked log-prob head, the decoder's forward and backward with and
without gradient checkpointing, a rollout with the HF and with the static engine) under
``torch.profiler`` with ``profile_memory``, replays the allocator's events in order, and checks
the planner's figure for that component against the peak of live bytes: within 15%. The shapes
are small enough for one thread and large enough that the component dominates the window.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

from groupwise.memory import plan as planmod
from groupwise.memory.plan import MemoryOptions, plan_grpo
from groupwise.memory.shapes import shape_from_hf_config

TOLERANCE = 0.15
# A Llama decoder of 13.6M parameters: 4 layers, hidden 256, 4 heads / 2 KV heads of 64.
CONFIG = LlamaConfig(
    hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=8192, max_position_embeddings=1024,
    attn_implementation="sdpa", tie_word_embeddings=False,
)  # fmt: skip
SHAPE = shape_from_hf_config(CONFIG.to_dict(), name="measured")
FP32 = MemoryOptions(dtype="fp32", device="cpu", share_prompt=False, beta=0.0)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def allocated(fn) -> tuple[object, int, int]:
    """``fn()``, the peak of bytes allocated and still live during it, and the bytes it left
    allocated (both relative to its start: frees of older tensors count negative)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return out, peak, live


def close(measured: int, planned: int) -> bool:
    return abs(measured - planned) <= TOLERANCE * planned


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaForCausalLM(CONFIG).train()


def test_weights(model):
    torch.manual_seed(0)
    _, peak, left = allocated(lambda: LlamaForCausalLM(CONFIG))
    planned = plan_grpo(SHAPE, FP32)[planmod.POLICY_WEIGHTS]
    assert close(left, planned) and close(peak, planned), (peak, left, planned)


def test_gradients_and_adamw_states(model):
    ids = torch.randint(0, CONFIG.vocab_size, (2, 32))
    model.zero_grad(set_to_none=True)
    model(ids).logits.float().logsumexp(-1).mean().backward()
    grads = sum(p.grad.nbytes for p in model.parameters())
    rows = plan_grpo(SHAPE, FP32)
    assert close(grads, rows[planmod.POLICY_GRADS]), (grads, rows[planmod.POLICY_GRADS])
    # torch's AdamW as a GPU runs it (multi-tensor): the states stay, a copy of v comes and goes.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=True)
    _, peak, left = allocated(optimizer.step)
    states, step = rows[planmod.POLICY_OPTIM], rows[planmod.POLICY_STEP]
    assert close(left, states), (left, states)
    assert close(peak, states + step), (peak, states + step)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_chunked_logprob_logits(dtype):
    """One chunk's head outputs (in the dtype), their fp32 copy and the fp32 exponentials."""
    from groupwise.policy.logprobs import ChunkedLMHeadLogprob

    batch, completion, chunk = 4, 256, 256
    opts = replace(FP32, dtype=dtype, precision="pure", batch=batch, group_size=4,
                   completion_len=completion, logprob_chunk_size=chunk)  # fmt: skip
    planned = plan_grpo(SHAPE, opts)[planmod.LOGITS]
    torch.manual_seed(0)
    torch_dtype = DTYPES[dtype]
    hidden = torch.randn(batch * completion, SHAPE.hidden, dtype=torch_dtype, requires_grad=True)
    # a frozen head: no weight gradient in the window
    weight = (torch.randn(SHAPE.vocab, SHAPE.hidden) * 0.02).to(torch_dtype)
    targets = torch.randint(0, SHAPE.vocab, (batch * completion,))

    def forward():
        return ChunkedLMHeadLogprob.apply(hidden, targets, weight, None, 1.0, None, chunk)

    (logp, _), peak, _ = allocated(forward)
    assert close(peak, planned), (peak, planned)
    # The backward recomputes one chunk at a time, mostly in place: about the forward's peak,
    # next to the hidden states' gradient.
    _, backward, _ = allocated(lambda: logp.sum().backward())
    assert close(backward - hidden.nbytes, planned), (backward, planned)


def _decoder_peak(decoder: torch.nn.Module, batch: int, tokens: int) -> int:
    """Peak bytes of the decoder's forward and backward over ``batch`` rows of ``tokens``: what
    the forward saves and the backward's own buffers. The gradient is taken for the input
    embeddings only, so no parameter gradient lands in the window (they are a row of their
    own); what the forward saves does not depend on that."""
    ids = torch.randint(0, CONFIG.vocab_size, (batch, tokens))

    def step():
        embeds = decoder.embed_tokens(ids).detach().requires_grad_(True)
        hidden = decoder(inputs_embeds=embeds, use_cache=False).last_hidden_state
        return torch.autograd.grad(hidden.sum(), embeds)

    return allocated(step)[1]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations(model, dtype, checkpointing):
    """A full fine-tune's decoder (every parameter trained) over one micro-batch, next to the
    planner's activations row; bf16 weights keep each norm's input as an fp32 copy."""
    batch, prompt, completion = 8, 64, 64
    opts = replace(FP32, dtype=dtype, precision="pure", batch=batch, group_size=batch,
                   prompt_len=prompt, completion_len=completion,
                   gradient_checkpointing=checkpointing)  # fmt: skip
    planned = plan_grpo(SHAPE, opts)[planmod.POLICY_ACTS]
    net = model if dtype == "fp32" else LlamaForCausalLM(CONFIG).to(DTYPES[dtype]).train()
    if checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        peak = _decoder_peak(net.model, batch, prompt + completion)
    finally:
        net.gradient_checkpointing_disable()
    assert close(peak, planned), (dtype, checkpointing, peak, planned)


@pytest.mark.parametrize("dropout", [0.0, 0.05])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_lora_activations(dropout, checkpointing):
    """LoRA r 16 on every linear: the frozen base linears and norms keep less, the adapters
    keep their own inputs (a dropped-out copy and its mask each, with dropout)."""
    from peft import LoraConfig, get_peft_model

    batch, prompt, completion = 8, 64, 64
    opts = replace(FP32, lora_r=16, lora_dropout=dropout, batch=batch, group_size=batch,
                   prompt_len=prompt, completion_len=completion,
                   gradient_checkpointing=checkpointing)  # fmt: skip
    planned = plan_grpo(SHAPE, opts)[planmod.POLICY_ACTS]
    torch.manual_seed(0)
    base = LlamaForCausalLM(CONFIG).train()
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    get_peft_model(base, LoraConfig(r=16, lora_dropout=dropout, target_modules=targets))
    peak = _decoder_peak(base.model, batch, prompt + completion)
    assert close(peak, planned), (dropout, checkpointing, peak, planned)


def _rollout_setup():
    from groupwise.rollout.base import SamplingParams
    from groupwise.runtime.models import smollm2_tokenizer

    config = LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=1024, max_position_embeddings=512,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    net = LlamaForCausalLM(config).eval()
    tokenizer = smollm2_tokenizer()
    # An end-of-sequence id the model cannot sample: every row decodes all its tokens, the
    # longest case the planner prices.
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(40000)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(5)
    net.generation_config.eos_token_id = 40000
    net.generation_config.pad_token_id = 5
    prompt, completion, group, prompts = 32, 96, 16, 4
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(10, 1024, (prompt,), generator=generator).tolist() for _ in range(prompts)]
    params = SamplingParams(completion, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                            repetition_penalty=1.0)  # fmt: skip
    opts = replace(FP32, batch=group * prompts, group_size=group, prompt_len=prompt,
                   completion_len=completion)  # fmt: skip
    shape = shape_from_hf_config(config.to_dict())
    return net, tokenizer, ids, [group] * prompts, params, shape, opts


def _generation_rows(rows: dict[str, int]) -> int:
    return rows[planmod.KV_CACHE] + rows[planmod.GENERATION_LOGITS]


def test_hf_engine_kv_cache():
    from groupwise.rollout import generate

    net, tokenizer, prompts, counts, params, shape, opts = _rollout_setup()
    with torch.no_grad():
        out, peak, _ = allocated(lambda: generate(net, tokenizer, prompts, counts, params))
    assert int(out.completion_mask.sum()) == opts.batch * opts.completion_len
    planned = _generation_rows(plan_grpo(shape, replace(opts, generation_engine="hf")))
    assert close(peak, planned), (peak, planned)


def test_static_engine_kv_cache():
    from groupwise.rollout.static import StaticEngine

    net, tokenizer, prompts, counts, params, shape, opts = _rollout_setup()
    engine = StaticEngine(net, tokenizer, params, dtype=torch.float32, eos_check_every=8,
                          cuda_graphs=False, compact=False)  # fmt: skip
    with torch.no_grad():
        out, peak, _ = allocated(lambda: engine.generate(prompts, counts))
    assert int(out.completion_mask.sum()) == opts.batch * opts.completion_len
    # On a CPU (no CUDA graphs) the slots are exactly prompt + completion.
    planned = _generation_rows(plan_grpo(shape, replace(opts, generation_engine="static")))
    assert close(peak, planned), (peak, planned)


def test_nf4_base_weights():
    """QLoRA's base as groupwise quantises it: each 4-bit linear's packed codes, its uint8
    absmax, their fp32 scales and offset; embeddings, norms and the LM head in bf16."""
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    from groupwise.memory.terms import base_weight_bytes
    from groupwise.runtime.quantization import quantize_4bit

    torch.manual_seed(0)
    net = LlamaForCausalLM(CONFIG).to(torch.bfloat16)
    net = quantize_4bit(net, "nf4", True, torch.bfloat16, torch.device("cpu"))
    stored = 0
    for module in net.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            stored += module.weight.data.nbytes + state.absmax.nbytes + state.offset.nbytes
            stored += state.state2.absmax.nbytes
        else:
            stored += sum(p.nbytes for p in module.parameters(recurse=False))
    planned = base_weight_bytes(SHAPE, 2, load_in_4bit=True, double_quant=True)
    assert close(stored, planned), (stored, planned)


def test_static_engine_prefill():
    """Long prompts and one new token: the prefill (the prompts' cache and one layer's
    activations of the forward, with a fused attention) is the rollout's peak."""
    from groupwise.rollout.base import SamplingParams
    from groupwise.rollout.static import StaticEngine

    net, tokenizer, _, _, _, shape, opts = _rollout_setup()
    prompt, prompts = 384, 4
    generator = torch.Generator().manual_seed(1)
    ids = [torch.randint(10, 1024, (prompt,), generator=generator).tolist() for _ in range(prompts)]
    params = SamplingParams(1, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                            repetition_penalty=1.0)  # fmt: skip
    engine = StaticEngine(net, tokenizer, params, dtype=torch.float32, eos_check_every=8,
                          cuda_graphs=False, compact=False)  # fmt: skip
    with torch.no_grad():
        _, peak, _ = allocated(lambda: engine.generate(ids, 1))
    opts = replace(opts, batch=prompts, group_size=1, prompt_len=prompt, completion_len=1,
                   generation_engine="static")  # fmt: skip
    rows = plan_grpo(shape, opts)
    assert rows[planmod.PREFILL] > _generation_rows(rows)  # the case this test is for
    assert close(peak, rows[planmod.PREFILL]), (peak, rows[planmod.PREFILL])
