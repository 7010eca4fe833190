"""Before/after of each speed optimisation in generation and in the update, side by side.

Every variant switches off (or adds) exactly one thing against the groupwise default, runs on the
same model, prompts and rollout, and the variants alternate round by round (A B C ... A B C ...)
so that machine noise hits them alike. Prints median seconds and the ratio variant / groupwise
(> 1: the optimisation saves that factor).

    python benchmarks/optimisations.py                       # SmolLM2-135M, 2 prompts x 8 x 48
    python benchmarks/optimisations.py --model tiny-random --rounds 2   # quick
    python benchmarks/optimisations.py --compile             # also try torch.compile (slow)

Generation variants: the prompt encoded once per completion instead of once per group;
``torch.multinomial`` over the full vocabulary instead of inverse-CDF sampling; finished rows
kept in the batch; a preallocated in-place KV cache instead of transformers' DynamicCache (an
experiment: not used by groupwise unless it pays off here); bf16 autocast (where the CPU has
bf16 instructions); ``torch.compile`` of the decoder (--compile); and ``transformers``'
``generate`` with ``num_return_sequences`` (what TRL runs without vLLM).
Update variants (forward + backward of the GRPO loss over the rollout, micro-batches of --micro
rows): full-vocabulary logits instead of the chunked LM-head function; the prompt forward per
completion instead of per group; micro-batches at the full rollout width in rollout order
instead of length-sorted and trimmed; and the passes that groupwise skips or shares: the
no-grad pass that recomputes old log-probs (skipped when num_iterations == 1) and the reference
pass with full logits.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers.cache_utils import DynamicLayer

import groupwise.rollout.hf as rollout_module  # the engine's generation code
from groupwise.algo.advantages import group_advantages
from groupwise.algo.grpo import policy_loss
from groupwise.data.prompts import tokenize_prompts
from groupwise.policy.batches import micro_batch_rows, prompt_blocks, trimmed_completions
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rollout import Rollout, generate, plain_sampling
from groupwise.runtime.models import load_model_and_tokenizer
from groupwise.tasks.arithmetic import arithmetic_dataset

# ---------------------------------------------------------------------------------------------
# Generation variants.


class PreallocatedLayer(DynamicLayer):
    """A KV cache layer written in place into a buffer sized for the whole generation, instead
    of ``torch.cat`` on every token (which copies the layer's cache each step)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.length = keys.shape[-2]
        shape = (*keys.shape[:2], capacity, keys.shape[-1])
        self.key_buffer, self.value_buffer = keys.new_empty(shape), values.new_empty(shape)
        self.key_buffer[:, :, : self.length] = keys
        self.value_buffer[:, :, : self.length] = values
        self._views()

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
        self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
        self._views()


def preallocated_cache_class(extra_tokens: int) -> type:
    """A DynamicCache whose layers become preallocated ones when the prompt cache is shared
    across the group (the first thing ``generate`` does after encoding the prompts)."""

    class PreallocatedCache(rollout_module.DynamicCache):
        def _convert(self) -> None:
            if self.layers and not isinstance(self.layers[0], PreallocatedLayer):
                self.layers = [
                    PreallocatedLayer(la.keys, la.values, la.keys.shape[-2] + extra_tokens)
                    for la in self.layers
                ]

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._convert()
            super().batch_repeat_interleave(repeats)

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._convert()
            super().batch_select_indices(indices)

    return PreallocatedCache


def multinomial_sample(logits, params, generator=None):
    """Sampling as most trainers do it: softmax over the full vocabulary + torch.multinomial."""
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@contextlib.contextmanager
def patched(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def generation_variants(model, tokenizer, prompts, opts) -> dict[str, Callable[[], Rollout]]:
    params = plain_sampling(opts.tokens, 1.0)

    def run(prompt_ids=prompts, group=opts.group, **kwargs):
        return generate(
            model, tokenizer, prompt_ids, group, params, torch.Generator().manual_seed(0), **kwargs
        )

    def per_completion_prompts():
        return run([p for p in prompts for _ in range(opts.group)], 1)

    def multinomial():
        with patched(rollout_module, "sample_next_token", multinomial_sample):
            return run()

    def preallocated():
        cache = preallocated_cache_class(opts.tokens + 1)
        with patched(rollout_module, "DynamicCache", cache):
            return run()

    def bf16():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return run()

    def hf_generate():
        ids, mask = rollout_module.left_pad(prompts, tokenizer.pad_token_id)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=opts.tokens,
            num_return_sequences=opts.group,
            pad_token_id=tokenizer.pad_token_id,
        )
        completions = out[:, ids.shape[1] :]
        return completions.ne(tokenizer.pad_token_id).sum()  # tokens incl. EOS

    variants: dict[str, Callable[[], Rollout]] = {
        "groupwise sampler": run,
        "prompt encoded per completion": per_completion_prompts,
        "torch.multinomial sampling": multinomial,
        "finished rows kept in batch": lambda: run(drop_finished=False),
        "preallocated in-place KV cache": preallocated,
    }
    if cpu_has_bf16():
        variants["bf16 autocast"] = bf16
    if opts.compile:
        compiled = torch.compile(model.forward, dynamic=True)

        def compiled_run():
            with patched(model, "forward", compiled):
                return run()

        variants["torch.compile (dynamic)"] = compiled_run
    variants["transformers generate (TRL's path)"] = hf_generate
    return variants


# ---------------------------------------------------------------------------------------------
# Update variants: forward + backward of the GRPO loss over every micro-batch of one rollout.


def update_pass(
    model,
    rollout: Rollout,
    advantages: torch.Tensor,
    opts,
    *,
    impl: str = "chunked",
    share_prompt: bool = True,
    sort_and_trim: bool = True,
    grad: bool = True,
) -> None:
    """One pass over the rollout as GRPOTrainer.train_step runs it (loss_type grpo, beta 0):
    length-sorted whole-group micro-batches, each trimmed to its longest completion."""
    lengths = rollout.completion_mask.sum(dim=1)
    batches = micro_batch_rows(lengths, opts.micro, opts.group, by_length=sort_and_trim)
    model.zero_grad(set_to_none=True)
    for rows in batches:
        if sort_and_trim:
            ids, mask, _ = trimmed_completions(rollout, rows)
        else:
            ids, mask = rollout.completion_ids[rows], rollout.completion_mask[rows]
        blocks = prompt_blocks(rollout.group_ids[rows], opts.group) if share_prompt else None
        prompts, group_size = blocks if blocks is not None else (rollout.group_ids[rows], 1)
        with torch.set_grad_enabled(grad):
            logps, _ = completion_logprobs(
                model,
                rollout.prompt_ids[prompts],
                rollout.prompt_mask[prompts],
                ids,
                mask,
                group_size=group_size,
                impl=impl,
            )
            if grad:
                loss, _ = policy_loss(logps, None, None, advantages[rows], mask.float(), beta=0.0)
                (loss * len(rows) / len(lengths)).backward()


def update_variants(model, rollout: Rollout, opts) -> dict[str, Callable[[], object]]:
    # Advantages from a stand-in reward (completion length), so the loss has a gradient.
    rewards = rollout.lengths.float()
    advantages = group_advantages(rewards, rollout.group_ids)
    model.train()

    def variant(**kwargs):
        return lambda: update_pass(model, rollout, advantages, opts, **kwargs)

    return {
        "groupwise update": variant(),
        "full-vocabulary logits": variant(impl="naive"),
        "prompt forward per completion": variant(share_prompt=False),
        "full width, rollout order": variant(sort_and_trim=False),
        "+ old log-prob pass (mu > 1 only)": variant(grad=False),
        "+ reference pass, full logits": variant(grad=False, impl="naive", share_prompt=False),
        "+ reference pass, groupwise": variant(grad=False),
    }


# ---------------------------------------------------------------------------------------------


def measure(variants: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for name, fn in variants.items():  # warm-up round (allocator, lazy init, compilation)
        start = time.perf_counter()
        fn()
        print(f"  warm-up {name}: {time.perf_counter() - start:.2f} s", flush=True)
    for r in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
        print(f"  round {r + 1}/{rounds} done", flush=True)
    return times


def print_table(title: str, times: dict[str, list[float]], base: str, extra: str = "") -> None:
    base_median = statistics.median(times[base])
    print(f"\n{title}{extra}")
    print(f"  {'variant':38s} {'median s':>9s} {'range s':>15s} {'x groupwise':>12s}")
    for name, values in times.items():
        median = statistics.median(values)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"  {name:38s} {median:9.3f} {spread:>15s} {median / base_median:12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="max completion tokens")
    parser.add_argument("--micro", type=int, default=8, help="rows per update micro-batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--compile", action="store_true", help="also try torch.compile")
    parser.add_argument("--only", choices=["generation", "update"], help="one half only")
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)

    model, tokenizer = load_model_and_tokenizer(opts.model, seed=0)
    model.eval()
    rows = arithmetic_dataset(opts.prompts, "train", seed=0)
    prompts = tokenize_prompts([r["prompt"] for r in rows], tokenizer, 512)
    print(
        f"{opts.model}: {opts.prompts} prompts x G {opts.group}, <= {opts.tokens} completion "
        f"tokens, fp32, {torch.get_num_threads()} threads, {opts.rounds} rounds (+ warm-up)"
    )

    gen_times = {}
    if opts.only != "update":
        print("generation:", flush=True)
        gen_times = measure(generation_variants(model, tokenizer, prompts, opts), opts.rounds)
    rollout = generate(
        model,
        tokenizer,
        prompts,
        opts.group,
        plain_sampling(opts.tokens, 1.0),
        torch.Generator().manual_seed(0),
    )
    lengths = rollout.lengths.tolist()
    upd_times = {}
    if opts.only != "generation":
        print("update:", flush=True)
        upd_times = measure(update_variants(model, rollout, opts), opts.rounds)

    if gen_times:
        print_table(
            "Generation (one rollout)",
            gen_times,
            "groupwise sampler",
            f": {sum(lengths)} tokens, lengths {min(lengths)}-{max(lengths)}",
        )
    if upd_times:
        print_table(
            "Update (forward + backward over all micro-batches; '+' rows: extra no-grad passes)",
            upd_times,
            "groupwise update",
            f": micro-batches of {opts.micro} rows, completion lengths {min(lengths)}-"
            f"{max(lengths)}",
        )


if __name__ == "__main__":
    main()
