// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: mapping a segment.
 *
 * A mapping made through a holder's fd becomes a real shmem mapping: the
 * VMA's vm_file is switched to the segment's shmem file (as ashmem and
 * i915's gemfs do) and shmem's ->mmap sets it up, so the VMA sits in the
 * shmem inode's i_mmap tree and its pages are reclaimed, swapped,
 * migrated and compacted through rmap like any shmem page.  We then wrap
 * shmem's vm_operations_struct with ours, which adds ->open and ->close
 * to count the VMA as a reference on its holder and forwards every hook
 * shmem has to shmem.  What this keeps and what it loses (vma_is_shmem()
 * is false for our VMAs) is in Documentation/design/lifetimes.rst.
 *
 * Locking: ->mmap runs with mmap_lock held for writing, ->open and
 * ->close under mmap_lock too (or with the mm going away); none of them
 * takes a lock of its own, except the segment's when a holder's last
 * reference goes (segment.c).  Faults run under mmap_lock for reading and
 * only forward to shmem.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>

#include "internal.h"

/* shmem's own vm_ops, learnt from the first mapping and checked after. */
static const struct vm_operations_struct *tshm_shmem_vm_ops;

static void tshm_vm_open(struct vm_area_struct *vma)
{
	struct tshm_holder *h = vma->vm_private_data;

	refcount_inc(&h->ref);
}

static void tshm_vm_close(struct vm_area_struct *vma)
{
	tshm_holder_put(vma->vm_private_data);
}

static vm_fault_t tshm_vm_fault(struct vm_fault *vmf)
{
	return tshm_shmem_vm_ops->fault(vmf);
}

static vm_fault_t tshm_vm_map_pages(struct vm_fault *vmf, pgoff_t start,
				    pgoff_t end)
{
	return tshm_shmem_vm_ops->map_pages(vmf, start, end);
}

#ifdef CONFIG_NUMA
static int tshm_vm_set_policy(struct vm_area_struct *vma,
			      struct mempolicy *new)
{
	return tshm_shmem_vm_ops->set_policy(vma, new);
}

TSHM_DEFINE_GET_POLICY_FORWARD(tshm_vm_get_policy, tshm_shmem_vm_ops)
#endif

static const struct vm_operations_struct tshm_vm_ops = {
	.open		= tshm_vm_open,
	.close		= tshm_vm_close,
	.fault		= tshm_vm_fault,
	.map_pages	= tshm_vm_map_pages,
#ifdef CONFIG_NUMA
	.set_policy	= tshm_vm_set_policy,
	.get_policy	= tshm_vm_get_policy,
#endif
};

/*
 * Only wrap shmem's operations if we forward every hook they have: a hook
 * we did not know of (a kernel newer than this module was written for)
 * would be silently lost, and the mere presence of some (page_mkwrite,
 * map_pages) changes how the core treats the VMA.
 */
static bool tshm_shmem_vm_ops_ok(const struct vm_operations_struct *ops)
{
	const struct vm_operations_struct known = {
		.fault		= ops->fault,
		.map_pages	= ops->map_pages,
#ifdef CONFIG_NUMA
		.set_policy	= ops->set_policy,
		.get_policy	= ops->get_policy,
#endif
	};

	if (!ops->fault || !ops->map_pages)
		return false;
#ifdef CONFIG_NUMA
	if (!ops->set_policy || !ops->get_policy)
		return false;
#endif
	return !memcmp(&known, ops, sizeof(known));
}

/**
 * tshm_seg_mmap() - ->mmap of a holder's file
 * @file: the holder's file
 * @vma: the new VMA, vm_file still @file
 *
 * Return: 0; -EINVAL for a private mapping or one reaching past the end
 * of the segment; -EACCES for a writable mapping of a read-only holder;
 * -ENODEV if shmem's vm_ops are not what this module knows how to wrap.
 */
int tshm_seg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct tshm_holder *h = file->private_data;
	struct file *shmem = h->seg->shmem;
	pgoff_t pages = h->seg->size >> PAGE_SHIFT;
	const struct vm_operations_struct *ops;
	int err;

	/* do_mmap() clears VM_SHARED for O_RDONLY files, not VM_MAYSHARE. */
	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	if (vma->vm_pgoff > pages || vma_pages(vma) > pages - vma->vm_pgoff)
		return -EINVAL;
	if (h->rdonly) {
		if (vma->vm_flags & VM_WRITE)
			return -EACCES;
		vm_flags_clear(vma, VM_MAYWRITE);
	}

	/* On error the core puts whatever vm_file is then. */
	vma_set_file(vma, shmem);
	err = call_mmap(shmem, vma);
	if (err)
		return err;

	ops = READ_ONCE(tshm_shmem_vm_ops);
	if (unlikely(vma->vm_ops != ops)) {
		if (ops || !tshm_shmem_vm_ops_ok(vma->vm_ops)) {
			pr_warn_once("unexpected shmem vm_operations, mmap refused\n");
			return -ENODEV;
		}
		WRITE_ONCE(tshm_shmem_vm_ops, vma->vm_ops);
	}

	refcount_inc(&h->ref);
	vma->vm_private_data = h;
	vma->vm_ops = &tshm_vm_ops;
	return 0;
}

/**
 * tshm_seg_get_unmapped_area() - pick an address as shmem would
 * @file: the holder's file
 * @addr: hint
 * @len: length
 * @pgoff: offset in pages
 * @flags: MAP_* flags
 *
 * shmem aligns mappings of huge-page tmpfs files to PMD boundaries so that
 * faults can map whole huge pages; ask it with the shmem file.
 *
 * Return: the address or a negative errno.
 */
unsigned long tshm_seg_get_unmapped_area(struct file *file,
					 unsigned long addr,
					 unsigned long len,
					 unsigned long pgoff,
					 unsigned long flags)
{
	struct tshm_holder *h = file->private_data;
	struct file *shmem = h->seg->shmem;

	if (shmem->f_op->get_unmapped_area)
		return shmem->f_op->get_unmapped_area(shmem, addr, len, pgoff,
						      flags);
	return mm_get_unmapped_area(current->mm, file, addr, len, pgoff,
				    flags);
}
