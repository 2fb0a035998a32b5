// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * spawn.c - tshm._tshm._Procs: N worker processes that exec a given argv,
 * started and supervised by libtshm's spawner (tshm-spawn.h).
 *
 * Python cannot run in a bare fork() of a threaded interpreter, so each
 * worker is forked by the library (FORK method) and at once execs the argv
 * it was given, with its rank and nprocs appended.  exec keeps what the
 * library set up in the child: the process group, the parent-death signal
 * (not cleared by exec of an ordinary binary), the thread budget in
 * OMP_NUM_THREADS and friends; the library reaps the workers, reports the
 * first failure and terminates the rest.  What a worker says about its
 * failure (a Python traceback) travels outside the library, since exec
 * ends the library's worker runtime: see tshm/torch/_spawn.py.
 *
 * The argv is copied into the spawn attributes as one blob (the library
 * copies it for every worker); the child only walks it and execs: no
 * allocation between fork and exec.
 *
 * With a target instead of an argv, the workers run Python in a fork of
 * this interpreter (the "fork" start method of tshm.torch.spawn): the
 * library forks its supervisor while the calling thread holds the GIL,
 * between PyOS_BeforeFork() and PyOS_AfterFork_Parent() as os.fork() does,
 * and each worker, a fork of that supervisor and so of this thread, calls
 * PyOS_AfterFork_Child() and then target(rank, nprocs), whose result is its
 * exit status (an exception, SystemExit included, is 1, and nothing of
 * the interpreter is finalized).  Safe where os.fork() is: not once the
 * interpreter has threads that hold locks, or CUDA.
 */
#include "pytshm.h"

#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tshm-spawn.h>

#define EXEC_MAX_ARGS	64

typedef struct {
	PyObject_HEAD
	struct tshm_procs *procs;
	unsigned busy;		/* threads in join() with the GIL off */
	PyObject *codes;	/* what close() returned, once it did */
} TshmProcs;

static char *utoa(char *buf, size_t len, unsigned int v)
{
	char *p = buf + len - 1;

	*p = '\0';
	do {
		*--p = (char)('0' + v % 10);
		v /= 10;
	} while (v && p > buf);
	return p;
}

/* Runs in the forked worker: exec blob's argv plus rank and nprocs. */
static int exec_entry(int rank, int nprocs, void *arg)
{
	const char *blob = arg;
	char *argv[EXEC_MAX_ARGS + 3];
	char rbuf[16], nbuf[16];
	unsigned int argc, i;

	memcpy(&argc, blob, sizeof(argc));
	blob += sizeof(argc);
	for (i = 0; i < argc; i++) {
		argv[i] = (char *)blob;
		blob += strlen(blob) + 1;
	}
	argv[i++] = utoa(rbuf, sizeof(rbuf), (unsigned int)rank);
	argv[i++] = utoa(nbuf, sizeof(nbuf), (unsigned int)nprocs);
	argv[i] = NULL;
	execv(argv[0], argv);
	tshm_worker_fail("exec %s: %s", argv[0], strerror(errno));
}

/*
 * Runs in a forked worker (GIL held: see the top of this file); @arg is
 * the target itself, passed by pointer (FORK: the worker has the caller's
 * memory), not a global: PyOS_BeforeFork() runs Python's at-fork handlers,
 * during which another thread may start a set of its own.
 */
static int python_entry(int rank, int nprocs, void *arg)
{
	PyObject *target = arg, *res;
	long code = 1;

	PyOS_AfterFork_Child();
	res = PyObject_CallFunction(target, "ii", rank, nprocs);
	if (res) {
		code = PyLong_Check(res) ? PyLong_AsLong(res) : 1;
		Py_DECREF(res);
	}
	/*
	 * What escaped the target is status 1, as what escapes a
	 * multiprocessing child's _bootstrap() is.  Not PyErr_Print() for a
	 * SystemExit: it would finalize the interpreter, running in this
	 * fork the exit handlers the caller registered.
	 */
	if (PyErr_ExceptionMatches(PyExc_SystemExit))
		PyErr_Clear();
	else if (PyErr_Occurred())
		PyErr_Print();
	return code >= 0 && code <= 255 ? (int)code : 1;
}

