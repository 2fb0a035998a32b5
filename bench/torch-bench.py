#!/usr/bin/python3
# SPDX-License-Identifier: GPL-2.0
"""tshm.torch against torch's own sharing strategies, in one run, one table.

  PYTHONPATH=build/python bench/torch-bench.py [--quick] [--rows KIND...]

  and for the module backend, the queue rows in the VM (each process
  there imports torch in half a minute: spawn rows would take long):

  scripts/vm-run --mem 4G --timeout 1200 -- env PYTHONPATH=build/python \
      /usr/bin/python3 bench/torch-bench.py --quick --rows queue

Rows:
* queue latency: one-way, a tensor through a Queue to a worker: from
  just before put() in the sender to just after get() returned in the
  worker (time.perf_counter(), CLOCK_MONOTONIC, one clock for every
  process; the worker sends its reading back on a second queue, after
  the clock stopped), per tensor of 4 KiB, 1 MiB, 64 MiB, the same
  tensor re-sent or a fresh one each time, the worker dropping each
  tensor before the next get() (and, in the "kept" rows, the same
  tensor re-sent to a worker that holds the previous one until the next
  get() returns, as `t = q.get()` in a loop does); each cell the median of
  ROUNDS runs taken in turn with the other columns'.  The queues are
  those each strategy's user makes: torch's (multiprocessing's, a pipe)
  for file_descriptor and file_system,
  tshm.torch.get_context("fork").Queue() for tshm;
* DataLoader throughput (batches/s, 2 workers, fork; tshm with
  multiprocessing_context=tshm.torch.get_context("fork")): items of (a) one
  16 MiB tensor, (b) a dict of 64 small tensors (256 floats each),
  batch_size 4;
* spawn of 1, 4 and 16 workers to all joined (fn does nothing): in these
  rows the first column is torch.multiprocessing.spawn (start method
  "spawn", torch's default), the second torch's start_processes with the
  start method the row names, the tshm column tshm.torch.spawn with it.
  Both forkservers (torch's preloading torch, tshm's zygote) are started
  before the first row, as a forkserver is meant to be used; their start
  times are printed under the table.

Columns: file_descriptor, file_system, tshm, and the ratios of tshm to
each (how many times faster tshm is).  Medians of repeated runs where
cheap.  The figures depend on the machine: compare columns of one run.
"""

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset

import tshm.torch

STRATEGIES = ["file_descriptor", "file_system", "tshm"]
#: Rounds of the queue rows (see main()).
ROUNDS = 3


def use(strategy):
    tmp.set_sharing_strategy(strategy)


def _echo(q, r, keep):
    while True:
        t = q.get()
        got = time.perf_counter()
        if t is None:
            return
        r.put(got)
        if not keep:
            del t


def context(strategy):
    """What a user of each strategy passes to DataLoader and makes queues
    with: multiprocessing's fork context (torch.multiprocessing.Queue is
    its Queue), or tshm.torch's."""
    if strategy == "tshm":
        return tshm.torch.get_context("fork")
    return mp.get_context("fork")


def queue_latency(strategy, nbytes, resend, iters, keep=False):
    use(strategy)
    ctx = context(strategy)
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_echo, args=(q, r, keep))
    p.start()
    numel = nbytes // 4
    same = torch.ones(numel)
    q.put(same)          # warm up: the worker and the first transfer
    r.get()
    times = []
    for _ in range(iters):
        t = same if resend else torch.ones(numel)
        t0 = time.perf_counter()
        q.put(t)
        times.append(r.get() - t0)
        del t
    q.put(None)
    p.join()
    return statistics.median(times)


