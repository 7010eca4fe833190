import json
import subprocess
import sys

import pytest

from groupwise.cli import main


def test_train_from_command_line_alone(tmp_path, capsys):
    out = tmp_path / "x"
    code = main(
        [
            "train",
            "--model", "tiny-random",
            "--task", "arithmetic",
            "--max_steps", "2",
            "--logging_steps", "1",
            "--num_generations", "4",
            "--max_completion_length", "4",
            "--num_eval_prompts", "4",
            "--eval_on_start", "true",
            "--output_dir", str(out),
            "--disable_tqdm",
        ]
    )  # fmt: skip
    assert code == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert "eval/rewards/accuracy_reward/mean" in lines[0]
    assert [x["step"] for x in lines if "reward" in x] == [1, 2]
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    assert "max_steps: 2" in (out / "config.yaml").read_text()


def test_train_from_yaml_with_override(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "model: tiny-random\nmax_steps: 5\nnum_generations: 4\nmax_completion_length: 3\n"
        f"num_eval_prompts: 0\noutput_dir: {tmp_path / 'y'}\ndisable_tqdm: true\n"
    )
    assert main(["train", str(config), "--max_steps", "1"]) == 0
    lines = (tmp_path / "y" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1


def test_bad_option_is_a_clear_error(capsys):
    assert main(["train", "--max_stepz", "3"]) == 2
    err = capsys.readouterr().err
    assert "unknown option 'max_stepz'" in err and "did you mean 'max_steps'" in err
    assert main(["train", "--beta", "lots"]) == 2
    assert "option 'beta' expects a number" in capsys.readouterr().err
    assert main(["train", "--task", "nope"]) == 2
    assert "task='nope'" in capsys.readouterr().err


def test_python_dash_m_works(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "groupwise", "--help"], capture_output=True, text=True, check=True
    )
    assert "groupwise <command>" in result.stdout
    assert main(["train", "--help"]) == 0


