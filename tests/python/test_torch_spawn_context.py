# SPDX-License-Identifier: GPL-2.0
"""tshm.torch.spawn(join=False)'s ProcessContext is torch's: besides
join() and pids(), its processes (pid, name, daemon, exitcode, sentinel,
is_alive(), join(), terminate(), kill()) and sentinels, for workers that
are not this process's children.

"spawn" and "forkserver" on the host only, as in test_torch_spawn.py."""

import gc
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing import connection

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing import ProcessExitedException  # noqa: E402

import tshm  # noqa: E402
import tshm.torch  # noqa: E402
from conftest import IN_VM  # noqa: E402

_HOST_ONLY = pytest.mark.skipif(
    IN_VM, reason="host only: a spawned worker, or the forkserver's zygote, "
    "imports torch (30 s in the VM)")
METHODS = [pytest.param("spawn", marks=_HOST_ONLY), "fork",
           pytest.param("forkserver", marks=_HOST_ONLY)]
PREFIX = {"spawn": "SpawnProcess-", "fork": "ForkProcess-",
          "forkserver": "ForkServerProcess-"}


def _until_told(rank, q):
    """Rank 0 ends at once; the others run until signalled."""
    q.put(rank)
    if rank:
        time.sleep(600)


def _started(q, n):
    return sorted(q.get(timeout=120) for _ in range(n))


def _wait_for(pred, timeout=60):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("method", METHODS)
def test_processes_as_torchs_until_a_failure(method):
    q = tshm.Queue()
    ctx = tshm.torch.spawn(_until_told, args=(q,), nprocs=3, join=False,
                           start_method=method)
    assert _started(q, 3) == [0, 1, 2]
    procs = ctx.processes
    assert [p.pid for p in procs] == ctx.pids()
    assert all(p.name.startswith(PREFIX[method]) and not p.daemon
               for p in procs), procs
    sentinels = ctx.sentinels
    assert sorted(sentinels.values()) == [0, 1, 2]
    assert {procs[r].sentinel: r for r in range(3)} == sentinels

    # Rank 0 returned: its sentinel is ready, it joins with exit code 0.
    ready = connection.wait(list(sentinels), timeout=60)
    assert ready == [procs[0].sentinel]
    procs[0].join(60)
    assert procs[0].exitcode == 0 and not procs[0].is_alive()
    assert ctx.join(0) is False
    assert procs[0].sentinel not in ctx.sentinels      # as torch's join
    assert [p.is_alive() for p in procs[1:]] == [True, True]
    assert [p.exitcode for p in procs[1:]] == [None, None]
    procs[2].join(0.1)                                 # times out
    assert procs[2].is_alive()
    with pytest.raises(ValueError):                    # as multiprocessing
        procs[2].close()

    # SIGTERM to rank 1 is the set's first failure: rank 2 is terminated.
    procs[1].terminate()
    procs[1].join(60)
    assert procs[1].exitcode == -signal.SIGTERM
    with pytest.raises(ProcessExitedException) as info:
        while not ctx.join(60):
            pass
    assert info.value.error_index == 1
    assert [p.exitcode for p in procs] == [0, -signal.SIGTERM,
                                           -signal.SIGTERM]
    assert not any(p.is_alive() for p in procs)
    assert ctx.sentinels == {}
    procs[2].kill()                                    # gone: nothing
    for p in procs:
        p.close()
    with pytest.raises(ValueError):
        procs[0].sentinel


def _ends(rank, code):
    sys.exit(code if rank == 1 else 0)


@pytest.mark.parametrize("method", METHODS)
def test_processes_of_a_set_that_ended(method):
    """Made after the end; kept after the context is dropped."""
    ctx = tshm.torch.spawn(_ends, args=(0,), nprocs=2, join=False,
                           start_method=method)
    while not ctx.join(60):
        pass
    assert ctx.sentinels == {}
    procs = ctx.processes
    assert [p.exitcode for p in procs] == [0, 0]
    assert connection.wait([p.sentinel for p in procs], timeout=60)
    del ctx
    gc.collect()
    assert [p.exitcode for p in procs] == [0, 0]
    procs[0].join(-1)                  # as multiprocessing: no wait
    assert not procs[1].is_alive()


@pytest.mark.parametrize("method", METHODS)
def test_processes_say_an_exit_status(method):
    ctx = tshm.torch.spawn(_ends, args=(7,), nprocs=2, join=False,
                           start_method=method)
    procs = ctx.processes
    procs[1].join(120)
    assert procs[1].exitcode == 7
    with pytest.raises(ProcessExitedException) as info:
        ctx.join(120)
    assert info.value.exit_code == 7
    assert procs[0].exitcode in (0, -signal.SIGTERM)  # raced its SIGTERM


