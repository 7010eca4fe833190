"""groupwise report: the HTML page built from a synthetic run folder, its errors, and a check of
the page in headless Chromium (skipped only where Chromium is not installed)."""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from groupwise import report
from groupwise.report import ReportError, build_report, check_in_browser, main, panels

STEPS = 30
# The figures a full run without a curriculum must have, and the extra ones with a curriculum.
BASE_PLOTS = {
    "reward",
    "accuracy",
    "eval",
    "eval_difficulty",
    "loss",
    "kl",
    "entropy",
    "length",
    "clip",
    "zero_std",
    "time",
    "optim",
}
CURRICULUM_PLOTS = {
    "curriculum_weights",
    "curriculum_rollouts",
    "curriculum_prompts",
    "curriculum_stats",
}
OLD_KEYS = ("step", "reward", "kl", "time/step")
CONFIG = {
    "model": "smollm2-135m-instruct",
    "task": "arithmetic",
    "num_generations": 8,
    "learning_rate": 1.0e-5,
    "beta": 0.04,
    "reward_weights": [1.0, 2.0],
}
EVENTS = [
    {"step": 2, "kind": "zero_std", "message": "92% of groups have one reward"},
    {"step": 5, "kind": "nan_step", "message": "loss is NaN; step skipped"},
    {"step": 6, "kind": "zero_std", "message": "95% of groups have one reward"},
    {"step": 9, "kind": "zero_std", "message": "100% of groups have one reward"},
]
EVIL = "<script>alert('pwned')</script>"


def _train_row(step: int, curriculum: bool) -> dict:
    accuracy = min(1.0, 0.1 + step / STEPS)
    noise = random.Random(step).uniform(-0.1, 0.1)  # so the moving average has work to do
    # Every plotted series changes over the run (a constant one is left out of the plots),
    # except the learning rate; time/step sums to 60 s over 30 steps.
    step_time = 2.0 + (0.5 if step % 2 else -0.5)
    row = {
        "step": step,
        "reward": 1.0 + accuracy,
        "reward_std": 0.3 + noise,
        "frac_reward_zero_std": 0.5 - step / 100,
        "rewards/format_reward/mean": 0.95 + noise / 2,
        "rewards/format_reward/std": 0.1,
        "rewards/accuracy_reward/mean": accuracy,
        "rewards/accuracy_reward/std": 0.4,
        "completions/mean_length": 30.0 + step + 20 * noise,
        "completions/max_length": 48.0 + step % 3,
        "completions/clipped_ratio": 0.1 + noise / 10,
        "loss": 0.01 * step,
        "kl": 0.001 * step * (1 + noise),
        "entropy": 1.0 - step / 50,
        "clip_ratio/low_mean": 0.001 * (step % 2),
        "clip_ratio/high_mean": 0.01 + noise / 100,
        "clip_ratio/region_mean": 0.01 + noise / 50,
        "grad_norm": 0.5 + noise,
        "learning_rate": 1e-5,
        "time/generation": step_time - 1.0,
        "time/scoring": 0.25,
        "time/update": 0.75,
        "time/step": step_time,
        "tokens_per_second": 100.0 / step_time,
    }
    if curriculum:
        for b in range(3):
            row[f"curriculum/weight_bin_{b}"] = (b + 1) / 6 + 0.01 * noise
            row[f"curriculum/rollouts_bin_{b}"] = 8.0 * (3 - b) + step % 2
            row[f"curriculum/prompts_bin_{b}"] = float(b + 1 + step % 3)
        row["curriculum/mu"] = 0.1 * step
        row["curriculum/wse"] = 0.05 + noise / 100
    return row


