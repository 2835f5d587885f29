/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the C files of the dma-buf facility (rust/kfac/dmabuf_*.c) share with each other and not
 * with Rust: rust/kfac/dmabuf.h is the Rust interface.
 */
#ifndef NEURON_UDMA_KFAC_DMABUF_INTERNAL_H
#define NEURON_UDMA_KFAC_DMABUF_INTERNAL_H

#include <linux/types.h>

#include "dmabuf.h"

struct dma_buf;

/* dmabuf_export.c: the dma-buf of @exp (no reference is taken). */
struct dma_buf *neuron_udma_export_dmabuf(struct neuron_udma_export *exp);
/*
 * dmabuf_export.c: whether @dmabuf is an export of this driver of the memory of @dev; then
 * *@bus_base is the bus address of @dev's BAR4.
 */
bool neuron_udma_export_local(struct dma_buf *dmabuf, struct device *dev, u64 *bus_base);
/* dmabuf_export.c: the device whose memory @dmabuf is, if it is an export of this driver. */
struct device *neuron_udma_export_device(struct dma_buf *dmabuf);
/*
 * sysfs.c, with the other module parameters: whether pinned importers are admitted
 * (dmabuf_pinned_importers), and how long an unbind waits for them (ms).
 */
bool neuron_udma_dmabuf_pinned_importers(void);
unsigned int neuron_udma_dmabuf_pinned_unbind_wait_ms(void);
/* dmabuf_import.c: neuron_udma_import_dmabuf() of @dmabuf, whose reference it takes over. */
struct neuron_udma_import *neuron_udma_import_attach(struct dma_buf *dmabuf, struct device *dev,
						     bool write, u64 *size);

#endif /* NEURON_UDMA_KFAC_DMABUF_INTERNAL_H */
