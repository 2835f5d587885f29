// SPDX-License-Identifier: GPL-2.0
/*
 * The dma-buf importer (rust/kfac/dmabuf.h): another exporter's dma-buf attached to the device
 * with invalidate_mappings, pinned and mapped, and its revocation into rust/buffer.rs.
 */
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/fs.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "dmabuf_internal.h"

/*
 * Import (NEURON_UDMA_DMABUF_IMPORT): another exporter's dma-buf, attached for the device and
 * pinned (dma_buf_pin()), then mapped once. Pinned, not moved on demand: descriptors carry the
 * mapped addresses and the engine runs them whenever it gets to them, with no way to stop or
 * retry one, so the memory must stay where it is for as long as a descriptor may reach it; an
 * exporter does not move a pinned buffer. The attachment is still dynamic, with
 * invalidate_mappings, because exporters revoke (vfio-pci, this driver at unbind): then the
 * buffer is marked revoked in Rust (no new copy can name it: ENXIO), and the mapping is
 * unmapped only once no descriptor or copy can reach it any more (rust/dmabuf.rs drains the
 * buffer from a work item, resetting the owner's queues that still hold it after a grace
 * period), which the exporter waits for before it reuses the memory.
 */
struct neuron_udma_import {
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	/* Under the reservation lock: the mapping, NULL once unmapped. */
	struct sg_table *sgt;
	enum dma_data_direction dir;
	/* Under the reservation lock. */
	bool pinned;
	bool revoked;
	/* Under the reservation lock: the Rust buffer (not counted: it outlives its backing). */
	const struct neuron_udma_buffer *buf;
	/* Drains a revoked buffer that was still in use, then unmaps. */
	struct work_struct drain;
};

static void neuron_udma_import_unmap_locked(struct neuron_udma_import *imp)
{
	dma_resv_assert_held(imp->dmabuf->resv);
	if (imp->sgt) {
		dma_buf_unmap_attachment(imp->attach, imp->sgt, imp->dir);
		imp->sgt = NULL;
	}
	if (imp->pinned) {
		dma_buf_unpin(imp->attach);
		imp->pinned = false;
	}
}

static void neuron_udma_import_invalidate(struct dma_buf_attachment *attach)
{
	struct neuron_udma_import *imp = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (imp->revoked)
		return;
	imp->revoked = true;
	/*
	 * Not connected yet: the import is being made from the mapping, and fails at
	 * neuron_udma_import_connect(); its release unmaps (bounded). Released: unmapped already.
	 */
	if (!imp->buf)
		return;
	/* In use: the mapping stays until no descriptor can reach it (in bounded time). */
	if (neuron_udma_import_revoke(imp->buf)) {
		queue_work(system_dfl_wq, &imp->drain);
		return;
	}
	neuron_udma_import_unmap_locked(imp);
}

static void neuron_udma_import_drain_work(struct work_struct *work)
{
	struct neuron_udma_import *imp = container_of(work, struct neuron_udma_import, drain);
	const struct neuron_udma_buffer *buf;

	dma_resv_lock(imp->dmabuf->resv, NULL);
	buf = imp->buf;
	dma_resv_unlock(imp->dmabuf->resv);
	/* The release waits for this work before the buffer's record can go. */
	if (buf)
		neuron_udma_import_drain(buf);
}

static const struct dma_buf_attach_ops neuron_udma_import_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = neuron_udma_import_invalidate,
};

static int neuron_udma_import_error(int err)
{
	/* The exporter cannot give this device its memory (placement, peer-to-peer, revoked). */
	return err == -ENOMEM || err == -EINTR ? err : -EOPNOTSUPP;
}

