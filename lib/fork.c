// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * fork.c - the library across fork().
 *
 * fork() copies one thread.  A lock that another thread held at that
 * moment stays held for ever in the child, and whatever it protected may be
 * half-changed.  So every process-local lock of the library is taken before
 * fork() (pthread_atfork's prepare) and released in the parent, and made
 * afresh in the child, where the data it protects is then consistent.
 *
 * Objects that own such locks (contexts, pools) register a fork_node here.
 * Levels give the order in which the locks are taken, which is the order in
 * which the library nests them: a pool's lock before its context's lock,
 * a context's lock before its queue list lock and its segments' lease
 * locks.  @fork_lock, taken first, also protects the lists.
 *
 * Process-shared locks (a queue's segment lock) need nothing: their holder
 * is a thread of the parent, which goes on and releases them.  Locks a thread
 * sleeps under (a pool's sleeper lock) are not taken, since fork() would
 * wait for that sleep; in the child they are made afresh, as nothing in
 * the child sleeps under them.
 */
#include <pthread.h>

#include "tshm-private.h"

static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static struct fork_node *fork_list[FORK_LEVELS];

static void fork_prepare(void)
{
	struct fork_node *n;
	int level;

	pthread_mutex_lock(&fork_lock);
	spawn_fork_prepare();
	for (level = 0; level < FORK_LEVELS; level++)
		for (n = fork_list[level]; n; n = n->next)
			n->prepare(n);
}

static void fork_release(bool child)
{
	struct fork_node *n;
	int level;

	for (level = FORK_LEVELS - 1; level >= 0; level--)
		for (n = fork_list[level]; n; n = n->next)
			n->release(n, child);
	spawn_fork_release(child);
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
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

void fork_register(struct fork_node *n, enum fork_level level)
{
	pthread_once(&fork_once, fork_init);
	pthread_mutex_lock(&fork_lock);
	n->level = level;
	n->prev = NULL;
	n->next = fork_list[level];
	if (n->next)
		n->next->prev = n;
	fork_list[level] = n;
	pthread_mutex_unlock(&fork_lock);
}

void fork_unregister(struct fork_node *n)
{
	pthread_mutex_lock(&fork_lock);
	if (n->prev)
		n->prev->next = n->next;
	else
		fork_list[n->level] = n->next;
	if (n->next)
		n->next->prev = n->prev;
	pthread_mutex_unlock(&fork_lock);
}