/* argv (a sequence of str) as the blob exec_entry() reads. */
static char *argv_blob(PyObject *seq, size_t *lenp)
{
	PyObject *fast = PySequence_Fast(seq, "argv must be a sequence of str");
	Py_ssize_t n, i;
	size_t len = sizeof(unsigned int), pos;
	char *blob = NULL;
	unsigned int argc;

	if (!fast)
		return NULL;
	n = PySequence_Fast_GET_SIZE(fast);
	if (n < 1 || n > EXEC_MAX_ARGS) {
		PyErr_Format(PyExc_ValueError,
			     "argv must hold 1 to %d strings", EXEC_MAX_ARGS);
		goto out;
	}
	for (i = 0; i < n; i++) {
		PyObject *s = PySequence_Fast_GET_ITEM(fast, i);
		Py_ssize_t sl;
		const char *u;

		if (!PyUnicode_Check(s)) {
			PyErr_SetString(PyExc_TypeError,
					"argv must be a sequence of str");
			goto out;
		}
		u = PyUnicode_AsUTF8AndSize(s, &sl);
		if (!u)
			goto out;
		if ((Py_ssize_t)strlen(u) != sl) {
			PyErr_SetString(PyExc_ValueError,
					"argv strings must not contain NUL");
			goto out;
		}
		len += (size_t)sl + 1;
	}
	blob = PyMem_Malloc(len);
	if (!blob) {
		PyErr_NoMemory();
		goto out;
	}
	argc = (unsigned int)n;
	memcpy(blob, &argc, sizeof(argc));
	pos = sizeof(argc);
	for (i = 0; i < n; i++) {
		Py_ssize_t sl;
		const char *u = PyUnicode_AsUTF8AndSize(
			PySequence_Fast_GET_ITEM(fast, i), &sl);

		memcpy(blob + pos, u, (size_t)sl + 1);
		pos += (size_t)sl + 1;
	}
	*lenp = len;
out:
	Py_DECREF(fast);
	return blob;
}

static int set_envs(struct tshm_spawn_attr *attr, PyObject *env)
{
	PyObject *key, *value;
	Py_ssize_t pos = 0;

	if (env == Py_None)
		return 0;
	if (!PyDict_Check(env)) {
		PyErr_SetString(PyExc_TypeError, "env must be a dict of str");
		return -1;
	}
	while (PyDict_Next(env, &pos, &key, &value)) {
		const char *k = PyUnicode_AsUTF8(key), *v;
		int ret;

		if (!k)
			return -1;
		v = value == Py_None ? NULL : PyUnicode_AsUTF8(value);
		if (!v && value != Py_None)
			return -1;
		ret = tshm_spawn_attr_setenv(attr, k, v);
		if (ret < 0) {
			pytshm_raise(ret, "tshm_spawn_attr_setenv");
			return -1;
		}
	}
	return 0;
}

static PyObject *procs_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "argv", "nprocs", "threads", "env",
				  "grace_ms", "target", "forward_sigint", NULL };
	PyObject *argv, *env = Py_None, *target = Py_None;
	int nprocs, threads = 0, grace_ms = TSHM_SPAWN_GRACE_MS, ret;
	int forward_sigint = 0;
	struct tshm_spawn_attr *attr = NULL;
	struct tshm_procs *procs = NULL;
	TshmProcs *self;
	size_t len = 0;
	char *blob;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|iOiOp", kwlist, &argv,
					 &nprocs, &threads, &env, &grace_ms,
					 &target, &forward_sigint))
		return NULL;
	if (target != Py_None) {
		if (argv != Py_None || !PyCallable_Check(target)) {
			PyErr_SetString(PyExc_TypeError,
					"target must be callable, with argv None");
			return NULL;
		}
		blob = NULL;
	} else {
		blob = argv_blob(argv, &len);
		if (!blob)
			return NULL;
	}
	ret = tshm_spawn_attr_create(&attr);
	if (ret < 0) {
		pytshm_raise(ret, "tshm_spawn_attr_create");
		goto out;
	}
	ret = tshm_spawn_attr_set_nprocs(attr, nprocs);
	if (!ret)
		ret = tshm_spawn_attr_set_method(attr, TSHM_START_FORK);
	if (!ret)
		ret = tshm_spawn_attr_set_fn(attr, blob ? exec_entry
						   : python_entry);
	if (!ret)
		ret = blob ? tshm_spawn_attr_set_arg(attr, blob, len) :
			     tshm_spawn_attr_set_arg(attr, target, 0);
	if (!ret)
		ret = tshm_spawn_attr_set_threads(attr, threads);
	if (!ret)
		ret = tshm_spawn_attr_set_grace_ms(attr, grace_ms);
	if (!ret && forward_sigint)
		ret = tshm_spawn_attr_set_flags(attr,
						TSHM_SPAWN_FORWARD_SIGINT);
	if (ret < 0) {
		pytshm_raise(ret, "tshm_spawn_attr");
		goto out;
	}
	if (set_envs(attr, env) < 0)
		goto out;
	/*
	 * The launch is not interruptible: a worker may be running its entry
	 * already, and a set killed and started again would run it twice.
	 * It cannot hang on the caller's locks (no setenv() or malloc()
	 * between fork and exec).
	 */
	if (blob) {
		Py_BEGIN_ALLOW_THREADS
		ret = tshm_spawn(NULL, attr, &procs);
		Py_END_ALLOW_THREADS
	} else {
		/* The GIL stays held: the workers are forks of this thread.
		 * (Our caller's reference keeps the target alive.) */
		PyOS_BeforeFork();
		ret = tshm_spawn(NULL, attr, &procs);
		PyOS_AfterFork_Parent();
	}
	if (ret < 0) {
		pytshm_raise(ret, "tshm_spawn");
		goto out;
	}
	self = (TshmProcs *)type->tp_alloc(type, 0);
	if (!self) {
		tshm_procs_destroy(procs);
		goto out;
	}
	self->procs = procs;
	tshm_spawn_attr_destroy(attr);
	PyMem_Free(blob);
	return (PyObject *)self;
