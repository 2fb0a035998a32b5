// SPDX-License-Identifier: GPL-2.0
/*
 * tshmctl: reading /proc/tshm (Documentation/admin-guide/tshm.rst).
 *
 *   id size resident holders grants flags uid pid comm age name
 *   <one line per segment>
 *   total <segments> <size> <resident>
 *
 * Columns are found by the names in the header, so a newer module that
 * adds columns still reads; one that drops or renames a column we need,
 * or a line that does not split into the header's fields, is an error
 * naming the line.  TSHMCTL_PROC=FILE reads FILE instead (tests).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tshmctl.h"

#define MAX_FIELDS	64

enum col { C_ID, C_SIZE, C_RES, C_HOLDERS, C_GRANTS, C_FLAGS, C_UID, C_PID,
	   C_COMM, C_AGE, C_NAME, NR_COLS };

static const char *const col_names[NR_COLS] = {
	"id", "size", "resident", "holders", "grants", "flags", "uid", "pid",
	"comm", "age", "name",
};

const char *proc_path(void)
{
	const char *p = getenv("TSHMCTL_PROC");

	return p && *p ? p : "/proc/tshm";
}

/* Split @line in place on single spaces; returns the field count. */
static int split(char *line, char **f)
{
	int n = 0;
	char *save, *tok;

	for (tok = strtok_r(line, " ", &save); tok;
	     tok = strtok_r(NULL, " ", &save)) {
		if (n == MAX_FIELDS)
			return -1;
		f[n++] = tok;
	}
	return n;
}

static bool parse_u64(const char *s, uint64_t *v)
{
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return !errno && !*end;
}

static bool parse_s64(const char *s, int64_t *v)
{
	char *end;

	if (!*s)
		return false;
	errno = 0;
	*v = strtoll(s, &end, 10);
	return !errno && !*end;
}

/**
 * unescape_field() - undo the module's \ooo escapes and "-" for empty
 *
 * Return: 0, or -EINVAL for a bad escape or an over-long result.
 */
int unescape_field(const char *in, char *out, size_t outlen)
{
	size_t o = 0;

	if (!strcmp(in, "-")) {
		*out = 0;
		return 0;
	}
	for (; *in; in++) {
		unsigned int c = (unsigned char)*in;

		if (c == '\\') {
			if (in[1] < '0' || in[1] > '3' || in[2] < '0' ||
			    in[2] > '7' || in[3] < '0' || in[3] > '7')
				return -EINVAL;
			c = (in[1] - '0') << 6 | (in[2] - '0') << 3 |
			    (in[3] - '0');
			in += 3;
		}
		if (!c || o + 1 >= outlen)
			return -EINVAL;
		out[o++] = c;
	}
	out[o] = 0;
	return 0;
}

static int fail(char *err, size_t len, unsigned int lineno, const char *fmt, ...)
{
	va_list ap;
	int n;

	n = snprintf(err, len, "%s:%u: ", proc_path(), lineno);
	if (n < 0 || (size_t)n >= len)
		n = 0;
	va_start(ap, fmt);
	vsnprintf(err + n, len - n, fmt, ap);
	va_end(ap);
	return -EPROTO;
}

