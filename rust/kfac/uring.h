/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The file operations of the device node that Linux 7.3's MiscDevice lacks (uring_cmd,
 * uring_cmd_iopoll, poll), and the io_uring command API (no Rust abstraction in 7.3): a
 * command's private bytes and its completion. Implemented in rust/kfac/uring.c; bindgen generates
 * the Rust declarations (Kbuild), wrapped by rust/kfac/uring.rs.
 */
#ifndef NEURON_UDMA_KFAC_URING_H
#define NEURON_UDMA_KFAC_URING_H

#include <linux/types.h>

struct file;
struct io_comp_batch;
struct io_uring_cmd;
struct page;
struct poll_table_struct;

/*
 * A NEURON_UDMA_URING_COPY being issued: the SQE's fields (read once: the SQE is user-shared
 * memory) and how io_uring issues it.
 */
struct neuron_udma_uring_issue {
	u32 engine;
	u32 queue;
	u32 count;
	/* The SQE's len, with @fixed: reserved (must be 0). */
	u32 fixed_len;
	u64 copies;
	/* The SQE's addr, with @fixed: the start of the registered buffer range. */
	u64 fixed_addr;
	/* The io_uring issue flags (IO_URING_F_*), for io_uring_cmd_import_fixed(). */
	u32 issue_flags;
	/* IORING_URING_CMD_FIXED: the copies may name the SQE's registered buffer range. */
	bool fixed;
	/* The ring reaps by polling (the command is completed by neuron_udma_uring_poll()). */
	bool iopoll;
	/* A non-blocking issue: -EAGAIN, with nothing prepared, where the call would sleep. */
	bool nonblock;
	/* The file is open for writing (a read-only file may not start DMA: EBADF). */
	bool writable;
};

/* rust/file.rs: OpenFile (the file's private data); opaque to C. */
struct neuron_udma_file;

/* ---- implemented in rust/kfac/uring.c, called from Rust ---- */

/* The file operations (rust/node.rs puts them in the node's file_operations). */
int neuron_udma_uring_cmd(struct io_uring_cmd *cmd, unsigned int issue_flags);
int neuron_udma_uring_cmd_iopoll(struct io_uring_cmd *cmd, struct io_comp_batch *iob,
				 unsigned int poll_flags);
__poll_t neuron_udma_poll(struct file *file, struct poll_table_struct *wait);
/* The completion of a queued command, and what it keeps in its private bytes. */
void neuron_udma_uring_cmd_complete(struct io_uring_cmd *cmd, int res);
void neuron_udma_uring_cmd_done(struct io_uring_cmd *cmd, int res);
void neuron_udma_uring_pdu_set(struct io_uring_cmd *cmd, u32 engine, u32 queue, u64 instance,
			       u64 fence);
void neuron_udma_uring_pdu_get(struct io_uring_cmd *cmd, u32 *engine, u32 *queue, u64 *instance,
			       u64 *fence);
/*
 * The pages under [@addr, @addr + @len) of the registered buffer @cmd names (its buf_index):
 * at most @max into @pages, each with a page reference of the caller's; *@offset is the range's
 * offset in the first. The number of pages, or -EFAULT (no such buffer, the range not inside
 * it, or not in direction @write), -EOPNOTSUPP (the buffer is not page-contiguous), or another
 * error of io_uring_cmd_import_fixed() or iov_iter_extract_pages() (-ENOMEM).
 */
int neuron_udma_uring_fixed_pages(struct io_uring_cmd *cmd, u64 addr, u32 len, bool write,
				  unsigned int issue_flags, struct page **pages, u32 max,
				  u32 *offset);

/*
 * ---- implemented in Rust, called from rust/kfac/uring.c ----
 * Not given to bindgen (__BINDGEN__): their Rust definitions are their declarations.
 */
#ifndef __BINDGEN__
/*
 * rust/file/uring.rs: the io_uring NEURON_UDMA_URING_COPY @cmd of @file, as @issue says; returns
 * -EIOCBQUEUED once queued (the command then completes through neuron_udma_uring_cmd_complete()),
 * or the result the command completes with at once: 0 or a negative errno (its fence settled
 * before the issue returned, or the issue failed).
 */
int neuron_udma_uring_submit(const struct neuron_udma_file *file, struct io_uring_cmd *cmd,
			     const struct neuron_udma_uring_issue *issue);
/* rust/file.rs: 1 if the IOPOLL command @cmd of @file completed now, else 0. */
int neuron_udma_uring_poll(const struct neuron_udma_file *file, struct io_uring_cmd *cmd);
/* rust/file.rs: the events poll() reports for @file (EPOLLIN, EPOLLPRI, EPOLLERR bits). */
__poll_t neuron_udma_file_poll(const struct neuron_udma_file *file, struct file *raw,
			       struct poll_table_struct *wait);
#endif

#endif /* NEURON_UDMA_KFAC_URING_H */
