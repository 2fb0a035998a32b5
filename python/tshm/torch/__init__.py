# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm.torch: tshm as a sharing strategy for torch.multiprocessing.

Importing this module adds the strategy "tshm" to torch.multiprocessing
and plugs tshm in where torch itself shares CPU memory: the reducers that
torch.multiprocessing registers for tensors and storages, and torch's
shared allocation (UntypedStorage._new_shared, used by DataLoader's
collate; Tensor.share_memory_()).  Each hook hands over to torch unless
the strategy is "tshm", so one line switches::

    import tshm.torch
    tshm.torch.install()     # or torch.multiprocessing.set_sharing_strategy("tshm")

    DataLoader(ds, num_workers=4,
               multiprocessing_context=tshm.torch.get_context("spawn"))

See Documentation/python/torch.rst.
"""

import multiprocessing
import multiprocessing.context as _mpc
import multiprocessing.queues

import torch
import torch.multiprocessing

from . import _alloc, _mpqueue, _reductions, cuda
from ._reductions import STRATEGY, active, locate, move_to_segment

__all__ = ["install", "uninstall", "installed", "get_context", "spawn", "cuda",
           "SMALL_MAX", "ARENA_SIZE"]

SMALL_MAX = _alloc.SMALL_MAX
ARENA_SIZE = _alloc.ARENA_SIZE

_previous = None      # the strategy install() replaced


# -- torch's shared allocation ----------------------------------------------

_orig_new_shared = torch.UntypedStorage._new_shared.__func__
_orig_storage_share = torch.UntypedStorage.share_memory_
_orig_storage_is_shared = torch.UntypedStorage.is_shared
_orig_tensor_share = torch.Tensor.share_memory_


def _new_shared(cls, size, *, device="cpu"):
    if active() and torch.device(device).type == "cpu" and \
            cls is torch.UntypedStorage:
        return _alloc.new_shared(size)
    return _orig_new_shared(cls, size, device=device)


def _storage_share_memory_(self):
    # A storage already in a segment is shared, whatever the strategy
    # (torch's would move it out, and this process would stop sharing
    # it); another one cannot be moved in place from Python: torch's own
    # strategy moves it.
    if self.device.type == "cpu" and locate(self) is not None:
        return self
    return _orig_storage_share(self)


def _storage_is_shared(self):
    if self.device.type == "cpu" and locate(self) is not None:
        return True
    return _orig_storage_is_shared(self)


def _tensor_share_memory_(self):
    if active() and type(self) in (torch.Tensor,
                                   torch.nn.parameter.Parameter) and \
            _reductions._shareable(self):
        return move_to_segment(self)
    return _orig_tensor_share(self)


def _hook():
    strategies = torch.multiprocessing.get_all_sharing_strategies()
    strategies.add(STRATEGY)
    torch.UntypedStorage._new_shared = classmethod(_new_shared)
    torch.UntypedStorage.share_memory_ = _storage_share_memory_
    torch.UntypedStorage.is_shared = _storage_is_shared
    torch.Tensor.share_memory_ = _tensor_share_memory_
    _reductions.register()


_hook()


# -- install -----------------------------------------------------------------

def install():
    """Make tshm the sharing strategy for CPU tensors in this process."""
    global _previous
    current = torch.multiprocessing.get_sharing_strategy()
    if current != STRATEGY:
        _previous = current
        torch.multiprocessing.set_sharing_strategy(STRATEGY)


def uninstall():
    """Go back to the strategy that install() replaced (torch's default if
    the strategy was set some other way)."""
    global _previous
    if torch.multiprocessing.get_sharing_strategy() != STRATEGY:
        return
    back = _previous
    if back is None:
        back = "file_descriptor" if "file_descriptor" in \
            torch.multiprocessing.get_all_sharing_strategies() \
            else "file_system"
    torch.multiprocessing.set_sharing_strategy(back)
    _previous = None


def installed():
    """True while the sharing strategy is "tshm"."""
    return active()


# -- multiprocessing contexts whose workers have tshm installed --------------

class _TshmProcess:
    """A process that installs tshm before anything of the caller's runs.

    In _bootstrap(), which every start method calls in the child, not in
    run(): a subclass that overrides run() (the usual way to subclass
    Process) would otherwise send tensors torch's way, through a resource
    sharer that dies with it."""

    def _bootstrap(self, *args, **kwargs):
        install()
        return super()._bootstrap(*args, **kwargs)


class ForkProcess(_TshmProcess, _mpc.ForkProcess):
    pass


class SpawnProcess(_TshmProcess, _mpc.SpawnProcess):
    pass


class ForkServerProcess(_TshmProcess, _mpc.ForkServerProcess):
    pass


class _TshmQueues:
    """Queues on tshm.Queue: tensors in segments travel by reference,
    no fd through multiprocessing's resource sharer (tshm/torch/_mpqueue.py)."""

    def Queue(self, maxsize=0):
        return _mpqueue.Queue(maxsize)

    def SimpleQueue(self):
        return _mpqueue.SimpleQueue()

    def Pool(self, processes=None, initializer=None, initargs=(),
             maxtasksperchild=None):
        from multiprocessing.pool import Pool
        return Pool(processes, initializer, initargs, maxtasksperchild,
                    context=_PoolContext(self))


