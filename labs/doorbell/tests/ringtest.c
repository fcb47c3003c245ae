// SPDX-License-Identifier: GPL-2.0
/*
 * ringtest: the ring labs' in-guest test (doorbell, modern). One thread pinned per CPU
 * submits commands with unique tags through /dev/ringdrv, BATCH at a time so
 * that the CPUs contend for the driver's lock; every command must
 * complete exactly once with its own result. The card's counters (kept by
 * the simulator, not by the driver under test) must show no stale doorbell,
 * no stale descriptor and exactly one execution per command. A watcher stops
 * the run at the card's first stale doorbell or descriptor (ring0/state).
 *
 * Prints one KTAP test result on stdout, indented by INDENT spaces (the
 * harness adds the run's nonce; this program never sees it: a driver could
 * read it from here). What ordering the doorbells costs is ordercost.c's.
 *   ringtest -k NUMBER -N NAME -t THREADS -n PER_THREAD [-s SEED]
 *            [-i INDENT] [-m PATH]
 * PATH selects the driver's submit path (RINGDRV_PATH_*, modern lab).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "ringdrv_ioctl.h"
#include "ktap.h"
#include "progress.h"

#define BATCH		16	/* commands per submission: keeps the lock contended */

static int fd;
static int per_thread = 1000;
static uint64_t seed = 1;
static unsigned int submit_path;	/* RINGDRV_PATH_* */
static pthread_barrier_t start;
static long submitted_total;	/* atomically counted, for first_failure_at */
static long first_failure = -1;
static int stop;		/* set at the first failure: the verdict is known */

struct worker {
	pthread_t th;
	int cpu;
	int id;
	long ok, lost, corrupt, errors;
};

