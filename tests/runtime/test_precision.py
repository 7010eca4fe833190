"""Precision modes (groupwise.runtime.precision): what the options resolve to on each device, that
fp32 master weights with bf16 autocast keep every small update while pure bf16 weights lose them,
and the GPU-facing pieces that run the same arithmetic on this CPU (reference offload, host syncs
per pass, CUDA-synchronised timers, TF32, RNG state across devices)."""

from __future__ import annotations

import warnings

import pytest
import torch

from conftest import tiny_config
from groupwise import GRPOTrainer
from groupwise.config.grpo_config import GRPOConfig
from groupwise.errors import ConfigError
from groupwise.policy import update
from groupwise.policy.weights import OffloadedWeights, frozen_copy
from groupwise.runtime import precision
from groupwise.runtime.precision import PrecisionWarning, resolve_precision
from groupwise.trainer import checkpoints as ckpt
from groupwise.trainer.base import PhaseTimer

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture()
def bf16_gpu(monkeypatch):
    """Resolve as on a bf16-capable GPU (an A100/H100), without one."""
    monkeypatch.setattr(precision, "bf16_capable", lambda device: device.type == "cuda")


# -- what the options resolve to ------------------------------------------------------------------


def test_cpu_defaults_to_fp32_without_autocast():
    p = resolve_precision("auto", None, "auto", CPU)
    assert (p.weights, p.autocast, p.generation_only, p.name) == (
        torch.float32, False, False, "fp32"
    )  # fmt: skip


def test_gpu_defaults_to_fp32_master_weights_with_bf16_autocast(bf16_gpu):
    p = resolve_precision("auto", None, "auto", CUDA)
    assert (p.weights, p.trained, p.autocast, p.name) == (
        torch.float32, torch.float32, True, "bf16 mixed"
    )  # fmt: skip
    # An explicit choice wins over auto in both directions.
    assert not resolve_precision("auto", False, "auto", CUDA).autocast
    assert resolve_precision("auto", True, "auto", CPU).autocast


def test_lora_on_a_gpu_stores_the_frozen_base_in_bf16(bf16_gpu):
    p = resolve_precision("auto", None, "auto", CUDA, use_peft=True)
    assert (p.weights, p.trained, p.autocast) == (torch.bfloat16, torch.float32, True)
    assert resolve_precision("auto", None, "auto", CPU, use_peft=True).weights == torch.float32


def test_pure_bf16_only_when_asked():
    p = resolve_precision("bfloat16", None, "auto", CPU)
    assert (p.weights, p.trained, p.autocast, p.name) == (
        torch.bfloat16, torch.bfloat16, False, "bf16 weights"
    )  # fmt: skip


def test_bf16_generation_alone_only_when_the_update_is_fp32(bf16_gpu):
    assert resolve_precision("auto", None, "bfloat16", CPU).generation_only
    # Under autocast (or bf16 weights) generation already runs in bf16, like the update.
    assert not resolve_precision("auto", None, "bfloat16", CUDA).generation_only
    assert not resolve_precision("bfloat16", False, "bfloat16", CPU).generation_only


def test_bf16_autocast_takes_auto_from_yaml_and_the_command_line():
    assert GRPOConfig.from_dict({"bf16_autocast": "auto"}, source="cli").bf16_autocast is None
    assert GRPOConfig.from_dict({"bf16_autocast": "true"}, source="cli").bf16_autocast is True
    with pytest.raises(ConfigError, match="bf16_autocast"):
        GRPOConfig.from_dict({"bf16_autocast": "sometimes"}, source="cli")


def test_trl_bf16_means_mixed_precision_not_bf16_weights():
    config = GRPOConfig.from_dict({"bf16": "true"}, source="cli")
    assert (config.dtype, config.bf16_autocast) == ("auto", True)
    p = resolve_precision(config.dtype, config.bf16_autocast, config.generation_dtype, CPU)
    assert (p.weights, p.autocast) == (torch.float32, True)


# -- updates kept and lost ----------------------------------------------------------------------


