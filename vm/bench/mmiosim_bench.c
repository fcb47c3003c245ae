// SPDX-License-Identifier: GPL-2.0
/*
 * mmiosim_bench: measurements of the simulated MMIO fabric, printed as KTAP.
 *
 * 1. Flush cost, as in OLS 2004 table 3: after five posted writes, the time
 *    of a read-back versus the time of mmiowb(), median over many rounds,
 *    on every online CPU. SN2 measured 5940 ns versus 1610 ns (3.7x).
 * 2. Overtakes per 10,000 lock handoffs: CPUs 0 and 1 take turns taking a
 *    spinlock and writing one register; the fabric counts how many writes
 *    reached the bridge behind a write posted later.
 * 3. The accessor's own cost: writel() with the fabric hook against the
 *    plain "movl" that x86's writel() is without the series, both to RAM,
 *    so only the instructions differ.
 * 4. What ARCH_HAS_MMIOWB costs every spinlock of the lab kernel: a lock and
 *    unlock with asm-generic/mmiowb.h's per-CPU bookkeeping against the
 *    same without it, both inline here, uncontended, interrupts off.
 *
 * The writes go to the ring card's SCRATCH register, which has no side
 * effects. Booted with mmiosim.card=0 there is no simulated window, and only
 * the accessor's cost is measured: the case of a kernel that has the series
 * but no simulated device. Loading the module runs everything.
 */
#include <linux/delay.h>
#include <linux/io.h>
#include <linux/kthread.h>
#include <linux/mmiosim.h>
#include <linux/mmiosim_ring.h>
#include <linux/module.h>
#include <linux/preempt.h>
#include <linux/platform_device.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/spinlock.h>

#include <asm/mmiowb.h>

static unsigned int rounds = 201;
module_param(rounds, uint, 0444);
static unsigned int handoffs = 10000;
module_param(handoffs, uint, 0444);

static void __iomem *scratch;
static int test_no;

static int cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

static u64 median(u64 *v, unsigned int n)
{
	sort(v, n, sizeof(*v), cmp_u64, NULL);
	return v[n / 2];
}

struct flush_result {
	u64 readback_ns;
	u64 mmiowb_ns;
};

static long flush_cost(void *arg)
{
	struct flush_result *res = arg;
	u64 *rb, *wb, t0;
	unsigned int r, i;

	rb = kcalloc(rounds, sizeof(u64), GFP_KERNEL);
	wb = kcalloc(rounds, sizeof(u64), GFP_KERNEL);
	if (!rb || !wb)
		goto out;
	for (r = 0; r < rounds; r++) {
		for (i = 0; i < 5; i++)
			writel(i, scratch);
		t0 = ktime_get_ns();
		readl(scratch);
		rb[r] = ktime_get_ns() - t0;

		for (i = 0; i < 5; i++)
			writel(i, scratch);
		t0 = ktime_get_ns();
		mmiowb();
		wb[r] = ktime_get_ns() - t0;
		readl(scratch);		/* start the next round empty */
	}
	res->readback_ns = median(rb, rounds);
	res->mmiowb_ns = median(wb, rounds);
out:
	kfree(rb);
	kfree(wb);
	return 0;
}

static DEFINE_SPINLOCK(handoff_lock);
static atomic_t turn;

struct handoff_arg {
	int me;
	struct completion done;
};

static int handoff_fn(void *p)
{
	struct handoff_arg *a = p;
	unsigned int i;

	for (i = 0; i < handoffs / 2; i++) {
		/* Yield now and then: a busy host can slow a handoff to seconds. */
		while (atomic_read(&turn) != a->me)
			cond_resched();
		spin_lock(&handoff_lock);
		writel(i, scratch);
		spin_unlock(&handoff_lock);
		atomic_set(&turn, !a->me);
	}
	complete(&a->done);
	return 0;
}

static u64 count_overtakes(void)
{
	struct handoff_arg a[2];
	struct mmiosim_stats s0, s1;
	struct task_struct *t[2];
	int i;

	mmiosim_flush();
	mmiosim_get_stats(&s0);
	atomic_set(&turn, 0);
	for (i = 0; i < 2; i++) {
		a[i].me = i;
		init_completion(&a[i].done);
		t[i] = kthread_create(handoff_fn, &a[i], "mmiobench/%d", i);
		if (IS_ERR(t[i]))
			return U64_MAX;
		kthread_bind(t[i], i);
	}
	for (i = 0; i < 2; i++)
		wake_up_process(t[i]);
	for (i = 0; i < 2; i++)
		wait_for_completion(&a[i].done);
	mmiosim_flush();
	mmiosim_get_stats(&s1);
	return s1.overtakes - s0.overtakes;
}

/* x86's writel() as it is without the series. */
static inline void plain_writel(u32 val, void __iomem *addr)
{
	asm volatile("movl %0,%1" : : "r" (val), "m" (*(u32 __force *)addr) : "memory");
}

