"""The prepared GPU check: what CPU tests cannot show, on one CUDA GPU, in a few minutes.

    python scripts/gpu_check.py --device cuda --out DIR    # on the GPU machine (gpu_check.sh)
    python scripts/gpu_check.py --device cpu --quick --out DIR    # its CPU path (a test runs it)

Each check records its numbers and ``passed``; one failing check does not stop the others.
Writes DIR/gpu_check.json and prints a summary; exits 1 if any check failed.

1. precision: per mode (fp32, bf16 mixed, pure bf16), 5 GRPO steps at learning_rate 1e-6, the
   share of each tensor family's elements the updates moved (fp32 and mixed >= 0.99).
2. learning: bf16 mixed precision (the CUDA default) raises a reward within a few dozen steps.
3. sdpa_left_padding: bf16 SDPA over a left-padded batch gives finite logits, close to fp32.
4. memory: peak reserved memory of a real step against the memory planner's prediction.
5. collectives: groupwise's collective helpers under the process group a CUDA run makes
   (``cpu:gloo,cuda:nccl``), one rank, with host and device tensors.
6. generation: tokens/s of the HF engine, fp32 and bf16 autocast.

The model is random, of SmolLM2-135M's shape (tiny with ``--quick``), saved with a tokenizer
into a scratch folder, so nothing but this tree and a tokenizer folder has to travel.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SMOLLM2_SHAPE = dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
    rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip
TINY_SHAPE = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=49152, max_position_embeddings=1024,
    tie_word_embeddings=True,
)  # fmt: skip
MODES = {
    "fp32": dict(dtype="float32", bf16_autocast=False),
    "bf16_mixed": dict(dtype="float32", bf16_autocast=True),
    "bf16_pure": dict(dtype="bfloat16", bf16_autocast=False),
}


def family(name: str) -> str:
    if "norm" in name:
        return "norm"
    if "embed" in name or "lm_head" in name:
        return "embedding"
    if any(k in name for k in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention"
    return "mlp"


def build_model_folder(folder: Path, shape: dict, tokenizer_path: str | None) -> Path:
    """A random Llama of ``shape`` and a tokenizer, saved as a Hugging Face folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if tokenizer_path:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    else:
        from groupwise.models import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
    config = LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def prompts(n: int) -> list[dict[str, str]]:
    return [{"prompt": f"Problem {i}: what is {i} plus {2 * i}?"} for i in range(n)]


def length_reward(completions, **kwargs):  # differs within groups: non-zero advantages
    return [float(len(c)) for c in completions]


class TargetToken:
    """Reward = the fraction of completion tokens equal to one token (the most frequent one of
    the first batch): a random model reaches it in a few dozen steps."""

    __name__ = "target_token"

    def __init__(self) -> None:
        self.target: int | None = None

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        if self.target is None:
            flat = [t for ids in completion_ids for t in ids]
            self.target = max(set(flat), key=flat.count)
        return [sum(t == self.target for t in ids) / max(len(ids), 1) for ids in completion_ids]


def config(ns: argparse.Namespace, model: Path, out: Path, **options: Any):
    from groupwise import GRPOConfig

    values = dict(
        model=str(model), device=ns.device, output_dir=str(out), disable_tqdm=True, seed=0,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=16,
        max_prompt_length=64, beta=0.0, save_steps=0, num_eval_prompts=0,
    )  # fmt: skip
    values.update(options)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    return GRPOConfig(**{k: v for k, v in values.items() if k in fields})


# -- the checks ----------------------------------------------------------------------------------


def check_precision(ns, model, scratch) -> dict:
    from groupwise import GRPOTrainer

    steps = 3 if ns.quick else 5
    result: dict[str, Any] = {}
    for mode, options in MODES.items():
        moved: dict[str, torch.Tensor] = {}

        class PerStep:
            def __init__(self, moved: dict[str, torch.Tensor]) -> None:
                self.moved = moved

            def on_step_begin(self, args, state, control, model, **kwargs):
                self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

            def on_step_end(self, args, state, control, model, **kwargs):
                for name, param in model.named_parameters():
                    if param.requires_grad:
                        changed = param.detach() != self.before[name]
                        seen = self.moved.get(name)
                        self.moved[name] = changed if seen is None else seen | changed

        args = config(ns, model, scratch / mode, learning_rate=1e-6, max_steps=steps, **options)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = GRPOTrainer(str(model), length_reward, prompts(8), args=args,
                                  callbacks=[PerStep(moved)])  # fmt: skip
            trainer.train()
        families: dict[str, list[float]] = {}
        for name, mask in moved.items():
            families.setdefault(family(name), []).append(mask.float().mean().item())
        result[mode] = {
            "precision": getattr(getattr(trainer, "precision", None), "name", "?"),
            "weights_dtype": str(next(trainer.model.parameters()).dtype),
            "min_fraction_moved": {k: round(min(v), 4) for k, v in families.items()},
            "warnings": [str(w.message)[:120] for w in caught if "bfloat16" in str(w.message)],
        }
    ok = all(
        min(result[m]["min_fraction_moved"][f] for f in ("attention", "mlp", "norm")) >= 0.99
        for m in ("fp32", "bf16_mixed")
    )
    ok = ok and result["bf16_pure"]["min_fraction_moved"]["norm"] < 0.5
    return {"passed": ok, **result}


