# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm.torch.spawn(): torch.multiprocessing.spawn on libtshm's supervisor.

The workers are started by libtshm's spawner (python/src/spawn.c): they
are in a process group of their own, die with the parent (parent-death
signal), get floor(usable CPUs / nprocs) threads, and the library's join
reports the first failure and terminates the rest (SIGTERM, grace,
SIGKILL).  Two start methods:

* "spawn" (the default, as torch's): each worker is a fresh interpreter
  exec'ed with its rank; it imports torch itself, which is most of its
  start-up time (about a second of CPU per worker);
* "fork": each worker is a fork of this interpreter, made by the library
  while this thread holds the GIL (as os.fork()), and runs fn at once:
  torch is already imported.  Unsafe where fork is: once this process has
  threads holding locks, or CUDA;
* "forkserver": each worker is a "fork" worker of a zygote, a fresh
  interpreter with torch imported, started once (tshm/torch/_zygote.py).

What a worker needs and says travels in two memfds the workers inherit
(freed when the last holder exits, whatever kills it):

* the payload ("spawn" only: a forked worker finds fn and args in its
  memory): multiprocessing's preparation data (sys.path, the main
  module, as its spawn start method sends), and (fn, args) pickled with
  ForkingPickler once per rank, so tensors in args go the tshm way;
* the error board: SLOT bytes per rank, where a worker that raised writes
  its traceback (the start and the end of a longer one: board_entry())
  before it exits with status 1.
