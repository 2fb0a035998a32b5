// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * The supervisor: the real parent of a worker set (see lib/spawn.h).
 *
 * With the fork and spawn methods the supervisor is a fork of the caller,
 * which may have had threads (CUDA, OpenMP, the application's own): until
 * it forks a worker that runs the entry function in place (fork method),
 * it calls async-signal-safe functions only: no malloc, no stdio, no
 * locks.  Everything it needs was prepared by the caller in struct sup_plan.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tshm-private.h"
#include "spawn.h"

extern char **environ;

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC	(1U << 2)
#endif

/* ---- small async-signal-safe helpers ---- */

size_t spawn_board_size(unsigned nprocs)
{
	return sizeof(struct spawn_board) +
	       (size_t)nprocs * sizeof(struct spawn_rank);
}

int spawn_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	errno = ENOSYS;
	return -1;
#endif
}

char *spawn_fmt_int(char *p, long v)
{
	char tmp[24];
	unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;
	int n = 0;

	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		*p++ = '-';
	while (n)
		*p++ = tmp[--n];
	*p = '\0';
	return p;
}

static int sys_close_range(unsigned first, unsigned last, unsigned flags)
{
#ifdef SYS_close_range
	return (int)syscall(SYS_close_range, first, last, flags);
#else
	errno = ENOSYS;
	return -1;
#endif
}

