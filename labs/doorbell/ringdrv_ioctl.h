/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The test interface of the doorbell lab's driver: /dev/ringdrv.
 * Owned by the lab (the grader supplies this file; students don't edit it).
 */
#ifndef _RINGDRV_IOCTL_H
#define _RINGDRV_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* One command: the card returns mmiosim_ring_result(payload, tag). */
struct ringdrv_cmd {
	__u32 tag;
	__u32 status;		/* out: 0, or ETIMEDOUT if it never completed */
	__u64 payload;
	__u64 result;		/* out */
};

/* Up to RINGDRV_BATCH_MAX commands, submitted one after another. */
#define RINGDRV_BATCH_MAX	32
struct ringdrv_batch {
	__u32 count;
	__u32 reserved;
	__u64 cmds;		/* user pointer to struct ringdrv_cmd[count] */
};

/* What the driver saw; the grader trusts the card's counters, not these. */
struct ringdrv_stats {
	__u64 submitted;
	__u64 completed;
	__u64 spurious;		/* completions that matched no command */
	__u64 timeouts;
};

/* Submit every command, then wait for all, 200 ms at most. */
#define RINGDRV_SUBMIT	_IOW('R', 1, struct ringdrv_batch)
#define RINGDRV_STATS	_IOR('R', 2, struct ringdrv_stats)

#endif