"""

import itertools
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import traceback
from multiprocessing import (context, process, reduction, resource_sharer,
                             resource_tracker, spawn as mp_spawn, util)

from .._tshm import _Procs
from . import _context
from ._context import SLOT, NoProcesses, ProcessContext, board_entry
from ._reductions import sending_as_tshm

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
_WORKER = ("import sys; from tshm.torch._spawn import _worker; "
           "_worker(*sys.argv[1:])")


START_METHODS = ("spawn", "fork", "forkserver")


def spawn(fn, args=(), nprocs=1, join=True, daemon=False,
          start_method="spawn"):
    """Start nprocs processes running fn(rank, *args), as
    torch.multiprocessing.spawn does.  Workers always die with this
    process; daemon is what multiprocessing.current_process().daemon
    says in them (a daemonic worker may not start processes), as in
    torch's.  start_method "spawn"
    (each worker a fresh interpreter: safe with threads and CUDA, slow),
    "forkserver" (each worker a fork of a zygote that imported torch:
    safe and fast once the zygote runs) or "fork" (each worker a fork of
    this process: fast, unsafe once it has threads or CUDA); see the top
    of this file."""
    if start_method not in START_METHODS:
        raise ValueError(f"tshm.torch.spawn: start_method {start_method!r} "
                         f"is not supported; use one of {START_METHODS}")
    if nprocs < 0:
        raise ValueError(f"nprocs must not be negative, not {nprocs}")
    # As multiprocessing's start(): the main module of a "spawn" or
    # "forkserver" worker that starts workers as it is imported, for
    # want of an `if __name__ == "__main__":`, is told so.
    mp_spawn._check_not_importing_main()
    if nprocs == 0:             # torch's spawn starts nothing, waits for it
        return _finish(NoProcesses(), join)
    if process.current_process().daemon:
        # As multiprocessing's start() (an assert there): torch's spawn
        # raises it from a daemonic process, a daemonic worker included.
        raise AssertionError("daemonic processes are not allowed to have "
                             "children")
    # The caller's own thread settings win over the budget: all of it.
    # One set alone (OMP_NUM_THREADS) leaves the others unset, as the
    # caller has them (MKL follows OMP_NUM_THREADS then), not budgeted.
    env = {}
    if any(k in os.environ for k in _THREAD_VARS):
        env = {k: os.environ.get(k) for k in _THREAD_VARS}
    whos = _identities(start_method, nprocs, daemon)
    if start_method == "fork":
        ctx = _start_forks(
            lambda rank, board: _forked_worker(lambda: (fn, args), board,
                                               rank, whos[rank]),
            nprocs, env, whos)
        return _finish(ctx, join)
    prep, calls = _payload(fn, args, nprocs)
    if start_method == "forkserver":
        from ._zygote import ZygoteProcs
        procs = ZygoteProcs(prep, calls, whos, env)
        return _finish(ProcessContext(procs, None, nprocs, whos), join)
    payload = pickle.dumps((prep, calls, whos), protocol=5)
    pfd = os.memfd_create("tshm-spawn-payload", 0)
    board = os.memfd_create("tshm-spawn-errors", os.MFD_CLOEXEC)
    try:
        _write_all(pfd, payload)
        os.ftruncate(board, nprocs * SLOT)
        bfd = os.dup(board)          # the workers' copy: no CLOEXEC
        tfd = -1
        try:
            os.set_inheritable(bfd, True)
            tfd = tracker_fd()
            procs = _Procs(_interpreter(_WORKER) +
                           [str(pfd), str(bfd), str(tfd)], nprocs, env=env,
                           forward_sigint=True)
        finally:
            os.close(bfd)
            if tfd >= 0:
                os.close(tfd)
    except BaseException:
        os.close(board)
        raise
    finally:
        os.close(pfd)
    return _finish(ProcessContext(procs, board, nprocs, whos), join)


class _Spawning:
    """What multiprocessing's pickling asks of the process it pickles for
    (context.get_spawning_popen()): with one set, its primitives
    (SimpleQueue, Queue, Lock, Event...) agree to be pickled, as for its
    own spawn start method.  Their fds do not go by inheritance, as
    popen_spawn_posix's do (the forkserver's workers are not this
    process's children): reduction.DupFd() hands them to the resource
    sharer, which a worker fetches them from when it unpickles, as it
    does for tensors."""

    DupFd = resource_sharer.DupFd

    @staticmethod
    def duplicate_for_child(fd):
        return fd


def tracker_fd():
    """An inheritable copy of the fd of this process's multiprocessing
    resource tracker (started if it is not running), or -1 if it cannot
    be had.  multiprocessing hands it to its "spawn" and "forkserver"
    children, so that what they register (a SharedMemory, a semaphore)
    is the caller's tracker's, not a tracker of their own that cleans it
    up when they exit."""
    try:
        fd = os.dup(resource_tracker.getfd())
    except (OSError, ValueError):
        return -1
    os.set_inheritable(fd, True)
    return fd


def use_tracker(fd):
    """In a worker: use the caller's resource tracker (tracker_fd()),
    as multiprocessing's spawn_main() does."""
    if fd >= 0:
        resource_tracker._resource_tracker._fd = fd


def prepare(prep, who):
    """multiprocessing's spawn.prepare() for the worker who is, marked
    as still starting up as multiprocessing's spawn children are: a main
    module that starts workers as it is imported gets multiprocessing's
    error about the missing `if __name__ == "__main__":`."""
    me = process.current_process()
    me._inheriting = True
    try:
        mp_spawn.prepare(_prepared(prep, who))
    finally:
        del me._inheriting


def _interpreter(code):
    """argv running code in a new interpreter with this one's flags (-O,
    -s, -W..., as multiprocessing's spawn passes them) and this one's
    sys.path first: it finds what this one finds, however this one
    found it (PYTHONPATH, which -E and -I ignore, or sys.path edited)."""
    path = [os.path.abspath(p) for p in sys.path if isinstance(p, str)]
    return [sys.executable, *subprocess._args_from_interpreter_flags(),
            "-c", f"import sys; sys.path[:0] = {path!r}; {code}"]


def _payload(fn, args, nprocs):
    """multiprocessing's preparation data and (fn, args) pickled once per
    rank, as torch does: what args hold may be good for one load only (an
    fd fetched from the resource sharer)."""
    prep = mp_spawn.get_preparation_data("tshm-spawn")
    # As bytes: the workers must hold it to fetch fds (tensors in args)
    # from this process's resource sharer.
    prep["authkey"] = bytes(prep["authkey"])
    outer = context.get_spawning_popen()
    context.set_spawning_popen(_Spawning())
    try:
        with sending_as_tshm():     # whatever this process's strategy
            return prep, [bytes(reduction.ForkingPickler.dumps((fn, args),
                                                               5))
                          for _ in range(nprocs)]
    finally:
        context.set_spawning_popen(outer)


