# SPDX-License-Identifier: LGPL-2.1-or-later
"""What tshm.torch.spawn(join=False) returns: torch's ProcessContext
(join(), pids(), processes, sentinels) over a libtshm process set.

The workers are not this process's children (libtshm's supervisor, or
the forkserver zygote's, started them), so the Process-like objects in
``processes`` learn how a worker ended from the set's status board
(``_Procs.status()``) and wait for it with a pidfd, which works for any
process: the same fd is its ``sentinel``, readable once it exited, as
multiprocessing's are.

A context dropped while its workers run leaves them running, as torch's
(multiprocessing's Process objects) do, and this process waits for
them when it ends, as multiprocessing waits for its non-daemonic
children; daemonic ones are terminated then (_at_exit()).
"""

import atexit
import errno
import os
import signal
import threading
import time
import weakref
from multiprocessing import connection

#: Bytes of a failed worker's traceback on the error board, per rank.
SLOT = 64 * 1024
# Of a traceback longer than that, the bytes kept from its start; the
# rest of the slot keeps its end, which names what was raised last.
_HEAD = 16 * 1024
# How far a cut moves to fall between two lines.
_LINE_SLACK = 4 * 1024
_LEFT_OUT = b"[... %d bytes of the traceback left out ...]\n"
# How often Process.join() looks at the board once the worker has exited
# but the supervisor has not reaped it yet (a few ms at most, as a rule).
_REAP_POLL = 0.002


def board_entry(tb):
    """A failed worker's traceback as it goes on the error board: UTF-8
    and a NUL, SLOT bytes at most.  One that does not fit (a chain of
    exceptions, a message of megabytes) keeps its first lines and its
    last, which say what was raised in the end, and how many bytes were
    left out between them; the worker's stderr has it whole."""
    raw = tb.encode("utf-8", "replace")
    if len(raw) < SLOT:
        return raw + b"\0"
    head = raw[:_HEAD]
    nl = head.rfind(b"\n")
    if nl >= _HEAD - _LINE_SLACK:
        head = head[:nl + 1]
    # Room for a mark counting every byte: as many digits as the real one
    # needs, or more.
    room = SLOT - 1 - len(head) - len(_LEFT_OUT % len(raw))
    tail = raw[len(raw) - room:]
    nl = tail.find(b"\n", 0, _LINE_SLACK)
    if 0 <= nl < len(tail) - 1:
        tail = tail[nl + 1:]
    mark = _LEFT_OUT % (len(raw) - len(head) - len(tail))
    return head + mark + tail + b"\0"


def _exceptions():
    try:
        from torch.multiprocessing.spawn import (ProcessExitedException,
                                                 ProcessRaisedException)
        return ProcessRaisedException, ProcessExitedException
    except ImportError:       # torch without them: plain exceptions
        return None, None


def _failure(res, tb):
    """The exception for a failure _Procs.join() reported, as torch's."""
    rank, pid, code, signo, message, summary = res
    raised, exited = _exceptions()
    if tb:
        msg = (f"\n\n-- Process {rank} terminated with the following "
               f"error:\n{tb}")
        if raised is not None:
            return raised(msg, rank, pid)
        return RuntimeError(msg)
    name = None
    if signo:
        try:
            name = signal.Signals(signo).name
        except ValueError:          # real-time signals have no name
            name = f"SIG{signo}"
    if rank >= 0 and name:
        # torch's words (torch.multiprocessing.spawn's ProcessContext),
        # which callers match: "process 0 terminated with signal SIGKILL"
        msg = f"process {rank} terminated with signal {name}"
    elif rank >= 0 and summary.startswith(
            f"rank {rank} (pid {pid}): exited with status "):
        msg = f"process {rank} terminated with exit code {code}"
    else:
        # Not an exit: it could not start, the supervisor died, or it
        # still runs after the join's timeout.  libtshm's words.
        msg = f"process {summary or rank}"
        message = ""
    if message:
        msg += f": {message}"
    if exited is not None:
        return exited(msg, rank, pid, code if not signo else -signo, name)
    return RuntimeError(msg)


class NoProcesses:
    """What spawn(nprocs=0, join=False) returns: torch's ProcessContext
    over no processes, whose join() is done at once."""

    def __init__(self):
        self.processes = []
        self.sentinels = {}

    def pids(self):
        return []

    def join(self, timeout=None, grace_period=None):
        return True


