/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The tracepoints of the driver (system neuron_udma): queues, submissions, doorbells, fences,
 * resets, engine aborts, buffers, dma-bufs, scrubs and device resets. Documentation/neuron-udma.rst lists them
 * with an example; rust/kfac/trace.c instantiates them and wraps each in a function Rust calls
 * (rust/kfac/trace.rs). Every event names its device (the PCI device's name); the events of a
 * queue also name its instance, which is never reused (a queue id is: a released queue's id
 * comes back with a new instance).
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM neuron_udma

#if !defined(NEURON_UDMA_TRACE_INTERNAL_H) || defined(TRACE_HEADER_MULTI_READ)
#define NEURON_UDMA_TRACE_INTERNAL_H

#include <linux/device.h>
#include <linux/tracepoint.h>

/*
 * A queue's events start with the same four fields (device, engine, queue, instance) and print
 * them first, as "%s engine=%u queue=%u instance=%llu".
 */
TRACE_EVENT(neuron_udma_queue_init,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u32 tx_descs,
		 u32 rx_descs, bool device_rings, u64 owner),
	TP_ARGS(dev, engine, queue, instance, tx_descs, rx_descs, device_rings, owner),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u32, tx_descs)
		__field(u32, rx_descs)
		__field(bool, device_rings)
		__field(u64, owner)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->tx_descs = tx_descs;
		__entry->rx_descs = rx_descs;
		__entry->device_rings = device_rings;
		__entry->owner = owner;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu tx_descs=%u rx_descs=%u device_rings=%d owner=%llu",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance,
		  __entry->tx_descs, __entry->rx_descs, __entry->device_rings, __entry->owner)
);

TRACE_EVENT(neuron_udma_queue_release,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u64 next_fence),
	TP_ARGS(dev, engine, queue, instance, next_fence),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u64, next_fence)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->next_fence = next_fence;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu next_fence=%llu",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->next_fence)
);

TRACE_EVENT(neuron_udma_submit,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u32 pairs,
		 u64 bytes),
	TP_ARGS(dev, engine, queue, instance, pairs, bytes),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u32, pairs)
		__field(u64, bytes)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->pairs = pairs;
		__entry->bytes = bytes;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu pairs=%u bytes=%llu",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->pairs,
		  __entry->bytes)
);

TRACE_EVENT(neuron_udma_fence,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u64 fence),
	TP_ARGS(dev, engine, queue, instance, fence),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u64, fence)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->fence = fence;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu fence=%llu",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->fence)
);

TRACE_EVENT(neuron_udma_doorbell,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u32 tx, u32 rx),
	TP_ARGS(dev, engine, queue, instance, tx, rx),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u32, tx)
		__field(u32, rx)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->tx = tx;
		__entry->rx = rx;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu tx=%u rx=%u",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->tx, __entry->rx)
);

TRACE_EVENT(neuron_udma_fence_done,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u64 fence,
		 u32 fences),
	TP_ARGS(dev, engine, queue, instance, fence, fences),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u64, fence)
		__field(u32, fences)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->fence = fence;
		__entry->fences = fences;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu fence=%llu fences=%u",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->fence,
		  __entry->fences)
);

TRACE_EVENT(neuron_udma_fence_failed,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, u64 first,
		 u64 last, int error),
	TP_ARGS(dev, engine, queue, instance, first, last, error),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(u64, first)
		__field(u64, last)
		__field(int, error)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->first = first;
		__entry->last = last;
		__entry->error = error;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu first=%llu last=%llu error=%d",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->first,
		  __entry->last, __entry->error)
);

TRACE_EVENT(neuron_udma_queue_reset,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u64 instance, int cause),
	TP_ARGS(dev, engine, queue, instance, cause),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u64, instance)
		__field(int, cause)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->instance = instance;
		__entry->cause = cause;
	),
	TP_printk("%s engine=%u queue=%u instance=%llu cause=%d",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->instance, __entry->cause)
);

TRACE_EVENT(neuron_udma_engine_abort,
	TP_PROTO(const struct device *dev, u32 engine, u32 queue, u32 m2s_state, u32 m2s_cause,
		 u32 s2m_state, u32 s2m_cause),
	TP_ARGS(dev, engine, queue, m2s_state, m2s_cause, s2m_state, s2m_cause),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u32, engine)
		__field(u32, queue)
		__field(u32, m2s_state)
		__field(u32, m2s_cause)
		__field(u32, s2m_state)
		__field(u32, s2m_cause)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->engine = engine;
		__entry->queue = queue;
		__entry->m2s_state = m2s_state;
		__entry->m2s_cause = m2s_cause;
		__entry->s2m_state = s2m_state;
		__entry->s2m_cause = s2m_cause;
	),
	TP_printk("%s engine=%u queue=%u m2s_state=%#x m2s_cause=%#x s2m_state=%#x s2m_cause=%#x",
		  __get_str(dev), __entry->engine, __entry->queue, __entry->m2s_state,
		  __entry->m2s_cause, __entry->s2m_state, __entry->s2m_cause)
);