def test_train_help_gives_every_option_its_meaning(capsys):
    from groupwise.config.grpo_config import GRPOConfig, option_help

    meanings = option_help()
    assert set(meanings) == set(GRPOConfig.field_names())
    assert [name for name, text in meanings.items() if len(text) < 8] == []
    assert main(["train", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    beta = [line for line in lines if line.strip().startswith("--beta ")]
    assert beta == ["  --beta [0.0]  KL coefficient; 0 loads no reference model at all"]
    # A field without a comment on its line takes the comment block above it.
    assert meanings["gdro_signal"].startswith("Prompt-GDRO signal: pg_loss")


def test_the_demo_has_one_source_of_settings():
    """`groupwise demo`, `make demo` and `groupwise train configs/demo.yaml` read one file."""
    from pathlib import Path

    from groupwise.cli.args import _config_from_argv
    from groupwise.cli.train import DEMO_CONFIG, DEMO_YAML
    from groupwise.config.grpo_config import GRPOConfig

    root = Path(__file__).resolve().parents[2]
    # configs/demo.yaml is the packaged file itself (a link), not a copy that can drift.
    assert (root / "configs" / "demo.yaml").resolve() == DEMO_YAML.resolve()
    assert DEMO_YAML.resolve().parent == (root / "src" / "groupwise" / "cli")
    assert '"cli/demo.yaml"' in (root / "pyproject.toml").read_text()  # shipped in the wheel
    demo = _config_from_argv([], base=DEMO_CONFIG)
    from_yaml = GRPOConfig.from_yaml(root / "configs" / "demo.yaml")
    assert demo.to_dict() == from_yaml.to_dict()
    # The held-out accuracy is the demo's measure: no sampled eval_loss on top.
    assert demo.eval_loss is False and DEMO_CONFIG["eval_loss"] is False
    # make demo runs the command with no settings of its own.
    makefile = (root / "Makefile").read_text().splitlines()
    recipe = makefile[makefile.index("demo: setup") + 1]
    assert recipe.strip() == "$(VENV)/bin/groupwise demo"


def test_eval_command_greedy_sampled_and_compare(tmp_path, capsys):
    out = tmp_path / "eval.json"
    args = [
        "eval",
        "--model", "tiny-random",
        "--task", "arithmetic",
        "--num_eval_prompts", "3",
        "--eval_num_generations", "2",
        "--max_completion_length", "4",
        "--eval_output", str(out),
        "--compare_model", "tiny-random",
    ]  # fmt: skip
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["a"]["summary"]["overall"]["num_prompts"] == 3
    assert "pass@2" in report["a"]["summary"]["overall"]
    # The same seeded model against itself: the paired difference is exactly 0.
    assert report["comparison"]["metrics"]["pass@1"]["diff"] == 0.0
    assert "paired bootstrap 95% CI" in capsys.readouterr().out


def test_train_on_a_jsonl_file(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "\n".join(json.dumps({"question": f"What is {i} + 1?", "gold": i + 1}) for i in range(4))
    )
    code = main(
        [
            "train", "--model", "tiny-random", "--task", str(data),
            "--prompt_column", "question", "--answer_column", "gold",
            "--system_prompt", "Answer in <answer> tags.",
            "--max_steps", "1", "--num_generations", "2", "--per_device_train_batch_size", "4",
            "--max_completion_length", "3", "--output_dir", str(tmp_path / "run"),
            "--disable_tqdm",
        ]
    )  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["step"] == 1
    assert main(["train", "--task", str(tmp_path / "missing.jsonl")]) == 2


@pytest.mark.parametrize("task", ["countdown", "python", "gsm", "logic", "mixed"])
def test_train_one_step_on_every_builtin_task(tmp_path, task):
    out = tmp_path / task
    code = main(
        [
            "train", "--model", "tiny-random", "--task", task, "--max_steps", "1",
            "--num_generations", "2", "--per_device_train_batch_size", "4",
            "--num_train_prompts", "8", "--num_eval_prompts", "2", "--eval_on_start",
            "--max_completion_length", "3", "--output_dir", str(out), "--disable_tqdm",
        ]
    )  # fmt: skip
    assert code == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["eval/num_prompts"] == 2
    assert lines[1]["step"] == 1 and "reward" in lines[1]


def test_help_and_a_mistyped_option_do_not_import_torch():
    # torch and transformers take seconds to import; help and option errors need neither.
    code = (
        "import sys\n"
        "from groupwise.cli import main\n"
        "assert main(['--help']) == 0\n"
        "assert main(['train', '--help']) == 0\n"
        "assert main(['train', '--max_stepz', '3']) == 2\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout
    assert "did you mean 'max_steps'" in result.stderr


def test_the_package_exports_load_on_first_use():
    import groupwise

    assert groupwise.GRPOTrainer.__name__ == "GRPOTrainer"
    assert "GRPOConfig" in dir(groupwise)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = groupwise.nope


def test_max_steps_help_says_what_the_loop_counts(tmp_path):
    from groupwise.config.grpo_config import option_help

    # Two optimizer steps per generation batch: max_steps=4 is 4 optimizer steps (TRL's count),
    # 2 generation batches, logged at global_step 2 and 4.
    text = option_help()["max_steps"]
    assert "optimizer steps of the run" in text
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny-random", "--max_steps", "4", "--num_generations", "2",
                 "--logging_steps", "1",
                 "--per_device_train_batch_size", "2", "--steps_per_generation", "2",
                 "--max_completion_length", "2", "--num_eval_prompts", "0", "--output_dir",
                 str(out), "--disable_tqdm"]) == 0  # fmt: skip
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    assert rows[-1]["compute/optimizer_steps_total"] == 4


def test_curriculum_simulation_answers_help():
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum_sim.py"
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout and "seeds" in result.stdout


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.25, 0.5, 1.0, 2.0])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tmp_path, delay):
    import os
    import signal
    import time

    # SIGINT at several moments of start-up (importing the command line, then torch and
    # transformers, then building the run), before any step: always the shell's 130 and one line.
    # The delays count from groupwise's first own import (``-X importtime`` reports each import
    # as it finishes): before that the interpreter itself is starting, and a Ctrl-C there ends
    # any Python program with a KeyboardInterrupt traceback.
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "groupwise", "train", "--model",
         "tiny-random", "--max_steps", "1", "--output_dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # A terminal's Ctrl-C handling, whatever this test inherited (under nohup, or as a
        # background job of a script, SIGINT is ignored, and the child would rightly keep that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    head = []
    for line in process.stderr:  # the command line's own modules import inside its guard
        head.append(line)
        if line.rsplit("|", 1)[-1].strip().startswith("groupwise."):
            break
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    err = "".join(head) + rest
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err


