// SPDX-License-Identifier: GPL-2.0
/*
 * io_uring copies (ABI 3, include/uapi/linux/neuron_udma.h): IORING_OP_URING_CMD with cmd_op
 * NEURON_UDMA_URING_COPY and a struct neuron_udma_uring_copy in the SQE's command area prepares
 * its copies, submits them with a fence and completes when the fence is done. A normal ring
 * copies 4 ranges in one SQE (CQE 0, the bytes there, one fence); bad SQEs complete with the
 * COPY_PREPARE error (or ENOTTY for another cmd_op) and prepare nothing; an engine error fails
 * an SQE waiting on a stalled queue (EIO); 64 SQEs in flight all complete; an IOPOLL ring reaps
 * by polling; a read-only file is EBADF; a file of another uid reaches neither the queue nor
 * the buffers of a file of uid 1001. An SQE belongs to its queue instance: on a normal and an
 * IOPOLL ring, QUEUE_RELEASE completes a waiting SQE with ECANCELED, also when the file takes
 * the same id again and copies on the new instance before the SQE is reaped (its own copy never
 * ran); closing the file leaves it to complete (res 0, its bytes there). A FENCE_WAIT is not
 * ended by the task work of its thread's ring (no EINTR without a signal handler).
 *
 * Built with liburing (LDLIBS_uring_test in the Makefile).
 * Each test fails when the driver breaks the rule it checks; after a refused SQE it checks that
 * the queue did not change and has no fence. The queues are on engine 15 (host-connected on v2
 * and v3), one queue number per test; stalls and engine errors come from the device model's
 * BAR2 window, cleared by the harness's parent after every test. A CQE is waited for with a
 * deadline, never without one.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <liburing.h>

#include "kselftest_harness.h"
#include "udma_fence.h"
#include "udma_uring.h"

#define ENG FENCE_ENG
#define BUF (256U * 1024)
#define KIB 1024U
#define BAD_HANDLE 0xdead0000beefULL
#define RING_ENTRIES 128

/* What every test starts with: a file, the model's window, two host buffers, a normal ring. */
FIXTURE(uring) {
	int fd;
	struct neuron_udma_info info;
	struct ubar2 bar2;
	struct ubuf a, b;
	unsigned char *save;	/* b's bytes as the test began */
	struct io_uring ring;
};

FIXTURE_SETUP(uring)
{
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ((__u32)NEURON_UDMA_ABI_VERSION, self->info.abi_version);
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->b));
	fill_pattern(self->a.map, BUF, 41);
	fill_pattern(self->b.map, BUF, 42);
	self->save = malloc(BUF);
	ASSERT_NE(NULL, self->save);
	memcpy(self->save, self->b.map, BUF);
	ret = io_uring_queue_init(RING_ENTRIES, &self->ring, 0);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_queue_init: %s", err_name(ret));
	}
}

/* In the harness's parent: runs also after an assertion or a timeout killed the test. */
FIXTURE_TEARDOWN_PARENT(uring)
{
	model_clear();
}

/*
 * One SQE with 4 copies on a normal ring: CQE res 0 with its user_data, the 4 ranges copied
 * and nothing else written, one fence (COPY_SUBMIT then has nothing new: fence 1) covering 4
 * pairs and a marker, retired.
 */
TEST_F_TIMEOUT(uring, copy_four, 60)
{
	const __u32 q = 1;
	struct neuron_udma_copy c[4] = {
		ucopy(&self->a, 0, &self->b, 0, 4096),
		ucopy(&self->a, 8 * KIB, &self->b, 64 * KIB, 65536),
		ucopy(&self->a, 100, &self->b, 160 * KIB + 1, 5000),
		ucopy(&self->a, 200 * KIB, &self->b, 200 * KIB + 3, 777),
	};
	struct neuron_udma_queue_state st0, st;
	struct cqe_out out;
	unsigned char *want;
	__u64 f = ~0ULL;
	int i, ret;

	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 256, 256));
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st0));
	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, c, 4,
				 0x1234));
	ret = cqe_next(&self->ring, false, SOON_MS, &out);
	ASSERT_EQ(0, ret) {
		TH_LOG("no CQE within %u ms", SOON_MS);
	}
	EXPECT_EQ(0x1234ULL, out.data);
	ASSERT_EQ(0, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	want = malloc(BUF);
	ASSERT_NE(NULL, want);
	memcpy(want, self->save, BUF);
	for (i = 0; i < 4; i++)
		memcpy(want + c[i].dst_offset, self->a.map + c[i].src_offset, c[i].size);
	ASSERT_BYTES(self->b.map, want, BUF);
	free(want);
	EXPECT_FENCE(self->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_EQ(0, copy_submit(self->fd, ENG, q, &f));
	EXPECT_EQ(1ULL, f);
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st));
	EXPECT_EQ((st0.tx.sw_next + 5) % 256, st.tx.sw_next);
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);
	EXPECT_EQ(0U, st.tx.sw_pending);
	EXPECT_EQ(0U, st.resets);
}

/*
 * An uncontended URING_COPY is issued inline (IO_URING_F_NONBLOCK, from io_uring_enter in this
 * task): one SQE on a normal ring while nothing else looks at the queue, then 16 SQEs one after
 * the other on an IOPOLL ring (polled by this task, so no completion engine contends for the
 * queue); every CQE is 0, the bytes landed, and no io-wq worker of this process ever ran.
 */
