"""Atomic file writes: a temp file in the target folder, then rename. Nothing partial is left.
And :func:`indented_json`, the text of ``json.dumps(obj, indent=2)`` written fast for a plan."""
from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from itertools import chain
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


def indented_json(obj: object) -> str:
    """``json.dumps(obj, indent=2)``, character for character, with each list of flat objects
    (string keys, scalar values: a plan's ``schedule``) that is a value of a top-level object
    written by a loop of its own. With ``indent`` the json module takes its pure-Python encoder:
    650 thousand events (Chen's schedule of the lstm fixture, batch 8, seq 128) took 12.7 s that
    way, 5.2 s this way."""
    if not isinstance(obj, dict):
        return json.dumps(obj, indent=2)
    bulk: dict[str, str] = {}
    shallow = dict(obj)
    for key, value in obj.items():
        if isinstance(value, list) and value and _flat_objects(value):
            mark = f"\x00memplan-bulk-{len(bulk)}\x00"
            bulk[json.dumps(mark)] = _flat_list(value)
            shallow[key] = mark
    text = json.dumps(shallow, indent=2)
    for mark, body in bulk.items():
        if text.count(mark) != 1:  # a mark the data spells too: the slow path
            return json.dumps(obj, indent=2)
        text = text.replace(mark, body)
    return text


#: the value types of a flat object's members (json writes each alike in both encoders)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat_objects(items: list) -> bool:
    """``items`` holds only non-empty objects of string keys and scalar values (checked by
    C-level iteration: a generator over each member took 2.2 s of 650 thousand events)."""
    return (set(map(type, items)) == {dict} and all(items)
            and set(map(type, chain.from_iterable(items))) == {str}
            and set(map(type, chain.from_iterable(map(dict.values, items)))) <= _SCALARS)


#: what json.dumps(..., indent=2) puts between two members of an object two levels down
_MEMBER = ",\n      "


def _flat_list(items: list[dict]) -> str:
    """A list of non-empty flat objects as the value of a top-level key, indented by 2. The
    json module's C encoder writes it with the members already apart; only the objects' own
    boundaries are then spelled out. A line break in that text is always a separator's (the
    encoder escapes one in a string), and after a separator a member starts with a key's quote,
    never with "{", so ``},<member break>{`` is always the break between two objects."""
    text = json.dumps(items, separators=(_MEMBER, ": "))  # [{"op": "free",\n      "node": "a"},\n      {...}]
    inner = text[2:-2].replace("}" + _MEMBER + "{", "\n    },\n    {" + _MEMBER[1:])
    return "[\n    {" + _MEMBER[1:] + inner + "\n    }\n  ]"
