# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm: shared memory between processes that cannot leak.

Segments are shared memory that lives while any process holds it and is
freed the moment the last holder goes (close, exit or SIGKILL).  Queues move
Python objects between processes, pickled with protocol 5: big buffers
(numpy arrays, bytes-like objects) travel as segments instead of through the
queue, and a buffer that already lives in a segment is sent by reference.

With the tshm kernel module loaded (/dev/tshm) segments come from it: they
appear in /proc/tshm, and a process keeps received segments without an fd
each.  Without it tshm falls back to memfd and fd passing.  See
Documentation/python/ in the source tree.
"""

from ._tshm import (Context, Pool, QueueClosed, Segment, Timeout,
                    default_context)
from ._queue import Queue
from ._sync import Barrier, Event
from . import _reduction  # noqa: F401  (makes Segment picklable)

__all__ = ["Barrier", "Context", "Event", "Pool", "Queue", "QueueClosed",
           "Segment", "Timeout", "default_context"]
__version__ = "0.2.0"
