"""docs/algorithms.md stays in step with the code that cites it and the code it names.

1. Every numbered citation of algorithms.md in ``src/`` ("algorithms.md §3.5",
   "algorithms.md 3.6", "algorithms.md 1.1 [obs]", "algorithms.md §2, §3.2",
   "docs/algorithms.md section 1", also split over two lines) names a heading of the document.
2. Every groupwise name the document gives in backticks (``module.function``,
   ``curriculum.gdro.Class.method`` or ``groupwise.x.y``) can be imported.

Fast: no model is loaded; only groupwise's modules are imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import groupwise

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "algorithms.md"
SRC = ROOT / "src"

SECTION = r"\d+(?:\.\d+)*"
# "algorithms.md" then an optional "," / ")" / "`", an optional "§", "section", "sec." prefix,
# a section number, and further "§"-prefixed numbers joined by "," or "and".
CITATION = re.compile(
    rf"algorithms\.md[`)]?,?\s*(?:§\s*|sections?\s+|sec\.\s*)?(?P<first>{SECTION})(?![\w.]*\d)"
    rf"(?P<rest>(?:\s*(?:,|and)\s*§\s*{SECTION})*)",
    re.IGNORECASE,
)
HEADING = re.compile(rf"^#{{2,4}}\s+(?P<number>{SECTION})\.?\s", re.MULTILINE)
BACKTICKED = re.compile(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)`")
NOT_A_NAME = (".py", ".md", ".yaml", ".yml", ".json", ".jsonl", ".toml", ".txt", ".html")


def _strip(line: str) -> str:
    """A source line without indentation, a comment marker or a docstring's quotes."""
    return line.strip().lstrip("#").strip().strip('"').strip()


def find_citations(text: str) -> list[tuple[int, str, list[str]]]:
    """(line number, cited text, section numbers) for each numbered citation of algorithms.md.

    A citation may continue on the next line (``algorithms.md\\n§3.6``), so each line is read
    together with the next one."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if "algorithms.md" not in line:
            continue
        start = line.index("algorithms.md")
        window = line[start:].rstrip()
        own = len(window)
        if i + 1 < len(lines):
            window += " " + _strip(lines[i + 1])
        for match in CITATION.finditer(window):
            if match.start() >= own:  # it starts on the next line, which is read on its own
                break
            numbers = [match["first"], *re.findall(rf"§\s*({SECTION})", match["rest"])]
            found.append((i + 1, match.group(0), numbers))
    return found


def doc_sections(text: str) -> set[str]:
    return {m["number"] for m in HEADING.finditer(text)}


def source_citations() -> list[tuple[str, int, str, list[str]]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        for lineno, cited, numbers in find_citations(path.read_text(encoding="utf-8")):
            out.append((f"{path.relative_to(ROOT)}:{lineno}", cited, numbers))
    return out


def _groupwise_modules() -> list[str]:
    names = ["groupwise"]
    for info in pkgutil.walk_packages(groupwise.__path__, "groupwise."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            names.append(info.name)
    return names


def resolve(name: str, modules: list[str]) -> object | None:
    """The object a dotted name in the document refers to, or None when the name is not a
    groupwise reference at all (``torch.std``, ``np.prod``). Raises when it is one (its first
    parts name a groupwise module) but the rest does not exist."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        prefix = ".".join(parts[:cut])
        matches = [m for m in modules if m == prefix or m.endswith("." + prefix)]
        if not matches:
            continue
        if len(matches) > 1:
            raise LookupError(f"`{name}`: {prefix!r} is ambiguous: {matches}")
        obj: object = importlib.import_module(matches[0])
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise AttributeError(f"`{name}`: {matches[0]} has no {'.'.join(parts[cut:])}")
            obj = getattr(obj, attr)
        return obj
    return None


def doc_names(text: str) -> list[str]:
    names = dict.fromkeys(m for m in BACKTICKED.findall(text) if not m.endswith(NOT_A_NAME))
    return list(names)


# ------------------------------------------------------------------------------------------
# The parsers themselves


