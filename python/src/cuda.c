// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * cuda.c - libtshm-cuda's objects for Python: _CudaDevice, _CudaBuffer and
 * _CudaPool (tshm/cuda.py is the API on top).  Built only when the CUDA
 * toolkit's headers are found (python.mk, setup.py); the driver itself is
 * loaded at run time by the library, so the extension imports on machines
 * without one and _CudaDevice() raises OSError(ENODEV) with the reason.
 *
 * A CUDA context does not survive fork(): each object remembers the pid
 * that made it, refuses to be used in another process, and is not freed
 * through the driver there (the child's copy is simply forgotten).
 */
#include "pytshm.h"

#include <errno.h>
#include <stddef.h>
#include <unistd.h>

#include <tshm-cuda.h>

typedef struct {
	PyObject_HEAD
	struct tshm_cuda *cu;
	int ordinal;
	pid_t pid;
} TshmCudaDevice;

typedef struct {
	PyObject_HEAD
	struct tshm_cuda_buf *buf;	/* NULL once closed */
	TshmCudaDevice *device;
	PyObject *pool;			/* a pool's buffer: keeps it alive */
	bool producer;
	pid_t pid;
	unsigned busy;			/* threads waiting with the GIL off */
	PyObject *weakrefs;
} TshmCudaBuffer;

typedef struct {
	PyObject_HEAD
	struct tshm_cuda_pool *pool;	/* NULL once closed */
	TshmCudaDevice *device;
	pid_t pid;
	unsigned busy;			/* threads in get() with the GIL off */
} TshmCudaPool;

static PyTypeObject TshmCudaBuffer_Type;

/* OSError for a libtshm-cuda failure, with the library's message. */
static PyObject *cuda_raise(int err)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "%s: %s", tshm_cuda_strerror(err),
		 tshm_cuda_last_error());
	return pytshm_raise(err, msg);
}

static int check_pid(pid_t pid)
{
	if (pid == getpid())
		return 0;
	PyErr_SetString(PyExc_RuntimeError,
			"a CUDA object made before fork() cannot be used in the "
			"child: a CUDA context does not survive fork()");
	return -1;
}

/* ---- _CudaDevice ---- */

struct open_call {
	int ordinal;
	struct tshm_cuda *cu;
};

static PyObject *device_new(PyTypeObject *type, PyObject *args,
			    PyObject *kwds)
{
	static char *kwlist[] = { "ordinal", NULL };
	TshmCudaDevice *self;
	int ordinal = 0, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i:_CudaDevice", kwlist,
					 &ordinal))
		return NULL;
	self = (TshmCudaDevice *)type->tp_alloc(type, 0);
	if (!self)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_cuda_open(ordinal, &self->cu);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		self->cu = NULL;
		Py_DECREF(self);
		return cuda_raise(ret);
	}
	self->ordinal = ordinal;
	self->pid = getpid();
	return (PyObject *)self;
}

static void device_dealloc(TshmCudaDevice *self)
{
	if (self->cu && self->pid == getpid())
		tshm_cuda_close(self->cu);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *buffer_wrap(TshmCudaDevice *dev, struct tshm_cuda_buf *buf,
			     bool producer, PyObject *pool)
{
	TshmCudaBuffer *b = PyObject_New(TshmCudaBuffer, &TshmCudaBuffer_Type);

	if (!b) {
		tshm_cuda_buf_unref(buf);
		return NULL;
	}
	b->buf = buf;
	b->device = dev;
	Py_INCREF(dev);
	b->pool = pool;
	Py_XINCREF(pool);
	b->producer = producer;
	b->pid = getpid();
	b->busy = 0;
	b->weakrefs = NULL;
	return (PyObject *)b;
}

static PyObject *device_alloc(TshmCudaDevice *self, PyObject *args,
			      PyObject *kwds)
{
	static char *kwlist[] = { "size", "ctx", NULL };
	PyObject *ctxarg = Py_None;
	struct tshm_cuda_buf *buf;
	TshmContext *ctx;
	Py_ssize_t size;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|O:alloc", kwlist,
					 &size, &ctxarg))
		return NULL;
	if (check_pid(self->pid) < 0)
		return NULL;
	if (size <= 0)
		return PyErr_Format(PyExc_ValueError,
				    "size must be positive, not %zd", size);
	ctx = pytshm_context_arg(ctxarg);
	if (!ctx)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_cuda_buf_alloc(self->cu, ctx->ctx, size, &buf);
	Py_END_ALLOW_THREADS
	Py_DECREF(ctx);
	if (ret < 0)
		return cuda_raise(ret);
	return buffer_wrap(self, buf, true, NULL);
}

