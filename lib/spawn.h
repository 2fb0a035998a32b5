/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * spawn internals shared by lib/spawn.c (the caller's side and the worker
 * runtime), lib/spawn-sup.c (the supervisor) and lib/spawn-forkserver.c.
 * Nothing here is ABI: every process involved runs the same binary.
 *
 * Process tree of one worker set:
 *
 *   caller ── supervisor ──┬── worker 0   (process group leader)
 *                          ├── worker 1
 *                          └── ...
 *
 * The supervisor is the workers' real parent: it forks them, reaps them,
 * propagates the first failure, and writes everything the caller needs to
 * know into a shared "board" (struct spawn_board, a MAP_SHARED memfd).  It
 * nudges the caller through a SOCK_SEQPACKET pair when the board changes and
 * takes commands (terminate, kill) through the same pair.  It watches the
 * caller through a pidfd of the caller's *process*, so the caller thread that
 * forked it may exit without consequence; workers get PR_SET_PDEATHSIG from
 * the single-threaded supervisor.  With the forkserver method the
 * supervisor is forked by the forkserver instead of by the caller.
 */
#ifndef _TSHM_SPAWN_PRIVATE_H
#define _TSHM_SPAWN_PRIVATE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "tshm.h"
#include "tshm-spawn.h"

#define SPAWN_BOARD_MAGIC	0x7473686d626f6172ULL	/* "tshmboar" */
#define SPAWN_SPEC_MAGIC	0x7473686d73706563ULL	/* "tshmspec" */
#define SPAWN_SPEC_VERSION	1
#define SPAWN_MAX_QUEUES	16
#define SPAWN_ENTRY_NAME_MAX	128

/* The environment variable an exec'ed worker finds itself through. */
#define SPAWN_WORKER_ENV	"TSHM_SPAWN_WORKER"
#define SPAWN_QUEUES_ENV	"TSHM_SPAWN_QUEUES"

/* Exit codes of a worker that could not start. */
#define SPAWN_EXIT_NOSTART	127

/* ---- worker -> supervisor messages (SOCK_SEQPACKET, one per send) ---- */

enum {
	WMSG_READY = 1,		/* about to call the entry function */
	WMSG_FAIL = 2,		/* tshm_worker_fail() text */
	WMSG_ERR = 3,		/* could not start: @err */
};

struct spawn_wmsg {
	uint32_t type;
	int32_t rank;
	int32_t err;
	uint32_t len;
	char text[TSHM_WORKER_MSG_MAX];
};

/* ---- caller -> supervisor commands ---- */

enum {
	CMD_TERMINATE = 1,	/* SIGTERM, grace, SIGKILL */
	CMD_KILL = 2,		/* send @sig to the group */
};

struct spawn_cmd {
	uint32_t type;
	int32_t sig;
};

/* ---- the board: supervisor writes, caller reads ---- */

#define RANK_READY	(1U << 0)
#define RANK_EXITED	(1U << 1)	/* @wstatus valid */
#define RANK_MSG	(1U << 2)	/* @msg holds the worker's message */
#define RANK_ERR	(1U << 3)	/* @err: could not start */

struct spawn_rank {
	int32_t pid;
	uint32_t flags;
	int32_t wstatus;
	int32_t err;
	char msg[TSHM_WORKER_MSG_MAX];
};

enum {
	PHASE_LAUNCH = 0,	/* forking, waiting for every READY */
	PHASE_RUNNING = 1,	/* every worker started */
	PHASE_DONE = 2,		/* every worker reaped; supervisor exits */
};

struct spawn_board {
	uint64_t magic;
	uint32_t nprocs;
	int32_t sup_pid;
	int32_t pgid;
	int32_t launch_err;	/* 0 or -errno: the set could not start */
	int32_t launch_rank;	/* the rank that could not start, or -1 */
	int32_t first_fail;	/* rank of the first failure, or -1 */
	uint32_t phase;
	uint32_t nready;
	uint32_t nexited;
	uint32_t terminating;	/* why: 1 failure, 2 asked, 3 caller gone */
	struct spawn_rank rank[];
};

size_t spawn_board_size(unsigned nprocs);

/* ---- spec: what an exec'ed worker or the forkserver needs (memfd) ---- */

struct spawn_spec {
	uint64_t magic;
	uint32_t version;
	uint32_t size;		/* bytes of the whole spec */
	int32_t nprocs;
	int32_t threads;
	uint32_t flags;		/* TSHM_SPAWN_* */
	int32_t grace_ms;
	int32_t ctx_fd;		/* spawn: the number the worker inherits */
	int32_t nqueues;	/* forkserver: queues sent after the request */
	uint64_t fn;		/* forkserver: the entry function */
	uint32_t name_off, name_len;
	uint32_t env_off, env_len;	/* "NAME=VALUE\0"... to setenv */
	uint32_t cpus_off, ncpus;	/* int32_t cpu numbers for pinning */
	uint64_t arg_off, arg_len;
	uint32_t has_arg;		/* arg points at the blob (else NULL) */
	uint32_t __pad;
};

