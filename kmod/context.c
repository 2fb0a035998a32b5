// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: contexts, the opens of /dev/tshm, and the grants they own.
 *
 * A context is one open file description of /dev/tshm; it is shared by
 * fork and SCM_RIGHTS like any file and released when its last fd goes.
 * It owns grants: references on segments that any process holding the
 * context can turn into a holder with ATTACH, or give back with DROP.
 * A context learns nothing about segments it was not granted: ATTACH and
 * DROP of any other id, live or freed, fail alike with -ENOENT.
 *
 * Locking: ctx->lock (mutex) protects the grant tree and its total.  It
 * nests outside seg->lock and tshm_segs_lock, and is never taken under
 * mmap_lock (user memory may be touched while holding it).  ->release
 * runs with no other user of the context left and takes no lock.
 */
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/rbtree.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "internal.h"

/**
 * struct tshm_grant_ent - grants one context holds on one segment
 * @node:	in tshm_ctx.grants, keyed by @id
 * @id:		the segment's id
 * @seg:	the segment; alive while @count > 0
 * @count:	grants held, > 0
 */
struct tshm_grant_ent {
	struct rb_node node;
	u64 id;
	struct tshm_seg *seg;
	unsigned int count;
};

/**
 * tshm_copy_arg() - copy in an ioctl argument that starts with its size
 * @karg: kernel copy, @ksize bytes
 * @ksize: size of the struct this module knows
 * @uarg: user pointer; its first __u32 is argsz
 *
 * Bytes past @ksize that a newer caller passed must be zero.
 *
 * Return: 0; -EFAULT; -EINVAL if argsz is smaller than the first version
 * of the struct; -E2BIG if argsz is over a page or the bytes this module
 * does not know are not zero.
 */
int tshm_copy_arg(void *karg, size_t ksize, const void __user *uarg)
{
	u32 usize;

	if (get_user(usize, (const u32 __user *)uarg))
		return -EFAULT;
	if (usize < ksize)
		return -EINVAL;
	if (usize > PAGE_SIZE)
		return -E2BIG;
	return copy_struct_from_user(karg, ksize, uarg, usize);
}

/**
 * tshm_copy_arg_out() - copy an ioctl result back
 * @uarg: user pointer
 * @karg: result
 * @ksize: bytes to copy; the caller's argsz is at least this
 *
 * Return: 0 or -EFAULT.
 */
int tshm_copy_arg_out(void __user *uarg, const void *karg, size_t ksize)
{
	return copy_to_user(uarg, karg, ksize) ? -EFAULT : 0;
}

/**
 * tshm_ctx_from_file() - the context behind a file, if it is one
 * @file: any file
 *
 * Return: the context, or NULL if @file is not an open of /dev/tshm.
 */
struct tshm_ctx *tshm_ctx_from_file(struct file *file)
{
	return file->f_op == &tshm_ctx_fops ? file->private_data : NULL;
}

static struct tshm_grant_ent *tshm_ctx_find(struct tshm_ctx *ctx, u64 id,
					    struct rb_node ***linkp,
					    struct rb_node **parentp)
{
	struct rb_node **link = &ctx->grants.rb_node, *parent = NULL;
	struct tshm_grant_ent *ent;

	while (*link) {
		parent = *link;
		ent = rb_entry(parent, struct tshm_grant_ent, node);
		if (id == ent->id)
			return ent;
		link = id < ent->id ? &parent->rb_left : &parent->rb_right;
	}
	if (linkp) {
		*linkp = link;
		*parentp = parent;
	}
	return NULL;
}

/* Take @count grants out of @ent; the caller gives them to the segment. */
static void tshm_ctx_take(struct tshm_ctx *ctx, struct tshm_grant_ent *ent,
			  unsigned int count)
{
	ent->count -= count;
	ctx->nr_grants -= count;
	if (!ent->count) {
		rb_erase(&ent->node, &ctx->grants);
		kfree(ent);
	}
}

/**
 * tshm_ctx_grant() - give @ctx @count grants on @seg
 * @ctx: the receiving context, kept open by the caller
 * @seg: the segment, kept alive by the caller's holder
 * @count: > 0
 * @total: out: grants @seg has outstanding afterwards
 *
 * Return: 0, -ENOMEM, -EOVERFLOW (more than %TSHM_GRANTS_MAX grants on
 * @seg) or -EINTR.
 */
