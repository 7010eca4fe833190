"""The static engine on a LoRA adapter and on a 4-bit base: the policy's own layers read in
place with the adapters unmerged (no second copy of the base), the same greedy tokens as the
reference loop through peft's forward, and a build and a sync that hold at most one decoder
layer beyond the engine's own working set (measured as the process's peak resident memory)."""

import gc
import os

import peft
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import sampling, static_engine_options
from groupwise.rollout import generate
from groupwise.rollout.static import StaticEngine, supports
from groupwise.rollout.static_weights import Projection
from groupwise.runtime.models import tiny_random_model
from groupwise.runtime.quantization import keep_trainable_layout, quantize_4bit

CPU = torch.device("cpu")
PROMPTS = [[5, 17, 301, 44], [9, 9, 100], [250]]
COUNTS = [2, 1, 3]


def _lora(model, **kwargs):
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", **kwargs)
    model = peft.get_peft_model(model, config)
    with torch.no_grad():  # a non-zero adapter, so it changes the tokens
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    return model.eval()


def _engine(model, tokenizer, tokens=12, **kwargs):
    greedy = sampling(tokens, temperature=0.0)
    return StaticEngine(
        model, tokenizer, greedy, **static_engine_options(dtype=torch.float32, **kwargs)
    )


def _greedy(model, tokenizer, tokens=12):
    return generate(model, tokenizer, PROMPTS, COUNTS, sampling(tokens, temperature=0.0))


def _parameter_storages(model):
    return {p.untyped_storage().data_ptr() for p in model.parameters()}


def test_lora_is_applied_unmerged_on_the_policys_own_weights(tokenizer):
    model = _lora(tiny_random_model(seed=1))
    engine = _engine(model, tokenizer)
    decoder = engine.decoder
    assert decoder.in_place and not decoder.packed
    storages = _parameter_storages(model)
    projections = [
        v for layer in decoder.layers for v in vars(layer).values() if isinstance(v, Projection)
    ]
    assert len(projections) == 4 * decoder.layers_n
    for projection in projections:  # base and adapters are the policy's tensors, not copies
        assert all(t.untyped_storage().data_ptr() in storages for t in projection.tensors())
    assert all(adapters for p in projections for _, adapters in p.parts)
    assert torch.equal(
        engine.generate(PROMPTS, COUNTS).completion_ids, _greedy(model, tokenizer).completion_ids
    )
    # The optimizer updates the adapters in their storage: the engine follows with no copy.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.add_(torch.randn_like(param) * 0.3)
    engine.sync(model)
    assert torch.equal(
        engine.generate(PROMPTS, COUNTS).completion_ids, _greedy(model, tokenizer).completion_ids
    )
    with model.disable_adapter():  # a sync reads which adapters are active
        engine.sync(model)
        assert torch.equal(
            engine.generate(PROMPTS, COUNTS).completion_ids,
            _greedy(model, tokenizer).completion_ids,
        )


def test_a_4bit_base_under_lora_matches_the_reference_loop(tokenizer):
    base = quantize_4bit(tiny_random_model(seed=2), "nf4", True, torch.float32, CPU)
    model = _lora(keep_trainable_layout(base))
    assert supports(model) is None
    engine = _engine(model, tokenizer, tokens=16)
    assert engine.decoder.in_place
    weights = [base for layer in engine.decoder.layers for base, _ in layer.qkv.parts]
    assert all(hasattr(b.weight, "quant_state") for b in weights)  # bitsandbytes' own layers
    reference = _greedy(model, tokenizer, tokens=16)
    rollout = engine.generate(PROMPTS, COUNTS)
    assert torch.equal(rollout.completion_ids, reference.completion_ids)
    assert torch.equal(rollout.completion_mask, reference.completion_mask)


def test_other_quantization_and_adapters_are_refused_with_the_reason():
    model = tiny_random_model(seed=0)
    model.config.quantization_config = {"quant_method": "gptq", "bits": 4}
    assert "other than bitsandbytes 4-bit" in supports(model)
    ia3 = peft.get_peft_model(tiny_random_model(seed=0), peft.IA3Config(target_modules=["q_proj"]))
    assert "IA3 adapter" in supports(ia3)
    dora = peft.get_peft_model(
        tiny_random_model(seed=0), peft.LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)
    )
    assert "DoRA" in supports(dora)


# ---- memory: at most one layer's transient beyond the engine's own working set ----------------


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:  # resets VmHWM to the current RSS
            handle.write("5")
    except OSError:
        return False
    return True


def _status(key):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _peak_rise(fn):
    """(fn's result, the process's peak resident memory during fn minus the resident memory
    before it) in bytes."""
    gc.collect()
    if not _reset_peak():
        pytest.skip("this kernel cannot reset the peak RSS (/proc/self/clear_refs)")
    before = _status("VmRSS")
    result = fn()
    return result, _status("VmHWM") - before


def _wide_model():
    """Four decoder layers of 12.9M fp32 parameters (51 MB) each: a full copy of the model, or
    every layer's LoRA merge at once, is four times one layer, far above the noise of RSS."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _layer_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.model.layers[0].parameters())


def _owned_bytes(decoder, model):
    """The bytes the engine holds that are not the policy's own storage."""
    storages = _parameter_storages(model)
    owned = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for _, t in decoder.named_tensors()
        if t.untyped_storage().data_ptr() not in storages
    }
    return sum(owned.values()) + (decoder.cos.nbytes + decoder.sin.nbytes)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_building_and_syncing_on_lora_hold_at_most_one_layer_beyond_the_working_set(tokenizer):
    model = _lora(_wide_model())
    layer = _layer_bytes(model.base_model.model)
    engine, rise = _peak_rise(lambda: _engine(model, tokenizer))
    working = _owned_bytes(engine.decoder, model)
    assert working < layer / 10  # norms and RoPE tables only: no copy of the base
    assert rise <= working + layer, (rise, working, layer)
    _, rise = _peak_rise(lambda: engine.sync(model))
    assert rise <= layer, (rise, layer)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_building_and_syncing_a_copy_hold_at_most_one_layer_beyond_it(tokenizer):
    model = _wide_model()
    layer = _layer_bytes(model)
    engine, rise = _peak_rise(lambda: _engine(model, tokenizer, pack_weights=False))
    working = _owned_bytes(engine.decoder, model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert working >= weights  # its own full copy
    assert rise <= working + layer, (rise, working, layer)
    _, rise = _peak_rise(lambda: engine.sync(model))
    assert rise <= layer, (rise, layer)


def test_layers_read_in_place_are_read_inside_the_weights_context(tokenizer):
    """Under FSDP the full weights exist only inside the policy's ``full_weights`` context: an
    engine reading the policy's layers decodes inside it (a copy needs it only to load)."""
    import contextlib

    entered = []

    @contextlib.contextmanager
    def weights():
        entered.append(True)
        yield

    options = static_engine_options(dtype=torch.float32, weights=weights)
    greedy = sampling(4, temperature=0.0)
    engine = StaticEngine(_lora(tiny_random_model(seed=1)), tokenizer, greedy, **options)
    built = len(entered)
    engine.generate(PROMPTS, COUNTS)
    assert len(entered) == built + 1
    copy = StaticEngine(tiny_random_model(seed=1), tokenizer, greedy, **options)
    built = len(entered)
    copy.generate(PROMPTS, COUNTS)
    assert len(entered) == built
