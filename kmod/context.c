// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: contexts, the opens of /dev/tshm, and the grants they own.
 *
 * A context is one open file description of /dev/tshm; it is shared by
 * fork and SCM_RIGHTS like any file and released when its last fd goes.
 * It owns grants: references on segments, writable or read-only, that
 * any process holding the context can turn into a holder with ATTACH, or
 * give back with DROP.  GRANT is issued on the receiving context and
 * names the segment by one of the caller's segment fds or by the address
 * of one of its mappings of the segment, so a process that keeps a
 * segment only mapped can still pass it on.
 * A context learns nothing about segments it was not granted: ATTACH and
 * DROP of any other id, live or freed, fail alike with -ENOENT.
 *
 * Locking: ctx->lock (mutex) protects the grant tree and its total.  It
 * nests outside seg->lock and the tshm_segs xarray's lock, and is never
 * taken under mmap_lock (user memory may be touched while holding it).  ->release
 * runs with no other user of the context left and takes no lock.
 */
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
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
 * @seg:	the segment; alive while the entry exists
 * @count:	writable grants held
 * @ro_count:	read-only grants held; @count + @ro_count > 0
 */
struct tshm_grant_ent {
	struct rb_node node;
	u64 id;
	struct tshm_seg *seg;
	unsigned int count;
	unsigned int ro_count;
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

/*
 * Take @count grants of one kind out of @ent; the caller gives them back
 * to the segment.
 */
static void tshm_ctx_take(struct tshm_ctx *ctx, struct tshm_grant_ent *ent,
			  unsigned int count, bool rdonly)
{
	if (rdonly)
		ent->ro_count -= count;
	else
		ent->count -= count;
	ctx->nr_grants -= count;
	if (!ent->count && !ent->ro_count) {
		rb_erase(&ent->node, &ctx->grants);
		kfree(ent);
	}
}

/*
 * Give @ctx @count grants of one kind on @seg, which the caller keeps
 * alive.  Returns the grants @seg has outstanding afterwards, or
 * -ENOMEM, -EOVERFLOW (more than TSHM_GRANTS_MAX) or -EINTR.
 */
static long tshm_ctx_grant(struct tshm_ctx *ctx, struct tshm_seg *seg,
			   unsigned int count, bool rdonly)
{
	struct tshm_grant_ent *ent, *new;
	struct rb_node **link, *parent;
	unsigned int holders, grants;
	long ret;

	new = kzalloc(sizeof(*new), GFP_KERNEL_ACCOUNT);
	if (!new)
		return -ENOMEM;
	if (mutex_lock_killable(&ctx->lock)) {
		kfree(new);
		return -EINTR;
	}

	ent = tshm_ctx_find(ctx, seg->id, &link, &parent);
	if (!tshm_seg_add_grants(seg, count)) {
		ret = -EOVERFLOW;
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
	if (rdonly)
		ent->ro_count += count;
	else
		ent->count += count;
	ctx->nr_grants += count;
	tshm_seg_counts(seg, &holders, &grants, NULL);
	ret = grants;
out:
	mutex_unlock(&ctx->lock);
	kfree(new);
	return ret;
}

/*
 * The holder file of the caller's mapping at @addr, with a reference:
 * -EFAULT if nothing is mapped there, -EINVAL if it is not a segment.
 * mmap_lock is dropped before the caller takes any lock of ours.
 */
static struct file *tshm_holder_at(unsigned long addr)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	struct file *file;

	if (mmap_read_lock_killable(mm))
		return ERR_PTR(-EINTR);
	vma = vma_lookup(mm, addr);
	if (!vma)
		file = ERR_PTR(-EFAULT);
	else if (!vma->vm_file || !tshm_is_seg_file(vma->vm_file))
		file = ERR_PTR(-EINVAL);
	else
		file = get_file(vma->vm_file);
	mmap_read_unlock(mm);
	return file;
}

static long tshm_ioc_grant(struct tshm_ctx *ctx, void __user *uarg)
{
	struct tshm_grant arg;
	struct file *file;
	bool rdonly;
	long ret;

	ret = tshm_copy_arg(&arg, sizeof(arg), uarg);
	if (ret)
		return ret;
	if (arg.flags & ~TSHM_GRANT_FLAGS ||
	    memchr_inv(arg.__reserved, 0, sizeof(arg.__reserved)))
		return -EINVAL;
	if (!arg.count)
		return -EINVAL;
	if (arg.count > TSHM_GRANTS_MAX)
		return -EOVERFLOW;
	rdonly = arg.flags & TSHM_GRANT_RDONLY;

	if (arg.flags & TSHM_GRANT_BY_ADDR) {
		if (arg.seg_fd != -1)
			return -EINVAL;
		file = tshm_holder_at(arg.addr);
		if (IS_ERR(file))
			return PTR_ERR(file);
	} else {
		if (arg.addr)
			return -EINVAL;
		file = fget(arg.seg_fd);
		if (!file)
			return -EBADF;
		if (!tshm_is_seg_file(file)) {
			ret = -EINVAL;
			goto out;
		}
	}
	/* A read-only holder passes on what it has, no more. */
	if (tshm_holder_rdonly(file) && !rdonly) {
		ret = -EACCES;
		goto out;
	}
	ret = tshm_ctx_grant(ctx, file->private_data, arg.count, rdonly);
out:
	fput(file);
	return ret;
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

/* The size of segment @id, if @ctx holds a grant on it. */
static int tshm_ctx_seg_size(struct tshm_ctx *ctx, u64 id, u64 *size)
{
	struct tshm_grant_ent *ent;

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	ent = tshm_ctx_find(ctx, id, NULL, NULL);
	if (ent)
		*size = ent->seg->size;
	mutex_unlock(&ctx->lock);
	return ent ? 0 : -ENOENT;
}

static long tshm_ioc_attach(struct tshm_ctx *ctx, void __user *uarg)
{
	struct tshm_attach __user *u = uarg;
	struct tshm_grant_ent *ent;
	struct tshm_attach arg;
	struct tshm_seg *seg;
	struct file *file;
	bool want_ro, take_ro;
	u64 size;
	int fd, err;

	err = tshm_copy_arg(&arg, sizeof(arg), uarg);
	if (err)
		return err;
	if (arg.flags & ~TSHM_ATTACH_FLAGS ||
	    memchr_inv(arg.__reserved, 0, sizeof(arg.__reserved)))
		return -EINVAL;
	want_ro = arg.flags & TSHM_ATTACH_RDONLY;

	/*
	 * The size goes out first, with no lock held and nothing consumed:
	 * a fault here (even a slow one) costs the context nothing.
	 */
	err = tshm_ctx_seg_size(ctx, arg.id, &size);
	if (err)
		return err;
	if (put_user(size, &u->size))
		return -EFAULT;

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
	/* Read-only grants first for a read-only attach, never for another. */
	take_ro = want_ro ? ent->ro_count > 0 : false;
	if (!take_ro && !ent->count) {
		err = -EACCES;
		goto err_unlock;
	}
	seg = ent->seg;
	file = tshm_holder_open(seg, want_ro);
	if (IS_ERR(file)) {
		err = PTR_ERR(file);
		goto err_unlock;
	}
	tshm_ctx_take(ctx, ent, 1, take_ro);
	mutex_unlock(&ctx->lock);
	/* Never the last user: the new holder is one. */
	tshm_seg_put_grants(seg, 1);
	fd_install(fd, file);
	return fd;

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
	struct tshm_drop arg;
	unsigned int held;
	bool rdonly;
	int err;

	err = tshm_copy_arg(&arg, sizeof(arg), uarg);
	if (err)
		return err;
	if (arg.flags & ~TSHM_DROP_FLAGS || arg.__pad ||
	    memchr_inv(arg.__reserved, 0, sizeof(arg.__reserved)) ||
	    !arg.count)
		return -EINVAL;
	rdonly = arg.flags & TSHM_DROP_RDONLY;

	if (mutex_lock_killable(&ctx->lock))
		return -EINTR;
	ent = tshm_ctx_find(ctx, arg.id, NULL, NULL);
	held = !ent ? 0 : rdonly ? ent->ro_count : ent->count;
	if (!ent) {
		err = -ENOENT;
	} else if (arg.count > held) {
		err = -EINVAL;
	} else {
		seg = ent->seg;
		tshm_ctx_take(ctx, ent, arg.count, rdonly);
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
	case TSHM_IOC_GRANT & ~IOCSIZE_MASK:
		return tshm_ioc_grant(ctx, uarg);
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
		tshm_seg_put_grants(ent->seg, ent->count + ent->ro_count);
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

	/* Interruptible: a reader never sleeps in D state behind ATTACH. */
	if (mutex_lock_interruptible(&ctx->lock))
		return;
	seq_printf(m, "tshm-grants:\t%llu\n", ctx->nr_grants);
	/* One line per segment: id writable read-only size holders name */
	for (node = rb_first(&ctx->grants); node; node = rb_next(node)) {
		ent = rb_entry(node, struct tshm_grant_ent, node);
		tshm_seg_counts(ent->seg, &holders, &grants, NULL);
		seq_printf(m, "tshm-grant:\t%llu %u %u %llu %u ", ent->id,
			   ent->count, ent->ro_count, ent->seg->size, holders);
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
