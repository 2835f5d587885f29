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
struct dma_buf;
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
struct neuron_udma_export_hold;	/* rust/dmabuf.rs: ExportHold (a KBox), owned by an export */

/* C objects, opaque to Rust. */
struct neuron_udma_pin;		/* pinned user pages and their scatter-gather table */
struct neuron_udma_dma;		/* a dma_device with its channels */
struct neuron_udma_usage;	/* the sysfs group of a device's usage counters */
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

/* ---- implemented in rust/shim.c, called from Rust ---- */

/* No vm_operations_struct in Rust. */
int neuron_udma_mmap_buffer(struct vm_area_struct *vma, const struct neuron_udma_buffer *buf,
			    u64 size, bool wc);
/* No vmf_insert_pfn() in Rust. */
vm_fault_t neuron_udma_insert_page(struct vm_fault *vmf, void *cpu_addr);
vm_fault_t neuron_udma_insert_pfn(struct vm_fault *vmf, u64 pfn);
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
unsigned int neuron_udma_max_buffers(void);
/* No pin_user_pages() in Rust; its SGTable maps only pages it allocated itself. */
struct neuron_udma_pin *neuron_udma_pin_user(u64 addr, u64 size, bool write);
int neuron_udma_pin_map(struct neuron_udma_pin *pin, struct device *dev);
struct sg_table *neuron_udma_pin_sgt(struct neuron_udma_pin *pin);
void neuron_udma_pin_release(struct neuron_udma_pin *pin);
/* No sysfs attributes in Rust: read-only u64 counters of a device, in a named group. */
#define NEURON_UDMA_USAGE_NR 7
struct neuron_udma_usage *neuron_udma_usage_add(struct device *dev, const u64 *const *vals);
void neuron_udma_usage_remove(struct neuron_udma_usage *usage);
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
void neuron_udma_uring_pdu_set(struct io_uring_cmd *cmd, u32 engine, u32 queue, u64 instance,
			       u64 fence);
void neuron_udma_uring_pdu_get(struct io_uring_cmd *cmd, u32 *engine, u32 *queue, u64 *instance,
			       u64 *fence);
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
/* No dma-buf abstraction in Rust: the exporter of device memory (its dma_buf_ops). */
struct neuron_udma_export *neuron_udma_dmabuf_export(struct device *dev, u64 offset, u64 size,
						     struct neuron_udma_export_hold *hold);
void neuron_udma_dmabuf_put(struct neuron_udma_export *exp);
int neuron_udma_fd_reserve(u32 flags);
void neuron_udma_fd_unreserve(int fd);
void neuron_udma_dmabuf_install(struct neuron_udma_export *exp, int fd);
void neuron_udma_dmabuf_revoke(struct neuron_udma_export *exp);
void neuron_udma_dmabuf_revoke_all(struct device *dev);
/* ... and the importer (a dynamic, pinned attachment with invalidate_mappings). */
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

/* rust/dmabuf.rs: an export's dma-buf was released (its last reference is gone). */
void neuron_udma_dmabuf_released(struct neuron_udma_export_hold *hold);
/*
 * rust/dmabuf.rs: the exporter revoked the import of @buf (called under the dma-buf's
 * reservation lock): no new copy may name it; true while a descriptor or copy may still reach
 * it (neuron_udma_import_drain() then waits, from a work item, and unmaps).
 */
bool neuron_udma_import_revoke(const struct neuron_udma_buffer *buf);
void neuron_udma_import_drain(const struct neuron_udma_buffer *buf);

/* rust/dmaengine.rs: the dma_device operations of one channel. */
int neuron_udma_dma_alloc_chan(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_free_chan(const struct neuron_udma_dma_chan *chan);
struct neuron_udma_dma_desc *neuron_udma_dma_prep(const struct neuron_udma_dma_chan *chan,
						  struct dma_async_tx_descriptor *txd, u64 dst,
						  u64 src, u64 len);
struct neuron_udma_dma_desc *neuron_udma_dma_prep_memset(const struct neuron_udma_dma_chan *chan,
							 struct dma_async_tx_descriptor *txd,
							 u64 dst, u8 value, u64 len);
dma_cookie_t neuron_udma_dma_submit(const struct neuron_udma_dma_chan *chan,
				    struct neuron_udma_dma_desc *desc);
void neuron_udma_dma_issue(const struct neuron_udma_dma_chan *chan);
bool neuron_udma_dma_failed(const struct neuron_udma_dma_chan *chan, dma_cookie_t cookie);
u32 neuron_udma_dma_residue(const struct neuron_udma_dma_chan *chan, dma_cookie_t cookie);
void neuron_udma_dma_terminate(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_sync(const struct neuron_udma_dma_chan *chan);
void neuron_udma_dma_put_chan(const struct neuron_udma_dma_chan *chan);

#endif /* NEURON_UDMA_SHIM_H */
