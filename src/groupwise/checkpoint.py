"""Checkpoints that a run can continue from exactly.

A checkpoint is a folder ``OUTPUT_DIR/checkpoint-<step>`` holding the model in Hugging Face format
(or the LoRA adapter), the tokenizer, ``training_state.pt`` (optimizer, scheduler, every RNG, the
prompt sampler, curriculum and monitor state, the metrics so far) and ``checkpoint.json``, a
manifest of every file with its size and SHA-256. It is written into a temporary folder first and
renamed into place, so a crash during a save leaves the previous checkpoint intact and never a
half checkpoint under a checkpoint-<step> name; the manifest catches folders damaged afterwards
(a manifest from before the hashes is checked by size only).
"""

from __future__ import annotations

import hashlib
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

from .config import ConfigError
from .errors import OutputDirError, UserError, first_line, option
from .files import fsync_dir

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
        "overwrite_output_dir",
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


# Files that show a folder holds a run's output (besides checkpoint-<step> folders).
RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "completions.jsonl",
    "model.safetensors",
    "adapter_model.safetensors",
    "pytorch_model.bin",
)


def earlier_run(output_dir: str | Path) -> list[str]:
    """The names in ``output_dir`` that an earlier run left there (empty: none)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [name for name in RUN_FILES if (output_dir / name).exists()]
    found += [path.name for _, path in checkpoint_dirs(output_dir)]
    # config.yaml alone: a run stopped before its first step, with nothing to keep or resume;
    # refusing it would block both a rerun and --resume.
    return [] if found == ["config.yaml"] else found


def check_output_dir(output_dir: str | Path, resume: str | None, overwrite: bool) -> None:
    """Refuse an output_dir that is not a usable folder, or that holds an earlier run when the
    run neither resumes it (``resume_from_checkpoint``) nor may overwrite it
    (``overwrite_output_dir``): nothing a user has is replaced silently."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise OutputDirError(
            f"output_dir={str(output_dir)!r} is a file, not a folder; choose another output_dir"
        )
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputDirError(
            f"output_dir={str(output_dir)!r} cannot be created: {parent} is a file, not a "
            "folder; choose another output_dir"
        )
    if not os.access(parent, os.W_OK):
        raise OutputDirError(
            f"output_dir={str(output_dir)!r}: {parent} is not writable; choose another output_dir"
        )
    # os.access trusts permission bits; a read-only file system, a full disk or (for root) a
    # folder like /proc refuses writes anyway, so try one, before any model is loaded.
    try:
        handle, probe = tempfile.mkstemp(prefix=".groupwise-write-test-", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise OutputDirError(
            f"output_dir={str(output_dir)!r}: cannot write in {parent} "
            f"({err.strerror or err}); choose another output_dir"
        ) from None
    found = earlier_run(path)
    if found and not resume and not overwrite:
        resume_option = option("--resume", 'resume_from_checkpoint="auto"')
        overwrite_option = option("--overwrite_output_dir true", "overwrite_output_dir=True")
        raise OutputDirError(
            f"output_dir={str(output_dir)!r} holds an earlier run ({', '.join(found[:6])}); "
            f"continue it with {resume_option}, start over in it with {overwrite_option} (its "
            "model, metrics, reports and checkpoints are removed), or choose another "
            "output_dir (without one, each run gets a new folder)"
        )


# Everything a run (and `groupwise eval` / `report` on it) writes into its output_dir, besides
# checkpoint-<step> folders: what overwrite_output_dir removes. Files a run did not write stay.
RUN_ARTEFACTS = (
    *RUN_FILES,
    "rewards.json",
    "run.json",
    "events.jsonl",
    "report.html",
    "eval.json",
    "wandb_run_id.txt",
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "tensorboard",
    "wandb",
    "merged",
)
# Name patterns of the same: rotated metrics, sharded weights, interrupted saves.
RUN_ARTEFACT_PATTERNS = (
    "metrics-*.jsonl",
    "model-*-of-*.safetensors",
    "pytorch_model-*-of-*.bin",
    f".tmp-{PREFIX}*",
    ".save-*",
)


def clear_earlier_run(output_dir: str | Path) -> list[str]:
    """Remove every artefact of an earlier run from ``output_dir`` (its checkpoints, model,
    metrics, logs, reports, evaluation results) so that nothing left there describes another
    model; return the names removed, sorted. PEFT's model card (README.md) goes with the
    adapter it describes; files groupwise does not write are kept."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    targets = {folder / name for name in RUN_ARTEFACTS if (folder / name).exists()}
    for pattern in RUN_ARTEFACT_PATTERNS:
        targets.update(folder.glob(pattern))
    targets.update(path for _, path in checkpoint_dirs(folder))
    if (folder / "adapter_config.json").exists() and (folder / "README.md").is_file():
        targets.add(folder / "README.md")
    for path in targets:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    fsync_dir(folder)
    return sorted(path.name for path in targets)


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


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Options whose value differs and that would change the training trajectory. An option
    the checkpoint predates counts as its default (what that run used)."""
    from .config import GRPOConfig

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
    diffs = config_differences(saved, current)
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
