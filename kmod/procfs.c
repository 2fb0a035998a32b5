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
 * Locking: none that anyone else waits for.  The walk runs under RCU
 * from one segment id to the next (segments are freed after a grace
 * period), one read() at a time, so a reader looping on a large table
 * never holds up creation, teardown, munmap or exit.  Holders and grants
 * are read under each segment's spinlock.  The lines are therefore not
 * one snapshot of the whole table; the totals are the sums of the lines
 * printed.  A segment created during the walk may or may not be listed.
 */
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/pid_namespace.h>
#include <linux/proc_fs.h>
#include <linux/rcupdate.h>
#include <linux/seq_file.h>
#include <linux/timekeeping.h>
#include <linux/xarray.h>

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

/**
 * struct tshm_proc_iter - a reader's walk over tshm_segs
 * @all:	the reader may see every segment (CAP_SYS_ADMIN)
 * @count:	segments printed so far
 * @size:	their sizes
 * @resident:	their resident bytes
 */
struct tshm_proc_iter {
	bool all;
	unsigned long count;
	u64 size;
	u64 resident;
};

#define TSHM_PROC_HEADER	((void *)1)
#define TSHM_PROC_TOTAL		((void *)2)

/*
 * Positions: 0 is the header, then the id of the next segment to look at
 * (ids start at 1 and stay far below the last two), then the totals line,
 * then the end.
 */
#define TSHM_POS_TOTAL		(LLONG_MAX - 1)
#define TSHM_POS_END		LLONG_MAX

static void *tshm_proc_find(struct seq_file *m, loff_t *pos)
{
	struct tshm_proc_iter *it = m->private;
	const struct cred *cred = m->file->f_cred;
	unsigned long index;
	struct tshm_seg *seg;

	if (*pos == TSHM_POS_END)
		return NULL;
	if (*pos != TSHM_POS_TOTAL) {
		xa_for_each_start(&tshm_segs, index, seg, *pos) {
			if (it->all || uid_eq(seg->uid, cred->euid)) {
				*pos = index;
				return seg;
			}
		}
		*pos = TSHM_POS_TOTAL;
	}
	return TSHM_PROC_TOTAL;
}

static void *tshm_proc_start(struct seq_file *m, loff_t *pos)
	__acquires(RCU)
{
	struct tshm_proc_iter *it = m->private;

	rcu_read_lock();
	if (!*pos) {
		it->all = file_ns_capable(m->file, &init_user_ns,
					  CAP_SYS_ADMIN);
		it->count = 0;
		it->size = 0;
		it->resident = 0;
		return TSHM_PROC_HEADER;
	}
	return tshm_proc_find(m, pos);
}

static void *tshm_proc_next(struct seq_file *m, void *v, loff_t *pos)
{
	if (v == TSHM_PROC_TOTAL)
		*pos = TSHM_POS_END;
	else
		++*pos;
	return tshm_proc_find(m, pos);
}

static void tshm_proc_stop(struct seq_file *m, void *v)
	__releases(RCU)
{
	rcu_read_unlock();
}

static void tshm_proc_show_seg(struct seq_file *m, struct tshm_seg *seg)
{
	struct tshm_proc_iter *it = m->private;
	const struct cred *cred = m->file->f_cred;
	struct pid_namespace *pid_ns = proc_pid_ns(file_inode(m->file)->i_sb);
	time64_t now = ktime_get_boottime_seconds();
	unsigned int holders, grants;
	u64 res;

	tshm_seg_counts(seg, &holders, &grants, NULL);
	/* Torn down since the lookup: gone, as far as readers go. */
	if (!holders && !grants)
		return;
	res = tshm_seg_resident(seg);
	seq_printf(m, "%llu %llu %llu %u %u %s%s%s%s %u %d ",
		   seg->id, seg->size, res, holders, grants,
		   seg->flags & TSHM_CREATE_HUGE ? "h" : "",
		   seg->flags & TSHM_CREATE_PREFAULT ? "p" : "",
		   seg->flags & TSHM_CREATE_NOEXEC ? "x" : "",
		   seg->flags & (TSHM_CREATE_HUGE | TSHM_CREATE_PREFAULT |
				 TSHM_CREATE_NOEXEC) ? "" : "-",
		   from_kuid_munged(cred->user_ns, seg->uid),
		   pid_nr_ns(seg->pid, pid_ns));
	tshm_seq_name(m, seg->comm);
	seq_printf(m, " %lld ", now - seg->created);
	tshm_seq_name(m, seg->name);
	seq_putc(m, '\n');
	/* A line that did not fit is shown again: count it once. */
	if (!seq_has_overflowed(m)) {
		it->count++;
		it->size += seg->size;
		it->resident += res;
	}
}

static int tshm_proc_show(struct seq_file *m, void *v)
{
	struct tshm_proc_iter *it = m->private;

	if (v == TSHM_PROC_HEADER)
		seq_puts(m, "id size resident holders grants flags uid pid comm age name\n");
	else if (v == TSHM_PROC_TOTAL)
		seq_printf(m, "total %lu %llu %llu\n", it->count, it->size,
			   it->resident);
	else
		tshm_proc_show_seg(m, v);
	return 0;
}

static const struct seq_operations tshm_proc_seq_ops = {
	.start	= tshm_proc_start,
	.next	= tshm_proc_next,
	.stop	= tshm_proc_stop,
	.show	= tshm_proc_show,
};

/**
 * tshm_proc_init() - create /proc/tshm
 *
 * Return: 0 or -ENOMEM.
 */
int tshm_proc_init(void)
{
	return proc_create_seq_private("tshm", 0444, NULL, &tshm_proc_seq_ops,
				       sizeof(struct tshm_proc_iter), NULL) ?
		0 : -ENOMEM;
}

/**
 * tshm_proc_exit() - remove /proc/tshm, waiting for its readers
 */
void tshm_proc_exit(void)
{
	remove_proc_entry("tshm", NULL);
}
