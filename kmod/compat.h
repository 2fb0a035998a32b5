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

#include <linux/mm.h>
#include <linux/version.h>

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 3, 0)
/* 6.3: vma->vm_flags is read-only outside vm_flags_{set,clear}(). */
static inline void vm_flags_clear(struct vm_area_struct *vma,
				  vm_flags_t flags)
{
	vma->vm_flags &= ~flags;
}
#endif

#endif /* TSHM_COMPAT_H */
