// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * Receiving a GPU buffer: the queue message (with, for VMM, the
 * allocation's fd), the checks, the import or cache hit (cache.c), and a
 * receiver buffer that holds the message's lease until it is unref'd.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda-private.h"

/* A message this library sent, whole and self-consistent. */
static bool wire_ok(const struct tcu_wire *w, size_t got,
		    struct tshm_seg **segs, unsigned nsegs)
{
	const struct tcu_anchor *an;

	if (got < sizeof(*w) || w->magic != TCU_WIRE_MAGIC ||
	    got != sizeof(*w) + w->len || w->nsegs != nsegs)
		return false;
	if (w->kind == TSHM_CUDA_VMM && nsegs != 2)
		return false;
	if (w->kind == TSHM_CUDA_LEGACY && nsegs != 1)
		return false;
	if (w->kind != TSHM_CUDA_VMM && w->kind != TSHM_CUDA_LEGACY)
		return false;
	if (!w->size || w->size > w->alloc_size ||
	    w->off > w->alloc_size - w->size)
		return false;
	if (w->kind == TSHM_CUDA_LEGACY)
		return true;
	/* the anchor is the allocation's */
	an = tshm_seg_data(segs[1]);
	return tshm_seg_size(segs[1]) >= sizeof(*an) &&
		an->magic == TCU_ANCHOR_MAGIC && an->alloc_id == w->alloc_id;
}

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
	struct tshm_cuda_buf *b = NULL;
	struct tcu_import *imp;
	struct tcu_wire *w;
	int ret, fd = -1;

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
	if (nfds == 1)
		fd = fds[0];
	if (!wire_ok(w, got, segs, nsegs) ||
	    nfds != (w->kind == TSHM_CUDA_VMM ? 1U : 0U)) {
		tcu_err("not a tshm-cuda message (%zu bytes, %u segments, "
			"%u fds)", got, nsegs, nfds);
		for (i = 0; i < nfds; i++)
			close(fds[i]);
		fd = -1;
		ret = -EBADMSG;
		goto out_segs;
	}
	if (w->len > cap) {
		tcu_err("payload of %u bytes, room for %zu", w->len, cap);
		ret = -EMSGSIZE;
		if (lenp)
			*lenp = w->len;
		goto out_segs;
	}
	ret = tshm_cuda_check_uuid(cu, w->uuid);
	if (ret)
		goto out_segs;
	if (w->kind == TSHM_CUDA_VMM &&
	    (!cu->gran || w->alloc_size % cu->gran)) {
		tcu_err("allocation of %llu bytes cannot be mapped here "
			"(granularity %zu)", (unsigned long long)w->alloc_size,
			cu->gran);
		ret = -EBADMSG;
		goto out_segs;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		ret = -ENOMEM;
		goto out_segs;
	}
	ret = tcu_import_get(cu, w, fd, w->kind == TSHM_CUDA_VMM ? segs[1] :
			     NULL, &imp);
	if (ret)
		goto out_segs;

	b->refs = 1;
	b->cu = cu;
	b->kind = w->kind;
	b->id = w->id;
	b->size = w->size;
	b->off = w->off;
	b->imp = imp;
	b->ptr = imp->base + w->off;
	b->lease = segs[0];
	segs[0] = NULL;
	if (w->len)
		memcpy(msg, w + 1, w->len);
	if (lenp)
		*lenp = w->len;
	*out = b;
	b = NULL;
	ret = 0;

out_segs:
	free(b);
	if (fd >= 0)
		close(fd);
	for (i = 0; i < nsegs; i++)
		if (segs[i])
			tshm_seg_unref(segs[i]);
out_free:
	tcu_wire_buf_free(&stack, w);
	return ret;
}
