# SPDX-License-Identifier: GPL-2.0
"""tshm.torch: the "tshm" sharing strategy for torch.multiprocessing.

Strategy switching, every dtype, views, non-contiguous and empty tensors,
re-sending a received tensor, put+get in one process, torch's shared
allocation from tshm segments (small storages sub-allocated), and
DataLoader workers through tshm.torch.get_context() for every start
method.  Skipped where Debian's python3-torch is missing."""

import errno
import gc
import os
import pickle
import queue
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as tmp  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import tshm  # noqa: E402
import tshm.torch  # noqa: E402
from tshm import _tshm  # noqa: E402
from conftest import IN_VM  # noqa: E402

# In the VM (emulated, `import torch` takes half a minute) only fork,
# which starts with torch imported: spawn and forkserver run on the host.
METHODS = ["fork"] if IN_VM else ["fork", "spawn", "forkserver"]

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64, torch.complex32, torch.complex64, torch.complex128]


@pytest.fixture(autouse=True)
def strategy():
    """Every test starts with tshm installed and leaves torch's default."""
    tshm.torch.install()
    yield
    tshm.torch.uninstall()


def untyped(t):
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage()
    return t.storage().untyped()


def segment_of(t):
    s = untyped(t)
    found = _tshm._locate_address(s.data_ptr(), s.nbytes())
    return None if found is None else found[0]


def sample(dtype, n=3000):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 100
    if dtype is torch.bool:
        return x > 0
    if dtype is torch.complex32:
        # complex32 has few kernels in 1.13: build it by a view.
        return x.to(torch.float16).view(torch.complex32)
    return x.to(dtype)


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and \
        a.stride() == b.stride()
    return torch.equal(a.contiguous().view(torch.uint8),
                       b.contiguous().view(torch.uint8))


def test_strategy_switch():
    assert tmp.get_sharing_strategy() == "tshm"
    assert "tshm" in tmp.get_all_sharing_strategies()
    tshm.torch.uninstall()
    assert tmp.get_sharing_strategy() in ("file_descriptor", "file_system")
    assert not tshm.torch.installed()
    tmp.set_sharing_strategy("tshm")
    assert tshm.torch.installed()


def _roundtrip(obj):
    """Pickle and unpickle obj the way a torch.multiprocessing queue does,
    in this process (put+get in one process)."""
    q = tmp.get_context("spawn").SimpleQueue()
    q.put(obj)
    return q.get()


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_in_one_process(dtype):
    x = sample(dtype)
    y = _roundtrip(x)
    assert same(x, y)
    # The sender's tensor was moved into a segment, the receiver maps it.
    seg = segment_of(x)
    assert seg is not None and segment_of(y) is seg
    assert untyped(y).data_ptr() == untyped(x).data_ptr()


def test_views_noncontiguous_empty_parameter():
    base = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    cases = [base[3:17, 5:40], base.t(), base[::3, ::2], base[10],
             torch.empty(0), torch.empty(5, 0, 3), torch.tensor(7.5),
             torch.arange(10)[2:2]]
    for x in cases:
        y = _roundtrip(x)
        assert y.shape == x.shape and y.stride() == x.stride()
        assert y.storage_offset() == x.storage_offset()
        assert torch.equal(x, y)
    p = torch.nn.Parameter(torch.randn(300, 40))
    q = _roundtrip(p)
    assert type(q) is torch.nn.Parameter and q.requires_grad
    assert torch.equal(p.detach(), q.detach())
    with pytest.raises(RuntimeError, match="non-leaf"):
        _roundtrip(p * 2)


