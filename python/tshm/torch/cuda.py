# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm.torch.cuda: CUDA tensors whose memory is a tshm GPU buffer.

A tensor made by empty() lives in a libtshm-cuda buffer (tshm.cuda).  Put
on a queue of a tshm.torch context, it travels as that buffer (its
description, lease and anchor segments, the allocation's fd) and the
receiver gets a CUDA tensor over the same device memory through DLPack,
no copy::

    t = tshm.torch.cuda.empty((4096, 4096), dtype=torch.float16,
                              device="cuda:0")
    t.normal_()
    q.put(t)                   # q = tshm.torch.get_context("spawn").Queue()
    tshm.torch.cuda.wait_released(t, timeout=30)   # every receiver let go

What torch's own CUDA sharing cannot do: the producer may exit right
after the put (the memory lives while a message or a receiver holds it),
and a receiver that is killed gives the memory back with its process.

Order between the processes' kernels:

* the sender's put() returns once the work queued so far on its current
  stream (and on streams given to record_stream()) has completed, so a
  receiver never reads before the producer's kernels finished.  torch
  hands the receiver an interprocess CUDA event instead; such an event
  dies with its producer (which may exit here right after the put) and
  lives in /dev/shm, both of which tshm exists to avoid;
* when a process's last tensor over a buffer is freed, an event is
  recorded on that thread's current stream (and on those given to
  record_stream()) and the buffer is let go (a pool sees it back, the
  memory may be freed) only once they completed, on a releaser thread:
  never under a kernel still using it.  Tensor.record_stream() does
  nothing for this memory (torch's allocator ignores pointers it did not
  allocate): use tshm.torch.cuda.record_stream().

Ordinary CUDA tensors keep torch's own path; a received tshm GPU tensor
cannot be sent on (clone() it).  Documentation/python/torch.rst has the
details.
"""

import errno
import multiprocessing.util
import os
import queue
import threading
import time
import warnings
import weakref

import torch
import torch.utils.dlpack

from .. import cuda as _tcuda
from .._tshm import _dlpack
from . import _alloc

__all__ = ["empty", "buffer", "wait_released", "record_stream"]

#: DLPack's device types (dlpack.h).
_DL_CPU, _DL_CUDA = 1, 2
#: DLPack's data type of a byte (kDLUInt, 8 bits): every tensor is built
#: as bytes and then given its dtype, so no dtype table is needed.
_DL_UINT, _BYTE_BITS = 1, 8

#: Reentrant: a tensor freed by the garbage collector while this thread
#: holds it lets go of its buffer through _Holder.__del__.
_lock = threading.RLock()
#: Device pointer -> weak references to the _Holders of tensors whose
#: storage starts there, in this process (CUDA's unified addressing gives
#: every device's memory its own addresses; a buffer received twice may be
#: imported once, at one address, for two holders).
_holders = {}


#: How long an exiting process waits for the GPU work its buffers wait for.
DRAIN_TIMEOUT = 60.0
#: A release whose events failed to synchronize is tried again after this.
_RETRY_S = 0.5


class _Streams:
    """The CUDA half: tensors on the GPU, ordered by stream waits.  The
    CUDA calls are the four methods at the top, so that the tests on a
    torch without CUDA stand in for them and run the rest."""

    dl_device = _DL_CUDA

    def current_stream(self, ordinal):
        return torch.cuda.current_stream(ordinal)

    def new_event(self):
        # Blocking: the releaser sleeps in synchronize(), not spins.
        return torch.cuda.Event(blocking=True)

    def capturing(self, streams):
        """Is any of streams being captured into a CUDA graph?"""
        for s in streams:
            with torch.cuda.stream(s):
                if torch.cuda.is_current_stream_capturing():
                    return True
        return False

    def torch_device(self, ordinal):
        return torch.device("cuda", ordinal)

    def __init__(self):
        self._release = None         # the releaser's queue, this process's
        self._thread = None
        self._exiting = False
        self._kept = []              # buffers freed under graph capture

    def ordinal(self, device):
        if device is None:
            return torch.cuda.current_device()
        device = torch.device("cuda", device) if isinstance(device, int) \
            else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"tshm.torch.cuda.empty() makes CUDA tensors, "
                             f"not {device.type!r} ones")
        return torch.cuda.current_device() if device.index is None \
            else device.index

    def written(self, ordinal, streams):
        """Sender: the work queued so far that may write the tensor has
        completed (see the module's docstring)."""
        for s in (self.current_stream(ordinal),) + streams:
            s.synchronize()          # without the GIL

    def release_after_use(self, holder):
        """Let go of holder.buf once the work queued so far that may use
        it completed, on the releaser thread."""
        streams = (self.current_stream(holder.ordinal),) + holder.streams
        if self.capturing(streams):
            # An event recorded during capture is a node of the graph,
            # which may replay over the buffer any time: keep it.
            self._kept.append(holder.buf)
            _warn("a tensor freed during CUDA graph capture keeps its "
                  "buffer until the process exits")
            return
        events = []
        for s in streams:
            ev = self.new_event()
            ev.record(s)
            events.append(ev)
        with _lock:
            exiting = self._exiting
            if not exiting and self._release is None:
                self._release = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=_releaser, args=(self._release,),
                    name="tshm.torch.cuda releaser", daemon=True)
                self._thread.start()
                # multiprocessing's workers leave by os._exit(), past
                # atexit, after running these (exitpriority >= 0).
                multiprocessing.util.Finalize(None, self.drain,
                                              exitpriority=10)
            if not exiting:
                self._release.put((events, holder.buf))
        if exiting:                  # no releaser any more: here, now
            _release_when_done(events, holder.buf, retry=False)

    def drain(self):
        """At exit: every buffer waiting for this process's work is let go
        once it completed (DRAIN_TIMEOUT at most); the releaser thread is
        stopped and joined (a daemon thread still in a CUDA call at
        interpreter shutdown may abort the process).  A tensor freed
        after this lets go of its buffer in the freeing thread."""
        with _lock:
            self._exiting = True
            release, thread = self._release, self._thread
            self._release = self._thread = None
        if release is not None:
            release.put(None)
            thread.join(DRAIN_TIMEOUT)
            if thread.is_alive():
                _warn(f"GPU work still pending after {DRAIN_TIMEOUT} s at "
                      f"exit: its buffers go with the process")

    def after_fork(self):
        """In a child: the parent's releaser thread is not here, and CUDA
        cannot be used (its buffers refuse to close here anyway)."""
        self._release = self._thread = None
        self._exiting = False
        self._kept = []


