// SPDX-License-Identifier: GPL-2.0
/*
 * The dmaengine provider (rust/kfac/dmaengine.h): the dma_device of a bound device, its
 * operations (trampolines into rust/dmaengine.rs), cookies and client descriptors.
 */
#include <linux/dmaengine.h>
#include <linux/list.h>
#include <linux/overflow.h>
#include <linux/slab.h>
#include <linux/spinlock.h>

#include "dmaengine.h"

/*
 * No dmaengine abstraction in Rust: the provider of rust/dmaengine.rs, laid out as idxd's: one
 * allocation per device holds the dma_device and one struct dma_chan per channel, each pointing to
 * its Rust channel (a counted reference, owned by the dma_device until its release); a client
 * descriptor embeds its struct dma_async_tx_descriptor and points to its Rust descriptor. Cookies
 * are the dmaengine core's (dma_cookie_*() of drivers/dma/dmaengine.h); channel state, descriptor
 * building and completion are Rust's.
 */
#if __has_include(<dmaengine.h>)
/* <>, not "": rust/kfac/dmaengine.h is this file's own header (Kbuild adds -I drivers/dma). */
#include <dmaengine.h>
#else
#error "neuron_udma needs drivers/dma/dmaengine.h of the kernel's source tree (the dmaengine core's cookie helpers): build against a kernel build tree with its sources, not a header package"
#endif

struct neuron_udma_dchan {
	struct dma_chan chan;
	const struct neuron_udma_dma_chan *rs;
};

struct neuron_udma_dma {
	struct dma_device ddev;
	struct list_head released;
	unsigned int nr;
	struct neuron_udma_dchan chans[];
};

struct neuron_udma_txd {
	struct dma_async_tx_descriptor txd;
	struct neuron_udma_dma_desc *rs;
};

static const struct neuron_udma_dma_chan *neuron_udma_rs(struct dma_chan *chan)
{
	return container_of(chan, struct neuron_udma_dchan, chan)->rs;
}

static int neuron_udma_alloc_chan_resources(struct dma_chan *chan)
{
	int ret = neuron_udma_dma_alloc_chan(neuron_udma_rs(chan));

	if (!ret)
		dma_cookie_init(chan);
	return ret;
}

static void neuron_udma_free_chan_resources(struct dma_chan *chan)
{
	neuron_udma_dma_free_chan(neuron_udma_rs(chan));
}

static dma_cookie_t neuron_udma_tx_submit(struct dma_async_tx_descriptor *txd)
{
	struct neuron_udma_txd *d = container_of(txd, struct neuron_udma_txd, txd);

	return neuron_udma_dma_submit(neuron_udma_rs(txd->chan), d->rs);
}

/* A descriptor of @chan for Rust to fill in, or NULL (GFP_NOWAIT: prep may be atomic). */
static struct neuron_udma_txd *neuron_udma_txd_new(struct dma_chan *chan, unsigned long flags)
{
	struct neuron_udma_txd *d = kzalloc(sizeof(*d), GFP_NOWAIT);

	if (!d)
		return NULL;
	dma_async_tx_descriptor_init(&d->txd, chan);
	d->txd.flags = flags;
	d->txd.tx_submit = neuron_udma_tx_submit;
	return d;
}

/*
 * A descriptor of @chan for a copy of @len bytes from @src to @dst, or with @fill a fill of
 * @len bytes at @dst with @value; NULL if there is no memory or Rust refuses it.
 */
static struct dma_async_tx_descriptor *neuron_udma_prep(struct dma_chan *chan, dma_addr_t dst,
							dma_addr_t src, u8 value, bool fill,
							size_t len, unsigned long flags)
{
	struct neuron_udma_txd *d = neuron_udma_txd_new(chan, flags);
	struct neuron_udma_dma_desc *rs;

	if (!d)
		return NULL;
	/* From here on Rust owns @d: it has freed it if it returns NULL (so @d is not touched). */
	if (fill)
		rs = neuron_udma_dma_prep_memset(neuron_udma_rs(chan), &d->txd, dst, value, len);
	else
		rs = neuron_udma_dma_prep(neuron_udma_rs(chan), &d->txd, dst, src, len);
	if (!rs)
		return NULL;
	d->rs = rs;
	return &d->txd;
}

