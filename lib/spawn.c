// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * spawn: start N workers, propagate the first failure, never orphan, never
 * oversubscribe.  The caller's side (attributes, tshm_spawn, join), the
 * entry registry, and the worker runtime.  lib/spawn.h has the process
 * tree; Documentation/lib/spawn.rst the user's view.
 *
 * Global state, all of it inherent to the spawn method: the registry of
 * entry points (filled by constructors, so it must be process-wide), and in
 * a worker process the worker's identity (rank, context, status socket).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tshm-private.h"
#include "spawn.h"

extern char **environ;

/* ---- entry registry ---- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tshm_entry *registry;
/* dl_iterate_phdr()'s load counter when the program started. */
static unsigned long startup_loads;

void spawn_fork_prepare(void)
{
	pthread_mutex_lock(&registry_lock);
}

void spawn_fork_release(bool child)
{
	if (child)
		pthread_mutex_init(&registry_lock, NULL);
	else
		pthread_mutex_unlock(&registry_lock);
}

static int count_loads(struct dl_phdr_info *info, size_t size, void *data)
{
	unsigned long long *adds = data;

	if (size >= offsetof(struct dl_phdr_info, dlpi_subs))
		*adds = info->dlpi_adds;
	return 1;
}

static unsigned long loads_now(void)
{
	unsigned long long adds = 0;

	dl_iterate_phdr(count_loads, &adds);
	return (unsigned long)adds;
}

__attribute__((constructor)) static void spawn_init(void)
{
	startup_loads = loads_now();
}

static void run_spawned_worker(struct tshm_entry *e, const char *env);

TSHM_EXPORT void tshm_entry_register(struct tshm_entry *e)
{
	const char *w;

	if (!e || !e->name || !e->fn)
		return;
	e->__loaded = loads_now();
	pthread_mutex_lock(&registry_lock);
	e->__next = registry;
	registry = e;
	pthread_mutex_unlock(&registry_lock);

	/* An exec'ed worker starts when its entry shows up. */
	w = getenv(SPAWN_WORKER_ENV);
	if (w)
		run_spawned_worker(e, w);
}

TSHM_EXPORT void tshm_entry_unregister(struct tshm_entry *e)
{
	pthread_mutex_lock(&registry_lock);
	for (struct tshm_entry **pp = &registry; *pp; pp = &(*pp)->__next) {
		if (*pp == e) {
			*pp = e->__next;
			break;
		}
	}
	pthread_mutex_unlock(&registry_lock);
}

/* The oldest registration wins when names repeat. */
static struct tshm_entry *entry_find(const char *name, tshm_entry_fn fn)
{
	struct tshm_entry *found = NULL;

	pthread_mutex_lock(&registry_lock);
	for (struct tshm_entry *e = registry; e; e = e->__next)
		if ((name && !strcmp(e->name, name)) || (!name && e->fn == fn))
			found = e;
	pthread_mutex_unlock(&registry_lock);
	return found;
}

/* ---- names ---- */

TSHM_EXPORT const char *tshm_start_method_name(enum tshm_start_method m)
{
	switch (m) {
	case TSHM_START_FORK:
		return "fork";
	case TSHM_START_SPAWN:
		return "spawn";
	case TSHM_START_FORKSERVER:
		return "forkserver";
	}
	return NULL;
}

TSHM_EXPORT const char *tshm_signal_name(int sig)
{
	static const char *const names[] = {
		[SIGHUP] = "SIGHUP", [SIGINT] = "SIGINT",
		[SIGQUIT] = "SIGQUIT", [SIGILL] = "SIGILL",
		[SIGTRAP] = "SIGTRAP", [SIGABRT] = "SIGABRT",
		[SIGBUS] = "SIGBUS", [SIGFPE] = "SIGFPE",
		[SIGKILL] = "SIGKILL", [SIGUSR1] = "SIGUSR1",
		[SIGSEGV] = "SIGSEGV", [SIGUSR2] = "SIGUSR2",
		[SIGPIPE] = "SIGPIPE", [SIGALRM] = "SIGALRM",
		[SIGTERM] = "SIGTERM", [SIGSTKFLT] = "SIGSTKFLT",
		[SIGCHLD] = "SIGCHLD", [SIGCONT] = "SIGCONT",
		[SIGSTOP] = "SIGSTOP", [SIGTSTP] = "SIGTSTP",
		[SIGTTIN] = "SIGTTIN", [SIGTTOU] = "SIGTTOU",
		[SIGURG] = "SIGURG", [SIGXCPU] = "SIGXCPU",
		[SIGXFSZ] = "SIGXFSZ", [SIGVTALRM] = "SIGVTALRM",
		[SIGPROF] = "SIGPROF", [SIGWINCH] = "SIGWINCH",
		[SIGIO] = "SIGIO", [SIGPWR] = "SIGPWR",
		[SIGSYS] = "SIGSYS",
	};

	if (sig > 0 && sig < (int)ARRAY_SIZE(names) && names[sig])
		return names[sig];
	return NULL;
}

/* ---- attributes ---- */

struct tshm_spawn_attr {
	int nprocs;
	enum tshm_start_method method;
	struct tshm_forkserver *fs;
	tshm_entry_fn fn;
	char *entry;
	const void *arg;
	size_t arg_len;
	int threads;
	unsigned flags;
	int grace_ms;
	char **env;		/* "NAME=VALUE" or "NAME" (unset) */
	int nenv;
	struct tshm_queue *queues[SPAWN_MAX_QUEUES];
	int nqueues;
};

TSHM_EXPORT int tshm_spawn_attr_create(struct tshm_spawn_attr **out)
{
	struct tshm_spawn_attr *a;

	if (!out)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->nprocs = 1;
	a->method = TSHM_START_FORK;
	a->grace_ms = TSHM_SPAWN_GRACE_MS;
	*out = a;
	return 0;
}

