/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The interface between neuron_udma's Rust code and rust/shim.c: the kernel facilities Linux 7.3
 * has no Rust abstraction for. Every function here is declared with the same types in the
 * extern block of rust/shim.rs (tests/test_layout.py checks that the two lists agree), and each
 * says which abstraction is missing.
 */
#ifndef NEURON_UDMA_SHIM_H
#define NEURON_UDMA_SHIM_H

#include <linux/types.h>
#include <linux/mm_types.h>
#include <linux/poll.h>
#include <linux/dmaengine.h>

struct device;
struct file;
struct sg_table;
struct user_struct;
struct vm_area_struct;
struct vm_fault;
struct work_struct;
struct eventfd_ctx;
struct io_comp_batch;
struct io_uring_cmd;
struct poll_table_struct;

/* Rust objects, opaque to C (pointers of the Rust types). */
struct neuron_udma_file;	/* rust/file.rs: OpenFile (the file's private data) */
struct neuron_udma_buffer;	/* rust/buffer.rs: Buffer, one counted (Arc) reference */
struct neuron_udma_dma_chan;	/* rust/dmaengine.rs: DmaChan, one counted (Arc) reference */
struct neuron_udma_dma_desc;	/* rust/dmaengine.rs: Desc (a KBox) */

/* C objects, opaque to Rust. */
struct neuron_udma_pin;		/* pinned user pages and their scatter-gather table */
struct neuron_udma_dma;		/* a dma_device with its channels */

/* ---- implemented in rust/shim.c, called from Rust ---- */

/* No vm_operations_struct in Rust. */
int neuron_udma_mmap_buffer(struct vm_area_struct *vma, const struct neuron_udma_buffer *buf,
			    u64 size);
/* No vmf_insert_pfn() in Rust. */
vm_fault_t neuron_udma_insert_page(struct vm_fault *vmf, void *cpu_addr);
/* No unmap_mapping_range() in Rust. */
void neuron_udma_zap(struct file *file, u64 offset, u64 len);
/* No locked-memory (user_struct::locked_vm) accounting in Rust. */
int neuron_udma_charge(unsigned long pages, struct user_struct **userp);
void neuron_udma_uncharge(struct user_struct *user, unsigned long pages);
/* No fatal_signal_pending() in Rust. */
bool neuron_udma_fatal_signal_pending(void);
/* Rust module parameters never appear in sysfs in 7.3 (module! registers them with perm 0). */
unsigned int neuron_udma_dma_channels(void);
/* As above; this one is writable: "bar4" or "engine". */
bool neuron_udma_device_rings_by_engine(void);
/* No pin_user_pages() in Rust; its SGTable maps only pages it allocated itself. */
struct neuron_udma_pin *neuron_udma_pin_user(u64 addr, u64 size, bool write);
int neuron_udma_pin_map(struct neuron_udma_pin *pin, struct device *dev);
struct sg_table *neuron_udma_pin_sgt(struct neuron_udma_pin *pin);
void neuron_udma_pin_release(struct neuron_udma_pin *pin);
/* No dma_set_seg_boundary() in Rust. */
void neuron_udma_dma_no_seg_boundary(struct device *dev);
/* No flush_work() in Rust. */
void neuron_udma_flush_work(struct work_struct *work);
/* No eventfd in Rust. */
struct eventfd_ctx *neuron_udma_eventfd_get(int fd);
void neuron_udma_eventfd_signal(struct eventfd_ctx *ctx);
void neuron_udma_eventfd_put(struct eventfd_ctx *ctx);
/*
 * No io_uring command abstraction in Rust (and 7.3's MiscDevice has no uring_cmd or poll):
 * the file operations' uring_cmd trampolines, and the completion of a queued command.
 */
int neuron_udma_uring_cmd(struct io_uring_cmd *cmd, unsigned int issue_flags);
int neuron_udma_uring_cmd_iopoll(struct io_uring_cmd *cmd, struct io_comp_batch *iob,
				 unsigned int poll_flags);