struct linux_dirent64_ {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/*
 * For kernels without close_range(): walk /proc/self/fd with getdents64
 * (opendir() allocates).  @keep sorted.  @cloexec: mark instead of close.
 */
static void walk_fds(const int *keep, int nkeep, bool cloexec)
{
	char buf[2048] __attribute__((aligned(8)));
	int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	long n;

	if (dfd < 0)
		return;
	while ((n = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n;) {
			struct linux_dirent64_ *d = (void *)(buf + off);
			int fd = 0;
			bool num = d->d_name[0] != '\0';

			off += d->d_reclen;
			for (const char *c = d->d_name; *c; c++) {
				if (*c < '0' || *c > '9') {
					num = false;
					break;
				}
				fd = fd * 10 + (*c - '0');
			}
			if (!num || fd < 3 || fd == dfd)
				continue;
			for (int i = 0; i < nkeep; i++)
				if (keep[i] == fd)
					goto next;
			if (cloexec)
				fcntl(fd, F_SETFD, FD_CLOEXEC);
			else
				close(fd);
next:
			;
		}
	}
	close(dfd);
}

void spawn_cloexec_from3(void)
{
	if (sys_close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
		return;
	walk_fds(NULL, 0, true);
}

void spawn_close_fds_except(const int *keep, int nkeep)
{
	int k[32];
	int n = 0;
	unsigned lo = 3;

	for (int i = 0; i < nkeep && n < (int)ARRAY_SIZE(k); i++) {
		int fd = keep[i], j;

		if (fd < 3)
			continue;
		/* insertion sort, dropping duplicates */
		for (j = n; j > 0 && k[j - 1] > fd; j--)
			k[j] = k[j - 1];
		if (j > 0 && k[j - 1] == fd) {
			memmove(&k[j], &k[j + 1], (size_t)(n - j) * sizeof(int));
			continue;
		}
		k[j] = fd;
		n++;
	}
	for (int i = 0; i < n; i++) {
		if ((unsigned)k[i] > lo &&
		    sys_close_range(lo, (unsigned)k[i] - 1, 0) < 0)
			goto fallback;
		lo = (unsigned)k[i] + 1;
	}
	if (sys_close_range(lo, ~0U, 0) == 0)
		return;
fallback:
	walk_fds(k, n, false);
}

/* ---- the supervisor ---- */

struct sup {
	struct sup_plan *p;
	struct spawn_board *b;
	pid_t self;
	pid_t pgid;
	int started;		/* workers forked */
	int reaped;
	bool forking;		/* still in the launch loop */
	bool launching;		/* not every worker READY yet */
	int terminating;	/* 0, or why (struct spawn_board) */
	bool killed;		/* SIGKILL sent */
	bool graced;			/* SIGTERM sent, SIGKILL at @kill_at */
	struct deadline kill_at;
	bool sock_open;
	bool wsock_open;	/* some worker still holds the status socket */
	bool changed;		/* tell the caller */
};

static void sup_notify(struct sup *s)
{
	int32_t v = 0;

	s->changed = false;
	if (s->sock_open)
		send(s->p->sock, &v, sizeof(v), MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void set_flags(struct spawn_rank *r, uint32_t add)
{
	uint32_t f = __atomic_load_n(&r->flags, __ATOMIC_RELAXED);

	__atomic_store_n(&r->flags, f | add, __ATOMIC_RELEASE);
}

static void copy_text(char *dst, const char *src, ssize_t len)
{
	if (len < 0)
		len = 0;
	if (len > TSHM_WORKER_MSG_MAX - 1)
		len = TSHM_WORKER_MSG_MAX - 1;
	memcpy(dst, src, (size_t)len);
	dst[len] = '\0';
}

static void sup_drain_workers(struct sup *s)
{
	struct spawn_wmsg m;
	const ssize_t hdr = offsetof(struct spawn_wmsg, text);

	for (;;) {
		ssize_t n = recv(s->p->wsock_r, &m, sizeof(m), MSG_DONTWAIT);
		struct spawn_rank *r;

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 && !s->forking)
			s->wsock_open = false;	/* every worker closed it */
		if (n <= 0)
			return;
		if (n < hdr || m.rank < 0 || m.rank >= s->p->nprocs)
			continue;
		r = &s->b->rank[m.rank];
		switch (m.type) {
		case WMSG_READY:
			if (!(r->flags & RANK_READY)) {
				set_flags(r, RANK_READY);
				__atomic_add_fetch(&s->b->nready, 1,
						   __ATOMIC_RELEASE);
			}
			break;
		case WMSG_FAIL:
			if (!(r->flags & RANK_MSG)) {
				copy_text(r->msg, m.text,
					  n - hdr < (ssize_t)m.len ? n - hdr :
					  (ssize_t)m.len);
				set_flags(r, RANK_MSG);
			}
			break;
		case WMSG_ERR:
			r->err = m.err > 0 ? m.err : EIO;
			if (!(r->flags & RANK_MSG)) {
				copy_text(r->msg, m.text,
					  n - hdr < (ssize_t)m.len ? n - hdr :
					  (ssize_t)m.len);
				set_flags(r, RANK_MSG);
			}
			set_flags(r, RANK_ERR);
			break;
		default:
			continue;
		}
		s->changed = true;
	}
}

/*
 * Signal what is left, once per worker, as the terminal signals each process
 * of its group once: a second SIGINT or SIGTERM would interrupt what the
 * first one started (a Python worker's clean-up, its exit).  The group goes
 * first (it also reaches the workers' own children), then by pid each
 * unreaped worker that left the group.  An unreaped worker, even a zombie,
 * keeps both its pid and the group id from being reused, so this never
 * hits a stranger.
 */
static void sup_signal(struct sup *s, int sig)
{
	if (s->reaped >= s->started)
		return;
	if (s->pgid > 0)
		kill(-s->pgid, sig);
	for (int i = 0; i < s->started; i++) {
		struct spawn_rank *r = &s->b->rank[i];

		if (!(r->flags & RANK_EXITED) && r->pid > 0 &&
		    (s->pgid <= 0 || getpgid(r->pid) != s->pgid))
			kill(r->pid, sig);
	}
}

static void sup_terminate(struct sup *s, int why, bool now)
{
	if (!s->terminating) {
		s->terminating = why;
		__atomic_store_n(&s->b->terminating, (uint32_t)why,
				 __ATOMIC_RELEASE);
		s->changed = true;
	}
	if (now || s->p->grace_ms <= 0) {
		if (!s->killed) {
			s->killed = true;
			sup_signal(s, SIGKILL);
		}
		return;
	}
	if (!s->graced) {
		s->graced = true;
		deadline_init(&s->kill_at, s->p->grace_ms);
		sup_signal(s, SIGTERM);
	}
}

static int rank_of(struct sup *s, pid_t pid)
{
	for (int i = 0; i < s->started; i++)
		if (s->b->rank[i].pid == pid)
			return i;
	return -1;
}

/* The wait status waitpid() would give for what waitid() says. */
static int wait_status(const siginfo_t *si)
{
	switch (si->si_code) {
	case CLD_EXITED:
		return (si->si_status & 0xff) << 8;
	case CLD_DUMPED:
		return (si->si_status & 0x7f) | 0x80;
	default:		/* CLD_KILLED */
		return si->si_status & 0x7f;
	}
}

/*
 * Reap what exited.  A rank's status is on the board before its pid is
 * freed (waitid(WNOWAIT), then waitpid()): while the board says a rank
 * runs, its pid is still its own, so the caller may open a pidfd for it
 * and check the board after (tshm_procs_status()).
 */
static void sup_reap(struct sup *s)
{
	for (;;) {
		struct spawn_rank *r;
		siginfo_t si;
		pid_t pid;
		int st, i;
		bool ok;

		si.si_pid = 0;
		if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		pid = si.si_pid;
		if (pid <= 0)
			return;
		st = wait_status(&si);
		i = rank_of(s, pid);
		if (i >= 0) {
			/* Its last messages were sent before it exited. */
			sup_drain_workers(s);
			r = &s->b->rank[i];
			r->wstatus = st;
			set_flags(r, RANK_EXITED);
			__atomic_add_fetch(&s->b->nexited, 1,
					   __ATOMIC_RELEASE);
		}
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		if (i < 0)
			continue;
		s->reaped++;
		s->changed = true;
		ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;

		if (s->terminating)
			continue;
		if (!(r->flags & RANK_READY)) {
			/* Died before reaching its entry: the set never
			 * started.  Nothing ran user code for long: kill. */
			s->b->launch_err = (r->flags & RANK_ERR) ? -r->err :
					   -ECHILD;
			s->b->launch_rank = i;
			sup_terminate(s, 1, true);
		} else if (!ok) {
			__atomic_store_n(&s->b->first_fail, i,
					 __ATOMIC_RELEASE);
			sup_terminate(s, 1, false);
		}
	}
}

static void sup_commands(struct sup *s)
{
	struct spawn_cmd c;

	for (;;) {
		ssize_t n = recv(s->p->sock, &c, sizeof(c), MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			/* The caller closed its end (destroy, exec, exit):
			 * nobody will join; wind the set down. */
			s->sock_open = false;
			sup_terminate(s, 2, false);
			return;
		}
		if (n < (ssize_t)sizeof(c))
			continue;
		if (c.type == CMD_TERMINATE)
			sup_terminate(s, 2, false);
		else if (c.type == CMD_KILL && c.sig > 0 && c.sig < NSIG)
			sup_signal(s, c.sig);
	}
}

/* ---- the worker, between fork and its entry function (or exec) ---- */

static void worker_signals(struct sup_plan *p)
{
	struct sigaction dfl;
	sigset_t empty;

	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int sig = 1; sig < NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		sigaction(sig, p->restore_signals ? &p->saved_act[sig] : &dfl,
			  NULL);
	}
	sigemptyset(&empty);
	sigprocmask(SIG_SETMASK, p->restore_signals ? &p->saved_mask : &empty,
		    NULL);
}

static void worker_pin(struct sup_plan *p, int rank)
{
	unsigned long mask[8192 / (8 * sizeof(unsigned long))];
	const unsigned bits = 8 * sizeof(unsigned long);
	bool any = false;

	if (!p->pin || p->ncpus <= 0)
		return;
	memset(mask, 0, sizeof(mask));
	for (int j = 0; j < p->threads; j++) {
		long idx = ((long)rank * p->threads + j) % p->ncpus;
		int cpu = p->cpus[idx];

		if (cpu < 0 || cpu >= (int)(sizeof(mask) * 8))
			continue;
		mask[cpu / bits] |= 1UL << (cpu % bits);
		any = true;
	}
	if (any)
		sched_setaffinity(0, sizeof(mask), (cpu_set_t *)mask);
}

static __attribute__((noreturn)) void worker_exec(struct sup *s, int rank)
{
	struct sup_plan *p = s->p;
	char *q;
	int e;

	spawn_cloexec_from3();
	if (p->ctx_fd >= 0)
		fcntl(p->ctx_fd, F_SETFD, 0);
	fcntl(p->wsock_w, F_SETFD, 0);
	fcntl(p->spec_fd, F_SETFD, 0);

	q = p->queue_slot;
	if (q) {
		char *end = q + p->queue_slot_len;

		q += strlen(SPAWN_QUEUES_ENV "=");
		for (int i = 0; i < p->nqueues; i++) {
			int ret;

			if (end - q < TSHM_QUEUE_DESC_MAX + 2)
				break;
			ret = tshm_queue_export(p->queues[i], q,
						TSHM_QUEUE_DESC_MAX);
			if (ret < 0) {
				spawn_worker_send(p->wsock_w, WMSG_ERR, rank,
						  -ret, "tshm_queue_export", 17);
				_exit(SPAWN_EXIT_NOSTART);
			}
			q += strlen(q);
			*q++ = ';';
			*q = '\0';
		}
	}

	/* TSHM_SPAWN_WORKER=<spec fd>,<rank>,<supervisor pid>,<status fd> */
	q = p->env_slot + strlen(SPAWN_WORKER_ENV "=");
	q = spawn_fmt_int(q, p->spec_fd);
	*q++ = ',';
	q = spawn_fmt_int(q, rank);
	*q++ = ',';
	q = spawn_fmt_int(q, s->self);
	*q++ = ',';
	spawn_fmt_int(q, p->wsock_w);

	execve("/proc/self/exe", p->argv, p->envp);
	e = errno;
	spawn_worker_send(p->wsock_w, WMSG_ERR, rank, e,
			  "execve /proc/self/exe", 21);
	_exit(SPAWN_EXIT_NOSTART);
}

static __attribute__((noreturn)) void worker_run(struct sup *s, int rank)
{
	struct sup_plan *p = s->p;
	struct spawn_worker_info info;

	/*
	 * Not setenv(): its lock may be held by a thread of the caller that
	 * this fork left behind.  Assigning environ is allowed (POSIX), and
	 * a later setenv() in the worker copies the array.
	 */
	if (p->envp)
		environ = p->envp;
	memset(&info, 0, sizeof(info));
	info.rank = rank;
	info.nprocs = p->nprocs;
	info.threads = p->threads;
	info.status_fd = p->wsock_w;
	info.method = p->method;
	info.ctx = p->ctx;
	info.nqueues = p->nqueues;
	for (int i = 0; i < p->nqueues && i < SPAWN_MAX_QUEUES; i++)
		info.queues[i] = p->queues[i];
	spawn_worker_begin(&info);
	spawn_worker_exit(p->fn(rank, p->nprocs, p->arg));
}

static __attribute__((noreturn)) void worker_child(struct sup *s, int rank)
{
	struct sup_plan *p = s->p;

	setpgid(0, s->pgid);
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != s->self)
		_exit(SPAWN_EXIT_NOSTART);
	close(p->sock);
	close(p->wsock_r);
	close(p->sigfd);
	if (p->caller_pidfd >= 0)
		close(p->caller_pidfd);
	worker_signals(p);
	worker_pin(p, rank);
	if (p->method == SM_SPAWN)
		worker_exec(s, rank);
	worker_run(s, rank);
}

static pid_t sup_fork(struct sup_plan *p)
{
	/*
	 * An exec'ed worker only makes system calls before execve(): _Fork()
	 * skips the atfork handlers, which may take locks a thread of the
	 * caller held when the supervisor was forked.  The fork method runs
	 * user code in the child, which needs them (malloc, stdio).
	 */
	if (p->method == SM_SPAWN)
		return _Fork();
	return fork();
}

static void sup_signals(struct sup_plan *p)
{
	static const int ignore[] = {
		SIGINT, SIGQUIT, SIGHUP, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU,
	};
	struct sigaction sa;
	sigset_t set;

	if (p->restore_signals)
		sigprocmask(SIG_SETMASK, NULL, &p->saved_mask);
	/*
	 * What sigfd reads is blocked before any disposition changes: one
	 * that comes meanwhile waits there instead of killing the supervisor
	 * (SIGINT goes from SIG_IGN or a handler to SIG_DFL below).
	 * SIGTERM (a timeout(1), a kill of the caller's group) terminates the
	 * set as tshm_procs_terminate() does, with the grace: dying of it
	 * would leave the workers to their parent-death signal, and their
	 * own children to nobody.
	 */
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	if (p->forward_sigint)
		sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	memset(&sa, 0, sizeof(sa));
	for (int sig = 1; sig < NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		if (p->restore_signals)
			sigaction(sig, NULL, &p->saved_act[sig]);
		sa.sa_handler = SIG_DFL;
		for (unsigned i = 0; i < ARRAY_SIZE(ignore); i++)
			if (ignore[i] == sig)
				sa.sa_handler = SIG_IGN;
		/* Blocked and read on sigfd: an ignored one is discarded. */
		if (sig == SIGINT && p->forward_sigint)
			sa.sa_handler = SIG_DFL;
		sigaction(sig, &sa, NULL);
	}
	sigprocmask(SIG_SETMASK, &set, NULL);
	p->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

/*
 * spawn: the supervisor is a fork of the caller and holds a copy of every
 * fd the caller had, for as long as the set runs: a pipe's write end, a
 * listening socket.  Keep only what the workers get.  The queues' fds are
 * learnt from their descriptors ("tshm-queue:2:memfd:5,6,7,8").
 */
static void sup_close_caller_fds(struct sup_plan *p)
{
	int keep[8 + SPAWN_MAX_QUEUES * 4], n = 0;

	keep[n++] = p->sock;
	keep[n++] = p->caller_pidfd;
	keep[n++] = p->ctx_fd;
	keep[n++] = p->spec_fd;
	keep[n++] = p->sigfd;
	for (int i = 0; i < p->nqueues; i++) {
		char desc[TSHM_QUEUE_DESC_MAX];
		const char *c;
		int fd = -1;

		if (tshm_queue_export(p->queues[i], desc, sizeof(desc)) < 0)
			return;		/* keep everything */
		c = strrchr(desc, ':');
		if (!c)
			return;
		for (c++;; c++) {
			if (*c >= '0' && *c <= '9') {
				fd = (fd < 0 ? 0 : fd * 10) + (*c - '0');
				continue;
			}
			if (fd < 0 || (*c != ',' && *c != '\0'))
				return;
			if (n >= (int)ARRAY_SIZE(keep))
				return;
			/* Not inherited by anything but our workers. */
			fcntl(fd, F_SETFD, FD_CLOEXEC);
			keep[n++] = fd;
			fd = -1;
			if (!*c)
				break;
		}
	}
	spawn_close_fds_except(keep, n);
}

/*
 * Every worker runs: from here on the supervisor only waits, reaps and
 * relays.  It lets go of the fds and the memory it inherited from the
 * caller (or the forkserver), or it would keep the caller's segments
 * alive and a copy-on-write image of its memory pinned for as long as the
 * set runs.
 */
static void sup_let_go_of_caller(struct sup *s)
{
	struct sup_plan *p = s->p;
	const int fds[] = { p->sock, p->wsock_r, p->sigfd, p->caller_pidfd };
	const struct sup_range keep[] = {
		{ (uintptr_t)p, (uintptr_t)(p + 1) },
		{ (uintptr_t)s, (uintptr_t)(s + 1) },
		{ (uintptr_t)s->b, (uintptr_t)s->b +
		  spawn_board_size((unsigned int)p->nprocs) },
	};

	spawn_close_fds_except(fds, ARRAY_SIZE(fds));
	sup_let_go(keep, ARRAY_SIZE(keep));
}

void sup_main(struct sup_plan *p)
{
	struct spawn_board *b = p->board;
	struct sup s;
	int w[2];

	memset(&s, 0, sizeof(s));
	s.p = p;
	s.b = b;
	s.self = getpid();
	s.forking = true;
	s.launching = true;
	s.sock_open = true;
	s.wsock_open = true;
	prctl(PR_SET_NAME, "tshm-supervisor");

	if (p->caller_pidfd < 0) {
		/* No pidfd (Linux < 5.3): the thread that forked us is all
		 * we can watch. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != p->caller_pid)
			_exit(1);
	}
	sup_signals(p);
	if (p->method == SM_SPAWN)
		sup_close_caller_fds(p);
	__atomic_store_n(&b->sup_pid, s.self, __ATOMIC_RELEASE);
	if (p->sigfd < 0 ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, w) < 0) {
		b->launch_err = -errno;
		goto done;
	}
	p->wsock_r = w[0];
	p->wsock_w = w[1];

	for (int i = 0; i < p->nprocs; i++) {
		pid_t pid = sup_fork(p);

		if (pid == 0)
			worker_child(&s, i);
		if (pid < 0) {
			b->launch_err = -errno;
			b->launch_rank = i;
			sup_terminate(&s, 1, true);
			break;
		}
		if (i == 0)
			s.pgid = pid;
		/* Also in the child: whichever runs first wins the race. */
		setpgid(pid, s.pgid);
		b->rank[i].pid = pid;
		s.started++;
		if (i == 0)
			__atomic_store_n(&b->pgid, pid, __ATOMIC_RELEASE);
	}
	s.forking = false;
	close(p->wsock_w);

	while (s.reaped < s.started) {
		struct pollfd pfd[4];
		int n = 0, timeout = -1, isig, isock = -1, ipid = -1;

		if (s.wsock_open) {
			pfd[n].fd = p->wsock_r;
			pfd[n++].events = POLLIN;
		}
		isig = n;
		pfd[n].fd = p->sigfd;
		pfd[n++].events = POLLIN;
		if (s.sock_open) {
			isock = n;
			pfd[n].fd = p->sock;
			pfd[n++].events = POLLIN;
		}
		if (p->caller_pidfd >= 0 && s.terminating != 3) {
			ipid = n;
			pfd[n].fd = p->caller_pidfd;
			pfd[n++].events = POLLIN;
		}
		if (s.graced && !s.killed)
			timeout = deadline_poll_ms(&s.kill_at);
		if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR) {
			/*
			 * Blind from here on: kill the set and die without
			 * saying DONE, so that join reports the supervisor's
			 * failure instead of a success with nothing recorded.
			 */
			sup_signal(&s, SIGKILL);
			_exit(1);
		}

		sup_drain_workers(&s);
		if (pfd[isig].revents) {
			struct signalfd_siginfo si;

			/*
			 * A SIGINT or SIGTERM that came while the workers were
			 * being forked is acted on here, once they all exist.
			 */
			while (read(p->sigfd, &si, sizeof(si)) > 0) {
				if (si.ssi_signo == SIGINT)
					sup_signal(&s, SIGINT);
				else if (si.ssi_signo == SIGTERM)
					sup_terminate(&s, 2, false);
			}
		}
		sup_reap(&s);
		if (ipid >= 0 && pfd[ipid].revents) {
			/* The caller's process is gone: no grace. */
			s.terminating = 0;
			sup_terminate(&s, 3, true);
		}
		if (isock >= 0 && pfd[isock].revents)
			sup_commands(&s);
		if (s.graced && !s.killed && deadline_expired(&s.kill_at)) {
			s.killed = true;
			sup_signal(&s, SIGKILL);
		}
		if (s.launching && b->nready >= (uint32_t)p->nprocs) {
			s.launching = false;
			__atomic_store_n(&b->phase, PHASE_RUNNING,
					 __ATOMIC_RELEASE);
			sup_notify(&s);
			sup_let_go_of_caller(&s);
		}
		if (s.changed)
			sup_notify(&s);
	}
done:
	__atomic_store_n(&b->phase, PHASE_DONE, __ATOMIC_RELEASE);
	sup_notify(&s);
	_exit(0);
}