@pytest.mark.parametrize(
    "text, numbers",
    [
        ("Sec. 4.1.2; algorithms.md §2):", [["2"]]),
        ("(algorithms.md §2, §3.2):", [["2", "3.2"]]),
        ("# --- PPO baseline (algorithms.md 3.6; verl defaults", [["3.6"]]),
        ("all bin weights equal (algorithms.md 1.1 [obs]).", [["1.1"]]),
        ("One step (algorithms.md\n    §3.6, verl core_algos.py", [["3.6"]]),
        ("docs/algorithms.md section 1). This", [["1"]]),
        ("(algorithms.md 1.4 lists its", [["1.4"]]),
        ("Section numbers refer to docs/algorithms.md, which quotes", []),
        ("algorithms.md §4).", [["4"]]),
    ],
)
def test_citation_parser(text, numbers):
    assert [n for _, _, n in find_citations(text)] == numbers


def test_heading_parser():
    text = "# Title\n## 1. GDRO\n### 1.1 Notation\n## 3. Variants\n### 3.7 CISPO\n"
    assert doc_sections(text) == {"1", "1.1", "3", "3.7"}


def test_a_wrong_citation_is_reported():
    sections = doc_sections(DOC.read_text(encoding="utf-8"))
    cited = find_citations("see algorithms.md §3.99 and algorithms.md 7")
    assert [n for _, _, numbers in cited for n in numbers if n not in sections] == ["3.99", "7"]


# ------------------------------------------------------------------------------------------
# The document against the code


def test_every_cited_section_exists():
    sections = doc_sections(DOC.read_text(encoding="utf-8"))
    citations = source_citations()
    # The docstrings cite the document about two dozen times; far fewer means the parser broke.
    assert len(citations) >= 15, f"only {len(citations)} citations found: {citations}"
    missing = [
        f"{where}: {cited!r} cites §{number}"
        for where, cited, numbers in citations
        for number in numbers
        if number not in sections
    ]
    assert not missing, (
        "citations of algorithms.md with no such heading in docs/algorithms.md "
        f"(headings: {sorted(sections)}):\n" + "\n".join(missing)
    )


def test_document_has_the_expected_sections():
    sections = doc_sections(DOC.read_text(encoding="utf-8"))
    expected = {"1", "2", "3", "4", "5"}
    expected |= {f"1.{i}" for i in range(1, 10)} | {f"3.{i}" for i in range(1, 8)}
    assert expected <= sections, f"missing headings: {sorted(expected - sections)}"


def test_every_named_function_exists():
    modules = _groupwise_modules()
    names = doc_names(DOC.read_text(encoding="utf-8"))
    resolved, errors = [], []
    for name in names:
        try:
            obj = resolve(name, modules)
        except (ImportError, AttributeError, LookupError) as exc:
            errors.append(str(exc))
            continue
        if obj is not None:
            resolved.append(name)
    assert not errors, "docs/algorithms.md names code that does not exist:\n" + "\n".join(errors)
    # The document names the implementing function of each section: dozens of them.
    assert len(resolved) >= 30, f"only {len(resolved)} groupwise names resolved: {resolved}"


def test_resolver_rejects_a_wrong_name():
    modules = _groupwise_modules()
    assert resolve("algo.pass_at_k", modules) is groupwise.algo.pass_at_k
    assert resolve("torch.std", modules) is None
    with pytest.raises(AttributeError, match="no pass_at_kk"):
        resolve("algo.pass_at_kk", modules)
    with pytest.raises(AttributeError):
        resolve("groupwise.curriculum.gdro.PromptGDRO.no_such_method", modules)


# --- product text speaks about the product --------------------------------------------------------

# Text about how the project was made, which means nothing to a user: its planning files (not in
# the repository), tracker numbers, the machine it was developed on, internal review rows.
HISTORY_TEXT = re.compile(
    r"mission\.md|\bissues?[ _-]?#?\d+|\bissue N\b|\bthis \d+-core (?:machine|CPU)\b"
    r"|curriculum[- ]audit|\baudit (?:row|section)s?\b|\bthe audit\b|\bseeds' "
    r"|\bthe seeds assume\b|\.\./shared\b",
    re.IGNORECASE,
)
PRODUCT_FILES = ("README.md", "Makefile", "pyproject.toml")
PRODUCT_FOLDERS = ("docs", "src", "benchmarks", "scripts", "configs", "tests")


def _product_files() -> list[Path]:
    files = [ROOT / name for name in PRODUCT_FILES if (ROOT / name).is_file()]
    for folder in PRODUCT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".sh"):
                files.append(path)
    return [f for f in files if f != Path(__file__).resolve()]


