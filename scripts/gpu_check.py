"""The prepared GPU check: what the CPU tests cannot show, on one CUDA GPU, in a few minutes.

    bash scripts/gpu_check.sh                                  # on the GPU machine
    python scripts/gpu_check.py --device cpu --quick --out DIR    # its CPU path (a test runs it)

Each check records ``passed`` and its numbers; a failing check does not stop the others. The
summary goes to DIR/gpu_check.json (rewritten after every check, so a run cut short still leaves
one) and is printed as a table at the end; the exit status is 1 if any check failed.

1. precision: fp32, bf16 mixed (fp32 weights, bf16 autocast: TRL's bf16=True) and pure bf16
   weights, 5 GRPO steps each at learning_rate 1e-6: per tensor family, the share of elements
   that some step moved (fp32 and mixed >= 0.99) and the share that differ from the weights
   before training (pure bf16: far lower, norm weights not at all).
2. learning: under bf16 mixed precision the mean reward of a target-token task rises within
   20 steps (first 5 steps against the last 5).
3. sdpa_left_padding: a left-padded batch through SDPA in bf16 (autocast and bf16 weights) gives
   finite logits at every real position, close to fp32, and padding does not change fp32 logits.
4. memory: peak ``torch.cuda.max_memory_reserved`` of real steps against the memory planner's
   prediction for the same settings (groupwise.memory.measure, a fresh process), with the HF
   engine and with the static engine.
5. collectives: groupwise's collective helpers, with host and device tensors, in a one-rank
   process group made with the backend groupwise's own init path chooses on CUDA.
6. generation: tokens/s of the rollout engine the trainer builds, fp32 and bf16 autocast, the
   static engine eager, compiled (torch.compile's default mode) and replayed as CUDA graphs (on
   CUDA only), and vLLM when both the package and a groupwise engine for it exist.
7. static_engine: the static engine's greedy tokens and sampling log-probs against the HF
   engine's on the same fp32 weights.
8. step_time: whole bf16-mixed GRPO steps with the HF engine and with the static engine, the
   trainer's own generation / update / step timers side by side.
9. vllm: where vllm imports, its engine against the HF engine.

``--suite real`` runs instead the real-size stages of scripts/gpu_check_real.py (Qwen3-8B QLoRA
at the documented configuration under a 22 GiB limit, a Qwen2.5-1.5B full fine-tune with the
8-bit AdamW, the static against the HF engine decoding the 4-bit model, TRL's GRPOTrainer side by
side, activation offloading), in that order, under 7 minutes on one H100: a stage starts only when
its estimated time (gpu_check_real.ESTIMATE_S) fits in what is left of ``--budget-s``, and one that
cannot run fails. The versions of torch, transformers, peft, bitsandbytes, accelerate, trl and
datasets are printed at start and recorded (``environment.packages``).

The model has SmolLM2-135M's shape with random weights (``--quick``: the tiny-random shape). Its
tokenizer is SmolLM2's where groupwise can produce it offline (it is read from the demo model's
GGUF, which does not travel to the GPU machine), else a synthetic one built here: one token per
ASCII character, SmolLM2's special tokens at their ids, filler tokens up to SmolLM2's vocabulary
size, and a ChatML chat template. No check depends on what the tokens mean.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import os
import shutil
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before transformers is imported: no hub lookups (the GPU machine has no network) and no
# progress bars in the log.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this tree's groupwise, installed or not
sys.path.insert(0, str(ROOT / "scripts"))  # gpu_check_real, also when imported from elsewhere

import gpu_check_real  # noqa: E402

# SmolLM2-135M's config.json, with random weights.
SMOLLM2_SHAPE = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
    rope_theta=100000.0, rms_norm_eps=1e-5, initializer_range=0.041666666666666664,
    tie_word_embeddings=True,
)  # fmt: skip
# groupwise.runtime.models.tiny_random_model's shape.
TINY_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=49152, max_position_embeddings=1024,
    tie_word_embeddings=True,
)  # fmt: skip
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)  # as SmolLM2's

MODES = {
    "fp32": dict(dtype="float32", bf16_autocast=False),
    "bf16_mixed": dict(dtype="float32", bf16_autocast=True),
    "bf16_pure": dict(dtype="bfloat16", bf16_autocast=False),
}
# Tensor families by the substring of the parameter name; the first match wins.
FAMILIES = {
    "attention": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "embedding": ("embed_tokens", "lm_head"),
    "norm": ("norm",),
}
MOVED_FAMILIES = ("attention", "mlp", "norm")  # what fp32 and mixed must move (>= 0.99)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each check is: the GPU sizes, or the CPU rehearsal's (``--quick``)."""

    shape: dict
    precision_steps: int
    precision_completion: int
    learning_steps: int
    learning_rate: float
    learning_temperature: float
    sdpa_lengths: tuple[int, ...]
    memory: dict
    generation_tokens: int
    generation_repeats: int  # timed generations per engine; tokens/s is their median
    step_time: dict  # the step_time check's run: prompts, group size, new tokens, steps


GPU_SIZES = Sizes(
    shape=SMOLLM2_SHAPE, precision_steps=5, precision_completion=32, learning_steps=20,
    learning_rate=1e-4, learning_temperature=0.5, sdpa_lengths=(1, 2, 7, 33, 100, 257, 512, 512),
    memory=dict(batch=16, group_size=8, prompt_len=128, completion_len=128, beta=0.04),
    generation_tokens=128, generation_repeats=3,
    step_time=dict(prompts=8, group_size=8, new_tokens=128, steps=6),
)  # fmt: skip
QUICK_SIZES = Sizes(
    shape=TINY_SHAPE, precision_steps=5, precision_completion=16, learning_steps=12,
    learning_rate=3e-3, learning_temperature=0.1, sdpa_lengths=(1, 3, 9, 17, 32),
    memory=dict(batch=8, group_size=4, prompt_len=64, completion_len=16, beta=0.04),
    generation_tokens=16, generation_repeats=1,
    step_time=dict(prompts=4, group_size=4, new_tokens=8, steps=3),
)  # fmt: skip
MEMORY_BAND = (0.5, 2.0)  # measured / predicted within this: the planner is usable


# -- the model, the tokenizer and the trainer's options -------------------------------------------


