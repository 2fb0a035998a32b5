// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * A buffer's description: what a receiver needs to map a producer's buffer
 * (struct tcu_wire without payload), the segments that travel with it (the
 * lease; for VMM the allocation's anchor) and, for VMM, the allocation's
 * exported fd.  Channels put it at the head of their messages (chan.c,
 * recv.c); tshm_cuda_buf_pack() and tshm_cuda_buf_unpack() let a program
 * carry it in messages of its own.  Either way it is built, checked and
 * turned into a receiver buffer here only.
 *
 * A description comes from another process: no field of it is trusted.
 * tcu_desc_check() ties it to the segments and fd it came with before
 * anything is imported, and no failure leaves a reference, an fd or an
 * import behind.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-private.h"

_Static_assert(sizeof(struct tcu_wire) <= TSHM_CUDA_DESC_SIZE,
	       "TSHM_CUDA_DESC_SIZE is smaller than a description");
_Static_assert(TSHM_CUDA_PACK_SEGS >= 2 &&
	       TSHM_CUDA_PACK_SEGS <= TSHM_QUEUE_MAX_SEGS,
	       "a VMM buffer travels with two segments");

int tcu_desc_fill(struct tshm_cuda_buf *b, struct tcu_wire *w,
		  struct tshm_seg **segs, unsigned *nsegs, int *fd)
{
	if (!b->producer) {
		tcu_err("a received GPU buffer cannot be sent on (forwarding "
			"is not supported); send the producer's buffer");
		return -EOPNOTSUPP;
	}
	memset(w, 0, sizeof(*w));
	w->magic = TCU_WIRE_MAGIC;
	w->kind = (uint8_t)b->kind;
	w->id = b->id;
	w->off = b->off;
	w->size = b->size;
	memcpy(w->uuid, b->cu->uuid.bytes, 16);
	segs[0] = b->lease;
	if (b->kind == TSHM_CUDA_VMM) {
		w->alloc_id = b->alloc->id;
		w->alloc_size = b->alloc->size;
		w->nsegs = 2;
		segs[1] = b->alloc->anchor;
		*fd = b->alloc->fd;
	} else {
		w->alloc_size = b->alloc_size;
		memcpy(w->ipc, b->ipc.reserved, CU_IPC_HANDLE_SIZE);
		w->nsegs = 1;
		*fd = -1;
	}
	*nsegs = w->nsegs;
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	while (n--)
		if (*p++)
			return false;
	return true;
}

#define BAD(what, fmt, ...) ({						\
		tcu_err("not a tshm-cuda %s: " fmt, what, ##__VA_ARGS__); \
		-EBADMSG;						\
	})

int tcu_desc_check(const struct tcu_wire *w, const char *what,
		   struct tshm_seg *const *segs, unsigned nsegs, int fd)
{
	const struct tcu_anchor *an;
	bool vmm = w->kind == TSHM_CUDA_VMM;
	unsigned want = vmm ? 2 : 1;

	if (w->magic != TCU_WIRE_MAGIC)
		return BAD(what, "magic %#x", w->magic);
	if (w->kind != TSHM_CUDA_VMM && w->kind != TSHM_CUDA_LEGACY)
		return BAD(what, "buffer kind %u", w->kind);
	if (w->pad || w->pad2)
		return BAD(what, "reserved fields set");
	if (w->nsegs != want || nsegs != want)
		return BAD(what, "%u segments with it, it names %u, a %s "
			   "buffer has %u", nsegs, w->nsegs,
			   vmm ? "VMM" : "legacy", want);
	if (vmm && fd < 0)
		return BAD(what, "a VMM buffer without its fd");
	if (!vmm && fd >= 0)
		return BAD(what, "a legacy buffer with an fd");
	if (!w->id)
		return BAD(what, "buffer id 0");
	if (!w->size || w->size > w->alloc_size ||
	    w->off > w->alloc_size - w->size)
		return BAD(what, "%llu bytes at %llu in an allocation of %llu",
			   (unsigned long long)w->size,
			   (unsigned long long)w->off,
			   (unsigned long long)w->alloc_size);
	if (!vmm) {
		if (w->alloc_id)
			return BAD(what, "a legacy buffer with an allocation "
				   "id");
		return 0;
	}
	if (!w->alloc_id || !all_zero(w->ipc, sizeof(w->ipc)))
		return BAD(what, "VMM allocation id 0 or an IPC handle");
	/* the anchor is the allocation's */
	if (tshm_seg_size(segs[1]) < sizeof(*an))
		return BAD(what, "its second segment is no anchor");
	an = tshm_seg_data(segs[1]);
	if (an->magic != TCU_ANCHOR_MAGIC)
		return BAD(what, "its second segment is no anchor");
	if (an->alloc_id != w->alloc_id)
		return BAD(what, "anchor of allocation %#llx with a buffer of "
			   "allocation %#llx",
			   (unsigned long long)an->alloc_id,
			   (unsigned long long)w->alloc_id);
	return 0;
}

