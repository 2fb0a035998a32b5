# SPDX-License-Identifier: LGPL-2.1-or-later
"""The "tshm" sharing strategy: how CPU tensors and storages pickle.

These reducers are registered with multiprocessing's ForkingPickler for
the classes torch.multiprocessing registers its own for, and hand every
object back to torch's reducer unless the strategy is "tshm" (so that
set_sharing_strategy() switches back and forth at any time), with two
exceptions: a tensor or storage already in a segment goes as one
whatever the strategy (torch's reducer would move it out of the segment,
and this process would stop sharing it), and within sending_as_tshm()
(tshm.torch.spawn's arguments, a tshm.torch queue's messages) plain
tensors go the tshm way too.

A CPU storage travels as (segment, offset, length): the segment pickles
the way tshm.Segment always does (tshm/_reduction.py); the receiver
maps the same pages and gets a storage over them, so a received tensor is
shared with the sender, and sending it on again sends the same segment.
A tensor whose storage is not in a segment yet is moved into one first,
as torch's own strategies move it into shared memory: the sender's tensor
is shared from then on, and sending it again copies nothing.
"""

import errno
import multiprocessing.reduction
import pickle
import struct
import threading

import torch
import torch.multiprocessing
import torch.multiprocessing.reductions as _torch_red
from torch._namedtensor_internals import check_serializing_named_tensor
from torch.utils.hooks import warn_if_has_hooks

from .._tshm import _locate_address
from . import _alloc, _mirror, cuda

STRATEGY = "tshm"


def active():
    return torch.multiprocessing.get_sharing_strategy() == STRATEGY


_forced = threading.local()


class sending_as_tshm:
    """Within it, this thread pickles CPU tensors the tshm way whatever
    the strategy (tshm.torch.spawn's arguments, a tshm.torch queue's
    messages); a bare storage still goes torch's way (reduce_storage());
    other threads are not affected.  A class, not a generator: a queue
    enters it on every put()."""

    __slots__ = ("_outer",)

    def __enter__(self):
        self._outer = getattr(_forced, "on", False)
        _forced.on = True

    def __exit__(self, *exc):
        _forced.on = self._outer


def _sending():
    return getattr(_forced, "on", False) or active()


def locate(storage):
    """(segment, offset) of a CPU storage's bytes, or None."""
    n = storage.nbytes()
    if n == 0:
        return None
    return _locate_address(storage.data_ptr(), n)


def _shareable(tensor):
    return (tensor.is_cpu and tensor.layout == torch.strided
            and not tensor.is_quantized)


def move_to_segment(tensor):
    """Move tensor into tshm memory, in place (as torch's share_memory_()
    does): it keeps its size, stride, offset and values, and points into
    its storage's mirror (tshm/torch/_mirror.py), where the other tensors
    over that storage that are moved point too."""
    old = _alloc.untyped(tensor)
    if old.nbytes() == 0 or locate(old) is not None:
        return tensor
    new = _mirror.storage_for(tensor, old)
    moved = torch.empty((0,), dtype=tensor.dtype)
    moved.set_(new, tensor.storage_offset(), tensor.size(), tensor.stride())
    moved = _lazy_bits(tensor.is_conj(), tensor.is_neg(), moved)
    # Not tensor.set_(): an in-place op bumps the version counter, and a
    # tensor that autograd saved for backward would then fail backward()
    # ("modified by an inplace operation") though its values are the
    # same.  Assigning .data swaps the storage as share_memory_() does.
    tensor.data = moved
    return tensor


def _lazy_bits(conj, neg, t):
    """t read as a conjugate and/or negative view (the bits a tensor like
    x.conj() carries over memory holding x's values): without them, a
    tensor moved or received would read x, not x.conj()."""
    if conj:
        t = t.conj()
    if neg:
        t = t._neg_view()
    return t


def _export(storage):
    """The picklable form of a CPU storage: its segment, offset, length."""
    n = storage.nbytes()
    if n == 0:
        return None, 0, 0
    found = locate(storage)
    if found is None:
        # A bare storage cannot be moved in place: send a copy.
        copy = _alloc.new_shared(n)
        copy.copy_(storage)
        found = locate(copy)
    seg, off = found
    return seg, off, n


def _import(seg, off, n):
    if n == 0:
        return torch.UntypedStorage(0)
    return _alloc.storage_over(seg, off, n)[0]


_element_sizes = {}
_dtype_names = {}
_dtypes = {}


def _dtype_name(dtype):
    """"float32" for torch.float32: a str pickles as itself, a dtype by
    its global name, which costs the sender a module lookup per message
    (about a microsecond: a tenth of a small tensor's encoding)."""
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).rpartition(".")[2]
    return name


def _dtype_named(name):
    if isinstance(name, torch.dtype):   # a pickle made before names
        return name
    dtype = _dtypes.get(name)
    if dtype is None:
        dtype = getattr(torch, name, None) if type(name) is str else None
        if not isinstance(dtype, torch.dtype):
            raise pickle.UnpicklingError(f"not a torch dtype: {name!r}")
        _dtypes[name] = dtype
    return dtype


