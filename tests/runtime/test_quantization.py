"""QLoRA's 4-bit layers on the CPU: the NF4 code and its forward against the dequantised
reference, the in-memory quantisation against transformers' own (the 8-bit optimizer states are
tested with the optimizer, tests/policy/test_optimizer.py)."""

import copy

import bitsandbytes as bnb
import bitsandbytes.functional as bnbf
import pytest
import torch
from transformers import AutoModelForCausalLM

from groupwise.errors import ConfigError
from groupwise.policy.optimizer import build_optimizer
from groupwise.runtime.models import tiny_random_model
from groupwise.runtime.quantization import (
    bnb_config,
    compute_dtype,
    is_4bit,
    keep_trainable_layout,
    quantize_4bit,
    require_bitsandbytes,
)

# The 16 NormalFloat4 levels (QLoRA, Dettmers et al. 2023, Appendix E: the quantiles of N(0, 1)
# scaled to [-1, 1], with an exact 0).
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]  # fmt: skip


def _linear4bit(weight: torch.Tensor, quant_type="nf4", nested=False) -> bnb.nn.Linear4bit:
    module = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    module.weight.data = weight.clone()
    holder = torch.nn.Sequential(module)
    quantize_4bit(holder, quant_type, nested, torch.float32, torch.device("cpu"))
    return holder[0]


def _dequantized(layer: bnb.nn.Linear4bit) -> torch.Tensor:
    return bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state)


def test_nf4_stores_its_levels_exactly_and_rounds_to_the_nearest():
    # Each 64-value block (bitsandbytes' block size) is scaled by its absmax: a block made of
    # absmax x the NF4 levels comes back exactly; 0.5 x absmax lies nearest 0.4407 (0.0593
    # away, 0.5626 is 0.0626 away) and 0.1 x absmax nearest 0.0796.
    levels = torch.tensor(NF4)
    block = torch.cat([levels, levels, levels, levels]) * 3.0  # absmax 3
    other = torch.full((64,), 0.5 * 2.0)
    other[0], other[1] = 2.0, 0.1 * 2.0  # absmax 2
    weight = torch.stack([block, other])
    back = _dequantized(_linear4bit(weight))
    torch.testing.assert_close(back[0], block, rtol=0, atol=1e-6)
    assert back[1, 0] == pytest.approx(2.0, abs=1e-6)
    assert back[1, 1] == pytest.approx(NF4[8] * 2.0, abs=1e-6)
    assert back[1, 2:].tolist() == pytest.approx([NF4[12] * 2.0] * 62, abs=1e-6)


@pytest.mark.parametrize("quant_type, nested", [("nf4", False), ("nf4", True), ("fp4", False)])
def test_4bit_forward_equals_the_dequantized_reference(quant_type, nested):
    torch.manual_seed(0)
    weight = torch.randn(96, 128) * 0.05
    layer = _linear4bit(weight, quant_type, nested)
    assert layer.weight.dtype == torch.uint8 and layer.weight.quant_state.nested == nested
    reference = _dequantized(layer)
    x = torch.randn(5, 7, 128)
    torch.testing.assert_close(layer(x), x @ reference.T, rtol=1e-5, atol=1e-5)
    # One row (the decode shape) takes bitsandbytes' other kernel: the same numbers.
    with torch.no_grad():
        torch.testing.assert_close(layer(x[:1, :1]), x[:1, :1] @ reference.T, rtol=1e-5, atol=1e-5)
    # NF4's error: at most half the widest gap between levels (0.3038 / 2) x the block's absmax.
    blocks = weight.reshape(-1, 64)
    bound = 0.3038 / 2 * blocks.abs().amax(1, keepdim=True) * 1.02  # nested absmax: ~1% off
    if quant_type == "nf4":
        assert ((reference.reshape(-1, 64) - blocks).abs() <= bound).all()


def test_quantize_4bit_swaps_every_linear_but_the_lm_head():
    model = tiny_random_model()
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    quantize_4bit(model, "nf4", True, torch.float32, torch.device("cpu"))
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    four = [n for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert is_4bit(model) and len(four) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert set(linears) - set(four) == {"lm_head"}
    assert model.lm_head.weight.dtype == torch.float32


def test_a_4bit_model_computes_as_its_dequantized_weights():
    # The whole tiny model, 4-bit, against the same model whose linear layers hold the
    # dequantised weights in fp32 (bitsandbytes.functional.dequantize_4bit).
    base = tiny_random_model()
    quantized = quantize_4bit(copy.deepcopy(base), "nf4", True, torch.float32, torch.device("cpu"))
    reference = copy.deepcopy(base)
    for name, module in quantized.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            reference.get_submodule(name).weight.data = _dequantized(module)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 40, 41]])
    with torch.no_grad():
        got, want = quantized(input_ids=ids).logits, reference(input_ids=ids).logits
        plain = base(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - plain).abs().max() > 1e-3  # it is quantised: not the fp32 model


def test_in_memory_quantization_matches_transformers_loading_quantized(tmp_path):
    base = tiny_random_model()
    base.save_pretrained(tmp_path)
    config = bnb_config("nf4", True, torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=config, dtype=torch.float32
    )
    keep_trainable_layout(loaded)  # loaded in eval mode (see the test below)
    ours = quantize_4bit(copy.deepcopy(base), "nf4", True, torch.float32, torch.device("cpu"))
    assert is_4bit(loaded)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        torch.testing.assert_close(
            ours(input_ids=ids).logits, loaded(input_ids=ids).logits, rtol=1e-5, atol=1e-5
        )


def test_eval_mode_keeps_the_layout_that_backpropagates():
    # bitsandbytes repacks a 4-bit weight for its CPU inference kernel (no autograd) the first
    # time an eval-mode layer sees an input without grad, where the CPU has AVX512-BF16; the
    # training forward after it would pass no gradient to the layer's input. The policy
    # generates in eval mode and then trains, so its layers keep the trainable layout: the
    # gradient to the input after an eval forward equals the dequantised reference's.
    torch.manual_seed(0)
    layer = keep_trainable_layout(_linear4bit(torch.randn(32, 64) * 0.1))
    reference = _dequantized(layer).clone()
    layer.eval()
    with torch.no_grad():
        layer(torch.randn(3, 64))
    layer.train()
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    x = torch.randn(4, 64, requires_grad=True)
    layer(x).sum().backward()
    torch.testing.assert_close(x.grad, reference.sum(0).expand(4, 64), rtol=1e-5, atol=1e-5)


def test_compute_dtype_is_the_runs():
    assert compute_dtype(torch.float32, autocast=False) == torch.float32  # CPU
    assert compute_dtype(torch.float32, autocast=True) == torch.bfloat16  # bf16 autocast
    assert compute_dtype(torch.bfloat16, autocast=True) == torch.bfloat16  # LoRA on a bf16 GPU


def test_missing_bitsandbytes_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "bitsandbytes" else real(n, *a)
    )
    with pytest.raises(ConfigError, match=r'load_in_4bit=True needs .*groupwise\[quant\]'):
        require_bitsandbytes("load_in_4bit=True")
    with pytest.raises(ConfigError, match=r"optim=adamw_8bit needs the bitsandbytes package"):
        build_optimizer("adamw_8bit", [torch.nn.Parameter(torch.zeros(2))], 1e-3, (0.9, 0.99),
                        1e-8, 0.0)  # fmt: skip
