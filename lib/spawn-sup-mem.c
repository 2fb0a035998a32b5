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
 * supervisor's loop still touches is kept: the pages around its stack
 * pointer and its thread's TLS and TCB, the ranges it names (the board,
 * its own state), the kernel's special mappings, and every loaded ELF
 * object with its .bss (libc's and the library's own code and data).  An
 * ELF object is a file with an executable mapping; its other mappings are
 * those of the same file, and its .bss the part of an anonymous mapping
 * right after one that its program headers cover.  Only those extents are
 * kept, not the whole VMAs that hold them: the kernel merges neighbouring
 * anonymous mappings, and the caller's data may share a VMA with a
 * thread's stack or an object's .bss.  Everything else is unmapped.
 *
 * It is skipped, keeping everything, where that is not known to be safe:
 * under a sanitizer (its shadow and runtime are anonymous memory); with a
 * shadow stack (x86 CET, arm64 GCS: an unnamed anonymous mapping the next
 * return reads); and where a call could still be bound lazily (the
 * dynamic linker would walk its link maps, which live in anonymous
 * memory): the object holding this code must be linked with -z now, as
 * libtshm.so and tshm's Python extension are, or load nothing (static).
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
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tshm-private.h"
#include "spawn.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
	defined(__SANITIZE_HWADDRESS__)
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

#define ELF_EHDR	ElfW(Ehdr)
#define ELF_PHDR	ElfW(Phdr)

/* The dynamic section of the object this code is linked into, if any. */
extern ElfW(Dyn) _DYNAMIC[] __attribute__((weak, visibility("hidden")));

#define MAX_OBJECTS	1024	/* distinct ELF files mapped */
#define MAX_RANGES	1024	/* ranges unmapped per read of the maps */
#define MAX_PASSES	256
#define MAPS_LINE_MAX	8192
#define MAX_KEEP	12	/* 8 named ranges, stack, TP, errno, scratch */
/*
 * Stack kept around the stack pointer, and TLS and TCB around the thread
 * pointer and errno: the TCB (glibc's struct pthread, 2.3 KiB) and the
 * rseq area the kernel writes on each preemption (in the TCB, or from
 * glibc 2.40 right below it) are within a few KiB of the thread pointer.
 */
#define STACK_KEPT	(256 << 10)
#define TLS_KEPT	(64 << 10)

#define ARCH_SHSTK_STATUS_		0x5005	/* asm/prctl.h, 6.6 */
#define PR_GET_SHADOW_STACK_STATUS_	74	/* linux/prctl.h, 6.13 */

struct file_id {
	unsigned long dev;
	unsigned long ino;
};

struct scratch {
	struct file_id obj[MAX_OBJECTS];
	int nobj;
	struct sup_range range[MAX_RANGES];
	int nrange;
	char buf[MAPS_LINE_MAX * 2];
};

/* One line of /proc/self/maps, parsed. */
struct map_line {
	uintptr_t start, end;
	unsigned long offset;
	bool read, exec;
	struct file_id id;	/* ino 0: anonymous */
	const char *name;	/* "" if none */
};

static bool bound_now(void)
{
	bool needs = false;

	if (!_DYNAMIC)
		return true;	/* static: nothing is bound at run time */
	for (const ElfW(Dyn) *d = _DYNAMIC; d->d_tag != DT_NULL; d++) {
		if (d->d_tag == DT_NEEDED)
			needs = true;
		if (d->d_tag == DT_BIND_NOW)
			return true;
		if (d->d_tag == DT_FLAGS && (d->d_un.d_val & DF_BIND_NOW))
			return true;
		if (d->d_tag == DT_FLAGS_1 && (d->d_un.d_val & DF_1_NOW))
			return true;
	}
	return !needs;		/* static-pie: nothing to bind to */
}

static bool shadow_stack(void)
{
	unsigned long on = 0;

#if defined(__x86_64__)
	if (syscall(SYS_arch_prctl, ARCH_SHSTK_STATUS_, &on) == 0 && on)
		return true;
#endif
	on = 0;
	return prctl(PR_GET_SHADOW_STACK_STATUS_, &on, 0, 0, 0) == 0 && on;
}

/*
 * Where the ELF object mapped at @m (its file offset 0) ends in memory,
 * .bss included, page-aligned: from its program headers; 0 if it is not
 * one (or they are not in this mapping).
 */
static uintptr_t object_end(const struct map_line *m, uintptr_t page)
{
	const ELF_EHDR *eh = (const void *)m->start;
	const ELF_PHDR *ph;
	uintptr_t lo = UINTPTR_MAX, hi = 0, size = m->end - m->start;

	if (!m->read || m->offset != 0 || size < sizeof(*eh) ||
	    memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
	    eh->e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 :
				      ELFCLASS32) ||
	    eh->e_phentsize != sizeof(*ph) || eh->e_phoff > size ||
	    eh->e_phnum > (size - eh->e_phoff) / sizeof(*ph))
		return 0;
	ph = (const void *)(m->start + eh->e_phoff);
	for (unsigned int i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type != PT_LOAD)
			continue;
		if ((ph[i].p_vaddr & ~(page - 1)) < lo)
			lo = ph[i].p_vaddr & ~(page - 1);
		if (ph[i].p_vaddr + ph[i].p_memsz > hi)
			hi = ph[i].p_vaddr + ph[i].p_memsz;
	}
	if (lo == UINTPTR_MAX || hi <= lo)
		return 0;
	/* The mapping at offset 0 is the lowest PT_LOAD's first page. */
	return ALIGN_UP(m->start - lo + hi, page);
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
	m->read = c[1] == 'r';
	m->exec = c[3] == 'x';
	c = hex(skip(c + 1, ' '), &m->offset);	/* after the perms */
	if (!c || *c != ' ')
		return false;
	c = hex(c + 1, &maj);
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

