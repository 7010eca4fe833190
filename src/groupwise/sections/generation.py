"""Sampling the rollouts and the engine that does it (:class:`GenerationOptions`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ConfigError
from .base import Section, at_least, choice, require

# Rollout engines (generation_engine): hf = the Hugging Face / torch engine on the policy's own
# weights (rollout/hf.py); static = a lean Llama-family decoder with its own copy of the weights
# and a static KV cache (rollout/static.py); vllm = a colocated vLLM engine with its own copy of
# the weights (rollout/vllm.py). wiring.rollout.build_engine dispatches on the name; a new engine
# adds its name here and its branch there. auto (the default) is one of them, chosen when the run
# is built (resolve_generation_engine).
GENERATION_ENGINES: tuple[str, ...] = ("hf", "static", "vllm")
GENERATION_ENGINE_CHOICES: tuple[str, ...] = (*GENERATION_ENGINES, "auto")

STATIC_MULTI_TURN = (
    "generation_engine=static does not run tools or environments (multi-turn rollouts continue "
    "from the HF engine's KV cache, or run turn by turn on vLLM); use generation_engine: hf "
    "or vllm with tools / environment"
)
# vLLM's SamplingParams (vllm/sampling_params.py, 0.33) silently raises a temperature in (0, 0.01)
# to 0.01 and refuses one above 2; rollout/vllm.py checks each request the same way.
VLLM_TEMPERATURES = (0.01, 2.0)


@dataclass(frozen=True)
class GenerationOptions(Section):
    """Sampling the rollouts and the engine that does it (docs/speed-memory.md)."""

    name: ClassVar[str] = "generation"
    max_completion_length: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float | None
    repetition_penalty: float
    generation_kwargs: Mapping[str, Any] | None
    generation_engine: str
    generation_dtype: str
    static_compile: bool | None
    static_compile_min_steps: int
    static_eos_check_every: int
    static_cuda_graphs: bool | None
    vllm_mode: str
    vllm_server_base_url: str | None
    vllm_server_host: str
    vllm_server_port: int
    vllm_server_timeout: float
    vllm_group_port: int
    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int | None
    vllm_enable_sleep_mode: bool
    vllm_tensor_parallel_size: int
    vllm_enable_prefix_caching: bool

    def validate(self) -> None:
        if self.generation_kwargs:
            self._check_generation_kwargs()
        if not self.temperature > 0:
            raise ConfigError(
                f"temperature must be > 0, got {self.temperature} (GRPO samples its groups; at "
                "temperature 0 every completion of a prompt is the same and nothing is learned)"
            )
        at_least(self, 1, "max_completion_length")
        at_least(self, 0, "top_k")
        min_p, memory = self.min_p, self.vllm_gpu_memory_utilization
        require(
            self,
            ("top_p", 0.0 < self.top_p <= 1.0, "in (0, 1]"),
            ("min_p", min_p is None or 0.0 <= min_p <= 1.0, "in [0, 1] or null"),
            ("repetition_penalty", self.repetition_penalty > 0, "> 0"),
            ("vllm_gpu_memory_utilization", 0.0 < memory <= 1.0, "in (0, 1]"),
        )
        choice(self, "generation_dtype", ("auto", "bfloat16"))
        choice(self, "generation_engine", GENERATION_ENGINE_CHOICES)
        choice(self, "vllm_mode", ("colocate", "server"))
        at_least(self, 1, "vllm_max_model_length", optional=True)
        at_least(self, 1, "vllm_tensor_parallel_size", "static_eos_check_every")
        require(
            self,
            ("vllm_server_port", 0 < self.vllm_server_port < 65536, "a TCP port (1-65535)"),
            ("vllm_group_port", 0 < self.vllm_group_port < 65536, "a TCP port (1-65535)"),
            ("vllm_server_timeout", self.vllm_server_timeout > 0, "> 0 (seconds)"),
        )
        at_least(self, 0, "static_compile_min_steps")
        if self.generation_engine != "vllm":
            return
        low, high = VLLM_TEMPERATURES
        if not low <= self.temperature <= high:
            raise ConfigError(
                f"temperature={self.temperature} is outside what generation_engine=vllm samples "
                f"at: vLLM needs {low} <= temperature <= {high} (it silently raises a lower one "
                "to 0.01, so rollouts would not follow the configured temperature, and refuses "
                "a higher one); use generation_engine: hf for it"
            )
        if self.vllm_tensor_parallel_size != 1 and self.vllm_mode == "colocate":
            raise ConfigError(
                f"vllm_tensor_parallel_size={self.vllm_tensor_parallel_size} is not supported: "
                "each rank runs its own colocated vLLM holding the whole model (tensor parallel "
                "size 1); use a model that fits one GPU, or generation_engine: hf with "
                "data_parallel: fsdp"
            )

    def _check_generation_kwargs(self) -> None:
        """generation_kwargs are options of transformers' generate(), which only the hf engine
        calls (single-turn rollouts: :func:`check_across`)."""
        keys = ", ".join(sorted(self.generation_kwargs or {}))
        if self.generation_engine not in ("hf", "auto"):  # auto resolves to hf with them
            raise ConfigError(
                f"generation_kwargs ({keys}) need generation_engine: hf, got "
                f"{self.generation_engine!r}: only the hf engine can hand them to transformers' "
                "generate(); the static and vllm engines sample with temperature, top_p, top_k, "
                "min_p and repetition_penalty only"
            )
        if self.generation_dtype == "bfloat16":
            raise ConfigError(
                f"generation_kwargs ({keys}) are not supported with generation_dtype: "
                "bfloat16: its rollout correction needs the sampler's log-probs, which "
                "transformers' generate() (beam search) does not record"
            )


def resolve_generation_engine(
    requested: str,
    *,
    device_type: str,
    static_unsupported: str | None,
    multi_turn: bool = False,
    generation_kwargs: bool = False,
) -> tuple[str, str]:
    """The engine a run uses and why, in one line: ``requested`` itself unless it is ``auto``.

    ``auto`` picks the static engine (rollout/static.py) on a CUDA device for a model it can
    decode (``static_unsupported`` is None: a Llama-family decoder, full fine-tuning, LoRA or a
    bitsandbytes 4-bit base under LoRA, no DoRA), and the HF engine otherwise: for tools or an
    environment (multi-turn rollouts continue from the HF engine's KV cache), for
    ``generation_kwargs`` (transformers' generate()), for other architectures, and on a CPU,
    where the update dominates a step and the static engine buys little (docs/speed-memory.md,
    "Rollout engines"). On one H200 it made a bf16-mixed full fine-tuning step 1.7x faster
    (docs/gpu.md); under LoRA and on a 4-bit base it reads the policy's layers in place, so it
    adds no weight memory there. A named engine is kept as set (its own checks refuse what it
    cannot run)."""
    if requested != "auto":
        return requested, f"generation_engine={requested} as set"
    if multi_turn:
        return "hf", "auto: tools / an environment need the HF engine (multi-turn rollouts)"
    if generation_kwargs:
        return "hf", "auto: generation_kwargs need the HF engine (transformers' generate())"
    if device_type != "cuda":
        # benchmarks/engine_auto_cpu.py on a 2-core CPU: the static engine generated 1.6x the
        # tokens/s, but the update is most of a step (demo steps 0.92x as long, within noise).
        return "hf", (
            f"auto: the HF engine on {device_type}, where the update dominates a step and the "
            "static engine's second weight copy buys little; docs/gpu.md"
        )
    if static_unsupported is not None:
        return "hf", f"auto: the static engine cannot decode this model ({static_unsupported})"
    return "static", "auto: the static engine (a Llama-family decoder on a CUDA device)"
