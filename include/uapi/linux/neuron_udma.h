/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * neuron_udma: ioctl ABI of the AWS Neuron UDMA (memory-to-memory DMA) driver.
 *
 * One character device per bound Neuron device: /dev/neuron_udma0, /dev/neuron_udma1, ...
 *
 * User space names memory only as (buffer handle, byte offset); it never sees a bus address.
 * Host buffers are coherent DMA memory, mapped into the process with mmap() at the offset
 * MEM_ALLOC returns; device buffers are ranges of the device memory (HBM, BAR4); imported
 * buffers (ABI 2, MEM_IMPORT) are the caller's own memory, pinned for DMA (zero-copy).
 *
 * A queue is one (engine, queue) pair with a Tx (m2s, source) and an Rx (s2m, destination)
 * descriptor ring. Copies are prepared as descriptor pairs (COPY_PREPARE_ONE / COPY_PREPARE),
 * started by ringing the doorbells (COPY_START: Rx then Tx) and completed by COPY_WAIT, which
 * appends a completion marker pair when needed, waits for it and frees the ring space.
 * Every resource belongs to the file that created it and is released when that file is closed.
 *
 * Conventions: all structs have explicit padding; every field named reserved* and every flag
 * bit not defined here must be zero (else EINVAL). Sizes are in bytes unless a name says
 * "descs" (descriptors) or "pairs" (Tx+Rx descriptor pairs).
 *
 * Errors common to every ioctl: EFAULT (bad user pointer), ENOTTY (unknown command), ENODEV
 * (the device was unbound), EINVAL (bad argument or a reserved field set). Per-ioctl errors are
 * listed with each command and in Documentation/userspace-api.rst.
 */
#ifndef _UAPI_LINUX_NEURON_UDMA_H
#define _UAPI_LINUX_NEURON_UDMA_H

#include <linux/ioctl.h>
#include <linux/types.h>

/*
 * 1: the first ABI. 2: MEM_IMPORT, NEURON_UDMA_COPY_SPLIT, neuron_udma_info.max_import_size
 * (ABI 1 calls are unchanged; an ABI 1 driver answers MEM_IMPORT with ENOTTY).
 * 3: fences as values (COPY_SUBMIT, FENCE_STATUS, FENCE_WAIT), completion events (poll(),
 * QUEUE_EVENTS, QUEUE_EVENTFD, io_uring NEURON_UDMA_URING_COPY), MEMSET, dma-buf export and
 * import, queues with their rings in device memory, mmap of device buffers, per-file limits in
 * INFO; COPY_WAIT no longer resets a queue that still makes progress when it times out;
 * NEURON_UDMA_COPY_DST_INT is reserved (it set a descriptor bit nothing listens to: EINVAL);
 * INFO reports the device's NUMA node. INFO accepts every earlier size of its struct (the
 * command number encodes the size).
 */
#define NEURON_UDMA_ABI_VERSION 3

/* 0xB9 is unassigned in Documentation/userspace-api/ioctl/ioctl-number.rst. */
#define NEURON_UDMA_IOC_MAGIC 0xB9

/* Device generations (struct neuron_udma_info.generation). */
#define NEURON_UDMA_GEN_V2 2 /* Trainium1 (0x7164), Inferentia2 (0x7264) */
#define NEURON_UDMA_GEN_V3 3 /* Trainium2 (0x7364) */

