"""Roofline of decoding on this machine: measured peaks, the ceiling they imply for a model's
token steps, and the rollout engines measured against it, side by side in one run.

    python benchmarks/roofline.py                      # SmolLM2-135M, batches 16 and 64
    python benchmarks/roofline.py --quick              # tiny-random, few repeats (a check)
    python benchmarks/roofline.py --engines hf-fp32,hf-bf16 --repeats 3 --json roofline.json

1. Peaks: fp32 and bf16 matmul GFLOP/s (square matmuls and decode-shaped ones, a batch of
   hidden states times an MLP-sized weight) and memory bandwidth (a copy and a read-reduce over a
   buffer eight times the last-level cache), each the best of several repeats, with torch's
   default thread count.
2. Ceiling: one token step of batch B costs 2 x (non-embedding + LM-head parameters) x B FLOPs
   plus attention over the context (4 x layers x B x context x attention width), and reads the
   weights once in the engine's dtype plus the KV cache of every row. The step cannot be faster
   than the slower of FLOPs / peak FLOP/s and bytes / bandwidth, so the machine cannot decode
   more than B / that many tokens per second.
3. Engines, each generating the demo's prompts (G = 8 completions each, ``--new_tokens``) with
   the same seed on every call, interleaved engine by engine within each repeat so that machine
   noise hits them alike: ``hf-fp32`` (the Hugging Face decode loop, fp32), ``hf-bf16`` (the same
   loop under bf16 autocast: today's bf16 generation, the baseline of every ratio), ``static``
   and ``static-compile`` (``groupwise.rollout.static.StaticEngine`` in bf16, eager and with
   ``torch.compile``). Throughput counts kept tokens (completion tokens up to and including EOS)
   per second of wall time, warm-up call excluded, median over ``--repeats``; a compiled
   engine's compile time is its warm-up call less its median call, reported on its own line.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from groupwise.config.grpo_config import GRPOConfig
from groupwise.data.prompts import tokenize_prompts
from groupwise.rollout import HFEngine, Rollout, SamplingParams, plain_sampling
from groupwise.rollout.static import StaticEngine
from groupwise.runtime.models import load_model_and_tokenizer
from groupwise.tasks.arithmetic import arithmetic_dataset

GROUP = 8  # completions per prompt, as in the demo (configs/demo.yaml)
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# ---------------------------------------------------------------------------------------------
# The ceiling arithmetic: plain functions of the model's shape, unit-tested by hand.


@dataclass(frozen=True)
class DecodeShape:
    """The sizes of a Llama-style decoder that set the cost of one token step."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: Any) -> DecodeShape:
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            hidden=int(config.hidden_size),
            intermediate=int(config.intermediate_size),
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab=int(config.vocab_size),
            attention_bias=bool(getattr(config, "attention_bias", False)),
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )

    @property
    def layer_params(self) -> int:
        """One decoder layer: q, k, v, o projections, the gated MLP and two RMSNorm weights."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * q + 2 * self.hidden * kv + q * self.hidden
        if self.attention_bias:
            attn += q + 2 * kv + self.hidden
        mlp = 3 * self.hidden * self.intermediate
        if self.mlp_bias:
            mlp += 2 * self.intermediate + self.hidden
        return attn + mlp + 2 * self.hidden

    @property
    def non_embedding_params(self) -> int:
        """Every layer plus the final norm: what each token step multiplies through."""
        return self.layers * self.layer_params + self.hidden

    @property
    def lm_head_params(self) -> int:
        """The LM head, read in full every step even when tied to the embedding (the embedding
        lookup itself reads only B rows, so it is left out)."""
        return self.vocab * self.hidden

    @property
    def matmul_params(self) -> int:
        return self.non_embedding_params + self.lm_head_params

    @property
    def kv_values_per_token(self) -> int:
        """Cached keys and values of one position, over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim


def mean_context(prompt_tokens: float, new_tokens: int) -> float:
    """Mean number of positions a decoded token attends to: token t (1..T) sees the prompt and
    the t completion tokens so far (itself included), so the mean over the completion is
    prompt + (T + 1) / 2."""
    return prompt_tokens + (new_tokens + 1) / 2


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float


def decode_step_cost(
    shape: DecodeShape, batch: int, context: float, weight_bytes: int, kv_bytes: int
) -> StepCost:
    """FLOPs and bytes moved by one token step of ``batch`` rows at ``context`` positions.

    FLOPs: 2 per weight per row (multiply and add), plus attention's two products (scores
    q.K and the weighted sum of V), each 2 x context x heads x head_dim per layer and row.
    Bytes: every weight read once (the batch shares it) plus each row's KV cache."""
    attention_width = shape.heads * shape.head_dim
    flops = 2 * shape.matmul_params * batch + 4 * shape.layers * batch * context * attention_width
    weights = shape.matmul_params * weight_bytes
    kv_cache = shape.kv_values_per_token * batch * context * kv_bytes
    return StepCost(flops=float(flops), bytes=float(weights + kv_cache))


@dataclass(frozen=True)
class Ceiling:
    compute_tokens_per_s: float  # if only the FLOPs counted
    memory_tokens_per_s: float  # if only the bytes counted

    @property
    def tokens_per_s(self) -> float:
        return min(self.compute_tokens_per_s, self.memory_tokens_per_s)

    @property
    def binds(self) -> str:
        return "compute" if self.compute_tokens_per_s <= self.memory_tokens_per_s else "memory"


def ceiling(cost: StepCost, batch: int, flops_per_s: float, bytes_per_s: float) -> Ceiling:
    """Tokens per second no engine can beat: B tokens per step, a step no shorter than
    max(FLOPs / peak FLOP/s, bytes / bandwidth)."""
    return Ceiling(
        compute_tokens_per_s=batch / (cost.flops / flops_per_s),
        memory_tokens_per_s=batch / (cost.bytes / bytes_per_s),
    )


# ---------------------------------------------------------------------------------------------
# Peaks of this machine.


def best_seconds(fn: Callable[[], object], repeats: int, min_seconds: float) -> float:
    """Seconds per call, best of ``repeats`` timings, each running ``fn`` long enough to last
    ``min_seconds`` (so a short kernel is not timed alone against the clock's resolution)."""
    fn()  # warm-up: allocation, kernel selection
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(min_seconds / once))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int, min_s: float) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    out = torch.empty(m, n, dtype=dtype)
    return 2 * m * k * n / best_seconds(lambda: torch.mm(a, b, out=out), repeats, min_s) / 1e9


