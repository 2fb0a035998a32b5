// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: segments and holders.
 *
 * A segment is a shmem file on one of the module's private tmpfs mounts
 * (a huge=within_size one for TSHM_CREATE_HUGE, as i915's gemfs does),
 * sealed against grow and shrink.  Userspace never gets that file.  Each
 * holder is a struct file of its own on the same shmem inode
 * (alloc_file_pseudo() with our file_operations), whose ->mmap hands the
 * VMA to shmem's ->mmap (mmap.c) and whose ->release drops the holder.
 * The inode's i_fop is ours too, with an ->open that refuses: reopening
 * a segment fd through /proc/PID/fd or /proc/PID/map_files would give a
 * plain shmem file, mappable without a holder.
 *
 * Locking:
 *   seg->lock (spinlock)   holders, grants, generation; poll wake-ups are
 *                          issued under it so that the waitqueue cannot
 *                          be freed under the waker.
 *   tshm_segs (xarray)     its own lock; readers (/proc/tshm) walk it
 *                          under RCU and segments are freed after a
 *                          grace period, so no reader holds a lock that
 *                          creation or teardown waits for.
 * Nothing here sleeps under seg->lock.  A segment whose holders and grants
 * both reached zero cannot come back: a new holder needs a grant or an
 * existing holder, so tshm_seg_destroy() runs exactly once and unlocked.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/err.h>
#include <linux/falloc.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/huge_mm.h>
#include <linux/mount.h>
#include <linux/pgtable.h>
#include <linux/pid.h>
#include <linux/poll.h>
#include <linux/seq_file.h>
#include <linux/shmem_fs.h>
#include <linux/slab.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>
#include <uapi/linux/fcntl.h>

#include "internal.h"

/* "tshm:" + 20 digits + ":" + name + NUL */
#define TSHM_FILE_NAME_LEN	(5 + 20 + 1 + TSHM_NAME_LEN)

DEFINE_XARRAY(tshm_segs);

static atomic64_t tshm_last_id = ATOMIC64_INIT(0);
static struct vfsmount *tshm_shm_mnt;
static struct vfsmount *tshm_huge_mnt;

static const struct file_operations tshm_seg_fops;

/*
 * The segment inode's i_fop, used only by an open of its path (a magic
 * link in /proc): a holder is made by CREATE, ATTACH or fd passing only.
 * Such an open can only start while a holder file exists, which pins the
 * module.
 */
static int tshm_seg_reopen(struct inode *inode, struct file *file)
{
	return -ENXIO;
}

static const struct file_operations tshm_seg_inode_fops = {
	.owner		= THIS_MODULE,
	.open		= tshm_seg_reopen,
};

bool tshm_is_seg_file(const struct file *file)
{
	return file->f_op == &tshm_seg_fops;
}

/**
 * tshm_seg_resident() - bytes of a segment that are in memory
 * @seg: the segment, alive for the duration of the call
 *
 * Pages in the page cache of its shmem inode: not the ones in swap, not
 * holes.  Read without locks; a snapshot.  Under RCU (/proc/tshm) @seg
 * may be on its way out: its mapping, part of an inode freed after a
 * grace period, is still there to read.
 *
 * Return: bytes.
 */
u64 tshm_seg_resident(const struct tshm_seg *seg)
{
	return (u64)READ_ONCE(seg->mapping->nrpages) << PAGE_SHIFT;
}

/**
 * tshm_seg_counts() - consistent snapshot of a segment's users
 * @seg: the segment
 * @holders: out: live holders
 * @grants: out: outstanding grants
 * @generation: out: generation number; may be NULL
 */
void tshm_seg_counts(struct tshm_seg *seg, unsigned int *holders,
		     unsigned int *grants, u64 *generation)
{
	spin_lock(&seg->lock);
	*holders = seg->holders;
	*grants = seg->grants;
	if (generation)
		*generation = seg->generation;
	spin_unlock(&seg->lock);
}

static void tshm_seg_free_rcu(struct rcu_head *rcu)
{
	struct tshm_seg *seg = container_of(rcu, struct tshm_seg, rcu);

	put_pid(seg->pid);
	kfree(seg);
}

/*
 * Undo everything tshm_seg_create() did; @seg has no users left.  The
 * last VMA went before its holder's file did, so the pages go with the
 * shmem file here, unless something else pins them (see the pool's
 * punch in Documentation/design/lifetimes.rst).
 */
static void tshm_seg_destroy(struct tshm_seg *seg)
{
	xa_erase(&tshm_segs, seg->id);
	tshm_user_uncharge(seg->user, seg->size);
	fput(seg->shmem);
	/* /proc/tshm readers may still look at it; tshm_seg_exit() waits. */
	call_rcu(&seg->rcu, tshm_seg_free_rcu);
}

static void tshm_seg_put_users(struct tshm_seg *seg, unsigned int holders,
			       unsigned int grants)
{
	bool dead;

	spin_lock(&seg->lock);
	WARN_ON_ONCE(seg->holders < holders || seg->grants < grants);
	seg->holders -= holders;
	seg->grants -= grants;
	seg->generation++;
	dead = !seg->holders && !seg->grants;
	if (!dead)
		wake_up_all(&seg->wq);
	spin_unlock(&seg->lock);

	if (dead)
		tshm_seg_destroy(seg);
}

/**
 * tshm_seg_add_grants() - account @count more grants to @seg
 * @seg: the segment, kept alive by the caller (a holder or a grant)
 * @count: grants to add, > 0
 *
 * Return: false if the total would exceed %TSHM_GRANTS_MAX.
 */
bool tshm_seg_add_grants(struct tshm_seg *seg, unsigned int count)
{
	bool ok;

	spin_lock(&seg->lock);
	ok = count <= TSHM_GRANTS_MAX - seg->grants;
	if (ok) {
		seg->grants += count;
		seg->generation++;
	}
	spin_unlock(&seg->lock);
	return ok;
}

/**
 * tshm_seg_put_grants() - give back @count grants of @seg
 * @seg: the segment; may be freed by this call
 * @count: grants to give back
 *
 * May sleep.
 */
void tshm_seg_put_grants(struct tshm_seg *seg, unsigned int count)
{
	tshm_seg_put_users(seg, 0, count);
}

/**
 * tshm_holder_open() - make a new holder of @seg
 * @seg: the segment, kept alive by the caller
 * @rdonly: the holder may not map for writing nor grant
 *
 * Return: the holder's file (not yet installed in an fd), or an ERR_PTR.
 */
struct file *tshm_holder_open(struct tshm_seg *seg, bool rdonly)
{
	struct inode *inode = file_inode(seg->shmem);
	char fname[TSHM_FILE_NAME_LEN];
	struct file *file;

	/* Dropped by __fput(); the caller's own file pins us meanwhile. */
	__module_get(THIS_MODULE);
	ihold(inode);
	snprintf(fname, sizeof(fname), "tshm:%llu:%s", seg->id, seg->name);
	file = alloc_file_pseudo(inode, seg->shmem->f_path.mnt, fname,
				 rdonly ? O_RDONLY : O_RDWR, &tshm_seg_fops);
	if (IS_ERR(file)) {
		iput(inode);
		module_put(THIS_MODULE);
		return file;
	}
	file->private_data = seg;

	spin_lock(&seg->lock);
	seg->holders++;
	seg->generation++;
	spin_unlock(&seg->lock);
	return file;
}

static int tshm_seg_check_create(const struct tshm_create *arg, u64 *size)
{
	u64 align = PAGE_SIZE;

	if (arg->flags & ~TSHM_CREATE_FLAGS)
		return -EINVAL;
	if (arg->__pad || memchr_inv(arg->__reserved, 0,
				     sizeof(arg->__reserved)))
		return -EINVAL;
	if (strnlen(arg->name, TSHM_NAME_LEN) == TSHM_NAME_LEN)
		return -EINVAL;
	if (!arg->size)
		return -EINVAL;
	if (arg->flags & TSHM_CREATE_HUGE) {
		if (!tshm_huge_mnt)
			return -EOPNOTSUPP;
		/* What shmem allocates huge pages in (HPAGE_PMD_SIZE). */
		align = PMD_SIZE;
	}
	if (arg->size > (u64)MAX_LFS_FILESIZE - align)
		return -EOVERFLOW;
	*size = round_up(arg->size, align);
	return tshm_limits_check_size(*size);
}

/**
 * tshm_seg_create() - create a segment and its first holder
 * @arg: the caller's request, copied in; @arg->fd and @arg->id unused
 * @id: out: the new segment's id
 *
 * Charges the creator's user, sets up the shmem file, prefaults if asked
 * and lists the segment in /proc/tshm.
 *
 * Return: the first holder's file (not yet installed), or an ERR_PTR:
 * -EINVAL, -EOVERFLOW, -EOPNOTSUPP for bad arguments, the limits' errnos
 * (limits.c), -ENOMEM, or what shmem returned.
 */
struct file *tshm_seg_create(const struct tshm_create *arg, u64 *id)
{
	char fname[TSHM_FILE_NAME_LEN];
	struct tshm_seg *seg;
	struct inode *inode;
	struct file *file;
	struct vfsmount *mnt;
	u64 size;
	int err;

	err = tshm_seg_check_create(arg, &size);
	if (err)
		return ERR_PTR(err);

	seg = kzalloc(sizeof(*seg), GFP_KERNEL_ACCOUNT);
	if (!seg)
		return ERR_PTR(-ENOMEM);

	seg->size = size;
	seg->flags = arg->flags;
	seg->uid = current_euid();
	strscpy(seg->name, arg->name, sizeof(seg->name));
	get_task_comm(seg->comm, current);
	seg->created = ktime_get_boottime_seconds();
	spin_lock_init(&seg->lock);
	init_waitqueue_head(&seg->wq);

	err = tshm_user_charge(seg->uid, size, &seg->user);
	if (err)
		goto err_free;

	seg->id = atomic64_inc_return(&tshm_last_id);
	snprintf(fname, sizeof(fname), "tshm:%llu:%s", seg->id, seg->name);
	mnt = arg->flags & TSHM_CREATE_HUGE ? tshm_huge_mnt : tshm_shm_mnt;
	seg->shmem = shmem_file_setup_with_mnt(mnt, fname, size, VM_NORESERVE);
	if (IS_ERR(seg->shmem)) {
		err = PTR_ERR(seg->shmem);
		goto err_uncharge;
	}
	/* As a sealed memfd: writes, faults and fallocate stay within. */
	inode = file_inode(seg->shmem);
	seg->mapping = inode->i_mapping;
	SHMEM_I(inode)->seals |= F_SEAL_SEAL | F_SEAL_GROW | F_SEAL_SHRINK;
	/* Not yet visible to anyone: fstat() shows the id, no reopening. */
	inode->i_ino = seg->id;
	inode->i_fop = &tshm_seg_inode_fops;

	if (arg->flags & TSHM_CREATE_PREFAULT) {
		err = vfs_fallocate(seg->shmem, 0, 0, size);
		if (err)
			goto err_shmem;
	}

	seg->pid = get_pid(task_tgid(current));
	err = xa_insert(&tshm_segs, seg->id, seg, GFP_KERNEL_ACCOUNT);
	if (err)
		goto err_pid;

	/* From here on, tshm_seg_destroy() undoes everything. */
	file = tshm_holder_open(seg, false);
	if (IS_ERR(file)) {
		tshm_seg_destroy(seg);
		return file;
	}
	*id = seg->id;
	return file;

err_pid:
	put_pid(seg->pid);
err_shmem:
	fput(seg->shmem);
err_uncharge:
	tshm_user_uncharge(seg->user, size);
err_free:
	kfree(seg);
	return ERR_PTR(err);
}

/* The fd and every VMA mapped through this holder are gone. */
static int tshm_seg_release(struct inode *inode, struct file *file)
{
	tshm_seg_put_users(file->private_data, 1, 0);
	return 0;
}

static long tshm_ioc_info(struct file *file, void __user *uarg)
{
	struct tshm_seg *seg = file->private_data;
	struct tshm_info info;
	int err;

	err = tshm_copy_arg(&info, sizeof(info), uarg);
	if (err)
		return err;
	info = (struct tshm_info){ .argsz = info.argsz };
	info.flags = tshm_holder_rdonly(file) ? TSHM_INFO_RDONLY : 0;
	info.create_flags = seg->flags;
	info.id = seg->id;
	info.size = seg->size;
	info.resident = tshm_seg_resident(seg);
	tshm_seg_counts(seg, &info.holders, &info.grants, &info.generation);
	memcpy(info.name, seg->name, sizeof(info.name));
	return tshm_copy_arg_out(uarg, &info, sizeof(info));
}

static long tshm_seg_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	/* The size bits may grow with the struct: @argsz says which. */
	switch (cmd & ~IOCSIZE_MASK) {
	case TSHM_IOC_INFO & ~IOCSIZE_MASK:
		return tshm_ioc_info(file, uarg);
	}
	return -ENOTTY;
}

