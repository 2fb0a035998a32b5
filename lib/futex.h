/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * futex.h - sleeps against a deadline (futex.c).  Nothing here is ABI.
 */
#ifndef _TSHM_FUTEX_H
#define _TSHM_FUTEX_H

#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "deadline.h"

/*
 * Sleeps.  Each returns 0 when woken, the value changed or a signal came
 * (the caller re-checks), -ETIMEDOUT at @dl, and -EINTR for a signal when
 * the thread asked for it (tshm_thread_set_intr()).
 */
bool intr_enabled(void);
/* Set this thread's choice; returns the old one. */
bool intr_set(bool on);
int futex_wait_until(_Atomic uint32_t *word, uint32_t val,
		     const struct deadline *dl);
/*
 * The same, but never longer than TSHM_SLEEP_SLICE_MS (then 0): a sleep
 * whose waker may have died re-checks what it waits for by itself.
 */
#define TSHM_SLEEP_SLICE_MS	100
int futex_wait_slice(_Atomic uint32_t *word, uint32_t val,
		     const struct deadline *dl);
void futex_wake_all(_Atomic uint32_t *word);
/* poll() until @dl: ready count, 0 (timeout or restart) or -errno. */
int wait_poll(struct pollfd *pfd, unsigned n, const struct deadline *dl);

/* Process-local lock with deadline- and signal-aware waits. */
struct tlock {
	_Atomic uint32_t word;
};
#define TLOCK_INIT	{ 0 }
/* 0, -EAGAIN / -ETIMEDOUT at @dl, or -EINTR. */
int tlock_lock(struct tlock *l, const struct deadline *dl);
void tlock_unlock(struct tlock *l);

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

#endif /* _TSHM_FUTEX_H */
