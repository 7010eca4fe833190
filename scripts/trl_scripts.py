"""Runs public TRL GRPO scripts on groupwise, as a user who switches `from trl import ...` would.

    python scripts/trl_scripts.py --trl-src TRL --openr1-src OPEN_R1 [--work runs/trl-scripts]
        [--only ROW,...] [--no-trl-run]

TRL and OPEN_R1 are a git directory (bare or not; HEAD is read) or a plain checkout folder.
The scripts are TRL's ``examples/scripts/`` ``grpo_agent.py`` (a tool), ``gspo.py`` (TrlParser,
sequence-level importance sampling, LoRA, TRL's rewards), ``grpo_2048.py`` (an
environment_factory game, no command line) and ``grpo_continuous_batching.py`` (options set
on the parsed config), and open-r1's ``src/open_r1/grpo.py`` (with the ``open_r1`` modules it
imports, found transitively, and its recipe YAML). The two that parse with TrlParser, gspo.py
and grpo_continuous_batching.py, also run as two more rows each: on TRL itself (``NAME-trl``:
only the stand-ins edited in; its optimizer-step count is TRL's for the same arguments, which
the script's rows are checked against, as every other row is against max_steps), and as a
user who switches only ``GRPOConfig`` / ``GRPOTrainer`` ports it (``NAME-trl-parser``:
TrlParser, ModelConfig, ScriptArguments and TRL's rewards stay TRL's). The copies go into WORK
at run time, never into groupwise, and are edited mechanically, nothing else:

(a) TRL's import lines: a name groupwise provides is imported from groupwise under the same name
    (``trl`` -> ``groupwise``, ``trl.rewards`` -> ``groupwise.rewards.trl_rewards``; ``import trl``
    with ``trl.X`` uses becomes ``import groupwise as trl``); a name it does not provide stays
    imported from ``trl`` and is listed in results.md (the run then needs TRL installed for it:
    ``--trl-fallback DIR`` puts a folder holding the ``trl`` package on the scripts' path);
(b) what an offline CPU run needs: hub ids (string literals, recipe values) -> local stand-ins,
    and the optional remote-service imports listed in ``OPTIONAL_IMPORTS``, each with its reason,
    dropped only when their packages are not installed;
(c) only for grpo_2048.py, which parses no command line: its ``GRPOConfig(...)`` keywords that
    a CPU run needs (``game_keywords``: max_steps, shorter games, no trackio, use_cpu), what
    its user would edit. Every other script gets its CPU scale from the command line.

With TRL installed beside groupwise (as in groupwise's virtualenv) the names left on ``trl``
import from it and ``--trl-fallback`` is not needed.

Every changed file's unified diff is written to WORK/diffs/. The stand-ins are built in
WORK/assets: tiny models (groupwise's tiny-random architecture and SmolLM2's tokenizer and chat
template), each fitted to answer its script's prompts in the form the rewards score (the agent's
and the 2048 game's to call their tool, so the tool really runs), and datasets with the columns
and splits each script reads. Each script runs a few optimizer steps on CPU as ``python
script.py ...`` (one thread), and WORK/results.md gets one row per script with the checks a user
would make: exit status, optimizer steps against TRL's, the saved model (or last checkpoint)
loadable by transformers / peft, open-r1's metrics files and model card, the rewards' logged
values, the tools' calls, the options groupwise reported ignoring.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# TRL modules whose names groupwise provides, and where (docs/trl.md "TRL scripts").
MODULE_MAP = {"trl": "groupwise", "trl.rewards": "groupwise.rewards.trl_rewards"}

# (b) Imports of remote services an offline CPU run cannot use: (file, imported module, the
# packages it needs, why dropping it changes nothing the run does). Dropped only when one of
# the packages is missing.
OPTIONAL_IMPORTS = [
    ("src/open_r1/rewards.py", "open_r1.utils.competitive_programming",
     ("aiohttp", "async_lru", "dotenv"),
     "the Piston / Morph remote code-execution clients of the ioi_code and cf_code rewards; the "
     "recipe's rewards (accuracy, format, tag_count) never call them"),
    ("src/open_r1/rewards.py", "open_r1.utils.code_providers", ("e2b_code_interpreter",
     "morphcloud"), "the E2B / Morph remote sandboxes of the code rewards: its "
     "`if is_e2b_available():` imports e2b_code_interpreter although it is not installed, as "
     "transformers 5's _is_package_available returns a (bool, version) tuple, always true; the "
     "recipe's rewards never call get_provider"),
]  # fmt: skip

AGENT = "examples/scripts/grpo_agent.py"
GSPO = "examples/scripts/gspo.py"
GAME = "examples/scripts/grpo_2048.py"
BATCHING = "examples/scripts/grpo_continuous_batching.py"
# What a user switches who changes only the trainer's two names: the parser variant keeps
# TrlParser, ModelConfig, ScriptArguments (and everything else) on TRL.
TRAINER_ONLY = ("GRPOConfig", "GRPOTrainer")
# The rows each TRL script gives: a TrlParser script also runs on TRL itself (-trl) and with
# only the trainer's two names switched (-trl-parser).
TRL_ROWS = {AGENT: ("grpo_agent",), GSPO: ("gspo-trl", "gspo", "gspo-trl-parser"),
            GAME: ("grpo_2048",), BATCHING: ("grpo_continuous_batching-trl",
            "grpo_continuous_batching", "grpo_continuous_batching-trl-parser")}  # fmt: skip
OPENR1_ENTRY = "src/open_r1/grpo.py"
OPENR1_RECIPE = "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml"


# -- sources ---------------------------------------------------------------------------------------


class Source:
    """A repository snapshot: a git directory (HEAD is read) or a plain folder of files."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        git = self.path / ".git" if (self.path / ".git").exists() else self.path
        self.git = git if (git / "HEAD").is_file() and (git / "objects").is_dir() else None
        if self.git is None and not self.path.is_dir():
            raise SystemExit(f"error: {path} is neither a git directory nor a folder")

    def read(self, rel: str) -> str | None:
        if self.git is None:
            file = self.path / rel
            return file.read_text() if file.is_file() else None
        out = subprocess.run(["git", "--git-dir", str(self.git), "show", f"HEAD:{rel}"],
                             capture_output=True, text=True)  # fmt: skip
        return out.stdout if out.returncode == 0 else None

    def revision(self) -> str:
        if self.git is None:
            return f"folder {self.path}"
        out = subprocess.run(["git", "--git-dir", str(self.git), "log", "-1", "--format=%H %cs"],
                             capture_output=True, text=True)  # fmt: skip
        return out.stdout.strip()