def synthetic_tokenizer(vocab_size: int):
    """A tokenizer that needs no file: one token per printable ASCII character, SmolLM2's
    special tokens at SmolLM2's ids (0-2), filler tokens up to ``vocab_size`` (a random model
    samples every id, and each must decode), and a ChatML chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(specials + list(string.printable))}
    vocab.update({f"<w{i}>": i for i in range(len(vocab), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
        pad_token="<|im_end|>", unk_token="<|endoftext|>",
    )  # fmt: skip
    tokenizer.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
        "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    return tokenizer


def load_tokenizer(choice: str, vocab_size: int) -> tuple[Any, str]:
    """``choice``: a folder, ``smollm2``, ``synthetic``, or ``auto`` (SmolLM2's when groupwise
    can produce it offline, else synthetic)."""
    if choice not in ("auto", "smollm2", "synthetic"):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(choice), f"folder {choice}"
    if choice != "synthetic":
        try:
            from groupwise.runtime.models import smollm2_tokenizer

            return smollm2_tokenizer(), "smollm2"
        except Exception as err:  # noqa: BLE001 - the GPU machine has no GGUF: fall back
            if choice == "smollm2":
                raise
            print(f"[gpu_check] SmolLM2 tokenizer unavailable ({type(err).__name__}); "
                  "using the synthetic one")  # fmt: skip
    return synthetic_tokenizer(vocab_size), "synthetic"


def build_model_folder(folder: Path, shape: dict, tokenizer, device: torch.device) -> dict:
    """A seeded random Llama of ``shape`` and the tokenizer, saved as a Hugging Face folder (what
    every check loads, as a user's checkpoint would be)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, **SPECIAL_IDS)
    torch.manual_seed(0)
    with torch.device(device):  # initialising 135M parameters on the GPU takes no time
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    rope = getattr(config, "rope_parameters", None) or {}
    info = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "vocab": config.vocab_size,
        "rope_theta": rope.get("rope_theta", getattr(config, "rope_theta", None)),
    }
    del model
    return info


def grpo_fields() -> set[str]:
    from groupwise import GRPOConfig

    return {f.name for f in dataclasses.fields(GRPOConfig)}


def grpo_config(ns: argparse.Namespace, model: Path, out: Path, **options: Any):
    """GRPOConfig for a check. Options this version of groupwise lacks are left out (and
    listed in the summary), so the script runs on either side of an options change."""
    from groupwise import GRPOConfig

    values = dict(
        model=str(model), device=ns.device, output_dir=str(out), disable_tqdm=True, seed=0,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=16,
        max_prompt_length=64, beta=0.0, save_steps=0, num_eval_prompts=0,
        attn_implementation="sdpa",
        # the settings the checks' thresholds were measured with, where TRL's defaults (which
        # GRPOConfig follows) differ: the per-sequence loss, a constant rate, no recomputation,
        # a metrics row per step
        loss_type="grpo", lr_scheduler_type="constant", gradient_checkpointing=False,
        logging_steps=1,
    )  # fmt: skip
    values.update(options)
    fields = grpo_fields()
    missing = sorted(k for k in values if k not in fields)
    ns.missing_options.update(missing)
    return GRPOConfig(**{k: v for k, v in values.items() if k in fields})


def lower_half_reward(prompts, completions, completion_ids, **kwargs):
    """The share of completion tokens whose id is in the lower half of the vocabulary: about
    0.5 for a random model and different for every completion, so every step's advantages,
    and so its gradients, are non-zero (the precision check's dense reward)."""
    half = SMOLLM2_SHAPE["vocab_size"] // 2
    return [sum(t < half for t in ids) / max(len(ids), 1) for ids in completion_ids]


def prompt_rows(n: int) -> list[dict[str, str]]:
    return [{"prompt": f"Problem {i}: what is {i} plus {2 * i}?"} for i in range(n)]


def family(name: str) -> str:
    for fam, keys in FAMILIES.items():
        if any(k in name for k in keys):
            return fam
    return "other"


def tf32_state() -> dict[str, Any]:
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Give the GPU memory of the last check back, so the next starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- the checks ----------------------------------------------------------------------------------


class MovedEachStep:
    """A callback marking every element that some optimizer step changed (the weights after a
    step against those before it). Comparing only the final weights with the initial ones
    under-counts: an element can move and come back, most of all a norm weight at exactly 1.0,
    where fp32's grid is coarsest (6e-8 below, 1.2e-7 above, against AdamW steps of about the
    learning rate)."""

    def __init__(self) -> None:
        self.before: dict[str, torch.Tensor] = {}
        self.moved: dict[str, torch.Tensor] = {}

    def on_step_begin(self, args, state, control, model=None, **kwargs) -> None:
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_step_end(self, args, state, control, model=None, **kwargs) -> None:
        for name, param in model.named_parameters():
            step = param.detach() != self.before[name]
            self.moved[name] = step if name not in self.moved else self.moved[name] | step
        self.before = {}


def by_family(masks: dict[str, torch.Tensor]) -> tuple[dict[str, float], dict[str, float]]:
    """Per tensor family: the share of its elements set in ``masks``, and the lowest share of
    any one tensor of it."""
    counts: dict[str, list[int]] = {}
    lowest: dict[str, float] = {}
    for name, mask in masks.items():
        fam, hits = family(name), int(mask.sum())
        total = counts.setdefault(fam, [0, 0])
        total[0] += hits
        total[1] += mask.numel()
        lowest[fam] = min(lowest.get(fam, 1.0), hits / mask.numel())
    shares = {f: round(hits / n, 4) for f, (hits, n) in counts.items()}
    return shares, {f: round(v, 4) for f, v in lowest.items()}


def check_precision(ns, model: Path, scratch: Path) -> dict:
    from groupwise import GRPOTrainer

    steps = ns.sizes.precision_steps
    result: dict[str, Any] = {"steps": steps, "learning_rate": 1e-6}
    for mode, options in MODES.items():
        args = grpo_config(ns, model, scratch / f"precision-{mode}", learning_rate=1e-6,
                           max_steps=steps, num_generations=8, per_device_train_batch_size=16,
                           max_completion_length=ns.sizes.precision_completion,
                           **options)  # fmt: skip
        tracker = MovedEachStep()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = GRPOTrainer(str(model), lower_half_reward, prompt_rows(16), args=args,
                                  callbacks=[tracker])  # fmt: skip
            # The weights as loaded, in their own dtype, for the trained ones to be compared with.
            before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            trainer.train()
            history = trainer.log_history
        final = {n: p.detach() != before[n] for n, p in trainer.model.named_parameters()}
        changed, changed_lowest = by_family(final)
        moved, moved_lowest = by_family(tracker.moved)
        grad_norms = [row["grad_norm"] for row in history if "grad_norm" in row]
        result[mode] = {
            "precision": getattr(getattr(trainer, "precision", None), "name", "?"),
            "weights_dtype": str(next(trainer.model.parameters()).dtype),
            "attn_implementation": getattr(trainer.model.config, "_attn_implementation", None),
            "tf32": tf32_state(),
            "fraction_changed": changed,  # final weights != the weights before train()
            "min_tensor_fraction_changed": changed_lowest,
            "fraction_moved_in_some_step": moved,
            "min_tensor_fraction_moved_in_some_step": moved_lowest,
            "mean_grad_norm": round(sum(grad_norms) / max(len(grad_norms), 1), 4),
            "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:160]}"
                                for w in caught if "bfloat16" in str(w.message)}),
        }  # fmt: skip
        del trainer, before, final, tracker
        release(ns.torch_device)
    # fp32 master weights keep every update; bf16 weights lose the ones under half a bf16 step.
    full = all(result[m]["fraction_moved_in_some_step"].get(f, 0.0) >= 0.99
               for m in ("fp32", "bf16_mixed") for f in MOVED_FAMILIES)  # fmt: skip
    pure_low = all(result["bf16_pure"]["fraction_changed"].get(f, 1.0) < 0.5
                   for f in MOVED_FAMILIES)  # fmt: skip
    result["passed"] = full and pure_low
    shown = MOVED_FAMILIES + ("embedding",)
    moved_text = "; ".join(
        f"{m} " + "/".join(f"{result[m]['fraction_moved_in_some_step'].get(f, float('nan')):.3f}"
                           for f in shown)
        for m in MODES
    )  # fmt: skip
    norms_text = ", ".join(f"{m} {result[m]['fraction_changed'].get('norm', float('nan')):.3f}"
                           for m in MODES)  # fmt: skip
    result["summary"] = (f"moved in some step ({'/'.join(shown)}): {moved_text}; "
                         f"norms changed at the end: {norms_text}")  # fmt: skip
    return result


