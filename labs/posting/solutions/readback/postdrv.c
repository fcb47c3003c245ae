// SPDX-License-Identifier: GPL-2.0
/*
 * postdrv - driver for the mmiosim ring-doorbell card (the posting lab).
 *
 * User space runs sessions through /dev/postdrv (see postdrv_ioctl.h):
 * START resets the card and enables its completion interrupt, SUBMIT
 * queues commands and rings the doorbell without waiting, and STOP quiets
 * the card and tears the session down. The interrupt handler reaps
 * completions into the session, so the session must outlive every
 * interrupt the card raises for it.
 *
 * Read postdrv_stop() first: that is where this lab is.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/dma-mapping.h>
#include <linux/interrupt.h>
#include <linux/io.h>
#include <linux/miscdevice.h>
#include <linux/mmiosim_ring.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/platform_device.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>

#include "postdrv_ioctl.h"

#define RING_ENTRIES	64

/* Everything the interrupt handler needs for one session. */
struct postdrv_session {
	u64 submitted;
	u64 completed;
	u64 bad;
	u32 tag[RING_ENTRIES];
	u64 expect[RING_ENTRIES];
};

struct postdrv {
	void __iomem *regs;
	int irq;
	struct mmiosim_ring_desc *desc;
	struct mmiosim_ring_cmpl *cmpl;
	dma_addr_t desc_dma;
	dma_addr_t cmpl_dma;
	struct mutex ctl;		/* serialises START and STOP */
	spinlock_t lock;		/* protects everything below */
	struct postdrv_session *session;	/* NULL between sessions */
	u32 tail;			/* next free descriptor */
	u32 seq;			/* descriptors submitted this session */
	u32 cmpl_head;			/* next completion to look at */
	struct postdrv_stats stats;
	struct miscdevice misc;
};

static struct postdrv *the_dev;

static irqreturn_t postdrv_irq(int irq, void *data)
{
	struct postdrv *pd = data;
	struct mmiosim_ring_cmpl *c;
	struct postdrv_session *s;
	u32 status, slot, tag;

	status = readl(pd->regs + MMIOSIM_RING_INT_STATUS);
	writel(status, pd->regs + MMIOSIM_RING_INT_ACK);

	spin_lock(&pd->lock);
	pd->stats.irqs++;
	s = pd->session;
	if (!s) {
		/*
		 * The session is gone: in a real driver this handler would now
		 * use freed memory. The lab driver counts it instead (keep
		 * this check; the grader also counts interrupts itself).
		 */
		pd->stats.late_irqs++;
		spin_unlock(&pd->lock);
		return IRQ_HANDLED;
	}
	for (;;) {
		c = &pd->cmpl[pd->cmpl_head];
		if (!(le32_to_cpu(READ_ONCE(c->flags)) & MMIOSIM_RING_CMPL_VALID))
			break;
		dma_rmb();	/* the entry is complete once VALID is seen */
		slot = le32_to_cpu(c->seq) % RING_ENTRIES;
		tag = le32_to_cpu(c->tag);
		if (tag == s->tag[slot] && le64_to_cpu(c->result) == s->expect[slot])
			s->completed++;
		else
			s->bad++;
		WRITE_ONCE(c->flags, 0);
		pd->cmpl_head = (pd->cmpl_head + 1) % RING_ENTRIES;
	}
	spin_unlock(&pd->lock);
	return IRQ_HANDLED;
}

/* Program the card for a new session; nothing of the old one is in flight. */
static void postdrv_hw_start(struct postdrv *pd)
{
	writel(MMIOSIM_RING_CTRL_RESET, pd->regs + MMIOSIM_RING_CTRL);
	readl(pd->regs + MMIOSIM_RING_CTRL);	/* the card is reset: rings unused */
	memset(pd->cmpl, 0, RING_ENTRIES * sizeof(*pd->cmpl));
	pd->tail = 0;
	pd->seq = 0;
	pd->cmpl_head = 0;
	writel(RING_ENTRIES, pd->regs + MMIOSIM_RING_SIZE);
	writel(lower_32_bits(pd->desc_dma), pd->regs + MMIOSIM_RING_DESC_LO);
	writel(upper_32_bits(pd->desc_dma), pd->regs + MMIOSIM_RING_DESC_HI);
	writel(lower_32_bits(pd->cmpl_dma), pd->regs + MMIOSIM_RING_CMPL_LO);
	writel(upper_32_bits(pd->cmpl_dma), pd->regs + MMIOSIM_RING_CMPL_HI);
	writel(MMIOSIM_RING_CTRL_ENABLE, pd->regs + MMIOSIM_RING_CTRL);
	writel(MMIOSIM_RING_INT_CMPL, pd->regs + MMIOSIM_RING_INT_ENABLE);
	readl(pd->regs + MMIOSIM_RING_CTRL);	/* ready before the first command */
}

