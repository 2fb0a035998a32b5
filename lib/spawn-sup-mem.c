// SPDX-License-Identifier: LGPL-2.1-or-later
/*
 * The supervisor lets go of the caller's memory (see lib/spawn.h).
 *
 * With the fork and spawn methods the supervisor is a fork of the caller.
 * Once its workers run, it executes nothing of the caller's, yet every
 * private page it inherited stays shared copy-on-write with the caller:
 * each page the caller later writes or frees is then held twice, for as
 * long as the set runs (tshm.torch's forkserver zygote, for one, runs as
 * long as the program).  The shared mappings it inherited (segments,
 * /dev/shm files, a torch checkpoint mapped from disk) stay alive with it.
 *
 * sup_let_go() unmaps all of that once the set runs.  What the
 * supervisor's loop still touches is kept: the mappings that hold an
 * address it names (its stack, its thread's TLS and TCB, the board), the
 * kernel's special mappings, and every loaded ELF object with its .bss
 * (what libc and the library's own code and data live in).  An ELF object
 * is a file with an executable mapping; its other mappings are those of
 * the same file, and its .bss the anonymous mapping right after one.
 * Everything else, anonymous or file-backed, is unmapped.
 *
 * It is skipped, keeping everything, where that is not known to be safe:
 * under a sanitizer (its shadow and runtime are anonymous memory), and
 * where a call could still be bound lazily (the dynamic linker would walk
 * its link maps, which live in anonymous memory): the object holding this
 * code must be linked with -z now, as libtshm.so and tshm's Python
 * extension are; a static executable binds nothing at run time.
 *
 * Async-signal-safe: only system calls.  Its scratch memory is a shared
 * anonymous mapping of its own, which never merges with a neighbour.
 */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tshm-private.h"
#include "spawn.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SUP_SANITIZED true
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
	__has_feature(memory_sanitizer)
#define SUP_SANITIZED true
#endif
#endif
#ifndef SUP_SANITIZED
#define SUP_SANITIZED false
#endif

/* The dynamic section of the object this code is linked into, if any. */
extern ElfW(Dyn) _DYNAMIC[] __attribute__((weak, visibility("hidden")));

#define MAX_OBJECTS	1024	/* distinct ELF files mapped */
#define MAX_RANGES	128	/* ranges unmapped per read of the maps */
#define MAX_PASSES	256
#define MAPS_LINE_MAX	8192

struct file_id {
	unsigned long dev;
	unsigned long ino;
};

struct scratch {
	struct file_id obj[MAX_OBJECTS];
	int nobj;
	uintptr_t range[MAX_RANGES][2];
	int nrange;
	char buf[MAPS_LINE_MAX * 2];
};

/* One line of /proc/self/maps, parsed. */
struct map_line {
	uintptr_t start, end;
	bool exec;
	struct file_id id;	/* ino 0: anonymous */
	const char *name;	/* "" if none */
};

static bool bound_now(void)
{
	if (!_DYNAMIC)
		return true;	/* static: nothing is bound at run time */
	for (const ElfW(Dyn) *d = _DYNAMIC; d->d_tag != DT_NULL; d++) {
		if (d->d_tag == DT_BIND_NOW)
			return true;
		if (d->d_tag == DT_FLAGS && (d->d_un.d_val & DF_BIND_NOW))
			return true;
		if (d->d_tag == DT_FLAGS_1 && (d->d_un.d_val & DF_1_NOW))
			return true;
	}
	return false;
}

static const char *hex(const char *c, unsigned long *v)
{
	unsigned long x = 0;
	const char *s = c;

	for (;; c++) {
		if (*c >= '0' && *c <= '9')
			x = x * 16 + (unsigned long)(*c - '0');
		else if (*c >= 'a' && *c <= 'f')
			x = x * 16 + (unsigned long)(*c - 'a' + 10);
		else
			break;
	}
	*v = x;
	return c == s ? NULL : c;
}

static const char *skip(const char *c, char sep)
{
	if (!c)
		return NULL;
	while (*c && *c != sep)
		c++;
	return *c ? c + 1 : NULL;
}

/* "start-end perms offset major:minor inode   name" */
static bool parse(const char *c, struct map_line *m)
{
	unsigned long v, maj, min;

	c = hex(c, &v);
	if (!c || *c != '-')
		return false;
	m->start = v;
	c = hex(c + 1, &v);
	if (!c || *c != ' ' || c[1] == '\0' || c[2] == '\0' || c[3] == '\0')
		return false;
	m->end = v;
	m->exec = c[3] == 'x';
	c = skip(skip(c + 1, ' '), ' ');	/* perms, offset */
	if (!c)
		return false;
	c = hex(c, &maj);
	if (!c || *c != ':')
		return false;
	c = hex(c + 1, &min);
	if (!c || *c != ' ')
		return false;
	m->id.dev = maj << 20 | min;
	for (v = 0, c++; *c >= '0' && *c <= '9'; c++)
		v = v * 10 + (unsigned long)(*c - '0');
	m->id.ino = v;
	while (*c == ' ')
		c++;
	m->name = c;
	return true;
}