TSHM_EXPORT void tshm_spawn_attr_destroy(struct tshm_spawn_attr *a)
{
	if (!a)
		return;
	for (int i = 0; i < a->nenv; i++)
		free(a->env[i]);
	free(a->env);
	free(a->entry);
	free(a);
}

TSHM_EXPORT int tshm_spawn_attr_set_nprocs(struct tshm_spawn_attr *a, int n)
{
	if (!a || n <= 0)
		return -EINVAL;
	if (n > TSHM_SPAWN_MAX_PROCS)
		return -E2BIG;
	a->nprocs = n;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_method(struct tshm_spawn_attr *a,
					   enum tshm_start_method m)
{
	if (!a || !tshm_start_method_name(m))
		return -EINVAL;
	a->method = m;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_forkserver(struct tshm_spawn_attr *a,
					       struct tshm_forkserver *fs)
{
	if (!a)
		return -EINVAL;
	a->fs = fs;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_fn(struct tshm_spawn_attr *a,
				       tshm_entry_fn fn)
{
	if (!a || !fn)
		return -EINVAL;
	free(a->entry);
	a->entry = NULL;
	a->fn = fn;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_entry(struct tshm_spawn_attr *a,
					  const char *name)
{
	char *dup;

	if (!a || !name || !*name || strlen(name) >= SPAWN_ENTRY_NAME_MAX)
		return -EINVAL;
	dup = strdup(name);
	if (!dup)
		return -ENOMEM;
	free(a->entry);
	a->entry = dup;
	a->fn = NULL;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_arg(struct tshm_spawn_attr *a,
					const void *arg, size_t len)
{
	if (!a || (len && !arg) || len > (1UL << 30))
		return -EINVAL;
	a->arg = arg;
	a->arg_len = len;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_threads(struct tshm_spawn_attr *a,
					    int threads)
{
	if (!a || threads < 0 || threads > 65536)
		return -EINVAL;
	a->threads = threads;
	return 0;
}

static bool env_name_ok(const char *name)
{
	return name && *name && !strchr(name, '=');
}

/* Length of the name part of "NAME=VALUE" or "NAME". */
static size_t env_name_len(const char *s)
{
	const char *eq = strchr(s, '=');

	return eq ? (size_t)(eq - s) : strlen(s);
}

static int env_find(char *const *list, int n, const char *name, size_t len)
{
	for (int i = 0; i < n; i++)
		if (env_name_len(list[i]) == len && !strncmp(list[i], name, len))
			return i;
	return -1;
}

TSHM_EXPORT int tshm_spawn_attr_setenv(struct tshm_spawn_attr *a,
				       const char *name, const char *value)
{
	size_t len;
	char *s;
	int i;

	if (!a || !env_name_ok(name))
		return -EINVAL;
	len = strlen(name);
	if (value) {
		if (asprintf(&s, "%s=%s", name, value) < 0)
			return -ENOMEM;
	} else {
		s = strdup(name);
		if (!s)
			return -ENOMEM;
	}
	i = env_find(a->env, a->nenv, name, len);
	if (i >= 0) {
		free(a->env[i]);
		a->env[i] = s;
		return 0;
	}
	if (a->nenv >= 256) {
		free(s);
		return -E2BIG;
	}
	{
		char **n = realloc(a->env, (size_t)(a->nenv + 1) * sizeof(*n));

		if (!n) {
			free(s);
			return -ENOMEM;
		}
		a->env = n;
	}
	a->env[a->nenv++] = s;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_flags(struct tshm_spawn_attr *a,
					  unsigned flags)
{
	if (!a || (flags & ~(TSHM_SPAWN_PIN | TSHM_SPAWN_FORWARD_SIGINT)))
		return -EINVAL;
	a->flags = flags;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_set_grace_ms(struct tshm_spawn_attr *a,
					     int grace_ms)
{
	if (!a || grace_ms < 0)
		return -EINVAL;
	a->grace_ms = grace_ms;
	return 0;
}

TSHM_EXPORT int tshm_spawn_attr_add_queue(struct tshm_spawn_attr *a,
					  struct tshm_queue *q)
{
	if (!a || !q)
		return -EINVAL;
	if (a->nqueues >= SPAWN_MAX_QUEUES)
		return -E2BIG;
	a->queues[a->nqueues++] = q;
	return 0;
}

/* ---- the worker runtime ---- */

static struct spawn_worker_info worker;
static struct spawn_spec *worker_spec;	/* exec'ed: the argument lives here */
static bool in_worker;
static bool worker_msg_sent;

void spawn_worker_send(int fd, uint32_t type, int rank, int err,
		       const char *text, size_t len)
{
	struct spawn_wmsg m;
	size_t hdr = offsetof(struct spawn_wmsg, text);

	if (fd < 0)
		return;
	if (len > sizeof(m.text))
		len = sizeof(m.text);
	m.type = type;
	m.rank = rank;
	m.err = err;
	m.len = (uint32_t)len;
	if (len)
		memcpy(m.text, text, len);
	while (send(fd, &m, hdr + len, MSG_NOSIGNAL) < 0 && errno == EINTR)
		;
}

void spawn_worker_begin(const struct spawn_worker_info *info)
{
	worker = *info;
	in_worker = true;
	spawn_worker_send(worker.status_fd, WMSG_READY, worker.rank, 0,
			  NULL, 0);
}

void spawn_worker_exit(int ret)
{
	int code = ret;

	if (ret < 0 || ret > 255) {
		if (!worker_msg_sent) {
			char buf[128];
			int n;

			n = snprintf(buf, sizeof(buf),
				     "entry function returned %d%s%s%s", ret,
				     ret < 0 ? " (" : "",
				     ret < 0 ? tshm_strerror(ret) : "",
				     ret < 0 ? ")" : "");
			spawn_worker_send(worker.status_fd, WMSG_FAIL,
					  worker.rank, 0, buf, (size_t)n);
		}
		code = 255;
	}
	if (worker.method == SM_SPAWN)
		exit(code);
	/* A forked worker must not run the caller's atexit handlers. */
	fflush(NULL);
	_exit(code);
}

TSHM_EXPORT void tshm_worker_fail(const char *fmt, ...)
{
	char buf[TSHM_WORKER_MSG_MAX];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if (n >= (int)sizeof(buf))
		n = sizeof(buf) - 1;
	if (!in_worker) {
		fprintf(stderr, "%s\n", buf);
		exit(1);
	}
	if (!worker_msg_sent) {
		worker_msg_sent = true;
		spawn_worker_send(worker.status_fd, WMSG_FAIL, worker.rank, 0,
				  buf, (size_t)n);
	}
	spawn_worker_exit(1);
}

TSHM_EXPORT int tshm_worker_rank(void)
{
	return in_worker ? worker.rank : -1;
}

TSHM_EXPORT int tshm_worker_nprocs(void)
{
	return in_worker ? worker.nprocs : -1;
}

TSHM_EXPORT int tshm_worker_threads(void)
{
	return in_worker ? worker.threads : -1;
}

TSHM_EXPORT struct tshm_ctx *tshm_worker_ctx(void)
{
	return in_worker ? worker.ctx : NULL;
}

TSHM_EXPORT struct tshm_queue *tshm_worker_queue(unsigned idx)
{
	if (!in_worker || idx >= (unsigned)worker.nqueues)
		return NULL;
	return worker.queues[idx];
}

/* ---- the exec'ed worker's start ---- */

static bool parse_ints(const char *s, long *v, int n)
{
	for (int i = 0; i < n; i++) {
		char *end;

		errno = 0;
		v[i] = strtol(s, &end, 10);
		if (errno || end == s || (i < n - 1 ? *end != ',' : *end))
			return false;
		s = end + 1;
	}
	return true;
}

static __attribute__((noreturn)) void spawned_fail(int fd, int rank, int err,
						   const char *what)
{
	spawn_worker_send(fd, WMSG_ERR, rank, err, what, strlen(what));
	_exit(SPAWN_EXIT_NOSTART);
}

/*
 * Called from the registration of every entry while TSHM_SPAWN_WORKER is
 * set: returns if @e is not the one this worker was started for, else runs
 * the worker and never returns.
 */
static void run_spawned_worker(struct tshm_entry *e, const char *env)
{
	struct spawn_worker_info info;
	struct spawn_spec hdr, *spec;
	struct tshm_ctx *ctx = NULL;
	long v[4];
	int spec_fd, rank, status_fd, ret;
	pid_t sup;
	char *name;
	void *arg;

	if (!parse_ints(env, v, 4))
		goto not_a_worker;
	spec_fd = (int)v[0];
	rank = (int)v[1];
	sup = (pid_t)v[2];
	status_fd = (int)v[3];
	if (pread(spec_fd, &hdr, sizeof(hdr), 0) != sizeof(hdr) ||
	    hdr.magic != SPAWN_SPEC_MAGIC || hdr.version != SPAWN_SPEC_VERSION ||
	    hdr.size < sizeof(hdr) || rank < 0 || rank >= hdr.nprocs)
		goto not_a_worker;
	if (hdr.name_len != strlen(e->name) + 1)
		return;
	spec = malloc(hdr.size);
	if (!spec)
		spawned_fail(status_fd, rank, ENOMEM, "spawned worker");
	if (pread(spec_fd, spec, hdr.size, 0) != (ssize_t)hdr.size)
		spawned_fail(status_fd, rank, EIO, "reading the spawn spec");
	name = (char *)spec + spec->name_off;
	if (spec->name_off + spec->name_len > spec->size ||
	    name[spec->name_len - 1] != '\0' || strcmp(name, e->name)) {
		free(spec);
		return;
	}

	/* This worker is ours. */
	worker_spec = spec;
	unsetenv(SPAWN_WORKER_ENV);
	if (getppid() != sup)
		_exit(SPAWN_EXIT_NOSTART);	/* orphaned during exec */
	fcntl(status_fd, F_SETFD, FD_CLOEXEC);
	close(spec_fd);

	memset(&info, 0, sizeof(info));
	if (spec->ctx_fd >= 0) {
		ret = tshm_ctx_open_fd(spec->ctx_fd, 0, &ctx);
		if (ret < 0)
			spawned_fail(status_fd, rank, -ret,
				     "tshm_ctx_open_fd in the worker");
		close(spec->ctx_fd);
	}
	{
		const char *qenv = getenv(SPAWN_QUEUES_ENV);
		char *qs = qenv ? strdup(qenv) : NULL, *save = NULL;

		for (char *d = qs ? strtok_r(qs, ";", &save) : NULL; d;
		     d = strtok_r(NULL, ";", &save)) {
			if (info.nqueues >= SPAWN_MAX_QUEUES)
				break;
			ret = tshm_queue_import(ctx, d,
						&info.queues[info.nqueues]);
			if (ret < 0)
				spawned_fail(status_fd, rank, -ret,
					     "tshm_queue_import in the worker");
			info.nqueues++;
		}
		free(qs);
		unsetenv(SPAWN_QUEUES_ENV);
	}
	arg = spec->has_arg ? (char *)spec + spec->arg_off : NULL;
	info.rank = rank;
	info.nprocs = spec->nprocs;
	info.threads = spec->threads;
	info.status_fd = status_fd;
	info.method = SM_SPAWN;
	info.ctx = ctx;
	spawn_worker_begin(&info);
	spawn_worker_exit(e->fn(rank, spec->nprocs, arg));

not_a_worker:
	/* Stale or foreign: do not let it reach our children. */
	unsetenv(SPAWN_WORKER_ENV);
}

/* ---- the caller's side ---- */

struct tshm_procs {
	pid_t owner;
	enum spawn_method method;
	int nprocs;
	int grace_ms;
	int sock;		/* our end of the supervisor pair */
	pid_t sup_pid;		/* our child (fork, spawn), else 0 */
	int sup_pidfd;
	struct spawn_board *board;
	size_t board_size;
	bool sup_gone;		/* the supervisor exited */
	bool done;		/* every worker reaped, or the supervisor gone */
	bool reaped_sup;
	int sup_status;
	bool failed;		/* the supervisor died with workers left */
	int fs_err;		/* the forkserver could not fork one */
	pthread_mutex_t lock;	/* one joiner at a time */
};

/* CPUs of the caller's affinity mask, in order. */
static int usable_cpus(int **list)
{
	cpu_set_t *set = NULL;
	size_t size = 0;
	int ncpu = 1024, n = 0;

	*list = NULL;
	for (;;) {
		set = CPU_ALLOC(ncpu);
		if (!set)
			return -ENOMEM;
		size = CPU_ALLOC_SIZE(ncpu);
		if (sched_getaffinity(0, size, set) == 0)
			break;
		CPU_FREE(set);
		if (errno != EINVAL || ncpu >= (1 << 16)) {
			long c = sysconf(_SC_NPROCESSORS_ONLN);

			return c > 0 ? (int)c : 1;
		}
		ncpu *= 2;
	}
	*list = malloc(sizeof(int) * (size_t)CPU_COUNT_S(size, set));
	if (!*list) {
		CPU_FREE(set);
		return -ENOMEM;
	}
	for (int c = 0; c < ncpu; c++)
		if (CPU_ISSET_S(c, size, set))
			(*list)[n++] = c;
	CPU_FREE(set);
	return n ? n : 1;
}

static const char *const budget_vars[] = {
	"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
};

/* The variables workers get: the budget, then the attribute's. */
static int build_env_list(const struct tshm_spawn_attr *a, int threads,
			  char ***out, int *nout)
{
	int max = a->nenv + (int)ARRAY_SIZE(budget_vars), n = 0;
	char **l = calloc((size_t)max + 1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	for (unsigned i = 0; i < ARRAY_SIZE(budget_vars); i++) {
		const char *v = budget_vars[i];

		if (env_find(a->env, a->nenv, v, strlen(v)) >= 0)
			continue;
		if (asprintf(&l[n], "%s=%d", v, threads) < 0)
			goto nomem;
		n++;
	}
	for (int i = 0; i < a->nenv; i++) {
		l[n] = strdup(a->env[i]);
		if (!l[n])
			goto nomem;
		n++;
	}
	*out = l;
	*nout = n;
	return 0;
nomem:
	for (int i = 0; i < n; i++)
		free(l[i]);
	free(l);
	return -ENOMEM;
}

static void free_strv(char **v)
{
	for (char **p = v; p && *p; p++)
		free(*p);
	free(v);
}

/*
 * The spec memfd (spawn, forkserver): a spawn_spec, the entry name, the
 * variables, the CPU list and the argument blob.
 */
static int build_spec(const struct tshm_spawn_attr *a, const char *name,
		      tshm_entry_fn fn, int threads, char **env, int nenv,
		      const int *cpus, int ncpus, int ctx_fd)
{
	struct spawn_spec h;
	size_t env_len = 0, off, total;
	char *buf, *p;
	int fd, ret = 0;

	for (int i = 0; i < nenv; i++)
		env_len += strlen(env[i]) + 1;
	memset(&h, 0, sizeof(h));
	h.magic = SPAWN_SPEC_MAGIC;
	h.version = SPAWN_SPEC_VERSION;
	h.nprocs = a->nprocs;
	h.threads = threads;
	h.flags = a->flags;
	h.grace_ms = a->grace_ms;
	h.ctx_fd = ctx_fd;
	h.nqueues = a->nqueues;
	h.fn = (uint64_t)(uintptr_t)fn;
	off = sizeof(h);
	h.name_off = (uint32_t)off;
	h.name_len = name ? (uint32_t)strlen(name) + 1 : 0;
	off += h.name_len;
	h.env_off = (uint32_t)off;
	h.env_len = (uint32_t)env_len;
	off = ALIGN_UP(off + env_len, 8);
	h.cpus_off = (uint32_t)off;
	h.ncpus = (uint32_t)ncpus;
	off = ALIGN_UP(off + sizeof(int32_t) * (size_t)ncpus, 16);
	h.arg_off = off;
	h.arg_len = a->arg_len;
	h.has_arg = a->arg_len > 0;
	total = off + a->arg_len;
	if (total > UINT32_MAX)
		return -E2BIG;
	h.size = (uint32_t)total;

	buf = calloc(1, total);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, &h, sizeof(h));
	if (name)
		memcpy(buf + h.name_off, name, h.name_len);
	p = buf + h.env_off;
	for (int i = 0; i < nenv; i++) {
		size_t l = strlen(env[i]) + 1;

		memcpy(p, env[i], l);
		p += l;
	}
	for (int i = 0; i < ncpus; i++) {
		int32_t c = cpus[i];

		memcpy(buf + h.cpus_off + sizeof(c) * (size_t)i, &c, sizeof(c));
	}
	if (a->arg_len)
		memcpy(buf + h.arg_off, a->arg, a->arg_len);

	fd = memfd_create("tshm-spawn-spec", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	for (size_t done = 0; done < total;) {
		ssize_t n = pwrite(fd, buf + done, total - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ret = n < 0 ? -errno : -EIO;
			close(fd);
			goto out;
		}
		done += (size_t)n;
	}
	/* Workers may read it, nobody may change it. */
	fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE |
	      F_SEAL_SEAL);
	ret = fd;
out:
	free(buf);
	return ret;
}

/*
 * The workers' environment: ours minus what @list sets or unsets, plus what
 * it sets, and room for @extra more; the strings are ours and @list's, not
 * copied.  Built before any fork: a child of a threaded process must not
 * setenv() (glibc's environment lock may have been held by a thread the
 * fork left behind) nor allocate.  The forkserver's supervisor builds its
 * own from the spec.
 */
char **spawn_env_merge(char *const *list, int nlist, int extra)
{
	/*
	 * Read once, and copied no further than counted: another thread
	 * may setenv() a new name in between (a Python thread, the GIL
	 * released).
	 */
	char **src = environ;
	size_t n = 0, k = 0;
	char **envp;

	while (src && src[n])
		n++;
	envp = calloc(n + (size_t)nlist + (size_t)extra + 1, sizeof(*envp));
	if (!envp)
		return NULL;
	for (size_t i = 0; i < n && src[i]; i++) {
		char *e = src[i];
		size_t l = env_name_len(e);

		if (env_find(list, nlist, e, l) >= 0 ||
		    (l == strlen(SPAWN_WORKER_ENV) &&
		     !strncmp(e, SPAWN_WORKER_ENV, l)) ||
		    (l == strlen(SPAWN_QUEUES_ENV) &&
		     !strncmp(e, SPAWN_QUEUES_ENV, l)))
			continue;
		envp[k++] = e;
	}
	for (int i = 0; i < nlist; i++)
		if (strchr(list[i], '='))
			envp[k++] = list[i];
	return envp;
}

/* envp for the exec'ed workers, with the slots worker_exec() fills in. */
static char **build_envp(char **list, int nlist, int nqueues,
			 char **worker_slot, size_t *worker_len,
			 char **queue_slot, size_t *queue_len)
{
	char **envp = spawn_env_merge(list, nlist, 2);
	size_t k = 0;

	if (!envp)
		return NULL;
	while (envp[k])
		k++;
	*worker_len = strlen(SPAWN_WORKER_ENV "=") + 4 * 24;
	*worker_slot = calloc(1, *worker_len);
	if (!*worker_slot) {
		free(envp);
		return NULL;
	}
	strcpy(*worker_slot, SPAWN_WORKER_ENV "=");
	envp[k++] = *worker_slot;
	*queue_slot = NULL;
	*queue_len = 0;
	if (nqueues) {
		*queue_len = strlen(SPAWN_QUEUES_ENV "=") +
			     (size_t)nqueues * (TSHM_QUEUE_DESC_MAX + 1) +
			     TSHM_QUEUE_DESC_MAX + 2;
		*queue_slot = calloc(1, *queue_len);
		if (!*queue_slot) {
			free(*worker_slot);
			free(envp);
			return NULL;
		}
		strcpy(*queue_slot, SPAWN_QUEUES_ENV "=");
		envp[k++] = *queue_slot;
	}
	envp[k] = NULL;
	return envp;
}

static void procs_recv(struct tshm_procs *p)
{
	for (;;) {
		int32_t v;
		ssize_t n = recv(p->sock, &v, sizeof(v), MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return;
		if (n == 0) {
			p->sup_gone = true;
			return;
		}
		if (n == sizeof(v) && v < 0 && !p->fs_err)
			p->fs_err = v;
	}
}

static uint32_t board_phase(struct tshm_procs *p)
{
	return __atomic_load_n(&p->board->phase, __ATOMIC_ACQUIRE);
}

static void reap_supervisor(struct tshm_procs *p)
{
	int st;

	if (p->reaped_sup || p->sup_pid <= 0)
		return;
	while (waitpid(p->sup_pid, &st, 0) < 0) {
		if (errno != EINTR) {
			st = 0;
			break;
		}
	}
	p->sup_status = st;
	p->reaped_sup = true;
}

/*
 * Wait for the supervisor to say something or go, until @dl (NULL: for
 * ever).  Returns false on timeout.
 */
static bool procs_wait(struct tshm_procs *p, const struct deadline *dl)
{
	struct pollfd pfd[2];
	int n = 0, timeout = -1;

	if (dl) {
		if (deadline_expired(dl))
			return false;
		timeout = deadline_poll_ms(dl);
	}
	pfd[n].fd = p->sock;
	pfd[n++].events = POLLIN;
	if (p->sup_pidfd >= 0) {
		pfd[n].fd = p->sup_pidfd;
		pfd[n++].events = POLLIN;
	}
	if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR)
		return false;
	if (n > 1 && pfd[1].revents)
		p->sup_gone = true;
	return true;
}

/* Refresh what we know; true once nothing is left running. */
static bool procs_update(struct tshm_procs *p)
{
	if (p->done)
		return true;
	procs_recv(p);
	if (board_phase(p) == PHASE_DONE) {
		p->done = true;
	} else if (p->sup_gone) {
		p->done = true;
		/* Its workers died with it (PR_SET_PDEATHSIG). */
		if (__atomic_load_n(&p->board->nexited, __ATOMIC_ACQUIRE) <
		    (uint32_t)p->nprocs)
			p->failed = true;
	}
	if (p->done)
		reap_supervisor(p);
	return p->done;
}

static void describe_status(char *buf, size_t len, int st)
{
	if (WIFEXITED(st)) {
		snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
	} else if (WIFSIGNALED(st)) {
		const char *name = tshm_signal_name(WTERMSIG(st));

		if (name)
			snprintf(buf, len, "killed by %s%s", name,
				 WCOREDUMP(st) ? " (core dumped)" : "");
		else
			snprintf(buf, len, "killed by signal %d%s",
				 WTERMSIG(st),
				 WCOREDUMP(st) ? " (core dumped)" : "");
	} else {
		snprintf(buf, len, "wait status %#x", st);
	}
}

static void fill_failure(struct tshm_procs *p, int rank,
			 struct tshm_failure *f, int waited_ms)
{
	char what[96];

	memset(f, 0, sizeof(*f));
	f->rank = rank;
	f->exit_code = -1;
	if (rank < 0) {
		if (!p->failed)
			return;
		describe_status(what, sizeof(what), p->sup_status);
		snprintf(f->summary, sizeof(f->summary),
			 "supervisor (pid %d) died: %s; its workers were killed",
			 p->board->sup_pid, what);
		f->pid = p->board->sup_pid;
		if (WIFSIGNALED(p->sup_status))
			f->signo = WTERMSIG(p->sup_status);
		return;
	}
	{
		struct spawn_rank *r = &p->board->rank[rank];
		uint32_t flags = __atomic_load_n(&r->flags, __ATOMIC_ACQUIRE);

		f->pid = r->pid;
		/* Bounded: a worker may have left it without its NUL. */
		if (flags & RANK_MSG)
			snprintf(f->message, sizeof(f->message), "%.*s",
				 (int)sizeof(r->msg) - 1, r->msg);
		if (!(flags & RANK_EXITED)) {
			f->timed_out = waited_ms >= 0;
			snprintf(what, sizeof(what), "still running after %d ms",
				 waited_ms < 0 ? 0 : waited_ms);
		} else if (flags & RANK_ERR) {
			int st = r->wstatus;

			f->exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
			snprintf(what, sizeof(what), "could not start: %s",
				 strerror(r->err));
		} else {
			int st = r->wstatus;

			describe_status(what, sizeof(what), st);
			if (WIFEXITED(st))
				f->exit_code = WEXITSTATUS(st);
			else if (WIFSIGNALED(st))
				f->signo = WTERMSIG(st);
		}
		snprintf(f->summary, sizeof(f->summary), "rank %d (pid %d): %s%s%s",
			 rank, r->pid, what, f->message[0] ? ": " : "",
			 f->message);
	}
}

static void procs_command(struct tshm_procs *p, uint32_t type, int sig)
{
	struct spawn_cmd c = { .type = type, .sig = sig };

	while (send(p->sock, &c, sizeof(c), MSG_NOSIGNAL) < 0 &&
	       errno == EINTR)
		;
}

static void procs_free(struct tshm_procs *p)
{
	if (p->board)
		munmap(p->board, p->board_size);
	if (p->sock >= 0)
		close(p->sock);
	if (p->sup_pidfd >= 0)
		close(p->sup_pidfd);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

/*
 * Wait for every worker to be running, or for the set to fail to start.
 * A signal does not end the wait: a worker may be running its entry
 * already, and killing the set there would have a retry run it twice.
 */
static int procs_wait_launch(struct tshm_procs *p)
{
	for (;;) {
		procs_update(p);
		if (p->done) {
			int err = __atomic_load_n(&p->board->launch_err,
						  __ATOMIC_ACQUIRE);

			if (err < 0)
				return err;
			if (p->fs_err < 0)
				return p->fs_err;
			if (p->failed &&
			    __atomic_load_n(&p->board->nready,
					    __ATOMIC_ACQUIRE) < (uint32_t)p->nprocs)
				return -ECHILD;
			return 0;
		}
		if (board_phase(p) >= PHASE_RUNNING)
			return 0;
		procs_wait(p, NULL);
	}
}

TSHM_EXPORT int tshm_spawn(struct tshm_ctx *ctx,
			   const struct tshm_spawn_attr *a,
			   struct tshm_procs **out)
{
	struct tshm_entry *entry = NULL;
	struct sup_plan plan;
	struct tshm_procs *p = NULL;
	tshm_entry_fn fn;
	char **env = NULL, **envp = NULL, *wslot = NULL, *qslot = NULL;
	int *cpus = NULL, ncpus, nenv = 0, threads, ret;
	int sv[2] = { -1, -1 }, self_pidfd = -1, board_fd = -1, spec_fd = -1;
	int ctx_fd = -1;
	size_t wlen = 0, qlen = 0;
	char *argv[2] = { NULL, NULL };
	pid_t pid;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!a || a->nprocs <= 0)
		return -EINVAL;
	if (a->nprocs > TSHM_SPAWN_MAX_PROCS)
		return -E2BIG;
	if (!tshm_start_method_name(a->method))
		return -EINVAL;

	/* What to run. */
	fn = a->fn;
	if (a->entry) {
		entry = entry_find(a->entry, NULL);
		if (!entry)
			return -ENOENT;
		fn = entry->fn;
	}
	if (!fn)
		return -EINVAL;
	if (a->method == TSHM_START_SPAWN) {
		if (!entry)
			entry = entry_find(NULL, fn);
		/* A worker runs a fresh image of the program: an entry from a
		 * library dlopen()ed since would never register there. */
		if (!entry || entry->__loaded > startup_loads)
			return -ENOENT;
	}
	if (a->method == TSHM_START_FORKSERVER &&
	    (!a->fs || !spawn_forkserver_knows(a->fs, (const void *)fn)))
		return -EINVAL;
	if (a->arg && !a->arg_len && a->method != TSHM_START_FORK)
		return -EINVAL;
	if (a->nqueues && !ctx)
		return -EINVAL;
	if (ctx) {
		ctx_fd = tshm_ctx_fd(ctx);
		if (ctx_fd < 0)
			return ctx_fd;
	}

	/* Thread budget and CPUs. */
	ncpus = usable_cpus(&cpus);
	if (ncpus < 0)
		return ncpus;
	threads = a->threads ? a->threads : ncpus / a->nprocs;
	if (threads < 1)
		threads = 1;
	ret = build_env_list(a, threads, &env, &nenv);
	if (ret < 0)
		goto out;

	/* The board, the supervisor pair, ourselves as a pidfd. */
	p = calloc(1, sizeof(*p));
	if (!p) {
		ret = -ENOMEM;
		goto out;
	}
	p->owner = getpid();
	pthread_mutex_init(&p->lock, NULL);
	p->method = (enum spawn_method)a->method;
	p->nprocs = a->nprocs;
	p->grace_ms = a->grace_ms;
	p->sock = -1;
	p->sup_pidfd = -1;
	p->board_size = spawn_board_size((unsigned)a->nprocs);
	board_fd = memfd_create("tshm-spawn-board", MFD_CLOEXEC);
	if (board_fd < 0 || ftruncate(board_fd, (off_t)p->board_size) < 0) {
		ret = -errno;
		goto out;
	}
	p->board = mmap(NULL, p->board_size, PROT_READ | PROT_WRITE,
			MAP_SHARED, board_fd, 0);
	if (p->board == MAP_FAILED) {
		p->board = NULL;
		ret = -errno;
		goto out;
	}
	p->board->magic = SPAWN_BOARD_MAGIC;
	p->board->nprocs = (uint32_t)a->nprocs;
	p->board->launch_rank = -1;
	p->board->first_fail = -1;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		ret = -errno;
		goto out;
	}
	self_pidfd = spawn_pidfd_open(getpid());

	if (a->method != TSHM_START_FORK) {
		spec_fd = build_spec(a, entry ? entry->name : NULL, fn, threads,
				     env, nenv, cpus, ncpus, ctx_fd);
		if (spec_fd < 0) {
			ret = spec_fd;
			goto out;
		}
	}

	if (a->method == TSHM_START_FORKSERVER) {
		ret = spawn_forkserver_request(a->fs, sv[1], self_pidfd,
					       board_fd, spec_fd, ctx_fd);
		if (ret < 0)
			goto out;
		close(sv[1]);
		sv[1] = -1;
		for (int i = 0; i < a->nqueues; i++) {
			ret = tshm_queue_send_fd(a->queues[i], sv[0]);
			if (ret < 0)
				break;
		}
		p->sock = sv[0];
		sv[0] = -1;
		if (ret < 0) {
			/* The supervisor gives up when we hang up. */
			close(p->sock);
			p->sock = -1;
			goto out;
		}
		goto launched;
	}

	memset(&plan, 0, sizeof(plan));
	plan.method = (enum spawn_method)a->method;
	plan.nprocs = a->nprocs;
	plan.grace_ms = a->grace_ms;
	plan.board = p->board;
	plan.sock = sv[1];
	plan.caller_pidfd = self_pidfd;
	plan.caller_pid = getpid();
	plan.fn = fn;
	plan.ctx = ctx;
	plan.ctx_fd = ctx_fd;
	plan.threads = threads;
	plan.pin = a->flags & TSHM_SPAWN_PIN;
	plan.forward_sigint = a->flags & TSHM_SPAWN_FORWARD_SIGINT;
	plan.cpus = cpus;
	plan.ncpus = ncpus;
	plan.queues = (struct tshm_queue **)a->queues;
	plan.nqueues = a->nqueues;
	plan.spec_fd = spec_fd;
	plan.wsock_r = plan.wsock_w = plan.sigfd = -1;
	if (a->method == TSHM_START_FORK) {
		/* Each worker gets its own copy of the caller's memory: the
		 * argument, copied or not, is private to it. */
		plan.arg = (void *)a->arg;
		plan.restore_signals = true;
		plan.saved_act = calloc(NSIG, sizeof(*plan.saved_act));
		envp = spawn_env_merge(env, nenv, 0);
		if (!plan.saved_act || !envp) {
			free(plan.saved_act);
			ret = -ENOMEM;
			goto out;
		}
		plan.envp = envp;
		/* Or buffered output would be written once per worker. */
		fflush(NULL);
		pid = fork();
	} else {
		argv[0] = program_invocation_name ? program_invocation_name :
			  (char *)"tshm-worker";
		envp = build_envp(env, nenv, a->nqueues, &wslot, &wlen,
				  &qslot, &qlen);
		if (!envp) {
			ret = -ENOMEM;
			goto out;
		}
		plan.argv = argv;
		plan.envp = envp;
		plan.env_slot = wslot;
		plan.env_slot_len = wlen;
		plan.queue_slot = qslot;
		plan.queue_slot_len = qlen;
		/* Only system calls until execve(): see sup_fork(). */
		pid = _Fork();
	}
	if (pid == 0) {
		close(sv[0]);
		sup_main(&plan);
	}
	free(plan.saved_act);
	if (pid < 0) {
		ret = -errno;
		goto out;
	}
	p->sup_pid = pid;
	p->sup_pidfd = spawn_pidfd_open(pid);
	close(sv[1]);
	sv[1] = -1;
	p->sock = sv[0];
	sv[0] = -1;

launched:
	ret = procs_wait_launch(p);
	if (ret < 0) {
		/* The supervisor killed and reaped what it started. */
		while (!procs_update(p))
			procs_wait(p, NULL);
		goto out;
	}
	*out = p;
	p = NULL;
	ret = 0;
out:
	if (p) {
		if (p->sock >= 0 && !p->done) {
			procs_command(p, CMD_TERMINATE, 0);
			while (!procs_update(p))
				procs_wait(p, NULL);
		}
		procs_free(p);
	}
	for (int i = 0; i < 2; i++)
		if (sv[i] >= 0)
			close(sv[i]);
	if (self_pidfd >= 0)
		close(self_pidfd);
	if (board_fd >= 0)
		close(board_fd);
	if (spec_fd >= 0)
		close(spec_fd);
	free(envp);
	free(wslot);
	free(qslot);
	free_strv(env);
	free(cpus);
	return ret;
}

static int lowest_running(struct tshm_procs *p)
{
	for (int i = 0; i < p->nprocs; i++)
		if (!(__atomic_load_n(&p->board->rank[i].flags,
				      __ATOMIC_ACQUIRE) & RANK_EXITED))
			return i;
	return -1;
}

static int procs_join(struct tshm_procs *p, int timeout_ms,
		      struct tshm_failure *failure);

TSHM_EXPORT int tshm_procs_join(struct tshm_procs *p, int timeout_ms,
				struct tshm_failure *failure)
{
	int ret;

	if (!p || p->owner != getpid()) {
		if (failure) {
			memset(failure, 0, sizeof(*failure));
			failure->rank = -1;
			failure->exit_code = -1;
		}
		return !p ? -EINVAL : -ECHILD;
	}
	pthread_mutex_lock(&p->lock);
	ret = procs_join(p, timeout_ms, failure);
	pthread_mutex_unlock(&p->lock);
	return ret;
}

/*
 * The board is shared with the supervisor, and mapped in FORK workers,
 * which can scribble on it: the first failure's rank is checked before it
 * indexes anything.  -EBADMSG (with @failure saying so) when it is not a
 * rank, else the rank or -1.
 */
static int board_first_fail(struct tshm_procs *p, struct tshm_failure *f)
{
	int ff = __atomic_load_n(&p->board->first_fail, __ATOMIC_ACQUIRE);

	if (ff >= -1 && ff < p->nprocs)
		return ff;
	memset(f, 0, sizeof(*f));
	f->rank = -1;
	f->exit_code = -1;
	snprintf(f->summary, sizeof(f->summary),
		 "the workers' status board was overwritten (first failure "
		 "\"rank %d\" of %d): a worker scribbled on it", ff,
		 p->nprocs);
	return -EBADMSG;
}

static int procs_join(struct tshm_procs *p, int timeout_ms,
		      struct tshm_failure *failure)
{
	struct tshm_failure dummy;
	int64_t start = now_ns();
	struct deadline dl;
	int ff;

	if (!failure)
		failure = &dummy;
	memset(failure, 0, sizeof(*failure));
	failure->rank = -1;
	failure->exit_code = -1;
	deadline_init(&dl, timeout_ms);

	for (;;) {
		bool waited;

		procs_update(p);
		ff = board_first_fail(p, failure);
		if (ff == -EBADMSG)
			return ff;
		if (p->done) {
			if (ff >= 0) {
				fill_failure(p, ff, failure, -1);
				return -ECANCELED;
			}
			if (p->failed) {
				fill_failure(p, -1, failure, -1);
				return -ECANCELED;
			}
			return 0;
		}
		waited = procs_wait(p, &dl);
		if (waited)
			continue;
		/* Out of time. */
		procs_update(p);
		if (p->done)
			continue;
		ff = board_first_fail(p, failure);
		if (ff == -EBADMSG)
			return ff;
		if (ff >= 0) {
			/* Known failure, the rest still being terminated. */
			fill_failure(p, ff, failure, -1);
			return -ECANCELED;
		}
		fill_failure(p, lowest_running(p), failure,
			     (int)((now_ns() - start) / 1000000));
		return deadline_err(&dl);
	}
}

TSHM_EXPORT int tshm_procs_terminate(struct tshm_procs *p)
{
	if (!p)
		return -EINVAL;
	if (p->owner != getpid())
		return -ECHILD;
	/* No update here: a joiner may be polling the socket. */
	if (board_phase(p) != PHASE_DONE)
		procs_command(p, CMD_TERMINATE, 0);
	return 0;
}

TSHM_EXPORT int tshm_procs_kill(struct tshm_procs *p, int sig)
{
	if (!p || sig <= 0 || sig >= NSIG)
		return -EINVAL;
	if (p->owner != getpid())
		return -ECHILD;
	if (board_phase(p) == PHASE_DONE)
		return -ESRCH;
	procs_command(p, CMD_KILL, sig);
	return 0;
}

TSHM_EXPORT int tshm_procs_nprocs(const struct tshm_procs *p)
{
	return p ? p->nprocs : -EINVAL;
}

TSHM_EXPORT int tshm_procs_pid(const struct tshm_procs *p, int rank)
{
	if (!p || rank < 0 || rank >= p->nprocs)
		return -EINVAL;
	return p->board->rank[rank].pid;
}

TSHM_EXPORT int tshm_procs_status(struct tshm_procs *p, int rank,
				  int *wstatus)
{
	struct spawn_rank *r;
	bool orphaned = false;

	if (!p || !wstatus || rank < 0 || rank >= p->nprocs)
		return -EINVAL;
	if (p->owner != getpid())
		return -ECHILD;
	r = &p->board->rank[rank];
	if (!(__atomic_load_n(&r->flags, __ATOMIC_ACQUIRE) & RANK_EXITED) &&
	    pthread_mutex_trylock(&p->lock) == 0) {
		/* Only the board tells a supervisor that died from one alive. */
		procs_update(p);
		orphaned = p->failed;
		pthread_mutex_unlock(&p->lock);
	}
	if (__atomic_load_n(&r->flags, __ATOMIC_ACQUIRE) & RANK_EXITED) {
		*wstatus = r->wstatus;
		return 1;
	}
	if (!orphaned)
		return 0;
	*wstatus = W_EXITCODE(0, SIGKILL);	/* "killed by SIGKILL" */
	return 1;
}

TSHM_EXPORT int tshm_procs_pgid(const struct tshm_procs *p)
{
	if (!p)
		return -EINVAL;
	return __atomic_load_n(&p->board->pgid, __ATOMIC_ACQUIRE);
}

TSHM_EXPORT void tshm_procs_destroy(struct tshm_procs *p)
{
	if (!p)
		return;
	if (p->owner == getpid() && !procs_update(p)) {
		procs_command(p, CMD_TERMINATE, 0);
		while (!procs_update(p))
			procs_wait(p, NULL);
	}
	procs_free(p);
}
