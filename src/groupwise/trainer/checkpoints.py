"""Saving and restoring a run's weights and checkpoints.

Two parts: the folder format (atomic ``checkpoint-<step>`` folders, the manifest, rotation, RNG
states, reading ``training_state.pt``, the resume config check), and :class:`Checkpoints`, the
glue between it and the trainer: what a run's training state is
(:meth:`Checkpoints.training_state`, read back by :meth:`Checkpoints.restore`), the collectives
a save needs under data parallel, the model and tokenizer files, the weights read back into the
policy.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError, UserError, first_line, option
from ..files import fsync_dir, staged_files
from ..policy.policy import Policy
from ..policy.weights import CheckpointMismatch
from ..runtime.distributed import DistributedContext, all_gather_objects, barrier
from ..runtime.models import record_adapter_base
from ..wiring.run import Run
from . import console


class Checkpoints:
    """``adapter_base``: the base a saved LoRA adapter names (None: PEFT's own record, from a
    loaded model)."""

    def __init__(
        self,
        output_dir: Path,
        dist: DistributedContext,
        policy: Policy,
        tokenizer: PreTrainedTokenizerBase,
        adapter_base: str | None,
    ) -> None:
        self.output_dir, self.dist, self.policy = output_dir, dist, policy
        self.tokenizer, self.adapter_base = tokenizer, adapter_base

    def save_weights(self, folder: Path, weights: dict[str, torch.Tensor] | None) -> None:
        """The model (or LoRA adapter) in Hugging Face format, an adapter naming a base that
        groupwise can load (a built-in name, an absolute path or a hub id)."""
        with console.quiet_transformers_bars():  # no "Writing model shards" bar per save
            self.policy.save_pretrained(folder, weights)
        if self.adapter_base is not None:
            record_adapter_base(folder, self.adapter_base)

    def save_model(self, target: Path) -> Path:
        """Model and tokenizer into ``target`` through a temporary folder (see
        ``Trainer.save_model``); every rank calls it under FSDP, rank 0 writes."""
        weights = self.policy.full_state_dict()
        if not self.dist.is_main and self.policy.network.sharded:
            return target
        with staged_files(target) as tmp:
            self.save_weights(tmp, weights)
            self.tokenizer.save_pretrained(tmp)
        return target

    def training_state(
        self,
        step: int,
        config: dict[str, Any],
        run: Run[Any],
        components: dict[str, Any],
        log_history: list[dict[str, float]],
    ) -> dict[str, Any]:
        """Everything but the model weights that a step depends on or that was logged: the
        step, the config, the optimizer and its schedule, every rank's RNG state (a collective
        under data parallel), ``{name: component.state_dict()}``, the reward functions' counts,
        the metrics so far and the algorithm's own state (``extra``: PPO's critic)."""
        network = run.policy.network
        state: dict[str, Any] = {
            "format": 1,
            "global_step": step,
            "config": config,
            "optimizer": network.optimizer_state_dict(),
            "scheduler": network.scheduler.state_dict(),
            # One entry per rank: each samples with its own generator.
            "rng": self.rng_states({"sampling": run.generator}),
        }
        for name, component in components.items():
            value = component.state_dict()
            state[name] = plain(value) if value is not None else None
        state.update(plain(run.scorer.state_dict()))
        state["log_history"] = plain(log_history)
        state["extra"] = run.algorithm.state_dict()
        return state

    def restore(
        self, path: Path, config: dict[str, Any], run: Run[Any], components: dict[str, Any]
    ) -> tuple[int, list[dict[str, float]], list[str]]:
        """Checkpoint ``path`` read back into ``run`` and ``components`` (refused when its
        config differs from ``config`` in options that change training; see
        :meth:`training_state`); returns its step, its metrics so far, and a note for each
        generator that could not be restored."""
        state = self.read(path, config)  # the weights are loaded
        run.engine.sync(run.policy.model)  # an engine with its own weights (static, vLLM)
        run.policy.network.load_optimizer_state_dict(state["optimizer"])
        run.policy.network.scheduler.load_state_dict(state["scheduler"])
        for name, component in components.items():
            if state.get(name) is not None:
                component.load_state_dict(state[name])
        run.scorer.load_state_dict(state)
        run.algorithm.load_state_dict(state.get("extra", {}))
        notes = self.restore_rng(path, state["rng"], {"sampling": run.generator})
        return int(state["global_step"]), list(state["log_history"]), notes

    def rng_states(self, generators: dict[str, torch.Generator]) -> list[dict[str, Any]]:
        """Every rank's RNG states (a collective under data parallel). They travel as
        torch.save bytes: all_gather_object cannot carry tensors between CPU processes."""
        buffer = io.BytesIO()
        torch.save(rng_state(generators), buffer)
        blobs = all_gather_objects(buffer.getvalue(), self.dist)
        return [torch.load(io.BytesIO(blob), weights_only=True) for blob in blobs]

    def save(self, step: int, state: dict[str, Any], keep: int | None) -> Path:
        """Write ``checkpoint-<step>`` (weights, tokenizer, ``state``) atomically and keep the
        newest ``keep`` (save_total_limit). Every rank calls it: gathering FSDP's weights is a
        collective."""
        weights = self.policy.full_state_dict()

        def write(folder: Path) -> None:
            self.save_weights(folder, weights)
            self.tokenizer.save_pretrained(folder)
            torch.save(state, folder / STATE_FILE)

        path = self.output_dir / f"{PREFIX}{step}"
        if self.dist.is_main:
            path = write_checkpoint(self.output_dir, step, write)
            rotate_checkpoints(self.output_dir, keep)
        barrier(self.dist)
        return path

    def read(self, path: Path, config: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint ``path``'s training state, refused when its config differs from
        ``config`` in options that change training; its weights are loaded into the policy."""
        state = read_training_state(path)
        check_resume_config(state["config"], config, path)
        try:
            self.policy.load_weights(path)
        except CheckpointMismatch as err:
            raise CheckpointError(f"checkpoint {path}: {err}") from None
        except (OSError, ValueError, RuntimeError, SafetensorError) as err:
            raise CheckpointError(
                f"checkpoint {path}: the model weights cannot be read ({type(err).__name__}: "
                f"{first_line(err)}); resume from an earlier checkpoint, or start over"
            ) from err
        return state

    def restore_rng(
        self, path: Path, states: list[dict[str, Any]], generators: dict[str, torch.Generator]
    ) -> list[str]:
        """This rank's RNG states from a checkpoint written by as many processes; returns a
        note for each generator that could not be restored."""
        if len(states) != self.dist.world_size:
            raise CheckpointError(
                f"checkpoint {path} was written by {len(states)} process(es); resume it with "
                f"the same number (this run has {self.dist.world_size})"
            )
        return set_rng_state(states[self.dist.rank], generators)


