// SPDX-License-Identifier: GPL-2.0
/*
 * The dma-buf facility's KUnit helpers (rust/kfac/dmabuf.h; Kbuild links this file into KUnit
 * builds only): an in-kernel importer of an export, the driver's own importer on an export
 * without a file descriptor, and a pinned importer user space drives (a debugfs file).
 */
#include <linux/debugfs.h>
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/err.h>
#include <linux/fs.h>
#include <linux/kstrtox.h>
#include <linux/mutex.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
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

/*
 * KUnit builds only: a pinned importer of this driver's exports that user space drives, for
 * pinned_export_test (kselftest). It attaches as RDMA's ib_umem_dmabuf_get_pinned() does, so as
 * EFA registers a dma-buf: dynamic, peer-to-peer, no invalidate_mappings, dma_buf_pin(), one
 * mapping for as long as it lives. The importing device is the exporter itself (a PCI device the
 * BAR reaches). Writing a dma-buf descriptor number to the file imports it (one per open file:
 * EBUSY for a second; the attach's error otherwise, as EOPNOTSUPP while pinned importers are
 * not admitted); reading says "<bus address> <bytes>" of the mapping; closing the file unmaps,
 * unpins and detaches it, and puts the dma-buf.
 */
struct neuron_udma_pinned_importer {
	struct mutex lock;
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	struct sg_table *sgt;
};

static const struct dma_buf_attach_ops neuron_udma_pinned_ops = {
	.allow_peer2peer = true,
};

static int neuron_udma_pinned_open(struct inode *inode, struct file *file)
{
	struct neuron_udma_pinned_importer *p = kzalloc(sizeof(*p), GFP_KERNEL);

	if (!p)
		return -ENOMEM;
	mutex_init(&p->lock);
	file->private_data = p;
	return nonseekable_open(inode, file);
}

static int neuron_udma_pinned_import(struct neuron_udma_pinned_importer *p, int fd)
{
	struct dma_buf_attachment *attach;
	struct dma_buf *dmabuf;
	struct sg_table *sgt;
	struct device *dev;
	int ret;

	dmabuf = dma_buf_get(fd);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);
	dev = neuron_udma_export_device(dmabuf);
	if (!dev) {
		ret = -EINVAL;
		goto put;
	}
	attach = dma_buf_dynamic_attach(dmabuf, dev, &neuron_udma_pinned_ops, p);
	if (IS_ERR(attach)) {
		ret = PTR_ERR(attach);
		goto put;
	}
	dma_resv_lock(dmabuf->resv, NULL);
	ret = dma_buf_pin(attach);
	if (ret)
		goto unlock;
	sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL);
	if (IS_ERR(sgt)) {
		ret = PTR_ERR(sgt);
		dma_buf_unpin(attach);
		goto unlock;
	}
	dma_resv_unlock(dmabuf->resv);
	p->dmabuf = dmabuf;
	p->attach = attach;
	p->sgt = sgt;
	return 0;
unlock:
	dma_resv_unlock(dmabuf->resv);
	dma_buf_detach(dmabuf, attach);
put:
	dma_buf_put(dmabuf);
	return ret;
}

static ssize_t neuron_udma_pinned_write(struct file *file, const char __user *ubuf, size_t len,
					loff_t *ppos)
{
	struct neuron_udma_pinned_importer *p = file->private_data;
	int fd, ret;

	ret = kstrtoint_from_user(ubuf, len, 10, &fd);
	if (ret)
		return ret;
	mutex_lock(&p->lock);
	ret = p->dmabuf ? -EBUSY : neuron_udma_pinned_import(p, fd);
	mutex_unlock(&p->lock);
	return ret ? ret : len;
}

static ssize_t neuron_udma_pinned_read(struct file *file, char __user *ubuf, size_t len,
				       loff_t *ppos)
{
	struct neuron_udma_pinned_importer *p = file->private_data;
	char text[48];
	int n;

	mutex_lock(&p->lock);
	if (!p->sgt) {
		mutex_unlock(&p->lock);
		return -ENODATA;
	}
	n = scnprintf(text, sizeof(text), "%#llx %u\n",
		      (unsigned long long)sg_dma_address(p->sgt->sgl), sg_dma_len(p->sgt->sgl));
	mutex_unlock(&p->lock);
	return simple_read_from_buffer(ubuf, len, ppos, text, n);
}

static int neuron_udma_pinned_release(struct inode *inode, struct file *file)
{
	struct neuron_udma_pinned_importer *p = file->private_data;

	if (p->dmabuf) {
		dma_resv_lock(p->dmabuf->resv, NULL);
		dma_buf_unmap_attachment(p->attach, p->sgt, DMA_BIDIRECTIONAL);
		dma_buf_unpin(p->attach);
		dma_resv_unlock(p->dmabuf->resv);
		dma_buf_detach(p->dmabuf, p->attach);
		dma_buf_put(p->dmabuf);
	}
	mutex_destroy(&p->lock);
	kfree(p);
	return 0;
}

static const struct file_operations neuron_udma_pinned_fops = {
	.owner = THIS_MODULE,
	.open = neuron_udma_pinned_open,
	.read = neuron_udma_pinned_read,
	.write = neuron_udma_pinned_write,
	.release = neuron_udma_pinned_release,
};

/* Creates debugfs's neuron_udma_pinned_importer (root only); NULL without debugfs. */
struct dentry *neuron_udma_kunit_pinned_importer_create(void)
{
	struct dentry *d = debugfs_create_file("neuron_udma_pinned_importer", 0600, NULL, NULL,
					       &neuron_udma_pinned_fops);

	return IS_ERR(d) ? NULL : d;
}

/* Removes it (NULL: nothing), waiting for callers in progress; open files keep their import. */
void neuron_udma_kunit_pinned_importer_remove(struct dentry *d)
{
	debugfs_remove(d);
}
