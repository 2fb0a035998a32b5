// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl: the segment list as a table a person reads, or as JSON.
 *
 * Table: sizes in B/KiB/MiB/GiB/TiB, ages as durations, names with
 * control characters written \ooo.  JSON: numbers in bytes and seconds,
 * strings with every byte outside printable ASCII written \u00XX (names
 * are bytes, not necessarily UTF-8).  Both are described in tshmctl(8).
 */
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tshmctl.h"

void fmt_bytes(char *buf, size_t len, uint64_t b)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = b;
	int u = -1;

	if (b < 1024) {
		snprintf(buf, len, "%" PRIu64 " B", b);
		return;
	}
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, v < 10 ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

void fmt_age(char *buf, size_t len, int64_t s)
{
	if (s < 60)
		snprintf(buf, len, "%" PRId64 "s", s);
	else if (s < 3600)
		snprintf(buf, len, "%" PRId64 "m%02" PRId64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, len, "%" PRId64 "h%02" PRId64 "m", s / 3600,
			 s / 60 % 60);
	else
		snprintf(buf, len, "%" PRId64 "d%02" PRId64 "h", s / 86400,
			 s / 3600 % 24);
}

void user_name(uint32_t uid, char *buf, size_t len)
{
	struct passwd *pw = getpwuid(uid);

	if (pw)
		snprintf(buf, len, "%s", pw->pw_name);
	else
		snprintf(buf, len, "%u", uid);
}

static enum sort_key sort_by;

