"""The atomic-write helper behind every file a run writes (groupwise.files)."""

import os
import stat

import pytest

from groupwise.files import atomic_write_text, staged_files


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "out.json"
    atomic_write_text(path, "first\n")
    atomic_write_text(path, "second\n")
    assert path.read_text() == "second\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's private 0600


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    atomic_write_text(path, "old\n")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_staged_files_move_in_only_on_success(tmp_path):
    target = tmp_path / "model"
    with staged_files(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert [p.name for p in target.iterdir()] == ["config.json"]
    with pytest.raises(RuntimeError), staged_files(target) as tmp:
        (tmp / "config.json").write_text('{"half": ')
        (tmp / "weights.bin").write_bytes(b"x")
        raise RuntimeError("killed mid-save")
    assert (target / "config.json").read_text() == "{}"
    assert [p.name for p in target.iterdir()] == ["config.json"]
