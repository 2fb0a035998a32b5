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
socket pair the zygote inherits), one request at a time; the zygote
first says ("ok", its pid) once it imported torch, then answers:

    ("spawn", prep, calls, whos, env, environ)   -> ("ok", pids)
    ("join", key, timeout)                       -> ("ok", (result, tb))
    ("status", key)                              -> ("ok", codes)
    ("close", key)                               -> ("ok", codes)

or ("err", text) for a request that raised (the zygote goes on), where
result is what _Procs.join() returns and codes each rank's exit code
(None while it runs; "close" waits until every worker is reaped).  A
join waits at most JOIN_SLICE seconds in the zygote, so that one set's
join never holds up another's; the caller loops.  The zygote exits when the caller closes the
connection or exits.

What can go wrong, and what happens then:

* the zygote dies (the OOM killer, a stray kill): its workers die with
  it; a join of any set it started raises torch's
  ProcessExitedException naming the zygote, and the next spawn starts
  a new zygote.  A set belongs to the zygote that started it (its
  _Life): a new zygote never answers for it (it would not know the set,
  and "unknown" must not read as "exited 0"), and joining or closing a
  lost set starts no zygote.  It ignores SIGINT
  (its workers do not): a kill -INT to every process, or Ctrl-C, which
  its supervisor passes on to its group for the workers' supervisors in
  it, does not take the forkserver down;
* Ctrl-C: in the main thread, SIGINT's handler is deferred while the
  lock is held (_DeferredSigint), and the caller's runs once it is
  released, where it may use the zygote; only a join's wait for its
  reply, and the zygote's start-up, are interrupted, and a join's reply
  is then read before the next request's (_Life.unread): the zygote and
  its sets live on;
* an exception (a handler of another signal that raised) in the middle
  of a message, or between any request but a join and its reply: the
  reply, or the rest of the message, would be taken for the next
  request's, so the connection is lost and the zygote let go, with its
  running sets, as if it had died; such a handler that asks the zygote
  anything is a RuntimeError (its thread holds the lock);
* this process forks (another thread may be talking to the zygote,
  holding the lock): the child forgets the zygote and the lock, and
  starts its own zygote on first use;
* the zygote's environment is the caller's when it started: each spawn
  request carries the caller's os.environ of that moment, which the
  workers take (the thread budget set for them kept), and multiprocessing's
  preparation data (sys.path, cwd, main module);
* the caller may have found tshm through sys.path, not PYTHONPATH: the
  zygote starts with the caller's sys.path first on its own, and the
  caller's interpreter flags (-O, -s, -W...); one that cannot come up
  is a RuntimeError with what it wrote to stderr.
