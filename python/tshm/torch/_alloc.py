# SPDX-License-Identifier: LGPL-2.1-or-later
"""CPU storages whose bytes live in tshm segments.

A large storage gets a segment of its own.  A small one (at most
SMALL_MAX bytes) is a slice of a shared arena segment of ARENA_SIZE bytes,
so that a batch of small tensors costs one kernel object, not one each:

* slices are cut one after the other, each on a cache line (64 bytes),
  and never handed out twice: a slice sent anywhere, or reached through
  the segment by a numpy array or a memoryview, may be held by a
  receiver after its storage died here, and nothing here can tell.  A
  new arena starts when one is full; its pages are freed when the last
  storage over it dies in every process.  So a kept slice keeps its
  whole arena's pages (those that were used: the slices cut before the
  arena filled) in memory: keep small tensors of many batches by
  cloning them;
* after fork() both processes map the current arena: neither cuts from
  it again (each would hand out the same bytes).

Why SMALL_MAX is 64 KiB: below it the fixed cost of a segment (create,
mmap, an fd on the memfd backend, a /proc/tshm entry and page rounding)
outweighs copying the bytes; above it a slice would pin too much of an
arena (a kept 64 KiB slice pins at most 16x its size).
"""

import os
import threading

import torch

from .._tshm import Segment

SMALL_MAX = 64 * 1024
ARENA_SIZE = 1024 * 1024
_ALIGN = 64

_lock = threading.RLock()      # guards _current; no finalizer takes it
_current = None               # the arena new slices are cut from


#: The untyped storage of a tensor: untyped_storage() on torch 2.x,
#: _storage() on 1.13 (whose storage() builds a TypedStorage in Python
#: first, ten times slower).
untyped = getattr(torch.Tensor, "untyped_storage", None) or \
    torch.Tensor._storage


def view_over(seg, offset, nbytes):
    """A memoryview of seg[offset:offset+nbytes]: it keeps the segment
    mapped as long as it (or what is built over it) lives."""
    return memoryview(seg)[offset:offset + nbytes]


def storage_over(seg, offset, nbytes):
    """An UntypedStorage over seg[offset:offset+nbytes], no copy.  The
    storage keeps the segment mapped (through a memoryview) until torch
    frees it.  Returns (storage, view)."""
    if nbytes == 0:
        return torch.UntypedStorage(0), None
    view = view_over(seg, offset, nbytes)
    storage = untyped(torch.frombuffer(view, dtype=torch.uint8))
    return storage, view


class _Arena:
    def __init__(self):
        self.seg = Segment(ARENA_SIZE, "tshm.torch arena")
        self.top = 0

    def cut(self, size):
        """The offset of size new bytes, or None if they do not fit."""
        if self.top + size > ARENA_SIZE:
            return None
        off = self.top
        self.top += -(-size // _ALIGN) * _ALIGN
        return off


def new_shared(nbytes):
    """A new UntypedStorage of nbytes in tshm shared memory, zeros (bytes
    never used before)."""
    global _current
    if nbytes < 0:
        raise RuntimeError(f"cannot allocate a storage of {nbytes} bytes")
    if nbytes > SMALL_MAX:
        return storage_over(Segment(nbytes, "tshm.torch"), 0, nbytes)[0]
    with _lock:
        arena = _current
        off = arena.cut(nbytes) if arena is not None else None
        if off is None:
            arena = _current = _Arena()
            off = arena.cut(nbytes)
    return storage_over(arena.seg, off, nbytes)[0]


def retire_current():
    """Cut the next small storage from a new arena."""
    global _current
    with _lock:
        _current = None


def _before_fork():
    # A handler may raise before or as the lock is taken: the fork goes
    # on (an at-fork hook's exception is only reported), and the parent
    # then releases only a lock this thread holds, never another's.
    _lock.acquire()


def _after_fork_parent():
    global _current
    _current = None
    try:
        _lock.release()     # RuntimeError: this thread does not hold it
    except RuntimeError:
        pass


def _after_fork_child():
    global _lock, _current
    _lock = threading.RLock()
    _current = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                    after_in_child=_after_fork_child)
