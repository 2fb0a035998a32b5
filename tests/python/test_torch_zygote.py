# SPDX-License-Identifier: GPL-2.0
"""tshm.torch.spawn(start_method="forkserver"): the zygote's failures.

A zygote that dies (SIGKILL, SIGINT) is replaced on the next spawn; one
lost in the middle of a join is torch's ProcessExitedException; a bad
request gets an error, not a dead zygote; a fork while another thread
talks to the zygote leaves the child a working forkserver; the workers
get the caller's environment at each spawn(), not the zygote's; a caller
that found tshm through sys.path gets a zygote that finds it too, and a
zygote that cannot come up is a clear error with what it printed.

Host only: the zygote is a fresh interpreter importing torch (half a
minute in the emulated VM)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

torch = pytest.importorskip("torch")
from torch.multiprocessing import ProcessExitedException  # noqa: E402

import tshm  # noqa: E402
import tshm.torch  # noqa: E402
from tshm.torch import _zygote  # noqa: E402
from conftest import IN_VM  # noqa: E402

pytestmark = pytest.mark.skipif(
    IN_VM, reason="host only: the forkserver's zygote imports torch "
    "(30 s in the VM)")


def _noop(rank):
    pass


def _sleep(rank):
    time.sleep(600)


def _zygote_pid():
    tshm.torch.spawn(_noop, start_method="forkserver")
    return _zygote._zygote[1].pids()[0]


def _gone(pid, timeout=10):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            # Reaped before open(), or between open() and read() (ESRCH).
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_dead_zygote_is_replaced(sig):
    """SIGKILL kills the zygote: the next spawn starts a new one.  SIGINT
    (kill -INT, a scheduler signalling every process) is ignored."""
    first = _zygote_pid()
    os.kill(first, sig)
    if sig == signal.SIGKILL:
        assert _gone(first)
    else:
        time.sleep(0.5)
    for _ in range(2):
        tshm.torch.spawn(_noop, start_method="forkserver")
    second = _zygote._zygote[1].pids()[0]
    assert (second != first) == (sig == signal.SIGKILL)


def test_zygote_lost_mid_join_is_process_exited():
    first = _zygote_pid()
    ctx = tshm.torch.spawn(_sleep, nprocs=2, start_method="forkserver",
                           join=False)
    pids = ctx.pids()
    os.kill(first, signal.SIGKILL)
    with pytest.raises(ProcessExitedException) as info:
        while not ctx.join(60):
            pass
    assert "forkserver" in str(info.value)
    assert info.value.signal_name == "SIGKILL"
    assert all(_gone(p) for p in pids)       # they die with their zygote
    tshm.torch.spawn(_noop, start_method="forkserver")


def test_every_set_of_a_dead_zygote_is_lost():
    """Each set belongs to the zygote that started it: once that one died,
    a new zygote (started for another spawn) does not know the set, and
    joining or closing it starts none."""
    first = _zygote_pid()
    sets = [tshm.torch.spawn(_sleep, nprocs=1, start_method="forkserver",
                             join=False) for _ in range(2)]
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    second = _zygote_pid()
    assert second != first
    for ctx in sets:
        with pytest.raises(ProcessExitedException, match="forkserver"):
            ctx.join(60)
    del sets, ctx
    assert _zygote._zygote[1].pids()[0] == second


def test_a_bad_request_is_an_error_not_a_dead_zygote():
    first = _zygote_pid()
    with pytest.raises(RuntimeError, match="forkserver"):
        _zygote._ask(("no such request",))
    tshm.torch.spawn(_noop, start_method="forkserver")
    assert _zygote._zygote[1].pids()[0] == first


def test_an_interrupted_request_leaves_no_reply_behind():
    """Ctrl-C between a request and its reply (in the middle of a join,
    say): the reply must not be taken for the next request's."""
    _zygote_pid()
    conn = _zygote._zygote[2]

    def interrupted():
        del conn.recv                   # once
        raise KeyboardInterrupt

    conn.recv = interrupted
    with pytest.raises(KeyboardInterrupt):
        _zygote._ask(("join", -1, 0))
    ctx = tshm.torch.spawn(_noop, nprocs=2, start_method="forkserver",
                           join=False)
    assert all(isinstance(pid, int) and pid > 0 for pid in ctx.pids()), \
        ctx.pids()
    assert ctx.join(60)


