"""Warnings for known GRPO failure modes, computed from the per-step metrics the trainer logs.

The monitor is pure bookkeeping over metric dicts (no torch, no I/O), deterministic, and
checkpointable (:meth:`TrainingMonitor.state_dict`), so a resumed run warns exactly as an
uninterrupted one would. Kinds, in the order one step reports them:

- ``nan_step``: a non-finite step was skipped (:meth:`TrainingMonitor.record_bad_step`);
  :attr:`TrainingMonitor.should_stop` after ``max_bad_steps`` of them in a row.
- ``zero_std``: almost every group had one reward for several steps (no learning signal).
- ``entropy_collapse``: mean token entropy below a floor.
- ``kl_blowup``: KL to the reference above a ceiling, or growing fast.
- ``length_hacking``: completions got much longer while correctness did not improve.
- ``info``: the once-per-run note that the GRPO loss is ~0 by construction.

A kind fires when its condition starts to hold; while it keeps holding it fires again only every
``cooldown_steps``, and it re-arms after its condition has been clear for ``rearm_steps`` steps in
a row (so a metric hovering around a threshold does not warn every other step).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

# Kinds that fire from metric conditions (nan_step and info have their own rules).
CONDITION_KINDS = ("zero_std", "entropy_collapse", "kl_blowup", "length_hacking")
KINDS = ("nan_step", *CONDITION_KINDS, "info")

LOSS_ZERO_NOTE = (
    "loss is ~0 while grad_norm is {grad_norm:.3g} (step {step}): this is expected, the on-policy "
    "GRPO loss value is ~0 by construction (advantages are zero-mean within each group and the "
    "probability ratio is 1) while its gradient is not, so watch reward, not loss."
)


@dataclass
class TrainingWarning:
    """One warning: the step it refers to, its kind (see :data:`KINDS`) and one sentence."""

    step: int
    kind: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The ``events.jsonl`` record: ``{"step", "kind", "message"}``."""
        return {"step": self.step, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class MonitorThresholds:
    """Every threshold of :class:`TrainingMonitor`; the first five are ``GRPOConfig`` fields."""

    zero_std_fraction: float = 0.9  # warn_zero_std_fraction
    zero_std_steps: int = 5  # warn_zero_std_steps
    entropy_min: float = 0.05  # warn_entropy_min
    kl_max: float = 1.0  # warn_kl_max
    max_bad_steps: int = 3  # max_bad_steps
    # Entropy of the first steps is the base model's, not a collapse caused by training.
    entropy_warmup_steps: int = 3
    kl_growth: float = 10.0  # kl_blowup also when KL grew more than this factor ...
    kl_window: int = 5  # ... over this many steps ...
    kl_floor: float = 0.1  # ... and is at least this (tiny early KLs grow fast harmlessly)
    length_growth: float = 1.5  # length_hacking when the mean length of the newer half ...
    length_window: int = 10  # ... of this many steps is this factor of the older half's ...
    length_min_improvement: float = 0.0  # ... and correctness rose by no more than this
    loss_zero_atol: float = 1e-6  # |loss| below this counts as "~0"
    cooldown_steps: int = 20  # a kind that keeps holding re-fires after this many steps
    rearm_steps: int = 3  # ... or after being clear for this many consecutive steps

    def __post_init__(self) -> None:
        for name in ("zero_std_steps", "kl_window", "cooldown_steps", "rearm_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.length_window < 2:
            raise ValueError(f"length_window must be >= 2, got {self.length_window}")
        if self.max_bad_steps < 0:
            raise ValueError(f"max_bad_steps must be >= 0, got {self.max_bad_steps}")

    @classmethod
    def from_config(cls, args: Any, **overrides: Any) -> MonitorThresholds:
        """Thresholds from a ``GRPOConfig`` (or any object with its ``warn_*`` fields)."""
        values = {
            "zero_std_fraction": args.warn_zero_std_fraction,
            "zero_std_steps": args.warn_zero_std_steps,
            "entropy_min": args.warn_entropy_min,
            "kl_max": args.warn_kl_max,
            "max_bad_steps": args.max_bad_steps,
        }
        values.update(overrides)
        return cls(**values)


def _number(logs: dict[str, Any], key: str) -> float | None:
    """``logs[key]`` as a finite float, or None when missing, non-numeric or not finite."""
    value = logs.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return math.fsum(kept) / len(kept) if kept else None


def correctness_key(logs: dict[str, Any], correctness_reward: str | None = None) -> str:
    """The metric that says whether answers are right: the mean of ``correctness_reward`` (the
    name of the run's reward function marked ``is_correctness``), or the total ``reward`` when
    the run has none or the step did not log it."""
    if correctness_reward is not None:
        key = f"rewards/{correctness_reward}/mean"
        if key in logs:
            return key
    return "reward"


@dataclass
class _Alarm:
    """Firing state of one condition kind."""

    active: bool = False  # the condition held at the last step
    armed: bool = True  # a new onset may fire
    clear_run: int = 0  # consecutive steps the condition has been clear
    last_fired: int | None = None


class TrainingMonitor:
    """Turns each step's metrics into :class:`TrainingWarning` records.

    ``TrainingMonitor(monitor)`` takes its thresholds from the run's ``monitor`` section
    (:class:`groupwise.sections.MonitorOptions`; a ``GRPOConfig`` has the same names);
    ``TrainingMonitor(kl_max=0.5)`` or ``TrainingMonitor(MonitorThresholds(...))`` set them
    directly (keyword arguments override those of ``args``). ``correctness_reward`` names the
    reward function that scores task success (the trainer passes the one marked
    ``is_correctness``); ``length_hacking`` judges progress by its mean, or by the total
    ``reward`` when it is None. Call :meth:`update` with every
    training step's metrics (eval rows are ignored) and :meth:`record_bad_step` for every skipped
    non-finite step; stop training when :attr:`should_stop` is true.
    """

    def __init__(
        self, args: Any = None, correctness_reward: str | None = None, **thresholds: Any
    ) -> None:
        self.correctness_reward = correctness_reward
        if isinstance(args, MonitorThresholds):
            self.thresholds = dataclasses.replace(args, **thresholds)
        elif args is not None:
            self.thresholds = MonitorThresholds.from_config(args, **thresholds)
        else:
            self.thresholds = MonitorThresholds(**thresholds)
        t = self.thresholds
        self._alarms = {kind: _Alarm() for kind in CONDITION_KINDS}
        self._steps_seen = 0  # training rows given to update()
        self._zero_std_run = 0
        self._kl_history: deque[float | None] = deque(maxlen=t.kl_window + 1)
        self._length_history: deque[tuple[float | None, float | None]] = deque(
            maxlen=t.length_window
        )
        self._loss_note_given = False
        self._bad_run = 0
        self._last_bad_step: int | None = None

    # ------------------------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """True once ``max_bad_steps`` consecutive steps were skipped as non-finite."""
        return self.thresholds.max_bad_steps > 0 and self._bad_run >= self.thresholds.max_bad_steps

    @property
    def consecutive_bad_steps(self) -> int:
        return self._bad_run

    def record_bad_step(self, step: int, what: str = "the loss") -> list[TrainingWarning]:
        """Note a step whose update was skipped because ``what`` was NaN/inf. Returns one
        ``nan_step`` warning, always (each is an update lost), in a list like :meth:`update`."""
        if self._last_bad_step != step:  # the same step reported twice counts once
            self._bad_run += 1
            self._last_bad_step = step
        limit = self.thresholds.max_bad_steps
        stopping = " (stopping the run)" if self.should_stop else ""
        warning = TrainingWarning(
            step,
            "nan_step",
            f"{what} was not finite at step {step}, so its update was skipped "
            f"({self._bad_run} in a row of at most max_bad_steps={limit}{stopping}); lower "
            "learning_rate or max_grad_norm, use dtype=float32, and check the rewards for NaN.",
        )
        return [warning]

    # ------------------------------------------------------------------------------------------
    def update(self, logs: dict[str, Any]) -> list[TrainingWarning]:
        """Check one training step's metrics; returns the warnings to report (often none)."""
        if any(key.startswith("eval/") for key in logs):
            return []  # evaluation rows carry no training signal
        step = int(logs.get("step", self._steps_seen + 1))
        self._steps_seen += 1
        if step != self._last_bad_step:
            self._bad_run = 0  # a good step ends a run of bad ones

        out: list[TrainingWarning] = []
        checks = {
            "zero_std": self._zero_std,
            "entropy_collapse": self._entropy,
            "kl_blowup": self._kl,
            "length_hacking": self._length,
        }
        for kind, check in checks.items():
            message = check(logs, step)  # every check runs: each keeps its own history
            if self._should_fire(kind, message is not None, step):
                out.append(TrainingWarning(step, kind, message or ""))
        note = self._loss_note(logs, step)
        if note is not None:
            out.append(note)
        return out

    def _should_fire(self, kind: str, holds: bool, step: int) -> bool:
        t, alarm = self.thresholds, self._alarms[kind]
        if not holds:
            alarm.active = False
            alarm.clear_run += 1
            if alarm.clear_run >= t.rearm_steps:
                alarm.armed = True
            return False
        alarm.active, alarm.clear_run = True, 0
        cooled = alarm.last_fired is not None and step - alarm.last_fired >= t.cooldown_steps
        if alarm.armed or cooled:
            alarm.armed, alarm.last_fired = False, step
            return True
        return False

    # --- rules: each returns the message when its condition holds, else None ------------------
    def _zero_std(self, logs: dict[str, Any], step: int) -> str | None:
        t = self.thresholds
        frac = _number(logs, "frac_reward_zero_std")
        if frac is None:
            return None
        self._zero_std_run = self._zero_std_run + 1 if frac > t.zero_std_fraction else 0
        if self._zero_std_run < t.zero_std_steps:
            return None
        silent = [
            key.split("/")[1]
            for key, value in logs.items()
            if key.startswith("rewards/") and key.endswith("/frac_none") and value == 1.0
        ]
        if silent:
            return (
                f"frac_reward_zero_std has been above {t.zero_std_fraction:g} for "
                f"{self._zero_std_run} steps because reward function(s) {silent} returned None "
                "(or NaN) for every completion: they give no signal. Check that the dataset has "
                "the columns they read and that they can parse the completions."
            )
        return (
            f"frac_reward_zero_std has been above {t.zero_std_fraction:g} for "
            f"{self._zero_std_run} steps (now {frac:.2f}): almost every group gave all its "
            "completions the same reward, so advantages are 0 and nothing is being learned. "
            "Easier prompts (a task or mix the model solves some of the time) help most; "
            "dynamic_sampling=true (drop those groups, draw more prompts), curriculum=select "
            "(pick prompts likely to give mixed groups: 1.4-1.6x informative groups per rollout "
            "in the simulation in docs/benchmarks.md) and a larger num_generations spend the "
            "rollouts better."
        )

    def _entropy(self, logs: dict[str, Any], step: int) -> str | None:
        t = self.thresholds
        entropy = _number(logs, "entropy")
        if entropy is None or self._steps_seen <= t.entropy_warmup_steps:
            return None
        if entropy >= t.entropy_min:
            return None
        return (
            f"mean token entropy is {entropy:.3g} (below warn_entropy_min={t.entropy_min:g}) at "
            f"step {step}: the policy is collapsing onto a few outputs and will stop exploring; "
            "lower learning_rate, raise temperature, or raise beta."
        )

    def _kl(self, logs: dict[str, Any], step: int) -> str | None:
        t = self.thresholds
        kl = _number(logs, "kl")
        self._kl_history.append(kl)
        if kl is None:
            return None
        advice = "lower learning_rate, raise beta, or lower max_grad_norm."
        if kl > t.kl_max:
            return (
                f"KL to the reference is {kl:.3g} (above warn_kl_max={t.kl_max:g}) at step "
                f"{step}: the policy is drifting far from the reference; {advice}"
            )
        oldest = self._kl_history[0]
        if len(self._kl_history) <= t.kl_window or oldest is None or kl < t.kl_floor:
            return None
        if kl > t.kl_growth * oldest:
            growth = f"{kl / oldest:.1f}x " if oldest > 0 else ""
            return (
                f"KL to the reference grew {growth}in {t.kl_window} steps (from {oldest:.3g} to "
                f"{kl:.3g} at step {step}): the policy is starting to drift fast; {advice}"
            )
        return None

    def _length(self, logs: dict[str, Any], step: int) -> str | None:
        t = self.thresholds
        key = correctness_key(logs, self.correctness_reward)
        self._length_history.append((_number(logs, "completions/mean_length"), _number(logs, key)))
        if len(self._length_history) < t.length_window:
            return None
        half = t.length_window // 2
        rows = list(self._length_history)
        old, new = rows[:half], rows[-half:]  # the middle row of an odd window is in neither
        old_len, new_len = _mean([r[0] for r in old]), _mean([r[0] for r in new])
        old_ok, new_ok = _mean([r[1] for r in old]), _mean([r[1] for r in new])
        if old_len is None or new_len is None or old_ok is None or new_ok is None:
            return None  # a half without a finite value cannot be judged
        if old_len <= 0:
            return None
        if new_len <= t.length_growth * old_len or new_ok > old_ok + t.length_min_improvement:
            return None
        name = key.removeprefix("rewards/").removesuffix("/mean")
        return (
            f"mean completion length grew {new_len / old_len:.2f}x in {t.length_window} steps "
            f"(from {old_len:.0f} to {new_len:.0f} tokens, means of {half}-step windows) while "
            f"{name} did not improve ({old_ok:.3f} -> {new_ok:.3f}): likely reward hacking, so "
            "read the completions and consider length_penalty or a smaller max_completion_length."
        )

    def _loss_note(self, logs: dict[str, Any], step: int) -> TrainingWarning | None:
        loss, grad_norm = _number(logs, "loss"), _number(logs, "grad_norm")
        if self._loss_note_given or loss is None or grad_norm is None:
            return None
        if abs(loss) >= self.thresholds.loss_zero_atol or grad_norm <= 0:
            return None
        self._loss_note_given = True
        return TrainingWarning(step, "info", LOSS_ZERO_NOTE.format(grad_norm=grad_norm, step=step))

    # ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python values (JSON-serialisable) holding everything :meth:`update` depends on.
        The thresholds are not included: they come from the run's config."""
        return {
            "alarms": {kind: dataclasses.asdict(a) for kind, a in self._alarms.items()},
            "steps_seen": self._steps_seen,
            "zero_std_run": self._zero_std_run,
            "kl_history": list(self._kl_history),
            "length_history": [list(row) for row in self._length_history],
            "loss_note_given": self._loss_note_given,
            "bad_run": self._bad_run,
            "last_bad_step": self._last_bad_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._alarms = {kind: _Alarm(**state["alarms"][kind]) for kind in CONDITION_KINDS}
        self._steps_seen = int(state["steps_seen"])
        self._zero_std_run = int(state["zero_std_run"])
        self._kl_history = deque(state["kl_history"], maxlen=self.thresholds.kl_window + 1)
        self._length_history = deque(
            (tuple(row) for row in state["length_history"]), maxlen=self.thresholds.length_window
        )
        self._loss_note_given = bool(state["loss_note_given"])
        self._bad_run = int(state["bad_run"])
        self._last_bad_step = state["last_bad_step"]
