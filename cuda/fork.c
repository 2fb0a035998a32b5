// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * libtshm-cuda across fork(), as libtshm's lib/fork.c: the process-local
 * locks of every device handle (its import cache) and pool are taken
 * before fork() and released in the parent, made afresh in the child.
 *
 * Order: a device's lock is held while libtshm's locks are taken (dropping
 * an import unrefs its anchor segment), so ours must be taken first.
 * pthread_atfork() runs prepare handlers in the reverse order of their
 * registration: ours are registered after libtshm's, which opening a
 * context registers (tcu_fork_init() opens one if none was yet).  The
 * process-shared channel locks need nothing (their holder is a thread of
 * the parent, which releases them).
 */
#include "cuda-private.h"

static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static struct tcu_fork_node *fork_list;

static void fork_prepare(void)
{
	struct tcu_fork_node *n;

	pthread_mutex_lock(&fork_lock);
	for (n = fork_list; n; n = n->next)
		pthread_mutex_lock(n->lock);
}

static void fork_release(bool child)
{
	struct tcu_fork_node *n;

	for (n = fork_list; n; n = n->next) {
		if (child)
			pthread_mutex_init(n->lock, NULL);
		else
			pthread_mutex_unlock(n->lock);
	}
	if (child)
		pthread_mutex_init(&fork_lock, NULL);
	else
		pthread_mutex_unlock(&fork_lock);
}

static void fork_parent(void)
{
	fork_release(false);
}

static void fork_child(void)
{
	fork_release(true);
}

static void fork_init(void)
{
	struct tshm_ctx *ctx;

	/* libtshm's handlers first (see above). */
	if (tshm_ctx_open(&ctx, TSHM_CTX_MEMFD) == 0)
		tshm_ctx_close(ctx);
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void tcu_fork_register(struct tcu_fork_node *n, pthread_mutex_t *lock)
{
	pthread_once(&fork_once, fork_init);
	pthread_mutex_lock(&fork_lock);
	n->lock = lock;
	n->prev = NULL;
	n->next = fork_list;
	if (n->next)
		n->next->prev = n;
	fork_list = n;
	pthread_mutex_unlock(&fork_lock);
}

void tcu_fork_unregister(struct tcu_fork_node *n)
{
	pthread_mutex_lock(&fork_lock);
	if (n->prev)
		n->prev->next = n->next;
	else
		fork_list = n->next;
	if (n->next)
		n->next->prev = n->prev;
	pthread_mutex_unlock(&fork_lock);
}
