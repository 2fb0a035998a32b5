/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tshm: internal interfaces between the module's files.
 *
 * Objects and who keeps them alive (Documentation/design/lifetimes.rst):
 *
 *   context  one open of /dev/tshm; owns grants (struct tshm_grant_ent).
 *   segment  one shmem inode plus bookkeeping; alive while it has holders
 *            or grants ("users").  When both reach zero it is torn down
 *            at once: unlisted, uncharged, its shmem file put.
 *   holder   one struct file of our own on the segment's shmem inode
 *            (a segment fd).  Every VMA mapped through it holds it
 *            through vm_file, as every file mapping does, so the holder
 *            counts as one user until its fd and all those VMAs are gone.
 *
 * The module stays loaded while anything exists: context and holder
 * files pin it through fops->owner, and the VFS drops that reference
 * only after our ->release has returned, in whatever task or kernel
 * thread the last fput() of the file runs.  Grants live in contexts.
 */
#ifndef TSHM_INTERNAL_H
#define TSHM_INTERNAL_H

#include <linux/fs.h>
#include <linux/mutex.h>
#include <linux/rbtree.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/uidgid.h>
#include <linux/wait.h>
#include <linux/xarray.h>
#include <linux/tshm.h>

#include "compat.h"

struct tshm_user;

/**
 * struct tshm_seg - a segment
 * @id:		never reused while the module is loaded
 * @size:	bytes, page (or huge page) aligned, fixed for life
 * @flags:	TSHM_CREATE_* given at creation
 * @shmem:	shmem file whose inode holds the pages; never given out,
 *		it keeps the pages while only grants are left
 * @mapping:	its address_space, freed after an RCU grace period like
 *		its inode: what lockless readers use
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
 * @rcu:	freed after an RCU grace period: /proc/tshm walks locklessly
 */
struct tshm_seg {
	u64 id;
	u64 size;
	u32 flags;
	struct file *shmem;
	struct address_space *mapping;
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

	struct rcu_head rcu;
};

/**
 * struct tshm_ctx - what a /dev/tshm fd's private_data points to
 * @lock:	protects @grants and @nr_grants; never held while user memory
 *		is touched, nor taken under mmap_lock
 * @grants:	struct tshm_grant_ent by segment id
 * @nr_grants:	sum of the entries' counts, both kinds
 */
struct tshm_ctx {
	struct mutex lock;	/* grants, nr_grants */
	struct rb_root grants;
	u64 nr_grants;
};

/* Every live segment by id; entries are freed after an RCU grace period. */
extern struct xarray tshm_segs;

/* segment.c */
int tshm_seg_init(void);
void tshm_seg_exit(void);
struct file *tshm_seg_create(const struct tshm_create *arg, u64 *id);
struct file *tshm_holder_open(struct tshm_seg *seg, bool rdonly);
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
long tshm_seg_fallocate(struct file *file, int mode, loff_t offset,
			loff_t len);

/**
 * tshm_holder_rdonly() - whether a holder may not write the segment
 * @file: a holder's file
 *
 * Read-only holders are files opened O_RDONLY: the core mm then refuses
 * writable shared mappings and clears VM_MAYWRITE by itself.
 *
 * Return: true for a read-only holder.
 */
static inline bool tshm_holder_rdonly(const struct file *file)
{
	return !(file->f_mode & FMODE_WRITE);
}

/* context.c */
extern const struct file_operations tshm_ctx_fops;

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