def _module_file(source: Source, root: str, module: str) -> str | None:
    base = f"{root}/{module.replace('.', '/')}" if root else module.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        if source.read(rel) is not None:
            return rel
    return None


def imported_modules(text: str, module: str, is_package: bool) -> set[str]:
    """Every absolute module name ``text`` (module ``module``) imports, relative imports
    resolved, including ``from pkg import submodule`` candidates (``pkg.submodule``)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def extract_package(source: Source, entry: str, root: str, package: str,
                    edit=lambda rel, text: text) -> dict[str, str]:  # fmt: skip
    """``entry`` and, transitively, every module of ``package`` it imports (after ``edit``),
    with the ``__init__.py`` of each package on the way: {path in the repo: edited text}."""
    files: dict[str, str] = {}
    todo = [entry]
    while todo:
        rel = todo.pop()
        if rel in files:
            continue
        text = source.read(rel)
        if text is None:
            raise SystemExit(f"error: {rel} is not in {source.path}")
        files[rel] = text = edit(rel, text)
        inner = rel[len(root) + 1 :] if root else rel
        module = inner[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for name in sorted(imported_modules(text, module, rel.endswith("__init__.py"))):
            if name != package and not name.startswith(package + "."):
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # the packages on the way, then the module
                found = _module_file(source, root, ".".join(parts[:i]))
                if found and found not in files:
                    todo.append(found)
    return files


# -- the edits -------------------------------------------------------------------------------------


@dataclass
class EditLog:
    """What the edits of one file changed and what they could not map."""

    changes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # "trl.NAME (line N)"


def _provides(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def _replace_lines(lines: list[str], start: int, end: int, new: list[str]) -> None:
    lines[start - 1 : end] = new


def edit_trl_imports(text: str, log: EditLog, provides=_provides) -> str:
    """(a): TRL's import lines -> groupwise, same names. ``provides(module, name)`` says whether
    groupwise's ``module`` has ``name``; names it lacks stay on TRL and go to ``log.missing``."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(tree):
        indent = " " * getattr(node, "col_offset", 0)
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
            node.module == "trl" or node.module.startswith("trl.")
        ):
            target = MODULE_MAP.get(node.module)
            names = [(a.name, a.asname) for a in node.names]
            have = [n for n in names if target and provides(target, n[0])]
            lack = [n for n in names if n not in have]
            def spell(chosen):
                return ", ".join(n if a is None else f"{n} as {a}" for n, a in chosen)

            new = []
            if have:
                new.append(f"{indent}from {target} import {spell(have)}\n")
            if lack:
                new.append(f"{indent}from {node.module} import {spell(lack)}\n")
                log.missing += [f"{node.module}.{n} (line {node.lineno})" for n, _ in lack]
            if have:
                new[-1] = new[-1][:-1] + _tail(lines, node)
                edits.append((node.lineno, node.end_lineno, new))
                log.changes.append(f"line {node.lineno}: {len(have)} name(s) from {target}")
        elif isinstance(node, ast.Import) and any(a.name == "trl" for a in node.names):
            bound = next(a.asname or "trl" for a in node.names if a.name == "trl")
            used = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                           and isinstance(n.value, ast.Name) and n.value.id == bound})  # fmt: skip
            lack = [n for n in used if not provides("groupwise", n)]
            log.missing += [f"trl.{n} (used as {bound}.{n})" for n in lack]
            if len(node.names) == 1 and not lack:
                new = [f"{indent}import groupwise as {bound}{_tail(lines, node)}"]
                edits.append((node.lineno, node.end_lineno, new))
                log.changes.append(f"line {node.lineno}: import groupwise as {bound}")
            elif len(node.names) == 1 and len(lack) < len(used):
                # Some names only: those groupwise has are read from it, the rest from trl.
                edits.append((node.lineno, node.end_lineno,
                              [f"{indent}import groupwise\n", lines[node.lineno - 1]]))  # fmt: skip
                log.changes.append(f"line {node.lineno}: import groupwise too")
                uses = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name) and n.value.id == bound
                        and n.attr not in lack]  # fmt: skip
                for number in sorted({n.lineno for n in uses}):
                    on_line = [n for n in uses if n.lineno == number]
                    edits.append((number, number, [_retarget(lines[number - 1], on_line)]))
                    log.changes += [f"line {number}: {bound}.{n.attr} -> groupwise.{n.attr}"
                                    for n in on_line]  # fmt: skip
    for start, end, new in sorted(edits, reverse=True):
        _replace_lines(lines, start, end, new)
    return "".join(lines)


def _tail(lines: list[str], node: ast.stmt) -> str:
    """What follows statement ``node`` on its last line (a comment), with the line's end."""
    return lines[node.end_lineno - 1].encode()[node.end_col_offset :].decode() or "\n"


def _retarget(line: str, nodes: list[ast.Attribute]) -> str:
    """``line`` with the ``trl`` of each of its ``nodes`` (``trl.NAME``) spelled ``groupwise``."""
    raw = line.encode()
    for node in sorted(nodes, key=lambda n: n.col_offset, reverse=True):
        raw = raw[: node.value.col_offset] + b"groupwise" + raw[node.value.end_col_offset :]
    return raw.decode()


def replace_literals(text: str, mapping: dict[str, str], log: EditLog) -> str:
    """(b): every string literal equal to a key of ``mapping`` (a hub id) -> its local path."""
    lines = text.splitlines(keepends=True)
    nodes = [n for n in ast.walk(ast.parse(text))
             if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and n.value in mapping and n.lineno == n.end_lineno]  # fmt: skip
    for n in sorted(nodes, key=lambda n: (n.lineno, n.col_offset), reverse=True):
        line = lines[n.lineno - 1].encode()
        literal = json.dumps(mapping[n.value]).encode()  # a double-quoted Python string
        line = line[: n.col_offset] + literal + line[n.end_col_offset :]
        lines[n.lineno - 1] = line.decode()
        log.changes.append(f"line {n.lineno}: {n.value!r} -> local stand-in")
    return "".join(lines)


def drop_imports(text: str, module: str, file_module: str, reason: str, log: EditLog) -> str:
    """(b): remove the ``from ... import`` statements of ``module`` (relative ones resolved
    against ``file_module``), for an optional remote service the run cannot reach."""
    lines = text.splitlines(keepends=True)
    package = file_module.rpartition(".")[0]
    spans = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            name = ".".join(p for p in (base, node.module) if p)
            if name == module or name.startswith(module + "."):
                spans.append((node.lineno, node.end_lineno))
    for start, end in sorted(spans, reverse=True):
        _replace_lines(lines, start, end, [])
    if spans:
        where = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in sorted(spans))
        log.changes.append(f"lines {where}: imports of {module} dropped ({reason})")
    return "".join(lines)