/* ---- the supervisor's plan (in its memory: prepared before fork) ---- */

enum spawn_method {
	SM_FORK = TSHM_START_FORK,
	SM_SPAWN = TSHM_START_SPAWN,
	SM_FORKSERVER = TSHM_START_FORKSERVER,
};

struct sup_plan {
	enum spawn_method method;
	int nprocs;
	int grace_ms;
	struct spawn_board *board;

	int sock;		/* supervisor's end of the caller pair */
	int caller_pidfd;	/* the caller process, or -1 (then pdeathsig) */
	pid_t caller_pid;

	/* Worker setup. */
	tshm_entry_fn fn;
	void *arg;
	struct tshm_ctx *ctx;	/* fork: the caller's; forkserver: reopened */
	int ctx_fd;		/* -1 without a context */
	int threads;
	bool pin;
	bool forward_sigint;	/* SIGINT read on @sigfd, sent to the group */
	const int *cpus;
	int ncpus;
	struct tshm_queue **queues;
	int nqueues;

	/*
	 * The workers' complete environment, built before the fork
	 * (spawn_env_merge()).  fork/forkserver: the worker points environ
	 * at it (no setenv: see spawn_env_merge()).  spawn: execve()
	 * arguments; @env_slot is the TSHM_SPAWN_WORKER= string inside
	 * @envp, @queue_slot the TSHM_SPAWN_QUEUES= one (or NULL), both with
	 * room to format in the child.
	 */
	char **envp;
	char **argv;
	char *env_slot;
	size_t env_slot_len;
	char *queue_slot;
	size_t queue_slot_len;
	int spec_fd;

	/* fork: the caller's signal dispositions and mask, restored in the
	 * workers (the supervisor resets its own). */
	struct sigaction *saved_act;	/* [NSIG] */
	sigset_t saved_mask;
	bool restore_signals;

	/* Filled by the supervisor. */
	int wsock_r, wsock_w;	/* worker -> supervisor pair */
	int sigfd;
};

/*
 * Run the supervisor.  Only async-signal-safe calls: with the fork and
 * spawn methods it is a child of a process that may have had threads.
 */
__attribute__((noreturn)) void sup_main(struct sup_plan *p);

/*
 * Unmap what the supervisor inherited from the caller and does not use
 * (lib/spawn-sup-mem.c); @keep's ranges stay, up to 8 of them.
 */
struct sup_range {
	uintptr_t start, end;
};

void sup_let_go(const struct sup_range *keep, int nkeep);

/* Close every fd >= 3 except @keep (any order, -1 entries ignored). */
void spawn_close_fds_except(const int *keep, int nkeep);
/* Set FD_CLOEXEC on every fd >= 3. */
void spawn_cloexec_from3(void);

/* ---- the worker runtime (lib/spawn.c) ---- */

struct spawn_worker_info {
	int rank;
	int nprocs;
	int threads;
	int status_fd;
	enum spawn_method method;
	struct tshm_ctx *ctx;
	struct tshm_queue *queues[SPAWN_MAX_QUEUES];
	int nqueues;
};

/* Become a worker: set the runtime state, send READY. */
void spawn_worker_begin(const struct spawn_worker_info *info);
/* Leave: flush stdio, exit (spawn) or _exit (fork, forkserver). */
__attribute__((noreturn)) void spawn_worker_exit(int ret);
/* Send one message to the supervisor (async-signal-safe). */
void spawn_worker_send(int fd, uint32_t type, int rank, int err,
		       const char *text, size_t len);

/* ---- forkserver ---- */

struct tshm_forkserver {
	pid_t pid;
	pid_t owner;
	int sock;
	/* Executable ranges loaded when the server was forked. */
	uintptr_t (*text)[2];
	unsigned ntext;
};

/* Fork a supervisor through @fs; fds as in struct spawn_fs_req. */
int spawn_forkserver_request(struct tshm_forkserver *fs, int sup_sock,
			     int caller_pidfd, int board_fd, int spec_fd,
			     int ctx_fd);
bool spawn_forkserver_knows(const struct tshm_forkserver *fs, const void *fn);

/*
 * The workers' envp: environ with @list's "NAME=VALUE" or "NAME" (unset)
 * applied, and room for @extra more; the strings are not copied.
 */
char **spawn_env_merge(char *const *list, int nlist, int extra);

/* Small helpers shared by the three files. */
int spawn_pidfd_open(pid_t pid);
/* Async-signal-safe decimal formatting; returns the end of the digits. */
char *spawn_fmt_int(char *p, long v);

#endif /* _TSHM_SPAWN_PRIVATE_H */
