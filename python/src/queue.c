// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue.c - tshm._Queue: a libtshm queue moving bytes plus segments.
 *
 * tshm.Queue (tshm/_queue.py) pickles objects into that: this file knows
 * nothing about pickling.  send() and recv() take timeouts in milliseconds
 * (< 0 forever, 0 never blocks) and raise queue.Full, queue.Empty or
 * tshm.QueueClosed.
 */
#include "pytshm.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

typedef struct {
	PyObject_HEAD
	struct tshm_queue *q;
	/*
	 * The message each thread received and has not yet acknowledged
	 * (thread id -> (bytes, segments)): a get() interrupted before it
	 * returned its object receives the same message again.
	 */
	PyObject *in_hand;
} TshmQueue;

static PyObject *queue_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "capacity", "max_msg", "ctx", NULL };
	Py_ssize_t capacity, max_msg;
	PyObject *ctxarg = Py_None;
	TshmContext *ctx;
	TshmQueue *self;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn|O:_Queue", kwlist,
					 &capacity, &max_msg, &ctxarg))
		return NULL;
	if (capacity < 1 || capacity > 65536)
		return PyErr_Format(PyExc_ValueError,
			"maxsize must be 1 .. 65536, not %zd", capacity);
	if (max_msg < 0)
		return PyErr_Format(PyExc_ValueError,
			"max_msg must not be negative, not %zd", max_msg);
	ctx = pytshm_context_arg(ctxarg);
	if (!ctx)
		return NULL;
	self = (TshmQueue *)type->tp_alloc(type, 0);
	if (self) {
		Py_BEGIN_ALLOW_THREADS
		ret = tshm_queue_create(ctx->ctx, capacity, max_msg, &self->q);
		Py_END_ALLOW_THREADS
		if (ret < 0) {
			self->q = NULL;
			Py_CLEAR(self);
			/* The bounds are the library's (lib/queue.c). */
			pytshm_raise(ret, ret == -EINVAL ?
				"max_msg above the library's 16 MiB" :
				ret == -E2BIG ? "maxsize * max_msg above the "
				"library's 1 GiB ring" : NULL);
		}
	}
	Py_DECREF(ctx);
	return (PyObject *)self;
}

/* Close the fds (a tuple of ints) that came with a message. */
static void msg_fds_close(PyObject *fds)
{
	Py_ssize_t i;

	for (i = 0; i < PyTuple_GET_SIZE(fds); i++) {
		PyObject *fd = PyTuple_GET_ITEM(fds, i);

		if (fd)
			close((int)PyLong_AsLong(fd));
	}
}

static void queue_dealloc(TshmQueue *self)
{
	PyObject *key, *msg;
	Py_ssize_t pos = 0;

	if (self->q)
		tshm_queue_unref(self->q);
	while (self->in_hand && PyDict_Next(self->in_hand, &pos, &key, &msg))
		msg_fds_close(PyTuple_GET_ITEM(msg, 2));
	Py_XDECREF(self->in_hand);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Map a queue call's error to the exception Python users expect. */
static PyObject *queue_error(int ret, PyObject *timeout_exc)
{
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret == -ETIMEDOUT || ret == -EAGAIN) {
		PyErr_SetNone(timeout_exc);
		return NULL;
	}
	if (ret == -EPIPE) {
		PyObject *args = Py_BuildValue("(is)", EPIPE,
					       tshm_strerror(-EPIPE));

		if (args) {
			PyErr_SetObject(pytshm_QueueClosed, args);
			Py_DECREF(args);
		}
		return NULL;
	}
	return pytshm_raise(ret, NULL);
}

struct send_call {
	struct tshm_queue *q;
	const void *buf;
	size_t len;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs;
	int fds[TSHM_QUEUE_MAX_FDS];
	unsigned nfds;
};

static int send_call(void *arg, int timeout_ms)
{
	struct send_call *c = arg;

	if (c->nfds)
		return tshm_queue_send_fds(c->q, c->buf, c->len, c->segs,
					   c->nsegs, c->fds, c->nfds,
					   timeout_ms);
	return tshm_queue_send(c->q, c->buf, c->len, c->segs, c->nsegs,
			       timeout_ms);
}

