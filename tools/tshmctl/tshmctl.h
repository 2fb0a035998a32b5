/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tshmctl: load, unload and audit tshm.ko.  Shared declarations.
 */
#ifndef TSHMCTL_H
#define TSHMCTL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <linux/tshm.h>

#ifndef TSHMCTL_VERSION
#define TSHMCTL_VERSION	"0.1"	/* tools.mk passes kmod/dkms.conf's */
#endif
#define TSHM_MODNAME	"tshm"
#define TSHM_DEVICE_PATH "/dev/" TSHM_MODNAME	/* the misc device */

/* Exit codes; documented in tshmctl(8). */
enum {
	EXIT_OK		= 0,
	EXIT_FAIL	= 1,	/* the operation failed (errno given) */
	EXIT_USAGE	= 2,	/* unknown command, option or argument */
	EXIT_NOTLOADED	= 3,	/* tshm.ko is not loaded */
	EXIT_BUSY	= 4,	/* unload: in use; load: already loaded */
	EXIT_FORMAT	= 5,	/* /proc/tshm in a format we cannot read */
};

/* One line of /proc/tshm. */
struct seg {
	uint64_t id, size, resident;
	uint32_t holders, grants;
	char flags[8];
	uint32_t uid;
	int pid;
	char comm[64];		/* unescaped */
	int64_t age;		/* seconds */
	char name[64];		/* unescaped */
	struct holder *held;	/* holders.c, NULL until resolved */
	unsigned int nr_held;
};

struct segtab {
	struct seg *segs;
	size_t n;
	/* The totals line. */
	uint64_t total_segs, total_size, total_resident;
};

/* A process that holds a segment. */
struct holder {
	int pid;
	uint32_t uid;
	char comm[64];
	int fds[8];		/* the first few segment fds */
	unsigned int nr_fds;
	unsigned int maps;	/* VMAs */
	uint64_t mapped;	/* bytes */
	uint64_t grants;	/* grants owned by a context the process has open */
	int ctx_fd;		/* that context's fd, -1 if none */
};

/* A process with /dev/tshm open: what keeps the module loaded. */
struct ctxuser {
	int pid;
	char comm[64];
	int fd;
};

/* procfile.c */
const char *proc_path(void);
int proc_read(struct segtab *t, char *err, size_t errlen);
void segtab_free(struct segtab *t);
int unescape_field(const char *in, char *out, size_t outlen);

/* holders.c */
struct holders_scan {
	unsigned int denied;	/* processes we could not inspect */
	struct ctxuser *ctx;	/* /dev/tshm opens */
	size_t nr_ctx;
};
int holders_resolve(struct segtab *t, int only_pid, struct holders_scan *scan);
void holders_scan_free(struct holders_scan *scan);
bool seg_held_by(const struct seg *s, int pid);

/* kmod.c */
int kmod_do_load(const char *path, char **params, int nparams);
int kmod_do_unload(void);
bool module_loaded(void);
int kmod_status_info(char *path, size_t pathlen, char *state, size_t statelen,
		     long *refcnt);

/* output.c */
enum sort_key { SORT_ID, SORT_SIZE, SORT_AGE, SORT_RESIDENT };
struct list_opts {
	bool have_uid;
	uint32_t uid;
	int pid;		/* 0: any */
	enum sort_key sort;
	bool json;
	bool holders;
	unsigned int width;	/* 0: no limit */
	unsigned int rows;	/* 0: no limit */
};
void fmt_bytes(char *buf, size_t len, uint64_t bytes);
void fmt_age(char *buf, size_t len, int64_t secs);
void user_name(uint32_t uid, char *buf, size_t len);
void segtab_filter_sort(struct segtab *t, const struct list_opts *o);
void print_table(FILE *f, const struct segtab *t, const struct list_opts *o);
void print_json(FILE *f, const struct segtab *t, const struct list_opts *o);
void json_str(FILE *f, const char *s);

/* top.c */
int cmd_top(struct list_opts *o, double delay, long iterations);

/* status.c */
int cmd_status(int argc, char **argv);
int cmd_unload(int argc, char **argv);

/* main.c */
extern const char *prog;
void usage(FILE *f);
int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int opt_error(const char *cmd, int c, char **argv);
void errmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int load_list(struct segtab *t, const struct list_opts *o, bool quiet_notes);

#endif
