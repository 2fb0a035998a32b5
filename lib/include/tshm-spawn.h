/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * tshm-spawn.h - libtshm's process spawner: N workers with a rank, the
 * tshm context and queues, sized thread pools, no orphans, and a join that
 * reports the first failure.  Part of libtshm (link as for tshm.h);
 * Documentation/lib/spawn.rst has the guide.  Conventions as in tshm.h.
 */
#ifndef _TSHM_SPAWN_H
#define _TSHM_SPAWN_H

#include <tshm.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Start @nprocs worker processes running one entry function, pass each its
 * rank, the context and an argument blob, size their thread pools so they
 * do not oversubscribe the machine, and never leave one behind: workers die
 * with the caller (even SIGKILLed), and joining reports the first failure
 * and terminates the rest.  Documentation/lib/spawn.rst has the details.
 *
 * Start methods:
 *  FORK        fork() of the caller: fastest; the worker sees the caller's
 *              memory.  Unsafe once the caller has threads or CUDA.
 *  SPAWN       fork + exec of /proc/self/exe, which runs the entry
 *              registered with TSHM_ENTRY(): a fresh address space (safe
 *              with threads and CUDA).
 *  FORKSERVER  fork() of a server process made by tshm_forkserver_create()
 *              early, before the caller starts threads or CUDA.
 */
enum tshm_start_method {
	TSHM_START_FORK = 0,
	TSHM_START_SPAWN = 1,
	TSHM_START_FORKSERVER = 2,
};

/* "fork", "spawn", "forkserver" (NULL for anything else). */
const char *tshm_start_method_name(enum tshm_start_method method);

#define TSHM_SPAWN_MAX_PROCS	1024	/* nprocs above: -E2BIG */
#define TSHM_SPAWN_GRACE_MS	3000	/* default SIGTERM -> SIGKILL delay */
#define TSHM_WORKER_MSG_MAX	512	/* a worker's message, NUL included */

/* A worker's entry function: its return value is its exit status. */
typedef int (*tshm_entry_fn)(int rank, int nprocs, void *arg);

/*
 * Entry points the SPAWN method can run, by name.  TSHM_ENTRY("name", fn) at
 * file scope registers @fn from a constructor.  In an exec'ed worker the
 * registration of the entry it was started for runs the worker there and
 * then, so main() is never entered (and constructors that come later in
 * link order never run).  Entries must live in the program or in a library
 * it links, not in one it dlopen()s.
 */
struct tshm_entry {
	const char *name;
	tshm_entry_fn fn;
	struct tshm_entry *__next;	/* private */
	unsigned long __loaded;		/* private */
};

void tshm_entry_register(struct tshm_entry *entry);
void tshm_entry_unregister(struct tshm_entry *entry);

#define __TSHM_CAT2(a, b)	a##b
#define __TSHM_CAT(a, b)	__TSHM_CAT2(a, b)
#define TSHM_ENTRY(ename, efn)						\
	static struct tshm_entry __TSHM_CAT(__tshm_entry_, __LINE__) = {	\
		(ename), (efn), 0, 0 };					\
	__attribute__((constructor)) static void			\
	__TSHM_CAT(__tshm_entry_reg_, __LINE__)(void)			\
	{ tshm_entry_register(&__TSHM_CAT(__tshm_entry_, __LINE__)); }	\
	__attribute__((destructor)) static void				\
	__TSHM_CAT(__tshm_entry_unreg_, __LINE__)(void)			\
	{ tshm_entry_unregister(&__TSHM_CAT(__tshm_entry_, __LINE__)); }

/*
 * The forkserver: a process forked from the caller by
 * tshm_forkserver_create(), which should run early in main(), before any
 * thread or CUDA exists.  Workers are later forked from it, so they start
 * from that early, clean image: globals the caller changed afterwards are
 * not seen, and the entry function must be loaded at creation time
 * (-EINVAL otherwise).  Any process holding it may use it; it exits when its
 * creator exits or on destroy (running sets are not affected).
 */
