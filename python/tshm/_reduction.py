# SPDX-License-Identifier: LGPL-2.1-or-later
"""How objects that own file descriptors cross into other processes.

A Segment or a Queue is sent over one end of a fresh AF_UNIX socket pair by
the library (tshm_seg_send_fd(), tshm_queue_send_fd()); the other end
travels the way multiprocessing moves any fd (reduction.DupFd): inherited
by a spawned or forkserver child, or through multiprocessing's resource
sharer to a running process.  The receiver takes the object off the socket
and closes it.  A pickle of such an object is therefore good for one load,
like a pickled multiprocessing.Connection.
"""

import copyreg
import socket
import threading
from multiprocessing import context, reduction, resource_sharer, util

from ._tshm import Segment


def send_over_socket(send):
    """Call send(fd) on one end of a new socket pair; return a picklable
    handle to the other end (multiprocessing's DupFd)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        send(mine.fileno())
    finally:
        mine.close()
    handle = reduction.DupFd(theirs.fileno())
    popen = context.get_spawning_popen()
    if popen is None:
        theirs.close()  # the resource sharer has its own duplicate
        made = getattr(_pickling, "handles", None)
        if made is not None:
            made.append(handle)
    else:
        # The child inherits this very fd when it is launched, after
        # pickling: keep it open as long as the launcher lives.
        util.Finalize(popen, theirs.close)
    return handle


_pickling = threading.local()


class withdrawn_unless_kept:
    """Collect the handles made by send_over_socket() for a pickle that
    may never be loaded: a tshm.Queue message whose pickling fails, is
    done again, or is not queued.  As a context manager, yields a list of
    them; unless the caller empties it, each is taken back from the
    resource sharer and its socket closed (nobody would ever fetch it:
    one fd and the object in flight, kept for the life of the process).
    A class, not a generator: every put() enters two."""

    __slots__ = ("outer", "made")

    def __enter__(self):
        self.outer = getattr(_pickling, "handles", None)
        self.made = _pickling.handles = []
        return self.made

    def __exit__(self, *exc):
        _pickling.handles = self.outer
        for handle in self.made:
            withdraw(handle)
        return False


def withdraw(handle):
    """Take back a handle whose pickle will never be loaded."""
    rs = getattr(resource_sharer, "_resource_sharer", None)
    key = getattr(handle, "_id", (None, None))[1]
    if rs is None or key is None:
        return
    with rs._lock:
        entry = rs._cache.pop(key, None)
    if entry is not None:
        entry[1]()  # the sharer's close(): its duplicate of the fd


def recv_over_socket(handle, recv):
    """The receiving half: recv(fd) on the socket behind handle."""
    with socket.socket(fileno=handle.detach()) as sock:
        return recv(sock.fileno())


def _rebuild_segment(handle):
    return recv_over_socket(handle, Segment._recv_fd)


def _reduce_segment(seg):
    return _rebuild_segment, (send_over_socket(seg._send_fd),)


copyreg.pickle(Segment, _reduce_segment)
