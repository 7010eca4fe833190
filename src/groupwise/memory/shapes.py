"""Model shapes for the memory planner: a LLaMA-style decoder's sizes, from a built-in name, a
shipped model's ``config.json`` fields (``model_shapes.json``, no weights), a Hugging Face
``config.json`` or the command line, and the parameter counts they give (the whole model, its
LM head, a LoRA adapter, tensor by tensor)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from .engine import static_refusal
from .units import human_count

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class MemoryPlanError(ValueError):
    """A bad option for the planner: the message names the option."""


def _flags(names: Sequence[str]) -> str:
    return "/".join("--" + n for n in names)


@dataclass(frozen=True)
class ModelShape:
    """A LLaMA-style decoder: embeddings, ``layers`` x (RMSNorm, GQA attention, RMSNorm, SwiGLU
    MLP), final RMSNorm, LM head (tied to the embeddings or not). Any field may be None when only
    a parameter count is known (``--params``); ``params`` then overrides the computed count."""

    name: str = "custom"
    hidden: int | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None  # None: same as heads (multi-head attention)
    intermediate: int | None = None
    vocab: int | None = None
    head_dim: int | None = None  # None: hidden // heads
    tie_embeddings: bool = False
    attention_bias: bool = False  # q, k, v biases (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head's query and key (Qwen3): 2 x head_dim weights
    max_positions: int | None = field(default=None, compare=False)  # max_position_embeddings
    model_type: str | None = field(default=None, compare=False)  # None: a LLaMA-style decoder
    # Why the static engine cannot decode this model (engine.static_refusal), None if it can.
    static_refusal: str | None = field(default=None, compare=False)
    params: int | None = None  # explicit parameter count, e.g. --params 7e9
    note: str = ""  # e.g. how a missing shape was inferred

    @property
    def head_size(self) -> int:
        if self.head_dim is not None:
            return self.head_dim
        return self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_size

    @property
    def kv_dim(self) -> int:
        return (self.kv_heads if self.kv_heads is not None else self.heads) * self.head_size

    def missing(self, *names: str) -> list[str]:
        """Which of the named shape fields are unknown."""
        return [n for n in names if getattr(self, n) is None]

    @property
    def has_layer_shapes(self) -> bool:
        return not self.missing("hidden", "layers", "heads", "intermediate")

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of every linear layer inside one decoder block."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def computed_params(self) -> int:
        """Parameter count from the shapes alone (needs every shape field)."""
        missing = self.missing("hidden", "layers", "heads", "intermediate", "vocab")
        if missing:
            raise MemoryPlanError(f"the parameter count needs {_flags(missing)}")
        return sum(self.tensor_numels())

    def tensor_numels(self) -> list[int]:
        """Elements of every parameter tensor, in the model's order (embeddings, each layer's
        linears, biases and norms, the final norm, the LM head unless tied); with ``--params``
        only, one tensor of that size. 8-bit optimizers treat each tensor on its own."""
        if self.params is not None and self.missing("hidden", "layers", "heads", "intermediate",
                                                    "vocab"):  # fmt: skip
            return [self.params]
        missing = self.missing("hidden", "layers", "heads", "intermediate", "vocab")
        if missing:
            raise MemoryPlanError(f"the parameter count needs {_flags(missing)}")
        h = self.hidden
        block = [d_in * d_out for d_in, d_out in self.linear_shapes().values()] + [h, h]
        if self.attention_bias:
            block += [self.q_dim, self.kv_dim, self.kv_dim]
        if self.qk_norm:
            block += [self.head_size, self.head_size]
        embed = [self.vocab * h]
        return embed + block * self.layers + [h] + ([] if self.tie_embeddings else embed)

    def linear_numels(self) -> list[int]:
        """Elements of every linear weight inside the decoder blocks (what bitsandbytes
        quantises to 4 bits: not the embeddings, norms, biases or the LM head)."""
        return [d_in * d_out for d_in, d_out in self.linear_shapes().values()] * self.layers

    def num_params(self) -> int:
        return self.params if self.params is not None else self.computed_params()

    def lm_head_params(self) -> int:
        """Parameters only the LM head holds (0 when tied: the embedding stays for the input)."""
        if self.tie_embeddings or self.vocab is None or self.hidden is None:
            return 0
        return self.vocab * self.hidden

    def lora_targets(self, targets: Sequence[str] | None = None) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each targeted linear (default: all of them, never the LM head)."""
        if not self.has_layer_shapes:
            missing = self.missing("hidden", "layers", "heads", "intermediate")
            raise MemoryPlanError(f"--lora_r needs the layer shapes: give {_flags(missing)}")
        shapes = self.linear_shapes()
        chosen = list(LORA_TARGETS if not targets or "all-linear" in targets else targets)
        unknown = [t for t in chosen if t not in shapes]
        if unknown:
            raise MemoryPlanError(
                f"--lora_targets: unknown module(s) {unknown}; "
                f"expected some of {list(LORA_TARGETS)}"
            )
        return {t: shapes[t] for t in chosen}

    def lora_numels(self, rank: int, targets: Sequence[str] | None = None) -> list[int]:
        """Elements of every LoRA tensor: A (rank x d_in) and B (d_out x rank) per targeted
        linear, every layer (Hu et al. 2021, eq. 3)."""
        pairs = [(rank * d_in, d_out * rank) for d_in, d_out in self.lora_targets(targets).values()]
        return [n for pair in pairs for n in pair] * self.layers

    def lora_params(self, rank: int, targets: Sequence[str] | None = None) -> int:
        """Trainable LoRA parameters: rank x (d_in + d_out) per targeted linear, every layer."""
        return sum(self.lora_numels(rank, targets))

    def describe(self) -> str:
        parts = [f"{self.name}: {human_count(self.num_params())} parameters"]
        if self.params is not None and not self.missing("hidden", "layers", "heads", "vocab"):
            try:
                parts[0] += f" (shapes give {human_count(self.computed_params())})"
            except MemoryPlanError:
                pass
        if self.layers is not None and self.hidden is not None:
            detail = f"{self.layers} layers, hidden {self.hidden}"
            if self.heads is not None:
                detail += f", {self.heads} heads / {self.kv_heads or self.heads} KV heads"
                detail += f" of {self.head_size}"
            if self.intermediate is not None:
                detail += f", MLP {self.intermediate}"
            if self.vocab is not None:
                detail += f", vocab {self.vocab}"
            detail += ", tied embeddings" if self.tie_embeddings else ""
            parts.append(detail)
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)