/* neuron_udma_import_dmabuf() of @dmabuf, whose reference it takes over. */
struct neuron_udma_import *neuron_udma_import_attach(struct dma_buf *dmabuf, struct device *dev,
						     bool write, u64 *size)
{
	struct neuron_udma_import *imp;
	struct sg_table *sgt;
	long ret;

	if (write && !(dmabuf->file->f_mode & FMODE_WRITE)) {
		ret = -EACCES;
		goto put;
	}
	imp = kzalloc(sizeof(*imp), GFP_KERNEL_ACCOUNT);
	if (!imp) {
		ret = -ENOMEM;
		goto put;
	}
	imp->dmabuf = dmabuf;
	imp->dir = write ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	INIT_WORK(&imp->drain, neuron_udma_import_drain_work);
	imp->attach = dma_buf_dynamic_attach(dmabuf, dev, &neuron_udma_import_ops, imp);
	if (IS_ERR(imp->attach)) {
		ret = neuron_udma_import_error(PTR_ERR(imp->attach));
		goto free;
	}
	ret = dma_resv_lock_interruptible(dmabuf->resv, NULL);
	if (ret)
		goto detach;
	if (imp->revoked) {
		ret = -EOPNOTSUPP;
		goto unlock;
	}
	ret = dma_buf_pin(imp->attach);
	if (ret) {
		ret = neuron_udma_import_error(ret);
		goto unlock;
	}
	imp->pinned = true;
	sgt = dma_buf_map_attachment(imp->attach, imp->dir);
	if (IS_ERR(sgt)) {
		ret = neuron_udma_import_error(PTR_ERR(sgt));
		goto unmap;
	}
	imp->sgt = sgt;
	/* What the exporter still does to the memory (a move, a clear) ends first. */
	ret = dma_resv_wait_timeout(dmabuf->resv, DMA_RESV_USAGE_KERNEL, true,
				    MAX_SCHEDULE_TIMEOUT);
	if (ret < 0)
		goto unmap;
	dma_resv_unlock(dmabuf->resv);
	*size = dmabuf->size;
	return imp;

unmap:
	neuron_udma_import_unmap_locked(imp);
unlock:
	dma_resv_unlock(dmabuf->resv);
detach:
	dma_buf_detach(dmabuf, imp->attach);
free:
	kfree(imp);
put:
	dma_buf_put(dmabuf);
	return ERR_PTR(ret);
}

/*
 * Attaches the dma-buf @fd to the bound device @dev, pins it and maps it (to the device only,
 * unless @write); *@size is the dma-buf's size. Nothing is connected to a Rust buffer yet
 * (neuron_udma_import_connect()). ERR_PTR(-EBADF) (@fd is not a dma-buf), -EACCES (@write for
 * a dma-buf not open for writing), -EOPNOTSUPP (the exporter refused this device), -ENOMEM,
 * -EINTR.
 */
struct neuron_udma_import *neuron_udma_import_dmabuf(int fd, struct device *dev, bool write,
						     u64 *size)
{
	struct dma_buf *dmabuf = dma_buf_get(fd);

	if (IS_ERR(dmabuf))
		return ERR_PTR(-EBADF);
	return neuron_udma_import_attach(dmabuf, dev, write, size);
}

/* The mapping of @imp (DMA addresses only, nents entries), valid until it is unmapped. */
struct sg_table *neuron_udma_import_sgt(struct neuron_udma_import *imp)
{
	return imp->sgt;
}

/*
 * Whether @imp is this driver's own export of device memory of the device it is attached to:
 * then *@bus_base is the bus address of that device's BAR4, so an address of the mapping minus
 * it is a device address the engine reaches directly (rather than through the host route and
 * back into its own BAR).
 */
bool neuron_udma_import_local(struct neuron_udma_import *imp, u64 *bus_base)
{
	return neuron_udma_export_local(imp->dmabuf, imp->attach->dev, bus_base);
}

/*
 * Connects @imp to its Rust buffer @buf, whose revocation callbacks it calls from now on
 * (neuron_udma_import_revoke(), neuron_udma_import_drain()). -ENXIO if the exporter revoked it
 * meanwhile.
 */
int neuron_udma_import_connect(struct neuron_udma_import *imp,
			       const struct neuron_udma_buffer *buf)
{
	int ret = 0;

	dma_resv_lock(imp->dmabuf->resv, NULL);
	if (imp->revoked)
		ret = -ENXIO;
	else
		imp->buf = buf;
	dma_resv_unlock(imp->dmabuf->resv);
	return ret;
}

/* Unmaps and unpins @imp (a revoked buffer that no descriptor can reach any more). */
void neuron_udma_import_unmap(struct neuron_udma_import *imp)
{
	dma_resv_lock(imp->dmabuf->resv, NULL);
	neuron_udma_import_unmap_locked(imp);
	dma_resv_unlock(imp->dmabuf->resv);
}

/*
 * Releases @imp (no descriptor can reach it): no callback into Rust after this, unmapped,
 * unpinned, detached, and the dma-buf reference given back.
 */
void neuron_udma_import_release(struct neuron_udma_import *imp)
{
	struct dma_buf *dmabuf = imp->dmabuf;

	dma_resv_lock(dmabuf->resv, NULL);
	imp->buf = NULL;
	neuron_udma_import_unmap_locked(imp);
	dma_resv_unlock(dmabuf->resv);
	/* Not queued again: the invalidation needs imp->buf for that. */
	cancel_work_sync(&imp->drain);
	dma_buf_detach(dmabuf, imp->attach);
	kfree(imp);
	dma_buf_put(dmabuf);
}