struct tshm_forkserver;
int tshm_forkserver_create(struct tshm_forkserver **out);
int tshm_forkserver_pid(const struct tshm_forkserver *fs);
void tshm_forkserver_destroy(struct tshm_forkserver *fs);

/*
 * Spawn attributes.  Defaults: 1 process, FORK, no entry, no argument,
 * automatic thread budget, no pinning, grace TSHM_SPAWN_GRACE_MS.
 */
struct tshm_spawn_attr;
int tshm_spawn_attr_create(struct tshm_spawn_attr **out);
void tshm_spawn_attr_destroy(struct tshm_spawn_attr *attr);
int tshm_spawn_attr_set_nprocs(struct tshm_spawn_attr *attr, int nprocs);
int tshm_spawn_attr_set_method(struct tshm_spawn_attr *attr,
			       enum tshm_start_method method);
/* FORKSERVER needs one (-EINVAL at spawn time otherwise). */
int tshm_spawn_attr_set_forkserver(struct tshm_spawn_attr *attr,
				   struct tshm_forkserver *fs);
/*
 * What to run: a function (FORK, FORKSERVER; SPAWN looks it up among the
 * registered entries) or the name of a registered entry (every method).
 * Setting one clears the other.
 */
int tshm_spawn_attr_set_fn(struct tshm_spawn_attr *attr, tshm_entry_fn fn);
int tshm_spawn_attr_set_entry(struct tshm_spawn_attr *attr, const char *name);
/*
 * The argument: @len bytes at @arg are copied at tshm_spawn() time and each
 * worker gets a pointer to its own copy.  @len 0 passes @arg itself (FORK
 * only: a pointer means nothing in an exec'ed or forkserver worker).
 */
int tshm_spawn_attr_set_arg(struct tshm_spawn_attr *attr, const void *arg,
			    size_t len);
/*
 * Threads per worker: 0 (default) is floor(usable CPUs / nprocs), at least
 * 1, where usable CPUs are those of the caller's affinity mask.  Exported
 * to each worker as OMP_NUM_THREADS, MKL_NUM_THREADS and
 * OPENBLAS_NUM_THREADS, replacing inherited values; tshm_spawn_attr_setenv()
 * of one of them wins over the budget.
 */
int tshm_spawn_attr_set_threads(struct tshm_spawn_attr *attr, int threads);
/* Set (or with @value NULL, remove) an environment variable in workers. */
int tshm_spawn_attr_setenv(struct tshm_spawn_attr *attr, const char *name,
			   const char *value);

#define TSHM_SPAWN_PIN		(1U << 0)	/* sched_setaffinity() each
						 * worker to its own CPUs */
/*
 * Pass the SIGINT the supervisor gets (Ctrl-C: it stays in the caller's
 * process group) on to the workers' group, as if they were in the
 * terminal's foreground group themselves.
 */
#define TSHM_SPAWN_FORWARD_SIGINT	(1U << 1)
int tshm_spawn_attr_set_flags(struct tshm_spawn_attr *attr, unsigned flags);
/* SIGTERM to SIGKILL delay when a set is terminated (0: SIGKILL at once). */
int tshm_spawn_attr_set_grace_ms(struct tshm_spawn_attr *attr, int grace_ms);
/*
 * Hand queues to the workers (up to 16): tshm_worker_queue(i) gives the
 * i-th in each worker, whatever the method.  Needs a context.
 */
int tshm_spawn_attr_add_queue(struct tshm_spawn_attr *attr,
			      struct tshm_queue *q);

/*
 * Start the set.  Returns when every worker is running its entry function
 * (or has already finished), or fails with nothing left running:
 * -EINVAL (bad attributes, no entry), -E2BIG (nprocs above
 * TSHM_SPAWN_MAX_PROCS), -ENOENT (no registered entry of that name or
 * function for SPAWN), -EAGAIN (fork failed: RLIMIT_NPROC), an execve()
 * errno, or -ECHILD (a worker died before reaching its entry).  @ctx may be
 * NULL: workers then have no context.  The returned set belongs to the
 * calling process; any of its threads may join it.
 */
