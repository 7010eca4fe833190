"""Generation on a QLoRA policy (NF4 base + LoRA adapter): the HF engine against the static
engine, which reads the 4-bit layers in place and adds the adapters unmerged, side by side.

    python benchmarks/static_qlora.py [--model smollm2-135m-instruct] [--batch 16]
        [--new_tokens 64] [--repeats 5] [--rank 16] [--device cpu|cuda]

The policy is the demo's model quantised to NF4 with double quantisation (as
``--load_in_4bit --use_bnb_nested_quant`` does) under a LoRA adapter on every linear but the head
(r ``--rank``, alpha 2r, B drawn at random so the adapter changes the tokens). Both engines run
on that one policy: no second copy of the weights exists. Rounds alternate the engines
(A B A B ...), every call with the same seed, after one warm-up call each. Printed and written
to ``benchmarks/results_static_qlora.json``: whether greedy completions are the same tokens,
median seconds, kept tokens per second and their ratio (static / hf).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import peft
import torch

from groupwise.config.grpo_config import GRPOConfig
from groupwise.data.prompts import tokenize_prompts
from groupwise.rollout import HFEngine, plain_sampling
from groupwise.rollout.static import StaticEngine
from groupwise.runtime.models import load_model_and_tokenizer
from groupwise.runtime.quantization import keep_trainable_layout, quantize_4bit
from groupwise.tasks.arithmetic import arithmetic_dataset

GROUP = 8
RESULTS = Path(__file__).resolve().parent / "results_static_qlora.json"


def qlora_policy(name: str, rank: int, device: torch.device) -> tuple[torch.nn.Module, object]:
    model, tokenizer = load_model_and_tokenizer(name, seed=0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = keep_trainable_layout(quantize_4bit(model, "nf4", True, dtype, device))
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear")
    policy = peft.get_peft_model(base, lora)
    torch.manual_seed(0)
    with torch.no_grad():
        for param_name, param in policy.named_parameters():
            if "lora_B" in param_name:
                param.normal_(0, 0.02)
    return policy.eval(), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=16, help="completions (a multiple of 8)")
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    policy, tokenizer = qlora_policy(args.model, args.rank, device)
    rows = arithmetic_dataset(args.batch // GROUP, "train", seed=0)  # the demo's task
    prompts = tokenize_prompts([r["prompt"] for r in rows], tokenizer, 512)
    sampled = plain_sampling(args.new_tokens, 1.0)
    engines = {
        "hf": HFEngine(policy, tokenizer, sampled),
        "static": StaticEngine(
            policy, tokenizer, sampled,
            dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
            eos_check_every=GRPOConfig.static_eos_check_every,
            cuda_graphs=GRPOConfig.static_cuda_graphs,
        ),
    }  # fmt: skip
    assert engines["static"].decoder.in_place  # the 4-bit layers read in place, no copy

    greedy = plain_sampling(args.new_tokens, 0.0)
    outs = {name: engine.generate(prompts, GROUP, greedy) for name, engine in engines.items()}
    same_greedy = bool(torch.equal(outs["hf"].completion_ids, outs["static"].completion_ids))

    def once(name: str) -> tuple[float, int]:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        rollout = engines[name].generate(prompts, GROUP, sampled, torch.Generator().manual_seed(0))
        sync()
        return time.perf_counter() - start, int(rollout.completion_mask.sum())

    for name in engines:
        once(name)  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    kept: dict[str, list[int]] = {name: [] for name in engines}
    for r in range(args.repeats):
        for name in engines:
            s, k = once(name)
            seconds[name].append(s)
            kept[name].append(k)
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(
            f"{n} {seconds[n][-1]:.2f} s" for n in engines), flush=True)  # fmt: skip
    setting = (f"{args.model} NF4 + LoRA r{args.rank}, {args.batch} completions, <= "
               f"{args.new_tokens} new tokens, {device.type}, {torch.get_num_threads()} threads, "
               f"medians of {args.repeats} interleaved rounds")  # fmt: skip
    print(setting)
    print(f"  greedy completions identical: {same_greedy}")
    record: dict[str, object] = {"setting": setting, "same_greedy_tokens": same_greedy}
    rate = {}
    for name in engines:
        median = statistics.median(seconds[name])
        rate[name] = statistics.median(kept[name]) / median
        record[name] = {"median_s": round(median, 3), "kept_tokens_per_s": round(rate[name], 1)}
        print(f"  {name:<7} {median:7.2f} s  {rate[name]:8.1f} kept tokens/s")
    record["static_over_hf_tokens_per_s"] = round(rate["static"] / rate["hf"], 2)
    print(f"  static / hf tokens/s: {record['static_over_hf_tokens_per_s']:.2f}x")
    record["command"] = "python benchmarks/static_qlora.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()
    )
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[f"{device.type}"] = record
    RESULTS.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