# The built-in models' shapes, so that planning never loads weights (tests check both against
# the real models: tiny_random_model() and SmolLM2-135M-Instruct's config.json).
BUILTIN_SHAPES = {
    "tiny-random": ModelShape(
        name="tiny-random", hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
        vocab=49152, tie_embeddings=True, model_type="llama",
    ),
    "smollm2-135m-instruct": ModelShape(
        name="smollm2-135m-instruct", hidden=576, layers=30, heads=9, kv_heads=3,
        intermediate=1536, vocab=49152, head_dim=64, tie_embeddings=True, model_type="llama",
    ),
}  # fmt: skip


@functools.cache
def shipped_configs() -> dict[str, dict[str, Any]]:
    """The ``config.json`` fields of the shipped models (``model_shapes.json``, package data),
    by lowercase name; each also names its Hugging Face repository (``hf_id``)."""
    text = resources.files(__package__).joinpath("model_shapes.json").read_text(encoding="utf-8")
    return json.loads(text)


def shipped_name(model: str) -> str | None:
    """The shipped name of ``model`` (``qwen3-8b``, ``Qwen3-8B`` or ``Qwen/Qwen3-8B``), or None."""
    key = model.strip().lower()
    configs = shipped_configs()
    if key in configs:
        return key
    for name, config in configs.items():
        hf_id = config["hf_id"].lower()
        if key in (hf_id, hf_id.split("/", 1)[1]):
            return name
    return None


def model_config(name: str) -> Any:
    """A transformers config for a shipped model, ready for random weights
    (``AutoModelForCausalLM.from_config(model_config("qwen3-8b"))``): the shapes its
    ``config.json`` states, nothing downloaded."""
    from transformers import AutoConfig

    key = shipped_name(name)
    if key is None:
        raise MemoryPlanError(
            f"model {name!r} is not a shipped model shape; expected one of "
            f"{sorted(shipped_configs())}"
        )
    fields = {k: v for k, v in shipped_configs()[key].items() if k not in ("hf_id", "model_type")}
    return AutoConfig.for_model(shipped_configs()[key]["model_type"], **fields)


def shape_from_hf_config(config: dict[str, Any], name: str = "custom") -> ModelShape:
    """A ModelShape from a Hugging Face ``config.json`` mapping (multimodal: its text_config).
    Qwen2's attention always has q, k, v biases (its config has no attention_bias field);
    Qwen3 normalises each head's query and key."""
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], **{k: v for k, v in config.items() if k == "name"}}
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [k for k in required + ("vocab_size",) if config.get(k) is None]
    if missing:
        raise MemoryPlanError(f"model {name!r}: config.json lacks {missing}")
    return ModelShape(
        name=name,
        hidden=int(config["hidden_size"]),
        layers=int(config["num_hidden_layers"]),
        heads=int(config["num_attention_heads"]),
        kv_heads=int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        intermediate=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        head_dim=int(config["head_dim"]) if config.get("head_dim") else None,
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        qk_norm=config.get("model_type") == "qwen3",
        max_positions=config.get("max_position_embeddings"),
        model_type=config.get("model_type"),
        static_refusal=static_refusal(config),
    )


def infer_intermediate(shape: ModelShape) -> ModelShape:
    """Fill in the MLP width from --params when every other shape is known: the SwiGLU MLP's
    3 x hidden x intermediate per layer is what the attention, embeddings and norms leave."""
    if shape.params is None or shape.missing("hidden", "layers", "heads", "vocab"):
        return shape
    without_mlp = replace(shape, intermediate=0, params=None).computed_params()
    width = round((shape.params - without_mlp) / (3 * shape.hidden * shape.layers))
    if width < 1:
        return shape
    return replace(shape, intermediate=width, note=f"MLP width {width} inferred from --params")


def resolve_model_shape(model: str) -> ModelShape:
    """Shape of a built-in model name, a shipped model (``qwen3-8b``, ``Qwen/Qwen3-8B``) or a
    local Hugging Face model folder (config.json)."""
    if model in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[model]
    shipped = shipped_name(model)
    if shipped is not None and not Path(model).exists():
        return shape_from_hf_config(shipped_configs()[shipped], name=shipped)
    path = Path(model)
    config_file = path / "config.json" if path.is_dir() else path
    if config_file.name == "config.json" and config_file.exists():
        with open(config_file, encoding="utf-8") as handle:
            return shape_from_hf_config(json.load(handle), name=str(model))
    raise MemoryPlanError(
        f"--model {model!r} is neither a built-in model {sorted(BUILTIN_SHAPES)}, a shipped "
        f"model shape {sorted(shipped_configs())} nor a local folder with a config.json (or "
        "give --params/--layers/--hidden/...)"
    )
