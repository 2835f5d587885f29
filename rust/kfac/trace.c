// SPDX-License-Identifier: GPL-2.0
/*
 * The driver's tracepoints: instantiated here (CREATE_TRACE_POINTS), fired by the functions of
 * rust/kfac/trace.h for Rust, and directly by the C of rust/kfac/ (dmabuf_export.c).
 */
#include <linux/device.h>

#define CREATE_TRACE_POINTS
#include "trace_internal.h"

#include "trace.h"

void neuron_udma_trace_queue_init(const struct device *dev, u32 engine, u32 queue, u64 instance,
				  u32 tx_descs, u32 rx_descs, bool device_rings, u64 owner)
{
	trace_neuron_udma_queue_init(dev, engine, queue, instance, tx_descs, rx_descs,
				     device_rings, owner);
}

void neuron_udma_trace_queue_release(const struct device *dev, u32 engine, u32 queue,
				     u64 instance, u64 next_fence)
{
	trace_neuron_udma_queue_release(dev, engine, queue, instance, next_fence);
}

bool neuron_udma_trace_submit_enabled(void)
{
	return trace_neuron_udma_submit_enabled();
}

void neuron_udma_trace_submit(const struct device *dev, u32 engine, u32 queue, u64 instance,
			      u32 pairs, u64 bytes)
{
	trace_neuron_udma_submit(dev, engine, queue, instance, pairs, bytes);
}

void neuron_udma_trace_fence(const struct device *dev, u32 engine, u32 queue, u64 instance,
			     u64 fence)
{
	trace_neuron_udma_fence(dev, engine, queue, instance, fence);
}

void neuron_udma_trace_doorbell(const struct device *dev, u32 engine, u32 queue, u64 instance,
				u32 tx, u32 rx)
{
	trace_neuron_udma_doorbell(dev, engine, queue, instance, tx, rx);
}

void neuron_udma_trace_fence_done(const struct device *dev, u32 engine, u32 queue, u64 instance,
				  u64 fence, u32 fences)
{
	trace_neuron_udma_fence_done(dev, engine, queue, instance, fence, fences);
}

void neuron_udma_trace_fence_failed(const struct device *dev, u32 engine, u32 queue,
				    u64 instance, u64 first, u64 last, int error)
{
	trace_neuron_udma_fence_failed(dev, engine, queue, instance, first, last, error);
}

void neuron_udma_trace_queue_reset(const struct device *dev, u32 engine, u32 queue, u64 instance,
				   int cause)
{
	trace_neuron_udma_queue_reset(dev, engine, queue, instance, cause);
}

void neuron_udma_trace_engine_abort(const struct device *dev, u32 engine, u32 queue,
				    u32 m2s_state, u32 m2s_cause, u32 s2m_state, u32 s2m_cause)
{
	trace_neuron_udma_engine_abort(dev, engine, queue, m2s_state, m2s_cause, s2m_state,
				       s2m_cause);
}

void neuron_udma_trace_buffer(const struct device *dev, u32 what, u64 handle, u64 size,
			      const char *kind, u64 owner)
{
	switch (what) {
	case 0:
		trace_neuron_udma_buffer_alloc(dev, handle, size, kind, owner);
		break;
	case 1:
		trace_neuron_udma_buffer_import(dev, handle, size, kind, owner);
		break;
	case 2:
		trace_neuron_udma_buffer_free(dev, handle, size, kind, owner);
		break;
	default:
		trace_neuron_udma_dmabuf_export(dev, handle, size, kind, owner);
		break;
	}
}

void neuron_udma_trace_scrub(const struct device *dev, u64 addr, u64 size, u32 engines,
			     int error)
{
	trace_neuron_udma_scrub(dev, addr, size, engines, error);
}

void neuron_udma_trace_device_reset(const struct device *dev, const char *what, u32 queues,
				    int error)
{
	trace_neuron_udma_device_reset(dev, what, queues, error);
}
