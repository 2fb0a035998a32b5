# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm.Queue: Python objects between processes, big buffers out of band.

An object is pickled with protocol 5.  Out-of-band buffers
(pickle.PickleBuffer: numpy arrays, bytearrays, memoryviews) leave the
pickle stream:

* a buffer that lies inside a segment this process maps (a Segment, an
  array received earlier, an array over ``memoryview(seg)``) is sent by
  reference, whatever its size: the segment plus an offset and a length,
  nothing copied;
* any other buffer of at least ``oob_threshold`` bytes is copied once into
  a segment made for the message (one segment holds every copied buffer of
  a message); smaller ones stay in band.

What stays in band must fit the queue's ``max_msg``; if it does not, the
object is pickled again with every buffer out of band (bytes objects too),
and only then is the put refused.

A message in the ring is::

    header   "TSQ1", buffer count (u16), flags (u16), 4 bytes zero
    buffers  per buffer: segment index (u32), offset (u64), length (u64)
    pickle   the protocol 5 stream

or, with the flag _F_PACKED, no buffers and in place of the pickle a
payload that the queue's class packed and unpacks itself (_pack(),
_unpack(): tshm.torch's queues send a lone tensor so, with no pickling
on either side).

The receiver checks every field against the segments that arrived before it
uses them.  It maps the same pages: a received array is writable where the
sent one was, and shared with the sender.
"""

import errno
import pickle
import signal
import struct
import threading
import types

from . import _reduction, cuda
from ._sync import _ms
from . import _tshm
from ._tshm import QUEUE_MAX_FDS, QUEUE_MAX_SEGS, Segment, _Queue, _locate

_CudaBuffer = getattr(_tshm, "_CudaBuffer", None)  # built with CUDA's headers

_HEADER = struct.Struct("<4sHHI")
_BUFFER = struct.Struct("<IQQ")
_MAGIC = b"TSQ1"
_F_SEGMENTS = 1  # the pickle names Segment objects (_segment_at)
_F_PACKED = 2    # no pickle: the class's _unpack() reads the payload
_ALIGN = 64      # copied buffers start on a cache line
_PACKED_HEADER = _HEADER.pack(_MAGIC, 0, _F_PACKED, 0)

#: Buffers smaller than this travel in band (a copy through the ring is
#: cheaper than making and mapping a segment below about this size).
OOB_THRESHOLD = 32 * 1024

#: Types that pickle saves itself and that no hook here reduces, answered
#: first.  The C pickler asks reducer_override() about every object it has
#: no fast path for, functions and classes included (a tensor's message
#: names two, the callables of its reduce values); the pure-Python one
#: (_SlowEncoder) asks about every object.
PICKLED_AS_IS = frozenset({tuple, list, dict, set, frozenset, type,
                           types.FunctionType, types.BuiltinFunctionType})


def _timeout_ms(block, timeout):
    if not block:
        return 0
    return -1 if timeout is None else _ms(timeout)


def _raised_by_signal_handler(exc):
    """True if exc came out of a Python signal handler (its traceback
    passes through one), not out of the message."""
    handlers = set()
    for sig in signal.valid_signals():
        code = getattr(signal.getsignal(sig), "__code__", None)
        if code is not None:
            handlers.add(code)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in handlers:
            return True
        tb = tb.tb_next
    return False


def _rebuild_memoryview(buf, fmt, shape):
    mv = memoryview(buf).cast("B")
    if mv.format == fmt and mv.shape == shape:
        return mv  # cast() refuses empty views even to what they are
    return mv.cast(fmt, shape)


class _Split:
    """What one message is made of besides its pickle stream: its buffers
    and its segments.  Kept apart from the pickler so that the pickler's
    buffer_callback makes no reference cycle (which would keep the pickled
    objects, and views of segments, alive until the next gc run)."""

    def __init__(self, threshold, max_refs):
        self.threshold = threshold
        self.max_refs = max_refs
        self.segments = []   # Segment objects, in index order
        self.index = {}      # id(segment) -> index
        self.buffers = []    # (index, offset, length), or None: a copy
        self.copies = []     # (position in buffers, memoryview)
        self.named = False   # the stream names segments
        self.fds = []        # fds the message carries (send() copies them)

    def segment_index(self, seg, limit):
        i = self.index.get(id(seg))
        if i is None:
            if len(self.segments) >= limit:
                return None
            i = self.index[id(seg)] = len(self.segments)
            self.segments.append(seg)
        return i

    def buffer(self, pb):
        """pickle's buffer_callback: True keeps a buffer in band."""
        raw = pb.raw()
        n = raw.nbytes
        found = _locate(raw) if n else None
        if found is None and (n == 0 or n < self.threshold):
            return True  # (nothing to copy: no zero-size segment)
        if found is not None:
            # Leave a segment slot for the copies.
            i = self.segment_index(found[0], self.max_refs - 1)
            if i is not None:
                self.buffers.append((i, found[1], n))
                return False
        self.buffers.append(None)
        self.copies.append((len(self.buffers) - 1, raw))
        return False


