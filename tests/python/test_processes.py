# SPDX-License-Identifier: GPL-2.0
"""tshm.Queue between processes: every start method, many producers and
consumers, a consumer SIGKILLed while holding arrays, Ctrl-C, fork while
other threads are inside tshm, and many received arrays under a low fd
limit."""

import hashlib
import multiprocessing as mp
import os
import queue
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tshm
from conftest import (IN_VM, backend, memfd_fds, proc_tshm_ids, settle,
                      shmem_kb)

METHODS = ["fork", "spawn", "forkserver"]


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _consumer(q, results):
    while True:
        try:
            item = q.get(timeout=60)
        except tshm.QueueClosed:
            break
        item["payload"][0] += 1  # writable and shared with the sender
        results.put((item["seq"], digest(item["payload"][1:])))


@pytest.mark.parametrize("method", METHODS)
def test_producer_consumer(method):
    ctx = mp.get_context(method)
    q, results = tshm.Queue(maxsize=8), tshm.Queue()
    p = ctx.Process(target=_consumer, args=(q, results))
    p.start()
    sizes = [10, 5000, 1 << 20, 3 << 20]
    sent = {}
    kept = []
    for seq, n in enumerate(sizes):
        a = np.random.default_rng(seq).integers(0, 255, n, dtype=np.uint8)
        sent[seq] = digest(a[1:])
        q.put({"seq": seq, "payload": a})
    seg = tshm.Segment(1 << 20)
    shared = np.frombuffer(seg, dtype=np.uint8)
    shared[:] = 9
    kept.append(shared)
    sent[len(sizes)] = digest(shared[1:])
    q.put({"seq": len(sizes), "payload": shared})  # by reference
    got = dict(results.get(timeout=120) for _ in sent)
    q.close()
    p.join(60)
    assert p.exitcode == 0
    assert got == sent
    assert shared[0] == 10  # the consumer's write reached us


def _producer(q, rank, count):
    rng = np.random.default_rng(rank)
    for seq in range(count):
        n = int(rng.integers(1, 300000))
        a = rng.integers(0, 1 << 30, n, dtype=np.int32)
        q.put({"rank": rank, "seq": seq, "a": a, "sum": digest(a)})


def _checker(q, results):
    while True:
        try:
            m = q.get(timeout=120)
        except tshm.QueueClosed:
            return
        results.put((m["rank"], m["seq"], digest(m["a"]) == m["sum"]))


def test_four_producers_four_consumers():
    method = "fork" if IN_VM else "forkserver"
    ctx = mp.get_context(method)
    q, results = tshm.Queue(maxsize=16), tshm.Queue(maxsize=1024)
    count = 25 if IN_VM else 100
    cons = [ctx.Process(target=_checker, args=(q, results)) for _ in range(4)]
    prods = [ctx.Process(target=_producer, args=(q, r, count))
             for r in range(4)]
    for p in cons + prods:
        p.start()
    seen = [results.get(timeout=300) for _ in range(4 * count)]
    for p in prods:
        p.join(120)
    q.close()
    for p in cons:
        p.join(120)
    assert all(p.exitcode == 0 for p in cons + prods)
    assert all(ok for _, _, ok in seen)
    assert sorted((r, s) for r, s, _ in seen) == \
        [(r, s) for r in range(4) for s in range(count)]


def _holder(q, ready):
    held = [q.get(timeout=60) for _ in range(6)]
    assert all(int(a[0]) == i for i, a in enumerate(held))
    ready.set()
    time.sleep(600)


