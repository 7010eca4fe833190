"""The package's layout, read from its source.

Enforced: every import (function-level and ``TYPE_CHECKING`` ones included) runs down the layers
that docs/architecture.md declares; no import cycle between files; no module that only
re-exports; a class subclasses a class of another groupwise file only where that class is a base
meant for it (:data:`PERMITTED_BASES`, exceptions, protocols); the sandbox, the report and the
trainers' steps keep their own dependency rules. Sizes are reported, not pinned: the largest
files and classes are printed (``pytest -s`` or ``-rP``), and only a file past
:data:`MAX_FILE_LINES` or a class past :data:`MAX_CLASS_LINES` fails.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "groupwise"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

# Past these a file or a class no longer reads as one unit. GRPOConfig is TRL's flat facade
# (one field per option, each with its comment), the configuration users write, so it and its
# file are measured but not held to them.
MAX_FILE_LINES, MAX_CLASS_LINES = 800, 400
FACADE_FILE, FACADE_CLASS = "config/grpo_config.py", "GRPOConfig"


def module_name(path: Path) -> str:
    """``algo/grpo.py`` -> ``algo.grpo``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}
TREES = {module: ast.parse(path.read_text(encoding="utf-8")) for module, path in MODULES.items()}


# ----------------------------------------------------------------------------------------------
# The import reader


def imported_names(
    tree: ast.Module, module: str, is_package: bool, modules=MODULES
) -> list[tuple[str, str, str]]:
    """(groupwise module, name, local name) for every groupwise import in ``tree``, wherever it
    stands: at the top, inside functions, under ``TYPE_CHECKING``. ``from . import x`` names
    module ``x`` when there is one (name ``""``), else the package it imports from; ``import
    groupwise.x`` names ``x``."""
    package = [] if module == "__init__" else module.split(".")
    if not is_package:
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                base = base + (node.module.split(".") if node.module else [])
            elif node.module == "groupwise" or (node.module or "").startswith("groupwise."):
                base = node.module.split(".")[1:]
            else:
                continue
            target = ".".join(base)
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                local = alias.asname or alias.name
                if sub in modules:
                    found.append((sub, "", local))
                else:
                    found.append((target or "__init__", alias.name, local))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("groupwise."):
                    found.append((alias.name.removeprefix("groupwise."), "", alias.asname or ""))
    return [(m, name, local) for m, name, local in found if m in modules]


def file_imports(module: str) -> set[str]:
    """The groupwise modules (files) that ``module`` imports anywhere in its source."""
    is_package = MODULES[module].name == "__init__.py"
    found = {target for target, _, _ in imported_names(TREES[module], module, is_package)}
    return found - {module}


GRAPH = {module: file_imports(module) for module in MODULES}


def test_the_import_reader_sees_every_kind_of_import():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import variants, advantages as adv\n"  # modules of the package
        "from .grpo import policy_loss\n"
        "from ..errors import ConfigError\n"
        "from groupwise.files import atomic_write_text\n"
        "import groupwise.runtime.distributed\n"
        "import torch\n"
        "if TYPE_CHECKING:\n"
        "    from ..policy.policy import Policy\n"
        "def f():\n"
        "    from ..rollout import Rollout\n"
    )
    found = imported_names(ast.parse(source), "algo.ppo", is_package=False)
    assert sorted(found) == [
        ("algo.advantages", "", "adv"),
        ("algo.grpo", "policy_loss", "policy_loss"),
        ("algo.variants", "", "variants"),
        ("errors", "ConfigError", "ConfigError"),
        ("files", "atomic_write_text", "atomic_write_text"),
        ("policy.policy", "Policy", "Policy"),
        ("rollout", "Rollout", "Rollout"),
        ("runtime.distributed", "", ""),
    ]
    # In a package's __init__, "." is the package itself.
    found = imported_names(ast.parse("from .base import Curriculum\n"), "curriculum", True)
    assert found == [("curriculum.base", "Curriculum", "Curriculum")]


