// SPDX-License-Identifier: GPL-2.0
/*
 * ringdrv - driver for the mmiosim ring-doorbell card (the doorbell lab).
 *
 * The card executes commands from a ring of descriptors in DMA memory. To
 * submit, the driver fills the next free descriptor and writes the new
 * producer index to the card's DOORBELL register, just as qla1280 wrote
 * its request ring index to mailbox4. Completions come back in a second
 * ring, announced by an interrupt. /dev/ringdrv lets user space submit
 * commands and wait for their results (see ringdrv_ioctl.h).
 *
 * Several CPUs submit at once; a spinlock serialises them.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/jiffies.h>
#include <linux/miscdevice.h>
#include <linux/mmiosim_ring.h>
#include <linux/module.h>
#include <linux/platform_device.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "ringdrv_ioctl.h"

#define RING_ENTRIES	64
#define CMD_TIMEOUT	msecs_to_jiffies(2000)	/* generous: an emulated CPU can stall */

struct ringdrv_req {
	u32 seq;
	u32 tag;
	u32 slot;
	u64 result;
	bool done;
};

struct ringdrv {
	void __iomem *regs;
	struct mmiosim_ring_desc *desc;
	struct mmiosim_ring_cmpl *cmpl;
	dma_addr_t desc_dma;
	dma_addr_t cmpl_dma;
	spinlock_t lock;		/* protects everything below */
	u32 tail;			/* next free descriptor */
	u32 seq;			/* descriptors submitted, ever */
	u32 cmpl_head;			/* next completion to look at */
	unsigned int busy;		/* descriptors not yet completed */
	struct ringdrv_req *inflight[RING_ENTRIES];
	wait_queue_head_t wq;
	struct ringdrv_stats stats;
	struct miscdevice misc;
};

static struct ringdrv *the_ring;

/*
 * Queue one request and ring the doorbell. Called with rd->lock held and a
 * free descriptor available.
 */
static void ringdrv_post(struct ringdrv *rd, struct ringdrv_req *req, u64 payload)
{
	struct mmiosim_ring_desc *d = &rd->desc[rd->tail];

	req->seq = rd->seq++;
	d->seq = cpu_to_le32(req->seq);
	d->tag = cpu_to_le32(req->tag);
	d->payload = cpu_to_le64(payload);
	rd->inflight[rd->tail] = req;
	rd->busy++;
	rd->stats.submitted++;

	rd->tail = (rd->tail + 1) % RING_ENTRIES;
	writel(rd->tail, rd->regs + MMIOSIM_RING_DOORBELL);
}

/* Queue one command; sleeps while the ring is full. */
static int ringdrv_queue(struct ringdrv *rd, struct ringdrv_req *req, u64 payload)
{
	unsigned long flags;

	spin_lock_irqsave(&rd->lock, flags);
	while (rd->busy >= RING_ENTRIES - 1) {
		spin_unlock_irqrestore(&rd->lock, flags);
		if (!wait_event_timeout(rd->wq, READ_ONCE(rd->busy) < RING_ENTRIES - 1,
					CMD_TIMEOUT))
			return -EBUSY;
		spin_lock_irqsave(&rd->lock, flags);
	}
	req->slot = rd->tail;
	ringdrv_post(rd, req, payload);
	spin_unlock_irqrestore(&rd->lock, flags);
	return 0;
}

/*
 * Wait for one command until the batch's deadline; a lost one is forgotten,
 * so that a late completion can't touch it.
 */
static int ringdrv_wait(struct ringdrv *rd, struct ringdrv_req *req,
			unsigned long deadline)
{
	long left = max_t(long, (long)(deadline - jiffies), 1);
	unsigned long flags;

	wait_event_timeout(rd->wq, READ_ONCE(req->done), left);
	spin_lock_irqsave(&rd->lock, flags);
	if (!req->done) {
		if (rd->inflight[req->slot] == req) {
			rd->inflight[req->slot] = NULL;
			rd->busy--;
		}
		rd->stats.timeouts++;
	}
	spin_unlock_irqrestore(&rd->lock, flags);
	return req->done ? 0 : -ETIMEDOUT;
}