int tshm_ctx_grant(struct tshm_ctx *ctx, struct tshm_seg *seg,
		   unsigned int count, u64 *total)
{
	struct tshm_grant_ent *ent, *new;
	struct rb_node **link, *parent;
	unsigned int holders, grants;
	int err = 0;

	new = kzalloc(sizeof(*new), GFP_KERNEL_ACCOUNT);
	if (!new)
		return -ENOMEM;
	if (mutex_lock_killable(&ctx->lock)) {
		kfree(new);
		return -EINTR;
	}

	ent = tshm_ctx_find(ctx, seg->id, &link, &parent);
	if (!tshm_seg_add_grants(seg, count)) {
		err = -EOVERFLOW;
		goto out;
	}
	if (!ent) {
		ent = new;
		new = NULL;
		ent->id = seg->id;
		ent->seg = seg;
		rb_link_node(&ent->node, parent, link);
		rb_insert_color(&ent->node, &ctx->grants);
	}
	ent->count += count;
	ctx->nr_grants += count;
	tshm_seg_counts(seg, &holders, &grants, NULL);
	*total = grants;
out:
	mutex_unlock(&ctx->lock);
	kfree(new);
	return err;
}

static long tshm_ioc_create(void __user *uarg)
{
	struct tshm_create __user *u = uarg;
	struct tshm_create arg;
	struct file *file;
	u64 id;
	int fd, err;

	err = tshm_copy_arg(&arg, sizeof(arg), uarg);
	if (err)
		return err;
	file = tshm_seg_create(&arg, &id);
	if (IS_ERR(file))
		return PTR_ERR(file);

	fd = get_unused_fd_flags(arg.flags & TSHM_CREATE_NOCLOEXEC ?
				 0 : O_CLOEXEC);
	if (fd < 0) {
		err = fd;
		goto err_fput;
	}
	if (put_user(fd, &u->fd) || put_user(id, &u->id)) {
		err = -EFAULT;
		goto err_fd;
	}
	fd_install(fd, file);
	return 0;

err_fd:
	put_unused_fd(fd);
err_fput:
	fput(file);	/* frees the segment */
	return err;
}

static int tshm_check_attach(const struct tshm_attach *arg, bool drop)
{
	if (memchr_inv(arg->__reserved, 0, sizeof(arg->__reserved)))
		return -EINVAL;
	if (drop)
		return arg->flags || arg->count <= 0 ? -EINVAL : 0;
	return arg->flags & ~TSHM_ATTACH_FLAGS || arg->count ? -EINVAL : 0;
}

static long tshm_ioc_attach(struct tshm_ctx *ctx, void __user *uarg)
{
	struct tshm_attach __user *u = uarg;
	struct tshm_grant_ent *ent;
	struct tshm_attach arg;
	struct tshm_seg *seg;
	struct file *file;
	int fd, err;

	err = tshm_copy_arg(&arg, sizeof(arg), uarg);
	if (err)
		return err;
	err = tshm_check_attach(&arg, false);
	if (err)
		return err;

	fd = get_unused_fd_flags(arg.flags & TSHM_ATTACH_NOCLOEXEC ?
				 0 : O_CLOEXEC);
	if (fd < 0)
		return fd;
	if (mutex_lock_killable(&ctx->lock)) {
		err = -EINTR;
		goto err_fd;
	}
	ent = tshm_ctx_find(ctx, arg.id, NULL, NULL);
	if (!ent) {
		err = -ENOENT;
		goto err_unlock;
	}
	seg = ent->seg;
	file = tshm_holder_open(seg, arg.flags & TSHM_ATTACH_RDONLY);
	if (IS_ERR(file)) {
		err = PTR_ERR(file);
		goto err_unlock;
	}
	/* Report before consuming the grant, so -EFAULT costs nothing. */
	if (put_user(fd, &u->fd) || put_user(seg->size, &u->size)) {
		mutex_unlock(&ctx->lock);
		fput(file);
		err = -EFAULT;
		goto err_fd;
	}
	tshm_ctx_take(ctx, ent, 1);
	mutex_unlock(&ctx->lock);
	/* Never the last user: the new holder is one. */
	tshm_seg_put_grants(seg, 1);
	fd_install(fd, file);
	return 0;

err_unlock:
	mutex_unlock(&ctx->lock);
err_fd:
	put_unused_fd(fd);
	return err;
}

