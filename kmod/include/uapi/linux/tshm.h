/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * tshm: refcounted shared memory segments with leak-proof lifetimes.
 *
 * This header is the whole ABI between tshm.ko and userspace.  Every ioctl
 * argument starts with @argsz, which the caller sets to sizeof() of the
 * struct it was compiled against: the module accepts any @argsz at least as
 * large as the first version of the struct, zero-fills what an older caller
 * did not pass and refuses (-E2BIG) non-zero bytes it does not understand
 * from a newer caller.  All reserved fields must be zero (-EINVAL otherwise).
 *
 * Out fields are written before a call commits anything; a call that
 * fails has consumed and made nothing.  GRANT writes no user memory.
 *
 * Errors beyond the usual EFAULT/EINVAL/E2BIG/ENOTTY/ENOMEM/EMFILE/EINTR:
 *   CREATE  EOVERFLOW size overflows rounding, EOPNOTSUPP HUGE without THP,
 *           EFBIG over max_segment_bytes, EDQUOT over max_user_bytes,
 *           ENOSPC over max_user_segments (module parameters)
 *   GRANT   EBADF seg_fd not open, EINVAL seg_fd (or the mapping at addr)
 *           not a segment, EFAULT nothing mapped at addr, EACCES a
 *           writable grant from a read-only holder, EOVERFLOW more than
 *           TSHM_GRANTS_MAX grants on the segment
 *   ATTACH  ENOENT no grant on this id in this context (never existed,
 *           freed and not granted all look the same), EACCES only
 *           read-only grants and TSHM_ATTACH_RDONLY not given
 *   DROP    ENOENT no grant, EINVAL count above the grants of that kind
 *
 * See Documentation/userspace-api/tshm.rst for every ioctl and errno.
 */
#ifndef _UAPI_LINUX_TSHM_H
#define _UAPI_LINUX_TSHM_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* Length of a segment's name, terminating NUL included. */
#define TSHM_NAME_LEN		32

/* Most grants one segment may have outstanding (GRANT returns the total). */
#define TSHM_GRANTS_MAX		0x7fffffffU

/* struct tshm_create.flags */
#define TSHM_CREATE_HUGE	(1U << 0)	/* back with transparent huge pages */
#define TSHM_CREATE_PREFAULT	(1U << 1)	/* allocate every page at CREATE */
#define TSHM_CREATE_NOCLOEXEC	(1U << 2)	/* segment fd without O_CLOEXEC */
#define TSHM_CREATE_NOEXEC	(1U << 3)	/* PROT_EXEC mappings refused */
#define TSHM_CREATE_FLAGS	(TSHM_CREATE_HUGE | TSHM_CREATE_PREFAULT | \
				 TSHM_CREATE_NOCLOEXEC | TSHM_CREATE_NOEXEC)

/* struct tshm_grant.flags */
#define TSHM_GRANT_BY_ADDR	(1U << 0)	/* the segment mapped at @addr */
#define TSHM_GRANT_RDONLY	(1U << 1)	/* grants attach read-only */
#define TSHM_GRANT_FLAGS	(TSHM_GRANT_BY_ADDR | TSHM_GRANT_RDONLY)

/* struct tshm_attach.flags */
#define TSHM_ATTACH_RDONLY	(1U << 0)	/* a read-only holder */
#define TSHM_ATTACH_NOCLOEXEC	(1U << 1)	/* segment fd without O_CLOEXEC */
#define TSHM_ATTACH_FLAGS	(TSHM_ATTACH_RDONLY | TSHM_ATTACH_NOCLOEXEC)

/* struct tshm_drop.flags */
#define TSHM_DROP_RDONLY	(1U << 0)	/* give back read-only grants */
#define TSHM_DROP_FLAGS		TSHM_DROP_RDONLY

/* struct tshm_info.flags: about this holder (creation flags: create_flags) */
#define TSHM_INFO_RDONLY	(1U << 0)	/* a read-only holder */

/**
 * struct tshm_create - TSHM_IOC_CREATE argument (on a context fd)
 * @argsz:	in: sizeof(struct tshm_create)
 * @flags:	in: TSHM_CREATE_*
 * @size:	in: bytes; rounded up to the page (or huge page) size
 * @name:	in: NUL-terminated tag shown in /proc/tshm, /proc/PID/maps
 * @fd:		out: the new segment fd (a holder)
 * @__pad:	must be zero
 * @id:		out: the segment id, unique for the module's lifetime
 * @__reserved:	must be zero
 */