TEST_F_TIMEOUT(uring, inline_issue_no_worker, 60)
{
	const __u32 q = 3, qp = 4;
	struct neuron_udma_copy c = ucopy(&self->a, 200 * KIB, &self->b, 200 * KIB, 8192);
	struct io_uring ring;
	struct cqe_out out;
	int i, ret;

	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 256, 256));
	ASSERT_EQ(0, queue_init(self->fd, ENG, qp, 256, 256));
	ASSERT_EQ(0, iou_workers());
	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 99));
	ASSERT_EQ(0, cqe_next(&self->ring, false, SOON_MS, &out));
	ASSERT_EQ(0, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	ret = io_uring_queue_init(8, &ring, IORING_SETUP_IOPOLL);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_queue_init(IOPOLL): %s", err_name(ret));
	}
	for (i = 0; i < 16; i++) {
		c = ucopy(&self->a, i * 4096, &self->b, i * 4096, 4096);
		ASSERT_EQ(0, submit_copy(&ring, self->fd, NEURON_UDMA_URING_COPY, ENG, qp, &c, 1, i));
		ASSERT_EQ(0, cqe_next(&ring, true, SOON_MS, &out));
		ASSERT_EQ(0, out.res) {
			TH_LOG("SQE %d: CQE res %d (%s)", i, out.res, err_name(out.res));
		}
	}
	EXPECT_EQ(0, iou_workers()) {
		TH_LOG("an io-wq worker ran: the SQEs were not issued inline");
	}
	ASSERT_BYTES(self->b.map, self->a.map, 16 * 4096);
	ASSERT_BYTES(self->b.map + 200 * KIB, self->a.map + 200 * KIB, 8192);
	io_uring_queue_exit(&ring);
}

#define FILL_PARAM "/sys/module/neuron_udma/parameters/device_ring_fill"

/*
 * A URING_COPY that would sleep inline goes to io-wq (-EAGAIN from the non-blocking issue, with
 * nothing prepared) and completes there: a queue whose rings are in device memory, filled by the
 * driver's H2T queue ("engine", which waits for that copy). An io-wq worker ran, the CQE is 0,
 * the bytes landed, one fence covers one pair and a marker.
 */
TEST_F_TIMEOUT(uring, sleeping_issue_goes_to_a_worker, 60)
{
	const __u32 q = 5;
	struct neuron_udma_copy c = ucopy(&self->a, 8192, &self->b, 4096, 3000);
	struct neuron_udma_queue_init qi = {
		.engine = ENG, .queue = q, .tx_descs = 64, .rx_descs = 64,
		.flags = NEURON_UDMA_QUEUE_DEVICE_RINGS,
	};
	struct cqe_out out;
	int ret;

	if (!((self->info.device_ring_engines[ENG / 64] >> (ENG % 64)) & 1))
		SKIP(return, "no device rings on engine %u", ENG);
	ASSERT_EQ(0, sysfs_write(FILL_PARAM, "engine"));
	ret = udma_ioc(self->fd, NEURON_UDMA_QUEUE_INIT, &qi);
	ASSERT_EQ(0, sysfs_write(FILL_PARAM, "bar4"));
	ASSERT_EQ(0, ret) {
		TH_LOG("QUEUE_INIT with device rings: %s", strerror(errno));
	}
	ASSERT_EQ(0, iou_workers());
	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 7));
	ret = cqe_next(&self->ring, false, SOON_MS, &out);
	ASSERT_EQ(0, ret);
	ASSERT_EQ(0, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	EXPECT_LT(0, iou_workers());
	ASSERT_BYTES(self->b.map + 4096, self->a.map + 8192, 3000);
	EXPECT_FENCE(self->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
}

/*
 * 32 SQEs of 64 bytes, one at a time, on a queue with an eventfd, on a DEFER_TASKRUN ring (whose
 * task work, through which a queued command completes, runs only when the caller waits for a
 * CQE). An SQE whose fence settled while it was issued completes then, with the issue's result:
 * its CQE is there as io_uring_enter returns, with nothing waited for, and the eventfd reads 1 at
 * once (the issue told the queue's listeners itself). The others complete later, the eventfd
 * counting them too. Every CQE is 0 and the bytes landed; at least one SQE settled at its issue
 * (the model finishes a 64-byte copy within the call).
 */
TEST_F_TIMEOUT(uring, settled_at_issue_tells_listeners, 60)
{
	const __u32 q = 10;
	struct neuron_udma_copy c;
	struct io_uring ring;
	struct cqe_out out;
	int efd, i, ret, early = 0;
	__u64 v;

	ret = io_uring_queue_init(8, &ring, IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_queue_init (DEFER_TASKRUN): %s", err_name(ret));
	}
	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 256, 256));
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_LE(0, efd);
	ASSERT_EQ(0, queue_eventfd(self->fd, ENG, q, efd));
	for (i = 0; i < 32; i++) {
		bool at_issue;

		c = ucopy(&self->a, i * 64, &self->b, i * 64, 64);
		ASSERT_EQ(0, submit_copy(&ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, i));
		at_issue = io_uring_cq_ready(&ring) > 0;
		if (at_issue) {
			early++;
			v = 0;
			EXPECT_EQ((ssize_t)sizeof(v), read(efd, &v, sizeof(v))) {
				TH_LOG("SQE %d completed at its issue, the eventfd not signalled", i);
			}
			EXPECT_EQ(1ULL, v);
		}
		ret = cqe_next(&ring, false, SOON_MS, &out);
		ASSERT_EQ(0, ret) {
			TH_LOG("SQE %d: no CQE within %u ms", i, SOON_MS);
		}
		EXPECT_EQ((__u64)i, out.data);
		ASSERT_EQ(0, out.res) {
			TH_LOG("SQE %d: CQE res %d (%s)", i, out.res, err_name(out.res));
		}
		if (!at_issue)
			EXPECT_EQ(1ULL, efd_collect(efd, 1, SOON_MS));
	}
	ASSERT_BYTES(self->b.map, self->a.map, 32 * 64);
	EXPECT_FENCE(self->fd, ENG, q, 32, NEURON_UDMA_FENCE_DONE, 0);
	TH_LOG("%d of 32 SQEs settled at their issue; the completion engine watched the queue %lld "
	       "times", early, queue_watches(ENG, q));
	EXPECT_LT(0, early);
	close(efd);
	io_uring_queue_exit(&ring);
}

struct bad_sqe {
	const char *what;
	__u32 cmd_op, q, count;
	int copies;	/* index into the copy sets below, -1: an unmapped pointer */
	int want;
};

