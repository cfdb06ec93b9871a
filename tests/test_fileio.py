"""planner.fileio: atomic writes leave the permissions a plain write would."""
import os
import stat

from planner.fileio import atomic_write


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "a.json", "{}\n")
        os.umask(0o077)
        atomic_write(tmp_path / "b.json", b"{}\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.json") == 0o644
    assert _mode(tmp_path / "b.json") == 0o600
    assert (tmp_path / "a.json").read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temp file left


def test_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    atomic_write(path, "new")
    assert path.read_text() == "new"
    assert _mode(path) == 0o640
