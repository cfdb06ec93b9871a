"""Atomic file writes: a temp file in the target folder, then rename. Nothing partial is left."""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically (the file appears whole or not at all), with the
    permissions a plain ``open(path, "w")`` gives: a file it replaces keeps its mode, a new one
    gets 0o666 less the umask (``mkstemp`` alone would leave 0o600, unreadable to a CI job's
    other users)."""
    path = write_target(path)
    payload = data.encode() if isinstance(data, str) else data
    folder = path.parent if str(path.parent) else Path(".")
    mode = write_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_mode(path: Path) -> int:
    """The permission bits ``open(path, "w")`` would leave on ``path``."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)  # read it; os has no getter
        os.umask(umask)
        return 0o666 & ~umask


def write_target(path: str | os.PathLike) -> Path:
    """The file a write of ``path`` replaces: a symlink's target, as ``open(path, "w")`` writes
    through a link (renaming over the link itself replaced ``/dev/stdout``, a link in ``/dev``, with
    a regular file). A target that exists and is neither a regular file nor a folder (a device such
    as ``/dev/null``, a pipe, a socket) is refused: renaming over it, as root, replaced ``/dev/null``
    itself with the plan."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file() and not target.is_dir():
        raise OSError(errno.EINVAL, "not a regular file (a device, pipe or socket); give a file name", str(path))
    return target