static bool is_object(const struct scratch *sc, const struct file_id *id)
{
	for (int i = 0; i < sc->nobj; i++)
		if (sc->obj[i].dev == id->dev && sc->obj[i].ino == id->ino)
			return true;
	return false;
}

static bool holds(const struct map_line *m, const uintptr_t *keep, int nkeep)
{
	for (int i = 0; i < nkeep; i++)
		if (keep[i] >= m->start && keep[i] < m->end)
			return true;
	return false;
}

/* [vdso], [vvar], [stack] and their like; not [heap] or [anon:...]. */
static bool special(const char *name)
{
	return name[0] == '[' && strncmp(name, "[heap]", 6) != 0 &&
	       strncmp(name, "[anon", 5) != 0;
}

/*
 * Read the maps through, calling @fn on each line; false if they could
 * not be read (or a line did not fit), or @fn said stop.
 */
static bool each_line(struct scratch *sc,
		      bool (*fn)(struct scratch *, const struct map_line *,
				 void *), void *data)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	size_t have = 0;
	bool ok = fd >= 0;

	while (ok) {
		ssize_t n = read(fd, sc->buf + have, sizeof(sc->buf) - 1 - have);
		char *line = sc->buf, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			ok = n == 0 && have == 0;
			break;
		}
		have += (size_t)n;
		sc->buf[have] = '\0';
		while ((nl = strchr(line, '\n'))) {
			struct map_line m;

			*nl = '\0';
			if (!parse(line, &m) || !fn(sc, &m, data)) {
				ok = false;
				break;
			}
			line = nl + 1;
		}
		have -= (size_t)(line - sc->buf);
		memmove(sc->buf, line, have);
		if (have >= MAPS_LINE_MAX)
			ok = false;
	}
	if (fd >= 0)
		close(fd);
	return ok;
}

static bool note_object(struct scratch *sc, const struct map_line *m,
			void *data)
{
	(void)data;
	if (!m->exec || m->id.ino == 0 || is_object(sc, &m->id))
		return true;
	if (sc->nobj == MAX_OBJECTS)
		return false;
	sc->obj[sc->nobj++] = m->id;
	return true;
}

struct pass {
	const uintptr_t *keep;
	int nkeep;
	uintptr_t object_end;	/* end of the last object mapping seen */
};

static bool note_unneeded(struct scratch *sc, const struct map_line *m,
			  void *data)
{
	struct pass *ps = data;
	uintptr_t object_end = ps->object_end;

	ps->object_end = 0;
	if (holds(m, ps->keep, ps->nkeep))
		return true;
	if (m->id.ino == 0 && special(m->name))
		return true;
	if (m->id.ino != 0 && is_object(sc, &m->id)) {
		ps->object_end = m->end;
		return true;
	}
	if (m->id.ino == 0 && !m->name[0] && object_end == m->start)
		return true;			/* an object's .bss */
	if (sc->nrange && sc->range[sc->nrange - 1][1] == m->start) {
		sc->range[sc->nrange - 1][1] = m->end;
		return true;
	}
	if (sc->nrange == MAX_RANGES)
		return false;			/* unmap these, read again */
	sc->range[sc->nrange][0] = m->start;
	sc->range[sc->nrange++][1] = m->end;
	return true;
}

void sup_let_go(const uintptr_t *keep_addr, int nkeep)
{
	uintptr_t keep[12];
	struct scratch *sc;
	struct pass ps;
	int i, pass;

	if (SUP_SANITIZED || !bound_now() ||
	    nkeep > (int)ARRAY_SIZE(keep) - 4)
		return;
	sc = mmap(NULL, sizeof(*sc), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sc == MAP_FAILED)
		return;
	for (i = 0; i < nkeep; i++)
		keep[i] = keep_addr[i];
	keep[i++] = (uintptr_t)__builtin_frame_address(0);
	keep[i++] = (uintptr_t)&errno;		/* the thread's TLS */
	keep[i++] = (uintptr_t)__builtin_thread_pointer();	/* its TCB */
	keep[i++] = (uintptr_t)sc;
	ps.keep = keep;
	ps.nkeep = i;

	sc->nobj = 0;
	if (!each_line(sc, note_object, NULL))
		goto out;
	for (pass = 0; pass < MAX_PASSES; pass++) {
		bool whole;

		sc->nrange = 0;
		ps.object_end = 0;
		whole = each_line(sc, note_unneeded, &ps);
		for (i = 0; i < sc->nrange; i++)
			munmap((void *)sc->range[i][0],
			       sc->range[i][1] - sc->range[i][0]);
		if (whole || sc->nrange == 0)
			break;
	}
out:
	munmap(sc, sizeof(*sc));
}