def flat_bytes(t):
    """t's values (its lazy bits resolved) as bytes, whatever its shape."""
    t = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return t.view(torch.uint8)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_lone_tensor_goes_packed_and_arrives_as_pickled():
    """A tshm.torch queue sends a message that is one plain tensor without
    pickling it (_reductions.pack_tensor()): it arrives as the same tensor
    in a tuple (pickled) does, over the same memory; a tensor the packed
    form does not carry (a dtype outside it, a Parameter, a non-leaf that
    requires grad, an empty storage) goes pickled, with its errors."""
    from tshm.torch import _reductions
    q = tshm.torch.get_context("fork").SimpleQueue()
    base = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    leaf = torch.randn(5, 7, requires_grad=True)
    cases = [base, base[3:17, 5:40], base.t(), base[::3, ::2], base[10],
             torch.tensor(7.5), torch.empty(5, 0, 3), torch.arange(10)[2:2],
             torch.ones(3, 4).expand(2, 3, 4), leaf,
             torch.tensor([1 + 2j, 3 - 4j]).conj(),
             torch.tensor([1.0, -2.0])._neg_view(),
             torch.arange(7, dtype=torch.uint8)[:6].view(torch.int16)] + \
        [sample(d, 100) for d in DTYPES]
    for x in cases:
        packed = _reductions.pack_tensor(x) is not None
        assert packed == (x.dtype is not torch.complex32 and
                          untyped(x).nbytes() > 0 and
                          untyped(x).nbytes() % x.element_size() == 0), x
        q.put(x)
        got = q.get()
        q.put((x,))
        (pickled,) = q.get()
        for y in (got, pickled):
            assert type(y) is torch.Tensor and y.dtype == x.dtype
            assert y.shape == x.shape and y.stride() == x.stride()
            assert y.storage_offset() == x.storage_offset()
            assert (y.requires_grad, y.is_leaf, y.is_conj(), y.is_neg()) == \
                (x.requires_grad, True, x.is_conj(), x.is_neg())
            assert torch.equal(flat_bytes(x), flat_bytes(y))
            if untyped(x).nbytes():
                assert untyped(y).data_ptr() == untyped(x).data_ptr()
    p = torch.nn.Parameter(torch.randn(3))
    assert _reductions.pack_tensor(p) is None or type(p) is not torch.Tensor
    q.put(p)
    assert type(q.get()) is torch.nn.Parameter
    with pytest.raises(RuntimeError, match="non-leaf"):
        q.put(leaf * 2)
    assert q.empty()


def test_malformed_packed_tensors_are_rejected():
    """A packed tensor's fields come from another process: a bad length,
    dtype, bit, storage outside its segment or geometry outside its
    storage fails that get() (the message is dropped), not the queue."""
    from tshm import _queue
    from tshm.torch import _reductions
    q = tshm.torch.get_context("fork").SimpleQueue()
    raw = q._q._raw
    x = torch.arange(16, dtype=torch.float32)
    payload, segs = _reductions.pack_tensor(x)
    seg = segs[0]
    off = _reductions._PACKED.unpack_from(payload)[0]
    st = _reductions._packed_struct(1)

    def fields(**kw):
        f = dict(off=off, n=64, offset=0, code=0, ndim=1, bits=0,
                 size=16, stride=1)
        f.update(kw)
        return st.pack(*f.values())

    bad = [payload[:-1], payload + bytes(16), fields(code=200),
           fields(bits=8), fields(ndim=2), fields(n=0), fields(n=62),
           fields(off=seg.size - 32), fields(off=2**64 - 8),
           fields(n=2**64 - 64), fields(size=17), fields(offset=1),
           fields(stride=-1), fields(size=2**62), fields(offset=-1),
           fields(bits=1, code=_reductions._PACKED_DTYPES.index("int64"),
                  size=8),
           fields(bits=4, code=_reductions._PACKED_DTYPES.index("bool"),
                  size=64),
           fields(bits=2)]
    for data in bad:
        raw.send(_queue._PACKED_HEADER + data, [seg], -1)
        with pytest.raises(OSError) as e:
            q.get()
        assert e.value.errno == errno.EBADMSG
        assert q.empty()
    raw.send(_queue._PACKED_HEADER + payload, [seg, seg], -1)
    with pytest.raises(OSError):
        q.get()
    raw.send(_queue._PACKED_HEADER + payload, [seg], -1)
    assert torch.equal(q.get(), x)


