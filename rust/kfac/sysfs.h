/* SPDX-License-Identifier: GPL-2.0 */
/*
 * sysfs files of the driver, which Linux 7.3's Rust cannot create: the read-only usage counters
 * of a bound device (an attribute group), and the module parameters (7.3's module! macro
 * registers Rust parameters with perm 0, so they never appear in
 * /sys/module/neuron_udma/parameters/). Implemented in rust/kfac/sysfs.c; bindgen generates the
 * Rust declarations (Kbuild), wrapped by rust/kfac/sysfs.rs.
 */
#ifndef NEURON_UDMA_KFAC_SYSFS_H
#define NEURON_UDMA_KFAC_SYSFS_H

#include <linux/types.h>

struct device;

/* The sysfs group of a device's counters; opaque to Rust. */
struct neuron_udma_usage;

/* The number of counters (rust/kfac/sysfs.c names them): 8 of memory, 12 of activity. */
#define NEURON_UDMA_USAGE_NR 20

/* No sysfs attributes in Rust: read-only u64 counters of a device, in a named group. */
struct neuron_udma_usage *neuron_udma_usage_add(struct device *dev, const u64 *const *vals);
void neuron_udma_usage_remove(struct neuron_udma_usage *usage);
/*
 * The module parameters: dma_channels (read-only), device_ring_fill and max_buffers (and the
 * dma-buf ones, which only C reads: rust/kfac/dmabuf_internal.h).
 */
unsigned int neuron_udma_dma_channels(void);
bool neuron_udma_device_rings_by_engine(void);
unsigned int neuron_udma_max_buffers(void);

#endif /* NEURON_UDMA_KFAC_SYSFS_H */
