// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * segment.c - tshm.Segment: a fixed-size shared mapping with the buffer
 * protocol, and the registry of mapped segments by address.
 *
 * The registry lets the queue's pickler find that a buffer (a numpy array,
 * a memoryview) lies inside a segment this process maps, so that it is
 * sent by reference instead of copied.  It also keeps one Python object per
 * library segment: receiving a segment this process already holds gives
 * back the same Segment.  It is a sorted array searched by bisection,
 * guarded by the GIL.
 */
#include "pytshm.h"

#include <errno.h>
#include <string.h>

static TshmSegment **reg;
static Py_ssize_t reg_len, reg_cap;

/* Index of the first entry whose data does not start below @addr. */
static Py_ssize_t reg_lower_bound(const char *addr)
{
	Py_ssize_t lo = 0, hi = reg_len;

	while (lo < hi) {
		Py_ssize_t mid = lo + (hi - lo) / 2;

		if (reg[mid]->data < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int reg_add(TshmSegment *s)
{
	Py_ssize_t i;

	if (reg_len == reg_cap) {
		Py_ssize_t cap = reg_cap ? reg_cap * 2 : 64;
		TshmSegment **n = PyMem_Realloc(reg, cap * sizeof(*reg));

		if (!n) {
			PyErr_NoMemory();
			return -1;
		}
		reg = n;
		reg_cap = cap;
	}
	i = reg_lower_bound(s->data);
	memmove(reg + i + 1, reg + i, (reg_len - i) * sizeof(*reg));
	reg[i] = s;
	reg_len++;
	return 0;
}

static void reg_remove(TshmSegment *s)
{
	Py_ssize_t i = reg_lower_bound(s->data);

	if (i < reg_len && reg[i] == s) {
		memmove(reg + i, reg + i + 1, (reg_len - i - 1) * sizeof(*reg));
		reg_len--;
	}
}

TshmSegment *pytshm_segment_containing(const void *addr, Py_ssize_t len)
{
	const char *p = addr;
	Py_ssize_t i = reg_lower_bound(p + 1);	/* first starting above p */
	TshmSegment *s;

	if (i == 0)
		return NULL;
	s = reg[i - 1];
	if (p < s->data || len > s->size || p - s->data > s->size - len)
		return NULL;
	return s;
}

/* A new Segment object owning one library reference to @seg. */
static PyObject *segment_alloc(PyTypeObject *type, struct tshm_seg *seg)
{
	TshmSegment *self = (TshmSegment *)type->tp_alloc(type, 0);

	if (!self) {
		tshm_seg_unref(seg);
		return NULL;
	}
	self->seg = seg;
	self->data = tshm_seg_data(seg);
	self->size = tshm_seg_size(seg);
	if (reg_add(self) < 0) {
		Py_DECREF(self);
		return NULL;
	}
	return (PyObject *)self;
}

PyObject *pytshm_segment_wrap(struct tshm_seg *seg)
{
	TshmSegment *known;

	/* The library's cache gave an attached segment again: reuse. */
	known = pytshm_segment_containing(tshm_seg_data(seg), 1);
	if (known && known->seg == seg) {
		tshm_seg_unref(seg);
		Py_INCREF(known);
		return (PyObject *)known;
	}
	return segment_alloc(&TshmSegment_Type, seg);
}

struct tshm_seg *pytshm_segment_get(PyObject *obj)
{
	TshmSegment *s;

	if (!PyObject_TypeCheck(obj, &TshmSegment_Type)) {
		PyErr_Format(PyExc_TypeError, "expected a tshm.Segment, not %.100s",
			     Py_TYPE(obj)->tp_name);
		return NULL;
	}
	s = (TshmSegment *)obj;
	if (!s->seg) {
		PyErr_SetString(PyExc_ValueError, "I/O on a closed segment");
		return NULL;
	}
	return s->seg;
}

static PyObject *segment_new(PyTypeObject *type, PyObject *args,
			     PyObject *kwds)
{
	static char *kwlist[] = { "size", "name", "huge", "prefault", "ctx",
				  NULL };
	Py_ssize_t size;
	const char *name = NULL;
	int huge = 0, prefault = 0, ret;
	PyObject *ctxarg = NULL;
	TshmContext *ctx;
	struct tshm_seg *seg;
	unsigned flags;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|z$ppO:Segment", kwlist,
					 &size, &name, &huge, &prefault,
					 &ctxarg))
		return NULL;
	if (size <= 0)
		return PyErr_Format(PyExc_ValueError,
				    "segment size must be positive, not %zd",
				    size);
	ctx = pytshm_context_arg(ctxarg);
	if (!ctx)
		return NULL;
	flags = (huge ? TSHM_SEG_HUGE : 0) | (prefault ? TSHM_SEG_PREFAULT : 0);
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_seg_create(ctx->ctx, size, name, flags, &seg);
	Py_END_ALLOW_THREADS
	Py_DECREF(ctx);
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	return segment_alloc(type, seg);
}

static void segment_drop(TshmSegment *self)
{
	if (self->seg) {
		reg_remove(self);
		tshm_seg_unref(self->seg);
		self->seg = NULL;
	}
}

static void segment_dealloc(TshmSegment *self)
{
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	segment_drop(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int segment_getbuffer(TshmSegment *self, Py_buffer *view, int flags)
{
	if (!self->seg) {
		PyErr_SetString(PyExc_ValueError, "I/O on a closed segment");
		view->obj = NULL;
		return -1;
	}
	if (PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size,
			      0, flags) < 0)
		return -1;
	self->exports++;
	return 0;
}

static void segment_releasebuffer(TshmSegment *self, Py_buffer *view)
{
	self->exports--;
}

static PyBufferProcs segment_as_buffer = {
	.bf_getbuffer = (getbufferproc)segment_getbuffer,
	.bf_releasebuffer = (releasebufferproc)segment_releasebuffer,
};

static PyObject *segment_close(TshmSegment *self, PyObject *unused)
{
	if (self->exports) {
		PyErr_SetString(PyExc_BufferError,
				"cannot close a segment while views of it exist");
		return NULL;
	}
	segment_drop(self);
	Py_RETURN_NONE;
}

static PyObject *segment_enter(TshmSegment *self, PyObject *unused)
{
	if (!pytshm_segment_get((PyObject *)self))
		return NULL;
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *segment_exit(TshmSegment *self, PyObject *args)
{
	return segment_close(self, NULL);
}

static int wait_released_call(void *seg, int timeout_ms)
{
	return tshm_seg_wait_released(seg, timeout_ms);
}

static PyObject *segment_wait_released(TshmSegment *self, PyObject *args,
				       PyObject *kwds)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *timeout = Py_None;
	struct tshm_seg *seg;
	int ms, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:wait_released", kwlist,
					 &timeout))
		return NULL;
	if (pytshm_timeout_ms(timeout, &ms) < 0)
		return NULL;
	seg = pytshm_segment_get((PyObject *)self);
	if (!seg)
		return NULL;
	tshm_seg_ref(seg);	/* a close() meanwhile must not free it */
	ret = pytshm_block(wait_released_call, seg, ms, true);
	tshm_seg_unref(seg);
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret == -ETIMEDOUT || ret == -EAGAIN)
		Py_RETURN_FALSE;
	if (ret < 0)
		return pytshm_raise(ret, ret == -EOPNOTSUPP ?
			"only the process that created a segment can wait "
			"for its release" : NULL);
	Py_RETURN_TRUE;
}

