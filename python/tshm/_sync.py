# SPDX-License-Identifier: LGPL-2.1-or-later
"""Events and barriers across processes: the library's futex objects,
each in a small segment of its own, so they pickle into child processes
(every start method) and through queues the way segments do."""

import math

from ._tshm import BARRIER_SIZE, EVENT_SIZE, Segment, _barrier_op, _event_op

_INIT, _SET, _CLEAR, _IS_SET, _WAIT = range(5)
_FOREVER = -1
_MS_MAX = 2**31 - 1


def _ms(timeout):
    """timeout= in seconds (None: forever) to the library's milliseconds,
    as the C side does it: NaN and negatives are refused, and anything
    beyond what an int of milliseconds holds (inf included) is forever."""
    if timeout is None:
        return _FOREVER
    if not timeout >= 0:  # NaN too
        raise ValueError("'timeout' must be a non-negative number")
    ms = timeout * 1000
    if ms >= _MS_MAX:
        return _FOREVER
    return math.ceil(ms)


class Event:
    """A manual-reset flag shared by processes, like threading.Event.

    set() wakes every waiter and the flag stays set until clear().  A
    process that dies while waiting disturbs nobody.
    """

    def __init__(self, *, ctx=None):
        self._seg = Segment(EVENT_SIZE, "tshm.Event", ctx=ctx)
        _event_op(self._seg, _INIT, 0)

    @classmethod
    def _from_segment(cls, seg):
        self = cls.__new__(cls)
        self._seg = seg
        return self

    def set(self):
        """Set the flag and wake every waiter."""
        _event_op(self._seg, _SET, 0)

    def clear(self):
        """Reset the flag."""
        _event_op(self._seg, _CLEAR, 0)

    def is_set(self):
        """True while the flag is set."""
        return bool(_event_op(self._seg, _IS_SET, 0))

    def wait(self, timeout=None):
        """Wait until the flag is set; False if timeout (seconds) ran out."""
        return bool(_event_op(self._seg, _WAIT, _ms(timeout)))

    def __reduce__(self):
        return Event._from_segment, (self._seg,)

    def __repr__(self):
        return f"<tshm.Event {'set' if self.is_set() else 'unset'}>"


class Barrier:
    """A reusable barrier for parties processes (1 .. 65535).

    wait() returns 1 in the party that arrived last and 0 in the others.
    On timeout it withdraws the caller's arrival and raises TimeoutError:
    unlike threading.Barrier it is not broken, so a party that died can be
    waited out and the barrier used again.
    """

    def __init__(self, parties, *, ctx=None):
        self._seg = Segment(BARRIER_SIZE, "tshm.Barrier", ctx=ctx)
        _barrier_op(self._seg, parties, True)
        self._parties = parties

    @classmethod
    def _from_segment(cls, seg, parties):
        self = cls.__new__(cls)
        self._seg = seg
        self._parties = parties
        return self

    @property
    def parties(self):
        """The number of parties that must arrive."""
        return self._parties

    def wait(self, timeout=None):
        """Arrive and wait for the other parties."""
        return _barrier_op(self._seg, _ms(timeout), False)

    def __reduce__(self):
        return Barrier._from_segment, (self._seg, self._parties)

    def __repr__(self):
        return f"<tshm.Barrier parties={self._parties}>"