static int ringdrv_submit(struct ringdrv *rd, struct ringdrv_cmd *cmds, u32 n)
{
	unsigned long deadline = jiffies + CMD_TIMEOUT;
	struct ringdrv_req *reqs;
	u32 i, queued;
	int ret = 0;

	reqs = kcalloc(n, sizeof(*reqs), GFP_KERNEL);
	if (!reqs)
		return -ENOMEM;
	for (queued = 0; queued < n; queued++) {
		reqs[queued].tag = cmds[queued].tag;
		ret = ringdrv_queue(rd, &reqs[queued], cmds[queued].payload);
		if (ret)
			break;
	}
	for (i = 0; i < queued; i++) {
		cmds[i].status = -ringdrv_wait(rd, &reqs[i], deadline);
		cmds[i].result = reqs[i].result;
	}
	kfree(reqs);
	return ret;
}

static irqreturn_t ringdrv_irq(int irq, void *data)
{
	struct ringdrv *rd = data;
	struct mmiosim_ring_cmpl *c;
	struct ringdrv_req *req;
	unsigned int slot;
	bool woke = false;

	spin_lock(&rd->lock);
	for (;;) {
		c = &rd->cmpl[rd->cmpl_head];
		if (!(le32_to_cpu(READ_ONCE(c->flags)) & MMIOSIM_RING_CMPL_VALID))
			break;
		dma_rmb();	/* the entry is complete once VALID is seen */
		slot = le32_to_cpu(c->seq) % RING_ENTRIES;
		req = rd->inflight[slot];
		if (req && req->seq == le32_to_cpu(c->seq) &&
		    req->tag == le32_to_cpu(c->tag)) {
			req->result = le64_to_cpu(c->result);
			WRITE_ONCE(req->done, true);
			rd->inflight[slot] = NULL;
			rd->busy--;
			rd->stats.completed++;
			woke = true;
		} else {
			rd->stats.spurious++;
		}
		WRITE_ONCE(c->flags, 0);
		rd->cmpl_head = (rd->cmpl_head + 1) % RING_ENTRIES;
	}
	writel(MMIOSIM_RING_INT_CMPL, rd->regs + MMIOSIM_RING_INT_ACK);
	spin_unlock(&rd->lock);
	if (woke)
		wake_up_all(&rd->wq);
	return IRQ_HANDLED;
}

static long ringdrv_ioctl(struct file *file, unsigned int op, unsigned long arg)
{
	struct ringdrv_cmd cmds[RINGDRV_BATCH_MAX];
	struct ringdrv *rd = the_ring;
	struct ringdrv_stats stats;
	struct ringdrv_batch batch;
	unsigned long flags;
	void __user *ucmds;
	int ret;

	switch (op) {
	case RINGDRV_SUBMIT:
		if (copy_from_user(&batch, (void __user *)arg, sizeof(batch)))
			return -EFAULT;
		if (!batch.count || batch.count > RINGDRV_BATCH_MAX)
			return -EINVAL;
		ucmds = u64_to_user_ptr(batch.cmds);
		if (copy_from_user(cmds, ucmds, batch.count * sizeof(cmds[0])))
			return -EFAULT;
		ret = ringdrv_submit(rd, cmds, batch.count);
		if (copy_to_user(ucmds, cmds, batch.count * sizeof(cmds[0])))
			return -EFAULT;
		return ret;
	case RINGDRV_STATS:
		spin_lock_irqsave(&rd->lock, flags);
		stats = rd->stats;
		spin_unlock_irqrestore(&rd->lock, flags);
		return copy_to_user((void __user *)arg, &stats, sizeof(stats)) ? -EFAULT : 0;
	}
	return -ENOTTY;
}