def _changed_fractions(tmp_path, **options) -> tuple[dict[str, float], list[str]]:
    """Train 3 steps at learning_rate 1e-6 (groupwise's default) with a dense reward; per trained
    tensor, the fraction of its elements that some optimizer step changed (compared step by
    step, not start to end: an element AdamW moves down and back up can land on its start
    value), and the warnings raised."""

    def length(completions, **kwargs):  # differs within every group: non-zero advantages
        return [float(len(c)) for c in completions]

    config = tiny_config(tmp_path, learning_rate=1e-6, max_steps=3, max_completion_length=8,
                         save_steps=0, **options)  # fmt: skip
    rows = [{"prompt": f"Say something about {i}."} for i in range(8)]
    moved: dict[str, torch.Tensor] = {}

    class PerStep:
        def on_step_begin(self, args, state, control, model, **kwargs):
            self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

        def on_step_end(self, args, state, control, model, **kwargs):
            for name, param in model.named_parameters():
                if param.requires_grad:
                    changed = param.detach() != self.before[name]
                    moved[name] = moved[name] | changed if name in moved else changed

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = GRPOTrainer(config.model, length, rows, args=config, callbacks=[PerStep()])
        trainer.train()
    fractions = {name: mask.float().mean().item() for name, mask in moved.items()}
    return fractions, [str(w.message) for w in caught if w.category is PrecisionWarning]


def test_mixed_precision_keeps_every_small_update_pure_bf16_loses_them(tmp_path):
    fp32, fp32_warnings = _changed_fractions(tmp_path / "fp32", bf16_autocast=False)
    mixed, mixed_warnings = _changed_fractions(tmp_path / "mixed", bf16_autocast=True)
    pure, pure_warnings = _changed_fractions(tmp_path / "pure", dtype="bfloat16",
                                             bf16_autocast=False)  # fmt: skip
    assert set(fp32) == set(mixed) == set(pure) and len(fp32) >= 10
    # fp32 master weights: the updates reach every element of every trained tensor, as in fp32.
    assert min(fp32.values()) >= 0.99, fp32
    assert min(mixed.values()) >= 0.99, mixed
    # bf16 weights: a 1e-6 step is below half a bf16 ulp of most weights (init std 0.02, ulp
    # ~1e-4) and of every norm weight (1.0, ulp 2^-7): those never change.
    norms = [n for n in pure if "norm" in n]
    projections = [n for n in pure if n.endswith(("proj.weight",))]
    assert norms and projections
    assert all(pure[n] == 0.0 for n in norms), {n: pure[n] for n in norms}
    assert all(pure[n] < 0.1 for n in projections), {n: pure[n] for n in projections}
    assert fp32_warnings == mixed_warnings == []
    assert len(pure_warnings) == 1 and "no fp32 master copy" in pure_warnings[0]
    assert "learning_rate=1e-06" in pure_warnings[0]


def test_lora_adapters_stay_fp32_on_a_bf16_base(tmp_path):
    config = tiny_config(tmp_path, use_peft=True, dtype="bfloat16", max_steps=1)
    rows = [{"prompt": "Hi"}] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)  # a frozen base loses nothing
        trainer = GRPOTrainer(config.model, lambda completions, **k: [0.0] * len(completions),
                              rows, args=config)  # fmt: skip
    dtypes = {n: p.dtype for n, p in trainer.model.named_parameters()}
    adapters = [n for n in dtypes if "lora_" in n]
    base = [n for n in dtypes if "lora_" not in n]
    assert adapters and all(dtypes[n] == torch.float32 for n in adapters)
    assert base and all(dtypes[n] == torch.bfloat16 for n in base)
    assert all(dtypes[n] == torch.float32 for n, p in trainer.model.named_parameters()
               if p.requires_grad)  # fmt: skip


# -- loading, attention, TF32 -----------------------------------------------------------------