static PyObject *device_unpack(TshmCudaDevice *self, PyObject *args)
{
	struct tshm_seg *segs[TSHM_CUDA_PACK_SEGS];
	struct tshm_cuda_buf *buf;
	PyObject *segarg, *fast;
	Py_buffer desc;
	Py_ssize_t n, i;
	int fd, ret;

	if (!PyArg_ParseTuple(args, "y*Oi:unpack", &desc, &segarg, &fd))
		return NULL;
	fast = PySequence_Fast(segarg, "segments must be a sequence");
	if (!fast)
		goto fail_desc;
	n = PySequence_Fast_GET_SIZE(fast);
	if (n > TSHM_CUDA_PACK_SEGS) {
		PyErr_Format(PyExc_ValueError, "a GPU buffer comes with at most "
			     "%d segments, not %zd", TSHM_CUDA_PACK_SEGS, n);
		goto fail_fast;
	}
	if (check_pid(self->pid) < 0)
		goto fail_fast;
	for (i = 0; i < n; i++) {
		segs[i] = pytshm_segment_get(PySequence_Fast_GET_ITEM(fast, i));
		if (!segs[i])
			goto fail_fast;
	}
	/* unpack takes its own segment references and never closes fd */
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_cuda_buf_unpack(self->cu, desc.buf, desc.len, segs,
				   (unsigned)n, fd, &buf);
	Py_END_ALLOW_THREADS
	Py_DECREF(fast);
	PyBuffer_Release(&desc);
	if (ret < 0)
		return cuda_raise(ret);
	return buffer_wrap(self, buf, false, NULL);
fail_fast:
	Py_DECREF(fast);
fail_desc:
	PyBuffer_Release(&desc);
	return NULL;
}

/* A static method: needs no open device, and opens none. */
static PyObject *device_ordinal_of(PyObject *unused, PyObject *args)
{
	Py_buffer desc;
	int ret;

	if (!PyArg_ParseTuple(args, "y*:ordinal_of", &desc))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_cuda_desc_device(desc.buf, desc.len);
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&desc);
	if (ret < 0)
		return cuda_raise(ret);
	return PyLong_FromLong(ret);
}

static PyObject *device_stats(TshmCudaDevice *self, PyObject *unused)
{
	struct tshm_cuda_stats st;

	if (check_pid(self->pid) < 0)
		return NULL;
	tshm_cuda_stats(self->cu, &st);
	return Py_BuildValue("{sKsKsKsK}", "imports",
			     (unsigned long long)st.imports, "cache_hits",
			     (unsigned long long)st.cache_hits, "evictions",
			     (unsigned long long)st.evictions, "cached",
			     (unsigned long long)st.cached);
}

static PyObject *device_trim(TshmCudaDevice *self, PyObject *unused)
{
	int ret;

	if (check_pid(self->pid) < 0)
		return NULL;
	ret = tshm_cuda_cache_trim(self->cu);
	if (ret < 0)
		return cuda_raise(ret);
	return PyLong_FromLong(ret);
}

static PyObject *device_mem_info(TshmCudaDevice *self, PyObject *unused)
{
	size_t free_b, total_b;
	int ret;

	if (check_pid(self->pid) < 0)
		return NULL;
	ret = tshm_cuda_mem_info(self->cu, &free_b, &total_b);
	if (ret < 0)
		return cuda_raise(ret);
	return Py_BuildValue("(nn)", (Py_ssize_t)free_b, (Py_ssize_t)total_b);
}