/*
 * A range kept, page-aligned, in the VMA that holds @anchor only: a window
 * around the stack pointer must not keep the neighbouring mapping.
 */
struct kept {
	uintptr_t start, end, anchor;
};

struct pass {
	const struct kept *keep;
	int nkeep;
	uintptr_t page;
	uintptr_t object_end;	/* end of the last object mapping seen */
	uintptr_t bss_end;	/* where that object ends in memory */
};

static bool drop(struct scratch *sc, uintptr_t start, uintptr_t end)
{
	if (start >= end)
		return true;
	if (sc->nrange && sc->range[sc->nrange - 1].end == start) {
		sc->range[sc->nrange - 1].end = end;
		return true;
	}
	if (sc->nrange == MAX_RANGES)
		return false;
	sc->range[sc->nrange].start = start;
	sc->range[sc->nrange++].end = end;
	return true;
}

/*
 * Drop [start, end) of @m but the kept ranges from @k on that belong to
 * it; false when the list is full.
 */
static bool drop_but_kept(struct scratch *sc, const struct pass *ps,
			  const struct map_line *m, int k, uintptr_t start,
			  uintptr_t end)
{
	for (; k < ps->nkeep; k++) {
		const struct kept *kp = &ps->keep[k];

		if (kp->anchor < m->start || kp->anchor >= m->end ||
		    kp->end <= start || kp->start >= end)
			continue;
		return drop_but_kept(sc, ps, m, k + 1, start,
				     kp->start > start ? kp->start : start) &&
		       drop_but_kept(sc, ps, m, k + 1,
				     kp->end < end ? kp->end : end, end);
	}
	return drop(sc, start, end);
}

static bool note_unneeded(struct scratch *sc, const struct map_line *m,
			  void *data)
{
	struct pass *ps = data;
	uintptr_t after = ps->object_end, start = m->start;

	ps->object_end = 0;
	if (m->id.ino == 0 && special(m->name))
		return true;
	if (m->id.ino != 0 && is_object(sc, &m->id)) {
		uintptr_t end = object_end(m, ps->page);

		if (end)
			ps->bss_end = end;
		ps->object_end = m->end;
		return true;
	}
	/*
	 * An object's .bss, and maybe more in the same VMA ([heap] when brk
	 * starts right after the program).
	 */
	if (m->id.ino == 0 && after == m->start && ps->bss_end > start)
		start = ps->bss_end < m->end ? ps->bss_end : m->end;
	/* Full: unmap what was noted, and read again. */
	return drop_but_kept(sc, ps, m, 0, start, m->end);
}

static void keep_range(struct kept *keep, int *n, uintptr_t page,
		       uintptr_t anchor, uintptr_t start, uintptr_t end)
{
	keep[*n].start = start & ~(page - 1);
	keep[*n].end = ALIGN_UP(end, page);
	keep[*n].anchor = anchor;
	(*n)++;
}

void sup_let_go(const struct sup_range *range, int nrange)
{
	struct kept keep[MAX_KEEP];
	uintptr_t page = (uintptr_t)getpagesize();
	uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
	uintptr_t tp = (uintptr_t)__builtin_thread_pointer();
	uintptr_t err = (uintptr_t)&errno, lo = err, hi = err;
	struct scratch *sc;
	struct pass ps;
	int n = 0;

	if (SUP_SANITIZED || !bound_now() || shadow_stack() ||
	    nrange > MAX_KEEP - 4)
		return;
	sc = mmap(NULL, sizeof(*sc), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sc == MAP_FAILED)
		return;
	for (int i = 0; i < nrange; i++)
		keep_range(keep, &n, page, range[i].start, range[i].start,
			   range[i].end);
	/* Room below for the loop's calls; its callers' frames above. */
	keep_range(keep, &n, page, sp, sp - STACK_KEPT, sp + STACK_KEPT);
	lo = tp < lo ? tp : lo;
	hi = tp > hi ? tp : hi;
	keep_range(keep, &n, page, tp, lo - TLS_KEPT, hi + TLS_KEPT);
	keep_range(keep, &n, page, err, lo - TLS_KEPT, hi + TLS_KEPT);
	keep_range(keep, &n, page, (uintptr_t)sc, (uintptr_t)sc,
		   (uintptr_t)(sc + 1));
	ps.keep = keep;
	ps.nkeep = n;
	ps.page = page;

	sc->nobj = 0;
	if (!each_line(sc, note_object, NULL))
		goto out;
	for (int pass = 0; pass < MAX_PASSES; pass++) {
		int gone = 0;
		bool whole;

		sc->nrange = 0;
		ps.object_end = ps.bss_end = 0;
		whole = each_line(sc, note_unneeded, &ps);
		for (int i = 0; i < sc->nrange; i++)
			gone += munmap((void *)sc->range[i].start,
				       sc->range[i].end - sc->range[i].start) == 0;
		/* Done, or nothing more will go (mseal()ed). */
		if (whole || !gone)
			break;
	}
out:
	munmap(sc, sizeof(*sc));
}
