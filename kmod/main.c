// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: refcounted shared memory segments with leak-proof lifetimes.
 *
 * The module's entry points: /dev/tshm (a misc device whose every open is
 * a context, context.c), /proc/tshm (procfs.c) and the mounts segments
 * live on (segment.c).  See Documentation/admin-guide/tshm.rst.
 *
 * Locking: none here; init and exit run single-threaded, and exit only
 * runs once nothing holds a module reference (no context, segment fd,
 * mapping or grant is left).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/init.h>
#include <linux/miscdevice.h>
#include <linux/module.h>

#include "internal.h"

static struct miscdevice tshm_misc = {
	.minor	= MISC_DYNAMIC_MINOR,
	.name	= "tshm",
	.fops	= &tshm_ctx_fops,
	/* Anyone may create segments; the per-user limits bound them. */
	.mode	= 0666,
};

static int __init tshm_init(void)
{
	int err;

	err = tshm_seg_init();
	if (err)
		return err;
	err = tshm_proc_init();
	if (err)
		goto err_seg;
	err = misc_register(&tshm_misc);
	if (err)
		goto err_proc;
	return 0;

err_proc:
	tshm_proc_exit();
err_seg:
	tshm_seg_exit();
	return err;
}

static void __exit tshm_exit(void)
{
	misc_deregister(&tshm_misc);
	tshm_proc_exit();
	tshm_seg_exit();
}

module_init(tshm_init);
module_exit(tshm_exit);

MODULE_DESCRIPTION("Refcounted shared memory segments with leak-proof lifetimes");
MODULE_AUTHOR("The tshm authors");
MODULE_LICENSE("GPL");
