"""The run's options: :class:`GRPOConfig` (:mod:`.grpo_config`: one dataclass with TRL's names,
loadable from YAML and overridable from the command line) and the TRL / transformers names it
translates or accepts (:mod:`.trl`), and the rest of a TRL script's imports
(:mod:`.trl_parser`: ``TrlParser``, ``ModelConfig``, ``ScriptArguments``, ...; not imported
here: it needs transformers, and the command line's --help must not load it).
``GRPOConfig.sections()`` splits it into the sections that the components read
(:mod:`groupwise.sections`)."""

from ..errors import ConfigError
from ..sections import (
    CISPO_DEFAULT_CAP,
    GENERATION_ENGINES,
    PPO_MULTI_TURN,
    STATIC_MULTI_TURN,
    world_size_from_env,
)
from .grpo_config import (
    UNBOUNDED_FIELDS,
    GRPOConfig,
    coerce,
    default_output_dir,
    option_help,
    parse_cli_overrides,
    unused_dir,
)

__all__ = [
    "CISPO_DEFAULT_CAP", "GENERATION_ENGINES", "PPO_MULTI_TURN", "STATIC_MULTI_TURN",
    "UNBOUNDED_FIELDS", "ConfigError", "GRPOConfig", "coerce",
    "default_output_dir", "option_help", "parse_cli_overrides", "unused_dir",
    "world_size_from_env",
]  # fmt: skip