class TargetToken:
    """Reward: the share of completion tokens equal to one token, the most frequent one of the
    first batch scored (the trainer tests' task). A random model's most frequent token is
    sampled often enough at a low temperature for every group to vary, and one token's logit is
    quick to raise."""

    __name__ = "target_token"

    def __init__(self) -> None:
        self.target: int | None = None

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        if self.target is None:
            flat = [t for ids in completion_ids for t in ids]
            self.target = max(set(flat), key=flat.count)
        return [sum(t == self.target for t in ids) / max(len(ids), 1) for ids in completion_ids]


def check_learning(ns, model: Path, scratch: Path) -> dict:
    from groupwise import GRPOTrainer

    sizes = ns.sizes
    steps, lr, temperature = sizes.learning_steps, sizes.learning_rate, sizes.learning_temperature
    args = grpo_config(ns, model, scratch / "learning", learning_rate=lr, max_steps=steps,
                       num_generations=8, per_device_train_batch_size=32,
                       max_completion_length=16, temperature=temperature,
                       **MODES["bf16_mixed"])  # fmt: skip
    trainer = GRPOTrainer(str(model), TargetToken(), prompt_rows(32), args=args)
    trainer.train()
    history = [row["reward"] for row in trainer.log_history if "reward" in row]
    precision = getattr(getattr(trainer, "precision", None), "name", "?")
    del trainer
    release(ns.torch_device)
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    return {
        "passed": last >= first + 0.1, "precision": precision, "steps": steps,
        "learning_rate": lr, "temperature": temperature, "first5_reward": round(first, 4),
        "last5_reward": round(last, 4), "rewards": [round(r, 4) for r in history],
        "summary": f"{precision}: reward {first:.3f} (first 5 steps) -> {last:.3f} (last 5) "
                   f"in {steps} steps at lr {lr:g}, temperature {temperature:g}",
    }  # fmt: skip


# bf16 rounding through 30 random layers moves logits by a few percent of their spread on average
# (3% under autocast, 11% with bf16 weights and activations, measured on a CPU); a masking or
# padding error gives errors the size of the logits themselves.
SDPA_TOLERANCE = 0.25  # mean |difference| / std of the fp32 logits


