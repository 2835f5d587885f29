/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The device-memory cgroup controller (CONFIG_CGROUP_DMEM), which Linux 7.3's Rust does not
 * wrap: a device's HBM registered as a dmem region, allocations in it charged to the allocating
 * task's cgroup. Implemented in rust/kfac/dmem.c; bindgen generates the Rust declarations
 * (Kbuild), wrapped by rust/kfac/dmem.rs. The region and the charged pool are opaque pointers
 * here (struct dmem_cgroup_region, struct dmem_cgroup_pool_state in C).
 */
#ifndef NEURON_UDMA_KFAC_DMEM_H
#define NEURON_UDMA_KFAC_DMEM_H

#include <linux/types.h>

/*
 * Registers region @name of @size bytes: 0 and *@region set (NULL without CONFIG_CGROUP_DMEM),
 * or -errno.
 */
int neuron_udma_dmem_register(u64 size, const char *name, void **region);
/* Unregisters @region (NULL: nothing); charges taken from it stay valid until uncharged. */
void neuron_udma_dmem_unregister(void *region);
/*
 * Charges @size bytes of @region to the current task's cgroup: 0 and *@pool set (the charged
 * pool, NULL without the controller), -EDQUOT past a dmem.max, or another -errno.
 */
int neuron_udma_dmem_try_charge(void *region, u64 size, void **pool);
/* Gives back @size bytes charged to @pool (NULL: nothing). */
void neuron_udma_dmem_uncharge(void *pool, u64 size);

#endif /* NEURON_UDMA_KFAC_DMEM_H */
