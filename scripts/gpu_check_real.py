"""The prepared GPU check's real-size stages (``gpu_check.py --suite real``): random-weight models
of shipped shapes, at the sizes a user trains them, on one H100 in under 7 minutes. The stages run
in the order of what they tell, so the ones dropped when time runs short are the least telling:

1. real_qlora: Qwen3-8B QLoRA (NF4 base with nested quantization, a rank-16 LoRA adapter on every
   linear, bf16 compute) at the documented configuration: 4 prompts x G 8, micro-batches of 8 x
   4 gradient accumulation steps, 256-token prompts, 512-token completions, gradient
   checkpointing. Its peak ``torch.cuda.max_memory_reserved`` must stay under 22 GiB (what a
   24 GB card leaves); ``torch.cuda.mem_get_info`` before and after, the memory planner's
   prediction for the same settings and measured / planned are recorded.
2. real_full_ft: Qwen2.5-1.5B full fine-tune under bf16 mixed precision (fp32 weights, bf16
   autocast) with bitsandbytes' 8-bit AdamW (``optim: adamw_8bit``) and the default engine
   (``generation_engine: auto``: the static engine with CUDA graphs on a GPU), the same batch in
   one micro-batch: seconds per step (median after the first), generation tokens/s, peak memory
   against the planner's prediction.
3. real_decode_4bit: generation alone on the 4-bit + LoRA Qwen3-8B: the static engine (asked for
   through the config, ``generation_engine: static``) against the HF engine on the same model,
   the same prompts, greedy: tokens/s of each and the share of identical rows.
4. real_trl: TRL's GRPOTrainer (the carried trl wheel; transformers' generate, no vLLM) on the
   1.5B folder with the same settings and optimizer: its seconds per step and peak memory, and
   groupwise's (real_full_ft) over it.
5. real_offload: the 1.5B run again with ``activation_offloading`` and ``padding_free``: peak
   memory and seconds per step against real_full_ft's.

A stage that cannot run (an option this tree lacks, a package that does not import) fails with
the reason: a green summary means every stage ran. ``ESTIMATE_S`` holds each stage's expected
seconds on one H100; gpu_check.py starts a stage only when it fits in what is left of the time
budget. No stage writes a final model (:func:`trainer_class`). With ``--quick`` every stage runs
at tiny sizes (the CPU rehearsal, tests/system/test_gpu_check.py), where peak memory is not
measured (a process's peak RSS is its lifetime's).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

# The shipped config.json shapes (groupwise.memory.shapes.model_config where this tree has it;
# these are the same fields, for a tree without it).
FALLBACK_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
        tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=1000000.0,
    ),
    "qwen3-8b": dict(
        model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        tie_word_embeddings=False, max_position_embeddings=40960, rope_theta=1000000.0,
    ),
}  # fmt: skip
# --quick: the same architectures at the tiny-random model's size.
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=49152,
            max_position_embeddings=1024)  # fmt: skip
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=2)  # the synthetic tokenizer's

# The QLoRA stage's limit on peak max_memory_reserved: what a 24 GB card leaves to PyTorch's
# allocator once the CUDA context and other processes' share are taken.
QLORA_LIMIT_BYTES = 22 * 2**30
# Expected seconds of each stage on one H100 at the real sizes, from its arithmetic (model
# build and save, load, decode steps at the HF loop's or the static engine's per-token time,
# update FLOPs), not from a run. gpu_check.py starts a stage only when it fits.
ESTIMATE_S = {
    "real_qlora": 150,  # 8B build + save 25, 4-bit load 30, 2 steps of 512 HF decode steps + update
    "real_full_ft": 45,  # 1.5B build + load 10, graph capture 10, 3 steps of about 7 s
    "real_decode_4bit": 60,  # 4-bit load 30, HF 256 tokens 15, static build + 2 x 256 tokens 15
    "real_trl": 60,  # load 5, 2 steps of transformers' generate (512 tokens) + update
    "real_offload": 45,  # as real_full_ft, with host copies of the activations
}
# The packages whose versions decide what the stages measure; printed and recorded at start.
VERSIONED = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "trl", "datasets")


@dataclasses.dataclass(frozen=True)
class RealSizes:
    prompts: int
    group: int
    prompt_len: int
    completion_len: int
    steps: int  # per run; the first is warm-up, the rest are timed
    lora_r: int = 16
    qlora_steps: int = 2  # the 8B run: one warm-up step and one timed (the time budget)
    qlora_micro_batch: int = 8  # per_device_train_batch_size of the QLoRA run
    qlora_accumulation: int = 4  # its gradient_accumulation_steps (micro x accumulation = batch)
    trl_steps: int = 2  # TRL's run: likewise (its first step is left out as groupwise's is)
    decode_tokens: int = 256  # real_decode_4bit: new tokens per row, greedy


REAL = RealSizes(prompts=4, group=8, prompt_len=256, completion_len=512, steps=3)
QUICK = RealSizes(prompts=2, group=4, prompt_len=24, completion_len=8, steps=2, lora_r=4,
                  qlora_micro_batch=4, qlora_accumulation=2, decode_tokens=8)  # fmt: skip


def sizes(ns) -> RealSizes:
    return QUICK if ns.quick else REAL


def package_versions() -> dict[str, str | None]:
    """The installed version of each of ``VERSIONED`` (None: not installed), as this process
    sees them (the carried wheels' folder comes first on its path)."""
    found: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def not_run(reason: str) -> dict[str, Any]:
    """A stage that could not run: it fails, with the reason (a check that did not check is no
    pass)."""
    return {"passed": False, "not_run": reason, "summary": f"NOT RUN: {reason}"}


def missing_options(base: ModuleType, *names: str) -> str | None:
    """Why a stage cannot run in this tree (GRPOConfig lacks one of ``names``), or None."""
    fields = base.grpo_fields()
    missing = [name for name in names if name not in fields]
    return f"GRPOConfig has no {', '.join(missing)}" if missing else None


def bitsandbytes_problem(device: torch.device) -> str | None:
    """Why bitsandbytes cannot serve a stage here, or None: not installed, or it fails to
    import (on CUDA, a library built for another CUDA fails here)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed (carry its wheel in .whl: make gpu-check-wheels)"
    try:
        import bitsandbytes  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure is the reason
        return f"bitsandbytes does not import: {type(err).__name__}: {err}"[:400]
    return None


def model_config(name: str, quick: bool) -> tuple[Any, str]:
    """A transformers config of the shipped model ``name`` (tiny with ``quick``), and where its
    shape came from."""
    from transformers import AutoConfig

    try:
        from groupwise.memory.shapes import model_config as shipped

        config, source = shipped(name), "groupwise.memory.shapes.model_config"
        fields = config.to_dict()
        model_type = config.model_type
    except (ImportError, AttributeError):
        fields, source = dict(FALLBACK_SHAPES[name]), "the check's copy of config.json"
        model_type = fields.pop("model_type")
    fields = {k: v for k, v in fields.items() if k not in ("model_type", "transformers_version")}
    if quick:
        fields.update(TINY)
        # transformers derives layer_types from num_hidden_layers when it is not given; the
        # shipped config's list has the full model's length.
        fields.pop("layer_types", None)
    fields.update(SPECIAL_IDS)
    return AutoConfig.for_model(model_type, **fields), source


def build_folder(folder: Path, name: str, ns, base: ModuleType) -> dict[str, Any]:
    """A seeded random model of ``name``'s shape in bf16 and the synthetic tokenizer, saved as a
    Hugging Face folder (what the runs load, as a user's checkpoint would be)."""
    from transformers import AutoModelForCausalLM

    config, source = model_config(name, ns.quick)
    if folder.exists():
        return {"shape_from": source, "reused": True}
    began = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(ns.torch_device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    base.synthetic_tokenizer(config.vocab_size).save_pretrained(folder)
    info = {"shape_from": source, "model_type": config.model_type,
            "parameters": sum(p.numel() for p in model.parameters()),
            "layers": config.num_hidden_layers, "hidden": config.hidden_size}  # fmt: skip
    del model
    base.release(ns.torch_device)
    info["build_and_save_s"] = round(time.perf_counter() - began, 1)
    return info


def prompt_rows(n: int, length: int) -> list[dict[str, str]]:
    """``n`` plain-text prompts of ``length`` characters: ``length`` tokens under the synthetic
    tokenizer (one per character), different for every row."""
    rows = []
    for i in range(n):
        text = f"Problem {i}: " + " ".join(f"{i * 7 + k} plus {k}" for k in range(length))
        rows.append({"prompt": text[:length]})
    return rows


class Peak:
    """GPU memory over a block: the peak ``max_memory_reserved`` (absolute, and above what was
    reserved when the block began) and ``mem_get_info`` at both ends. On a CPU every figure is
    None (a process's peak RSS is its lifetime's, not this block's)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.bytes: int | None = None  # peak reserved above the baseline
        self.max_reserved: int | None = None  # peak reserved, absolute
        self.info: dict[str, int] = {}

    def __enter__(self) -> Peak:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_reserved()
            free, total = torch.cuda.mem_get_info()
            # What the device holds outside this process's caching allocator: the CUDA context,
            # library workspaces, other processes.
            self.info = {"free_before": free, "total": total,
                         "outside_allocator": total - free - self.baseline}  # fmt: skip
        return self

    def mark(self) -> None:
        """Read ``mem_get_info`` now (while what the block built still holds its memory)."""
        if self.cuda:
            torch.cuda.synchronize()
            self.info["free_after"] = torch.cuda.mem_get_info()[0]

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            if "free_after" not in self.info:
                self.mark()
            self.max_reserved = torch.cuda.max_memory_reserved()
            self.bytes = self.max_reserved - self.baseline

    def record(self) -> dict[str, Any]:
        return {"peak_reserved_bytes": self.bytes, "max_memory_reserved_bytes": self.max_reserved,
                "mem_get_info": self.info or None}  # fmt: skip


def trainer_class() -> type:
    """groupwise's GRPOTrainer without the final ``save_model``: the check keeps no model (a
    1.5B full fine-tune's fp32 weights are 6 GB of disk and tens of seconds)."""
    from groupwise import GRPOTrainer

    class CheckTrainer(GRPOTrainer):
        def save_model(self, path=None, output_dir=None) -> Path:
            return Path(path if path is not None else output_dir or self.output_dir)

    return CheckTrainer


def optimizer_name(trainer: Any) -> str | None:
    """The class of ``trainer``'s optimizer (under accelerate's wrapper, TRL's) with its module,
    and the bits of its states where bitsandbytes says (transformers' ``adamw_8bit`` is
    bitsandbytes' AdamW with 8-bit states), or None."""
    optimizer = getattr(trainer, "optimizer", None)
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer
    if optimizer is None:
        return None
    kind = type(optimizer)
    bits = getattr(getattr(optimizer, "args", None), "optim_bits", None)
    return f"{kind.__module__}.{kind.__qualname__}" + (f" ({bits}-bit)" if bits else "")


def groupwise_run(
    ns, base: ModuleType, folder: Path, out: Path, steps: int | None = None, **options: Any
) -> dict[str, Any]:
    """``sizes(ns).steps`` GRPO steps of groupwise on ``folder``: the trainer's own phase timers
    (medians after the first step), generation tokens/s and GPU memory (:class:`Peak`)."""
    s = sizes(ns)
    values = dict(
        max_steps=steps or s.steps, num_generations=s.group,
        per_device_train_batch_size=s.prompts * s.group,
        max_prompt_length=s.prompt_len, max_completion_length=s.completion_len,
        learning_rate=1e-6, beta=0.0, gradient_checkpointing=True, logging_steps=1,
        loss_type="dapo", lr_scheduler_type="linear",  # TRL's, as the TRL run below has them
        **base.MODES["bf16_mixed"],
    )  # fmt: skip
    values.update(options)
    args = base.grpo_config(ns, folder, out, **values)
    with Peak(ns.torch_device) as peak:
        rows = prompt_rows(s.prompts * (steps or s.steps), s.prompt_len)
        began = time.perf_counter()
        trainer = trainer_class()(str(folder), base.lower_half_reward, rows, args=args)
        built = time.perf_counter()
        trainer.train()
        trained = time.perf_counter()
        peak.mark()
    rows = [row for row in trainer.log_history if "time/step" in row]
    kept = rows[1:] or rows
    medians = {phase: round(statistics.median(r[f"time/{phase}"] for r in kept), 3)
               for phase in base.STEP_PHASES}  # fmt: skip
    tokens = statistics.median(
        r.get("completions/mean_length", 0.0) * s.prompts * s.group for r in kept
    )
    result = {
        "engine": type(trainer.engine).__name__,
        "cuda_graphs": getattr(getattr(trainer.engine, "graphs", None), "captures", None),
        "optimizer": optimizer_name(trainer),
        "steps_logged": len(rows), "median_s": medians,
        "trainer_build_s": round(built - began, 1), "train_s": round(trained - built, 1),
        "generation_tokens_per_step": round(tokens),
        "generation_tokens_per_s": round(tokens / medians["generation"], 1)
        if medians["generation"] > 0 else None,
        **peak.record(),
        "weights_dtype": str(next(trainer.model.parameters()).dtype),
    }  # fmt: skip
    del trainer
    base.release(ns.torch_device)
    return result


def predicted_bytes(folder: Path, ns, **fields: Any) -> tuple[int | None, str]:
    """The memory planner's GRPO peak for ``folder``'s shape with MemoryOptions ``fields``
    (through groupwise.memory's public names), or None and why (a field or function this tree's
    planner lacks)."""
    try:
        from groupwise.memory import MemoryOptions, plan_grpo, resolve_model_shape, total_bytes
    except ImportError as err:
        return None, f"planner unavailable ({err})"
    known = {f.name for f in dataclasses.fields(MemoryOptions)}
    missing = sorted(k for k in fields if k not in known)
    if missing:
        return None, f"the planner's MemoryOptions lacks {', '.join(missing)}"
    try:
        plan = plan_grpo(resolve_model_shape(str(folder)), MemoryOptions(**fields))
    except Exception as err:  # noqa: BLE001 - recorded: the stage still measures
        return None, f"planner error: {type(err).__name__}: {err}"[:300]
    return total_bytes(plan), "groupwise.memory.plan_grpo"


def memory_verdict(result: dict[str, Any], predicted: int | None, why: str, base) -> bool:
    """Record measured / predicted; True when it is within the check's band or not measurable
    here (CPU, or no prediction: the reason is recorded)."""
    result["predicted_bytes"], result["prediction"] = predicted, why
    measured = result.get("peak_reserved_bytes")
    if measured is None or predicted is None:
        return True
    ratio = measured / predicted
    result["measured_over_predicted"] = round(ratio, 3)
    return base.MEMORY_BAND[0] <= ratio <= base.MEMORY_BAND[1]


def memory_limit(max_reserved: int | None, limit: int, planned: int | None) -> dict[str, Any]:
    """The QLoRA stage's memory assertion: peak ``max_memory_reserved`` strictly under ``limit``
    bytes, with the headroom and measured / planned (None where unknown). ``under_limit`` is
    None where nothing was measured (a CPU)."""
    out: dict[str, Any] = {"limit_bytes": limit, "max_memory_reserved_bytes": max_reserved,
                           "planned_bytes": planned, "under_limit": None,
                           "headroom_bytes": None, "measured_over_planned": None}  # fmt: skip
    if max_reserved is not None:
        out["under_limit"] = max_reserved < limit
        out["headroom_bytes"] = limit - max_reserved
        if planned:
            out["measured_over_planned"] = round(max_reserved / planned, 3)
    return out


def plan_fields(s: RealSizes, **extra: Any) -> dict[str, Any]:
    """The planner's options for a bf16-mixed run of these sizes (as groupwise.memory.measure
    plans what a run did: fp32 weights with AdamW in their dtype)."""
    import torch

    # The engine the run's generation_engine: auto gets, resolved per method as the trainer does.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fields = dict(dtype="fp32", precision="pure", batch=s.prompts * s.group, group_size=s.group,
                  prompt_len=s.prompt_len, completion_len=s.completion_len,
                  gradient_checkpointing=True, beta=0.0, generation_engine="auto",
                  device=device)  # fmt: skip
    return {**fields, **extra}


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB"


def qlora_options(s: RealSizes) -> dict[str, Any]:
    """GRPOConfig options of the QLoRA runs: NF4 base with nested quantization, a rank-r LoRA
    adapter on every linear, LoRA's default dtype (bf16 base on a bf16 GPU) under autocast."""
    return dict(use_peft=True, lora_r=s.lora_r, lora_alpha=2 * s.lora_r, load_in_4bit=True,
                bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True, dtype="auto",
                bf16_autocast=None)  # fmt: skip


QLORA_OPTIONS = ("use_peft", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
                 "gradient_accumulation_steps", "gradient_checkpointing")  # fmt: skip


def check_qlora(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    """Qwen3-8B QLoRA at the documented configuration; peak reserved memory under 22 GiB."""
    reason = missing_options(base, *QLORA_OPTIONS) or bitsandbytes_problem(ns.torch_device)
    if reason:
        return not_run(reason)
    s = sizes(ns)
    folder = scratch / "qwen3-8b"
    out: dict[str, Any] = {"sizes": dataclasses.asdict(s), "model": "qwen3-8b",
                           **build_folder(folder, "qwen3-8b", ns, base)}  # fmt: skip
    result = groupwise_run(
        ns, base, folder, scratch / "qlora", steps=s.qlora_steps,
        per_device_train_batch_size=s.qlora_micro_batch,
        gradient_accumulation_steps=s.qlora_accumulation, **qlora_options(s),
    )  # fmt: skip
    bf16 = ns.torch_device.type == "cuda"
    predicted, why = predicted_bytes(folder, ns, **plan_fields(
        s, batch=s.qlora_micro_batch, grad_accum=s.qlora_accumulation, lora_r=s.lora_r,
        load_in_4bit=True, double_quant=True, dtype="bf16" if bf16 else "fp32",
        precision="mixed" if bf16 else "pure",
    ))  # fmt: skip
    in_band = memory_verdict(result, predicted, why, base)
    limit = memory_limit(result["max_memory_reserved_bytes"], QLORA_LIMIT_BYTES, predicted)
    out.update(result)
    out["memory_limit"] = limit
    steps_ok = result["steps_logged"] == s.qlora_steps
    out["passed"] = steps_ok and in_band and limit["under_limit"] is not False
    ratio = limit["measured_over_planned"]
    verdict = {True: "under", False: "OVER", None: "not measured on a CPU: limit"}
    info = result.get("mem_get_info") or {}
    used = (f"; mem_get_info: {gib(info['total'] - info['free_after'])} of {gib(info['total'])} "
            "in use after the last step") if "free_after" in info else ""  # fmt: skip
    out["summary"] = (
        f"{result['engine']}, {result['optimizer']}: {result['median_s']['step']:.2f} s/step, gen "
        f"{result['generation_tokens_per_s']} tok/s; max reserved "
        f"{gib(limit['max_memory_reserved_bytes'])} {verdict[limit['under_limit']]} "
        f"{gib(QLORA_LIMIT_BYTES)}; planned {gib(predicted)} ({why}); measured / planned "
        f"{ratio if ratio is not None else 'n/a'}{used}"
    )  # fmt: skip
    return out


def check_full_ft(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    """Qwen2.5-1.5B full fine-tune with the 8-bit AdamW and the default engine."""
    reason = missing_options(base, "optim", "generation_engine") or bitsandbytes_problem(
        ns.torch_device
    )
    if reason:
        return not_run(reason)
    s = sizes(ns)
    folder = scratch / "qwen2.5-1.5b"
    out: dict[str, Any] = {"sizes": dataclasses.asdict(s), "model": "qwen2.5-1.5b",
                           "optim": "adamw_8bit",
                           **build_folder(folder, "qwen2.5-1.5b", ns, base)}  # fmt: skip
    result = groupwise_run(ns, base, folder, scratch / "full-default", optim="adamw_8bit")
    static = result["engine"] == "StaticEngine"
    extra = {"generation_engine": "static", "generation_dtype": "bf16"} if static else {}
    predicted, why = predicted_bytes(folder, ns, **plan_fields(s, optimizer="adamw8bit", **extra))
    in_band = memory_verdict(result, predicted, why, base)
    out["default"] = result
    out["passed"] = in_band and result["steps_logged"] == s.steps
    out["summary"] = (f"{result['engine']}, {result['optimizer']}: "
                      f"{result['median_s']['step']:.2f} s/step, gen "
                      f"{result['generation_tokens_per_s']} tok/s, peak "
                      f"{gib(result['peak_reserved_bytes'])} / planned {gib(predicted)} "
                      f"({result.get('measured_over_predicted', 'n/a')})")  # fmt: skip
    return out


def timed_generation(
    engine: Any,
    prompts: list[list[int]],
    count: int,
    params: Any,
    device: torch.device,
    base: ModuleType,
) -> tuple[Any, float]:
    """One ``engine.generate`` and its wall seconds (synchronized)."""
    base.synchronize(device)
    began = time.perf_counter()
    rollout = engine.generate(prompts, count, params=params)
    base.synchronize(device)
    return rollout, time.perf_counter() - began


def check_decode_4bit(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    """The static engine against the HF engine decoding the 4-bit + LoRA Qwen3-8B: one model,
    loaded once (the trainer asked for ``generation_engine: static``; the HF engine is built
    over the same model), the same prompts, greedy."""
    reason = missing_options(base, *QLORA_OPTIONS, "generation_engine") or bitsandbytes_problem(
        ns.torch_device
    )
    if reason:
        return not_run(reason)
    from groupwise.rollout import HFEngine, plain_sampling

    s = sizes(ns)
    device = ns.torch_device
    folder = scratch / "qwen3-8b"
    out: dict[str, Any] = {"model": "qwen3-8b", "rows": s.prompts * s.group,
                           "prompt_len": s.prompt_len, "new_tokens": s.decode_tokens,
                           **build_folder(folder, "qwen3-8b", ns, base)}  # fmt: skip
    values = dict(max_steps=1, num_generations=s.group,
                  per_device_train_batch_size=s.prompts * s.group,
                  max_prompt_length=s.prompt_len, max_completion_length=s.decode_tokens,
                  **qlora_options(s))  # fmt: skip
    rows = prompt_rows(s.prompts, s.prompt_len)
    began = time.perf_counter()
    try:
        trainer = trainer_class()(str(folder), base.lower_half_reward, rows, args=base.grpo_config(
            ns, folder, scratch / "decode", generation_engine="static", **values))  # fmt: skip
        static_error = None
    except Exception as err:  # noqa: BLE001 - recorded; the HF engine is still measured
        static_error = f"{type(err).__name__}: {err}"[:500]
        base.release(device)
        trainer = trainer_class()(str(folder), base.lower_half_reward, rows, args=base.grpo_config(
            ns, folder, scratch / "decode", generation_engine="hf", **values))  # fmt: skip
    out["load_s"] = round(time.perf_counter() - began, 1)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1000, (s.prompt_len,), generator=generator).tolist()
               for _ in range(s.prompts)]  # fmt: skip
    greedy = plain_sampling(s.decode_tokens, 0.0)
    precision = trainer.run.precision
    # The HF engine first: a static engine that breaks while decoding leaves its numbers.
    engines: dict[str, Any] = {"hf": HFEngine(
        trainer.model, trainer.tokenizer, greedy,
        numerics=functools.partial(precision.generation_context, device),
    )}  # fmt: skip
    if static_error is None:
        engines["static"] = trainer.engine
    completions = {}
    with Peak(device) as peak:
        for name, engine in engines.items():
            # Warm-up: the static engine's full request (its CUDA graphs are captured per batch
            # shape), a few tokens for the HF engine (nothing to capture).
            warm = greedy if name == "static" else plain_sampling(min(16, s.decode_tokens), 0.0)
            try:
                _, warm_s = timed_generation(engine, prompts, s.group, warm, device, base)
                rollout, seconds = timed_generation(engine, prompts, s.group, greedy, device, base)
            except Exception as err:  # noqa: BLE001 - recorded; the other engine's numbers stay
                out[name] = {"engine": type(engine).__name__,
                             "error": f"{type(err).__name__}: {err}"[:500]}  # fmt: skip
                continue
            tokens = int(rollout.lengths.sum())
            completions[name] = rollout.completion_ids.tolist()
            out[name] = {"engine": type(engine).__name__, "warm_up_s": round(warm_s, 2),
                         "seconds": round(seconds, 3), "tokens": tokens,
                         "tokens_per_s": round(tokens / seconds, 1),
                         "cuda_graphs": getattr(getattr(engine, "graphs", None), "captures",
                                                None)}  # fmt: skip
    out.update(peak.record())
    del trainer, engines
    base.release(device)
    if static_error is not None:
        out["static"] = {"error": static_error}
    failed = [name for name in ("hf", "static") if "error" in out[name]]
    if failed:
        out["passed"] = False
        hf = out["hf"].get("tokens_per_s", "n/a")
        out["summary"] = "; ".join(f"{name} failed: {out[name]['error'][:200]}" for name in failed)
        out["summary"] += f"; hf {hf} tok/s" if "hf" not in failed else ""
        return out
    same = sum(a == b for a, b in zip(completions["static"], completions["hf"], strict=True))
    out["greedy_rows_identical"] = round(same / len(completions["hf"]), 3)
    out["static_over_hf_tokens_per_s"] = round(out["static"]["tokens_per_s"]
                                               / out["hf"]["tokens_per_s"], 3)  # fmt: skip
    out["passed"] = all(out[name]["tokens"] > 0 for name in ("static", "hf"))
    out["summary"] = (f"tokens/s static {out['static']['tokens_per_s']}, hf "
                      f"{out['hf']['tokens_per_s']} (x{out['static_over_hf_tokens_per_s']}); "
                      f"greedy rows identical {out['greedy_rows_identical']}")  # fmt: skip
    return out


def check_trl(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    """TRL's GRPOTrainer on the 1.5B folder of real_full_ft, its sizes, precision and optimizer."""
    if importlib.util.find_spec("trl") is None:
        return not_run("trl does not import (carry scripts/wheels/trl-1.16.0-*.whl)")
    reason = bitsandbytes_problem(ns.torch_device)
    if reason:
        return not_run(reason)
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    s = sizes(ns)
    folder = scratch / "qwen2.5-1.5b"
    out: dict[str, Any] = {"trl": trl.__version__, "optim": "adamw_8bit",
                           **build_folder(folder, "qwen2.5-1.5b", ns, base)}  # fmt: skip
    cuda = ns.torch_device.type == "cuda"

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            base.synchronize(ns.torch_device)
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            base.synchronize(ns.torch_device)
            self.seconds.append(time.perf_counter() - self.start)

    config = trl.GRPOConfig(
        output_dir=str(scratch / "trl"), per_device_train_batch_size=s.prompts * s.group,
        num_generations=s.group, max_completion_length=s.completion_len, max_steps=s.trl_steps,
        learning_rate=1e-6, beta=0.0, gradient_checkpointing=True, bf16=cuda, use_cpu=not cuda,
        logging_steps=1, report_to="none", save_strategy="no", use_vllm=False, seed=0,
        temperature=1.0, disable_tqdm=True, optim="adamw_8bit",
        # fp32 weights and AdamW under bf16 autocast, as groupwise's bf16 mixed precision (the
        # folder holds bf16 weights, which TRL's default dtype "auto" would train as they are).
        model_init_kwargs={"dtype": torch.float32},
    )  # fmt: skip
    timer = StepTimer()
    dataset = Dataset.from_list(prompt_rows(s.prompts * s.trl_steps, s.prompt_len))
    with Peak(ns.torch_device) as peak:
        trainer = trl.GRPOTrainer(
            model=str(folder), reward_funcs=base.lower_half_reward, args=config,
            train_dataset=dataset, callbacks=[timer],
        )  # fmt: skip
        trainer.train()
        peak.mark()
    out["weights_dtype"] = str(next(trainer.model.parameters()).dtype)
    out["optimizer"] = optimizer_name(trainer)
    out["step_seconds"] = [round(t, 3) for t in timer.seconds]
    kept = timer.seconds[1:] or timer.seconds
    out["median_step_s"] = round(statistics.median(kept), 3) if kept else None
    out.update(peak.record())
    del trainer
    base.release(ns.torch_device)
    mine = ns.results.get("real_full_ft", {}).get("default", {})
    ratios = {}
    if "median_s" in mine and out["median_step_s"]:
        ratios["step_over_trl"] = round(mine["median_s"]["step"] / out["median_step_s"], 3)
    if mine.get("peak_reserved_bytes") and peak.bytes:
        ratios["memory_over_trl"] = round(mine["peak_reserved_bytes"] / peak.bytes, 3)
    out["groupwise_over_trl"] = ratios
    out["passed"] = len(timer.seconds) == s.trl_steps
    out["summary"] = (f"TRL {trl.__version__} ({out['optimizer']}): {out['median_step_s']} "
                      f"s/step, peak {gib(peak.bytes)}; groupwise / TRL "
                      f"{ratios or 'n/a'}")  # fmt: skip
    return out


def check_offload(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    """real_full_ft's run with activation offloading and the padding-free update."""
    options = ("activation_offloading", "padding_free")
    reason = missing_options(base, *options, "optim") or bitsandbytes_problem(ns.torch_device)
    if reason:
        return not_run(reason)
    folder = scratch / "qwen2.5-1.5b"
    out: dict[str, Any] = {"options": list(options), "optim": "adamw_8bit",
                           **build_folder(folder, "qwen2.5-1.5b", ns, base)}  # fmt: skip
    result = groupwise_run(ns, base, folder, scratch / "offload", optim="adamw_8bit",
                           **{name: True for name in options})  # fmt: skip
    out.update(result)
    plain = ns.results.get("real_full_ft", {}).get("default", {})
    if plain.get("peak_reserved_bytes") and result["peak_reserved_bytes"]:
        out["memory_over_plain"] = round(result["peak_reserved_bytes"]
                                         / plain["peak_reserved_bytes"], 3)  # fmt: skip
    if "median_s" in plain:
        out["step_over_plain"] = round(result["median_s"]["step"] / plain["median_s"]["step"], 3)
    out["passed"] = result["steps_logged"] == sizes(ns).steps
    out["summary"] = (f"{'+'.join(options)}: {result['median_s']['step']:.2f} s/step, peak "
                      f"{gib(result['peak_reserved_bytes'])}; x real_full_ft: memory "
                      f"{out.get('memory_over_plain', 'n/a')}, step "
                      f"{out.get('step_over_plain', 'n/a')}")  # fmt: skip
    return out


# In the order they run: what they tell first (see the docstring).
STAGES = {
    "real_qlora": check_qlora,
    "real_full_ft": check_full_ft,
    "real_decode_4bit": check_decode_4bit,
    "real_trl": check_trl,
    "real_offload": check_offload,
}
