// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * dlpack.c - tshm._tshm._dlpack(): memory tshm owns, handed to a framework
 * (torch.from_dlpack) as a DLPack capsule without a copy.
 *
 * The capsule's DLManagedTensor holds a reference to an owner object (a
 * GPU buffer, a segment): the framework calls the deleter when its tensor
 * lets go, maybe from a thread that does not hold the GIL, and the deleter
 * drops that reference under the GIL.  A capsule nobody consumed is freed
 * by its own destructor.  The structures are DLPack's stable ABI (v0.8,
 * dlpack.h; not shipped by Debian, hence copied with their layout).
 */
#include "pytshm.h"

#include <stdint.h>

enum { DL_CPU = 1, DL_CUDA = 2 };

typedef struct {
	int32_t device_type;
	int32_t device_id;
} DLDevice;

typedef struct {
	uint8_t code;		/* 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool */
	uint8_t bits;
	uint16_t lanes;
} DLDataType;

typedef struct {
	void *data;
	DLDevice device;
	int32_t ndim;
	DLDataType dtype;
	int64_t *shape;
	int64_t *strides;	/* in elements; NULL: compact row-major */
	uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
	DLTensor dl_tensor;
	void *manager_ctx;
	void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DL_MAX_DIMS	64

/* The managed tensor with its shape and strides in one allocation. */
struct dl_holder {
	DLManagedTensor mt;
	PyObject *owner;
	int64_t dims[2 * DL_MAX_DIMS];
};

static int dl_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
	return Py_IsFinalizing();
#else
	return _Py_IsFinalizing();
#endif
}

static void dl_deleter(DLManagedTensor *mt)
{
	struct dl_holder *h = (struct dl_holder *)mt;
	PyGILState_STATE g;

	/*
	 * A framework may free its tensor while the interpreter shuts down
	 * or after it is gone (a C++ static destructor), when taking the GIL
	 * from another thread may hang or end that thread: the owner is then
	 * left to the process's exit, which frees everything anyway.
	 */
	if (Py_IsInitialized() && !dl_finalizing()) {
		g = PyGILState_Ensure();
		Py_DECREF(h->owner);
		PyGILState_Release(g);
	}
	PyMem_RawFree(h);
}

static void capsule_destructor(PyObject *cap)
{
	DLManagedTensor *mt;

	/* Consumed: renamed "used_dltensor", the consumer owns it. */
	if (!PyCapsule_IsValid(cap, "dltensor"))
		return;
	mt = PyCapsule_GetPointer(cap, "dltensor");
	if (mt)
		mt->deleter(mt);
}

/* A tuple of ints into @out (@n of them). */
static int dims_arg(PyObject *seq, const char *what, int64_t *out,
		    Py_ssize_t *n)
{
	PyObject *fast = PySequence_Fast(seq, what);
	Py_ssize_t i;

	if (!fast)
		return -1;
	*n = PySequence_Fast_GET_SIZE(fast);
	if (*n > DL_MAX_DIMS) {
		PyErr_Format(PyExc_ValueError, "%s: at most %d dimensions",
			     what, DL_MAX_DIMS);
		Py_DECREF(fast);
		return -1;
	}
	for (i = 0; i < *n; i++) {
		out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
		if (out[i] == -1 && PyErr_Occurred()) {
			Py_DECREF(fast);
			return -1;
		}
	}
	Py_DECREF(fast);
	return 0;
}

PyObject *pytshm_dlpack(PyObject *module, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "owner", "ptr", "device_type", "device_id",
				  "shape", "strides", "code", "bits", NULL };
	PyObject *owner, *shape, *strides, *cap;
	unsigned long long ptr;
	int dev_type, dev_id, code, bits;
	Py_ssize_t ndim, nstrides, i;
	struct dl_holder *h;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OKiiOOii:_dlpack", kwlist,
					 &owner, &ptr, &dev_type, &dev_id,
					 &shape, &strides, &code, &bits))
		return NULL;
	if (dev_type != DL_CPU && dev_type != DL_CUDA)
		return PyErr_Format(PyExc_ValueError,
				    "device_type %d: kDLCPU (1) or kDLCUDA (2)",
				    dev_type);
	if (code < 0 || code > 6 || code == 3 || bits <= 0 || bits > 255)
		return PyErr_Format(PyExc_ValueError,
				    "not a DLPack data type: code %d, %d bits",
				    code, bits);
	h = PyMem_RawCalloc(1, sizeof(*h));
	if (!h)
		return PyErr_NoMemory();
	if (dims_arg(shape, "shape", h->dims, &ndim) < 0)
		goto fail;
	for (i = 0; i < ndim; i++)
		if (h->dims[i] < 0) {
			PyErr_SetString(PyExc_ValueError, "negative dimension");
			goto fail;
		}
	if (strides != Py_None) {
		if (dims_arg(strides, "strides", h->dims + DL_MAX_DIMS,
			     &nstrides) < 0)
			goto fail;
		if (nstrides != ndim) {
			PyErr_SetString(PyExc_ValueError,
					"strides and shape differ in length");
			goto fail;
		}
		h->mt.dl_tensor.strides = h->dims + DL_MAX_DIMS;
	}
	h->mt.dl_tensor.data = (void *)(uintptr_t)ptr;
	h->mt.dl_tensor.device.device_type = dev_type;
	h->mt.dl_tensor.device.device_id = dev_id;
	h->mt.dl_tensor.ndim = (int32_t)ndim;
	h->mt.dl_tensor.dtype.code = (uint8_t)code;
	h->mt.dl_tensor.dtype.bits = (uint8_t)bits;
	h->mt.dl_tensor.dtype.lanes = 1;
	h->mt.dl_tensor.shape = h->dims;
	h->mt.manager_ctx = h;
	h->mt.deleter = dl_deleter;
	h->owner = owner;
	Py_INCREF(owner);
	cap = PyCapsule_New(&h->mt, "dltensor", capsule_destructor);
	if (!cap) {
		Py_DECREF(owner);
		goto fail;
	}
	return cap;
fail:
	PyMem_RawFree(h);
	return NULL;
}
