// SPDX-License-Identifier: GPL-2.0
/*
 * posttest: the posting lab's in-guest test. Pinned to one CPU, it runs
 * CYCLES sessions through /dev/postdrv: START, SUBMIT a few commands,
 * optionally wait WAIT_US, STOP. The card takes a while per command, so
 * without a wait STOP finds commands still running. A session passes when:
 *  - the card's interrupt was off before STOP returned: the card's own
 *    state (ring0/state, kept by the simulator, not by the driver) says when
 *    the disable arrived, in CLOCK_MONOTONIC, which this program also reads
 *    the moment STOP returns;
 *  - no interrupt of the card reaches the kernel after STOP returned (its
 *    line of /proc/interrupts, and the driver's own late_irqs count);
 *  - every command STOP reports completed had its own result, and with
 *    -w (waiting before STOP) every command completed.
 *
 * Prints one KTAP test result on stdout; the harness adds the run's nonce
 * (this program never sees it: a driver could read it from here):
 *   posttest -k NUMBER -N NAME -n CYCLES [-s SEED] [-w WAIT_US|slowest] [-i INDENT]
 *            [-c CPU]
 * It runs pinned to CPU (default 0).
 * "-w slowest" waits as long as the fabric's slowest write can take.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "postdrv_ioctl.h"
#include "ktap.h"
#include "progress.h"

#define PARAMS		"/sys/kernel/debug/mmiosim/params"
#define CARD_PARAMS	"/sys/kernel/debug/mmiosim/ring0/params"
#define CARD_STATE	"/sys/kernel/debug/mmiosim/ring0/state"
#define SETTLE_MARGIN_US	1000	/* interrupt delivery, scheduling */
#define IRQ_SETTLE_US	2000	/* an interrupt raised before STOP returned has been taken */


static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Interrupts delivered for the card: its line of /proc/interrupts. */
static long long card_irqs(void)
{
	char line[1024], *p, *end;
	long long sum = -1, v;
	FILE *f = fopen("/proc/interrupts", "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "irq_sim"))
			continue;
		p = strchr(line, ':');
		if (!p)
			break;
		for (sum = 0, p++; (v = strtoll(p, &end, 10)), end != p; p = end)
			sum += v;
		break;
	}
	fclose(f);
	return sum;
}

/*
 * Send the card's interrupt to another CPU than the one STOP runs on, as
 * an interrupt's affinity often does on a real machine: its handler then
 * runs beside STOP, not nested in it, and an interrupt still on its way
 * when STOP tears down is caught. Returns the CPU, or -1.
 */
static int irq_elsewhere(int self)
{
	char line[1024], path[64];
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	int irq = -1, cpu;
	FILE *f = fopen("/proc/interrupts", "r");

	if (!f || n < 2) {
		if (f)
			fclose(f);
		return -1;
	}
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "irq_sim") && sscanf(line, " %d:", &irq) == 1)
			break;
	fclose(f);
	if (irq < 0)
		return -1;
	cpu = (self + 1) % n;
	snprintf(path, sizeof(path), "/proc/irq/%d/smp_affinity_list", irq);
	f = fopen(path, "w");
	if (!f)
		return -1;
	if (fprintf(f, "%d\n", cpu) < 0)
		cpu = -1;
	if (fclose(f))
		cpu = -1;
	return cpu;
}

/*
 * How long after STOP a late interrupt can still come: the fabric's slowest
 * write (the farthest route, all the jitter, a stall, the bridge) plus a
 * margin. Read from the fabric itself, so the test follows the lab's settings.
 */
