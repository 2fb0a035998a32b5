# SPDX-License-Identifier: GPL-2.0
"""tshm.torch.spawn: torch.multiprocessing.spawn's contract on libtshm's
supervisor, for each start method: a worker's traceback comes back and the
rest are terminated, no worker outlives a SIGKILLed parent, the thread
budget, tensors in args, and a 2-rank gloo job whose ranks iterate tshm
DataLoaders.

"spawn" and "forkserver" on the host only: every worker, or the zygote,
is a fresh interpreter importing torch, which takes half a minute in the
emulated VM.  "fork" starts with torch imported and runs in the VM too."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing import (  # noqa: E402
    ProcessExitedException, ProcessRaisedException)

import tshm  # noqa: E402
import tshm.torch  # noqa: E402
from conftest import IN_VM  # noqa: E402

_HOST_ONLY = pytest.mark.skipif(
    IN_VM, reason="host only: a spawned worker, or the forkserver's zygote, "
    "imports torch (30 s in the VM)")
METHODS = [pytest.param("spawn", marks=_HOST_ONLY), "fork",
           pytest.param("forkserver", marks=_HOST_ONLY)]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Reaped before open(), or between open() and read() (ESRCH).
        return False


def failed_pid(err):
    """The failed worker's pid in torch's exception: torch 1.13 keeps it
    as err.pid; torch 2.11 (the GPU machine's) has no pid attribute, and
    error_pid is the name its __slots__ give (not yet seen run there)."""
    for name in ("error_pid", "pid"):
        if hasattr(err, name):
            return getattr(err, name)
    raise AssertionError(f"{type(err).__name__} keeps no pid: {vars(err)}")


def _fail_rank_2(rank, q):
    q.put(("started", rank, os.getpid()))
    if rank == 2:
        raise ValueError("rank 2 failed on purpose")
    time.sleep(600)


@pytest.mark.parametrize("method", METHODS)
def test_exception_comes_back_and_terminates_the_rest(method):
    q = tshm.Queue()
    t0 = time.monotonic()
    ctx = tshm.torch.spawn(_fail_rank_2, args=(q,), nprocs=4, join=False,
                           start_method=method)
    pids = ctx.pids()
    with pytest.raises(ProcessRaisedException) as info:
        while not ctx.join(60):
            pass
    assert time.monotonic() - t0 < 300
    err = info.value
    assert err.error_index == 2 and failed_pid(err) == pids[2]
    assert "ValueError: rank 2 failed on purpose" in str(err)
    assert "_fail_rank_2" in str(err)            # the worker's traceback
    assert not any(alive(p) for p in pids)


def _kill_rank_1(rank):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_killed_by_a_signal_is_process_exited(method):
    """torch's ProcessExitedException, naming the rank and the signal; the
    others are terminated."""
    ctx = tshm.torch.spawn(_kill_rank_1, nprocs=3, join=False,
                           start_method=method)
    pids = ctx.pids()
    with pytest.raises(ProcessExitedException) as info:
        while not ctx.join(60):
            pass
    err = info.value
    assert (err.error_index, failed_pid(err)) == (1, pids[1])
    assert (err.exit_code, err.signal_name) == (-signal.SIGKILL, "SIGKILL")
    # torch's words, which torch's own tests match
    assert str(err) == "process 1 terminated with signal SIGKILL"
    assert not any(alive(p) for p in pids)


def _report(rank, q, x):
    x.add_(rank)                                   # shared with the caller
    q.put((rank, torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"),
           torch.multiprocessing.get_sharing_strategy(),
           os.environ.get("MKL_NUM_THREADS")))


def _reports(nprocs, x, method):
    q = tshm.Queue()
    assert tshm.torch.spawn(_report, args=(q, x), nprocs=nprocs,
                            start_method=method) is None
    return sorted(q.get(timeout=10) for _ in range(nprocs))


@pytest.mark.parametrize("method", METHODS)
def test_thread_budget_and_tensor_args(method):
    tshm.torch.install()
    threads = torch.get_num_threads()
    try:
        usable = len(os.sched_getaffinity(0))
        # Shared memory, as with torch: a forked worker inherits args
        # without pickling, so only a shared tensor is shared.
        x = torch.zeros(4).share_memory_()
        got = _reports(2, x, method)
        budget = max(1, usable // 2)
        assert got == [(r, budget, str(budget), "tshm", str(budget))
                       for r in range(2)]
        assert torch.equal(x, torch.full((4,), 1.0))   # 0 + 1
        os.environ["OMP_NUM_THREADS"] = "3"            # the caller's wins
        try:
            got = _reports(2, torch.zeros(1), method)
        finally:
            del os.environ["OMP_NUM_THREADS"]
        # and the other variables stay as the caller has them: unset
        assert [g[1:] for g in got] == [(3, "3", "tshm", None)] * 2
        # MKL's alone sizes torch's pools, as torch's start-up does (a
        # zygote's worker must not keep the zygote's size)
        os.environ["MKL_NUM_THREADS"] = "1"
        try:
            got = _reports(2, torch.zeros(1), method)
        finally:
            del os.environ["MKL_NUM_THREADS"]
        assert [g[1:] for g in got] == [(1, None, "tshm", "1")] * 2
        assert torch.get_num_threads() == threads   # the caller's own
    finally:
        tshm.torch.uninstall()


def _quantized_threads(rank, q):
    """The threads a QNNPACK op adds to this worker: torch's pthreadpool,
    which only set_num_threads() sizes (get_num_threads() is OpenMP's)."""
    def tasks():
        return len(os.listdir("/proc/self/task"))
    torch.backends.quantized.engine = "qnnpack"
    lin = torch.ao.nn.quantized.Linear(64, 64)
    x = torch.quantize_per_tensor(torch.randn(8, 64), 0.1, 0, torch.quint8)
    before = tasks()
    lin(x)
    q.put((rank, tasks() - before))


@pytest.mark.skipif("qnnpack" not in
                    torch.backends.quantized.supported_engines,
                    reason="this torch has no QNNPACK")
@pytest.mark.parametrize("method", METHODS)
def test_thread_budget_sizes_the_pthreadpool(method):
    """Without set_num_threads() in the worker torch's pthreadpool takes
    a thread per CPU at its first QNNPACK op, whatever OpenMP's size."""
    budget = max(1, len(os.sched_getaffinity(0)) // 2)
    q = tshm.Queue()
    tshm.torch.spawn(_quantized_threads, args=(q,), nprocs=2,
                     start_method=method)
    got = sorted(q.get(timeout=10) for _ in range(2))
    # At most budget - 1 pool threads, and as many of OpenMP's.
    assert all(added <= 2 * (budget - 1) for _, added in got), got


def _arg_in_segment(rank, q, x, bare):
    s = x.untyped_storage() if hasattr(x, "untyped_storage") \
        else x.storage().untyped()
    q.put(tshm._tshm._locate_address(s.data_ptr(), s.nbytes()) is not None)
    bare[0] = 42


@_HOST_ONLY
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_tensor_args_go_the_tshm_way_whatever_the_callers_strategy(method):
    """A caller that never installed tshm: the tensors in args still
    travel as segments (not through torch's resource sharer), and its
    strategy is left as it was.  A bare storage, which could only be
    copied into a segment, goes torch's way: shared with the caller."""
    tshm.torch.uninstall()
    before = torch.multiprocessing.get_sharing_strategy()
    assert before != "tshm"
    q = tshm.Queue()
    bare = torch.UntypedStorage(16)
    bare[0] = 0
    tshm.torch.spawn(_arg_in_segment, args=(q, torch.zeros(1000), bare),
                     nprocs=1, start_method=method)
    assert q.get(timeout=10) is True
    assert bare[0] == 42
    assert torch.multiprocessing.get_sharing_strategy() == before


def _fail_after_a_long_failure(rank):
    if rank == 1:
        try:
            raise ValueError("y" * 200_000)
        except ValueError:
            raise RuntimeError("the last word")


@pytest.mark.parametrize("method", METHODS)
def test_a_traceback_longer_than_its_slot_keeps_its_end(method, capfd):
    """A worker's traceback of 200 KB comes back as its start and its
    end, which names the exception raised last.  (torch 1.13's own spawn
    hangs on one over a pipe's 64 KiB: the worker blocks writing it to
    an error queue that the parent reads once the worker has exited.)"""
    with pytest.raises(ProcessRaisedException) as info:
        tshm.torch.spawn(_fail_after_a_long_failure, nprocs=2,
                         start_method=method)
    msg = str(info.value)
    assert info.value.error_index == 1
    assert "Traceback (most recent call last)" in msg
    assert msg.rstrip().endswith("RuntimeError: the last word")
    assert "bytes of the traceback left out ...]" in msg
    assert len(msg.encode()) < 64 * 1024 + 200
    # The worker's stderr has it whole (a forkserver worker's is its
    # zygote's, which may have been started by an earlier test).
    if method != "forkserver":
        assert capfd.readouterr().err.count("y" * 200_000) == 1


def _exit_3(rank):
    if rank == 1:
        sys.exit(3)


@pytest.mark.parametrize("method", METHODS)
def test_exit_status_in_torchs_words(method):
    with pytest.raises(ProcessExitedException) as info:
        tshm.torch.spawn(_exit_3, nprocs=2, start_method=method)
    err = info.value
    assert (err.error_index, err.exit_code, err.signal_name) == (1, 3, None)
    assert str(err) == "process 1 terminated with exit code 3"


class _NotAnException(BaseException):
    pass


def _exit_with_words(rank, how):
    if rank == 1 and how == "message":
        sys.exit("rank 1 gives up")
    if rank == 1:
        raise _NotAnException("not an Exception")


@pytest.mark.parametrize("method", METHODS)
def test_exit_with_a_message_and_a_base_exception(method, capfd):
    """As Python, and torch's workers: sys.exit("why") prints why and is
    exit status 1; so is a BaseException that is not an Exception
    (torch's workers pass on Exceptions only)."""
    for how in ("message", "base exception"):
        with pytest.raises(ProcessExitedException) as info:
            tshm.torch.spawn(_exit_with_words, args=(how,), nprocs=2,
                             start_method=method)
        err = info.value
        assert (err.error_index, err.exit_code) == (1, 1)
    # A forkserver worker's stderr is its zygote's (an earlier test's).
    if method != "forkserver":
        err = capfd.readouterr().err
        assert "rank 1 gives up\n" in err
        assert "_NotAnException: not an Exception" in err


def test_bad_arguments_and_no_workers():
    """nprocs=0 starts nothing, as torch's spawn: join() is done at once."""
    with pytest.raises(ValueError, match="start_method"):
        tshm.torch.spawn(_report, nprocs=1, start_method="vfork")
    with pytest.raises(ValueError, match="negative"):
        tshm.torch.spawn(_report, nprocs=-1)
    assert tshm.torch.spawn(_report, nprocs=0) is None
    ctx = tshm.torch.spawn(_report, nprocs=0, join=False)
    assert ctx.join() and ctx.pids() == [] and ctx.processes == []


def _interrupted(rank):
    if rank == 1:
        raise KeyboardInterrupt


@pytest.mark.parametrize("method", METHODS)
def test_keyboard_interrupt_in_a_worker_is_a_clean_exit(method):
    """As torch's workers: SIGINT is the parent telling them to stop."""
    assert tshm.torch.spawn(_interrupted, nprocs=2,
                            start_method=method) is None


INTERRUPTED_AT_START = textwrap.dedent("""
    import sys
    import tshm.torch

    if __name__ != "__main__":      # imported in a worker, before fn
        raise KeyboardInterrupt

    def fn(rank):
        print("fn ran")

    if __name__ == "__main__":
        try:
            tshm.torch.spawn(fn, start_method=sys.argv[1])
        except Exception as e:
            print(type(e).__name__, e)
        else:
            print("no failure")
""")


@_HOST_ONLY
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_keyboard_interrupt_before_fn_is_a_failure(tmp_path, method):
    """Only fn's KeyboardInterrupt is a clean exit: one in the worker's
    start-up (its main module's import) fails the run, as torch's."""
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_AT_START)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.startswith("ProcessExitedException process 0 "
                                 "terminated with "), out.stdout + out.stderr


CTRL_C = textwrap.dedent("""
    import os, sys, time
    import tshm.torch

    def work(rank, path):
        try:
            # One write: under PYTHONUNBUFFERED print() writes "started"
            # and its newline apart, and two workers' would interleave.
            os.write(1, b"started\\n")
            time.sleep(600)
        finally:
            open(f"{path}.{rank}", "w").write("finally ran")

    if __name__ == "__main__":
        method, path = sys.argv[1:]
        ctx = tshm.torch.spawn(work, args=(path,), nprocs=2, join=False,
                               start_method=method)
        os.write(1, f"pids {ctx.pids()[0]} {ctx.pids()[1]}\\n".encode())
        try:
            tshm.torch.spawn(work, args=(path + ".joined",), nprocs=1,
                             start_method=method)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        print(ctx.join(60), [p.exitcode for p in ctx.processes], flush=True)
""")


@pytest.mark.skipif(IN_VM, reason="host only: a program of its own "
                    "importing torch (30 s in the VM); no module part")
@pytest.mark.parametrize("method", METHODS)
def test_ctrl_c_reaches_the_workers(tmp_path, method):
    """Ctrl-C (SIGINT to the program's process group) reaches the workers
    as torch's, though they run in a group of their own: their finally
    runs, KeyboardInterrupt out of fn is a clean exit, and the caller's
    join() is interrupted; with join=False as with join=True."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C)
    done = tmp_path / "done"
    p = subprocess.Popen([sys.executable, str(script), method, str(done)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    seen, lines = b"", []
    try:
        deadline = time.monotonic() + 300
        while lines.count(b"started") < 3:
            # Never past the deadline on a worker that says nothing.
            left = deadline - time.monotonic()
            assert left > 0 and select.select([p.stdout], [], [], left)[0], \
                seen
            chunk = os.read(p.stdout.fileno(), 4096)
            assert chunk, (seen, p.stderr.read())
            seen += chunk
            lines = seen.split(b"\n")[:-1]
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
        out = seen.decode() + out
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    said = [x for x in out.splitlines() if x != "started"]
    assert said[1:] == ["interrupted", "True [0, 0]"], out + err
    pids = [int(x) for x in said[0].split()[1:]]
    assert sorted(f.name for f in tmp_path.glob("done*")) == \
        ["done.0", "done.1", "done.joined.0"]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


RAISES_AT_START = textwrap.dedent("""
    import sys
    import tshm.torch

    if __name__ != "__main__":
        raise RuntimeError("planted: no main module in a worker")

    def fn(rank):
        pass

    if __name__ == "__main__":
        try:
            tshm.torch.spawn(fn, nprocs=2, start_method=sys.argv[1])
        except Exception as e:
            print(type(e).__name__)
            print(e)
        else:
            print("no failure")
""")


@_HOST_ONLY
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_exception_in_start_up_comes_back_with_its_traceback(tmp_path,
                                                              method):
    """An exception in a worker's start-up (its main module's import)
    comes back with its traceback, as one out of fn does, with every
    start method.  A forkserver worker imported the main module outside
    the part that reports, and the caller got only 'terminated with exit
    code 1'."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES_AT_START)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.startswith("ProcessRaisedException\n"), \
        out.stdout + out.stderr
    assert "RuntimeError: planted: no main module in a worker" in \
        out.stdout, out.stdout


def _make_shared_memory(rank, q):
    from multiprocessing import shared_memory
    s = shared_memory.SharedMemory(create=True, size=16)
    s.buf[0] = 42
    q.put(s.name)
    s.close()


@pytest.mark.parametrize("method", [pytest.param("spawn", marks=_HOST_ONLY),
                                    pytest.param("forkserver",
                                                 marks=_HOST_ONLY)])
def test_workers_use_the_callers_resource_tracker(method):
    """multiprocessing hands its spawn and forkserver children the
    parent's resource tracker: what a worker registers outlives it, as
    with torch's spawn.  A tracker of the worker's own unlinked it when
    the worker exited."""
    from multiprocessing import shared_memory
    q = tshm.Queue()
    tshm.torch.spawn(_make_shared_memory, args=(q,), start_method=method)
    name = q.get(timeout=10)
    time.sleep(0.5)           # a tracker of its own would have run by now
    s = shared_memory.SharedMemory(name=name)
    try:
        assert s.buf[0] == 42
    finally:
        s.close()
        s.unlink()


NO_MAIN_GUARD = textwrap.dedent("""
    import sys
    import tshm.torch

    def fn(rank):
        pass

    tshm.torch.spawn(fn, start_method=sys.argv[1])
    print("spawned")
""")


@_HOST_ONLY
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_main_module_without_its_guard_is_told_so(tmp_path, method):
    """multiprocessing's error for a script that starts workers as it is
    imported (in every worker, for want of `if __name__ == "__main__":`),
    not a worker starting workers of its own."""
    script = tmp_path / "noguard.py"
    script.write_text(NO_MAIN_GUARD)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "bootstrapping phase" in out.stderr, out.stderr
    assert "spawned" not in out.stdout


def test_fork_worker_exit_status_and_closure():
    """A forked worker runs what is in memory (a closure, no pickling) and
    its sys.exit() status comes back as torch's ProcessExitedException."""
    from torch.multiprocessing import ProcessExitedException
    seen = tshm.Queue()
    tshm.torch.spawn(lambda rank: seen.put(rank), nprocs=3,
                     start_method="fork")
    assert sorted(seen.get(timeout=10) for _ in range(3)) == [0, 1, 2]
    with pytest.raises(ProcessExitedException) as info:
        tshm.torch.spawn(_exit_3, nprocs=2, start_method="fork")
    assert info.value.error_index == 1 and info.value.exit_code == 3


def test_a_failed_set_fails_every_join():
    """join() after the one that raised raises the same again: a failed
    set must not read as one that succeeded."""
    from torch.multiprocessing import ProcessExitedException
    ctx = tshm.torch.spawn(_exit_3, nprocs=2, start_method="fork",
                           join=False)
    for _ in range(2):
        with pytest.raises(ProcessExitedException) as info:
            ctx.join(60)
        assert info.value.error_index == 1 and info.value.exit_code == 3


def _leave_a_thread_behind(rank, path):
    import threading

    def late():
        time.sleep(0.5)
        with open(f"{path}.{rank}", "w") as f:
            f.write("done")
    threading.Thread(target=late).start()


@pytest.mark.parametrize("method", METHODS)
def test_workers_wait_for_their_non_daemon_threads(tmp_path, method):
    """A worker whose fn returns while a non-daemon thread it started
    still runs ends as a Python process (and torch's workers) end: after
    that thread.  A forked worker leaves with _exit(), which waits for
    nothing unless told."""
    path = str(tmp_path / "late")
    tshm.torch.spawn(_leave_a_thread_behind, args=(path,), nprocs=2,
                     start_method=method)
    for rank in range(2):
        with open(f"{path}.{rank}") as f:
            assert f.read() == "done"


def _late_write(rank, path):
    with open(f"{path}.started", "w") as f:
        f.write(str(os.getpid()))
    time.sleep(1)
    with open(f"{path}.done", "w") as f:
        f.write("done")


def _start_a_set_and_return(rank, path, daemon, by):
    def start():
        if by == "thread":          # after fn returned
            time.sleep(0.3)
        ctx = tshm.torch.spawn(_late_write, args=(path,), nprocs=1,
                               join=False, daemon=daemon,
                               start_method="fork")
        with open(f"{path}.pid", "w") as f:
            f.write(str(ctx.pids()[0]))
    if by == "thread":
        import threading
        threading.Thread(target=start).start()
        return
    start()
    while not os.path.exists(f"{path}.started"):
        time.sleep(0.01)


@pytest.mark.parametrize("by", ["fn", "thread"])
@pytest.mark.parametrize("daemon", [False, True],
                         ids=["non-daemonic", "daemonic"])
@pytest.mark.parametrize("method", METHODS)
def test_workers_wait_for_the_sets_they_started(tmp_path, method, daemon,
                                                by):
    """A worker whose fn returns with a set of its own still running
    (spawn(join=False)) ends as a Python program does: after the set's
    workers, or having terminated them if they are daemonic; also one
    that a non-daemon thread of the worker started after fn returned (a
    program waits for its threads, then runs its exit handlers).  A
    forked worker leaves with _exit(), which runs no atexit handler."""
    path = str(tmp_path / "nested")
    tshm.torch.spawn(_start_a_set_and_return, args=(path, daemon, by),
                     nprocs=1, start_method=method)
    with open(f"{path}.pid") as f:     # (a daemonic one may have been
        nested = int(f.read())          # terminated before it started)
    _wait_for_exit(nested)
    assert os.path.exists(f"{path}.done") == (not daemon)


def _wait_for_exit(pid, timeout=30):
    end = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < end, f"{pid} still runs"
        time.sleep(0.01)


def _callers_sockets(rank, caller, path):
    """The fds of this worker that are an end of a socket pair the caller
    made (SO_PEERCRED names the process that made a pair, on both
    ends)."""
    import socket
    import struct
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                struct.calcsize("3i"))
            if struct.unpack("3i", cred)[0] == caller:
                found.append(fd)
        except OSError:
            pass
        finally:
            s.close()
    with open(f"{path}.{rank}", "w") as f:
        f.write(repr(found))