def override_keywords(text: str, callee: str, values: dict[str, object], reason: str,
                      log: EditLog) -> str:  # fmt: skip
    """(c), for a script that parses no command line (its options are the keyword arguments of
    its ``callee(...)`` call, grpo_2048.py's ``GRPOConfig(...)``): each of ``values`` replaces
    that keyword's value, or is added after the call's last argument, one per line in a call
    laid out one argument per line. What a user of such a script edits to run it at CPU scale."""
    lines = text.splitlines(keepends=True)
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == callee]  # fmt: skip
    edits: list[tuple[int, int, int, int, str]] = []  # (line, col, end line, end col, text)
    for call in calls:
        given = {k.arg: k for k in call.keywords if k.arg}
        for name, value in values.items():
            if name in given:
                v = given[name].value
                span = (v.lineno, v.col_offset, v.end_lineno, v.end_col_offset)
                edits.append((*span, _literal(value)))
                log.changes.append(f"line {v.lineno}: {callee}({name}=...) -> {value!r} ({reason})")
        added = {k: v for k, v in values.items() if k not in given}
        last = max([*call.args, *call.keywords], key=lambda n: (n.end_lineno, n.end_col_offset),
                   default=None)  # fmt: skip
        if not added:
            continue
        if last is None:  # callee(): inside the parentheses
            at = (call.end_lineno, call.end_col_offset - 1)
            edits.append((*at, *at, ", ".join(f"{k}={_literal(v)}" for k, v in added.items())))
        elif last.end_lineno < call.end_lineno and _rest(lines, last).strip() == ",":
            # One argument per line: the new ones as lines of their own, same indent.
            first = lines[last.lineno - 1]
            indent = first[: len(first) - len(first.lstrip())]
            block = "".join(f"{indent}{k}={_literal(v)},\n" for k, v in added.items())
            edits.append((last.end_lineno + 1, 0, last.end_lineno + 1, 0, block))
        else:
            at = (last.end_lineno, last.end_col_offset)
            edits.append((*at, *at, "".join(f", {k}={_literal(v)}" for k, v in added.items())))
        log.changes += [f"line {call.lineno}: {callee}(..., {k}={v!r}) added ({reason})"
                        for k, v in added.items()]  # fmt: skip
    for line, col, end_line, end_col, new in sorted(edits, reverse=True):
        start, end = _offset(lines, line, col), _offset(lines, end_line, end_col)
        joined = "".join(lines)
        lines = (joined[:start] + new + joined[end:]).splitlines(keepends=True)
    return "".join(lines)


def _literal(value: object) -> str:
    """``value`` as Python source, a string double-quoted (as the scripts write them)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """The character offset in ``"".join(lines)`` of ast position (lineno, col: a byte offset)."""
    before = sum(len(line) for line in lines[: lineno - 1])
    if lineno > len(lines):  # the end of the text
        return before
    return before + len(lines[lineno - 1].encode()[:col].decode())


def _rest(lines: list[str], node: ast.AST) -> str:
    """What follows ``node`` on its last line."""
    return lines[node.end_lineno - 1].encode()[node.end_col_offset :].decode()


def unified_diff(rel: str, before: str, after: str) -> tuple[str, int, int]:
    """The diff of one file, and its counts of removed and added lines."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    diff = list(difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}"))
    removed = sum(1 for d in diff if d.startswith("-") and not d.startswith("---"))
    added = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
    return "".join(diff), removed, added


@dataclass
class Prepared:
    """One script copied into WORK: its files, edit logs and diff sizes."""

    name: str
    folder: Path
    logs: dict[str, EditLog]
    sizes: dict[str, tuple[int, int]]  # changed file -> (removed, added)

    @property
    def missing(self) -> list[str]:
        return [f"{rel}: {m}" for rel, log in self.logs.items() for m in log.missing]


def prepare(name: str, source: Source, files: dict[str, str], work: Path) -> Prepared:
    """Write the edited ``files`` under WORK/name and their diffs to WORK/diffs/name.diff."""
    folder = work / name
    # A fresh folder: an earlier run's output (checkpoints, a timestamped default output_dir)
    # would be read as this run's, or refused as an output_dir holding a run.
    shutil.rmtree(folder, ignore_errors=True)
    logs, sizes, diffs = {}, {}, []
    for rel, (before, after, log) in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(after)
        logs[rel] = log
        diff, removed, added = unified_diff(rel, before, after)
        if diff:
            diffs.append(diff)
            sizes[rel] = (removed, added)
    (work / "diffs").mkdir(parents=True, exist_ok=True)
    (work / "diffs" / f"{name}.diff").write_text("".join(diffs))
    return Prepared(name, folder, logs, sizes)


def edited(text: str, rel: str, hub: dict[str, str], package_module: str | None,
           provides=_provides) -> tuple[str, EditLog]:  # fmt: skip
    """The whole edit of one file: (a), then (b)."""
    log = EditLog()
    out = edit_trl_imports(text, log, provides)
    out = replace_literals(out, hub, log)
    for file, module, packages, reason in OPTIONAL_IMPORTS:
        if file == rel and package_module and not all(
            importlib.util.find_spec(p) for p in packages
        ):
            out = drop_imports(out, module, package_module, reason, log)
    return out, log


def prepare_trl(source: Source, work: Path, hub: dict[str, str], rel: str, name: str,
                provides=_provides,
                keywords: dict[str, object] | None = None) -> Prepared:  # fmt: skip
    """One of TRL's example scripts, edited, in WORK/name. ``provides``: which names go to
    groupwise (``trainer_only`` for the parser variant, ``on_trl`` for TRL's own run);
    ``keywords``: (c), the GRPOConfig(...) values of a script without a command line."""
    text = source.read(rel)
    if text is None:
        raise SystemExit(f"error: {rel} is not in {source.path}")
    after, log = edited(text, rel, hub, None, provides)
    if provides is on_trl:
        log.missing = []  # TRL's own run: nothing was meant to be switched
    if keywords:
        after = override_keywords(after, "GRPOConfig", keywords, "CPU scale: the script parses "
                                  "no command line", log)  # fmt: skip
    return prepare(name, source, {rel: (text, after, log)}, work)


def prepare_agent(source: Source, work: Path, hub: dict[str, str]) -> Prepared:
    return prepare_trl(source, work, hub, AGENT, "grpo_agent")


def trainer_only(module: str, name: str) -> bool:
    """The parser variant's switch: GRPOConfig and GRPOTrainer from groupwise, nothing else."""
    return module == "groupwise" and name in TRAINER_ONLY and _provides(module, name)