out:
	tshm_spawn_attr_destroy(attr);
	PyMem_Free(blob);
	return NULL;
}

static void procs_dealloc(TshmProcs *self)
{
	if (self->procs) {
		Py_BEGIN_ALLOW_THREADS
		tshm_procs_destroy(self->procs);
		Py_END_ALLOW_THREADS
	}
	Py_XDECREF(self->codes);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static struct tshm_procs *procs_get(TshmProcs *self)
{
	if (!self->procs)
		PyErr_SetString(PyExc_ValueError, "the process set is closed");
	return self->procs;
}

struct join_args {
	struct tshm_procs *procs;
	struct tshm_failure failure;
};

static int join_fn(void *arg, int timeout_ms)
{
	struct join_args *j = arg;

	return tshm_procs_join(j->procs, timeout_ms, &j->failure);
}

/*
 * join(timeout=None) -> None when every worker exited 0, False when the
 * timeout ran out, or the first failure as a tuple (rank, pid, exit_code,
 * signo, message, summary); the other workers were terminated.
 */
static PyObject *procs_join(TshmProcs *self, PyObject *args)
{
	PyObject *timeout = Py_None;
	struct join_args j;
	int ms, ret;

	if (!PyArg_ParseTuple(args, "|O", &timeout))
		return NULL;
	j.procs = procs_get(self);
	if (!j.procs || pytshm_timeout_ms(timeout, &ms) < 0)
		return NULL;
	memset(&j.failure, 0, sizeof(j.failure));
	/* close() refuses while busy, and the reference keeps dealloc off:
	 * another thread must not free the set under this one's join. */
	Py_INCREF(self);
	self->busy++;
	ret = pytshm_block(join_fn, &j, ms, true);
	self->busy--;
	Py_DECREF(self);
	if (ret == PYTSHM_RAISED)
		return NULL;
	if (ret == 0)
		Py_RETURN_NONE;
	if (ret == -ETIMEDOUT || ret == -EAGAIN)
		Py_RETURN_FALSE;
	if (ret == -ECANCELED)
		return Py_BuildValue("(iiiiss)", j.failure.rank, j.failure.pid,
				     j.failure.exit_code, j.failure.signo,
				     j.failure.message, j.failure.summary);
	return pytshm_raise(ret, j.failure.summary[0] ? j.failure.summary :
			    "tshm_procs_join");
}

static PyObject *procs_pids(TshmProcs *self, PyObject *unused)
{
	struct tshm_procs *procs = procs_get(self);
	PyObject *list;
	int i, n;

	if (!procs)
		return NULL;
	n = tshm_procs_nprocs(procs);
	list = PyList_New(n);
	for (i = 0; list && i < n; i++) {
		PyObject *pid = PyLong_FromLong(tshm_procs_pid(procs, i));

		if (!pid) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, i, pid);
	}
	return list;
}

/* -N for a signal, else the exit status, as multiprocessing says it. */
static PyObject *exit_code(int wstatus)
{
	if (WIFSIGNALED(wstatus))
		return PyLong_FromLong(-WTERMSIG(wstatus));
	return PyLong_FromLong(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1);
}