static struct dma_async_tx_descriptor *
neuron_udma_prep_memcpy(struct dma_chan *chan, dma_addr_t dst, dma_addr_t src, size_t len,
			unsigned long flags)
{
	return neuron_udma_prep(chan, dst, src, 0, false, len, flags);
}

/* DMA_MEMSET: @value's low byte, as dmatest and the other providers read it. */
static struct dma_async_tx_descriptor *
neuron_udma_prep_memset(struct dma_chan *chan, dma_addr_t dst, int value, size_t len,
			unsigned long flags)
{
	return neuron_udma_prep(chan, dst, 0, (u8)value, true, len, flags);
}

static void neuron_udma_issue_pending(struct dma_chan *chan)
{
	neuron_udma_dma_issue(neuron_udma_rs(chan));
}

/*
 * DMA_COMPLETE, or DMA_ERROR for a cookie whose transfer was aborted (rust/dmaengine.rs keeps
 * the last failed ranges), or DMA_IN_PROGRESS with the residue of its descriptor.
 */
static enum dma_status neuron_udma_tx_status(struct dma_chan *chan, dma_cookie_t cookie,
					     struct dma_tx_state *state)
{
	const struct neuron_udma_dma_chan *rs = neuron_udma_rs(chan);
	enum dma_status st = dma_cookie_status(chan, cookie, state);

	if (st == DMA_COMPLETE)
		return neuron_udma_dma_failed(rs, cookie) ? DMA_ERROR : DMA_COMPLETE;
	dma_set_residue(state, neuron_udma_dma_residue(rs, cookie));
	return st;
}

static int neuron_udma_terminate_all(struct dma_chan *chan)
{
	neuron_udma_dma_terminate(neuron_udma_rs(chan));
	return 0;
}

static void neuron_udma_synchronize(struct dma_chan *chan)
{
	neuron_udma_dma_sync(neuron_udma_rs(chan));
}

/*
 * Released dma_devices, freed at module unload. When the last client lets go of a channel after
 * unregister, the release runs inside dma_release_channel() -> dma_chan_put() ->
 * dma_device_put(), and dma_release_channel() still reads and writes the channel (chan->slave,
 * chan->dbg_client_name) after dma_chan_put() returns: the struct dma_chan, embedded here, must
 * outlive the release. A client holds a module reference until dma_chan_put() ends, so the
 * memory is kept until the module is unloaded.
 */
static LIST_HEAD(neuron_udma_released);
static DEFINE_SPINLOCK(neuron_udma_released_lock);

/* The last reference is gone (after unregister): give the channels back to Rust. */
static void neuron_udma_release(struct dma_device *ddev)
{
	struct neuron_udma_dma *dma = container_of(ddev, struct neuron_udma_dma, ddev);
	unsigned int i;

	for (i = 0; i < dma->nr; i++)
		neuron_udma_dma_put_chan(dma->chans[i].rs);
	spin_lock(&neuron_udma_released_lock);
	list_add(&dma->released, &neuron_udma_released);
	spin_unlock(&neuron_udma_released_lock);
}

/* Module unload: frees the released dma_devices (no client holds a channel any more). */
void neuron_udma_dma_free_released(void)
{
	struct neuron_udma_dma *dma, *next;
	LIST_HEAD(list);

	spin_lock(&neuron_udma_released_lock);
	list_splice_init(&neuron_udma_released, &list);
	spin_unlock(&neuron_udma_released_lock);
	list_for_each_entry_safe(dma, next, &list, released)
		kfree(dma);
}

/*
 * Registers a DMA_MEMCPY and DMA_MEMSET dma_device of @dev with @nr channels backed by the Rust channels
 * @chans; on success the dma_device owns one reference of each (given back by the release). The
 * channels are private (DMA_PRIVATE): only clients that ask for a channel get one, never async_tx
 * or the opportunistic dma_find_channel() users (Documentation/neuron-udma.rst, "dmaengine").
 */