@_HOST_ONLY
def test_forkserver_workers_hold_no_end_of_the_callers_connection(tmp_path):
    """As multiprocessing's forkserver children close its listener, the
    zygote's workers do not keep the zygote's end of the caller's
    connection: while they held it, the caller could not see the zygote
    die (EOF)."""
    path = str(tmp_path / "socks")
    tshm.torch.spawn(_callers_sockets, args=(os.getpid(), path), nprocs=2,
                     start_method="forkserver")
    for rank in range(2):
        with open(f"{path}.{rank}") as f:
            assert f.read() == "[]"


_WHO_AM_I = """
import multiprocessing as mp, os, sys
from multiprocessing import util
import tshm, tshm.torch

IMPORTED_AS = mp.current_process().name     # spawn, forkserver: in the worker
HOOKS = []


class Hook:
    pass


HOOK = Hook()
util.register_after_fork(HOOK, lambda _: HOOKS.append(mp.current_process().name))


def who(rank, q):
    me, parent = mp.current_process(), mp.parent_process()
    try:
        tshm.torch.spawn(int, nprocs=1, start_method="fork")
        nested = "ok"
    except AssertionError:
        nested = "refused"
    q.put((rank, me.name, me.daemon, me._identity, me.pid == os.getpid(),
           parent.pid, parent.is_alive(), mp.get_start_method(),
           IMPORTED_AS, HOOKS, nested, sys.stdin.read()))


if __name__ == "__main__":
    q = tshm.Queue()
    mp.Process(target=int).start()      # takes the counter's 1
    tshm.torch.spawn(who, args=(q,), nprocs=2, start_method=sys.argv[1],
                     daemon=sys.argv[1] == "fork")
    for got in sorted(q.get(timeout=60) for _ in range(2)):
        print(*got, sep="|")
    print(os.getpid())
"""


