"""The rest of a TRL script's ``from trl import ...`` line: :class:`TrlParser`,
:class:`ModelConfig`, :class:`ScriptArguments`, :func:`get_peft_config`,
:func:`get_quantization_config` and :func:`get_kbit_device_map`, with TRL 1.16's fields, defaults
and meanings (``trl/scripts/utils.py``, ``trl/trainer/model_config.py``, ``trl/trainer/utils.py``),
so that a script such as ``TrlParser((ScriptArguments, GRPOConfig, ModelConfig))`` runs with
that line switched to groupwise (docs/trl.md "TRL scripts").

Why :class:`TrlParser` is groupwise's own: ``transformers.HfArgumentParser`` adds one argparse
option per ``init`` dataclass field, so a name that two dataclasses declare is argparse's
"conflicting option strings". TRL's own ``TrlParser`` works with groupwise's ``GRPOConfig`` too:
its options that TRL's ``GRPOConfig`` lacks are ``init=False`` fields, which that parser does
not offer (it offers the names TRL's ``GRPOConfig`` and groupwise's share). This one offers all
of them, and TRL's names groupwise translates or ignores (``--bf16 False``, ``--push_to_hub``).
groupwise's ``GRPOConfig`` declares names that TRL keeps in ``ModelConfig`` (``dtype``,
``attn_implementation``, ``use_peft``, ``lora_*``) and names that scripts' own argument classes
declare (open-r1's ``reward_funcs``, ``repetition_max_penalty``). Here such a name is one
option, and its value goes:

- to ``ModelConfig`` *and* ``GRPOConfig`` for the names in :data:`SAME_MEANING`, which mean the
  same in both (the script reads ``ModelConfig`` for ``get_peft_config`` and
  ``get_quantization_config``; groupwise applies the ``GRPOConfig`` copy when it loads the
  model);
- to the script's own class (or ``ModelConfig``) only for any other name: TRL's ``GRPOConfig``
  has no such field, so the script reads it there (``GRPOConfig`` keeps its default). That
  includes ``dtype`` and ``attn_implementation``: under TRL they reach the model only through
  the ``model_init_kwargs`` the script builds from ``ModelConfig``, and so they do here
  (:func:`groupwise.config.trl.model_init_changes`).

``GRPOConfig``'s options are read as ``groupwise train --name value`` reads them
(:meth:`GRPOConfig.from_dict`: the same types and errors, TRL's translated and ignored names
such as ``--bf16 False`` included); only the options given (command line or ``--config`` YAML)
are passed, so ``config.is_set(name)`` stays true to what the user wrote.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import yaml
from transformers import HfArgumentParser

from ..errors import ConfigError
from .grpo_config import GRPOConfig, coerce
from .trl import TRL_IGNORED, TRL_REFUSED, TRL_TRANSLATED, is_trl_name

# ModelConfig names that are GRPOConfig options with the same meaning: the value reaches both.
# Not dtype and attn_implementation: TRL loads the model with them only when the script puts
# them into model_init_kwargs (trl/scripts/grpo.py does), never from ModelConfig itself.
SAME_MEANING = frozenset(
    {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
     "trust_remote_code", "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant"}
)  # fmt: skip


@dataclass
class ScriptArguments:
    """TRL's ``ScriptArguments``: the dataset a script loads (TRL 1.16's fields and defaults)."""

    dataset_name: str | None = None  # hub id or local path given to datasets.load_dataset
    dataset_config: str | None = None  # the dataset's configuration name
    dataset_train_split: str = "train"  # split to train on
    dataset_test_split: str = "test"  # split to evaluate on
    dataset_streaming: bool = False  # load the dataset in streaming mode
    ignore_bias_buffers: bool = False  # debug argument for distributed training


@dataclass
class ModelConfig:
    """TRL's ``ModelConfig`` (TRL 1.16's fields and defaults): the model, its dtype and
    attention, LoRA (:func:`get_peft_config`) and bitsandbytes quantisation
    (:func:`get_quantization_config`), as TRL's scripts read them."""

    model_name_or_path: str | None = None
    model_revision: str = "main"
    dtype: str | None = field(
        default="float32", metadata={"choices": ["auto", "bfloat16", "float16", "float32"]}
    )
    attn_implementation: str | None = None
    use_peft: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | None = None
    lora_target_parameters: list[str] | None = None
    lora_modules_to_save: list[str] | None = None
    lora_task_type: str = "CAUSAL_LM"
    use_rslora: bool = False
    use_dora: bool = False
    load_in_8bit: bool = False
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = field(default="nf4", metadata={"choices": ["fp4", "nf4"]})
    use_bnb_nested_quant: bool = False
    bnb_4bit_quant_storage: str | None = None
    # TRL's older name of dtype (before TRL followed transformers' rename; open-r1 reads
    # model_args.torch_dtype): one value under both names.
    torch_dtype: str | None = field(
        default=None, metadata={"choices": ["auto", "bfloat16", "float16", "float32"]}
    )
    # TRL's field until 1.7 moved it to the trainer configs (open-r1 reads
    # model_args.trust_remote_code); a SAME_MEANING name, so the value reaches GRPOConfig too.
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.torch_dtype is not None:
            if self.dtype not in ("float32", self.torch_dtype):  # float32: dtype's default
                raise ConfigError(
                    f"ModelConfig: dtype={self.dtype!r} and torch_dtype={self.torch_dtype!r} "
                    "disagree; torch_dtype is TRL's older name of dtype, give one of them"
                )
            self.dtype = self.torch_dtype
        self.torch_dtype = self.dtype
        if self.load_in_8bit and self.load_in_4bit:
            raise ConfigError("ModelConfig: load_in_8bit and load_in_4bit cannot both be true")
        # TRL: a one-element list is the name itself (peft then matches it as a regex).
        targets = self.lora_target_modules
        if isinstance(targets, list) and len(targets) == 1:
            self.lora_target_modules = targets[0]  # type: ignore[assignment]