class WorkerProcess:
    """One worker of a spawn(), as the multiprocessing.Process objects in
    torch's ProcessContext.processes: pid, name, daemon, exitcode,
    sentinel, is_alive(), join(), terminate(), kill(), close().  It was
    started for you: there is no start() or run()."""

    def __init__(self, ctx, rank, pid, name, daemon):
        # Weak: dropping the context frees the set, as before it had
        # processes; it leaves each its exit code first (_final).
        self._ctx = weakref.ref(ctx)
        self._orphan = None       # the context, once dropped running
        self._final = None
        self._rank = rank
        self.pid = self.ident = pid
        self.name = name
        self.daemon = daemon
        self._pidfd = None        # None: not opened; -1: closed
        self._is_pidfd = False    # else a pipe: the worker was gone
        self._lock = threading.Lock()

    def __repr__(self):
        try:              # never raises: the context may be closing
            code = self.exitcode
        except Exception:
            code = self._final
        state = "started" if code is None else f"stopped exitcode={code}"
        return (f"<{type(self).__name__} name={self.name!r} pid={self.pid}"
                f" rank={self._rank} {state}"
                f"{' daemon' if self.daemon else ''}>")

    def _check_closed(self):
        if self._pidfd == -1:
            raise ValueError("process object is closed")

    @property
    def exitcode(self):
        """None while it runs, else its exit status, or -N if signal N
        killed it (a worker whose supervisor died: -SIGKILL)."""
        ctx = self._ctx() or self._orphan
        if ctx is None or self._final is not None:
            return self._final
        return ctx._status(self._rank)

    @property
    def sentinel(self):
        """An fd readable once the worker has exited (a pidfd; for a
        worker already gone, a pipe at end of file)."""
        with self._lock:
            self._check_closed()
            if self._pidfd is None:
                self._pidfd, self._is_pidfd = self._open()
            return self._pidfd

    def _open(self):
        try:
            fd = os.pidfd_open(self.pid)
        except OSError as e:
            # ESRCH, or EINVAL for a pid that outlives its process (a
            # reference still held somewhere): gone either way.
            if e.errno not in (errno.ESRCH, errno.EINVAL):
                raise
            fd = None
        # Checked after the open: the supervisor frees a worker's pid only
        # after the board says it ended, so while the board says it runs,
        # the pid was still this worker's when the pidfd was opened.
        if fd is not None and self.exitcode is None:
            return fd, True
        if fd is not None:
            os.close(fd)
        r, w = os.pipe2(os.O_CLOEXEC)
        os.close(w)
        return r, False

    def is_alive(self):
        """Whether the worker still runs."""
        self._check_closed()
        if self.exitcode is not None:
            return False
        return not connection.wait([self.sentinel], 0)

    def join(self, timeout=None):
        """Wait until the worker has ended (its exitcode known), or for
        timeout seconds."""
        self._check_closed()
        if timeout is not None:
            timeout = max(0.0, timeout)       # as multiprocessing's
            end = time.monotonic() + timeout
        if self.exitcode is None:
            connection.wait([self.sentinel], timeout)
        while self.exitcode is None:
            left = None if timeout is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            # Exited: the supervisor reaps it in a moment.
            time.sleep(_REAP_POLL if left is None else
                       min(_REAP_POLL, left))

    def terminate(self):
        """SIGTERM to the worker, if it still runs."""
        self._signal(signal.SIGTERM)

    def kill(self):
        """SIGKILL to the worker, if it still runs."""
        self._signal(signal.SIGKILL)

    def _signal(self, signo):
        self._check_closed()
        if self.exitcode is not None:
            return
        fd = self.sentinel
        if not self._is_pidfd:        # it ended as the sentinel was made
            return
        try:
            # Through the pidfd: never a process that took the pid over.
            signal.pidfd_send_signal(fd, signo)
        except ProcessLookupError:
            pass

    def close(self):
        """Close the sentinel; the object can then only say its pid and
        name.  ValueError while the worker runs, as multiprocessing's."""
        if self._pidfd != -1 and self.exitcode is None:
            raise ValueError("Cannot close a process while it is still "
                             "running. You should first call join() or "
                             "terminate().")
        with self._lock:
            fd, self._pidfd = self._pidfd, -1
        if fd is not None and fd >= 0:
            os.close(fd)

    def __del__(self):
        # Whatever the worker does: nobody can wait on the sentinel now.
        fd, self._pidfd = self._pidfd, -1
        if fd is not None and fd >= 0:
            os.close(fd)


