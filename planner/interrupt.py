"""Ctrl-C during a CP-SAT solve stops memplan.

CP-SAT catches SIGINT itself by default (``catch_sigint_signal``): Ctrl-C only ended the solve
phase then running, the planner went on with its next phases for the rest of the time limit and
wrote its files as if nothing had happened (``memplan plan zoo:gpt --budget 80% --time-limit 30
-o plan.json``, Ctrl-C at 6 s: exit 0 at 30 s, plan.json written). Once :func:`install` ran (the
CLI does), solves run through :func:`solve`: CP-SAT leaves SIGINT to Python, whose handler
writes the signal to a wakeup socket; a watcher thread reading it stops every running solve, and
Python raises KeyboardInterrupt as the solve returns, so nothing more is planned or written.
Without :func:`install` (memplan used as a library) CP-SAT keeps its own handling.

SIGTERM (a CI job cancelled, ``timeout``) killed memplan where it stood: one caught mid-write left
the half-written temp file (``.plan.json.XXXX.tmp``, or a ``tmpXXXX`` folder holding part of the
model) in the output's folder. Once :func:`install` ran it stops running solves as Ctrl-C does
and exits with status 143 (128 + SIGTERM) through the usual clean-up, so temp files go too.
It does so whatever SIGINT's handler: with SIGINT ignored (a job a script started with ``&``,
nohup) no watcher ran, and SIGTERM waited for the running solve phase to end.

:func:`install` returns the function that undoes it: the CLI run in-process (click's CliRunner,
``cli.main([...], standalone_mode=False)``) left its SIGTERM handler and wakeup fd installed after
it returned, so the caller's SIGTERM then printed "memplan: terminated" and an asyncio loop's
wakeup fd was lost.

Work other than a solve that holds the main thread in C++ (ONNX Runtime's ``run`` while
``--costs measured`` profiles the step) runs under :func:`stopping`: the watcher calls its stop
function, where before the signal waited for the run to end (``plan zoo:cnn?batch=3072 --costs
measured``, SIGTERM while profiling: exit after up to 2.4 s, one training step's time).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Any, Callable, Iterator

_lock = threading.Lock()
_active: set = set()  # the stop functions of the work now running (a CpSolver's StopSearch)
_installed = 0  # the pid whose watcher runs (0: none; a forked child inherits its parent's pid, not its thread)
_stops: frozenset = frozenset()  # the signals its watcher stops solves on


def install() -> Callable[[], None]:
    """Stop running solves on SIGINT (main thread only, and only while SIGINT raises
    KeyboardInterrupt, Python's default), exit 143 on SIGTERM and stop running solves (only while
    SIGTERM has its default action); where neither, nothing changes. Returns the function that
    undoes what this call changed (nothing where it changed nothing, as when already installed)."""
    global _installed, _stops
    pid = os.getpid()
    if _installed == pid or threading.current_thread() is not threading.main_thread():
        return _nothing
    took_term = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    if took_term:
        signal.signal(signal.SIGTERM, _terminated)
    # SIGINT ignored (a job a script started with &, nohup) stays ignored, but SIGTERM must still
    # stop the solve: without a watcher it waited for the phase to end (past a CI runner's SIGKILL)
    stops = frozenset([signal.SIGTERM] * took_term
                      + [signal.SIGINT] * (signal.getsignal(signal.SIGINT) is signal.default_int_handler))
    if not stops:
        return lambda: _uninstall(pid, took_term, None)
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        reader.close()
        writer.close()
        return lambda: _uninstall(pid, took_term, None)
    threading.Thread(target=_watch, args=(reader, writer, stops), daemon=True, name="memplan-sigint").start()
    _installed, _stops = pid, stops
    return lambda: _uninstall(pid, took_term, (old_fd, writer))


def _nothing() -> None:
    pass


def _uninstall(pid: int, took_term: bool, watch: tuple[int, socket.socket] | None) -> None:
    """Undo :func:`install`: SIGTERM's default action back (unless someone replaced our handler
    since), the wakeup fd it replaced back, its watcher ended (closing the writer ends its read)."""
    global _installed
    if os.getpid() != pid or threading.current_thread() is not threading.main_thread():
        return  # a forked child, or another thread: nothing here is ours to undo
    if took_term and signal.getsignal(signal.SIGTERM) is _terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if watch is not None:
        old_fd, writer = watch
        now = signal.set_wakeup_fd(old_fd)
        if now != writer.fileno():  # someone set theirs since: keep theirs
            signal.set_wakeup_fd(now)
        _installed = 0
        writer.close()


def _watch(reader: socket.socket, writer: socket.socket, stops: frozenset) -> None:
    # ``writer`` is held here so that the socket behind the wakeup fd stays open
    while True:
        data = reader.recv(64)
        if not data:  # the writer closed: uninstalled
            reader.close()
            return
        # the wakeup fd carries one byte per signal: its number
        if any(signum in data for signum in stops):
            with _lock:
                for stop in list(_active):
                    stop()


def _terminated(signum: int, frame: Any) -> None:
    """SIGTERM: leave through the clean-up that removes temp files; one line, status 128 + 15."""
    os.write(2, b"memplan: terminated\n")
    raise SystemExit(128 + signal.SIGTERM)


def solve(solver: Any, model: Any, callback: Any = None) -> int:
    """``solver.Solve(model, callback)``, stopped by Ctrl-C once :func:`install` ran."""
    if _installed != os.getpid():
        return solver.Solve(model, callback)
    if signal.SIGINT in _stops:  # else SIGINT is the caller's (ignored, or its own handler): CP-SAT's as before
        solver.parameters.catch_sigint_signal = False
    with stopping(solver.StopSearch):
        return solver.Solve(model, callback)


@contextlib.contextmanager
def stopping(stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, a signal :func:`install` stops solves on calls ``stop()`` from the watcher
    thread (at once; the main thread's handler runs only once the C++ call holding it returns).
    ``stop`` must be safe to call from another thread; nothing is called without :func:`install`."""
    if _installed != os.getpid():
        yield
        return
    with _lock:
        _active.add(stop)
    try:
        yield
    finally:
        with _lock:
            _active.discard(stop)


def deliver() -> None:
    """Let the handler of a signal that stopped work under :func:`stopping` raise now: Python runs
    pending handlers in the main thread as it enters a function, this one (the stopped C++ call's
    own error, ONNX Runtime's "terminate flag", would otherwise be reported in its place)."""
