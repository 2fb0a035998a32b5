// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * The forkserver: a process forked from the caller early (before threads or
 * CUDA), which forks a supervisor for each worker set it is asked for.  The
 * supervisor then forks the workers, which run their entry function in the
 * server's clean image.
 *
 * A request is one SOCK_SEQPACKET message on the server's socket carrying
 * the supervisor's end of the caller's pair, the board memfd, the spec
 * memfd, the caller's pidfd and the context fd (SCM_RIGHTS).  Queues follow
 * on the caller's pair (tshm_queue_send_fd()), read by the supervisor.
 * The server exits when its creator does or when the socket hangs up
 * (tshm_forkserver_destroy()); running sets do not depend on it.
 */
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tshm-private.h"
#include "spawn.h"

#define FS_REQ_MAGIC	0x7473667271756573ULL
#define FS_HAS_PIDFD	(1U << 0)
#define FS_HAS_CTX	(1U << 1)
#define FS_MAX_FDS	5

struct fs_req {
	uint64_t magic;
	uint32_t flags;
	int32_t caller_pid;
};

/* ---- executable ranges known to the server ---- */

struct text_walk {
	uintptr_t (*r)[2];
	unsigned n, cap;
};

static int collect_text(struct dl_phdr_info *info, size_t size, void *data)
{
	struct text_walk *w = data;

	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
			continue;
		if (w->n == w->cap) {
			unsigned cap = w->cap ? 2 * w->cap : 32;
			void *n = realloc(w->r, cap * sizeof(*w->r));

			if (!n)
				return 1;
			w->r = n;
			w->cap = cap;
		}
		w->r[w->n][0] = info->dlpi_addr + ph->p_vaddr;
		w->r[w->n][1] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
		w->n++;
	}
	return 0;
}

bool spawn_forkserver_knows(const struct tshm_forkserver *fs, const void *fn)
{
	uintptr_t a = (uintptr_t)fn;

	for (unsigned i = 0; i < fs->ntext; i++)
		if (a >= fs->text[i][0] && a < fs->text[i][1])
			return true;
	return false;
}

/* ---- the server ---- */

static void fs_reply_err(int sock, int err)
{
	int32_t v = err;

	send(sock, &v, sizeof(v), MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void fs_board_fail(struct spawn_board *b, int sock, int err)
{
	b->launch_err = err;
	__atomic_store_n(&b->phase, PHASE_DONE, __ATOMIC_RELEASE);
	fs_reply_err(sock, 0);
	_exit(1);
}

/* In the supervisor-to-be, forked from the server: clean, may allocate. */
static __attribute__((noreturn)) void fs_run(const struct fs_req *req,
					     int *fds, unsigned nfds)
{
	int sup_sock = fds[0], board_fd = fds[1], spec_fd = fds[2];
	int pidfd = -1, ctx_fd = -1, k = 3;
	struct spawn_spec hdr, *spec;
	struct spawn_board *b;
	struct sup_plan plan;
	struct stat st;
	char **envl;
	int ret, nenv = 0;

	if (req->flags & FS_HAS_PIDFD)
		pidfd = fds[k++];
	if (req->flags & FS_HAS_CTX)
		ctx_fd = fds[k++];
	if ((unsigned)k != nfds || fstat(board_fd, &st) < 0 ||
	    pread(spec_fd, &hdr, sizeof(hdr), 0) != sizeof(hdr) ||
	    hdr.magic != SPAWN_SPEC_MAGIC || hdr.nprocs <= 0 ||
	    (size_t)st.st_size < spawn_board_size((unsigned)hdr.nprocs)) {
		fs_reply_err(sup_sock, -EINVAL);
		_exit(1);
	}
	b = mmap(NULL, spawn_board_size((unsigned)hdr.nprocs),
		 PROT_READ | PROT_WRITE, MAP_SHARED, board_fd, 0);
	if (b == MAP_FAILED) {
		fs_reply_err(sup_sock, -errno);
		_exit(1);
	}
	close(board_fd);
	spec = malloc(hdr.size);
	if (!spec || pread(spec_fd, spec, hdr.size, 0) != (ssize_t)hdr.size)
		fs_board_fail(b, sup_sock, -ENOMEM);
	close(spec_fd);

	memset(&plan, 0, sizeof(plan));
	plan.method = SM_FORKSERVER;
	plan.nprocs = spec->nprocs;
	plan.grace_ms = spec->grace_ms;
	plan.board = b;
	plan.sock = sup_sock;
	plan.caller_pidfd = pidfd;
	plan.caller_pid = getppid();
	plan.fn = (tshm_entry_fn)(uintptr_t)spec->fn;
	plan.arg = spec->has_arg ? (char *)spec + spec->arg_off : NULL;
	plan.ctx_fd = -1;
	if (ctx_fd >= 0) {
		ret = tshm_ctx_open_fd(ctx_fd, 0, &plan.ctx);
		if (ret < 0)
			fs_board_fail(b, sup_sock, ret);
		close(ctx_fd);
		plan.ctx_fd = tshm_ctx_fd(plan.ctx);
	}
	plan.nqueues = spec->nqueues;
	if (plan.nqueues) {
		plan.queues = calloc((size_t)plan.nqueues, sizeof(*plan.queues));
		if (!plan.queues)
			fs_board_fail(b, sup_sock, -ENOMEM);
		for (int i = 0; i < plan.nqueues; i++) {
			ret = tshm_queue_recv_fd(plan.ctx, sup_sock,
						 &plan.queues[i]);
			if (ret < 0)
				fs_board_fail(b, sup_sock, ret);
		}
	}
	plan.threads = spec->threads;
	plan.pin = spec->flags & TSHM_SPAWN_PIN;
	plan.forward_sigint = spec->flags & TSHM_SPAWN_FORWARD_SIGINT;
	plan.cpus = (const int *)((char *)spec + spec->cpus_off);
	plan.ncpus = (int)spec->ncpus;
	envl = calloc(spec->env_len + 1, sizeof(*envl));
	if (!envl)
		fs_board_fail(b, sup_sock, -ENOMEM);
	for (char *e = (char *)spec + spec->env_off;
	     e < (char *)spec + spec->env_off + spec->env_len;
	     e += strlen(e) + 1)
		envl[nenv++] = e;
	plan.envp = spawn_env_merge(envl, nenv, 0);
	if (!plan.envp)
		fs_board_fail(b, sup_sock, -ENOMEM);
	plan.spec_fd = -1;
	plan.wsock_r = plan.wsock_w = plan.sigfd = -1;
	sup_main(&plan);
}

static void fs_handle(int sock, int sigfd, int my_pidfd)
{
	struct fs_req req;
	int fds[FS_MAX_FDS];
	unsigned nfds = FS_MAX_FDS;
	ssize_t n;
	pid_t pid;

	n = fd_recv(sock, &req, sizeof(req), fds, &nfds, MSG_DONTWAIT);
	if (n == -EAGAIN || n == -EBADMSG)
		return;		/* nothing, or malformed (its fds closed) */
	if (n <= 0)
		_exit(0);	/* destroyed */
	if (n != sizeof(req) || req.magic != FS_REQ_MAGIC || nfds < 3)
		goto out;

	pid = fork();
	if (pid == 0) {
		close(sock);
		close(sigfd);
		if (my_pidfd >= 0)
			close(my_pidfd);
		fs_run(&req, fds, nfds);
	}
	if (pid < 0)
		fs_reply_err(fds[0], -errno);
out:
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
}

static __attribute__((noreturn)) void fs_main(int sock, int creator_pidfd,
					      pid_t creator)
{
	struct sigaction sa;
	sigset_t set;
	int sigfd, keep[2] = { sock, creator_pidfd };

	prctl(PR_SET_NAME, "tshm-forkserver");
	if (creator_pidfd < 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != creator)
			_exit(1);
	}
	spawn_close_fds_except(keep, 2);
	memset(&sa, 0, sizeof(sa));
	for (int sig = 1; sig < NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP)
			continue;
		sa.sa_handler = (sig == SIGINT || sig == SIGQUIT ||
				 sig == SIGHUP || sig == SIGPIPE ||
				 sig == SIGTSTP) ? SIG_IGN : SIG_DFL;
		sigaction(sig, &sa, NULL);
	}
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_SETMASK, &set, NULL);
	sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sigfd < 0)
		_exit(1);

	for (;;) {
		struct pollfd pfd[3] = {
			{ .fd = sock, .events = POLLIN },
			{ .fd = sigfd, .events = POLLIN },
			{ .fd = creator_pidfd, .events = POLLIN },
		};

		if (poll(pfd, creator_pidfd >= 0 ? 3 : 2, -1) < 0 &&
		    errno != EINTR)
			_exit(1);
		if (pfd[1].revents) {
			struct signalfd_siginfo si;

			while (read(sigfd, &si, sizeof(si)) > 0)
				;
		}
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		if (creator_pidfd >= 0 && pfd[2].revents)
			_exit(0);
		if (pfd[0].revents)
			fs_handle(sock, sigfd, creator_pidfd);
	}
}