static void accessor_cost(void)
{
	const unsigned int n = 100000;
	void __iomem *ram;
	u64 t0, hooked, plain;
	unsigned int i;

	ram = (void __iomem __force *)kzalloc(64, GFP_KERNEL);
	if (!ram)
		return;
	t0 = ktime_get_ns();
	for (i = 0; i < n; i++)
		writel(i, ram);
	hooked = ktime_get_ns() - t0;
	t0 = ktime_get_ns();
	for (i = 0; i < n; i++)
		plain_writel(i, ram);
	plain = ktime_get_ns() - t0;
	kfree((void __force *)ram);
	pr_info("    # writel to RAM: %llu ps with the fabric hook, %llu ps without\n",
		hooked * 1000 / n, plain * 1000 / n);
	pr_info("    ok %d accessor_cost\n", ++test_no);
}

static arch_spinlock_t bench_lock = __ARCH_SPIN_LOCK_UNLOCKED;

/* Median ps per lock+unlock pair, with or without the mmiowb() bookkeeping. */
static u64 lock_pair_ps(bool mmiowb_hooks)
{
	const unsigned int n = 100000, trials = 11;
	unsigned long flags;
	u64 t[11], t0;
	unsigned int k, i;

	for (k = 0; k < trials; k++) {
		local_irq_save(flags);
		t0 = ktime_get_ns();
		for (i = 0; i < n; i++) {
			preempt_disable();
			arch_spin_lock(&bench_lock);
			if (mmiowb_hooks)
				mmiowb_spin_lock();
			barrier();
			if (mmiowb_hooks)
				mmiowb_spin_unlock();
			arch_spin_unlock(&bench_lock);
			preempt_enable();
		}
		t[k] = (ktime_get_ns() - t0) * 1000 / n;
		local_irq_restore(flags);
	}
	return median(t, trials);
}

static void spinlock_cost(void)
{
	u64 with = lock_pair_ps(true), without = lock_pair_ps(false);

	pr_info("    # spin_lock+spin_unlock: %llu ps with the mmiowb() bookkeeping, %llu ps without, ratio_x100=%llu\n",
		with, without, without ? with * 100 / without : 0);
	pr_info("    ok %d spinlock_cost\n", ++test_no);
}

static int __init bench_init(void)
{
	struct mmiosim_params p;
	struct flush_result res;
	struct resource *r;
	struct device *dev;
	u64 overtakes;
	int cpu;

	pr_info("KTAP version 1\n");
	pr_info("# Subtest: mmiosim_bench\n");
	dev = bus_find_device_by_name(&platform_bus_type, NULL, MMIOSIM_RING_NAME ".0");
	if (!dev) {
		pr_info("    1..2\n");
		pr_info("    # no ring card: no simulated window, the static key is off\n");
		accessor_cost();
		spinlock_cost();
		pr_info("ok 1 mmiosim_bench\n");
		return 0;
	}
	r = platform_get_resource(to_platform_device(dev), IORESOURCE_MEM, 0);
	put_device(dev);
	if (!r)
		return -ENODEV;
	scratch = ioremap(r->start + MMIOSIM_RING_SCRATCH, 4);
	if (!scratch)
		return -ENOMEM;
	mmiosim_get_params(&p);
	pr_info("    1..%d\n", 3 + num_online_cpus());
	for_each_online_cpu(cpu) {
		memset(&res, 0, sizeof(res));
		work_on_cpu(cpu, flush_cost, &res);
		pr_info("    # cpu%d: readback_ns=%llu mmiowb_ns=%llu ratio_x100=%llu\n",
			cpu, res.readback_ns, res.mmiowb_ns,
			res.mmiowb_ns ? res.readback_ns * 100 / res.mmiowb_ns : 0);
		pr_info("    ok %d flush_cost_cpu%d\n", ++test_no, cpu);
	}
	if (num_online_cpus() >= 2 && cpu_online(1)) {
		overtakes = count_overtakes();
		pr_info("    # handoffs=%u overtakes=%llu profile=%d lock_2004=%d\n",
			handoffs, overtakes, p.profile, p.lock_2004);
		pr_info("    ok %d handoff_overtakes\n", ++test_no);
	} else {
		pr_info("    ok %d handoff_overtakes # SKIP needs 2 CPUs\n", ++test_no);
	}
	accessor_cost();
	spinlock_cost();
	pr_info("ok 1 mmiosim_bench\n");
	return 0;
}

static void __exit bench_exit(void)
{
	if (scratch)
		iounmap(scratch);
}

module_init(bench_init);
module_exit(bench_exit);
MODULE_DESCRIPTION("Measurements of the simulated MMIO fabric");
MODULE_LICENSE("GPL");
MODULE_IMPORT_NS(MMIOSIM);
