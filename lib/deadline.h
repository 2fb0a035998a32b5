/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * deadline.h - timed waits (deadline.c).  Nothing here is ABI.
 */
#ifndef _TSHM_DEADLINE_H
#define _TSHM_DEADLINE_H

#include <stdbool.h>
#include <stdint.h>

struct deadline {
	int64_t ns;	/* CLOCK_MONOTONIC, or INT64_MAX for ever */
	bool nowait;
};

int64_t now_ns(void);
/* @timeout_ms: <0 for ever, 0 do not wait, else milliseconds from now. */
void deadline_init(struct deadline *dl, int timeout_ms);
/* Milliseconds left for poll(): -1 for ever, 0 expired. */
int deadline_poll_ms(const struct deadline *dl);
bool deadline_expired(const struct deadline *dl);
/* -EAGAIN for a zero timeout, -ETIMEDOUT otherwise. */
int deadline_err(const struct deadline *dl);

#endif /* _TSHM_DEADLINE_H */