_decoding = threading.local()   # .segments, .fds: the message's loading


def _segment_at(index):
    """A segment reference in a message's pickle: the index-th segment
    that came with the message being decoded in this thread (set by
    _decode()); anywhere else an error."""
    segments = getattr(_decoding, "segments", None)
    if segments is None:
        raise pickle.UnpicklingError(
            "a tshm.Queue segment reference outside a tshm.Queue message")
    if type(index) is not int or not 0 <= index < len(segments):
        raise pickle.UnpicklingError(f"bad segment reference {index!r}")
    return segments[index]


def _cuda_buffer_at(desc, seg_index, fd_index):
    """A GPU buffer in a message's pickle (_Hooks.cuda_ref): imported
    from its description, the message's segments and its fd."""
    segments = [_segment_at(i) for i in seg_index]
    fds = getattr(_decoding, "fds", ())
    if type(fd_index) is not int or not -1 <= fd_index < len(fds):
        raise pickle.UnpicklingError(f"bad fd reference {fd_index!r}")
    return cuda._unpack(desc, segments, fds[fd_index] if fd_index >= 0
                        else -1)


class _Hooks:
    """The pickler hooks: segments by reference, big bytes-like objects
    as out-of-band buffers.

    A segment is reduced here to ``_segment_at(index)``, which resolves
    against the segments that came with the message being decoded.
    (A persistent_id() would do the same, but the pickler calls it for
    every object of the message, ints and tuples included; reducer_override
    is called only for objects no atomic save handles.)"""

    def segment_ref(self, seg, limit):
        """The reduce value naming seg among the message's first limit
        segments, or None if it would be segment limit + 1."""
        i = self.split.segment_index(seg, limit)
        if i is None:
            return None
        self.split.named = True
        return _segment_at, (i,)

    def reducer_override(self, obj):
        t = type(obj)
        if t in PICKLED_AS_IS:
            return NotImplemented
        if t is Segment:
            ref = self.segment_ref(obj, QUEUE_MAX_SEGS)
            if ref is None:
                raise ValueError(
                    f"a message can name at most {QUEUE_MAX_SEGS} segments")
            return ref
        if t is memoryview:
            if not obj.c_contiguous:
                return NotImplemented
            # Only what the receiver can rebuild: cast() takes native
            # single-character formats only, and no empty view but bytes.
            # Refused here, the put fails as pickle's does; found in
            # get(), the message would be lost.
            try:
                _rebuild_memoryview(obj, obj.format, obj.shape)
            except (TypeError, ValueError):
                return NotImplemented
            return _rebuild_memoryview, (pickle.PickleBuffer(obj),
                                         obj.format, obj.shape)
        if (t is bytes or t is bytearray) and \
                len(obj) >= self.split.threshold:
            return t, (pickle.PickleBuffer(obj),)
        if t is _CudaBuffer:
            return self.cuda_ref(obj)
        return NotImplemented

    def cuda_ref(self, buf):
        """A GPU buffer (libtshm-cuda) travels as its description, its
        lease and anchor segments and, for VMM memory, the allocation's
        fd, all in this message: the receiver imports it from them."""
        desc, segs, fd = buf._pack()
        split = self.split
        index = []
        for seg in segs:
            i = split.segment_index(seg, QUEUE_MAX_SEGS - 1)
            if i is None:
                raise ValueError(
                    f"a message names at most {QUEUE_MAX_SEGS - 1} "
                    f"segments besides its copied bytes: each big CPU "
                    f"tensor one, each GPU buffer two (its lease and its "
                    f"allocation's anchor, which a pool's buffers share); "
                    f"put fewer in one message or take GPU buffers from "
                    f"one pool")
            index.append(i)
        split.named = True
        fd_index = -1
        if fd >= 0:
            # Buffers of one allocation (a pool's) share its fd: once.
            if fd in split.fds:
                fd_index = split.fds.index(fd)
            elif len(split.fds) >= QUEUE_MAX_FDS:
                raise ValueError(f"a message can carry buffers of at most "
                                 f"{QUEUE_MAX_FDS} GPU allocations")
            else:
                fd_index = len(split.fds)
                split.fds.append(fd)
        return _cuda_buffer_at, (desc, tuple(index), fd_index)


