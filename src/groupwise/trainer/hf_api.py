"""What the ``transformers.Trainer`` methods that GRPO scripts call after training
(TRL's ``trl/scripts/grpo.py``, open-r1's ``grpo.py``) need beyond the trainer
(:class:`groupwise.trainer.base.Trainer` holds the methods): :class:`Accelerator`, the
part of accelerate's ``Accelerator`` that scripts use, over groupwise's processes
(:mod:`groupwise.runtime.distributed`); the model card (:func:`write_model_card`) and the
upload (:func:`push_folder`).
"""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..runtime.distributed import DistributedContext, barrier, leave_process_group

if TYPE_CHECKING:
    from ..config.grpo_config import GRPOConfig


class Accelerator:
    """accelerate's ``Accelerator`` as scripts use it, for this run's processes: who is the
    main process, ``wait_for_everyone()``, ``print()`` on the local main process only,
    ``unwrap_model()`` (the model under DDP / a compiled model), ``end_training()``."""

    def __init__(self, dist: DistributedContext, device: torch.device) -> None:
        self.dist = dist
        self.device = device

    @property
    def process_index(self) -> int:
        return self.dist.rank

    @property
    def local_process_index(self) -> int:
        return self.dist.local_rank

    @property
    def num_processes(self) -> int:
        return self.dist.world_size

    @property
    def is_main_process(self) -> bool:
        return self.dist.is_main

    @property
    def is_local_main_process(self) -> bool:
        return self.dist.local_rank == 0

    @property
    def use_distributed(self) -> bool:
        return self.dist.enabled

    def wait_for_everyone(self) -> None:
        """A barrier over every process (nothing to wait for in a single process)."""
        barrier(self.dist)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine (accelerate's ``Accelerator.print``)."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def unwrap_model(self, model: torch.nn.Module, **_: Any) -> torch.nn.Module:
        """The model inside DDP's ``module`` and ``torch.compile``'s ``_orig_mod``."""
        while True:
            inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
            if not isinstance(inner, torch.nn.Module):
                return model
            model = inner

    def end_training(self) -> None:
        """Leave the process group (torchrun runs); the run's files are already written."""
        leave_process_group()


def write_model_card(
    args: GRPOConfig,
    output_dir: Path,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
) -> Path:
    """``output_dir/README.md``, a model card: its metadata names the base model, the dataset,
    the tags (plus ``grpo`` and ``groupwise``) and the library (``peft`` for an adapter, as
    ``save_pretrained`` writes it); the text says how the model was trained."""
    from huggingface_hub import ModelCard, ModelCardData

    tags = [tags] if isinstance(tags, str) else list(tags or [])
    tags += [tag for tag in ("grpo", "groupwise") if tag not in tags]
    data = ModelCardData(
        base_model=args.model,
        datasets=[dataset_name] if dataset_name else None,
        library_name="peft" if args.use_peft else "transformers",
        model_name=model_name or Path(output_dir).name,
        tags=tags,
    )
    text = (
        f"---\n{data.to_yaml()}\n---\n\n# {data.model_name}\n\n"
        f"A fine-tune of `{args.model}`"
        + (f" on `{dataset_name}`" if dataset_name else "")
        + ", trained with GRPO ([DeepSeekMath](https://huggingface.co/papers/2402.03300)) by "
        f"groupwise for {args.max_steps} steps (loss_type `{args.loss_type}`, beta {args.beta}, "
        f"{args.num_generations} completions per prompt). The run's options are in "
        "`config.yaml`.\n"
    )
    path = Path(output_dir) / "README.md"
    ModelCard(text).save(path)
    return path


def push_folder(args: GRPOConfig, output_dir: Path, repo_id: str, commit_message: str) -> Any:
    """Upload ``output_dir`` to the Hub repository ``repo_id``. Offline (``HF_HUB_OFFLINE``) or
    unreachable: an error saying so; the saved model stays in ``output_dir``."""
    offline = any(
        os.environ.get(var, "").upper() in ("1", "ON", "YES", "TRUE")
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    where = f"the trained model is saved in {output_dir}"
    if offline:
        raise RuntimeError(
            f"push_to_hub: the Hugging Face Hub is off here (HF_HUB_OFFLINE); {where}; "
            "upload it later with `hf upload REPO_ID OUTPUT_DIR`"
        )
    from huggingface_hub import HfApi

    api = HfApi(token=args.trl_ignored.get("hub_token"))
    try:
        repo = api.create_repo(repo_id, exist_ok=True).repo_id
        return api.upload_folder(
            repo_id=repo, folder_path=output_dir, commit_message=commit_message
        )
    except OSError as err:  # requests' and huggingface_hub's errors derive from OSError
        raise RuntimeError(
            f"push_to_hub: could not upload to the Hub repository {repo_id!r} ({err}); {where}"
        ) from None
