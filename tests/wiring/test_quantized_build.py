"""QLoRA's and the 8-bit optimizers' options: both spellings (groupwise's load_in_4bit, ... and
TRL's model_init_kwargs quantization_config), what is refused and why, and the built model."""

import warnings
from pathlib import Path

import bitsandbytes as bnb
import pytest
import torch
from transformers import BitsAndBytesConfig
from transformers.training_args import OptimizerNames

from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.runtime.models import tiny_random_model
from groupwise.runtime.quantization import bnb_config, is_4bit, quantize_4bit
from groupwise.wiring.model import check_quantization

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]
QLORA = dict(use_peft=True, load_in_4bit=True)


def _reward(completion_ids, **kwargs):
    return [len(ids) / 10 for ids in completion_ids]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"load_in_4bit": True}, "load_in_4bit=True needs use_peft=True"),
        ({**QLORA, "generation_engine": "vllm"},
         "load_in_4bit=True with generation_engine=vllm is not supported"),
        ({**QLORA, "algorithm": "ppo"}, "load_in_4bit=True works with algorithm=grpo only"),
        ({**QLORA, "data_parallel": "fsdp"},
         "load_in_4bit=True with data_parallel=fsdp is not supported"),
        ({"optim": "adamw_8bit", "data_parallel": "fsdp"},
         "optim=adamw_8bit with data_parallel=fsdp is not supported"),
        ({**QLORA, "save_merged_model": True},
         "save_merged_model=True with load_in_4bit=True is not supported"),
        ({**QLORA, "bnb_4bit_quant_type": "int4"},
         "bnb_4bit_quant_type='int4' is not one of ['nf4', 'fp4']"),
        ({"optim": "adafactor"}, "optim='adafactor' is not supported: groupwise trains with "
         "AdamW, one of ['adamw_torch', 'adamw_torch_fused', 'adamw_bnb_8bit', 'adamw_8bit', "
         "'paged_adamw_8bit', 'paged_adamw_32bit']"),
        ({"model_init_kwargs": {"quantization_config": {"load_in_8bit": True}}},
         "load_in_8bit=True is not supported: an 8-bit base is not supported"),
        ({"model_init_kwargs": {"quantization_config": {"quant_method": "gptq"}}},
         "groupwise quantises through bitsandbytes only"),
        ({"model_init_kwargs": {"quantization_config": 4}},
         "must be a transformers BitsAndBytesConfig or a mapping, got 4"),
        ({"model_init_kwargs": "bf16"}, "model_init_kwargs must be a mapping"),
        ({"use_peft": True, "load_in_4bit": False,
          "model_init_kwargs": {"quantization_config": {"load_in_4bit": True}}},
         "quantization_config load_in_4bit=True means load_in_4bit=True, but load_in_4bit="),
    ],
)  # fmt: skip
def test_quantization_options_are_refused_with_the_reason(options, message):
    with pytest.raises(ConfigError) as info:
        GRPOConfig(**options)
    assert message in str(info.value)


def test_trl_quantization_config_sets_groupwise_options():
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.bfloat16)  # fmt: skip
    with pytest.warns(UserWarning, match=r"model_init_kwargs=\{'device_map'"):
        # TRL's scripts add a k-bit device map: groupwise places the model itself.
        args = GRPOConfig(use_peft=True, model_init_kwargs={"quantization_config": config,
                                                            "device_map": {"": 0}})  # fmt: skip
    assert (args.load_in_4bit, args.bnb_4bit_quant_type, args.use_bnb_nested_quant) == (
        True, "nf4", True)  # fmt: skip
    # Its to_dict() form (YAML) and BitsAndBytesConfig's own default quant type (fp4).
    as_dict = BitsAndBytesConfig(load_in_4bit=True).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is ignored
        args = GRPOConfig(use_peft=True, model_init_kwargs={"quantization_config": as_dict})
    assert (args.load_in_4bit, args.bnb_4bit_quant_type, args.use_bnb_nested_quant) == (
        True, "fp4", False)  # fmt: skip
    assert "model_init_kwargs" not in args.to_dict()  # translated, not a field


