"""Every module, function and class that groupwise's docstrings and comments name exists.

A reference is read in four forms, from every docstring (any string statement) and comment of
``src/groupwise``:

1. Sphinx roles: ``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:data:``, ``:attr:`` (and
   ``:exc:``, ``:obj:``), with the ``~`` prefix and ``.x`` forms relative to the file's package;
   a bare name is looked up as Sphinx does, in the file first (its definitions and imports).
2. Dotted names below ``groupwise``: ``groupwise.trainer.base.Trainer``.
3. Short forms without ``groupwise.``: ``algo.grpo.policy_loss`` or ``advantages.pass_at_k``
   must name what that module holds; a front naming no module must not stand before a name
   groupwise defines (``old_module.policy_loss``); ``package/module.Name`` likewise
   (``rewards/scoring.RolloutScorer``).
4. File paths: ``rollout/hf.py``, ``(trainer/evaluate.py)``, relative to ``src/groupwise``, its
   package, ``src`` or the repository; ``docs/*.md`` pages.

A module must exist; for :func:, :class:, :data: and dotted names the object too (imported, then
read attribute by attribute); for :meth: the method on its class; for :attr: its owner, and on a
class the attribute as a class attribute, an annotation or a ``self.name`` assignment.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import io
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "groupwise"

ROLE = re.compile(r":(mod|func|class|meth|data|attr|exc|obj):`([^`]+)`")
DOTTED_GROUPWISE = re.compile(r"(?<![\w./])groupwise(?:\.[A-Za-z_]\w*)+")
SHORT = re.compile(r"(?<![\w./\\-])[a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+")
PACKAGE_PATH = re.compile(r"(?<![\w./-])([a-z_]\w*)/([a-z_]\w*)(?:\.([A-Za-z_]\w*))?(?![\w/-])")
FILE_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.(?:py|md))\b")
# Other projects, installed or not, and placeholders.
OTHER_PROJECTS = {"trl", "vllm", "verl", "transformers", "torch", "peft", "deepspeed",
                  "accelerate", "liger_kernel", "flash_attn"}  # fmt: skip
ELSEWHERE = tuple(f"{name}/" for name in sorted(OTHER_PROJECTS)) + ("path/to/",)
# Fronts of ``x.y`` that are no module: the method's own object, "e.g.", "i.e.".
NOT_MODULES = {"self", "cls", "e", "i"}
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "yaml", "yml", "txt", "pt", "html", "csv", "toml",
                 "safetensors", "cpp", "log"}  # fmt: skip


def module_name(path: Path) -> str:
    """``src/groupwise/algo/grpo.py`` -> ``groupwise.algo.grpo``; an ``__init__`` -> its
    package."""
    parts = ("groupwise", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {module_name(path): path for path in sorted(SRC.rglob("*.py"))}
PACKAGES = {name for name, path in FILES.items() if path.name == "__init__.py"}


@dataclass(frozen=True)
class Reference:
    file: str  # relative to src/groupwise
    line: int
    kind: str  # a role, "dotted", "short", "path"
    target: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.kind} {self.target}"


# ----------------------------------------------------------------------------------------------
# What a file says: its docstrings and comments, and the names it defines and imports


def prose(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every string statement (module, class, function and attribute
    docstrings) and every comment."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):  # fmt: skip
            found.append((node.lineno, node.value.value))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


@dataclass(frozen=True)
class Namespace:
    """What a bare name means in one file: ``module`` (dotted), its package, the classes around
    each line, and every name it defines at the top or imports (anywhere, ``TYPE_CHECKING``
    included) with where it comes from."""

    module: str
    package: str
    names: dict[str, str]  # local name -> absolute dotted origin
    classes: list[tuple[int, int, str]]  # (first line, last line, dotted name)
    source: str

    def enclosing(self, line: int) -> list[str]:
        """The classes whose body holds ``line``, innermost first."""
        inside = [(first, name) for first, last, name in self.classes if first <= line <= last]
        return [name for _, name in sorted(inside, reverse=True)]


def relative(package: str, target: str) -> str:
    """``.options`` in package ``groupwise.curriculum`` -> ``groupwise.curriculum.options``;
    each further leading dot goes one package up."""
    dots = len(target) - len(target.lstrip("."))
    base = package.split(".")
    base = base[: len(base) - dots + 1]
    rest = target[dots:]
    return ".".join(base + ([rest] if rest else []))


def namespace(module: str, source: str | None = None) -> Namespace:
    """The namespace of ``module``, read from ``source`` (by default its file)."""
    package = module if module in PACKAGES else module.rpartition(".")[0]
    if source is None:
        source = FILES[module].read_text(encoding="utf-8")
    tree = ast.parse(source)
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = relative(package, "." * node.level + (node.module or "")) if node.level \
                else node.module  # fmt: skip
            for alias in node.names:
                names.setdefault(alias.asname or alias.name, f"{origin}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                names.setdefault(local, alias.name if alias.asname else local)
    for node in tree.body:
        targets: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            targets = [node.name]
        elif isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
        for name in targets:
            names[name] = f"{module}.{name}"
    classes = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                classes.append((node.lineno, node.end_lineno, f"{prefix}.{node.name}"))
                visit(node.body, f"{prefix}.{node.name}")

    visit(tree.body, module)
    return Namespace(module, package, names, classes, source)


@cache
def top_level_names() -> dict[str, set[str]]:
    """name -> the groupwise modules that define it at their top (functions, classes,
    constants; not type variables, whose one-letter names read as anything's attributes)."""
    found: dict[str, set[str]] = {}
    for module, path in FILES.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign) and not (
                isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func).split(".")[-1] in ("TypeVar", "ParamSpec")
            ):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for name in names:
                found.setdefault(name, set()).add(module)
    return found