def _element_size(dtype):
    size = _element_sizes.get(dtype)
    if size is None:
        size = _element_sizes[dtype] = \
            torch.empty((0,), dtype=dtype).element_size()
    return size


def _within(numel, offset, size, stride):
    """True if a tensor of that geometry reaches only elements of a storage
    of numel.  torch 1.13's set_() checks it against the storage, except
    when only the offset changes (the same sizes and strides as the tensor
    has: frombuffer()'s of the whole storage), where it lets the tensor
    reach past its storage: a message from another process must not."""
    if offset < 0 or min(size, default=1) < 0 or min(stride, default=0) < 0:
        return False
    if 0 in size:
        return True                 # no element, nothing reached
    return offset + sum((n - 1) * s for n, s in zip(size, stride)) < numel


def rebuild_storage(seg, off, n):
    return _import(seg, off, n)


def rebuild_tensor(cls, seg, off, n, dtype_name, meta):
    """The receiving half of reduce_tensor(); cls None is torch.Tensor."""
    dtype = _dtype_named(dtype_name)
    offset, size, stride, requires_grad, conj, neg = meta
    esize = _element_size(dtype)
    if n and n % esize == 0:
        # A tensor of dtype over the storage's bytes, then given its own
        # geometry, unless it is that one already (the whole storage, flat):
        # one tensor made, not an empty one and a byte view.
        t = torch.frombuffer(_alloc.view_over(seg, off, n), dtype=dtype)
        if offset or size != (n // esize,) or stride != (1,):
            if not _within(n // esize, offset, size, stride):
                raise pickle.UnpicklingError(
                    f"a tensor of {size}, stride {stride} at {offset} "
                    f"outside its storage of {n} bytes")
            t.set_(_alloc.untyped(t), offset, size, stride)
    else:
        # No bytes, or a storage that is not a whole number of elements
        # (a dtype view of an odd-sized byte storage): frombuffer() in
        # dtype would refuse it.
        t = torch.empty((0,), dtype=dtype)
        t.set_(_import(seg, off, n), offset, size, stride)
    t = _lazy_bits(conj, neg, t)
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t if cls is None else t.as_subclass(cls)


def reduce_tensor(tensor):
    red = cuda._reduce(tensor)      # over a tshm GPU buffer: whatever
    if red is not None:             # the strategy, torch's cannot share it
        return red
    if not _shareable(tensor):
        return _torch_red.reduce_tensor(tensor)
    storage = _alloc.untyped(tensor)
    found = locate(storage)
    if found is None and not _sending():
        return _torch_red.reduce_tensor(tensor)
    # Whatever the strategy, a tensor in a segment goes as one: torch's
    # reducer would move its storage out of the segment (its share_fd
    # or share_filename swaps the memory under it), and this process
    # would stop sharing it with the others that hold the segment.
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which "
            "requires_grad: call detach() on it before sending it")
    check_serializing_named_tensor(tensor)     # as torch's reducer does
    warn_if_has_hooks(tensor)
    if found is None:       # not in a segment yet (or empty)
        move_to_segment(tensor)
        seg, off, n = _export(_alloc.untyped(tensor))
    else:                   # already shared: sent as it is
        (seg, off), n = found, storage.nbytes()
    cls = type(tensor)
    meta = (tensor.storage_offset(), tuple(tensor.size()),
            tuple(tensor.stride()), tensor.requires_grad,
            tensor.is_conj(), tensor.is_neg())
    return rebuild_tensor, (None if cls is torch.Tensor else cls,
                            seg, off, n, _dtype_name(tensor.dtype), meta)


# -- a lone tensor, packed -----------------------------------------------------
#
# A tshm.torch queue sends a message that is one tensor without pickling it
# (tshm/_queue.py, _F_PACKED; _mpqueue.ForkingQueue): what reduce_tensor()
# would pickle, as fixed fields, and the tensor's segment as the message's
# one segment.  Pickling costs the sender of a small tensor three times what
# building its reduce value does, and the receiver twice what rebuilding
# it does (two functions named, looked up, called through the pickle
# machinery), and pickle holds nothing a tensor's message needs.

#: Offset and length of the storage in the segment, the storage offset,
#: the dtype (an index into _PACKED_DTYPES), the number of dimensions,
#: bits (1 requires_grad, 2 conj, 4 neg); then sizes and strides
#: (_packed_struct(): all in one struct per number of dimensions).
_PACKED = struct.Struct("<QQqBBB")
_PACKED_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64",
                  "complex128", "uint8", "int8", "int16", "int32", "int64",
                  "bool")
_packed_dtypes = tuple(getattr(torch, name, None) for name in _PACKED_DTYPES)
_packed_codes = {dtype: code for code, dtype in enumerate(_packed_dtypes)
                 if isinstance(dtype, torch.dtype)}
