// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: mapping a segment.
 *
 * A holder's file is a file of the segment's shmem inode (same inode,
 * same address_space), with our file_operations.  Its ->mmap checks what
 * tshm promises (shared only, within the segment, no exec for a NOEXEC
 * segment) and hands the VMA to shmem's own ->mmap, which sets shmem's
 * vm_operations.  So the VMA is a shmem VMA in every way the core mm
 * checks: vma_is_shmem(), shmem_file(vm_file), the inode's i_mmap tree.
 * vm_file stays the holder's file: the reference every VMA holds on its
 * file is what keeps the holder alive, and remap_file_pages(), mremap(),
 * merge, split and fork copy or re-mmap that file like any other.  No
 * vm_operations of ours exist.  See Documentation/design/lifetimes.rst.
 *
 * Locking: ->mmap runs with mmap_lock held for writing and takes no lock
 * of its own.  ->fallocate is shmem's, with its locking.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/mm.h>

#include "internal.h"

/**
 * tshm_seg_mmap() - ->mmap of a holder's file
 * @file: the holder's file
 * @vma: the new VMA; vm_file is @file and stays so
 *
 * The core has already refused PROT_WRITE for a read-only holder (an
 * O_RDONLY file) and cleared VM_MAYWRITE.
 *
 * Return: 0; -EINVAL for a private mapping or one reaching past the end
 * of the segment; -EPERM for an executable mapping of a NOEXEC segment;
 * what shmem's ->mmap returns.
 */
int tshm_seg_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct tshm_seg *seg = file->private_data;
	pgoff_t pages = seg->size >> PAGE_SHIFT;

	/* do_mmap() clears VM_SHARED for O_RDONLY files, not VM_MAYSHARE. */
	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	if (vma->vm_pgoff > pages || vma_pages(vma) > pages - vma->vm_pgoff)
		return -EINVAL;
	if (seg->flags & TSHM_CREATE_NOEXEC) {
		/* As do_mmap() does for a file on a noexec mount. */
		if (vma->vm_flags & VM_EXEC)
			return -EPERM;
		vm_flags_clear(vma, VM_MAYEXEC);
	}
	return seg->shmem->f_op->mmap(file, vma);
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
 * faults can map whole huge pages.  It is asked with the segment's own
 * shmem file, the only kind of file shmem's helper accepts.
 *
 * Return: the address or a negative errno.
 */
unsigned long tshm_seg_get_unmapped_area(struct file *file,
					 unsigned long addr,
					 unsigned long len,
					 unsigned long pgoff,
					 unsigned long flags)
{
	struct tshm_seg *seg = file->private_data;
	struct file *shmem = seg->shmem;

	return shmem->f_op->get_unmapped_area(shmem, addr, len, pgoff, flags);
}

/**
 * tshm_seg_fallocate() - ->fallocate of a holder's file
 * @file: the holder's file, opened for writing (vfs_fallocate() checks)
 * @mode: FALLOC_FL_* as shmem takes them
 * @offset: start
 * @len: length
 *
 * shmem's, on the same inode: FALLOC_FL_PUNCH_HOLE (also what
 * MADV_REMOVE on a mapping does) takes pages out of the segment, so that
 * pages a former holder still pins (vmsplice, O_DIRECT) are no longer
 * the segment's when a pool reuses it; allocation is limited by the
 * segment's F_SEAL_GROW.
 *
 * Return: 0 or what shmem returns.
 */
long tshm_seg_fallocate(struct file *file, int mode, loff_t offset,
			loff_t len)
{
	struct tshm_seg *seg = file->private_data;

	return seg->shmem->f_op->fallocate(file, mode, offset, len);
}