# Contexts dropped before they were closed, kept until their workers end
# (_reap_orphans(), at the next context) or this process does
# (_at_exit()); and every context not closed yet, which _at_exit() also
# waits for.  __del__ only appends to _dropped: a finalizer runs wherever
# the collector does, with any lock of this module or the zygote's held
# by its thread, so it takes no lock and asks nothing of a set.
_dropped = []
_live = weakref.WeakSet()
_reaping = threading.Lock()


def _take_dropped():
    with _reaping:
        n = len(_dropped)
        taken = _dropped[:n]
        del _dropped[:n]          # what a finalizer appends meanwhile stays
    return taken


def _reap_orphans():
    """Close the dropped contexts whose workers all ended."""
    running = []
    for ctx in _take_dropped():
        if ctx._running():
            running.append(ctx)
        else:
            _quietly(ctx._close)
    _dropped.extend(running)


def _quietly(fn):
    try:
        fn()
    except Exception:     # another thread joins it (a daemon thread)
        pass


def _at_exit():
    """As multiprocessing's exit handler does for its children: terminate
    the daemonic workers of every context still open (dropped or not),
    then wait for the others.  A KeyboardInterrupt in the wait (a second
    Ctrl-C) terminates what is left instead."""
    ctxs = set(_take_dropped()) | set(_live)
    try:
        for ctx in ctxs:
            if ctx._daemon:
                _quietly(ctx._close)
        for ctx in ctxs:
            if ctx._daemon:
                continue
            try:
                while not ctx.join():
                    pass
            except Exception:     # the worker said why on its stderr
                pass
    finally:
        for ctx in ctxs:
            _quietly(ctx._close)


def _after_fork_in_child():
    # The parent's contexts are not this process's to wait for.
    global _dropped, _live, _reaping
    _dropped, _live, _reaping = [], weakref.WeakSet(), threading.Lock()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)


