// SPDX-License-Identifier: GPL-2.0
/*
 * ordercost: what the doorbell lab's submit path pays to order its doorbells,
 * read from the fabric's own trace events (include/trace/events/mmiosim.h),
 * not from anything the driver says or counts.
 *
 *   ordercost -k NUMBER -N NAME [-i INDENT] [-b KB] -- COMMAND [ARG...]
 *   ordercost -k NUMBER -N NAME [-i INDENT] -f TRACE
 *
 * The first form records the fabric's events while COMMAND runs (ringtest,
 * on the driver under test) with the kernel's trace buffer, KB kilobytes per
 * CPU (default 4096), and passes COMMAND's own lines on as diagnostics; the
 * second reads a trace saved from such a run (the kit's tests). Either
 * prints one KTAP result for test NUMBER, NAME, with a "# NAME:" line:
 *
 *   flush=mmiowb|readback|none   what ordered most bursts
 *   doorbells=N                  doorbell writes posted
 *   bursts=N                     bursts of doorbells (below) that ended
 *   by_mmiowb=N by_read=N        of those, ordered by mmiowb() / a read
 *   unordered=N                  of those, ordered by no flush
 *   idle_flushes=N               mmiowb()s and reads that ordered no doorbell
 *   ordering_ns=N                mean wait of an ordering flush
 *   ns_per_doorbell=N            all ordering waits over all doorbells
 *
 * What needs ordering: a CPU's doorbell writes since its last flush (one
 * burst: writes from one CPU never reorder among themselves, so one flush
 * after the last orders them all), before another CPU posts a doorbell; the
 * lock hand-over is not in the trace (under the 2004 lock rule spin_unlock()
 * does nothing the fabric sees), the next CPU's doorbell is. A burst ends at
 * the first mmiowb() or read on its CPU, or at another CPU's doorbell. It is
 * ordered by the first mmiowb() or read on the writer's CPU after it, if that
 * flush found the last doorbell still in the CPU's posted-write queue: it
 * came straight after the doorbell (an mmiowb() event is only traced when
 * it waited), or it began before the doorbell's drain time. A flush that
 * found the burst gone (a cosmetic mmiowb() in the interrupt handler, after
 * the command completed) ordered nothing and earns nothing; a burst handed
 * over with no such flush (a driver that waits for the card before ringing
 * again, or a race) is unordered. The wait of each ordering flush is the
 * fabric's own: mmiowb()'s wait for the queue to drain, a read's round trip.
 *
 * When a flush began is compared with a drain time, the post's t=, which is
 * on the fabric's clock. A kernel whose mmiowb and read events carry t=
 * (when the wait began, on that clock) is read by it. An older kernel's
 * events have no t=: the flush began at the line's timestamp less its wait,
 * which is on the fabric's clock only while that clock is the hrtimer's
 * (mmiosim.clock=real, all such kernels had). Under mmiosim.clock=skip the
 * fabric's clock runs ahead of the line's timestamp by a lead that grows
 * during a run, so there t= is the only right answer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ktap.h"

/* The card's DOORBELL register (include/linux/mmiosim_ring.h). */
#define DOORBELL	0x1c
#define MAX_CPUS	64
#define TRACING		"/sys/kernel/tracing"


enum fate { MMIOWB, READ, UNORDERED };

struct cpu_state {
	int pending;			/* doorbells posted since its last flush */
	int last_is_doorbell;		/* its last write was the pending doorbell */
	unsigned long long drain;	/* when that doorbell leaves its queue */
};

struct tally {
	struct cpu_state cpu[MAX_CPUS];
	unsigned long doorbells, by[3], idle_flushes, lines;
	unsigned long long ordering_ns;
};

static void close_burst(struct tally *t, unsigned int cpu, enum fate how,
			unsigned long long wait)
{
	t->by[how]++;
	if (how != UNORDERED)
		t->ordering_ns += wait;
	t->cpu[cpu].pending = 0;
}

static void posted(struct tally *t, unsigned int cpu, unsigned long off,
		   unsigned long long drain)
{
	struct cpu_state *c = &t->cpu[cpu];
	unsigned int x;

	if (off != DOORBELL) {
		c->last_is_doorbell = 0;
		return;
	}
	t->doorbells++;
	/* Another CPU's bursts are handed over: they had to be ordered by now. */
	for (x = 0; x < MAX_CPUS; x++)
		if (x != cpu && t->cpu[x].pending)
			close_burst(t, x, UNORDERED, 0);
	c->pending = 1;
	c->last_is_doorbell = 1;
	c->drain = drain;
}