@_HOST_ONLY    # nothing of the module's, and torch imported once more
@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_workers_are_multiprocessing_processes_as_torchs(tmp_path, method):
    """In a worker, multiprocessing says what it says in torch's (whose
    workers are the start method's Process objects): its name and
    identity from the caller's counter, already while the main module is
    imported again and when the at-fork hooks run, the daemon flag
    spawn() was given (a daemonic worker may not start a set), the
    caller as parent_process(), the start method; and stdin is
    /dev/null: a forked worker used to read the caller's input."""
    script = tmp_path / "who.py"
    script.write_text(_WHO_AM_I)
    out = subprocess.run([sys.executable, str(script), method],
                         input="for the caller\n", capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    *lines, caller = out.stdout.split("\n")[:-1]
    cls = {"fork": "ForkProcess", "spawn": "SpawnProcess",
           "forkserver": "ForkServerProcess"}[method]
    daemon = method == "fork"
    expect = []
    for rank in range(2):
        name = f"{cls}-{rank + 2}"
        imported = "MainProcess" if method == "fork" else name
        expect.append(f"{rank}|{name}|{daemon}|({rank + 2},)|True|{caller}|"
                      f"True|{method}|{imported}|[{name!r}]|"
                      f"{'refused' if daemon else 'ok'}|")
    assert lines == expect


_EXIT_IN_THE_WAIT = """
import atexit, os, signal, sys, threading, time
import tshm.torch

atexit.register(lambda: os.getpid() != int(os.environ["CALLER"]) and
                print("an exit handler ran in a worker", flush=True))


def fn(rank):
    if rank == 0:
        signal.signal(signal.SIGALRM, lambda *a: sys.exit(5))
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        threading.Thread(target=time.sleep, args=(1,)).start()


if __name__ == "__main__":
    os.environ["CALLER"] = str(os.getpid())
    try:
        tshm.torch.spawn(fn, nprocs=2, start_method=sys.argv[1])
    except Exception as e:
        print(type(e).__name__, e.error_index, e.exit_code)
"""


@_HOST_ONLY
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_an_exit_while_waiting_for_threads_runs_no_exit_handler(tmp_path,
                                                                method):
    """sys.exit() in a signal handler while a forked worker waits for its
    threads is exit status 1, as in torch's workers, not an interpreter
    shutdown in the fork running the exit handlers it inherited or
    registered (those of the caller's main module)."""
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_IN_THE_WAIT)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # Python 3.13's wait for threads ignores the handler's exception, as
    # in a plain program and in multiprocessing's children (torch 2.x's
    # Debian runs on it); 3.11's raises it: exit status 1.
    want = {"ProcessExitedException 0 1\n"}
    if sys.version_info >= (3, 12):
        want.add("")
    assert out.stdout in want


