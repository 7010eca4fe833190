"""The prepared GPU check's real-size stages (``gpu_check.py --suite real``): random-weight models
of shipped shapes, at the sizes a user trains them, on one GPU in under 8 minutes.

1. real_full_ft: Qwen2.5-1.5B, full fine-tune under bf16 mixed precision (fp32 weights and AdamW,
   bf16 autocast), 4 prompts x G 8 per step, 256-token prompts, 512-token completions, gradient
   checkpointing, beta 0: with the HF engine and with the default engine (``generation_engine:
   auto``: the static engine with CUDA graphs on a GPU). Per engine: seconds per step (median
   after the first), generation tokens/s, and peak ``torch.cuda.max_memory_reserved`` against
   the memory planner's prediction for the same settings.
2. real_trl: TRL's GRPOTrainer (the carried trl wheel; transformers' generate, no vLLM) on the same
   model and settings in the same run: its seconds per step and peak memory, and the ratios of
   groupwise's (HF engine and default engine) to it.
3. real_qlora: Qwen3-8B QLoRA (NF4 base with nested quantization, a rank-16 LoRA adapter on every
   linear, bf16 compute), the same batch: seconds per step, tokens/s, peak memory against the
   planner's prediction. Needs the ``load_in_4bit`` options and bitsandbytes.
4. real_offload: the 1.5B run again with ``activation_offloading`` and ``padding_free``, where
   this tree has them: peak memory and seconds per step against stage 1's.

A stage whose options, planner functions or packages are absent passes with ``skipped`` naming
what is missing, so the check runs on any merge order of the branches that add them. With
``--quick`` every stage runs at tiny sizes (the CPU rehearsal, tests/system/test_gpu_check.py),
where peak memory is not measured (a process's peak RSS is its lifetime's).
"""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class RealSizes:
    prompts: int
    group: int
    prompt_len: int
    completion_len: int
    steps: int  # per run; the first is warm-up, the rest are timed
    lora_r: int = 16
    qlora_steps: int = 2  # the 8B run: one warm-up step and one timed (the 8-minute budget)
    trl_steps: int = 2  # TRL's run: likewise (its first step is left out as groupwise's is)


REAL = RealSizes(prompts=4, group=8, prompt_len=256, completion_len=512, steps=3)
QUICK = RealSizes(prompts=2, group=4, prompt_len=24, completion_len=8, steps=2, lora_r=4,
                  qlora_steps=2)


