"""How much rollout correction changes at long completions: a bf16 sampler against an fp32
learner, 512-token completions, on the CPU.

    OMP_NUM_THREADS=1 python benchmarks/rollout_correction.py [--model smollm2-135m-instruct]
        [--prompts 8] [--group 8] [--length 512] [--out benchmarks/results_rollout_correction.json]

The samplers: the static engine in bf16 (its own bf16 copy of the weights, which records the
sampler's log-probs) and the HF engine under bf16 autocast (``generation_dtype: bfloat16``).
The learner: the policy's ``completion_logprobs`` on the fp32 model, and the same under bf16
autocast (a GPU full fine-tune's numerics). EOS does not end a completion here (the engines are
given no EOS token), so every completion is ``--length`` tokens; the model writes on past its
end-of-turn token, as it would in a longer conversation. Sampling at temperature 1, no top-k /
top-p, seeds fixed.

For each (sampler, learner) pair it reports the per-token log-ratio
``d_t = log pi_old - log pi_rollout`` (|d| mean, p50, p99, max; signed mean), the distribution
of the summed sequence log-ratio ``sum_t d_t`` at 128, 256 and ``--length`` tokens, and what
each ``rollout_correction_mode`` does at ``rollout_correction_clip_max`` 3 (and, for
reference, with ``clip_min`` 1/3): the share of completions (sequence modes) or tokens (token
modes) masked or truncated, using ``algo.variants.rollout_correction_weights`` and
``rollout_correction_logs`` as the trainer does.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path
from unittest import mock

import torch

from groupwise.algo.variants import (
    ROLLOUT_CORRECTION_MODES,
    rollout_correction_logs,
    rollout_correction_weights,
)
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rollout import generate
from groupwise.rollout.base import plain_sampling
from groupwise.rollout.static import StaticEngine
from groupwise.runtime.models import load_model_and_tokenizer

TOPICS = [
    "the history of the printing press",
    "how a steam engine works",
    "a day in the life of a lighthouse keeper",
    "why the sky is blue",
    "the rules of chess, explained to a beginner",
    "how bread is made, from wheat to loaf",
    "a journey across the Sahara by camel",
    "the life cycle of a star",
    "how a city's water supply works",
    "the invention of the telephone",
    "what happens inside a beehive",
    "how to plan a vegetable garden",
]
NO_EOS = [-1]  # no token id is -1: no completion ends before the budget


def prompts(tokenizer, n: int) -> list[list[int]]:
    out = []
    for topic in TOPICS[:n]:
        messages = [{"role": "user", "content": f"Write a long, detailed essay about {topic}."}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def quantiles(x: torch.Tensor, qs: tuple[float, ...]) -> dict[str, float]:
    x = x.double().flatten()
    return {f"p{q * 100:g}": float(torch.quantile(x, q)) for q in qs}


def summary(diff: torch.Tensor, mask: torch.Tensor, length: int) -> dict:
    """Everything reported for one (sampler, learner) pair; ``diff`` [N, T] = old - sampling."""
    keep = mask.bool()
    tokens = diff[keep]
    out: dict = {
        "tokens": int(keep.sum()),
        "sequences": int(diff.shape[0]),
        "token_abs_log_ratio": {
            "mean": float(tokens.abs().mean()),
            **quantiles(tokens.abs(), (0.5, 0.9, 0.99, 0.999)),
            "max": float(tokens.abs().max()),
        },
        "token_log_ratio_mean": float(tokens.mean()),
        "token_log_ratio_std": float(tokens.std()),
        "tokens_above_ln3": float((tokens > math.log(3)).float().mean()),
        "tokens_below_minus_ln3": float((tokens < -math.log(3)).float().mean()),
    }
    sums = {}
    for prefix in sorted({128, 256, length}):
        if prefix > diff.shape[1]:
            continue
        s = (diff[:, :prefix] * mask[:, :prefix]).sum(dim=1)
        sums[str(prefix)] = {
            "mean": float(s.mean()),
            "std": float(s.std()),
            "min": float(s.min()),
            **quantiles(s, (0.01, 0.05, 0.5, 0.95, 0.99)),
            "max": float(s.max()),
            "share_above_ln3": float((s > math.log(3)).float().mean()),
            "share_below_minus_ln3": float((s < -math.log(3)).float().mean()),
        }
    out["sequence_log_ratio"] = sums
    old = diff  # the weights depend on the difference only: old = d, sampling = 0
    zero = torch.zeros_like(diff)
    modes = {}
    for clip_min in (None, 1 / 3):
        for mode in ROLLOUT_CORRECTION_MODES:
            w = rollout_correction_weights(
                old, zero, mask, mode=mode, clip_min=clip_min, clip_max=3.0
            )
            trained = w.flatten() if w.shape[1] == 1 else w[keep]
            logs = rollout_correction_logs(trained, mode=mode, clip_min=clip_min, clip_max=3.0)
            entry = {key.rsplit("/", 1)[1]: value for key, value in logs.items()}
            entry["mean_weight"] = float(trained.mean())
            if mode.startswith("token"):  # completions with at least one changed token
                changed = (w == 0) if mode.endswith("mask") else (w >= 3.0)
                if clip_min is not None and mode.endswith("truncate"):
                    changed = changed | (w <= clip_min)
                entry["sequences_touched"] = float((changed & keep).any(dim=1).float().mean())
            name = mode if clip_min is None else f"{mode}_clip_min_1/3"
            modes[name] = entry
    out["modes_at_clip_max_3"] = modes
    return out


def sample_static(model, tokenizer, ids, group, params, seed):
    engine = StaticEngine(
        model, tokenizer, params, torch.Generator().manual_seed(seed),
        eos_check_every=8, cuda_graphs=False, dtype=torch.bfloat16,
    )  # fmt: skip
    engine.eos = NO_EOS
    return engine.generate(ids, group)


def sample_hf_bf16(model, tokenizer, ids, group, params, seed):
    with (
        mock.patch("groupwise.rollout.hf.eos_token_ids", lambda *_: NO_EOS),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        return generate(
            model, tokenizer, ids, group, params, torch.Generator().manual_seed(seed),
            return_logprobs=True,
        )  # fmt: skip


def learner_logprobs(model, rollout, group, autocast: bool, rows_per_pass: int):
    """The fp32 model's log-probs of the rollout's tokens (under bf16 autocast when asked), a
    few groups per forward."""
    parts = []
    n = rollout.completion_ids.shape[0]
    for start in range(0, n, rows_per_pass):
        rows = slice(start, start + rows_per_pass)
        prompt_rows = slice(start // group, (start + rows_per_pass) // group)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, _ = completion_logprobs(
                model,
                rollout.prompt_ids[prompt_rows],
                rollout.prompt_mask[prompt_rows],
                rollout.completion_ids[rows],
                rollout.completion_mask[rows],
                group_size=group,
            )
        parts.append(logp.float())
    return torch.cat(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--samplers", default="static_bf16,hf_bf16_autocast")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results_rollout_correction.json")
    ns = parser.parse_args()

    torch.manual_seed(ns.seed)
    model, tokenizer = load_model_and_tokenizer(ns.model, None, seed=ns.seed)
    model.eval()
    ids = prompts(tokenizer, ns.prompts)
    params = plain_sampling(ns.length, temperature=1.0)
    samplers = {"static_bf16": sample_static, "hf_bf16_autocast": sample_hf_bf16}
    results: dict = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/rollout_correction.py "
        f"--model {ns.model} --prompts {ns.prompts} --group {ns.group} --length {ns.length} "
        f"--samplers {ns.samplers} --seed {ns.seed}",
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": ns.model,
        "completions": ns.prompts * ns.group,
        "completion_length": ns.length,
        "results": {},
    }
    for name in ns.samplers.split(","):
        start = time.perf_counter()
        rollout = samplers[name](model, tokenizer, ids, ns.group, params, ns.seed)
        gen_s = time.perf_counter() - start
        assert rollout.sampling_logprobs is not None
        mask = rollout.completion_mask.float()
        print(f"{name}: {int(mask.sum())} tokens in {gen_s:.0f} s", flush=True)
        for learner, autocast in (("fp32", False), ("bf16_autocast", True)):
            start = time.perf_counter()
            old = learner_logprobs(model, rollout, ns.group, autocast, rows_per_pass=ns.group)
            diff = (old - rollout.sampling_logprobs.float()) * mask
            entry = summary(diff, mask, ns.length)
            entry["seconds"] = {"generation": round(gen_s, 1),
                                "learner": round(time.perf_counter() - start, 1)}  # fmt: skip
            results["results"][f"{name} sampler vs {learner} learner"] = entry
            seq = entry["sequence_log_ratio"][str(ns.length)]
            print(
                f"  vs {learner} learner: |d| mean {entry['token_abs_log_ratio']['mean']:.4f} "
                f"p99 {entry['token_abs_log_ratio']['p99']:.4f}; sum_t d at {ns.length}: mean "
                f"{seq['mean']:+.3f} std {seq['std']:.3f} [{seq['min']:+.3f}, {seq['max']:+.3f}]"
                f"; sequence_mask masks {entry['modes_at_clip_max_3']['sequence_mask']}",
                flush=True,
            )
    Path(ns.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {ns.out}")


if __name__ == "__main__":
    main()
