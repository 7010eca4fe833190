"""How a ``GRPOConfig`` is built: TRL's names translated before the dataclass sees them, and
the options TRL's ``GRPOConfig`` lacks hidden from transformers' ``HfArgumentParser``.

:class:`TRLConfigType` is ``GRPOConfig``'s metaclass: every construction, the class's and a
``@dataclass`` subclass's (open-r1 subclasses it), goes through its ``__call__``, which checks
each name, translates TRL's (:func:`groupwise.config.trl.translate_trl_options`) and reports
the ignored ones. :func:`trl_only_options` is ``GRPOConfig``'s base: one parser-only field per
TRL name that is no groupwise option, so TRL's own ``TrlParser`` offers ``--bf16``,
``--push_to_hub``, ... on groupwise's config.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import sys
import types
import warnings
from typing import Any

from .trl import (
    IgnoredOptionsWarning,
    ignored_message,
    is_trl_name,
    reported_ignored,
    set_trl_option,
    translate_trl_options,
)
from .trl_fields import TRL_GRPO_FIELDS, TRL_ONLY_TYPES

# The options given for GRPOConfig's hidden (init=False) fields, from the metaclass's __call__ to
# __post_init__, which sets them before it validates (the generated __init__ cannot take them).
_GIVEN_HIDDEN: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "groupwise_hidden_options", default=None
)
# True while GRPOConfig.replace builds its copy, which passes every field's value on purpose.
COPYING: contextvars.ContextVar[bool] = contextvars.ContextVar("groupwise_copying", default=False)


class TRLConfigType(type):
    """``GRPOConfig(**options)`` for the class and for every ``@dataclass`` subclass (open-r1's
    configs.py adds its fields that way, and ``@dataclass`` gives the subclass an ``__init__`` of
    its own): construction goes through here, so TRL's names are checked and translated
    (:func:`groupwise.config.trl.translate_trl_options`) before any generated ``__init__`` sees
    them; the TRL options with no meaning here are kept in ``trl_ignored`` and reported in one
    warning.

    GRPOConfig's own options that TRL's GRPOConfig lacks (not in
    :data:`groupwise.config.trl_fields.TRL_GRPO_FIELDS`) are ``init=False`` fields: transformers'
    ``HfArgumentParser`` (and so TRL's ``TrlParser``) adds an option only per ``init`` field, so
    ``TrlParser((ScriptArguments, GRPOConfig, ModelConfig))`` declares no ``--dtype``,
    ``--use_peft``, ``--reward_funcs``, ... that ModelConfig or the script's dataclass declares
    too. They are still options everywhere else: taken here, out of the generated ``__init__``'s
    way, and set by ``__post_init__`` before it validates; ``to_dict()``, ``replace``,
    ``dataclasses.replace``, copies and pickles keep them. TRL's names that are no options here
    are parser-only fields (:func:`trl_only_options`). HfArgumentParser passes every option it
    offers, defaults included: a call that names every ``init`` field counts a value equal to
    the field's default as not given."""

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> Any:
        # GRPOConfig itself only: a subclass's own fields are the script's options and stay
        # visible to HfArgumentParser.
        if not any(isinstance(base, TRLConfigType) for base in bases):
            for option in namespace.get("__annotations__", {}):
                if option in TRL_GRPO_FIELDS:
                    continue
                value = namespace.get(option, dataclasses.MISSING)
                if isinstance(value, dataclasses.Field):
                    value.init = False
                else:
                    namespace[option] = dataclasses.field(default=value, init=False)
        return super().__new__(mcs, name, bases, namespace, **kwargs)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        source = _replacing(sys._getframe(1), cls)
        if source is not None:  # dataclasses.replace(config, ...): it drops the hidden options
            changed = {k: v for k, v in kwargs.items() if getattr(source, k) != v}
            return source.replace(**changed)
        names = cls.field_names()  # type: ignore[attr-defined]
        # Positional values follow the fields' order, the hidden ones included.
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__} takes at most {len(names)} positional arguments")
        for name, value in zip(names[: len(args)], args, strict=True):
            if name in kwargs:
                raise TypeError(f"{cls.__name__} got multiple values for argument {name!r}")
            kwargs[name] = value
        for name in kwargs:
            if name not in names and not is_trl_name(name):
                raise cls.unknown_option(name, cls.__name__)  # type: ignore[attr-defined]
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        init_names = [f.name for f in fields if f.init]
        if not args and not COPYING.get() and set(init_names) <= set(kwargs):
            # HfArgumentParser passes every visible option, defaults included: a value equal to
            # the default counts as not given (is_set, and the rules on what was given, such as
            # num_train_epochs without max_steps, see what the user wrote).
            defaults = field_default_values(fields)
            kwargs = {k: v for k, v in kwargs.items() if k not in defaults or v != defaults[k]}
        kwargs, ignored = translate_trl_options(kwargs, cls.field_defaults())
        # Which options were given, not defaulted (GRPOConfig.is_set): e.g. max_steps, which an
        # environment that owns its data requires. Not a field: to_dict() and config.yaml never
        # see it.
        explicit = frozenset(kwargs)
        hidden = {f.name: kwargs.pop(f.name) for f in fields if not f.init and f.name in kwargs}
        token = _GIVEN_HIDDEN.set(hidden)
        try:
            config = super().__call__(**kwargs)
        finally:
            _GIVEN_HIDDEN.reset(token)
        if hidden:  # a subclass's __post_init__ that does not call GRPOConfig's
            for name, value in hidden.items():
                setattr(config, name, value)
            config.validate()
        config.trl_ignored = ignored
        config.explicit_options = explicit
        reported = reported_ignored(ignored)
        if reported:
            warnings.warn(ignored_message(reported), IgnoredOptionsWarning, stacklevel=2)
        return config

    @property
    def __signature__(cls) -> inspect.Signature:
        """The options in the fields' order (as ``__call__`` takes positional values), then
        TRL's parser-only names, keyword-only; not ``__call__``'s ``*args, **kwargs``."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        defaults = field_default_values(fields)
        parameters = [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY if is_trl_only(f)
                else inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=defaults.get(f.name, inspect.Parameter.empty),
                annotation=f.type,
            )
            for f in sorted(fields, key=is_trl_only)  # the options first, in their order
        ]  # fmt: skip
        return inspect.Signature(parameters)


def field_default_values(fields: tuple[dataclasses.Field[Any], ...]) -> dict[str, Any]:
    """Each field's default, by name (those without one left out)."""
    values = {}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return values