static PyObject *device_ordinal(TshmCudaDevice *self, void *closure)
{
	return PyLong_FromLong(self->ordinal);
}

static PyObject *device_uuid(TshmCudaDevice *self, void *closure)
{
	uint8_t uuid[16];
	char s[48];

	tshm_cuda_uuid(self->cu, uuid);
	tshm_cuda_uuid_str(uuid, s, sizeof(s));
	return PyUnicode_FromString(s);
}

static PyObject *device_granularity(TshmCudaDevice *self, void *closure)
{
	int64_t g = tshm_cuda_granularity(self->cu);

	if (g < 0)
		return cuda_raise((int)g);
	return PyLong_FromLongLong(g);
}

static PyObject *device_vmm(TshmCudaDevice *self, void *closure)
{
	return PyBool_FromLong(tshm_cuda_vmm_supported(self->cu));
}

static PyObject *pool_new_for(TshmCudaDevice *dev, PyObject *args,
			      PyObject *kwds);

static PyGetSetDef device_getset[] = {
	{ "ordinal", (getter)device_ordinal, NULL, "The device's ordinal.", NULL },
	{ "uuid", (getter)device_uuid, NULL, "\"GPU-...\", as nvidia-smi -L.",
	  NULL },
	{ "granularity", (getter)device_granularity, NULL,
	  "Sizes of alloc() are multiples of this.", NULL },
	{ "vmm_supported", (getter)device_vmm, NULL,
	  "True when the device shares VMM memory as fds.", NULL },
	{ NULL }
};

static PyMethodDef device_methods[] = {
	{ "alloc", (PyCFunction)(void (*)(void))device_alloc,
	  METH_VARARGS | METH_KEYWORDS,
	  "alloc(size, ctx=None) -> _CudaBuffer: tshm_cuda_buf_alloc()" },
	{ "pool", (PyCFunction)(void (*)(void))pool_new_for,
	  METH_VARARGS | METH_KEYWORDS,
	  "pool(count, size, ctx=None) -> _CudaPool: tshm_cuda_pool_create()" },
	{ "unpack", (PyCFunction)device_unpack, METH_VARARGS,
	  "unpack(desc, segments, fd) -> _CudaBuffer: tshm_cuda_buf_unpack();\n"
	  "fd stays the caller's." },
	{ "ordinal_of", (PyCFunction)device_ordinal_of,
	  METH_VARARGS | METH_STATIC,
	  "ordinal_of(desc) -> int: the device a packed buffer lives on, by\n"
	  "its UUID, opening none (tshm_cuda_desc_device())." },
	{ "stats", (PyCFunction)device_stats, METH_NOARGS,
	  "The receiver cache's counters (tshm_cuda_stats)." },
	{ "trim", (PyCFunction)device_trim, METH_NOARGS,
	  "Drop cached imports whose producer freed them or died." },
	{ "mem_info", (PyCFunction)device_mem_info, METH_NOARGS,
	  "(free, total) bytes of device memory (cuMemGetInfo)." },
	{ NULL }
};

static PyTypeObject TshmCudaDevice_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm._tshm._CudaDevice",
	.tp_basicsize = sizeof(TshmCudaDevice),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "_CudaDevice(ordinal=0): tshm_cuda_open() in this process.",
	.tp_new = device_new,
	.tp_dealloc = (destructor)device_dealloc,
	.tp_getset = device_getset,
	.tp_methods = device_methods,
};

/* ---- _CudaBuffer ---- */

static struct tshm_cuda_buf *buffer_get(TshmCudaBuffer *self)
{
	if (!self->buf) {
		PyErr_SetString(PyExc_ValueError, "operation on a closed GPU "
				"buffer");
		return NULL;
	}
	if (check_pid(self->pid) < 0)
		return NULL;
	return self->buf;
}

static void buffer_release(TshmCudaBuffer *self)
{
	struct tshm_cuda_buf *buf = self->buf;

	self->buf = NULL;
	if (buf && self->pid == getpid())
		tshm_cuda_buf_unref(buf);
	Py_CLEAR(self->pool);
}