int tcu_desc_import(struct tshm_cuda *cu, const struct tcu_wire *w,
		    struct tshm_seg *const *segs, int fd,
		    struct tshm_cuda_buf **out)
{
	struct tshm_cuda_buf *b;
	struct tcu_import *imp;
	int ret;

	ret = tshm_cuda_check_uuid(cu, w->uuid);
	if (ret)
		return ret;
	if (w->kind == TSHM_CUDA_VMM &&
	    (!cu->gran || w->alloc_size % cu->gran)) {
		tcu_err("allocation of %llu bytes cannot be mapped here "
			"(granularity %zu)", (unsigned long long)w->alloc_size,
			cu->gran);
		return -EBADMSG;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	ret = tcu_import_get(cu, w, fd, w->kind == TSHM_CUDA_VMM ? segs[1] :
			     NULL, &imp);
	if (ret) {
		free(b);
		return ret;
	}
	b->refs = 1;
	b->cu = cu;
	b->kind = w->kind;
	b->id = w->id;
	b->size = w->size;
	b->off = w->off;
	b->imp = imp;
	b->ptr = imp->base + w->off;
	b->lease = tshm_seg_ref(segs[0]);
	*out = b;
	return 0;
}

int tshm_cuda_buf_pack(struct tshm_cuda_buf *b, void *desc, size_t cap,
		       struct tshm_seg **segs, unsigned *nsegs, int *fd)
{
	struct tshm_seg *s[TSHM_CUDA_PACK_SEGS];
	struct tcu_wire w;
	unsigned n;
	int ret, f;

	if (!b || !desc || !segs || !nsegs || !fd)
		return -EINVAL;
	ret = tcu_desc_fill(b, &w, s, &n, &f);
	if (ret)
		return ret;
	if (cap < TSHM_CUDA_DESC_SIZE || *nsegs < TSHM_CUDA_PACK_SEGS) {
		tcu_err("room for %zu bytes and %u segments, a description "
			"needs %u and %u", cap, *nsegs, TSHM_CUDA_DESC_SIZE,
			TSHM_CUDA_PACK_SEGS);
		return -ENOSPC;
	}
	memcpy(desc, &w, sizeof(w));
	memcpy(segs, s, n * sizeof(*s));
	*nsegs = n;
	*fd = f;
	return (int)sizeof(w);
}

int tshm_cuda_buf_unpack(struct tshm_cuda *cu, const void *desc, size_t len,
			 struct tshm_seg *const *segs, unsigned nsegs, int fd,
			 struct tshm_cuda_buf **out)
{
	struct tcu_wire w;
	unsigned i;
	int ret;

	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!cu || (len && !desc) || (nsegs && !segs))
		return -EINVAL;
	for (i = 0; i < nsegs; i++)
		if (!segs[i])
			return -EINVAL;
	if (len != sizeof(w))
		return BAD("buffer description", "%zu bytes, one has %zu", len,
			   sizeof(w));
	/* the caller's bytes need not be aligned */
	memcpy(&w, desc, sizeof(w));
	if (w.len)
		return BAD("buffer description", "a channel message's head");
	ret = tcu_desc_check(&w, "buffer description", segs, nsegs, fd);
	if (ret)
		return ret;
	return tcu_desc_import(cu, &w, segs, fd, out);
}

int tshm_cuda_desc_device(const void *desc, size_t len)
{
	struct tcu_wire w;

	if (len && !desc)
		return -EINVAL;
	if (len != sizeof(w))
		return BAD("buffer description", "%zu bytes, one has %zu", len,
			   sizeof(w));
	memcpy(&w, desc, sizeof(w));
	/* its head only: unpack checks the rest against its segments */
	if (w.magic != TCU_WIRE_MAGIC)
		return BAD("buffer description", "magic %#x", w.magic);
	if (w.len)
		return BAD("buffer description", "a channel message's head");
	if (w.kind != TSHM_CUDA_VMM && w.kind != TSHM_CUDA_LEGACY)
		return BAD("buffer description", "buffer kind %u", w.kind);
	if (w.pad || w.pad2)
		return BAD("buffer description", "reserved fields set");
	return tcu_ordinal_of_uuid(w.uuid);
}