class _Route:
    """A pickler's buffer_callback: the split of the message it pickles
    now (a pickler is reused for the next message, _pickled())."""

    __slots__ = ("split",)

    def __init__(self, split):
        self.split = split

    def buffer(self, pb):
        return self.split.buffer(pb)


class _Sink:
    """The file a pickler writes to: the chunks it wrote, each bytes.  The
    C pickler hands write() a big in-band bytearray or PickleBuffer as the
    object itself, which a later reducer of the message may change: a
    file copies it at once, and so does this."""

    __slots__ = ("chunks",)

    def __init__(self, chunks):
        self.chunks = chunks

    def write(self, b):
        self.chunks.append(b if type(b) is bytes else bytes(b))


class _Encoder(_Hooks, pickle.Pickler):
    """The C pickler: fast, but never shows bytes to reducer_override."""

    def __init__(self, file, split):
        self.route = _Route(split)
        pickle.Pickler.__init__(self, file, protocol=5,
                                buffer_callback=self.route.buffer)
        self.split = split


class _SlowEncoder(_Hooks, pickle._Pickler):
    """The pure-Python pickler, which shows every object to
    reducer_override: the second try, for messages whose big bytes
    objects do not fit in band."""

    def __init__(self, file, split):
        self.route = _Route(split)
        pickle._Pickler.__init__(self, file, protocol=5,
                                 buffer_callback=self.route.buffer)
        self.split = split


_kept = threading.local()   # .picklers: encoder class -> (pickler, chunks)
#: A pickler that made a longer pickle is not kept: the C pickler's memo
#: table keeps its biggest size after clear_memo(), which walks all of it,
#: so one big message would slow every later one of the thread (and hold
#: the table's memory); a new pickler costs little next to a big message.
_KEEP_MAX = 8192


def _pickled(cls, obj, split):
    """obj's protocol 5 pickle (bytes) by an encoder of class cls with
    split's hooks.  The thread keeps one encoder of each class for its
    next messages: making one (protocol 5, its buffer_callback, its hooks
    looked up) costs as much as pickling a tensor's message.  An encoder
    is taken while it pickles, so that a reducer that puts to a queue
    meanwhile makes its own, and dropped if its dump() fails; one kept
    holds no object of the message (its memo is cleared, its split
    unset)."""
    kept = getattr(_kept, "picklers", None)
    if kept is None:
        kept = _kept.picklers = {}
    entry = kept.pop(cls, None)
    if entry is None:
        chunks = []
        entry = cls(_Sink(chunks), split), chunks
    pickler, chunks = entry
    pickler.split = pickler.route.split = split
    try:
        pickler.dump(obj)
    finally:
        pickler.clear_memo()
        pickler.split = pickler.route.split = None
    data = chunks[0] if len(chunks) == 1 and type(chunks[0]) is bytes \
        else b"".join(chunks)
    chunks.clear()
    if len(data) <= _KEEP_MAX:
        kept[cls] = entry
    return data


