// SPDX-License-Identifier: GPL-2.0
/*
 * The dma-buf exporter of device memory (rust/kfac/dmabuf.h): its dma_buf_ops, the revocation
 * of its exports, and the file descriptor an export is published as.
 */
#include <linux/dma-buf.h>
#include <linux/dma-buf-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/completion.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/slab.h>

#include "dmabuf_internal.h"
#include "trace_internal.h"

/*
 * ---- dma-buf: no Rust abstraction in 7.3 ----
 *
 * Export (NEURON_UDMA_DMABUF_EXPORT): a dma-buf of a range of device memory, which is BAR4 (a
 * device address is its BAR4 offset, rust/arch.rs). Importers get the bus addresses of that
 * range from the PCI P2PDMA provider of BAR4 (dma_buf_phys_vec_to_sgt(), as vfio-pci exports
 * BARs). By default only importers that can be revoked attach (a dynamic attachment with
 * invalidate_mappings, as vfio-pci requires): at unbind every export is revoked
 * (neuron_udma_dmabuf_revoke_all()) and the unbind waits until every importer unmapped, so no
 * importer reaches the BAR (nor the provider, which devres frees) after it. The dma-buf holds a
 * module reference (exp_info.owner) and, through its Rust hold, the buffer: the device memory
 * goes back to the allocator only when the last reference to the dma-buf is gone, and it is
 * scrubbed before its next MEM_ALLOC.
 *
 * Pinned importers (peer-to-peer, no invalidate_mappings: RDMA's ib_umem_dmabuf_get_pinned(),
 * through which EFA registers dma-bufs) attach only with the dmabuf_pinned_importers parameter.
 * Nothing can make them unmap: the unbind waits for their mappings at most
 * dmabuf_pinned_unbind_wait_ms in all (one deadline for every export of the device), then says
 * so in the log and goes on with each export still mapped *stranded*:
 * its range stays reserved, in every later binding's allocator of the device (rust/dmabuf.rs),
 * until the dma-buf is released (the importer detached and no descriptor of it is left).
 */
MODULE_IMPORT_NS("DMA_BUF");

/* Export instances, never reused: what a stranded range's reservation names. */
static atomic64_t neuron_udma_export_instances = ATOMIC64_INIT(0);

/* BAR holding device memory (rust/driver.rs). */
#define NEURON_UDMA_DRAM_BAR 4

/* The offset of @exp's range in BAR4 (its device address), for the tracepoints. */
#define NU_EXPORT_OFFSET(exp) \
	((exp)->phys.paddr - pci_resource_start(to_pci_dev((exp)->dev), NEURON_UDMA_DRAM_BAR))

struct neuron_udma_export {
	/* In neuron_udma_exports while the dma-buf lives and is not being revoked. */
	struct list_head node;
	struct dma_buf *dmabuf;
	/* The exporting device: an address to compare, kept alive by @hold. */
	struct device *dev;
	struct p2pdma_provider *provider;
	/* The CPU physical range of the buffer in BAR4. */
	struct phys_vec phys;
	/* One per live mapping, and one until the export is revoked. */
	struct kref maps;
	struct completion unmapped;
	/* Under the dma-buf's reservation lock: no new mapping (the device is going away). */
	bool revoked;
	/* This export, among every export of the module's lifetime (from 1). */
	u64 instance;
	/*
	 * The exporting function's PCI domain and bus/devfn: a later binding of the same function
	 * reserves a stranded export's range, also after a remove and rescan (a new pci_dev).
	 */
	int domain;
	u16 devid;
	/* Attachments admitted without invalidate_mappings (their ->priv is the export). */
	atomic_t pinned;
	/*
	 * Under neuron_udma_exports_lock: revoked with a mapping left past the unbind's wait; in
	 * neuron_udma_stranded until its release, its range reserved meanwhile.
	 */
	bool stranded;
	/* rust/dmabuf.rs: the exported buffer (busy) and its device, given back by ->release. */
	struct neuron_udma_export_hold *hold;
};