/* NEURON_UDMA_INFO: device and driver facts. */
struct neuron_udma_info {
	__u32 abi_version;		/* NEURON_UDMA_ABI_VERSION */
	__u32 generation;		/* NEURON_UDMA_GEN_* */
	__u16 vendor_id;		/* PCI vendor, 0x1d0f */
	__u16 device_id;		/* PCI device */
	__u32 engines;			/* engine ids 0..engines-1 */
	__u32 queues_per_engine;	/* 16 */
	__u32 max_copy_size;		/* largest size of one copy (descriptor pair): 65536 */
	__u64 device_mem_size;		/* device memory (HBM) available to MEM_ALLOC */
	__u32 min_ring_descs;		/* smallest ring: 32 descriptors */
	__u32 max_ring_descs;		/* largest ring: 2^23 descriptors */
	__u32 ring_reserve_descs;	/* slots kept free on each ring: 16 */
	__u32 max_batch;		/* most entries of one COPY_PREPARE */
	__u64 max_host_buffer;		/* largest host buffer of one MEM_ALLOC */
	/*
	 * Bitmap of the engines that reach host memory (bit e % 64 of word e / 64): user queues
	 * (their rings are in host memory) exist only on these; QUEUE_INIT refuses the others
	 * with EOPNOTSUPP. v2: every engine; v3: 32i + {4-7, 12-15, 20-23, 28-31} and 128-131.
	 */
	__u64 host_engines[3];
	__u64 max_import_size;		/* ABI 2: largest range of one MEM_IMPORT (0 before) */
	/* ABI 3 (an ABI 2 caller's shorter struct gets the fields above only): */
	__u32 max_buffers;		/* live buffers (allocated, imported) this file may hold */
	__u32 max_queue_fences;		/* fences in flight on one queue (COPY_SUBMIT: EBUSY past) */
	/*
	 * Bitmap of the engines whose queues may keep their rings in device memory
	 * (NEURON_UDMA_QUEUE_DEVICE_RINGS): every engine when the device has device memory.
	 */
	__u64 device_ring_engines[3];
	/*
	 * NUMA node of the device (as /sys/bus/pci/devices/<bdf>/numa_node), -1 when the kernel
	 * knows none; the driver's completion work runs there. Earlier ABI 3 drivers leave it 0.
	 */
	__s32 numa_node;
	/* NEURON_UDMA_FEATURE_* the driver has; earlier ABI 3 drivers leave it 0. */
	__u32 features;
	__u64 reserved[3];
};

/*
 * Features (struct neuron_udma_info.features) added within ABI 3.
 * URING_FIXED: a NEURON_UDMA_URING_COPY may name a range of an io_uring registered buffer as
 * NEURON_UDMA_FIXED_BUFFER (see struct neuron_udma_uring_copy).
 */
#define NEURON_UDMA_FEATURE_URING_FIXED	(1U << 0)

/* Buffer types (struct neuron_udma_mem_alloc.type). */
#define NEURON_UDMA_MEM_HOST 0		/* coherent host memory, mmap'able */
#define NEURON_UDMA_MEM_DEVICE 1	/* device memory (HBM); ABI 3: mmap'able (through BAR4) */

/*
 * NEURON_UDMA_MEM_ALLOC: allocate a buffer of @size bytes (rounded up to 4 KiB). Host buffers
 * are mmap'able at @mmap_offset; ABI 3: so are device buffers (write-combined through BAR4, for
 * small CPU reads and writes).
 * Errors: EINVAL (size 0, unknown type, flags or reserved set), ENOMEM (no memory of that type,
 * or the memory cgroup's limit on the kernel memory of the buffer's record), EMFILE (the file
 * holds max_buffers buffers already), EDQUOT (a device buffer past the caller's cgroup's
 * dmem.max for the device's region "neuron_udma/<PCI address>"; nothing is allocated).
 */
struct neuron_udma_mem_alloc {
	__u64 size;			/* in */
	__u32 type;			/* in: NEURON_UDMA_MEM_* */
	__u32 flags;			/* in: 0 */
	__u64 handle;			/* out: non-zero buffer handle */
	__u64 mmap_offset;		/* out: offset for mmap() (ABI 3: device buffers too) */
	__u64 reserved[2];
};

/* Import flags (struct neuron_udma_mem_import.flags). */
#define NEURON_UDMA_IMPORT_WRITE (1U << 0)	/* the engine may write it: usable as destination */

/*
 * NEURON_UDMA_MEM_IMPORT (ABI 2): pin the caller's memory [@addr, @addr + @size) for DMA
 * (zero-copy: no bounce buffer, no CPU copy) and return a handle usable wherever a host
 * buffer's is: as source of every copy ioctl and MEMCPY, and as destination only with
 * NEURON_UDMA_IMPORT_WRITE (else those fail with EPERM). Offsets count bytes from @addr; any
 * alignment and size (1..max_import_size) is accepted. The pages are charged to the caller's
 * RLIMIT_MEMLOCK (with host buffers and rings), stay pinned and belong to the importer whatever
 * the process does with the range (munmap, mremap; fork gives the child copies), and are
 * unpinned by MEM_FREE or close only once no descriptor can reach them (MEM_FREE is EBUSY
 * before). Not mmap'able: the process reads and writes its own mapping.
 * @segments is the number of physically contiguous runs the range maps to: a copy whose source
 * or destination range crosses from one run to the next needs one descriptor pair per piece
 * (see NEURON_UDMA_COPY_SPLIT).
 * Errors: EINVAL (size 0 or > max_import_size, addr + size wraps, flags or reserved set),
 * EFAULT (part of the range is not mapped, or is read-only and IMPORT_WRITE was asked),
 * ENOMEM (RLIMIT_MEMLOCK would be exceeded, or no memory: nothing stays pinned), EOPNOTSUPP
 * (memory that cannot be pinned long-term, such as some file mappings, or that the device
 * could only reach through bounce buffers).
 */
