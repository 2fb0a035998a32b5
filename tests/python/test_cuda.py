# SPDX-License-Identifier: GPL-2.0
"""tshm.cuda: GPU buffers through tshm.Queue, and the queue's fds.

Without a GPU the buffer tests run against libtshm-cuda's fake driver
(tests/cuda/fake-cuda.c: "device memory" is a memfd mapped in the host,
so a test reads it with ctypes), each scenario in fresh processes that
load it: the library opens its driver once per process.  That proves the
binding, the wire through tshm.Queue, leases and kills; nothing about the
real driver (test_torch_cuda.py runs on a GPU when one is lent)."""

import errno
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import tshm
import tshm.cuda
from tshm import _tshm

BUILD = pathlib.Path(tshm.__file__).resolve().parents[2]
FAKE = BUILD / "tests" / "cuda" / "libfake-cuda.so"

needs_cuda_build = pytest.mark.skipif(
    tshm.cuda.Device is None, reason="tshm built without the CUDA toolkit")
needs_fake = pytest.mark.skipif(
    tshm.cuda.Device is None or not FAKE.exists(),
    reason=f"no fake CUDA driver at {FAKE} (make builds it with nvcc found)")

PRELUDE = """
import ctypes, errno, os, signal, sys, time
import tshm, tshm.cuda as tc

def fill(buf, byte):
    ctypes.memset(buf.ptr, byte, buf.size)   # fake device memory is host's

def check(buf, byte):
    data = ctypes.string_at(buf.ptr, buf.size)
    assert data == bytes([byte]) * buf.size, (data[:8], byte)
"""


def run_python(code, fake, timeout, devices=1):
    """Run code in a new python3, on the fake driver with that many
    devices if fake (each test its own fake device memory); its stdout."""
    env = dict(os.environ)
    if fake:
        env.update(TSHM_CUDA_DRIVER=str(FAKE),
                   TSHM_FAKE_VRAM_TAG=f"py{os.getpid()}",
                   TSHM_FAKE_DEVICES=str(devices))
    p = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def run_fake(code, timeout=120, devices=1):
    """Run code (after PRELUDE) in a new python3 on the fake driver;
    its stdout."""
    return run_python(PRELUDE + textwrap.dedent(code), True, timeout,
                      devices)


# -- the queue's fds -------------------------------------------------------


def test_raw_queue_carries_fds_and_done_closes_them():
    q = _tshm._Queue(4, 256)
    r, w = os.pipe()
    try:
        q.send(b"hi", [], 0, [w])
        os.close(w)               # the message holds the pipe's write end
        w = -1
        data, segs, fds = q.recv(0)
        assert data == b"hi" and segs == () and len(fds) == 1
        os.write(fds[0], b"through the queue")
        assert os.read(r, 100) == b"through the queue"
        assert q.recv(0)[2] == fds   # in hand until done()
        q.done()
        with pytest.raises(OSError) as e:
            os.fstat(fds[0])
        assert e.value.errno == errno.EBADF
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_raw_queue_refuses_bad_fds():
    q = _tshm._Queue(4, 256)
    with pytest.raises(ValueError, match="at most"):
        q.send(b"x", [], 0, [0] * (_tshm.QUEUE_MAX_FDS + 1))
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError) as e:
        q.send(b"x", [], 0, [w])
    assert e.value.errno == errno.EBADF
    assert len(q) == 0           # nothing was sent


# -- without a driver ------------------------------------------------------