/*
 * Bad SQEs: count 0 or above max_batch (EINVAL), an unknown handle in any entry or a queue the
 * file does not have (ENOENT), another cmd_op (ENOTTY), a range past a buffer (ERANGE), a bad
 * size, barrier, reserved field or the reserved DST_INT flag (EINVAL), an unmapped copies
 * pointer (EFAULT). Each completes with that error, and nothing was prepared: the queue is
 * unchanged, has no fence, the destination unwritten. A good SQE then works.
 */
TEST_F_TIMEOUT(uring, bad_sqes, 60)
{
	const __u32 q = 2, q_none = 3;
	struct neuron_udma_copy good = ucopy(&self->a, 0, &self->b, 0, 4096);
	struct neuron_udma_copy sets[10][2];
	const struct bad_sqe cases[] = {
		{ "count 0", NEURON_UDMA_URING_COPY, q, 0, 0, -EINVAL },
		{ "count above max_batch", NEURON_UDMA_URING_COPY, q, self->info.max_batch + 1, 0,
		  -EINVAL },
		{ "unknown source handle", NEURON_UDMA_URING_COPY, q, 2, 1, -ENOENT },
		{ "unknown destination handle", NEURON_UDMA_URING_COPY, q, 2, 2, -ENOENT },
		{ "a queue nobody took", NEURON_UDMA_URING_COPY, q_none, 1, 0, -ENOENT },
		{ "cmd_op 0x21", _IOW(NEURON_UDMA_IOC_MAGIC, 0x21, struct neuron_udma_uring_copy), q,
		  1, 0, -ENOTTY },
		{ "cmd_op COPY_PREPARE", NEURON_UDMA_COPY_PREPARE, q, 1, 0, -ENOTTY },
		{ "cmd_op 0", 0, q, 1, 0, -ENOTTY },
		{ "range past the destination", NEURON_UDMA_URING_COPY, q, 2, 3, -ERANGE },
		{ "size 0", NEURON_UDMA_URING_COPY, q, 2, 4, -EINVAL },
		{ "size 65537", NEURON_UDMA_URING_COPY, q, 2, 5, -EINVAL },
		{ "barrier 7", NEURON_UDMA_URING_COPY, q, 2, 6, -EINVAL },
		{ "reserved field", NEURON_UDMA_URING_COPY, q, 2, 7, -EINVAL },
		{ "DST_INT (reserved since ABI 3)", NEURON_UDMA_URING_COPY, q, 2, 8, -EINVAL },
		{ "unknown flag", NEURON_UDMA_URING_COPY, q, 2, 9, -EINVAL },
		{ "unmapped copies pointer", NEURON_UDMA_URING_COPY, q, 2, -1, -EFAULT },
	};
	struct neuron_udma_queue_state st0;
	struct neuron_udma_fence_status fs;
	struct cqe_out out;
	__u64 f = ~0ULL;
	size_t i;
	int ret;

	/* Each set: a good copy first, the bad one second (all or nothing). */
	for (i = 0; i < ARRAY_SIZE(sets); i++) {
		sets[i][0] = good;
		sets[i][1] = ucopy(&self->a, 8192, &self->b, 8192, 4096);
	}
	sets[1][1].src_handle = BAD_HANDLE;
	sets[2][1].dst_handle = BAD_HANDLE;
	sets[3][1].dst_offset = BUF - 100;
	sets[4][1].size = 0;
	sets[5][1].size = UDMA_MAX_COPY + 1;
	sets[6][1].barrier = 7;
	sets[7][1].reserved = 1;
	sets[8][1].flags = NEURON_UDMA_COPY_DST_INT;
	sets[9][1].flags = 1U << 7;

	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st0));
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		const struct bad_sqe *t = &cases[i];
		const struct neuron_udma_copy *c = t->copies < 0 ? (const void *)8 : sets[t->copies];

		ASSERT_EQ(0, submit_copy(&self->ring, self->fd, t->cmd_op, ENG, t->q, c, t->count, i));
		ret = cqe_next(&self->ring, false, SOON_MS, &out);
		ASSERT_EQ(0, ret) {
			TH_LOG("%s: no CQE within %u ms", t->what, SOON_MS);
		}
		EXPECT_EQ((__u64)i, out.data);
		EXPECT_EQ(t->want, out.res) {
			TH_LOG("%s: CQE res %d (%s), want %s", t->what, out.res, err_name(out.res),
			       err_name(t->want));
		}
		/* Nothing prepared, no fence. */
		ASSERT_UNCHANGED(self->fd, ENG, q, &st0);
		EXPECT_EQ(-EINVAL, fence_status(self->fd, ENG, q, 1, &fs)) {
			TH_LOG("%s: a fence was submitted", t->what);
		}
	}
	ASSERT_EQ(0, copy_submit(self->fd, ENG, q, &f));
	EXPECT_EQ(0ULL, f);
	ASSERT_UNCHANGED(self->fd, ENG, q, &st0);
	ASSERT_BYTES(self->b.map, self->save, BUF);

	/* A good SQE works on the same queue. */
	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, sets[0], 2,
				 99));
	ASSERT_EQ(0, cqe_next(&self->ring, false, SOON_MS, &out));
	EXPECT_EQ(99ULL, out.data);
	EXPECT_EQ(0, out.res);
	EXPECT_FENCE(self->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	ASSERT_BYTES(self->b.map + 8192, self->a.map + 8192, 4096);
}

/*
 * An SQE waiting on a stalled queue (no CQE while the stall lasts) whose copy then fails in
 * the engine: CQE -EIO, the fence FAILED (EIO), the destination unwritten, the queue reset
 * once; the next SQE works.
 */