def test_optim_takes_transformers_names_and_enums():
    assert GRPOConfig(optim=OptimizerNames.ADAMW_8BIT).optim == "adamw_8bit"
    assert GRPOConfig(optim="paged_adamw_32bit").optim == "paged_adamw_32bit"
    assert GRPOConfig().optim == "adamw_torch_fused"  # TRL's default (torch >= 2.8)


def test_model_init_kwargs_alone_loads_a_4bit_base(tmp_path):
    # A saved model, TRL's spelling only: transformers quantises it as it is read, to the
    # same layers the in-memory quantisation of the built-in model gives.
    folder = tmp_path / "model"
    tiny_random_model().save_pretrained(folder)
    quant = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}
    args = tiny_config(tmp_path, model=str(folder), use_peft=True, lora_r=4, lora_alpha=8,
                       model_init_kwargs={"quantization_config": quant})  # fmt: skip
    from groupwise.runtime.models import smollm2_tokenizer

    trainer = GRPOTrainer(str(folder), _reward, ROWS, args=args,
                          processing_class=smollm2_tokenizer())  # fmt: skip
    base = trainer.model.get_base_model()
    assert is_4bit(base) and base.model.layers[0].mlp.up_proj.base_layer.compute_dtype == (
        torch.float32)  # the run's dtype on a CPU  # fmt: skip
    assert not any(p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" not in n)
    ours = quantize_4bit(tiny_random_model(), "nf4", True, torch.float32, torch.device("cpu"))
    loaded = dict(base.named_modules())
    for name, module in ours.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            assert torch.equal(loaded[name].base_layer.weight.data, module.weight.data), name
    trainer.train()  # and it trains
    assert trainer.log_history[-1]["step"] == 2


def test_paged_optimizer_on_cpu_is_refused_before_loading(tmp_path):
    args = tiny_config(tmp_path, optim="paged_adamw_8bit", device="cpu")
    with pytest.raises(ConfigError, match="optim=paged_adamw_8bit needs a CUDA GPU"):
        GRPOTrainer("tiny-random", _reward, ROWS, args=args)


def test_a_4bit_model_given_without_an_adapter_is_refused(tmp_path):
    # With one (a PeftModel, peft_config or use_peft) it trains: tests/wiring/test_model_object.py
    model = quantize_4bit(tiny_random_model(), "nf4", False, torch.float32, torch.device("cpu"))
    from groupwise.runtime.models import smollm2_tokenizer

    with pytest.raises(ConfigError, match="the model given holds 4-bit"):
        GRPOTrainer(model, _reward, ROWS, args=tiny_config(tmp_path),
                    processing_class=smollm2_tokenizer())  # fmt: skip


def test_missing_bitsandbytes_is_named_before_loading(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "bitsandbytes" else real(n, *a)
    )
    with pytest.raises(ConfigError, match=r'optim=adamw_bnb_8bit needs .*"groupwise\[quant\]"'):
        check_quantization(GRPOConfig(optim="adamw_bnb_8bit"), torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"load_in_4bit=True needs the bitsandbytes package"):
        check_quantization(GRPOConfig(**QLORA), torch.device("cpu"))


def test_bnb_config_is_qloras():
    config = bnb_config("nf4", True, torch.bfloat16)
    assert config.load_in_4bit and config.bnb_4bit_use_double_quant
    assert (config.bnb_4bit_quant_type, config.bnb_4bit_compute_dtype) == ("nf4", torch.bfloat16)


def test_the_command_line_spelling_of_model_init_kwargs():
    overrides = {
        "use_peft": "true",
        "model_init_kwargs": "{quantization_config: {load_in_4bit: true, "
        "bnb_4bit_quant_type: nf4, bnb_4bit_use_double_quant: true}}",
        "optim": "adamw_bnb_8bit",
    }
    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    config = GRPOConfig.from_yaml(demo, overrides)
    assert (config.load_in_4bit, config.bnb_4bit_quant_type, config.use_bnb_nested_quant) == (
        True, "nf4", True)  # fmt: skip
    assert config.optim == "adamw_bnb_8bit"


def test_auto_resolves_a_4bit_base_to_the_static_engine_on_cuda():
    # The static engine runs bitsandbytes' own 4-bit layers in place (no 16-bit copy), whether
    # transformers or groupwise quantised the model.
    from groupwise.rollout.static import supports
    from groupwise.sections.generation import resolve_generation_engine

    model = quantize_4bit(tiny_random_model(), "nf4", True, torch.float32, torch.device("cpu"))
    assert supports(model) is None
    engine, _ = resolve_generation_engine("auto", device_type="cuda", static_unsupported=None)
    assert engine == "static"
    assert GRPOConfig(**QLORA).generation_engine == "auto"  # the default is accepted


def test_a_qlora_run_trains_with_the_static_engine_reading_the_4bit_layers(tmp_path):
    from groupwise.rollout.static import StaticEngine

    args = tiny_config(tmp_path, **QLORA, lora_r=4, lora_alpha=8, generation_engine="static")
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    engine = trainer.engine
    assert isinstance(engine, StaticEngine) and engine.decoder.in_place
    assert hasattr(engine.decoder.layers[0].down.parts[0][0].weight, "quant_state")
    trainer.train()
    assert trainer.log_history[-1]["step"] == 2


def test_eval_and_chat_load_a_qlora_adapter_on_its_4bit_base(tmp_path, monkeypatch):
    # A QLoRA run's saved adapter: with load_in_4bit, groupwise eval/chat put it unmerged on the
    # 4-bit base it was trained on and compute exactly the trained model's logits; without, it
    # is merged into the unquantised base, which is another model.
    from groupwise.cli import main
    from groupwise.runtime.precision import Precision
    from groupwise.wiring.model import load_for_generation

    args = tiny_config(tmp_path, **QLORA, lora_r=4, lora_alpha=8, lora_dropout=0.0,
                       max_steps=2, learning_rate=5e-2)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    trainer.train()
    run = str(tmp_path / "run")
    fp32 = Precision(torch.float32, False)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    loaded, _ = load_for_generation(run, args, torch.device("cpu"), fp32)
    assert is_4bit(loaded) and not loaded.training
    with torch.no_grad():
        trained = trainer.model.eval()(input_ids=ids).logits
        # Exactly: the same 4-bit layers in the layout they trained in (bitsandbytes' CPU
        # inference repack alone differs by about 3e-3 here).
        assert torch.equal(loaded(input_ids=ids).logits, trained)
        merged, _ = load_for_generation(run, GRPOConfig(output_dir=str(tmp_path / "m")),
                                        torch.device("cpu"), fp32)  # fmt: skip
        assert not is_4bit(merged)
        assert (merged(input_ids=ids).logits - trained).abs().max() > 0.1
    # Both commands load through it.
    seen = []
    import groupwise.wiring.model as build_model

    def spy(name, args, device, precision):
        model, tokenizer = load_for_generation(name, args, device, precision)
        if name == run:  # (the adapter's base is loaded through it too)
            seen.append(type(model).__name__ == "PeftModelForCausalLM" and is_4bit(model))
        return model, tokenizer

    monkeypatch.setattr(build_model, "load_for_generation", spy)
    # `groupwise eval RUN` / `chat RUN` read the run's config.yaml (use_peft, load_in_4bit).
    few = ["--max_completion_length", "2", "--num_eval_prompts", "2"]
    assert main(["eval", run, *few, "--eval_output", str(tmp_path / "eval.json")]) == 0
    assert main(["chat", run, *few]) == 0
    assert seen == [True, True]