def _sleeps(rank):
    time.sleep(600)


@pytest.mark.parametrize("method", METHODS)
def test_kill_reaches_the_worker_and_join_accepts_grace_period(method):
    ctx = tshm.torch.spawn(_sleeps, nprocs=2, join=False,
                           start_method=method)
    procs = ctx.processes
    procs[0].kill()
    with pytest.raises(ProcessExitedException) as info:
        ctx.join(120, grace_period=1)
    assert (info.value.error_index, info.value.exit_code) == \
        (0, -signal.SIGKILL)
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGTERM]


def _waits_for_word(rank, q, w, r):
    q.put(rank)
    r.put(rank + w.get(timeout=120))


@pytest.mark.parametrize("method", METHODS)
def test_dropping_the_context_leaves_its_workers_running(method):
    """As torch's (multiprocessing's Process objects): the workers of a
    dropped context run on, and their processes keep saying how they
    ended."""
    q, w, r = tshm.Queue(), tshm.Queue(), tshm.Queue()
    ctx = tshm.torch.spawn(_waits_for_word, args=(q, w, r), nprocs=2,
                           join=False, start_method=method)
    procs = ctx.processes
    assert _started(q, 2) == [0, 1]
    del ctx
    gc.collect()
    assert [p.exitcode for p in procs] == [None, None]
    w.put(10)
    w.put(10)
    assert sorted(r.get(timeout=120) for _ in range(2)) == [10, 11]
    _wait_for(lambda: all(p.exitcode is not None for p in procs), 120)
    assert [p.exitcode for p in procs] == [0, 0]
    tshm.torch.spawn(_ends, args=(0,), nprocs=1, start_method="fork")
    assert not tshm.torch._context._dropped   # closed by the next spawn


@_HOST_ONLY
def test_a_context_in_a_cycle_is_finalized_under_any_lock():
    """The collector may finalize a running context in a reference cycle
    while its thread holds the zygote's lock (in the middle of a request)
    or the reaper's: __del__ takes no lock and asks the zygote nothing;
    and the workers' sentinels it made are closed, not left open."""
    from tshm.torch import _context, _zygote
    tshm.torch.spawn(_ends, args=(0,), start_method="forkserver")  # zygote
    before = set(os.listdir("/proc/self/fd"))
    ctx = tshm.torch.spawn(_sleeps, nprocs=2, join=False,
                           start_method="forkserver")
    pids = ctx.pids()
    assert len(ctx.sentinels) == 2
    ctx.me = ctx
    del ctx
    done = threading.Event()

    def collect():
        with _zygote._lock, _context._reaping:
            gc.collect()
        done.set()

    threading.Thread(target=collect, daemon=True).start()
    assert done.wait(60), "a finalizer waits for a lock its thread holds"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: not any(c._running() for c in _context._dropped))
    _context._reap_orphans()
    assert not _context._dropped
    assert set(os.listdir("/proc/self/fd")) == before


AT_EXIT = textwrap.dedent("""
    import sys, time
    import tshm.torch

    def work(rank, path):
        time.sleep(1)
        open(f"{path}.{rank}", "w").write(str(rank))

    if __name__ == "__main__":
        method, daemon, keep, path = sys.argv[1:]
        ctx = tshm.torch.spawn(work, args=(path,), nprocs=2, join=False,
                               daemon=daemon == "1", start_method=method)
        print(*ctx.pids(), flush=True)
        if keep == "0":
            del ctx
""")


@pytest.mark.skipif(IN_VM, reason="host only: each case a program of its "
                    "own importing torch (30 s in the VM); no module part")