def test_a_lone_tensor_too_long_to_pack_goes_pickled():
    """A queue with small messages: a lone tensor whose packed form does
    not fit goes pickled (and spilled if needed), as it did before tensors
    were packed; a neg view of an integer tensor, which the packed form
    does not carry, too."""
    from tshm.torch._mpqueue import ForkingQueue
    q = ForkingQueue(4, 128)
    for t in (torch.arange(6.), torch.zeros([1] * 40),
              torch.zeros([1] * 64), torch.arange(5)._neg_view()):
        q.put(t)
        got = q.get()
        assert got.shape == t.shape and got.is_neg() == t.is_neg()
        assert torch.equal(got.resolve_neg(), t.resolve_neg())


def test_pickled_tensor_outside_its_storage_is_refused():
    """A message is another process's: torch 1.13's set_() lets a tensor
    reach past its storage when only its offset differs from the tensor's
    (a frombuffer() tensor of the whole storage given an offset), so
    rebuild_tensor() checks the geometry itself."""
    import pickle
    from tshm.torch import _reductions
    seg = tshm.Segment(4096)
    for meta in ((1, (16,), (1,)), (0, (4, 4), (5, 1)), (0, (2,), (-1,)),
                 (-1, (2,), (1,)), (0, (-1,), (1,))):
        with pytest.raises((pickle.UnpicklingError, RuntimeError)):
            _reductions.rebuild_tensor(None, seg, 64, 64, "float32",
                                       meta + (False, False, False))
    t = _reductions.rebuild_tensor(None, seg, 64, 64, "float32",
                                   (2, (2, 7), (7, 1), False, False, False))
    assert t.shape == (2, 7) and t.storage_offset() == 2


def test_conjugate_and_negative_views_read_the_same_on_both_sides():
    """x.conj() and x._neg_view() are x's memory read through a bit:
    moving one into a segment keeps the bit (the sender's tensor reads
    what it read), and the receiver's tensor carries it too (torch's own
    reducer drops it there).  A named tensor is refused as torch refuses
    it, before anything moves or is queued."""
    q = tshm.torch.get_context("fork").SimpleQueue()
    cases = [torch.tensor([1 + 2j, 3 - 4j]).conj(),
             torch.tensor([1.0, -2.0])._neg_view(),
             torch.tensor([1 + 2j, 5j]).conj()._neg_view()]
    for x in cases:
        want = x.resolve_conj().resolve_neg().clone()
        q.put(x)
        got = q.get()
        for t in (x, got):
            assert torch.equal(t.resolve_conj().resolve_neg(), want)
            assert (t.is_conj(), t.is_neg()) == (x.is_conj(), x.is_neg())
    with pytest.warns(UserWarning, match="Named tensors"):
        named = torch.zeros(3, names=("n",))
    with pytest.raises(RuntimeError, match="Named tensors"):
        q.put(named)
    assert q.empty() and segment_of(named) is None


def test_dtype_view_of_odd_sized_storage():
    """A storage that is not a whole number of the tensor's elements (a
    dtype view of an odd-sized byte storage) arrives: it was put without
    error, and a get() that failed would have dropped the message."""
    odd = [torch.arange(7, dtype=torch.uint8)[:6].view(torch.int16),
           torch.arange(3, dtype=torch.float16)[:2].view(torch.float32)]
    q = tshm.torch.get_context("fork").SimpleQueue()
    for x in odd:
        assert untyped(x).nbytes() % x.element_size() != 0
        for got in (_roundtrip(x), (q.put(x), q.get())[1]):
            assert got.dtype == x.dtype and torch.equal(got, x)
            assert untyped(got).data_ptr() == untyped(x).data_ptr()


def test_sending_keeps_autograd_saved_tensor_usable():
    """Moving a tensor into a segment swaps its storage as share_memory_()
    does: it is not an in-place op, so a tensor autograd saved for
    backward still works afterwards."""
    w = torch.randn(5, requires_grad=True)
    x = torch.randn(5)
    y = (w * x).sum()
    v = x._version
    got = _roundtrip(x)
    assert segment_of(x) is not None and x._version == v
    y.backward()
    assert torch.equal(w.grad, x) and torch.equal(got, x)


