#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""One-way latency of Python objects between two processes: tshm.Queue
against multiprocessing.Queue (pickled in band through a pipe) and
multiprocessing.shared_memory plus a Queue carrying the name (the manual
way), all measured in this run, with ratios.

    PYTHONPATH=build/python /usr/bin/python3 bench/python-bench.py [--quick]

Method: the parent puts an object, the child takes it, touches its first
and last byte (so the mapping is really there) and answers with a small
acknowledgement on a second queue of the same kind; the one-way latency of
the object is that round trip less the one-way latency of the small
acknowledgement, measured alone (half of a small-object ping-pong).  The
median of many rounds is reported.  "fresh": a new ordinary array each
round (tshm copies it into a segment; shared_memory copies it into a new
block); "in segment": the same array, already in shared memory, sent again
(tshm by reference, shared_memory by name).
"""

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

import tshm

MiB = 1 << 20


def child(kind, inq, outq):
    """Take objects, touch them, acknowledge; None ends."""
    while True:
        m = inq.get()
        if m is None:
            return
        if kind == "shm" and isinstance(m, tuple):
            name, shape, dtype = m
            blk = shared_memory.SharedMemory(name)
            # Attaching registers the block with the resource tracker as
            # if this process owned it (CPython issue 82300): undo that.
            resource_tracker.unregister(blk._name, "shared_memory")
            a = np.ndarray(shape, dtype, blk.buf)
            ok = int(a.flat[0]) + int(a.flat[-1])
            del a
            blk.close()
        elif isinstance(m, np.ndarray):
            ok = int(m.flat[0]) + int(m.flat[-1])
        else:
            ok = 0
        outq.put(ok)


class Peer:
    """A child process and the two queues of one kind."""

    def __init__(self, kind):
        self.kind = kind
        if kind == "tshm":
            self.inq, self.outq = tshm.Queue(4), tshm.Queue(4)
        else:
            self.inq, self.outq = mp.Queue(4), mp.Queue(4)
        self.proc = mp.get_context("fork").Process(
            target=child, args=(kind, self.inq, self.outq))
        self.proc.start()
        self.blocks = []

    def send(self, obj):
        if self.kind == "shm" and isinstance(obj, np.ndarray):
            # The manual way: a new block, the array copied in, its name
            # sent; the block is unlinked once the round is measured.
            blk = shared_memory.SharedMemory(create=True, size=obj.nbytes)
            np.ndarray(obj.shape, obj.dtype, blk.buf)[...] = obj
            self.blocks.append(blk)
            obj = (blk.name, obj.shape, obj.dtype.str)
        self.inq.put(obj)
        self.outq.get()

    def unlink_blocks(self):
        for b in self.blocks:
            b.close()
            b.unlink()
        self.blocks = []

    def close(self):
        self.inq.put(None)
        self.proc.join()
        self.unlink_blocks()


def rounds(peer, make, n):
    times = []
    for _ in range(n):
        obj = make()
        t0 = time.perf_counter_ns()
        peer.send(obj)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def measure(quick):
    n_small = 500 if quick else 3000
    sizes = [("1 MiB", MiB, 50 if quick else 300),
             ("64 MiB", 64 * MiB, 5 if quick else 20)]
    rows = []
    peers = {k: Peer(k) for k in ("tshm", "mp", "shm")}
    ack = {}
    for k, p in peers.items():
        # A small object's one-way latency (half a ping-pong): the ack.
        rounds(p, lambda: 1, 100)
        ack[k] = rounds(p, lambda: 1, n_small) / 2
    rows.append(("small object", ack["tshm"], ack["mp"], ack["shm"]))
    for label, size, n in sizes:
        for how in ("fresh", "in segment"):
            res = {}
            for k, p in peers.items():
                if k == "shm" and how == "in segment":
                    blk = shared_memory.SharedMemory(create=True, size=size)
                    p.blocks.append(blk)
                    np.ndarray(size, np.uint8, blk.buf)[:] = 1
                    msg = (blk.name, (size,), "uint8")
                    make = lambda msg=msg: msg  # noqa: E731
                elif k == "tshm" and how == "in segment":
                    seg = tshm.Segment(size)
                    a = np.frombuffer(seg, np.uint8)
                    a[:] = 1
                    make = lambda a=a: a  # noqa: E731
                else:  # fresh arrays, and mp.Queue always pickles in band
                    make = lambda size=size: np.ones(size, np.uint8)  # noqa
                rounds(p, make, 2)
                res[k] = max(rounds(p, make, n) - ack[k], 0.1)
                p.unlink_blocks()
            rows.append((f"{label} array, {how}", res["tshm"], res["mp"],
                         res["shm"]))
    for p in peers.values():
        p.close()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    args = ap.parse_args()
    backend = tshm.default_context().backend
    print(f"# python-bench: tshm backend {backend}, Python "
          f"{sys.version.split()[0]}, numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs; one-way latency, median, microseconds")
    rows = measure(args.quick)
    print(f"{'object':<26} {'tshm.Queue':>12} {'mp.Queue':>12} "
          f"{'shm+Queue':>12} {'mp/tshm':>9} {'shm/tshm':>9}")
    for name, t, m, s in rows:
        print(f"{name:<26} {t:12.1f} {m:12.1f} {s:12.1f} {m / t:8.1f}x "
              f"{s / t:8.1f}x")


if __name__ == "__main__":
    main()