/* The card's documented result function (include/linux/mmiosim_ring.h). */
static uint64_t expected(uint64_t payload, uint32_t tag)
{
	return payload ^ ((uint64_t)tag * 0x9e3779b97f4a7c15ULL);
}

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static void failed_at(long n)
{
	long old = __atomic_load_n(&first_failure, __ATOMIC_RELAXED);

	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	while ((old < 0 || n < old) &&
	       !__atomic_compare_exchange_n(&first_failure, &old, n, 0,
					    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

static void *work(void *arg)
{
	struct ringdrv_cmd cmds[BATCH];
	struct ringdrv_batch batch = { .cmds = (uintptr_t)cmds, .path = submit_path };
	struct worker *w = arg;
	cpu_set_t set;
	int i, k, n;

	CPU_ZERO(&set);
	CPU_SET(w->cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
	pthread_barrier_wait(&start);
	for (i = 0; i < per_thread && !__atomic_load_n(&stop, __ATOMIC_RELAXED); i += n) {
		long base;

		n = per_thread - i < BATCH ? per_thread - i : BATCH;
		base = __atomic_fetch_add(&submitted_total, n, __ATOMIC_RELAXED);
		for (k = 0; k < n; k++) {
			memset(&cmds[k], 0, sizeof(cmds[k]));
			cmds[k].tag = (uint32_t)w->id << 24 | (i + k);
			cmds[k].payload = splitmix(seed ^ ((uint64_t)cmds[k].tag << 1));
		}
		batch.count = n;
		if (ioctl(fd, RINGDRV_SUBMIT, &batch) < 0 && errno != ETIMEDOUT) {
			w->errors += n;
			failed_at(base + 1);
			continue;
		}
		for (k = 0; k < n; k++) {
			if (cmds[k].status == ETIMEDOUT) {
				w->lost++;
				failed_at(base + k + 1);
			} else if (cmds[k].status) {
				w->errors++;
				failed_at(base + k + 1);
			} else if (cmds[k].result != expected(cmds[k].payload, cmds[k].tag)) {
				w->corrupt++;
				failed_at(base + k + 1);
			} else {
				w->ok++;
			}
		}
		progress(base + n);	/* the heartbeat's: the run moves */
	}
	return NULL;
}

/* "name value" lines of a debugfs counters file. */
static int read_counter(const char *path, const char *name, long long *val)
{
	char key[64];
	long long v;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fscanf(f, "%63s %lld", key, &v) == 2)
		if (!strcmp(key, name)) {
			*val = v;
			fclose(f);
			return 0;
		}
	fclose(f);
	return -1;
}

#define RING "/sys/kernel/debug/mmiosim/ring0/counters"
#define STATE "/sys/kernel/debug/mmiosim/ring0/state"
#define FABRIC "/sys/kernel/debug/mmiosim/stats"

static int workers_done;

/*
 * Stop at the card's first stale doorbell or stale descriptor, which the
 * card's state shows without delivering the writes in flight (reading
 * RING would): the verdict is known, and a wrong driver need not run on.
 */
static void *watch(void *unused)
{
	long long base_db = 0, base_desc = 0, db, desc;
	struct timespec nap = { 0, 2000000 };	/* 2 ms */

	(void)unused;
	if (read_counter(STATE, "stale_doorbells", &base_db) ||
	    read_counter(STATE, "stale_descriptors", &base_desc))
		return NULL;			/* an older card: the end-of-run check still holds */
	while (!__atomic_load_n(&workers_done, __ATOMIC_RELAXED) &&
	       !__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
		nanosleep(&nap, NULL);
		if (read_counter(STATE, "stale_doorbells", &db) ||
		    read_counter(STATE, "stale_descriptors", &desc))
			break;
		if (db > base_db || desc > base_desc)
			failed_at(__atomic_load_n(&submitted_total, __ATOMIC_RELAXED));
	}
	return NULL;
}

struct snapshot {
	long long doorbells, stale_doorbells, executed, stale_descriptors;
	long long reads, mmiowbs, overtakes;
};

static int snap(struct snapshot *s)
{
	return read_counter(RING, "doorbells", &s->doorbells) |
	       read_counter(RING, "stale_doorbells", &s->stale_doorbells) |
	       read_counter(RING, "executed", &s->executed) |
	       read_counter(RING, "stale_descriptors", &s->stale_descriptors) |
	       read_counter(FABRIC, "reads", &s->reads) |
	       read_counter(FABRIC, "mmiowbs", &s->mmiowbs) |
	       read_counter(FABRIC, "overtakes", &s->overtakes);
}

/*
 * A command the driver gave up on (its CMD_TIMEOUT, 2 s of guest time) was
 * lost only if the card never executes it. A ring that raced shows it in the
 * card's stale counters; with none, wait (up to 10 s) for the card to catch
 * up: a guest whose vCPUs the host starved (half a CPU shared by four) runs
 * the card's deliveries late, and the commands complete after the timeout.
 * Returns whether the card then executed exactly one command per command
 * sent, with no stale doorbell or descriptor: lateness, not loss. B is
 * refreshed.
 */
static int late(const struct snapshot *a, struct snapshot *b, long sent)
{
	struct timespec nap = { 0, 50000000 };	/* 50 ms */
	int i;

	if (b->stale_doorbells != a->stale_doorbells ||
	    b->stale_descriptors != a->stale_descriptors)
		return 0;			/* it raced: nothing to wait for */
	for (i = 0; i < 200 && b->executed - a->executed < sent; i++) {
		nanosleep(&nap, NULL);
		if (snap(b))
			return 0;
	}
	return b->executed - a->executed == sent &&
	       b->stale_doorbells == a->stale_doorbells &&
	       b->stale_descriptors == a->stale_descriptors;
}

int main(int argc, char **argv)
{
	int threads = 0, number = 1, i, opt, ncpu;
	long ok = 0, lost = 0, corrupt = 0, errors = 0, sent;
	long long dup;
	const char *name = "race";
	struct snapshot a, b;
	struct worker *w;
	int starved;
	pthread_t watcher;
	struct timespec t0, t1;
	double secs;
	int pass;

	while ((opt = getopt(argc, argv, "k:N:t:n:s:i:m:")) != -1) {
		switch (opt) {
		case 'k': number = atoi(optarg); break;
		case 'N': name = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'n': per_thread = atoi(optarg); break;
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 'i': ktap_indent = atoi(optarg); break;
		case 'm': submit_path = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: ringtest -k N -N NAME -t THREADS -n CMDS [-s SEED] [-i INDENT] [-m PATH]\n");
			return 2;
		}
	}
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (threads <= 0)
		threads = ncpu;
	fd = open("/dev/ringdrv", O_RDWR);
	if (fd < 0 || snap(&a)) {
		ktap_out("not ok %d %s # cannot open /dev/ringdrv or the card's counters: %s",
		    number, name, strerror(errno));
		return 1;
	}
	w = calloc(threads, sizeof(*w));
	progress_open();
	pthread_barrier_init(&start, NULL, threads);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < threads; i++) {
		w[i].cpu = i % ncpu;
		w[i].id = i;
		pthread_create(&w[i].th, NULL, work, &w[i]);
	}
	pthread_create(&watcher, NULL, watch, NULL);
	for (i = 0; i < threads; i++) {
		pthread_join(w[i].th, NULL);
		ok += w[i].ok;
		lost += w[i].lost;
		corrupt += w[i].corrupt;
		errors += w[i].errors;
	}
	__atomic_store_n(&workers_done, 1, __ATOMIC_RELAXED);
	pthread_join(watcher, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	snap(&b);
	sent = ok + lost + corrupt + errors;
	starved = lost && !corrupt && !errors && late(&a, &b, sent);

	dup = b.executed - a.executed - sent;
	ktap_out("# %s: seed=%llu cpus=%d commands=%ld completed=%ld lost=%ld corrupt=%ld errors=%ld duplicated=%lld stale_commands=%lld stale_doorbells=%lld overtakes=%lld",
	    name, (unsigned long long)seed, threads, sent, ok, lost, corrupt, errors,
	    dup > 0 ? dup : 0, b.stale_descriptors - a.stale_descriptors,
	    b.stale_doorbells - a.stale_doorbells, b.overtakes - a.overtakes);
	ktap_out("# %s: reads_per_cmd=%.3f mmiowbs_per_cmd=%.3f throughput_cps=%.0f",
	    name, sent ? (double)(b.reads - a.reads) / sent : 0,
	    sent ? (double)(b.mmiowbs - a.mmiowbs) / sent : 0, secs > 0 ? sent / secs : 0);
	if (first_failure >= 0)
		ktap_out("# %s: first_failure_at=%ld", name, first_failure);
	if (starved)
		ktap_out("# %s: starved=%ld (every command the driver timed out was executed later, once, with no stale doorbell or descriptor: the guest's CPUs were starved, not the ring raced)",
		    name, lost);
	pass = !lost && !corrupt && !errors &&
	       b.executed - a.executed == sent &&
	       b.stale_doorbells == a.stale_doorbells &&
	       b.stale_descriptors == a.stale_descriptors;
	ktap_out("%sok %d %s", pass ? "" : "not ", number, name);
	return pass ? 0 : 1;
}
