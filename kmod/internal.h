/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tshm: internal interfaces between the module's files.
 *
 * Objects and who keeps them alive (Documentation/design/lifetimes.rst):
 *
 *   context  one open of /dev/tshm; owns grants (struct tshm_grant_ent).
 *   segment  one shmem file plus bookkeeping; alive while it has holders
 *            or grants ("users").  When both reach zero it is torn down
 *            at once: unlisted, uncharged, its shmem file put.
 *   holder   one segment fd (open file description) plus every VMA
 *            mapped through it; counts as one user of the segment until
 *            the file and all those VMAs are gone.
 *
 * The module stays loaded while anything exists: context and segment
 * files through fops->owner, VMAs (whose vm_file is the shmem file, not
 * ours) through their holder's segment, which owns an anchor file with
 * fops->owner == THIS_MODULE; the VFS drops that reference only after
 * the anchor's ->release has returned.
 */
#ifndef TSHM_INTERNAL_H
#define TSHM_INTERNAL_H

#include <linux/fs.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/rbtree.h>
#include <linux/refcount.h>
#include <linux/sched.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/wait.h>
#include <linux/tshm.h>

#include "compat.h"

struct tshm_user;

/**
 * struct tshm_seg - a segment
 * @id:		never reused while the module is loaded
 * @size:	bytes, page (or huge page) aligned, fixed for life
 * @flags:	TSHM_CREATE_* given at creation
 * @shmem:	the shmem file holding the pages; VMAs use it as vm_file
 * @anchor:	file whose ->release frees this struct; pins the module
 * @user:	per-user accounting this segment is charged to
 * @uid:	creator's effective uid
 * @pid:	creator's thread group
 * @comm:	creator's comm
 * @created:	boot time (seconds) of creation
 * @name:	NUL-terminated name given at creation
 * @lock:	protects @holders, @grants, @generation
 * @holders:	live holders
 * @grants:	grants outstanding in all contexts
 * @generation:	bumped on every change of @holders or @grants
 * @wq:		poll waiters; woken under @lock
 * @node:	entry in the global segment list, under tshm_segs_lock
 */
struct tshm_seg {
	u64 id;
	u64 size;
	u32 flags;
	struct file *shmem;
	struct file *anchor;
	struct tshm_user *user;
	kuid_t uid;
	struct pid *pid;
	char comm[TASK_COMM_LEN];
	time64_t created;
	char name[TSHM_NAME_LEN];

	spinlock_t lock;		/* holders, grants, generation */
	unsigned int holders;
	unsigned int grants;
	u64 generation;
	wait_queue_head_t wq;

	struct list_head node;
};

/**
 * struct tshm_holder - what a segment fd's private_data points to
 * @seg:	the segment; alive while this holder is
 * @ref:	one for the file, one per VMA mapped through it
 * @rdonly:	attached read-only: no writable mappings, no grants
 */
struct tshm_holder {
	struct tshm_seg *seg;
	refcount_t ref;
	bool rdonly;
};

/**
 * struct tshm_ctx - what a /dev/tshm fd's private_data points to
 * @lock:	protects @grants and @nr_grants; never taken under mmap_lock
 * @grants:	struct tshm_grant_ent by segment id
 * @nr_grants:	sum of the entries' counts
 */
struct tshm_ctx {
	struct mutex lock;	/* grants, nr_grants */
	struct rb_root grants;
	u64 nr_grants;
};

/* Largest number of grants one segment may have outstanding. */
#define TSHM_GRANTS_MAX		INT_MAX

extern struct mutex tshm_segs_lock;
extern struct list_head tshm_segs;

/* segment.c */
int tshm_seg_init(void);
void tshm_seg_exit(void);
struct file *tshm_seg_create(const struct tshm_create *arg, u64 *id);
struct file *tshm_holder_open(struct tshm_seg *seg, bool rdonly);
void tshm_holder_put(struct tshm_holder *h);
bool tshm_seg_add_grants(struct tshm_seg *seg, unsigned int count);
void tshm_seg_put_grants(struct tshm_seg *seg, unsigned int count);
u64 tshm_seg_resident(const struct tshm_seg *seg);
void tshm_seg_counts(struct tshm_seg *seg, unsigned int *holders,
		     unsigned int *grants, u64 *generation);
bool tshm_is_seg_file(const struct file *file);

/* mmap.c */
int tshm_seg_mmap(struct file *file, struct vm_area_struct *vma);
unsigned long tshm_seg_get_unmapped_area(struct file *file,
					 unsigned long addr,
					 unsigned long len,
					 unsigned long pgoff,
					 unsigned long flags);

/* context.c */
extern const struct file_operations tshm_ctx_fops;
struct tshm_ctx *tshm_ctx_from_file(struct file *file);
int tshm_ctx_grant(struct tshm_ctx *ctx, struct tshm_seg *seg,
		   unsigned int count, u64 *total);

/* limits.c */
int tshm_limits_check_size(u64 size);
int tshm_user_charge(kuid_t uid, u64 bytes, struct tshm_user **user);
void tshm_user_uncharge(struct tshm_user *user, u64 bytes);

/* procfs.c */
int tshm_proc_init(void);
void tshm_proc_exit(void);
void tshm_seq_name(struct seq_file *m, const char *name);

/* ioctl argument helpers (context.c) */
int tshm_copy_arg(void *karg, size_t ksize, const void __user *uarg);
int tshm_copy_arg_out(void __user *uarg, const void *karg, size_t ksize);

#endif /* TSHM_INTERNAL_H */