def last_level_cache_bytes() -> int:
    """The largest CPU cache sysfs reports (32 MiB if it reports none)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        with contextlib.suppress(ValueError):
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 * 1024**2)


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (the architecture where there is none)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


@dataclass
class Peaks:
    threads: int
    cache_bytes: int
    buffer_bytes: int
    copy_gb_s: float  # bytes read + bytes written per second
    read_gb_s: float  # a sum over the buffer: bytes read per second
    # dtype -> GFLOP/s: the best of every shape tried, and the best decode-shaped one per batch
    matmul_best: dict[str, float] = field(default_factory=dict)
    matmul_best_shape: dict[str, str] = field(default_factory=dict)
    matmul_decode: dict[str, dict[int, float]] = field(default_factory=dict)

    @property
    def bandwidth_gb_s(self) -> float:
        return max(self.copy_gb_s, self.read_gb_s)


def measure_peaks(shape: DecodeShape, batches: Sequence[int], quick: bool) -> Peaks:
    repeats, min_s = (2, 0.02) if quick else (5, 0.2)
    squares = (512, 1024) if quick else (1024, 2048, 3072)
    d, ff = shape.hidden, 4 * shape.hidden
    peaks_best: dict[str, float] = {}
    best_shape: dict[str, str] = {}
    decode: dict[str, dict[int, float]] = {}
    for name, dtype in TORCH_DTYPES.items():
        tried = {f"{s}x{s}x{s}": matmul_gflops(s, s, s, dtype, repeats, min_s) for s in squares}
        decode[name] = {}
        for b in batches:  # [B x d] @ [d x 4d] and its transpose shape [B x 4d] @ [4d x d]
            up = matmul_gflops(b, d, ff, dtype, repeats, min_s)
            down = matmul_gflops(b, ff, d, dtype, repeats, min_s)
            tried[f"{b}x{d}x{ff}"], tried[f"{b}x{ff}x{d}"] = up, down
            decode[name][b] = max(up, down)
        best_shape[name] = max(tried, key=tried.__getitem__)
        peaks_best[name] = tried[best_shape[name]]

    cache = last_level_cache_bytes()
    buffer_bytes = max(8 * cache, 256 * 1024**2)
    src = torch.ones(buffer_bytes // 4)
    dst = torch.empty_like(src)
    mem_repeats = 3 if quick else 10
    copy_s = best_seconds(lambda: dst.copy_(src), mem_repeats, 0.0)
    read_s = best_seconds(lambda: src.sum(), mem_repeats, 0.0)
    return Peaks(
        threads=torch.get_num_threads(),
        cache_bytes=cache,
        buffer_bytes=buffer_bytes,
        copy_gb_s=2 * buffer_bytes / copy_s / 1e9,
        read_gb_s=buffer_bytes / read_s / 1e9,
        matmul_best=peaks_best,
        matmul_best_shape=best_shape,
        matmul_decode=decode,
    )


# ---------------------------------------------------------------------------------------------
# Engines.


class Engine(Protocol):
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        counts: int | Sequence[int],
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Rollout: ...


@dataclass(frozen=True)
class EngineSpec:
    label: str  # what the table calls it
    ceiling_dtype: str  # which roofline it is held against
    compiled: bool = False


ENGINES: dict[str, EngineSpec] = {
    "hf-fp32": EngineSpec("(a) HF loop, fp32", "fp32"),
    "hf-bf16": EngineSpec("(b) HF loop, bf16 autocast", "bf16"),
    "static": EngineSpec("(c) static, bf16", "bf16"),
    "static-compile": EngineSpec("(c) static, bf16, compiled", "bf16", compiled=True),
}
BASELINE = "hf-bf16"  # today's bf16 generation: the loop under autocast


def build_engine(name: str, model: torch.nn.Module, tokenizer: Any, params: SamplingParams
                 ) -> Engine:  # fmt: skip
    """The engine called ``name``."""
    if name == "hf-fp32":
        return HFEngine(model, tokenizer, params)
    if name == "hf-bf16":
        return HFEngine(
            model, tokenizer, params,
            numerics=lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        )  # fmt: skip
    if name in ("static", "static-compile"):
        # Its own copy of the policy: an engine that casts or compiles the model it is given
        # must not change what the HF engines measure.
        own = copy.deepcopy(model)
        return StaticEngine(
            own, tokenizer, params, dtype=torch.bfloat16, compile=ENGINES[name].compiled,
            eos_check_every=GRPOConfig.static_eos_check_every,
            cuda_graphs=GRPOConfig.static_cuda_graphs,
        )  # fmt: skip
    raise ValueError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")


def timed_generate(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, seed: int
) -> tuple[float, int]:
    """Wall seconds of one rollout and its kept tokens (completion tokens up to EOS)."""
    start = time.perf_counter()
    rollout = engine.generate(prompts, GROUP, params, torch.Generator().manual_seed(seed))
    seconds = time.perf_counter() - start
    return seconds, int(rollout.completion_mask.sum())


@dataclass
class Measurement:
    engine: str
    batch: int
    warmup_s: float
    seconds: list[float]
    kept_tokens: list[int]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        """Median kept tokens over the median call: every call has the same seed, so an engine
        keeps the same tokens each time and this is the median call's throughput, in line with
        the median seconds printed beside it."""
        return statistics.median(self.kept_tokens) / self.median_s

    @property
    def compile_s(self) -> float:
        """The warm-up call's excess over a steady call: compilation, for a compiled engine."""
        return max(self.warmup_s - self.median_s, 0.0)