static int parse_seg(char **f, const int *col, struct seg *s, char *err,
		     size_t errlen, unsigned int ln)
{
	uint64_t v[NR_COLS];
	int64_t pid;
	static const enum col nums[] = { C_ID, C_SIZE, C_RES, C_HOLDERS,
					 C_GRANTS, C_UID };
	size_t i;

	memset(s, 0, sizeof(*s));
	for (i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
		if (!parse_u64(f[col[nums[i]]], &v[nums[i]]))
			return fail(err, errlen, ln, "%s '%s' is not a number",
				    col_names[nums[i]], f[col[nums[i]]]);
	s->id = v[C_ID];
	s->size = v[C_SIZE];
	s->resident = v[C_RES];
	if (v[C_HOLDERS] > UINT32_MAX || v[C_GRANTS] > UINT32_MAX ||
	    v[C_UID] > UINT32_MAX)
		return fail(err, errlen, ln, "count or uid out of range");
	s->holders = v[C_HOLDERS];
	s->grants = v[C_GRANTS];
	s->uid = v[C_UID];
	if (!parse_s64(f[col[C_PID]], &pid) || pid < 0 || pid > INT32_MAX)
		return fail(err, errlen, ln, "pid '%s' is not a number",
			    f[col[C_PID]]);
	s->pid = pid;
	if (!parse_s64(f[col[C_AGE]], &s->age) || s->age < 0)
		return fail(err, errlen, ln, "age '%s' is not a number",
			    f[col[C_AGE]]);
	if (strlen(f[col[C_FLAGS]]) >= sizeof(s->flags) ||
	    strspn(f[col[C_FLAGS]], "-hp") != strlen(f[col[C_FLAGS]]))
		return fail(err, errlen, ln, "unknown flags '%s'",
			    f[col[C_FLAGS]]);
	strcpy(s->flags, f[col[C_FLAGS]]);
	if (unescape_field(f[col[C_COMM]], s->comm, sizeof(s->comm)))
		return fail(err, errlen, ln, "bad escape in comm '%s'",
			    f[col[C_COMM]]);
	if (unescape_field(f[col[C_NAME]], s->name, sizeof(s->name)))
		return fail(err, errlen, ln, "bad escape in name '%s'",
			    f[col[C_NAME]]);
	return 0;
}

static int parse_header(char *line, int *col, char *err, size_t errlen)
{
	char *f[MAX_FIELDS];
	int n, i, c;

	n = split(line, f);
	if (n < 0)
		return fail(err, errlen, 1, "header has too many fields");
	for (c = 0; c < NR_COLS; c++) {
		col[c] = -1;
		for (i = 0; i < n; i++)
			if (!strcmp(f[i], col_names[c]))
				col[c] = i;
		if (col[c] < 0)
			return fail(err, errlen, 1,
				    "header has no '%s' column (a newer module? this tshmctl reads format \"%s %s %s ...\")",
				    col_names[c], col_names[0], col_names[1],
				    col_names[2]);
	}
	return n;
}

/**
 * proc_read() - read and check /proc/tshm (or $TSHMCTL_PROC)
 * @t: out: the segments and the totals line; segtab_free() it
 * @err: out: a message naming the file and line, on -EPROTO
 *
 * Return: 0; -errno if the file cannot be read (-ENOENT: not loaded);
 * -EPROTO if it is not in a format we know.
 */
int proc_read(struct segtab *t, char *err, size_t errlen)
{
	char *line = NULL, *f[MAX_FIELDS];
	int col[NR_COLS], nf = 0, n, ret = 0;
	unsigned int ln = 0;
	bool total = false;
	size_t cap = 0, alloc = 0;
	ssize_t len;
	FILE *fp;

	memset(t, 0, sizeof(*t));
	fp = fopen(proc_path(), "re");
	if (!fp) {
		snprintf(err, errlen, "%s: %s", proc_path(), strerror(errno));
		return -errno;
	}
	while ((len = getline(&line, &cap, fp)) >= 0) {
		ln++;
		if (len && line[len - 1] == '\n')
			line[--len] = 0;
		else {
			ret = fail(err, errlen, ln, "line not terminated");
			break;
		}
		if (ln == 1) {
			nf = parse_header(line, col, err, errlen);
			if (nf < 0) {
				ret = nf;
				break;
			}
			continue;
		}
		if (total) {
			ret = fail(err, errlen, ln, "text after the totals line");
			break;
		}
		if (!strncmp(line, "total ", 6)) {
			total = true;
			if (sscanf(line, "total %" SCNu64 " %" SCNu64 " %" SCNu64 "%n",
				   &t->total_segs, &t->total_size,
				   &t->total_resident, &n) != 3 || line[n]) {
				ret = fail(err, errlen, ln,
					   "malformed totals line '%s'", line);
				break;
			}
			continue;
		}
		n = split(line, f);
		if (n != nf) {
			ret = fail(err, errlen, ln,
				   "%d fields where the header has %d", n, nf);
			break;
		}
		if (t->n == alloc) {
			struct seg *s;

			alloc = alloc ? alloc * 2 : 64;
			s = realloc(t->segs, alloc * sizeof(*s));
			if (!s) {
				ret = -ENOMEM;
				snprintf(err, errlen, "out of memory");
				break;
			}
			t->segs = s;
		}
		ret = parse_seg(f, col, &t->segs[t->n], err, errlen, ln);
		if (ret)
			break;
		t->n++;
	}
	if (!ret && ferror(fp)) {
		ret = -errno;
		snprintf(err, errlen, "%s: %s", proc_path(), strerror(errno));
	} else if (!ret && !ln) {
		ret = fail(err, errlen, 1, "empty file, no header");
	} else if (!ret && !total) {
		ret = fail(err, errlen, ln, "no totals line");
	} else if (!ret && t->total_segs != t->n) {
		ret = fail(err, errlen, ln,
			   "totals line counts %" PRIu64 " segments, the file lists %zu",
			   t->total_segs, t->n);
	}
	free(line);
	fclose(fp);
	if (ret)
		segtab_free(t);
	return ret;
}

void segtab_free(struct segtab *t)
{
	size_t i;

	for (i = 0; i < t->n; i++)
		free(t->segs[i].held);
	free(t->segs);
	memset(t, 0, sizeof(*t));
}
