# SPDX-License-Identifier: GPL-2.0
"""tshm.torch's allocator of small storages (slices of arena segments):
a slice is never handed out twice, and nothing in it can deadlock with
the garbage collector."""

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tshm  # noqa: E402
import tshm.torch  # noqa: E402
# The autouse fixture strategy (tshm installed, then torch's default back):
from test_torch import strategy  # noqa: E402,F401


def test_a_slice_reached_through_numpy_is_not_handed_out_again():
    """A slice that left as a numpy array (by reference through a
    tshm.Queue: the segment, not the storage, is sent) is still the
    receiver's after the sender's storage died: the next small storage
    is somewhere else."""
    tshm.torch._alloc.retire_current()      # an arena never sent
    q = tshm.Queue()
    t = torch.zeros(1000).share_memory_()
    q.put(t.numpy())
    arr = q.get()
    del t
    u = torch.full((1000,), 7.0).share_memory_()
    assert arr.tolist() == [0.0] * 1000 and u[0].item() == 7.0


_COLLECT_UNDER_LOCKS = """
    import gc, torch, tshm.torch
    from tshm.torch import _alloc, _mirror
    tshm.torch.install()
    gc.disable()

    class Cycle:
        pass

    c = Cycle()
    c.self = c                      # garbage only the collector frees,
    c.t = torch.empty(100)          # holding a small storage's slice
    c.t.share_memory_()             # (moved into its mirror)
    del c
    # A collection starts at whatever allocation crosses the threshold,
    # the allocator's own included, and runs the finalizers of what it
    # frees there, on this thread: none may take these locks.
    with _alloc._lock, _mirror._lock:
        gc.collect()
    print("done")
"""


def test_the_collector_freeing_slices_takes_no_lock():
    """Storages in reference cycles die inside a garbage collection, which
    may start under the allocator's locks (the reviewer's stress loop hung
    so: a finalizer gave the slice back under the arena lock, already
    held by the same thread)."""
    r = subprocess.run([sys.executable, "-c",
                        textwrap.dedent(_COLLECT_UNDER_LOCKS)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.strip()) == (0, "done"), r.stderr