def test_storage_by_reference_and_copy():
    s = torch.UntypedStorage._new_shared(1 << 20)
    assert s.is_shared() and segment_of(torch.empty(0).set_(s)) is not None
    r = _roundtrip(s)
    assert r.data_ptr() == s.data_ptr()        # same pages, no copy
    plain = torch.UntypedStorage(1000)
    c = _roundtrip(plain)
    assert c.data_ptr() != plain.data_ptr() and c.nbytes() == 1000


def test_share_memory_and_new_shared():
    x = torch.randn(100, 100)
    assert not x.is_shared()
    x.share_memory_()
    assert x.is_shared() and segment_of(x) is not None
    # torch's TypedStorage path, used by DataLoader's collate:
    st = x.storage()._new_shared(10)
    assert st.is_shared() and st.size() == 10


def test_small_storages_share_an_arena():
    tshm.torch._alloc.retire_current()   # an arena no test sent yet
    small = [torch.UntypedStorage._new_shared(n)
             for n in (1, 100, 4096, 5000, tshm.torch.SMALL_MAX)]
    segs = {id(_tshm._locate_address(s.data_ptr(), s.nbytes())[0])
            for s in small}
    assert len(segs) == 1
    seg = _tshm._locate_address(small[0].data_ptr(), 1)[0]
    assert seg.size == tshm.torch.ARENA_SIZE
    big = torch.UntypedStorage._new_shared(tshm.torch.SMALL_MAX + 1)
    bseg = _tshm._locate_address(big.data_ptr(), big.nbytes())[0]
    assert bseg is not seg and bseg.size < 2 * (tshm.torch.SMALL_MAX + 1)
    # Slices never overlap.
    spans = sorted((s.data_ptr(), s.data_ptr() + s.nbytes()) for s in small)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # A freed slice is never handed out again: whoever reached it through
    # the segment (a receiver, a numpy array) may still hold it.
    ptr = small[2].data_ptr()
    del small[2]
    again = torch.UntypedStorage._new_shared(4096)
    assert again.data_ptr() != ptr
    with pytest.raises(RuntimeError, match="-1 bytes"):
        torch.UntypedStorage._new_shared(-1)


def test_uninstall_restores_the_strategy_install_replaced():
    tshm.torch.uninstall()
    default = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        tshm.torch.install()
        assert tmp.get_sharing_strategy() == "tshm"
        tshm.torch.uninstall()
        assert tmp.get_sharing_strategy() == "file_system"
    finally:
        tmp.set_sharing_strategy(default)


def test_module_share_memory_puts_parameters_and_buffers_in_segments():
    m = torch.nn.Sequential(torch.nn.Linear(30, 30), torch.nn.BatchNorm1d(30))
    m.share_memory()
    tensors = list(m.parameters()) + list(m.buffers())
    assert len(tensors) == 7            # weight, bias x2; 3 BatchNorm stats
    assert all(segment_of(t) is not None and t.is_shared() for t in tensors)
    m(torch.randn(4, 30)).sum().backward()      # still a working module
    assert all(p.grad is not None for p in m.parameters())


def _hold(q):
    time.sleep(600)


def test_a_message_never_received_is_freed_with_the_queue():
    """The message holds its segment (the sender may drop the tensor at
    once) until the queue goes: the last handle closed, or its last
    holder SIGKILLed."""
    ctx = tshm.torch.get_context("fork")
    t = torch.ones(1 << 20)                 # 4 MiB: a segment of its own
    q = ctx.Queue()
    q.put(t)
    seg = segment_of(t)
    del t
    gc.collect()
    assert not seg.wait_released(0.2)       # held by the message
    del q
    gc.collect()
    assert seg.wait_released(30)
    t = torch.ones(1 << 20)
    q = ctx.Queue()
    p = ctx.Process(target=_hold, args=(q,))
    p.start()
    q.put(t)
    seg = segment_of(t)
    del t, q
    gc.collect()
    assert not seg.wait_released(0.2)       # the child holds the queue
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert seg.wait_released(30)


