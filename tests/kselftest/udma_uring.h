/* SPDX-License-Identifier: GPL-2.0 */
/*
 * io_uring helpers of the kselftests (liburing): one NEURON_UDMA_URING_COPY SQE, its submission,
 * and the next CQE with a deadline. Link with -luring.
 */
#ifndef UDMA_URING_H
#define UDMA_URING_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <liburing.h>
#include <linux/neuron_udma.h>

_Static_assert(sizeof(struct neuron_udma_uring_copy) == 16,
	       "the command must fit the 16 bytes of a normal SQE's command area");

/* CLOCK_MONOTONIC in milliseconds (the CQE deadlines). */
static inline double uring_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/*
 * Queues one NEURON_UDMA_URING_COPY (or @cmd_op) SQE on @ring for file @fd: @count copies at
 * @copies (which must stay valid until its CQE: the driver may read them from io_uring's worker
 * after the submission returned). The SQE, or NULL when the SQ is full.
 */
static inline struct io_uring_sqe *sqe_copy_get(struct io_uring *ring, int fd, __u32 cmd_op,
						__u32 eng, __u32 q,
						const struct neuron_udma_copy *copies,
						__u32 count, __u64 data)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct neuron_udma_uring_copy uc = {
		.engine = (__u16)eng,
		.queue = (__u16)q,
		.count = count,
		.copies = (uintptr_t)copies,
	};

	if (!sqe)
		return NULL;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = fd;
	sqe->cmd_op = cmd_op;
	memcpy((char *)sqe + offsetof(struct io_uring_sqe, addr3), &uc, sizeof(uc));
	sqe->user_data = data;
	return sqe;
}

/* sqe_copy_get(): 0, or -EBUSY when the SQ is full. */
static inline int sqe_copy(struct io_uring *ring, int fd, __u32 cmd_op, __u32 eng, __u32 q,
		    const struct neuron_udma_copy *copies, __u32 count, __u64 data)
{
	return sqe_copy_get(ring, fd, cmd_op, eng, q, copies, count, data) ? 0 : -EBUSY;
}

/* One SQE, submitted. 0 or -errno. */
static inline int submit_copy(struct io_uring *ring, int fd, __u32 cmd_op, __u32 eng, __u32 q,
		       const struct neuron_udma_copy *copies, __u32 count, __u64 data)
{
	int ret = sqe_copy(ring, fd, cmd_op, eng, q, copies, count, data);

	if (ret)
		return ret;
	ret = io_uring_submit(ring);
	return ret == 1 ? 0 : ret < 0 ? ret : -EIO;
}

struct cqe_out {
	__u64 data;
	int res;
};

/*
 * The next CQE of @ring within @ms (an IOPOLL ring is polled: one pass per io_uring_enter with
 * GETEVENTS and no minimum). 0 and its user_data/res, or -ETIME.
 */
static inline int cqe_next(struct io_uring *ring, bool iopoll, unsigned int ms, struct cqe_out *out)
{
	struct io_uring_cqe *cqe = NULL;
	double t0 = uring_now_ms();
	int ret;

	for (;;) {
		double left;

		if (!io_uring_peek_cqe(ring, &cqe) && cqe)
			break;
		left = ms - (uring_now_ms() - t0);
		if (left <= 0)
			return -ETIME;
		if (iopoll) {
			io_uring_get_events(ring);
			if (!io_uring_peek_cqe(ring, &cqe) && cqe)
				break;
			usleep(500);
		} else {
			struct __kernel_timespec ts = {
				.tv_sec = (long long)left / 1000,
				.tv_nsec = ((long long)left % 1000) * 1000000 + 1000000,
			};

			ret = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
			if (!ret && cqe)
				break;
			if (ret && ret != -ETIME && ret != -EINTR)
				return ret;
		}
	}
	out->data = cqe->user_data;
	out->res = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return 0;
}

#endif /* UDMA_URING_H */