def write_run(
    root: Path,
    name: str = "run",
    curriculum: bool = False,
    extras: bool = True,
) -> Path:
    """A run folder as the trainer writes it; ``extras=False``: an old run, metrics.jsonl only."""
    run = root / name
    run.mkdir()
    rows = []
    for step in (0, 10, 20, 30):  # evaluations before training and every 10 steps
        evals = {
            "step": step,
            "eval/reward": 1.0 + step / 40,
            "eval/rewards/accuracy_reward/mean": step / 40,
            "eval/pass@1": 0.2 + step / 100,
            "eval/pass@4": 0.4 + step / 100,
            "eval/mean@8": 0.3 + step / 100,
            "eval/accuracy": 0.2 + step / 100,
            "eval/num_prompts": 64,
            "eval/difficulty_1/pass@1": 0.5,
            "eval/difficulty_2/pass@1": 0.1 + step / 100,
        }
        if step == 20:
            evals["eval/pass@1"] = 0.9  # the best pass@1, not the last one
        if step:
            rows.append(_train_row(step, curriculum))
        rows.append(evals)
    for step in range(1, STEPS + 1):
        if step % 10:
            rows.append(_train_row(step, curriculum))
    rows.sort(key=lambda r: r["step"])
    if not extras:  # an old trainer logged fewer metrics, and no eval rows here
        rows = [{k: r[k] for k in OLD_KEYS if k in r} for r in rows if "reward" in r]
    for row in rows:
        if row["step"] == 5 and "loss" in row:
            row["loss"] = math.nan  # the NaN step
        if row["step"] == 3:
            row.pop("entropy", None)  # a missing value
    with open(run / "metrics.jsonl", "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    # An earlier run in the same folder, which the report must ignore.
    (run / "metrics-20240101-000000.jsonl").write_text(
        json.dumps({"step": 1, "reward": 777.25, "time/step": 5000.0}) + "\n"
    )
    if not extras:
        return run
    (run / "config.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    with open(run / "events.jsonl", "w", encoding="utf-8") as out:
        for event in EVENTS:
            out.write(json.dumps(event) + "\n")
    records = [
        {
            "step": 5,
            "prompt": [
                {"role": "system", "content": "Answer in <answer> tags"},
                {"role": "user", "content": "What is 7 * 3?"},
            ],
            "answer": "21",
            "completions": [
                {
                    "text": f"<think>easy</think> <answer> 21 </answer> {EVIL}",
                    "reward": 2.0,
                    "rewards": {"format_reward": 1.0, "accuracy_reward": 1.0},
                    "advantage": 0.8125,
                },
                {
                    "text": "I do not know",
                    "reward": None,
                    "rewards": {"format_reward": 0.0, "accuracy_reward": None},
                    "advantage": -0.8125,
                },
            ],
        },
        {
            "step": 30,
            "prompt": "What is 2 + 2?",
            "answer": None,
            "completions": [
                {"text": "the last step's sample", "reward": 1.0, "rewards": {}, "advantage": 0.0}
            ],
        },
    ]
    with open(run / "completions.jsonl", "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    return run


def plot_ids(page: str) -> list[str]:
    return re.findall(r'<figure id="plot-([\w]+)"', page)


def png_sizes(page: str) -> list[tuple[int, int]]:
    """Width and height of every embedded PNG (from the IHDR chunk), checking the signature."""
    sizes = []
    for data in re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page):
        raw = base64.b64decode(data, validate=True)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        sizes.append(struct.unpack(">II", raw[16:24]))
    return sizes


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Build the reports once: plain, with a curriculum, and an old metrics-only run."""
    root = tmp_path_factory.mktemp("runs")
    built = {}
    for name, kwargs in {
        "plain": {},
        "curriculum": {"curriculum": True},
        "old": {"extras": False},
    }.items():
        run = write_run(root, name, **kwargs)
        path = build_report(run, dpi=40)  # low dpi: these tests check content, not looks
        built[name] = (path, path.read_text(encoding="utf-8"))
    return built


# ----------------------------------------------------------------------------------------------
# Content


def test_report_written_atomically_next_to_the_run(runs):
    path, page = runs["plain"]
    assert path.name == "report.html"
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []
    assert page.startswith("<!DOCTYPE html>")
    assert page.rstrip().endswith("</html>")


def test_every_section_present(runs):
    _, page = runs["plain"]
    for section in ("summary", "warnings", "plots", "config", "completions"):
        assert f'<section id="{section}">' in page
    assert f"<title>{report.REPORT_TITLE}: plain</title>" in page


def test_plots_exactly_the_groups_present(runs):
    _, page = runs["plain"]
    ids = plot_ids(page)
    assert set(ids) == BASE_PLOTS and len(ids) == len(BASE_PLOTS)
    sizes = png_sizes(page)
    assert page.count("<img") == len(sizes) == len(BASE_PLOTS)
    assert all(w > 100 and h > 50 for w, h in sizes)


def test_curriculum_plots_only_with_curriculum_keys(runs):
    _, page = runs["curriculum"]
    ids = plot_ids(page)
    assert set(ids) == BASE_PLOTS | CURRICULUM_PLOTS
    assert page.count("<img") == len(png_sizes(page)) == len(BASE_PLOTS | CURRICULUM_PLOTS)
    assert not CURRICULUM_PLOTS & set(plot_ids(runs["plain"][1]))


def test_no_external_resources(runs):
    _, page = runs["curriculum"]
    assert not re.search(r'(src|href)="(?!data:|#)', page)
    assert "http://" not in page and "https://" not in page
    assert page.count("<script") == 1  # only the load check


def test_summary_numbers(runs):
    _, page = runs["plain"]
    summary = page.split('<section id="summary">')[1].split("</section>")[0]
    # 30 steps at 2.0 s each; the earlier run's 5000 s step is not included.
    assert "1m 00s (2 s per step)" in summary
    assert "30 (steps 1 to 30)" in summary
    # Reward = 1.1 + step/30: means over the first/last 3 steps are 1.167 and 2.067 (capped 2.0).
    assert "1.167 → 2 (means of the first / last 3 logged steps)" in summary
    assert "777.2" not in page
    # The best pass@1 was at step 20 (0.9), not the last evaluation (0.5 at step 30).
    row = re.search(r"<tr><td>pass@1</td>(.*?)</tr>", summary).group(1)
    assert "0.2 <small>(step 0)</small>" in row
    assert "0.5 <small>(step 30)</small>" in row
    assert "<b>0.9</b> <small>(step 20)</small>" in row
    assert "loss: 1 step (5)" in summary  # the NaN is reported, not silently dropped
    assert "metrics-20240101-000000.jsonl" in page  # noted as an earlier run, not included


def test_warnings_grouped_with_counts_and_near_the_top(runs):
    _, page = runs["plain"]
    banner = page.index('id="warnings-banner"')
    assert banner < page.index('<section id="summary">')
    assert "4 warnings</b>: zero_std ×3, nan_step ×1" in page
    rows = re.findall(
        r'<tr><td><b>(\w+)</b></td><td class="num">(\d+)</td><td class="num">(\d+)</td>'
        r'<td class="num">(\d+)</td><td>(.*?)</td></tr>',
        page,
    )
    assert rows == [
        ("zero_std", "3", "2", "9", "92% of groups have one reward"),
        ("nan_step", "1", "5", "5", "loss is NaN; step skipped"),
    ]


def test_config_table(runs):
    _, page = runs["plain"]
    config = page.split('<section id="config">')[1].split("</section>")[0]
    assert "<tr><td>model</td><td>smollm2-135m-instruct</td></tr>" in config
    assert "<tr><td>learning_rate</td><td>1e-05</td></tr>" in config
    assert "<tr><td>reward_weights</td><td>[1.0, 2.0]</td></tr>" in config
    assert "<tr><td>num_generations</td><td>8</td></tr>" in config


def test_completions_escaped_with_rewards_advantage_and_answer(runs):
    _, page = runs["plain"]
    samples = page.split('<section id="completions">')[1].split("</section>")[0]
    assert EVIL not in page
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in samples
    assert "&lt;think&gt;easy&lt;/think&gt;" in samples
    assert "<b>system</b>: Answer in &lt;answer&gt; tags" in samples
    assert "answer: <code>21</code>" in samples
    assert "format_reward: 1<br>accuracy_reward: 1" in samples
    assert "accuracy_reward: —" in samples  # None: not applicable
    assert "+0.812" in samples and "-0.812" in samples
    # First and last logged steps, in that order.
    assert samples.index("Step 5 (first") < samples.index("Step 30 (last")
    assert "the last step&#x27;s sample" in samples


def test_old_run_with_only_metrics(runs):
    _, page = runs["old"]
    assert plot_ids(page) == ["reward", "kl", "time"]
    assert page.count("<img") == 3
    assert "No events.jsonl" in page
    assert "No config.yaml" in page
    assert "No completions.jsonl" in page
    assert 'id="warnings-banner"' not in page


def test_minimal_metrics_plot_only_what_exists(tmp_path):
    run = tmp_path / "tiny"
    run.mkdir()
    lines = [{"step": 1, "reward": 0.5, "kl": "n/a"}, {"step": 2, "reward": math.nan}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "events.jsonl").write_text("")
    page = build_report(run, tmp_path / "out" / "r.html", dpi=30).read_text()
    assert plot_ids(page) == ["reward"]  # kl is not a number, so no KL plot
    assert "No warnings were raised" in page
    assert (run / "report.html").exists() is False


def test_partial_last_line_is_skipped_with_a_note(tmp_path):
    run = tmp_path / "live"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')
    page = build_report(run, dpi=30).read_text()
    assert "skipped an incomplete last line 2" in page
    assert "1 (steps 1 to 1)" in page


def _groups(run_dir: Path) -> dict[str, report.PlotGroup]:
    return {g.id: g for g in report.plot_groups(report.load_run(run_dir))}


def _rewards_json(run: Path, flagged: str | None) -> None:
    names = ("format_reward", "accuracy_reward")
    records = [{"name": n, "weight": 1.0, "is_correctness": n == flagged} for n in names]
    (run / "rewards.json").write_text(json.dumps(records))


def test_correctness_reward_is_the_one_rewards_json_marks(tmp_path):
    run = write_run(tmp_path)
    _rewards_json(run, "format_reward")  # a run whose flagged reward is not named "accura..."
    assert report.load_run(run).rewards[0] == {
        "name": "format_reward",
        "weight": 1.0,
        "is_correctness": True,
    }
    accuracy = _groups(run)["accuracy"]
    assert accuracy.title == "Accuracy (format_reward)"
    assert [line.key for line in accuracy.panels[0].lines][0] == "rewards/format_reward/mean"
    _rewards_json(run, None)  # the run recorded that none of its rewards scores correctness
    assert "accuracy" not in _groups(run)


def test_correctness_reward_of_an_old_run_comes_from_the_names(tmp_path):
    run = write_run(tmp_path)  # no rewards.json: written before the trainer recorded it
    assert report.load_run(run).rewards is None
    assert _groups(run)["accuracy"].title == "Accuracy (accuracy_reward)"


def test_correctness_reward_rule():
    flagged = [
        {"name": "format_reward", "weight": 0.5, "is_correctness": False},
        {"name": "passes_tests", "weight": 1.0, "is_correctness": True},
    ]
    names = ["format_reward", "accuracy_reward", "passes_tests"]
    assert report.correctness_reward(names, flagged) == "passes_tests"
    assert report.correctness_reward(names, flagged[:1]) is None  # recorded: none is correctness
    assert report.correctness_reward(names, []) is None
    # Older runs: a name containing "accura" or "correct", not a list of known names.
    assert report.correctness_reward(names) == "accuracy_reward"
    assert report.correctness_reward(["format_reward", "is_correct"]) == "is_correct"
    assert report.correctness_reward(["format_reward", "code_reward"]) is None
    assert not hasattr(report, "CORRECTNESS_REWARDS")


# ----------------------------------------------------------------------------------------------
# Errors


def test_missing_run_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ReportError, match=re.escape(f"{missing} does not exist")):
        build_report(missing)


def test_run_dir_without_metrics(tmp_path):
    with pytest.raises(ReportError) as err:
        build_report(tmp_path)
    assert str(tmp_path / "metrics.jsonl") in str(err.value)
    assert "expected the metrics.jsonl" in str(err.value)


def test_malformed_metrics_line_names_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n\n{"step": 2,,}\n{"step": 3}\n')
    with pytest.raises(ReportError, match=r"metrics\.jsonl, line 3: malformed JSON"):
        build_report(tmp_path)


def test_malformed_events_line_names_file_and_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 1}\n')
    (tmp_path / "events.jsonl").write_text('{"step": 1, "kind": "x"}\n[1, 2]\n')
    with pytest.raises(ReportError, match=r"events\.jsonl, line 2: expected a JSON object"):
        build_report(tmp_path)


def test_malformed_rewards_json_names_the_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 1}\n')
    (tmp_path / "rewards.json").write_text('[{"name": "format_reward",')
    with pytest.raises(ReportError, match=r"rewards\.json: malformed JSON"):
        build_report(tmp_path)
    (tmp_path / "rewards.json").write_text('{"name": "format_reward"}')
    with pytest.raises(ReportError, match=r"rewards\.json: expected a list of objects"):
        build_report(tmp_path)


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 1}\n')
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ReportError, match=re.escape("pip install groupwise[report]")):
        build_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_main_prints_path_and_errors(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 1
    assert "nope does not exist" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 1}\n{oops\n')
    assert main([str(tmp_path)]) == 1
    assert "metrics.jsonl, line 2" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 1}\n')
    target = tmp_path / "elsewhere.html"
    assert main([str(tmp_path), "--output", str(target)]) == 0
    assert str(target) in capsys.readouterr().out
    assert target.read_text().count("<img") == 1
    assert main([]) == 2  # usage error from argparse, returned rather than exiting


# ----------------------------------------------------------------------------------------------
# The browser check


CHROMIUM_150_STDERR = """\
[1:2:1130/064858.054879:ERROR:dbus/bus.cc:405] Failed to connect to the bus: no socket
[1:1:1130/064858.581569:INFO:CONSOLE:3] "my console error", source: file:///t/b.html (3)
[1:1:1130/064858.581600:INFO:CONSOLE:3] "Uncaught ReferenceError: f is not defined", source: x (3)
"""


def test_console_messages_parses_chromium_logs():
    assert report.console_messages(CHROMIUM_150_STDERR) == [
        '"my console error", source: file:///t/b.html (3)',
        '"Uncaught ReferenceError: f is not defined", source: x (3)',
    ]
    older = '[1:1:0101/000000.1:INFO:CONSOLE(7)] "Uncaught TypeError: x", source: y (7)'
    assert report.console_messages(older) == ['"Uncaught TypeError: x", source: y (7)']
    assert report.console_messages("[1:2:3:ERROR:dbus/bus.cc:405] Failed to connect") == []


def test_dom_problems_reads_the_load_script_results():
    good = f'<title>{report.REPORT_TITLE}</title><body data-images-loaded="1" '
    good += 'data-images-ok="true" data-page-errors="0"><img src="x">'
    assert report.dom_problems(good) == []
    broken = good.replace('"true"', '"false"').replace('loaded="1"', 'loaded="0"')
    assert report.dom_problems(broken) == ["images failed to load: 0 of 1 <img> loaded"]
    assert "did not run" in report.dom_problems("<title>x</title><body>")[-1]


needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)"
)


@needs_chromium
def test_browser_renders_report_cleanly(runs):
    path, page = runs["curriculum"]
    assert check_in_browser(path) == []


@needs_chromium
def test_browser_check_catches_broken_page(runs, tmp_path):
    _, page = runs["plain"]
    broken = page.replace(
        "</main>",
        '<img alt="broken" src="data:image/png;base64,AAAA">'
        "<script>notDefinedAnywhere();</script></main>",
    )
    (tmp_path / "broken.html").write_text(broken, encoding="utf-8")
    problems = check_in_browser(tmp_path / "broken.html")
    text = "\n".join(problems)
    assert "Uncaught ReferenceError: notDefinedAnywhere is not defined" in text
    images = len(BASE_PLOTS) + 1
    assert f"images failed to load: {images - 1} of {images} <img> loaded" in text
    assert "error event(s) on the page" in text


@needs_chromium
def test_browser_check_catches_foreign_page(tmp_path):
    page = tmp_path / "other.html"
    page.write_text("<html><body><script>console.error('boom')</script></body></html>")
    problems = check_in_browser(page)
    assert any("boom" in p for p in problems)
    assert any("did not render" in p for p in problems)
    assert any("load script did not run" in p for p in problems)


def test_check_script_exit_codes(tmp_path, monkeypatch, capsys):
    script = Path(__file__).resolve().parents[2] / "scripts" / "check_report_browser.py"
    spec = importlib.util.spec_from_file_location("check_report_browser", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "check_in_browser", lambda path, chromium: [])
    assert module.main([str(tmp_path / "r.html")]) == 0
    assert "OK" in capsys.readouterr().out
    monkeypatch.setattr(module, "check_in_browser", lambda path, chromium: ["console: boom"])
    assert module.main([str(tmp_path / "r.html")]) == 1
    assert "console: boom" in capsys.readouterr().err


def test_eval_against_generated_tokens_when_the_run_counts_them(tmp_path):
    # 100 tokens per step, evaluations at steps 0, 2 and 4 (step 3 logged no count): the plot
    # puts them at 0, 200 and 400 tokens; a run without compute/* keys has no such plot.
    run = tmp_path / "tokens"
    run.mkdir()
    rows = []
    for step in range(5):
        if step:
            row = {"step": step, "reward": 0.1 * step}
            if step != 3:
                row["compute/generated_tokens_total"] = 100.0 * step
            rows.append(row)
        if step % 2 == 0:
            rows.append({"step": step, "eval/reward": 0.2 * step, "eval/accuracy": 0.1 * step})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = report.load_run(run)
    assert report.token_axis(data) == {0: 0.0, 1: 100.0, 2: 200.0, 4: 400.0}
    x, y = report.series(data.evals, "eval/accuracy", report.token_axis(data))
    assert x.tolist() == [0.0, 200.0, 400.0] and y.tolist() == pytest.approx([0.0, 0.2, 0.4])
    page = build_report(run, tmp_path / "r.html", dpi=30).read_text()
    assert "eval_tokens" in plot_ids(page)
    assert "completion tokens generated" in page
    for row in rows:
        row.pop("compute/generated_tokens_total", None)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "eval_tokens" not in plot_ids(build_report(run, tmp_path / "s.html", dpi=30).read_text())


# ----------------------------------------------------------------------------------------------
# The headline, hidden series, step ticks, the configuration against its defaults


def _write_metrics(run: Path, rows: list[dict], config: dict | None = None) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run


def _headline_of(page: str) -> str:
    return page.split('<section id="headline">')[1].split("</section>")[0]


def test_report_leads_with_held_out_accuracy_before_and_after(runs):
    _, page = runs["plain"]
    # eval/rewards/accuracy_reward/mean = step / 40: 0 before training, 0.75 at step 30.
    top = _headline_of(page)
    assert (
        "Held-out accuracy (accuracy_reward, greedy): <b>0.0% → 75.0%</b> (+75.0 points; "
        "before training → step 30, 4 evaluations)"
    ) in top
    assert page.index('<section id="headline">') < page.index('id="warnings-banner"')
    assert page.index('id="warnings-banner"') < page.index('<section id="summary">')
    assert "30 training steps" in top
    assert "no run.json (older groupwise)" in top


def test_headline_without_evaluation_says_so(runs, tmp_path):
    top = _headline_of(runs["old"][1])
    assert "No held-out evaluation in this run: metrics.jsonl has no eval/ records" in top
    run = _write_metrics(tmp_path / "noeval", [{"step": 1, "reward": 0.5}], {"num_eval_prompts": 0})
    top = _headline_of(build_report(run, dpi=30).read_text())
    assert "No held-out evaluation in this run (num_eval_prompts is 0)" in top


def test_headline_falls_back_and_names_its_steps(tmp_path):
    rows = [{"step": s, "reward": 0.1 * s} for s in range(1, 31)]
    # No correctness reward and no step-0 evaluation: sampled accuracy from step 10 to 30.
    evals = [{"step": s, "eval/accuracy": a} for s, a in ((10, 0.25), (20, 0.5), (30, 0.625))]
    run = _write_metrics(tmp_path / "sampled", rows + evals)
    found = report.headline(report.load_run(run))
    assert (found.key, found.first_step, found.last_step) == ("eval/accuracy", 10, 30)
    top = _headline_of(build_report(run, dpi=30).read_text())
    assert "Held-out accuracy (sampled): <b>25.0% → 62.5%</b> (+37.5 points; step 10 →" in top
    once = _write_metrics(tmp_path / "once", rows + [{"step": 30, "eval/reward": 1.5}])
    top = _headline_of(build_report(once, dpi=30).read_text())
    assert "Held-out reward (no accuracy metric logged): <b>1.5</b> at step 30" in top
    assert "evaluated once: no before and after" in top


def _hidden_line(page: str) -> str:
    match = re.search(r'<p class="hidden-series">not shown: (.*?)</p>', page)
    return match.group(1) if match else ""


def test_constant_and_switched_off_series_are_listed_not_plotted(tmp_path):
    # beta 0: the KL is not computed (logged as 0); a constant learning rate; loss never logged;
    # a reward component that is always 1. The grad norm and reward change and stay.
    rows = [
        {
            "step": s,
            "reward": 0.1 * s,
            "rewards/format_reward/mean": 1.0,
            "rewards/accuracy_reward/mean": 0.05 * s,
            "kl": 0.0,
            "grad_norm": 1.0 / s,
            "learning_rate": 1e-6,
        }
        for s in range(1, 21)
    ]
    run = _write_metrics(tmp_path / "beta0", rows, {"beta": 0.0})
    page = build_report(run, dpi=30).read_text()
    assert _hidden_line(page) == (
        "rewards/format_reward/mean (constant 1), loss (not logged), kl (beta 0), "
        "entropy (not logged), completions/mean_length (not logged), learning_rate (constant "
        "1e-06)"
    )
    assert plot_ids(page) == ["reward", "accuracy", "optim"]
    groups = _groups(run)
    assert [[line.key for line in p.lines] for p in groups["optim"].panels] == [["grad_norm"]]
    assert [line.key for line in groups["reward"].panels[0].lines] == [
        "reward",
        "rewards/accuracy_reward/mean",
    ]
    # With beta > 0 a KL that changes is plotted; a constant one is named as constant.
    run = _write_metrics(tmp_path / "beta", [dict(r, kl=0.01 * r["step"]) for r in rows])
    (run / "config.yaml").write_text("beta: 0.04\n")
    assert "kl" in plot_ids(build_report(run, dpi=30).read_text())
    run = _write_metrics(tmp_path / "nocfg", [dict(r, kl=0.5) for r in rows])
    assert "kl (constant 0.5)" in _hidden_line(build_report(run, dpi=30).read_text())


def test_one_point_is_plotted_and_nothing_hidden_says_nothing(tmp_path, runs):
    run = _write_metrics(tmp_path / "one", [{"step": 1, "reward": 0.5, "loss": 0.1}])
    page = build_report(run, dpi=30).read_text()
    assert plot_ids(page) == ["reward", "loss"]  # one value is an observation, not a constant
    assert _hidden_line(page) == "kl (not logged), entropy (not logged), " + (
        "completions/mean_length (not logged), grad_norm (not logged)"
    )
    # The full fixture run hides only its constant learning rate and the easy level's pass@1.
    assert _hidden_line(runs["plain"][1]) == (
        "eval/difficulty_1/pass@1 (constant 0.5), learning_rate (constant 1e-05)"
    )


def test_step_axes_have_integer_ticks(tmp_path):
    rows = [{"step": s, "reward": r, "time/step": t} for s, r, t in ((1, 0.1, 2), (2, 0.5, 3))]
    rows += [{"step": 3, "reward": 0.4, "time/step": 1}]
    data = report.load_run(_write_metrics(tmp_path / "short", rows))
    for group in report.plot_groups(data):
        fig = report.draw_group([data], group, dpi=30)
        for ax in fig.axes:
            ticks = ax.get_xticks()
            assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


RUN_INFO = {
    "groupwise_version": "0.1.0",
    "device": "cuda:0",
    "world_size": 2,
    "dtype": "float32",
    "precision": "bf16 mixed",
    "defaults": {"model": "tiny-random", "learning_rate": 1e-06, "beta": 0.04},
    "started": "2026-11-30T06:48:58+00:00",
    "finished": "2026-11-30T06:50:03+00:00",
    "wall_time_s": 65.2,
}


def test_configuration_as_changes_from_defaults_with_run_facts(tmp_path):
    run = write_run(tmp_path)
    (run / "run.json").write_text(json.dumps(RUN_INFO))
    page = build_report(run, dpi=30).read_text()
    config = page.split('<section id="config">')[1].split("</section>")[0]
    changed = config.split("<details>")[0]
    # CONFIG changes model and learning_rate (beta 0.04 is the default: not listed).
    assert "<h3>Options changed from the defaults (2)</h3>" in changed
    assert (
        "<tr><td>model</td><td><code>tiny-random</code> → <b>smollm2-135m-instruct</b></td></tr>"
    ) in changed
    assert "<tr><td>learning_rate</td><td><code>1e-06</code> → <b>1e-05</b></td></tr>" in changed
    assert "beta" not in changed and "num_generations" not in changed
    assert "<summary>All 6 options</summary>" in config  # the full list stays, folded
    for row in (
        "<tr><td>wall time</td><td>1m 05s</td></tr>",
        "<tr><td>started</td><td>2026-11-30 06:48:58+00:00</td></tr>",
        "<tr><td>groupwise</td><td>0.1.0</td></tr>",
        "<tr><td>device</td><td>cuda:0 × 2 ranks</td></tr>",
        "<tr><td>dtype</td><td>float32 (bf16 mixed)</td></tr>",
    ):
        assert row in config
    assert "1m 05s · started 2026-11-30 06:48:58+00:00 · groupwise 0.1.0" in _headline_of(page)
    (run / "run.json").write_text(json.dumps({**RUN_INFO, "finished": None}))
    assert "not finished" in _headline_of(build_report(run, dpi=30).read_text())
    (run / "run.json").write_text("[1]")
    with pytest.raises(ReportError, match=r"run\.json: expected a JSON object"):
        build_report(run)


def test_run_info_keeps_first_start_and_adds_up_wall_time(tmp_path, monkeypatch):
    clock = iter([1000.0, 1010.5, 2000.0, 2004.0])
    monkeypatch.setattr(report.record.time, "time", lambda: next(clock))
    start = report.record_run_start(tmp_path, {"device": "cpu"}, resumed=False)
    report.record_run_end(tmp_path, start)
    first = json.loads((tmp_path / "run.json").read_text())
    assert first["wall_time_s"] == 10.5 and first["device"] == "cpu"
    assert first["started"] == "1970-01-01T00:16:40+00:00"
    start = report.record_run_start(tmp_path, {"device": "cuda:0"}, resumed=True)
    assert json.loads((tmp_path / "run.json").read_text())["finished"] is None
    report.record_run_end(tmp_path, start)
    second = json.loads((tmp_path / "run.json").read_text())
    assert second["wall_time_s"] == 14.5 and second["started"] == first["started"]
    assert second["finished"] == "1970-01-01T00:33:24+00:00" and second["device"] == "cuda:0"
    assert report.changed_defaults({"a": 1, "b": [2], "c": 3}, {"a": 1, "b": [3]}) == {"b": [2]}


# ----------------------------------------------------------------------------------------------
# Several runs on one page


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    a = write_run(root, "a")
    b = write_run(root, "b", curriculum=True)
    config = {**CONFIG, "learning_rate": 3e-5, "num_generations": 16, "curriculum": "gdro"}
    (b / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root, a, b


def test_comparison_page_of_two_runs(compared, monkeypatch, capsys):
    root, a, b = compared
    monkeypatch.chdir(root)
    assert main([str(a), str(b)]) == 0
    path = root / "compare-a-vs-b.html"
    assert f"wrote {path.name}" in capsys.readouterr().out
    page = path.read_text()
    assert f"<title>{report.REPORT_TITLE}: comparison of a, b</title>" in page
    top = _headline_of(page)
    for run in ("a", "b"):  # the same evaluations: 0% before, 75% after, 30 steps
        row = re.search(rf"<tr><td><b>{run}</b></td>(.*?)</tr>", top).group(1)
        assert "<td>held-out accuracy (accuracy_reward, greedy)</td>" in row
        assert "0.0% <small>(step 0)</small>" in row
        assert "<b>75.0%</b> <small>(step 30)</small>" in row
        assert "+75.0 points" in row and "<td>30 training steps</td>" in row
    config = page.split('<section id="config">')[1].split("</section>")[0]
    assert "<tr><td>learning_rate</td><td>1e-05</td><td>3e-05</td></tr>" in config
    assert "<tr><td>num_generations</td><td>8</td><td>16</td></tr>" in config
    assert "<tr><td>curriculum</td><td>—</td><td>gdro</td></tr>" in config
    assert "<td>model</td>" not in config and "<td>beta</td>" not in config
    # Every figure of either run, once, with both runs overlaid.
    assert set(plot_ids(page)) == BASE_PLOTS | CURRICULUM_PLOTS
    assert len(plot_ids(page)) == len(png_sizes(page))
    assert _hidden_line(page) == (
        "eval/difficulty_1/pass@1 (constant 0.5), learning_rate (constant 1e-05)"
    )
    assert "<tr><td><b>b</b></td><td>zero_std ×3, nan_step ×1</td></tr>" in page
    assert not re.search(r'(src|href)="(?!data:|#)', page)


def test_comparison_overlays_each_run_with_a_legend(compared):
    _, a, b = compared
    runs = [report.load_run(a), report.load_run(b)]
    groups, _ = report.plot_plan(runs)
    by_id = {g.id: g for g in groups}
    fig = report.draw_group(runs, by_id["loss"], dpi=30, labels=["a", "b"])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["a", "b"]
    fig = report.draw_group(runs, by_id["reward"], dpi=30, labels=["a", "b"])
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[:2] == ["a: total", "b: total"] and "b: accuracy_reward" in legend
    # A curriculum figure has b's lines only; the time stack becomes the whole step per run.
    fig = report.draw_group(runs, by_id["curriculum_stats"], dpi=30, labels=["a", "b"])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["b"]
    fig = report.draw_group(runs, by_id["time"], dpi=30, labels=["a", "b"])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["a", "b"]
    for ax in fig.axes:
        assert all(float(t).is_integer() for t in ax.get_xticks())


def test_comparison_never_replaces_a_file_unasked(compared, monkeypatch, capsys):
    root, a, b = compared
    monkeypatch.chdir(root / "a")
    (root / "a" / "compare-a-vs-b.html").write_text("an earlier comparison")
    assert main([str(a), str(b)]) == 0
    assert (root / "a" / "compare-a-vs-b.html").read_text() == "an earlier comparison"
    assert (root / "a" / "compare-a-vs-b-2.html").read_text().startswith("<!DOCTYPE html>")
    capsys.readouterr()
    target = root / "mine.html"
    target.write_text("old")
    assert main([str(b), str(a), "--output", str(target)]) == 0  # asked for: replaced, and said
    assert "(replacing the file that was there)" in capsys.readouterr().out
    assert "comparison of b, a" in target.read_text()


def test_comparison_errors_and_labels(compared, tmp_path, capsys):
    _, a, b = compared
    assert main([str(a), str(a.parent / "b" / ".." / "a")]) == 1
    assert f"run directory {a.parent / 'b' / '..' / 'a'} is given twice" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "missing")]) == 1
    assert "missing does not exist" in capsys.readouterr().err
    # Two runs with one folder name are told apart by their parents.
    other = write_run(tmp_path, "a")
    assert report.run_labels([report.load_run(a), report.load_run(other)]) == [
        f"{a.parent.name}/a",
        f"{tmp_path.name}/a",
    ]
    assert report.default_comparison_path(["x y", "z"], tmp_path).name == "compare-x-y-vs-z.html"


def test_comparison_hides_what_is_constant_in_every_run(tmp_path):
    def rows(lr: float, kl: float) -> list[dict]:
        return [{"step": s, "reward": s * lr, "learning_rate": lr, "kl": kl} for s in range(1, 9)]

    a = _write_metrics(tmp_path / "a", rows(1e-6, 0.0), {"beta": 0.0})
    b = _write_metrics(tmp_path / "b", rows(1e-5, 0.0), {"beta": 0.04})
    page = report.render_comparison([report.load_run(a), report.load_run(b)], dpi=30)
    hidden = _hidden_line(page)
    # beta 0 in one run only: its KL is not "switched off" for both, but constant in each.
    assert "kl (constant 0)" in hidden and "learning_rate (constant in each run)" in hidden
    assert plot_ids(page) == ["reward"]


def test_cli_report_takes_several_runs(compared, monkeypatch, capsys):
    from groupwise import cli

    root, a, b = compared
    monkeypatch.chdir(tmp := root / "b")
    assert cli.main(["report", str(a), str(b), "-o", str(tmp / "ab.html")]) == 0
    assert (tmp / "ab.html").read_text().count("<figure") == len(BASE_PLOTS | CURRICULUM_PLOTS)
    assert "RUN_DIR [RUN_DIR ...]" in cli.USAGE


@needs_chromium
def test_browser_renders_comparison_cleanly(compared, tmp_path):
    _, a, b = compared
    path = report.build_comparison([a, b], tmp_path / "c.html", dpi=40)
    assert check_in_browser(path) == []


# ----------------------------------------------------------------------------------------------
# The table of figures

STYLES = {"smooth", "raw", "points", "stack"}
# One value per placeholder of the table, for a synthetic run that logs every series.
SAMPLE = {
    "reward": "accuracy_reward",
    "correct": "accuracy_reward",
    "bin": "0",
    "score": "pass@1",
    "level": "easy",
    "difficulty_metric": "pass@1",
}


def _table_series():
    for figure in panels.FIGURES:
        for panel in figure.panels:
            for spec in panel.series:
                yield figure, panel, spec


def _sample_key(template: str) -> str:
    for name, value in SAMPLE.items():
        template = template.replace("{" + name + "}", value)
    return template


def test_the_table_of_figures_is_well_formed():
    ids = [figure.id for figure in panels.FIGURES]
    assert len(ids) == len(set(ids))
    placeholders = set(panels.EACH) | set(panels.CHOSEN)
    assert set(SAMPLE) == placeholders
    for figure in panels.FIGURES:
        assert figure.panels and set(figure.needs) <= set(panels.CHOSEN), figure.id
        for text in [figure.title, *(panel.ylabel for panel in figure.panels)]:
            assert set(panels.placeholders(text)) <= set(figure.needs), (figure.id, text)
        # The panels of a figure share its x axis (and draw_group labels it from the last one).
        assert len({panel.x for panel in figure.panels}) == 1, figure.id
        keys = [spec.key for panel in figure.panels for spec in panel.series]
        assert len(keys) == len(set(keys)), figure.id
        for panel in figure.panels:
            assert panel.series and panel.style in STYLES, (figure.id, panel.ylabel)
            assert panel.x in ("step", "tokens"), (figure.id, panel.ylabel)
            if panel.style == "stack":  # the phases stack up to the whole step's time
                assert "time/step" in [spec.key for spec in panel.series], figure.id
    for figure, _, spec in _table_series():
        names = panels.placeholders(spec.key)
        assert set(names) <= placeholders, (figure.id, spec.key)
        assert sum(name in panels.EACH for name in names) <= 1, (figure.id, spec.key)
        assert set(panels.placeholders(spec.label)) <= set(names), (figure.id, spec.label)
        # A label override picks one value of a series repeated per logged name.
        assert not spec.labels or any(name in panels.EACH for name in names), spec.key
    for key in set(panels.SWITCHED_OFF) | set(panels.EXPECTED):
        assert key in {spec.key for _, _, spec in _table_series()}, key


def test_every_series_of_the_table_is_a_metric_the_trainer_logs():
    # A renamed metric fails here rather than silently vanishing from the report: every fixed
    # key is a string literal of the trainer's sources (eval/ keys: the evaluation's names,
    # which the trainer prefixes), and the fixed part of a repeated one appears in them.
    src = Path(report.__file__).parents[1]
    source = "\n".join(
        p.read_text(encoding="utf-8")
        for p in src.rglob("*.py")
        if p.relative_to(src).parts[0] != "report"
    )
    missing = []
    for figure, _, spec in _table_series():
        key = spec.key.removeprefix("eval/")
        if not panels.placeholders(key):
            found = f'"{key}"' in source
        else:
            fixed = [part for part in re.split(r"\{\w+\}", key) if part]
            found = all(part in source for part in fixed)
        if not found:
            missing.append(f"{figure.id}: {spec.key}")
    assert missing == []


def test_every_figure_of_the_table_renders(tmp_path):
    # A synthetic run that logs every series of the table (values that change, so none is
    # hidden as constant): every figure is planned, with every series, and draws.
    keys = list(dict.fromkeys(_sample_key(spec.key) for _, _, spec in _table_series()))
    train_keys = [k for k in keys if not k.startswith("eval/")]
    eval_keys = [k for k in keys if k.startswith("eval/")]
    rows = []
    for step in range(13):
        if step:
            row = {"step": step, "compute/generated_tokens_total": 100.0 * step}
            row.update({k: (step * (i + 2)) % 7 + step / 10 for i, k in enumerate(train_keys)})
            rows.append(row)
        if step % 4 == 0:
            rows.append({"step": step, **{k: step / (i + 20) for i, k in enumerate(eval_keys)}})
    run = _write_metrics(tmp_path / "all", rows)
    flagged = [{"name": "accuracy_reward", "weight": 1.0, "is_correctness": True}]
    (run / "rewards.json").write_text(json.dumps(flagged))
    data = report.load_run(run)
    groups, hidden = report.plot_plan([data])
    assert [g.id for g in groups] == [figure.id for figure in panels.FIGURES]
    assert hidden == []
    shown = {line.key: line.label for g in groups for p in g.panels for line in p.lines}
    assert set(shown) == set(keys)
    assert shown["curriculum/weight_bin_0"] == "bin 0 (hardest)"
    assert [g.title for g in groups if g.id == "accuracy"] == ["Accuracy (accuracy_reward)"]
    for group in groups:
        fig = report.draw_group([data], group, dpi=20)
        assert len(fig.axes) == len(group.panels), group.id
        assert report.figure_png(fig)[:8] == b"\x89PNG\r\n\x1a\n", group.id


def test_table_placeholders_expand_per_logged_name_in_order(tmp_path):
    # Reward components keep the order they were logged in; bins and eval scores sort by
    # number (bin 10 after bin 2, pass@16 after pass@2); the difficulty plot takes pass@1.
    rows = [
        {
            "step": s,
            "reward": s,
            "rewards/zeta/mean": s,
            "rewards/alpha/mean": 2 * s,
            "curriculum/weight_bin_10": s,
            "curriculum/weight_bin_2": -s,
        }
        for s in range(1, 5)
    ]
    rows.append(
        {
            "step": 4,
            "eval/pass@16": 0.5,
            "eval/pass@2": 0.25,
            "eval/difficulty_b/pass@1": 0.5,
            "eval/difficulty_a/pass@1": 0.25,
            "eval/difficulty_a/accuracy": 0.125,
        }
    )
    data = report.load_run(_write_metrics(tmp_path / "order", rows))
    groups = {g.id: g for g in report.candidate_groups([data])}
    assert [line.label for line in groups["reward"].panels[0].lines] == ["total", "zeta", "alpha"]
    assert [line.label for line in groups["curriculum_weights"].panels[0].lines] == [
        "bin 2",
        "bin 10",
    ]
    assert [line.key for line in groups["eval"].panels[0].lines] == [
        "eval/reward",
        "eval/pass@2",
        "eval/pass@16",
    ]
    difficulty = groups["eval_difficulty"].panels[0]
    assert difficulty.ylabel == "pass@1"
    assert [line.label for line in difficulty.lines] == ["difficulty a", "difficulty b"]
    assert "accuracy" not in groups  # no correctness reward: no accuracy figure


def test_importing_the_report_leaves_matplotlib_unloaded():
    # The trainer imports report.record at start-up; matplotlib loads only to draw.
    code = (
        "import sys\n"
        "import groupwise.report.record\n"
        "import groupwise.report\n"
        "print('LOADED', 'matplotlib' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "LOADED False" in result.stdout