def _length(rank, q, blob):
    q.put(len(blob))


@_HOST_ONLY
def test_spawn_payload_survives_short_writes(monkeypatch):
    """One write() moves at most 2 GiB minus a page: a bigger payload
    goes in as many as it takes (here forced short at 1 MiB)."""
    write = os.write

    def short(fd, data):
        return write(fd, memoryview(data)[:1 << 20])

    q = tshm.Queue()
    monkeypatch.setattr(os, "write", short)
    tshm.torch.spawn(_length, args=(q, b"x" * (3 << 20)), nprocs=1)
    monkeypatch.undo()
    assert q.get(timeout=10) == 3 << 20


def test_fork_flushes_the_callers_output_first():
    """Output the caller buffered (stdout a pipe: block-buffered) is
    written once, not once more by every forked worker."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    out = subprocess.run(
        [sys.executable, "-c", "import tshm.torch\n"
         "print('before')\n"
         "tshm.torch.spawn(lambda rank: None, nprocs=3, "
         "start_method='fork')\n"],
        capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "before\n"


def _mp_primitives(rank, simple, queue, lock, event):
    with lock:
        simple.put(rank)
    queue.put(rank)
    if rank == 1:
        event.set()


@pytest.mark.parametrize("method", METHODS)
def test_multiprocessing_primitives_in_args(method):
    """multiprocessing's own primitives in args work in the workers, as
    with torch.multiprocessing.spawn: pickled as multiprocessing pickles
    them for a process it starts, and a Queue's feeder flushed before a
    forked worker leaves."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    simple, queue, event = ctx.SimpleQueue(), ctx.Queue(), ctx.Event()
    tshm.torch.spawn(_mp_primitives, nprocs=2, start_method=method,
                     args=(simple, queue, ctx.Lock(), event))
    assert sorted(simple.get() for _ in range(2)) == [0, 1]
    assert sorted(queue.get(timeout=10) for _ in range(2)) == [0, 1]
    assert event.is_set()
    queue.close()
    queue.join_thread()