static LIST_HEAD(neuron_udma_exports);
/* Stranded exports (revoked, still mapped by a pinned importer), of every device. */
static LIST_HEAD(neuron_udma_stranded);
static DEFINE_MUTEX(neuron_udma_exports_lock);

static void neuron_udma_export_unmapped(struct kref *kref)
{
	complete(&container_of(kref, struct neuron_udma_export, maps)->unmapped);
}

/*
 * Only importers that reach the BAR (peer-to-peer) and can be revoked, or, with the
 * dmabuf_pinned_importers parameter, also pinned ones (no invalidate_mappings), which can keep
 * their mapping past unbind. A static importer (no importer ops, as vgem's PRIME import) is
 * not peer-to-peer: BAR memory has no pages it could map.
 */
static int neuron_udma_dmabuf_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct neuron_udma_export *exp = dmabuf->priv;
	bool pinned = !dma_buf_attach_revocable(attach);

	if (!attach->peer2peer || (pinned && !neuron_udma_dmabuf_pinned_importers()))
		return -EOPNOTSUPP;
	/* Rechecked under the reservation lock by ->map_dma_buf. */
	if (READ_ONCE(exp->revoked))
		return -ENODEV;
	/* A device the BAR cannot reach (no common switch or allow-listed host bridge). */
	if (pci_p2pdma_distance_many(to_pci_dev(exp->dev), &attach->dev, 1, false) < 0)
		return -EOPNOTSUPP;
	if (pinned) {
		/* Counted before any mapping of it: the revocation reads the count after them. */
		atomic_inc(&exp->pinned);
		attach->priv = exp;
		/* Any user who can register an export with such an importer can attach it. */
		dev_warn_ratelimited(exp->dev,
			 "dma-buf of device memory [%#llx, +%#zx): pinned importer %s admitted (dmabuf_pinned_importers): an unbind cannot revoke it\n",
			 NU_EXPORT_OFFSET(exp), exp->phys.len, dev_name(attach->dev));
	}
	trace_neuron_udma_dmabuf_attach(exp->dev, NU_EXPORT_OFFSET(exp), exp->phys.len,
					dev_name(attach->dev));
	return 0;
}

static void neuron_udma_dmabuf_detach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct neuron_udma_export *exp = dmabuf->priv;

	if (attach->priv)
		atomic_dec(&exp->pinned);
}

static struct sg_table *neuron_udma_dmabuf_map(struct dma_buf_attachment *attach,
					       enum dma_data_direction dir)
{
	struct neuron_udma_export *exp = attach->dmabuf->priv;
	struct sg_table *sgt;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (exp->revoked)
		return ERR_PTR(-ENODEV);
	sgt = dma_buf_phys_vec_to_sgt(attach, exp->provider, &exp->phys, 1, exp->phys.len, dir);
	if (!IS_ERR(sgt))
		kref_get(&exp->maps);
	return sgt;
}

static void neuron_udma_dmabuf_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
				     enum dma_data_direction dir)
{
	struct neuron_udma_export *exp = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	/*
	 * Linux 7.3's dma_buf_phys_vec_to_sgt() sets orig_nents to 0 (no CPU list), and
	 * dma_buf_free_sgt()'s sg_free_table() frees orig_nents entries: the scatterlist of every
	 * mapping leaked (kmemleak, one object per map). It allocated nents entries: say so first.
	 */
	sgt->orig_nents = sgt->nents;
	dma_buf_free_sgt(attach, sgt, dir);
	kref_put(&exp->maps, neuron_udma_export_unmapped);
}