PREFIX = "checkpoint-"
STATE_FILE = "training_state.pt"
MANIFEST_FILE = "checkpoint.json"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")

# Options a resumed run may change: they do not alter the training trajectory (what is logged,
# saved or evaluated, where, and for how long).
RESUME_SAFE_FIELDS = frozenset(
    {
        "max_steps",
        "output_dir",
        "device",
        "logging_steps",
        "save_steps",
        "save_total_limit",
        "resume_from_checkpoint",
        "eval_steps",
        "eval_on_start",
        "eval_num_generations",
        "eval_ks",
        "eval_output",
        "compare_model",
        "num_eval_prompts",
        "eval_task",
        "log_completions",
        "log_completions_steps",
        "num_completions_to_print",
        "completions_sample_size",
        "report_to",
        "run_name",
        "disable_tqdm",
        "max_bad_steps",
        "warn_zero_std_fraction",
        "warn_zero_std_steps",
        "warn_entropy_min",
        "warn_kl_max",
        "save_merged_model",
        "accuracy_timeout",
        "code_timeout",
        "remote_timeout",
        "reward_max_failure_fraction",
        "num_train_epochs",
        "save_strategy",
        "eval_strategy",
        "per_device_eval_batch_size",
        "reward_timeout",
        "slow_call_warning",
        "overwrite_output_dir",
        # Memory, not math: a run that ran out of memory resumes with them turned on.
        "gradient_checkpointing",
        "activation_offloading",
    }
)


class TrainingInterrupted(RuntimeError):
    """SIGINT/SIGTERM stopped the run after a checkpoint was written."""

    def __init__(self, signum: int, path: Path) -> None:
        name = signal.Signals(signum).name
        super().__init__(f"{name}: stopped after saving {path}; continue with --resume")
        self.signum = signum
        self.path = path


