"""The trainer: :class:`Trainer`, one class with TRL's constructor and names over a run record.

``Trainer.__init__`` reads its arguments in TRL's forms (positional order, ``peft_config``,
``optimizers``, tools or an environment, the datasets, the processes and the output folder),
then builds the run once, :func:`groupwise.wiring.assemble.assemble_run`: a frozen
:class:`~groupwise.wiring.run.Run` holding the options, the model, the policy, the engine, the
rewards, the prompts, the curriculum and the algorithm's own parts. Around it the trainer keeps
the run's services, one module each:

- ``loop``: ``train()``'s loop and its cadence (when to log, evaluate, save, stop), the failure
  monitor, SIGINT/SIGTERM;
- ``metrics``: a step's result as the logged metric dict (``StepMetrics``, ``ComputeLedger``);
- ``records``: ``log_history``, metrics.jsonl, events.jsonl, completions.jsonl, the loggers;
- ``checkpoints``: saving the model and checkpoints, reading them back;
- ``evaluate``: what ``evaluate()`` computes on an evaluation set;
- ``trl_api``: TRL's constructor forms, transformers' callbacks and the run as a ``TrainerState``;
- ``datasets``: the checks a dataset must pass, streams read into rows.

What differs between GRPO and PPO is the step, a function of the run (``grpo.grpo_step``,
``ppo.ppo_step``) that a subclass's ``train_step`` runs, and an :class:`Algorithm`: which parts
the assembly adds, the default options, the refusals, the evaluation loss and the files saved
beside the model. :class:`~groupwise.trainer.grpo.GRPOTrainer` and
:class:`~groupwise.trainer.ppo.PPOTrainer` name theirs.

A checkpoint's training state is ``{component: component.state_dict()}`` plus the step, the
config, every rank's RNG state and the metrics so far (:meth:`Trainer.state_dict`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerControl, TrainerState
from transformers.trainer_pt_utils import log_metrics, save_metrics, save_state
from transformers.trainer_utils import TrainOutput

from ..config.grpo_config import GRPOConfig, default_output_dir
from ..curriculum import Curriculum
from ..curriculum.base import PromptBatches
from ..errors import ConfigError
from ..policy.policy import Policy
from ..rewards import RewardFunc, RewardModel
from ..rewards.scoring import RolloutScorer
from ..rollout import Rollout, RolloutEngine
from ..runtime.distributed import DistributedContext, all_gather_objects, init_distributed
from ..runtime.models import adapter_base_name
from ..runtime.precision import Precision
from ..sections import Sections
from ..wiring.assemble import assemble_run
from ..wiring.rollout import Interaction, build_interaction, environment_dataset
from ..wiring.run import Run
from .checkpoints import Checkpoints, resume_argument
from .datasets import check_dataset, check_eval_dataset, stream_prefix
from .evaluate import evaluate_sets
from .hf_api import Accelerator, push_folder, write_model_card
from .loop import LoopCalls, TrainingLoop
from .memory_check import check_before_load, out_of_memory_error
from .metrics import ComputeLedger, StepMetrics, StepResult
from .monitor import TrainingMonitor
from .records import RunRecords
from .trl_api import CallbackHandler, fill_trainer_state, trl_arguments

__all__ = ["Algorithm", "PhaseTimer", "RunPart", "Trainer"]

T = TypeVar("T")


def _model_name(model: Any, args: GRPOConfig) -> str:
    """The model's name for a default output folder: the name or path given, else the loaded
    model's own ``name_or_path``."""
    if isinstance(model, str):
        return model
    name = getattr(getattr(model, "config", None), "name_or_path", None)
    return str(name) if name else str(args.model)


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class PhaseTimer:
    """The step's own clock. Wall time of a step's phases: ``mark(name)`` ends the phase begun
    at the previous mark (and adds it to ``name``'s time). On CUDA each mark first waits for
    the device: kernels run asynchronously, so without it a phase's GPU work would be billed to
    the next phase that happens to wait (one sync per phase, a handful per step)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.cuda = device is not None and device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize(device)
        self.device = device
        self.start = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def mark(self, name: str) -> None:
        """A phase marked more than once (several generation batches) adds up."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.phases[name], self.last = self.phases.get(name, 0.0) + now - self.last, now

    @property
    def total(self) -> float:
        return self.last - self.start


