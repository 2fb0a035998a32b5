// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * sync.c - events and barriers on futex words, process-shared when they
 * sit in shared memory.
 */
#include <errno.h>

#include "tshm-private.h"

#define EVENT_MAGIC	0x56455354U	/* "TSEV" */
#define BARRIER_MAGIC	0x52425354U	/* "TSBR" */
#define SYNC_SPINS	2000

/*
 * Event word: bit 0 set, bit 1 sleepers (only while unset), bits 2..31 the
 * number of sets so far.  A waiter returns once the event is set or the
 * count moved since it began: a set followed at once by a reset still
 * releases everyone who was waiting (the pulse is not lost), since a woken
 * waiter sees the count even when it finds the event unset again.
 */
#define EV_SET		1U
#define EV_WAITERS	2U
#define EV_GEN(w)	((w) >> 2)
#define EV_NEXT		4U

struct event {
	_Atomic uint32_t word;
	uint32_t magic;
	uint32_t __pad[2];
};

/* word: generation << 16 | members arrived in this generation */
struct barrier {
	_Atomic uint32_t word;
	uint32_t count;
	uint32_t magic;
	uint32_t __pad;
};

_Static_assert(sizeof(struct event) == sizeof(struct tshm_event),
	       "struct tshm_event size");
_Static_assert(sizeof(struct barrier) == sizeof(struct tshm_barrier),
	       "struct tshm_barrier size");

static struct event *to_event(struct tshm_event *ev)
{
	struct event *e = (struct event *)ev;

	return e && e->magic == EVENT_MAGIC ? e : NULL;
}

TSHM_EXPORT
int tshm_event_init(struct tshm_event *ev)
{
	struct event *e = (struct event *)ev;

	if (!e)
		return -EINVAL;
	atomic_store(&e->word, 0);
	e->__pad[0] = e->__pad[1] = 0;
	atomic_thread_fence(memory_order_release);
	e->magic = EVENT_MAGIC;
	return 0;
}

TSHM_EXPORT
int tshm_event_set(struct tshm_event *ev)
{
	struct event *e = to_event(ev);
	uint32_t w;

	if (!e)
		return -EINVAL;
	w = atomic_load(&e->word);
	do {
		if (w & EV_SET)
			return 0;
	} while (!atomic_compare_exchange_weak(&e->word, &w,
					       ((w & ~EV_WAITERS) + EV_NEXT) |
					       EV_SET));
	if (w & EV_WAITERS)
		futex_wake_all(&e->word);
	return 0;
}

TSHM_EXPORT
int tshm_event_reset(struct tshm_event *ev)
{
	struct event *e = to_event(ev);

	if (!e)
		return -EINVAL;
	atomic_fetch_and(&e->word, ~EV_SET);
	return 0;
}

TSHM_EXPORT
int tshm_event_is_set(struct tshm_event *ev)
{
	struct event *e = to_event(ev);

	if (!e)
		return -EINVAL;
	return atomic_load(&e->word) & EV_SET;
}

TSHM_EXPORT
int tshm_event_wait(struct tshm_event *ev, int timeout_ms)
{
	struct event *e = to_event(ev);
	struct deadline dl;
	uint32_t w, gen;
	int i, ret;

	if (!e)
		return -EINVAL;
	w = atomic_load_explicit(&e->word, memory_order_acquire);
	gen = EV_GEN(w);
	for (i = 0; i < SYNC_SPINS; i++) {
		if ((w & EV_SET) || EV_GEN(w) != gen)
			return 0;
		cpu_relax();
		w = atomic_load_explicit(&e->word, memory_order_acquire);
	}
	deadline_init(&dl, timeout_ms);
	for (;;) {
		w = atomic_load(&e->word);
		if ((w & EV_SET) || EV_GEN(w) != gen)
			return 0;
		if (dl.nowait)
			return -EAGAIN;
		if (!(w & EV_WAITERS) &&
		    !atomic_compare_exchange_strong(&e->word, &w,
						    w | EV_WAITERS))
			continue;
		ret = futex_wait_until(&e->word, w | EV_WAITERS, &dl);
		if (ret < 0) {
			w = atomic_load(&e->word);
			if ((w & EV_SET) || EV_GEN(w) != gen)
				return 0;
			return ret;
		}
	}
}

TSHM_EXPORT
int tshm_barrier_init(struct tshm_barrier *b, unsigned count)
{
	struct barrier *br = (struct barrier *)b;

	if (!br || count < 1 || count > 0xffff)
		return -EINVAL;
	atomic_store(&br->word, 0);
	br->count = count;
	br->__pad = 0;
	atomic_thread_fence(memory_order_release);
	br->magic = BARRIER_MAGIC;
	return 0;
}

TSHM_EXPORT
int tshm_barrier_wait(struct tshm_barrier *b, int timeout_ms)
{
	struct barrier *br = (struct barrier *)b;
	struct deadline dl;
	uint32_t w, gen, count;
	bool last;
	int i, ret;

	if (!br || br->magic != BARRIER_MAGIC)
		return -EINVAL;
	count = br->count;
	if (count < 1 || count > 0xffff)
		return -EINVAL;
	/*
	 * Arrive, or (last in) open the next generation, in one atomic step:
	 * a member withdrawing at its timeout can then never be counted by
	 * a generation that completes (a fetch_add and a later store would
	 * leave that window open).
	 */
	w = atomic_load(&br->word);
	do {
		gen = w >> 16;
		last = (w & 0xffff) + 1 >= count;
	} while (!atomic_compare_exchange_weak(&br->word, &w,
			last ? ((gen + 1) & 0xffff) << 16 : w + 1));
	if (last) {
		futex_wake_all(&br->word);
		return 1;
	}
	for (i = 0; i < SYNC_SPINS; i++) {
		if ((atomic_load_explicit(&br->word, memory_order_acquire) >>
		     16) != gen)
			return 0;
		cpu_relax();
	}
	deadline_init(&dl, timeout_ms);
	for (;;) {
		w = atomic_load(&br->word);
		if ((w >> 16) != gen)
			return 0;
		ret = dl.nowait ? -EAGAIN : futex_wait_until(&br->word, w, &dl);
		if (ret < 0) {
			/* Withdraw, unless the generation completed. */
			w = atomic_load(&br->word);
			while ((w >> 16) == gen) {
				if (atomic_compare_exchange_weak(&br->word, &w,
								 w - 1))
					return ret == -EINTR ? ret :
						deadline_err(&dl);
			}
			return 0;
		}
	}
}