def check_sdpa_left_padding(ns, model: Path, scratch: Path) -> dict:
    from groupwise.rollout import left_pad
    from groupwise.runtime.models import load_model_and_tokenizer

    device = ns.torch_device
    net, _ = load_model_and_tokenizer(str(model), dtype=torch.float32, device=device,
                                      attn_implementation="sdpa")  # fmt: skip
    net.eval()
    lengths = ns.sizes.sdpa_lengths
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, net.config.vocab_size, (n,), generator=generator).tolist()
               for n in lengths]  # fmt: skip
    ids, mask = left_pad(prompts, pad_id=SPECIAL_IDS["pad_token_id"])
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as groupwise's prefill numbers them
    real = mask.bool()

    def padded_and_alone(module, numerics: Callable[[], Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded batch's logits, and |padded - each prompt run alone, unpadded| at every
        real position (what left padding must not change beyond rounding)."""

        def forward(rows: slice, width: int) -> torch.Tensor:
            out = module(input_ids=ids[rows, -width:], attention_mask=mask[rows, -width:],
                         position_ids=positions[rows, -width:])  # fmt: skip
            return out.logits.float()

        with torch.no_grad(), numerics():
            padded = forward(slice(None), ids.shape[1])
            gaps = [(forward(slice(i, i + 1), n)[0] - padded[i, -n:]).abs().flatten()
                    for i, n in enumerate(lengths)]  # fmt: skip
        return padded, torch.cat(gaps)

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    # The fp32 reference in full fp32: TF32 (on by default in groupwise runs) would blur it.
    saved_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        fp32, fp32_gaps = padded_and_alone(net, contextlib.nullcontext)
        runs = {"bf16_autocast": padded_and_alone(net, autocast)}
        runs["bf16_weights"] = padded_and_alone(net.to(torch.bfloat16), contextlib.nullcontext)
    finally:
        torch.set_float32_matmul_precision(saved_precision)
    scale = float(fp32[real].std())
    out: dict[str, Any] = {
        "lengths": list(lengths), "fp32_logit_std": round(scale, 4),
        "tolerance_mean_abs_over_std": SDPA_TOLERANCE,
        "fp32": {"finite": bool(torch.isfinite(fp32[real]).all()),
                 "padded_vs_alone_max_abs_diff": float(f"{float(fp32_gaps.max()):.3g}")},
    }  # fmt: skip
    passed = out["fp32"]["finite"] and float(fp32_gaps.max()) <= 1e-3 * max(scale, 1.0)
    for name, (logits, gaps) in runs.items():
        diff = (logits - fp32)[real].abs()
        out[name] = {
            "finite": bool(torch.isfinite(logits[real]).all()),
            "max_abs_diff_vs_fp32": round(float(diff.max()), 4),
            "mean_abs_diff_vs_fp32": round(float(diff.mean()), 5),
            "padded_vs_alone_max_abs_diff": round(float(gaps.max()), 4),
            "padded_vs_alone_mean_abs_diff": round(float(gaps.mean()), 5),
        }
        passed = (passed and out[name]["finite"]
                  and max(float(diff.mean()), float(gaps.mean())) <= SDPA_TOLERANCE * scale)
    out["passed"] = passed
    mixed, pure = out["bf16_autocast"], out["bf16_weights"]
    out["summary"] = (
        f"finite (fp32/autocast/bf16 weights): {out['fp32']['finite']}/{mixed['finite']}/"
        f"{pure['finite']}; |bf16 - fp32| mean/max: autocast {mixed['mean_abs_diff_vs_fp32']}/"
        f"{mixed['max_abs_diff_vs_fp32']}, bf16 weights {pure['mean_abs_diff_vs_fp32']}/"
        f"{pure['max_abs_diff_vs_fp32']} (logit std {scale:.3f}); padded vs alone max: fp32 "
        f"{out['fp32']['padded_vs_alone_max_abs_diff']:.2g}, autocast "
        f"{mixed['padded_vs_alone_max_abs_diff']}"
    )  # fmt: skip
    del net
    release(device)
    return out


def check_memory(ns, model: Path, scratch: Path) -> dict:
    """Peak memory of 2 real GRPO steps against the planner, with the default (HF) engine and
    with the static engine, whose own weight copy the planner counts."""
    from groupwise.memory.measure import run_measurement
    from groupwise.memory.plan import MemoryOptions
    from groupwise.memory.units import human_bytes

    sizes = ns.sizes.memory
    what = ("torch.cuda.max_memory_reserved" if ns.torch_device.type == "cuda"
            else "peak RSS minus RSS before the model")  # fmt: skip
    out: dict[str, Any] = {"settings": sizes, "measured": what, "expected_band": list(MEMORY_BAND)}
    passed, summaries = True, []
    for engine in ("hf", "static"):
        options = MemoryOptions(**sizes, generation_engine=engine)
        (result,) = run_measurement(str(model), options, algorithms=("grpo",), steps=2,
                                    device=ns.device, timeout=300)  # fmt: skip
        if "error" in result:
            out[engine] = {"error": result["error"]}
            passed = False
            summaries.append(f"{engine}: {result['error'][:160]}")
            continue
        ratio = result["ratio"]
        out[engine] = {
            # The measuring child runs GRPOConfig's defaults: bf16 mixed on a bf16 GPU.
            "trainer_precision": "dtype auto, bf16_autocast auto",
            "device": result["device"], "weights_dtype": result["dtype"],
            "generation_dtype": result.get("generation_dtype"),
            "prompt_len": result["prompt_len"], "completion_len": result["completion_len"],
            "measured_bytes": result["measured_bytes"],
            "predicted_bytes": result["predicted_bytes"],
            "predicted_components": result.get("predicted_components"),
            "measured_over_predicted": round(ratio, 3),
        }  # fmt: skip
        passed = passed and MEMORY_BAND[0] <= ratio <= MEMORY_BAND[1]
        measured, predicted = result["measured_bytes"], result["predicted_bytes"]
        summaries.append(f"{engine} {human_bytes(measured)} measured / "
                         f"{human_bytes(predicted)} predicted = {ratio:.2f}")  # fmt: skip
    out["passed"] = passed
    out["summary"] = f"{what}: " + "; ".join(summaries)
    return out


class _Recorded(Exception):
    """Raised by the stand-in for init_process_group once it has seen the backend."""


def groupwise_backend(device_type: str) -> tuple[str, str]:
    """The backend groupwise's init path gives a run on ``device_type``, and where it was read.

    ``backend_for`` when runtime/distributed.py has it; else init_distributed is run as a two-rank
    world with init_process_group replaced by a stand-in that records its backend and stops."""
    import torch.distributed as dist

    from groupwise.runtime import distributed as gd

    if hasattr(gd, "backend_for"):
        return gd.backend_for(device_type), "groupwise.runtime.distributed.backend_for"
    seen: dict[str, Any] = {}

    def record(backend=None, **kwargs):
        seen["backend"] = backend
        raise _Recorded

    saved_env = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    real = dist.init_process_group
    os.environ.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    dist.init_process_group = record
    try:
        gd.init_distributed(device_type)
    except _Recorded:
        pass
    finally:
        dist.init_process_group = real
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if "backend" not in seen:
        raise RuntimeError("groupwise.runtime.distributed.init_distributed chose no backend")
    return seen["backend"], "groupwise.runtime.distributed.init_distributed"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_collectives(ns, model: Path, scratch: Path) -> dict:
    """One rank in the process group groupwise makes for a run on this device; every collective
    helper called with host tensors (counts, flags, metrics, pickled objects) and, on CUDA, a
    device tensor. DistributedContext.enabled is False for one rank, so a subclass turns the
    collective path on."""
    import torch.distributed as dist

    from groupwise.algo.advantages import global_group_advantages, group_advantages
    from groupwise.runtime import distributed as gd

    device = ns.torch_device
    cuda = device.type == "cuda"
    backend, source = groupwise_backend(device.type)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    options = {"device_id": torch.device("cuda", 0)} if cuda else {}
    if cuda:
        torch.cuda.set_device(0)

    class OneRankEnabled(gd.DistributedContext):
        @property
        def enabled(self) -> bool:
            return True

    ctx = OneRankEnabled()
    calls: dict[str, str] = {}

    def attempt(name: str, call: Callable[[], Any], expected: Callable[[Any], bool]) -> None:
        try:
            value = call()
            calls[name] = "ok" if expected(value) else f"wrong result: {value!r}"[:200]
        except Exception as err:  # noqa: BLE001 - recorded; the next call still runs
            calls[name] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 0.75, 1.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    local = group_advantages(rewards, groups, scale="batch")
    dist.init_process_group(backend=backend, rank=0, world_size=1, **options)
    try:
        attempt("all_reduce_sum(cpu)", lambda: gd.all_reduce_sum(torch.tensor([3, 4]), ctx),
                lambda v: v.device.type == "cpu" and v.tolist() == [3, 4])  # fmt: skip
        if cuda:
            attempt("all_reduce_sum(cuda)",
                    lambda: gd.all_reduce_sum(torch.tensor([3.0, 4.0], device=device), ctx),
                    lambda v: v.device.type == "cuda" and v.tolist() == [3.0, 4.0])  # fmt: skip
        attempt("max_over_ranks", lambda: gd.max_over_ranks(5, ctx), lambda v: v == 5)
        attempt("any_rank", lambda: (gd.any_rank(True, ctx), gd.any_rank(False, ctx)),
                lambda v: v == (True, False))  # fmt: skip
        metrics = {"step": 3, "loss": 0.5, "completions/max_length": 7.0}
        attempt("reduce_metrics", lambda: gd.reduce_metrics(metrics, ctx),
                lambda v: v == metrics)  # fmt: skip
        attempt("all_gather_objects", lambda: gd.all_gather_objects({"a": 1}, ctx),
                lambda v: v == [{"a": 1}])  # fmt: skip
        attempt("concat_over_ranks", lambda: gd.concat_over_ranks(([1, 2], [3.5]), ctx),
                lambda v: tuple(v) == ([1, 2], [3.5]))  # fmt: skip
        attempt("global_group_advantages(batch)",
                lambda: global_group_advantages(rewards, groups, "batch", ctx),
                lambda v: torch.allclose(v, local))  # fmt: skip
        attempt("barrier", lambda: gd.barrier(ctx), lambda v: True)
    finally:
        dist.destroy_process_group()
    out: dict[str, Any] = {"backend": backend, "backend_from": source, "calls": calls}
    if cuda:
        # What the mixed backend is for: NCCL alone refuses host tensors.
        os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group(backend="nccl", rank=0, world_size=1, **options)
        try:
            dist.all_reduce(torch.tensor([1]))
            out["nccl_alone_with_a_host_tensor"] = "accepted"
        except Exception as err:  # noqa: BLE001 - the expected refusal, recorded
            out["nccl_alone_with_a_host_tensor"] = f"raises {type(err).__name__}"
        finally:
            dist.destroy_process_group()
    ok = sum(v == "ok" for v in calls.values())
    out["passed"] = ok == len(calls)
    failures = [f"{k}: {v}" for k, v in calls.items() if v != "ok"]
    out["summary"] = f"backend {backend} ({source}): {ok}/{len(calls)} calls ok"
    if failures:
        out["summary"] += "; " + "; ".join(failures)
    if "nccl_alone_with_a_host_tensor" in out:
        out["summary"] += f"; nccl alone + host tensor: {out['nccl_alone_with_a_host_tensor']}"
    return out


def vllm_option() -> tuple[dict[str, Any] | None, str]:
    """The GRPOConfig option that selects a vLLM engine, when vLLM and a groupwise engine for it
    are both installed; else why not."""
    if importlib.util.find_spec("vllm") is None:
        return None, "not available (no vllm package)"
    if importlib.util.find_spec("groupwise.rollout.vllm") is None:
        return None, "not available (no groupwise.rollout.vllm)"
    fields = grpo_fields()
    for name in ("use_vllm", "rollout_engine", "generation_engine", "engine"):
        if name in fields:
            return {name: True if name == "use_vllm" else "vllm"}, f"selected with {name}"
    return None, "groupwise.rollout.vllm exists but no GRPOConfig option selects it"


def check_generation(ns, model: Path, scratch: Path) -> dict:
    """Tokens/s of the engine the trainer builds (build_rollout.build_engine), on 8 prompts of 48-62
    tokens x 8 completions each, after a short warm-up (kernels, allocator): the median of
    ``generation_repeats`` timed generations, each one's tokens and seconds kept beside it."""
    from groupwise import GRPOTrainer

    device = ns.torch_device
    new_tokens = ns.sizes.generation_tokens
    generator = torch.Generator().manual_seed(0)
    half = SMOLLM2_SHAPE["vocab_size"] // 2
    prompt_ids = [torch.randint(3, half, (48 + 2 * i,), generator=generator).tolist()
                  for i in range(8)]  # fmt: skip
    out: dict[str, Any] = {"prompts": 8, "per_prompt": 8, "max_new_tokens": new_tokens}
    engines: dict[str, dict[str, Any]] = {
        "hf_fp32": MODES["fp32"], "hf_bf16_autocast": MODES["bf16_mixed"],
        "static_bf16": {**MODES["bf16_mixed"], "generation_engine": "static",
                        "static_compile": False, "static_cuda_graphs": False},
        "static_bf16_compiled": {**MODES["bf16_mixed"], "generation_engine": "static",
                                 "static_compile": True, "static_cuda_graphs": False},
    }  # fmt: skip
    if device.type == "cuda":  # a CPU cannot capture graphs
        engines["static_bf16_graphs"] = {**MODES["bf16_mixed"], "generation_engine": "static",
                                         "static_compile": False, "static_cuda_graphs": True}
    else:
        out["static_bf16_graphs"] = "not run: CUDA graphs need a CUDA device"
    vllm, vllm_note = vllm_option()
    if vllm is not None:
        engines["vllm_bf16_autocast"] = {**MODES["bf16_mixed"], **vllm}
    else:
        out["vllm"] = vllm_note
    passed = True
    for name, options in engines.items():
        try:
            args = grpo_config(ns, model, scratch / f"generation-{name}", max_steps=1,
                               num_generations=8, per_device_train_batch_size=64,
                               max_completion_length=new_tokens, **options)  # fmt: skip
            trainer = GRPOTrainer(str(model), lower_half_reward, prompt_rows(8), args=args)
            engine = trainer.engine
            params = getattr(engine, "params", None)  # the HF engine's; others: their own
            warm = params and dataclasses.replace(params, max_completion_length=8)
            engine.generate(prompt_ids[:2], 2, params=warm)
            if name.endswith("compiled"):  # compiled at the measured shapes, timed apart
                start = time.perf_counter()
                engine.generate(prompt_ids, 8)
                synchronize(device)
                out[f"{name}_compile_s"] = round(time.perf_counter() - start, 1)
            timings = []  # (tokens, seconds) per timed generation, in order
            for _ in range(ns.sizes.generation_repeats):
                synchronize(device)
                start = time.perf_counter()
                rollout = engine.generate(prompt_ids, 8)
                synchronize(device)
                timings.append((int(rollout.completion_mask.sum()), time.perf_counter() - start))
            rate = statistics.median(tokens / seconds for tokens, seconds in timings)
            tokens = min(tokens for tokens, _ in timings)
            out[name] = {
                "engine": type(engine).__name__, "tokens": [t for t, _ in timings],
                "seconds": [round(s, 3) for _, s in timings],
                "tokens_per_second": round(rate, 1),
                "tf32": tf32_state(),
            }  # fmt: skip
            passed = passed and tokens > 0
            del trainer, engine, rollout
        except Exception as err:  # noqa: BLE001 - recorded; the other engines still run
            out[name] = {"error": f"{type(err).__name__}: {err}"[:400]}
            passed = False
        release(device)
    out["passed"] = passed
    rates = [f"{name} {out[name].get('tokens_per_second', 'error')}" for name in engines]
    out["summary"] = "tokens/s: " + ", ".join(rates)
    eager = out.get("static_bf16", {}).get("tokens_per_second")
    for name in ("static_bf16_compiled", "static_bf16_graphs"):
        entry = out.get(name)
        rate = entry.get("tokens_per_second") if isinstance(entry, dict) else None
        if eager and rate:
            out[f"{name}_over_eager"] = round(rate / eager, 3)
            out["summary"] += f"; {name} / eager {out[f'{name}_over_eager']}x"
    if "vllm" in out:
        out["summary"] += f"; vllm {out['vllm']}"
    return out


STEP_TIME_WARMUP = 2  # steps left out of the step_time medians (first kernels, allocator)
STEP_PHASES = ("generation", "update", "step")  # the trainer's time/<phase> metrics


def check_step_time(ns, model: Path, scratch: Path) -> dict:
    """Whole GRPO steps under bf16 mixed precision (the default on a bf16 GPU) with the HF engine
    and with the static engine (eager: static_compile's auto mode compiles only in long runs),
    side by side: the median over the steps after the first ``STEP_TIME_WARMUP`` of the trainer's
    own phase timers (``time/generation``, ``time/update``, ``time/step``), and the static
    engine's step time as a ratio of the HF engine's."""
    from groupwise import GRPOTrainer

    size = ns.sizes.step_time
    out: dict[str, Any] = {**size, "precision": "bf16 mixed"}
    passed = True
    for engine in ("hf", "static"):
        try:
            args = grpo_config(ns, model, scratch / f"step-time-{engine}", max_steps=size["steps"],
                               num_generations=size["group_size"],
                               per_device_train_batch_size=size["prompts"] * size["group_size"],
                               max_completion_length=size["new_tokens"], learning_rate=1e-6,
                               generation_engine=engine, **MODES["bf16_mixed"])  # fmt: skip
            prompts = prompt_rows(size["prompts"] * size["steps"])
            trainer = GRPOTrainer(str(model), lower_half_reward, prompts, args=args)
            trainer.train()
            rows = [row for row in trainer.log_history if "time/step" in row]
            kept = rows[STEP_TIME_WARMUP:] or rows
            medians = {
                phase: round(statistics.median(row[f"time/{phase}"] for row in kept), 3)
                for phase in STEP_PHASES
            }
            out[engine] = {
                "engine": type(trainer.engine).__name__, "steps_logged": len(rows),
                "median_s": medians,
                "tokens_per_step": round(statistics.median(
                    row.get("completions/mean_length", 0.0) * size["prompts"] * size["group_size"]
                    for row in kept)),
            }  # fmt: skip
            if len(rows) != size["steps"]:
                out[engine]["error"] = f"{len(rows)} of {size['steps']} steps logged"
                passed = False
            del trainer
        except Exception as err:  # noqa: BLE001 - recorded; the other engine still runs
            out[engine] = {"error": f"{type(err).__name__}: {err}"[:400]}
            passed = False
        release(ns.torch_device)
    out["passed"] = passed
    if passed:
        hf, static = out["hf"]["median_s"], out["static"]["median_s"]
        out["static_over_hf"] = {
            phase: round(static[phase] / hf[phase], 3) if hf[phase] > 0 else None
            for phase in STEP_PHASES
        }
        out["summary"] = (
            f"median s/step (generation + update), steps {STEP_TIME_WARMUP + 1}-{size['steps']}: "
            f"hf {hf['step']:.2f} ({hf['generation']:.2f} + {hf['update']:.2f}), static "
            f"{static['step']:.2f} ({static['generation']:.2f} + {static['update']:.2f}); "
            f"static / hf whole step {out['static_over_hf']['step']}"
        )
    else:
        out["summary"] = "failed: " + "; ".join(
            f"{name} {out[name]['error']}" for name in ("hf", "static") if "error" in out[name]
        )
    return out


def check_static_engine(ns, model: Path, scratch: Path) -> dict:
    """The static engine against the HF engine on the same fp32 weights with TF32 off: greedy
    completions (the share of rows with identical tokens; near-ties may flip a few) and the
    largest gap between the static engine's sampling log-probs and the trainer's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from groupwise import GRPOConfig
    from groupwise.policy.logprobs import completion_logprobs
    from groupwise.rollout import HFEngine, plain_sampling
    from groupwise.rollout.static import StaticEngine

    device = ns.torch_device
    previous = torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None
    if previous is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    try:
        policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
        tokenizer = AutoTokenizer.from_pretrained(model)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        generator = torch.Generator().manual_seed(1)
        prompts = [torch.randint(3, 1000, (20 + 3 * i,), generator=generator).tolist()
                   for i in range(4)]  # fmt: skip
        greedy = plain_sampling(32, 0.0)
        reference = HFEngine(policy, tokenizer, greedy).generate(prompts, [3, 1, 2, 2])
        static = StaticEngine(policy, tokenizer, greedy, dtype=torch.float32,
                              eos_check_every=GRPOConfig.static_eos_check_every,
                              cuda_graphs=GRPOConfig.static_cuda_graphs)  # fmt: skip
        out = static.generate(prompts, [3, 1, 2, 2])
        same = [torch.equal(a, b) for a, b in zip(out.completion_ids, reference.completion_ids,
                                                   strict=True)]  # fmt: skip
        sampled = static.generate(prompts, 2, plain_sampling(32, 1.0),
                                  torch.Generator(device=device).manual_seed(0))  # fmt: skip
        with torch.no_grad():
            trainer, _ = completion_logprobs(
                policy, sampled.prompt_ids, sampled.prompt_mask, sampled.completion_ids,
                sampled.completion_mask, group_size=2,
            )  # fmt: skip
        gap = float((sampled.sampling_logprobs - trainer)[sampled.completion_mask.bool()]
                    .abs().max())  # fmt: skip
    finally:
        if previous is not None:
            torch.backends.cuda.matmul.allow_tf32 = previous
    share = sum(same) / len(same)
    passed = share >= 0.75 and gap < 1e-3
    return {
        "passed": passed, "greedy_rows_identical": share, "max_logprob_gap": gap,
        "summary": f"greedy rows identical {share:.2f}, max log-prob gap {gap:.2e}",
    }  # fmt: skip


def chi_square(a: list[int], b: list[int]) -> dict[str, float]:
    """Two-sample chi-square test of two samples of tokens: bins are the tokens with an expected
    count of at least 5 in both samples, the rest pooled into one bin. scipy's p-value when
    scipy is installed, else the Wilson-Hilferty normal approximation of the chi-square tail."""
    import collections
    import math

    ca, cb = collections.Counter(a), collections.Counter(b)
    na, nb = len(a), len(b)
    share_a = na / (na + nb)
    bins, other = [], [0, 0]
    for token in set(ca) | set(cb):
        total = ca[token] + cb[token]
        if min(total * share_a, total * (1 - share_a)) >= 5:
            bins.append((ca[token], cb[token]))
        else:
            other[0], other[1] = other[0] + ca[token], other[1] + cb[token]
    if sum(other):
        bins.append(tuple(other))
    stat = 0.0
    for x, y in bins:
        total = x + y
        for observed, expected in ((x, total * share_a), (y, total * (1 - share_a))):
            stat += (observed - expected) ** 2 / expected if expected else 0.0
    dof = max(len(bins) - 1, 1)
    try:
        from scipy.stats import chi2

        p = float(chi2.sf(stat, dof))
    except ImportError:
        z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        p = 0.5 * math.erfc(z / math.sqrt(2))
    return {"chi2": round(stat, 3), "dof": dof, "p_value": p}


def ks_two_sample(a: list[float], b: list[float]) -> dict[str, float]:
    """Two-sample Kolmogorov-Smirnov test (scipy's when installed, else the statistic with the
    asymptotic p-value)."""
    import math

    try:
        from scipy.stats import ks_2samp

        result = ks_2samp(a, b)
        return {"ks": float(result.statistic), "p_value": float(result.pvalue)}
    except ImportError:
        pass
    xs = sorted(set(a) | set(b))
    sa, sb = sorted(a), sorted(b)

    def cdf(sample: list[float], x: float) -> float:
        import bisect

        return bisect.bisect_right(sample, x) / len(sample)

    d = max(abs(cdf(sa, x) - cdf(sb, x)) for x in xs)
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return {"ks": d, "p_value": min(max(p, 0.0), 1.0) if d > 0 else 1.0}


def check_vllm(ns, model: Path, scratch: Path) -> dict:
    """The vLLM engine against the HF engine on the same weights: the first-token distribution of
    one prompt (a few hundred samples each, two-sample chi-square) before and after a sync of a
    perturbed policy, the completion-length distributions (two-sample KS) and tokens/s of both.
    Runs only where vllm imports; elsewhere it passes with the reason recorded."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure: recorded, not run
        reason = f"not run: vllm does not import ({type(err).__name__}: {err})"[:300]
        return {"passed": True, "skipped": reason, "summary": reason}
    if ns.torch_device.type != "cuda":
        return {"passed": True, "skipped": "not run: needs CUDA", "summary": "not run: CPU"}
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from groupwise import GRPOConfig
    from groupwise.rollout import HFEngine, eos_token_ids, plain_sampling
    from groupwise.rollout.vllm import build_vllm_engine

    device = ns.torch_device
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 1000, (32,), generator=generator).tolist()
    samples = 400
    # A temperature at which the first token's distribution has mass on few enough tokens for
    # a chi-square test with a few hundred samples (a random model's is nearly uniform at 1).
    with torch.no_grad():
        logits = policy(torch.tensor([prompt], device=device)).logits[0, -1].float()
    temperature = 1.0
    def top20_mass(t: float) -> float:
        return float(torch.softmax(logits / t, -1).topk(20).values.sum())

    # Never below 0.01: vLLM would silently sample at 0.01 (the vLLM engine refuses lower).
    while temperature / 2 >= 0.01 and top20_mass(temperature) < 0.5:
        temperature /= 2
    first = plain_sampling(1, temperature)
    hf = HFEngine(policy, tokenizer, first, torch.Generator(device=device).manual_seed(1),
                  records_logprobs=True)  # fmt: skip
    engine = build_vllm_engine(
        policy, tokenizer, first, eos_token_ids(policy, tokenizer), device=device,
        weights_dtype=torch.float32, seed=0, gpu_memory_utilization=0.3, max_model_len=512,
        enable_prefix_caching=GRPOConfig.vllm_enable_prefix_caching,
        enable_sleep_mode=GRPOConfig.vllm_enable_sleep_mode,
    )  # fmt: skip
    out: dict[str, Any] = {"temperature": temperature, "samples": samples}

    def first_tokens(e) -> list[int]:
        return e.generate([prompt], samples).completion_ids[:, 0].tolist()

    vllm_before = first_tokens(engine)
    out["first_token_before_sync"] = chi_square(first_tokens(hf), vllm_before)
    with torch.no_grad():  # a perturbed policy, pushed with sync
        for param in policy.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    engine.sync(policy)
    vllm_after = first_tokens(engine)
    out["first_token_after_sync"] = chi_square(first_tokens(hf), vllm_after)
    out["vllm_before_vs_after"] = chi_square(vllm_before, vllm_after)
    # Completion lengths and speed: 8 prompts x 16 completions at the run's temperature.
    long = plain_sampling(ns.sizes.generation_tokens, 1.0)
    prompts = [torch.randint(3, 1000, (24 + 4 * i,), generator=generator).tolist()
               for i in range(8)]  # fmt: skip
    lengths, speed = {}, {}
    for name, e in (("hf", hf), ("vllm", engine)):
        e.generate(prompts[:2], 2, params=plain_sampling(8, 1.0))  # warm-up
        synchronize(device)
        start = time.perf_counter()
        rollout = e.generate(prompts, 16, params=long)
        synchronize(device)
        seconds = time.perf_counter() - start
        lengths[name] = rollout.lengths.float().tolist()
        speed[name] = round(sum(lengths[name]) / seconds, 1)
    out["lengths"] = {**ks_two_sample(lengths["hf"], lengths["vllm"]),
                      "mean_hf": sum(lengths["hf"]) / len(lengths["hf"]),
                      "mean_vllm": sum(lengths["vllm"]) / len(lengths["vllm"])}  # fmt: skip
    out["tokens_per_second"] = speed
    same = [out["first_token_before_sync"], out["first_token_after_sync"], out["lengths"]]
    out["passed"] = all(t["p_value"] > 1e-3 for t in same) and (
        out["vllm_before_vs_after"]["p_value"] < 1e-3
    )
    out["summary"] = (
        f"first token p={out['first_token_before_sync']['p_value']:.3g} before, "
        f"{out['first_token_after_sync']['p_value']:.3g} after sync (changed: p="
        f"{out['vllm_before_vs_after']['p_value']:.3g}); lengths KS p="
        f"{out['lengths']['p_value']:.3g}; tokens/s hf {speed['hf']}, vllm {speed['vllm']}"
    )
    del engine, hf, policy
    release(device)
    return out


CHECKS: dict[str, Callable[..., dict]] = {
    "precision": check_precision,
    "learning": check_learning,
    "sdpa_left_padding": check_sdpa_left_padding,
    "memory": check_memory,
    "collectives": check_collectives,
    "generation": check_generation,
    "static_engine": check_static_engine,
    "step_time": check_step_time,
    "vllm": check_vllm,
}
# --suite real: the real-size stages (scripts/gpu_check_real.py), each given this module.
REAL_CHECKS: dict[str, Callable[..., dict]] = {
    name: (lambda stage: lambda ns, model, scratch: stage(ns, scratch, sys.modules[__name__]))(fn)
    for name, fn in gpu_check_real.STAGES.items()
}
SUITES = {"standard": CHECKS, "real": REAL_CHECKS}


# -- the run -------------------------------------------------------------------------------------


def environment(ns) -> dict[str, Any]:
    import transformers

    import groupwise

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "groupwise": getattr(groupwise, "__version__", "?"),
        "groupwise_from": str(Path(groupwise.__file__).parent),
        "device": "cpu",
        # What gpu_check.sh installed from the carried wheels (.whl), if anything.
        "installed_from_wheels": os.environ.get("GPU_CHECK_INSTALLED", "").split(),
        "packages": gpu_check_real.package_versions(),
    }
    if ns.torch_device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=props.name, capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            bf16_supported=torch.cuda.is_bf16_supported(),
        )  # fmt: skip
    info["git_commit"] = None  # the tree may travel without its .git
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        git = ["git", "rev-parse", "HEAD"]
        done = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, timeout=10)
        info["git_commit"] = done.stdout.strip() or None
    fields = grpo_fields()
    info["grpo_options"] = {name: name in fields
                            for name in ("bf16_autocast", "tf32", "attn_implementation",
                                         "generation_engine", "static_cuda_graphs",
                                         "load_in_4bit", "activation_offloading",
                                         "padding_free")}  # fmt: skip
    if "generation_engine" in fields:
        from groupwise import GRPOConfig

        info["generation_engine_default"] = GRPOConfig().generation_engine
    if "tf32" in fields:
        from groupwise import GRPOConfig

        info["tf32_default"] = GRPOConfig().tf32
    return info