def _release_when_done(events, buf, retry=True):
    """Close buf once every event completed.  A failed synchronize (a
    graph capture in global mode elsewhere in the process refuses it; a
    broken context) is tried again, or without retry (exiting) leaves buf
    to the process's exit: never a close under running work."""
    warned = False
    while True:
        try:
            for ev in events:
                ev.synchronize()     # without the GIL
            break
        except BaseException as e:
            if not warned:
                _warn(f"waiting to release a GPU buffer: {e!r}" +
                      ("; retrying" if retry else ""))
                warned = True
            if not retry:
                return
            time.sleep(_RETRY_S)
    try:
        buf.close()
    except BaseException as e:
        _warn(f"releasing a GPU buffer: {e!r}")


def _releaser(work):
    while True:
        item = work.get()
        if item is None:
            return
        _release_when_done(*item)


def _warn(message):
    """A RuntimeWarning that never raises: turned into an error
    (-W error), it must not undo a release or kill the releaser."""
    try:
        warnings.warn(f"tshm.torch.cuda: {message}", RuntimeWarning)
    except BaseException:
        pass


class _HostMemory:
    """CPU tensors over the buffers: for tests on libtshm-cuda's fake
    driver, whose "device memory" is host memory, on a torch without
    CUDA.  Nothing to order: there are no streams."""

    dl_device = _DL_CPU

    def ordinal(self, device):
        if device is None:
            return 0
        if isinstance(device, int):
            return device
        return torch.device(device).index or 0

    def torch_device(self, ordinal):
        return torch.device("cpu")

    def written(self, ordinal, streams):
        pass

    def release_after_use(self, holder):
        holder.buf.close()

    def capturing(self, streams):
        return False

    def drain(self):
        pass

    def after_fork(self):
        pass


_streams = _Streams()


def _after_fork_in_child():
    global _lock
    _lock = threading.RLock()    # another thread may have held it
    _streams.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Holder:
    """What a tensor's storage holds, in the producer and in a receiver:
    the buffer, let go after this process's work on it (see the module's
    docstring).  A pool then hands it out again, a producer's unref may
    free it: neither under a kernel still using it."""

    __slots__ = ("buf", "ptr", "ordinal", "streams", "__weakref__")

    def __init__(self, buf, ordinal):
        self.buf = buf
        self.ptr = buf.ptr
        self.ordinal = ordinal
        self.streams = ()
        ref = weakref.ref(self)      # allocated before the lock: no
        with _lock:                  # collection runs in between
            _holders.setdefault(self.ptr, []).append(ref)

    def __del__(self):
        with _lock:
            refs = _holders.get(self.ptr)
            if refs is not None:
                # Our own weak reference is still alive in __del__.
                refs[:] = [r for r in refs if r() not in (None, self)]
                if not refs:
                    del _holders[self.ptr]
        try:
            _streams.release_after_use(self)
        except BaseException as e:
            # No releaser (thread limit, shutdown): wait for the device
            # here rather than free memory under a running kernel.
            _warn(f"releasing a GPU buffer in place: {e!r}")
            try:
                torch.cuda.synchronize(self.ordinal)
            except BaseException:
                pass                 # no CUDA left: nothing runs on it
            self.buf.close()