def on_trl(module: str, name: str) -> bool:
    """TRL's own run of a script: no name is switched (only the stand-ins are edited in)."""
    return False


def prepare_openr1(source: Source, work: Path, hub: dict[str, str]) -> Prepared:
    logs: dict[str, tuple[str, EditLog]] = {}

    def edit(rel: str, text: str) -> str:
        after, log = edited(text, rel, hub, rel[len("src/") : -len(".py")].replace("/", "."))
        logs[rel] = (text, log)
        return after

    files = extract_package(source, OPENR1_ENTRY, "src", "open_r1", edit)
    recipe = source.read(OPENR1_RECIPE)
    if recipe is None:
        raise SystemExit(f"error: {OPENR1_RECIPE} is not in {source.path}")
    recipe_log = EditLog()
    new_recipe = edit_recipe(recipe, hub, recipe_log)
    table = {rel: (logs[rel][0], text, logs[rel][1]) for rel, text in files.items()}
    table[OPENR1_RECIPE] = (recipe, new_recipe, recipe_log)
    return prepare("open-r1", source, table, work)


def edit_recipe(text: str, hub: dict[str, str], log: EditLog) -> str:
    """(b) in a recipe YAML: a top-level value that is a hub id -> its local stand-in."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        key, sep, value = line.partition(":")
        if sep and not line[:1].isspace() and value.strip() in hub:
            lines[i] = f"{key}: {hub[value.strip()]}\n"
            log.changes.append(f"line {i + 1}: {key} {value.strip()} -> local stand-in")
    return "".join(lines)


# -- local stand-ins -------------------------------------------------------------------------------

AGENT_SQL = "SELECT * FROM interactions WHERE Alt_IDs_Interactor_A LIKE '%TP53%'"
AGENT_CALL = ('<tool_call>\n{"name": "query_biogrid", "arguments": {"sql_command": "'
              + AGENT_SQL + '"}}\n</tool_call>')  # fmt: skip
# open-r1's recipe asks for this format in its system prompt (<think> ... <answer> ...).
OPENR1_ANSWER = "<think>\nAdd them.\n</think>\n<answer>\n\\boxed{4}\n</answer>"


def build_model(folder: Path, examples: list[tuple[str, str]] = (), steps: int = 300,
                seed: int = 0) -> Path:  # fmt: skip
    """A tiny causal LM in ``folder`` (groupwise's tiny-random architecture, SmolLM2's tokenizer
    and chat template). With ``examples`` (prompt text, reply) it is first fitted, by teacher
    forcing on the reply tokens, to answer each prompt with its reply: a stand-in whose sampled
    completions hold what the script's tools and rewards look for."""
    import torch

    from groupwise.runtime.models import smollm2_tokenizer, tiny_random_model

    if (folder / "config.json").exists():
        return folder
    torch.manual_seed(seed)
    model, tokenizer = tiny_random_model(seed=seed), smollm2_tokenizer()
    rows = []
    for context, reply in examples:
        ids = tokenizer(context, add_special_tokens=False)["input_ids"]
        target = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((torch.tensor([ids + target]), len(ids)))
    if rows:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for step in range(steps):
            ids, start = rows[step % len(rows)]
            logits = model(ids).logits[0, start - 1 : -1]
            loss = torch.nn.functional.cross_entropy(logits, ids[0, start:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"stand-in model {folder.name}: fitted {steps} steps, last loss {loss.item():.4f}")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _load_script(path: Path, name: str):
    """The copied script as a module (its ``__main__`` block does not run)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def fit_agent_model(prepared: Prepared, hub: dict[str, str]) -> None:
    """The agent's stand-in answers each of the script's own prompts (format_example), shown
    with its tool as groupwise shows tools to a SmolLM2 template, by calling that tool."""
    from groupwise.runtime.models import smollm2_tokenizer
    from groupwise.tools.prompting import prompt_text_with_tools
    from groupwise.tools.schema import tool_schema

    script = _load_script(prepared.folder / AGENT, "grpo_agent_copy")
    schemas = [tool_schema(script.query_biogrid)]
    tokenizer = smollm2_tokenizer()
    examples = [(prompt_text_with_tools(script.format_example({"question": q})["prompt"],
                                        tokenizer, schemas), AGENT_CALL)
                for q, _ in AGENT_QUESTIONS if q.startswith("Does the gene ")]  # fmt: skip
    build_model(Path(hub["Qwen/Qwen3-1.7B"]), examples)


def fit_openr1_model(prepared: Prepared, hub: dict[str, str]) -> None:
    """open-r1's stand-in answers each problem, under the recipe's system prompt, in the
    recipe's format (always 4: right for three of the four problems)."""
    import yaml

    from groupwise.runtime.models import smollm2_tokenizer

    recipe = yaml.safe_load((prepared.folder / OPENR1_RECIPE).read_text())
    tokenizer = smollm2_tokenizer()
    system = {"role": "system", "content": recipe["system_prompt"]}
    examples = [(tokenizer.apply_chat_template([system, {"role": "user", "content": p}],
                                               add_generation_prompt=True, tokenize=False),
                 OPENR1_ANSWER) for p, _, _ in OPENR1_PROBLEMS]  # fmt: skip
    build_model(Path(hub["Qwen/Qwen2.5-1.5B-Instruct"]), examples)


def _chat(tokenizer, system: str, user: str) -> str:
    """The prompt text of a system and a user turn, as the stand-in's chat template lays it."""
    return tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        add_generation_prompt=True, tokenize=False)  # fmt: skip


def fit_gspo_model(hub: dict[str, str]) -> None:
    """gspo.py's stand-in answers each problem, under the script's system prompt, in the
    <think> format it asks for, with a boxed 4 (right for three of the four problems)."""
    from groupwise.runtime.models import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    examples = [(_chat(tokenizer, GSPO_SYSTEM, p), GSPO_ANSWER) for p, _ in MATH_PROBLEMS]
    build_model(Path(hub["Qwen/Qwen3-0.6B"]), examples)


def fit_game_model(prepared: Prepared, hub: dict[str, str]) -> None:
    """grpo_2048.py's stand-in answers the script's prompt, with a board from its own
    environment's reset() appended (as both TRL and groupwise show it) and its ``move`` tool
    shown, by calling that tool: the game really runs."""
    import random

    from groupwise.runtime.models import smollm2_tokenizer
    from groupwise.tools.prompting import prompt_text_with_tools
    from groupwise.tools.schema import tool_schema

    script = _load_script(prepared.folder / GAME, "grpo_2048_copy")
    env = script.Game2048Env()
    schemas = [tool_schema(env.move)]
    tokenizer = smollm2_tokenizer()
    random.seed(0)
    examples = []
    for direction in ("left", "up", "right", "down"):
        board = env.reset()
        prompt = [{"role": "user", "content": script.PROMPT + board}]
        examples.append((prompt_text_with_tools(prompt, tokenizer, schemas),
                         GAME_CALL.format(direction=direction)))  # fmt: skip
    build_model(Path(hub["Qwen/Qwen3-4B"]), examples)


