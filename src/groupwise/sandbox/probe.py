"""Detection, once per process: which interpreter the sandbox runs, whether the trainer is root
(and which uids are free), and which namespaces this machine lets the sandbox create."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import sys
import threading
import time

from . import cgroup
from .confine import landlock_abi
from .execute import cgroup_support, run_parsed
from .info import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    SANDBOX_PATH,
    SandboxInfo,
)
from .process import spawn, workdir
from .uids import candidate_uids, init_pool

logger = logging.getLogger("groupwise.sandbox")

_info_lock = threading.Lock()
_info: SandboxInfo | None = None


def sandbox_info() -> SandboxInfo:
    """Detect (once, then cached) which isolation layers this machine allows."""
    global _info
    with _info_lock:
        if _info is None:
            _info = _detect()
            if _info.error:
                logger.warning("code sandbox unavailable: %s", _info.error)
            else:
                logger.info("code sandbox: %s", _info.summary())
                for line in weaknesses(_info):
                    logger.warning("code sandbox: %s", line)
        return _info


def refuse_trainer_files(info: SandboxInfo) -> SandboxInfo:
    """A trainer that is not root, with neither a mount namespace nor Landlock, would run the
    solution as itself with nothing between it and the trainer's files (tokens, keys, the
    project): refused unless the user opts in."""
    if info.root or info.mount_namespace or info.landlock or os.environ.get(WEAK_OPT_IN) == "1":
        return info
    return dataclasses.replace(
        info,
        error="no mount namespace and no Landlock for a trainer that is not root: the solution "
        "would read and write everything the trainer's user can (access tokens, SSH keys, the "
        "project). Enable unprivileged user namespaces or Landlock, run as root, or set "
        f"{WEAK_OPT_IN}=1 to accept this",
    )


def weaknesses(info: SandboxInfo) -> list[str]:
    """What this machine's sandbox does not defend (docs/sandbox.md, by mode)."""
    found = []
    if not info.mount_namespace:
        found.append(
            "no mount namespace: the working directory is not size-capped as a whole"
            + (
                ""
                if info.landlock
                else "; no Landlock either: the sandbox reads every file its uid may read "
                "(datasets, answer keys, the project)"
            )
        )
    if not info.pid_namespace and not info.root:
        found.append("no PID namespace and not root: the solution can signal the trainer's uid")
    if not info.limits.startswith("cgroup"):
        found.append(f"memory and processes are limited per process only ({info.limits})")
    return found


def _python_candidates() -> list[str]:
    override = os.environ.get("GROUPWISE_SANDBOX_PYTHON")
    if override:
        return [override]
    found = [os.path.realpath(sys.executable)] if sys.executable else []
    system = shutil.which("python3", path=SANDBOX_PATH)
    if system:
        found.append(os.path.realpath(system))
    return list(dict.fromkeys(found))


def _probe_namespaces(
    python: str, root: bool
) -> tuple[int, str, tuple[tuple[str, ...], tuple[str, ...]]] | None:
    """(CLONE flags to use, interpreter version, (the files the interpreter needs, the package
    directories among them to mask)), or None if the interpreter does not run."""
    if root:
        candidates = [
            ("net", CLONE_NEWNET),
            ("pid", CLONE_NEWPID),
            ("mnt", CLONE_NEWNS),
            ("ipc", CLONE_NEWIPC),
        ]
    else:
        candidates = [
            ("user", CLONE_NEWUSER),
            ("net", CLONE_NEWUSER | CLONE_NEWNET),
            ("pid", CLONE_NEWUSER | CLONE_NEWPID),
            ("mnt", CLONE_NEWUSER | CLONE_NEWNS),
            ("ipc", CLONE_NEWUSER | CLONE_NEWIPC),
        ]
    nonce = secrets.token_hex(16)
    payload = {"probe": True, "candidates": candidates, "nonce": nonce}
    with workdir(None) as path:
        payload["workdir"] = path
        out = spawn(python, payload, path, deadline=time.monotonic() + 20.0, limit=65536)
    paths: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        head, _, rest = line.partition(" PATHS ")
        if head == nonce:
            found = json.loads(rest)
            paths = tuple(  # type: ignore[assignment]
                tuple(p for p in found[key] if isinstance(p, str) and p.startswith("/"))
                for key in ("paths", "masks")
            )
    for line in out.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == nonce and parts[1] == "PROBE":
            ok = set(parts[2].split(","))
            names = {name: flag for name, flag in candidates}
            if not root:
                if "user" not in ok:
                    return 0, parts[3], paths
                names = {k: v & ~CLONE_NEWUSER for k, v in names.items()}
                flags = CLONE_NEWUSER
            else:
                flags = 0
            for name in ok & set(names):
                flags |= names[name]
            return flags, parts[3], paths
    return None


WEAK_OPT_IN = "GROUPWISE_SANDBOX_ALLOW_TRAINER_FILES"


def _detect(allowed_flags: int = -1, landlock: bool = True) -> SandboxInfo:
    """Detect the sandbox; ``allowed_flags`` masks the namespaces it may use and ``landlock``
    turns Landlock off (tests run the modes of hosts that lack them)."""
    if not sys.platform.startswith("linux"):
        return SandboxInfo(error=f"the code sandbox needs Linux, not {sys.platform}")
    root = os.geteuid() == 0
    uids = candidate_uids() if root else ()
    if root and not uids:
        return SandboxInfo(root=True, error="no free uid for the sandbox (all in use)")
    errors = []
    for python in _python_candidates():
        probed = _probe_namespaces(python, root)
        if probed is None:
            errors.append(f"{python}: does not start")
            continue
        flags, version, paths = probed
        flags &= allowed_flags
        if root:
            init_pool(uids)
        # A layer the probe accepted may still fail in the full setup: drop mount, then all.
        ladder = dict.fromkeys([flags, flags & ~CLONE_NEWNS, 0])
        for attempt in ladder:
            info = SandboxInfo(
                python=python,
                python_version=version,
                root=root,
                uids=uids,
                unshare_flags=attempt,
                root_paths=paths[0],
                root_masks=paths[1],
                limits=cgroup.describe(cgroup_support()),
                landlock=landlock_abi() if landlock else 0,
            )
            check = run_parsed(
                "import json, math, collections, re, itertools\nvalue = json.loads('[1, 2]')",
                ("asserts", (("test", "assert value == [1, 2]"),)),
                info,
                timeout_s=20.0,
                memory_mb=512,
                max_output_bytes=65536,
                max_processes=32,
            )
            if check.passed == 1:
                return refuse_trainer_files(info)
            errors.append(f"{python} (namespaces {attempt:#x}): {check.error}")
    return SandboxInfo(root=root, uids=uids, error="; ".join(errors) or "no Python interpreter")
