// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: per-user limits, set through module parameters.
 *
 * Every segment is charged, at CREATE, to its creator's effective uid:
 * its size in bytes and one segment.  The charge is returned when the
 * segment is freed.  A limit of 0 means no limit.  Lowering a limit
 * below what a user already has only stops new segments.
 *
 *   max_segment_bytes   largest segment             -EFBIG
 *   max_user_bytes      bytes of live segments      -EDQUOT
 *   max_user_segments   number of live segments     -ENOSPC
 *
 * Locking: tshm_users_lock (spinlock) protects the table and every
 * struct tshm_user in it; nothing sleeps under it.
 */
#include <linux/hashtable.h>
#include <linux/moduleparam.h>
#include <linux/overflow.h>
#include <linux/slab.h>
#include <linux/spinlock.h>

#include "internal.h"

static unsigned long max_segment_bytes;
module_param(max_segment_bytes, ulong, 0644);
MODULE_PARM_DESC(max_segment_bytes,
		 "Largest segment in bytes, after rounding (0: no limit)");

static unsigned long max_user_bytes;
module_param(max_user_bytes, ulong, 0644);
MODULE_PARM_DESC(max_user_bytes,
		 "Bytes of live segments per creating uid (0: no limit)");

static unsigned long max_user_segments = 16384;
module_param(max_user_segments, ulong, 0644);
MODULE_PARM_DESC(max_user_segments,
		 "Live segments per creating uid (0: no limit; default 16384)");

/**
 * struct tshm_user - what one uid has
 * @node:	in tshm_users, while @segs > 0
 * @uid:	the uid
 * @bytes:	bytes of its live segments
 * @segs:	its live segments
 */
struct tshm_user {
	struct hlist_node node;
	kuid_t uid;
	u64 bytes;
	unsigned long segs;
};

static DEFINE_HASHTABLE(tshm_users, 6);
static DEFINE_SPINLOCK(tshm_users_lock);

/**
 * tshm_limits_check_size() - check a segment size against max_segment_bytes
 * @size: rounded size
 *
 * Return: 0 or -EFBIG.
 */
int tshm_limits_check_size(u64 size)
{
	unsigned long max = READ_ONCE(max_segment_bytes);

	return max && size > max ? -EFBIG : 0;
}

static struct tshm_user *tshm_user_find(kuid_t uid)
{
	struct tshm_user *u;

	hash_for_each_possible(tshm_users, u, node, __kuid_val(uid))
		if (uid_eq(u->uid, uid))
			return u;
	return NULL;
}

/**
 * tshm_user_charge() - charge a new segment to @uid
 * @uid: the creator
 * @bytes: the segment's size
 * @userp: out: what to give to tshm_user_uncharge() later
 *
 * Return: 0, -ENOSPC (max_user_segments), -EDQUOT (max_user_bytes) or
 * -ENOMEM.
 */
int tshm_user_charge(kuid_t uid, u64 bytes, struct tshm_user **userp)
{
	unsigned long max_segs = READ_ONCE(max_user_segments);
	unsigned long max_bytes = READ_ONCE(max_user_bytes);
	struct tshm_user *u, *new = NULL;
	u64 total;
	int err = 0;

	spin_lock(&tshm_users_lock);
	u = tshm_user_find(uid);
	if (!u) {
		spin_unlock(&tshm_users_lock);
		new = kzalloc(sizeof(*new), GFP_KERNEL);
		if (!new)
			return -ENOMEM;
		new->uid = uid;
		spin_lock(&tshm_users_lock);
		u = tshm_user_find(uid);
		if (!u)
			u = new;
	}

	if (max_segs && u->segs >= max_segs)
		err = -ENOSPC;
	else if (check_add_overflow(u->bytes, bytes, &total) ||
		 (max_bytes && total > max_bytes))
		err = -EDQUOT;
	if (!err) {
		u->segs++;
		u->bytes = total;
		if (u == new) {
			hash_add(tshm_users, &u->node, __kuid_val(uid));
			new = NULL;
		}
		*userp = u;
	}
	spin_unlock(&tshm_users_lock);
	kfree(new);
	return err;
}

/**
 * tshm_user_uncharge() - return a freed segment's charge
 * @u: from tshm_user_charge()
 * @bytes: the segment's size
 */
void tshm_user_uncharge(struct tshm_user *u, u64 bytes)
{
	bool last;

	spin_lock(&tshm_users_lock);
	u->bytes -= bytes;
	last = !--u->segs;
	if (last)
		hash_del(&u->node);
	spin_unlock(&tshm_users_lock);
	if (last)
		kfree(u);
}