/* The last reference is gone: no attachment (nor mapping) is left. */
static void neuron_udma_dmabuf_release(struct dma_buf *dmabuf)
{
	struct neuron_udma_export *exp = dmabuf->priv;
	bool stranded;

	mutex_lock(&neuron_udma_exports_lock);
	list_del_init(&exp->node);
	stranded = exp->stranded;
	mutex_unlock(&neuron_udma_exports_lock);
	if (stranded) {
		dev_warn(exp->dev,
			 "dma-buf of device memory [%#llx, +%#zx) released (no importer or descriptor left); the range is free again\n",
			 NU_EXPORT_OFFSET(exp), exp->phys.len);
		/* Off the list: no later binding reserves it; the current one stops now. */
		neuron_udma_dmabuf_stranded_released(exp->instance);
	}
	/* The buffer is no longer busy: freed now if its file was closed. */
	neuron_udma_dmabuf_released(exp->hold);
	kfree(exp);
}

static const struct dma_buf_ops neuron_udma_dmabuf_ops = {
	.attach = neuron_udma_dmabuf_attach,
	.detach = neuron_udma_dmabuf_detach,
	.map_dma_buf = neuron_udma_dmabuf_map,
	.unmap_dma_buf = neuron_udma_dmabuf_unmap,
	.release = neuron_udma_dmabuf_release,
};

struct dma_buf *neuron_udma_export_dmabuf(struct neuron_udma_export *exp)
{
	return exp->dmabuf;
}

struct device *neuron_udma_export_device(struct dma_buf *dmabuf)
{
	if (dmabuf->ops != &neuron_udma_dmabuf_ops)
		return NULL;
	return ((struct neuron_udma_export *)dmabuf->priv)->dev;
}

bool neuron_udma_export_local(struct dma_buf *dmabuf, struct device *dev, u64 *bus_base)
{
	if (neuron_udma_export_device(dmabuf) != dev)
		return false;
	*bus_base = pci_bus_address(to_pci_dev(dev), NEURON_UDMA_DRAM_BAR);
	return true;
}

/*
 * A dma-buf of bytes [@offset, @offset + @size) of @dev's BAR4 (a bound device), with one
 * reference the caller owns (neuron_udma_dmabuf_install() or neuron_udma_dmabuf_put()). On
 * success the dma-buf owns @hold and gives it back to Rust when it is released; on error the
 * caller keeps it. ERR_PTR(-EINVAL) for a range outside BAR4, -EOPNOTSUPP without PCI
 * peer-to-peer support (CONFIG_PCI_P2PDMA, or a BAR that cannot be mapped), -ENOMEM, -ENOENT
 * (the module is going away).
 */
struct neuron_udma_export *neuron_udma_dmabuf_export(struct device *dev, u64 offset, u64 size,
						     struct neuron_udma_export_hold *hold)
{
	struct pci_dev *pdev = to_pci_dev(dev);
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct neuron_udma_export *exp;
	struct p2pdma_provider *provider;
	struct dma_buf *dmabuf;
	int ret;

	if (!size || offset + size < offset ||
	    offset + size > pci_resource_len(pdev, NEURON_UDMA_DRAM_BAR))
		return ERR_PTR(-EINVAL);
	/* Once per binding (devres frees it at unbind); the caller holds the device state lock. */
	ret = pcim_p2pdma_init(pdev);
	if (ret)
		return ERR_PTR(ret == -ENOMEM ? ret : -EOPNOTSUPP);
	provider = pcim_p2pdma_provider(pdev, NEURON_UDMA_DRAM_BAR);
	if (!provider)
		return ERR_PTR(-EOPNOTSUPP);
	exp = kzalloc(sizeof(*exp), GFP_KERNEL_ACCOUNT);
	if (!exp)
		return ERR_PTR(-ENOMEM);
	INIT_LIST_HEAD(&exp->node);
	exp->dev = dev;
	exp->provider = provider;
	exp->phys.paddr = pci_resource_start(pdev, NEURON_UDMA_DRAM_BAR) + offset;
	exp->phys.len = size;
	kref_init(&exp->maps);
	init_completion(&exp->unmapped);
	exp->instance = atomic64_inc_return(&neuron_udma_export_instances);
	exp->domain = pci_domain_nr(pdev->bus);
	exp->devid = pci_dev_id(pdev);
	atomic_set(&exp->pinned, 0);
	exp_info.ops = &neuron_udma_dmabuf_ops;
	exp_info.size = size;
	exp_info.flags = O_RDWR;
	exp_info.priv = exp;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		kfree(exp);
		return ERR_CAST(dmabuf);
	}
	exp->dmabuf = dmabuf;
	exp->hold = hold;
	mutex_lock(&neuron_udma_exports_lock);
	list_add_tail(&exp->node, &neuron_udma_exports);
	mutex_unlock(&neuron_udma_exports_lock);
	return exp;
}

