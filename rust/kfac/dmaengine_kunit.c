// SPDX-License-Identifier: GPL-2.0
/*
 * KUnit builds only: an in-kernel client of the driver's dmaengine channels, as a driver using
 * them would be (dmaengine's client API), for rust/live_tests.rs. Declared in dmaengine.h.
 */
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/dma-mapping.h>
#include <linux/dmaengine.h>
#include <linux/slab.h>

#include "dmaengine.h"

/* The callbacks of one burst. */
struct neuron_udma_burst_cb {
	atomic_t noerror, aborted, other, called;
	u32 n;
	struct completion done;
};

static bool neuron_udma_chan_of(struct dma_chan *chan, void *dev)
{
	return chan->device->dev == dev;
}

static void neuron_udma_burst_done(void *arg, const struct dmaengine_result *res)
{
	struct neuron_udma_burst_cb *b = arg;

	if (res->result == DMA_TRANS_NOERROR)
		atomic_inc(&b->noerror);
	else if (res->result == DMA_TRANS_ABORTED)
		atomic_inc(&b->aborted);
	else
		atomic_inc(&b->other);
	if (atomic_inc_return(&b->called) == b->n)
		complete(&b->done);
}

struct dma_chan *neuron_udma_kunit_dma_get(struct device *dev, u32 *chan_id)
{
	dma_cap_mask_t mask;
	struct dma_chan *chan;

	dma_cap_zero(mask);
	dma_cap_set(DMA_MEMCPY, mask);
	chan = dma_request_channel(mask, neuron_udma_chan_of, dev);
	if (chan)
		*chan_id = chan->chan_id;
	return chan;
}

int neuron_udma_kunit_dma_burst(struct dma_chan *chan, u32 n, u64 len,
				struct neuron_udma_kunit_burst *r)
{
	struct device *dev = chan->device->dev;
	struct neuron_udma_burst_cb *b;
	dma_cookie_t *cookies;
	void *src = NULL, *dst = NULL;
	dma_addr_t s, d;
	int ret = 0;
	u32 i;

	b = kzalloc(sizeof(*b), GFP_KERNEL);
	cookies = kcalloc(n, sizeof(*cookies), GFP_KERNEL);
	if (b && cookies) {
		src = dma_alloc_coherent(dev, len, &s, GFP_KERNEL);
		dst = dma_alloc_coherent(dev, len, &d, GFP_KERNEL);
	}
	if (!b || !cookies || !src || !dst) {
		ret = -ENOMEM;
		goto out;
	}
	b->n = n;
	init_completion(&b->done);
	memset(src, 0x5a, len);
	for (i = 0; i < n; i++) {
		struct dma_async_tx_descriptor *tx;

		tx = dmaengine_prep_dma_memcpy(chan, d, s, len, DMA_PREP_INTERRUPT | DMA_CTRL_ACK);
		if (!tx) {
			ret = -ENOMEM;
			break;
		}
		tx->callback_result = neuron_udma_burst_done;
		tx->callback_param = b;
		cookies[i] = dmaengine_submit(tx);
	}
	if (!ret) {
		dma_async_issue_pending(chan);
		if (!wait_for_completion_timeout(&b->done, 120 * HZ))
			ret = -ETIMEDOUT;
	}
	for (i = 0; !ret && i < n; i++)
		if (dmaengine_tx_status(chan, cookies[i], NULL) == DMA_ERROR)
			r->status_error++;
	/* No callback runs after this: @b may go. */
	dmaengine_terminate_sync(chan);
	r->noerror = atomic_read(&b->noerror);
	r->aborted = atomic_read(&b->aborted);
	r->other = atomic_read(&b->other);
out:
	if (dst)
		dma_free_coherent(dev, len, dst, d);
	if (src)
		dma_free_coherent(dev, len, src, s);
	kfree(cookies);
	kfree(b);
	return ret;
}

void neuron_udma_kunit_dma_put(struct dma_chan *chan)
{
	dma_release_channel(chan);
}
