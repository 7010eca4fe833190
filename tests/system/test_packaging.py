"""Packaging: pyproject.toml declares ranges, constraints/cpu.txt pins one tested point inside
them, the declared requirements co-install with vLLM, and the wheel holds the files groupwise
runs rather than imports (the sandbox launcher, the task data).

The co-install check resolves with uv from package metadata alone, for Linux x86_64 whatever
machine runs it: uv reads a wheel's METADATA with HTTP range requests where the index serves no
separate metadata file, so nothing is installed, no wheel is downloaded whole (only two small
sdist-only packages that reasoning-gym needs are built for their metadata) and no GPU is needed.
pip was measured as the alternative: from an index without PEP 658 metadata its resolver
downloads whole wheels (about 1.9 GB for this resolution), and with fast-deps it takes a minute.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from uv import find_uv_bin

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints" / "cpu.txt"

# The vLLM release the co-install check resolves against (with the groupwise[vllm] extra); it
# pins torch==2.14.0 and transformers>=5.16.1,<5.21.0.
VLLM = "vllm==0.33.0"
# Extras that install only on a CUDA machine: the CPU constraints file cannot pin them; the
# co-install check below resolves them with the rest.
GPU_ONLY_EXTRAS = ("vllm",)
# vLLM publishes manylinux_2_28 wheels only and needs Python >= 3.11.
PLATFORM = "x86_64-manylinux_2_28"
PYTHONS = ("3.11", "3.12")

# Exact pins on torch 2.13.0 and transformers 5.23.0, both outside what vLLM 0.33.0 accepts: the
# co-install check must reject them, or it would pass any requirement list.
EXACT_PINS = [
    "torch==2.13.0",
    "transformers==5.23.0",
    "safetensors==0.8.0",
    "numpy>=1.26,<3",
    "pyyaml==6.0.3",
    "tqdm==4.70.1",
    "gguf==0.19.0",
    "math-verify==0.9.0",
    "peft==0.21.2",
    "rich==15.0.0",
    "reasoning-gym==0.1.25",
    "matplotlib==3.11.2",
    "tensorboard==2.21.0",
    "wandb==0.31.0",
]


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def user_extras() -> list[str]:
    """Every optional extra but ``test`` (test tools are not installed by users)."""
    return [name for name in project()["optional-dependencies"] if name != "test"]


def declared(extras: list[str]) -> list[Requirement]:
    meta = project()
    strings = list(meta["dependencies"])
    for name in extras:
        strings += meta["optional-dependencies"][name]
    return [Requirement(s) for s in strings]


def pins() -> dict[str, Version]:
    """constraints/cpu.txt as {canonical name: version}; every line must be ``name==version``."""
    found: dict[str, Version] = {}
    for number, line in enumerate(CONSTRAINTS.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        where = f"{CONSTRAINTS.name}:{number}: {line!r}"
        assert not req.extras and req.marker is None and req.url is None, where
        assert len(specs) == 1 and specs[0].operator == "==", f"{where} is not an exact pin"
        name = canonicalize_name(req.name)
        assert name not in found, f"{where} pins {name} a second time"
        found[name] = Version(specs[0].version)
    return found


def applies(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate(default_environment())


def resolve(requirements: list[str], python: str, scratch: Path) -> subprocess.CompletedProcess:
    """uv's resolution of ``requirements`` for ``PLATFORM`` and Python ``python``: on success
    stdout is the ``name==version`` lock, on failure stderr says which requirements conflict.
    uv's temporary files (build locks of sdist-only packages) go under ``scratch``."""
    command = [
        find_uv_bin(),
        "pip",
        "compile",
        "-",
        "--no-config",  # no uv.toml or user config may change the answer
        "--no-header",
        "--no-annotate",
        "--no-progress",
        "--color",
        "never",
        "--python",
        sys.executable,  # builds the metadata of sdist-only packages
        "--python-version",
        python,
        "--python-platform",
        PLATFORM,
    ]
    # A missing interpreter must not send uv off to download one.
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "TMPDIR": str(scratch)}
    return subprocess.run(
        command,
        input="\n".join(requirements) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def locked(stdout: str) -> dict[str, Version]:
    lines = (line.strip() for line in stdout.splitlines())
    return {
        canonicalize_name(name): Version(version)
        for name, version in (line.split("==", 1) for line in lines if "==" in line)
    }


# -- what pyproject.toml declares ----------------------------------------------------------------


def test_declared_requirements_are_ranges_not_pins():
    meta = project()
    groups = {"dependencies": meta["dependencies"], **meta["optional-dependencies"]}
    pinned = [
        f"{group}: {text}"
        for group, strings in groups.items()
        for text in strings
        if any(spec.operator in ("==", "===") for spec in Requirement(text).specifier)
    ]
    assert not pinned, f"exact pins belong in {CONSTRAINTS.name}: {pinned}"


def test_every_runtime_requirement_has_a_lower_bound():
    unbounded = [
        str(req)
        for req in declared(user_extras())
        if not any(spec.operator in (">=", ">", "~=") for spec in req.specifier)
    ]
    assert not unbounded, f"no lower bound: {unbounded}"


# -- constraints/cpu.txt against the declared ranges ------------------------------------------


def test_constraints_pin_every_declared_requirement_inside_its_range():
    locked_versions = pins()
    problems = []
    cpu_extras = [e for e in project()["optional-dependencies"] if e not in GPU_ONLY_EXTRAS]
    for req in declared(cpu_extras):
        if not applies(req):
            continue
        name = canonicalize_name(req.name)
        if name not in locked_versions:
            problems.append(f"{req}: not pinned")
        elif not req.specifier.contains(locked_versions[name], prereleases=True):
            problems.append(f"{req}: pinned at {locked_versions[name]}, outside the range")
    assert not problems, problems


def test_constraints_pin_torch_which_setup_installs_first():
    # An unpinned torch pulls a multi-GB CUDA build; setup installs torch alone, first, through
    # the constraints file, so the pin has to be there.
    assert "torch" in pins()
    recipe = re.search(
        r"^\$\(VENV\)/\.installed:(?P<deps>.*)\n(?P<body>(?:\t.*\n)+)",
        (ROOT / "Makefile").read_text(encoding="utf-8"),
        re.M,
    )
    assert recipe, "Makefile has no $(VENV)/.installed rule"
    assert "$(CONSTRAINTS)" in recipe["deps"].split(), "the stamp must depend on the constraints"
    installs = [line for line in recipe["body"].splitlines() if "pip install" in line]
    assert installs[0].split()[-1] == "torch" and "-c $(CONSTRAINTS)" in installs[0]
    for line in installs:
        assert "-c $(CONSTRAINTS)" in line or "--no-deps" in line, line
    assert "CONSTRAINTS := constraints/cpu.txt" in (ROOT / "Makefile").read_text(encoding="utf-8")


def test_constraints_lock_the_installed_environment():
    """What `make setup` installed is the lock: every distribution groupwise's CPU extras pull
    in, transitively, is pinned at the version installed (so the lock is complete); the GPU-only
    extras (vllm) are not installed on a CPU machine."""
    try:
        importlib.metadata.distribution("groupwise")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("groupwise is not installed in this interpreter (run through make test)")
    locked_versions = pins()
    cpu_extras = [e for e in project()["optional-dependencies"] if e not in GPU_ONLY_EXTRAS]
    todo = [(Requirement(f"groupwise[{','.join(cpu_extras)}]"), "")]
    seen: set[tuple[str, str]] = set()
    problems = []
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in req.extras or {""}:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                problems.append(f"{name}: required ({req}) but not installed")
                continue
            installed = Version(dist.version)
            pin = locked_versions.get(name)
            if name != "groupwise":
                if pin is None:
                    problems.append(f"{name}=={installed}: installed but not in the lock")
                elif installed.public != pin.public:
                    problems.append(f"{name}: {installed} installed, {pin} locked")
            todo += [(Requirement(s), wanted) for s in dist.requires or []]
    assert not problems, problems


# -- co-installing with vLLM ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("uv")


@pytest.fixture(scope="module")
def index(scratch):
    """vLLM resolving on its own shows the index answers; a later failure is then groupwise's."""
    result = resolve([VLLM], PYTHONS[0], scratch)
    if result.returncode != 0:
        reason = f"{VLLM} does not resolve on its own (index unreachable?): {result.stderr[-600:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI always has the index: never let the check go quiet there
        pytest.skip(reason)
    return locked(result.stdout)


@pytest.mark.parametrize("python", PYTHONS)
def test_declared_requirements_coinstall_with_vllm(index, scratch, python):
    requirements = declared(user_extras())
    result = resolve([str(r) for r in requirements] + [VLLM], python, scratch)
    assert result.returncode == 0, f"groupwise does not co-install with {VLLM}:\n{result.stderr}"
    chosen = locked(result.stdout)
    assert chosen["vllm"] == Version("0.33.0")
    for req in requirements:
        name = canonicalize_name(req.name)
        assert req.specifier.contains(chosen[name], prereleases=True), (req, chosen[name])


def test_exact_pins_conflict_with_vllm(index, scratch):
    result = resolve(EXACT_PINS + [VLLM], PYTHONS[0], scratch)
    assert result.returncode != 0, "exact pins outside vLLM's ranges resolved next to it"
    assert "torch==2.13.0" in result.stderr and "vllm==0.33.0" in result.stderr, result.stderr


def test_a_transformers_pin_outside_vllms_range_is_reported(index, scratch):
    # The check names each conflict, not only the first: with torch a range, a transformers pin
    # outside vLLM's range is the one left.
    requirements = [
        "transformers==5.23.0" if canonicalize_name(r.name) == "transformers" else str(r)
        for r in declared(user_extras())
    ]
    result = resolve(requirements + [VLLM], PYTHONS[0], scratch)
    assert result.returncode != 0, "transformers==5.23.0 resolved next to vLLM"
    assert "transformers==5.23.0" in result.stderr and "<5.21.0" in result.stderr, result.stderr


SANDBOX_MODULES = ("__init__", "launcher", "info", "process", "uids", "execute", "probe", "program")
SANDBOX_CHECK = """
import json, groupwise.sandbox as s
info = s.sandbox_info()
out = None if info.error else s.run_program("print(6 * 7)").stdout
print(json.dumps({"module": s.__file__, "launcher": s.LAUNCHER, "error": info.error, "out": out}))
"""


def test_the_wheel_ships_the_sandbox_launcher_and_the_sandbox_runs_from_it(tmp_path):
    # The launcher is a file the sandbox interpreter runs by path, never imported by the trainer:
    # it must be in the wheel, and the sandbox must work from an installed copy.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(
        ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    command = "from setuptools import build_meta; print(build_meta.build_wheel('dist'))"
    build = subprocess.run(
        [sys.executable, "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = tmp_path / "dist" / build.stdout.split()[-1]
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(site)
    assert {f"groupwise/sandbox/{m}.py" for m in SANDBOX_MODULES} <= names
    assert "groupwise/tasks/python_problems.jsonl" in names
    assert "groupwise/memory/model_shapes.json" in names  # the planner's shipped shapes
    if not sys.platform.startswith("linux"):
        pytest.skip("the sandbox runs on Linux only")
    check = subprocess.run(
        [sys.executable, "-c", SANDBOX_CHECK],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr[-3000:]
    found = json.loads(check.stdout.splitlines()[-1])
    assert found["module"] == str(site / "groupwise" / "sandbox" / "__init__.py")
    assert found["launcher"] == str((site / "groupwise" / "sandbox" / "launcher.py").resolve())
    if found["error"]:
        pytest.skip(f"no sandbox on this machine: {found['error']}")
    assert found["out"] == "42\n"