def _holder_of(tensor):
    """The _Holder under tensor's storage, or None (an ordinary tensor)."""
    if tensor.device.type != _streams.torch_device(0).type or \
            tensor.layout != torch.strided or tensor.is_quantized or \
            getattr(tensor, "is_nested", False):
        return None
    try:
        storage = _alloc.untyped(tensor)
    except (NotImplementedError, RuntimeError):
        return None                  # a subclass without storage
    with _lock:
        refs = list(_holders.get(storage.data_ptr(), ()))
    for ref in refs:
        h = ref()
        if h is not None and not h.buf.closed and \
                storage.nbytes() <= h.buf.size and \
                tensor.device == _streams.torch_device(h.ordinal):
            return h
    return None


def _over(buf, ordinal, nbytes, dtype, meta):
    """A tensor of dtype with geometry meta over buf's first nbytes, whose
    storage holds buf through a new _Holder."""
    offset, size, stride = meta
    cap = _dlpack(_Holder(buf, ordinal), buf.ptr, _streams.dl_device,
                  ordinal, (nbytes,), None, _DL_UINT, _BYTE_BITS)
    data = torch.utils.dlpack.from_dlpack(cap)
    t = torch.empty((0,), dtype=dtype, device=data.device)
    t.set_(_alloc.untyped(data), offset, size, stride)
    return t


def empty(shape, *, dtype=None, device=None, pool=None, timeout=None,
          requires_grad=False):
    """A contiguous CUDA tensor of shape and dtype (torch's default dtype
    if None) in a new tshm GPU buffer on device (the current CUDA device
    if None), or in a buffer of pool (a tshm.cuda.Pool of that device,
    waiting up to timeout seconds for one to come back).  Its values are
    not initialized, as torch.empty()'s."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in {shape}")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    # torch's own geometry for the shape, with no memory behind it.
    like = torch.empty(shape, dtype=dtype, device="meta")
    nbytes = like.numel() * like.element_size()
    ordinal = _streams.ordinal(device)
    dev = _tcuda.device(ordinal)
    if pool is None:
        g = dev.granularity
        buf = dev.alloc(max(g, -(-nbytes // g) * g))
    else:
        buf = pool.get(timeout)
        if buf.device.ordinal != ordinal or buf.size < nbytes:
            why = (f"the pool's buffers ({buf.size} bytes on device "
                   f"{buf.device.ordinal}) cannot hold {nbytes} bytes on "
                   f"device {ordinal}")
            buf.close()
            raise ValueError(why)
    t = _over(buf, ordinal, nbytes, dtype, (0, shape, like.stride()))
    t.requires_grad_(requires_grad)
    return t


def buffer(tensor):
    """The tshm.cuda.Buffer under tensor's storage, or None when tensor
    is not over one (an ordinary CUDA tensor)."""
    h = _holder_of(tensor)
    return None if h is None else h.buf


def _require(tensor):
    h = _holder_of(tensor)
    if h is None:
        raise ValueError("not a tensor over a tshm GPU buffer "
                         "(tshm.torch.cuda.empty() makes those)")
    return h


def wait_released(tensor, timeout=None):
    """Producer: wait until every process tensor's buffer was sent to let
    go of it (or died); True, or False when timeout seconds passed.
    timeout=0 polls."""
    return _require(tensor).buf.wait_released(timeout)


def record_stream(tensor, stream):
    """Tensor.record_stream() for tshm GPU tensors: work on stream also
    orders the buffer's hand-over (the put waits for it) and release (see
    the module's docstring)."""
    h = _require(tensor)
    with _lock:
        if stream not in h.streams:
            h.streams += (stream,)


def _reduce(tensor):
    """The reduce value of a tensor over a tshm GPU buffer, or None for
    any other tensor (torch's path, or the CPU strategy's)."""
    if not _holders:
        return None
    h = _holder_of(tensor)
    if h is None:
        return None
    buf = h.buf
    if not buf.producer:
        raise OSError(errno.EOPNOTSUPP, "a received tshm GPU tensor cannot "
                      "be sent on: clone() it, or send it from its producer")
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which "
            "requires_grad: call detach() on it before sending it")
    _streams.written(h.ordinal, h.streams)
    meta = (tensor.storage_offset(), tuple(tensor.size()),
            tuple(tensor.stride()))
    cls = type(tensor)
    return _rebuild, (None if cls is torch.Tensor else cls, buf,
                      _alloc.untyped(tensor).nbytes(), tensor.dtype, meta,
                      tensor.requires_grad)


def _rebuild(cls, buf, nbytes, dtype, meta, requires_grad):
    """The receiving half of _reduce(): buf was imported on this
    process's device (tshm.cuda)."""
    t = _over(buf, buf.device.ordinal, nbytes, dtype, meta)
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t if cls is None else t.as_subclass(cls)
