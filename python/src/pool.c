// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * pool.c - tshm.Pool: fixed-size buffers that come back by themselves once
 * every process they were sent to has let go.
 */
#include "pytshm.h"

#include <errno.h>

typedef struct {
	PyObject_HEAD
	struct tshm_pool *pool;		/* NULL once destroyed */
	Py_ssize_t count, size;
	int busy;			/* get() calls waiting */
	int closed;			/* destroy when busy drops to 0;
					 * read without the GIL by get_call */
} TshmPool;

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "count", "size", "name", "ctx", "huge", NULL };
	Py_ssize_t count, size;
	const char *name = NULL;
	PyObject *ctxarg = Py_None;
	TshmContext *ctx;
	TshmPool *self;
	int huge = 0, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn|zO$p:Pool", kwlist,
					 &count, &size, &name, &ctxarg, &huge))
		return NULL;
	if (count <= 0 || count > 65536)	/* tshm_pool_create()'s bound */
		return PyErr_Format(PyExc_ValueError,
				    "count must be 1 .. 65536, not %zd", count);
	if (size <= 0)
		return PyErr_Format(PyExc_ValueError,
				    "buffer size must be positive, not %zd", size);
	ctx = pytshm_context_arg(ctxarg);
	if (!ctx)
		return NULL;
	self = (TshmPool *)type->tp_alloc(type, 0);
	if (self) {
		self->count = count;
		self->size = size;
		Py_BEGIN_ALLOW_THREADS
		ret = tshm_pool_create(ctx->ctx, count, size, name,
				       huge ? TSHM_SEG_HUGE : 0, &self->pool);
		Py_END_ALLOW_THREADS
		if (ret < 0) {
			self->pool = NULL;
			Py_CLEAR(self);
			pytshm_raise(ret, NULL);
		}
	}
	Py_DECREF(ctx);
	return (PyObject *)self;
}

static void pool_dealloc(TshmPool *self)
{
	if (self->pool)
		tshm_pool_destroy(self->pool);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static void pool_destroy(TshmPool *self)
{
	if (self->pool) {
		tshm_pool_destroy(self->pool);
		self->pool = NULL;
	}
}

static int pool_check(TshmPool *self)
{
	if (self->pool && !self->closed)
		return 0;
	PyErr_SetString(PyExc_ValueError, "operation on a closed pool");
	return -1;
}

struct get_call {
	struct tshm_pool *pool;
	const int *closed;
	struct tshm_seg *seg;
};

/* Each slice first sees whether close() came meanwhile: it ends the wait. */
static int get_call(void *arg, int timeout_ms)
{
	struct get_call *c = arg;

	if (__atomic_load_n(c->closed, __ATOMIC_RELAXED))
		return -ECANCELED;
	return tshm_pool_get(c->pool, timeout_ms, &c->seg);
}

static PyObject *pool_get(TshmPool *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *timeout = Py_None;
	struct get_call c;
	int ms, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:get", kwlist, &timeout))
		return NULL;
	if (pytshm_timeout_ms(timeout, &ms) < 0 || pool_check(self) < 0)
		return NULL;
	/*
	 * A close() from another thread while this waits without the GIL
	 * defers the destroy to the last waiter.
	 */
	c.pool = self->pool;
	c.closed = &self->closed;
	self->busy++;
	ret = pytshm_block(get_call, &c, ms, true);
	if (--self->busy == 0 && self->closed)
		pool_destroy(self);
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret == -ETIMEDOUT || ret == -EAGAIN) {
		PyErr_SetString(pytshm_Timeout,
				"no buffer came back to the pool in time");
		return NULL;
	}
	if (ret == -ECANCELED) {
		PyErr_SetString(PyExc_ValueError,
				"the pool was closed while get() waited");
		return NULL;
	}
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	return pytshm_segment_wrap(c.seg);
}

static PyObject *pool_close(TshmPool *self, PyObject *unused)
{
	__atomic_store_n(&self->closed, 1, __ATOMIC_RELAXED);
	if (!self->busy)
		pool_destroy(self);
	Py_RETURN_NONE;
}

static PyObject *pool_available(TshmPool *self, void *closure)
{
	if (pool_check(self) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(tshm_pool_available(self->pool));
}

static PyObject *pool_count(TshmPool *self, void *closure)
{
	return PyLong_FromSsize_t(self->count);
}

static PyObject *pool_size(TshmPool *self, void *closure)
{
	return PyLong_FromSsize_t(self->size);
}

static PyObject *pool_enter(TshmPool *self, PyObject *unused)
{
	if (pool_check(self) < 0)
		return NULL;
	Py_INCREF(self);
	return (PyObject *)self;
}

static PyObject *pool_exit(TshmPool *self, PyObject *args)
{
	return pool_close(self, NULL);
}

static PyGetSetDef pool_getset[] = {
	{ "available", (getter)pool_available, NULL,
	  "Buffers that get() could hand out now.", NULL },
	{ "count", (getter)pool_count, NULL, "Buffers in the pool.", NULL },
	{ "size", (getter)pool_size, NULL, "Bytes per buffer.", NULL },
	{ NULL }
};

static PyMethodDef pool_methods[] = {
	{ "get", (PyCFunction)(void (*)(void))pool_get,
	  METH_VARARGS | METH_KEYWORDS,
	  "get(timeout=None) -> Segment\n\n"
	  "A free buffer.  It comes back by itself once this process dropped "
	  "it and every process it was sent to let go.  tshm.Timeout (a "
	  "queue.Empty and a TimeoutError) when none came back in time." },
	{ "close", (PyCFunction)pool_close, METH_NOARGS,
	  "Drop the pool; buffers still out live until released." },
	{ "__enter__", (PyCFunction)pool_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)pool_exit, METH_VARARGS, NULL },
	{ NULL }
};

PyTypeObject TshmPool_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm.Pool",
	.tp_basicsize = sizeof(TshmPool),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Pool(count, size, name=None, ctx=None, *, huge=False)\n\n"
		"count buffers of size bytes, made up front and recycled.  A "
		"pool is used in the process that made it.",
	.tp_new = pool_new,
	.tp_dealloc = (destructor)pool_dealloc,
	.tp_getset = pool_getset,
	.tp_methods = pool_methods,
};