def get_peft_config(model_args: ModelConfig) -> Any:
    """TRL's ``get_peft_config``: None without ``use_peft``, else the ``peft.LoraConfig`` built
    from ``model_args`` (bias "none"), for ``GRPOTrainer(peft_config=...)``."""
    if not model_args.use_peft:
        return None
    from peft import LoraConfig

    extra = {}
    if model_args.lora_target_parameters is not None:
        extra["target_parameters"] = model_args.lora_target_parameters
    return LoraConfig(
        task_type=model_args.lora_task_type,
        r=model_args.lora_r,
        target_modules=model_args.lora_target_modules,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        bias="none",
        use_rslora=model_args.use_rslora,
        use_dora=model_args.use_dora,
        modules_to_save=model_args.lora_modules_to_save,
        **extra,
    )


def get_quantization_config(model_args: ModelConfig) -> Any:
    """TRL's ``get_quantization_config``: a ``transformers.BitsAndBytesConfig`` for
    ``load_in_4bit`` (compute dtype = ``dtype``, as TRL) or ``load_in_8bit``, else None; a
    script puts it in ``model_init_kwargs["quantization_config"]``."""
    from transformers import BitsAndBytesConfig

    if model_args.load_in_4bit:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=model_args.dtype,
            bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
            bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage,
        )
    if model_args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def get_kbit_device_map() -> dict[str, int] | None:
    """TRL's ``get_kbit_device_map`` (older TRL; scripts still import it): a quantised model
    loads whole onto this process's GPU, ``{"": LOCAL_RANK}``; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return {"": int(os.environ.get("LOCAL_RANK", "0"))}


def _is_config(dtype: type) -> bool:
    return isinstance(dtype, type) and issubclass(dtype, GRPOConfig)


def _options(dtype: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``dtype`` that are options here: a GRPOConfig's every field (its hidden,
    ``init=False`` ones too), another dataclass's ``init`` fields (as HfArgumentParser's)."""
    return [f for f in dataclasses.fields(dtype) if f.init or _is_config(dtype)]


def _takes_list(tp: Any) -> bool:
    args = typing.get_args(tp) if typing.get_origin(tp) is not list else (tp,)
    return any(typing.get_origin(arg) is list for arg in (tp, *args))