static long tshm_ioc_drop(struct tshm_ctx *ctx, void __user *uarg)
{
	struct tshm_seg *seg = NULL;
	struct tshm_grant_ent *ent;
	struct tshm_attach arg;
	int err;

	err = tshm_copy_arg(&arg, sizeof(arg), uarg);
	if (err)
		return err;
	err = tshm_check_attach(&arg, true);
	if (err)
		return err;

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	ent = tshm_ctx_find(ctx, arg.id, NULL, NULL);
	if (!ent) {
		err = -ENOENT;
	} else if (arg.count > ent->count) {
		err = -EINVAL;
	} else {
		seg = ent->seg;
		tshm_ctx_take(ctx, ent, arg.count);
	}
	mutex_unlock(&ctx->lock);
	if (seg)
		tshm_seg_put_grants(seg, arg.count);
	return err;
}

static long tshm_ctx_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	struct tshm_ctx *ctx = file->private_data;
	void __user *uarg = (void __user *)arg;

	/* The size bits may grow with the struct: argsz says which. */
	switch (cmd & ~IOCSIZE_MASK) {
	case TSHM_IOC_CREATE & ~IOCSIZE_MASK:
		return tshm_ioc_create(uarg);
	case TSHM_IOC_ATTACH & ~IOCSIZE_MASK:
		return tshm_ioc_attach(ctx, uarg);
	case TSHM_IOC_DROP & ~IOCSIZE_MASK:
		return tshm_ioc_drop(ctx, uarg);
	}
	return -ENOTTY;
}

static int tshm_ctx_open(struct inode *inode, struct file *file)
{
	struct tshm_ctx *ctx;

	ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);
	if (!ctx)
		return -ENOMEM;
	mutex_init(&ctx->lock);
	ctx->grants = RB_ROOT;
	file->private_data = ctx;
	return 0;
}

/* The last fd of the context is gone: its grants go with it. */
static int tshm_ctx_release(struct inode *inode, struct file *file)
{
	struct tshm_ctx *ctx = file->private_data;
	struct tshm_grant_ent *ent;
	struct rb_node *node;

	while ((node = rb_first(&ctx->grants))) {
		ent = rb_entry(node, struct tshm_grant_ent, node);
		rb_erase(node, &ctx->grants);
		tshm_seg_put_grants(ent->seg, ent->count);
		kfree(ent);
		cond_resched();
	}
	mutex_destroy(&ctx->lock);
	kfree(ctx);
	return 0;
}

static void tshm_ctx_show_fdinfo(struct seq_file *m, struct file *file)
{
	struct tshm_ctx *ctx = file->private_data;
	struct tshm_grant_ent *ent;
	unsigned int holders, grants;
	struct rb_node *node;

	mutex_lock(&ctx->lock);
	seq_printf(m, "tshm-grants:\t%llu\n", ctx->nr_grants);
	/* One line per segment: id count size holders name */
	for (node = rb_first(&ctx->grants); node; node = rb_next(node)) {
		ent = rb_entry(node, struct tshm_grant_ent, node);
		tshm_seg_counts(ent->seg, &holders, &grants, NULL);
		seq_printf(m, "tshm-grant:\t%llu %u %llu %u ", ent->id,
			   ent->count, ent->seg->size, holders);
		tshm_seq_name(m, ent->seg->name);
		seq_putc(m, '\n');
	}
	mutex_unlock(&ctx->lock);
}

const struct file_operations tshm_ctx_fops = {
	.owner		= THIS_MODULE,
	.open		= tshm_ctx_open,
	.release	= tshm_ctx_release,
	.unlocked_ioctl	= tshm_ctx_ioctl,
	.compat_ioctl	= compat_ptr_ioctl,
	.show_fdinfo	= tshm_ctx_show_fdinfo,
	.llseek		= noop_llseek,
};
