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
span overlaps claimed bytes that differ from its own gets a mirror of its
own (a copy, as a second share_memory_() of a private copy would be); the
storage's mirror stays for the tensors that agree with it.

What still differs from torch (Documentation/python/torch.rst): tensors
over the old storage that were not sent keep the old, private memory; the
mirror's bytes that no moved tensor spans are zeros, which a receiver
sees only by reaching outside its tensor through the storage.

Lifetimes.  A mirror is one UntypedStorage: every tensor moved into it
shares that StorageImpl, as the views of a storage torch shared do (so
torch.save() and deepcopy() see one storage).  The table finds it by the
old storage's StorageImpl (``_cdata``) while:

* the old storage lives, at the same address and size (resize_() and
  out= reallocate a storage in place: then it is another one); the entry
  holds a torch weak reference to the old StorageImpl, which also keeps
  its address from being handed to another one meanwhile;
* the tensor it was made for, or that tensor's base (``_base``: the views
  of one tensor share it), lives: until then the table holds the mirror,
  so that views sent as temporaries (``q.put(big[i])``) share it too.
  When that tensor dies, a finalizer lets go, and the mirror lives as
  long as the tensors moved into it.
"""

import bisect
import os
import threading
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import _alloc

_lock = threading.RLock()   # guards the table and claims; no finalizer
_mirrors = {}              # old storage's _cdata -> _Mirror
_prune_at = 64             # prune dead entries when the table grows past this


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
    __slots__ = ("old", "where", "storage", "starts", "ends")

    def __init__(self, old):
        self.old = StorageWeakRef(old)
        self.where = (old.data_ptr(), old.nbytes())
        self.storage = _alloc.new_shared(old.nbytes())
        self.starts = []          # claimed ranges [start, end):
        self.ends = []            # sorted, disjoint, not touching

    def serving(self, old):
        """The mirror's storage while it is old's mirror (see the module's
        docstring), else None.  Read once: a finalizer may let go of it
        at any allocation."""
        storage = self.storage
        if self.old.expired() or self.where != (old.data_ptr(), old.nbytes()):
            return None
        return storage

    def let_go(self):
        """The finalizer of the tensor it was made for: the table stops
        holding the mirror (an attribute store: safe in a finalizer)."""
        self.storage = None

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

    def gaps(self, lo, hi):
        """The parts of [lo, hi) not claimed."""
        i, j = self._around(lo, hi)
        gaps, pos = [], lo
        for k in range(i, j):
            if self.starts[k] > pos:
                gaps.append((pos, self.starts[k]))
            pos = max(pos, self.ends[k])
        if pos < hi:
            gaps.append((pos, hi))
        return gaps

    def claim(self, lo, hi):
        """Add [lo, hi) to the claimed ranges (once its gaps are copied:
        a copy that failed claims nothing)."""
        i, j = self._around(lo, hi)
        if i < j:
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j] = [lo]
        self.ends[i:j] = [hi]


def _agrees(mirror, storage, old, lo, hi):
    """True if every byte of [lo, hi) the mirror claimed is the same in
    its storage and in old."""
    return all(torch.equal(_bytes(storage, a, b), _bytes(old, a, b))
               for a, b in mirror.overlaps(lo, hi))


def _prune():
    global _prune_at
    for key, mirror in list(_mirrors.items()):
        if mirror.storage is None or mirror.old.expired():
            del _mirrors[key]
    _prune_at = max(64, 2 * len(_mirrors))


def _new_mirror(tensor, old):
    """old's mirror, in the table while tensor (or its base) lives."""
    mirror = _mirrors[old._cdata] = _Mirror(old)
    base = tensor._base if tensor._base is not None else tensor
    weakref.finalize(base, mirror.let_go)
    if len(_mirrors) > _prune_at:
        _prune()
    return mirror


def storage_for(tensor, old):
    """The storage to move tensor onto: old's mirror (old: tensor's
    storage, not in a segment, of at least one byte) with tensor's bytes
    in it, so that the move changes nothing tensor reads."""
    reach = span(tensor)
    with _lock:
        mirror = _mirrors.get(old._cdata)
        storage = mirror.serving(old) if mirror is not None else None
        if storage is None:
            mirror = _new_mirror(tensor, old)
            storage = mirror.storage
        elif reach is not None and not _agrees(mirror, storage, old, *reach):
            mirror = _Mirror(old)        # its own, not in the table
            storage = mirror.storage
        if reach is not None:
            for a, b in mirror.gaps(*reach):
                _bytes(storage, a, b).copy_(_bytes(old, a, b))
            mirror.claim(*reach)
        return storage


def _before_fork():
    # A handler may raise before or as the lock is taken: the fork goes
    # on (an at-fork hook's exception is only reported), and the parent
    # then releases only a lock this thread holds, never another's.
    _lock.acquire()


def _after_fork_parent():
    try:
        _lock.release()     # RuntimeError: this thread does not hold it
    except RuntimeError:
        pass


def _after_fork_child():
    # A child's old storages are its own copies: moving them into the
    # parent's mirrors would change what the parent's tensors read.
    global _lock
    _lock = threading.RLock()
    _mirrors.clear()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                    after_in_child=_after_fork_child)