struct neuron_udma_mem_import {
	__u64 addr;			/* in: user address */
	__u64 size;			/* in: bytes */
	__u32 flags;			/* in: NEURON_UDMA_IMPORT_* */
	__u32 segments;			/* out: physically contiguous runs of the range */
	__u64 handle;			/* out: non-zero buffer handle */
	__u64 reserved[2];
};

/*
 * NEURON_UDMA_MEM_FREE: free a buffer of this file (allocated or imported).
 * Errors: ENOENT (no such handle in this file), EBUSY (a descriptor pair the engine has not
 * consumed, or a MEMCPY, still uses it; wait for them first).
 */
struct neuron_udma_mem_free {
	__u64 handle;
	__u64 reserved;
};

/* Queue flags (struct neuron_udma_queue_init.flags). */
/*
 * ABI 3: the rings live in device memory (taken from the device memory MEM_ALLOC hands out), so
 * an engine without host connectivity can serve the queue: its copies may then only name device
 * buffers (a copy from or to host memory fails in the engine with EIO).
 */
#define NEURON_UDMA_QUEUE_DEVICE_RINGS (1U << 0)

/*
 * NEURON_UDMA_QUEUE_INIT: take queue (@engine, @queue) with rings of @tx_descs / @rx_descs
 * descriptors (powers of two, 32..2^23); the driver allocates the rings and programs the queue.
 * Errors: EINVAL (no such engine/queue, bad ring size, reserved set; a message names the limit),
 * EBUSY (the queue is taken by any file, or reserved for the driver), ENOMEM, EOPNOTSUPP (the
 * rings are in host memory and the engine cannot reach it: on Trainium2 only engines 32i +
 * 4..7, 12..15, 20..23, 28..31 and 128..131 can; every Trainium1/Inferentia2 engine can; or
 * DEVICE_RINGS without device memory), EDQUOT (DEVICE_RINGS past the caller's cgroup's
 * dmem.max for the device's region).
 */
struct neuron_udma_queue_init {
	__u32 engine;
	__u32 queue;
	__u32 tx_descs;
	__u32 rx_descs;
	__u32 flags;			/* NEURON_UDMA_QUEUE_* */
	__u32 reserved0;
	__u64 reserved[2];
};

/*
 * NEURON_UDMA_QUEUE_RELEASE: give a queue of this file back, ending its instance: its waits in
 * other threads return ECANCELED and its io_uring commands complete with -ECANCELED. Errors:
 * ENOENT (not this file's).
 */
struct neuron_udma_queue_id {
	__u32 engine;
	__u32 queue;
	__u64 reserved;
};

/* Barrier modes (struct neuron_udma_copy.barrier), as in the hardware's Tx descriptor. */
#define NEURON_UDMA_BARRIER_NONE 0
#define NEURON_UDMA_BARRIER_DMB 1	/* wait for all earlier transfers of the queue */
#define NEURON_UDMA_BARRIER_WRITE 2	/* make this copy's writes visible before later ones */

/* Copy flags (struct neuron_udma_copy.flags). */
/*
 * ABI 1-2: set the interrupt flag of the Rx descriptor. Reserved since ABI 3 (EINVAL): no
 * interrupt is requested or handled; completions are reported by fences and their events.
 */
#define NEURON_UDMA_COPY_DST_INT (1U << 0)
/*
 * ABI 2: the copy may take several descriptor pairs. A copy whose source or destination is an
 * imported buffer and whose range crosses from one physically contiguous run to the next is
 * written as one pair per piece (each piece within one run of each side, in order; every piece
 * has the copy's barrier, only the last one its DST_INT). Without this flag such a copy fails
 * with EXDEV, so a copy is never silently more than one pair.
 */
#define NEURON_UDMA_COPY_SPLIT (1U << 1)