static int seg_cmp(const void *a, const void *b)
{
	const struct seg *x = a, *y = b;

	/* Largest, oldest first; ties by id. */
	switch (sort_by) {
	case SORT_SIZE:
		if (x->size != y->size)
			return x->size < y->size ? 1 : -1;
		break;
	case SORT_RESIDENT:
		if (x->resident != y->resident)
			return x->resident < y->resident ? 1 : -1;
		break;
	case SORT_AGE:
		if (x->age != y->age)
			return x->age < y->age ? 1 : -1;
		break;
	case SORT_ID:
		break;
	}
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Keeps the segments --user and --pid select, in --sort order. */
void segtab_filter_sort(struct segtab *t, const struct list_opts *o)
{
	size_t i, n = 0;

	for (i = 0; i < t->n; i++) {
		struct seg *s = &t->segs[i];

		if ((o->have_uid && s->uid != o->uid) ||
		    (o->pid && s->pid != o->pid && !seg_held_by(s, o->pid))) {
			free(s->held);
			continue;
		}
		t->segs[n++] = *s;
	}
	t->n = n;
	sort_by = o->sort;
	qsort(t->segs, t->n, sizeof(*t->segs), seg_cmp);
}

/* Table output: each line cut at o->width, at most o->rows lines. */
struct out {
	FILE *f;
	const struct list_opts *o;
	unsigned int rows;
};

static void line(struct out *w, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void line(struct out *w, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	if (w->o->rows && w->rows >= w->o->rows)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (w->o->width && strlen(buf) > w->o->width)
		buf[w->o->width] = 0;
	fprintf(w->f, "%s\n", buf);
	w->rows++;
}

static void printable(char *out, size_t len, const char *in)
{
	size_t o = 0;

	for (; *in && o + 5 < len; in++) {
		unsigned char c = *in;

		if (c < 0x20 || c == 0x7f)
			o += snprintf(out + o, len - o, "\\%03o", c);
		else
			out[o++] = c;
	}
	out[o] = 0;
	if (!o)
		snprintf(out, len, "-");
}

static void holder_line(struct out *w, const struct holder *h)
{
	char buf[512], sz[32], user[32];
	size_t o = 0;
	unsigned int i;

	user_name(h->uid, user, sizeof(user));
	o += snprintf(buf + o, sizeof(buf) - o, "%*s held by pid %d (%s, %s):",
		      6, "", h->pid, h->comm, user);
	if (h->nr_fds) {
		o += snprintf(buf + o, sizeof(buf) - o, " fd");
		for (i = 0; i < h->nr_fds && o < sizeof(buf); i++)
			o += snprintf(buf + o, sizeof(buf) - o, "%s%d",
				      i ? "," : " ", h->fds[i]);
	}
	if (h->maps && o < sizeof(buf)) {
		fmt_bytes(sz, sizeof(sz), h->mapped);
		o += snprintf(buf + o, sizeof(buf) - o, "%s %s mapped (%u mapping%s)",
			      h->nr_fds ? ";" : "", sz, h->maps,
			      h->maps == 1 ? "" : "s");
	}
	if (h->grants && o < sizeof(buf))
		snprintf(buf + o, sizeof(buf) - o, "%s %" PRIu64 " grant%s in context fd %d",
			 h->nr_fds || h->maps ? ";" : "", h->grants,
			 h->grants == 1 ? "" : "s", h->ctx_fd);
	line(w, "%s", buf);
}

void print_table(FILE *f, const struct segtab *t, const struct list_opts *o)
{
	struct out w = { .f = f, .o = o };
	char size[32], res[32], age[32], user[32], name[160];
	uint64_t tsize = 0, tres = 0;
	size_t i;
	unsigned int j;

	line(&w, "%6s %9s %9s %4s %5s %-5s %-8s %7s %-15s %7s  %s", "ID",
	     "SIZE", "RESIDENT", "HOLD", "GRANT", "FLAGS", "USER", "PID",
	     "COMMAND", "AGE", "NAME");
	for (i = 0; i < t->n; i++) {
		const struct seg *s = &t->segs[i];

		tsize += s->size;
		tres += s->resident;
	}
	for (i = 0; i < t->n; i++) {
		const struct seg *s = &t->segs[i];

		fmt_bytes(size, sizeof(size), s->size);
		fmt_bytes(res, sizeof(res), s->resident);
		fmt_age(age, sizeof(age), s->age);
		user_name(s->uid, user, sizeof(user));
		printable(name, sizeof(name), s->name);
		line(&w, "%6" PRIu64 " %9s %9s %4u %5u %-5s %-8.8s %7d %-15.15s %7s  %s",
		     s->id, size, res, s->holders, s->grants, s->flags, user,
		     s->pid, s->comm[0] ? s->comm : "-", age, name);
		if (o->holders && !s->nr_held && s->holders)
			line(&w, "%6s held by: no process found%s", "",
			     geteuid() ? " (only yours were inspected)" : "");
		for (j = 0; o->holders && j < s->nr_held; j++)
			holder_line(&w, &s->held[j]);
	}
	fmt_bytes(size, sizeof(size), tsize);
	fmt_bytes(res, sizeof(res), tres);
	w.rows = 0;	/* the totals line always shows */
	line(&w, "%zu segment%s, %s, %s resident", t->n, t->n == 1 ? "" : "s",
	     size, res);
}

void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = *s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

static void json_holders(FILE *f, const struct seg *s)
{
	unsigned int i, j;
	char user[32];

	fprintf(f, ",\"held_by\":[");
	for (i = 0; i < s->nr_held; i++) {
		const struct holder *h = &s->held[i];

		user_name(h->uid, user, sizeof(user));
		fprintf(f, "%s{\"pid\":%d,\"comm\":", i ? "," : "", h->pid);
		json_str(f, h->comm);
		fprintf(f, ",\"uid\":%u,\"user\":", h->uid);
		json_str(f, user);
		fprintf(f, ",\"fds\":[");
		for (j = 0; j < h->nr_fds; j++)
			fprintf(f, "%s%d", j ? "," : "", h->fds[j]);
		fprintf(f, "],\"mappings\":%u,\"mapped\":%" PRIu64
			",\"grants\":%" PRIu64 "}", h->maps, h->mapped,
			h->grants);
	}
	fprintf(f, "]");
}

void print_json(FILE *f, const struct segtab *t, const struct list_opts *o)
{
	uint64_t tsize = 0, tres = 0;
	char user[32];
	size_t i;

	fprintf(f, "{\"segments\":[");
	for (i = 0; i < t->n; i++) {
		const struct seg *s = &t->segs[i];

		tsize += s->size;
		tres += s->resident;
		user_name(s->uid, user, sizeof(user));
		fprintf(f, "%s\n {\"id\":%" PRIu64 ",\"size\":%" PRIu64
			",\"resident\":%" PRIu64 ",\"holders\":%u,\"grants\":%u"
			",\"huge\":%s,\"prefault\":%s,\"uid\":%u,\"user\":",
			i ? "," : "", s->id, s->size, s->resident, s->holders,
			s->grants, strchr(s->flags, 'h') ? "true" : "false",
			strchr(s->flags, 'p') ? "true" : "false", s->uid);
		json_str(f, user);
		fprintf(f, ",\"pid\":%d,\"comm\":", s->pid);
		json_str(f, s->comm);
		fprintf(f, ",\"age\":%" PRId64 ",\"name\":", s->age);
		json_str(f, s->name);
		if (o->holders)
			json_holders(f, s);
		fprintf(f, "}");
	}
	fprintf(f, "%s],\n \"total\":{\"segments\":%zu,\"size\":%" PRIu64
		",\"resident\":%" PRIu64 "}}\n", t->n ? "\n" : "", t->n, tsize,
		tres);
}
