# SPDX-License-Identifier: GPL-2.0
"""tshm.torch.cuda: torch tensors over tshm GPU buffers.

Two halves:

* on a GPU (torch.cuda.is_available() and a driver libtshm-cuda opens):
  CUDA tensors between processes, stream order both ways, a producer that
  exits after the put, a consumer SIGKILLed while it holds the memory.
  Skipped with the reason elsewhere; bench/cuda-torch.py and the device
  tool run them where a GPU is lent;
* everywhere the C suite's fake driver is built: the same code paths with
  tensors on the CPU over the fake driver's "device memory" (host memory),
  through tshm.torch.cuda._HostMemory, the one piece that differs (it
  builds CPU tensors and orders nothing, there being no streams).  That
  proves the buffers, the reducer, the wire through torch queues, the
  geometry of every dtype and the release logic; nothing about CUDA.

Each scenario runs in fresh processes: a CUDA context does not survive
fork(), and libtshm-cuda opens its driver once per process."""

import functools
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tshm.cuda  # noqa: E402
from conftest import IN_VM  # noqa: E402
from test_cuda import FAKE, run_python  # noqa: E402

needs_fake = pytest.mark.skipif(
    tshm.cuda.Device is None or not FAKE.exists() or IN_VM,
    reason="no fake CUDA driver built (nvcc missing), or in the VM, where "
    "each scenario's `import torch` takes half a minute (test_cuda.py runs "
    "the buffers on the module)")


@functools.lru_cache(maxsize=None)
def _gpu_reason():
    """Why the GPU half cannot run here, or None.  Asked in a child: a
    CUDA context in pytest's own process would make every later fork in
    this session a fork of a CUDA process."""
    if tshm.cuda.Device is None:
        return "tshm built without the CUDA toolkit"
    p = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import torch, tshm.cuda
        if not torch.cuda.is_available():
            print("no CUDA device (torch.cuda.is_available() is False)")
        elif not tshm.cuda.available():
            print("libtshm-cuda cannot open device 0")
        """)], capture_output=True, text=True, timeout=300)
    if p.returncode:
        return f"cannot ask for a GPU: {p.stderr.strip()[-200:]}"
    return p.stdout.strip() or None


needs_gpu = pytest.mark.skipif(_gpu_reason() is not None,
                               reason=_gpu_reason() or "")

PRELUDE = """
import errno, os, signal, sys, time
import torch
import tshm, tshm.cuda as tc, tshm.torch, tshm.torch.cuda as ttc
ctx = tshm.torch.get_context("fork")

def child(fn, *args):
    p = ctx.Process(target=fn, args=args)
    p.start()
    return p

# A child running fn once its CUDA is up (it says so on r): its first
# kernel does not wait for a context or a module load.
def forked_warm(fn, r):
    def warm():
        torch.zeros(1, device="cuda:0").sum().item()
        r.put("ready")
        fn()
    p = child(warm)
    assert r.get(timeout=120) == "ready"
    return p
