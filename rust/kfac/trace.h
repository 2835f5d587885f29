/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The driver's tracepoints (rust/kfac/trace_internal.h), which Rust cannot define or fire
 * (TRACE_EVENT is a C macro): one function per event, firing it if it is enabled. Implemented
 * in rust/kfac/trace.c; bindgen generates the Rust declarations (Kbuild), wrapped by
 * rust/kfac/trace.rs. @dev is the PCI device's struct device; @kind a NUL-terminated string.
 */
#ifndef NEURON_UDMA_KFAC_TRACE_H
#define NEURON_UDMA_KFAC_TRACE_H

#include <linux/types.h>

struct device;

void neuron_udma_trace_queue_init(const struct device *dev, u32 engine, u32 queue, u64 instance,
				  u32 tx_descs, u32 rx_descs, bool device_rings, u64 owner);
void neuron_udma_trace_queue_release(const struct device *dev, u32 engine, u32 queue,
				     u64 instance, u64 next_fence);
/* Whether the submit event is enabled (its byte count costs a pass over the copies). */
bool neuron_udma_trace_submit_enabled(void);
void neuron_udma_trace_submit(const struct device *dev, u32 engine, u32 queue, u64 instance,
			      u32 pairs, u64 bytes);
void neuron_udma_trace_fence(const struct device *dev, u32 engine, u32 queue, u64 instance,
			     u64 fence);
void neuron_udma_trace_doorbell(const struct device *dev, u32 engine, u32 queue, u64 instance,
				u32 tx, u32 rx);
void neuron_udma_trace_fence_done(const struct device *dev, u32 engine, u32 queue, u64 instance,
				  u64 fence, u32 fences);
void neuron_udma_trace_fence_failed(const struct device *dev, u32 engine, u32 queue,
				    u64 instance, u64 first, u64 last, int error);
void neuron_udma_trace_queue_reset(const struct device *dev, u32 engine, u32 queue, u64 instance,
				   int cause);
void neuron_udma_trace_engine_abort(const struct device *dev, u32 engine, u32 queue,
				    u32 m2s_state, u32 m2s_cause, u32 s2m_state, u32 s2m_cause);
/* @what: 0 alloc, 1 import, 2 free, 3 dma-buf export. */
void neuron_udma_trace_buffer(const struct device *dev, u32 what, u64 handle, u64 size,
			      const char *kind, u64 owner);
void neuron_udma_trace_scrub(const struct device *dev, u64 addr, u64 size, u32 engines,
			     int error);
void neuron_udma_trace_device_reset(const struct device *dev, const char *what, u32 queues,
				    int error);

#endif /* NEURON_UDMA_KFAC_TRACE_H */