TSHM_EXPORT int tshm_forkserver_create(struct tshm_forkserver **out)
{
	struct tshm_forkserver *fs;
	struct text_walk w = { 0 };
	int sv[2], pidfd, ret;
	pid_t pid, me = getpid();

	if (!out)
		return -EINVAL;
	*out = NULL;
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	dl_iterate_phdr(collect_text, &w);
	fs->text = w.r;
	fs->ntext = w.n;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		ret = -errno;
		goto err;
	}
	pidfd = spawn_pidfd_open(me);
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		fs_main(sv[1], pidfd, me);
	}
	ret = -errno;
	close(sv[1]);
	if (pidfd >= 0)
		close(pidfd);
	if (pid < 0) {
		close(sv[0]);
		goto err;
	}
	fs->pid = pid;
	fs->owner = me;
	fs->sock = sv[0];
	*out = fs;
	return 0;
err:
	free(fs->text);
	free(fs);
	return ret;
}

TSHM_EXPORT int tshm_forkserver_pid(const struct tshm_forkserver *fs)
{
	return fs ? fs->pid : -EINVAL;
}

TSHM_EXPORT void tshm_forkserver_destroy(struct tshm_forkserver *fs)
{
	if (!fs)
		return;
	close(fs->sock);
	if (fs->owner == getpid())
		while (waitpid(fs->pid, NULL, 0) < 0 && errno == EINTR)
			;
	free(fs->text);
	free(fs);
}

int spawn_forkserver_request(struct tshm_forkserver *fs, int sup_sock,
			     int caller_pidfd, int board_fd, int spec_fd,
			     int ctx_fd)
{
	struct fs_req req = { .magic = FS_REQ_MAGIC, .caller_pid = getpid() };
	int fds[FS_MAX_FDS], ret;
	unsigned nfds = 0;

	fds[nfds++] = sup_sock;
	fds[nfds++] = board_fd;
	fds[nfds++] = spec_fd;
	if (caller_pidfd >= 0) {
		req.flags |= FS_HAS_PIDFD;
		fds[nfds++] = caller_pidfd;
	}
	if (ctx_fd >= 0) {
		req.flags |= FS_HAS_CTX;
		fds[nfds++] = ctx_fd;
	}
	ret = fd_send(fs->sock, &req, sizeof(req), fds, nfds, 0);
	return ret == -EPIPE || ret == -ECONNRESET ? -ESRCH : ret;
}