/* One copy: @size bytes from (src_handle, src_offset) to (dst_handle, dst_offset). */
struct neuron_udma_copy {
	__u64 src_handle;
	__u64 src_offset;
	__u64 dst_handle;
	__u64 dst_offset;
	__u32 size;			/* 1..65536 */
	__u32 barrier;			/* NEURON_UDMA_BARRIER_* */
	__u32 flags;			/* NEURON_UDMA_COPY_* */
	__u32 reserved;
};

/*
 * NEURON_UDMA_COPY_PREPARE_ONE: write one descriptor pair (Rx slot, then Tx slot), or with
 * NEURON_UDMA_COPY_SPLIT the pairs of its pieces.
 * Returns 0, or with NEURON_UDMA_COPY_SPLIT the number of pairs written (>= 1; the counts to
 * give COPY_START).
 * Errors: ENOENT (unknown handle, or queue not this file's), ERANGE (offset + size beyond a
 * buffer), EINVAL (size 0 or > 65536, bad barrier, flags/reserved set), ENOSPC (no room for all
 * its pairs: nothing written; COPY_WAIT frees space), EXDEV (crosses a run of an imported buffer
 * without NEURON_UDMA_COPY_SPLIT), E2BIG (a split copy needs more pairs than the queue's rings
 * hold even when empty: use larger rings), EPERM (destination imported without IMPORT_WRITE).
 */
struct neuron_udma_copy_prepare_one {
	__u32 engine;
	__u32 queue;
	struct neuron_udma_copy copy;
};

/*
 * NEURON_UDMA_COPY_PREPARE: write the pairs of @count copies from the array at @copies. Every
 * entry is validated, and the space for all their pairs checked, before any slot is written: on
 * any error nothing changes. Returns 0, or when any entry has NEURON_UDMA_COPY_SPLIT the total
 * number of pairs written (>= @count). Errors: as COPY_PREPARE_ONE, EINVAL also for count 0 or
 * > max_batch.
 */
struct neuron_udma_copy_prepare {
	__u32 engine;
	__u32 queue;
	__u32 count;
	__u32 reserved;
	__u64 copies;			/* user pointer to count x struct neuron_udma_copy */
};

/*
 * NEURON_UDMA_COPY_START: ring the doorbells: Rx += @s2m_count, then Tx += @m2s_count.
 * Errors: ENOENT (queue not this file's), EINVAL (s2m_count 0, or a count above the prepared,
 * not yet started descriptors of its ring).
 */
struct neuron_udma_copy_start {
	__u32 engine;
	__u32 queue;
	__u32 m2s_count;
	__u32 s2m_count;
	__u64 reserved;
};

/*
 * NEURON_UDMA_COPY_WAIT: start everything prepared, append a completion marker pair (or reuse
 * the newest one in flight when nothing new was prepared or there is no room), wait up to
 * @timeout_ms (0: 10 s; at least 10 ms) for it, then free the ring space of every completed
 * pair. Errors: ENOENT, ENOSPC (no room for the marker pair and none in flight), ETIMEDOUT (no
 * completion in time; since ABI 3 the copies go on, and the queue is reset only when it made
 * no progress for 10 s: then it is usable again), EIO (the engine reported an error, or a reset
 * dropped the marker, and the queue was reset; or the queue was reset while the wait went on, so
 * work it waited for may have been dropped. @completed is not set then: the copies up to the
 * newest fence done, FENCE_STATUS @completed, are done; later ones may have been dropped),
 * EINTR (a signal, or io_uring task work of this thread such as a CQE of its ring: the copies
 * go on), ECANCELED (another thread released the queue while the wait went on).
 */
struct neuron_udma_copy_wait {
	__u32 engine;
	__u32 queue;
	__u32 timeout_ms;
	__u32 reserved;
	__u64 completed;		/* out: descriptor pairs freed, marker included */
};

/* Register and software state of one ring. */
struct neuron_udma_ring_state {
	__u32 hw_cfg;			/* cfg register */
	__u32 hw_status;		/* status register */
	__u32 hw_len;			/* ring length register, descriptors */
	__u32 hw_head;			/* head: index [23:0], ring id [31:30] */
	__u32 hw_tail;			/* tail: index [23:0], ring id [31:30] */
	__u32 hw_comp_head;		/* completion head */
	__u32 sw_next;			/* next slot the driver writes */
	__u32 sw_ack;			/* first slot not yet completed */
	__u32 sw_ring_id;		/* ring id of the next slot */
	__u32 sw_available;		/* free slots */
	__u32 sw_pending;		/* prepared, doorbell not rung */
	__u32 size;			/* descriptors */
};

