# SPDX-License-Identifier: LGPL-2.1-or-later
"""The queues of tshm.torch's multiprocessing contexts: multiprocessing's
Queue API over a tshm.Queue with multiprocessing's reducers.

multiprocessing.Queue is a pipe: it cannot carry an fd, so every object
that owns one (a tshm Segment, a storage under torch's file_descriptor
strategy) goes through multiprocessing's resource sharer on every send:
a connection, an authentication and a thread hop per message.  The
queues made here are tshm.Queues whose pickler also knows the reducers
registered with multiprocessing's ForkingPickler (torch's, and the "tshm"
strategy's), so a tensor pickles to (segment, offset, shape ...) and the
segment travels the queue's own way: a grant on the module, an fd in the
queue's socket on the fallback, and nothing at all for a segment the
receiver already holds.  The sender may drop the tensor at once (the
message holds the segment); a message never received is freed with the
queue, SIGKILL included (not what crossed through the resource sharer:
see the last item below).  A message that is one plain tensor is not
pickled at all: ForkingQueue._pack() sends its fields as one struct
(_reductions.pack_tensor()), a few microseconds less on each side.

What differs from multiprocessing.Queue, and why:

* capacity: maxsize=0 ("unbounded") is DEFAULT_CAPACITY (1024)
  messages, not unbounded: the ring is shared memory of a fixed size.
  A put() beyond it waits for room as a bounded multiprocessing.Queue's
  does, so a producer that puts more than that before anyone gets
  deadlocks where multiprocessing.Queue would not.  maxsize is at most
  MAX_CAPACITY (65536), and above 16320 messages carry less pickle in
  the ring (_max_msg_for());
* no feeder thread: put() has queued the object when it returns (a later
  change to a mutable object is not seen), so join_thread() and
  cancel_join_thread() have nothing to do;
* close() lets go of this process's handle only, as multiprocessing's
  does (put() and get() then raise ValueError); the queue lives as long
  as any process holds it;
* an object whose pickle does not fit a message even with every buffer
  out of band (a list of a million ints) is pickled with ForkingPickler
  and sent as one out-of-band buffer: correct, not fast;
* a message carries QUEUE_MAX_SEGS segments: beyond the first
  QUEUE_MAX_SEGS - 1 (a batch of that many big tensors in separate
  segments), the others cross as ForkingPickler sends them, through the
  resource sharer, and so do a spilled object's.  Known limit: those are
  held by the sender's resource sharer, not by the message, so the
  sender must live until they are received, and a message never
  received leaves them pinned for as long as the sender lives
  (Documentation/python/torch.rst).
"""

import errno
import multiprocessing.reduction as _mpred

import torch

from .. import _queue, _reduction
from .._tshm import QUEUE_MAX_SEGS, Segment
from . import _reductions
from ._reductions import sending_as_tshm

_Tensor = torch.Tensor

#: Messages a queue made with maxsize=0 holds.
DEFAULT_CAPACITY = 1024
#: Bytes of pickle one message carries in the ring: a batch of a few
#: hundred tensors (about 100 bytes each) fits.
MAX_MSG = 64 * 1024
#: The most messages a queue holds, and the bytes of its ring: libtshm's
#: limits (tshm_queue_create() refuses more with EINVAL, E2BIG).
MAX_CAPACITY = 65536
_RING_MAX = 1 << 30