@dataclass(frozen=True)
class Algorithm:
    """What a trainer class trains, besides its step: ``name`` ("grpo" or "ppo": the own parts
    the assembly adds), the options when none are given, the refusals checked before anything
    is loaded (``check(args, interaction)``), why it cannot shard its model (FSDP2; None when
    it can), its ``eval_loss`` where it has one (``evaluation_loss(run, args, rows,
    batch_size)``) and the files it saves beside the model (``save_files(run, folder)``, on
    the main process)."""

    name: str
    default_args: Callable[[], GRPOConfig] = GRPOConfig
    check: Callable[[GRPOConfig, Interaction | None], None] | None = None
    sharding_refusal: str | None = None
    evaluation_loss: Callable[..., dict[str, float]] | None = None
    save_files: Callable[[Run[Any], Path], None] | None = None


class RunPart(Generic[T]):
    """A trainer attribute that is a part of its run record, ``run.<path>`` (``"policy"``,
    ``"algorithm.loss"``, ``"policy.network.optimizer"``). The record is frozen: assigning a
    part gives the trainer a new record with that part replaced."""

    def __init__(self, path: str) -> None:
        self.path = path.split(".")

    def __get__(self, trainer: Any, owner: type | None = None) -> T:
        if trainer is None:
            return self  # type: ignore[return-value]
        value = trainer.run
        for name in self.path:
            value = getattr(value, name)
        return value

    def __set__(self, trainer: Any, value: T) -> None:
        trainer.run = _replaced(trainer.run, self.path, value)


def _replaced(record: Any, path: list[str], value: Any) -> Any:
    name, rest = path[0], path[1:]
    if rest:
        value = _replaced(getattr(record, name), rest, value)
    if not dataclasses.is_dataclass(record):
        raise AttributeError(f"{type(record).__name__}.{name} cannot be replaced")
    return dataclasses.replace(record, **{name: value})


def new_output_dir(args: GRPOConfig, model: Any, dist: DistributedContext) -> str:
    """A new folder for a run given no ``output_dir``, named after the model and task (rank 0's,
    on every rank: every rank writes to it). Continuing a run (``resume_from_checkpoint='auto'``)
    needs the run's folder given."""
    if args.resume_from_checkpoint == "auto":
        raise ConfigError(
            "resume_from_checkpoint='auto' (--resume) continues the run in output_dir, but "
            "no output_dir is set (a new run would start from step 0 in a new folder): give "
            "the run's folder (--output_dir RUN on the command line, output_dir=RUN in "
            "Python)"
        )
    return all_gather_objects(default_output_dir(_model_name(model, args), args.task), dist)[0]


def check_algorithm(
    algorithm: Algorithm, args: GRPOConfig, dist: DistributedContext, interaction: Any
) -> None:
    """Refuse option combinations ``algorithm`` cannot run, before anything is loaded."""
    if dist.enabled and args.data_parallel == "fsdp" and algorithm.sharding_refusal:
        raise ConfigError(
            f"algorithm={args.algorithm} with data_parallel=fsdp is not supported: "
            f"{algorithm.sharding_refusal} (use data_parallel=ddp)"
        )
    if algorithm.check is not None:
        algorithm.check(args, interaction)