/* NEURON_UDMA_QUEUE_STATE: registers and software indices of a queue of this file. */
struct neuron_udma_queue_state {
	__u32 engine;			/* in */
	__u32 queue;			/* in */
	__u32 m2s_engine_state;		/* m2s.state register */
	__u32 s2m_engine_state;		/* s2m.state register */
	__u32 m2s_error_cause;		/* secondary IOFIC group A cause */
	__u32 s2m_error_cause;		/* secondary IOFIC group B cause */
	__u32 resets;			/* times the queue was reset after an error */
	__u32 reserved;
	struct neuron_udma_ring_state tx;
	struct neuron_udma_ring_state rx;
};

/*
 * NEURON_UDMA_MEMCPY: copy @size bytes (any size) with the driver's own H2T queue (shared by
 * all files), in 64 KiB pairs, and wait for completion (only SIGKILL interrupts it; bounded by
 * the timeout, at least 10 ms). A timeout resets the shared queue only if it made no progress
 * for 10 s: otherwise the copy goes on and its buffers stay busy until it is done. Imported
 * buffers are copied run by run (no flag needed). From 4 MiB on the copy is striped over every
 * H2T engine (one part each, all at once; a failed part fails the call). Errors: ENOENT,
 * ERANGE, EINVAL (size 0), ETIMEDOUT, EIO (engine error, or a reset dropped this copy), EINTR
 * (SIGKILL), EPERM (destination imported without IMPORT_WRITE).
 */
struct neuron_udma_memcpy {
	__u64 src_handle;
	__u64 src_offset;
	__u64 dst_handle;
	__u64 dst_offset;
	__u64 size;
	__u32 timeout_ms;		/* 0: 10 s per submission */
	__u32 reserved;
};

/*
 * Fences (ABI 3). A queue numbers its fences from 1; a QUEUE_INIT of a queue id the file
 * released before goes on after the released instance's numbers (a fence number never names
 * two instances: a fence of a released instance is ECANCELED). Fence N is done when every copy
 * submitted to the queue before it is done (the engine processes a queue in order), and failed
 * when an engine error or a queue reset dropped it before its marker arrived (the copies before
 * it may not all have run). A fence is a value: COPY_SUBMIT returns it at once, FENCE_STATUS
 * reads its state without blocking, FENCE_WAIT blocks for it; poll()/epoll, an eventfd per
 * queue (QUEUE_EVENTFD) and io_uring (NEURON_UDMA_URING_COPY) report completions as events. The
 * driver notices completions for pollers and listeners with a completion engine that runs only
 * while somebody polls or listens: it sleeps until half a queue's measured time to its next
 * completion, then looks without sleeping for 100 us and every 20 us after that; a blocked
 * COPY_WAIT or FENCE_WAIT polls its own fence (a short spin, then sleeps of 10 us doubling to
 * 1 ms).
 */
#define NEURON_UDMA_FENCE_PENDING 0	/* in flight */
#define NEURON_UDMA_FENCE_DONE 1	/* every copy before it completed */
#define NEURON_UDMA_FENCE_FAILED 2	/* dropped: @error says why */
/*
 * Older than what the queue remembers of its failures (its last 32 resets): it may have failed.
 * Only after more than 32 resets of the queue.
 */
#define NEURON_UDMA_FENCE_EXPIRED 3

/*
 * NEURON_UDMA_COPY_SUBMIT (ABI 3): ring the doorbells for everything prepared and append a
 * completion marker pair, with one doorbell, without waiting; @fence is the new fence. With
 * nothing prepared or started since the newest fence, nothing is written and @fence is that
 * fence (0 when the queue has none: nothing to wait for).
 * Errors: ENOENT (queue not this file's), ENOSPC (no room for the marker pair: wait for an
 * earlier fence first), EBUSY (max_queue_fences fences in flight on the queue).
 */
struct neuron_udma_copy_submit {
	__u32 engine;
	__u32 queue;
	__u32 flags;			/* 0 */
	__u32 reserved;
	__u64 fence;			/* out */
};