FLAGS = textwrap.dedent("""
    import sys, tshm, tshm.torch

    def flags(rank, q):
        q.put((sys.flags.optimize, sys.flags.no_user_site, sys.warnoptions))

    if __name__ == "__main__":
        q = tshm.Queue()
        for method in sys.argv[1:]:
            tshm.torch.spawn(flags, args=(q,), start_method=method)
            print(method, q.get(timeout=60))
""")


@_HOST_ONLY
def test_workers_get_the_interpreters_flags(tmp_path):
    """-O, -s, -W... reach "spawn" workers and the forkserver's zygote,
    as multiprocessing passes them to its spawned children."""
    script = tmp_path / "flags.py"
    script.write_text(FLAGS)
    out = subprocess.run([sys.executable, "-O", "-s", "-W",
                          "ignore::UserWarning", str(script), "spawn",
                          "forkserver"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    want = (1, 1, ["ignore::UserWarning"])
    assert out.stdout == f"spawn {want}\nforkserver {want}\n"


def test_fork_from_threads_at_once():
    """Threads start "fork" sets at once: each set's workers run that
    set's fn, never another thread's (or none)."""
    import threading
    q = tshm.Queue()
    errors = []

    def starter(tag):
        for _ in range(8):
            try:
                tshm.torch.spawn(lambda rank: q.put(tag), nprocs=1,
                                 start_method="fork")
            except Exception as e:
                errors.append(repr(e))

    threads = [threading.Thread(target=starter, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert sorted(q.get(timeout=10) for _ in range(24)) == \
        sorted(list(range(3)) * 8)


PARENT = textwrap.dedent("""
    import os, subprocess, sys, time, tshm.torch
    def sleeper(rank):
        child = subprocess.Popen(["sleep", "600"])     # the worker's own
        # One write: three workers print at once, and under
        # PYTHONUNBUFFERED print() writes its pieces one by one.
        os.write(1, f"worker {os.getpid()} {child.pid}\\n".encode())
        time.sleep(600)
    if __name__ == "__main__":
        tshm.torch.spawn(sleeper, nprocs=3, start_method=sys.argv[1])
""")


@pytest.mark.parametrize("method", METHODS)
def test_workers_never_outlive_a_sigkilled_parent(tmp_path, method):
    """Nor do their own children: with "forkserver" too, where the
    workers' supervisor is a fork of the zygote, which dies with the
    parent."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    p = subprocess.Popen([sys.executable, str(script), method],
                         stdout=subprocess.PIPE)
    pids, seen = [], b""
    try:
        deadline = time.monotonic() + 300
        while len(pids) < 6 and time.monotonic() < deadline:
            # Never block past the deadline on a worker that says nothing;
            # read what is there, not a line: select() does not see the
            # lines a buffered readline() already took in.
            if not select.select([p.stdout], [], [],
                                 deadline - time.monotonic())[0]:
                break
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
            pids = [int(pid)                   # whole lines only
                    for line in seen.split(b"\n")[:-1]
                    if line.startswith(b"worker ")
                    for pid in line.split()[1:]]
        assert len(pids) == 6, (pids, seen)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(w) for w in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(w) for w in pids), \
            [w for w in pids if alive(w)]
    finally:
        for w in pids:
            if alive(w):
                os.kill(w, signal.SIGKILL)
        if p.poll() is None:
            p.kill()


ENV_RACE = textwrap.dedent("""
    import os, threading
    from tshm._tshm import _Procs     # what "spawn" starts its workers with

    def hammer():
        i = 0
        while True:                   # a logger or config thread, say
            os.environ["TSHM_TEST_HAMMER"] = str(i)
            i += 1

    threading.Thread(target=hammer, daemon=True).start()
    for _ in range(150):
        procs = _Procs(["/bin/true"], 2, env={})
        assert procs.join() is None
        procs.close()
    print("done")
""")


def test_spawn_while_another_thread_sets_the_environment():
    """A "spawn" worker is exec'ed from a fork of this threaded process:
    had another thread held glibc's environment lock at the fork, a
    setenv() before the exec would wait for it for ever."""
    out = subprocess.run([sys.executable, "-c", ENV_RACE],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout == "done\n", out.stderr


SIGNALS_IN_LAUNCH = textwrap.dedent("""
    import os, signal, sys, threading, time, tshm.torch

    if __name__ == "__main__":
        log, method, times = sys.argv[1], sys.argv[2], int(sys.argv[3])
    hits = []
    signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    main = threading.get_ident()
    stop = threading.Event()

    def pester():
        while not stop.is_set():
            signal.pthread_kill(main, signal.SIGUSR1)
            time.sleep(0.0005)

    def fn(rank, log):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, b"%d\\n" % rank)
        os.close(fd)

    def main_():
        t = threading.Thread(target=pester)
        t.start()
        try:
            for _ in range(times):
                tshm.torch.spawn(fn, args=(log,), nprocs=4,
                                 start_method=method)
        finally:
            stop.set()
            t.join()
        print(len(hits) > 0)

    if __name__ == "__main__":
        main_()
""")


@pytest.mark.parametrize("method,times", [
    pytest.param("spawn", 3, marks=_HOST_ONLY), ("fork", 10)])
def test_signals_during_the_launch_run_no_worker_twice(tmp_path, method,
                                                       times):
    """A signal whose handler returns (SIGCHLD from a DataLoader's, a
    timer) arrives while a set is being launched: the launch goes on.
    Killing the set and starting it again would run the ranks that had
    started twice."""
    log, script = tmp_path / "ran", tmp_path / "signals.py"
    script.write_text(SIGNALS_IN_LAUNCH)    # "spawn" imports fn from it
    out = subprocess.run([sys.executable, str(script), str(log), method,
                          str(times)],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout == "True\n", out.stderr
    ranks = log.read_text().split()
    assert sorted(ranks) == sorted(["0", "1", "2", "3"] * times)


JOIN_RACE = textwrap.dedent("""
    import threading, time, tshm.torch
    from tshm._tshm import _Procs

    def fn(rank):
        time.sleep(0.02)
        if rank == 1:
            raise SystemExit(2)

    for _ in range(5):
        ctx = tshm.torch.spawn(fn, nprocs=2, join=False, start_method="fork")
        seen = []

        def join():
            try:
                seen.append(ctx.join())
            except Exception as e:
                seen.append(type(e).__name__)

        threads = [threading.Thread(target=join) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "ProcessExitedException" in seen, seen
    procs = _Procs(["/bin/sleep", "60"], 1)
    joiner = threading.Thread(target=procs.join)
    joiner.start()
    time.sleep(0.2)
    try:
        procs.close()
    except RuntimeError as e:
        print(e)
    procs.terminate()
    joiner.join()
    procs.close()
""")


def test_threads_joining_one_set_at_once():
    """Three threads join one set: the one that sees the failure closes
    it, never under another's wait (that crashed the interpreter), and
    _Procs.close() refuses while another thread joins."""
    out = subprocess.run([sys.executable, "-c", JOIN_RACE],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "close() of a process set another thread joins\n"


class _Range(torch.utils.data.Dataset):
    def __init__(self, rank):
        self.rank = rank

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((1000,), float(i + 100 * self.rank))


def _gloo_rank(rank, port, q):
    import torch.distributed as dist
    # torch >= 2.4's TCPStore wants libuv, which Debian's torch lacks.
    os.environ.setdefault("USE_LIBUV", "0")
    from torch.utils.data import DataLoader
    dl = DataLoader(_Range(rank), batch_size=4, num_workers=2,
                    multiprocessing_context=tshm.torch.get_context("fork"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    total = torch.zeros(1, dtype=torch.float64)
    for batch in dl:
        total += batch.sum(dtype=torch.float64)
    dist.all_reduce(total)
    q.put((rank, float(total)))
    dist.destroy_process_group()


@_HOST_ONLY
def test_forkserver_zygote_is_reused_and_workers_are_its_children():
    """The zygote starts once per process and forks every set's workers:
    their parent is a libtshm supervisor whose parent is the zygote, not
    this process."""
    from tshm.torch import _zygote
    pids = []
    for _ in range(2):
        q = tshm.Queue()
        tshm.torch.spawn(_parents, args=(q,), nprocs=2,
                         start_method="forkserver")
        pids += [q.get(timeout=10) for _ in range(2)]
    zygote = _zygote._zygote[1].pids()[0]
    assert all(grand == zygote and sup != os.getpid()
               for sup, grand in pids), (pids, zygote)


def _parents(rank, q):
    sup = os.getppid()
    with open(f"/proc/{sup}/stat") as f:
        grand = int(f.read().split(")")[-1].split()[1])
    q.put((sup, grand))


@_HOST_ONLY
def test_gloo_two_ranks_with_tshm_dataloaders():
    """torch.distributed composes: tshm.torch.spawn starts a 2-rank gloo
    job on localhost whose ranks each iterate a tshm DataLoader and
    all-reduce what they saw."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = tshm.Queue()
    tshm.torch.spawn(_gloo_rank, args=(port, q), nprocs=2)
    got = sorted(q.get(timeout=10) for _ in range(2))
    want = sum(1000.0 * (i + 100 * r) for r in range(2) for i in range(16))
    assert got == [(0, want), (1, want)]