class Trainer:
    """A trainer with TRL's constructor (a subclass names its :class:`Algorithm`). ``args``
    defaults to the algorithm's options; ``model`` is a built-in name, a path or a loaded
    ``PreTrainedModel``; ``reward_funcs`` built-in names or callables
    ``f(prompts, completions, **columns)``.

    TRL's other arguments: ``processing_class`` (the tokenizer, instead of the model's own),
    ``peft_config`` (a ``peft.LoraConfig``: LoRA as configured there), ``callbacks``
    (``transformers.TrainerCallback``-like objects or classes: on_init_end, on_train_begin,
    on_step_begin, on_step_end, on_log, on_evaluate, on_save and on_train_end are called with
    ``(args, state, control, **kwargs)``; ``control.should_training_stop`` and
    ``control.should_save`` are obeyed), ``reward_processing_classes`` (the tokenizers of the
    reward models in ``reward_funcs``: one, or a list with an entry per reward function),
    ``optimizers`` (only ``(None, None)``), ``quantization_config`` (a
    ``transformers.BitsAndBytesConfig``: QLoRA's 4-bit base, as in ``model_init_kwargs``).
    TRL's positional order ``(model, reward_funcs, args, train_dataset)`` works too.

    Multi-turn rollouts (docs/tools.md): ``tools``, typed and documented Python
    functions (or built-in names) the model may call, as TRL's ``tools``; or
    ``environment_factory``, a callable returning one :class:`groupwise.tools.Environment` per
    conversation (``reset(row)``, ``step(message)``, ``state()``)."""

    algorithm: Algorithm
    # TRL's flag: whether the loss adds a Mixture-of-Experts model's router load-balancing loss
    # (then logged as aux_loss). groupwise trains on its policy loss alone, so never.
    aux_loss_enabled: bool = False

    # The run's parts (self.run), under groupwise's and TRL's names.
    options = RunPart[Sections]("options")
    dist = RunPart[DistributedContext]("dist")
    device = RunPart[torch.device]("device")
    precision = RunPart[Precision]("precision")
    dtype = RunPart[torch.dtype]("precision.weights")
    tokenizer = RunPart[PreTrainedTokenizerBase]("tokenizer")
    policy = RunPart[Policy]("policy")
    scorer = RunPart[RolloutScorer]("scorer")
    generator = RunPart[torch.Generator]("generator")
    engine = RunPart[RolloutEngine]("engine")
    prompts = RunPart[PromptBatches]("prompts")
    curriculum = RunPart[Curriculum]("curriculum")
    interaction = RunPart[Interaction | None]("interaction")
    model = RunPart[PreTrainedModel]("policy.model")
    ref_model = RunPart[PreTrainedModel | None]("policy.ref_model")
    optimizer = RunPart[torch.optim.Optimizer]("policy.network.optimizer")
    scheduler = RunPart[torch.optim.lr_scheduler.LRScheduler]("policy.network.scheduler")
    sampling = RunPart[Any]("engine.params")
    reward_funcs = RunPart[list[RewardFunc]]("scorer.funcs")
    reward_names = RunPart[list[str]]("scorer.names")
    reward_func_names = RunPart[list[str]]("scorer.names")  # TRL's name
    reward_weights = RunPart[torch.Tensor]("scorer.combine.weights")  # environments' are 1

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None = None,
        train_dataset: Sequence[dict[str, Any]] | GRPOConfig | None = None,
        args: GRPOConfig | Sequence[dict[str, Any]] | None = None,
        eval_dataset: Sequence[dict[str, Any]] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: Any = None,
        callbacks: Sequence[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any | None = None,
        peft_config: Any | None = None,
        tools: Sequence[Callable[..., Any] | str] | None = None,
        environment_factory: Callable[[], Any] | None = None,
    ) -> None:
        train_dataset, args = trl_arguments(
            model, train_dataset, args, optimizers, peft_config, self.algorithm.default_args,
            quantization_config,
        )
        # Tools or an environment: multi-turn rollouts (rollout/multiturn.py).
        interaction = build_interaction(args, tools, environment_factory)
        environments = interaction.environments if interaction else None
        train_dataset = environment_dataset(train_dataset, environments, args)
        seed_everything(args.seed)
        dist = init_distributed(args.device)
        if args.output_dir is None:
            args.output_dir = new_output_dir(args, model, dist)
        train_dataset = stream_prefix(train_dataset, args, dist.world_size)
        check_dataset(train_dataset, "train_dataset")
        # max_steps=-1 (num_train_epochs) and "epoch" strategies need the dataset's size.
        self.args = args = args.for_dataset(len(train_dataset), dist.world_size)
        check_algorithm(self.algorithm, args, dist, interaction)
        if eval_dataset is not None:
            check_eval_dataset(eval_dataset, "eval_dataset")
        # The memory plan of the run, said before the weights load (GPU) and if a step runs out.
        self.plan_model = _model_name(model, args)
        fit_check = partial(check_before_load, args, self.plan_model, dist.is_main)
        self.run: Run[Any] = assemble_run(
            args, model, algorithm=self.algorithm.name, dist=dist, train_dataset=train_dataset,
            reward_funcs=reward_funcs, processing_class=processing_class, peft_config=peft_config,
            reward_processing_classes=reward_processing_classes, interaction=interaction,
            trainer_state=lambda: self.state,  # TRL's trainer_state reward kwarg
            before_load=fit_check if isinstance(model, str) else None,
        )  # fmt: skip
        self.eval_dataset = eval_dataset
        self.global_step = 0  # optimizer steps, as TRL counts them
        self.optimizer_steps_per_batch = args.optimizer_steps_per_step
        # One pass over the prompts in steps (TrainerState.epoch); redone by train_dataset's setter
        self.steps_per_epoch = args.steps_per_epoch(len(self.prompts.dataset), dist.world_size)
        # The run's services: its files, checkpoints, failure warnings and step metrics.
        self.output_dir = Path(args.output_dir)
        self.records = RunRecords(self.output_dir, dist, self.scorer.names, args.answer_column,
                                  keep_samples=args.log_completions)  # fmt: skip
        # A saved LoRA adapter names its base (None: PEFT's own record, from a loaded model).
        named = args.use_peft and isinstance(model, str)
        adapter_base = adapter_base_name(model) if named else None
        self.checkpoints = Checkpoints(
            self.output_dir, dist, self.policy, self.tokenizer, adapter_base
        )
        self.monitor = TrainingMonitor(self.options.monitor, self.scorer.correctness_name)
        self.compute = ComputeLedger()  # tokens, rollouts, informative groups, optimizer steps
        self.step_metrics = StepMetrics(dist, self.scorer, self.policy, self.compute,
                                        self.options.batch)  # fmt: skip
        self.callback_handler = CallbackHandler(callbacks)
        self.control = TrainerControl()
        self._state = TrainerState()
        self._callback("on_init_end")

    # -- a step ----------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One step of the subclass's algorithm on the run, counted, with its metrics
        (:meth:`step_logs`): ``GRPOTrainer`` runs ``grpo_step``, ``PPOTrainer`` ``ppo_step``."""
        raise NotImplementedError

    def optimizer_steps_now(self) -> int:
        """Optimizer steps the next step trains: a generation batch's
        (``optimizer_steps_per_step``), or the fewer left before ``max_steps`` (TRL stops
        there, inside a generation batch). ``global_step`` counts these, as TRL's does."""
        per_batch, left = self.optimizer_steps_per_batch, self.args.max_steps - self.global_step
        return left if 0 < left < per_batch else per_batch

    def step_logs(self, result: StepResult, timer: PhaseTimer) -> dict[str, float]:
        """The end of a step: the records keep its batch (completions.jsonl), then its metrics
        (docs/metrics.md), averaged over ranks (:class:`~groupwise.trainer.metrics.StepMetrics`)."""
        self.records.keep_batch(result.rows, result.rollout, result.scores, result.advantages,
                                result.plan)  # fmt: skip
        return self.step_metrics(self.global_step, result, timer, engine=self.engine)

    def score(
        self, rows: Sequence[dict[str, Any]], rollout: Rollout
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards [N] (weighted sum; NaN where every function returned None) and the per-function
        rewards [N, F] (NaN for None). Dataset columns reach the functions by name, as in TRL."""
        scores = self.scorer(rows, rollout)
        return scores.rewards, scores.per_func

    # -- TRL's and transformers' methods --------------------------------------------------------
    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Run ``max_steps`` steps (continuing from a checkpoint when
        ``resume_from_checkpoint`` is set), logging to ``output_dir/metrics.jsonl``, evaluating
        every ``eval_steps`` and saving every ``save_steps``, on SIGINT/SIGTERM, and at the end
        (:class:`groupwise.trainer.loop.TrainingLoop`).

        Returns transformers' ``TrainOutput(global_step, training_loss, metrics)``, as TRL's
        trainer does (:func:`groupwise.trainer.loop.train_summary`); the per-step rows are
        ``self.log_history``.

        ``resume_from_checkpoint`` as in the Hugging Face Trainer: True continues from the
        newest checkpoint in output_dir, a path from that checkpoint; it replaces
        ``args.resume_from_checkpoint`` (None keeps it)."""
        if resume_from_checkpoint is not None:
            value = resume_argument(resume_from_checkpoint, self.output_dir)
            self.args = self.args.replace(resume_from_checkpoint=value)
        self.control = TrainerControl()
        calls = LoopCalls(
            step=self.train_step, evaluate=self.evaluate, log=self._log, callback=self._callback,
            control=lambda: self.control, global_step=lambda: self.global_step,
            save_checkpoint=self.save_checkpoint, load_checkpoint=self.load_checkpoint,
            save_model=self.save_model, epoch=lambda: self.state.epoch,
            out_of_memory=partial(out_of_memory_error, self.args, self.plan_model, self.device),
        )  # fmt: skip
        loop = TrainingLoop(self.args, self.run, self.records, self.monitor, self.output_dir,
                            calls, evaluates=self.eval_dataset is not None)  # fmt: skip
        metrics = loop.train()
        if self.args.use_peft and self.args.save_merged_model and self.dist.is_main:
            merged = copy.deepcopy(self.model).merge_and_unload()
            merged.save_pretrained(self.output_dir / "merged")
            self.tokenizer.save_pretrained(self.output_dir / "merged")
        return TrainOutput(self.global_step, metrics["train_loss"], metrics)

    @torch.no_grad()
    def evaluate(
        self,
        dataset: Sequence[dict[str, Any]] | None = None,
        batch_size: int | None = None,
        greedy: bool = True,
        *,
        eval_dataset: Any = None,
    ) -> dict[str, float]:
        """Mean of every reward function over ``dataset`` (default: eval_dataset), one greedy
        completion per prompt (or one sample at the training temperature), ``batch_size``
        (default ``per_device_eval_batch_size``) prompts at a time; with
        ``eval_num_generations`` also pass@k / mean@k (overall and per difficulty level), and
        the algorithm's ``eval_loss`` where it has one. ``eval_dataset`` is TRL's name for
        ``dataset``. A dict of datasets (TRL's form) is evaluated set by set, each one's
        metrics named ``eval/<name>/...``; an IterableDataset is read whole. Scalars the reward
        functions log with ``log_metric`` are ``eval/<metric>``. The metrics:
        :func:`groupwise.trainer.evaluate.evaluation_metrics`."""
        if eval_dataset is not None:
            if dataset is not None:
                raise ValueError("evaluate(): give dataset or eval_dataset (TRL's name), not both")
            dataset = eval_dataset
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs a dataset: pass one or give eval_dataset")
        loss = self.algorithm.evaluation_loss
        return evaluate_sets(
            dataset, self.args, engine=self.engine, tokenizer=self.tokenizer, policy=self.policy,
            scorer=self.scorer, score=self.score, batch_size=batch_size, greedy=greedy,
            loss=partial(loss, self.run, self.args) if loss is not None else None,
        )  # fmt: skip

    def save_model(self, path: str | Path | None = None, output_dir: str | None = None) -> Path:
        """Save model and tokenizer in Hugging Face format (``from_pretrained``-loadable; with
        LoRA the adapter, ``PeftModel.from_pretrained``-loadable), and what the algorithm saves
        beside it (PPO: the critic, under ``critic/``).

        Files are written into a temporary folder first and then moved into place one by one
        (``os.replace`` is atomic), so a crash never leaves a truncated weights file.

        Under FSDP every rank must call it (the full weights are gathered); rank 0 writes.
        ``output_dir`` is TRL's name for ``path``."""
        path = path if path is not None else output_dir
        target = self.checkpoints.save_model(Path(path) if path is not None else self.output_dir)
        if self.algorithm.save_files is not None and self.dist.is_main:
            self.algorithm.save_files(self.run, target)
        return target

    # transformers.Trainer binds these functions of trainer_pt_utils the same way, so
    # {split}_results.json, all_results.json and trainer_state.json are the files it writes.
    log_metrics = log_metrics
    save_metrics = save_metrics
    save_state = save_state

    @property
    def accelerator(self) -> Accelerator:
        return Accelerator(self.dist, self.device)

    def is_world_process_zero(self) -> bool:
        return self.dist.is_main

    def is_local_process_zero(self) -> bool:
        return self.dist.local_rank == 0

    @property
    def hub_model_id(self) -> str:
        """TrainingArguments' ``hub_model_id``, else the output folder's name (transformers')."""
        return self.args.trl_ignored.get("hub_model_id") or self.output_dir.name

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
        """``output_dir/README.md`` (main process; TRL's keyword names, the others accepted):
        :func:`groupwise.trainer.hf_api.write_model_card`."""
        if not self.is_world_process_zero():
            return None
        return write_model_card(self.args, self.output_dir, model_name, dataset_name, tags)

    def push_to_hub(self, commit_message: str = "End of training", **kwargs: Any) -> Any:
        """A model card from ``kwargs`` (as TRL), then ``output_dir`` uploaded to
        ``hub_model_id``; offline or unreachable, an error saying so."""
        if not self.is_world_process_zero():
            return None
        self.create_model_card(**kwargs)
        return push_folder(self.args, self.output_dir, self.hub_model_id, commit_message)

    # -- TRL's attribute names beyond the run's parts --------------------------------------------
    @property
    def train_dataset(self) -> Sequence[dict[str, Any]]:
        return self.prompts.dataset

    @train_dataset.setter
    def train_dataset(self, dataset: Sequence[dict[str, Any]]) -> None:
        self.prompts.dataset = dataset
        self.steps_per_epoch = self.args.steps_per_epoch(len(dataset), self.dist.world_size)

    @property
    def reward_processing_classes(self) -> list[Any]:
        """Each reward function's tokenizer (a reward model's), else None."""
        return [f.tokenizer if isinstance(f, RewardModel) else None for f in self.scorer.funcs]

    @property
    def tools(self) -> list[Callable[..., Any]]:
        """TRL's ``trainer.tools``: the tool functions of an environment_factory run (every
        environment's methods, bound to its first instance, and the standalone tools)."""
        environments = self._environment_factories
        return environments.all_tools if environments is not None else []

    @property
    def environments(self) -> list[Any] | None:
        """TRL's ``trainer.environments``: the environment instance of each rollout of the
        last generated batch (an environment_factory run; None before the first or without)."""
        environments = self._environment_factories
        return environments.last if environments is not None else None

    @property
    def _environment_factories(self) -> Any:
        """TRL's environment_factory of the run, if it has one (else None)."""
        return self.interaction.environments if self.interaction else None

    # -- records, state and callbacks -------------------------------------------------------------
    @property
    def log_history(self) -> list[dict[str, float]]:
        """Every logged row: one per logged step, one per evaluation (metrics.jsonl's rows)."""
        return self.records.history

    @log_history.setter
    def log_history(self, rows: list[dict[str, float]]) -> None:
        self.records.history = rows

    def completion_records(self, num_prompts: int | None = None) -> list[dict[str, Any]]:
        """The last step's first ``num_prompts`` prompts with all their completions, each with
        its reward, reward components and advantage, and the ground truth."""
        return self.records.completion_records(self.global_step, num_prompts)

    def _log(self, logs: dict[str, float]) -> None:
        """Log a row: log_history, the on_log callbacks, then metrics.jsonl and the loggers."""
        self.records.history.append(logs)
        self._callback("on_log", logs=dict(logs))
        self.records.write(logs, step=int(logs.get("step", self.global_step)))

    def _clear_earlier_run(self) -> None:
        """overwrite_output_dir: remove the earlier run in output_dir and say what went."""
        self.records.clear_earlier_run()

    @property
    def state(self) -> TrainerState:
        """A ``transformers.TrainerState`` of this run, up to date: global_step, max_steps,
        log_history (``self.log_history``'s rows with, as in transformers, the summary row each
        ``train()`` call added at its end: train_loss, train_runtime, ..., and the final step's
        metrics), epoch, ..."""
        records, dist = self.records, self.dist
        return fill_trainer_state(self._state, self.args, self.global_step, self.steps_per_epoch,
                                  records.history, records.summaries, dist.rank,
                                  dist.local_rank)  # fmt: skip

    @property
    def callbacks(self) -> list[Any]:
        return self.callback_handler.callbacks

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback``-like object (or class), as transformers' Trainer does."""
        self.callback_handler.add(callback)

    def _callback(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on every callback that has it, with transformers' arguments."""
        if not self.callback_handler.callbacks:  # the state is not built for nobody
            return
        self.control = self.callback_handler.call(
            event, self.args, self.state, self.control, model=self.model,
            processing_class=self.tokenizer, optimizer=self.optimizer,
            lr_scheduler=self.scheduler, train_dataloader=None, eval_dataloader=None, **kwargs,
        )  # fmt: skip

    # -- checkpoints ----------------------------------------------------------------------------
    def components(self) -> dict[str, Any]:
        """The stateful parts a checkpoint holds, by name (``state_dict``/``load_state_dict``):
        the run's (:meth:`~groupwise.wiring.run.Run.components`) and the services'."""
        return {**self.run.components(), "monitor": self.monitor, "compute": self.compute}

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model weights that a step depends on or that was logged
        (:meth:`~groupwise.trainer.checkpoints.Checkpoints.training_state`)."""
        return self.checkpoints.training_state(self.global_step, self.args.to_dict(), self.run,
                                               self.components(), self.log_history)  # fmt: skip

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>`` atomically and apply ``save_total_limit``."""
        # state_dict() is a collective under data parallel: every rank calls it
        path = self.checkpoints.save(
            self.global_step, self.state_dict(), self.args.save_total_limit
        )
        self._callback("on_save")
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the state saved by :meth:`save_checkpoint`, refusing a checkpoint whose config
        differs in options that change training, and cut the run's log files back to it."""
        path = Path(path)
        step, history, notes = self.checkpoints.restore(path, self.args.to_dict(), self.run,
                                                        self.components())  # fmt: skip
        self.global_step = step
        for note in notes:
            self.records.warn(step, "info", f"resuming {path.name}: {note}")
        self.records.rewind(step, history)
        tqdm.write(f"[groupwise] resumed from {path} at step {step}")