TEST_F_TIMEOUT(uring, engine_error_eio, 60)
{
	const __u32 q = 4;
	struct neuron_udma_copy c = ucopy(&self->a, 0, &self->b, 0, 4096);
	struct neuron_udma_copy c2 = ucopy(&self->a, 4096, &self->b, 4096, 4096);
	struct neuron_udma_queue_state st;
	struct cqe_out out;
	int ret;

	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, bar2_add_fault(&self->bar2, FAULT_FAIL_NTH, ENG, q, 1));
	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 7));
	ret = cqe_next(&self->ring, false, 300, &out);
	EXPECT_EQ(-ETIME, ret) {
		TH_LOG("a CQE (res %d) while the queue is stalled", out.res);
	}
	ASSERT_EQ(0U, bar2_read(&self->bar2, BAR2_ERRORS));

	/* The stall ends (the fail_nth stays armed): the copy fails in the engine. */
	ASSERT_EQ(0, bar2_add_fault(&self->bar2, FAULT_STALL, ENG, q, 0));
	ret = cqe_next(&self->ring, false, SOON_MS, &out);
	ASSERT_EQ(0, ret) {
		TH_LOG("no CQE within %u ms of the engine error", SOON_MS);
	}
	EXPECT_EQ(7ULL, out.data);
	EXPECT_EQ(-EIO, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	EXPECT_EQ(ERR_INJECTED_FAIL, bar2_read(&self->bar2, BAR2_LAST_ERROR));
	EXPECT_EQ(ENG, bar2_read(&self->bar2, BAR2_LAST_ENGINE));
	EXPECT_FENCE(self->fd, ENG, q, 1, NEURON_UDMA_FENCE_FAILED, EIO);
	ASSERT_BYTES(self->b.map, self->save, BUF);
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st));
	EXPECT_EQ(1U, st.resets);

	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c2, 1, 8));
	ASSERT_EQ(0, cqe_next(&self->ring, false, SOON_MS, &out));
	EXPECT_EQ(8ULL, out.data);
	EXPECT_EQ(0, out.res);
	ASSERT_BYTES(self->b.map + 4096, self->a.map + 4096, 4096);
	ASSERT_BYTES(self->b.map, self->save, 4096);
}

/*
 * A FENCE_WAIT of this thread on a stalled queue while an SQE of its normal ring completes:
 * the SQE's completion (and the start of io_uring's workers) is task work of this thread,
 * whose notification makes signal_pending() true. No signal handler runs, so the wait goes on
 * (the driver restarts the call) and returns 0 once the stall ends, not EINTR; the SQE's CQE
 * is there too, res 0 and its bytes copied.
 */
TEST_F_TIMEOUT(uring, fence_wait_through_task_work, 60)
{
	const __u32 q = 7, q2 = 8;
	struct neuron_udma_copy c = ucopy(&self->a, 0, &self->b, 0, 4096);
	struct neuron_udma_copy c2 = ucopy(&self->a, 8192, &self->b, 8192, 4096);
	struct cqe_out out;
	double t0, dt;
	__u64 f = 0;
	int ret;

	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, queue_init(self->fd, ENG, q2, 64, 64));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, 500));
	ASSERT_EQ(0, submit_one(self->fd, ENG, q, c, &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q2, &c2, 1,
				 0x77));
	t0 = uring_now_ms();
	ret = fence_wait(self->fd, ENG, q, 1, 5000);
	dt = uring_now_ms() - t0;
	ASSERT_EQ(0, ret) {
		TH_LOG("FENCE_WAIT with the ring's task work arriving: %s after %.0f ms",
		       err_name(ret), dt);
	}
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	ASSERT_EQ(0, cqe_next(&self->ring, false, SOON_MS, &out));
	EXPECT_EQ(0x77ULL, out.data);
	EXPECT_EQ(0, out.res);
	ASSERT_BYTES(self->b.map + 8192, self->a.map + 8192, 4096);
}

#define INFLIGHT 64

/*
 * 64 SQEs of one copy each on a stalled queue: all of them issued (64 copies on the ring, each
 * behind a fence, none pending) and no CQE while the stall lasts; once it ends, 64 CQEs with
 * res 0, each user_data once, every byte copied.
 */
TEST_F_TIMEOUT(uring, many_in_flight, 60)
{
	const __u32 q = 5, ring_descs = 1024;
	static struct neuron_udma_copy c[INFLIGHT];
	struct neuron_udma_queue_state st0, st;
	struct neuron_udma_fence_status fs;
	bool seen[INFLIGHT] = { false };
	__u32 written = 0, copies = 0, fences = 0;
	int i, n = 0, bad = 0, ret;
	struct cqe_out out;
	double t0;

	ASSERT_LE((__u32)INFLIGHT, self->info.max_queue_fences);
	ASSERT_EQ(0, queue_init(self->fd, ENG, q, ring_descs, ring_descs));
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st0));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	for (i = 0; i < INFLIGHT; i++) {
		c[i] = ucopy(&self->a, i * 4096, &self->b, i * 4096, 4096);
		ASSERT_EQ(0, sqe_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c[i], 1,
				      1000 + i));
	}
	ret = io_uring_submit(&self->ring);
	ASSERT_EQ(INFLIGHT, ret);
	/*
	 * Issued (inline, or by io_uring's workers, which may still be at it): 64 copies written,
	 * each behind a fence of its own, none left pending.
	 */
	t0 = now_ms();
	while (now_ms() - t0 < SOON_MS) {
		ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st));
		written = (st.tx.sw_next - st0.tx.sw_next) & (ring_descs - 1);
		fences = 0;
		if (!fence_status(self->fd, ENG, q, 1, &fs))
			fences = (__u32)fs.submitted;
		copies = written - fences;
		if (copies == INFLIGHT && st.tx.sw_pending == 0)
			break;
		sleep_ms(20);
	}
	TH_LOG("%u copies behind %u fences in flight after %.0f ms", copies, fences, now_ms() - t0);
	ASSERT_EQ((__u32)INFLIGHT, copies);
	EXPECT_EQ(0U, st.tx.sw_pending);
	EXPECT_FENCE(self->fd, ENG, q, fences, NEURON_UDMA_FENCE_PENDING, 0);
	ret = cqe_next(&self->ring, false, 200, &out);
	EXPECT_EQ(-ETIME, ret) {
		TH_LOG("a CQE (res %d) while the queue is stalled", out.res);
	}
	ASSERT_BYTES(self->b.map, self->save, BUF);

	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	t0 = now_ms();
	for (n = 0; n < INFLIGHT; n++) {
		ret = cqe_next(&self->ring, false, 20000, &out);
		if (ret)
			break;
		if (out.res || out.data < 1000 || out.data >= 1000 + INFLIGHT ||
		    seen[out.data - 1000]) {
			if (!bad++)
				TH_LOG("CQE %llu: res %d (%s)%s", (unsigned long long)out.data, out.res,
				       err_name(out.res),
				       out.data >= 1000 && out.data < 1000 + INFLIGHT &&
				       seen[out.data - 1000] ? ", seen before" : "");
			continue;
		}
		seen[out.data - 1000] = true;
	}
	TH_LOG("%d CQEs in %.0f ms after the stall ended", n, now_ms() - t0);
	ASSERT_EQ(INFLIGHT, n);
	EXPECT_EQ(0, bad);
	ASSERT_BYTES(self->b.map, self->a.map, BUF);
	EXPECT_FENCE(self->fd, ENG, q, fences, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);
	EXPECT_EQ(-ETIME, cqe_next(&self->ring, false, 100, &out));
}