static void fds_close(const int *fds, Py_ssize_t n)
{
	while (n-- > 0)
		close(fds[n]);
}

/* The fds= argument of send(): up to TSHM_QUEUE_MAX_FDS of the caller's. */
static int fds_arg(PyObject *arg, struct send_call *c)
{
	PyObject *fast;
	Py_ssize_t n, i;

	if (!arg || arg == Py_None)
		return 0;
	fast = PySequence_Fast(arg, "fds must be a sequence of ints");
	if (!fast)
		return -1;
	n = PySequence_Fast_GET_SIZE(fast);
	if (n > TSHM_QUEUE_MAX_FDS) {
		PyErr_Format(PyExc_ValueError,
			     "a message carries at most %d fds, not %zd",
			     TSHM_QUEUE_MAX_FDS, n);
		Py_DECREF(fast);
		return -1;
	}
	/*
	 * Our own copies, made with the GIL held: the objects owning the fds
	 * may close them in another thread while the send waits.
	 */
	for (i = 0; i < n; i++) {
		int fd = PyObject_AsFileDescriptor(
				PySequence_Fast_GET_ITEM(fast, i));

		if (fd >= 0) {
			c->fds[i] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
			if (c->fds[i] < 0)
				pytshm_raise(-errno, NULL);
		}
		if (fd < 0 || c->fds[i] < 0) {
			fds_close(c->fds, i);
			c->nfds = 0;
			Py_DECREF(fast);
			return -1;
		}
		c->nfds = i + 1;
	}
	Py_DECREF(fast);
	return 0;
}

static PyObject *queue_send(TshmQueue *self, PyObject *args)
{
	struct send_call c = { .q = self->q };
	PyObject *segs, *fast, *fds = NULL, *ret = NULL;
	Py_buffer data;
	Py_ssize_t n, i;
	int ms, r;

	if (!PyArg_ParseTuple(args, "y*Oi|O:send", &data, &segs, &ms, &fds))
		return NULL;
	if (fds_arg(fds, &c) < 0)
		goto out_data;
	fast = PySequence_Fast(segs, "segments must be a sequence");
	if (!fast)
		goto out_data;
	n = PySequence_Fast_GET_SIZE(fast);
	if (n > TSHM_QUEUE_MAX_SEGS) {
		PyErr_Format(PyExc_ValueError,
			     "a message carries at most %d segments, not %zd",
			     TSHM_QUEUE_MAX_SEGS, n);
		goto out_fast;
	}
	for (i = 0; i < n; i++) {
		c.segs[i] = pytshm_segment_get(PySequence_Fast_GET_ITEM(fast, i));
		if (!c.segs[i])
			goto out_fast;
	}
	/* Our own references: a close() in another thread meanwhile. */
	for (i = 0; i < n; i++)
		tshm_seg_ref(c.segs[i]);
	c.nsegs = n;
	c.buf = data.buf;
	c.len = data.len;
	r = pytshm_block(send_call, &c, ms, true);
	for (i = 0; i < n; i++)
		tshm_seg_unref(c.segs[i]);
	if (r < 0) {
		if (r == -EMSGSIZE)
			PyErr_Format(PyExc_ValueError,
				"message of %zd bytes above the queue's max_msg "
				"(%zu)", data.len, tshm_queue_max_msg(self->q));
		else
			queue_error(r, pytshm_Full);
		goto out_fast;
	}
	ret = Py_None;
	Py_INCREF(ret);
out_fast:
	Py_DECREF(fast);
out_data:
	fds_close(c.fds, c.nfds);
	PyBuffer_Release(&data);
	return ret;
}

struct recv_call {
	struct tshm_queue *q;
	char *buf;
	size_t cap, len;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs;
	int fds[TSHM_QUEUE_MAX_FDS];
	unsigned nfds;
};

static int recv_call(void *arg, int timeout_ms)
{
	struct recv_call *c = arg;

	c->nsegs = TSHM_QUEUE_MAX_SEGS;
	c->nfds = TSHM_QUEUE_MAX_FDS;
	return tshm_queue_recv_fds(c->q, c->buf, c->cap, &c->len, c->segs,
				   &c->nsegs, c->fds, &c->nfds, timeout_ms);
}