static void buffer_dealloc(TshmCudaBuffer *self)
{
	if (self->weakrefs)
		PyObject_ClearWeakRefs((PyObject *)self);
	buffer_release(self);
	Py_XDECREF(self->device);
	PyObject_Free(self);
}

static PyObject *buffer_close(TshmCudaBuffer *self, PyObject *unused)
{
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "close() of a GPU buffer "
				"another thread waits on");
		return NULL;
	}
	buffer_release(self);
	Py_RETURN_NONE;
}

static PyObject *buffer_pack(TshmCudaBuffer *self, PyObject *unused)
{
	struct tshm_seg *segs[TSHM_CUDA_PACK_SEGS];
	unsigned nsegs = TSHM_CUDA_PACK_SEGS, i;
	char desc[TSHM_CUDA_DESC_SIZE];
	struct tshm_cuda_buf *buf;
	PyObject *tuple, *ret;
	int len, fd;

	buf = buffer_get(self);
	if (!buf)
		return NULL;
	len = tshm_cuda_buf_pack(buf, desc, sizeof(desc), segs, &nsegs, &fd);
	if (len < 0)
		return cuda_raise(len);
	tuple = PyTuple_New(nsegs);
	if (!tuple)
		return NULL;
	for (i = 0; i < nsegs; i++) {
		PyObject *s = pytshm_segment_wrap(tshm_seg_ref(segs[i]));

		if (!s) {
			Py_DECREF(tuple);
			return NULL;
		}
		PyTuple_SET_ITEM(tuple, i, s);
	}
	ret = Py_BuildValue("(y#Oi)", desc, (Py_ssize_t)len, tuple, fd);
	Py_DECREF(tuple);
	return ret;
}

/*
 * Only a tshm.Queue message can carry a buffer (its segments and fd go
 * with the message); any other pickler is told so.
 */
static PyObject *buffer_reduce(TshmCudaBuffer *self, PyObject *unused)
{
	PyErr_SetString(PyExc_TypeError, "a tshm GPU buffer travels only in "
			"a tshm.Queue message (a tshm.torch context's Queue) "
			"whose pickle fits the queue's max_msg, not through "
			"pickle or a pipe");
	return NULL;
}

struct wait_call {
	struct tshm_cuda_buf *buf;
};

static int wait_call(void *arg, int timeout_ms)
{
	struct wait_call *c = arg;

	return tshm_cuda_buf_wait_released(c->buf, timeout_ms);
}

static PyObject *buffer_wait_released(TshmCudaBuffer *self, PyObject *args,
				      PyObject *kwds)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *timeout = Py_None;
	struct wait_call c;
	int ms, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:wait_released",
					 kwlist, &timeout) ||
	    pytshm_timeout_ms(timeout, &ms) < 0)
		return NULL;
	c.buf = buffer_get(self);
	if (!c.buf)
		return NULL;
	if (!self->producer) {
		PyErr_SetString(PyExc_ValueError, "only the producer learns "
				"when receivers let go");
		return NULL;
	}
	/* close() refuses while busy, and the reference keeps dealloc off. */
	Py_INCREF(self);
	self->busy++;
	ret = pytshm_block(wait_call, &c, ms, true);
	self->busy--;
	Py_DECREF(self);
	if (ret == -ETIMEDOUT || ret == -EAGAIN)
		Py_RETURN_FALSE;
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret < 0)
		return cuda_raise(ret);
	Py_RETURN_TRUE;
}

#define BUF_GETTER(name, expr)						\
static PyObject *buffer_##name(TshmCudaBuffer *self, void *closure)	\
{									\
	struct tshm_cuda_buf *buf = buffer_get(self);			\
									\
	return buf ? (expr) : NULL;					\
}

BUF_GETTER(ptr, PyLong_FromVoidPtr(tshm_cuda_buf_ptr(buf)))
BUF_GETTER(size, PyLong_FromSize_t(tshm_cuda_buf_size(buf)))
BUF_GETTER(id, PyLong_FromUnsignedLongLong(tshm_cuda_buf_id(buf)))
BUF_GETTER(kind, PyUnicode_FromString(tshm_cuda_buf_kind(buf) ==
				      TSHM_CUDA_VMM ? "vmm" : "legacy"))