/* Readable when the caller's holder is the only user left. */
static __poll_t tshm_seg_poll(struct file *file, poll_table *wait)
{
	struct tshm_seg *seg = file->private_data;
	unsigned int holders, grants;

	poll_wait(file, &seg->wq, wait);
	tshm_seg_counts(seg, &holders, &grants, NULL);
	return holders == 1 && !grants ? EPOLLIN | EPOLLRDNORM : 0;
}

static void tshm_seg_show_fdinfo(struct seq_file *m, struct file *file)
{
	struct tshm_seg *seg = file->private_data;
	unsigned int holders, grants;
	u64 gen;

	tshm_seg_counts(seg, &holders, &grants, &gen);
	seq_printf(m, "tshm-id:\t%llu\n", seg->id);
	seq_printf(m, "tshm-size:\t%llu\n", seg->size);
	seq_printf(m, "tshm-resident:\t%llu\n", tshm_seg_resident(seg));
	seq_printf(m, "tshm-holders:\t%u\n", holders);
	seq_printf(m, "tshm-grants:\t%u\n", grants);
	seq_printf(m, "tshm-generation:\t%llu\n", gen);
	seq_printf(m, "tshm-create-flags:\t%#x\n", seg->flags);
	seq_printf(m, "tshm-flags:\t%#x\n",
		   tshm_holder_rdonly(file) ? TSHM_INFO_RDONLY : 0);
	seq_puts(m, "tshm-name:\t");
	tshm_seq_name(m, seg->name);
	seq_putc(m, '\n');
}