def _identities(method, nprocs, daemon):
    """Who each worker is for multiprocessing, as torch's workers (the
    start method's Process objects) are: a name and an identity from
    this process's counter (ForkProcess-3), the daemon flag, and this
    process as the parent."""
    me = process.current_process()
    cls = multiprocessing.get_context(method).Process
    whos = []
    for _ in range(nprocs):
        identity = me._identity + (next(process._process_counter),)
        name = f"{cls.__name__}-{':'.join(map(str, identity))}"
        whos.append((method, name, identity, bool(daemon), os.getpid(),
                     me.name))
    return whos


def _prepared(prep, who):
    """multiprocessing's preparation data for the worker who is: the
    main module is imported under its name, as in torch's workers."""
    return dict(prep, name=who[1])


def _become(who):
    """Make this worker what multiprocessing's Process._bootstrap() makes
    a child before its target runs: current_process() its Process
    object, parent_process() the caller (its pidfd the sentinel), the
    start method its own, a counter and children of its own, stdin
    /dev/null (a forked worker would read what was meant for the
    caller), then the caller's finalizers dropped and the at-fork hooks
    run (a Queue's feeder thread is not in a fork), which see the worker
    as it now is."""
    method, name, identity, daemon, ppid, pname = who
    context._force_start_method(method)
    process._children = set()
    util._close_stdin()
    me = multiprocessing.get_context(method).Process(name=name,
                                                     daemon=daemon)
    me._identity = identity
    me._parent_pid, me._parent_name = ppid, pname
    process._process_counter = itertools.count(1)
    process._current_process = me
    try:
        sentinel = os.pidfd_open(ppid)
    except (AttributeError, OSError):   # Linux < 5.3: no parent to show
        process._parent_process = None
    else:
        process._parent_process = process._ParentProcess(pname, ppid,
                                                         sentinel)
    if threading._HAVE_THREAD_NATIVE_ID:
        threading.main_thread()._set_native_id()
    util._finalizer_registry.clear()
    util._run_after_forkers()


def _finish(ctx, join):
    """spawn()'s result for a started set."""
    if not join:
        return ctx
    while not ctx.join():
        pass
    return None


def _start_forks(body, nprocs, env, whos=None):
    """nprocs forks of this process running body(rank, board), whose
    result is the exit status: a ProcessContext (whos: the workers'
    identities, for its processes)."""
    # What this process buffered would be written once more by each
    # worker (multiprocessing's util._flush_std_streams() does the same).
    _flush_std_streams()
    # A fork keeps every fd, CLOEXEC or not: the workers have the board.
    board = os.memfd_create("tshm-spawn-errors", os.MFD_CLOEXEC)
    try:
        os.ftruncate(board, nprocs * SLOT)
        procs = _Procs(None, nprocs, env=env,
                       target=lambda rank, n: _forked(body, rank, board),
                       forward_sigint=True)
    except BaseException:
        os.close(board)
        raise
    return ProcessContext(procs, board, nprocs, whos)


def _forked(body, rank, board):
    """A forked worker: body(rank, board) (_forked_worker(), which loads
    fn and args, then calls _become()), then what Process._bootstrap()
    does after its target: the worker leaves with _exit(), which runs no
    atexit handler, so what an ending Python process would do is done
    here first, in its order: multiprocessing's finalizers run (a
    Queue's feeder flushes what was put, its children are joined: what
    Process._bootstrap() does after its target), it waits for its
    non-daemon threads, then for the sets it or those threads started
    with tshm.torch.spawn(join=False), or terminates them if daemonic
    (_context._at_exit(), an atexit handler elsewhere).  An exception
    there (sys.exit() in a signal handler during a wait) is exit status
    1, as in torch's workers (python/src/spawn.c); the sets are still
    waited for."""
    code = body(rank, board)
    try:
        try:
            try:
                util._exit_function()
            finally:
                threading._shutdown()
        finally:
            _context._at_exit()
    finally:
        _flush_std_streams()
    return code


