# SPDX-License-Identifier: GPL-2.0
"""tshm.Queue in one process: objects, out-of-band buffers, by-reference
sends, timeouts, close, bad input."""

import errno
import pickle
import queue
import struct
import threading

import numpy as np
import pytest

import tshm
from tshm._tshm import _Queue


def roundtrip(obj, q=None):
    q = q or tshm.Queue()
    q.put(obj)
    return q.get(timeout=10)


@pytest.mark.parametrize("obj", [
    None, 0, -1, 2**100, 3.5, "text", "ünïcödé", b"", b"bytes", (1, 2),
    [1, [2, [3]]], {"a": 1, "b": {2, 3}}, frozenset({1}), bytearray(b"ba"),
    Exception("boom"), range(3),
])
def test_small_objects(obj):
    got = roundtrip(obj)
    if isinstance(obj, Exception):
        assert type(got) is type(obj) and got.args == obj.args
    else:
        assert got == obj and type(got) is type(obj)


@pytest.mark.parametrize("dtype", ["u1", "i4", "f8", "c16", "?", "<M8[s]"])
def test_numpy_out_of_band(dtype):
    a = (np.arange(100000) % 7).astype(dtype)
    got = roundtrip(a)
    assert got.dtype == a.dtype and np.array_equal(got, a)
    assert got.flags.writeable


def test_numpy_views_and_order():
    base = np.arange(200000, dtype=np.float32).reshape(400, 500)
    for a in (base.T, base[::2, ::3], np.asfortranarray(base), base[10:20]):
        got = roundtrip(a)
        assert np.array_equal(got, a)


def test_empty_and_small_arrays_stay_in_band():
    for a in (np.zeros(0), np.zeros((3, 0)), np.ones(10)):
        assert np.array_equal(roundtrip(a), a)


def test_array_in_segment_is_shared_not_copied():
    seg = tshm.Segment(1 << 20)
    a = np.frombuffer(seg, dtype=np.int64)
    a[:] = 5
    q = tshm.Queue()
    q.put(a[1000:3000])
    got = q.get()
    got[0] = 77  # the receiver's write is the sender's
    assert a[1000] == 77
    got_seg = tshm._tshm._locate(got)[0]
    assert got_seg is seg


def test_resend_received_array():
    q1, q2 = tshm.Queue(), tshm.Queue()
    q1.put(np.arange(50000))
    a = q1.get()
    q2.put(a)
    b = q2.get()
    b[0] = -1
    assert a[0] == -1  # same pages: re-sent by reference


def test_segment_objects_by_reference():
    seg = tshm.Segment(4096)
    got = roundtrip({"seg": seg, "again": seg, "n": 1})
    assert got["seg"] is seg and got["again"] is seg


def test_bytes_like_out_of_band():
    big = bytes(range(256)) * 1024
    got = roundtrip({"b": big, "ba": bytearray(big), "mv": memoryview(big)})
    assert got["b"] == big and type(got["b"]) is bytes
    assert got["ba"] == big and type(got["ba"]) is bytearray
    assert got["mv"].tobytes() == big


def test_memoryview_format_and_shape():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = roundtrip(memoryview(a))
    assert got.format == "i" and got.shape == (3, 4)
    assert got.tolist() == a.tolist()


def test_big_bytes_goes_out_of_band_past_max_msg():
    q = tshm.Queue(max_msg=4096)
    big = b"x" * (1 << 20)
    q.put([big, big[:10]])
    got = q.get()
    assert got[0] == big and got[1] == b"x" * 10


def test_many_buffers_one_message():
    """More buffers than a message has segment slots: copies share one."""
    arrays = {f"t{i}": np.full(20000, i, dtype=np.int32) for i in range(64)}
    got = roundtrip(arrays)
    assert all(np.array_equal(got[k], v) for k, v in arrays.items())


