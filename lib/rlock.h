/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * rlock.h - a robust, process-shared lock in shared memory whose waits
 * honour a deadline and tshm_thread_set_intr() (rlock.c).  Nothing here is
 * ABI.
 */
#ifndef _TSHM_RLOCK_H
#define _TSHM_RLOCK_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "deadline.h"

/*
 * @mutex is robust and process-shared.  Waiters sleep on @seq, which moves
 * at every unlock; @wait is set by a sleeper and cleared by the unlocker
 * that wakes it.  The sleeps are sliced, so a holder that dies (no unlock,
 * no wake) is noticed by the next trylock (EOWNERDEAD) within a slice, and
 * one that is stopped costs the others no more than their timeout.
 */
struct rlock {
	pthread_mutex_t mutex;
	_Atomic uint32_t seq;
	_Atomic uint32_t wait;
};

/* Trylocks before the first sleep. */
#define RLOCK_SPINS	64

/* 0 or -errno. */
int rlock_init(struct rlock *l);
/*
 * 0 locked, 1 locked after a dead holder (made consistent: the caller
 * repairs what it protects), -EAGAIN / -ETIMEDOUT at @dl, -EINTR, or the
 * mutex's error.  Never pthread_mutex_lock(): its wait honours neither a
 * deadline nor a signal, and the holder may be a stopped process.
 */
int rlock_lock(struct rlock *l, const struct deadline *dl);
void rlock_unlock(struct rlock *l);

/* 0 locked, 1 locked after a dead holder, -EBUSY: never waits. */
int rlock_trylock(struct rlock *l);

#endif /* _TSHM_RLOCK_H */
