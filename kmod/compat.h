/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tshm: the differences between the kernels the module is built for,
 * Debian's 6.1 and 6.12 (Documentation/dev-tools/kernels.rst).
 *
 * The module is written against the newer kernel's interfaces; each shim
 * here gives that interface to the older kernel, with the release that
 * introduced it, so that a shim can be deleted once the oldest supported
 * kernel has the interface.  Nothing outside this file tests the version.
 */
#ifndef TSHM_COMPAT_H
#define TSHM_COMPAT_H

#include <linux/file.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/version.h>

/* 6.12: struct fd is opaque, read through fd_file(). */
#ifndef fd_file
#define fd_file(f)	((f).file)
#endif

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 3, 0)
/* 6.3: vma->vm_flags is read-only outside vm_flags_{set,clear}(). */
static inline void vm_flags_clear(struct vm_area_struct *vma,
				  vm_flags_t flags)
{
	vma->vm_flags &= ~flags;
}
#endif

/* 6.3: inode operations take the mount's idmap, not its user namespace. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
#define tshm_idmap	mnt_idmap
#else
#define tshm_idmap	user_namespace
#endif

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 10, 0)
/* 6.10: mm->get_unmapped_area is gone; this helper replaces it. */
static inline unsigned long mm_get_unmapped_area(struct mm_struct *mm,
						 struct file *file,
						 unsigned long addr,
						 unsigned long len,
						 unsigned long pgoff,
						 unsigned long flags)
{
	return mm->get_unmapped_area(file, addr, len, pgoff, flags);
}
#endif

#ifdef CONFIG_NUMA
/*
 * 6.7: ->get_policy also hands back the interleave index.  Defines NAME,
 * a ->get_policy that forwards to OPS's with the kernel's own signature.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 7, 0)
#define TSHM_DEFINE_GET_POLICY_FORWARD(name, ops)			\
static struct mempolicy *name(struct vm_area_struct *vma,		\
			      unsigned long addr, pgoff_t *ilx)		\
{									\
	return (ops)->get_policy(vma, addr, ilx);			\
}
#else
#define TSHM_DEFINE_GET_POLICY_FORWARD(name, ops)			\
static struct mempolicy *name(struct vm_area_struct *vma,		\
			      unsigned long addr)				\
{									\
	return (ops)->get_policy(vma, addr);				\
}
#endif
#endif /* CONFIG_NUMA */

#endif /* TSHM_COMPAT_H */