static const struct file_operations ringdrv_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = ringdrv_ioctl,
};

static void ringdrv_hw_init(struct ringdrv *rd)
{
	writel(MMIOSIM_RING_CTRL_RESET, rd->regs + MMIOSIM_RING_CTRL);
	writel(RING_ENTRIES, rd->regs + MMIOSIM_RING_SIZE);
	writel(lower_32_bits(rd->desc_dma), rd->regs + MMIOSIM_RING_DESC_LO);
	writel(upper_32_bits(rd->desc_dma), rd->regs + MMIOSIM_RING_DESC_HI);
	writel(lower_32_bits(rd->cmpl_dma), rd->regs + MMIOSIM_RING_CMPL_LO);
	writel(upper_32_bits(rd->cmpl_dma), rd->regs + MMIOSIM_RING_CMPL_HI);
	writel(MMIOSIM_RING_CTRL_ENABLE, rd->regs + MMIOSIM_RING_CTRL);
	writel(MMIOSIM_RING_INT_CMPL, rd->regs + MMIOSIM_RING_INT_ENABLE);
	/* Flush the set-up: the card must be ready before the first command. */
	readl(rd->regs + MMIOSIM_RING_CTRL);
}

static int ringdrv_probe(struct platform_device *pdev)
{
	struct device *dev = &pdev->dev;
	struct ringdrv *rd;
	int irq, ret;

	rd = devm_kzalloc(dev, sizeof(*rd), GFP_KERNEL);
	if (!rd)
		return -ENOMEM;
	rd->regs = devm_platform_ioremap_resource(pdev, 0);
	if (IS_ERR(rd->regs))
		return PTR_ERR(rd->regs);
	if (readl(rd->regs + MMIOSIM_RING_ID) != MMIOSIM_RING_ID_VALUE)
		return dev_err_probe(dev, -ENODEV, "not a ring card\n");
	irq = platform_get_irq(pdev, 0);
	if (irq < 0)
		return irq;

	rd->desc = dmam_alloc_coherent(dev, RING_ENTRIES * sizeof(*rd->desc),
				       &rd->desc_dma, GFP_KERNEL);
	rd->cmpl = dmam_alloc_coherent(dev, RING_ENTRIES * sizeof(*rd->cmpl),
				       &rd->cmpl_dma, GFP_KERNEL);
	if (!rd->desc || !rd->cmpl)
		return -ENOMEM;
	spin_lock_init(&rd->lock);
	init_waitqueue_head(&rd->wq);
	ringdrv_hw_init(rd);

	ret = devm_request_irq(dev, irq, ringdrv_irq, 0, "ringdrv", rd);
	if (ret)
		return ret;
	rd->misc.minor = MISC_DYNAMIC_MINOR;
	rd->misc.name = "ringdrv";
	rd->misc.fops = &ringdrv_fops;
	the_ring = rd;
	ret = misc_register(&rd->misc);
	if (ret)
		return ret;
	platform_set_drvdata(pdev, rd);
	dev_info(dev, "ring of %d descriptors, irq %d\n", RING_ENTRIES, irq);
	return 0;
}

static void ringdrv_remove(struct platform_device *pdev)
{
	struct ringdrv *rd = platform_get_drvdata(pdev);

	misc_deregister(&rd->misc);
	writel(0, rd->regs + MMIOSIM_RING_INT_ENABLE);
	writel(MMIOSIM_RING_CTRL_RESET, rd->regs + MMIOSIM_RING_CTRL);
	/* The card must stop using our rings before devres frees them. */
	readl(rd->regs + MMIOSIM_RING_CTRL);
}

static struct platform_driver ringdrv_driver = {
	.driver.name = MMIOSIM_RING_NAME,
	.probe = ringdrv_probe,
	.remove = ringdrv_remove,
};
module_platform_driver(ringdrv_driver);

MODULE_DESCRIPTION("Driver for the mmiosim ring-doorbell card");
MODULE_LICENSE("GPL");