def _sync_thread_vars():
    """The library set the thread budget in the C environment of this
    fork (environ points at the workers' array); os.environ is the
    interpreter's copy from start-up."""
    import ctypes
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    getenv.argtypes = [ctypes.c_char_p]
    for k in _THREAD_VARS:
        v = getenv(k.encode())
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = os.fsdecode(v)


def _apply_thread_budget():
    """Size torch's pools to the budget the library put in
    OMP_NUM_THREADS.  Always, even where torch.get_num_threads() already
    says so: that is OpenMP's size only, and set_num_threads() also sizes
    torch's pthreadpool (QNNPACK, XNNPACK), which otherwise takes every
    CPU.  In a fork it costs about 5 ms of CPU (torch builds the pool
    afresh there, then again at the new size)."""
    # torch's own rule at start-up: OMP_NUM_THREADS, else MKL_NUM_THREADS
    # (a caller's, set alone); a zygote's worker must not keep the
    # zygote's size instead.
    threads = os.environ.get("OMP_NUM_THREADS") or \
        os.environ.get("MKL_NUM_THREADS")
    import torch
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _run_fn(fn, rank, args):
    """fn(rank, *args), as torch's workers run it: a KeyboardInterrupt out
    of it is the parent telling the worker to stop (SIGINT), no failure.
    One before fn runs (in the worker's start-up) is a failure."""
    try:
        fn(rank, *args)
    except KeyboardInterrupt:
        pass


def _exit_status(e):
    """The exit status of a SystemExit, as the interpreter makes it:
    sys.exit("why") prints why on stderr and is status 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    sys.stderr.write(f"{e.code}\n")
    return 1


def _report_failure(bfd, rank):
    """In a worker, in an except clause: the exception's traceback on
    rank's slot of the error board (board_entry()) and, whole, on
    stderr."""
    tb = traceback.format_exc()
    os.pwrite(bfd, board_entry(tb), rank * SLOT)
    sys.stderr.write(tb)


def _forked_worker(load, bfd, rank, who):
    """The body of a forked worker: its exit status.  load() gives fn and
    args (a zygote's worker imports the caller's main module there): what
    it raises comes back with its traceback, as what fn raises does."""
    code = 0
    try:
        fn, args = load()
        _become(who)
        _sync_thread_vars()
        _apply_thread_budget()
        from . import install
        install()
        _run_fn(fn, rank, args)
    except KeyboardInterrupt:
        code = 1
    except SystemExit as e:
        code = _exit_status(e)
    except Exception:
        _report_failure(bfd, rank)
        code = 1
    except BaseException:
        # Not an Exception (GeneratorExit, a class of the caller's): as a
        # Python program, and torch's workers, end on it (exit status 1).
        traceback.print_exc()
        code = 1
    return code               # (_forked() flushes the streams after)


def _flush_std_streams():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:     # None, closed, or not a file after all
            pass


def _write_all(fd, data):
    """Write all of data: one write() moves at most 2 GiB minus a page."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd):
    chunks, off = [], 0
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        off += len(b)


def _worker(pfd, bfd, tfd, rank, nprocs):
    pfd, bfd, rank = int(pfd), int(bfd), int(rank)
    try:
        use_tracker(int(tfd))
        prep, calls, whos = pickle.loads(_read_all(pfd))
        os.close(pfd)
        prepare(prep, whos[rank])
        _become(whos[rank])
        _apply_thread_budget()
        from . import install
        install()
        fn, args = pickle.loads(calls[rank])
        del calls
        _run_fn(fn, rank, args)
    except Exception:
        _report_failure(bfd, rank)
        sys.exit(1)
    # Anything else (KeyboardInterrupt: killed by SIGINT; SystemExit; a
    # BaseException of the caller's: status 1) ends it as Python does.
    sys.exit(0)

