"""The optimizer and its schedule: AdamW by TRL's ``optim`` names (bitsandbytes' 8-bit AdamW
against torch's AdamW, paged ones refused off CUDA) and the LR schedule against transformers'
schedules, optimizer step by step."""

import functools

import bitsandbytes as bnb
import pytest
import torch
from transformers import get_scheduler

from groupwise import GRPOConfig
from groupwise.errors import ConfigError
from groupwise.policy.optimizer import (
    OPTIMIZERS,
    Trainable,
    build_optimizer,
    check_optim_device,
    decay_parameter_names,
    lr_factor,
    parameter_groups,
)
from groupwise.runtime.distributed import DistributedContext
from groupwise.sections.run import OPTIM_CHOICES

# groupwise's lr_scheduler_type -> transformers' scheduler of the same curve (groupwise's
# constant warms up: transformers' constant_with_warmup, docs/trl.md).
HF_NAME = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def _trainable(schedule: str, warmup: int, max_steps: int, lr: float = 1e-3) -> Trainable:
    args = GRPOConfig(max_steps=max_steps, warmup_steps=warmup, lr_scheduler_type=schedule,
                      learning_rate=lr, weight_decay=0.0)  # fmt: skip
    sections = args.sections()
    module = torch.nn.Linear(2, 1)
    return Trainable(module, None, sections.optimization, DistributedContext(), lr)


def test_warmup_starts_from_zero_by_hand():
    # 3 warm-up steps of 10, linear: lr * step / 3 while step < 3, then (10 - step) / 7.
    args = GRPOConfig(max_steps=10, warmup_steps=3, lr_scheduler_type="linear")
    factor = lr_factor(args.sections().optimization, 10)
    assert [factor(s) for s in range(5)] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 6 / 7])
    assert factor(10) == 0.0
    cosine = lr_factor(GRPOConfig(max_steps=10, warmup_steps=2, lr_scheduler_type="cosine")
                       .sections().optimization, 10)  # fmt: skip
    # progress (6 - 2) / 8 = 0.5: 0.5 * (1 + cos(pi / 2)) = 0.5
    assert [cosine(0), cosine(1), cosine(2), cosine(6)] == pytest.approx([0.0, 0.5, 1.0, 0.5])
    constant = lr_factor(GRPOConfig(max_steps=10, warmup_steps=4, lr_scheduler_type="constant")
                         .sections().optimization, 10)  # fmt: skip
    assert [constant(s) for s in (0, 1, 3, 4, 9)] == pytest.approx([0.0, 0.25, 0.75, 1.0, 1.0])


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_each_step_uses_and_reports_transformers_rate(schedule, warmup):
    steps, lr = 9, 1e-3
    trainable = _trainable(schedule, warmup, steps, lr)
    reference = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=lr)
    hf = get_scheduler(HF_NAME[schedule], reference, num_warmup_steps=warmup,
                       num_training_steps=steps)  # fmt: skip
    assert trainable.learning_rate == pytest.approx(hf.get_last_lr()[0])  # before any step
    for step in range(steps):
        expected = hf.get_last_lr()[0]  # the rate transformers' step `step` runs at
        used = trainable.optimizer.param_groups[0]["lr"]
        assert used == pytest.approx(expected, abs=1e-15), (schedule, warmup, step)
        if step == 0 and warmup:
            assert used == 0.0  # lr * 0 / warmup
        trainable.module.weight.grad = torch.ones_like(trainable.module.weight)
        trainable.step()
        # what the trainer logs as learning_rate: the rate this step ran at, not the next's
        assert trainable.learning_rate == pytest.approx(expected, abs=1e-15)
        reference.step()
        hf.step()


def _ten_steps(optim: str | type, start: torch.Tensor, grads: list[torch.Tensor]):
    param = torch.nn.Parameter(start.clone())
    hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    make = functools.partial(build_optimizer, optim) if isinstance(optim, str) else optim
    opt = make([param], **hyper)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    return param.detach(), opt.state[param]


def test_adamw8bit_follows_torch_adamw():
    # 64 x 128 = 8192 elements: above bitsandbytes' min_8bit_size (4096), so the states are
    # 8-bit block-wise. Ten steps of the same gradients from the same start.
    torch.manual_seed(0)
    start = torch.randn(64, 128)
    grads = [torch.randn(64, 128) for _ in range(10)]
    torch_adamw, _ = _ten_steps("adamw_torch", start, grads)
    eight_bit, state = _ten_steps("adamw_8bit", start, grads)
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8
    # bitsandbytes' 32-bit AdamW with the same hyper-parameters is torch's, to fp32 rounding:
    # the options mean the same thing; what differs below is the 8-bit states alone.
    full, _ = _ten_steps(bnb.optim.AdamW32bit, start, grads)
    torch.testing.assert_close(full, torch_adamw, rtol=0, atol=1e-6)
    gap, moved = (eight_bit - torch_adamw).abs(), (torch_adamw - start).abs()
    # Measured: the largest gap 0.0024 (2.4% of the 0.1 that ten steps of lr can move a weight),
    # the mean gap 1.2% of the mean distance moved. Tolerances: 5% and 2%.
    assert gap.max() < 0.05 * 10 * 1e-2, gap.max()
    assert gap.mean() < 0.02 * moved.mean(), (gap.mean(), moved.mean())