void neuron_udma_uring_cmd_complete(struct io_uring_cmd *cmd, int res);
void neuron_udma_uring_cmd_done(struct io_uring_cmd *cmd, int res);
void neuron_udma_uring_pdu_set(struct io_uring_cmd *cmd, u32 engine, u32 queue, u64 fence);
void neuron_udma_uring_pdu_get(struct io_uring_cmd *cmd, u32 *engine, u32 *queue, u64 *fence);
/* 7.3's MiscDevice has no poll: the file operation's trampoline (into rust/file.rs). */
__poll_t neuron_udma_poll(struct file *file, struct poll_table_struct *wait);
/* No dmaengine provider abstraction in Rust: the dma_device, its channels, the cookies. */
struct neuron_udma_dma *neuron_udma_dma_register(struct device *dev,
						 struct neuron_udma_dma_chan *const *chans,
						 unsigned int nr);
void neuron_udma_dma_unregister(struct neuron_udma_dma *dma);
void neuron_udma_dma_free_released(void);
dma_cookie_t neuron_udma_txd_assign_cookie(struct dma_async_tx_descriptor *txd);
void neuron_udma_txd_cookie_complete(struct dma_async_tx_descriptor *txd);
void neuron_udma_txd_callback(struct dma_async_tx_descriptor *txd, u32 result, u32 residue);
bool neuron_udma_txd_acked(struct dma_async_tx_descriptor *txd);
void neuron_udma_txd_free(struct dma_async_tx_descriptor *txd);

/* ---- implemented in Rust, called from rust/shim.c ---- */

/*
 * rust/file.rs: an io_uring NEURON_UDMA_URING_COPY of @file: @engine/@queue/@count/@copies from
 * the SQE; returns -EIOCBQUEUED once queued (the command then completes through
 * neuron_udma_uring_cmd_complete()), or a negative errno (the command completes with it at once).
 * @iopoll: the ring reaps by polling (the command is completed by neuron_udma_uring_poll()).
 * @writable: the file is open for writing (a read-only file may not start DMA: EBADF).
 */
int neuron_udma_uring_submit(const struct neuron_udma_file *file, struct io_uring_cmd *cmd,
			     u32 engine, u32 queue, u32 count, u64 copies, bool iopoll,
			     bool writable);
/* rust/file.rs: 1 if the IOPOLL command @cmd of @file completed now, else 0. */
int neuron_udma_uring_poll(const struct neuron_udma_file *file, struct io_uring_cmd *cmd);
/* rust/file.rs: the events poll() reports for @file (EPOLLIN, EPOLLPRI, EPOLLERR bits). */
__poll_t neuron_udma_file_poll(const struct neuron_udma_file *file, struct file *raw,
			       struct poll_table_struct *wait);

/* rust/buffer.rs: the buffer behind a mapping, counted per VMA. */
void neuron_udma_vma_get(const struct neuron_udma_buffer *buf);
void neuron_udma_vma_put(const struct neuron_udma_buffer *buf);
u32 neuron_udma_vma_fault(const struct neuron_udma_buffer *buf, u64 pgoff, struct vm_fault *vmf);

/* rust/dmaengine.rs: the dma_device operations of one channel. */
int neuron_udma_dma_alloc_chan(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_free_chan(const struct neuron_udma_dma_chan *chan);
struct neuron_udma_dma_desc *neuron_udma_dma_prep(const struct neuron_udma_dma_chan *chan,
						  struct dma_async_tx_descriptor *txd, u64 dst,
						  u64 src, u64 len);
dma_cookie_t neuron_udma_dma_submit(const struct neuron_udma_dma_chan *chan,
				    struct neuron_udma_dma_desc *desc);
void neuron_udma_dma_issue(const struct neuron_udma_dma_chan *chan);
bool neuron_udma_dma_failed(const struct neuron_udma_dma_chan *chan, dma_cookie_t cookie);
u32 neuron_udma_dma_residue(const struct neuron_udma_dma_chan *chan, dma_cookie_t cookie);
void neuron_udma_dma_terminate(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_sync(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_put_chan(const struct neuron_udma_dma_chan *chan);

#endif /* NEURON_UDMA_SHIM_H */
