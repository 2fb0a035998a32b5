// SPDX-License-Identifier: GPL-2.0
/*
 * tshm: /proc/tshm, every live segment.
 *
 *   id size resident holders grants flags uid pid comm age name
 *   <one line per segment>
 *   total <segments> <size> <resident>
 *
 * flags: "h" huge pages, "p" prefaulted, "-" neither.  uid and pid as
 * seen from the reader's user and pid namespaces, comm and name with
 * spaces, backslashes and non-printable bytes escaped as \ooo, "-" for an
 * empty one; age in seconds.  Readers without CAP_SYS_ADMIN see only the
 * segments whose creator's effective uid is their own, and the totals of
 * those.
 *
 * Locking: the whole file is produced under tshm_segs_lock (mutex), so
 * lines and totals are one snapshot and no segment is freed while it is
 * printed; holders and grants are read under each segment's lock.
 */
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/pid_namespace.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/timekeeping.h>

#include "internal.h"

/**
 * tshm_seq_name() - print a name or comm as one awk field
 * @m: the seq_file
 * @name: NUL-terminated
 */
void tshm_seq_name(struct seq_file *m, const char *name)
{
	const unsigned char *p = name;

	if (!*p) {
		seq_putc(m, '-');
		return;
	}
	for (; *p; p++) {
		if (*p <= ' ' || *p >= 0x7f || *p == '\\')
			seq_printf(m, "\\%03o", *p);
		else
			seq_putc(m, *p);
	}
}

static int tshm_proc_show(struct seq_file *m, void *v)
{
	const struct cred *cred = m->file->f_cred;
	struct pid_namespace *pid_ns = proc_pid_ns(file_inode(m->file)->i_sb);
	bool all = file_ns_capable(m->file, &init_user_ns, CAP_SYS_ADMIN);
	time64_t now = ktime_get_boottime_seconds();
	u64 size = 0, resident = 0, res;
	unsigned int holders, grants;
	unsigned long count = 0;
	struct tshm_seg *seg;

	seq_puts(m, "id size resident holders grants flags uid pid comm age name\n");
	mutex_lock(&tshm_segs_lock);
	list_for_each_entry(seg, &tshm_segs, node) {
		if (!all && !uid_eq(seg->uid, cred->euid))
			continue;
		tshm_seg_counts(seg, &holders, &grants, NULL);
		res = tshm_seg_resident(seg);
		seq_printf(m, "%llu %llu %llu %u %u %s%s%s %u %d ",
			   seg->id, seg->size, res, holders, grants,
			   seg->flags & TSHM_CREATE_HUGE ? "h" : "",
			   seg->flags & TSHM_CREATE_PREFAULT ? "p" : "",
			   seg->flags & (TSHM_CREATE_HUGE |
					 TSHM_CREATE_PREFAULT) ? "" : "-",
			   from_kuid_munged(cred->user_ns, seg->uid),
			   pid_nr_ns(seg->pid, pid_ns));
		tshm_seq_name(m, seg->comm);
		seq_printf(m, " %lld ", now - seg->created);
		tshm_seq_name(m, seg->name);
		seq_putc(m, '\n');
		count++;
		size += seg->size;
		resident += res;
	}
	mutex_unlock(&tshm_segs_lock);
	seq_printf(m, "total %lu %llu %llu\n", count, size, resident);
	return 0;
}

/**
 * tshm_proc_init() - create /proc/tshm
 *
 * Return: 0 or -ENOMEM.
 */
int tshm_proc_init(void)
{
	return proc_create_single("tshm", 0444, NULL, tshm_proc_show) ?
		0 : -ENOMEM;
}

/**
 * tshm_proc_exit() - remove /proc/tshm, waiting for its readers
 */
void tshm_proc_exit(void)
{
	remove_proc_entry("tshm", NULL);
}