static PyObject *queue_recv(TshmQueue *self, PyObject *args)
{
	struct recv_call c = { .q = self->q };
	PyObject *bytes, *segs = NULL, *fds = NULL, *key, *msg;
	unsigned i;
	int ms, r;

	if (!PyArg_ParseTuple(args, "i:recv", &ms))
		return NULL;
	if (!self->in_hand && !(self->in_hand = PyDict_New()))
		return NULL;
	key = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
	if (!key)
		return NULL;
	msg = PyDict_GetItemWithError(self->in_hand, key);
	if (msg || PyErr_Occurred()) {
		Py_DECREF(key);
		Py_XINCREF(msg);
		return msg;
	}
	c.cap = tshm_queue_max_msg(self->q);
	/* Received straight into the bytes object: no second copy. */
	bytes = PyBytes_FromStringAndSize(NULL, c.cap ? c.cap : 1);
	if (!bytes) {
		Py_DECREF(key);
		return NULL;
	}
	c.buf = PyBytes_AS_STRING(bytes);
	tshm_queue_ref(self->q);
	r = pytshm_block(recv_call, &c, ms, true);
	tshm_queue_unref(self->q);
	if (r < 0) {
		Py_DECREF(key);
		Py_DECREF(bytes);
		return queue_error(r, pytshm_Empty);
	}
	segs = PyTuple_New(c.nsegs);
	if (!segs)
		goto fail;
	for (i = 0; i < c.nsegs; i++) {
		PyObject *s = pytshm_segment_wrap(c.segs[i]);

		c.segs[i] = NULL;
		if (!s)
			goto fail;
		PyTuple_SET_ITEM(segs, i, s);
	}
	fds = PyTuple_New(c.nfds);
	if (!fds)
		goto fail;
	for (i = 0; i < c.nfds; i++) {
		PyObject *fd = PyLong_FromLong(c.fds[i]);

		if (!fd)
			goto fail;
		c.fds[i] = -1;
		PyTuple_SET_ITEM(fds, i, fd);
	}
	if (_PyBytes_Resize(&bytes, c.len) < 0)
		goto fail;
	msg = PyTuple_Pack(3, bytes, segs, fds);
	if (msg && PyDict_SetItem(self->in_hand, key, msg) < 0)
		Py_CLEAR(msg);	/* not kept: no memory, the message is gone */
	if (!msg) {
		msg_fds_close(fds);
	}
	Py_DECREF(bytes);
	Py_DECREF(segs);
	Py_DECREF(fds);
	Py_DECREF(key);
	return msg;
fail:
	Py_DECREF(key);
	for (i = 0; i < c.nsegs; i++)
		if (c.segs[i])
			tshm_seg_unref(c.segs[i]);
	for (i = 0; i < c.nfds; i++)
		if (c.fds[i] >= 0)
			close(c.fds[i]);
	if (fds)
		msg_fds_close(fds);
	Py_XDECREF(fds);
	Py_XDECREF(segs);
	Py_XDECREF(bytes);
	return NULL;
}