/*
 * NEURON_UDMA_FENCE_STATUS (ABI 3): the state of @fence, without blocking (the completed fences
 * are retired first). @error is the reason of a FAILED fence: EIO (an engine error), ETIMEDOUT
 * (the queue made no progress for 10 s and was reset). Errors: ENOENT (queue not this file's),
 * EINVAL (@fence 0, or newer than the newest fence of the queue), ECANCELED (a fence of a queue
 * instance the file released: older than the current instance's first fence).
 */
struct neuron_udma_fence_status {
	__u32 engine;
	__u32 queue;
	__u64 fence;			/* in */
	__u32 state;			/* out: NEURON_UDMA_FENCE_* */
	__s32 error;			/* out: FAILED: a positive errno */
	__u64 completed;		/* out: the newest fence of the queue known done */
	__u64 submitted;		/* out: the newest fence of the queue */
};

/*
 * NEURON_UDMA_FENCE_WAIT (ABI 3): wait up to @timeout_ms (0: 10 s; at least 10 ms) until @fence
 * is done. Errors: ENOENT, EINVAL (as FENCE_STATUS), EIO (the fence failed: FENCE_STATUS says
 * why), ESTALE (the fence expired), ETIMEDOUT (not done in time: the copies go on; the queue is
 * reset only when it made no progress for 10 s), EINTR (a signal whose handler ran; one that
 * runs no handler restarts the call), ECANCELED (a fence of a released instance, or the queue
 * was released while the wait went on).
 */
struct neuron_udma_fence_wait {
	__u32 engine;
	__u32 queue;
	__u64 fence;
	__u32 timeout_ms;
	__u32 reserved;
};

/* Event kinds (struct neuron_udma_queue_event.flags). */
#define NEURON_UDMA_EVENT_COMPLETED (1U << 0)	/* fences completed: @completed the newest */
#define NEURON_UDMA_EVENT_FAILED (1U << 1)	/* a fence failed: @failed the newest, @error */

/* What happened on one queue since the file's previous QUEUE_EVENTS. */
struct neuron_udma_queue_event {
	__u32 engine;
	__u32 queue;
	__u32 flags;			/* NEURON_UDMA_EVENT_* */
	__s32 error;			/* FAILED: a positive errno (as FENCE_STATUS) */
	__u64 completed;		/* the newest fence of the queue known done */
	__u64 failed;			/* the newest fence of the queue that failed (0: none) */
};

/*
 * NEURON_UDMA_QUEUE_EVENTS (ABI 3): the queues of this file with completions or failures not
 * reported yet, up to @max records into the array at @events (@count of them); reporting them
 * clears what poll() shows. poll() on the device file: EPOLLIN | EPOLLRDNORM while a queue of
 * the file has completed fences not reported yet, EPOLLPRI | EPOLLERR while one has a failure
 * not reported yet (an engine error or a reset dropped a fence).
 */
struct neuron_udma_events {
	__u64 events;			/* user pointer to @max x struct neuron_udma_queue_event */
	__u32 max;			/* in */
	__u32 count;			/* out */
};

/*
 * NEURON_UDMA_QUEUE_EVENTFD (ABI 3): signal eventfd @fd once per fence of the queue that
 * completes or fails (the count it adds is the number of such fences); @fd -1 unregisters.
 * A queue has at most one: registering replaces the previous one. Released with the queue, the
 * file, or at unbind. Errors: ENOENT (queue not this file's), EBADF/EINVAL (@fd is not an
 * eventfd).
 */
struct neuron_udma_eventfd {
	__u32 engine;
	__u32 queue;
	__s32 fd;
	__u32 reserved;
};