"""

HOST = "ttc._streams = ttc._HostMemory()\n"


def run(code, fake, timeout=240):
    """Run code (after PRELUDE) in a new python3, on the fake driver if
    fake; its stdout."""
    if fake:
        return run_python(PRELUDE + HOST + textwrap.dedent(code),
                          fake=True, timeout=timeout)
    return run_python(PRELUDE + textwrap.dedent(code), fake=False,
                      timeout=timeout)


# -- on the fake driver: CPU tensors over its host "device memory" -------


@needs_fake
def test_empty_geometry_of_every_dtype():
    run("""
        dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16,
                  torch.int32, torch.int64, torch.float16, torch.bfloat16,
                  torch.float32, torch.float64, torch.complex32,
                  torch.complex64, torch.complex128]
        g = tc.device(0).granularity
        for dt in dtypes:
            for shape in [(3, 5), 7, (), (0, 4), (3, 0, 4), (2, 3, 4)]:
                t = ttc.empty(shape, dtype=dt, device=0)
                want = torch.empty(shape, dtype=dt)
                assert (t.shape, t.dtype, t.stride()) == \\
                    (want.shape, dt, want.stride()), (dt, shape)
                buf = ttc.buffer(t)
                nbytes = t.numel() * t.element_size()
                assert buf is not None and buf.producer
                assert buf.size % g == 0 and buf.size >= max(nbytes, 1)
                assert t.numel() == 0 or t.data_ptr() == buf.ptr
                t.view(-1).view(torch.uint8).fill_(1) if nbytes and \
                    t.element_size() == 1 else None
        assert torch.get_default_dtype() == ttc.empty(2).dtype
        t = ttc.empty((2, 2), requires_grad=True)
        assert t.requires_grad and t.is_leaf
        for bad in [(-1, 2)]:
            try:
                ttc.empty(bad)
            except ValueError:
                pass
            else:
                raise AssertionError(bad)
        plain = torch.ones(4)
        assert ttc.buffer(plain) is None
        try:
            ttc.wait_released(plain)
        except ValueError as e:
            assert "tshm GPU buffer" in str(e)
        else:
            raise AssertionError("wait_released of a plain tensor")
        # Only a tshm.Queue carries the buffer: any other pickler is told.
        from multiprocessing.reduction import ForkingPickler
        try:
            ForkingPickler.dumps(ttc.empty(4))
        except TypeError as e:
            assert "only in a tshm.Queue" in str(e)
        else:
            raise AssertionError("a GPU tensor pickled without its buffer")
        # The real half refuses a CPU device, with the reason.
        try:
            ttc._Streams().ordinal("cpu")
        except ValueError as e:
            assert "CUDA tensors" in str(e)
        else:
            raise AssertionError("a CPU device accepted")
        print("ok")
        """, fake=True)


@needs_fake
def test_views_travel_and_share_memory():
    out = run("""
        t = ttc.empty((6, 8), dtype=torch.float32, device=0)
        t.copy_(torch.arange(48, dtype=torch.float32).view(6, 8))
        q, r = ctx.Queue(), ctx.Queue()

        def consumer():
            for _ in range(3):
                x = q.get(timeout=30)
                seen = x.tolist()
                x.mul_(-1)           # the producer sees it: no copy
                r.put((tuple(x.shape), x.stride(), x.storage_offset(),
                       seen, ttc.buffer(x).producer))
                del x
            # A received tensor cannot be sent on: clear error, nothing
            # queued.
            y = q.get(timeout=30)
            try:
                r.put(y)
            except OSError as e:
                r.put(("refused", e.errno))
            else:
                r.put("forwarded")

        p = child(consumer)
        for v in [t, t[1:4, ::3], t.t()]:
            before = v.clone()
            q.put(v)
            shape, stride, off, seen, producer = r.get(timeout=30)
            assert (shape, stride, off) == \
                (tuple(v.shape), v.stride(), v.storage_offset())
            assert seen == before.tolist() and not producer
            assert torch.equal(v, -before)
        q.put(t)
        assert r.get(timeout=30) == ("refused", errno.EOPNOTSUPP)
        assert r.empty() and q.empty()
        p.join(30)
        assert p.exitcode == 0
        assert ttc.wait_released(t, timeout=30)
        print("shared", float(t[0, 1]))
        """, fake=True)
    assert "shared" in out


@needs_fake
def test_gpu_tensors_a_message_carries():
    run("""
        q = ctx.Queue()
        own = [ttc.empty(4, device=0) for _ in range(4)]
        q.put(own[:3])                 # 3 allocations: 6 segments
        try:
            q.put(own)                 # 4: 8, one more than room
        except ValueError as e:
            assert "each GPU buffer two" in str(e), e
        else:
            raise AssertionError("4 GPU allocations in one message")
        dev = tc.device(0)
        pool = dev.pool(6, 4096)
        pooled = [ttc.empty(16, device=0, pool=pool) for _ in range(6)]
        q.put(pooled)                  # 6 leases and one shared anchor
        got = q.get(timeout=30)
        assert len(got) == 3
        got = q.get(timeout=30)
        assert len(got) == 6 and q.empty()
        print("ok")
        """, fake=True)


STUB_STREAMS = """
import threading
gate = threading.Event()        # the stand-in GPU work completes when set
log = []


class StubStream:
    def __init__(self, name):
        self.name = name

    def synchronize(self):
        log.append(("sync", self.name))


class StubEvent:
    failures = 0                # how many synchronize() calls fail first

    def record(self, stream):
        self.stream = stream
        log.append(("record", stream.name))

    def synchronize(self):
        if StubEvent.failures:
            StubEvent.failures -= 1
            raise RuntimeError("stand-in CUDA error")
        gate.wait()


class StubStreams(ttc._Streams):
    # The real _Streams with its four CUDA calls stood in for, over CPU
    # tensors: the releaser, drain(), record_stream() and the put's wait
    # run as shipped.
    dl_device = ttc._DL_CPU
    ordinal = ttc._HostMemory.ordinal
    torch_device = ttc._HostMemory.torch_device

    def current_stream(self, ordinal):
        return StubStream("current")

    def new_event(self):
        return StubEvent()

    def capturing(self, streams):
        return False


