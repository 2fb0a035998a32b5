// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * deadline.c - the one notion of time of every timed wait: an absolute
 * CLOCK_MONOTONIC deadline taken once from the caller's timeout in
 * milliseconds, so that retries and restarts never stretch it.
 */
#include <errno.h>
#include <limits.h>
#include <time.h>

#include "deadline.h"

int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void deadline_init(struct deadline *dl, int timeout_ms)
{
	dl->nowait = timeout_ms == 0;
	if (timeout_ms < 0)
		dl->ns = INT64_MAX;
	else
		dl->ns = now_ns() + (int64_t)timeout_ms * 1000000;
}

bool deadline_expired(const struct deadline *dl)
{
	if (dl->nowait)
		return true;
	return dl->ns != INT64_MAX && now_ns() >= dl->ns;
}

int deadline_poll_ms(const struct deadline *dl)
{
	int64_t left;

	if (dl->nowait)
		return 0;
	if (dl->ns == INT64_MAX)
		return -1;
	left = dl->ns - now_ns();
	if (left <= 0)
		return 0;
	/* Round up so that poll() does not return just before the deadline. */
	left = (left + 999999) / 1000000;
	return left > INT_MAX ? INT_MAX : (int)left;
}

int deadline_err(const struct deadline *dl)
{
	return dl->nowait ? -EAGAIN : -ETIMEDOUT;
}