/*
 * io_uring (ABI 3): IORING_OP_URING_CMD on the device file with cmd_op NEURON_UDMA_URING_COPY and
 * this struct in the SQE's command area: prepares @count copies (struct neuron_udma_copy at
 * @copies, as COPY_PREPARE), submits them with a fence (as COPY_SUBMIT), and completes when the
 * fence is done. CQE res: 0, or -errno: the errors of COPY_PREPARE and COPY_SUBMIT (nothing
 * prepared then); EBADF (the file is not open for writing); ENOTTY (another cmd_op); EIO (the
 * fence failed); ESTALE (the fence is older than the failures the queue remembers: it may have
 * failed); ECANCELED (the queue instance ended first, by QUEUE_RELEASE, a release and re-init of
 * the id, or unbind, whatever the ring type); ENOMEM after the fence was submitted (the copies
 * still run). SQEs are not ordered against each other (link them, IOSQE_IO_LINK, for order); the
 * copies array must stay valid until the CQE. Rings set up with IORING_SETUP_IOPOLL reap by
 * polling the marker.
 *
 * Registered buffers (INFO features NEURON_UDMA_FEATURE_URING_FIXED): with IORING_URING_CMD_FIXED
 * in the SQE's uring_cmd_flags, the SQE's buf_index names a buffer registered with the ring
 * (io_uring_register_buffers) and its addr a user address inside it, where a range starts (the
 * SQE's len is reserved: 0). The copies may then name that range as the handle
 * NEURON_UDMA_FIXED_BUFFER, at offsets from addr, as source or destination; the range ends at
 * the furthest byte they name. The copy's host side is then the registered pages
 * themselves, as zero-copy as a MEM_IMPORT'ed buffer and with its rules (physically contiguous
 * runs, NEURON_UDMA_COPY_SPLIT). The driver holds the range's pages, maps them for the device
 * and charges them to RLIMIT_MEMLOCK (as MEM_IMPORT) from the issue until the engine is done
 * with the copies, however the command ends: unregistering the buffer, unmapping its memory or
 * closing the ring meanwhile is safe.
 * Further CQE errors: EINVAL (len set, or no copy names NEURON_UDMA_FIXED_BUFFER), EFAULT
 * (buf_index not registered, or the range not inside that buffer), ENOMEM (RLIMIT_MEMLOCK),
 * EOPNOTSUPP (the pages are not reachable by the device without bounce buffers, or a buffer a
 * kernel driver registered is not page-contiguous), EXDEV (a copy across runs without
 * NEURON_UDMA_COPY_SPLIT). Without IORING_URING_CMD_FIXED, NEURON_UDMA_FIXED_BUFFER is an
 * unknown handle (ENOENT), as it is in every other call.
 */
struct neuron_udma_uring_copy {
	__u16 engine;
	__u16 queue;
	__u32 count;
	__u64 copies;			/* user pointer to count x struct neuron_udma_copy */
};

/* The handle of the registered buffer range of a NEURON_UDMA_URING_COPY (never a buffer's). */
#define NEURON_UDMA_FIXED_BUFFER	0xffffffffffffffffULL

/*
 * NEURON_UDMA_MEMSET (ABI 3): fill @size bytes at @offset of a buffer of this file (host, device,
 * or imported with IMPORT_WRITE) with the byte @value (bits 7:0; the rest must be 0) through the
 * engine, on the driver's shared queue as MEMCPY (same timeout, SIGKILL and busy rules).
 * Errors: ENOENT, ERANGE, EINVAL (size 0, @value > 255), EPERM, ETIMEDOUT, EIO, EINTR.
 */
struct neuron_udma_memset {
	__u64 handle;
	__u64 offset;
	__u64 size;
	__u32 value;			/* 0..255 */
	__u32 timeout_ms;		/* 0: 10 s per submission */
};

/*
 * NEURON_UDMA_DMABUF_EXPORT (ABI 3): a dma-buf of the device buffer @handle of this file, for
 * other devices' drivers to DMA from and to (they get the bus addresses of that range of device
 * memory). The buffer cannot be freed while exported (MEM_FREE: EBUSY until every fd of the
 * dma-buf is closed); at unbind every importer's mapping is revoked. @flags: O_CLOEXEC.
 * Errors: ENOENT, EINVAL (not a device buffer, other flags), EMFILE, EOPNOTSUPP (no PCI
 * peer-to-peer DMA in the kernel).
 */
struct neuron_udma_dmabuf_export {
	__u64 handle;			/* in */
	__u32 flags;			/* in: O_CLOEXEC or 0 */
	__s32 fd;			/* out: the dma-buf */
	__u64 reserved;
};

/*
 * NEURON_UDMA_DMABUF_IMPORT (ABI 3): a buffer of this file backed by the dma-buf @fd of any
 * exporter (mapped for this device), usable as copy source, and as destination with
 * NEURON_UDMA_IMPORT_WRITE, like MEM_IMPORT's buffers; @segments as there. Freed with MEM_FREE
 * or close once no descriptor can reach it. A copy naming it after the exporter revoked the
 * dma-buf fails with ENXIO. Errors: EBADF (not a dma-buf), EINVAL, ENOMEM, EOPNOTSUPP (the
 * exporter's memory is not reachable by this device), EMFILE, EACCES (IMPORT_WRITE of a dma-buf
 * not open for writing).
 */
