/* SPDX-License-Identifier: GPL-2.0 */
/*
 * dma-buf (no Rust abstraction in Linux 7.3): the exporter of device memory (its dma_buf_ops,
 * rust/kfac/dmabuf_export.c), the importer of other exporters' dma-bufs (a dynamic, pinned
 * attachment with invalidate_mappings, rust/kfac/dmabuf_import.c), the file descriptor an export
 * is published as, and in KUnit builds an in-kernel importer of an export
 * (rust/kfac/dmabuf_kunit.c). bindgen generates the Rust declarations (Kbuild), wrapped by
 * rust/kfac/dmabuf.rs.
 */
#ifndef NEURON_UDMA_KFAC_DMABUF_H
#define NEURON_UDMA_KFAC_DMABUF_H

#include <linux/types.h>

struct dentry;
struct device;
struct sg_table;

/* Rust objects, opaque to C. */
struct neuron_udma_buffer;	/* rust/buffer.rs: Buffer (not counted: see the import) */
struct neuron_udma_export_hold;	/* rust/dmabuf.rs: ExportHold (a KBox), owned by an export */

/* C objects, opaque to Rust. */
struct neuron_udma_export;	/* a dma-buf of device memory, its mappings and revocation */
struct neuron_udma_import;	/* another exporter's dma-buf, attached, pinned and mapped */

/* What the KUnit importer of an export saw (rust/dmabuf.rs; KUnit builds only). */
struct neuron_udma_kunit_report {
	int static_attach;	/* dma_buf_attach() without invalidate_mappings: 0 or -errno */
	int attach;		/* the revocable dynamic attachment */
	int map;		/* its mapping */
	u32 nents;		/* DMA entries of the mapping */
	u64 first_addr;		/* DMA (bus) address of the first entry */
	u64 bytes;		/* bytes of all entries */
	u32 invalidations;	/* invalidate_mappings calls of the revocation */
	u32 unmapped;		/* 1 if the importer had no mapping left after the revocation */
	int map_after;		/* a mapping after the revocation */
	int attach_after;	/* an attachment after the revocation */
};

/* ---- implemented in rust/kfac/dmabuf_*.c, called from Rust ---- */

/* The exporter of device memory (its dma_buf_ops), and the descriptor it is published as. */
struct neuron_udma_export *neuron_udma_dmabuf_export(struct device *dev, u64 offset, u64 size,
						     struct neuron_udma_export_hold *hold);
void neuron_udma_dmabuf_put(struct neuron_udma_export *exp);
void neuron_udma_dmabuf_install(struct neuron_udma_export *exp, int fd);
bool neuron_udma_dmabuf_revoke(struct neuron_udma_export *exp);
void neuron_udma_dmabuf_revoke_all(struct device *dev);
/*
 * Stranded exports (revoked at an unbind while a pinned importer still mapped them): their
 * ranges, which a new binding of the device reserves (in order of instance), and whether one
 * still is.
 */
bool neuron_udma_dmabuf_stranded_next(struct device *dev, u64 after, u64 *instance, u64 *offset,
				      u64 *len);
bool neuron_udma_dmabuf_is_stranded(u64 instance);
/* The importer (a dynamic, pinned attachment with invalidate_mappings). */
struct neuron_udma_import *neuron_udma_import_dmabuf(int fd, struct device *dev, bool write,
						     u64 *size);
struct sg_table *neuron_udma_import_sgt(struct neuron_udma_import *imp);
bool neuron_udma_import_local(struct neuron_udma_import *imp, u64 *bus_base);
int neuron_udma_import_connect(struct neuron_udma_import *imp,
			       const struct neuron_udma_buffer *buf);
void neuron_udma_import_unmap(struct neuron_udma_import *imp);
void neuron_udma_import_release(struct neuron_udma_import *imp);
/* KUnit builds only: an in-kernel importer of an export, and the driver's own on one. */
void neuron_udma_kunit_import(struct neuron_udma_export *exp, struct device *dev,
			      struct neuron_udma_kunit_report *r);
struct neuron_udma_import *neuron_udma_kunit_import_export(struct neuron_udma_export *exp,
							   struct device *dev, u64 *size);
/* KUnit builds only: the pinned importer user space drives (debugfs). */
struct dentry *neuron_udma_kunit_pinned_importer_create(void);
void neuron_udma_kunit_pinned_importer_remove(struct dentry *d);

/*
 * ---- implemented in Rust, called from rust/kfac/dmabuf_*.c ----
 * Not given to bindgen (__BINDGEN__): their Rust definitions are their declarations.
 */
#ifndef __BINDGEN__
/* rust/dmabuf.rs: an export's dma-buf was released (its last reference is gone). */
void neuron_udma_dmabuf_released(struct neuron_udma_export_hold *hold);
/*
 * rust/dmabuf.rs: the stranded export @instance was released (off the list): the binding that
 * reserved its range, if one did, frees it.
 */
void neuron_udma_dmabuf_stranded_released(u64 instance);
/*
 * rust/buffer.rs: the exporter revoked the import of @buf (called under the dma-buf's
 * reservation lock): no new copy may name it; true while a descriptor or copy may still reach
 * it (neuron_udma_import_drain() then waits, from a work item, and unmaps).
 */
bool neuron_udma_import_revoke(const struct neuron_udma_buffer *buf);
void neuron_udma_import_drain(const struct neuron_udma_buffer *buf);
#endif

#endif /* NEURON_UDMA_KFAC_DMABUF_H */