def _takes_bool(tp: Any) -> bool:
    return tp is bool or bool in typing.get_args(tp)


class TrlParser(HfArgumentParser):
    """TRL's ``TrlParser`` for groupwise's ``GRPOConfig`` (and ``@dataclass`` subclasses of it)
    beside other dataclasses: ``parse_args_and_config()`` reads ``--config FILE`` (YAML, with an
    ``env:`` mapping set in ``os.environ``) and the command line, which overrides it. A name two
    dataclasses declare is one option (the module docstring says where its value goes)."""

    def __init__(self, dataclass_types: Any = None, **kwargs: Any) -> None:
        if dataclass_types is None:
            dataclass_types = []
        elif not isinstance(dataclass_types, Iterable):
            dataclass_types = [dataclass_types]
        dataclass_types = list(dataclass_types)
        for dtype in dataclass_types:
            if "config" in dtype.__dataclass_fields__:
                raise ValueError(
                    f"{dtype.__name__} has a field named 'config': it is reserved for the "
                    "--config FILE option"
                )
        self._raw: dict[str, Any] = {}  # option -> the type its value is read as, by us
        self._declared: dict[str, list[type]] = {}  # option -> the dataclasses declaring it
        for dtype in dataclass_types:
            for f in _options(dtype):
                self._declared.setdefault(f.name, []).append(dtype)
        super().__init__(dataclass_types=dataclass_types, **kwargs)

    # -- building the options ------------------------------------------------------------------
    def _add_raw(self, name: str, tp: Any, help_text: str | None = None) -> None:
        """One option read as a string (YAML scalars and lists as groupwise's command line reads
        them), absent from the namespace unless given."""
        if name in self._raw or f"--{name}" in self._option_string_actions:
            return
        self._raw[name] = tp
        options: dict[str, Any] = {"default": argparse.SUPPRESS, "help": help_text}
        if _takes_list(tp):
            options["nargs"] = "+"
        elif _takes_bool(tp) or tp is None:
            options.update(nargs="?", const="true")
        aliases = [f"--{name.replace('_', '-')}"] if "_" in name else []  # as HfArgumentParser
        self.add_argument(f"--{name}", *aliases, dest=name, **options)

    def _add_dataclass_arguments(self, dtype: Any) -> None:
        hints = typing.get_type_hints(dtype)
        if _is_config(dtype):
            from .grpo_config import option_help

            helps = option_help()
            for f in _options(dtype):
                # argparse formats help with %; TRL's names: their field's help
                text = helps.get(f.name) or f.metadata.get("help")
                self._add_raw(f.name, hints[f.name], text and text.replace("%", "%%"))
            for name in (*TRL_TRANSLATED, *TRL_REFUSED, *sorted(TRL_IGNORED)):
                if name not in self._declared:  # TRL's names: --bf16 False, --push_to_hub ...
                    self._add_raw(name, TRL_TRANSLATED.get(name), "TRL's name (docs/trl.md)")
            return
        for f in dataclasses.fields(dtype):
            if not f.init:
                continue
            if len(self._declared[f.name]) > 1:  # shared: one option, typed per dataclass
                self._add_raw(f.name, hints[f.name])
                continue
            f.type = hints[f.name]
            self._parse_dataclass_field(self, f)

    # -- reading them --------------------------------------------------------------------------
    def _receives(self, dtype: type, name: str) -> bool:
        """Whether ``dtype`` gets the value of option ``name`` (see the module docstring)."""
        if not _is_config(dtype) or len(self._declared.get(name, [])) < 2:
            return True
        return name in SAME_MEANING

    def parse_args_into_dataclasses(  # type: ignore[override]
        self, args: Iterable[str] | None = None, return_remaining_strings: bool = False, **_: Any
    ) -> tuple[Any, ...]:
        namespace, remaining = self.parse_known_args(args=list(args) if args is not None else None)
        values = vars(namespace)
        outputs = []
        for dtype in self.dataclass_types:
            hints = typing.get_type_hints(dtype)
            given = {
                f.name: values[f.name]
                for f in _options(dtype)
                if f.name in values and self._receives(dtype, f.name)
            }
            if _is_config(dtype):
                trl_names = {
                    n: values[n]
                    for n in self._raw
                    if n in values and n not in hints and is_trl_name(n)
                }
                given.update({n: _scalar(v) for n, v in trl_names.items()})
                outputs.append(dtype.from_dict(_lists(given), source="command line"))
                continue
            for name in list(given):
                if name in self._raw:
                    given[name] = coerce(_lists({name: given[name]})[name], hints[name],
                                         f"command line: option {name!r}")  # fmt: skip
            outputs.append(dtype(**given))
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            raise ValueError(f"Some specified arguments are not used by the TrlParser: {remaining}")
        return tuple(outputs)

    def parse_dict(self, args: dict[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """HfArgumentParser's ``parse_dict`` (and so ``parse_yaml_file`` / ``parse_json_file``)
        with the same routing of shared names and TRL's names as the command line."""
        unused = set(args)
        outputs = []
        for dtype in self.dataclass_types:
            names = {f.name for f in _options(dtype)}
            given = {k: v for k, v in args.items() if k in names and self._receives(dtype, k)}
            if _is_config(dtype):
                given.update({k: v for k, v in args.items()
                              if is_trl_name(k) and k not in self._declared})  # fmt: skip
                outputs.append(dtype.from_dict(given, source="parse_dict"))
            else:
                outputs.append(dtype(**given))
            unused -= set(given)
        if unused and not allow_extra_keys:
            raise ValueError(f"Some keys are not used by the TrlParser: {sorted(unused)}")
        return tuple(outputs)

    def parse_args_and_config(
        self,
        args: Iterable[str] | None = None,
        return_remaining_strings: bool = False,
        fail_with_unknown_args: bool = True,
        separate_remaining_strings: bool = False,
    ) -> tuple[Any, ...]:
        """TRL's: ``--config FILE`` values become the defaults, the command line overrides them;
        unknown YAML keys are an error (``fail_with_unknown_args``) or returned as strings."""
        args = list(args) if args is not None else sys.argv[1:]
        config_remaining: list[str] = []
        if "--config" in args:
            at = args.index("--config")
            args.pop(at)
            path = args.pop(at)
            with open(path, encoding="utf-8") as handle:
                config = yaml.safe_load(handle)
            if not isinstance(config, dict):
                raise ConfigError(f"{path}: expected a mapping of option: value at the top level")
            env = config.pop("env", {})
            if not isinstance(env, dict):
                raise ConfigError(f"{path}: env must be a mapping of VARIABLE: value")
            for key, value in env.items():
                os.environ[key] = str(value)
            config_remaining = self.set_defaults_with_config(**config)
        output = self.parse_args_into_dataclasses(args, return_remaining_strings)
        if return_remaining_strings:
            if separate_remaining_strings:
                return (*output[:-1], config_remaining, output[-1])
            return (*output[:-1], config_remaining + output[-1])
        if fail_with_unknown_args and config_remaining:
            raise ConfigError(
                f"unknown options in the config file: {config_remaining}; remove them or add "
                "them to a dataclass (or pass fail_with_unknown_args=False)"
            )
        return output

    def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
        """Each option named in ``kwargs`` defaults to that value (and is no longer required);
        the names no option has come back as ``["--name", "value", ...]``."""
        used = set()
        for action in self._actions:
            if action.dest in kwargs:
                action.default = kwargs[action.dest]
                action.required = False
                used.add(action.dest)
        return [item for k, v in kwargs.items() if k not in used for item in (f"--{k}", str(v))]


def _lists(values: dict[str, Any]) -> dict[str, Any]:
    """``--name a,b`` and ``--name [a, b]`` as one string, like ``groupwise train``'s."""
    return {
        k: v[0] if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str) else v
        for k, v in values.items()
    }


def _scalar(value: Any) -> Any:
    """A TRL name's command-line string as a YAML scalar (``False`` -> False, ``1e-4``)."""
    if isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value