def test_product_text_does_not_speak_of_how_it_was_made():
    found = []
    for path in _product_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = HISTORY_TEXT.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}: {line}")
    assert not found, "rephrase to speak about the product:\n" + "\n".join(found)


def test_history_pattern_catches_what_it_should():
    for text in ("see mission.md", "fixed in issue 14", "Issue #3", "on this 2-core machine",
                 "docs/curriculum-audit.md", "(audit row 12)", "The seeds' figures",
                 "../shared/notes"):  # fmt: skip
        assert HISTORY_TEXT.search(text), text
    for text in ("every collective groupwise issues", "the seeds vary the runs", "a 2-core CPU"):
        assert not HISTORY_TEXT.search(text), text


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_readme_examples_say_what_they_do(page):
    """The first command of the README (and of the quickstart, which carries the same section)
    says tiny-random cannot learn; the Python example uses the demo's learning rate (the
    quickstart reports that 2e-5 collapsed the entropy)."""
    from groupwise.cli.train import DEMO_CONFIG

    readme = (ROOT / page).read_text(encoding="utf-8")
    use_it = readme[readme.index("## Use it") :]
    block = use_it[: use_it.index("```", use_it.index("```bash") + 3)]
    first = block.index("groupwise train --model tiny-random")
    assert "cannot learn" in block[:first], block
    snippet = use_it[use_it.index("```python") :]
    snippet = snippet[: snippet.index("```", 3)]
    rate = re.search(r"learning_rate=([0-9.e-]+)", snippet)
    assert rate is not None and float(rate.group(1)) == DEMO_CONFIG["learning_rate"]


def test_the_demo_learning_rate_claim_is_where_the_examples_point():
    # The reason given for 1e-5 lives in the quickstart's demo section.
    quickstart = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    demo = quickstart[quickstart.index("## What the demo does") :]
    assert "2e-5 collapsed the policy's entropy" in demo


# --- the documentation site ----------------------------------------------------------------------

DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
HOOKS = ROOT / "scripts" / "mkdocs_hooks.py"


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", HOOKS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    return []