class TrainingStopped(RuntimeError):
    """The run cannot continue (repeated non-finite steps); the last good state was saved."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used: the message names the folder and what is wrong."""












def checkpoint_dirs(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete-looking ``checkpoint-<step>`` folders in ``output_dir``, oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for path in output_dir.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    dirs = checkpoint_dirs(output_dir)
    return dirs[-1][1] if dirs else None


def write_checkpoint(output_dir: str | Path, step: int, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_folder)`` to fill a temporary folder, add the manifest, flush everything
    to disk and rename it to ``checkpoint-<step>`` (replacing an older one of that step)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for stale in output_dir.glob(f".tmp-{PREFIX}*"):  # left by a crash during an earlier save
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{PREFIX}{step}-", dir=output_dir))
    try:
        write(tmp)
        files, hashes = {}, {}
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                with open(path, "rb+") as handle:
                    os.fsync(handle.fileno())
                files[str(path.relative_to(tmp))] = path.stat().st_size
                hashes[str(path.relative_to(tmp))] = file_sha256(path)
        manifest = {"step": step, "files": files, "sha256": hashes}
        with open(tmp / MANIFEST_FILE, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        final = output_dir / f"{PREFIX}{step}"
        old = None
        if final.exists():
            old = output_dir / f".tmp-{PREFIX}{step}-old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(output_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """The manifest of checkpoint ``path``; raises CheckpointError naming the first missing,
    truncated or (where the manifest has content hashes: those written since hashes were added)
    modified file."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a folder")
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CheckpointError(
            f"checkpoint {path} is incomplete: {MANIFEST_FILE} is missing (the save did not "
            "finish, or this is not a groupwise checkpoint)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        files = manifest["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST_FILE} is corrupt ({err})") from None
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        if file.stat().st_size != size:
            raise CheckpointError(
                f"checkpoint {path}: {name} has {file.stat().st_size} bytes, the manifest says "
                f"{size} (truncated or modified); resume from an earlier checkpoint with "
                "--resume_from_checkpoint PATH, or start over"
            )
    if STATE_FILE not in files:
        raise CheckpointError(f"checkpoint {path} is incomplete: {STATE_FILE} is missing")
    for name, expected in (manifest.get("sha256") or {}).items():
        if (path / name).is_file() and file_sha256(path / name) != expected:
            raise CheckpointError(
                f"checkpoint {path}: {name} is damaged (its content does not match the SHA-256 "
                "in the manifest, although its size does); resume from an earlier checkpoint "
                "with --resume_from_checkpoint PATH, or start over"
            )
    return manifest


def read_training_state(path: str | Path) -> dict[str, Any]:
    """The ``training_state.pt`` of checkpoint ``path``, after :func:`verify_checkpoint`; a
    file that cannot be read is a CheckpointError naming it."""
    path = Path(path)
    verify_checkpoint(path)
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is named, not traced
        raise CheckpointError(
            f"checkpoint {path}: {STATE_FILE} cannot be read ({type(err).__name__}: "
            f"{first_line(err)}); resume from an earlier checkpoint, or start over"
        ) from err


def rotate_checkpoints(output_dir: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (None keeps all); returns those removed."""
    if keep is None:
        return []
    dirs = checkpoint_dirs(output_dir)
    removed = [path for _, path in dirs[: max(len(dirs) - keep, 0)]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def resolve_resume_path(value: str, output_dir: str | Path) -> Path | None:
    """``auto``: the newest checkpoint in output_dir (None when there is none: a fresh start);
    otherwise the given folder, which must exist."""
    if value == "auto":
        return latest_checkpoint(output_dir)
    path = Path(value)
    if not path.exists():
        raise CheckpointError(
            f"resume_from_checkpoint={value!r}: {path} does not exist; "
            + _checkpoints_in(output_dir)
        )
    return path


def _checkpoints_in(output_dir: str | Path) -> str:
    """Which checkpoints output_dir holds, for an error about a missing one."""
    found = [str(path) for _, path in checkpoint_dirs(output_dir)]
    if found:
        return f"checkpoints in output_dir={str(output_dir)!r}: {', '.join(found)}"
    return f"output_dir={str(output_dir)!r} holds no checkpoint-<step> folder"


def resume_argument(value: bool | str | os.PathLike, output_dir: str | Path) -> str | None:
    """``train(resume_from_checkpoint=...)`` as in the Hugging Face Trainer: True is the newest
    checkpoint in output_dir (an error when there is none), a path is that checkpoint (an error
    naming it when it does not exist), False is a fresh start. Returns the value for
    ``GRPOConfig.resume_from_checkpoint``."""
    if value is False:
        return None
    if value is True:
        latest = latest_checkpoint(output_dir)
        if latest is None:
            raise CheckpointError(
                f"resume_from_checkpoint=True: no checkpoint to resume from: "
                f"{_checkpoints_in(output_dir)} (save_steps writes them)"
            )
        return str(latest)
    if not isinstance(value, (str, os.PathLike)):
        raise CheckpointError(
            "resume_from_checkpoint: expected True (the newest checkpoint in output_dir), a "
            f"checkpoint folder or False, got {value!r}"
        )
    resolve_resume_path(str(value), output_dir)  # "auto" is allowed; a missing path is refused
    return str(value)


# ----------------------------------------------------------------------------------------------
def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random state a step consumes, in types ``torch.load(weights_only=True)`` accepts.
    CUDA's is the current device's only, and only once this process has started CUDA: asking
    for every device's (``get_rng_state_all``) would open a context on every visible GPU from
    every rank."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in generators.items()},
        "generator_devices": {name: g.device.type for name, g in generators.items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> list[str]:
    """Restore :func:`rng_state`'s states; returns a note for each generator that could not
    carry over (a checkpoint written on another kind of device: a CPU generator's state is
    5,056 bytes, a CUDA one's 16, and neither reads the other). Such a generator is re-seeded
    from the saved state, so the resumed run is reproducible, though it does not sample what
    an uninterrupted run on the first device would have."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    notes = []
    saved_devices = state.get("generator_devices", {})
    for name, generator in generators.items():
        saved = state["generators"][name]
        written_on = saved_devices.get(name, generator.device.type)
        try:
            if written_on != generator.device.type:
                raise ValueError("written on another device")
            generator.set_state(saved)
        except (RuntimeError, ValueError):
            digest = hashlib.sha256(saved.numpy().tobytes()).digest()
            generator.manual_seed(int.from_bytes(digest[:8], "little"))
            notes.append(
                f"the {name} generator was saved on {written_on} and this run samples on "
                f"{generator.device.type}: generator states do not carry over between devices, "
                "so it was re-seeded from the saved state (reproducible, but not the samples an "
                f"uninterrupted {written_on} run would draw)"
            )
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # older checkpoints: every device's state
            index = torch.cuda.current_device()
            cuda = cuda[index] if index < len(cuda) else None
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)
    return notes


def plain(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into Python numbers and lists, so that
    ``torch.load(weights_only=True)`` (no arbitrary unpickling) can read it back."""
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def trajectory_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Options whose value differs and that would change the training trajectory. An option
    the checkpoint predates counts as its default (what that run used)."""
    from ..config.grpo_config import GRPOConfig

    defaults = GRPOConfig().to_dict()
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    diffs = []
    for name in sorted(set(saved) | set(current)):
        if name in RESUME_SAFE_FIELDS:
            continue
        old, new = saved.get(name, "<absent>"), current.get(name, "<absent>")
        if old != new:
            diffs.append(f"{name}: {old!r} -> {new!r}")
    return diffs


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], path: Path) -> None:
    diffs = trajectory_changes(saved, current)
    if diffs:
        raise ConfigError(
            f"cannot resume from {path}: the config differs in options that change training:\n  "
            + "\n  ".join(diffs)
            + "\nUse the checkpoint's config (its values are above, on the left: "
            + option(
                f"groupwise train --output_dir {path.parent} --resume reads the run's own "
                f"{path.parent / 'config.yaml'}, and so does groupwise train "
                f"{path.parent / 'config.yaml'} --resume",
                f"GRPOConfig.from_yaml({str(path.parent / 'config.yaml')!r})",
            )
            + "), or start a new run in another output_dir. Safe to change: "
            + ", ".join(sorted(RESUME_SAFE_FIELDS))
        )