# ----------------------------------------------------------------------------------------------
# Layers and cycles


def declared_layers(text: str) -> dict[str, int]:
    """unit -> layer, from the first fenced block after the "### Layers" heading: one line per
    layer, its number then its units (a top-level module or package of groupwise)."""
    section = text.split("### Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers = {}
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        number, *units = line.split()
        for unit in units:
            layers[unit] = int(number)
    return layers


LAYERS = declared_layers(ARCHITECTURE.read_text(encoding="utf-8"))


def unit_of(module: str) -> str:
    return module if module in ("__init__", "__main__") else module.split(".")[0]


def test_the_declared_layers_are_read():
    assert declared_layers("### Layers\n```text\n2  b c\n1  a\n```\n") == {"a": 1, "b": 2, "c": 2}
    assert LAYERS["errors"] == 1 and LAYERS["trainer"] > LAYERS["policy"] > LAYERS["algo"]


def test_every_unit_is_on_a_declared_layer():
    units = {unit_of(module) for module in MODULES}
    assert sorted(units - set(LAYERS)) == []
    assert sorted(set(LAYERS) - units) == []  # the document names no unit that is gone


def test_imports_only_run_down_the_declared_layers():
    upward = [
        f"{module} (layer {LAYERS[unit_of(module)]}) -> {target} (layer "
        f"{LAYERS[unit_of(target)]})"
        for module, targets in GRAPH.items()
        for target in sorted(targets)
        if unit_of(target) != unit_of(module)
        and LAYERS[unit_of(target)] >= LAYERS[unit_of(module)]
    ]
    assert upward == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph``: its strongly connected components of more than one node
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_files():
    assert strongly_connected(GRAPH) == []


# ----------------------------------------------------------------------------------------------
# Modules


def only_re_exports(tree: ast.Module) -> bool:
    """True when a module's top holds imports (and ``__all__``) but defines nothing."""
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)
    return not [
        node
        for node in tree.body
        if isinstance(node, definitions) and "__all__" not in ast.unparse(node).split("=")[0]
    ]


def test_no_module_only_re_exports():
    # A package's __init__ is its face; every other module defines what it holds.
    assert only_re_exports(ast.parse('"""Doc."""\nfrom .a import b\n__all__ = ["b"]\n'))
    assert not only_re_exports(ast.parse("from .a import b\nC = b + 1\n"))
    faces = ("__init__.py", "__main__.py")
    found = [m for m, p in MODULES.items() if p.name not in faces and only_re_exports(TREES[m])]
    assert found == []


# ----------------------------------------------------------------------------------------------
# Inheritance across files

# The groupwise classes that a class of another file may subclass: the extension points, each a
# kind with variants, and the options' building blocks. Errors, warnings and protocols may be
# subclassed anywhere (an error type adds no behaviour; subclassing a protocol declares that a
# class keeps it). Anything else is composed: a class holds the parts it uses.
PERMITTED_BASES = {
    "Section", "SectionGroup",  # a section of the options; a group of sections for one part
    "LossVariant",  # a loss variant, registered in algo.LOSSES
    "Curriculum", "GlobalBatchCurriculum",  # a curriculum, registered in CURRICULA
    "RolloutEngine", "Engine",  # a rollout engine; Engine is the one that samples token by token
    "Trainer",  # an algorithm's trainer, as TRL's trainers subclass transformers' Trainer
}  # fmt: skip


def base_name(base: ast.expr) -> str:
    """``Engine``, ``base.Engine``, ``Section[T]`` -> the class's own name."""
    return ast.unparse(base).split("[")[0].split(".")[-1]