def test_ctrl_c_taken_by_another_thread_keeps_the_zygote():
    """Python runs a SIGINT handler in the main thread whichever thread
    the kernel gave the signal to (torch's threads, in a torch program):
    a flood of them at a joining caller, each given to another thread,
    interrupts its joins but never a message, so the zygote and its set
    live on."""
    ctx = tshm.torch.spawn(_sleep, nprocs=1, join=False,
                           start_method="forkserver")
    life = _zygote._zygote[3]
    armed = threading.Event()
    stop = threading.Event()

    def handler(signo, frame):
        # Only in the library: in this test's own lines it would stop
        # the test, not a join.
        if armed.is_set() and frame.f_code.co_filename != __file__:
            raise KeyboardInterrupt

    def flood():
        me = threading.get_ident()
        while not stop.is_set():
            signal.pthread_kill(me, signal.SIGINT)
            time.sleep(0.0002)

    old = signal.signal(signal.SIGINT, handler)
    thread = threading.Thread(target=flood)
    interrupts = 0
    try:
        thread.start()
        armed.set()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                assert not ctx.join(0.05)
            except KeyboardInterrupt:
                interrupts += 1
            assert _zygote._zygote is not None and \
                _zygote._zygote[3] is life, \
                f"zygote lost after {interrupts} interrupts"
    finally:
        armed.clear()
        stop.set()
        thread.join()
        signal.signal(signal.SIGINT, old)
    assert interrupts > 0
    assert _zygote._zygote[3] is life
    for p in ctx.processes:
        p.kill()
    with pytest.raises(ProcessExitedException):
        ctx.join(60)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_a_fork_meanwhile_keeps_the_callers_sigint_handler():
    """While the main thread talks to the zygote its SIGINT handler is
    one that defers the signal: a process another thread forks meanwhile
    (a fork worker, a DataLoader's) gets the caller's back, or Ctrl-C
    would never stop it."""
    ctx = tshm.torch.spawn(_sleep, nprocs=1, join=False,
                           start_method="forkserver")
    mine = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    counts = [0, 0]

    def forker():
        while not stop.is_set():
            pid = os.fork()
            if pid == 0:
                os._exit(0 if signal.getsignal(signal.SIGINT) is mine
                         else 7)
            _, status = os.waitpid(pid, 0)
            counts[os.waitstatus_to_exitcode(status) == 7] += 1

    thread = threading.Thread(target=forker)
    thread.start()
    try:
        end = time.monotonic() + 5
        while time.monotonic() < end:
            assert not ctx.join(0.001)
    finally:
        stop.set()
        thread.join()
    assert counts[0] > 0
    assert counts[1] == 0, f"{counts[1]} of {sum(counts)} forks"
    assert signal.getsignal(signal.SIGINT) is mine
    for p in ctx.processes:
        p.kill()
    with pytest.raises(ProcessExitedException):
        ctx.join(60)


def test_ctrl_c_interrupts_a_wait_for_another_threads_request():
    """While another thread talks to the zygote (a close's grace period,
    a long start-up), the main thread waits for the lock: Ctrl-C there
    raises at once, not once the other request is done."""
    ctx = tshm.torch.spawn(_sleep, nprocs=1, join=False,
                           start_method="forkserver")
    held, release, freed = (threading.Event(), threading.Event(),
                            threading.Event())

    def hold():
        with _zygote._lock:
            held.set()
            release.wait(20)
        freed.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            ctx.join()
        assert not freed.is_set(), "raised only once the lock was free"
    finally:
        release.set()
        holder.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    for p in ctx.processes:
        p.kill()
    with pytest.raises(ProcessExitedException):
        ctx.join(60)


@pytest.mark.parametrize("mine", ["python", "SIG_IGN", "SIG_DFL"])
def test_a_deferring_handler_left_behind_is_undone(mine):
    """A handler of another signal that raises at every turn can break
    off the restore of the caller's SIGINT handler: the next request puts
    it back, or Ctrl-C would never raise again.  SIG_IGN and SIG_DFL:
    install() never wraps them, but one made by hand over them (this
    test's, in a suite started with SIGINT ignored) is undone too."""
    _zygote_pid()
    before = signal.getsignal(signal.SIGINT)
    mine = before if mine == "python" else getattr(signal, mine)
    signal.signal(signal.SIGINT, _zygote._DeferredSigint(mine))
    try:
        ctx = tshm.torch.spawn(_noop, nprocs=1, start_method="forkserver",
                               join=False)
        assert ctx.join(60)
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)


