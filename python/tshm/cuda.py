# SPDX-License-Identifier: LGPL-2.1-or-later
"""tshm.cuda: GPU buffers between processes, freed when the last one lets go.

libtshm-cuda's buffers for Python.  A buffer put on a tshm.Queue (alone or
inside any picklable object) travels as its description, two small tshm
segments (its lease and its allocation's anchor) and, for VMM memory, the
allocation's fd, all in the same message; the receiver maps the same device
memory, no copy::

    dev = tshm.cuda.device(0)
    buf = dev.alloc(dev.granularity)       # or dev.pool(count, size).get()
    q.put(buf)                             # the producer may close() or exit
    buf.wait_released(timeout=10)          # every receiver let go, or died

The producer may close its buffer, or exit, right after the put: the
memory lives while a receiver maps it or a message carries it.  A
receiver that is killed gives it back with its process.

A CUDA context does not survive fork(): device() opens the device again in
a child, and buffers made before the fork cannot be used there.  The driver
is loaded at run time: on a machine without one (or without a GPU),
device() raises OSError(ENODEV) with the loader's reason.

Documentation/python/cuda.rst has the details.
"""

import errno
import os
import threading

from . import _tshm

__all__ = ["available", "device", "Device", "Buffer", "Pool"]

try:
    Device = _tshm._CudaDevice
    Buffer = _tshm._CudaBuffer
    Pool = _tshm._CudaPool
except AttributeError:  # built without the CUDA toolkit's headers
    Device = Buffer = Pool = None

_lock = threading.Lock()
_devices = {}        # ordinal -> Device, this process's
_devices_pid = None


def _require():
    if Device is None:
        raise OSError(errno.ENOSYS, "tshm was built without CUDA: "
                      "no cuda.h where it was compiled (CUDA_HOME)")


def device(ordinal=0):
    """This process's Device for CUDA ordinal (as CUDA_VISIBLE_DEVICES
    numbers them), opened on first use and again after fork()."""
    global _devices_pid
    _require()
    with _lock:
        if _devices_pid != os.getpid():
            _devices.clear()   # the parent's contexts are not ours
            _devices_pid = os.getpid()
        dev = _devices.get(ordinal)
        if dev is None:
            dev = _devices[ordinal] = Device(ordinal)
        return dev


def available():
    """True if a GPU can be opened here (device(0) works)."""
    try:
        device(0)
    except OSError:
        return False
    return True


def _unpack(desc, segments, fd):
    """The receiving half of a Buffer in a tshm.Queue message: imported on
    the device it lives on, found by its UUID without opening the others
    (each opened device costs a CUDA context there)."""
    _require()
    return device(Device.ordinal_of(desc)).unpack(desc, segments, fd)