def fit_batching_model(work: Path) -> Path:
    """grpo_continuous_batching.py's stand-in (the docstring's Qwen/Qwen3-1.7B, which the agent's
    stand-in also replaces, so a folder of its own) answers each question, under the script's
    system prompt, with its GSM8K-style final line (#### 4: right for three of the four)."""
    from groupwise.runtime.models import smollm2_tokenizer

    system = ("You are a helpful math tutor. Solve the problem step by step, then provide the "
              "final numeric answer on the last line in the format: #### <number>")  # fmt: skip
    tokenizer = smollm2_tokenizer()
    examples = [(_chat(tokenizer, system, p), BATCHING_ANSWER) for p, _ in MATH_PROBLEMS]
    return build_model(work / "assets" / "gsm8k-model", examples)


def _parquet(folder: Path, columns: dict[str, list], split: str = "train") -> str:
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(columns).to_parquet(folder / f"{split}.parquet")
    return str(folder)


AGENT_QUESTIONS = [
    ("Does the gene TP53 interact with MDM2?", "Yes"),
    ("Does the gene TP53 interact with MAPK8?", "No"),
    ("Does the gene MAP2K4 interact with MAPK8?", "Yes"),
    ("Does the gene MDM2 interact with EP300?", "No"),
    ("Which genes interact with TP53?", "MDM2"),  # the script keeps "Does the gene ..." only
]
OPENR1_PROBLEMS = [  # open-r1/OpenR1-Math-220k's columns; the stand-in model always answers 4
    ("What is 2 + 2?", "$2 + 2 = \\boxed{4}$", "4"),
    ("What is 1 + 3?", "$1 + 3 = \\boxed{4}$", "4"),
    ("What is 8 / 2?", "$8 / 2 = \\boxed{4}$", "4"),
    ("What is 2 + 3?", "$2 + 3 = \\boxed{5}$", "5"),
]


MATH_PROBLEMS = [("What is 2 + 2?", "4"), ("What is 1 + 3?", "4"), ("What is 8 / 2?", "4"),
                 ("What is 2 + 3?", "5")]  # fmt: skip
GSPO_SYSTEM = (  # gspo.py's SYSTEM_PROMPT, for fitting its stand-in
    "A conversation between user and assistant. The user asks a question, and the assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think></think> tags, i.e., <think>\nThis is my reasoning.\n</think>\nThis is my answer."
)
GSPO_ANSWER = "<think>\nAdd them.\n</think>\nThe answer is $\\boxed{4}$."
GAME_CALL = ('<tool_call>\n{{"name": "move", "arguments": {{"direction": "{direction}"}}}}'
             "\n</tool_call>")  # fmt: skip
BATCHING_ANSWER = "Add them: the result is 4.\n#### 4"


def build_datasets(work: Path) -> dict[str, str]:
    """The datasets' stand-ins, and the hub id each one (or a model fitted later) replaces."""
    assets = work / "assets"
    genes = ["TP53", "MAP2K4", "MDM2"], ["MDM2", "MAPK8", "EP300"]
    biogrid = _parquet(assets / "qgallouedec/biogrid", {  # BioGRID's column names, with spaces
        "Alt IDs Interactor A": [f"entrez gene/locuslink:{g}" for g in genes[0]],
        "Alt IDs Interactor B": [f"entrez gene/locuslink:{g}" for g in genes[1]],
        "Aliases Interactor A": ["-", "JNKK|MAPKK4", "-"],
        "Aliases Interactor B": ["-", "JNK1", "-"],
        "Taxid Interactor A": ["taxid:9606"] * 3,
    })  # fmt: skip
    qa = _parquet(assets / "qgallouedec/biogrid_qa",
                  {"question": [q for q, _ in AGENT_QUESTIONS],
                   "answer": [a for _, a in AGENT_QUESTIONS]})  # fmt: skip
    math = _parquet(assets / "open-r1/OpenR1-Math-220k", {
        "problem": [p for p, _, _ in OPENR1_PROBLEMS],
        "solution": [s for _, s, _ in OPENR1_PROBLEMS],
        "answer": [a for _, _, a in OPENR1_PROBLEMS],
        "messages": [[{"role": "user", "content": p}] for p, _, _ in OPENR1_PROBLEMS],
    })  # fmt: skip
    # AI-MO/NuminaMath-TIR: train and test splits (gspo.py takes the first 5% of each, so 100
    # and 40 rows: 5 and 2), its columns problem / solution / messages.
    numina = assets / "AI-MO/NuminaMath-TIR"
    for split, count in (("train", 100), ("test", 40)):
        problems = [MATH_PROBLEMS[i % len(MATH_PROBLEMS)] for i in range(count)]
        _parquet(numina, {
            "problem": [p for p, _ in problems],
            "solution": [f"The answer is $\\boxed{{{a}}}$." for _, a in problems],
            "messages": [[{"role": "user", "content": p}] for p, _ in problems],
        }, split)  # fmt: skip
    # openai/gsm8k, config "main" (grpo_continuous_batching.py asks for it by name): the config
    # declared in the folder's README, as the hub repository declares it.
    gsm8k = assets / "openai/gsm8k"
    _parquet(gsm8k / "main", {
        "question": [p for p, _ in MATH_PROBLEMS],
        "answer": [f"Work it out.\n#### {a}" for _, a in MATH_PROBLEMS],
    })  # fmt: skip
    (gsm8k / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n"
        "  - split: train\n    path: main/train.parquet\n---\n"
    )
    return {
        "AI-MO/NuminaMath-TIR": str(numina),
        "openai/gsm8k": str(gsm8k),
        "Qwen/Qwen3-0.6B": str(assets / "gspo-model"),
        "Qwen/Qwen3-4B": str(assets / "2048-model"),
        "qgallouedec/biogrid": biogrid,
        "qgallouedec/biogrid_qa": qa,
        "open-r1/OpenR1-Math-220k": math,
        "Qwen/Qwen3-1.7B": str(assets / "agent-model"),
        "Qwen/Qwen2.5-1.5B-Instruct": str(assets / "open-r1-model"),
    }


# -- runs and checks -------------------------------------------------------------------------------

BASE = ["--use_cpu", "True", "--bf16", "False", "--report_to", "none", "--push_to_hub", "False",
        "--seed", "0", "--disable_tqdm", "True"]  # fmt: skip