static const struct file_operations tshm_seg_fops = {
	.owner			= THIS_MODULE,
	.release		= tshm_seg_release,
	.unlocked_ioctl		= tshm_seg_ioctl,
	.compat_ioctl		= compat_ptr_ioctl,
	.mmap			= tshm_seg_mmap,
	.get_unmapped_area	= tshm_seg_get_unmapped_area,
	.fallocate		= tshm_seg_fallocate,
	.fsync			= noop_fsync,	/* as shmem: msync(MS_SYNC) */
	.poll			= tshm_seg_poll,
	.show_fdinfo		= tshm_seg_show_fdinfo,
	.llseek			= noop_llseek,
};

/*
 * tmpfs with huge=within_size, for TSHM_CREATE_HUGE.  Not a long-term
 * mount like kern_mount()'s (its mnt_ns is not MNT_NS_INTERNAL): kern_mount()
 * takes no mount options, and neither 6.1 nor 6.12 exports a way to make a
 * long-term mount from a configured fs_context.  So each fput() of a file on
 * it takes mntput_no_expire()'s slow path (mount_lock).
 */
static struct vfsmount *tshm_mount_huge(struct file_system_type *type)
{
	struct fs_context *fc;
	struct vfsmount *mnt;
	int err;

	fc = fs_context_for_mount(type, SB_KERNMOUNT);
	if (IS_ERR(fc))
		return ERR_CAST(fc);
	err = vfs_parse_fs_string(fc, "huge", "within_size", 11);
	mnt = err ? ERR_PTR(err) : fc_mount(fc);
	put_fs_context(fc);
	return mnt;
}

