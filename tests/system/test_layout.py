"""The package's layout, read from its source: the layers that docs/architecture.md declares
and that every import keeps (function-level and ``TYPE_CHECKING`` imports included), no import
cycle between files, few top-level modules, no module that only re-exports, and files and
classes that stay readable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "groupwise"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

# The one file and the one class allowed past the size limits: GRPOConfig is TRL's flat facade
# (about 200 options, each with its comment), the configuration users write.
MAX_FILE_LINES, MAX_CLASS_LINES = 600, 300
FACADE_FILE, FACADE_CLASS = "config/grpo_config.py", "GRPOConfig"


def module_name(path: Path) -> str:
    """``algo/grpo.py`` -> ``algo.grpo``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def file_imports(module: str) -> set[str]:
    """The groupwise modules (files) that ``module`` imports anywhere in its source: at the top,
    inside functions and under ``TYPE_CHECKING``. ``from . import x`` names module ``x`` when
    there is one, else the package it imports from."""
    path = MODULES[module]
    package = [] if module == "__init__" else module.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
                found.add(sub if sub in MODULES else target or "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("groupwise."):
                    found.add(alias.name.removeprefix("groupwise."))
    return {m for m in found if m in MODULES and m != module}


GRAPH = {module: file_imports(module) for module in MODULES}


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
    assert max(LAYERS.values()) <= 12


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


def test_the_import_reader_sees_guarded_and_function_level_imports():
    # The circles a package hides are in exactly these places.
    source = (SRC / "policy" / "loss.py").read_text()
    assert "if TYPE_CHECKING:\n    from .update import UpdateStats" in source
    assert "policy.update" in GRAPH["policy.loss"]  # a TYPE_CHECKING import
    source = (SRC / "trainer" / "grpo.py").read_text()
    assert "        from ..evaluation import prompt_render" in source
    assert "evaluation" in GRAPH["trainer.grpo"]  # an import inside a method
    assert {"algo", "config", "trainer"} <= GRAPH["__init__"]  # its TYPE_CHECKING block


def test_few_top_level_modules():
    top = sorted(p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 6, top


def test_no_module_only_re_exports():
    # A package's __init__ is its face; every other module defines what it holds.
    only_imports = []
    for module, path in MODULES.items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        tree = ast.parse(path.read_text())
        definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                       ast.AnnAssign)  # fmt: skip
        defines = [
            node
            for node in tree.body
            if isinstance(node, definitions) and "__all__" not in ast.unparse(node).split("=")[0]
        ]
        if not defines:
            only_imports.append(module)
    assert only_imports == []


def test_files_and_classes_stay_readable():
    too_long = {}
    for path in MODULES.values():
        text = path.read_text()
        name = str(path.relative_to(SRC))
        if len(text.splitlines()) > MAX_FILE_LINES and name != FACADE_FILE:
            too_long[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name != FACADE_CLASS:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    too_long[f"{name}:{node.name}"] = lines
    assert too_long == {}


def test_no_object_is_split_across_files_by_inheritance():
    # The policy composes its network, reference and update; a class may subclass a class of
    # another groupwise file only where it is a variant of it (a trainer of the Trainer, a
    # registered loss of LossVariant, a curriculum of Curriculum, an engine of Engine), or a
    # mixin that gives the trainer TRL's names.
    allowed = {
        "GRPOTrainer": "Trainer", "PPOTrainer": "Trainer", "Trainer": "TRLSurface",
    }  # fmt: skip
    defined: dict[str, str] = {}
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, module)
    crossing = []
    for module, path in MODULES.items():
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                name = ast.unparse(base).split(".")[-1].split("[")[0]
                if defined.get(name, module) == module or allowed.get(node.name) == name:
                    continue
                if re.search(r"(Loss|Curriculum|Engine|Error|Warning|Options|Section|Fields)$",
                             name) or name in ("SectionGroup", "Exception", "Protocol"):
                    continue  # a variant of a registered kind, an error type, an options group
                crossing.append(f"{module}.{node.name}({name} of {defined[name]})")
    assert crossing == []
    policy = ast.parse((SRC / "policy" / "policy.py").read_text())
    bases = {n.name: [ast.unparse(b) for b in n.bases] for n in policy.body
             if isinstance(n, ast.ClassDef)}  # fmt: skip
    assert bases["Policy"] == [] and bases["Trainable"] == []