COMMON = [*BASE, "--per_device_train_batch_size", "4", "--num_generations", "2"]


def gspo_args(hub: dict[str, str], steps: int) -> list[str]:
    # The usage in the script's docstring at CPU scale: fp32, short completions, and smaller
    # batches in the same shape (two micro-batches an optimizer step, four a generation).
    return ["--model_name_or_path", hub["Qwen/Qwen3-0.6B"], "--output_dir", "out",
            "--max_steps", str(steps), "--learning_rate", "1e-5", "--dtype", "float32",
            "--max_completion_length", "32", "--use_peft", "--lora_target_modules", "q_proj",
            "v_proj", "--log_completions", "--per_device_train_batch_size", "4",
            "--num_generations", "4", "--importance_sampling_level", "sequence",
            "--epsilon", "3e-4", "--epsilon_high", "4e-4", "--beta", "0.0", "--loss_type", "grpo",
            "--gradient_accumulation_steps", "2", "--steps_per_generation", "4", *BASE]  # fmt: skip


def batching_args(model: Path, steps: int) -> list[str]:
    # The first usage line in the script's docstring at CPU scale; the dataset is the script's
    # default, openai/gsm8k "main" (its stand-in).
    return ["--model_name_or_path", str(model), "--output_dir", "out", "--max_steps", str(steps),
            "--num_generations", "2", "--max_completion_length", "32", "--use_peft",
            "--log_completions", "--per_device_train_batch_size", "4", *BASE]  # fmt: skip


def game_keywords(steps: int) -> dict[str, object]:
    """(c) for grpo_2048.py, whose options are its GRPOConfig(...) call's: a few steps, games
    short enough for CPU and for the stand-in's 1024 positions, no trackio Space (a remote
    service; trackio is not installed), and use_cpu, without which TRL's GRPOConfig refuses
    its default bf16 on a machine without a GPU."""
    return {"max_steps": steps, "max_completion_length": 256, "report_to": "none",
            "use_cpu": True}  # fmt: skip


def agent_args(hub: dict[str, str], steps: int) -> list[str]:
    # The usage line in the script's docstring, minus vLLM and the hub, on the stand-in model.
    return ["--model_name_or_path", hub["Qwen/Qwen3-1.7B"], "--output_dir", "out",
            "--max_steps", str(steps), "--max_completion_length", "256",
            "--log_completions", "True", *COMMON]  # fmt: skip


def openr1_args(steps: int) -> list[str]:
    # The recipe, with what a CPU run needs over it: no vLLM / bf16 / FlashAttention 2, fp32
    # weights, a few short steps, nothing pushed or reported.
    return ["--config", OPENR1_RECIPE, "--output_dir", "out", "--max_steps", str(steps),
            "--use_vllm", "False", "--torch_dtype", "float32", "--attn_implementation", "sdpa",
            "--gradient_accumulation_steps", "1", "--max_completion_length", "32",
            *COMMON]  # fmt: skip