/* put_filesystem(), which modules cannot call, for get_fs_type()'s ref. */
static void tshm_put_filesystem(struct file_system_type *type)
{
	module_put(type->owner);
}

/**
 * tshm_seg_init() - set up the mounts segments live on
 *
 * Return: 0 or a negative errno.
 */
int tshm_seg_init(void)
{
	struct file_system_type *type;

	type = get_fs_type("tmpfs");
	if (!type)
		return -ENODEV;
	tshm_shm_mnt = kern_mount(type);
	if (IS_ERR(tshm_shm_mnt)) {
		tshm_put_filesystem(type);
		return PTR_ERR(tshm_shm_mnt);
	}

	tshm_huge_mnt = NULL;
	if (IS_ENABLED(CONFIG_TRANSPARENT_HUGEPAGE)) {
		tshm_huge_mnt = tshm_mount_huge(type);
		if (IS_ERR(tshm_huge_mnt)) {
			pr_info("no huge page mount (%ld), TSHM_CREATE_HUGE disabled\n",
				PTR_ERR(tshm_huge_mnt));
			tshm_huge_mnt = NULL;
		}
	}
	/* The superblocks hold their own references on the type. */
	tshm_put_filesystem(type);
	return 0;
}

/**
 * tshm_seg_exit() - drop the mounts; no segment may be left
 *
 * Waits for the RCU callbacks that free segments (they are our code).
 * Shmem files still on their way out (a segment's shmem file put by
 * tshm_seg_destroy() as task work) keep their mount alive; the VFS
 * releases it later, with tmpfs code that is built in.
 */
void tshm_seg_exit(void)
{
	rcu_barrier();
	if (tshm_huge_mnt)
		kern_unmount(tshm_huge_mnt);
	kern_unmount(tshm_shm_mnt);
	tshm_huge_mnt = NULL;
	WARN_ON(!xa_empty(&tshm_segs));
}
