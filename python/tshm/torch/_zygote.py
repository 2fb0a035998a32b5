# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm.torch.spawn(start_method="forkserver"): workers forked from a
zygote.

The zygote is a fresh interpreter that has imported torch and tshm.torch
and does nothing else: no threads, no CUDA, so forking it is safe where
forking the caller may not be.  The caller starts it once, on first use,
as a one-process libtshm set (tshm._tshm._Procs exec'ing this module), so
it dies with the caller, SIGKILL included.  For each spawn() the zygote
starts the workers with the "fork" method of tshm/torch/_spawn.py: they
are libtshm's workers of the zygote, which dies with the caller, and so
do they.  Each worker first applies multiprocessing's preparation data
(sys.path, the main module, as the spawn start method does) and unpickles
its (fn, args), pickled once per rank by the caller with ForkingPickler.

The caller talks to the zygote over a multiprocessing Connection (a
socket pair the zygote inherits), one request at a time:

    ("spawn", prep, calls, nprocs, env) -> ("ok", pids) | ("err", text)
    ("join", key, timeout)               -> (result, traceback text)
    ("close", key)                       -> ("ok",)

where result is what _Procs.join() returns.  A join waits at most
JOIN_SLICE seconds in the zygote, so that one set's join never holds up
another's; the caller loops.  The zygote exits when the caller closes
the connection or exits.
"""

import os
import pickle
import socket
import sys
import threading
import time
from multiprocessing import connection, spawn as mp_spawn

from .._tshm import _Procs

JOIN_SLICE = 0.2
_SERVE = ("import sys; from tshm.torch._zygote import _serve; "
          "_serve(int(sys.argv[1]))")

_lock = threading.Lock()
_zygote = None            # (pid of its starter, _Procs, Connection)


def _connection():
    """The zygote of this process, started on first use."""
    global _zygote
    if _zygote is not None and _zygote[0] == os.getpid():
        return _zygote[2]
    mine, theirs = socket.socketpair()
    try:
        os.set_inheritable(theirs.fileno(), True)
        procs = _Procs([sys.executable, "-c", _SERVE,
                        str(theirs.fileno())], 1)
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    conn = connection.Connection(mine.detach())
    _zygote = (os.getpid(), procs, conn)
    return conn


def _ask(request):
    with _lock:
        conn = _connection()
        conn.send(request)
        return conn.recv()


class ZygoteProcs:
    """A set of workers forked by the zygote, with _Procs's interface
    (join, pids, close) plus the traceback of a failed rank."""

    def __init__(self, prep, calls, nprocs, env):
        reply = _ask(("spawn", prep, calls, nprocs, env))
        if reply[0] != "ok":
            raise RuntimeError(f"tshm.torch.spawn: the forkserver could "
                               f"not start the workers: {reply[1]}")
        self._pids = reply[1]
        self._key = self._pids[0]
        self._tracebacks = {}

    def pids(self):
        return list(self._pids)

    def join(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = JOIN_SLICE if end is None else \
                max(0.0, min(JOIN_SLICE, end - time.monotonic()))
            res, tb = _ask(("join", self._key, left))
            if res is not False:
                if res is not None and tb:
                    self._tracebacks[res[0]] = tb
                return res
            if end is not None and time.monotonic() >= end:
                return False

    def traceback(self, rank):
        return self._tracebacks.get(rank, "")

    def close(self):
        if self._key is not None:
            key, self._key = self._key, None
            try:
                _ask(("close", key))
            except (OSError, EOFError):
                pass          # the zygote is gone, and its workers


# -- in the zygote --------------------------------------------------------

def _run(prep, call, board, rank):
    from . import _spawn
    mp_spawn.prepare(prep)
    fn, args = pickle.loads(call)
    return _spawn._forked_worker(fn, args, board, rank)


def _serve(fd):
    import torch  # noqa: F401  (what the workers start with)
    from . import _spawn, install
    install()
    conn = connection.Connection(fd)
    sets = {}
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            break
        if req[0] == "spawn":
            _, prep, calls, nprocs, env = req
            try:
                ctx = _spawn._start_forks(
                    lambda rank, board: _run(prep, calls[rank], board, rank),
                    nprocs, env)
            except Exception as e:
                conn.send(("err", f"{type(e).__name__}: {e}"))
                continue
            sets[ctx.pids()[0]] = ctx
            conn.send(("ok", ctx.pids()))
        elif req[0] == "join":
            ctx = sets.get(req[1])
            res = ctx._procs.join(req[2]) if ctx else None
            tb = ctx._traceback(res[0]) if res and res[0] >= 0 else ""
            conn.send((res, tb))
        elif req[0] == "close":
            ctx = sets.pop(req[1], None)
            if ctx:
                ctx._close()
            conn.send(("ok",))
    for ctx in sets.values():
        ctx._close()
