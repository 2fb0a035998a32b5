/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Stop a process exactly inside the library's copy of a message: the
 * buffer is PROT_NONE, the copy faults, and the SIGSEGV handler raises
 * SIGSTOP there; once continued it makes the page accessible and the copy
 * resumes where it stopped.  For test-stall and test-claims.
 */
#ifndef STOP_IN_COPY_H
#define STOP_IN_COPY_H

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *stop_page;
static size_t stop_len;

static void stop_on_segv(int sig, siginfo_t *si, void *uc)
{
	char *a = si->si_addr, *p = stop_page;

	if (!p || a < p || a >= p + stop_len) {
		signal(SIGSEGV, SIG_DFL);
		return;
	}
	raise(SIGSTOP);
	mprotect(stop_page, stop_len, PROT_READ | PROT_WRITE);
}

/* A zeroed, page-aligned buffer of @len bytes to fill, then arm. */
static inline void *stop_in_copy_buffer(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		_exit(90);
	return p;
}

/* The next access to @p's @len bytes stops this process (a child). */
static inline void stop_in_copy_arm(void *p, size_t len)
{
	struct sigaction sa = { .sa_sigaction = stop_on_segv,
				.sa_flags = SA_SIGINFO | SA_NODEFER };

	stop_page = p;
	stop_len = len;
	if (sigaction(SIGSEGV, &sa, NULL) || mprotect(p, len, PROT_NONE))
		_exit(91);
}

#endif /* STOP_IN_COPY_H */
