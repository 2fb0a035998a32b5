// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * rlock.c - the robust lock of shared memory (rlock.h): trylock, then
 * sleeps in slices on a sequence word that every unlock moves.  A queue's
 * segment lock is one (queue-wait.c).
 */
#include <errno.h>

#include "futex.h"
#include "rlock.h"

int rlock_init(struct rlock *l)
{
	pthread_mutexattr_t attr;
	int ret;

	pthread_mutexattr_init(&attr);
	pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
	ret = pthread_mutex_init(&l->mutex, &attr);
	pthread_mutexattr_destroy(&attr);
	atomic_init(&l->seq, 0);
	atomic_init(&l->wait, 0);
	return -ret;
}

int rlock_lock(struct rlock *l, const struct deadline *dl)
{
	uint32_t seen;
	unsigned i;
	int ret;

	for (i = 0;; i++) {
		seen = atomic_load(&l->seq);
		ret = rlock_trylock(l);
		if (__builtin_expect(ret != -EBUSY, 1))
			return ret;	/* locked (0, 1) or the mutex's error */
		if (i < RLOCK_SPINS) {
			cpu_relax();
			continue;
		}
		if (deadline_expired(dl))
			return deadline_err(dl);
		atomic_store(&l->wait, 1);
		if (atomic_load(&l->seq) != seen)
			continue;
		ret = futex_wait_slice(&l->seq, seen, dl);
		if (ret == -EINTR)
			return ret;
	}
}

int rlock_trylock(struct rlock *l)
{
	int ret = pthread_mutex_trylock(&l->mutex);

	if (__builtin_expect(ret == 0, 1))
		return 0;
	if (ret == EOWNERDEAD) {
		pthread_mutex_consistent(&l->mutex);
		return 1;
	}
	return ret == EBUSY ? -EBUSY : -ret;
}

void rlock_unlock(struct rlock *l)
{
	pthread_mutex_unlock(&l->mutex);
	atomic_fetch_add(&l->seq, 1);
	if (atomic_load(&l->wait) && atomic_exchange(&l->wait, 0))
		futex_wake_all(&l->seq);
}