def versions_line(env: dict) -> str:
    """``name version`` of every recorded package, ``name missing`` where it is not installed."""
    return ", ".join(f"{name} {version or 'missing'}"
                     for name, version in env.get("packages", {}).items())  # fmt: skip


def print_summary(summary: dict, path: Path) -> None:
    env = summary["environment"]
    print("\n" + "=" * 100)
    print(f"gpu_check on {env['device']}: torch {env['torch']} (CUDA {env['torch_cuda']}), "
          f"transformers {env['transformers']}, groupwise {env['groupwise']}")  # fmt: skip
    print(f"versions: {versions_line(env)}")
    model = summary.get("model")
    if model:
        print(f"model: {model['shape']} shape, {model['parameters'] / 1e6:.1f}M parameters, "
              f"random weights; tokenizer {summary['tokenizer']}; TF32 after the checks: "
              f"{summary['tf32_after']['float32_matmul_precision']}")  # fmt: skip
    if summary["missing_options"]:
        print(f"GRPOConfig lacks (left out): {', '.join(summary['missing_options'])}")
    for name, check in summary["checks"].items():
        verdict = "PASS" if check["passed"] else "FAIL"
        detail = check.get("summary") or check.get("error", "")
        print(f"  {name:<18} {verdict}  {check.get('seconds', 0):6.1f} s  {detail}")
    verdict = "all passed" if summary["passed"] else "FAILED: " + ", ".join(
        n for n, c in summary["checks"].items() if not c["passed"]
    )
    print(f"{verdict} in {summary['seconds']} s; summary: {path}")