@cache
def method_names() -> set[str]:
    """Every name defined in the body of a groupwise class."""
    found = set()
    for path in FILES.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        found.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        found.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        found.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return found


# ----------------------------------------------------------------------------------------------
# Looking a dotted name up


class Missing(LookupError):
    pass


def is_module(dotted: str) -> bool:
    """A groupwise module, or an installed one of another project (not a folder of this
    repository that pytest put on the path, such as tests/algo)."""
    if dotted.split(".")[0] == "groupwise":
        return dotted in FILES
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = list(spec.submodule_search_locations or []) + [spec.origin or ""]
    return not any(Path(place).is_relative_to(ROOT) for place in places if place)


class Source:
    """A module or class read from its source instead of imported: its names (a class: those of
    its body and the ``self.x`` it assigns). An imported name, or a class with bases, is
    ``open``: any attribute is taken to exist, as its source is elsewhere."""

    def __init__(self, names: dict[str, object], open: bool = False) -> None:
        self._names, self._open = names, open

    def __getattr__(self, name: str) -> object:
        if name.startswith("_") and name.endswith("_"):
            raise AttributeError(name)
        if name in self._names:
            return self._names[name]
        if self._open:
            return Source({}, open=True)
        raise AttributeError(name)


def read_source(body: list[ast.stmt], in_class: ast.ClassDef | None = None) -> Source:
    names: dict[str, object] = {}
    statements = list(body)
    while statements:
        node = statements.pop(0)
        if isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
            handlers = [s for h in getattr(node, "handlers", []) for s in h.body]
            statements[:0] = [*node.body, *getattr(node, "orelse", []), *handlers]
        elif isinstance(node, ast.ClassDef):
            names[node.name] = read_source(node.body, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = Source({}, open=True)
    if in_class is None:
        return Source(names)
    for node in ast.walk(in_class):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and isinstance(node.ctx, ast.Store)):  # fmt: skip
            names.setdefault(node.attr, node)
    bases = {ast.unparse(b) for b in in_class.bases} - {"Protocol", "object", "Generic"}
    return Source(names, open=bool(bases))


@cache
def load(module: str) -> object:
    """The module imported; a groupwise one that does not import (a __main__, which runs its
    command when imported, or a module half-way through a change) read from its source."""
    if module.split(".")[0] != "groupwise":
        return importlib.import_module(module)  # ImportError: another project, not installed
    if not module.endswith("__main__"):
        try:
            return importlib.import_module(module)
        except Exception:  # whatever stops it, its references are checked against its source
            pass
    return read_source(ast.parse(FILES[module].read_text(encoding="utf-8")).body)