static PyObject *queue_done(TshmQueue *self, PyObject *unused)
{
	PyObject *key, *msg;

	if (!self->in_hand)
		Py_RETURN_NONE;
	key = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
	if (!key)
		return NULL;
	msg = PyDict_GetItemWithError(self->in_hand, key);
	if (msg) {
		/* Its fds go with it: a decoder that keeps one dup()s it. */
		Py_INCREF(msg);
		if (PyDict_DelItem(self->in_hand, key) < 0) {
			Py_DECREF(msg);
			Py_DECREF(key);
			return NULL;
		}
		msg_fds_close(PyTuple_GET_ITEM(msg, 2));
		Py_DECREF(msg);
	}
	Py_DECREF(key);
	if (PyErr_Occurred())
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *queue_close(TshmQueue *self, PyObject *unused)
{
	int ret = tshm_queue_close(self->q);

	if (ret < 0)
		return pytshm_raise(ret, NULL);
	Py_RETURN_NONE;
}

static Py_ssize_t queue_length(TshmQueue *self)
{
	return tshm_queue_len(self->q);
}

static PyObject *queue_capacity(TshmQueue *self, void *closure)
{
	return PyLong_FromUnsignedLong(tshm_queue_capacity(self->q));
}

static PyObject *queue_max_msg(TshmQueue *self, void *closure)
{
	return PyLong_FromSize_t(tshm_queue_max_msg(self->q));
}

static PyObject *queue_send_fd(TshmQueue *self, PyObject *arg)
{
	int sock = PyObject_AsFileDescriptor(arg), ret;

	if (sock < 0)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_queue_send_fd(self->q, sock);
	Py_END_ALLOW_THREADS
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	Py_RETURN_NONE;
}

static PyObject *queue_recv_fd(PyObject *cls, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "sock", "ctx", NULL };
	PyObject *sockarg, *ctxarg = Py_None;
	TshmContext *ctx;
	TshmQueue *self;
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
	self = (TshmQueue *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
	if (self) {
		Py_BEGIN_ALLOW_THREADS
		ret = tshm_queue_recv_fd(ctx->ctx, sock, &self->q);
		Py_END_ALLOW_THREADS
		if (ret < 0) {
			self->q = NULL;
			Py_CLEAR(self);
			pytshm_raise(ret, NULL);
		}
	}
	Py_DECREF(ctx);
	return (PyObject *)self;
}

static PyObject *queue_set_wait(TshmQueue *self, PyObject *args)
{
	unsigned int spin_us = 0;
	int policy, ret;

	if (!PyArg_ParseTuple(args, "i|I:set_wait", &policy, &spin_us))
		return NULL;
	ret = tshm_queue_set_wait(self->q, (enum tshm_wait)policy, spin_us);
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	Py_RETURN_NONE;
}

static PySequenceMethods queue_as_sequence = {
	.sq_length = (lenfunc)queue_length,
};

static PyGetSetDef queue_getset[] = {
	{ "capacity", (getter)queue_capacity, NULL, "Messages that fit.", NULL },
	{ "max_msg", (getter)queue_max_msg, NULL,
	  "Bytes one message may carry in the ring.", NULL },
	{ NULL }
};

static PyMethodDef queue_methods[] = {
	{ "send", (PyCFunction)queue_send, METH_VARARGS,
	  "send(data, segments, timeout_ms, fds=())\n\n"
	  "fds: up to QUEUE_MAX_FDS of the caller's fds (it keeps them);\n"
	  "the receiver gets its own." },
	{ "recv", (PyCFunction)queue_recv, METH_VARARGS,
	  "recv(timeout_ms) -> (bytes, tuple of Segment, tuple of fds)\n\n"
	  "The calling thread's unacknowledged message again if it has one.\n"
	  "Its fds are the message's: done() closes them (dup() one to keep\n"
	  "it)." },
	{ "done", (PyCFunction)queue_done, METH_NOARGS,
	  "Acknowledge the calling thread's last message (see recv) and\n"
	  "close the fds that came with it." },
	{ "close", (PyCFunction)queue_close, METH_NOARGS,
	  "Close for every process: sends fail, receivers drain then fail." },
	{ "set_wait", (PyCFunction)queue_set_wait, METH_VARARGS,
	  "set_wait(policy, spin_us=0): how this process waits on the queue\n\n"
	  "WAIT_ADAPTIVE (spin spin_us, then sleep), WAIT_FUTEX (sleep at\n"
	  "once) or WAIT_SPIN; local to this process and this object." },
	{ "_send_fd", (PyCFunction)queue_send_fd, METH_O,
	  "_send_fd(sock): send the queue over a connected AF_UNIX socket." },
	{ "_recv_fd", (PyCFunction)(void (*)(void))queue_recv_fd,
	  METH_VARARGS | METH_KEYWORDS | METH_CLASS,
	  "_recv_fd(sock, ctx=None) -> _Queue: the other end of _send_fd." },
	{ NULL }
};

PyTypeObject TshmQueue_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm._tshm._Queue",
	.tp_basicsize = sizeof(TshmQueue),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "_Queue(capacity, max_msg, ctx=None): bytes plus segments "
		"(tshm.Queue pickles objects into it).",
	.tp_new = queue_new,
	.tp_dealloc = (destructor)queue_dealloc,
	.tp_as_sequence = &queue_as_sequence,
	.tp_getset = queue_getset,
	.tp_methods = queue_methods,
};