static PyObject *procs_status(TshmProcs *self, PyObject *args)
{
	struct tshm_procs *procs;
	int rank, wstatus = 0, ret;

	if (!PyArg_ParseTuple(args, "i", &rank))
		return NULL;
	procs = procs_get(self);
	if (!procs)
		return NULL;
	/* It may reap the supervisor: without the GIL, and kept open. */
	Py_INCREF(self);
	self->busy++;
	Py_BEGIN_ALLOW_THREADS
	ret = tshm_procs_status(procs, rank, &wstatus);
	Py_END_ALLOW_THREADS
	self->busy--;
	Py_DECREF(self);
	if (ret < 0)
		return pytshm_raise(ret, "tshm_procs_status");
	if (ret == 0)
		Py_RETURN_NONE;
	return exit_code(wstatus);
}

static PyObject *procs_terminate(TshmProcs *self, PyObject *unused)
{
	struct tshm_procs *procs = procs_get(self);
	int ret;

	if (!procs)
		return NULL;
	ret = tshm_procs_terminate(procs);
	if (ret < 0)
		return pytshm_raise(ret, "tshm_procs_terminate");
	Py_RETURN_NONE;
}

static PyObject *procs_close(TshmProcs *self, PyObject *unused)
{
	struct tshm_procs *procs = self->procs;
	PyObject *codes;
	int *st, n;

	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "close() of a process set "
				"another thread joins");
		return NULL;
	}
	if (!procs)
		Py_RETURN_NONE;
	n = tshm_procs_nprocs(procs);
	st = PyMem_Calloc((size_t)n, sizeof(*st));
	if (!st)
		return PyErr_NoMemory();
	self->procs = NULL;
	/* As tshm_procs_destroy(), reading how each rank ended before the
	 * board is freed: every rank is reaped once the join returns. */
	Py_BEGIN_ALLOW_THREADS
	tshm_procs_terminate(procs);
	tshm_procs_join(procs, -1, NULL);
	for (int i = 0; i < n; i++)
		if (tshm_procs_status(procs, i, &st[i]) != 1)
			st[i] = -1;
	tshm_procs_destroy(procs);
	Py_END_ALLOW_THREADS
	/* (A wait status is never -1: it marks one not known.) */
	codes = PyList_New(n);
	for (int i = 0; codes && i < n; i++) {
		PyObject *code = Py_None;

		if (st[i] == -1)
			Py_INCREF(code);
		else
			code = exit_code(st[i]);

		if (!code) {
			Py_CLEAR(codes);
			break;
		}
		PyList_SET_ITEM(codes, i, code);
	}
	PyMem_Free(st);
	/* Kept: a signal handler may raise before the caller stores them. */
	Py_XINCREF(codes);
	Py_XSETREF(self->codes, codes);
	return codes;
}

static PyObject *procs_get_codes(TshmProcs *self, void *closure)
{
	PyObject *codes = self->codes ? self->codes : Py_None;

	(void)closure;
	Py_INCREF(codes);
	return codes;
}

static PyGetSetDef procs_getset[] = {
	{ "codes", (getter)procs_get_codes, NULL,
	  "each rank's exit code, as close() returned them (None before)",
	  NULL },
	{ NULL, NULL, NULL, NULL, NULL }
};

static PyMethodDef procs_methods[] = {
	{ "join", (PyCFunction)procs_join, METH_VARARGS,
	  "join(timeout=None) -> None (all exited 0), False (timeout) or\n"
	  "(rank, pid, exit_code, signo, message, summary) of the first\n"
	  "failure, the others terminated." },
	{ "pids", (PyCFunction)procs_pids, METH_NOARGS,
	  "pids() -> list of the workers' pids, by rank" },
	{ "status", (PyCFunction)procs_status, METH_VARARGS,
	  "status(rank) -> None while the worker runs, else its exit code\n"
	  "as multiprocessing's Process.exitcode says it (-N: signal N)" },
	{ "terminate", (PyCFunction)procs_terminate, METH_NOARGS,
	  "terminate(): SIGTERM now, SIGKILL after the grace period" },
	{ "close", (PyCFunction)procs_close, METH_NOARGS,
	  "close() -> each rank's exit code (as status()), or None if\n"
	  "closed already: terminate what still runs, reap, free" },
	{ NULL, NULL, 0, NULL }
};

PyTypeObject TshmProcs_Type = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tshm._tshm._Procs",
	.tp_basicsize = sizeof(TshmProcs),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "_Procs(argv, nprocs, threads=0, env=None, grace_ms=3000,\n"
		  "       target=None, forward_sigint=False)\n\n"
		  "nprocs workers that exec argv + [rank, nprocs], supervised by\n"
		  "libtshm: they die with this process, join() reports the first\n"
		  "failure and terminates the rest.  Private: tshm.torch.spawn().",
	.tp_new = procs_new,
	.tp_dealloc = (destructor)procs_dealloc,
	.tp_methods = procs_methods,
	.tp_getset = procs_getset,
};