def has_attribute(owner: object, name: str) -> bool:
    """``name`` on ``owner``: an attribute, or on a class also an annotation or a
    ``self.name = ...`` in the source of a groupwise class of its MRO."""
    if hasattr(owner, name):
        return True
    if not isinstance(owner, type):
        return False
    for cls in owner.__mro__:
        if name in getattr(cls, "__annotations__", {}):
            return True
        module = getattr(cls, "__module__", "")
        if module.startswith("groupwise") and module in FILES:
            source = FILES[module].read_text(encoding="utf-8")
            if re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]*)?=(?!=)", source):
                return True
    return False


def lookup(dotted: str, last_may_be_instance: bool = False) -> object:
    """The object ``dotted`` names: its longest module prefix imported, the rest read as
    attributes. With ``last_may_be_instance`` the last part may be an instance attribute.
    Raises :class:`Missing`, naming the first part that is not there."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        if is_module(".".join(parts[:cut])):
            break
    else:
        raise Missing(f"no module {parts[0]}")
    obj = load(".".join(parts[:cut]))
    for i in range(cut, len(parts)):
        name = parts[i]
        if i == len(parts) - 1 and last_may_be_instance:
            if not has_attribute(obj, name):
                raise Missing(f"{'.'.join(parts[:i])} has no {name}")
            return obj
        if not hasattr(obj, name):
            submodule = ".".join(parts[: i + 1])
            if is_module(submodule):
                obj = load(submodule)
                continue
            raise Missing(f"{'.'.join(parts[:i])} has no {name}")
        obj = getattr(obj, name)
    return obj


# ----------------------------------------------------------------------------------------------
# Checking one reference


def check_role(kind: str, target: str, space: Namespace, line: int) -> None:
    """Raises :class:`Missing` unless the role's target exists (see the module's docstring)."""
    target = target.strip()
    if "<" in target and target.endswith(">"):  # "title <target>"
        target = target[target.index("<") + 1 : -1]
    target = target.lstrip("~!").removesuffix("()")
    if target.startswith("."):
        target = relative(space.package, target)
    if kind == "mod":
        if not (is_module(target) or is_module(f"groupwise.{target}")):
            raise Missing(f"no module {target}")
        return
    instance = kind == "attr"
    first, _, rest = target.partition(".")
    candidates = []
    if first in space.names:  # defined or imported in the file
        candidates.append(".".join(filter(None, [space.names[first], rest])))
    if not target.startswith("groupwise."):
        candidates += [f"{cls}.{target}" for cls in space.enclosing(line)]
    if "." in target:
        candidates.append(target)  # an absolute name
        # A class of another groupwise module, named without its module (Sphinx searches).
        candidates += [f"{m}.{target}" for m in sorted(top_level_names().get(first, ()))]
    errors = []
    for candidate in candidates:
        try:
            lookup(candidate, last_may_be_instance=instance)
            return
        except Missing as error:
            errors.append(str(error))
        except ImportError:  # another project's module that is not installed
            if candidate.split(".")[0] != "groupwise":
                return
            raise
    if "." not in target:
        # A bare name of no class around it and not in the file: Sphinx searches the project.
        if kind in ("meth", "attr") and target in method_names():
            return
        assigned = rf"\.{re.escape(target)}\s*(?::[^=\n]*)?=(?!=)"
        if kind == "attr" and re.search(assigned, space.source):  # set on an object
            return
        if kind not in ("meth", "attr") and (target in top_level_names()
                                             or hasattr(builtins, target)):  # fmt: skip
            return
        raise Missing(f"{target} is defined nowhere in groupwise")
    raise Missing("; ".join(errors) or f"{target} is neither in the file nor absolute")


def check_short(chain: str, space: Namespace | None = None) -> None:
    """``module.name`` without ``groupwise.``: ``grpo.policy_loss``, ``algo.grpo.policy_loss``,
    ``run.PhaseTimer``. Its longest front naming one groupwise module (by its last parts) must
    hold the rest; a front naming no module must not stand before a name groupwise defines
    (``old_module.policy_loss``). Left alone: another project's module (``torch.where``), a front
    naming several modules (``model.generate``), and a variable's attribute (``config.n``). A
    front the file imports (``dist.barrier``) is read as what it imports."""
    parts = chain.split(".")
    defined = top_level_names()
    if space is not None and parts[0] in space.names:
        origin = space.names[parts[0]]
        if origin.startswith("groupwise.") and is_module(origin):
            lookup(".".join([origin, *parts[1:]]), last_may_be_instance=True)
        return
    if parts[0] in NOT_MODULES or parts[-1] in FILE_SUFFIXES or is_module(parts[0]):
        return
    if parts[0] in OTHER_PROJECTS:
        return
    for cut in range(len(parts), 0, -1):
        front = ".".join(parts[:cut])
        matches = [m for m in FILES if m == f"groupwise.{front}" or m.endswith(f".{front}")]
        if matches:
            break
    else:
        if len(parts) == 2 and parts[1] in defined and parts[0] not in defined:
            raise Missing(f"no module {parts[0]} (for {parts[1]}: "
                          f"{', '.join(sorted(defined[parts[1]]))})")  # fmt: skip
        return
    rest = parts[cut:]
    if len(matches) > 1 or not rest:
        return
    if cut == 1 and (rest[0] not in defined or matches[0] in PACKAGES):
        return  # a variable's attribute, or a variable named as a package (config, policy)
    lookup(".".join([matches[0], *rest]), last_may_be_instance=True)


def check_package_path(package: str, module: str, name: str | None) -> None:
    """``rewards/scoring.RolloutScorer`` or ``algo/advantages``, when the first part is a
    groupwise package."""
    dotted = f"groupwise.{package}.{module}"
    if name == "py" or f"groupwise.{package}" not in PACKAGES:
        return
    if dotted not in FILES:
        raise Missing(f"no module {package}/{module}")
    if name is not None:
        lookup(f"{dotted}.{name}")


def check_file_path(path: str, here: Path) -> None:
    if path.startswith(ELSEWHERE):
        return
    if path.endswith(".md") and not path.startswith("docs/"):
        return
    for base in (SRC, here.parent, SRC.parent, ROOT):
        if (base / path).is_file():
            return
    raise Missing(f"no file {path}")


def unresolved(path: Path, source: str | None = None) -> list[tuple[Reference, str]]:
    """Every reference in the docstrings and comments of one file (by default read from it)
    that does not resolve, with why."""
    if source is None:
        source = path.read_text(encoding="utf-8")
    space = namespace(module_name(path), source)
    file = str(path.relative_to(SRC))
    failures = []
    for first_line, text in prose(source):
        for offset, line_text in enumerate(text.splitlines()):
            line = first_line + offset
            # (kind, target, the check, its arguments)
            checks: list[tuple[str, str, Callable[..., object], tuple]] = []
            for match in ROLE.finditer(line_text):
                kind, target = match.groups()
                checks.append((kind, target, check_role, (kind, target, space, line)))
            rest = ROLE.sub(" ", line_text)
            for match in DOTTED_GROUPWISE.finditer(rest):
                checks.append(("dotted", match[0], lookup, (match[0], True)))
            for match in SHORT.finditer(DOTTED_GROUPWISE.sub(" ", rest)):
                checks.append(("short", match[0], check_short, (match[0], space)))
            for match in PACKAGE_PATH.finditer(rest):
                checks.append(("path", match[0], check_package_path, match.groups()))
            for match in FILE_PATH.finditer(rest):
                checks.append(("path", match[1], check_file_path, (match[1], path)))
            for kind, target, check, arguments in checks:
                try:
                    check(*arguments)
                except Missing as error:
                    failures.append((Reference(file, line, kind, target), str(error)))
    return failures


# ----------------------------------------------------------------------------------------------
# The readers themselves


def test_relative_names_go_up_one_package_per_dot():
    assert relative("groupwise.curriculum", ".options") == "groupwise.curriculum.options"
    assert relative("groupwise.curriculum", "..algo.grpo") == "groupwise.algo.grpo"
    assert relative("groupwise.curriculum", ".") == "groupwise.curriculum"


def test_prose_is_docstrings_and_comments_not_code():
    source = 'X = "groupwise.nowhere"\n\n\ndef f():\n    """:mod:`a`"""\n    return 1  # b.c\n'
    assert prose(source) == [(5, ":mod:`a`"), (6, "# b.c")]


@pytest.mark.parametrize(
    "kind, target",
    [
        ("mod", "groupwise.algo.grpo"),
        ("mod", ".grpo"),
        ("func", "~groupwise.algo.grpo.policy_loss"),
        ("func", "policy_loss"),  # a bare name, defined somewhere in groupwise
        ("class", "groupwise.curriculum.Curriculum"),
        ("meth", "groupwise.curriculum.base.Curriculum.plan"),
        ("data", "~groupwise.algo.variants.LOSSES"),
        ("attr", "groupwise.policy.policy.Policy.network"),  # set in __init__
        ("class", "fractions.Fraction"),
    ],
)
def test_a_reference_that_exists_passes(kind, target):
    check_role(kind, target, namespace("groupwise.algo.ppo"), line=1)


@pytest.mark.parametrize(
    "kind, target",
    [
        ("mod", "groupwise.algo.no_such_module"),
        ("mod", ".options"),  # algo/options.py
        ("func", "groupwise.algo.grpo.no_such_function"),
        ("func", "no_such_function_anywhere"),
        ("class", "~groupwise.nowhere.Thing"),
        ("meth", "groupwise.curriculum.base.Curriculum.no_such_method"),
        ("attr", "groupwise.policy.policy.Policy.no_such_attribute"),
    ],
)
def test_a_reference_that_does_not_exist_fails(kind, target):
    with pytest.raises(Missing):
        check_role(kind, target, namespace("groupwise.algo.ppo"), line=1)


def test_a_module_that_does_not_import_is_read_from_its_source():
    source = read_source(ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import Y\n"
        "LIMIT = 3\ndef f(): ...\n"
        "class A:\n    n: int\n    def __init__(self):\n        self.m = 1\n"
        "    def g(self): ...\nclass B(A): ...\n"
    ).body)  # fmt: skip
    for name in ("Y", "LIMIT", "f", "A.n", "A.m", "A.g", "B.anything", "Y.anything"):
        obj = source
        for part in name.split("."):
            obj = getattr(obj, part)
    for name in ("g", "A.h"):
        with pytest.raises(AttributeError):
            obj = source
            for part in name.split("."):
                obj = getattr(obj, part)
    lookup("groupwise.__main__._exit_interrupted")  # read, not run


def test_short_forms_and_paths_are_checked():
    with pytest.raises(Missing, match="no module grpo_loss"):
        check_short("grpo_loss.policy_loss")
    with pytest.raises(Missing, match="advantages has no PhaseTimer"):
        check_short("advantages.PhaseTimer")  # defined, but in trainer/base.py
    with pytest.raises(Missing):
        check_short("algo.grpo.no_such_loss")
    check_short("grpo.policy_loss")  # algo/grpo.py
    check_short("algo.grpo.policy_loss")
    check_short("curriculum.gdro.GDROCurriculum.plan")
    check_short("torch.where")  # another project's
    check_short("model.generate")  # several modules end in "model": a variable
    check_short("args.model_init_kwargs")  # a variable's attribute
    check_short("config.sections")  # a variable named as the config package
    check_short("config.json")
    check_short("weight.T")  # T: a type variable of groupwise's, and the tensor's transpose
    check_package_path("rewards", "scoring", "RolloutScorer")
    with pytest.raises(Missing):
        check_package_path("rewards", "scoring", "NoSuchScorer")
    with pytest.raises(Missing):
        check_package_path("algo", "no_such_module", None)
    check_package_path("eval", "reward", None)  # a metric's name: eval is no package
    here = SRC / "trainer" / "evaluate.py"
    check_file_path("rollout/hf.py", here)
    check_file_path("loop.py", here)
    check_file_path("tests/system/test_layout.py", here)
    check_file_path("trl/trainer/grpo_trainer.py", here)
    with pytest.raises(Missing):
        check_file_path("run/trl_api.py", here)
    with pytest.raises(Missing):
        check_file_path("docs/no_such_page.md", here)


def test_references_are_found_in_docstrings_and_comments():
    source = ('"""See :func:`policy_loss` and :func:`~.grpo.nope`."""\n'
              "# (run/trl_api.py) and groupwise.algo.grpo.gone\n")  # fmt: skip
    found = unresolved(SRC / "algo" / "probe.py", source)
    assert [str(ref) for ref, _ in found] == [
        "algo/probe.py:1: func ~.grpo.nope",
        "algo/probe.py:2: dotted groupwise.algo.grpo.gone",
        "algo/probe.py:2: path run/trl_api.py",
    ]


# ----------------------------------------------------------------------------------------------
# The package


def test_every_reference_in_docstrings_and_comments_resolves():
    failures = [f"{ref}: {why}" for path in sorted(SRC.rglob("*.py"))
                for ref, why in unresolved(path)]  # fmt: skip
    assert failures == [], "\n".join(failures)
