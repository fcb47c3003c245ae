/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The guest test programs' half of the progress heartbeat. The harness
 * (vm/harness-lib.sh) reads PROGRESS_FILE once a second and sends what it
 * finds to the host, tagged; the host (scripts/mmiolab/vm.py) counts a run
 * as stuck when that stops changing, and as slow, not stuck, while it moves.
 * The count only buys a run patience, up to its ceiling: it never scores.
 *
 * progress_open() once, before any thread starts; progress(done) from any
 * thread, cheap enough for every batch: it writes only when done crosses a
 * multiple of PROGRESS_EVERY. Each write is one fixed-width record at
 * offset 0, so writers racing leave one whole record, never a mixture.
 */
#ifndef MMIOLAB_PROGRESS_H
#define MMIOLAB_PROGRESS_H

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#define PROGRESS_FILE	"/tmp/progress"
#define PROGRESS_EVERY	64

static int progress_fd = -1;
static long progress_last = -1;

static inline void progress_open(void)
{
	progress_fd = open(PROGRESS_FILE, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
}

static inline void progress(long done)
{
	char rec[24];
	long step = done / PROGRESS_EVERY;

	if (progress_fd < 0 || __atomic_exchange_n(&progress_last, step, __ATOMIC_RELAXED) == step)
		return;
	snprintf(rec, sizeof(rec), "%20ld\n", done);
	if (pwrite(progress_fd, rec, 21, 0) != 21)
		return;		/* the heartbeat then just says nothing new */
}

#endif
