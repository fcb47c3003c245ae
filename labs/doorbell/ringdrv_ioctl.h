/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The test interface of the ring labs' drivers (doorbell, modern): /dev/ringdrv.
 * Owned by the labs (the grader supplies this file; students don't edit it).
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
	__u32 path;		/* RINGDRV_PATH_*: the submit path to use */
	__u64 cmds;		/* user pointer to struct ringdrv_cmd[count] */
};

/*
 * Submit paths. The doorbell lab's driver has one and ignores the field;
 * the modern lab's driver has one per way of stepping outside what
 * spin_unlock() orders since Linux 5.2.
 */
#define RINGDRV_PATH_DEFAULT	0
#define RINGDRV_PATH_UNLOCK	1	/* doorbell rung after spin_unlock() */
#define RINGDRV_PATH_RELAXED	2	/* writel_relaxed() inside the lock */
#define RINGDRV_PATH_MUTEX	3	/* a mutex instead of the spinlock */

/* What the driver saw; the grader trusts the card's counters, not these. */
struct ringdrv_stats {
	__u64 submitted;
	__u64 completed;
	__u64 spurious;		/* completions that matched no command */
	__u64 timeouts;
};

/* Submit every command, then wait for all, 2 s at most. */
#define RINGDRV_SUBMIT	_IOW('R', 1, struct ringdrv_batch)
#define RINGDRV_STATS	_IOR('R', 2, struct ringdrv_stats)

#endif