struct tshm_procs;
int tshm_spawn(struct tshm_ctx *ctx, const struct tshm_spawn_attr *attr,
	       struct tshm_procs **out);

/*
 * What went wrong, from tshm_procs_join().  @rank is -1 when nothing did, or
 * when the supervisor process itself died.  @exit_code is the exit status
 * when @signo is 0; @signo the signal that killed the worker.  @message is
 * the worker's own (tshm_worker_fail()), empty if it sent none; @summary a
 * line for humans: "rank 2 (pid 1234): killed by SIGSEGV (core dumped)".
 */
struct tshm_failure {
	int rank;
	int pid;
	int exit_code;
	int signo;
	int timed_out;		/* join timed out: @rank still running */
	int __reserved[3];
	char message[TSHM_WORKER_MSG_MAX];
	char summary[TSHM_WORKER_MSG_MAX + 128];
};

/*
 * Wait until every worker has exited 0 (returns 0), or one failed (-ECANCELED:
 * a worker exited non-zero or was killed; the rest got SIGTERM, then SIGKILL
 * after the grace period, and are reaped before this returns, unless
 * @timeout_ms runs out first), or @timeout_ms passed (-ETIMEDOUT, or -EAGAIN
 * for 0: @failure names the lowest rank still running), or -EBADMSG: the
 * status board the workers share was overwritten (a FORK worker scribbled
 * on it; @failure says so).  The first failure is sticky.  @failure may be
 * NULL.
 */
int tshm_procs_join(struct tshm_procs *procs, int timeout_ms,
		    struct tshm_failure *failure);
/* Start terminating the set: SIGTERM now, SIGKILL after the grace period. */
int tshm_procs_terminate(struct tshm_procs *procs);
/* Send @sig to every worker still running (the process group). */
int tshm_procs_kill(struct tshm_procs *procs, int sig);
int tshm_procs_nprocs(const struct tshm_procs *procs);
/* The worker's pid, or -EINVAL.  Valid until the set is destroyed. */
int tshm_procs_pid(const struct tshm_procs *procs, int rank);
/*
 * How rank @rank ended: 1 with its wait status (as waitpid() gives it) in
 * @wstatus once the supervisor reaped it, 0 while it runs (or is not reaped
 * yet).  A worker whose supervisor died before reaping it was killed by its
 * parent-death signal: its status reads as killed by SIGKILL.  -EINVAL for
 * a bad rank, -ECHILD outside the process that started the set.  Never
 * blocks on a joiner: another thread's join keeps what it learns for the
 * next call.
 */
int tshm_procs_status(struct tshm_procs *procs, int rank, int *wstatus);
int tshm_procs_pgid(const struct tshm_procs *procs);
/* Terminate what still runs (as tshm_procs_terminate), reap, free. */
void tshm_procs_destroy(struct tshm_procs *procs);

/* Signal name ("SIGSEGV"), or NULL. */
const char *tshm_signal_name(int signo);

/*
 * Inside a worker.  tshm_worker_fail() sends the formatted message to the
 * caller (reported by join) and exits with status 1; outside a worker it
 * prints to stderr and exits(1).  The others return -1 / NULL outside.
 * The context and queues are the worker runtime's: do not close them.
 */
__attribute__((noreturn, format(printf, 1, 2)))
void tshm_worker_fail(const char *fmt, ...);
int tshm_worker_rank(void);
int tshm_worker_nprocs(void);
int tshm_worker_threads(void);
struct tshm_ctx *tshm_worker_ctx(void);
struct tshm_queue *tshm_worker_queue(unsigned idx);

#ifdef __cplusplus
}
#endif

#endif /* _TSHM_SPAWN_H */