def test_uninstalled_is_torch():
    tshm.torch.uninstall()
    x = torch.randn(1000)
    y = _roundtrip(x)
    assert torch.equal(x, y) and segment_of(x) is None
    s = torch.UntypedStorage._new_shared(100)
    assert _tshm._locate_address(s.data_ptr(), 100) is None


@pytest.mark.parametrize("back", ["file_descriptor", "file_system"])
def test_a_shared_tensor_stays_shared_under_any_strategy(back):
    """torch's reducers and share_memory_() move a storage out of a tshm
    segment (their share_fd/share_filename swap its memory): this
    process would stop sharing it, silently.  Whatever the strategy, a
    tensor or storage in a segment is sent as one and share_memory_() of
    it does nothing."""
    x = torch.zeros(1000)
    y = _roundtrip(x)                   # x moved into a segment
    assert segment_of(x) is not None
    where = untyped(x).data_ptr()
    try:
        tmp.set_sharing_strategy(back)
        z = _roundtrip(x)
        w = _roundtrip(untyped(x))
        x.share_memory_()
        untyped(x).share_memory_()
        # What is not in a segment goes torch's way, as before.
        fresh = torch.ones(1000)
        assert torch.equal(_roundtrip(fresh), fresh) and \
            segment_of(fresh) is None
        tmp.set_sharing_strategy("tshm")
        tshm.torch.uninstall()          # torch's default strategy
        assert not tshm.torch.installed()
        v = _roundtrip(x)
        x.share_memory_()
    finally:
        tshm.torch.install()            # for the fixture to undo
    x.add_(1)
    assert segment_of(x) is not None
    assert torch.equal(y, x) and torch.equal(z, x) and torch.equal(v, x)
    assert untyped(x).data_ptr() == where and w.data_ptr() == where


