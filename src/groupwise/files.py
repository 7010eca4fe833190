"""Atomic file writes: what a run writes is either the old file or the complete new one, never a
truncated mix, whatever kills the process (the one helper behind every output a run writes).

A file is written to a temporary file in the same folder (same filesystem, so ``os.replace`` is
an atomic rename), flushed to disk, then renamed over the target; the folder is fsynced so the
rename itself survives a power loss. Whole folders of checkpoints are staged the same way in
:mod:`groupwise.trainer.checkpoints`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be
    opened (Windows)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _default_mode() -> int:
    # mkstemp makes files private (0600); an output is as readable as any file the user writes.
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (creating its folder); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (creating its folder); returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def staged_files(target: str | Path) -> Iterator[Path]:
    """A temporary folder inside ``target`` (created if needed) whose files are moved into
    ``target`` one by one (``os.replace``, atomic per file) when the block ends without an error;
    on an error nothing in ``target`` changes. For writers that take a folder
    (``save_pretrained``)."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".save-", dir=target))
    try:
        yield tmp
        for item in sorted(tmp.iterdir()):
            if item.is_file():
                with open(item, "rb+") as handle:
                    os.fsync(handle.fileno())
            os.replace(item, target / item.name)
        fsync_dir(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