"""

import contextlib
import os
import pickle
import signal
import socket
import sys
import threading
import time
from multiprocessing import connection, reduction

from .._tshm import _Procs
from . import _spawn

JOIN_SLICE = 0.2
#: How often a main thread waiting for another's request checks for Ctrl-C.
LOCK_POLL = 0.05
#: How much of a zygote's start-up stderr a failure to come up shows.
STDERR_SHOWN = 16 * 1024
# The zygote's stderr goes to a memfd until it is up: if it cannot come
# up (tshm or torch not importable), that is what the caller shows.
# SIGINT ignored first: its supervisor passes Ctrl-C on to its group,
# for the workers' supervisors in it, and the import of torch is long.
_SERVE = ("import os, signal, sys; "
          "signal.signal(signal.SIGINT, signal.SIG_IGN); "
          "err = os.dup(2); os.dup2(int(sys.argv[2]), 2); "
          "from tshm.torch._zygote import _serve; "
          "_serve(int(sys.argv[1]), int(sys.argv[2]), err, int(sys.argv[3]), "
          "int(sys.argv[4]))")

# An RLock for what it knows of its owner: _request() releases it, or
# refuses to wait for it, by whether this thread holds it, whatever a
# signal handler raised where (see _context.ProcessContext.join()).
_lock = threading.RLock()
# (pid of its starter, _Procs, Connection, _Life): the zygote now.
_zygote = None
# In the zygote: the fd of its connection to the caller, and one of
# /dev/null to put in its place in a worker.
_served = -1
_null = -1


class _Life:
    """One zygote's life, which the sets it started hold: once the zygote
    is gone, so are they, whatever zygote answers now."""

    def __init__(self):
        self.ended = None     # how it ended, as _Procs.join() says
        # Replies to requests interrupted before a byte of their reply
        # was read (Ctrl-C in a join): read before the next request's.
        self.unread = 0
        # A message half sent or half read, if an exception came then.
        self.midway = False


class _Interrupted(Exception):
    """SIGINT came while a join waited for its reply (_DeferredSigint)."""


class _DeferredSigint:
    """SIGINT's handler in the main thread while it holds the zygote's
    lock: one that notes the signal, so that the caller's runs once the
    lock is released (run()).

    Python runs signal handlers in the main thread only, whichever thread
    the kernel gave the signal to (a mask in this thread would only send
    it to torch's threads).  Run at once, the caller's handler could
    raise in the middle of a message, whose rest would then be taken for
    the next one's, and a handler that uses a forkserver set (terminates
    its workers on Ctrl-C, say) would wait for the lock its own thread
    holds.  The one place SIGINT interrupts is a join's wait for its
    reply (waiting): there no message is midway, the reply is read
    before the next request's (_Life.unread), and a Ctrl-C must not wait
    for a set that may run for hours.  The zygote's start-up, and the
    wait for the lock (polled), are interruptible too.  A process that
    another thread forks meanwhile gets the caller's handler back
    (_after_fork_in_child())."""

    def __init__(self, handler):
        self.handler = handler
        self.frames = []
        self.waiting = False

    def __call__(self, signo, frame):
        self.frames.append(frame)
        if self.waiting:
            self.waiting = False
            raise _Interrupted

    @contextlib.contextmanager
    def interruptible(self):
        """A wait that SIGINT interrupts (_Interrupted), at once if one
        came already."""
        if self.frames:
            raise _Interrupted
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False

    @classmethod
    def install(cls):
        """One installed, or None where no Python handler of SIGINT can
        run in this thread (another thread; SIG_IGN, SIG_DFL, C's)."""
        global _deferred
        if threading.current_thread() is not threading.main_thread():
            return None
        handler = signal.getsignal(signal.SIGINT)
        leaked = isinstance(handler, _DeferredSigint)
        while isinstance(handler, _DeferredSigint):
            # One whose restore() a handler of another signal broke off
            # (raising at every turn of its loop): the caller's is its.
            handler = handler.handler
        if not callable(handler):
            # (Never one install() made, which wraps only callables;
            # one made by hand: what it wraps goes back all the same.)
            if leaked:
                cls(handler).restore()
            return None
        self = cls(handler)
        _deferred = self
        try:
            signal.signal(signal.SIGINT, self)
        except BaseException:
            self.restore()      # (it may have been installed)
            raise
        return self

    def restore(self):
        """The caller's handler back.  signal.signal() runs the handlers
        of signals that came, before it installs one and after (the
        enum made of what it returns): one of another signal that raises
        must not leave SIGINT deferred for good."""
        global _deferred
        raised = None
        while True:
            try:
                try:
                    signal.signal(signal.SIGINT, self.handler)
                    break
                except BaseException as e:
                    raised = e
            except BaseException as e:      # another, in the except clause
                raised = e
        _deferred = None
        if raised is not None:
            raise raised

    def run(self):
        """The caller's handler, once, for the SIGINT that came first."""
        if self.frames:
            self.handler(signal.SIGINT, self.frames[0])


# The main thread's SIGINT handler while it holds the zygote's lock.
_deferred = None
# A wait that SIGINT does not interrupt.
_NO_WAIT = contextlib.nullcontext()


def _whole(life, unread, op, *args):
    """op(*args), a send or a read of one message, which leaves the
    connection in step only if it completes: life.midway meanwhile (an
    exception then loses the connection), and unread counted when it did
    (+1 a request, -1 a reply).  SIGINT is deferred meanwhile
    (_DeferredSigint); a handler of another signal that raises is not."""
    life.midway = True
    result = op(*args)
    life.midway = False
    life.unread += unread
    return result


def _after_fork_in_child():
    # Another thread may have held the lock, talking to the zygote: that
    # thread does not exist here.  The zygote is the parent's.
    global _lock, _zygote, _deferred
    _lock = threading.RLock()
    _zygote = None
    # Forked by another thread while the main one held the lock: SIGINT's
    # handler is the caller's again.
    if _deferred is not None:
        signal.signal(signal.SIGINT, _deferred.handler)
        _deferred = None


os.register_at_fork(after_in_child=_after_fork_in_child)


class ZygoteLost(Exception):
    """The zygote died or its connection broke: (rank, pid, exit_code,
    signo, message, summary) of the zygote, as _Procs.join() says."""


def _start(sigint=None):
    """A new zygote: (its _Procs, Connection) once it is up.  sigint: the
    _DeferredSigint that may interrupt the wait for it (_Interrupted),
    which lets it go."""
    mine, theirs = socket.socketpair()
    log = os.memfd_create("tshm-zygote-stderr", os.MFD_CLOEXEC)
    try:
        os.set_inheritable(theirs.fileno(), True)
        log_child = os.dup(log)
        tfd = -1
        try:
            tfd = _spawn.tracker_fd()
            os.set_inheritable(log_child, True)
            procs = _Procs(_spawn._interpreter(_SERVE) +
                           [str(theirs.fileno()), str(log_child), str(tfd),
                            str(os.getpgrp())],
                           1, forward_sigint=True)
        finally:
            os.close(log_child)
            if tfd >= 0:
                os.close(tfd)
        theirs.close()
        conn = connection.Connection(mine.detach())
        try:
            with sigint.interruptible() if sigint else _NO_WAIT:
                conn.recv()             # ("ok", pid) once it is up
        except BaseException as e:
            if not isinstance(e, (OSError, EOFError)):
                conn.close()            # interrupted: it is let go
                procs.terminate()
                procs.join()
                procs.close()
                raise
            conn.close()
            res = procs.join(10)
            procs.close()
            raise RuntimeError(
                "tshm.torch.spawn: the forkserver zygote did not come up "
                f"({_how(res)}); its stderr:\n"
                + os.pread(log, STDERR_SHOWN, 0).decode("utf-8", "replace")
            ) from None
        return procs, conn
    finally:
        mine.close()
        theirs.close()
        os.close(log)


def _how(res):
    if not res:
        return "no exit status"
    return f"killed by signal {res[3]}" if res[3] else f"exit status {res[2]}"


def _forget():
    """Let go of the zygote (dead, or its connection broken); the next
    request starts a new one.  How it ended, as _Procs.join() says."""
    global _zygote
    _, procs, conn, life = _zygote
    _zygote = None
    pid = procs.pids()[0]
    life.ended = (0, pid, -1, 0, "", "")   # if what follows is interrupted
    conn.close()
    res = procs.join(1)       # gone already, as a rule
    if not res:
        procs.terminate()
        res = procs.join()
    procs.close()
    # None: it exited 0 (we hung up), which its sets' joins then say.
    life.ended = res or (0, pid, 0, 0, "", "")
    return res


#: A join's reply that an interrupt kept it from waiting for, where the
#: caller's SIGINT handler did not raise: the join goes on.
NO_REPLY = object()


def _ask(request, retry=False, life=None):
    """The zygote's answer to request; retry: once more with a new zygote
    if this one is gone (a spawn: nothing was started for it that
    outlives the old zygote); life: only the zygote of that life may
    answer (a request about one of its sets: never start a zygote for
    it).  Raises ZygoteLost.  A join may answer NO_REPLY."""
    return _request(request, retry, life)[0]


def _request(request, retry=False, life=None):
    """_ask(), and the life of the zygote that answered."""
    # Pickled first: a request that cannot be pickled is the caller's
    # error, and leaves the connection as it was.  (bytes: dumps() gives
    # a view of a BytesIO, which an interrupt's traceback would keep in
    # a cycle that the collector then breaks with a BufferError.)
    buf = bytes(reduction.ForkingPickler.dumps(request))
    if _lock._is_owned():
        # A handler of another signal, run while this thread talks to
        # the zygote: waiting for the lock would never end.
        raise RuntimeError(
            "tshm.torch.spawn: a forkserver request from a signal handler "
            "that interrupted another one in the same thread")
    while True:
        failure = None
        # Before the lock: a SIGINT that came runs the caller's handler
        # here, where it may use the zygote.
        sigint = _DeferredSigint.install()
        try:
            if sigint is None:
                _lock.acquire()
            else:
                # Another thread may hold the lock a while (a join's
                # slice, a close's grace period, a zygote's start-up): a
                # SIGINT interrupts the wait for it.  Polled: the handler
                # must not raise once the lock is taken.
                while not _lock.acquire(timeout=LOCK_POLL):
                    if sigint.frames:
                        raise _Interrupted
        except BaseException as e:
            # Mostly before the lock was taken; but a handler of another
            # signal (SIGTERM's sys.exit()) may raise as acquire()
            # returns, the lock taken: this thread's, since it held none
            # (above), and let go here, or every request waits for ever.
            failure = e
            try:
                _lock.release()       # RuntimeError: not held
            except RuntimeError:
                pass
        else:
            try:
                answer = _exchange(request, buf, retry, life, sigint)
            except BaseException as e:
                failure = e
            finally:
                _lock.release()
        finally:
            if sigint is not None:
                sigint.restore()
        # The lock released: the caller's handler may use the zygote.
        if sigint is not None:
            try:
                sigint.run()
            except BaseException as e:
                if failure is not None and \
                        not isinstance(failure, _Interrupted):
                    raise e from failure
                raise
        if failure is None:
            break
        if not isinstance(failure, _Interrupted):
            raise failure
        # Interrupted, and the handler did not raise: a join goes on
        # (its reply is read before the next request's); a request whose
        # zygote was starting is asked again.
        if request[0] == "join":
            return NO_REPLY, None
    status, value, answered = answer
    if status != "ok":
        raise RuntimeError(f"tshm.torch.spawn: the forkserver zygote "
                           f"failed a request: {value}")
    return value, answered


def _exchange(request, buf, retry, life, sigint):
    """_request()'s part under the lock: (status, value, life of the
    zygote that answered)."""
    global _zygote
    for attempt in (0, 1):
        # (A fork that ran no at-fork handlers: not this one's.)
        if _zygote is not None and _zygote[0] != os.getpid():
            _zygote = None
        if life is not None and (_zygote is None or
                                 _zygote[3] is not life):
            # Its zygote is gone (or is another process's).
            raise ZygoteLost(*(life.ended or (0, 0, -1, 0, "", "")))
        if _zygote is None:
            _zygote = (os.getpid(), *_start(sigint), _Life())
        conn, answered = _zygote[2], _zygote[3]
        try:
            while answered.unread:
                _whole(answered, -1, conn.recv)
            _whole(answered, 1, conn.send_bytes, buf)
            with sigint.interruptible() if sigint and \
                    request[0] == "join" else _NO_WAIT:
                connection.wait([conn])
            status, value = _whole(answered, -1, conn.recv)
            return status, value, answered
        except (OSError, EOFError):
            res = _forget()
            if not retry or attempt:
                raise ZygoteLost(*(res or (0, 0, -1, 0, "", ""))) \
                    from None
        except BaseException as e:
            # A join interrupted while it waited for its reply: nothing of
            # the reply read, the next request reads it first, and the
            # zygote and its sets live on.  Else (a handler of another
            # signal that raised in the middle of a message, or between a
            # spawn and its reply) the reply, or the rest of the message,
            # would be taken for the next one's: the connection is lost,
            # and the zygote with it.
            if answered.midway or request[0] != "join":
                _forget()
            raise e


class ZygoteProcs:
    """A set of workers forked by the zygote, with _Procs's interface
    (join, pids, close) plus the traceback of a failed rank."""

    def __init__(self, prep, calls, whos, env):
        try:
            self._pids, self._life = _request(
                ("spawn", prep, calls, whos, env, dict(os.environ)),
                retry=True)
        except ZygoteLost as e:
            raise RuntimeError(f"tshm.torch.spawn: the forkserver zygote "
                               f"died twice ({_how(e.args)})") from None
        self._key = self._pids[0]
        self._tracebacks = {}
        self._last = [None] * len(self._pids)   # exit codes seen

    def pids(self):
        return list(self._pids)

    def join(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = JOIN_SLICE if end is None else \
                max(0.0, min(JOIN_SLICE, end - time.monotonic()))
            try:
                reply = _ask(("join", self._key, left), life=self._life)
                res, tb = (False, "") if reply is NO_REPLY else reply
            except ZygoteLost as e:
                # Its workers died with it: the set failed, as torch's
                # ProcessExitedException says (rank 0, the zygote's pid).
                self._key = None
                _, pid, code, signo, _, _ = e.args
                why = (f"the forkserver zygote (pid {pid}, {_how(e.args)}) "
                       f"of ranks 0..{len(self._pids) - 1}")
                return (0, pid, code, signo, why, why)
            if res is not False:
                if res is not None and tb:
                    self._tracebacks[res[0]] = tb
                return res
            if end is not None and time.monotonic() >= end:
                return False

    def traceback(self, rank):
        return self._tracebacks.get(rank, "")

    def status(self, rank):
        """Rank's exit code, None while it runs (_Procs.status())."""
        if self._last[rank] is None:
            return self.statuses()[rank]
        return self._last[rank]          # known: it never changes

    def statuses(self):
        """Every rank's exit code, in one request."""
        if self._key is not None and None in self._last:
            try:
                self._known(_ask(("status", self._key), life=self._life))
            except ZygoteLost:
                self._key = None
        return self._codes()

    @property
    def codes(self):
        """As _Procs.codes: what close() returned, once it did."""
        return None if self._key is not None else self._codes()

    def close(self):
        """As _Procs.close(): once every worker is reaped, their exit
        codes."""
        if self._key is not None:
            key, self._key = self._key, None
            try:
                self._known(_ask(("close", key), life=self._life))
            except ZygoteLost:
                pass          # the zygote is gone, and its workers
        return self._codes()

    def _known(self, codes):
        if codes:             # (None: the zygote no longer knew the set)
            self._last = [c if c is not None else p
                          for c, p in zip(codes, self._last)]

    def _codes(self):
        """What the zygote said last; once it is gone, a worker it did
        not see end died with it (its supervisor's parent-death signal:
        SIGKILL)."""
        codes = self._last
        if self._key is None:
            codes = [-signal.SIGKILL if c is None else c for c in codes]
        return codes


# -- in the zygote --------------------------------------------------------

def _run(prep, call, who, environ, board, rank):
    # The zygote's end of the caller's connection is not the worker's, as
    # multiprocessing's forkserver children close its listener: a worker
    # holding it would keep the caller from seeing the zygote's death
    # (EOF) while the worker lives, and could write into it.  /dev/null in
    # its place: the zygote's Connection object, copied here, still names
    # that fd number.
    if _served >= 0:
        os.dup2(_null, _served, inheritable=False)
        os.close(_null)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The caller's environment of this spawn(), with the thread budget
    # the library set in this fork's C environment.
    _spawn._sync_thread_vars()
    budget = {k: os.environ[k] for k in _spawn._THREAD_VARS
              if k in os.environ}
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(budget)

    def load():
        _spawn.prepare(prep, who)
        return pickle.loads(call)

    return _spawn._forked_worker(load, board, rank, who)


def _handle(req, sets):
    """The reply to one request."""
    if req[0] == "spawn":
        _, prep, calls, whos, env, environ = req
        ctx = _spawn._start_forks(
            lambda rank, board: _run(prep, calls[rank], whos[rank],
                                     environ, board, rank),
            len(whos), env)
        sets[ctx.pids()[0]] = ctx
        return ctx.pids()
    if req[0] == "join":
        # Never a success for a set this zygote does not run.
        ctx = sets[req[1]]
        res = ctx._procs.join(req[2])
        tb = ctx._traceback(res[0]) if res and res[0] >= 0 else ""
        return res, tb
    if req[0] == "status":
        ctx = sets[req[1]]
        return [ctx._status(rank) for rank in range(ctx.nprocs)]
    if req[0] == "close":
        ctx = sets.pop(req[1], None)
        if ctx:
            ctx._close()
            return ctx._final
        return None
    raise ValueError(f"unknown request {req[0]!r}")


def _serve(fd, log, stderr, tracker, pgid):
    """The zygote: fd its connection, log the memfd its stderr goes to
    until it is up, stderr its own stderr, tracker the caller's
    multiprocessing resource tracker (its workers use it), pgid the
    caller's process group."""
    global _served, _null
    _null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    _served = fd
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Into the caller's process group, out of the one libtshm made for it
    # (a one-process set's): the supervisors it forks for its sets are
    # in its group, and the zygote's supervisor, when the caller dies,
    # SIGKILLs its set's group.  Out of it, they outlive the zygote by a
    # moment, see it die, and kill their workers' groups, the workers'
    # own children included; and Ctrl-C reaches them from the terminal.
    try:
        os.setpgid(0, pgid)
    except OSError:           # another session: the caller left it
        pass
    _spawn.use_tracker(tracker)
    import torch  # noqa: F401  (what the workers start with)
    from . import install
    install()
    # Up: what it wrote so far (warnings) goes where its stderr goes.
    sys.stderr.flush()
    os.dup2(stderr, 2)
    os.close(stderr)
    sys.stderr.buffer.write(_spawn._read_all(log))
    sys.stderr.flush()
    os.close(log)
    conn = connection.Connection(fd)
    conn.send(("ok", os.getpid()))
    sets = {}
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            break
        try:
            reply = ("ok", _handle(req, sets))
        except Exception as e:
            reply = ("err", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            break
    for ctx in sets.values():
        ctx._close()