class Big(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((4 << 20,), float(i))      # 16 MiB


class Small(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return {f"k{j}": torch.full((256,), float(i)) for j in range(64)}


def loader_rate(strategy, ds):
    use(strategy)
    ctx = context(strategy)
    dl = DataLoader(ds, batch_size=4, num_workers=2,
                    multiprocessing_context=ctx, persistent_workers=False)
    it = iter(dl)
    next(it)             # workers started and warm
    n = 0
    t0 = time.perf_counter()
    for _ in it:
        n += 1
    return n / (time.perf_counter() - t0)


def _noop(rank):
    pass


def spawn_time(who, method, nprocs):
    """torch.multiprocessing's start_processes (spawn is start_processes
    with "spawn") or tshm.torch.spawn, start method method."""
    use("tshm" if who == "tshm" else "file_descriptor")
    t0 = time.perf_counter()
    if who == "tshm":
        tshm.torch.spawn(_noop, nprocs=nprocs, start_method=method)
    else:
        tmp.start_processes(_noop, nprocs=nprocs, start_method=method)
    return time.perf_counter() - t0


def fmt_time(s):
    return f"{s * 1e6:9.1f} us" if s < 0.01 else f"{s * 1e3:9.2f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer iterations (a smoke run)")
    ap.add_argument("--rows", nargs="+", default=["queue", "loader", "spawn"],
                    choices=["queue", "loader", "spawn"],
                    help="which rows (default: all)")
    args = ap.parse_args()
    k = 0.2 if args.quick else 1
    rows = []
    sizes = ((4096, "4 KiB", 200), (1 << 20, "1 MiB", 100),
             (64 << 20, "64 MiB", 10))
    for nbytes, name, iters in sizes if "queue" in args.rows else ():
        for resend, keep in ((True, False), (False, False), (True, True)):
            label = f"queue {name} " + \
                ("re-sent, kept" if keep else
                 "re-sent" if resend else "fresh")
            # Strategies in turn, ROUNDS times, the median of each
            # one's per-round medians: a moment of noise on a shared
            # machine then weighs on no column alone.
            runs = {s: [] for s in STRATEGIES}
            for _ in range(ROUNDS):
                for s in STRATEGIES:
                    runs[s].append(queue_latency(
                        s, nbytes, resend, max(3, int(iters * k)), keep))
            vals = [statistics.median(runs[s]) for s in STRATEGIES]
            rows.append((label, vals, "time"))
    loaders = ((Big(), "DataLoader (a) 16 MiB item"),
               (Small(), "DataLoader (b) 64 small tensors"))
    for ds, label in loaders if "loader" in args.rows else ():
        vals = [loader_rate(s, ds) for s in STRATEGIES]
        rows.append((label + " batches/s", vals, "rate"))
    servers = None
    if "spawn" in args.rows:
        # Both forkservers started (and torch imported in them) before
        # the rows, as a forkserver is meant to be used.
        mp.set_forkserver_preload(["torch"])
        servers = [spawn_time(w, "forkserver", 1) for w in ("torch", "tshm")]
    for n in (1, 4, 16) if servers else ():
        # Columns here: torch "spawn" (its default), torch with the start
        # method of the row, tshm.torch.spawn with it.
        sp = spawn_time("torch", "spawn", n)
        for m in ("spawn", "forkserver", "fork"):
            rows.append((f"spawn {n} to joined, {m}",
                         [sp, spawn_time("torch", m, n),
                          spawn_time("tshm", m, n)], "time"))

    print(f"torch {torch.__version__}, tshm backend "
          f"{tshm.default_context().backend}, {os.cpu_count()} CPUs")
    head = (f"{'':38} {'file_descriptor':>15} {'file_system':>15} "
            f"{'tshm':>15} {'vs fd':>7} {'vs fs':>7}")
    print(head)
    print("-" * len(head))
    for label, (fd, fs, ts), kind in rows:
        if kind == "time":
            cells = [fmt_time(v) for v in (fd, fs, ts)]
            r1, r2 = fd / ts, fs / ts
        else:
            cells = [f"{v:12.1f}/s" for v in (fd, fs, ts)]
            r1, r2 = ts / fd, ts / fs
        print(f"{label:38} {cells[0]:>15} {cells[1]:>15} {cells[2]:>15} "
              f"{r1:6.1f}x {r2:6.1f}x")
    if servers is None:
        return 0
    print(f"spawn rows: columns are torch.multiprocessing.spawn (\"spawn\"), "
          f"torch's start_processes and tshm.torch.spawn with the row's "
          f"method;\nforkservers started first: torch's (preloading torch) "
          f"{fmt_time(servers[0]).strip()}, tshm's zygote "
          f"{fmt_time(servers[1]).strip()} (each with a spawn of 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
