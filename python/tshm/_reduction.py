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
from multiprocessing import context, reduction, util

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
    else:
        # The child inherits this very fd when it is launched, after
        # pickling: keep it open as long as the launcher lives.
        util.Finalize(popen, theirs.close)
    return handle


def recv_over_socket(handle, recv):
    """The receiving half: recv(fd) on the socket behind handle."""
    with socket.socket(fileno=handle.detach()) as sock:
        return recv(sock.fileno())


def _rebuild_segment(handle):
    return recv_over_socket(handle, Segment._recv_fd)


def _reduce_segment(seg):
    return _rebuild_segment, (send_over_socket(seg._send_fd),)


copyreg.pickle(Segment, _reduce_segment)