class Queue:
    """Queue(maxsize=64, max_msg=65536, ctx=None, *, oob_threshold=32768)

    A bounded multi-producer multi-consumer queue of Python objects in
    shared memory, for threads and processes alike.  ``maxsize`` messages
    fit; each carries at most ``max_msg`` bytes of pickle in the ring plus
    its big buffers as segments.  The API is queue.Queue's: put() raises
    queue.Full and get() queue.Empty when they time out; after close(),
    put() raises tshm.QueueClosed and get() drains what is queued, then
    raises it.

    A Queue can be passed to multiprocessing.Process(args=...) with every
    start method, and sent through another queue or pipe.  Pickling is
    trusted input, as with multiprocessing: share a queue only with
    processes you trust.
    """

    #: The picklers a message is made with: the fast one, then the one
    #: that moves every bytes object out of band (subclasses may add
    #: reducers, as tshm.torch does with multiprocessing's).
    _encoders = (_Encoder, _SlowEncoder)

    def __init__(self, maxsize=64, max_msg=65536, ctx=None, *,
                 oob_threshold=OOB_THRESHOLD):
        self._setup(_Queue(maxsize, max_msg, ctx), oob_threshold, ctx)

    def _setup(self, raw, oob_threshold, ctx=None):
        if oob_threshold < 0:
            raise ValueError("oob_threshold must not be negative")
        self._raw = raw
        self._ctx = ctx  # where copies are made: the queue's backend
        self._max_msg = raw.max_msg
        self._threshold = oob_threshold

    # -- pickling into a message ------------------------------------------

    def _encode(self, obj, handles):
        """The message for obj: (bytes, segments, split); split.fds are
        the fds it carries (its GPU buffers').  The fd handles its
        pickle made (nested Queues) are appended to handles."""
        room = self._max_msg
        fast, slow = self._encoders
        for cls, threshold in ((fast, self._threshold), (slow, 1)):
            enc = _Split(threshold, QUEUE_MAX_SEGS)
            with _reduction.withdrawn_unless_kept() as made:
                data = _pickled(cls, obj, enc)
                head = _HEADER.size + _BUFFER.size * len(enc.buffers)
                if head + len(data) <= room:
                    handles.extend(made)
                    made.clear()
                    break
        else:
            raise OSError(errno.EMSGSIZE,
                          f"message too long: {head + len(data)} bytes stay "
                          f"in band with every buffer out of band, the "
                          f"queue's max_msg is {room}")
        if len(enc.buffers) > 0xffff:
            raise ValueError("a message carries at most 65535 buffers")
        segments = enc.segments
        if enc.copies:
            if len(segments) >= QUEUE_MAX_SEGS:
                # Said before copying what may be gigabytes for nothing.
                raise ValueError(
                    f"a message can carry at most {QUEUE_MAX_SEGS} "
                    f"segments: this one names {len(segments)} and needs "
                    f"one more for its {len(enc.copies)} copied buffer(s)")
            segments = segments + [self._copy(enc, self._ctx)]
        flags = _F_SEGMENTS if enc.named else 0
        if not enc.buffers:
            return _HEADER.pack(_MAGIC, 0, flags, 0) + data, segments, enc
        out = bytearray(head)
        _HEADER.pack_into(out, 0, _MAGIC, len(enc.buffers), flags, 0)
        pos = _HEADER.size
        for b in enc.buffers:
            _BUFFER.pack_into(out, pos, *b)
            pos += _BUFFER.size
        out += data
        return out, segments, enc

    @staticmethod
    def _copy(enc, ctx):
        """Copy the buffers not in a segment into one new segment, in the
        queue's context (a queue takes segments of its own backend only)."""
        total = sum(-(-raw.nbytes // _ALIGN) * _ALIGN for _, raw in enc.copies)
        seg = Segment(total, "tshm.Queue", ctx=ctx)
        index = len(enc.segments)
        off = 0
        with memoryview(seg) as view:
            for pos, raw in enc.copies:
                n = raw.nbytes
                view[off:off + n] = raw
                enc.buffers[pos] = (index, off, n)
                off += -(-n // _ALIGN) * _ALIGN
        return seg

    # -- unpickling a message ----------------------------------------------

    def _pack(self, obj):
        """A packed message for obj (_F_PACKED): (payload, segments), or
        None to pickle it.  The base class packs nothing."""
        return None

    def _unpack(self, payload, segments):
        """The object of a packed message's payload (a memoryview), which
        came with segments (a tuple).  The base class reads none."""
        raise OSError(errno.EBADMSG, f"tshm.Queue: a packed message on a "
                      f"{type(self).__name__}, which reads none")

    def _decode(self, data, segments, fds=()):
        mv = memoryview(data)
        if len(mv) < _HEADER.size:
            raise OSError(errno.EBADMSG, "tshm.Queue: short message")
        magic, nbuf, flags, zero = _HEADER.unpack_from(mv, 0)
        pos = _HEADER.size + nbuf * _BUFFER.size
        if magic != _MAGIC or zero or flags & ~(_F_SEGMENTS | _F_PACKED) \
                or pos > len(mv) or \
                (flags & _F_PACKED and (flags != _F_PACKED or nbuf or fds)):
            raise OSError(errno.EBADMSG, "tshm.Queue: not a message of "
                          "this protocol (bad header)")
        if flags & _F_PACKED:
            return self._unpack(mv[pos:], segments)
        buffers = []
        for i in range(nbuf):
            idx, off, n = _BUFFER.unpack_from(mv, _HEADER.size + i * _BUFFER.size)
            if idx >= len(segments) or off > segments[idx].size - n or \
                    n > segments[idx].size:
                raise OSError(errno.EBADMSG, f"tshm.Queue: buffer {i} lies "
                              "outside the segments that came with it")
            buffers.append(memoryview(segments[idx])[off:off + n])
        if not flags & _F_SEGMENTS:
            return pickle.loads(mv[pos:], buffers=buffers)
        outer = getattr(_decoding, "segments", None), \
            getattr(_decoding, "fds", ())
        _decoding.segments, _decoding.fds = segments, fds
        try:
            return pickle.loads(mv[pos:], buffers=buffers)
        finally:
            _decoding.segments, _decoding.fds = outer

    # -- queue.Queue's API ---------------------------------------------------

    def put(self, obj, block=True, timeout=None):
        """Put obj on the queue, waiting up to timeout seconds for room
        (forever if None; not at all if block is false): queue.Full."""
        ms = _timeout_ms(block, timeout)
        packed = self._pack(obj)
        # (One too long for the queue's messages goes pickled, and is
        # spilled or refused as any other.)
        if packed is not None and \
                len(_PACKED_HEADER) + len(packed[0]) <= self._max_msg:
            payload, segments = packed
            self._raw.send(_PACKED_HEADER + payload, segments, ms)
            return
        with _reduction.withdrawn_unless_kept() as handles:
            data, segments, enc = self._encode(obj, handles)
            self._raw.send(data, segments, ms, enc.fds)
            handles.clear()  # queued: the receiver fetches them

    def get(self, block=True, timeout=None):
        """Remove and return an object, waiting up to timeout seconds
        (forever if None; not at all if block is false): queue.Empty."""
        # The message stays in hand until acknowledged: an interrupt
        # (KeyboardInterrupt, or any exception a signal handler raises)
        # anywhere before that, even as recv() returns, leaves it to the
        # next get() of this thread.  A message that fails to decode with
        # an Exception is dropped: given again it would fail again.
        data, segments, fds = self._raw.recv(_timeout_ms(block, timeout))
        try:
            obj = self._decode(data, segments, fds)
        except Exception as e:
            if not _raised_by_signal_handler(e):
                self._raw.done()
            raise
        self._raw.done()
        return obj

    def put_nowait(self, obj):
        """put(obj, block=False)"""
        self.put(obj, False)

    def get_nowait(self):
        """get(block=False)"""
        return self.get(False)

    def qsize(self):
        """Messages queued now (a snapshot)."""
        return len(self._raw)

    def empty(self):
        """True if nothing is queued now (a snapshot)."""
        return len(self._raw) == 0

    def full(self):
        """True if no room is left now (a snapshot)."""
        return len(self._raw) >= self._raw.capacity

    @property
    def maxsize(self):
        """Messages that fit."""
        return self._raw.capacity

    @property
    def max_msg(self):
        """Bytes of pickle one message may carry in the ring."""
        return self._max_msg

    def close(self):
        """Close the queue for every process: see the class docstring."""
        self._raw.close()

    def __reduce__(self):
        handle = _reduction.send_over_socket(self._raw._send_fd)
        if type(self) is Queue:
            return _rebuild_queue, (handle, self._threshold)
        return _rebuild_queue, (handle, self._threshold, type(self))

    def __repr__(self):
        return (f"<tshm.Queue maxsize={self.maxsize} "
                f"max_msg={self._max_msg} qsize={self.qsize()}>")


def _rebuild_queue(handle, threshold, cls=None):
    cls = Queue if cls is None else cls
    q = cls.__new__(cls)
    q._setup(_reduction.recv_over_socket(handle, _Queue._recv_fd), threshold)
    return q