class _TRLName:
    """A parser-only field's attribute (:func:`trl_only_options`): read as a TRL name is read
    back (``GRPOConfig.__getattr__``: the value given, its translation, or TRL's default), set
    after construction as ``GRPOConfig.__setattr__`` sets a TRL name. The generated
    ``__init__``'s assignment of the field's default is dropped: ``TRLConfigType.__call__``
    has taken the value given already."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, config: Any, owner: type | None = None) -> Any:
        if config is None:
            return self
        if self.name in config.__dict__:  # model_init_kwargs, as TRL's grpo.py assigns it
            return config.__dict__[self.name]
        return type(config).__getattr__(config, self.name)

    def __set__(self, config: Any, value: Any) -> None:
        if "explicit_options" not in config.__dict__:  # the generated __init__: still built
            return
        if self.name == "model_init_kwargs":  # read by the trainer when it builds the model
            config.__dict__[self.name] = value
        else:
            set_trl_option(config, self.name, value)


def trl_only_options() -> type:
    """GRPOConfig's base: one field per TRL 1.16 GRPOConfig field that is no groupwise option
    (:data:`groupwise.config.trl_fields.TRL_ONLY_TYPES`), so that HfArgumentParser (TRL's
    TrlParser) offers ``--bf16``, ``--push_to_hub``, ``--use_vllm``, ... and passes their values
    to ``GRPOConfig(...)``, which reads them as TRL's names (translated, ignored or refused).
    Default None: not given. Not options: ``field_names()``, ``to_dict()``, ``repr`` and
    ``==`` leave them out, and an instance holds no value for them (:class:`_TRLName`)."""
    base = dataclasses.make_dataclass(
        "TRLOnlyOptions",
        [
            # metadata: argparse keywords (HfArgumentParser passes them on)
            (name, tp, dataclasses.field(default=None, repr=False, compare=False,
                                         metadata={"help": "TRL's name (docs/trl.md)"}))
            for name, tp in TRL_ONLY_TYPES.items()
        ],
    )  # fmt: skip
    for name in TRL_ONLY_TYPES:
        setattr(base, name, _TRLName(name))
    _TRL_ONLY_FIELDS.update(dataclasses.fields(base))
    return base


# The parser-only fields themselves (a subclass that declares one of these names anew makes it
# its own option).
_TRL_ONLY_FIELDS: set[dataclasses.Field[Any]] = set()


def is_trl_only(f: dataclasses.Field[Any]) -> bool:
    return f in _TRL_ONLY_FIELDS


def _replacing(frame: types.FrameType, cls: type) -> Any:
    """The config that ``dataclasses.replace`` (the caller's ``frame``) copies, or None."""
    # Python 3.13's dataclasses.replace calls _replace(self, ...), also copy.replace's
    called = frame.f_code.co_name in ("replace", "_replace")
    if frame.f_globals.get("__name__") != "dataclasses" or not called:
        return None
    source = frame.f_locals.get("obj", frame.f_locals.get("self"))
    return source if type(source) is cls else None


def set_hidden_options(config: Any) -> None:
    """The hidden options given to this construction (see :class:`TRLConfigType`), set once."""
    hidden = _GIVEN_HIDDEN.get()
    if hidden:
        for name in list(hidden):
            setattr(config, name, hidden.pop(name))