static int postdrv_start(struct postdrv *pd)
{
	struct postdrv_session *s;

	s = kzalloc(sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	if (READ_ONCE(pd->session)) {
		kfree(s);
		return -EBUSY;
	}
	postdrv_hw_start(pd);
	spin_lock_irq(&pd->lock);
	pd->session = s;
	pd->stats.sessions++;
	spin_unlock_irq(&pd->lock);
	return 0;
}

/*
 * End the session: after this returns, the card must raise no interrupt
 * that could find the session, because it is freed here.
 */
static int postdrv_stop(struct postdrv *pd, struct postdrv_report *rep)
{
	struct postdrv_session *s;

	/* Quiet the card: no more completion interrupts. */
	writel(0, pd->regs + MMIOSIM_RING_INT_ENABLE);
	/*
	 * The write is posted: it may still be on its way to the card, which
	 * can raise an interrupt until it arrives. A read of the card cannot
	 * pass it, so once SCRATCH (no side effects) answers, the card has
	 * the write, and the interrupts it raised before are already here.
	 * qla1280_disable_intrs() does the same with RD_REG_WORD(&reg->ictrl).
	 */
	readl(pd->regs + MMIOSIM_RING_SCRATCH);

	/* Wait for a handler that is already running on another CPU. */
	synchronize_irq(pd->irq);

	/* Tear the session down. */
	spin_lock_irq(&pd->lock);
	s = pd->session;
	pd->session = NULL;
	spin_unlock_irq(&pd->lock);
	if (!s)
		return -EINVAL;
	rep->submitted = s->submitted;
	rep->completed = s->completed;
	rep->bad = s->bad;
	kfree(s);
	return 0;
}

/* Queue the commands and ring the doorbell once; no waiting. */
static int postdrv_submit(struct postdrv *pd, struct postdrv_cmd *cmds, u32 n)
{
	struct mmiosim_ring_desc *d;
	struct postdrv_session *s;
	unsigned long flags;
	u32 i;
	int ret = 0;

	spin_lock_irqsave(&pd->lock, flags);
	s = pd->session;
	if (!s) {
		ret = -EINVAL;
		goto out;
	}
	if (pd->seq + n >= RING_ENTRIES) {	/* one ring's worth per session */
		ret = -ENOSPC;
		goto out;
	}
	for (i = 0; i < n; i++) {
		d = &pd->desc[pd->tail];
		s->tag[pd->tail] = cmds[i].tag;
		s->expect[pd->tail] = mmiosim_ring_result(cmds[i].payload, cmds[i].tag);
		d->seq = cpu_to_le32(pd->seq++);
		d->tag = cpu_to_le32(cmds[i].tag);
		d->payload = cpu_to_le64(cmds[i].payload);
		pd->tail = (pd->tail + 1) % RING_ENTRIES;
		s->submitted++;
	}
	writel(pd->tail, pd->regs + MMIOSIM_RING_DOORBELL);
out:
	spin_unlock_irqrestore(&pd->lock, flags);
	return ret;
}

static long postdrv_ioctl(struct file *file, unsigned int op, unsigned long arg)
{
	struct postdrv_cmd cmds[POSTDRV_BATCH_MAX];
	struct postdrv *pd = the_dev;
	struct postdrv_report rep = {};
	struct postdrv_stats stats;
	struct postdrv_batch batch;
	int ret;

	switch (op) {
	case POSTDRV_START:
		mutex_lock(&pd->ctl);
		ret = postdrv_start(pd);
		mutex_unlock(&pd->ctl);
		return ret;
	case POSTDRV_SUBMIT:
		if (copy_from_user(&batch, (void __user *)arg, sizeof(batch)))
			return -EFAULT;
		if (!batch.count || batch.count > POSTDRV_BATCH_MAX)
			return -EINVAL;
		if (copy_from_user(cmds, u64_to_user_ptr(batch.cmds),
				   batch.count * sizeof(cmds[0])))
			return -EFAULT;
		return postdrv_submit(pd, cmds, batch.count);
	case POSTDRV_STOP:
		mutex_lock(&pd->ctl);
		ret = postdrv_stop(pd, &rep);
		mutex_unlock(&pd->ctl);
		if (ret)
			return ret;
		return copy_to_user((void __user *)arg, &rep, sizeof(rep)) ? -EFAULT : 0;
	case POSTDRV_STATS:
		spin_lock_irq(&pd->lock);
		stats = pd->stats;
		spin_unlock_irq(&pd->lock);
		return copy_to_user((void __user *)arg, &stats, sizeof(stats)) ? -EFAULT : 0;
	}
	return -ENOTTY;
}

static const struct file_operations postdrv_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = postdrv_ioctl,
};