/* The fields of the buffer events: the buffer's handle, size, kind and owning file. */
DECLARE_EVENT_CLASS(neuron_udma_buffer,
	TP_PROTO(const struct device *dev, u64 handle, u64 size, const char *kind, u64 owner),
	TP_ARGS(dev, handle, size, kind, owner),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u64, handle)
		__field(u64, size)
		__string(kind, kind)
		__field(u64, owner)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->handle = handle;
		__entry->size = size;
		__assign_str(kind);
		__entry->owner = owner;
	),
	TP_printk("%s handle=%llu size=%llu kind=%s owner=%llu", __get_str(dev),
		  __entry->handle, __entry->size, __get_str(kind), __entry->owner)
);

DEFINE_EVENT(neuron_udma_buffer, neuron_udma_buffer_alloc,
	TP_PROTO(const struct device *dev, u64 handle, u64 size, const char *kind, u64 owner),
	TP_ARGS(dev, handle, size, kind, owner));
DEFINE_EVENT(neuron_udma_buffer, neuron_udma_buffer_import,
	TP_PROTO(const struct device *dev, u64 handle, u64 size, const char *kind, u64 owner),
	TP_ARGS(dev, handle, size, kind, owner));
DEFINE_EVENT(neuron_udma_buffer, neuron_udma_buffer_free,
	TP_PROTO(const struct device *dev, u64 handle, u64 size, const char *kind, u64 owner),
	TP_ARGS(dev, handle, size, kind, owner));
DEFINE_EVENT(neuron_udma_buffer, neuron_udma_dmabuf_export,
	TP_PROTO(const struct device *dev, u64 handle, u64 size, const char *kind, u64 owner),
	TP_ARGS(dev, handle, size, kind, owner));

/* An importer attached to an export of device memory, or the export's range revoked. */
DECLARE_EVENT_CLASS(neuron_udma_export,
	TP_PROTO(const struct device *dev, u64 addr, u64 size, const char *importer),
	TP_ARGS(dev, addr, size, importer),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u64, addr)
		__field(u64, size)
		__string(importer, importer)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->addr = addr;
		__entry->size = size;
		__assign_str(importer);
	),
	TP_printk("%s addr=%#llx size=%llu importer=%s", __get_str(dev), __entry->addr,
		  __entry->size, __get_str(importer))
);

DEFINE_EVENT(neuron_udma_export, neuron_udma_dmabuf_attach,
	TP_PROTO(const struct device *dev, u64 addr, u64 size, const char *importer),
	TP_ARGS(dev, addr, size, importer));
DEFINE_EVENT(neuron_udma_export, neuron_udma_dmabuf_revoke,
	TP_PROTO(const struct device *dev, u64 addr, u64 size, const char *importer),
	TP_ARGS(dev, addr, size, importer));

TRACE_EVENT(neuron_udma_scrub,
	TP_PROTO(const struct device *dev, u64 addr, u64 size, u32 engines, int error),
	TP_ARGS(dev, addr, size, engines, error),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__field(u64, addr)
		__field(u64, size)
		__field(u32, engines)
		__field(int, error)
	),
	TP_fast_assign(
		__assign_str(dev);
		__entry->addr = addr;
		__entry->size = size;
		__entry->engines = engines;
		__entry->error = error;
	),
	TP_printk("%s addr=%#llx size=%llu engines=%u error=%d", __get_str(dev), __entry->addr,
		  __entry->size, __entry->engines, __entry->error)
);

/* @what: "reset" (a function-level reset), "error" (PCI error recovery), "shutdown" or "restart". */
TRACE_EVENT(neuron_udma_device_reset,
	TP_PROTO(const struct device *dev, const char *what, u32 queues, int error),
	TP_ARGS(dev, what, queues, error),
	TP_STRUCT__entry(
		__string(dev, dev_name(dev))
		__string(what, what)
		__field(u32, queues)
		__field(int, error)
	),
	TP_fast_assign(
		__assign_str(dev);
		__assign_str(what);
		__entry->queues = queues;
		__entry->error = error;
	),
	TP_printk("%s what=%s queues=%u error=%d", __get_str(dev), __get_str(what),
		  __entry->queues, __entry->error)
);

#endif /* NEURON_UDMA_TRACE_INTERNAL_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE trace_internal
#include <trace/define_trace.h>
