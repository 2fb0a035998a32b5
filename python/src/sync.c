// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * sync.c - the library's futex events and barriers, placed at the start of
 * a segment.  tshm.Event and tshm.Barrier (tshm/_sync.py) own the segment,
 * so they cross to other processes the way a segment does.
 */
#include "pytshm.h"

#include <errno.h>

enum { EV_INIT, EV_SET, EV_CLEAR, EV_IS_SET, EV_WAIT };

/* The object at the start of @obj's mapping, checked for room. */
static void *sync_place(PyObject *obj, size_t size)
{
	struct tshm_seg *seg = pytshm_segment_get(obj);

	if (!seg)
		return NULL;
	if (tshm_seg_size(seg) < size) {
		PyErr_SetString(PyExc_ValueError, "segment too small");
		return NULL;
	}
	return tshm_seg_data(seg);
}

struct wait_call {
	void *obj;
	struct tshm_seg *seg;
};

static int event_wait_call(void *arg, int timeout_ms)
{
	return tshm_event_wait(((struct wait_call *)arg)->obj, timeout_ms);
}

static int barrier_wait_call(void *arg, int timeout_ms)
{
	return tshm_barrier_wait(((struct wait_call *)arg)->obj, timeout_ms);
}

/* A wait with the GIL released, the segment held for its duration. */
static int sync_wait(PyObject *segobj, void *obj, pytshm_blocking_fn fn,
		     int timeout_ms)
{
	struct wait_call c = { obj, pytshm_segment_get(segobj) };
	int ret;

	tshm_seg_ref(c.seg);
	ret = pytshm_block(fn, &c, timeout_ms, fn != barrier_wait_call);
	tshm_seg_unref(c.seg);
	return ret;
}

PyObject *pytshm_event_op(PyObject *module, PyObject *args)
{
	PyObject *segobj;
	struct tshm_event *ev;
	int op, ms, ret;

	if (!PyArg_ParseTuple(args, "Oii:_event_op", &segobj, &op, &ms))
		return NULL;
	ev = sync_place(segobj, sizeof(*ev));
	if (!ev)
		return NULL;
	switch (op) {
	case EV_INIT:
		ret = tshm_event_init(ev);
		break;
	case EV_SET:
		ret = tshm_event_set(ev);
		break;
	case EV_CLEAR:
		ret = tshm_event_reset(ev);
		break;
	case EV_IS_SET:
		ret = tshm_event_is_set(ev);
		break;
	case EV_WAIT:
		ret = sync_wait(segobj, ev, event_wait_call, ms);
		if (ret == -ETIMEDOUT || ret == -EAGAIN)
			ret = 0;
		else if (ret == 0)
			ret = 1;
		break;
	default:
		return PyErr_Format(PyExc_ValueError, "bad event op %d", op);
	}
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	return PyLong_FromLong(ret);
}

PyObject *pytshm_barrier_op(PyObject *module, PyObject *args)
{
	PyObject *segobj;
	struct tshm_barrier *b;
	int arg, init, ret;

	if (!PyArg_ParseTuple(args, "Oip:_barrier_op", &segobj, &arg, &init))
		return NULL;
	b = sync_place(segobj, sizeof(*b));
	if (!b)
		return NULL;
	if (init) {
		if (arg < 1 || arg > 65535)
			return PyErr_Format(PyExc_ValueError,
				"parties must be 1 .. 65535, not %d", arg);
		ret = tshm_barrier_init(b, arg);
	} else {
		ret = sync_wait(segobj, b, barrier_wait_call, arg);
	}
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret == -ETIMEDOUT || ret == -EAGAIN)
		return pytshm_raise(ETIMEDOUT,
			"barrier: the other parties did not arrive in time");
	if (ret < 0)
		return pytshm_raise(ret, NULL);
	return PyLong_FromLong(ret);
}