struct neuron_udma_dma *neuron_udma_dma_register(struct device *dev,
						 struct neuron_udma_dma_chan *const *chans,
						 unsigned int nr)
{
	struct neuron_udma_dma *dma = kzalloc(struct_size(dma, chans, nr), GFP_KERNEL);
	struct dma_device *dd;
	unsigned int i;
	int ret;

	if (!dma)
		return ERR_PTR(-ENOMEM);
	dd = &dma->ddev;
	dma->nr = nr;
	dd->dev = dev;
	INIT_LIST_HEAD(&dd->channels);
	dma_cap_set(DMA_MEMCPY, dd->cap_mask);
	dma_cap_set(DMA_MEMSET, dd->cap_mask);
	dma_cap_set(DMA_PRIVATE, dd->cap_mask);
	/* The engine copies any byte count from any byte address. */
	dd->copy_align = DMAENGINE_ALIGN_1_BYTE;
	dd->directions = BIT(DMA_MEM_TO_MEM);
	dd->residue_granularity = DMA_RESIDUE_GRANULARITY_DESCRIPTOR;
	dd->device_alloc_chan_resources = neuron_udma_alloc_chan_resources;
	dd->device_free_chan_resources = neuron_udma_free_chan_resources;
	dd->device_prep_dma_memcpy = neuron_udma_prep_memcpy;
	dd->device_prep_dma_memset = neuron_udma_prep_memset;
	dd->device_issue_pending = neuron_udma_issue_pending;
	dd->device_tx_status = neuron_udma_tx_status;
	dd->device_terminate_all = neuron_udma_terminate_all;
	dd->device_synchronize = neuron_udma_synchronize;
	dd->device_release = neuron_udma_release;
	for (i = 0; i < nr; i++) {
		dma->chans[i].rs = chans[i];
		dma->chans[i].chan.device = dd;
		dma_cookie_init(&dma->chans[i].chan);
		list_add_tail(&dma->chans[i].chan.device_node, &dd->channels);
	}
	ret = dma_async_device_register(dd);
	if (ret) {
		/* The release never runs: the channels stay the caller's. */
		kfree(dma);
		return ERR_PTR(ret);
	}
	return dma;
}

/*
 * Unregisters @dma: no new client finds its channels. The dma_device (and the Rust channels it
 * holds) is freed by the release once the last client gave its channel back.
 */
void neuron_udma_dma_unregister(struct neuron_udma_dma *dma)
{
	dma_async_device_unregister(&dma->ddev);
}

/* The next cookie of @txd's channel (the caller serialises submissions of a channel). */
dma_cookie_t neuron_udma_txd_assign_cookie(struct dma_async_tx_descriptor *txd)
{
	return dma_cookie_assign(txd);
}

/* @txd is done (or dropped): its channel's completed cookie moves up to it, in cookie order. */
void neuron_udma_txd_cookie_complete(struct dma_async_tx_descriptor *txd)
{
	dma_cookie_complete(txd);
}

bool neuron_udma_txd_acked(struct dma_async_tx_descriptor *txd)
{
	return async_tx_test_ack(txd);
}

/*
 * Finishes @txd: unmaps what the client asked to be unmapped, then runs its callback if it
 * asked for one (DMA_PREP_INTERRUPT), with @result (enum dmaengine_tx_result) and @residue in
 * bytes. Called without any lock of the driver held: the callback may submit more work.
 * Returns whether the client has acked @txd (DMA_CTRL_ACK) by now: it may be freed.
 */
bool neuron_udma_txd_callback(struct dma_async_tx_descriptor *txd, u32 result, u32 residue)
{
	struct dmaengine_result res = { .result = result, .residue = residue };

	dma_descriptor_unmap(txd);
	if (txd->flags & DMA_PREP_INTERRUPT)
		dmaengine_desc_get_callback_invoke(txd, &res);
	return async_tx_test_ack(txd);
}

/* Frees @txd (and the client's unmap data if it never completed). */
void neuron_udma_txd_free(struct dma_async_tx_descriptor *txd)
{
	dma_descriptor_unmap(txd);
	kfree(container_of(txd, struct neuron_udma_txd, txd));
}
