# SPDX-License-Identifier: GPL-2.0
"""tshm.Pool, tshm.Event, tshm.Barrier."""

import multiprocessing as mp
import os
import queue
import time

import numpy as np
import pytest

import tshm


def test_pool_recycles():
    with tshm.Pool(2, 65536, "bufs") as pool:
        assert (pool.count, pool.size, pool.available) == (2, 65536, 2)
        a = pool.get()
        b = pool.get(timeout=1)
        assert a.size == 65536 and a.name == "bufs"
        assert a is not b
        with pytest.raises(tshm.Timeout) as e:
            pool.get(timeout=0.05)
        assert isinstance(e.value, queue.Empty)
        assert isinstance(e.value, TimeoutError)
        a_id = a.id
        a.close()
        c = pool.get(timeout=5)
        assert c.id == a_id
        del b, c


def test_pool_buffer_comes_back_after_receiver():
    q = tshm.Queue()
    with tshm.Pool(1, 65536) as pool:
        buf = pool.get()
        np.frombuffer(buf, dtype=np.uint8)[:] = 7
        q.put(buf)
        buf.close()
        got = q.get()  # this process now holds it as a receiver would
        with pytest.raises(tshm.Timeout):
            pool.get(timeout=0.05)
        del got
        again = pool.get(timeout=5)
        again.close()


@pytest.mark.parametrize("first", ["available", "get"])
def test_pool_buffer_is_back_at_once(first):
    """A buffer every receiver let go is back without a blocking get().

    On the fallback the pool's own copy of the lease peer used to hide it
    from ``available`` and ``get(timeout=0)``.
    """
    q = tshm.Queue()
    with tshm.Pool(1, 4096) as pool:
        for _ in range(2):
            buf = pool.get(timeout=0)
            q.put(buf)
            buf.close()
            pid = os.fork()
            if pid == 0:
                got = q.get(timeout=5)
                got.close()
                os._exit(0)
            assert os.waitpid(pid, 0)[1] == 0
            if first == "available":
                assert pool.available == 1
            again = pool.get(timeout=0)
            assert pool.available == 0
            again.close()


def test_pool_errors():
    with pytest.raises(ValueError):
        tshm.Pool(0, 4096)
    with pytest.raises(ValueError):
        tshm.Pool(1, -1)
    pool = tshm.Pool(1, 4096)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.get()


def test_event_local():
    ev = tshm.Event()
    assert not ev.is_set()
    assert ev.wait(0.01) is False
    ev.set()
    assert ev.is_set() and ev.wait() is True and ev.wait(0) is True
    ev.clear()
    assert not ev.is_set()
    with pytest.raises(ValueError):
        ev.wait(-1)


def _event_child(ev, done):
    ev.wait()
    done.set()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_event_across_processes(method):
    ctx = mp.get_context(method)
    ev, done = tshm.Event(), tshm.Event()
    p = ctx.Process(target=_event_child, args=(ev, done))
    p.start()
    assert not done.wait(0.1)
    ev.set()
    assert done.wait(60)
    p.join(60)
    assert p.exitcode == 0


def _barrier_child(bar, q):
    q.put(bar.wait(60))


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_barrier_across_processes(method):
    ctx = mp.get_context(method)
    bar = tshm.Barrier(3)
    assert bar.parties == 3
    q = tshm.Queue()
    ps = [ctx.Process(target=_barrier_child, args=(bar, q)) for _ in range(2)]
    for p in ps:
        p.start()
    mine = bar.wait(60)
    got = sorted([q.get(timeout=60), q.get(timeout=60), mine])
    assert got == [0, 0, 1]
    for p in ps:
        p.join(60)
        assert p.exitcode == 0


def test_barrier_timeout_withdraws():
    bar = tshm.Barrier(2)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        bar.wait(0.05)
    assert time.monotonic() - t0 >= 0.04
    # The withdrawn arrival does not count: a later pair passes together.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, bytes([bar.wait(10)]))
        os._exit(0)
    mine = bar.wait(10)
    theirs = os.read(r, 1)[0]
    os.waitpid(pid, 0)
    assert sorted([mine, theirs]) == [0, 1]


def test_barrier_bad_parties():
    with pytest.raises(ValueError):
        tshm.Barrier(0)
    with pytest.raises(ValueError):
        tshm.Barrier(70000)