def test_get_context_leaves_the_start_method_unset():
    """get_context(None) is multiprocessing's default method, and does not
    fix it, as multiprocessing.get_start_method() would."""
    code = textwrap.dedent("""
        import multiprocessing, tshm.torch
        ctx = tshm.torch.get_context()
        assert multiprocessing.get_start_method(allow_none=True) is None
        multiprocessing.set_start_method("spawn")
        print(ctx.get_start_method(), multiprocessing.get_start_method())
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         capture_output=True, text=True).stdout
    assert out.split() == [_platform_default(), "spawn"]


def _platform_default():
    from multiprocessing import context
    return context._default_context._default_context.get_start_method()


def _one_thread():
    """A fork of this process, which ran parallel ops, deadlocks at its own
    first one on GNU OpenMP (torch 2.x) with more than one thread
    (Documentation/python/torch.rst, "fork"); DataLoader's workers run on
    one for that reason."""
    torch.set_num_threads(1)


def _echo(q, r):
    """Receive tensors, write to them, send them back (re-send)."""
    _one_thread()
    while True:
        t = q.get()
        if t is None:
            break
        t.add_(1)
        r.put(t)


@pytest.mark.parametrize("method", METHODS)
def test_resend_between_processes(method):
    ctx = tshm.torch.get_context(method)
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_echo, args=(q, r))
    p.start()
    try:
        for dtype in (torch.float32, torch.int64, torch.uint8):
            for n in (10, 70000, 3 << 20):
                x = torch.zeros(n, dtype=dtype)
                q.put(x)
                y = r.get(timeout=120)
                # The child's write is visible here: shared, not copied,
                # and the re-sent tensor maps the same pages.
                assert int(x[0]) == 1 and torch.equal(x, y)
                assert untyped(y).data_ptr() == untyped(x).data_ptr()
        q.put(None)
        p.join(60)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()


class _Items(Dataset):
    def __init__(self, n, shape):
        self.n, self.shape = n, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.full(self.shape, float(i)),
                "i": torch.tensor(i),
                "strategy": tmp.get_sharing_strategy()}


@pytest.mark.parametrize("method", METHODS)
def test_dataloader_context(method):
    ctx = tshm.torch.get_context(method)
    dl = DataLoader(_Items(24, (16, 256)), batch_size=4, num_workers=2,
                    multiprocessing_context=ctx)
    seen = []
    for batch in dl:
        assert batch["strategy"] == ["tshm"] * 4   # workers installed
        x = batch["x"]
        assert segment_of(x) is not None            # collated into tshm
        for row, i in zip(x, batch["i"].tolist()):
            assert torch.all(row == float(i))
        seen += batch["i"].tolist()
    assert sorted(seen) == list(range(24))


def test_fd_use_is_bounded_by_arenas():
    """Small tensors from one producer share arenas: receiving 500 of them
    costs far fewer than 500 segments."""
    xs = [torch.full((10,), float(i)) for i in range(500)]
    ys = _roundtrip(xs)
    assert all(torch.equal(a, b) for a, b in zip(xs, ys))
    segs = {id(segment_of(y)) for y in ys}
    assert len(segs) < 10


RESEND_SCRIPT = textwrap.dedent("""
    import os, sys, torch, tshm.torch
    from multiprocessing import resource_sharer

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def keep(q, r, n):
        kept = [q.get()]                    # the first one may attach
        before = fds()
        for _ in range(n - 1):
            kept.append(q.get())
        same = all(k.data_ptr() == kept[0].data_ptr() for k in kept)
        r.put((before, fds(), same))
        kept.clear()

    if __name__ == "__main__":
        tshm.torch.install()
        ctx = tshm.torch.get_context(sys.argv[1])
        for nbytes in (4096, 1 << 20):
            q, r = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=keep, args=(q, r, 50))
            p.start()
            x = torch.ones(nbytes // 4)
            for _ in range(50):
                q.put(x)
            before, after, same = r.get(timeout=120)
            p.join(60)
            print(nbytes, before, after, same, p.exitcode)
        rs = resource_sharer._resource_sharer
        print("resource sharer", "started" if rs._listener else "idle")
""")


@pytest.mark.parametrize("method", METHODS)
def test_resend_takes_no_fd_and_no_resource_sharer(method, tmp_path):
    """A tensor re-sent through a tshm.torch context's Queue goes by
    reference in the queue's own segment passing: the receiver, which
    keeps every copy, holds no new fd after the first, and the sender
    never starts multiprocessing's resource sharer (torch's queues, a
    pipe, send each storage's fd through it on every put)."""
    script = tmp_path / "resend.py"
    script.write_text(RESEND_SCRIPT)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for line, nbytes in zip(lines, (4096, 1 << 20)):
        n, before, after, same, code = line.split()
        assert (int(n), int(after), same, code) == \
            (nbytes, int(before), "True", "0"), line
    assert lines[-1] == "resource sharer idle"


def test_context_queue_api():
    """multiprocessing.Queue's API: maxsize bounds it, close() lets go of
    this handle only, the feeder-thread calls exist, and an object whose
    pickle is bigger than a message still arrives (spilled)."""
    ctx = tshm.torch.get_context("fork")
    q = ctx.Queue(2)
    q.put(1)
    q.put_nowait(2)
    assert q.full() and q.qsize() == 2
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.01)
    q.cancel_join_thread()
    assert q.get() == 1 and q.get_nowait() == 2
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
    big = list(range(300000))                    # far beyond max_msg
    t = torch.arange(10)
    q.put((big, t))
    got, gt = q.get(timeout=10)
    assert got == big and torch.equal(gt, t)
    q.close()
    q.join_thread()
    sq = ctx.SimpleQueue()
    sq.put(t)
    assert sq.empty() is False and torch.equal(sq.get(), t)
    assert isinstance(ctx.Queue(), tshm.torch._mpqueue.Queue)


def _fds():
    return len(os.listdir("/proc/self/fd"))


def test_context_queue_spilled_put_that_fails_leaves_nothing():
    """A put of an object too big for a message (spilled, its tensor's
    segment through the resource sharer) that times out takes back what
    it handed to the resource sharer: no fd, no segment left pinned."""
    ctx = tshm.torch.get_context("fork")
    q = ctx.Queue(1)
    q.put("filler")
    big = (list(range(300000)), torch.ones(100000))
    with pytest.raises(queue.Full):
        q.put(big, timeout=0.001)            # starts the resource sharer
    before = _fds()
    for _ in range(20):
        with pytest.raises(queue.Full):
            q.put(big, timeout=0.001)
    assert _fds() == before
    assert q.get() == "filler"
    q.put(big)
    got = q.get(timeout=10)
    assert got[0] == big[0] and torch.equal(got[1], big[1])