def check_learning(ns, model, scratch) -> dict:
    from groupwise import GRPOTrainer

    steps = 12 if ns.quick else 30
    # The tests' learning setting on the tiny model (one context, low temperature, lr 1e-2);
    # a deeper model takes a smaller step.
    args = config(ns, model, scratch / "learning", learning_rate=1e-2 if ns.quick else 2e-3,
                  max_steps=steps, max_completion_length=8, temperature=0.1,
                  num_generations=8, per_device_train_batch_size=16,
                  **MODES["bf16_mixed"])  # fmt: skip
    rows = [{"prompt": "Say something"}] * 4  # one context: the target is always reachable
    trainer = GRPOTrainer(str(model), TargetToken(), rows, args=args)
    history = [row["reward"] for row in trainer.train() if "reward" in row]
    first, last = sum(history[:5]) / 5, sum(history[-5:]) / 5
    return {"passed": last > first + 0.1, "steps": steps, "first5_reward": round(first, 4),
            "last5_reward": round(last, 4)}  # fmt: skip


def check_sdpa_left_padding(ns, model, scratch) -> dict:
    from transformers import AutoModelForCausalLM

    device = torch.device(ns.device)
    reference = AutoModelForCausalLM.from_pretrained(
        model, dtype=torch.float32, attn_implementation="sdpa"
    ).to(device)
    lengths = [3, 9, 17, 32]
    width = max(lengths)
    ids = torch.full((len(lengths), width), 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(3, 1000, (n,))
        mask[row, width - n:] = 1
    ids, mask = ids.to(device), mask.to(device)
    keep = mask.bool()
    with torch.no_grad():
        fp32 = reference(input_ids=ids, attention_mask=mask).logits.float()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            mixed = reference(input_ids=ids, attention_mask=mask).logits.float()
        pure = reference.to(torch.bfloat16)(input_ids=ids, attention_mask=mask).logits.float()
    out = {"passed": True}
    for name, logits in (("bf16_autocast", mixed), ("bf16_weights", pure)):
        finite = bool(torch.isfinite(logits[keep]).all())
        diff = float((logits - fp32)[keep].abs().max())
        out[name] = {"finite": finite, "max_abs_diff_vs_fp32": round(diff, 4)}
        out["passed"] &= finite and diff < 1.0
    return out


def check_memory(ns, model, scratch) -> dict:
    from groupwise.memory.measure import run_measurement
    from groupwise.memory.plan import MemoryOptions

    opts = MemoryOptions(batch=8, group_size=4, prompt_len=64, completion_len=16 if ns.quick
                         else 64, beta=0.04)  # fmt: skip
    (result,) = run_measurement(str(model), opts, algorithms=("grpo",), steps=2,
                                device=ns.device, timeout=600)  # fmt: skip
    if "error" in result:
        return {"passed": False, "error": result["error"]}
    ratio = result["ratio"]
    return {"passed": 0.3 <= ratio <= 3.0, "device": result["device"], "dtype": result["dtype"],
            "measured_bytes": result["measured_bytes"],
            "predicted_bytes": result["predicted_bytes"], "measured_over_predicted":
            round(ratio, 3)}  # fmt: skip


def check_collectives(ns, model, scratch) -> dict:
    """One rank in the process group a CUDA run makes; every groupwise collective helper called
    with host tensors and, on CUDA, device tensors (NCCL alone refuses host tensors)."""
    import torch.distributed as dist

    from groupwise import distributed as gd

    device_type = torch.device(ns.device).type
    backend = gd.backend_for(device_type)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    options = {"device_id": torch.device("cuda", 0)} if device_type == "cuda" else {}
    if device_type == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group(backend=backend, rank=0, world_size=1, **options)

    class Enabled(gd.DistributedContext):
        @property
        def enabled(self) -> bool:  # exercise the collective path with one rank
            return True

    ctx = Enabled()
    calls: dict[str, str] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            fn()
            calls[name] = "ok"
        except Exception as err:  # noqa: BLE001 - recorded, the next call still runs
            calls[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"

    try:
        attempt("all_reduce_sum(cpu)", lambda: gd.all_reduce_sum(torch.tensor([3, 4]), ctx))
        if device_type == "cuda":
            attempt("all_reduce_sum(cuda)",
                    lambda: gd.all_reduce_sum(torch.ones(3, device="cuda").sum(), ctx))  # fmt: skip
        attempt("max_over_ranks", lambda: gd.max_over_ranks(5, ctx))
        attempt("any_rank", lambda: gd.any_rank(True, ctx))
        attempt("reduce_metrics", lambda: gd.reduce_metrics({"step": 1, "loss": 0.5}, ctx))
        attempt("all_gather_objects", lambda: gd.all_gather_objects({"a": 1}, ctx))
        attempt("concat_over_ranks", lambda: gd.concat_over_ranks(([1, 2], [3]), ctx))
        rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
        attempt("global_group_advantages(batch)", lambda: gd.global_group_advantages(
            rewards, torch.tensor([0, 0, 1, 1]), "batch", ctx))  # fmt: skip
        attempt("barrier", lambda: gd.barrier(ctx))
    finally:
        dist.destroy_process_group()
    return {"passed": all(v == "ok" for v in calls.values()), "backend": backend, **calls}


def check_generation(ns, model, scratch) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from groupwise.rollout import HFEngine, SamplingParams

    device = torch.device(ns.device)
    tokenizer = AutoTokenizer.from_pretrained(model)
    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device).eval()
    new_tokens = 16 if ns.quick else 128
    params = SamplingParams(max_completion_length=new_tokens, temperature=1.0)
    prompt_ids = [tokenizer(p["prompt"])["input_ids"] for p in prompts(8)]
    out: dict[str, Any] = {"passed": True, "prompts": 8, "per_prompt": 8,
                           "max_new_tokens": new_tokens}  # fmt: skip
    def bf16() -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    for name, numerics in (("hf_fp32", contextlib.nullcontext), ("hf_bf16_autocast", bf16)):
        generator = torch.Generator(device=device).manual_seed(0)
        engine = HFEngine(net, tokenizer, params, generator, numerics=numerics)
        engine.generate(prompt_ids[:2], 2)  # warm-up (kernels, allocator)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        rollout = engine.generate(prompt_ids, 8)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        tokens = int(rollout.completion_mask.sum())
        out[name] = {"tokens": tokens, "seconds": round(seconds, 3),
                     "tokens_per_second": round(tokens / seconds, 1)}  # fmt: skip
        out["passed"] &= tokens > 0
    try:
        import groupwise.rollout.vllm  # noqa: F401

        out["vllm"] = "present, not measured by this version of the check"
    except ImportError:
        out["vllm"] = "not available"
    return out


CHECKS = {
    "precision": check_precision,
    "learning": check_learning,
    "sdpa_left_padding": check_sdpa_left_padding,
    "memory": check_memory,
    "collectives": check_collectives,
    "generation": check_generation,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu_check")
    parser.add_argument("--quick", action="store_true", help="a tiny model and few steps")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the "
                        "SmolLM2 tokenizer groupwise ships with its demo model)")  # fmt: skip
    parser.add_argument("--only", default=None, help="comma-separated check names")
    ns = parser.parse_args(argv)
    if ns.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if ns.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "quick": ns.quick,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "checks": {},
    }
    names = ns.only.split(",") if ns.only else list(CHECKS)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        scratch = Path(tmp)
        model = build_model_folder(scratch / "model", TINY_SHAPE if ns.quick else SMOLLM2_SHAPE,
                                   ns.tokenizer)  # fmt: skip
        for name in names:
            began = time.perf_counter()
            try:
                result = CHECKS[name](ns, model, scratch)
            except Exception as err:  # noqa: BLE001 - one broken check must not hide the rest
                result = {"passed": False, "error": f"{type(err).__name__}: {err}",
                          "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
            result["seconds"] = round(time.perf_counter() - began, 1)
            summary["checks"][name] = result
            print(f"[gpu_check] {name}: {'PASS' if result['passed'] else 'FAIL'} "
                  f"({result['seconds']} s) {json.dumps(result)[:600]}", flush=True)  # fmt: skip
        if ns.device == "cuda":
            summary["tf32_matmul_after_training"] = torch.backends.cuda.matmul.allow_tf32
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["passed"] = all(c["passed"] for c in summary["checks"].values())
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    print(f"[gpu_check] {'all passed' if summary['passed'] else 'FAILED'} in "
          f"{summary['seconds']} s; summary in {out / 'gpu_check.json'}")  # fmt: skip
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