def measure_engines(
    engines: dict[str, Engine],
    prompts: list[list[int]],
    batch: int,
    params: SamplingParams,
    repeats: int,
    seed: int,
) -> dict[str, Measurement]:
    """Each engine's warm-up call, then ``repeats`` rounds with every engine once per round
    (A B C A B C ...), every call with the same seed."""
    rows = prompts[: batch // GROUP]
    results = {}
    for name, engine in engines.items():
        warm, _ = timed_generate(engine, rows, params, seed)
        print(f"  batch {batch}: warm-up {name} {warm:.2f} s", flush=True)
        results[name] = Measurement(name, batch, warm, [], [])
    for r in range(repeats):
        for name, engine in engines.items():
            seconds, kept = timed_generate(engine, rows, params, seed)
            results[name].seconds.append(seconds)
            results[name].kept_tokens.append(kept)
        print(f"  batch {batch}: round {r + 1}/{repeats} done", flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# Report.


def payoff_steps(compile_s: float, eager_s: float, compiled_s: float) -> float | None:
    """Rollouts after which compiling has paid for itself; None if it never does."""
    saved = eager_s - compiled_s
    return compile_s / saved if saved > 0 else None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default smollm2-135m-instruct "
                        "(tiny-random with --quick)")  # fmt: skip
    parser.add_argument("--batches", default="16,64", help="completions per rollout, comma-"
                        f"separated; multiples of {GROUP} (G)")  # fmt: skip
    parser.add_argument("--new_tokens", type=int, default=None, help="max completion tokens "
                        "(default 48, 8 with --quick)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=None, help="default 5, 2 with --quick")
    parser.add_argument("--engines", default=None, help=f"comma-separated, of {', '.join(ENGINES)}"
                        " (default all; all but static-compile with --quick)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny-random, short and few repeats")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    opts = parser.parse_args(argv)
    model_name = opts.model or ("tiny-random" if opts.quick else "smollm2-135m-instruct")
    new_tokens = opts.new_tokens or (8 if opts.quick else 48)
    repeats = opts.repeats or (2 if opts.quick else 5)
    batches = [int(b) for b in opts.batches.split(",") if b.strip()]
    if any(b < GROUP or b % GROUP for b in batches):
        parser.error(f"--batches must be multiples of {GROUP}, got {opts.batches}")
    default_engines = [e for e in ENGINES if not (opts.quick and ENGINES[e].compiled)]
    names = opts.engines.split(",") if opts.engines else default_engines
    for name in names:
        if name not in ENGINES:
            parser.error(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")

    model, tokenizer = load_model_and_tokenizer(model_name, seed=0)
    model.eval()
    shape = DecodeShape.from_config(model.config)
    rows = arithmetic_dataset(max(batches) // GROUP, "train", seed=0)  # the demo's task
    prompts = tokenize_prompts([r["prompt"] for r in rows], tokenizer, 512)
    params = plain_sampling(new_tokens, 1.0)

    print(f"measuring peaks ({torch.get_num_threads()} torch threads)...", flush=True)
    peaks = measure_peaks(shape, batches, opts.quick)

    engines = {name: build_engine(name, model, tokenizer, params) for name in names}
    measured: dict[int, dict[str, Measurement]] = {}
    for batch in batches:
        measured[batch] = measure_engines(engines, prompts, batch, params, repeats, opts.seed)

    # -- ceilings ---------------------------------------------------------------------------------
    model_params = sum(p.numel() for p in model.parameters())
    ceilings: dict[tuple[str, int], Ceiling] = {}
    costs: dict[tuple[str, int], StepCost] = {}
    for batch in batches:
        prompt_tokens = statistics.mean(len(p) for p in prompts[: batch // GROUP])
        context = mean_context(prompt_tokens, new_tokens)
        for dtype, nbytes in DTYPE_BYTES.items():
            cost = decode_step_cost(shape, batch, context, nbytes, nbytes)
            costs[dtype, batch] = cost
            ceilings[dtype, batch] = ceiling(
                cost, batch, peaks.matmul_best[dtype] * 1e9, peaks.bandwidth_gb_s * 1e9
            )

    lines: list[str] = []
    out = lines.append
    out("")
    out(f"Roofline of decoding: {model_name} on {cpu_name()}, "
        f"torch {torch.__version__}, {peaks.threads} threads")  # fmt: skip
    out(f"  memory: copy {peaks.copy_gb_s:.1f} GB/s (read + write), read-reduce "
        f"{peaks.read_gb_s:.1f} GB/s, over {peaks.buffer_bytes / 2**20:.0f} MiB (last-level "
        f"cache {peaks.cache_bytes / 2**20:.0f} MiB); bandwidth used: "
        f"{peaks.bandwidth_gb_s:.1f} GB/s")  # fmt: skip
    for dtype in DTYPE_BYTES:
        decode = ", ".join(f"B={b} {g:.1f}" for b, g in peaks.matmul_decode[dtype].items())
        out(f"  {dtype} matmul: best {peaks.matmul_best[dtype]:.0f} GFLOP/s "
            f"({peaks.matmul_best_shape[dtype]}); decode-shaped [B x {shape.hidden}] @ "
            f"[{shape.hidden} x {4 * shape.hidden}]: {decode} GFLOP/s")  # fmt: skip
    out(f"  model: {model_params / 1e6:.1f}M parameters; per token step "
        f"{shape.non_embedding_params / 1e6:.1f}M non-embedding + {shape.lm_head_params / 1e6:.1f}M"
        f" LM head; {shape.layers} layers, attention {shape.heads} x {shape.head_dim}, KV "
        f"{shape.kv_heads} heads")  # fmt: skip
    out("")
    out("Ceilings (per token step, context = mean prompt + (new_tokens + 1) / 2):")
    out(f"  {'weights':7s} {'batch':>5s} {'GFLOP':>7s} {'MB':>7s} {'compute tok/s':>14s} "
        f"{'memory tok/s':>13s} {'ceiling tok/s':>14s}  binds")  # fmt: skip
    for (dtype, batch), c in ceilings.items():
        cost = costs[dtype, batch]
        out(f"  {dtype:7s} {batch:5d} {cost.flops / 1e9:7.2f} {cost.bytes / 1e6:7.1f} "
            f"{c.compute_tokens_per_s:14.0f} {c.memory_tokens_per_s:13.0f} "
            f"{c.tokens_per_s:14.0f}  {c.binds}")  # fmt: skip
    out("")
    out(f"Engines (batch = prompts x {GROUP}, <= {new_tokens} new tokens, "
        f"median of {repeats} interleaved repeats, seed {opts.seed}; tok/s = kept tokens per "
        "wall second):")  # fmt: skip
    out(f"  {'engine':16s} {'':28s} {'batch':>5s} {'kept tok':>8s} {'median s':>9s} "
        f"{'tok/s':>8s} {'x (b)':>6s} {'% roofline':>11s}")  # fmt: skip
    table: list[dict[str, Any]] = []
    for batch in batches:
        base = measured[batch].get(BASELINE)
        for name in names:
            spec = ENGINES[name]
            m = measured[batch][name]
            ratio = m.tokens_per_s / base.tokens_per_s if base else None
            cap = ceilings[spec.ceiling_dtype, batch].tokens_per_s
            fraction = m.tokens_per_s / cap
            ratio_text = f"{ratio:6.2f}" if ratio is not None else f"{'n/a':>6s}"
            out(f"  {name:16s} {spec.label:28s} {batch:5d} {statistics.median(m.kept_tokens):8.0f} "
                f"{m.median_s:9.3f} {m.tokens_per_s:8.1f} {ratio_text} "
                f"{100 * fraction:7.1f}% {spec.ceiling_dtype}")  # fmt: skip
            table.append({
                "engine": name, "batch": batch,
                "kept_tokens": m.kept_tokens, "seconds": m.seconds, "warmup_s": m.warmup_s,
                "median_s": m.median_s, "tokens_per_s": m.tokens_per_s,
                "ratio_to_baseline": ratio, "ceiling_dtype": spec.ceiling_dtype,
                "ceiling_tokens_per_s": cap, "fraction_of_ceiling": fraction,
            })  # fmt: skip
    if "hf-bf16" in engines:
        out("  (b) keeps fp32 weights and casts them every step, so it moves more bytes than "
            "its bf16 ceiling assumes")  # fmt: skip

    compile_rows: list[dict[str, Any]] = []
    for batch in batches:
        for name in engines:
            if not ENGINES[name].compiled:
                continue
            m = measured[batch][name]
            eager = measured[batch].get(name.removesuffix("-compile"))
            steps = payoff_steps(m.compile_s, eager.median_s, m.median_s) if eager else None
            paid = ("never (not faster than eager)" if eager and steps is None else
                    f"after {steps:.0f} rollouts" if steps is not None else
                    "n/a (eager engine not measured)")  # fmt: skip
            eager_text = f"{eager.median_s:.3f} s" if eager else "n/a"
            out(f"  compile: {name} batch {batch}: {m.compile_s:.1f} s (warm-up less a steady "
                f"call, excluded from tok/s); rollout {m.median_s:.3f} s vs eager "
                f"{eager_text}; pays off {paid}")  # fmt: skip
            compile_rows.append({"engine": name, "batch": batch, "compile_s": m.compile_s,
                                 "payoff_rollouts": steps})  # fmt: skip

    # -- targets ----------------------------------------------------------------------------------
    out("")
    targets: list[dict[str, Any]] = []
    static_names = [n for n in names if n.startswith("static")]

    def target(title: str, batch: int, figure: Callable[[Measurement], float], goal: float,
               unit: str) -> None:  # fmt: skip
        parts = []
        for name in static_names:
            if batch not in measured or (unit == "x" and BASELINE not in engines):
                parts.append(f"{name} n/a (batch {batch} or the baseline not measured)")
            else:
                value = figure(measured[batch][name])
                verdict = "PASS" if value >= goal else "MISS"
                shown = f"{value:.2f}x" if unit == "x" else f"{100 * value:.0f}%"
                parts.append(f"{name} {shown} {verdict}")
                targets.append({"target": title, "engine": name, "value": value,
                                "goal": goal, "pass": value >= goal})  # fmt: skip
        out(f"target: {title}: " + ("; ".join(parts) if parts else "n/a (no static engine run)"))

    target("static >= 3x today's bf16-autocast loop at batch 16", 16,
           lambda m: m.tokens_per_s / measured[16][BASELINE].tokens_per_s, 3.0, "x")  # fmt: skip
    target("static >= 50% of the bf16 roofline at batch 64", 64,
           lambda m: m.tokens_per_s / ceilings["bf16", 64].tokens_per_s, 0.5, "%")  # fmt: skip
    print("\n".join(lines))

    report = {
        "model": model_name,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "seed": opts.seed,
        "peaks": {**asdict(peaks), "bandwidth_gb_s": peaks.bandwidth_gb_s},
        "shape": asdict(shape),
        "ceilings": [
            {
                "dtype": d,
                "batch": b,
                "flops": costs[d, b].flops,
                "bytes": costs[d, b].bytes,
                "compute_tokens_per_s": c.compute_tokens_per_s,
                "memory_tokens_per_s": c.memory_tokens_per_s,
                "tokens_per_s": c.tokens_per_s,
                "binds": c.binds,
            }
            for (d, b), c in ceilings.items()
        ],  # fmt: skip
        "engines": table,
        "compile": compile_rows,
        "targets": targets,
    }
    if opts.json:
        Path(opts.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {opts.json}")
    return report


if __name__ == "__main__":
    main()