def test_context_queue_closed_and_negative_timeouts():
    """As multiprocessing's: after close() put() and get() raise
    ValueError (SimpleQueue: OSError, its pipe is closed); a negative
    timeout means no wait (Empty, Full), not a ValueError."""
    ctx = tshm.torch.get_context("fork")
    q = ctx.Queue(1)
    with pytest.raises(queue.Empty):
        q.get(True, -1)
    q.put(1)
    with pytest.raises(queue.Full):
        q.put(2, True, -0.5)
    q.close()
    for call in (lambda: q.put(3), lambda: q.put_nowait(3), q.get,
                 q.get_nowait, q.qsize, q.full):
        with pytest.raises(ValueError, match="is closed"):
            call()
    with pytest.raises(OSError, match="closed"):    # its pipe, closed
        q.empty()
    sq = ctx.SimpleQueue()
    sq.close()
    for call in (lambda: sq.put(1), sq.get):
        with pytest.raises(OSError, match="closed"):
            call()


class _OwnRun:
    """A Process subclass the usual way: run() overridden."""

    def __init__(self, q, **kwargs):
        super().__init__(**kwargs)
        self.q = q

    def run(self):
        _one_thread()
        t = torch.full((70000,), 7.0)
        s = torch.UntypedStorage._new_shared(4096)
        self.q.put((tmp.get_sharing_strategy(), t,
                    _tshm._locate_address(s.data_ptr(), 4096) is not None))


# Module level: a spawn child unpickles the process object by its class.
_OWN_RUN = {m: type(f"_OwnRun{m.capitalize()}", (_OwnRun, process), {})
            for m, process in (("fork", tshm.torch.ForkProcess),
                               ("spawn", tshm.torch.SpawnProcess),
                               ("forkserver", tshm.torch.ForkServerProcess))}
globals().update({cls.__name__: cls for cls in _OWN_RUN.values()})


@pytest.mark.parametrize("method", METHODS)
def test_process_subclass_overriding_run_has_tshm(method):
    """tshm is installed before run(), not by it: a subclass's own run()
    has the strategy and allocates from segments, and what it sent is
    received after it exited."""
    ctx = tshm.torch.get_context(method)
    q = ctx.Queue()
    p = _OWN_RUN[method](q)
    p.start()
    p.join(120)
    if p.exitcode is None:        # or this process's exit would wait
        p.kill()
    assert p.exitcode == 0
    strategy, t, in_segment = q.get(timeout=10)
    assert strategy == "tshm" and in_segment
    assert torch.equal(t, torch.full((70000,), 7.0))


def _put_fresh(rank, q):
    q.put((rank, torch.full((50000,), float(rank))))


@pytest.mark.skipif(IN_VM, reason="torch's spawn imports torch per worker")
def test_context_queue_in_torchs_own_spawn_outlives_its_workers():
    """A tshm.torch queue handed to torch.multiprocessing.spawn's workers,
    which run torch's default strategy: what they put goes as segments,
    and is read after they exited (torch's way: an fd in a resource
    sharer that died with them)."""
    q = tshm.torch.get_context("spawn").Queue()
    tmp.spawn(_put_fresh, args=(q,), nprocs=2)
    got = dict(q.get(timeout=10) for _ in range(2))
    assert sorted(got) == [0, 1]
    for rank, t in got.items():
        assert torch.equal(t, torch.full((50000,), float(rank)))
        assert segment_of(t) is not None


def test_context_queue_sends_as_tshm_whatever_the_strategy():
    tshm.torch.uninstall()
    q = tshm.torch.get_context("fork").Queue()    # installs again
    tshm.torch.uninstall()
    x = torch.arange(1000.)
    q.put(x)
    y = q.get(timeout=10)
    assert segment_of(x) is not None and torch.equal(x, y)
    assert untyped(y).data_ptr() == untyped(x).data_ptr()