def test_optim_names_are_the_choices_and_transformers_names():
    from transformers.training_args import OptimizerNames

    assert set(OPTIMIZERS) == set(OPTIM_CHOICES)
    assert set(OPTIMIZERS) <= {name.value for name in OptimizerNames}
    param = torch.nn.Parameter(torch.zeros(4))
    kinds = {
        name: type(build_optimizer(name, [param], 1e-3, (0.9, 0.999), 1e-8, 0.0)).__name__
        for name in OPTIMIZERS
    }
    assert kinds == {
        "adamw_torch": "AdamW", "adamw_torch_fused": "AdamW", "adamw_bnb_8bit": "AdamW8bit",
        "adamw_8bit": "AdamW8bit", "paged_adamw_8bit": "PagedAdamW8bit",
        "paged_adamw_32bit": "PagedAdamW32bit",
    }  # fmt: skip


def test_paged_optimizers_are_refused_off_cuda():
    with pytest.raises(ConfigError, match="optim=paged_adamw_8bit needs a CUDA GPU"):
        check_optim_device("paged_adamw_8bit", torch.device("cpu"))
    check_optim_device("adamw_8bit", torch.device("cpu"))
    check_optim_device("paged_adamw_32bit", torch.device("cuda"))


# --- weight decay: which parameters, as the HF Trainer ------------------------------------------
def _llama_with_biases() -> torch.nn.Module:
    """A tiny Llama with attention and MLP biases, so that biases as well as RMSNorm weights are
    among its parameters."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, attention_bias=True,
                         mlp_bias=True)  # fmt: skip
    return LlamaForCausalLM(config)


def _hf_decay_names(model: torch.nn.Module) -> set[str]:
    from transformers import Trainer

    # An instance method that reads nothing from the instance: no Trainer (or its args) needed.
    return set(Trainer.get_decay_parameter_names(object.__new__(Trainer), model))


@pytest.mark.parametrize("make", ["tiny", "biases", "layernorm"])
def test_decay_names_are_the_hf_trainers(tiny_model, make):
    if make == "tiny":
        model = tiny_model
    elif make == "biases":
        model = _llama_with_biases()
    else:  # an nn.LayerNorm whose parameter names say nothing of a norm
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    names = set(decay_parameter_names(model))
    assert names == _hf_decay_names(model)
    every = {name for name, _ in model.named_parameters()}
    kept = every - names
    if make == "tiny":  # no biases: the two norms of each layer and the final one
        assert kept == {f"model.layers.{i}.{n}.weight" for i in range(2)
                        for n in ("input_layernorm", "post_attention_layernorm")} | {
            "model.norm.weight"}  # fmt: skip
    elif make == "biases":
        assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.1.mlp.down_proj.bias",
                "model.norm.weight"} <= kept  # fmt: skip
        assert all(name.endswith("bias") or "norm" in name for name in kept)
        assert "model.layers.0.self_attn.q_proj.weight" in names
    else:
        assert kept == {"0.bias", "1.weight", "1.bias"}


def test_parameter_groups_split_only_with_weight_decay(tiny_model):
    params = [p for p in tiny_model.parameters() if p.requires_grad]
    single = parameter_groups(tiny_model, 0.0)
    assert isinstance(single, list) and all(isinstance(p, torch.nn.Parameter) for p in single)
    assert [id(p) for p in single] == [id(p) for p in params]  # one group, as before
    opt = build_optimizer("adamw_torch", single, 1e-3, (0.9, 0.999), 1e-8, 0.0)
    assert len(opt.state_dict()["param_groups"]) == 1
    tiny_model.model.norm.weight.requires_grad_(False)  # frozen parameters stay out
    decay, no_decay = parameter_groups(tiny_model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    by_id = {id(p): name for name, p in tiny_model.named_parameters()}
    assert {by_id[id(p)] for p in no_decay["params"]} == {
        f"model.layers.{i}.{n}.weight" for i in range(2)
        for n in ("input_layernorm", "post_attention_layernorm")}  # fmt: skip
    # (the tied lm_head.weight is in HF's names, but named_parameters yields it once, as the
    # embedding)
    hf_names = _hf_decay_names(tiny_model) & set(by_id.values())
    assert {by_id[id(p)] for p in decay["params"]} == hf_names
    only_linear = torch.nn.Linear(3, 3, bias=False)  # nothing undecayed: no empty group
    (group,) = parameter_groups(only_linear, 0.1)
    assert group["params"] == [only_linear.weight]


@pytest.mark.parametrize("optim", ["adamw_torch", "adamw_8bit", "paged_adamw_32bit"])
def test_weight_decay_skips_biases_and_norms(optim):
    if optim.startswith("paged_") and not torch.cuda.is_available():
        pytest.skip("paged optimizers need CUDA")
    device = "cuda" if optim.startswith("paged_") else "cpu"
    model = _llama_with_biases().to(device)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    lr, wd = 0.1, 0.5
    opt = build_optimizer(optim, parameter_groups(model, wd), lr, (0.9, 0.999), 1e-8, wd)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # Adam's update is 0: only the decay moves a weight
    opt.step()
    after = dict(model.named_parameters())
    # Decoupled decay: p <- p * (1 - lr * wd) = 0.95 p on decayed weights; the rest unchanged.
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight"):
        torch.testing.assert_close(after[name].detach(), before[name] * 0.95)
    for name in ("model.layers.0.self_attn.q_proj.bias", "model.layers.1.input_layernorm.weight",
                 "model.norm.weight", "model.layers.0.mlp.up_proj.bias"):  # fmt: skip
        torch.testing.assert_close(after[name].detach(), before[name], rtol=0, atol=0)


def test_trainable_decays_by_name(tiny_model):
    """Trainable builds its optimizer from the module's named parameters: with weight_decay two
    groups (state dicts keep two), without one."""
    args = GRPOConfig(max_steps=2, learning_rate=0.1, weight_decay=0.5)
    trainable = Trainable(tiny_model, None, args.sections().optimization, DistributedContext(),
                          0.1)  # fmt: skip
    assert [g["weight_decay"] for g in trainable.optimizer.param_groups] == [0.5, 0.0]
    assert len(trainable.optimizer_state_dict()["param_groups"]) == 2
    norm = tiny_model.model.norm.weight
    assert any(p is norm for p in trainable.optimizer.param_groups[1]["params"])
    plain = Trainable(tiny_model, None, GRPOConfig(max_steps=2, weight_decay=0.0).sections()
                      .optimization, DistributedContext(), 0.1)  # fmt: skip
    assert len(plain.optimizer.param_groups) == 1


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_resume_with_weight_decay_is_exact(tmp_path, wd):
    """A checkpoint's optimizer state holds both groups; resuming from it continues exactly."""
    from conftest import tiny_config
    from groupwise import GRPOTrainer

    rows = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1)} for i in range(12)]

    def reward(completions, answer, **kwargs):  # stateless: the resumed run scores the same
        return [float(a in c) + 0.1 * len(c) / 20 for c, a in zip(completions, answer, strict=True)]

    def run(folder, max_steps, **extra):
        args = tiny_config(folder, max_steps=max_steps, weight_decay=wd, save_steps=2, **extra)
        trainer = GRPOTrainer("tiny-random", reward, rows, args=args)
        trainer.train()
        return trainer

    full = run(tmp_path / "a", 3)
    run(tmp_path / "b", 2)
    rest = run(tmp_path / "b", 3, resume_from_checkpoint="auto")
    groups = rest.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == ([0.1, 0.0] if wd else [0.0])
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_adamw_torch_fused_is_torchs_fused_kernel_on_a_gpu(monkeypatch):
    """TRL's default optim runs torch's fused AdamW on a GPU (no temporary copy of v, which the
    memory planner then does not count); elsewhere, and for adamw_torch, torch's default."""
    from groupwise.policy import optimizer as optmod

    weights = [torch.nn.Parameter(torch.randn(8, 4))]
    group = [{"params": weights, "weight_decay": 0.0}]
    make = functools.partial(build_optimizer, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=0.0)  # fmt: skip
    assert make("adamw_torch_fused", weights).defaults["fused"] is None  # this CPU
    monkeypatch.setattr(optmod, "_device_type", lambda params: "cuda")
    assert make("adamw_torch_fused", group).defaults["fused"] is True
    assert make("adamw_torch", weights).defaults["fused"] is None

    from groupwise.memory.plan import POLICY_STEP, MemoryOptions, plan_grpo
    from groupwise.memory.shapes import resolve_model_shape

    shape = resolve_model_shape("qwen2.5-1.5b")
    fused = plan_grpo(shape, MemoryOptions(optimizer="adamw_torch_fused", device="cuda"))
    assert POLICY_STEP not in fused
    for optim, device in (("adamw_torch", "cuda"), ("adamw_torch_fused", "cpu")):
        rows = plan_grpo(shape, MemoryOptions(optimizer=optim, device=device))
        assert rows[POLICY_STEP] == rows["policy optimizer states"] // 2  # a copy of v
