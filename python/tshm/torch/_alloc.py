# SPDX-License-Identifier: LGPL-2.1-or-later
"""CPU storages whose bytes live in tshm segments.

A large storage gets a segment of its own.  A small one (at most
SMALL_MAX bytes) is a slice of a shared arena segment of ARENA_SIZE bytes,
so that a batch of small tensors costs one kernel object, not one each:

* slices come in power-of-two size classes from 64 bytes (a cache line)
  to SMALL_MAX; a freed slice goes back on its class's free list;
* a freed slice is only reused while its arena has never left this
  process: once any slice of it is sent, a receiver maps the whole
  segment and may still hold that slice, so from then on the arena only
  hands out space never used before, and its pages are freed when the
  last storage over it dies in every process;
* after fork() both processes map every arena: neither allocates from
  them again.

Why SMALL_MAX is 64 KiB: below it the fixed cost of a segment (create,
mmap, an fd on the memfd backend, a /proc/tshm entry and page rounding)
outweighs copying the bytes; above it a slice would pin too much of an
arena (a kept 64 KiB slice pins at most 16x its size).
"""

import os
import threading
import weakref

import torch

from .._tshm import Segment

SMALL_MAX = 64 * 1024
ARENA_SIZE = 1024 * 1024
_MIN_CLASS = 64

_lock = threading.Lock()
_current = None                        # the arena new slices come from
_arenas = weakref.WeakValueDictionary()  # segment id -> _Arena


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


def _size_class(n):
    return max(_MIN_CLASS, 1 << (n - 1).bit_length())


class _Arena:
    def __init__(self):
        self.seg = Segment(ARENA_SIZE, "tshm.torch arena")
        self.top = 0
        self.free = {}          # size class -> [offsets]
        self.exported = False

    def take(self, size):
        lst = self.free.get(size)
        if lst:
            return lst.pop()
        if self.top + size > ARENA_SIZE:
            return None
        off = self.top
        self.top += size
        return off

    def give_back(self, size, off):
        with _lock:
            if not self.exported:
                self.free.setdefault(size, []).append(off)


def new_shared(nbytes):
    """A new UntypedStorage of nbytes in tshm shared memory."""
    return new_shared_view(nbytes)[0]


def new_shared_view(nbytes):
    """new_shared(), and the memoryview the storage holds: (storage,
    view).  The view lives exactly as long as a storage over it."""
    global _current
    if nbytes > SMALL_MAX:
        return storage_over(Segment(nbytes, "tshm.torch"), 0, nbytes)
    size = _size_class(max(nbytes, 1))
    with _lock:
        arena = _current
        off = arena.take(size) if arena is not None else None
        if off is None:
            arena = _current = _Arena()
            _arenas[arena.seg.id] = arena
            off = arena.take(size)
    storage, view = storage_over(arena.seg, off, nbytes)
    weakref.finalize(view, arena.give_back, size, off)
    return storage, view


def retire_current():
    """Start the next small storage in a new arena."""
    global _current
    with _lock:
        _current = None


def mark_exported(seg):
    """seg is about to leave this process: if it is an arena, never reuse
    its freed slices."""
    arena = _arenas.get(seg.id)
    if arena is None or arena.exported:
        return
    with _lock:
        arena.exported = True
        arena.free.clear()


def _forking():
    """Both sides of a fork map every arena: neither may hand out or
    reuse a slice of them any more."""
    global _current
    _current = None
    for arena in list(_arenas.values()):
        arena.exported = True
        arena.free.clear()


def _before_fork():
    _lock.acquire()


def _after_fork_parent():
    _forking()
    _lock.release()


def _after_fork_child():
    global _lock
    _lock = threading.Lock()
    _forking()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                    after_in_child=_after_fork_child)
