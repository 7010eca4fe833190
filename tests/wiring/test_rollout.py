"""Which rollout engine a run gets (wiring/rollout.py, sections/generation.py): ``generation_engine:
auto`` resolved on both sides of the CUDA check and for each exclusion, the options validated
against what auto resolves to, and the default CPU run on the HF engine with its reason printed.
"""

from types import SimpleNamespace

import peft
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.rollout import HFEngine
from groupwise.runtime.models import tiny_random_model
from groupwise.runtime.quantization import keep_trainable_layout, quantize_4bit
from groupwise.sections.generation import resolve_generation_engine
from groupwise.wiring.rollout import choose_engine

CUDA, CPU = "cuda", "cpu"


def test_auto_is_the_default_and_use_vllm_keeps_its_meaning():
    assert GRPOConfig().generation_engine == "auto"
    assert GRPOConfig(use_vllm=True).generation_engine == "vllm"
    assert GRPOConfig(use_vllm=False).generation_engine == "hf"  # TRL: transformers' generate
    assert GRPOConfig(use_vllm=False, generation_engine="static").generation_engine == "static"
    with pytest.raises(ConfigError, match="generation_engine"):
        GRPOConfig(generation_engine="fast")


def test_auto_resolves_to_static_only_on_cuda_for_a_model_it_decodes():
    assert resolve_generation_engine("auto", device_type=CUDA, static_unsupported=None)[0] == (
        "static"
    )
    name, why = resolve_generation_engine("auto", device_type=CPU, static_unsupported=None)
    assert name == "hf" and "cpu" in why
    name, why = resolve_generation_engine(
        "auto", device_type=CUDA, static_unsupported="model_type 'gpt2' is not one"
    )
    assert name == "hf" and "gpt2" in why


@pytest.mark.parametrize(
    ("exclusion", "words"),
    [({"multi_turn": True}, "tools"), ({"generation_kwargs": True}, "generation_kwargs")],
)
def test_auto_keeps_the_hf_engine_for_each_exclusion_on_cuda(exclusion, words):
    name, why = resolve_generation_engine(
        "auto", device_type=CUDA, static_unsupported=None, **exclusion
    )
    assert name == "hf" and words in why


@pytest.mark.parametrize("engine", ["hf", "static", "vllm"])
@pytest.mark.parametrize("device", [CUDA, CPU])
def test_a_named_engine_is_kept_as_set(engine, device):
    name, why = resolve_generation_engine(
        engine, device_type=device, static_unsupported="anything", multi_turn=True
    )
    assert (name, why) == (engine, f"generation_engine={engine} as set")


def _policy(model, device):
    """What choose_engine reads of a Policy: its model and its device (here monkeypatched to
    CUDA on a CPU machine: the choice is made before any tensor moves)."""
    return SimpleNamespace(model=model, device=torch.device(device))


def _generation(tmp_path, **options):
    return tiny_config(tmp_path, **options).sections().generation


def test_choose_engine_on_either_side_of_the_cuda_check(tiny_model, tmp_path):
    generation = _generation(tmp_path)
    assert choose_engine(_policy(tiny_model, CUDA), generation)[0] == "static"
    assert choose_engine(_policy(tiny_model, CPU), generation)[0] == "hf"
    # With tools or an environment (an interaction), and with generation_kwargs: hf on CUDA.
    assert choose_engine(_policy(tiny_model, CUDA), generation, interaction=object())[0] == "hf"
    kwargs = _generation(tmp_path, generation_kwargs={"num_beams": 2})
    assert choose_engine(_policy(tiny_model, CUDA), kwargs)[0] == "hf"


def test_choose_engine_keeps_hf_for_models_the_static_engine_cannot_decode(tiny_model, tmp_path):
    generation = _generation(tmp_path)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    name, why = choose_engine(_policy(gpt2, CUDA), generation)
    assert name == "hf" and "gpt2" in why
    # Quantized but not by bitsandbytes' 4-bit layers (here: a config saying so, linears plain).
    tiny_model.config.quantization_config = {"quant_method": "gptq", "bits": 4}
    name, why = choose_engine(_policy(tiny_model, CUDA), generation)
    assert name == "hf" and "quantized" in why
    del tiny_model.config.quantization_config
    # A DoRA adapter: the copy cannot merge it.
    dora = peft.get_peft_model(
        tiny_model, peft.LoraConfig(r=2, target_modules=["q_proj"], use_dora=True)
    )
    name, why = choose_engine(_policy(dora, CUDA), generation)
    assert name == "hf" and "DoRA" in why


def test_choose_engine_gives_lora_and_a_4bit_base_the_static_engine_on_cuda(tmp_path):
    """The static engine reads their layers in place (no second copy), so auto picks it."""
    generation = _generation(tmp_path)
    lora = peft.LoraConfig(r=2, target_modules="all-linear")
    base = quantize_4bit(tiny_random_model(), "nf4", True, torch.float32, torch.device("cpu"))
    for model in (tiny_random_model(), keep_trainable_layout(base)):
        name, why = choose_engine(_policy(peft.get_peft_model(model, lora), CUDA), generation)
        assert (name, why) == (
            "static",
            "auto: the static engine (a Llama-family decoder on a CUDA device)",
        )


def test_options_are_checked_against_what_auto_resolves_to(tmp_path):
    # generation_kwargs need the HF engine: auto resolves there, a named static engine is refused.
    tiny_config(tmp_path, generation_kwargs={"num_beams": 2}).sections()
    with pytest.raises(ConfigError, match="generation_kwargs .* need generation_engine: hf"):
        tiny_config(tmp_path, generation_kwargs={"num_beams": 2}, generation_engine="static")
    # Tools: auto resolves to the HF engine; a named static engine is refused.
    tiny_config(tmp_path, tools=["calculator"]).sections()
    with pytest.raises(ConfigError, match="generation_engine=static does not run tools"):
        tiny_config(tmp_path, tools=["calculator"], generation_engine="static").sections()


def test_the_default_cpu_run_gets_the_hf_engine_and_says_why(tmp_path, capsys):
    trainer = GRPOTrainer("tiny-random", lambda completions, **kw: [0.0] * len(completions),
                          [{"prompt": "hi"}] * 8, args=tiny_config(tmp_path))  # fmt: skip
    assert type(trainer.engine) is HFEngine
    lines = [line for line in capsys.readouterr().out.splitlines() if "rollout engine" in line]
    assert lines == [
        "[groupwise] rollout engine: hf (auto: the HF engine on cpu, where the update dominates "
        "a step and the static engine's second weight copy buys little; docs/gpu.md)"
    ]


def test_static_cuda_graphs_on_a_cpu_is_refused_by_name(tmp_path):
    args = tiny_config(tmp_path, generation_engine="static", static_cuda_graphs=True)
    with pytest.raises(ConfigError, match="static_cuda_graphs=True needs a CUDA device"):
        GRPOTrainer("tiny-random", lambda completions, **kw: [0.0] * len(completions),
                    [{"prompt": "hi"}] * 8, args=args)  # fmt: skip