def test_saved_models_are_read_straight_into_their_dtype(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from groupwise.runtime import models

    models.tiny_random_model(seed=0).save_pretrained(tmp_path / "m")
    models.smollm2_tokenizer().save_pretrained(tmp_path / "m")
    seen = []
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    model, _ = models.load_model_and_tokenizer(str(tmp_path / "m"), dtype=torch.bfloat16,
                                               attn_implementation="eager")  # fmt: skip
    assert seen[0]["dtype"] == torch.bfloat16 and "device_map" not in seen[0]  # CPU: no map
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "eager"


def test_attn_implementation_is_chosen_and_flash_attention_refused_without_a_gpu(tmp_path):
    rows = [{"prompt": "Hi"}] * 4
    config = tiny_config(tmp_path, attn_implementation="eager", max_steps=1)
    trainer = GRPOTrainer(config.model, lambda completions, **k: [0.0] * len(completions), rows,
                          args=config)  # fmt: skip
    assert trainer.model.config._attn_implementation == "eager"
    config = tiny_config(tmp_path, attn_implementation="flash_attention_2")
    with pytest.raises(ConfigError, match="flash_attention_2 needs a CUDA GPU"):
        GRPOTrainer(config.model, lambda completions, **k: [0.0] * len(completions), rows,
                    args=config)  # fmt: skip
    with pytest.raises(ConfigError, match="attn_implementation='flash'"):
        GRPOConfig(attn_implementation="flash")


def test_tf32_is_switched_for_cuda_only():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        precision.configure_tf32(True, CPU)
        assert torch.get_float32_matmul_precision() == "highest"  # CPU: untouched
        precision.configure_tf32(True, CUDA)  # sets flags only; needs no GPU
        assert torch.get_float32_matmul_precision() == "high"
        precision.configure_tf32(False, CUDA)
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


# -- the reference model ------------------------------------------------------------------------


def test_frozen_copy_copies_each_tensor_once_and_keeps_ties(tiny_model):
    clone = frozen_copy(tiny_model, CPU)
    for (name, a), (_, b) in zip(tiny_model.named_parameters(), clone.named_parameters(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
        assert not b.requires_grad
    assert clone.lm_head.weight is clone.model.embed_tokens.weight  # tied stays tied
    buffers = dict(clone.named_buffers())
    assert buffers and all(v.data_ptr() != dict(tiny_model.named_buffers())[k].data_ptr()
                           for k, v in buffers.items())  # fmt: skip


def test_offloaded_weights_visit_the_device_once_per_block_and_come_back(tiny_model):
    module = frozen_copy(tiny_model, CPU)
    offloaded = OffloadedWeights(module, CPU)
    host = {id(t): t.data_ptr() for t, _ in offloaded.tensors}
    with offloaded.on_device():
        assert offloaded.visits == 1
    assert offloaded.visits == 1
    # Back on the very host memory they started in (nothing was copied back).
    assert all(t.data_ptr() == host[id(t)] for t, _ in offloaded.tensors)
    # Tied weights are one tensor: moved once.
    assert len(offloaded.tensors) == len({id(t) for t, _ in offloaded.tensors})


def test_the_reference_is_gathered_once_per_step_over_every_micro_batch(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, beta=0.1, per_device_train_batch_size=2,
                         gradient_accumulation_steps=4, max_steps=1)  # fmt: skip
    rows = [{"prompt": f"Count to {i}."} for i in range(8)]
    trainer = GRPOTrainer(config.model, lambda completions, **k: [float(len(c)) for c in
                          completions], rows, args=config)  # fmt: skip
    reference = trainer.policy.reference
    entered = []
    real = reference.weights

    def counting():
        entered.append(1)
        return real()

    reference.weights = counting
    sizes = []
    real_split = update.micro_batches_of
    monkeypatch.setattr(update, "micro_batches_of",
                        lambda *a: sizes.append(real_split(*a)) or sizes[-1])  # fmt: skip
    logs = trainer.train_step()
    assert len(sizes) == 1 and len(sizes[0]) >= 4  # several micro-batches ...
    assert len(entered) == 1 and logs["kl"] >= 0.0  # ... one visit of the reference


# -- host syncs, timers ---------------------------------------------------------------------


def test_an_update_pass_reads_device_floats_once_not_per_micro_batch(tmp_path, monkeypatch):
    """Every read of a floating-point tensor into Python (``item``, ``tolist``, ``float``,
    ``bool``) is a host sync on a GPU. Counted over one update pass, they must not grow with
    the number of micro-batches."""

    def reads(micro_batch_rows: int) -> int:
        config = tiny_config(tmp_path / str(micro_batch_rows), beta=0.1,
                             per_device_train_batch_size=micro_batch_rows,
                             gradient_accumulation_steps=8 // micro_batch_rows)  # fmt: skip
        rows = [{"prompt": f"Count to {i}."} for i in range(2)]
        trainer = GRPOTrainer(config.model, lambda completions, **k: [float(len(c)) for c in
                              completions], rows, args=config)  # fmt: skip
        rollout = trainer.engine.generate(trainer.prompts.next().prompt_ids, 4)
        advantages = torch.linspace(-1, 1, rollout.completion_ids.shape[0])
        inputs = update.prepare(trainer.policy, rollout, advantages)
        assert len(inputs.micro_batches) == 8 // micro_batch_rows
        count = [0]
        for name in ("item", "tolist", "__float__", "__bool__"):
            real = getattr(torch.Tensor, name)

            def counted(self, *args, _real=real, **kwargs):
                if self.is_floating_point():
                    count[0] += 1
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)
        update.update(trainer.policy, inputs, trainer.loss)
        monkeypatch.undo()
        return count[0]

    one, eight = reads(8), reads(1)
    assert eight == one, (one, eight)


def test_phase_timer_waits_for_the_gpu_before_reading_the_clock(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timer = PhaseTimer(CUDA)
    timer.mark("generation")
    timer.mark("update")
    assert calls == [CUDA, CUDA, CUDA]
    PhaseTimer(CPU).mark("generation")
    assert len(calls) == 3  # no CUDA call on a CPU run


# -- RNG state across devices -------------------------------------------------------------------


def test_rng_state_never_opens_cuda_on_every_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)

    def forbidden(*args, **kwargs):
        raise AssertionError("get_rng_state_all opens a context on every visible GPU")

    monkeypatch.setattr(torch.cuda, "get_rng_state_all", forbidden)
    state = ckpt.rng_state({"sampling": torch.Generator().manual_seed(0)})
    assert "cuda" not in state and state["generator_devices"] == {"sampling": "cpu"}


def test_a_generator_saved_on_another_device_is_reseeded_reproducibly():
    saved = ckpt.rng_state({"sampling": torch.Generator().manual_seed(3)})
    saved["generator_devices"] = {"sampling": "cuda"}  # as a GPU run writes it
    draws = []
    for _ in range(2):
        generator = torch.Generator().manual_seed(99)
        notes = ckpt.set_rng_state(saved, {"sampling": generator})
        draws.append(torch.rand(4, generator=generator))
        assert len(notes) == 1 and "saved on cuda and this run samples on cpu" in notes[0]
    assert torch.equal(draws[0], draws[1])  # the same continuation on every resume
    # A CUDA generator's 16-byte state in a checkpoint that predates generator_devices.
    older = dict(saved, generators={"sampling": torch.zeros(16, dtype=torch.uint8)})
    del older["generator_devices"]
    notes = ckpt.set_rng_state(older, {"sampling": torch.Generator()})
    assert len(notes) == 1 and "do not carry over" in notes[0]
    # Same device: restored exactly, no note.
    same = ckpt.rng_state({"sampling": torch.Generator().manual_seed(5)})
    generator = torch.Generator().manual_seed(0)
    assert ckpt.set_rng_state(same, {"sampling": generator}) == []
    assert torch.equal(torch.rand(3, generator=generator),
                       torch.rand(3, generator=torch.Generator().manual_seed(5)))  # fmt: skip


def test_tf32_none_leaves_torchs_setting_as_it_is():
    # TrainingArguments' tf32=None (the default): torch's own matmul precision stays.
    from groupwise.runtime.precision import configure_tf32

    cuda = torch.device("cuda")  # the setting is only touched for CUDA; none is needed to set it
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    try:
        torch.set_float32_matmul_precision("highest")
        configure_tf32(None, cuda)
        assert torch.get_float32_matmul_precision() == "highest"
        configure_tf32(True, cuda)
        assert torch.get_float32_matmul_precision() == "high"
        assert GRPOConfig().tf32 is None
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