def _double(t):
    return t * 2


@pytest.mark.parametrize("method", METHODS)
def test_context_pool_maps_tensors(method):
    """ctx.Pool() works on every context (multiprocessing.Pool reaches
    into its SimpleQueues' pipes): tensors go out to the workers and come
    back doubled.  Two workers: spawn and forkserver ones import torch."""
    ctx = tshm.torch.get_context(method)
    xs = [torch.full((1000,), float(i)) for i in range(6)]
    with ctx.Pool(2) as pool:
        got = pool.map(_double, xs)
    assert all(torch.equal(g, x * 2) for g, x in zip(got, xs))


def test_context_queue_default_is_a_ring_of_1024():
    """maxsize=0 is not unbounded (Documentation/python/torch.rst): the
    1025th unreceived put() waits for a get()."""
    ctx = tshm.torch.get_context("fork")
    for q in (ctx.Queue(), ctx.Queue(0)):
        for i in range(tshm.torch._mpqueue.DEFAULT_CAPACITY):
            q.put_nowait(i)
        assert q.full() and q.qsize() == 1024
        with pytest.raises(queue.Full):
            q.put(-1, timeout=0.01)
        assert q.get() == 0
        q.put_nowait(1024)


def test_forkserver_context_keeps_the_callers_preloads():
    """The forkserver is one per process: get_context("forkserver") adds
    torch and tshm.torch to what it preloads, keeping what the caller
    set and multiprocessing's default (__main__)."""
    from multiprocessing import forkserver
    saved = forkserver._forkserver._preload_modules
    try:
        forkserver._forkserver._preload_modules = ["__main__", "json"]
        tshm.torch.get_context("forkserver")
        assert forkserver._forkserver._preload_modules == \
            ["__main__", "json", "torch", "tshm.torch"]
    finally:
        forkserver._forkserver._preload_modules = saved


def test_context_queue_big_maxsize():
    """Up to 65536 messages, as libtshm's ring allows: a queue of more
    than 16384 carries less pickle per message in the ring, and what does
    not fit is spilled; more raise ValueError, not the library's E2BIG."""
    ctx = tshm.torch.get_context("fork")
    for n in (16384, 20000, tshm.torch._mpqueue.MAX_CAPACITY):
        q = ctx.Queue(n)
        q.put(torch.ones(3))
        q.put(list(range(100000)))
        assert torch.equal(q.get(), torch.ones(3))
        assert q.get() == list(range(100000))
    with pytest.raises(ValueError, match="1 to 65536 messages"):
        ctx.Queue(65537)


def _put_and_exit(q, n):
    _one_thread()
    q.put([torch.full((100000,), float(i)) for i in range(n)])


def test_context_queue_seven_segments_outlive_their_sender():
    """A message's first 7 segments are the message's: they arrive after
    the sender exited.  (More go through the resource sharer and need
    the sender alive: the known limit in Documentation/python/torch.rst.)"""
    ctx = tshm.torch.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_put_and_exit, args=(q, 7))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert [float(t[0]) for t in q.get(timeout=10)] == \
        [float(i) for i in range(7)]


def _firsts(q, r):
    r.put([float(y[0]) for y in q.get(timeout=60)])


def test_context_queue_more_segments_than_a_message_carries():
    """40 tensors in 40 segments in one message: the queue carries
    QUEUE_MAX_SEGS - 1 by reference, the others cross as ForkingPickler
    sends them; all arrive, in one process and in another."""
    ctx = tshm.torch.get_context("fork")
    q, r = ctx.Queue(), ctx.Queue()
    xs = [torch.full((20000,), float(i)) for i in range(40)]
    q.put(xs)
    assert all(torch.equal(a, b) for a, b in zip(xs, q.get(timeout=10)))
    p = ctx.Process(target=_firsts, args=(q, r))
    p.start()
    q.put(xs)
    assert r.get(timeout=60) == [float(i) for i in range(40)]
    p.join(60)
    assert p.exitcode == 0