def markdown_summary(summary: dict) -> str:
    """The summary as a markdown page: the environment, then one row per check."""
    env = summary["environment"]
    lines = [
        f"# gpu_check ({summary.get('suite', 'standard')} suite)", "",
        f"{env['device']}; torch {env['torch']} (CUDA {env['torch_cuda']}), transformers "
        f"{env['transformers']}; {summary.get('seconds', 0)} s; "
        + ("all passed" if summary.get("passed") else "FAILED"), "",
        f"versions: {versions_line(env)}", "",
        "| check | verdict | seconds | result |", "|---|---|---|---|",
    ]  # fmt: skip
    for name, check in summary["checks"].items():
        detail = str(check.get("summary") or check.get("error", "")).replace("|", "/")
        verdict = "pass" if check["passed"] else "FAIL"
        lines.append(f"| {name} | {verdict} | {check.get('seconds', 0)} | {detail} |")
    return "\n".join(lines) + "\n"


# --budget-s by suite: the standard suite starts no check after it; the real suite starts a stage
# only when its estimate fits before it (gpu_check.sh's hard stop follows at 400 s).
BUDGET_S = {"standard": 420.0, "real": 390.0}
# The real stages' model folders (16 GB for the 8B in bf16, 3 GB for the 1.5B): in /dev/shm when
# it has this much room, where saving and loading them go at memory speed.
REAL_SCRATCH_BYTES = 32 * 2**30


