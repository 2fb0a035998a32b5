// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * Channels: a tshm queue whose messages carry the buffer's description
 * (pack.c) with the payload after it, its lease and anchor segments, and
 * for VMM allocations the exported fd (tshm_queue_send_fds()).  While the
 * fd sits in the queue's socket the kernel holds it, so the memory
 * survives the producer freeing its copy, or exiting, before a consumer
 * receives.  The queue keeps the fd with its message (libtshm's ordering
 * and its SIGKILL argument, Documentation/lib/queue.rst); the channel adds
 * no lock and no socket.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda-private.h"

#define CHAN_MAX_MSG	(1U << 20)

int tshm_cuda_chan_create(struct tshm_ctx *ctx, unsigned capacity,
			  size_t max_msg, struct tshm_cuda_chan **out)
{
	struct tshm_cuda_chan *ch;
	int ret;

	if (!out || !ctx)
		return -EINVAL;
	*out = NULL;
	if (max_msg > CHAN_MAX_MSG) {
		tcu_err("max_msg %zu is over %u bytes", max_msg, CHAN_MAX_MSG);
		return -EINVAL;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	ch->max_msg = max_msg;
	ret = tshm_queue_create(ctx, capacity,
				sizeof(struct tcu_wire) + max_msg, &ch->q);
	if (ret) {
		free(ch);
		return ret;
	}
	*out = ch;
	return 0;
}

int tshm_cuda_chan_close(struct tshm_cuda_chan *ch)
{
	return tshm_queue_close(ch->q);
}

struct tshm_queue *tshm_cuda_chan_queue(struct tshm_cuda_chan *ch)
{
	return ch->q;
}

void tshm_cuda_chan_destroy(struct tshm_cuda_chan *ch)
{
	if (!ch)
		return;
	tshm_queue_unref(ch->q);
	free(ch);
}

int tshm_cuda_send(struct tshm_cuda_chan *ch, struct tshm_cuda_buf *b,
		   const void *msg, size_t len, int timeout_ms)
{
	struct tshm_seg *segs[TSHM_CUDA_PACK_SEGS];
	union tcu_wire_buf stack;
	struct tcu_wire *w;
	unsigned nsegs;
	int ret, fd;

	if (!ch || !b || (len && !msg))
		return -EINVAL;
	if (len > ch->max_msg) {
		tcu_err("payload of %zu bytes, the channel takes %zu", len,
			ch->max_msg);
		return -EMSGSIZE;
	}
	w = tcu_wire_buf(&stack, sizeof(*w) + len);
	if (!w)
		return -ENOMEM;
	/* the description (pack.c), then the payload */
	ret = tcu_desc_fill(b, w, segs, &nsegs, &fd);
	if (ret)
		goto out;
	w->len = (uint32_t)len;
	if (len)
		memcpy(w + 1, msg, len);
	ret = tshm_queue_send_fds(ch->q, w, sizeof(*w) + len, segs, nsegs,
				  &fd, fd >= 0 ? 1 : 0, timeout_ms);
	if (ret && ret != -ETIMEDOUT && ret != -EAGAIN && ret != -EPIPE &&
	    ret != -EINTR)
		tcu_err("sending the buffer: %s", strerror(-ret));
out:
	tcu_wire_buf_free(&stack, w);
	return ret;
}