static long settle_us(void)
{
	unsigned long long route = 0, jitter = 0, bridge = 0, stall = 0, v;
	unsigned long long service = 0, service_jitter = 0;
	char buf[512], *tok, *save, *p, *end;
	FILE *f = fopen(PARAMS, "r");

	if (!f || !fgets(buf, sizeof(buf), f)) {
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	for (tok = strtok_r(buf, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
		if (!strncmp(tok, "route_ns=", 9)) {
			for (p = tok + 9; *p; p = end + (*end == ',')) {
				v = strtoull(p, &end, 10);
				if (end == p)
					break;
				route = v > route ? v : route;
			}
		} else if (!strncmp(tok, "jitter_ns=", 10)) {
			jitter = strtoull(tok + 10, NULL, 10);
		} else if (!strncmp(tok, "bridge_ns=", 10)) {
			bridge = strtoull(tok + 10, NULL, 10);
		} else if (!strncmp(tok, "stall_ns=", 9)) {
			stall = strtoull(tok + 9, NULL, 10);
		}
	}
	f = fopen(CARD_PARAMS, "r");
	if (!f || !fgets(buf, sizeof(buf), f)) {
		if (f)
			fclose(f);
		return -1;
	}
	fclose(f);
	for (tok = strtok_r(buf, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
		if (!strncmp(tok, "service_ns=", 11))
			service = strtoull(tok + 11, NULL, 10);
		else if (!strncmp(tok, "service_jitter_ns=", 18))
			service_jitter = strtoull(tok + 18, NULL, 10);
	}
	/* A session's commands run one after the other once the doorbell is in. */
	return (long)((route + jitter + bridge + stall +
		       POSTDRV_BATCH_MAX * (service + service_jitter)) / 1000) + SETTLE_MARGIN_US;
}

/* The card's interrupt, now: on, or off since when (CLOCK_MONOTONIC ns). */
static int card_int_state(int *on, long long *off_ns)
{
	char key[64];
	long long v;
	FILE *f = fopen(CARD_STATE, "r");
	int got = 0;

	if (!f)
		return -1;
	while (fscanf(f, "%63s %lld", key, &v) == 2) {
		if (!strcmp(key, "int_enable")) {
			*on = v != 0;
			got |= 1;
		} else if (!strcmp(key, "int_off_ns")) {
			*off_ns = v;
			got |= 2;
		}
	}
	fclose(f);
	return got == 3 ? 0 : -1;
}

static long long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
	struct postdrv_cmd cmds[POSTDRV_BATCH_MAX];
	struct postdrv_batch batch = { .cmds = (uintptr_t)cmds };
	struct postdrv_stats st0, st;
	struct postdrv_report rep;
	int number = 1, cycles = 200, wait_us = 0, cpu = 0, irq_cpu, opt, fd, i, k, n;
	long long irqs_after = 0, lost = 0, bad = 0, errors = 0, first = -1;
	long long a, b, late_seen = 0, int_on_after = 0, t_stop, off_ns = 0, worst_late_ns = 0;
	int on = 0;
	long settle;
	const char *name = "teardown";
	uint64_t seed = 1, x;
	struct timespec t0, t1;
	cpu_set_t set;
	double secs;

	while ((opt = getopt(argc, argv, "k:N:n:s:w:i:c:")) != -1) {
		switch (opt) {
		case 'k': number = atoi(optarg); break;
		case 'N': name = optarg; break;
		case 'n': cycles = atoi(optarg); break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 'w': wait_us = strcmp(optarg, "slowest") ? atoi(optarg) : -1; break;
		case 'i': ktap_indent = atoi(optarg); break;
		case 'c': cpu = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: posttest -k N -N NAME -n CYCLES [-s SEED] [-w WAIT_US|slowest] [-i INDENT] [-c CPU]\n");
			return 2;
		}
	}
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
	settle = settle_us();
	if (settle < 0) {
		ktap_out("not ok %d %s # cannot read the fabric's parameters (%s)", number, name, PARAMS);
		return 1;
	}
	if (wait_us < 0)
		wait_us = settle;	/* -w slowest: nothing can still be in flight */
	fd = open("/dev/postdrv", O_RDWR);
	if (fd < 0 || card_irqs() < 0 || ioctl(fd, POSTDRV_STATS, &st0)) {
		ktap_out("not ok %d %s # cannot use /dev/postdrv or find the card's interrupt: %s",
		    number, name, strerror(errno));
		return 1;
	}
	irq_cpu = irq_elsewhere(cpu);
	if (irq_cpu < 0 && sysconf(_SC_NPROCESSORS_ONLN) > 1) {
		/* Kept on STOP's CPU, its handler would always run nested in STOP. */
		ktap_out("not ok %d %s # the card's interrupt cannot be sent to another CPU (/proc/irq/N/smp_affinity_list: %s); a driver must not pin it (IRQF_NOBALANCING)",
		    number, name, strerror(errno));
		return 1;
	}
	progress_open();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	x = seed;
	for (i = 0; i < cycles; i++) {
		int fail = 0;

		x = splitmix(x);
		n = 1 + x % 16;
		for (k = 0; k < n; k++) {
			cmds[k].tag = (uint32_t)(i << 8 | k);
			cmds[k].reserved = 0;
			cmds[k].payload = splitmix(x ^ k);
		}
		batch.count = n;
		if (ioctl(fd, POSTDRV_START) || ioctl(fd, POSTDRV_SUBMIT, &batch)) {
			ktap_out("# %s: cycle %d: START or SUBMIT failed: %s", name, i, strerror(errno));
			errors++;
			ioctl(fd, POSTDRV_STOP, &rep);
			fail = 1;
			goto next;
		}
		if (wait_us)
			usleep(wait_us);
		if (ioctl(fd, POSTDRV_STOP, &rep)) {
			ktap_out("# %s: cycle %d: STOP failed: %s", name, i, strerror(errno));
			errors++;
			fail = 1;
			goto next;
		}
		t_stop = now_ns();
		a = card_irqs();
		if (card_int_state(&on, &off_ns)) {
			ktap_out("# %s: cannot read %s", name, CARD_STATE);
			errors++;
			fail = 1;
			goto next;
		}
		if (on || off_ns > t_stop) {
			int_on_after++;
			if (!on)
				worst_late_ns = off_ns - t_stop > worst_late_ns ?
						off_ns - t_stop : worst_late_ns;
			fail = 1;
		}
		usleep(wait_us ? settle : IRQ_SETTLE_US);
		b = card_irqs();
		if (b != a) {
			irqs_after += b - a;
			fail = 1;
		}
		if (rep.submitted != (uint64_t)n ||
		    (wait_us && rep.completed != (uint64_t)n)) {
			lost += (long long)n - (long long)rep.completed;
			fail = 1;
		}
		if (rep.bad) {
			bad += rep.bad;
			fail = 1;
		}
next:
		if (ioctl(fd, POSTDRV_STATS, &st) == 0 && st.late_irqs != st0.late_irqs + late_seen) {
			late_seen = st.late_irqs - st0.late_irqs;
			fail = 1;
		}
		if (fail) {
			first = i + 1;
			break;
		}
		progress(i + 1);	/* the heartbeat's: the run moves */
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	ktap_out("# %s: seed=%llu cycles=%d wait_us=%d cpu=%d irq_cpu=%d int_on_after_stop=%lld irqs_after_stop=%lld late_irqs=%lld lost=%lld bad=%lld errors=%lld",
	    name, (unsigned long long)seed, first < 0 ? cycles : (int)first, wait_us, cpu,
	    irq_cpu, int_on_after, irqs_after, late_seen, lost, bad, errors);
	if (int_on_after)
		ktap_out("# %s: the card's interrupt was still on when STOP returned (the disable arrived %lld us later%s)",
		    name, worst_late_ns / 1000, worst_late_ns ? "" : ", or never");
	ktap_out("# %s: seconds=%.2f settle_us=%ld", name, secs, settle);
	if (first >= 0)
		ktap_out("# %s: first_failure_at=%lld", name, first);
	ktap_out("%sok %d %s", first < 0 ? "" : "not ", number, name);
	return first < 0 ? 0 : 1;
}