def classes_of(trees: dict[str, ast.Module]) -> dict[str, tuple[str, list[str]]]:
    """name -> (module, base names) for every top-level class (the first where names repeat)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for module, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, (module, [base_name(b) for b in node.bases]))
    return found


def freely_subclassed(name: str, classes: dict[str, tuple[str, list[str]]], seen=()) -> bool:
    """An exception, a warning or a protocol: by its bases, through groupwise classes down to
    Python's own."""
    if name == "Protocol":
        return True
    builtin = getattr(builtins, name, None)
    if isinstance(builtin, type) and issubclass(builtin, BaseException):
        return True
    if name not in classes or name in seen:
        return False
    _, bases = classes[name]
    if "Protocol" in bases:
        return True
    return any(freely_subclassed(b, classes, (*seen, name)) for b in bases if b != "Protocol")


def crossing_inheritance(trees: dict[str, ast.Module], permitted: set[str]) -> list[str]:
    """``module.Class(Base of other.module)`` for every class whose base is a groupwise class it
    imports from another file, unless that base is permitted."""
    classes = classes_of(trees)
    crossing = []
    for module, tree in trees.items():
        is_package = module == "__init__" or MODULES.get(module, Path()).name == "__init__.py"
        imports = imported_names(tree, module, is_package, modules=set(trees))
        names = {local: name for _, name, local in imports if name}  # local name -> its own
        modules = {local for _, name, local in imports if not name and local}
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                text = ast.unparse(base).split("[")[0]
                name = names.get(text, base_name(base))
                from_groupwise = text in names or text.split(".")[0] in modules
                if not from_groupwise or name not in classes:
                    continue  # defined in this file, or another project's class
                if name in permitted or freely_subclassed(name, classes):
                    continue
                crossing.append(f"{module}.{node.name}({name} of {classes[name][0]})")
    return crossing


def test_crossing_inheritance_is_found_by_import_not_by_name():
    trees = {
        "rollout.base": ast.parse("class Engine: ...\nclass Helper: ...\n"
                                  "class Plugin(Protocol): ...\n"
                                  "class Failed(ValueError): ...\n"),  # fmt: skip
        "rollout.fast": ast.parse(
            "from .base import Engine, Helper, Plugin, Failed, Helper as H\nfrom . import base\n"
            "class FastEngine(Engine): ...\n"  # a permitted base
            "class HelperEngine(Helper): ...\n"  # named like an engine, but Helper is not
            "class Other(base.Helper): ...\nclass Renamed(H): ...\n"
            "class Impl(Plugin): ...\nclass Worse(Failed): ...\n"
            "class Local: ...\nclass Same(Local): ...\nclass Net(nn.Module): ...\n"
        ),
    }
    assert crossing_inheritance(trees, {"Engine"}) == [
        "rollout.fast.HelperEngine(Helper of rollout.base)",
        "rollout.fast.Other(Helper of rollout.base)",
        "rollout.fast.Renamed(Helper of rollout.base)",
    ]


def test_classes_subclass_across_files_only_the_bases_meant_for_it():
    assert crossing_inheritance(TREES, PERMITTED_BASES) == []


def test_every_permitted_base_is_a_groupwise_class():
    # A base that is gone leaves its name here permitting whatever takes the name next.
    assert sorted(PERMITTED_BASES - set(classes_of(TREES))) == []


# ----------------------------------------------------------------------------------------------
# Rules inside and between packages


def _within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_sandbox_stands_alone_below_tools_and_rewards():
    # The python tool and the code reward share groupwise.sandbox: neither imports the other,
    # and the sandbox imports nothing else from groupwise (its launcher, run as a script in the
    # sandboxed process, nothing at all).
    sandbox = {m: GRAPH[m] for m in GRAPH if _within(m, "sandbox")}
    assert GRAPH["sandbox.launcher"] == set()
    assert {m: t for m, ts in sandbox.items() for t in ts if not _within(t, "sandbox")} == {}
    crossing = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        for one, other in (("tools", "rewards"), ("rewards", "tools"))
        if _within(module, one) and _within(target, other)
    ]
    assert crossing == []


