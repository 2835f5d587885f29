// SPDX-License-Identifier: GPL-2.0
/*
 * The io_uring command and poll file operations of the device node, and the io_uring command
 * API (rust/kfac/uring.h): the trampolines into rust/file.rs, a command's private bytes and its
 * completion from task work.
 */
#include <linux/fs.h>
#include <linux/io_uring/cmd.h>
#include <linux/mm.h>
#include <linux/uio.h>
#include <linux/poll.h>

#include "uring.h"
#include "../../include/uapi/linux/neuron_udma.h"

/*
 * 7.3's MiscDevice has no poll (rust/node.rs adds this to its file operations): the file's
 * private data is the Rust open file (rust/file.rs).
 */
__poll_t neuron_udma_poll(struct file *file, struct poll_table_struct *wait)
{
	return neuron_udma_file_poll(file->private_data, file, wait);
}

/*
 * What a queued NEURON_UDMA_URING_COPY keeps in its io_uring_cmd: its queue, the queue's
 * instance (ids are reused after a release, instances never are) and its fence.
 */
struct neuron_udma_uring_pdu {
	u32 engine;
	u32 queue;
	u64 instance;
	u64 fence;
	int res;
};

void neuron_udma_uring_pdu_set(struct io_uring_cmd *cmd, u32 engine, u32 queue, u64 instance,
			       u64 fence)
{
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	pdu->engine = engine;
	pdu->queue = queue;
	pdu->instance = instance;
	pdu->fence = fence;
}

void neuron_udma_uring_pdu_get(struct io_uring_cmd *cmd, u32 *engine, u32 *queue, u64 *instance,
			       u64 *fence)
{
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	*engine = pdu->engine;
	*queue = pdu->queue;
	*instance = pdu->instance;
	*fence = pdu->fence;
}

/*
 * No io_uring command abstraction in Rust: the uring_cmd file operation. The command's fields
 * are read once from the SQE (user-shared memory). A non-blocking issue (IO_URING_F_NONBLOCK,
 * io_uring_enter in the submitting task) prepares the copies inline unless it would wait for the
 * queue lock or for a device-ring move: then the driver answers -EAGAIN, with nothing prepared,
 * and io_uring issues the command again from its workers, where it may wait.
 */
int neuron_udma_uring_cmd(struct io_uring_cmd *cmd, unsigned int issue_flags)
{
	const struct neuron_udma_uring_copy *c;
	struct neuron_udma_uring_issue issue = {
		.issue_flags = issue_flags,
		.fixed = cmd->flags & IORING_URING_CMD_FIXED,
		.iopoll = issue_flags & IO_URING_F_IOPOLL,
		.nonblock = issue_flags & IO_URING_F_NONBLOCK,
		.writable = cmd->file->f_mode & FMODE_WRITE,
	};

	if (cmd->cmd_op != NEURON_UDMA_URING_COPY)
		return -ENOTTY;
	c = io_uring_sqe_cmd(cmd->sqe, struct neuron_udma_uring_copy);
	issue.engine = READ_ONCE(c->engine);
	issue.queue = READ_ONCE(c->queue);
	issue.count = READ_ONCE(c->count);
	issue.copies = READ_ONCE(c->copies);
	/* io_uring leaves a command's addr and len to its driver. */
	if (issue.fixed) {
		issue.fixed_addr = READ_ONCE(cmd->sqe->addr);
		issue.fixed_len = READ_ONCE(cmd->sqe->len);
	}
	return neuron_udma_uring_submit(cmd->file->private_data, cmd, &issue);
}

/*
 * io_uring_cmd_import_fixed() gives the range as a bio_vec iterator over the registered pages,
 * which io_uring keeps pinned only while the buffer is registered or this command runs; the
 * engine may outlive both (a command cancelled with its copies still running), so each page
 * gets a reference of the driver's (dropped by neuron_udma_put_pages()).
 */
int neuron_udma_uring_fixed_pages(struct io_uring_cmd *cmd, u64 addr, u32 len, bool write,
				  unsigned int issue_flags, struct page **pages, u32 max,
				  u32 *offset)
{
	struct iov_iter iter;
	u32 done = 0, i;
	int ret;

	ret = io_uring_cmd_import_fixed(addr, len, write ? ITER_DEST : ITER_SOURCE, &iter, cmd,
					issue_flags);
	if (ret)
		return ret;
	while (iov_iter_count(&iter)) {
		struct page **p = pages + done;
		size_t off = 0;
		ssize_t got;
		u32 n;

		got = iov_iter_extract_pages(&iter, &p, iov_iter_count(&iter), max - done, 0, &off);
		if (got <= 0) {
			ret = got ? got : -EFAULT;
			goto fail;
		}
		/* One table of whole pages: only the first may start, only the last end, inside. */
		if ((done && off) || ((off + got) % PAGE_SIZE && iov_iter_count(&iter))) {
			ret = -EOPNOTSUPP;
			goto fail;
		}
		if (!done)
			*offset = off;
		n = DIV_ROUND_UP(off + got, PAGE_SIZE);
		for (i = 0; i < n; i++)
			get_page(pages[done + i]);
		done += n;
	}
	return done;
fail:
	for (i = 0; i < done; i++)
		put_page(pages[i]);
	return ret;
}

/* The uring_cmd_iopoll file operation: 1 if @cmd completed. */
int neuron_udma_uring_cmd_iopoll(struct io_uring_cmd *cmd, struct io_comp_batch *iob,
				 unsigned int poll_flags)
{
	return neuron_udma_uring_poll(cmd->file->private_data, cmd);
}

static void neuron_udma_uring_task_cb(struct io_tw_req tw_req, io_tw_token_t tw)
{
	struct io_uring_cmd *cmd = io_uring_cmd_from_tw(tw_req);
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	io_uring_cmd_done(cmd, pdu->res, IO_URING_CMD_TASK_WORK_ISSUE_FLAGS);
}

/*
 * Completes a queued (non-IOPOLL) command with @res from any context: the CQE is posted from the
 * submitter's task work.
 */
void neuron_udma_uring_cmd_complete(struct io_uring_cmd *cmd, int res)
{
	io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu)->res = res;
	io_uring_cmd_complete_in_task(cmd, neuron_udma_uring_task_cb);
}

/* Completes an IOPOLL command with @res, from its uring_cmd_iopoll. */
void neuron_udma_uring_cmd_done(struct io_uring_cmd *cmd, int res)
{
	io_uring_cmd_done(cmd, res, 0);
}