def test_an_inherited_ignored_sigint_stays_ignored():
    import signal

    from groupwise.cli import _StartupInterrupt
    from groupwise.trainer.loop import StopSignals

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as nohup leaves it
        with _StartupInterrupt():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        stop = StopSignals()
        stop.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert callable(signal.getsignal(signal.SIGTERM))  # SIGTERM is not ignored: handled
        stop.restore()
        assert signal.getsignal(signal.SIGTERM) is before[1]
        # With the default handling, both install their handlers and restore the previous one.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with _StartupInterrupt() as watch:
            assert signal.getsignal(signal.SIGINT) == watch._handler
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        stop = StopSignals()
        stop.install()
        assert signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, signal.default_int_handler)
        stop.restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


def test_without_a_bar_each_logged_step_and_evaluation_is_one_line(tmp_path, capsys):
    base = ["train", "--model", "tiny-random", "--max_steps", "2", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--max_completion_length", "3",
            "--num_eval_prompts", "2", "--eval_on_start", "--eval_steps", "1",
            "--logging_steps", "1"]  # fmt: skip
    assert main([*base, "--output_dir", str(tmp_path / "a"), "--disable_tqdm", "true"]) == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("[groupwise] step ")]
    assert [line.split(" | ")[0] for line in steps] == ["[groupwise] step 1/2",
                                                        "[groupwise] step 2/2"]  # fmt: skip
    assert "accuracy" in steps[0] and "s/step" in steps[0]
    evals = [line for line in out.splitlines() if line.startswith("[groupwise] eval at step")]
    assert [line.split(":")[0] for line in evals] == [
        "[groupwise] eval at step 0 on 2 prompts",
        "[groupwise] eval at step 1 on 2 prompts",
        "[groupwise] eval at step 2 on 2 prompts",
    ]
    # With the bar allowed but no terminal (a log file), lines too, and no \r anywhere: neither
    # tqdm's bar nor transformers' "Writing model shards" bar on each save.
    assert main([*base, "--output_dir", str(tmp_path / "b"), "--logging_steps", "2",
                 "--save_steps", "1"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err
    assert "Writing model shards" not in captured.err
    steps = [line for line in captured.out.splitlines() if line.startswith("[groupwise] step ")]
    assert [line.split(" | ")[0] for line in steps] == ["[groupwise] step 2/2"]


def test_the_progress_bar_fits_80_columns():
    from tqdm import tqdm

    from groupwise.trainer.console import progress_postfix

    logs = {"reward": 1.234567, "kl": 0.012345, "completions/mean_length": 41.2,
            "rewards/format_reward/mean": 0.875, "rewards/accuracy_reward/mean": 0.5,
            "rewards/length_penalty/mean": -0.25, "time/step": 9.05}  # fmt: skip
    names = ["format_reward", "accuracy_reward", "length_penalty"]
    text = progress_postfix(logs, names, correctness="accuracy_reward")
    # The correctness reward comes first among the rewards; what does not fit is left out.
    assert text == "reward 1.23 accuracy 0.50"
    line = tqdm.format_meter(n=30, total=300, elapsed=3600 + 271, ncols=80, prefix="GRPO",
                             postfix=text)  # fmt: skip
    assert len(line) <= 80 and "reward 1.23" in line, line


def test_the_demo_says_when_it_evaluates_and_how_long_it_took(tmp_path, capsys):
    argv = ["demo", "--model", "tiny-random", "--max_steps", "1", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--max_completion_length", "3",
            "--num_eval_prompts", "2", "--output_dir", str(tmp_path / "demo")]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = [line for line in lines if line.startswith("[groupwise] evaluating ")]
    assert starts == [
        "[groupwise] evaluating 2 held-out problems before training (greedy) ...",
        "[groupwise] evaluating 2 held-out problems after 1 GRPO steps (greedy) ...",
    ]
    done = [line for line in lines if "held-out greedy accuracy" in line]
    assert len(done) == 2 and all(line.endswith(" s)") for line in done)
