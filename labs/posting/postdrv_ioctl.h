/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The test interface of the posting lab's driver: /dev/postdrv.
 * Owned by the lab (the grader supplies this file; students don't edit it).
 *
 * A session: START resets the card and enables its interrupt, SUBMIT
 * queues commands without waiting, STOP disables the interrupt, tears the
 * session down and reports what the interrupt handler saw.
 */
#ifndef _POSTDRV_IOCTL_H
#define _POSTDRV_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

/* One command: the card returns mmiosim_ring_result(payload, tag). */
struct postdrv_cmd {
	__u32 tag;
	__u32 reserved;
	__u64 payload;
};

#define POSTDRV_BATCH_MAX	32
struct postdrv_batch {
	__u32 count;
	__u32 reserved;
	__u64 cmds;		/* user pointer to struct postdrv_cmd[count] */
};

/* What one session saw, returned by STOP. */
struct postdrv_report {
	__u64 submitted;
	__u64 completed;	/* completions with the right tag and result */
	__u64 bad;		/* completions that matched no command */
};

/* Since the driver loaded; the grader also counts interrupts itself. */
struct postdrv_stats {
	__u64 sessions;
	__u64 irqs;		/* handler runs */
	__u64 late_irqs;	/* handler runs with no session: after teardown */
};

#define POSTDRV_START	_IO('P', 1)
#define POSTDRV_SUBMIT	_IOW('P', 2, struct postdrv_batch)	/* queue, don't wait */
#define POSTDRV_STOP	_IOR('P', 3, struct postdrv_report)
#define POSTDRV_STATS	_IOR('P', 4, struct postdrv_stats)

#endif