# Inside the report package, bottom to top: the trainer imports report.record (run.json), which
# needs none of the reading, the table of figures, the plotting or the pages.
REPORT_PARTS = ["report.record", "report.load", "report.panels", "report.plot", "report.html",
                "report.compare", "report.browser", "report"]  # fmt: skip


def test_the_config_names_tasks_and_rewards_without_importing_them():
    # Options name tasks and reward functions as strings; the wiring resolves them. (The rewards
    # importing neither the config, the tasks nor the wiring follows from the layers.)
    names = ("tasks", "rewards", "wiring")
    crossing = [f"{module} -> {target}" for module, targets in GRAPH.items()
                if _within(module, "config") for target in targets
                if any(_within(target, unit) for unit in names)]  # fmt: skip
    assert crossing == []


def test_report_parts_import_only_earlier_parts():
    def part(module: str) -> int:
        for depth in range(module.count(".") + 1, 0, -1):
            prefix = ".".join(module.split(".")[:depth])
            if prefix in REPORT_PARTS:
                return REPORT_PARTS.index(prefix)
        raise AssertionError(f"{module} is in no part of the report; add it to REPORT_PARTS")

    upward = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _within(module, "report")
        for target in targets
        if _within(target, "report") and part(target) > part(module)
    ]
    assert upward == []


# The processes, their collectives and the wrapped or sharded network belong to the policy and
# runtime/; an algorithm's step reads the same in one process and in many.
DATA_PARALLEL = re.compile(r"fsdp|ddp|no_sync|any_rank|all_reduce|world_size", re.IGNORECASE)


def code_names(tree: ast.Module) -> set[str]:
    """The names code uses (variables, attributes, arguments, keywords, imports), not its
    docstrings, comments or strings."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.name for alias in node.names)
            names.add(getattr(node, "module", None) or "")
    return names


def test_the_algorithm_steps_hold_no_data_parallel_plumbing():
    tree = ast.parse('"""Unlike DDP."""\nx = dist.world_size  # fsdp\ny = "all_reduce"\n')
    assert sorted(n for n in code_names(tree) if DATA_PARALLEL.search(n)) == ["world_size"]
    for module in ("trainer.grpo", "trainer.ppo"):
        hits = sorted(name for name in code_names(TREES[module]) if DATA_PARALLEL.search(name))
        assert hits == [], (module, hits)


# ----------------------------------------------------------------------------------------------
# Sizes: a report, and a limit far past it


def sizes() -> tuple[dict[str, int], dict[str, int]]:
    """Lines per file (``algo/grpo.py``) and per class (``algo/grpo.py:Name``, nested ones
    too)."""
    files, classes = {}, {}
    for module, path in MODULES.items():
        name = str(path.relative_to(SRC))
        files[name] = len(path.read_text(encoding="utf-8").splitlines())
        for node in ast.walk(TREES[module]):
            if isinstance(node, ast.ClassDef):
                classes[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    return files, classes


def largest(measured: dict[str, int], n: int = 10) -> list[tuple[str, int]]:
    return sorted(measured.items(), key=lambda item: (-item[1], item[0]))[:n]


def test_size_report_and_limits():
    files, classes = sizes()
    print(f"\nlargest files (limit {MAX_FILE_LINES} lines, {FACADE_FILE} aside):")
    for name, lines in largest(files):
        print(f"  {lines:5d}  {name}")
    print(f"largest classes (limit {MAX_CLASS_LINES} lines, {FACADE_CLASS} aside):")
    for name, lines in largest(classes):
        print(f"  {lines:5d}  {name}")
    too_long = {n: lines for n, lines in files.items()
                if lines > MAX_FILE_LINES and n != FACADE_FILE}  # fmt: skip
    too_long |= {n: lines for n, lines in classes.items()
                 if lines > MAX_CLASS_LINES and n != f"{FACADE_FILE}:{FACADE_CLASS}"}  # fmt: skip
    assert too_long == {}