def test_many_segments_one_message():
    """Arrays in more segments than fit by reference: the rest is copied."""
    segs = [tshm.Segment(65536) for _ in range(12)]
    arrays = [np.frombuffer(s, dtype=np.uint8) for s in segs]
    for i, a in enumerate(arrays):
        a[:] = i
    got = roundtrip(arrays)
    assert [int(g[0]) for g in got] == list(range(12))


def test_too_many_segment_objects():
    q = tshm.Queue()
    with pytest.raises(ValueError, match="at most"):
        q.put([tshm.Segment(4096) for _ in range(9)])
    assert q.empty()


def test_message_too_long_loses_nothing():
    q = tshm.Queue(max_msg=1024)
    q.put("first")
    with pytest.raises(OSError) as e:
        q.put([str(i) * 100 for i in range(100)])  # str stays in band
    assert e.value.errno == errno.EMSGSIZE
    assert "max_msg" in str(e.value)
    assert q.qsize() == 1 and q.get() == "first"


def test_unpicklable_loses_nothing():
    q = tshm.Queue()
    q.put(1)
    with pytest.raises((pickle.PicklingError, TypeError, AttributeError)):
        q.put(lambda: 0)
    with pytest.raises(TypeError):
        q.put(threading.Lock())
    assert q.qsize() == 1 and q.get() == 1


def test_full_and_empty():
    q = tshm.Queue(maxsize=2)
    assert q.maxsize == 2 and q.empty() and not q.full()
    q.put(1)
    q.put_nowait(2)
    assert q.full() and q.qsize() == 2
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.05)
    with pytest.raises(queue.Full):
        q.put(3, block=False)
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    assert q.get() == 1 and q.get_nowait() == 2
    with pytest.raises(queue.Empty):
        q.get(timeout=0.05)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(block=False)


def test_bad_arguments():
    with pytest.raises(ValueError):
        tshm.Queue(maxsize=0)
    with pytest.raises(ValueError):
        tshm.Queue(maxsize=70000)
    with pytest.raises(ValueError):
        tshm.Queue(max_msg=-1)
    q = tshm.Queue()
    with pytest.raises(ValueError, match="non-negative"):
        q.get(timeout=-1)
    with pytest.raises(ValueError, match="non-negative"):
        q.put(1, timeout=-0.5)


def test_close_drains_then_raises():
    q = tshm.Queue()
    q.put("a")
    q.put(np.arange(100000))
    q.close()
    q.close()  # idempotent
    with pytest.raises(tshm.QueueClosed) as e:
        q.put("b")
    assert isinstance(e.value, OSError) and e.value.errno == errno.EPIPE
    assert q.get() == "a"
    assert np.array_equal(q.get(), np.arange(100000))
    with pytest.raises(tshm.QueueClosed):
        q.get()


def test_close_wakes_blocked_getter():
    q = tshm.Queue()
    out = []

    def getter():
        try:
            q.get(timeout=30)
        except tshm.QueueClosed as e:
            out.append(e)

    t = threading.Thread(target=getter)
    t.start()
    q.close()
    t.join(30)
    assert not t.is_alive() and len(out) == 1


def test_threads_blocking_calls_release_the_gil():
    q = tshm.Queue(maxsize=4)
    n = 2000
    got = []

    def consumer():
        for _ in range(n):
            got.append(q.get(timeout=30))

    t = threading.Thread(target=consumer)
    t.start()
    for i in range(n):
        q.put(i, timeout=30)
    t.join(30)
    assert got == list(range(n))


def _raw_send(q, data, segs=()):
    q._raw.send(bytes(data), list(segs), -1)