static int postdrv_probe(struct platform_device *pdev)
{
	struct device *dev = &pdev->dev;
	struct postdrv *pd;
	int ret;

	pd = devm_kzalloc(dev, sizeof(*pd), GFP_KERNEL);
	if (!pd)
		return -ENOMEM;
	pd->regs = devm_platform_ioremap_resource(pdev, 0);
	if (IS_ERR(pd->regs))
		return PTR_ERR(pd->regs);
	if (readl(pd->regs + MMIOSIM_RING_ID) != MMIOSIM_RING_ID_VALUE)
		return dev_err_probe(dev, -ENODEV, "not a ring card\n");
	pd->irq = platform_get_irq(pdev, 0);
	if (pd->irq < 0)
		return pd->irq;
	pd->desc = dmam_alloc_coherent(dev, RING_ENTRIES * sizeof(*pd->desc),
				       &pd->desc_dma, GFP_KERNEL);
	pd->cmpl = dmam_alloc_coherent(dev, RING_ENTRIES * sizeof(*pd->cmpl),
				       &pd->cmpl_dma, GFP_KERNEL);
	if (!pd->desc || !pd->cmpl)
		return -ENOMEM;
	mutex_init(&pd->ctl);
	spin_lock_init(&pd->lock);
	/* The card is quiet until the first session. */
	writel(MMIOSIM_RING_CTRL_RESET, pd->regs + MMIOSIM_RING_CTRL);
	readl(pd->regs + MMIOSIM_RING_CTRL);

	ret = devm_request_irq(dev, pd->irq, postdrv_irq, 0, "postdrv", pd);
	if (ret)
		return ret;
	pd->misc.minor = MISC_DYNAMIC_MINOR;
	pd->misc.name = "postdrv";
	pd->misc.fops = &postdrv_fops;
	the_dev = pd;
	ret = misc_register(&pd->misc);
	if (ret)
		return ret;
	platform_set_drvdata(pdev, pd);
	dev_info(dev, "ring of %d descriptors, irq %d\n", RING_ENTRIES, pd->irq);
	return 0;
}

static void postdrv_remove(struct platform_device *pdev)
{
	struct postdrv *pd = platform_get_drvdata(pdev);
	struct postdrv_report rep;

	misc_deregister(&pd->misc);
	if (pd->session)
		postdrv_stop(pd, &rep);
	writel(MMIOSIM_RING_CTRL_RESET, pd->regs + MMIOSIM_RING_CTRL);
	/* The card must stop using our rings before devres frees them. */
	readl(pd->regs + MMIOSIM_RING_CTRL);
}

static struct platform_driver postdrv_driver = {
	.driver.name = MMIOSIM_RING_NAME,
	.probe = postdrv_probe,
	.remove = postdrv_remove,
};
module_platform_driver(postdrv_driver);

MODULE_DESCRIPTION("Driver for the mmiosim ring card (posting lab)");
MODULE_LICENSE("GPL");