@needs_cuda_build
def test_no_driver_says_why():
    env = dict(os.environ, TSHM_CUDA_DRIVER="/nonexistent/libcuda.so.1")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import errno, tshm.cuda as tc
        assert not tc.available()
        try:
            tc.device(0)
        except OSError as e:
            assert e.errno == errno.ENODEV, e
            print(e)
        """)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "/nonexistent/libcuda.so.1" in p.stdout


# -- on the fake driver ----------------------------------------------------


@needs_fake
def test_buffer_through_queue_to_a_child_and_released():
    out = run_fake("""
        dev = tc.device(0)
        q = tshm.Queue(4)
        done = tshm.Queue(4)
        b = dev.alloc(dev.granularity)
        fill(b, 0x5a)
        bid, bsize = b.id, b.size
        pid = os.fork()
        if pid == 0:
            got = q.get(timeout=30)
            r = got["buf"]
            assert not r.producer and r.id == bid and r.size == bsize
            check(r, 0x5a)
            fill(r, 0x33)                      # the same memory
            again = q.get(timeout=30)["buf"]   # re-sent: the cache hits
            st = tc.device(0).stats()
            assert st["imports"] == 1 and st["cache_hits"] >= 1, st
            r.close()
            done.put("read")
            again.close()
            os._exit(0)
        q.put({"buf": b, "tag": 1})
        q.put({"buf": b})
        assert done.get(timeout=30) == "read"
        assert b.wait_released(timeout=30) is True
        check(b, 0x33)
        assert os.waitpid(pid, 0)[1] == 0
        print("released")
        """)
    assert "released" in out


@needs_fake
def test_producer_exits_right_after_sending():
    run_fake("""
        q = tshm.Queue(4)
        pid = os.fork()
        if pid == 0:
            dev = tc.device(0)             # CUDA opened after fork
            b = dev.alloc(dev.granularity)
            fill(b, 0xc3)
            q.put(b)
            b.close()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0  # gone before we receive
        r = q.get(timeout=30)
        check(r, 0xc3)
        r.close()
        """)


@needs_fake
def test_receiver_opens_only_the_buffers_device():
    """With two GPUs, a buffer of device 1 is imported there and device 0
    is never opened: each opened device costs a CUDA context (memory on
    that GPU), which a receiver must not make where it has no use."""
    run_fake("""
        retained = ctypes.CDLL(os.environ["TSHM_CUDA_DRIVER"]) \
            .tshm_fake_retained
        q = tshm.Queue(4)
        pid = os.fork()
        if pid == 0:
            dev = tc.device(1)
            b = dev.alloc(dev.granularity)
            fill(b, 0x17)
            q.put(b)
            b.close()
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        r = q.get(timeout=30)
        assert r.device.ordinal == 1
        check(r, 0x17)
        assert (retained(0), retained(1)) == (0, 1), \
            (retained(0), retained(1))
        r.close()
        """, devices=2)


@needs_fake
def test_sigkilled_consumer_gives_the_buffer_back():
    run_fake("""
        dev = tc.device(0)
        q = tshm.Queue(4)
        ready = tshm.Queue(4)
        b = dev.alloc(dev.granularity)
        pid = os.fork()
        if pid == 0:
            r = q.get(timeout=30)
            ready.put("holding")
            time.sleep(600)
            os._exit(1)
        q.put(b)
        assert ready.get(timeout=30) == "holding"
        assert b.wait_released(timeout=0.2) is False   # held
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert b.wait_released(timeout=30) is True
        """)


@needs_fake
def test_pool_buffer_comes_back_after_the_receiver():
    run_fake("""
        dev = tc.device(0)
        pool = dev.pool(2, 4096)
        q = tshm.Queue(4)
        a = pool.get(timeout=5)
        b = pool.get(timeout=5)
        assert pool.available == 0
        try:
            pool.get(timeout=0.1)
        except tshm.Timeout:
            pass
        else:
            raise AssertionError("a third buffer from a pool of two")
        import threading
        def wait_in_get():
            try:
                pool.get(timeout=3)
            except tshm.Timeout:
                pass
        waiter = threading.Thread(target=wait_in_get)
        waiter.start()
        time.sleep(0.5)
        try:                             # not under a waiting get()
            pool.close()
        except RuntimeError:
            pass
        else:
            raise AssertionError("closed a pool another thread waits on")
        waiter.join()
        fill(a, 1)
        held, release = tshm.Queue(4), tshm.Queue(4)
        pid = os.fork()
        if pid == 0:
            r = q.get(timeout=30)
            check(r, 1)
            held.put("holding")
            release.get(timeout=30)
            r.close()
            os._exit(0)
        q.put(a)
        a.close()
        assert held.get(timeout=30) == "holding"
        assert pool.available == 0       # the receiver still holds it
        release.put("go")
        assert os.waitpid(pid, 0)[1] == 0
        assert pool.available == 1       # a came back, seen at once
        c = pool.get(timeout=0)
        assert c.size == 4096
        b.close(); c.close(); pool.close()
        """)


@needs_fake
def test_receiving_leaves_no_fd_and_pool_buffers_share_one():
    run_fake("""
        dev = tc.device(0)
        pool = dev.pool(8, 4096)
        q = tshm.Queue(4)
        bufs = [pool.get(timeout=5) for _ in range(6)]  # one allocation
        for i, b in enumerate(bufs):
            fill(b, i)
        fds = lambda: len(os.listdir("/proc/self/fd"))
        q.put(bufs)               # 6 buffers, one fd in the message
        q.put(bufs)
        pid = os.fork()
        if pid == 0:
            def receive():
                got = q.get(timeout=30)
                for i, r in enumerate(got):
                    check(r, i)
                    r.close()
            receive()             # opens CUDA, imports the allocation
            before = fds()
            receive()             # the cache: no fd more, none left open
            os._exit(0 if fds() == before else 3)
        assert os.waitpid(pid, 0)[1] == 0
        """)


@needs_fake
def test_misuse_gets_clear_errors():
    run_fake("""
        dev = tc.device(0)
        q = tshm.Queue(4)
        b = dev.alloc(dev.granularity)
        q.put(b)
        r = q.get(timeout=5)
        try:                             # forwarding is not supported
            q.put(r)
        except OSError as e:
            assert e.errno == errno.EOPNOTSUPP, e
        else:
            raise AssertionError("re-sent a received buffer")
        assert len(q._raw) == 0
        try:
            r.wait_released(0)
        except ValueError:
            pass
        else:
            raise AssertionError("receiver waited for release")
        desc, segs, fd = b._pack()
        for bad in (desc[:-1], b"x" * len(desc)):
            try:
                dev.unpack(bad, segs, fd)
            except OSError as e:
                assert e.errno == errno.EBADMSG, e
            else:
                raise AssertionError("unpacked garbage")
        try:
            dev.alloc(dev.granularity + 1)
        except OSError as e:
            assert e.errno == errno.EINVAL and "granularity" in str(e), e
        else:
            raise AssertionError("allocated off the granularity")
        r.close(); r.close()             # idempotent
        try:
            r.ptr
        except ValueError:
            pass
        else:
            raise AssertionError("used a closed buffer")
        pid = os.fork()
        if pid == 0:
            try:
                b.size
            except RuntimeError as e:
                os._exit(0 if "fork" in str(e) else 1)
            os._exit(2)
        assert os.waitpid(pid, 0)[1] == 0
        b.close()
        """)


# -- DLPack ----------------------------------------------------------------


def test_dlpack_capsule_shares_memory_and_keeps_its_owner():
    torch = pytest.importorskip("torch")
    import ctypes
    import gc
    import weakref

    seg = tshm.Segment(4096)
    view = memoryview(seg)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
    owner = tshm.Queue(1)          # any object: the capsule keeps it
    gone = weakref.ref(owner)
    cap = _tshm._dlpack(owner, addr, 1, 0, (4, 8), None, 2, 32)
    del owner
    t = torch.utils.dlpack.from_dlpack(cap)
    assert t.shape == (4, 8) and t.dtype == torch.float32
    t.fill_(2.5)
    assert bytes(view[:4]) == bytes(ctypes.c_float(2.5))   # no copy
    assert gone() is not None
    del cap, t
    gc.collect()
    assert gone() is None          # the tensor let go: so did the capsule
    # A capsule nobody consumed frees itself (and its owner) too.
    owner = tshm.Queue(1)
    gone = weakref.ref(owner)
    _tshm._dlpack(owner, addr, 1, 0, (2,), (1,), 0, 64)
    del owner
    gc.collect()
    assert gone() is None
    with pytest.raises(ValueError):
        _tshm._dlpack(None, addr, 7, 0, (2,), None, 2, 32)
    with pytest.raises(ValueError):
        _tshm._dlpack(None, addr, 1, 0, (2, 3), (1,), 2, 32)
    view.release()
