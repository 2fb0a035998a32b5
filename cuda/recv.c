// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * Receiving a GPU buffer: the queue message (and, for VMM, its fd
 * datagram) under the consumers' lock, then outside it the checks, the
 * import or cache hit (cache.c), and a receiver buffer that holds the
 * message's lease until it is unref'd.
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
	struct deadline dl;
	union tcu_wire_buf stack;
	struct tshm_seg *segs[TSHM_QUEUE_MAX_SEGS];
	unsigned nsegs = TSHM_QUEUE_MAX_SEGS, i;
	struct tshm_cuda_buf *b = NULL;
	struct tcu_import *imp;
	struct tcu_wire *w;
	int ret, fd = -1;

	if (!ch || !cu || !out || (cap && !msg))
		return -EINVAL;
	*out = NULL;
	deadline_init(&dl, timeout_ms);
	wlen = sizeof(*w) + ch->max_msg;
	w = tcu_wire_buf(&stack, wlen);
	if (!w)
		return -ENOMEM;
	/* A dead holder (1): its orphan datagram is skipped by seq. */
	ret = rlock_lock(&ch->sh->recv_lock, &dl);
	if (ret < 0)
		goto out_free;
	ret = tshm_queue_recv(ch->q, w, wlen, &got, segs, &nsegs,
			      deadline_poll_ms(&dl));
	if (ret) {
		rlock_unlock(&ch->sh->recv_lock);
		goto out_free;
	}
	if (!wire_ok(w, got, segs, nsegs)) {
		rlock_unlock(&ch->sh->recv_lock);
		tcu_err("not a tshm-cuda message (%zu bytes, %u segments)",
			got, nsegs);
		ret = -EBADMSG;
		goto out_segs;
	}
	if (w->kind == TSHM_CUDA_VMM)
		ret = tcu_take_fd(ch->sock[1], w->seq, w->alloc_id, &fd);
	rlock_unlock(&ch->sh->recv_lock);
	if (ret)
		goto out_segs;
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
