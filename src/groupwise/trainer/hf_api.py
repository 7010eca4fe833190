"""The ``transformers.Trainer`` methods and attributes that GRPO scripts call after training
(TRL's ``trl/scripts/grpo.py``, open-r1's ``grpo.py``), with the Hugging Face meaning.

``log_metrics``, ``save_metrics`` and ``save_state`` are transformers' own functions
(``transformers.trainer_pt_utils``, bound as methods exactly as ``transformers.Trainer`` binds
them), so ``train_results.json``, ``all_results.json`` and ``trainer_state.json`` are written as
the Hugging Face Trainer writes them. :class:`Accelerator` is the part of accelerate's
``Accelerator`` that scripts use, over groupwise's processes (:mod:`groupwise.runtime.distributed`).
"""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers.trainer_pt_utils import log_metrics, metrics_format, save_metrics, save_state

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


class HFTrainerMethods:
    """``transformers.Trainer``'s post-training methods on groupwise's trainers."""

    args: GRPOConfig
    dist: DistributedContext
    device: torch.device
    output_dir: Path

    # transformers.Trainer binds these module functions the same way: same files, same format.
    log_metrics = log_metrics
    save_metrics = save_metrics
    save_state = save_state
    metrics_format = staticmethod(metrics_format)

    @property
    def accelerator(self) -> Accelerator:
        return Accelerator(self.dist, self.device)

    def is_world_process_zero(self) -> bool:
        return self.dist.is_main

    def is_local_process_zero(self) -> bool:
        return self.dist.local_rank == 0

    @property
    def hub_model_id(self) -> str:
        """TrainingArguments' ``hub_model_id``, else the output folder's name (as transformers)."""
        return self.args.trl_ignored.get("hub_model_id") or Path(self.output_dir).name

    def end(self) -> None:
        """transformers' ``Trainer.end()``: leave the process group at the end of a script."""
        self.accelerator.end_training()

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | None = None,
        tags: str | list[str] | None = None,
        **_: Any,
    ) -> Path | None:
        """A ``README.md`` model card in ``output_dir`` (main process only; transformers' and
        TRL's keyword names): its metadata names the base model, the dataset, the tags (plus
        ``grpo`` and ``groupwise``) and the library (``peft`` for an adapter, as
        ``save_pretrained`` writes it); the text says how it was trained."""
        if not self.is_world_process_zero():
            return None
        from huggingface_hub import ModelCard, ModelCardData

        tags = [tags] if isinstance(tags, str) else list(tags or [])
        tags += [tag for tag in ("grpo", "groupwise") if tag not in tags]
        base = self.args.model
        data = ModelCardData(
            base_model=base,
            datasets=[dataset_name] if dataset_name else None,
            library_name="peft" if self.args.use_peft else "transformers",
            model_name=model_name or Path(self.output_dir).name,
            tags=tags,
        )
        text = (
            f"---\n{data.to_yaml()}\n---\n\n# {data.model_name}\n\n"
            f"A fine-tune of `{base}`"
            + (f" on `{dataset_name}`" if dataset_name else "")
            + f", trained with GRPO ([DeepSeekMath](https://huggingface.co/papers/2402.03300)) "
            f"by groupwise, for {self.args.max_steps} steps with loss_type "
            f"`{self.args.loss_type}`, beta {self.args.beta} and {self.args.num_generations} "
            "completions per prompt. The run's options are in `config.yaml`.\n"
        )
        path = Path(self.output_dir) / "README.md"
        ModelCard(text).save(path)
        return path

    def push_to_hub(self, commit_message: str = "End of training", **kwargs: Any) -> Any:
        """Upload ``output_dir`` to the Hub repository ``hub_model_id`` (with a model card made
        from ``kwargs``, as TRL does). Offline (``HF_HUB_OFFLINE``) or unreachable: an error
        saying so; the saved model stays in ``output_dir``."""
        if not self.is_world_process_zero():
            return None
        offline = any(
            os.environ.get(var, "").upper() in ("1", "ON", "YES", "TRUE")
            for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
        )
        where = f"the trained model is saved in {self.output_dir}"
        if offline:
            raise RuntimeError(
                f"push_to_hub: the Hugging Face Hub is off here (HF_HUB_OFFLINE); {where}; "
                "upload it later with `hf upload REPO_ID OUTPUT_DIR`"
            )
        self.create_model_card(**kwargs)
        from huggingface_hub import HfApi

        api = HfApi(token=self.args.trl_ignored.get("hub_token"))
        try:
            repo = api.create_repo(self.hub_model_id, exist_ok=True).repo_id
            return api.upload_folder(
                repo_id=repo, folder_path=self.output_dir, commit_message=commit_message
            )
        except OSError as err:  # requests' and huggingface_hub's errors derive from OSError
            raise RuntimeError(
                f"push_to_hub: could not upload to the Hub repository {self.hub_model_id!r} "
                f"({err}); {where}"
            ) from None