@pytest.mark.parametrize("daemon", [0, 1], ids=["non-daemonic", "daemonic"])
@pytest.mark.parametrize("keep", [1, 0], ids=["held", "dropped"])
@pytest.mark.parametrize("method", METHODS)
def test_the_main_program_ending_waits_for_workers(tmp_path, method, keep,
                                                    daemon):
    """As multiprocessing does for torch's workers at exit: a program that
    ends with workers running waits for them, or terminates them if they
    are daemonic, whether it still holds the context or not."""
    script = tmp_path / "main.py"
    script.write_text(AT_EXIT)
    out = tmp_path / "done"
    r = subprocess.run([sys.executable, str(script), method, str(daemon),
                        str(keep), str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    done = sorted(p.name for p in tmp_path.glob("done.*"))
    assert done == ([] if daemon else ["done.0", "done.1"]), r.stderr
    for pid in map(int, r.stdout.split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("method", METHODS)
def test_sentinels_above_fd_1024(method):
    """is_alive() and join() wait on any fd, not only select()'s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}: no fd above 1024")
    ctx = tshm.torch.spawn(_ends, args=(0,), nprocs=1, join=False,
                           start_method=method)
    held = []
    # The VM's soft limit is 1024: raised for the test, then put back.
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        held.append(null)
        while len(held) < 1100:
            held.append(os.dup(null))
        p = ctx.processes[0]
        assert p.sentinel >= 1024
        p.join(120)
        assert p.exitcode == 0 and not p.is_alive()
        assert ctx.join(120)
    finally:
        for fd in held:
            os.close(fd)
        p = None
        del ctx                       # its sentinel: above the soft limit
        gc.collect()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _exit_at_once(rank):
    pass


def test_terminate_as_a_worker_ends_is_quiet():
    """terminate() first thing, racing the worker's exit: never an error
    (the worker may be reaped as its sentinel is opened)."""
    for _ in range(10):
        ctx = tshm.torch.spawn(_exit_at_once, nprocs=4, join=False,
                               start_method="fork")
        for p in ctx.processes:
            p.terminate()
        try:
            ctx.join(120)
        except ProcessExitedException:
            pass                          # the SIGTERM came first
        assert all(p.exitcode in (0, -signal.SIGTERM)
                   for p in ctx.processes)


def _one_fails_one_holds_on(rank, q):
    if rank == 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        q.put("ignoring")
        time.sleep(600)
    q.get(timeout=120)
    sys.exit(3)


class _Alarm(Exception):
    pass


def _raise_alarm(signo, frame):
    raise _Alarm()


def test_an_interrupted_join_loses_no_exit_code():
    """A signal handler raising while join() waits out the others' grace
    period: the exit codes stay known (they were lost with the set)."""
    q = tshm.Queue()
    ctx = tshm.torch.spawn(_one_fails_one_holds_on, args=(q,), nprocs=2,
                           join=False, start_method="fork")
    procs = ctx.processes
    old = signal.signal(signal.SIGALRM, _raise_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(_Alarm):
            ctx.join()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    with pytest.raises(ProcessExitedException) as info:
        ctx.join(120)
    assert info.value.exit_code == 3
    procs[1].join(120)
    assert [p.exitcode for p in procs] == [3, -signal.SIGKILL]


JOIN_STORM = textwrap.dedent("""
    import signal, sys, time
    import tshm.torch

    class Alarm(Exception):
        pass

    armed = False

    def alarm(signo, frame):
        if armed:
            raise Alarm

    def work(rank):
        time.sleep(1)

    if __name__ == "__main__":
        ctx = tshm.torch.spawn(work, nprocs=1, join=False,
                               start_method="fork")
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
        stop, raised = time.monotonic() + 2, 0
        while time.monotonic() < stop:
            try:
                # Armed only inside the try: the handler raises
                # wherever join() is, never out of this loop.
                armed = True
                ctx.join(0.001)
                armed = False
            except Alarm:
                armed = False
                raised += 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        print(raised > 100, ctx.join(10), flush=True)
""")


@pytest.mark.skipif(IN_VM, reason="host only: a program of its own "
                    "importing torch (30 s in the VM)")
def test_a_join_interrupted_anywhere_leaves_no_lock_held(tmp_path):
    """A signal handler raising thousands of times, at whatever point of
    join() it is (Ctrl-C in CI once came between the acquire of the
    joiners' lock and its try): later joins, and the one at exit, still
    see the set end (the lock was left held, and both waited for ever)."""
    script = tmp_path / "storm.py"
    script.write_text(JOIN_STORM)
    res = subprocess.run([sys.executable, str(script)], capture_output=True,
                         text=True, timeout=90)
    assert (res.returncode, res.stdout) == (0, "True True\n"), res.stderr


def _sleep_3(rank):
    # Long enough that the alarm at 0.2 s comes during the join, even in
    # the emulated VM.
    time.sleep(3)


def test_a_join_from_a_handler_that_interrupted_a_join():
    """A join from a signal handler that interrupted this thread's join
    times out at once, or without a timeout raises (it waited for ever);
    another thread's join times out while this one's runs, takes nothing
    from it, and sees the end after."""
    ctx = tshm.torch.spawn(_sleep_3, nprocs=1, join=False,
                           start_method="fork")
    seen = []

    def alarm(signo, frame):
        seen.append(ctx.join(0))
        try:
            ctx.join()
        except RuntimeError as e:
            seen.append(str(e))
        other = []
        t = threading.Thread(target=lambda: other.append(ctx.join(0.05)))
        t.start()
        t.join()
        seen.extend(other)

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        assert ctx.join() is True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert seen[0] is False and seen[2] is False, seen
    assert "interrupted its join in the same thread" in seen[1]
    got = []
    t = threading.Thread(target=lambda: got.append(ctx.join(1)))
    t.start()
    t.join()
    assert got == [True]