def sizes(ns) -> RealSizes:
    return QUICK if ns.quick else REAL


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
    """Peak reserved GPU memory over a block, above what was reserved when it began (None on a
    CPU: a process's peak RSS is its lifetime's, not this block's)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.bytes: int | None = None

    def __enter__(self) -> Peak:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_reserved()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_reserved() - self.baseline


def groupwise_run(
    ns, base: ModuleType, folder: Path, out: Path, steps: int | None = None, **options: Any
) -> dict[str, Any]:
    """``sizes(ns).steps`` GRPO steps of groupwise on ``folder``: the trainer's own phase timers
    (medians after the first step), generation tokens/s and peak memory."""
    from groupwise import GRPOTrainer

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
        trainer = GRPOTrainer(str(folder), base.lower_half_reward, rows, args=args)
        trainer.train()
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
        "steps_logged": len(rows), "median_s": medians,
        "generation_tokens_per_step": round(tokens),
        "generation_tokens_per_s": round(tokens / medians["generation"], 1)
        if medians["generation"] > 0 else None,
        "peak_reserved_bytes": peak.bytes,
        "weights_dtype": str(next(trainer.model.parameters()).dtype),
    }  # fmt: skip
    del trainer
    base.release(ns.torch_device)
    return result


def predicted_bytes(folder: Path, ns, **fields: Any) -> tuple[int | None, str]:
    """The memory planner's GRPO total for ``folder``'s shape with MemoryOptions ``fields``, or
    None and why (a field or function this tree's planner lacks)."""
    try:
        from groupwise.memory.plan import MemoryOptions, plan_grpo, total_bytes
        from groupwise.memory.shapes import resolve_model_shape
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
    return total_bytes(plan), "groupwise.memory.plan.plan_grpo"


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


def plan_fields(s: RealSizes, **extra: Any) -> dict[str, Any]:
    """The planner's options for a bf16-mixed run of these sizes (as groupwise.memory.measure
    plans what a run did: fp32 weights with AdamW in their dtype)."""
    fields = dict(dtype="fp32", precision="pure", batch=s.prompts * s.group, group_size=s.group,
                  prompt_len=s.prompt_len, completion_len=s.completion_len,
                  gradient_checkpointing=True, beta=0.0)  # fmt: skip
    return {**fields, **extra}


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB"


def check_full_ft(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    s = sizes(ns)
    folder = scratch / "qwen2.5-1.5b"
    out: dict[str, Any] = {"sizes": dataclasses.asdict(s), "model": "qwen2.5-1.5b",
                           **build_folder(folder, "qwen2.5-1.5b", ns, base)}  # fmt: skip
    passed, parts = True, []
    # The HF engine, and the default (generation_engine: auto where this tree has it: the static
    # engine with CUDA graphs on a GPU).
    for engine, options in (("hf", {"generation_engine": "hf"}), ("default", {})):
        try:
            result = groupwise_run(ns, base, folder, scratch / f"full-{engine}", **options)
        except Exception as err:  # noqa: BLE001 - recorded; the other engine still runs
            out[engine] = {"error": f"{type(err).__name__}: {err}"[:400]}
            passed = False
            base.release(ns.torch_device)
            continue
        static = result["engine"] == "StaticEngine"
        extra = {"generation_engine": "static", "generation_dtype": "bf16"} if static else {}
        predicted, why = predicted_bytes(folder, ns, **plan_fields(s, **extra))
        ok = memory_verdict(result, predicted, why, base) and result["steps_logged"] == s.steps
        out[engine] = result
        passed = passed and ok
        parts.append(f"{engine}->{result['engine']} {result['median_s']['step']:.2f} s/step, "
                     f"gen {result['generation_tokens_per_s']} tok/s, peak "
                     f"{gib(result['peak_reserved_bytes'])} / planned "
                     f"{gib(predicted)}")  # fmt: skip
    if "median_s" in out.get("hf", {}) and "median_s" in out.get("default", {}):
        out["default_over_hf_step"] = round(out["default"]["median_s"]["step"]
                                            / out["hf"]["median_s"]["step"], 3)  # fmt: skip
    out["passed"] = passed
    out["summary"] = "; ".join(parts) or "no run finished"
    return out


def check_trl(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    """TRL's GRPOTrainer on the 1.5B folder of real_full_ft, its sizes and precision."""
    if importlib.util.find_spec("trl") is None:
        reason = "not run: trl does not import (carry scripts/wheels/trl-1.16.0-*.whl)"
        return {"passed": True, "skipped": reason, "summary": reason}
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    s = sizes(ns)
    folder = scratch / "qwen2.5-1.5b"
    out: dict[str, Any] = {"trl": trl.__version__, **build_folder(folder, "qwen2.5-1.5b", ns, base)}
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
        temperature=1.0, disable_tqdm=True,
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
    out["weights_dtype"] = str(next(trainer.model.parameters()).dtype)
    out["step_seconds"] = [round(t, 3) for t in timer.seconds]
    kept = timer.seconds[1:] or timer.seconds
    out["median_step_s"] = round(statistics.median(kept), 3) if kept else None
    out["peak_reserved_bytes"] = peak.bytes
    del trainer
    base.release(ns.torch_device)
    full = ns.results.get("real_full_ft", {})
    ratios = {}
    for engine in ("hf", "default"):
        mine = full.get(engine, {})
        if "median_s" in mine and out["median_step_s"]:
            ratios[f"{engine}_step_over_trl"] = round(mine["median_s"]["step"]
                                                      / out["median_step_s"], 3)  # fmt: skip
        if mine.get("peak_reserved_bytes") and peak.bytes:
            ratios[f"{engine}_memory_over_trl"] = round(mine["peak_reserved_bytes"] / peak.bytes, 3)
    out["groupwise_over_trl"] = ratios
    out["passed"] = len(timer.seconds) == s.trl_steps
    out["summary"] = (f"TRL {trl.__version__}: {out['median_step_s']} s/step, peak "
                      f"{gib(peak.bytes)}; groupwise / TRL {ratios or 'n/a'}")  # fmt: skip
    return out


def check_qlora(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    needed = ("load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant")
    missing = [name for name in needed if name not in base.grpo_fields()]
    if missing:
        reason = f"not run: GRPOConfig has no {', '.join(missing)} (QLoRA options not in this tree)"
        return {"passed": True, "skipped": reason, "summary": reason}
    if importlib.util.find_spec("bitsandbytes") is None:
        reason = "not run: bitsandbytes does not import (carry its wheel in .whl)"
        return {"passed": True, "skipped": reason, "summary": reason}
    s = sizes(ns)
    folder = scratch / "qwen3-8b"
    out: dict[str, Any] = {"sizes": dataclasses.asdict(s), "model": "qwen3-8b",
                           **build_folder(folder, "qwen3-8b", ns, base)}  # fmt: skip
    result = groupwise_run(
        ns, base, folder, scratch / "qlora", steps=s.qlora_steps, use_peft=True, lora_r=s.lora_r,
        lora_alpha=2 * s.lora_r, load_in_4bit=True, bnb_4bit_quant_type="nf4",
        use_bnb_nested_quant=True,
        dtype="auto", bf16_autocast=None,  # LoRA's default: bf16 base on a bf16 GPU, autocast
    )  # fmt: skip
    bf16 = ns.torch_device.type == "cuda"
    predicted, why = predicted_bytes(folder, ns, **plan_fields(
        s, lora_r=s.lora_r, load_in_4bit=True, double_quant=True,
        dtype="bf16" if bf16 else "fp32", precision="mixed" if bf16 else "pure",
    ))  # fmt: skip
    ok = memory_verdict(result, predicted, why, base)
    out.update(result)
    out["passed"] = ok and result["steps_logged"] == s.qlora_steps
    out["summary"] = (f"{result['engine']} {result['median_s']['step']:.2f} s/step, gen "
                      f"{result['generation_tokens_per_s']} tok/s, peak "
                      f"{gib(result['peak_reserved_bytes'])} / planned {gib(predicted)} "
                      f"({why})")  # fmt: skip
    return out


def check_offload(ns, scratch: Path, base: ModuleType) -> dict[str, Any]:
    present = [n for n in ("activation_offloading", "padding_free") if n in base.grpo_fields()]
    if not present:
        reason = "not run: GRPOConfig has neither activation_offloading nor padding_free"
        return {"passed": True, "skipped": reason, "summary": reason}
    folder = scratch / "qwen2.5-1.5b"
    out: dict[str, Any] = {"options": present, **build_folder(folder, "qwen2.5-1.5b", ns, base)}
    result = groupwise_run(ns, base, folder, scratch / "offload",
                           **{name: True for name in present})  # fmt: skip
    out.update(result)
    plain = ns.results.get("real_full_ft", {}).get("default", {})
    if plain.get("peak_reserved_bytes") and result["peak_reserved_bytes"]:
        out["memory_over_plain"] = round(result["peak_reserved_bytes"]
                                         / plain["peak_reserved_bytes"], 3)  # fmt: skip
    if "median_s" in plain:
        out["step_over_plain"] = round(result["median_s"]["step"] / plain["median_s"]["step"], 3)
    out["passed"] = result["steps_logged"] == sizes(ns).steps
    out["summary"] = (f"{'+'.join(present)}: {result['median_s']['step']:.2f} s/step, peak "
                      f"{gib(result['peak_reserved_bytes'])}; x plain: memory "
                      f"{out.get('memory_over_plain', 'n/a')}, step "
                      f"{out.get('step_over_plain', 'n/a')}")  # fmt: skip
    return out


STAGES = {
    "real_full_ft": check_full_ft,
    "real_trl": check_trl,
    "real_qlora": check_qlora,
    "real_offload": check_offload,
}