def test_consumer_sigkilled_while_holding():
    """Nothing outlives its holders: after a consumer holding received
    arrays is SIGKILLed, the sender's waits return, and once the sender
    drops its own references no segment (module: /proc/tshm, Shmem) or
    memfd (fallback) is left."""
    base_fds = memfd_fds()
    base_ids = proc_tshm_ids() if backend() == "kmod" else set()
    base_shmem = shmem_kb() if IN_VM else None
    q, ready = tshm.Queue(), tshm.Event()
    p = mp.get_context("fork").Process(target=_holder, args=(q, ready))
    p.start()
    segs = [tshm.Segment(1 << 20) for _ in range(3)]
    for i in range(6):
        if i < 3:
            a = np.frombuffer(segs[i], dtype=np.uint8)
            a[0] = i
            q.put(a)
            del a
        else:
            q.put(np.full(1 << 20, i, dtype=np.uint8))  # copied
    assert ready.wait(60)
    assert not segs[0].wait_released(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    for s in segs:
        assert s.wait_released(10)
        s.close()
    del q, ready, segs
    assert settle(lambda: memfd_fds() <= base_fds), \
        f"memfds left open: {memfd_fds()} > {base_fds}"
    if backend() == "kmod":
        assert settle(lambda: proc_tshm_ids() <= base_ids), \
            f"segments left in /proc/tshm: {proc_tshm_ids() - base_ids}"
    if IN_VM:
        assert settle(lambda: shmem_kb() <= base_shmem), \
            f"Shmem {shmem_kb()} kB, baseline {base_shmem} kB"


INTERRUPT = textwrap.dedent("""
    import sys, time, tshm
    q = tshm.Queue(maxsize=1)
    what = sys.argv[1]
    if what == "put":
        q.put(0)
    ev = tshm.Event()
    print("ready", flush=True)
    try:
        if what == "get":
            q.get()
        elif what == "put":
            q.put(1)
        else:
            ev.wait()
        print("returned", flush=True)
    except KeyboardInterrupt:
        print("interrupted", time.monotonic(), flush=True)
    # The queue is usable afterwards.
    if what == "put":
        assert q.get(timeout=1) == 0
    q.put("after", timeout=1)
    assert q.get(timeout=1) == "after"
    print("usable", flush=True)
""")


@pytest.mark.parametrize("what", ["get", "put", "event"])
def test_ctrl_c_interrupts_blocking_call(what):
    p = subprocess.Popen([sys.executable, "-c", INTERRUPT, what],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.2)  # let it block
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        out, _ = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("a blocking call ignored SIGINT for 30 s")
    words = out.split()
    assert words[0] == "interrupted", out
    latency = float(words[1]) - t0
    print(f"KeyboardInterrupt {latency * 1000:.1f} ms after SIGINT")
    assert latency < 2.0
    assert "usable" in out and p.returncode == 0


def test_fork_while_threads_inside_tshm():
    """A child forked while other threads sit inside tshm calls (blocked
    in get(), making segments) gets a working library."""
    q = tshm.Queue()
    stop = threading.Event()

    def blocked_getter():
        try:
            q.get(timeout=30)
        except tshm.QueueClosed:
            pass

    def churner():
        while not stop.is_set():
            tshm.Segment(65536).close()
            q2 = tshm.Queue(maxsize=2)
            q2.put(np.zeros(50000))
            q2.get()

    threads = [threading.Thread(target=blocked_getter)] + \
        [threading.Thread(target=churner) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:
                signal.alarm(20)  # a deadlock ends as a failure, not a hang
                q2 = tshm.Queue()
                q2.put(np.arange(100000))
                ok = np.array_equal(q2.get(timeout=5), np.arange(100000))
                s = tshm.Segment(4096)
                s.close()
                os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, \
                f"child status {status:#x}"
    finally:
        stop.set()
        q.close()
        for t in threads:
            t.join(30)


def _keeper(q, results, count):
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))
    kept = []
    try:
        for i in range(count):
            a = q.get(timeout=120)
            kept.append(a)
        ok = all(int(a[0]) == i % 251 and int(a[-1]) == i % 251
                 for i, a in enumerate(kept))
        results.put(("ok" if ok else "corrupt", len(kept)))
    except Exception as e:  # report, then fail
        results.put((repr(e), len(kept)))


def test_keep_2000_arrays_with_128_fds(kmod_only):
    """On the module a received segment is held by its mapping, not an fd:
    a consumer limited to 128 fds keeps 2000 received arrays."""
    count = 2000
    q = tshm.Queue(maxsize=64, oob_threshold=4096)  # each in a segment
    results = tshm.Queue()
    p = mp.get_context("fork").Process(target=_keeper,
                                       args=(q, results, count))
    p.start()
    try:
        for i in range(count):
            q.put(np.full(8192, i % 251, dtype=np.uint8), timeout=60)
    except queue.Full:
        pass  # the consumer stopped taking: its report says why
    status, kept = results.get(timeout=300)
    p.join(60)
    assert (status, kept) == ("ok", count)