def scratch_root(needed: int) -> str | None:
    """Where the check's temporary folder goes: GPU_CHECK_SCRATCH if set, else /dev/shm when
    ``needed`` > 0 and it has that much room, else the system's temporary folder (None)."""
    if os.environ.get("GPU_CHECK_SCRATCH"):
        return os.environ["GPU_CHECK_SCRATCH"]
    if needed > 0:
        with contextlib.suppress(OSError):
            if shutil.disk_usage("/dev/shm").free >= needed:
                return "/dev/shm"
    return None


def start_refusal(elapsed: float, estimate: float, budget: float) -> str | None:
    """Why a check must not start ``elapsed`` seconds into the run, or None: past the budget,
    or its ``estimate`` does not fit in what is left of it."""
    if elapsed > budget:
        return f"not started: past the {budget:g} s budget ({elapsed:.0f} s in)"
    if elapsed + estimate > budget:
        return (f"not started: about {estimate:g} s needed, {budget - elapsed:.0f} s left of the "
                f"{budget:g} s budget")  # fmt: skip
    return None


def write_summary(summary: dict, out: Path) -> None:
    """gpu_check.json and gpu_check.md in ``out``, rewritten (after every check)."""
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str))
    (out / "gpu_check.md").write_text(markdown_summary(summary))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check",
                        help="folder for gpu_check.json (default: $OUT, else runs/gpu_check)")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny-random shape and small sizes (the CPU rehearsal)")
    parser.add_argument("--tokenizer", default="auto",
                        help="auto | smollm2 | synthetic | a tokenizer folder (default: auto)")
    parser.add_argument("--suite", default="standard", choices=list(SUITES),
                        help="standard: the checks 1-9 (default); real: the real-size stages "
                        "(" + ",".join(REAL_CHECKS) + ")")  # fmt: skip
    parser.add_argument("--only", default=None, help="comma-separated checks of the suite "
                        "(standard: " + ",".join(CHECKS) + "; real: " + ",".join(REAL_CHECKS)
                        + ")")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=None,
                        help="standard suite: start no check after this many seconds (default "
                        "420: the whole run stays under 8 minutes on one H200); real suite: "
                        "start a stage only when its estimated seconds fit before this many "
                        "(default 390: with the wheels' install, under 7 minutes on one "
                        "H100)")  # fmt: skip
    ns = parser.parse_args(argv)
    if ns.budget_s is None:
        ns.budget_s = BUDGET_S[ns.suite]
    if ns.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    checks = SUITES[ns.suite]
    names = ns.only.split(",") if ns.only else list(checks)
    unknown = [n for n in names if n not in checks]
    if unknown:
        parser.error(f"unknown checks {unknown}; choose from {list(checks)}")
    ns.sizes = QUICK_SIZES if ns.quick else GPU_SIZES
    ns.torch_device = torch.device(ns.device)
    ns.missing_options = set()

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu_check.json"
    started = time.perf_counter()
    summary: dict[str, Any] = {"environment": environment(ns), "quick": ns.quick,
                               "suite": ns.suite, "budget_s": ns.budget_s,
                               "checks": {}}  # fmt: skip
    ns.results = summary["checks"]  # later stages read earlier ones (ratios)
    print(f"[gpu_check] versions: {versions_line(summary['environment'])}", flush=True)
    print(f"[gpu_check] {json.dumps(summary['environment'])}", flush=True)
    real = ns.suite == "real"
    root = scratch_root(REAL_SCRATCH_BYTES if real and not ns.quick else 0)
    with tempfile.TemporaryDirectory(prefix="gpu-check-", dir=root) as tmp:
        scratch = Path(tmp)
        summary["scratch"] = str(scratch)
        model = scratch / "model"
        if not real:  # the real stages build their own models
            vocab = ns.sizes.shape["vocab_size"]
            tokenizer, summary["tokenizer"] = load_tokenizer(ns.tokenizer, vocab)
            summary["model"] = {"shape": "tiny-random" if ns.quick else "SmolLM2-135M",
                                **build_model_folder(model, ns.sizes.shape, tokenizer,
                                                     ns.torch_device)}  # fmt: skip
        for name in names:
            began = time.perf_counter()
            estimate = 0 if ns.quick or not real else gpu_check_real.ESTIMATE_S.get(name, 0)
            reason = start_refusal(began - started, estimate, ns.budget_s)
            if reason:
                result = {"passed": False, "not_run": reason, "summary": f"NOT RUN: {reason}"}
            else:
                # A run cut short (the hard timeout) leaves this in the summary: what was running.
                summary["running"] = {"check": name, "since_s": round(began - started, 1),
                                      "estimate_s": estimate}  # fmt: skip
                summary["passed"] = False
                write_summary(summary, out)
                print(f"[gpu_check] {name} ...", flush=True)
                try:
                    result = checks[name](ns, model, scratch)
                except Exception as err:  # noqa: BLE001 - one broken check must not hide the rest
                    result = {"passed": False, "error": f"{type(err).__name__}: {err}"[:600],
                              "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
                    release(ns.torch_device)
            result["seconds"] = round(time.perf_counter() - began, 1)
            summary.pop("running", None)
            summary["checks"][name] = result
            summary["missing_options"] = sorted(ns.missing_options)
            summary["tf32_after"] = tf32_state()
            summary["seconds"] = round(time.perf_counter() - started, 1)
            summary["passed"] = all(c["passed"] for c in summary["checks"].values())
            write_summary(summary, out)
            verdict = "PASS" if result["passed"] else "FAIL"
            print(f"[gpu_check] {name}: {verdict} ({result['seconds']} s) "
                  f"{result.get('summary') or result.get('error', '')}", flush=True)  # fmt: skip
    print_summary(summary, path)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
