"""Atomic file writes: a temp file in the target folder, then rename. Nothing partial is left."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically (the file appears whole or not at all), with the
    permissions a plain ``open(path, "w")`` gives: a file it replaces keeps its mode, a new one
    gets 0o666 less the umask (``mkstemp`` alone would leave 0o600, unreadable to a CI job's
    other users)."""
    path = Path(path)
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
