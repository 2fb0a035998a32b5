// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * rlock.c - the robust lock of shared memory (rlock.h): trylock, then
 * sleeps in slices on a sequence word that every unlock moves.
 * Self-contained: libtshm-cuda builds it in too.
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

int robust_lock(pthread_mutex_t *m, _Atomic uint32_t *seq,
		_Atomic uint32_t *wait, const struct deadline *dl)
{
	uint32_t seen;
	unsigned i;
	int ret;

	for (i = 0;; i++) {
		seen = atomic_load(seq);
		ret = pthread_mutex_trylock(m);
		if (__builtin_expect(ret == 0, 1))
			return 0;
		if (ret == EOWNERDEAD) {
			pthread_mutex_consistent(m);
			return 1;
		}
		if (ret != EBUSY)
			return -ret;
		if (i < RLOCK_SPINS) {
			cpu_relax();
			continue;
		}
		if (deadline_expired(dl))
			return deadline_err(dl);
		atomic_store(wait, 1);
		if (atomic_load(seq) != seen)
			continue;
		ret = futex_wait_slice(seq, seen, dl);
		if (ret == -EINTR)
			return ret;
	}
}

void robust_unlock(pthread_mutex_t *m, _Atomic uint32_t *seq,
		   _Atomic uint32_t *wait)
{
	pthread_mutex_unlock(m);
	atomic_fetch_add(seq, 1);
	if (atomic_load(wait) && atomic_exchange(wait, 0))
		futex_wake_all(seq);
}

int rlock_lock(struct rlock *l, const struct deadline *dl)
{
	return robust_lock(&l->mutex, &l->seq, &l->wait, dl);
}

void rlock_unlock(struct rlock *l)
{
	robust_unlock(&l->mutex, &l->seq, &l->wait);
}