def run_script(prepared: Prepared, script: str, args: list[str], fallback: str | None,
               python: str, timeout: int) -> subprocess.CompletedProcess:  # fmt: skip
    """``python script.py args`` in the script's folder, offline, one thread."""
    paths = [str(prepared.folder / "src"), str(ROOT / "src"), *([fallback] if fallback else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled")  # fmt: skip
    result = subprocess.run([python, script, *args], cwd=prepared.folder, env=env,
                            capture_output=True, text=True, timeout=timeout)  # fmt: skip
    (prepared.folder / "stdout.log").write_text(result.stdout)
    (prepared.folder / "stderr.log").write_text(result.stderr)
    return result


def _rows(out: Path) -> list[dict]:
    file = out / "metrics.jsonl"
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def check_model(out: Path) -> tuple[bool, str]:
    """The saved model loads as a user loads it: transformers, or peft for an adapter."""
    try:
        if (out / "adapter_config.json").exists():
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(out)
        else:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(out)
        return True, f"{type(model).__name__}, {model.num_parameters()} parameters"
    except Exception as error:  # any failure to load is the finding
        return False, f"{type(error).__name__}: {str(error)[:200]}"


def check_completions(out: Path) -> tuple[bool, str]:
    """Both runs ask for log_completions (TRL: a sample at each logged step)."""
    file = out / "completions.jsonl"
    records = [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []
    steps = sorted({r["step"] for r in records})
    return bool(records), f"completions.jsonl: {len(records)} prompts, steps {steps}"


def check_rewards(out: Path, names: list[str], steps: int) -> tuple[bool, str]:
    """Each reward function logged a finite mean and no errors in every logged row (a row per
    logging_steps optimizer steps: TRL's default of 10 logs fewer than one a step)."""
    rows = _rows(out)
    logged = [r.get("step") for r in rows]
    if not rows or logged != sorted(set(logged)) or not all(1 <= s <= steps for s in logged):
        return False, f"metrics.jsonl steps {logged}"
    means = {}
    for name in names:
        values = [r.get(f"rewards/{name}/mean") for r in rows]
        errors = sum(r.get(f"rewards/{name}/errors", 0) for r in rows)
        if any(v is None or v != v for v in values) or errors:
            return False, f"{name}: means {values}, errors {errors}"
        means[name] = [round(v, 3) for v in values]
    return True, f"steps {logged}: " + "; ".join(f"{n} {v}" for n, v in means.items())


def check_openr1(out: Path, stdout: str, train_rows: int) -> list[tuple[str, bool, str]]:
    checks = []
    files = {}
    for name in ("train_results.json", "all_results.json", "trainer_state.json"):
        try:
            files[name] = json.loads((out / name).read_text())
            checks.append((name, True, "written"))
        except (OSError, ValueError) as error:
            checks.append((name, False, str(error)[:200]))
    if "train_results.json" in files:
        samples = files["train_results.json"].get("train_samples")
        checks.append(("train_samples", samples == train_rows, f"{samples} (dataset {train_rows})"))
    card = out / "README.md"
    text = card.read_text() if card.exists() else ""
    tagged = "open-r1" in text
    checks.append(("model card", tagged, "README.md tagged open-r1" if tagged else "none"))
    config = out / "config.json"
    cache = json.loads(config.read_text()).get("use_cache") if config.exists() else None
    checks.append(("config use_cache", cache is True, str(cache)))
    return checks


def check_agent(out: Path, stdout: str) -> list[tuple[str, bool, str]]:
    rows = _rows(out)
    calls = [r.get("tools/call_frequency", 0.0) for r in rows]
    checks = [("database built", "biogrid.db created. Rows stored: 3" in stdout, "stdout"),
              ("tool called", any(c > 0 for c in calls),
               f"tools/call_frequency {calls}")]  # fmt: skip
    # structure_reward is 0.05 or 0.1 only for a completion with an assistant turn holding
    # parsed tool_calls and a tool turn (-0.15 for a call without one, else 0): a positive
    # mean proves the rewards saw TRL's tool-call messages.
    means = [r.get("rewards/structure_reward/mean", 0.0) for r in rows]
    checks.append(("rewards saw tool_calls", any(m > 0 for m in means),
                   f"structure_reward means {[round(m, 3) for m in means]}"))  # fmt: skip
    return checks


# -- the whole check -------------------------------------------------------------------------------


@dataclass
class Row:
    script: str
    revision: str
    command: str
    returncode: int
    checks: list[tuple[str, bool, str]]
    prepared: Prepared
    steps: int | None = None  # optimizer steps taken
    trl_steps: int | None = None  # TRL's, for the same arguments (None: not compared)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and all(ok for _, ok, _ in self.checks)


@dataclass
class Plan:
    """How one script is run and what its run is checked for."""

    name: str
    script: str  # its path in the repository (and in WORK/name)
    args: list[str]
    rewards: list[str]  # the reward functions whose logged means are checked
    extra: Callable[[Path, str], list[tuple[str, bool, str]]] | None = None
    trl_run: bool = False  # TRL's own run: exit, steps and saved model only (no metrics.jsonl)
    trl_steps: int | None = None  # TRL's optimizer steps for the same arguments
    trl_steps_from: str = "max_steps"


def output_folder(folder: Path) -> Path:
    """The run's output_dir: ``out`` (the command line's), else TRL's default
    ``trainer_output``, else wherever the run wrote metrics.jsonl (a script without a command
    line leaves output_dir to the trainer's default)."""
    for candidate in (folder / "out", folder / "trainer_output"):
        if candidate.is_dir():
            return candidate
    found = sorted(folder.rglob("metrics.jsonl"))
    return found[0].parent if found else folder / "out"


def _checkpoints(out: Path) -> list[Path]:
    return sorted(out.glob("checkpoint-*[0-9]"), key=lambda p: int(p.name.rpartition("-")[2]))


def optimizer_steps(out: Path) -> tuple[int | None, str]:
    """The optimizer steps a run took, and where that was read: trainer_state.json's
    global_step (the output folder's, else its last checkpoint's: TRL saves one at the last
    step), else the last logged metrics row's step."""
    for file in (out / "trainer_state.json",
                 *[c / "trainer_state.json" for c in reversed(_checkpoints(out))]):  # fmt: skip
        if file.is_file():
            return json.loads(file.read_text()).get("global_step"), \
                str(file.relative_to(out.parent))  # fmt: skip
    rows = _rows(out)
    steps = [r["step"] for r in rows if "step" in r]
    last = _checkpoints(out)
    saved = f", last checkpoint {last[-1].name}" if last else ""
    if steps:
        return max(steps), f"last {out.name}/metrics.jsonl row's step{saved}"
    return None, f"no record{saved}"


def saved_model(out: Path) -> Path | None:
    """The model a run left: the output folder's (save_model), else its last checkpoint's."""
    for folder in (out, *reversed(_checkpoints(out))):
        if (folder / "config.json").exists() or (folder / "adapter_config.json").exists():
            return folder
    return None


def check_one(plan: Plan, source: Source, prepared: Prepared,
              options: argparse.Namespace) -> Row:  # fmt: skip
    try:
        result = run_script(prepared, plan.script, plan.args, options.trl_fallback,
                            options.python, options.timeout)  # fmt: skip
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    except subprocess.TimeoutExpired:
        code, stdout, stderr = -1, "", f"timed out after {options.timeout} s"
    out = output_folder(prepared.folder)
    checks = [("exit 0", code == 0, stderr.strip().splitlines()[-1][:300] if code and stderr
               else str(code))]  # fmt: skip
    steps, steps_from = optimizer_steps(out) if code == 0 else (None, "run failed")
    # TRL's count for the same arguments: its own run's where one was made, else max_steps.
    trl_steps = options.steps if plan.trl_steps is None else plan.trl_steps
    if code == 0 and plan.trl_run:
        checks.append(("optimizer steps = max_steps", steps == options.steps,
                       f"{steps} ({steps_from}); max_steps {options.steps}"))  # fmt: skip
    elif code == 0:
        checks.append(("same optimizer-step count as TRL", steps == trl_steps,
                       f"groupwise {steps} ({steps_from}); TRL {trl_steps} "
                       f"({plan.trl_steps_from})"))  # fmt: skip
    if code == 0:
        model = saved_model(out)
        checks.append(("model loads", *check_model(model)) if model else
                      ("model loads", False, f"no model or checkpoint in {out.name}"))  # fmt: skip
    if code == 0 and not plan.trl_run:
        checks.append(("completions logged", *check_completions(out)))
        checks.append(("rewards logged", *check_rewards(out, plan.rewards, options.steps)))
        if plan.extra:
            checks += plan.extra(out, stdout)
        ignored = [line.split(": ", 2)[-1] for line in stderr.splitlines()
                   if "IgnoredOptionsWarning" in line]  # fmt: skip
        checks.append(("options groupwise ignores (reported)", True, "; ".join(ignored) or "none"))
    command = f"python {plan.script} {' '.join(plan.args)}"
    return Row(plan.name, source.revision(), command, code, checks, prepared, steps, trl_steps)


def trl_version(python: str) -> str:
    """The version of the trl package the runs' interpreter imports."""
    out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('trl'))"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip() or "(unknown version)"


def check_game(out: Path, stdout: str) -> list[tuple[str, bool, str]]:
    rows = _rows(out)
    calls = [r.get("tools/call_frequency", 0.0) for r in rows]
    return [("move tool called", any(c > 0 for c in calls), f"tools/call_frequency {calls}"),
            # no output_dir given: a declared difference from TRL (trainer_output), which the
            # run must say at its start
            ("output_dir difference said", "output_dir was not given" in stdout,
             f"{'/'.join(out.parts[-2:])} (TRL: trainer_output)")]  # fmt: skip


def write_results(work: Path, rows: list[Row], skipped: list[str] = ()) -> Path:
    lines = ["# TRL GRPO scripts run on groupwise", "",
             "| script | source | result | optimizer steps (TRL's) | same optimizer-step count "
             "as TRL | saved model loads | checks failed | names groupwise lacks (left on trl) "
             "| lines changed (removed/added per file) |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def mark(row: Row, check: str) -> str:
        found = [ok for c, ok, _ in row.checks if c == check]
        return ("yes" if found[0] else "NO") if found else "-"

    for row in rows:
        failed = [f"{c}: {d}" for c, ok, d in row.checks if not ok]
        sizes = ", ".join(f"{rel} -{r}/+{a}" for rel, (r, a) in row.prepared.sizes.items())
        steps = f"{'-' if row.steps is None else row.steps} ({row.trl_steps})"
        lines.append(f"| {row.script} | {row.revision} | {'PASS' if row.ok else 'FAIL'} | "
                     f"{steps} | {mark(row, 'same optimizer-step count as TRL')} | "
                     f"{mark(row, 'model loads')} | "
                     f"{'; '.join(failed) or '-'} | {'; '.join(row.prepared.missing) or '-'} | "
                     f"{sizes} |".replace("\n", " "))  # fmt: skip
    if skipped:
        lines += ["", "Not run, the source lacking the script: " + "; ".join(skipped) + "."]
    for row in rows:
        lines += ["", f"## {row.script}", "", f"`{row.command}` (in {row.prepared.folder})", "",
                  "| check | ok | detail |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {c} | {'yes' if ok else 'NO'} | {d} |".replace("\n", " ")
                  for c, ok, d in row.checks]  # fmt: skip
        lines += ["", f"Edits (diff: diffs/{row.script}.diff):", ""]
        lines += [f"- {rel} {change}" for rel, log in row.prepared.logs.items()
                  for change in log.changes]  # fmt: skip
    (work / "results.md").write_text("\n".join(lines) + "\n")
    return work / "results.md"


def parsed_rows(name: str, script: str, args: list[str], rewards: list[str], source: Source,
                work: Path, hub: dict[str, str], options: argparse.Namespace,
                wanted: Callable[[str], bool]) -> list[Row]:  # fmt: skip
    """A TrlParser script three ways: ``NAME-trl`` on TRL itself (only the stand-ins edited in;
    its optimizer-step count is TRL's for the same arguments), ``NAME`` ported, and
    ``NAME-trl-parser`` with only GRPOConfig / GRPOTrainer switched."""
    rows = []
    trl_steps, trl_from = None, "max_steps"
    if wanted(f"{name}-trl") and not options.no_trl_run:
        prepared = prepare_trl(source, work, hub, script, f"{name}-trl", on_trl)
        row = check_one(Plan(f"{name}-trl", script, args, [], trl_run=True), source, prepared,
                        options)  # fmt: skip
        rows.append(row)
        if row.steps is not None:
            version = trl_version(options.python)
            trl_steps, trl_from = row.steps, f"its run on TRL {version}, row {name}-trl"
    for row_name, provides in ((name, _provides), (f"{name}-trl-parser", trainer_only)):
        if wanted(row_name):
            prepared = prepare_trl(source, work, hub, script, row_name, provides)
            rows.append(check_one(Plan(row_name, script, args, rewards, trl_steps=trl_steps,
                                       trl_steps_from=trl_from), source, prepared,
                                  options))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trl-src", help="TRL's repository (git dir or folder)")
    parser.add_argument("--openr1-src", help="open-r1's repository (git dir or folder)")
    parser.add_argument("--work", default="runs/trl-scripts", help="where everything is written")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per script")
    parser.add_argument("--trl-fallback", help="a folder holding the trl package, put on the "
                        "scripts' path for the names groupwise lacks")  # fmt: skip
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the runs")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per script")
    known = [n for names in TRL_ROWS.values() for n in names] + ["open-r1"]
    parser.add_argument("--only", help=f"comma-separated rows to run, of {', '.join(known)}")
    parser.add_argument("--no-trl-run", action="store_true", help="skip the -trl rows, the "
                        "runs on TRL itself (TRL's step count is then max_steps)")  # fmt: skip
    options = parser.parse_args(argv)
    if not options.trl_src and not options.openr1_src:
        parser.error("give --trl-src, --openr1-src or both")
    work = Path(options.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    hub = build_datasets(work)
    rows = []
    only = set(options.only.split(",")) if options.only else None
    if only and only - set(known):
        parser.error(f"--only: unknown rows {sorted(only - set(known))}; rows: {', '.join(known)}")
    lacking: set[str] = set()  # rows whose script the source does not have
    skipped: list[str] = []

    def wanted(name: str) -> bool:
        return (only is None or name in only) and name not in lacking

    if options.trl_src:
        source = Source(options.trl_src)
        steps = options.steps
        for rel, names in TRL_ROWS.items():
            # An older TRL lacks the newer examples: the scripts it has still run.
            if any(wanted(n) for n in names) and source.read(rel) is None:
                lacking.update(names)
                skipped.append(f"{rel} (not in {source.path} at {source.revision()})")
        if wanted("grpo_agent"):
            prepared = prepare_agent(source, work, hub)
            fit_agent_model(prepared, hub)
            rows.append(check_one(Plan("grpo_agent", AGENT, agent_args(hub, steps),
                                       ["correctness_reward", "structure_reward", "query_reward"],
                                       check_agent), source, prepared, options))  # fmt: skip
        if any(wanted(name) for name in TRL_ROWS[GSPO]):
            fit_gspo_model(hub)
        rows += parsed_rows("gspo", GSPO, gspo_args(hub, steps),
                            ["think_format_reward", "accuracy_reward"], source, work, hub,
                            options, wanted)  # fmt: skip
        if wanted("grpo_2048"):
            prepared = prepare_trl(source, work, hub, GAME, "grpo_2048",
                                   keywords=game_keywords(steps))  # fmt: skip
            fit_game_model(prepared, hub)
            rows.append(check_one(Plan("grpo_2048", GAME, [], ["reward_score"], check_game),
                                  source, prepared, options))  # fmt: skip
        if any(wanted(name) for name in TRL_ROWS[BATCHING]):
            model = fit_batching_model(work)
            rows += parsed_rows("grpo_continuous_batching", BATCHING, batching_args(model, steps),
                                ["correctness_reward"], source, work, hub, options, wanted)
    if options.openr1_src and wanted("open-r1"):
        source = Source(options.openr1_src)
        prepared = prepare_openr1(source, work, hub)
        fit_openr1_model(prepared, hub)
        checks = lambda out, stdout: check_openr1(out, stdout, len(OPENR1_PROBLEMS))  # noqa: E731
        rows.append(check_one(Plan("open-r1", OPENR1_ENTRY, openr1_args(options.steps),
                                   ["accuracy_reward", "format_reward", "tag_count_reward"],
                                   checks), source, prepared, options))  # fmt: skip
    results = write_results(work, rows, skipped)
    print(results.read_text())
    return 0 if all(row.ok for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