class _PoolContext:
    """The context a Pool runs on: the tshm.torch context's processes,
    multiprocessing's own SimpleQueue.  multiprocessing.pool.Pool uses
    its queues' pipes directly (_reader, _writer, _rlock); tensors go
    through them as ForkingPickler sends them (the "tshm" strategy's
    reducers, a segment's fd through the resource sharer)."""

    def __init__(self, ctx):
        self._ctx = ctx

    def SimpleQueue(self):
        return multiprocessing.queues.SimpleQueue(ctx=self._ctx)

    def __getattr__(self, name):
        return getattr(self._ctx, name)


class ForkContext(_TshmQueues, _mpc.ForkContext):
    Process = ForkProcess


class SpawnContext(_TshmQueues, _mpc.SpawnContext):
    Process = SpawnProcess


class ForkServerContext(_TshmQueues, _mpc.ForkServerContext):
    Process = ForkServerProcess

    def __init__(self):
        super().__init__()
        # The server imports torch and tshm.torch once, not every worker;
        # what the caller asked it to preload (and multiprocessing's
        # default, __main__) stays: the forkserver is one for the process.
        from multiprocessing import forkserver
        have = list(forkserver._forkserver._preload_modules or ())
        self.set_forkserver_preload(
            have + [m for m in ("torch", "tshm.torch") if m not in have])


_contexts = {"fork": ForkContext, "spawn": SpawnContext,
             "forkserver": ForkServerContext}


def _default_start_method():
    """multiprocessing's start method, without fixing it as
    multiprocessing.get_start_method() does (a later set_start_method()
    would then fail)."""
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None:
        platform = getattr(_mpc._default_context, "_default_context", None)
        method = platform.get_start_method() if platform is not None \
            else multiprocessing.get_start_method()
    return method


def get_context(method=None):
    """A multiprocessing context for method ("fork", "spawn" or
    "forkserver"; None: multiprocessing's default) whose processes run
    with tshm installed, for DataLoader(multiprocessing_context=...),
    torch.multiprocessing queues and pools alike.  Installs tshm in this
    process too, so that what its workers send back is received as tshm."""
    if method is None:
        method = _default_start_method()
    try:
        cls = _contexts[method]
    except KeyError:
        raise ValueError(f"cannot find context for {method!r}") from None
    install()
    return cls()




def spawn(fn, args=(), nprocs=1, join=True, daemon=False,
          start_method="spawn"):
    """A drop-in for torch.multiprocessing.spawn on libtshm's supervisor:
    fn(rank, *args) in nprocs fresh interpreters with tshm installed; a
    worker's exception comes back with its traceback and terminates the
    rest; workers never outlive this process (SIGKILL included); each
    worker gets floor(usable CPUs / nprocs) threads unless the caller set
    OMP_NUM_THREADS.  With join=False, returns a context whose join()
    works as torch's.  See tshm/torch/_spawn.py."""
    from ._spawn import spawn as _spawn
    return _spawn(fn, args, nprocs, join, daemon, start_method)