@pytest.mark.parametrize("data", [
    b"",
    b"XXXX" + bytes(8),
    struct.pack("<4sHHI", b"TSQ1", 0, 0x80, 0) + pickle.dumps(1),
    struct.pack("<4sHHI", b"TSQ1", 1, 0, 0) + struct.pack("<IQQ", 0, 0, 8),
    struct.pack("<4sHHI", b"TSQ1", 1000, 0, 0),
    # packed (a tshm.torch queue's lone tensor): a plain Queue reads none,
    # and a packed message has no buffers and no other flag
    struct.pack("<4sHHI", b"TSQ1", 0, 2, 0) + bytes(27),
    struct.pack("<4sHHI", b"TSQ1", 0, 3, 0) + bytes(27),
    struct.pack("<4sHHI", b"TSQ1", 1, 2, 0) + struct.pack("<IQQ", 0, 0, 0),
])
def test_corrupt_messages_are_rejected(data):
    q = tshm.Queue()
    _raw_send(q, data)
    with pytest.raises(OSError) as e:
        q.get()
    assert e.value.errno == errno.EBADMSG
    q.put("still works")
    assert q.get() == "still works"


class _Changes:
    """A later object of a message whose reducer changes a bytearray that
    an earlier part of the message pickled."""

    def __init__(self, ba, how):
        self.ba, self.how = ba, how

    def __reduce__(self):
        if self.how == "write":
            self.ba[:4] = b"LATE"
        elif self.how == "grow":
            self.ba.extend(b"Z" * 100)
        else:
            self.ba.clear()
        return int, (1,)


@pytest.mark.parametrize("how", ["write", "grow", "clear"])
def test_in_band_bytes_are_sent_as_they_were_pickled(how):
    """The C pickler hands a big in-band bytearray to write() as the object
    itself: what is sent is its bytes when it was pickled, as pickle.dumps()
    has them, not after a later reducer of the message changed it (which
    broke the stream: its length no longer its data's)."""
    q = tshm.Queue(maxsize=4, max_msg=1 << 20, oob_threshold=1 << 30)
    ba = bytearray(b"a" * 100_000)
    expected = pickle.loads(pickle.dumps([bytearray(ba), 1], protocol=5))
    q.put([ba, _Changes(ba, how)])
    assert q.get() == expected


def test_a_big_message_leaves_no_pickler_behind():
    """A thread reuses its picklers, but not one that pickled a big message:
    the C pickler's memo keeps its biggest size, and clearing it after each
    later message would walk all of it."""
    from tshm import _queue
    q = tshm.Queue(maxsize=4, max_msg=1 << 20)
    q.put((1, 2))
    assert q.get() == (1, 2)
    small = dict(_queue._kept.picklers)
    assert small
    q.put([(i,) for i in range(20000)])
    assert len(q.get()) == 20000
    assert all(_queue._kept.picklers.get(cls) is not small[cls]
               for cls in small)
    q.put((3, 4))
    assert q.get() == (3, 4)


def test_corrupt_buffer_bounds_are_rejected():
    q = tshm.Queue()
    seg = tshm.Segment(4096)
    bad = struct.pack("<4sHHI", b"TSQ1", 1, 0, 0) + \
        struct.pack("<IQQ", 0, 4000, 200) + pickle.dumps(1, protocol=5)
    _raw_send(q, bad, [seg])
    with pytest.raises(OSError) as e:
        q.get()
    assert e.value.errno == errno.EBADMSG
    bad = struct.pack("<4sHHI", b"TSQ1", 1, 0, 0) + \
        struct.pack("<IQQ", 0, 2**64 - 1, 2) + pickle.dumps(1, protocol=5)
    _raw_send(q, bad, [seg])
    with pytest.raises(OSError):
        q.get()


def test_raw_queue_limits():
    raw = _Queue(4, 16)
    with pytest.raises(ValueError, match="max_msg"):
        raw.send(b"x" * 17, [], 0)
    with pytest.raises(ValueError, match="at most"):
        raw.send(b"x", [tshm.Segment(4096)] * 9, 0)
    with pytest.raises(TypeError):
        raw.send(b"x", [1], 0)
    assert len(raw) == 0


def test_queue_pickles_through_a_queue():
    outer = tshm.Queue()
    inner = tshm.Queue()
    outer.put(inner)
    got = outer.get()
    got.put("via the copy")
    assert inner.get() == "via the copy"
