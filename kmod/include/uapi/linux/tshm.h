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
 * Errors beyond the usual EFAULT/EINVAL/E2BIG/ENOTTY/ENOMEM/EMFILE:
 *   CREATE  EOVERFLOW size overflows rounding, EOPNOTSUPP HUGE without THP,
 *           EFBIG over max_segment_bytes, EDQUOT over max_user_bytes,
 *           ENOSPC over max_user_segments (module parameters)
 *   GRANT   EBADF ctx_fd not open, EINVAL ctx_fd not a context,
 *           EACCES read-only holder, EOVERFLOW more than INT_MAX grants
 *   ATTACH  ENOENT no grant on this id in this context (never existed,
 *           freed and not granted all look the same)
 *   DROP    ENOENT no grant, EINVAL count above the grants held
 *
 * See Documentation/userspace-api/tshm.rst for every ioctl and errno.
 */
#ifndef _UAPI_LINUX_TSHM_H
#define _UAPI_LINUX_TSHM_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define TSHM_DEVICE_PATH	"/dev/tshm"

/* Length of a segment's name, terminating NUL included. */
#define TSHM_NAME_LEN		32

/* struct tshm_create.flags */
#define TSHM_CREATE_HUGE	(1U << 0)	/* back with transparent huge pages */
#define TSHM_CREATE_PREFAULT	(1U << 1)	/* allocate every page at CREATE */
#define TSHM_CREATE_NOCLOEXEC	(1U << 2)	/* segment fd without O_CLOEXEC */
#define TSHM_CREATE_FLAGS	(TSHM_CREATE_HUGE | TSHM_CREATE_PREFAULT | \
				 TSHM_CREATE_NOCLOEXEC)

/* struct tshm_attach.flags */
#define TSHM_ATTACH_RDONLY	(1U << 0)	/* PROT_WRITE mappings refused */
#define TSHM_ATTACH_NOCLOEXEC	(1U << 1)	/* segment fd without O_CLOEXEC */
#define TSHM_ATTACH_FLAGS	(TSHM_ATTACH_RDONLY | TSHM_ATTACH_NOCLOEXEC)

/* struct tshm_info.flags: the creation flags, plus */
#define TSHM_INFO_RDONLY	(1U << 31)	/* this fd is a read-only holder */

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
 * struct tshm_grant - TSHM_IOC_GRANT argument (on a segment fd)
 * @argsz:	in: sizeof(struct tshm_grant)
 * @ctx_fd:	in: the context that receives the grants
 * @count:	in: how many grants (> 0)
 * @flags:	in: must be zero
 * @grants:	out: grants this segment has outstanding, after this call
 * @__reserved:	must be zero
 */
struct tshm_grant {
	__u32 argsz;
	__s32 ctx_fd;
	__s32 count;
	__u32 flags;
	__u64 grants;
	__u64 __reserved[2];
};

/**
 * struct tshm_attach - TSHM_IOC_ATTACH / TSHM_IOC_DROP argument (on a context)
 * @argsz:	in: sizeof(struct tshm_attach)
 * @flags:	in: TSHM_ATTACH_* (must be zero for DROP)
 * @id:		in: segment id
 * @count:	in: DROP: grants to give back (> 0); ATTACH: must be zero
 * @fd:		out: ATTACH: the new segment fd (a new holder)
 * @size:	out: ATTACH: the segment's size
 * @__reserved:	must be zero
 */
struct tshm_attach {
	__u32 argsz;
	__u32 flags;
	__u64 id;
	__s32 count;
	__s32 fd;
	__u64 size;
	__u64 __reserved[2];
};

/**
 * struct tshm_info - TSHM_IOC_INFO argument (on a segment fd)
 * @argsz:	in: sizeof(struct tshm_info)
 * @flags:	out: creation flags, TSHM_INFO_RDONLY for a read-only holder
 * @id:		out: segment id
 * @size:	out: size in bytes
 * @resident:	out: bytes resident in memory (not swapped, not holes)
 * @generation:	out: bumped on every change of @holders or @grants
 * @holders:	out: open file descriptions of the segment, mappings included
 * @grants:	out: grants outstanding in all contexts
 * @name:	out: the name given at CREATE
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
	__u64 __reserved[4];
};

#define TSHM_IOC_MAGIC		0xB8

/* On a context fd (an open of /dev/tshm). */
#define TSHM_IOC_CREATE		_IOWR(TSHM_IOC_MAGIC, 0x00, struct tshm_create)
#define TSHM_IOC_ATTACH		_IOWR(TSHM_IOC_MAGIC, 0x01, struct tshm_attach)
#define TSHM_IOC_DROP		_IOW(TSHM_IOC_MAGIC, 0x02, struct tshm_attach)
/* On a segment fd. */
#define TSHM_IOC_GRANT		_IOWR(TSHM_IOC_MAGIC, 0x10, struct tshm_grant)
#define TSHM_IOC_INFO		_IOWR(TSHM_IOC_MAGIC, 0x11, struct tshm_info)

#endif /* _UAPI_LINUX_TSHM_H */
