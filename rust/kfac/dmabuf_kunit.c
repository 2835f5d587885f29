// SPDX-License-Identifier: GPL-2.0
/*
 * The dma-buf facility's KUnit helpers (rust/kfac/dmabuf.h; Kbuild links this file into KUnit
 * builds only): an in-kernel importer of an export, and the driver's own importer on an export
 * without a file descriptor.
 */
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/err.h>
#include <linux/scatterlist.h>
#include <linux/string.h>

#include "dmabuf_internal.h"

/*
 * KUnit builds only: an importer of an export of this driver in the kernel (rust/dmabuf.rs's
 * suite), as another device's driver would be: a static attachment (refused), then a dynamic,
 * revocable one that maps the buffer, sees the export revoked (its invalidate_mappings unmaps at
 * once, as the contract asks), and maps again after the revocation (refused).
 */
struct neuron_udma_kunit_importer {
	struct sg_table *sgt;
	unsigned int invalidations;
};

static void neuron_udma_kunit_invalidate(struct dma_buf_attachment *attach)
{
	struct neuron_udma_kunit_importer *k = attach->importer_priv;

	k->invalidations++;
	if (k->sgt) {
		dma_buf_unmap_attachment(attach, k->sgt, DMA_BIDIRECTIONAL);
		k->sgt = NULL;
	}
}

static const struct dma_buf_attach_ops neuron_udma_kunit_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = neuron_udma_kunit_invalidate,
};

static int neuron_udma_kunit_map(struct dma_buf_attachment *attach, struct sg_table **sgt)
{
	int ret;

	dma_resv_lock(attach->dmabuf->resv, NULL);
	*sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL);
	ret = PTR_ERR_OR_ZERO(*sgt);
	if (ret)
		*sgt = NULL;
	dma_resv_unlock(attach->dmabuf->resv);
	return ret;
}

/* Runs the importer on @exp from the bound device @dev; what it saw goes to @r. */
void neuron_udma_kunit_import(struct neuron_udma_export *exp, struct device *dev,
			      struct neuron_udma_kunit_report *r)
{
	struct dma_buf *dmabuf = neuron_udma_export_dmabuf(exp);
	struct neuron_udma_kunit_importer k = {};
	struct dma_buf_attachment *attach;
	struct scatterlist *sg;
	struct sg_table *sgt;
	unsigned int i;

	memset(r, 0, sizeof(*r));
	attach = dma_buf_attach(dmabuf, dev);
	r->static_attach = PTR_ERR_OR_ZERO(attach);
	if (!IS_ERR(attach))
		dma_buf_detach(dmabuf, attach);

	attach = dma_buf_dynamic_attach(dmabuf, dev, &neuron_udma_kunit_ops, &k);
	r->attach = PTR_ERR_OR_ZERO(attach);
	if (IS_ERR(attach))
		return;
	r->map = neuron_udma_kunit_map(attach, &k.sgt);
	if (!r->map) {
		r->nents = k.sgt->nents;
		for_each_sgtable_dma_sg(k.sgt, sg, i) {
			if (!i)
				r->first_addr = sg_dma_address(sg);
			r->bytes += sg_dma_len(sg);
		}
	}
	neuron_udma_dmabuf_revoke(exp);
	r->invalidations = k.invalidations;
	r->unmapped = !k.sgt;
	r->map_after = neuron_udma_kunit_map(attach, &sgt);
	if (sgt) {
		dma_resv_lock(dmabuf->resv, NULL);
		dma_buf_unmap_attachment(attach, sgt, DMA_BIDIRECTIONAL);
		dma_resv_unlock(dmabuf->resv);
	}
	if (k.sgt) {
		dma_resv_lock(dmabuf->resv, NULL);
		dma_buf_unmap_attachment(attach, k.sgt, DMA_BIDIRECTIONAL);
		dma_resv_unlock(dmabuf->resv);
	}
	dma_buf_detach(dmabuf, attach);
	attach = dma_buf_dynamic_attach(dmabuf, dev, &neuron_udma_kunit_ops, &k);
	r->attach_after = PTR_ERR_OR_ZERO(attach);
	if (!IS_ERR(attach))
		dma_buf_detach(dmabuf, attach);
}

/* The driver's own importer on @exp (as DMABUF_IMPORT of its descriptor), writable. */
struct neuron_udma_import *neuron_udma_kunit_import_export(struct neuron_udma_export *exp,
							   struct device *dev, u64 *size)
{
	struct dma_buf *dmabuf = neuron_udma_export_dmabuf(exp);

	get_dma_buf(dmabuf);
	return neuron_udma_import_attach(dmabuf, dev, true, size);
}
