# SPDX-License-Identifier: GPL-2.0
"""tshm.Context and tshm.Segment: creation, the buffer protocol, lifetime,
errors."""

import errno
import os
import pickle

import numpy as np
import pytest

import tshm
from conftest import backend


def test_context_backend():
    ctx = tshm.Context()
    assert ctx.backend in ("kmod", "memfd")
    assert ctx.backend == backend()
    assert ctx.fileno() >= 0
    assert tshm.Context(backend="memfd").backend == "memfd"


def test_context_bad_backend():
    with pytest.raises(ValueError, match="backend"):
        tshm.Context(backend="posix")


def test_context_kmod_without_module():
    if os.path.exists("/dev/tshm"):
        pytest.skip("the module is loaded here")
    with pytest.raises(OSError) as e:
        tshm.Context(backend="kmod")
    assert e.value.errno == errno.ENODEV
    assert "not loaded" in str(e.value)


def test_default_context_per_process():
    a = tshm.default_context()
    assert a is tshm.default_context()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = tshm.default_context() is not a and tshm.default_context() is \
            tshm.default_context()
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_segment_buffer_protocol():
    seg = tshm.Segment(1 << 20, "frames")
    assert seg.size == len(seg) == 1 << 20
    assert seg.name == "frames"
    assert seg.id > 0
    with memoryview(seg) as m:
        assert not m.readonly and m.nbytes == seg.size
        m[:5] = b"hello"
    a = np.frombuffer(seg, dtype=np.uint8)
    assert bytes(a[:5]) == b"hello"
    a[5:10] = 1
    assert bytes(memoryview(seg)[5:10]) == b"\x01" * 5
    del a
    seg.close()
    assert seg.closed


def test_segment_flags_and_unnamed():
    try:
        seg = tshm.Segment(4096, huge=True, prefault=True)
    except OSError as e:
        # Without THP (PREEMPT_RT kernels) the module refuses huge
        # segments; memfd's huge is an madvise() hint.
        if os.path.exists("/sys/kernel/mm/transparent_hugepage"):
            raise
        assert e.errno == errno.EOPNOTSUPP
        seg = tshm.Segment(4096, prefault=True)
    assert seg.name is None
    seg.close()


def test_segment_close_with_views():
    seg = tshm.Segment(4096)
    a = np.frombuffer(seg, dtype=np.uint8)
    with pytest.raises(BufferError):
        seg.close()
    assert not seg.closed
    del a
    seg.close()
    seg.close()  # idempotent


def test_segment_closed_errors():
    seg = tshm.Segment(4096)
    seg.close()
    with pytest.raises(ValueError, match="closed"):
        memoryview(seg)
    with pytest.raises(ValueError, match="closed"):
        seg.id
    with pytest.raises(ValueError, match="closed"):
        seg.wait_released(0)
    assert "closed" in repr(seg)


@pytest.mark.parametrize("size", [0, -1, -(1 << 40)])
def test_segment_bad_size(size):
    with pytest.raises(ValueError, match="positive"):
        tshm.Segment(size)


def test_segment_huge_size_is_oserror():
    with pytest.raises(OSError) as e:
        tshm.Segment(1 << 62)
    assert e.value.errno in (errno.ENOMEM, errno.EFBIG, errno.EINVAL,
                             errno.EDQUOT, errno.ENOSPC)


def test_segment_bad_ctx():
    with pytest.raises(TypeError, match="Context"):
        tshm.Segment(4096, ctx="memfd")


def test_segment_context_manager():
    with tshm.Segment(4096) as seg:
        memoryview(seg)[0] = 1
    assert seg.closed


def test_wait_released_alone():
    seg = tshm.Segment(4096)
    assert seg.wait_released(0) is True
    assert seg.wait_released() is True
    with pytest.raises(ValueError, match="non-negative"):
        seg.wait_released(-1)


def test_wait_released_after_child_lets_go():
    """A segment pickled into a child is held there until the child exits;
    the creator's wait sees both states."""
    seg = tshm.Segment(4096)
    memoryview(seg)[0] = 42
    data = pickle.dumps(seg)
    r, w = os.pipe()
    g, go = os.pipe()
    pid = os.fork()
    if pid == 0:
        s = pickle.loads(data)
        os.write(w, bytes([memoryview(s)[0]]))
        os.read(g, 1)
        os._exit(0)
    assert os.read(r, 1) == b"\x2a"
    assert seg.wait_released(0.05) is False
    os.write(go, b"x")
    os.waitpid(pid, 0)
    assert seg.wait_released(10) is True


def test_same_segment_same_object():
    """Receiving a segment this process already holds gives the same
    Segment back (the library's cache)."""
    seg = tshm.Segment(4096)
    q = tshm.Queue()
    q.put(seg)
    q.put(seg)
    assert q.get() is seg
    assert q.get() is seg


def test_locate():
    from tshm._tshm import _locate
    seg = tshm.Segment(8192)
    a = np.frombuffer(seg, dtype=np.uint8)[100:200]
    found = _locate(a)
    assert found is not None and found[0] is seg and found[1] == 100
    assert _locate(bytearray(100)) is None
    assert _locate(np.zeros(10)) is None


def test_pool_is_not_picklable():
    with tshm.Pool(1, 4096) as pool:
        with pytest.raises(TypeError):
            pickle.dumps(pool)


def test_locate_address():
    from tshm._tshm import _locate_address
    seg = tshm.Segment(8192)
    assert _locate_address(seg._address + 10, 100) == (seg, 10)
    assert _locate_address(seg._address + 8000, 500) is None
    assert _locate_address(seg._address - 1, 2) is None
    with pytest.raises(ValueError):
        _locate_address(seg._address, 0)
