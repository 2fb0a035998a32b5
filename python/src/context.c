// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * context.c - tshm.Context: what this process holds (a /dev/tshm open on
 * the module, the fallback's state on memfd), and the per-process default.
 */
#include "pytshm.h"

#include <string.h>
#include <unistd.h>

static PyObject *context_new(PyTypeObject *type, PyObject *args,
			     PyObject *kwds)
{
	static char *kwlist[] = { "backend", NULL };
	const char *backend = NULL;
	TshmContext *self;
	unsigned flags = 0;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|z:Context", kwlist,
					 &backend))
		return NULL;
	if (backend && !strcmp(backend, "kmod"))
		flags = TSHM_CTX_KMOD;
	else if (backend && !strcmp(backend, "memfd"))
		flags = TSHM_CTX_MEMFD;
	else if (backend)
		return PyErr_Format(PyExc_ValueError,
			"backend must be 'kmod', 'memfd' or None, not '%s'",
			backend);
	self = (TshmContext *)type->tp_alloc(type, 0);
	if (!self)
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_ctx_open(&self->ctx, flags);
	Py_END_ALLOW_THREADS
	if (ret < 0) {
		self->ctx = NULL;
		Py_DECREF(self);
		return pytshm_raise(ret, ret == -ENODEV ?
			"the tshm module is not loaded (/dev/tshm)" : NULL);
	}
	return (PyObject *)self;
}

static void context_dealloc(TshmContext *self)
{
	if (self->ctx)
		tshm_ctx_close(self->ctx);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *context_backend(TshmContext *self, void *closure)
{
	return PyUnicode_FromString(tshm_ctx_backend(self->ctx));
}

static PyObject *context_fileno(TshmContext *self, PyObject *unused)
{
	return PyLong_FromLong(tshm_ctx_fd(self->ctx));
}

static PyObject *context_repr(TshmContext *self)
{
	return PyUnicode_FromFormat("<tshm.Context backend=%s fd=%d>",
				    tshm_ctx_backend(self->ctx),
				    tshm_ctx_fd(self->ctx));
}

static PyGetSetDef context_getset[] = {
	{ "backend", (getter)context_backend, NULL,
	  "'kmod' (the module, /dev/tshm) or 'memfd' (the fallback).", NULL },
	{ NULL }
};

static PyMethodDef context_methods[] = {
	{ "fileno", (PyCFunction)context_fileno, METH_NOARGS,
	  "The context's file descriptor, owned by the context." },
	{ NULL }
};

PyTypeObject TshmContext_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm.Context",
	.tp_basicsize = sizeof(TshmContext),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Context(backend=None)\n\n"
		"What this process holds: segments, queues and pools are made "
		"in a context.  backend is 'kmod', 'memfd' or None (the module "
		"when /dev/tshm opens, else the fallback; TSHM_BACKEND=kmod|memfd "
		"overrides None).",
	.tp_new = context_new,
	.tp_dealloc = (destructor)context_dealloc,
	.tp_repr = (reprfunc)context_repr,
	.tp_getset = context_getset,
	.tp_methods = context_methods,
};

/*
 * One default context per process.  A child made by fork() gets its own on
 * first use: it does not share the parent's cache of attached segments, and
 * objects made in the parent keep the context they were made in.
 */
static PyObject *default_ctx;
static pid_t default_pid;

PyObject *pytshm_default_context(PyObject *module, PyObject *unused)
{
	if (!default_ctx || default_pid != getpid()) {
		PyObject *ctx = PyObject_CallNoArgs((PyObject *)&TshmContext_Type);

		if (!ctx)
			return NULL;
		Py_XSETREF(default_ctx, ctx);
		default_pid = getpid();
	}
	Py_INCREF(default_ctx);
	return default_ctx;
}

TshmContext *pytshm_context_arg(PyObject *ctx)
{
	if (!ctx || ctx == Py_None)
		return (TshmContext *)pytshm_default_context(NULL, NULL);
	if (!PyObject_TypeCheck(ctx, &TshmContext_Type)) {
		PyErr_Format(PyExc_TypeError,
			     "ctx must be a tshm.Context or None, not %.100s",
			     Py_TYPE(ctx)->tp_name);
		return NULL;
	}
	Py_INCREF(ctx);
	return (TshmContext *)ctx;
}