/*
 * An IOPOLL ring (IORING_SETUP_IOPOLL): an SQE completes with res 0 when polled (the bytes
 * there), also one that waited on a stalled queue (no CQE while it lasts); a bad SQE completes
 * with its error.
 */
TEST_F_TIMEOUT(uring, iopoll_ring, 60)
{
	const __u32 q = 6;
	struct neuron_udma_copy c = ucopy(&self->a, 0, &self->b, 0, 65536);
	struct neuron_udma_copy c2 = ucopy(&self->a, 65536, &self->b, 65536, 4096);
	struct io_uring ring;
	struct cqe_out out;
	int ret;

	ret = io_uring_queue_init(8, &ring, IORING_SETUP_IOPOLL);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_queue_init(IOPOLL): %s", err_name(ret));
	}
	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, submit_copy(&ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 1));
	ret = cqe_next(&ring, true, SOON_MS, &out);
	ASSERT_EQ(0, ret) {
		TH_LOG("no CQE on the IOPOLL ring within %u ms", SOON_MS);
	}
	EXPECT_EQ(1ULL, out.data);
	EXPECT_EQ(0, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	ASSERT_BYTES(self->b.map, self->a.map, 65536);
	EXPECT_FENCE(self->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);

	/* Polled while the queue is stalled: nothing; after: done. */
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_copy(&ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c2, 1, 2));
	ret = cqe_next(&ring, true, 300, &out);
	EXPECT_EQ(-ETIME, ret) {
		TH_LOG("a CQE (res %d) while the queue is stalled", out.res);
	}
	ASSERT_BYTES(self->b.map + 65536, self->save + 65536, 4096);
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ret = cqe_next(&ring, true, SOON_MS, &out);
	ASSERT_EQ(0, ret) {
		TH_LOG("no CQE on the IOPOLL ring within %u ms of the stall's end", SOON_MS);
	}
	EXPECT_EQ(2ULL, out.data);
	EXPECT_EQ(0, out.res);
	ASSERT_BYTES(self->b.map + 65536, self->a.map + 65536, 4096);

	ASSERT_EQ(0, submit_copy(&ring, self->fd, NEURON_UDMA_URING_COPY, ENG, q, &c, 0, 3));
	ASSERT_EQ(0, cqe_next(&ring, true, SOON_MS, &out));
	EXPECT_EQ(3ULL, out.data);
	EXPECT_EQ(-EINVAL, out.res);
	io_uring_queue_exit(&ring);
}

/*
 * An SQE on a file opened read-only: EBADF (it may not start DMA), nothing prepared on the
 * queue it names (the writable file's).
 */
TEST_F_TIMEOUT(uring, read_only_ebadf, 60)
{
	const __u32 q = 9;
	struct neuron_udma_copy c = ucopy(&self->a, 0, &self->b, 0, 4096);
	struct neuron_udma_queue_state st0;
	struct cqe_out out;
	__u64 f = ~0ULL;
	int ro;

	ASSERT_EQ(0, queue_init(self->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st0));
	ro = open(UDMA_DEV, O_RDONLY | O_CLOEXEC);
	ASSERT_LE(0, ro);
	ASSERT_EQ(0, submit_copy(&self->ring, ro, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 3));
	ASSERT_EQ(0, cqe_next(&self->ring, false, SOON_MS, &out));
	EXPECT_EQ(3ULL, out.data);
	EXPECT_EQ(-EBADF, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	ASSERT_UNCHANGED(self->fd, ENG, q, &st0);
	ASSERT_EQ(0, copy_submit(self->fd, ENG, q, &f));
	EXPECT_EQ(0ULL, f);
	ASSERT_BYTES(self->b.map, self->save, BUF);
	close(ro);
}

/* ---- an SQE pending when its queue instance ends ---- */

#define PAGE 4096U

/*
 * How the queue instance of a waiting SQE ends: QUEUE_RELEASE; QUEUE_RELEASE and QUEUE_INIT of
 * the same id, then a copy on the new instance that completes before the SQE is reaped; the
 * close of the file's only descriptor (io_uring holds the file: the instance lives on).
 */
enum inst_end { END_RELEASE, END_REINIT, END_CLOSE };

static const char *const inst_end_names[] = {
	[END_RELEASE] = "QUEUE_RELEASE",
	[END_REINIT] = "QUEUE_RELEASE + QUEUE_INIT",
	[END_CLOSE] = "close",
};

FIXTURE(uring_end) {
	int fd;			/* the test's own file: takes the queue once the SQE's is gone */
	struct ubar2 bar2;
	struct io_uring ring;	/* normal or IOPOLL, as the variant says */
	unsigned char *mem;	/* 3 pages: the source, the SQE's destination, another one */
	unsigned char *save;	/* their bytes as the test began */
};

FIXTURE_VARIANT(uring_end) {
	bool iopoll;		/* an IORING_SETUP_IOPOLL ring */
	enum inst_end end;
	__u32 q;		/* a queue of its own */
};

FIXTURE_VARIANT_ADD(uring_end, normal_release) { .iopoll = false, .end = END_RELEASE, .q = 7 };
FIXTURE_VARIANT_ADD(uring_end, iopoll_release) { .iopoll = true, .end = END_RELEASE, .q = 12 };
FIXTURE_VARIANT_ADD(uring_end, normal_reinit) { .iopoll = false, .end = END_REINIT, .q = 13 };
FIXTURE_VARIANT_ADD(uring_end, iopoll_reinit) { .iopoll = true, .end = END_REINIT, .q = 14 };
FIXTURE_VARIANT_ADD(uring_end, normal_close) { .iopoll = false, .end = END_CLOSE, .q = 8 };
FIXTURE_VARIANT_ADD(uring_end, iopoll_close) { .iopoll = true, .end = END_CLOSE, .q = 0 };

FIXTURE_SETUP(uring_end)
{
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("open %s: %s", UDMA_DEV, strerror(errno));
	}
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	self->mem = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			 0);
	ASSERT_NE(MAP_FAILED, self->mem);
	fill_pattern(self->mem, 3 * PAGE, 43);
	self->save = malloc(3 * PAGE);
	ASSERT_NE(NULL, self->save);
	memcpy(self->save, self->mem, 3 * PAGE);
	ret = io_uring_queue_init(8, &self->ring, variant->iopoll ? IORING_SETUP_IOPOLL : 0);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_queue_init(%s): %s", variant->iopoll ? "IOPOLL" : "0",
		       err_name(ret));
	}
}