struct tshm_create {
	__u32 argsz;
	__u32 flags;
	__u64 size;
	char name[TSHM_NAME_LEN];
	__s32 fd;
	__u32 __pad;
	__u64 id;
	__u64 __reserved[2];
};

/**
 * struct tshm_grant - TSHM_IOC_GRANT argument (on the receiving context)
 * @argsz:	in: sizeof(struct tshm_grant)
 * @flags:	in: TSHM_GRANT_*
 * @seg_fd:	in: a segment fd; -1 with TSHM_GRANT_BY_ADDR
 * @count:	in: how many grants, 1 to TSHM_GRANTS_MAX
 * @addr:	in: with TSHM_GRANT_BY_ADDR, any address inside the caller's
 *		mapping of the segment (no fd needed); zero otherwise
 * @__reserved:	must be zero
 *
 * Returns the number of grants the segment has outstanding afterwards.
 */
struct tshm_grant {
	__u32 argsz;
	__u32 flags;
	__s32 seg_fd;
	__u32 count;
	__u64 addr;
	__u64 __reserved[2];
};

/**
 * struct tshm_attach - TSHM_IOC_ATTACH argument (on a context fd)
 * @argsz:	in: sizeof(struct tshm_attach)
 * @flags:	in: TSHM_ATTACH_*
 * @id:		in: segment id
 * @size:	out: the segment's size
 * @__reserved:	must be zero
 *
 * Returns the new segment fd (a new holder).
 */
struct tshm_attach {
	__u32 argsz;
	__u32 flags;
	__u64 id;
	__u64 size;
	__u64 __reserved[2];
};

/**
 * struct tshm_drop - TSHM_IOC_DROP argument (on a context fd)
 * @argsz:	in: sizeof(struct tshm_drop)
 * @flags:	in: TSHM_DROP_*
 * @id:		in: segment id
 * @count:	in: grants to give back, > 0
 * @__pad:	must be zero
 * @__reserved:	must be zero
 */
struct tshm_drop {
	__u32 argsz;
	__u32 flags;
	__u64 id;
	__u32 count;
	__u32 __pad;
	__u64 __reserved[2];
};

/**
 * struct tshm_info - TSHM_IOC_INFO argument (on a segment fd)
 * @argsz:	in: sizeof(struct tshm_info)
 * @flags:	out: TSHM_INFO_*, about this holder
 * @id:		out: segment id
 * @size:	out: size in bytes
 * @resident:	out: bytes resident in memory (not swapped, not holes)
 * @generation:	out: bumped on every change of @holders or @grants
 * @holders:	out: holders (segment fds, open or kept by mappings)
 * @grants:	out: grants outstanding in all contexts
 * @name:	out: the name given at CREATE
 * @create_flags: out: the TSHM_CREATE_* flags given at CREATE
 * @__pad:	zero on output
 * @__reserved:	zero on output
 */
struct tshm_info {
	__u32 argsz;
	__u32 flags;
	__u64 id;
	__u64 size;
	__u64 resident;
	__u64 generation;
	__u32 holders;
	__u32 grants;
	char name[TSHM_NAME_LEN];
	__u32 create_flags;
	__u32 __pad;
	__u64 __reserved[3];
};

/* Free in Documentation/userspace-api/ioctl/ioctl-number.rst. */
#define TSHM_IOC_MAGIC		0xBC

/* On a context fd (an open of the tshm misc device). */
#define TSHM_IOC_CREATE		_IOWR(TSHM_IOC_MAGIC, 0x00, struct tshm_create)
#define TSHM_IOC_GRANT		_IOW(TSHM_IOC_MAGIC, 0x01, struct tshm_grant)
#define TSHM_IOC_ATTACH		_IOWR(TSHM_IOC_MAGIC, 0x02, struct tshm_attach)
#define TSHM_IOC_DROP		_IOW(TSHM_IOC_MAGIC, 0x03, struct tshm_drop)
/* On a segment fd. */
#define TSHM_IOC_INFO		_IOWR(TSHM_IOC_MAGIC, 0x10, struct tshm_info)

#endif /* _UAPI_LINUX_TSHM_H */
