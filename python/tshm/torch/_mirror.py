# SPDX-License-Identifier: LGPL-2.1-or-later
"""Sending a tensor whose storage is not in a segment: the storage's mirror.

torch's strategies share such a storage in place: share_memory_() swaps
the memory under its StorageImpl, so every tensor over it (a base and all
its views) is shared from then on, and sending the 16 chunks of
``big.split()`` copies ``big`` once.  Python cannot swap a StorageImpl's
memory.  Moving only the tensor sent (``tensor.data =`` a tensor over a
new segment) would copy the whole storage once per view sent: 16 chunks
of a 1 GiB tensor, 16 GiB of segments, none shared with another.

So a storage gets one mirror: a tshm storage of its size, into which the
tensors moved off it point, each at its own offset.  A move copies only
the bytes of the tensor moved that no earlier move copied (its span less
the mirror's claimed ranges), and claims them: from then on the mirror
holds those bytes for every tensor moved, the old storage for the ones
that were not.  The 16 chunks are one copy of ``big`` in one segment, and
their receivers share it as torch's would.

Two tensors over one storage can disagree after one of them moved: a
write through one that was not moved lands in the old memory only.  A
move never changes what a tensor of this process reads, so a tensor whose
span overlaps claimed bytes that differ from its own gets a new mirror:
a copy, as a second share_memory_() of a private copy would be.

What still differs from torch (Documentation/python/torch.rst): tensors
over the old storage that were not sent keep the old, private memory; the
mirror's bytes that no moved tensor spans are zeros, which a receiver
sees only by reaching outside its tensor through the storage.

A mirror is found by its old storage's StorageImpl (its ``_cdata``)
while that storage lives and a storage over the mirror lives in this
process; otherwise the next move starts another.  The entry holds a torch
weak reference to the StorageImpl, which says whether it lives and keeps
its address from being handed to another one meanwhile.  Two storages
over the same bytes (two ``frombuffer()`` of one buffer) get a mirror
each, as each would be moved on its own by torch's share_memory_().
"""

import bisect
import os
import threading
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _alloc

_lock = threading.Lock()
_mirrors = {}          # old storage's _cdata -> _Mirror
_prune_at = 64         # prune dead entries when the table grows past this


def _bytes(storage, lo, hi):
    """A uint8 tensor over storage's bytes [lo, hi)."""
    return torch.empty((0,), dtype=torch.uint8).set_(storage, lo, (hi - lo,))


def span(tensor):
    """[lo, hi): the bytes of its storage that tensor reaches, or None."""
    if tensor.numel() == 0:
        return None
    last = tensor.storage_offset() + sum(
        (n - 1) * s for n, s in zip(tensor.size(), tensor.stride()))
    size = tensor.element_size()
    return tensor.storage_offset() * size, (last + 1) * size


class _Mirror:
    __slots__ = ("old", "view", "starts", "ends")

    def __init__(self, old, view):
        self.old = StorageWeakRef(old)
        self.view = weakref.ref(view)  # alive while a storage over it is
        self.starts = []               # claimed ranges [start, end):
        self.ends = []                 # sorted, disjoint, not touching

    def storage(self):
        """A storage over the mirror's bytes, or None if it is gone."""
        view = self.view()
        if view is None or self.old.expired():
            return None
        return _alloc.untyped(torch.frombuffer(view, dtype=torch.uint8))

    def _around(self, lo, hi):
        """Indices [i, j) of the claimed ranges that overlap or touch
        [lo, hi)."""
        return bisect.bisect_left(self.ends, lo), \
            bisect.bisect_right(self.starts, hi)

    def overlaps(self, lo, hi):
        """The claimed parts of [lo, hi)."""
        i, j = self._around(lo, hi)
        return [(max(lo, self.starts[k]), min(hi, self.ends[k]))
                for k in range(i, j)
                if self.starts[k] < hi and self.ends[k] > lo]

    def claim(self, lo, hi):
        """Claim [lo, hi); return its parts that were not claimed."""
        i, j = self._around(lo, hi)
        gaps, pos = [], lo
        for k in range(i, j):
            if self.starts[k] > pos:
                gaps.append((pos, self.starts[k]))
            pos = max(pos, self.ends[k])
        if pos < hi:
            gaps.append((pos, hi))
        if i < j:
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j] = [lo]
        self.ends[i:j] = [hi]
        return gaps


def _agrees(mirror, new, old, lo, hi):
    """True if every claimed byte of [lo, hi) is the same in both."""
    return all(torch.equal(_bytes(new, a, b), _bytes(old, a, b))
               for a, b in mirror.overlaps(lo, hi))


def _prune():
    global _prune_at
    for key, mirror in list(_mirrors.items()):
        if mirror.view() is None or mirror.old.expired():
            del _mirrors[key]
    _prune_at = max(64, 2 * len(_mirrors))


def storage_for(tensor, old):
    """The mirror storage of old (tensor's storage, not in a segment, of
    at least one byte) with tensor's bytes in it: a move of tensor onto
    it changes nothing tensor reads."""
    reach = span(tensor)
    with _lock:
        mirror = _mirrors.get(old._cdata)
        new = mirror.storage() if mirror is not None else None
        if new is not None and reach is not None and \
                not _agrees(mirror, new, old, *reach):
            new = None
        if new is None:
            new, view = _alloc.new_shared_view(old.nbytes())
            mirror = _mirrors[old._cdata] = _Mirror(old, view)
            if len(_mirrors) > _prune_at:
                _prune()
        if reach is not None:
            for lo, hi in mirror.claim(*reach):
                _bytes(new, lo, hi).copy_(_bytes(old, lo, hi))
    return new


def _before_fork():
    _lock.acquire()


def _after_fork_parent():
    _lock.release()


def _after_fork_child():
    # A child's old storages are its own copies: moving them into the
    # parent's mirrors would change what the parent's tensors read.
    global _lock
    _lock = threading.Lock()
    _mirrors.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                    after_in_child=_after_fork_child)