FIXTURE_TEARDOWN_PARENT(uring_end)
{
	model_clear();
}

/* Imports the source page and both destination pages into @fd: the copy buffers. */
static int end_buffers(int fd, unsigned char *mem, struct ubuf *s, struct ubuf *d)
{
	__u64 h;
	int ret;

	ret = udma_import(fd, mem, PAGE, 0, &h, NULL);
	if (ret)
		return ret;
	*s = import_ubuf(h, PAGE);
	ret = udma_import(fd, mem + PAGE, 2 * PAGE, NEURON_UDMA_IMPORT_WRITE, &h, NULL);
	if (ret)
		return ret;
	*d = import_ubuf(h, 2 * PAGE);
	return 0;
}

/*
 * An SQE of one copy waits on a stalled queue when its queue instance ends, on a normal or an
 * IOPOLL ring (the variants: ring x end). QUEUE_RELEASE returns promptly and the SQE completes
 * with ECANCELED, also when the same file takes the same id again at once and a copy of the new
 * instance completes before the SQE is reaped; closing the file's only descriptor returns
 * promptly, the instance lives on (io_uring holds the file: the queue stays taken, no CQE while
 * the stall lasts) and the SQE completes with 0 once the stall ends, then the file is released.
 * The copy's buffers are imports of the test's own memory, readable whatever became of the
 * file: res 0 means its bytes are there; otherwise its destination is as it was (the stall kept
 * the copy from starting, the release paused the queue) and stays so after the CQE. No second
 * CQE; the id can be taken again and copies through the ring.
 */