/* Drops the caller's reference to @exp's dma-buf (the release runs when it was the last). */
void neuron_udma_dmabuf_put(struct neuron_udma_export *exp)
{
	dma_buf_put(exp->dmabuf);
}

/*
 * Publishes @exp's dma-buf as @fd (reserved by get_unused_fd_flags() in this task), with the
 * caller's reference: cannot be undone, so the caller did everything that may fail first.
 */
void neuron_udma_dmabuf_install(struct neuron_udma_export *exp, int fd)
{
	dma_buf_fd_install(exp->dmabuf, fd);
}

/* Names in the log every pinned importer of @exp that still maps it (it is revoked). */
static void neuron_udma_dmabuf_log_stranded(struct neuron_udma_export *exp)
{
	struct dma_buf_attachment *attach;

	dev_err(exp->dev,
		"dma-buf of device memory [%#llx, +%#zx): still mapped when the unbind's wait for pinned importers (%u ms) ended; the unbind goes on, and the range stays reserved (in every later binding) until the dma-buf is released\n",
		NU_EXPORT_OFFSET(exp), exp->phys.len, neuron_udma_dmabuf_pinned_unbind_wait_ms());
	dma_resv_lock(exp->dmabuf->resv, NULL);
	list_for_each_entry(attach, &exp->dmabuf->attachments, node) {
		if (attach->priv)
			dev_err(exp->dev, "  pinned importer %s (%s) may still reach it\n",
				dev_name(attach->dev), dev_driver_string(attach->dev));
	}
	dma_resv_unlock(exp->dmabuf->resv);
}

/*
 * Revokes @exp (the caller holds a reference to its dma-buf): no new mapping, every importer
 * is told to unmap (invalidate_mappings), and this waits until every mapping is gone, so the
 * BAR range and the provider are no longer reachable through it. Without a pinned importer
 * that wait ends (revocable importers unmap in bounded time); with one, it lasts until
 * @deadline (jiffies) at most. Returns false if a mapping is left then (logged: the caller
 * strands the export). Idempotent: a later call says whether a mapping is left now.
 */
static bool neuron_udma_dmabuf_revoke_until(struct neuron_udma_export *exp,
					    unsigned long deadline)
{
	struct dma_buf *dmabuf = exp->dmabuf;
	long left;

	dma_resv_lock(dmabuf->resv, NULL);
	if (exp->revoked) {
		dma_resv_unlock(dmabuf->resv);
		/* The first call dropped the revocation's own count. */
		return completion_done(&exp->unmapped);
	}
	WRITE_ONCE(exp->revoked, true);
	/* Every importer is told: none is named. */
	trace_neuron_udma_dmabuf_revoke(exp->dev, NU_EXPORT_OFFSET(exp), exp->phys.len, "*");
	dma_buf_invalidate_mappings(dmabuf);
	dma_resv_wait_timeout(dmabuf->resv, DMA_RESV_USAGE_BOOKKEEP, false, MAX_SCHEDULE_TIMEOUT);
	dma_resv_unlock(dmabuf->resv);
	kref_put(&exp->maps, neuron_udma_export_unmapped);
	/* Every mapping made before the revocation belongs to an attachment counted before it. */
	if (!atomic_read(&exp->pinned)) {
		wait_for_completion(&exp->unmapped);
		return true;
	}
	left = (long)(deadline - jiffies);
	if (wait_for_completion_timeout(&exp->unmapped, max(left, 0L)) ||
	    completion_done(&exp->unmapped))
		return true;
	neuron_udma_dmabuf_log_stranded(exp);
	return false;
}

