# SPDX-License-Identifier: GPL-2.0
"""tshm.torch: sending tensors whose storage is not in a segment yet.

torch's strategies share such a storage in place, so every view of it is
shared from then on; tshm moves each tensor sent into its storage's
mirror (tshm/torch/_mirror.py).  The views of one storage sent share one
segment, copied once; receivers of overlapping views share memory; a
send never changes what a tensor of the sender reads; a mirror is never
reused for another storage or across fork()."""

import threading

import pytest

torch = pytest.importorskip("torch")

import tshm.torch  # noqa: E402
# The autouse fixture strategy (tshm installed, then torch's default back):
from test_torch import segment_of, strategy, untyped  # noqa: E402,F401


def same_memory(a, b):
    return untyped(a).data_ptr() == untyped(b).data_ptr()


def roundtrip(q, t):
    q.put(t)
    return q.get()


@pytest.fixture
def q():
    return tshm.torch.get_context("fork").SimpleQueue()


def test_chunks_of_one_tensor_share_one_segment(q):
    """big.split(): 16 chunks sent are one segment of big's size (torch's
    strategies: one shared storage), not 16 copies of all of big."""
    big = torch.arange(1 << 20, dtype=torch.float32)    # 4 MiB
    chunks = big.split(big.numel() // 16)
    want = [c.clone() for c in chunks]
    got = [roundtrip(q, c) for c in chunks]
    assert len({segment_of(t).id for t in list(chunks) + got}) == 1
    assert all(untyped(t).nbytes() == 4 << 20 for t in got)
    for c, g, w in zip(chunks, got, want):
        assert torch.equal(c, w) and torch.equal(g, w)
        assert c.storage_offset() == g.storage_offset()
    # One StorageImpl, as torch's shared views have: torch.save() and
    # deepcopy() see one storage, not 16.
    assert len({untyped(c)._cdata for c in chunks}) == 1


def test_views_sent_as_temporaries_share_one_segment(q):
    """q.put(big[i:j]) with nothing keeping the view: the mirror lives as
    long as big does, so every chunk goes into it."""
    big = torch.arange(1 << 18, dtype=torch.float32)    # 1 MiB
    n = big.numel() // 8
    got = [roundtrip(q, big[i * n:(i + 1) * n]) for i in range(8)]
    assert len({segment_of(g).id for g in got}) == 1
    assert torch.equal(torch.cat(got), big)


def test_a_storage_resized_after_a_send_can_be_sent(q):
    """resize_() reallocates the storage in place (same StorageImpl): its
    old mirror no longer fits and a new one is made."""
    x = torch.arange(10.0)
    head = x[0:5]
    roundtrip(q, head)
    x.resize_(1000)
    x[10:] = 2.0                # resize_() leaves them uninitialized (NaNs)
    want = x.clone()
    got = roundtrip(q, x)
    assert torch.equal(x, want) and torch.equal(got, want)
    assert torch.equal(head, torch.arange(5.0))


def test_the_mirror_outside_a_span_is_zeros(q):
    """A receiver reaching through its storage past the bytes it was sent
    reads zeros, never a dead tensor's bytes (small storages are slices
    of arenas: a slice is never handed out twice)."""
    tshm.torch._alloc.retire_current()      # an arena never sent
    secret = torch.full((16,), 7.0).share_memory_()
    del secret
    z = torch.ones(16)
    got = roundtrip(q, z[0:2])
    whole = torch.empty((0,)).set_(untyped(got), 0, (16,))
    assert whole.tolist() == [1.0, 1.0] + [0.0] * 14


def test_overlapping_views_share_memory_at_the_receiver():
    """Two overlapping views of one tensor, sent to another process in
    two messages: what the receiver writes through one it reads through
    the other, and the sender reads it too."""
    ctx = tshm.torch.get_context("fork")
    q, back = ctx.SimpleQueue(), ctx.SimpleQueue()
    x = torch.zeros(10)
    a, b = x[0:6], x[4:10]
    p = ctx.Process(target=_write_through_first, args=(q, back))
    p.start()
    q.put(a)
    q.put(b)
    assert back.get() == 7.0          # b[1] is a[5]
    p.join(30)
    assert p.exitcode == 0
    assert a[5].item() == 7.0 and b[1].item() == 7.0


def _write_through_first(q, back):
    a, b = q.get(), q.get()
    a[5] = 7.0
    back.put(b[1].item())


def test_a_send_never_changes_what_a_tensor_reads(q):
    """y, a view of x, is sent (moved); x is then written, in its old
    memory, and sent: x keeps its values, y keeps its own, and they no
    longer share a segment.  Had x joined y's mirror, it would read y's
    zeros."""
    x = torch.zeros(10)
    y = x[:]
    roundtrip(q, y)
    x.fill_(1.0)
    got = roundtrip(q, x)
    assert torch.equal(x, torch.ones(10)) and torch.equal(got, x)
    assert torch.equal(y, torch.zeros(10))
    assert not same_memory(x, y)


def test_a_tensor_that_disagrees_leaves_the_mirror_to_the_others(q):
    """od disagrees with the mirror on bytes of its span a receiver wrote
    (through ev's copy): od gets a mirror of its own, and x[0:1], which
    agrees, still joins ev's."""
    x = torch.arange(20.0)
    ev, od = x[0::2], x[1::2]
    roundtrip(q, ev)[1] = 100.0            # x[2], in ev's mirror only
    roundtrip(q, od)
    first = x[0:1]
    roundtrip(q, first)
    assert same_memory(first, ev) and not same_memory(od, ev)
    assert torch.equal(od, torch.arange(1.0, 20.0, 2.0))


def test_a_tensor_that_agrees_joins_the_mirror(q):
    """Unwritten since its view was sent, x joins that view's segment
    when it is sent, and they share memory again, as with torch."""
    x = torch.arange(10.0)
    y = x[2:5]
    roundtrip(q, y)
    roundtrip(q, x)
    assert same_memory(x, y) and segment_of(x) is not None
    x[3] = -1.0
    assert y[1].item() == -1.0


def test_storages_over_the_same_bytes_get_a_mirror_each(q):
    """Two storages over one buffer (two frombuffer()s) are moved apart,
    as torch's share_memory_() moves each StorageImpl on its own: tensors
    moved off one share nothing with those moved off the other."""
    buf = bytearray(4096)
    v = over(torch.frombuffer(buf, dtype=torch.float32))
    roundtrip(q, v)
    twin = over(torch.frombuffer(buf, dtype=torch.float32))
    roundtrip(q, twin)
    v[0] = 5.0
    assert twin[0].item() == 0.0 and not same_memory(v, twin)


def over(t):
    """A tensor of 10 elements over t's storage that is not a view of t
    (no _base to keep t's StorageImpl alive)."""
    return torch.empty((0,), dtype=t.dtype).set_(untyped(t), 0, (10,))


def test_threads_moving_views_of_one_tensor(q):
    """Four threads send disjoint views of one tensor at once: every view
    arrives with its values, all in one segment."""
    big = torch.arange(1 << 16, dtype=torch.float64)
    parts = big.chunk(64)
    want = [p.clone() for p in parts]
    ctx = tshm.torch.get_context("fork")
    queues = [ctx.SimpleQueue() for _ in range(4)]
    got = [None] * len(parts)

    def send(k):
        for i in range(k, len(parts), 4):
            queues[k].put(parts[i])
            got[i] = queues[k].get()

    threads = [threading.Thread(target=send, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert all(torch.equal(p, w) for p, w in zip(parts, want))
    assert len({segment_of(p).id for p in parts}) == 1


def test_a_forked_child_does_not_write_the_parents_mirror():
    """The parent sends x[0:5]; a forked child writes its own copy of
    x[5:10] and sends it to the parent, which then sends its x[5:10]:
    the tensor received from the child keeps the child's values.  (Had
    the child moved into the parent's mirror, the parent's send would
    copy its zeros over them.)"""
    ctx = tshm.torch.get_context("fork")
    q, back = ctx.SimpleQueue(), ctx.SimpleQueue()
    x = torch.zeros(10)
    first = x[0:5]              # kept: the mirror lives
    roundtrip(q, first)
    p = ctx.Process(target=_child_sends_its_half, args=(x, back))
    p.start()
    from_child = back.get()
    p.join(30)
    assert p.exitcode == 0
    roundtrip(q, x[5:10])
    assert torch.equal(from_child, torch.full((5,), 9.0))


def _child_sends_its_half(x, back):
    half = x[5:10]
    half.fill_(9.0)
    back.put(half)