static PyObject *buffer_producer(TshmCudaBuffer *self, void *closure)
{
	return PyBool_FromLong(self->producer);
}

static PyObject *buffer_closed(TshmCudaBuffer *self, void *closure)
{
	return PyBool_FromLong(!self->buf);
}

static PyObject *buffer_device(TshmCudaBuffer *self, void *closure)
{
	Py_INCREF(self->device);
	return (PyObject *)self->device;
}

static PyGetSetDef buffer_getset[] = {
	{ "ptr", (getter)buffer_ptr, NULL, "Device address (an int).", NULL },
	{ "size", (getter)buffer_size, NULL, "Bytes.", NULL },
	{ "id", (getter)buffer_id, NULL, "The buffer's id (both ends).", NULL },
	{ "kind", (getter)buffer_kind, NULL, "\"vmm\" or \"legacy\".", NULL },
	{ "producer", (getter)buffer_producer, NULL,
	  "True where it was allocated, False where it was received.", NULL },
	{ "closed", (getter)buffer_closed, NULL, "True after close().", NULL },
	{ "device", (getter)buffer_device, NULL, "Its _CudaDevice.", NULL },
	{ NULL }
};

static PyMethodDef buffer_methods[] = {
	{ "close", (PyCFunction)buffer_close, METH_NOARGS,
	  "Drop this process's reference (tshm_cuda_buf_unref)." },
	{ "_pack", (PyCFunction)buffer_pack, METH_NOARGS,
	  "_pack() -> (desc, segments, fd): tshm_cuda_buf_pack(); fd is the\n"
	  "buffer's (-1: none), valid while the buffer is open." },
	{ "__reduce__", (PyCFunction)buffer_reduce, METH_NOARGS,
	  "Refused: see tshm.Queue." },
	{ "wait_released", (PyCFunction)(void (*)(void))buffer_wait_released,
	  METH_VARARGS | METH_KEYWORDS,
	  "wait_released(timeout=None) -> bool: True once every process it\n"
	  "was sent to let go (unref, exit or death), False on timeout." },
	{ NULL }
};

static PyTypeObject TshmCudaBuffer_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm._tshm._CudaBuffer",
	.tp_basicsize = sizeof(TshmCudaBuffer),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A libtshm-cuda buffer (made by _CudaDevice).",
	.tp_weaklistoffset = offsetof(TshmCudaBuffer, weakrefs),
	.tp_dealloc = (destructor)buffer_dealloc,
	.tp_getset = buffer_getset,
	.tp_methods = buffer_methods,
};

/* ---- _CudaPool ---- */

static PyTypeObject TshmCudaPool_Type;

static PyObject *pool_new_for(TshmCudaDevice *dev, PyObject *args,
			      PyObject *kwds)
{
	static char *kwlist[] = { "count", "size", "ctx", NULL };
	PyObject *ctxarg = Py_None;
	struct tshm_cuda_pool *pool;
	TshmCudaPool *self;
	TshmContext *ctx;
	unsigned count;
	Py_ssize_t size;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "In|O:pool", kwlist,
					 &count, &size, &ctxarg))
		return NULL;
	if (check_pid(dev->pid) < 0)
		return NULL;
	if (!count || size <= 0)
		return PyErr_Format(PyExc_ValueError, "count and size must be "
				    "positive, not %u and %zd", count, size);
	ctx = pytshm_context_arg(ctxarg);
	if (!ctx)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_cuda_pool_create(dev->cu, ctx->ctx, count, size, &pool);
	Py_END_ALLOW_THREADS
	Py_DECREF(ctx);
	if (ret < 0)
		return cuda_raise(ret);
	self = PyObject_New(TshmCudaPool, &TshmCudaPool_Type);
	if (!self) {
		tshm_cuda_pool_destroy(pool);
		return NULL;
	}
	self->pool = pool;
	self->device = dev;
	Py_INCREF(dev);
	self->pid = getpid();
	self->busy = 0;
	return (PyObject *)self;
}