TEST_F_TIMEOUT(uring_end, pending_sqe, 60)
{
	const __u32 q = variant->q;
	const bool iopoll = variant->iopoll;
	const int want = variant->end == END_CLOSE ? 0 : -ECANCELED;
	const char *ring = iopoll ? "IOPOLL" : "normal", *end = inst_end_names[variant->end];
	unsigned char *src = self->mem, *dst = self->mem + PAGE;
	struct neuron_udma_fence_status fs;
	struct neuron_udma_copy c;
	struct ubuf s, d;
	struct cqe_out out;
	int fd2, owner, ret = -1;
	double t0, dt;
	__u64 f = 0;

	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, queue_init(fd2, ENG, q, 64, 64));
	ASSERT_EQ(0, end_buffers(fd2, self->mem, &s, &d));
	c = ucopy(&s, 0, &d, 0, PAGE);
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_copy(&self->ring, fd2, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 5));
	/* Issued: its fence exists. */
	t0 = now_ms();
	while (now_ms() - t0 < SOON_MS && (ret = fence_status(fd2, ENG, q, 1, &fs)))
		sleep_ms(10);
	ASSERT_EQ(0, ret);
	ret = cqe_next(&self->ring, iopoll, 300, &out);
	ASSERT_EQ(-ETIME, ret) {
		TH_LOG("a CQE (res %d) while the queue is stalled", out.res);
	}
	ASSERT_BYTES(dst, self->save + PAGE, 2 * PAGE);

	t0 = now_ms();
	if (variant->end == END_CLOSE) {
		ASSERT_EQ(0, close(fd2));
		fd2 = -1;
	} else {
		ASSERT_EQ(0, queue_release(fd2, ENG, q));
	}
	dt = now_ms() - t0;
	TH_LOG("%s with an SQE waiting: %.0f ms", end, dt);
	EXPECT_LT(dt, 5000.0);
	if (variant->end == END_REINIT) {
		/* The same id again; a copy of the new instance done before the SQE is reaped. */
		ASSERT_EQ(0, queue_init(fd2, ENG, q, 64, 64));
		ASSERT_EQ(0, submit_one(fd2, ENG, q, ucopy(&s, 0, &d, PAGE, PAGE), &f));
		ret = fence_wait(fd2, ENG, q, f, 20000);
		ASSERT_EQ(0, ret) {
			TH_LOG("FENCE_WAIT of the new instance's fence %llu: %s",
			       (unsigned long long)f, err_name(ret));
		}
		ASSERT_BYTES(dst + PAGE, src, PAGE);
	}
	if (variant->end == END_CLOSE) {
		/* io_uring holds the file: the instance lives on, its copy still stalled. */
		ret = cqe_next(&self->ring, iopoll, 300, &out);
		EXPECT_EQ(-ETIME, ret) {
			TH_LOG("a CQE (res %d) after the close, the queue stalled", out.res);
		}
		EXPECT_EQ(-EBUSY, queue_init(self->fd, ENG, q, 64, 64));
	}

	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ret = cqe_next(&self->ring, iopoll, SOON_MS, &out);
	ASSERT_EQ(0, ret) {
		TH_LOG("no CQE within %u ms of the stall's end", SOON_MS);
	}
	EXPECT_EQ(5ULL, out.data);
	EXPECT_EQ(want, out.res) {
		TH_LOG("%s ring, %s: CQE res %d (%s), want %s", ring, end, out.res,
		       err_name(out.res), err_name(want));
	}
	if (!out.res) {
		ASSERT_BYTES(dst, src, PAGE);
	} else {
		ASSERT_BYTES(dst, self->save + PAGE, PAGE);
		sleep_ms(300);
		ASSERT_BYTES(dst, self->save + PAGE, PAGE);
	}
	ret = cqe_next(&self->ring, iopoll, 100, &out);
	EXPECT_EQ(-ETIME, ret) {
		TH_LOG("a second CQE: user_data %llu, res %d", (unsigned long long)out.data,
		       out.res);
	}

	/* The id again (the closed file's once io_uring let go of it), copying through the ring. */
	owner = fd2;
	if (variant->end == END_CLOSE) {
		owner = self->fd;
		t0 = now_ms();
		while (now_ms() - t0 < SOON_MS) {
			ret = queue_init(owner, ENG, q, 64, 64);
			if (ret != -EBUSY)
				break;
			sleep_ms(50);
		}
		ASSERT_EQ(0, ret) {
			TH_LOG("the closed file's queue: QUEUE_INIT %s", err_name(ret));
		}
		ASSERT_EQ(0, end_buffers(owner, self->mem, &s, &d));
	} else if (variant->end == END_RELEASE) {
		ASSERT_EQ(0, queue_init(owner, ENG, q, 64, 64));
	}
	memcpy(dst + PAGE, self->save + 2 * PAGE, PAGE);
	c = ucopy(&s, 0, &d, PAGE, PAGE);
	ASSERT_EQ(0, submit_copy(&self->ring, owner, NEURON_UDMA_URING_COPY, ENG, q, &c, 1, 6));
	ASSERT_EQ(0, cqe_next(&self->ring, iopoll, SOON_MS, &out));
	EXPECT_EQ(6ULL, out.data);
	EXPECT_EQ(0, out.res) {
		TH_LOG("the next SQE: res %d (%s)", out.res, err_name(out.res));
	}
	ASSERT_BYTES(dst + PAGE, src, PAGE);
	if (fd2 >= 0)
		close(fd2);
}

/* ---- another uid ---- */

#define ISO_QA 10U
#define ISO_QB 11U

/* What uid 1002's SQEs got, and what each side saw. */
enum { B_OTHER_QUEUE, B_OTHER_SRC, B_OTHER_DST, B_OWN, B_SQES };

static const char *const b_sqe_names[B_SQES] = {
	"uid 1001's queue with its own buffers", "its own queue from uid 1001's buffer",
	"its own queue into uid 1001's buffer", "its own queue and buffers",
};

static const int b_sqe_want[B_SQES] = { -ENOENT, -ENOENT, -ENOENT, 0 };

struct iso_report {
	__u64 a_src, a_dst;	/* uid 1001's buffer handles */
	int a_step, a_err;
	int b_step, b_err;
	int b_res[B_SQES];
};

struct iso_a_arg {
	struct iso_report *r;
	int ready, go;
};

#define STEP(who, n, expr) do {						\
		ret = (expr);						\
		if (ret) {						\
			r->who##_step = (n);				\
			r->who##_err = ret;				\
			return 1;					\
		}							\
	} while (0)

/* uid 1001: a queue with fence 1 done; after uid 1002's SQEs nothing of it changed. */
static int iso_owner(void *arg)
{
	struct iso_a_arg *a = arg;
	struct iso_report *r = a->r;
	struct neuron_udma_queue_state st, now;
	struct neuron_udma_fence_status fs;
	struct ubuf s, d;
	char why[256];
	__u64 f = 0;
	int fd, ret, i;

	fd = udma_open();
	STEP(a, 1, fd < 0 ? -errno : 0);
	STEP(a, 2, queue_init(fd, ENG, ISO_QA, 64, 64));
	STEP(a, 3, ubuf_host(fd, 64 * KIB, &s));
	STEP(a, 4, ubuf_host(fd, 64 * KIB, &d));
	fill_pattern(s.map, 64 * KIB, 5);
	memset(d.map, 0x5a, 64 * KIB);
	STEP(a, 5, submit_one(fd, ENG, ISO_QA, ucopy(&s, 0, &d, 0, 4096), &f));
	STEP(a, 6, fence_wait(fd, ENG, ISO_QA, f, 20000));
	STEP(a, 7, queue_state(fd, ENG, ISO_QA, &st));
	r->a_src = s.handle;
	r->a_dst = d.handle;
	STEP(a, 8, pipe_say(a->ready));
	STEP(a, 9, pipe_wait(a->go, 30000));
	STEP(a, 10, queue_state(fd, ENG, ISO_QA, &now));
	STEP(a, 11, state_diff(&st, &now, why, sizeof(why)) ? -EPERM : 0);
	STEP(a, 12, fence_status(fd, ENG, ISO_QA, 1, &fs));
	STEP(a, 13, fs.state == NEURON_UDMA_FENCE_DONE && fs.submitted == 1 ? 0 : -EPERM);
	/* Its destination holds its own copy and nothing else. */
	STEP(a, 14, first_diff(d.map, s.map, 4096) < 0 ? 0 : -EIO);
	for (i = 4096; i < 64 * (int)KIB; i++)
		STEP(a, 15, d.map[i] == 0x5a ? 0 : -EIO);
	return 0;
}

