// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * module.c - the _tshm extension module: errors, timeouts, blocking calls.
 */
#include "pytshm.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <time.h>

PyObject *pytshm_QueueClosed;
PyObject *pytshm_Empty;
PyObject *pytshm_Full;
PyObject *pytshm_Timeout;

PyObject *pytshm_raise(int err, const char *what)
{
	PyObject *args;

	if (err < 0)
		err = -err;
	if (what)
		args = Py_BuildValue("(is)", err, what);
	else
		args = Py_BuildValue("(is)", err, tshm_strerror(-err));
	if (args) {
		/* OSError(errno, msg) picks the subclass for errno. */
		PyErr_SetObject(PyExc_OSError, args);
		Py_DECREF(args);
	}
	return NULL;
}

int pytshm_timeout_ms(PyObject *timeout, int *ms)
{
	double s;

	if (!timeout || timeout == Py_None) {
		*ms = -1;
		return 0;
	}
	s = PyFloat_AsDouble(timeout);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (isnan(s) || s < 0) {
		PyErr_SetString(PyExc_ValueError,
				"'timeout' must be a non-negative number");
		return -1;
	}
	/* Round up: a wait never ends before the time asked for. */
	s = ceil(s * 1000.0);
	*ms = s >= INT_MAX ? -1 : (int)s;
	return 0;
}

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int pytshm_block(pytshm_blocking_fn fn, void *arg, int timeout_ms,
		 bool sliced)
{
	long long deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
	int left = timeout_ms, ret, prev, slice;

	for (;;) {
		slice = left;
		if (sliced && (left < 0 || left > PYTSHM_SLICE_MS))
			slice = PYTSHM_SLICE_MS;
		Py_BEGIN_ALLOW_THREADS
		prev = tshm_thread_set_intr(1);
		ret = fn(arg, slice);
		tshm_thread_set_intr(prev);
		Py_END_ALLOW_THREADS
		if (ret == -ETIMEDOUT && slice != left)
			ret = -EINTR;	/* only a slice ran out */
		if (ret != -EINTR)
			return ret;
		/* Let Python's handlers run, and stop if one raised. */
		if (PyErr_CheckSignals())
			return PYTSHM_RAISED;
		if (timeout_ms > 0) {
			long long rest = deadline - now_ms();

			left = rest > 0 ? (int)rest : 0;
		}
	}
}

static PyMethodDef module_methods[] = {
	{ "default_context", pytshm_default_context, METH_NOARGS,
	  "default_context() -> Context\n\n"
	  "This process's context, opened on first use and again after fork()." },
	{ "_locate", pytshm_locate, METH_O,
	  "_locate(buffer) -> (Segment, offset) or None\n\n"
	  "The segment a buffer lies in, if it lies wholly in one this process maps." },
	{ "_locate_address", pytshm_locate_address, METH_VARARGS,
	  "_locate_address(address, length) -> (Segment, offset) or None\n\n"
	  "The same for raw memory, such as a torch storage's data_ptr()." },
	{ "_event_op", pytshm_event_op, METH_VARARGS,
	  "_event_op(segment, op, timeout_ms) -> int (private: tshm.Event)" },
	{ "_barrier_op", pytshm_barrier_op, METH_VARARGS,
	  "_barrier_op(segment, parties_or_timeout, init) -> int (private: tshm.Barrier)" },
	{ "_dlpack", (PyCFunction)(void (*)(void))pytshm_dlpack,
	  METH_VARARGS | METH_KEYWORDS,
	  "_dlpack(owner, ptr, device_type, device_id, shape, strides, code,\n"
	  "        bits) -> a DLPack capsule (\"dltensor\") over ptr that keeps\n"
	  "owner alive until the consumer's tensor lets go." },
	{ NULL, NULL, 0, NULL }
};

static struct PyModuleDef tshm_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "tshm._tshm",
	.m_doc = "libtshm for Python: contexts, segments, queues, pools.",
	.m_size = -1,
	.m_methods = module_methods,
};

int pytshm_add_type(PyObject *m, PyTypeObject *type, const char *name)
{
	if (PyType_Ready(type) < 0)
		return -1;
	Py_INCREF(type);
	if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
		Py_DECREF(type);
		return -1;
	}
	return 0;
}

static int add_exceptions(PyObject *m)
{
	PyObject *queue_mod, *bases;

	queue_mod = PyImport_ImportModule("queue");
	if (!queue_mod)
		return -1;
	pytshm_Empty = PyObject_GetAttrString(queue_mod, "Empty");
	pytshm_Full = PyObject_GetAttrString(queue_mod, "Full");
	Py_DECREF(queue_mod);
	if (!pytshm_Empty || !pytshm_Full)
		return -1;
	pytshm_QueueClosed = PyErr_NewExceptionWithDoc("tshm.QueueClosed",
		"The queue was closed: put() after close(), or get() once a "
		"closed queue is drained.  errno is EPIPE.",
		PyExc_OSError, NULL);
	if (!pytshm_QueueClosed)
		return -1;
	bases = PyTuple_Pack(2, pytshm_Empty, PyExc_TimeoutError);
	if (!bases)
		return -1;
	pytshm_Timeout = PyErr_NewExceptionWithDoc("tshm.Timeout",
		"A wait ran out of time (Pool.get): both queue.Empty and "
		"TimeoutError, so either habit catches it.", bases, NULL);
	Py_DECREF(bases);
	if (!pytshm_Timeout)
		return -1;
	Py_INCREF(pytshm_QueueClosed);
	Py_INCREF(pytshm_Timeout);
	if (PyModule_AddObject(m, "QueueClosed", pytshm_QueueClosed) < 0 ||
	    PyModule_AddObject(m, "Timeout", pytshm_Timeout) < 0)
		return -1;
	return 0;
}

PyMODINIT_FUNC PyInit__tshm(void)
{
	PyObject *m = PyModule_Create(&tshm_module);

	if (!m)
		return NULL;
	if (add_exceptions(m) < 0 ||
	    pytshm_add_type(m, &TshmContext_Type, "Context") < 0 ||
	    pytshm_add_type(m, &TshmSegment_Type, "Segment") < 0 ||
	    pytshm_add_type(m, &TshmQueue_Type, "_Queue") < 0 ||
	    pytshm_add_type(m, &TshmPool_Type, "Pool") < 0 ||
	    pytshm_add_type(m, &TshmProcs_Type, "_Procs") < 0 ||
	    PyModule_AddIntConstant(m, "QUEUE_MAX_SEGS", TSHM_QUEUE_MAX_SEGS) ||
	    PyModule_AddIntConstant(m, "QUEUE_MAX_FDS", TSHM_QUEUE_MAX_FDS) ||
	    PyModule_AddIntConstant(m, "SEG_NAME_MAX", TSHM_SEG_NAME_MAX) ||
	    PyModule_AddIntConstant(m, "WAIT_ADAPTIVE", TSHM_WAIT_ADAPTIVE) ||
	    PyModule_AddIntConstant(m, "WAIT_FUTEX", TSHM_WAIT_FUTEX) ||
	    PyModule_AddIntConstant(m, "WAIT_SPIN", TSHM_WAIT_SPIN) ||
	    PyModule_AddIntConstant(m, "EVENT_SIZE", sizeof(struct tshm_event)) ||
	    PyModule_AddIntConstant(m, "BARRIER_SIZE",
				    sizeof(struct tshm_barrier))) {
		Py_DECREF(m);
		return NULL;
	}
#ifdef PYTSHM_CUDA
	if (pytshm_cuda_init(m) < 0) {
		Py_DECREF(m);
		return NULL;
	}
#endif
	return m;
}
