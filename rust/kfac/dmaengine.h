/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A dmaengine provider (no Rust abstraction in Linux 7.3): the dma_device with its channels, its
 * operations (trampolines into rust/dmaengine.rs), the cookies and the client descriptors.
 * Implemented in rust/kfac/dmaengine.c; bindgen generates the Rust declarations (Kbuild), wrapped
 * by rust/kfac/dmaengine.rs.
 */
#ifndef NEURON_UDMA_KFAC_DMAENGINE_H
#define NEURON_UDMA_KFAC_DMAENGINE_H

#include <linux/types.h>
#ifdef __BINDGEN__
/* bindgen reads only this header (and <linux/types.h>): <linux/dmaengine.h>'s cookie type. */
typedef s32 dma_cookie_t;
struct dma_async_tx_descriptor;
struct dma_chan;
#else
#include <linux/dmaengine.h>
#endif

struct device;

/* Rust objects, opaque to C. */
struct neuron_udma_dma_chan;	/* rust/dmaengine.rs: DmaChan, one counted (Arc) reference */
struct neuron_udma_dma_desc;	/* rust/dmaengine.rs: Desc (a KBox) */
/* A dma_device with its channels; opaque to Rust. */
struct neuron_udma_dma;

/* ---- implemented in rust/kfac/dmaengine.c, called from Rust ---- */

struct neuron_udma_dma *neuron_udma_dma_register(struct device *dev,
						 struct neuron_udma_dma_chan *const *chans,
						 unsigned int nr);
void neuron_udma_dma_unregister(struct neuron_udma_dma *dma);
void neuron_udma_dma_free_released(void);
dma_cookie_t neuron_udma_txd_assign_cookie(struct dma_async_tx_descriptor *txd);
void neuron_udma_txd_cookie_complete(struct dma_async_tx_descriptor *txd);
bool neuron_udma_txd_callback(struct dma_async_tx_descriptor *txd, u32 result, u32 residue);
bool neuron_udma_txd_acked(struct dma_async_tx_descriptor *txd);
void neuron_udma_txd_free(struct dma_async_tx_descriptor *txd);

/*
 * ---- KUnit builds only: rust/kfac/dmaengine_kunit.c, an in-kernel client ----
 * neuron_udma_kunit_dma_get() takes a DMA_MEMCPY channel of @dev (NULL: none free) and says its
 * number; neuron_udma_kunit_dma_burst() submits @n memcpy descriptors of @len bytes on it, issues
 * them, waits (at most 120 s) for every callback and counts the results in @r (0, -ENOMEM,
 * -ETIMEDOUT); neuron_udma_kunit_dma_put() gives the channel back.
 */
struct neuron_udma_kunit_burst {
	u32 noerror;		/* callbacks with DMA_TRANS_NOERROR */
	u32 aborted;		/* callbacks with DMA_TRANS_ABORTED */
	u32 other;		/* callbacks with another result */
	u32 status_error;	/* cookies dmaengine_tx_status() then reports DMA_ERROR */
};
struct dma_chan *neuron_udma_kunit_dma_get(struct device *dev, u32 *chan_id);
int neuron_udma_kunit_dma_burst(struct dma_chan *chan, u32 n, u64 len,
				struct neuron_udma_kunit_burst *r);
void neuron_udma_kunit_dma_put(struct dma_chan *chan);

/*
 * ---- implemented in Rust (rust/dmaengine.rs), called from rust/kfac/dmaengine.c ----
 * The dma_device operations of one channel. Not given to bindgen (__BINDGEN__): their Rust
 * definitions are their declarations.
 */
#ifndef __BINDGEN__
int neuron_udma_dma_alloc_chan(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_free_chan(const struct neuron_udma_dma_chan *chan);
struct neuron_udma_dma_desc *neuron_udma_dma_prep(const struct neuron_udma_dma_chan *chan,
						  struct dma_async_tx_descriptor *txd, u64 dst,
						  u64 src, u64 len);
struct neuron_udma_dma_desc *neuron_udma_dma_prep_memset(const struct neuron_udma_dma_chan *chan,
							 struct dma_async_tx_descriptor *txd,
							 u64 dst, u8 value, u64 len);
dma_cookie_t neuron_udma_dma_submit(const struct neuron_udma_dma_chan *chan,
				    struct neuron_udma_dma_desc *desc);
void neuron_udma_dma_issue(const struct neuron_udma_dma_chan *chan);
bool neuron_udma_dma_failed(const struct neuron_udma_dma_chan *chan, dma_cookie_t cookie);
u32 neuron_udma_dma_residue(const struct neuron_udma_dma_chan *chan, dma_cookie_t cookie);
void neuron_udma_dma_terminate(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_sync(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_put_chan(const struct neuron_udma_dma_chan *chan);
#endif

#endif /* NEURON_UDMA_KFAC_DMAENGINE_H */