ttc._streams = StubStreams()
"""


@needs_fake
def test_release_waits_for_the_work_queued_on_the_buffer():
    run(STUB_STREAMS + textwrap.dedent("""
        q, r, go = ctx.Queue(), ctx.Queue(), ctx.Queue()

        def consumer():
            x = q.get(timeout=30)
            ttc.record_stream(x, StubStream("side"))
            del x                      # work still "running": kept
            r.put(sorted(log))
            go.get(timeout=30)
            gate.set()                 # the work completes: released
            y = q.get(timeout=30)
            StubEvent.failures = 1     # a failed sync is retried, the
            gate.clear()               # buffer not closed meanwhile
            del y
            r.put("dropped")
            go.get(timeout=30)
            gate.set()
            z = q.get(timeout=30)
            gate.clear()
            del z
            r.put("exiting")
            timer = threading.Timer(2.0, gate.set)
            timer.daemon = True        # exit does not wait for it
            timer.start()
            # Returns: multiprocessing's exit drains the releaser, which
            # waits for the gate before the process goes.

        p = child(consumer)
        t = ttc.empty(1024, dtype=torch.uint8, device=0)
        ttc.record_stream(t, StubStream("producer-side"))
        del log[:]
        q.put(t)                       # waits for both streams' work
        assert sorted(log) == [("sync", "current"),
                               ("sync", "producer-side")], log
        assert r.get(timeout=30) == [("record", "current"),
                                     ("record", "side")]
        assert not ttc.wait_released(t, timeout=0.5)
        go.put("go")
        assert ttc.wait_released(t, timeout=30)
        q.put(t)
        assert r.get(timeout=30) == "dropped"
        assert not ttc.wait_released(t, timeout=0.5)
        go.put("go")
        assert ttc.wait_released(t, timeout=30)
        q.put(t)
        assert r.get(timeout=30) == "exiting"
        assert not ttc.wait_released(t, timeout=0.5)
        p.join(30)
        assert p.exitcode == 0
        assert ttc.wait_released(t, timeout=0)
        print("ok")
        """), fake=True)


@needs_fake
def test_producer_exits_right_after_put():
    run("""
        q = ctx.Queue()

        def producer():
            t = ttc.empty(1 << 16, dtype=torch.int32, device=0)
            t.copy_(torch.arange(1 << 16, dtype=torch.int32))
            q.put(t)
            os._exit(0)              # no goodbye: the memory lives on

        p = child(producer)
        p.join(30)
        assert p.exitcode == 0
        x = q.get(timeout=30)
        assert torch.equal(x, torch.arange(1 << 16, dtype=torch.int32))
        print("ok")
        """, fake=True)


@needs_fake
def test_killed_consumer_gives_the_buffer_back():
    run("""
        t = ttc.empty(4096, dtype=torch.uint8, device=0)
        t.fill_(9)
        q, r = ctx.Queue(), ctx.Queue()

        def consumer():
            x = q.get(timeout=30)
            r.put(int(x.sum()))
            time.sleep(600)          # holds x until killed

        p = child(consumer)
        q.put(t)
        assert r.get(timeout=30) == 9 * 4096
        assert not ttc.wait_released(t, timeout=0)
        os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert ttc.wait_released(t, timeout=30)
        print("ok")
        """, fake=True)


@needs_fake
def test_pool_buffer_comes_back_for_the_next_tensor():
    run("""
        dev = tc.device(0)
        pool = dev.pool(1, dev.granularity)
        q, r = ctx.Queue(), ctx.Queue()

        def consumer():
            for _ in range(2):
                x = q.get(timeout=30)
                r.put(int(x[0]))
                del x

        p = child(consumer)
        for round in range(2):
            t = ttc.empty(256, dtype=torch.int64, device=0, pool=pool)
            t.fill_(round)
            try:
                ttc.empty(1, device=0, pool=pool, timeout=0)
            except tshm.Timeout:
                pass
            else:
                raise AssertionError("a second buffer from a pool of one")
            q.put(t)
            del t
            assert r.get(timeout=30) == round
            # Back once the consumer let go, no blocking wait needed
            # once it did (the consumer's reply came after its del).
            deadline = time.monotonic() + 30
            while pool.available == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pool.available == 1
        p.join(30)
        assert p.exitcode == 0
        try:
            ttc.empty(dev.granularity + 1, dtype=torch.uint8, device=0,
                      pool=pool)
        except ValueError as e:
            assert "cannot hold" in str(e)
        else:
            raise AssertionError("a tensor bigger than the pool's buffers")
        assert pool.available == 1   # the refused buffer went back
        print("ok")
        """, fake=True)


# -- on a GPU --------------------------------------------------------------


@needs_gpu
def test_gpu_tensor_round_trip_zero_copy():
    run("""
        q, r = ctx.Queue(), ctx.Queue()

        def consumer():
            x = q.get(timeout=60)
            assert x.is_cuda and x.device.index == 0
            r.put(float(x.sum()))
            x.mul_(2)
            torch.cuda.synchronize()
            del x
            r.put("done")

        p = child(consumer)            # forked before this process's CUDA
        t = tshm.torch.cuda.empty((1024, 1024), dtype=torch.float32,
                                  device="cuda:0")
        t.fill_(1.5)
        q.put(t)
        assert r.get(timeout=60) == 1.5 * 1024 * 1024
        assert r.get(timeout=60) == "done"
        assert ttc.wait_released(t, timeout=60)
        assert float(t[0, 0]) == 3.0    # the consumer's kernel, no copy
        p.join(60)
        assert p.exitcode == 0
        print("ok")
        """, fake=False)


# Each of the two order tests runs its scenario twice: as shipped, and
# with the ordering it tests switched off (a control), which must then
# show the race; a control that does not means the test cannot tell.
SLEEP_CYCLES = 5_000_000_000          # a few seconds of one SM's time


@needs_gpu
def test_gpu_receiver_waits_for_the_producers_kernels():
    run(f"""
        q, r = ctx.Queue(), ctx.Queue()
        N = 1 << 24

        def consumer():
            for _ in range(2):
                x = q.get(timeout=120)
                r.put(int(x.sum()))    # reads at once, on its stream

        p = forked_warm(consumer, r)   # before this process's CUDA
        results = []
        for control in (False, True):
            if control:                # the put no longer waits
                ttc._streams.written = lambda ordinal, streams: None
            t = ttc.empty(N, dtype=torch.int64, device=0)
            t.zero_()
            torch.cuda.synchronize()
            torch.cuda._sleep({SLEEP_CYCLES})
            t.fill_(1)                 # queued behind the sleep
            q.put(t)
            results.append(r.get(timeout=120))
            torch.cuda.synchronize()
        p.join(60)
        assert p.exitcode == 0
        assert results[0] == N, results
        assert results[1] != N, ("control saw no race", results)
        print("ok")
        """, fake=False)


@needs_gpu
def test_gpu_buffer_not_reused_under_the_receivers_kernels():
    run(f"""
        q, r = ctx.Queue(), ctx.Queue()
        N = 1 << 24

        def consumer():
            for control in (False, True):
                if control:            # let go at once, not after use
                    ttc._streams.release_after_use = \
                        lambda holder: holder.buf.close()
                x = q.get(timeout=120)
                torch.cuda._sleep({SLEEP_CYCLES})
                copy = x.clone()       # reads x after the sleep
                del x
                r.put("dropped")
                r.put(int(copy.sum()))

        p = forked_warm(consumer, r)
        dev = tc.device(0)
        pool = dev.pool(1, N * 8)
        results = []
        for _ in range(2):
            t = ttc.empty(N, dtype=torch.int64, device=0, pool=pool,
                          timeout=120)
            t.fill_(1)
            q.put(t)
            del t
            assert r.get(timeout=120) == "dropped"
            u = ttc.empty(N, dtype=torch.int64, device=0, pool=pool,
                          timeout=120)      # the same buffer, once back
            u.fill_(2)
            torch.cuda.synchronize()
            del u
            results.append(r.get(timeout=120))
        p.join(60)
        assert p.exitcode == 0
        assert results[0] == N, results         # the clone saw 1s
        assert results[1] != N, ("control saw no race", results)
        print("ok")
        """, fake=False)


@needs_gpu
def test_gpu_producer_exits_and_killed_consumer_frees_memory():
    run("""
        q, r = ctx.Queue(), ctx.Queue()
        SIZE = 256 << 20

        def free_memory():
            # Free device memory with one context (this process's) open.
            r.put(tc.device(0).mem_info()[0])

        def producer():
            t = ttc.empty(SIZE, dtype=torch.uint8, device=0)
            t.fill_(7)
            q.put(t)
            sys.exit(0)                # exits at once, t still alive

        def consumer():
            go.get(timeout=60)         # the producer has exited
            x = q.get(timeout=60)
            r.put(int(x[::4096].sum()))
            time.sleep(600)

        # No CUDA here until every child is forked.
        b = child(free_memory)
        b.join(60)
        before = r.get(timeout=60)
        go = ctx.Queue()
        c = child(consumer)
        p = child(producer)
        p.join(60)
        assert p.exitcode == 0
        go.put("go")
        assert r.get(timeout=60) == 7 * (SIZE // 4096)
        os.kill(c.pid, signal.SIGKILL)
        c.join(60)
        deadline = time.monotonic() + 30     # this context alone again
        while True:
            after = tc.device(0).mem_info()[0]
            if after > before - SIZE // 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert after > before - SIZE // 4, (before, after)
        print("ok")
        """, fake=False)