/*
 * An mmiowb() or a read on CPU cpu that waited wait ns: it began at start on
 * the fabric's clock (the event's t=) if has_start, else it ended at the
 * line's timestamp ts.
 */
static void flushed(struct tally *t, unsigned int cpu, enum fate kind,
		    unsigned long long ts, unsigned long long wait,
		    int has_start, unsigned long long start)
{
	struct cpu_state *c = &t->cpu[cpu];
	/* ts is the trace's, to the microsecond: the flush began no earlier. */
	long long began = has_start ? (long long)start : (long long)ts - (long long)wait;

	if (c->pending && (c->last_is_doorbell || (long long)c->drain > began)) {
		close_burst(t, cpu, kind, wait);
	} else {
		if (c->pending)		/* the burst left the queue before it */
			close_burst(t, cpu, UNORDERED, 0);
		t->idle_flushes++;
	}
	c->last_is_doorbell = 0;
}

/*
 * One line of the trace, e.g.
 *   ringtest-55 [001] d.... 1.280073: mmiosim_post: win=0 cpu=1 seq=6 off=0x1c val=0x6 t=1280075153 posted=1280073020
 *   ringtest-55 [001] d.... 1.280075: mmiosim_mmiowb: cpu=1 wait=2133 t=1280073020
 * (an older kernel's: no posted=, and no t= on mmiowb and read).
 * Returns 0 for a line that is not one of the events read here.
 */
static int trace_line(struct tally *t, const char *line)
{
	const char *ev = strstr(line, ": mmiosim_"), *p;
	unsigned long sec, usec, off;
	unsigned long long ts, val, seq, v, start = 0;
	unsigned int cpu, win;
	int n;

	if (!ev)
		return 0;
	for (p = ev; p > line && p[-1] != ' '; p--)
		;
	if (sscanf(p, "%lu.%lu:", &sec, &usec) != 2)
		return 0;
	ts = sec * 1000000000ULL + usec * 1000ULL;
	ev += 2;
	if (sscanf(ev, "mmiosim_post: win=%u cpu=%u seq=%llu off=%lx val=%llx t=%llu",
		   &win, &cpu, &seq, &off, &v, &val) == 6) {
		if (cpu >= MAX_CPUS)
			return 0;
		posted(t, cpu, off, val);
	} else if ((n = sscanf(ev, "mmiosim_mmiowb: cpu=%u wait=%llu t=%llu",
			      &cpu, &val, &start)) >= 2) {
		if (cpu >= MAX_CPUS)
			return 0;
		flushed(t, cpu, MMIOWB, ts, val, n == 3, start);
	} else if ((n = sscanf(ev, "mmiosim_read: win=%u cpu=%u off=%lx val=%llx cost=%llu t=%llu",
			       &win, &cpu, &off, &v, &val, &start)) >= 5) {
		if (cpu >= MAX_CPUS)
			return 0;
		flushed(t, cpu, READ, ts, val, n == 6, start);
	} else {
		return 0;
	}
	t->lines++;
	return 1;
}

/*
 * Read a trace. Returns NULL, or why it cannot be trusted: a buffer that
 * overflowed lost the oldest events, and with them bursts and flushes.
 */
static const char *read_trace(struct tally *t, const char *path)
{
	static char why[128];
	unsigned long in_buf, written;
	char line[512];
	FILE *f = fopen(path, "r");

	if (!f) {
		snprintf(why, sizeof(why), "cannot read %s: %s", path, strerror(errno));
		return why;
	}
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "# entries-in-buffer/entries-written: %lu/%lu",
			   &in_buf, &written) == 2 && in_buf != written) {
			snprintf(why, sizeof(why), "the trace buffer kept %lu of %lu events",
				 in_buf, written);
			fclose(f);
			return why;
		}
		if (strstr(line, "LOST") && strstr(line, "EVENTS")) {
			fclose(f);
			return "the trace lost events";
		}
		trace_line(t, line);
	}
	fclose(f);
	return NULL;
}

static int put(const char *file, const char *val)
{
	char path[256];
	int fd, ok;

	snprintf(path, sizeof(path), TRACING "/%s", file);
	fd = open(path, O_WRONLY | O_TRUNC);
	if (fd < 0)
		return -1;
	ok = write(fd, val, strlen(val)) == (ssize_t)strlen(val);
	close(fd);
	return ok ? 0 : -1;
}