/* uid 1002, with a file, a queue, buffers and a ring of its own. */
static int iso_other(void *arg)
{
	struct iso_report *r = arg;
	struct neuron_udma_queue_state st0, now;
	struct neuron_udma_copy c[B_SQES];
	struct neuron_udma_fence_status fs;
	struct io_uring ring;
	struct ubuf s, d, a_src, a_dst;
	struct cqe_out out;
	char why[256];
	int fd, i, ret;
	__u32 q;

	for (i = 0; i < B_SQES; i++)
		r->b_res[i] = 1;
	fd = udma_open();
	STEP(b, 1, fd < 0 ? -errno : 0);
	STEP(b, 2, queue_init(fd, ENG, ISO_QB, 64, 64));
	STEP(b, 3, ubuf_host(fd, 64 * KIB, &s));
	STEP(b, 4, ubuf_host(fd, 64 * KIB, &d));
	fill_pattern(s.map, 64 * KIB, 6);
	memset(d.map, 0x33, 64 * KIB);
	STEP(b, 5, io_uring_queue_init(8, &ring, 0));
	STEP(b, 6, queue_state(fd, ENG, ISO_QB, &st0));
	a_src = import_ubuf(r->a_src, 64 * KIB);
	a_dst = import_ubuf(r->a_dst, 64 * KIB);
	c[B_OTHER_QUEUE] = ucopy(&s, 0, &d, 0, 4096);
	c[B_OTHER_SRC] = ucopy(&a_src, 0, &d, 0, 4096);
	c[B_OTHER_DST] = ucopy(&s, 0, &a_dst, 4096, 4096);
	c[B_OWN] = ucopy(&s, 0, &d, 8192, 4096);
	for (i = 0; i < B_SQES; i++) {
		q = i == B_OTHER_QUEUE ? ISO_QA : ISO_QB;
		STEP(b, 10 + i, submit_copy(&ring, fd, NEURON_UDMA_URING_COPY, ENG, q, &c[i], 1, i));
		STEP(b, 20 + i, cqe_next(&ring, false, SOON_MS, &out));
		STEP(b, 30 + i, out.data == (__u64)i ? 0 : -EPROTO);
		r->b_res[i] = out.res;
		if (i == B_OWN)
			break;
		/* Refused: nothing prepared on its own queue, no fence, nothing written. */
		STEP(b, 40 + i, queue_state(fd, ENG, ISO_QB, &now));
		STEP(b, 45 + i, state_diff(&st0, &now, why, sizeof(why)) ? -EPERM : 0);
		STEP(b, 50 + i, fence_status(fd, ENG, ISO_QB, 1, &fs) == -EINVAL ? 0 : -EPERM);
		STEP(b, 60 + i, d.map[0] == 0x33 && d.map[4096] == 0x33 ? 0 : -EIO);
	}
	STEP(b, 70, first_diff(d.map + 8192, s.map, 4096) < 0 ? 0 : -EIO);
	for (i = 0; i < B_SQES; i++)
		if (r->b_res[i] != b_sqe_want[i])
			return 3;
	return 0;
}

FIXTURE(isolation) {
	int unused;
};

FIXTURE_SETUP(isolation)
{
	struct ubar2 b;

	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, bar2_open(&b));
	bar2_write(&b, BAR2_CLEAR, 1);
	bar2_close(&b);
}

FIXTURE_TEARDOWN_PARENT(isolation)
{
	model_clear();
}

/*
 * io_uring from a file of uid 1002 against a file of uid 1001: an SQE naming uid 1001's queue,
 * or uid 1001's buffers on uid 1002's own queue, completes with ENOENT and prepares nothing;
 * uid 1002's own SQE works (so the refusals are about ownership); uid 1001's queue, fence and
 * buffers are unchanged.
 */
TEST_F_TIMEOUT(isolation, other_uid_sqe_enoent, 60)
{
	struct iso_report *r = sec_shared(sizeof(*r));
	int ready[2], go[2], rc_a, rc_b, i;
	struct iso_a_arg arg;
	pid_t a;

	ASSERT_NE(NULL, r);
	/* A child that died early closes its pipe: EPIPE, not SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	ASSERT_EQ(0, pipe2(ready, O_CLOEXEC));
	ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
	arg = (struct iso_a_arg){ .r = r, .ready = ready[1], .go = go[0] };
	a = sec_spawn(UID_A, iso_owner, &arg);
	ASSERT_LT(0, a);
	close(ready[1]);
	close(go[0]);
	ASSERT_EQ(0, pipe_wait(ready[0], 20000)) {
		TH_LOG("uid %d did not set up its queue: step %d, %s", UID_A, r->a_step,
		       err_name(r->a_err));
		kill(a, SIGKILL);
	}
	rc_b = sec_reap(sec_spawn(UID_B, iso_other, r));
	EXPECT_EQ(0, rc_b) {
		TH_LOG("uid %d: exit %d, step %d: %s", UID_B, rc_b, r->b_step, err_name(r->b_err));
	}
	for (i = 0; i < B_SQES; i++) {
		EXPECT_EQ(b_sqe_want[i], r->b_res[i]) {
			TH_LOG("uid %d's SQE on %s: res %d (%s), want %s", UID_B, b_sqe_names[i],
			       r->b_res[i], err_name(r->b_res[i]), err_name(b_sqe_want[i]));
		}
	}
	ASSERT_EQ(0, pipe_say(go[1]));
	rc_a = sec_reap(a);
	EXPECT_EQ(0, rc_a) {
		TH_LOG("uid %d: exit %d, step %d failed: %s", UID_A, rc_a, r->a_step,
		       err_name(r->a_err));
	}
}

TEST_HARNESS_MAIN