static PyObject *segment_send_fd(TshmSegment *self, PyObject *arg)
{
	struct tshm_seg *seg = pytshm_segment_get((PyObject *)self);
	int sock = PyObject_AsFileDescriptor(arg), ret;

	if (!seg || sock < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_seg_send_fd(seg, sock);
	Py_END_ALLOW_THREADS
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	Py_RETURN_NONE;
}

static PyObject *segment_recv_fd(PyObject *cls, PyObject *args,
				 PyObject *kwds)
{
	static char *kwlist[] = { "sock", "ctx", NULL };
	PyObject *sockarg, *ctxarg = Py_None;
	struct tshm_seg *seg;
	TshmContext *ctx;
	int sock, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:_recv_fd", kwlist,
					 &sockarg, &ctxarg))
		return NULL;
	sock = PyObject_AsFileDescriptor(sockarg);
	if (sock < 0)
		return NULL;
	ctx = pytshm_context_arg(ctxarg);
	if (!ctx)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_seg_recv_fd(ctx->ctx, sock, &seg);
	Py_END_ALLOW_THREADS
	Py_DECREF(ctx);
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	return pytshm_segment_wrap(seg);
}

PyObject *pytshm_locate(PyObject *module, PyObject *obj)
{
	TshmSegment *s;
	Py_buffer view;

	if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
		return NULL;
	s = view.len ? pytshm_segment_containing(view.buf, view.len) : NULL;
	if (!s) {
		PyBuffer_Release(&view);
		Py_RETURN_NONE;
	}
	obj = Py_BuildValue("(On)", s, (Py_ssize_t)((char *)view.buf - s->data));
	PyBuffer_Release(&view);
	return obj;
}