HANDLER_USES_THE_SET = textwrap.dedent("""
    import os, signal, threading, time
    import tshm.torch

    def sleeper(rank):
        time.sleep(60)

    if __name__ == "__main__":
        ctx = tshm.torch.spawn(sleeper, nprocs=2, join=False,
                               start_method="forkserver")

        def handler(signo, frame):
            for p in ctx.processes:
                p.terminate()
            print("handler ran", flush=True)

        signal.signal(signal.SIGINT, handler)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            ctx.join()
        except Exception as e:
            print(type(e).__name__, flush=True)
""")


def test_a_sigint_handler_may_use_the_sets(tmp_path):
    """The caller's SIGINT handler runs with the zygote's lock released:
    one that terminates a forkserver set's workers (a common Ctrl-C
    handler) does, and the join sees them end.  It ran in the middle of
    the join's request, and waited for the lock its own thread held."""
    script = tmp_path / "handler.py"
    script.write_text(HANDLER_USES_THE_SET)
    r = subprocess.run([sys.executable, str(script)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "handler ran\nProcessExitedException\n", r.stderr


def test_fork_while_the_zygote_lock_is_held():
    """Another thread is talking to the zygote (it holds the lock) when
    this one forks: the child starts a zygote of its own, and leaves
    this one's alone."""
    first = _zygote_pid()
    with _zygote._lock:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(120)
                tshm.torch.spawn(_noop, start_method="forkserver")
                code = 0
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _zygote_pid() == first


def _env(rank, q):
    q.put((os.environ.get("TSHM_TEST_ENV"),
           os.environ.get("OMP_NUM_THREADS"), os.getcwd()))


def test_workers_get_the_callers_environment_at_each_spawn(monkeypatch,
                                                           tmp_path):
    monkeypatch.setenv("TSHM_TEST_ENV", "first")
    _zygote_pid()                                # started with "first"
    monkeypatch.setenv("TSHM_TEST_ENV", "second")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.chdir(tmp_path)
    q = tshm.Queue()
    tshm.torch.spawn(_env, args=(q,), nprocs=2, start_method="forkserver")
    budget = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert [q.get(timeout=10) for _ in range(2)] == \
        [("second", budget, str(tmp_path))] * 2


SYS_PATH_SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[1])         # tshm, not on PYTHONPATH
    import tshm.torch

    def fn(rank):
        pass

    if __name__ == "__main__":
        if sys.argv[2] == "broken":
            # The zygote finds this torch first: it cannot come up.
            sys.path.insert(0, sys.argv[3])
        try:
            tshm.torch.spawn(fn, nprocs=1, start_method="forkserver")
            print("spawn ok")
        except RuntimeError as e:
            print("RuntimeError:", e)
""")


@pytest.mark.parametrize("mode", ["ok", "broken"])
def test_zygote_finds_tshm_through_the_callers_sys_path(mode, tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(SYS_PATH_SCRIPT)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "torch.py").write_text(
        "raise ImportError('planted torch refuses to load')\n")
    package_dir = os.path.dirname(os.path.dirname(tshm.__file__))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, str(script),
                          os.path.abspath(package_dir), mode, str(planted)],
                         capture_output=True, text=True, timeout=600,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    if mode == "ok":
        assert out.stdout == "spawn ok\n", out.stdout + out.stderr
    else:
        assert out.stdout.startswith("RuntimeError:"), out.stdout
        assert "did not come up" in out.stdout
        assert "planted torch refuses to load" in out.stdout


def test_the_zygote_dies_with_a_sigkilled_caller():
    """The zygote is the caller's, not a daemon: a caller SIGKILLed (no
    exit handler runs) takes it along."""
    code = textwrap.dedent("""
        import time, tshm.torch
        from tshm.torch import _zygote
        tshm.torch.spawn(time.sleep, start_method="forkserver")  # sleep(0)
        print(_zygote._zygote[1].pids()[0], flush=True)
        time.sleep(600)
    """)
    caller = subprocess.Popen([sys.executable, "-c", code],
                              stdout=subprocess.PIPE, text=True)
    try:
        zygote = int(caller.stdout.readline())
        assert not _gone(zygote, timeout=0.5)
        caller.kill()
        caller.wait()
        assert _gone(zygote, timeout=30)
    finally:
        caller.kill()
        caller.wait()
        caller.stdout.close()
