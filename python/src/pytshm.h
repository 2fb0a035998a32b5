/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * pytshm.h - what the files of the _tshm extension share.
 *
 * The extension is a thin layer: every object wraps one libtshm object and
 * every method calls one library function.  What Python adds (pickling, the
 * queue's wire format, Event and Barrier as classes) lives in the
 * package's Python files.
 *
 * Locking: the GIL protects the Python objects and the segment registry.
 * Blocking library calls run with the GIL released; the caller holds an
 * extra library reference on what the call uses, so a close() from another
 * thread meanwhile cannot free it under the call.
 */
#ifndef PYTSHM_H
#define PYTSHM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <tshm.h>

#include <stdbool.h>

typedef struct {
	PyObject_HEAD
	struct tshm_ctx *ctx;
} TshmContext;

typedef struct {
	PyObject_HEAD
	struct tshm_seg *seg;		/* NULL once closed */
	char *data;
	Py_ssize_t size;
	Py_ssize_t exports;		/* buffer views handed out */
	PyObject *weakrefs;
} TshmSegment;

extern PyTypeObject TshmContext_Type;
extern PyTypeObject TshmSegment_Type;
extern PyTypeObject TshmQueue_Type;
extern PyTypeObject TshmPool_Type;
extern PyTypeObject TshmProcs_Type;	/* spawn.c */

/* Exceptions the module defines or borrows (set up by module init). */
extern PyObject *pytshm_QueueClosed;
extern PyObject *pytshm_Empty;		/* queue.Empty */
extern PyObject *pytshm_Full;		/* queue.Full */
extern PyObject *pytshm_Timeout;	/* queue.Empty and TimeoutError */

/* Raise OSError(-err, message) (the subclass errno picks); returns NULL. */
PyObject *pytshm_raise(int err, const char *what);

/* The context named by a ctx= argument: NULL or None is the default one. */
TshmContext *pytshm_context_arg(PyObject *ctx);
PyObject *pytshm_default_context(PyObject *module, PyObject *unused);

/* timeout= in seconds (None: forever) to the library's milliseconds. */
int pytshm_timeout_ms(PyObject *timeout, int *ms);

/*
 * Run a blocking library call with the GIL released, returning -EINTR from
 * its waits so that signal handlers (Ctrl-C) run: a handler that raises
 * ends the call (PYTSHM_RAISED), one that does not resumes it with what
 * is left of the timeout.
 *
 * A signal that lands as a wait ends for another reason (its slice ran out)
 * runs its handler without any EINTR, so a @sliced call also waits at most
 * PYTSHM_SLICE_MS at a time and checks for handlers in between: Ctrl-C
 * takes effect within that, whatever the timing.  Calls whose timeout has
 * side effects (a barrier withdraws its arrival) pass @sliced false.
 */
#define PYTSHM_RAISED	(-0x10000)
#define PYTSHM_SLICE_MS	50
typedef int (*pytshm_blocking_fn)(void *arg, int timeout_ms);
int pytshm_block(pytshm_blocking_fn fn, void *arg, int timeout_ms,
		 bool sliced);

/*
 * Segments this process has mapped, by address, so that a buffer inside
 * one (a numpy array over a received segment) is sent by reference.
 */
PyObject *pytshm_segment_wrap(struct tshm_seg *seg);	/* takes the ref */
TshmSegment *pytshm_segment_containing(const void *addr, Py_ssize_t len);
struct tshm_seg *pytshm_segment_get(PyObject *obj);	/* borrowed */
PyObject *pytshm_locate(PyObject *module, PyObject *obj);
PyObject *pytshm_locate_address(PyObject *module, PyObject *args);

PyObject *pytshm_event_op(PyObject *module, PyObject *args);
PyObject *pytshm_barrier_op(PyObject *module, PyObject *args);

/* PyType_Ready() @type and add it to module @m as @name. */
int pytshm_add_type(PyObject *m, PyTypeObject *type, const char *name);

/* _dlpack(): memory handed to a framework as a DLPack capsule (dlpack.c). */
PyObject *pytshm_dlpack(PyObject *module, PyObject *args, PyObject *kwds);

#ifdef PYTSHM_CUDA
/* Adds _CudaDevice, _CudaBuffer and _CudaPool (cuda.c). */
int pytshm_cuda_init(PyObject *m);
#endif

PyMODINIT_FUNC PyInit__tshm(void);

#endif /* PYTSHM_H */