/* Whether an event is on: "1" in its enable file. */
static int event_on(const char *event)
{
	char path[128], c = 0;
	int fd, on;

	snprintf(path, sizeof(path), TRACING "/events/mmiosim/%s/enable", event);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	on = read(fd, &c, 1) == 1 && c == '1';
	close(fd);
	return on;
}

/*
 * Run argv with the fabric's events recorded in the kernel's trace buffer,
 * as vm/record does. The lab guests turn the events on at boot
 * (trace_event=, vm.RECORD_APPEND); this does not: turning one on rewrites
 * kernel text, which in a running TCG guest has ended in a panic. Its
 * output goes on as diagnostics. Returns its exit status, or -1 if the
 * tracing could not be set up.
 */
static int traced_run(char **argv, const char *kb)
{
	static const char *const events[] = { "mmiosim_post", "mmiosim_mmiowb", "mmiosim_read" };
	char line[512];
	FILE *pipe_in;
	int fds[2], status;
	unsigned int i;
	pid_t pid;

	if (put("tracing_on", "0") || put("trace_clock", "mono") ||
	    put("buffer_size_kb", kb) || put("trace", ""))
		return -1;
	for (i = 0; i < sizeof(events) / sizeof(events[0]); i++)
		if (!event_on(events[i]))
			return -1;
	if (pipe(fds))
		return -1;
	put("tracing_on", "1");
	pid = fork();
	if (pid == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execv(argv[0], argv);
		printf("cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(fds[1]);
	pipe_in = fdopen(fds[0], "r");
	while (pipe_in && fgets(line, sizeof(line), pipe_in)) {
		char *s = line + strspn(line, " ");

		s[strcspn(s, "\n")] = 0;
		if (*s == '#')
			ktap_out("%s", s);
		else if (*s)
			ktap_out("# run: %s", s);
	}
	if (pipe_in)
		fclose(pipe_in);
	if (pid < 0 || waitpid(pid, &status, 0) < 0)
		status = -1;
	put("tracing_on", "0");
	if (status == -1)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
	const char *name = "cost", *file = NULL, *kb = "4096", *why, *flush;
	unsigned long bursts, ordered;
	struct tally *t = calloc(1, sizeof(*t));
	int number = 1, opt, rc;

	while ((opt = getopt(argc, argv, "+k:N:i:b:f:")) != -1) {
		switch (opt) {
		case 'k': number = atoi(optarg); break;
		case 'N': name = optarg; break;
		case 'i': ktap_indent = atoi(optarg); break;
		case 'b': kb = optarg; break;
		case 'f': file = optarg; break;
		default:
			fprintf(stderr, "usage: ordercost -k N -N NAME [-i INDENT] [-b KB] -- COMMAND... | -f TRACE\n");
			return 2;
		}
	}
	if (!t)
		return 1;
	if (!file) {
		if (optind >= argc) {
			fprintf(stderr, "ordercost: no command to run\n");
			return 2;
		}
		rc = traced_run(argv + optind, kb);
		if (rc) {
			ktap_out("not ok %d %s # %s", number, name, rc < 0 ?
			    "cannot trace the run (" TRACING ": the mmiosim events on at boot?)" : "the measured run failed");
			return 1;
		}
		file = TRACING "/trace";
	}
	why = read_trace(t, file);
	if (why) {
		ktap_out("not ok %d %s # %s", number, name, why);
		return 1;
	}
	if (!strcmp(file, TRACING "/trace"))
		put("trace", "");		/* what it kept is read */
	bursts = t->by[MMIOWB] + t->by[READ] + t->by[UNORDERED];
	ordered = t->by[MMIOWB] + t->by[READ];
	if (bursts && t->by[MMIOWB] * 2 >= bursts && t->by[MMIOWB] >= t->by[READ])
		flush = "mmiowb";
	else if (bursts && t->by[READ] * 2 >= bursts)
		flush = "readback";
	else
		flush = "none";
	ktap_out("# %s: flush=%s doorbells=%lu bursts=%lu by_mmiowb=%lu by_read=%lu unordered=%lu idle_flushes=%lu ordering_ns=%.0f ns_per_doorbell=%.0f",
	    name, flush, t->doorbells, bursts, t->by[MMIOWB], t->by[READ],
	    t->by[UNORDERED], t->idle_flushes,
	    ordered ? (double)t->ordering_ns / ordered : 0.0,
	    t->doorbells ? (double)t->ordering_ns / t->doorbells : 0.0);
	ktap_out("ok %d %s", number, name);
	free(t);
	return 0;
}
