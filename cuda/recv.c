// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * Receiving a GPU buffer on a channel: the queue message (with, for VMM,
 * the allocation's fd), its framing, then the description's checks and
 * the receiver buffer (pack.c), which holds its own reference on the
 * message's lease until it is unref'd.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda-private.h"

int tshm_cuda_recv(struct tshm_cuda_chan *ch, struct tshm_cuda *cu,
		   struct tshm_cuda_buf **out, void *msg, size_t cap,
		   size_t *lenp, int timeout_ms)
{
	size_t wlen, got = 0;
	union tcu_wire_buf stack;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs = TSHM_QUEUE_MAX_SEGS, i;
	int fds[TSHM_QUEUE_MAX_FDS];
	unsigned nfds = TSHM_QUEUE_MAX_FDS;
	struct tcu_wire *w;
	int ret;

	if (!ch || !cu || !out || (cap && !msg))
		return -EINVAL;
	*out = NULL;
	wlen = sizeof(*w) + ch->max_msg;
	w = tcu_wire_buf(&stack, wlen);
	if (!w)
		return -ENOMEM;
	ret = tshm_queue_recv_fds(ch->q, w, wlen, &got, segs, &nsegs, fds,
				  &nfds, timeout_ms);
	if (ret)
		goto out_free;
	/* a description with the payload after it, and at most one fd */
	if (got < sizeof(*w) || got != sizeof(*w) + w->len || nfds > 1) {
		tcu_err("not a tshm-cuda message (%zu bytes, %u segments, "
			"%u fds)", got, nsegs, nfds);
		ret = -EBADMSG;
		goto out_segs;
	}
	ret = tcu_desc_check(w, "message", segs, nsegs, nfds ? fds[0] : -1);
	if (ret)
		goto out_segs;
	if (w->len > cap) {
		tcu_err("payload of %u bytes, room for %zu", w->len, cap);
		ret = -EMSGSIZE;
		if (lenp)
			*lenp = w->len;
		goto out_segs;
	}
	ret = tcu_desc_import(cu, w, segs, nfds ? fds[0] : -1, out);
	if (ret)
		goto out_segs;
	if (w->len)
		memcpy(msg, w + 1, w->len);
	if (lenp)
		*lenp = w->len;

out_segs:
	/* the receiver buffer took its own references; the import its own */
	for (i = 0; i < nfds; i++)
		close(fds[i]);
	for (i = 0; i < nsegs; i++)
		tshm_seg_unref(segs[i]);
out_free:
	tcu_wire_buf_free(&stack, w);
	return ret;
}
