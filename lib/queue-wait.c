// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * queue-wait.c - the segment lock and every sleep of a queue: a robust
 * process-shared mutex taken by trylock and sliced sleeps (so that
 * timeouts and signals are honoured and a dead holder is noticed), the
 * futex words senders and receivers sleep on, the eventfd of
 * tshm_queue_fd(), and the thread ids that slot claims carry.
 * Documentation/lib/queue.rst has the argument.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "queue.h"

/* A published message or a close: ring the eventfd if a poller armed it. */
void q_poll_wake(struct tshm_queue *q, bool force)
{
	uint64_t one = 1;

	if (force || (atomic_load(&q->hdr->pollwait) &&
		      atomic_exchange(&q->hdr->pollwait, 0))) {
		if (write(q->efd, &one, sizeof(one)) < 0) {
			/* Saturated: it is readable anyway. */
		}
	}
}

/* Under the lock, the ring found empty: make the next publish ring. */
void q_poll_arm(struct tshm_queue *q)
{
	uint64_t v;

	if (read(q->efd, &v, sizeof(v)) < 0) {
		/* Nothing pending. */
	}
	atomic_store(&q->hdr->pollwait, 1);
}

/*
 * The segment lock is the library's robust lock (rlock.c).  A holder that
 * died inside send or recv leaves the ring consistent: its changes commit
 * with one store to a slot's state word, and nothing it wrote past it is
 * visible.
 */
int q_lock(struct tshm_queue *q, const struct deadline *dl)
{
	return rlock_lock(&q->hdr->lock, dl);
}

/* 0 locked, 1 locked after a dead holder, -EBUSY: never waits. */
int q_trylock(struct tshm_queue *q)
{
	return rlock_trylock(&q->hdr->lock);
}

/*
 * The calling thread's id, as slot claims carry it.  Cached per thread; a
 * forked child's only thread has a new id, hence the atfork reset.
 */
static __thread uint32_t q_tid_cache;
static pthread_once_t q_tid_once = PTHREAD_ONCE_INIT;
/* This process's pid namespace, +1 (0: not looked up since the fork). */
static _Atomic uint64_t q_pidns_cache;

static void q_tid_forget(void)
{
	q_tid_cache = 0;
	atomic_store_explicit(&q_pidns_cache, 0, memory_order_relaxed);
}

static void q_tid_init(void)
{
	pthread_atfork(NULL, NULL, q_tid_forget);
}

uint32_t q_tid(void)
{
	if (unlikely(!q_tid_cache)) {
		pthread_once(&q_tid_once, q_tid_init);
		q_tid_cache = (uint32_t)gettid() & QS_TID_MASK;
	}
	return q_tid_cache;
}

/*
 * The calling process's pid namespace: the inode of /proc/self/ns/pid, or
 * 0 where that cannot be read (no /proc: the check is then skipped).
 * Looked up once per process; the atfork reset covers a child forked
 * into a new namespace after unshare(CLONE_NEWPID).
 */
uint64_t q_pidns(void)
{
	uint64_t v = atomic_load_explicit(&q_pidns_cache, memory_order_relaxed);
	struct stat st;

	if (likely(v))
		return v - 1;
	pthread_once(&q_tid_once, q_tid_init);
	v = stat("/proc/self/ns/pid", &st) ? 0 : (uint64_t)st.st_ino;
	atomic_store_explicit(&q_pidns_cache, v + 1, memory_order_relaxed);
	return v;
}

/* Whether /proc says thread @tid is a zombie (exited, not yet reaped). */
static bool q_tid_zombie(uint32_t tid)
{
	char path[40], buf[512], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%u/stat", tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	/* "tid (comm) S ...": comm may hold ')' itself, so take the last. */
	p = strrchr(buf, ')');
	return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/*
 * Has thread @tid exited?  Only "yes" is acted on (a claim it left is
 * freed).  ESRCH, or a zombie (killed, not yet reaped by its parent: it
 * runs no more code), is "yes"; any other error or a reused id counts as
 * alive: the slot then stays passed over, which costs capacity, never a
 * torn message.  Asked only where a claim is already suspect, never on
 * the fast path.  Meaningful because every participant shares one pid
 * namespace (q_pidns()).
 */
bool q_tid_gone(uint32_t tid)
{
	if (!tid)
		return true;
	if (kill((pid_t)tid, 0) < 0)
		return errno == ESRCH;
	return q_tid_zombie(tid);
}

void q_wake(_Atomic uint32_t *word, _Atomic uint32_t *waiters,
		   bool force)
{
	atomic_fetch_add(word, 1);
	if (force || (atomic_load(waiters) && atomic_exchange(waiters, 0)))
		futex_wake_all(word);
}

void q_unlock(struct tshm_queue *q, bool recovered)
{
	rlock_unlock(&q->hdr->lock);
	if (unlikely(recovered)) {
		/* The dead holder may have owed someone a wake-up. */
		q_wake(&q->hdr->pub, &q->hdr->rwait, true);
		q_wake(&q->hdr->con, &q->hdr->swait, true);
	}
}

/*
 * Wait until *@word moves from @seen, or for one sleep slice: 0 (the caller
 * re-checks the ring), -EAGAIN / -ETIMEDOUT, -EINTR.  The slice is what
 * makes a waker that died between its commit and its wake-up harmless.
 */
int q_wait(struct tshm_queue *q, _Atomic uint32_t *word, uint32_t seen,
		  _Atomic uint32_t *waiters, const struct deadline *dl)
{
	int64_t until, t;
	unsigned i = 0;

	if (dl->nowait)
		return -EAGAIN;
	if (q->wait != TSHM_WAIT_FUTEX) {
		until = dl->ns;
		if (q->wait == TSHM_WAIT_ADAPTIVE) {
			t = now_ns() + (int64_t)q->spin_us * 1000;
			if (t < until)
				until = t;
		}
		for (;;) {
			if (atomic_load_explicit(word, memory_order_acquire) !=
			    seen)
				return 0;
			cpu_relax();
			if ((++i & 127) == 0) {
				t = now_ns();
				if (t >= dl->ns)
					return -ETIMEDOUT;
				if (t >= until)
					break;
			}
		}
	}
	atomic_store(waiters, 1);
	if (atomic_load(word) != seen)
		return 0;
	return futex_wait_slice(word, seen, dl);
}