static void pool_release(TshmCudaPool *self)
{
	struct tshm_cuda_pool *pool = self->pool;

	self->pool = NULL;
	if (pool && self->pid == getpid())
		tshm_cuda_pool_destroy(pool);
}

static void pool_dealloc(TshmCudaPool *self)
{
	pool_release(self);
	Py_XDECREF(self->device);
	PyObject_Free(self);
}

struct get_call {
	struct tshm_cuda_pool *pool;
	struct tshm_cuda_buf *buf;
};

static int get_call(void *arg, int timeout_ms)
{
	struct get_call *c = arg;

	return tshm_cuda_pool_get(c->pool, timeout_ms, &c->buf);
}

static PyObject *pool_get(TshmCudaPool *self, PyObject *args,
			  PyObject *kwds)
{
	static char *kwlist[] = { "timeout", NULL };
	struct get_call c = { .pool = self->pool };
	PyObject *timeout = Py_None;
	int ms, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:get", kwlist,
					 &timeout) ||
	    pytshm_timeout_ms(timeout, &ms) < 0)
		return NULL;
	if (!c.pool) {
		PyErr_SetString(PyExc_ValueError, "operation on a closed pool");
		return NULL;
	}
	if (check_pid(self->pid) < 0)
		return NULL;
	/* close() refuses while busy, and the reference keeps dealloc off. */
	Py_INCREF(self);
	self->busy++;
	ret = pytshm_block(get_call, &c, ms, true);
	self->busy--;
	Py_DECREF(self);
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret == -ETIMEDOUT || ret == -EAGAIN) {
		PyErr_SetString(pytshm_Timeout, "no buffer of the pool came "
				"back in time");
		return NULL;
	}
	if (ret < 0)
		return cuda_raise(ret);
	/*
	 * A buffer still out keeps the pool's allocation: the pool object
	 * stays alive with it, destroyed when both are gone.
	 */
	return buffer_wrap(self->device, c.buf, true, (PyObject *)self);
}

static PyObject *pool_close(TshmCudaPool *self, PyObject *unused)
{
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "close() of a GPU pool "
				"another thread waits on");
		return NULL;
	}
	pool_release(self);
	Py_RETURN_NONE;
}

static PyObject *pool_available(TshmCudaPool *self, void *closure)
{
	if (!self->pool || self->pid != getpid())
		return PyLong_FromLong(0);
	return PyLong_FromUnsignedLong(tshm_cuda_pool_available(self->pool));
}

static PyGetSetDef pool_getset[] = {
	{ "available", (getter)pool_available, NULL,
	  "Buffers ready to be handed out now.", NULL },
	{ NULL }
};

static PyMethodDef pool_methods[] = {
	{ "get", (PyCFunction)(void (*)(void))pool_get,
	  METH_VARARGS | METH_KEYWORDS,
	  "get(timeout=None) -> _CudaBuffer: a free buffer, waiting up to\n"
	  "timeout seconds for one to come back (tshm.Timeout)." },
	{ "close", (PyCFunction)pool_close, METH_NOARGS,
	  "Destroy the pool; buffers still out live until released." },
	{ NULL }
};

static PyTypeObject TshmCudaPool_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm._tshm._CudaPool",
	.tp_basicsize = sizeof(TshmCudaPool),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Recycled GPU buffers cut from one allocation.",
	.tp_dealloc = (destructor)pool_dealloc,
	.tp_getset = pool_getset,
	.tp_methods = pool_methods,
};

int pytshm_cuda_init(PyObject *m)
{
	if (pytshm_add_type(m, &TshmCudaDevice_Type, "_CudaDevice") < 0 ||
	    pytshm_add_type(m, &TshmCudaBuffer_Type, "_CudaBuffer") < 0 ||
	    pytshm_add_type(m, &TshmCudaPool_Type, "_CudaPool") < 0)
		return -1;
	return 0;
}
