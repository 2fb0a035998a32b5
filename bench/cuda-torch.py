#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""torch.multiprocessing CUDA tensor handoff (spawn context): the baseline
for bench/cuda-bench.  Same measure: median round trip from put() to the
consumer's acknowledgement, allocation not timed, for a new tensor each
time (fresh) and the same tensor re-sent (cached by torch's CUDA IPC
cache).  Prints a SKIP line and exits 4 without torch or without a GPU.

    bench/cuda-torch.py [-r REPS] [-s MiB,MiB,...]
"""
import argparse
import statistics
import sys
import time


def consumer(q, ack):
    while True:
        t = q.get()
        if t is None:
            break
        t.data_ptr()            # a usable device tensor
        del t
        ack.put(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-r", type=int, default=20)
    ap.add_argument("-s", default="2,64,1024")
    a = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"# SKIP cuda-torch: no PyTorch: {e}")
        return 4
    if not torch.cuda.is_available():
        print("# SKIP cuda-torch: torch.cuda.is_available() is False")
        return 4
    ctx = mp.get_context("spawn")
    q, ack = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(q, ack))
    p.start()
    print(f"# cuda-torch: {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}, {a.r} reps, median microseconds")
    print(f"{'size':>10} {'torch-fresh':>16} {'torch-same':>16}")
    for mib in (int(x) for x in a.s.split(",")):
        n = mib << 20
        fresh, same = [], []
        for _ in range(a.r):
            t = torch.empty(n, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            q.put(t)
            ack.get()
            fresh.append((time.perf_counter() - t0) * 1e6)
            del t
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        q.put(t)
        ack.get()
        for _ in range(a.r):
            t0 = time.perf_counter()
            q.put(t)
            ack.get()
            same.append((time.perf_counter() - t0) * 1e6)
        print(f"{mib:>8}Mi {statistics.median(fresh):16.1f} "
              f"{statistics.median(same):16.1f}", flush=True)
    q.put(None)
    p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
