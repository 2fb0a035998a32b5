# SPDX-License-Identifier: GPL-2.0
"""Scenarios that test_torch_limits.py runs in a process of their own,
under a small /dev/shm, a low fd limit or a SIGKILL:

  torch_scenarios.py dataloader STRATEGY N 4 workers, N items of 32 MiB
  torch_scenarios.py keep STRATEGY COUNT   keep COUNT received tensors
                                           with RLIMIT_NOFILE 256
  torch_scenarios.py killed STRATEGY       iterate a DataLoader, print
                                           "ready", wait to be SIGKILLed

STRATEGY is a torch.multiprocessing sharing strategy or "tshm".  Each
prints what happened; the exit status is 0 when every item arrived."""

import multiprocessing as mp
import os
import resource
import sys
import time

import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset

import tshm.torch


def context(strategy, method="fork"):
    if strategy == "tshm":
        return tshm.torch.get_context(method)
    tmp.set_sharing_strategy(strategy)
    return mp.get_context(method)


class Full(Dataset):
    """Item i: a tensor of nbytes filled with i."""

    def __init__(self, n, nbytes):
        self.n, self.numel = n, nbytes // 4

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((self.numel,), float(i))


def dataloader(strategy, count):
    dl = DataLoader(Full(count, 32 << 20), batch_size=1, num_workers=4,
                    multiprocessing_context=context(strategy), timeout=300)
    n = 0
    try:
        for i, batch in enumerate(dl):
            assert batch.shape == (1, 8 << 20)
            assert bool(torch.all(batch == float(i))), f"batch {i} corrupt"
            n += 1
    except Exception as e:
        print(f"{strategy}: failed after {n} batches: "
              f"{type(e).__name__}: {e}", flush=True)
        # A worker's error comes with its traceback: its last line says
        # why (torch 2.x: shm allocation refused; 1.13: worker died).
        lines = str(e).strip().splitlines()
        if len(lines) > 1:
            print(f"{strategy}: cause: {lines[-1]}", flush=True)
        return 1
    print(f"{strategy}: delivered {n} of {count} batches intact",
          flush=True)
    return 0


def _produce(q, count, done):
    for i in range(count):
        q.put(torch.full((20000,), float(i)))   # 80 KiB: a segment each
    q.put(None)
    done.wait(300)   # fds are fetched from the sender while it lives


def keep(strategy, count):
    ctx = context(strategy)
    q, done = ctx.Queue(64), ctx.Event()
    p = ctx.Process(target=_produce, args=(q, count, done))
    p.start()
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    kept = []
    try:
        while True:
            t = q.get(timeout=300)
            if t is None:
                break
            kept.append(t)
        bad = [i for i, t in enumerate(kept) if float(t[0]) != i or
               float(t[-1]) != i]
        print(f"{strategy}: kept {len(kept)} tensors, {len(bad)} corrupt, "
              f"{len(os.listdir('/proc/self/fd'))} fds open", flush=True)
        status = 0 if len(kept) == count and not bad else 1
    except Exception as e:
        print(f"{strategy}: failed after {len(kept)} tensors: "
              f"{type(e).__name__}: {e}", flush=True)
        status = 1
    p.kill()
    os._exit(status)


def killed(strategy):
    os.setpgrp()   # the test kills the whole group: workers and consumer
    dl = DataLoader(Full(1000, 4 << 20), batch_size=2, num_workers=4,
                    multiprocessing_context=context(strategy), timeout=300)
    held = []
    for i, batch in enumerate(dl):
        held.append(batch)
        if i == 3:
            print(f"ready {os.getpid()}", flush=True)
        if i >= 3:
            time.sleep(0.05)
    return 1


if __name__ == "__main__":
    what, strategy = sys.argv[1], sys.argv[2]
    if what == "dataloader":
        sys.exit(dataloader(strategy, int(sys.argv[3])))
    if what == "keep":
        keep(strategy, int(sys.argv[3]))
    if what == "killed":
        sys.exit(killed(strategy))
    sys.exit(f"unknown scenario {what}")