/* neuron_udma_dmabuf_revoke_until() with a wait of dmabuf_pinned_unbind_wait_ms from now. */
bool neuron_udma_dmabuf_revoke(struct neuron_udma_export *exp)
{
	return neuron_udma_dmabuf_revoke_until(exp, jiffies +
					       msecs_to_jiffies(neuron_udma_dmabuf_pinned_unbind_wait_ms()));
}

/*
 * Unbind of @dev: revokes every export of it. A dma-buf whose last reference is already gone
 * has no attachment left; its release only gives its hold back.
 */
void neuron_udma_dmabuf_revoke_all(struct device *dev)
{
	/* One wait for pinned importers for the whole unbind, however many exports they map. */
	unsigned long deadline = jiffies + msecs_to_jiffies(neuron_udma_dmabuf_pinned_unbind_wait_ms());
	struct neuron_udma_export *exp, *next;
	LIST_HEAD(revoke);

	mutex_lock(&neuron_udma_exports_lock);
	list_for_each_entry_safe(exp, next, &neuron_udma_exports, node) {
		if (exp->dev == dev && get_file_active(&exp->dmabuf->file))
			list_move_tail(&exp->node, &revoke);
	}
	mutex_unlock(&neuron_udma_exports_lock);
	list_for_each_entry_safe(exp, next, &revoke, node) {
		bool unmapped = neuron_udma_dmabuf_revoke_until(exp, deadline);

		mutex_lock(&neuron_udma_exports_lock);
		if (unmapped) {
			list_del_init(&exp->node);
		} else {
			exp->stranded = true;
			list_move_tail(&exp->node, &neuron_udma_stranded);
		}
		mutex_unlock(&neuron_udma_exports_lock);
		/* May release it (from task work or the delayed fput worker, not here). */
		fput(exp->dmabuf->file);
	}
}

/*
 * The stranded export of the PCI function @dev (revoked at an unbind while a pinned importer
 * still mapped it; the same domain and bus/devfn, whether or not the same pci_dev) with the
 * lowest instance above @after: its instance and its bytes [*@offset, + *@len) of the device
 * memory, which that importer may still reach. False if there is none.
 */
bool neuron_udma_dmabuf_stranded_next(struct device *dev, u64 after, u64 *instance, u64 *offset,
				      u64 *len)
{
	struct pci_dev *pdev = to_pci_dev(dev);
	int domain = pci_domain_nr(pdev->bus);
	u16 devid = pci_dev_id(pdev);
	struct neuron_udma_export *exp, *found = NULL;

	mutex_lock(&neuron_udma_exports_lock);
	list_for_each_entry(exp, &neuron_udma_stranded, node) {
		if (exp->domain == domain && exp->devid == devid && exp->instance > after &&
		    (!found || exp->instance < found->instance))
			found = exp;
	}
	if (found) {
		*instance = found->instance;
		*offset = NU_EXPORT_OFFSET(found);
		*len = found->phys.len;
	}
	mutex_unlock(&neuron_udma_exports_lock);
	return found;
}

/* Whether export @instance is stranded (revoked, still mapped, not released). */
bool neuron_udma_dmabuf_is_stranded(u64 instance)
{
	struct neuron_udma_export *exp;
	bool found = false;

	mutex_lock(&neuron_udma_exports_lock);
	list_for_each_entry(exp, &neuron_udma_stranded, node) {
		if (exp->instance == instance) {
			found = true;
			break;
		}
	}
	mutex_unlock(&neuron_udma_exports_lock);
	return found;
}