def _max_msg_for(capacity):
    """MAX_MSG, or less for a queue of more than 16384 messages, so that
    its ring fits (a slot is the message and a small header): its bigger
    messages are spilled (see the module's docstring)."""
    if not 0 < capacity <= MAX_CAPACITY:
        raise ValueError(f"a tshm.torch queue holds 1 to {MAX_CAPACITY} "
                         f"messages, not {capacity} (maxsize=0: "
                         f"{DEFAULT_CAPACITY})")
    return min(MAX_MSG, (_RING_MAX // capacity - 256) // 1024 * 1024)


class _Reducers:
    """multiprocessing's reducers, and no failure for a message naming
    more segments than the queue carries: the first QUEUE_MAX_SEGS - 1
    (a slot stays free for copied buffers) go by reference, the rest the
    way ForkingPickler sends a segment (an fd through multiprocessing's
    resource sharer, tshm/_reduction.py).

    ForkingPickler copies copyreg's table and its own reducers into a
    new dispatch table for every pickler; looking its reducers up here,
    in reducer_override (which the pickler calls for every object no
    atomic save handles), costs nothing per message."""

    def reducer_override(self, obj):
        t = type(obj)
        if t is Segment:
            ref = self.segment_ref(obj, QUEUE_MAX_SEGS - 1)
            if ref is not None:
                return ref
            return NotImplemented     # copyreg's table: an fd
        reduce = _mpred.ForkingPickler._extra_reducers.get(t)
        if reduce is not None:
            return reduce(obj)
        if t in _queue.PICKLED_AS_IS:
            return NotImplemented
        return super().reducer_override(obj)


class _Encoder(_Reducers, _queue._Encoder):
    pass


class _SlowEncoder(_Reducers, _queue._SlowEncoder):
    pass


class _Spilled:
    """An object too big for a message: its ForkingPickler pickle."""

    def __init__(self, data):
        self.data = data


def _unspill(data):
    return _mpred.ForkingPickler.loads(data)


class ForkingQueue(_queue.Queue):
    """A tshm.Queue that pickles with multiprocessing's reducers.

    It waits as libtshm does by default: spins about 50 us, then sleeps.
    A tensor's message is pickled in a few microseconds, so a receiver
    that spins mostly catches the next message without a sleep; a futex
    wake-up costs the sender tens of microseconds where the machine's
    CPUs are virtual (bench/torch-bench.py)."""

    _encoders = (_Encoder, _SlowEncoder)

    def _pack(self, obj):
        """A lone CPU tensor that its reducer would send as a segment
        goes packed, unpickled (_reductions.pack_tensor()), while that
        reducer is the one registered for it."""
        if type(obj) is _Tensor and _mpred.ForkingPickler._extra_reducers \
                .get(_Tensor) is _reductions.reduce_tensor:
            return _reductions.pack_tensor(obj)
        return None

    def _unpack(self, payload, segments):
        return _reductions.unpack_tensor(payload, segments)

    def put(self, obj, block=True, timeout=None):
        # Whatever the strategy in this process (a tshm.torch queue handed
        # to torch.multiprocessing.spawn's workers, or a process that
        # uninstalled tshm), a CPU tensor goes as a segment: torch's way
        # would send an fd through a resource sharer that dies with this
        # process, leaving the message unreadable once it exits.
        with sending_as_tshm():
            return self._put(obj, block, timeout)

    def _put(self, obj, block, timeout):
        try:
            return super().put(obj, block, timeout)
        except OSError as e:
            if e.errno != errno.EMSGSIZE:
                raise
        # The fds its pickle hands to the resource sharer are taken back
        # unless the put succeeds (queue.Full, an interrupt).
        with _reduction.withdrawn_unless_kept() as handles:
            data = bytearray(_mpred.ForkingPickler.dumps(obj))
            super().put(_Spilled(data), block, timeout)
            handles.clear()

    def get(self, block=True, timeout=None):
        obj = super().get(block, timeout)
        if type(obj) is _Spilled:
            return _unspill(obj.data)
        return obj


def _no_negative(block, timeout):
    """multiprocessing's timeout: a negative one is no wait (its
    semaphore clamps it to 0), not queue.Queue's ValueError."""
    if block and timeout is not None and timeout < 0:
        return 0
    return timeout


class Queue:
    """multiprocessing.Queue's API over a ForkingQueue (see the module's
    docstring for what differs)."""

    def __init__(self, maxsize=0, *, ctx=None):
        cap = maxsize if maxsize > 0 else DEFAULT_CAPACITY
        self._q = ForkingQueue(cap, _max_msg_for(cap))
        self._maxsize = maxsize

    def _live(self):
        if self._q is None:
            raise ValueError(f"Queue {self!r} is closed")
        return self._q

    def put(self, obj, block=True, timeout=None):
        """Queue obj: waits for room as multiprocessing.Queue.put()
        (queue.Full).  maxsize=0 is a ring of DEFAULT_CAPACITY messages,
        not unbounded: a put() beyond that many unreceived messages
        waits for a get(); see the module's docstring."""
        q = self._q or self._live()     # (inline: a put costs microseconds)
        q.put(obj, block,
              timeout if timeout is None else _no_negative(block, timeout))

    def get(self, block=True, timeout=None):
        q = self._q or self._live()
        return q.get(block,
                     timeout if timeout is None else _no_negative(block,
                                                                  timeout))

    def put_nowait(self, obj):
        self._live().put(obj, False)

    def get_nowait(self):
        return self._live().get(False)

    def qsize(self):
        return self._live().qsize()

    def empty(self):
        if self._q is None:     # multiprocessing's: its pipe is closed
            raise OSError("handle is closed")
        return self._q.empty()

    def full(self):
        return self._live().full()

    def close(self):
        """Done with the queue in this process: lets go of this handle
        (multiprocessing's close(): the queue stays open for the others);
        put(), get(), qsize() and full() on it raise ValueError from
        now on, empty() OSError as multiprocessing's does."""
        self._q = None

    def join_thread(self):
        """Nothing to wait for: there is no feeder thread."""

    def cancel_join_thread(self):
        """Nothing to cancel: there is no feeder thread."""

    def __reduce__(self):
        return _rebuild, (self._live(), self._maxsize)

    def __repr__(self):
        return f"<tshm.torch Queue over {self._q!r}>"


def _rebuild(q, maxsize):
    self = Queue.__new__(Queue)
    self._q = q
    self._maxsize = maxsize
    return self


class SimpleQueue:
    """multiprocessing.SimpleQueue's API over a ForkingQueue: a ring of
    DEFAULT_CAPACITY messages, where put() waits for room."""

    def __init__(self, *, ctx=None):
        self._q = ForkingQueue(DEFAULT_CAPACITY, MAX_MSG)

    def _live(self):
        # multiprocessing's SimpleQueue is a closed pipe then: OSError.
        if self._q is None:
            raise OSError("handle is closed")
        return self._q

    def put(self, obj):
        self._live().put(obj)

    def get(self):
        return self._live().get()

    def empty(self):
        return self._live().empty()

    def close(self):
        """Done with the queue in this process: lets go of this handle."""
        self._q = None

    def __reduce__(self):
        return _rebuild_simple, (self._live(),)


def _rebuild_simple(q):
    self = SimpleQueue.__new__(SimpleQueue)
    self._q = q
    return self