PyObject *pytshm_locate_address(PyObject *module, PyObject *args)
{
	unsigned long long addr;
	Py_ssize_t len;
	TshmSegment *s;

	if (!PyArg_ParseTuple(args, "Kn:_locate_address", &addr, &len))
		return NULL;
	if (len <= 0)
		return PyErr_Format(PyExc_ValueError,
				    "length must be positive, not %zd", len);
	s = pytshm_segment_containing((const void *)(uintptr_t)addr, len);
	if (!s)
		Py_RETURN_NONE;
	return Py_BuildValue("(On)", s,
			     (Py_ssize_t)((char *)(uintptr_t)addr - s->data));
}

static PyObject *segment_address(TshmSegment *self, void *closure)
{
	if (!pytshm_segment_get((PyObject *)self))
		return NULL;
	return PyLong_FromVoidPtr(self->data);
}

static PyObject *segment_id(TshmSegment *self, void *closure)
{
	struct tshm_seg *seg = pytshm_segment_get((PyObject *)self);

	return seg ? PyLong_FromUnsignedLongLong(tshm_seg_id(seg)) : NULL;
}

static PyObject *segment_size(TshmSegment *self, void *closure)
{
	return PyLong_FromSsize_t(self->size);
}

static PyObject *segment_name(TshmSegment *self, void *closure)
{
	struct tshm_seg *seg = pytshm_segment_get((PyObject *)self);
	const char *name;

	if (!seg)
		return NULL;
	name = tshm_seg_name(seg);
	if (!name || !*name)
		Py_RETURN_NONE;
	return PyUnicode_DecodeFSDefault(name);
}

static PyObject *segment_closed(TshmSegment *self, void *closure)
{
	return PyBool_FromLong(!self->seg);
}

static PyObject *segment_repr(TshmSegment *self)
{
	if (!self->seg)
		return PyUnicode_FromString("<tshm.Segment closed>");
	return PyUnicode_FromFormat("<tshm.Segment id=%llu size=%zd>",
				    (unsigned long long)tshm_seg_id(self->seg),
				    self->size);
}

static Py_ssize_t segment_length(TshmSegment *self)
{
	return self->size;
}

static PySequenceMethods segment_as_sequence = {
	.sq_length = (lenfunc)segment_length,
};

static PyGetSetDef segment_getset[] = {
	{ "id", (getter)segment_id, NULL,
	  "The segment's id: the module's (never reused), or the memfd's inode.",
	  NULL },
	{ "size", (getter)segment_size, NULL, "Size in bytes (fixed).", NULL },
	{ "name", (getter)segment_name, NULL,
	  "The name shown in /proc/tshm and /proc/PID/maps, or None.", NULL },
	{ "closed", (getter)segment_closed, NULL, "True after close().", NULL },
	{ "_address", (getter)segment_address, NULL,
	  "Where the segment is mapped in this process (for torch storages).",
	  NULL },
	{ NULL }
};

static PyMethodDef segment_methods[] = {
	{ "close", (PyCFunction)segment_close, METH_NOARGS,
	  "Unmap and drop this process's hold.  BufferError while views "
	  "(memoryviews, numpy arrays) of it exist; idempotent." },
	{ "wait_released", (PyCFunction)(void (*)(void))segment_wait_released,
	  METH_VARARGS | METH_KEYWORDS,
	  "wait_released(timeout=None) -> bool\n\n"
	  "Wait until this process is the segment's only holder: every process "
	  "it was sent to let go (or died), nothing in flight.  False on "
	  "timeout." },
	{ "__enter__", (PyCFunction)segment_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)segment_exit, METH_VARARGS, NULL },
	{ "_send_fd", (PyCFunction)segment_send_fd, METH_O,
	  "_send_fd(sock): send over a connected AF_UNIX socket (pickling)." },
	{ "_recv_fd", (PyCFunction)(void (*)(void))segment_recv_fd,
	  METH_VARARGS | METH_KEYWORDS | METH_CLASS,
	  "_recv_fd(sock, ctx=None) -> Segment: the other end of _send_fd." },
	{ NULL }
};

PyTypeObject TshmSegment_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm.Segment",
	.tp_basicsize = sizeof(TshmSegment),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Segment(size, name=None, *, huge=False, prefault=False, "
		"ctx=None)\n\n"
		"Shared memory of a fixed size that lives while any process "
		"holds it.  memoryview(seg) and numpy.frombuffer(seg) give "
		"writable views of it.",
	.tp_new = segment_new,
	.tp_dealloc = (destructor)segment_dealloc,
	.tp_repr = (reprfunc)segment_repr,
	.tp_as_buffer = &segment_as_buffer,
	.tp_as_sequence = &segment_as_sequence,
	.tp_getset = segment_getset,
	.tp_methods = segment_methods,
	.tp_weaklistoffset = offsetof(TshmSegment, weakrefs),
};