#: The bits each dtype may carry: requires_grad and a neg view for
#: floating point, all three for complex, none for the others (a neg view
#: of bool fails at every use; one of an integer is only ever made by
#: hand, and goes pickled).
_packed_bits = tuple(7 if name.startswith("complex") else
                     5 if name.startswith(("float", "bfloat")) else 0
                     for name in _PACKED_DTYPES)
#: More dimensions than that go pickled.
_PACKED_MAX_DIM = 64
_packed_structs = {}


def _packed_struct(ndim):
    """The struct of a packed tensor of ndim dimensions: _PACKED, then
    ndim sizes and ndim strides."""
    st = _packed_structs.get(ndim)
    if st is None:
        st = _packed_structs[ndim] = \
            struct.Struct(f"{_PACKED.format}{2 * ndim}q")
    return st


def pack_tensor(tensor):
    """(payload, (segment,)): tensor (a torch.Tensor, not a subclass)
    packed, where reduce_tensor() would send it as a segment, moved into
    one first as there; else None, and it is pickled (whatever else
    reduce_tensor() does with it: torch's reducer, an error, a warning,
    is done there)."""
    if cuda._holders and cuda._holder_of(tensor) is not None:
        return None         # over a tshm GPU buffer (CPU memory under the
                            # fake driver): cuda._reduce()'s
    if not tensor.is_cpu or tensor.layout != torch.strided or \
            tensor.is_quantized or getattr(tensor, "is_nested", False):
        return None
    code = _packed_codes.get(tensor.dtype)
    ndim = tensor.dim()
    if code is None or ndim > _PACKED_MAX_DIM or tensor.has_names() or \
            tensor._backward_hooks or \
            (tensor.requires_grad and not tensor.is_leaf):
        return None
    storage = _alloc.untyped(tensor)
    n = storage.nbytes()
    if n == 0 or n % tensor.element_size():
        return None
    found = _locate_address(storage.data_ptr(), n)
    if found is None:
        if not _sending():
            return None
        move_to_segment(tensor)
        found = locate(_alloc.untyped(tensor))
        if found is None:
            return None
    seg, off = found
    bits = tensor.requires_grad | tensor.is_conj() << 1 | tensor.is_neg() << 2
    if bits & ~_packed_bits[code]:
        return None
    return _packed_struct(ndim).pack(
        off, n, tensor.storage_offset(), code, ndim, bits, *tensor.size(),
        *tensor.stride()), (seg,)


def _malformed(what):
    return OSError(errno.EBADMSG, f"tshm.torch: a packed tensor {what}")


def unpack_tensor(payload, segments):
    """The tensor of a packed message (pack_tensor()): payload, a bytes-like
    object, and segments, those that came with it.  Its fields come from
    another process: each is checked before use."""
    ndim, rest = divmod(len(payload) - _PACKED.size, 16)
    if ndim < 0 or rest or ndim > _PACKED_MAX_DIM or len(segments) != 1:
        raise _malformed("of a bad length, or not with one segment")
    fields = _packed_struct(ndim).unpack(payload)
    off, n, offset, code, dims, bits = fields[:6]
    dtype = _packed_dtypes[code] if code < len(_packed_dtypes) else None
    if dtype is None or dims != ndim or bits & ~_packed_bits[code]:
        raise _malformed("with bad fields")
    seg = segments[0]
    esize = _element_size(dtype)
    if n == 0 or n % esize or n > seg.size or off > seg.size - n:
        raise _malformed("outside its segment")
    t = torch.frombuffer(_alloc.view_over(seg, off, n), dtype=dtype)
    if offset or ndim != 1 or fields[6] != n // esize or fields[7] != 1:
        size, stride = fields[6:6 + ndim], fields[6 + ndim:]
        if not _within(n // esize, offset, size, stride):
            raise _malformed("outside its storage")
        t.set_(_alloc.untyped(t), offset, size, stride)
    if bits & 6:
        t = _lazy_bits(bits & 2, bits & 4, t)
    if bits & 1:
        t.requires_grad = True
    return t


def reduce_storage(storage):
    # Not _sending(): a bare storage not in a segment can only be copied
    # here, where torch's strategies move it into shared memory in place;
    # sending_as_tshm() must not take that sharing away from the caller.
    if storage.device.type != "cpu" or \
            (not active() and locate(storage) is None):
        return _torch_red.reduce_storage(storage)
    return rebuild_storage, _export(storage)


def register():
    """Register the reducers where torch.multiprocessing registers its own
    (torch.multiprocessing.reductions.init_reductions())."""
    fp = multiprocessing.reduction.ForkingPickler
    for t in torch._storage_classes:
        if t.__name__ == "UntypedStorage":
            fp.register(t, reduce_storage)
    for t in list(torch._tensor_classes) + [torch.Tensor,
                                             torch.nn.parameter.Parameter]:
        fp.register(t, reduce_tensor)
