// SPDX-License-Identifier: GPL-2.0
/*
 * A test-only module for vm-run's own test: loading it makes the kernel
 * print a WARNING, which vm-run must turn into a failed run.
 */
#include <linux/module.h>
#include <linux/bug.h>

static int __init vmrun_warn_init(void)
{
	WARN(1, "vmrun_warn: deliberate warning for vm-run's self test\n");
	return 0;
}

static void __exit vmrun_warn_exit(void)
{
}

module_init(vmrun_warn_init);
module_exit(vmrun_warn_exit);
MODULE_DESCRIPTION("vm-run self test: emits a kernel WARNING when loaded");
MODULE_LICENSE("GPL");
