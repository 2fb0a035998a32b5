// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * futex.c - every sleep of the library: futex waits against a deadline,
 * poll() against a deadline, and a process-local lock with deadline- and
 * signal-aware waits.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "futex.h"

/*
 * Whether this thread's blocking calls give -EINTR when a signal handler
 * ran while they slept (tshm_thread_set_intr()).  Every sleep goes through
 * futex_wait_until(), futex_wait_slice() or wait_poll(), which read it.
 */
static __thread bool thread_intr;

bool intr_set(bool on)
{
	bool old = thread_intr;

	thread_intr = on;
	return old;
}

bool intr_enabled(void)
{
	return thread_intr;
}

static int futex_wait_abs(_Atomic uint32_t *word, uint32_t val, int64_t ns)
{
	struct timespec ts, *tsp = NULL;
	long ret;

	if (ns != INT64_MAX) {
		ts.tv_sec = ns / 1000000000;
		ts.tv_nsec = ns % 1000000000;
		tsp = &ts;
	}
	/*
	 * FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline, so
	 * restarts after EINTR or spurious wake-ups need no arithmetic.  Not
	 * FUTEX_PRIVATE: the word may be in memory shared between processes.
	 */
	ret = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, val, tsp, NULL,
		      FUTEX_BITSET_MATCH_ANY);
	if (ret == 0)
		return 0;
	if (errno == ETIMEDOUT)
		return -ETIMEDOUT;
	if (errno == EINTR && thread_intr)
		return -EINTR;
	return 0;
}

int futex_wait_until(_Atomic uint32_t *word, uint32_t val,
		     const struct deadline *dl)
{
	if (dl->nowait)
		return -ETIMEDOUT;
	return futex_wait_abs(word, val, dl->ns);
}

int futex_wait_slice(_Atomic uint32_t *word, uint32_t val,
		     const struct deadline *dl)
{
	int64_t slice = now_ns() + (int64_t)TSHM_SLEEP_SLICE_MS * 1000000;
	int ret;

	if (dl->nowait)
		return -ETIMEDOUT;
	if (slice >= dl->ns)
		return futex_wait_abs(word, val, dl->ns);
	ret = futex_wait_abs(word, val, slice);
	return ret == -ETIMEDOUT ? 0 : ret;
}

int wait_poll(struct pollfd *pfd, unsigned n, const struct deadline *dl)
{
	int ret = poll(pfd, n, deadline_poll_ms(dl));

	if (ret >= 0)
		return ret;
	if (errno == EINTR)
		return thread_intr ? -EINTR : 0;
	return -errno;
}

/*
 * A process-local lock whose waits honour a deadline and
 * tshm_thread_set_intr() (pthread_mutex_timedlock() does neither for
 * signals).  Drepper's three-state futex mutex: 0 free, 1 locked, 2 locked
 * with sleepers.
 */
int tlock_lock(struct tlock *l, const struct deadline *dl)
{
	uint32_t c = 0;
	int ret;

	if (atomic_compare_exchange_strong(&l->word, &c, 1))
		return 0;
	if (c != 2)
		c = atomic_exchange(&l->word, 2);
	while (c != 0) {
		if (deadline_expired(dl))
			return deadline_err(dl);
		ret = futex_wait_until(&l->word, 2, dl);
		if (ret == -EINTR)
			return ret;
		c = atomic_exchange(&l->word, 2);
	}
	return 0;
}

void tlock_unlock(struct tlock *l)
{
	if (atomic_exchange(&l->word, 0) == 2)
		syscall(SYS_futex, &l->word, FUTEX_WAKE_PRIVATE, 1, NULL,
			NULL, 0);
}

void futex_wake_all(_Atomic uint32_t *word)
{
	syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