class ProcessContext:
    """What spawn(join=False) returns, as torch's ProcessContext: join(),
    pids(), and processes and sentinels.  Dropping it leaves running
    workers running (see the top of this file)."""

    def __init__(self, procs, board, nprocs, whos=None):
        _reap_orphans()
        self._procs = procs
        self._board = board
        self.nprocs = nprocs
        self._pids = procs.pids()
        self._whos = whos
        self._done = False
        self._error = None        # what join() raised: it raises it again
        # One joiner at a time: the one that sees the end closes the set,
        # which must not be freed under another's wait.  An RLock: it
        # knows its owner, so that join() releases it whatever a signal
        # handler raised where (see there).
        self._lock = threading.RLock()
        # Held to read a status or to close the set; never for a wait.
        self._state = threading.Lock()
        self._final = None        # every rank's exit code, once closed
        self._processes = None
        self._sentinels = None
        self._daemon = bool(whos and whos[0][3])
        _live.add(self)

    def pids(self):
        return list(self._pids)

    @property
    def processes(self):
        """A WorkerProcess per rank, made on first use."""
        with self._state:
            if self._processes is None:
                whos = self._whos or [None] * self.nprocs
                self._processes = [
                    WorkerProcess(self, rank, pid,
                                  who[1] if who else f"rank-{rank}",
                                  bool(who and who[3]))
                    for rank, (pid, who) in enumerate(zip(self._pids, whos))]
                for rank, p in enumerate(self._processes):
                    p._final = self._final and self._final[rank]
            return self._processes

    @property
    def sentinels(self):
        """{sentinel: rank} of the workers join() has not seen end, as
        torch's (which join() takes them out of)."""
        if self._sentinels is None:
            sentinels = {p.sentinel: rank
                         for rank, p in enumerate(self.processes)}
            with self._state:
                if self._sentinels is None:
                    self._sentinels = sentinels
                    if self._final is not None:
                        self._sentinels.clear()
        return self._sentinels

    def _status(self, rank):
        with self._state:
            if self._final is not None:
                return self._final[rank]
            return self._procs.status(rank)

    def _statuses(self):
        """Every rank's exit code (one request to the zygote)."""
        with self._state:
            if self._final is not None:
                return list(self._final)
            if hasattr(self._procs, "statuses"):
                return self._procs.statuses()
            return [self._procs.status(r) for r in range(self.nprocs)]

    def _traceback(self, rank):
        if self._board is None:           # the zygote read it
            return self._procs.traceback(rank)
        raw = os.pread(self._board, SLOT, rank * SLOT)
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    def join(self, timeout=None, grace_period=None):
        """True once every worker exited 0; False if timeout ran out.
        Raises for the first worker that failed (the others terminated):
        torch's ProcessRaisedException with the worker's traceback, or
        ProcessExitedException for an exit status or a signal, and then
        raises it again at every join.  Threads may join at once: they
        take turns, each within its timeout.  grace_period (torch 2.x's)
        is accepted and changes nothing: the set terminates the others
        itself, at the first failure (SIGTERM, then SIGKILL after 3 s)."""
        del grace_period
        if self._lock._is_owned():
            # A signal handler that interrupted this thread's join: the
            # set is mid-wait below it, and must not be closed there.  A
            # join with a timeout times out, as it did when it waited for
            # the lock; one without would wait for ever.
            if timeout is not None:
                return False
            raise RuntimeError("join() of a spawn context from a signal "
                               "handler that interrupted its join in the "
                               "same thread")
        try:
            if timeout is None:
                self._lock.acquire()
            else:
                end = time.monotonic() + timeout
                if not self._lock.acquire(timeout=max(0.0, timeout)):
                    return False
                timeout = max(0.0, end - time.monotonic())
            return self._join(timeout)
        finally:
            # Held unless the acquire timed out or never returned.  Not
            # "locked = acquire()", then "if locked: release()": a signal
            # handler's exception (Ctrl-C) can come as the acquire
            # returns, before the result is stored, or after a check,
            # before the release, and a lock left held makes every later
            # join, and the one at exit, wait for ever.  An RLock's
            # release() is that check and the release in one call
            # (RuntimeError when this thread does not hold it), made
            # here, not in a function of ours: handlers also run as a
            # Python function is entered.  (Python 3.10 and later run
            # handlers only at calls and backward jumps; 3.9 between
            # most instructions, where no Python code can close the gap.)
            try:
                self._lock.release()
            except RuntimeError:
                pass

    def _join(self, timeout):
        if self._done:
            if self._error is not None:
                raise self._error
            return True
        res = self._procs.join(timeout)
        if res is False:
            if self._sentinels is not None:
                codes = self._statuses()
                self._forget_sentinels(lambda rank: codes[rank] == 0)
            return False
        if res is None:
            self._close()
            return True
        try:
            tb = self._traceback(res[0]) if res[0] >= 0 else ""
            self._error = _failure(res, tb)
        finally:
            # Stored before the set is closed, which may be interrupted:
            # every later join raises it too.
            if self._error is None:
                self._error = RuntimeError(f"worker {res[0]} failed: {res}")
            self._close()
        raise self._error

    def _forget_sentinels(self, joined):
        """Take the sentinels of ranks that joined out, as torch's join
        does (only if sentinels were asked for)."""
        if self._sentinels is not None:
            for fd, rank in list(self._sentinels.items()):
                if joined(rank):
                    self._sentinels.pop(fd, None)

    def _close(self):
        if self._done:
            return
        self._done = True
        final = None
        try:
            with self._state:
                # Terminates what still runs (nothing, after a join that
                # saw the end; a failure's others, already terminated),
                # waits until every worker is reaped, frees the set: the
                # exit codes, read before the board goes.
                final = self._procs.close()
        finally:
            # A signal handler may raise as close() returns: the set
            # keeps what it returned.  Every worker is gone once the set
            # is closed: one whose code was not learnt must not read as
            # running.
            final = final or self._procs.codes or [None] * self.nprocs
            self._final = [-signal.SIGKILL if c is None else c
                           for c in final]
            if self._board is not None:
                os.close(self._board)
            for rank, p in enumerate(self._processes or ()):
                p._final = self._final[rank]
                p._orphan = None
            self._forget_sentinels(lambda rank: True)

    def _running(self):
        """Whether a worker may still run (False once closed)."""
        if self._done:
            return False
        try:
            return None in self._statuses()
        except Exception:         # a lost zygote: its workers are gone
            return False

    def __del__(self):
        # Not closed: as torch's workers, its workers keep running; this
        # context comes back to life in _dropped until they end (see
        # there).  Called once: the interpreter does not finalize a
        # resurrected object again.
        if not self._done:
            for p in self._processes or ():
                p._orphan = self          # a collected cycle cleared p._ctx
            _dropped.append(self)