struct neuron_udma_dmabuf_import {
	__s32 fd;			/* in */
	__u32 flags;			/* in: NEURON_UDMA_IMPORT_WRITE */
	__u64 handle;			/* out */
	__u64 size;			/* out: bytes */
	__u32 segments;			/* out */
	__u32 reserved;
};

#define NEURON_UDMA_INFO		_IOR(NEURON_UDMA_IOC_MAGIC, 0x00, struct neuron_udma_info)
#define NEURON_UDMA_MEM_ALLOC		_IOWR(NEURON_UDMA_IOC_MAGIC, 0x01, struct neuron_udma_mem_alloc)
#define NEURON_UDMA_MEM_FREE		_IOW(NEURON_UDMA_IOC_MAGIC, 0x02, struct neuron_udma_mem_free)
#define NEURON_UDMA_QUEUE_INIT		_IOW(NEURON_UDMA_IOC_MAGIC, 0x03, struct neuron_udma_queue_init)
#define NEURON_UDMA_QUEUE_RELEASE	_IOW(NEURON_UDMA_IOC_MAGIC, 0x04, struct neuron_udma_queue_id)
#define NEURON_UDMA_COPY_PREPARE_ONE	_IOW(NEURON_UDMA_IOC_MAGIC, 0x05, struct neuron_udma_copy_prepare_one)
#define NEURON_UDMA_COPY_PREPARE	_IOW(NEURON_UDMA_IOC_MAGIC, 0x06, struct neuron_udma_copy_prepare)
#define NEURON_UDMA_COPY_START		_IOW(NEURON_UDMA_IOC_MAGIC, 0x07, struct neuron_udma_copy_start)
#define NEURON_UDMA_COPY_WAIT		_IOWR(NEURON_UDMA_IOC_MAGIC, 0x08, struct neuron_udma_copy_wait)
#define NEURON_UDMA_QUEUE_STATE		_IOWR(NEURON_UDMA_IOC_MAGIC, 0x09, struct neuron_udma_queue_state)
#define NEURON_UDMA_MEMCPY		_IOW(NEURON_UDMA_IOC_MAGIC, 0x0A, struct neuron_udma_memcpy)
#define NEURON_UDMA_MEM_IMPORT		_IOWR(NEURON_UDMA_IOC_MAGIC, 0x0B, struct neuron_udma_mem_import)
#define NEURON_UDMA_COPY_SUBMIT		_IOWR(NEURON_UDMA_IOC_MAGIC, 0x0C, struct neuron_udma_copy_submit)
#define NEURON_UDMA_FENCE_STATUS	_IOWR(NEURON_UDMA_IOC_MAGIC, 0x0D, struct neuron_udma_fence_status)
#define NEURON_UDMA_FENCE_WAIT		_IOW(NEURON_UDMA_IOC_MAGIC, 0x0E, struct neuron_udma_fence_wait)
#define NEURON_UDMA_QUEUE_EVENTS	_IOWR(NEURON_UDMA_IOC_MAGIC, 0x0F, struct neuron_udma_events)
#define NEURON_UDMA_QUEUE_EVENTFD	_IOW(NEURON_UDMA_IOC_MAGIC, 0x10, struct neuron_udma_eventfd)
#define NEURON_UDMA_MEMSET		_IOW(NEURON_UDMA_IOC_MAGIC, 0x11, struct neuron_udma_memset)
#define NEURON_UDMA_DMABUF_EXPORT	_IOWR(NEURON_UDMA_IOC_MAGIC, 0x12, struct neuron_udma_dmabuf_export)
#define NEURON_UDMA_DMABUF_IMPORT	_IOWR(NEURON_UDMA_IOC_MAGIC, 0x13, struct neuron_udma_dmabuf_import)

/* io_uring command (struct io_uring_cmd.cmd_op) of IORING_OP_URING_CMD. */
#define NEURON_UDMA_URING_COPY		_IOW(NEURON_UDMA_IOC_MAGIC, 0x20, struct neuron_udma_uring_copy)

#endif /* _UAPI_LINUX_NEURON_UDMA_H */