def _anchors(path: Path) -> set[str]:
    """The heading ids MkDocs gives a page (Python-Markdown's toc slugify, as mkdocs.yml uses)."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M)
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in headings}


def test_every_readme_link_to_the_docs_resolves():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [m["target"] for m in LINK.finditer(readme) if m["target"].startswith("docs/")]
    # The README is short and points into the docs for everything else: a dozen pages at least.
    assert len({t.split("#")[0] for t in targets}) >= 12, targets
    broken = []
    for target in targets:
        file, _, anchor = target.partition("#")
        if not (ROOT / file).is_file():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(ROOT / file):
            broken.append(f"{target}: no heading with that id in {file}")
    assert not broken, broken


def test_anchor_reader_knows_mkdocs_ids():
    # The id MkDocs gave this heading in a build (checked in the built concepts.html).
    assert "batch-arithmetic-generation-batch-mini-batches-optimizer-steps" in _anchors(
        DOCS / "concepts.md"
    )


def test_the_nav_lists_every_page_and_only_pages_that_exist():
    import yaml

    config = yaml.safe_load(MKDOCS.read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, (
        f"in docs/ but not in the nav: {sorted(set(pages) - set(nav))}; "
        f"in the nav but not in docs/: {sorted(set(nav) - set(pages))}; "
        f"listed twice: {sorted({p for p in nav if nav.count(p) > 1})}"
    )
    assert config["hooks"] == ["scripts/mkdocs_hooks.py"]


def test_the_option_reference_is_generated_from_every_field():
    from groupwise.config.grpo_config import GRPOConfig, option_help

    hooks = _hooks()
    page = (DOCS / "options.md").read_text(encoding="utf-8")
    assert page.count(hooks.MARKER) == 1, "docs/options.md lost the generated reference's marker"
    sections = hooks.option_sections()
    listed = [name for _, fields in sections for name in fields]
    assert listed == list(GRPOConfig.field_names())  # each field once, in source order
    assert [title.split(" (")[0] for title, _ in sections][:4] == [
        "model and data", "tools and environments", "algorithm", "GRPO"
    ]  # fmt: skip
    reference = hooks.option_reference()
    meanings = option_help()
    for name in listed:
        rows = [line for line in reference.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, name
        assert meanings[name].replace("|", "\\|") in rows[0], (name, rows[0])
    beta = next(line for line in reference.splitlines() if line.startswith("| `beta` |"))
    assert beta == "| `beta` | `0.0` | KL coefficient; 0 loads no reference model at all |"
    # A "|" in a meaning would split its row into extra cells.
    assert "| `on_invalid_rows` | `error` | file tasks: error \\| skip" in reference
    assert reference.count("\n## ") + reference.startswith("## ") == len(sections)


def test_the_trl_page_lists_every_declared_difference_from_trl():
    from groupwise.config.trl import TRL_IGNORED
    from groupwise.config.trl_parity import DIFFERENCES, TRL_VERSION

    hooks = _hooks()
    page = (DOCS / "trl.md").read_text(encoding="utf-8")
    assert page.count(hooks.DIFFERENCES_MARKER) == 1, "docs/trl.md lost the differences' marker"
    assert page.count(hooks.IGNORED_COUNT_MARKER) == 1, "docs/trl.md lost the ignored count"
    rendered = hooks.trl_page(page)
    assert hooks.DIFFERENCES_MARKER not in rendered and hooks.IGNORED_COUNT_MARKER not in rendered
    assert f"the other {len(TRL_IGNORED)} names" in rendered
    table = hooks.differences_table()
    assert table in rendered and f"| option | groupwise | TRL {TRL_VERSION} | why |" in table
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(DIFFERENCES)  # each entry once, in order
    for row, difference in zip(rows, DIFFERENCES.values(), strict=True):
        assert row.count(" | ") == 3  # four cells: nothing in a text split its row
        for text in (difference.groupwise, difference.trl, difference.reason):
            assert text in row


def _docs_build_command(site: Path, config: Path | None = None) -> list[str]:
    """`make docs`'s mkdocs command as the Makefile spells it (so its flags cannot drift from
    what this test checks), writing to ``site``, optionally from another config file."""
    recipe = re.search(r"^docs:.*\n\t(?P<line>.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "Makefile has no docs target"
    args = recipe["line"].split("/bin/mkdocs ", 1)[1].split()
    assert args[:2] == ["build", "--strict"] and "--quiet" not in args, args  # quiet hides warnings
    args[args.index("--site-dir") + 1] = str(site)
    return [sys.executable, "-m", "mkdocs", *args, *(["-f", str(config)] if config else [])]


def _build(command: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_the_site_builds_strictly_with_the_generated_reference(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is installed by make setup (the test extra)")
    from groupwise.config.grpo_config import GRPOConfig

    build = _build(_docs_build_command(tmp_path / "site"))
    assert build.returncode == 0, build.stderr[-3000:]
    options = (tmp_path / "site" / "options.html").read_text(encoding="utf-8")
    missing = [n for n in GRPOConfig.field_names() if f"<code>{n}</code>" not in options]
    assert not missing, missing
    assert "option reference: generated" not in options  # the marker was replaced
    # A comment's "docs/tools.md" is a link on the site (checked by the strict build).
    assert '<a href="tools.html">tools</a>' in options


def test_the_strict_build_fails_on_a_page_left_out_and_on_a_broken_link(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is installed by make setup (the test extra)")
    import yaml

    config = yaml.safe_load(MKDOCS.read_text(encoding="utf-8"))
    config["docs_dir"] = str(DOCS)
    config["hooks"] = [str(ROOT / h) for h in config["hooks"]]
    nav = [page for page in config["nav"] if page != {"Option reference": "options.md"}]
    left_out = dict(config, nav=nav)
    assert left_out["nav"] != config["nav"]
    path = tmp_path / "left_out.yml"
    path.write_text(yaml.safe_dump(left_out), encoding="utf-8")
    build = _build(_docs_build_command(tmp_path / "a", path))
    assert build.returncode != 0 and "options.md" in build.stderr, build.stderr[-3000:]

    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    with open(docs / "index.md", "a", encoding="utf-8") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(dict(config, docs_dir=str(docs))), encoding="utf-8")
    build = _build(_docs_build_command(tmp_path / "b", path))
    assert build.returncode != 0 and "no-such-page.md" in build.stderr, build.stderr[-3000:]
