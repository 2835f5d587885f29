// SPDX-License-Identifier: GPL-2.0
/*
 * Fences as values and their events (ABI 3, include/uapi/linux/neuron_udma.h): COPY_SUBMIT
 * numbers a queue's fences from 1 and returns at once (also while the device model stalls the
 * queue), FENCE_STATUS and FENCE_WAIT tell pending, done and failed fences and refuse fence 0,
 * fences not submitted yet and other files' queues, FENCE_WAIT's timeout and signals leave the
 * copies going (no reset), COPY_SUBMIT stops at max_queue_fences; poll()/epoll and QUEUE_EVENTS
 * report each completion and failure once; an eventfd per queue counts the settled fences;
 * QUEUE_RELEASE and close with an eventfd and fences in flight; a file of another uid reaches
 * no queue through the new calls. Fences belong to a queue instance: QUEUE_RELEASE and QUEUE_INIT
 * of the same id continue its numbering, a released instance's fences are ECANCELED, and so are
 * FENCE_WAIT and COPY_WAIT blocked in a thread while another releases the queue.
 *
 * Each test fails when the driver breaks the rule it checks; after a refused call it checks
 * that the queue (ring indices, tail, resets) and its fences did not change. The queues are on
 * engine 15 (host-connected on v2 and v3; no other program uses it at the same time), one queue
 * number per test. Stalls and engine errors come from the device model's BAR2 window: a stall
 * is ended with BAR2_CLEAR once the test checked what must hold while it lasts, and the
 * harness's parent clears the model after every test (also after an assertion or a timeout).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "kselftest_harness.h"
#include "udma_fence.h"

#define ENG FENCE_ENG
#define BUF (256U * 1024)
#define KIB 1024U

/* What every test starts with: a file, the model's window, two host buffers of known bytes. */
struct fx {
	int fd;
	struct neuron_udma_info info;
	struct ubar2 bar2;
	struct ubuf a, b;
	unsigned char *save;	/* b's bytes as the test began */
};

static void fx_setup(struct __test_metadata *_metadata, struct fx *x)
{
	int ret;

	x->fd = udma_open();
	ASSERT_LE(0, x->fd) {
		TH_LOG("open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, udma_info(x->fd, &x->info));
	ASSERT_EQ((__u32)NEURON_UDMA_ABI_VERSION, x->info.abi_version);
	ASSERT_TRUE(!!(x->info.host_engines[ENG / 64] & (1ULL << (ENG % 64))));
	ret = bar2_open(&x->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, no_restart(SIGALRM));
	ASSERT_EQ(0, ubuf_host(x->fd, BUF, &x->a));
	ASSERT_EQ(0, ubuf_host(x->fd, BUF, &x->b));
	fill_pattern(x->a.map, BUF, 31);
	fill_pattern(x->b.map, BUF, 32);
	x->save = malloc(BUF);
	ASSERT_NE(NULL, x->save);
	memcpy(x->save, x->b.map, BUF);
}

/* ---- fences: numbering, states, errors, timeouts, signals ---- */

FIXTURE(fence) {
	struct fx x;
};

FIXTURE_SETUP(fence)
{
	fx_setup(_metadata, &self->x);
}

/* In the harness's parent: runs also after an assertion or a timeout killed the test. */
FIXTURE_TEARDOWN_PARENT(fence)
{
	model_clear();
}

/*
 * COPY_SUBMIT on a fresh queue: 0 with nothing to fence (nothing written), 1 for the first
 * copy, 2 for the next, the newest again with nothing new. It returns while the model stalls
 * the queue (the doorbell rung: nothing pending), and FENCE_STATUS says PENDING (completed 0,
 * submitted 2) until the stall ends; then FENCE_WAIT returns 0, both are DONE and the bytes
 * are there.
 */
TEST_F_TIMEOUT(fence, submit_numbers_and_status, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 1;
	struct neuron_udma_queue_state st0, st1, st;
	struct neuron_udma_fence_status fs;
	double t_stall, t0, dt;
	__u64 f = ~0ULL;
	int ret;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 256, 256));
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st0));
	/* A queue that never had a fence: 0, and nothing is written. */
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ(0ULL, f);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st0);
	EXPECT_EQ(-EINVAL, fence_status(x->fd, ENG, q, 1, &fs));

	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	t_stall = now_ms();
	ASSERT_EQ(0, prep_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096)));
	t0 = now_ms();
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	dt = now_ms() - t0;
	EXPECT_EQ(1ULL, f);
	TH_LOG("COPY_SUBMIT on the stalled queue returned in %.1f ms", dt);
	EXPECT_LT(dt, 2000.0);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st1));
	/* Started with one doorbell: the copy and its marker, nothing left pending. */
	EXPECT_EQ(0U, st1.tx.sw_pending);
	EXPECT_EQ(0U, st1.rx.sw_pending);
	EXPECT_EQ((st0.tx.sw_next + 2) % 256, st1.tx.sw_next);
	EXPECT_EQ((st0.rx.sw_next + 2) % 256, st1.rx.sw_next);
	EXPECT_EQ(st0.tx.sw_ack, st1.tx.sw_ack);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_PENDING, 0);

	/* Nothing new: the newest fence again, nothing written. */
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ(1ULL, f);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st1);

	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 8 * KIB, &x->b, 8 * KIB, 65536), &f));
	EXPECT_EQ(2ULL, f);
	ASSERT_EQ(0, fence_status(x->fd, ENG, q, 1, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_PENDING, fs.state);
	EXPECT_EQ(0, fs.error);
	EXPECT_EQ(0ULL, fs.completed);
	EXPECT_EQ(2ULL, fs.submitted);
	EXPECT_FENCE(x->fd, ENG, q, 2, NEURON_UDMA_FENCE_PENDING, 0);
	ASSERT_BYTES(x->b.map, x->save, BUF);
	/* All of the above ran while the stall lasted (else the PENDING checks proved nothing). */
	ASSERT_LT(now_ms() - t_stall, (double)STALL_MS) {
		TH_LOG("the host is too slow: the stall ended before the checks");
	}

	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	t0 = now_ms();
	ret = fence_wait(x->fd, ENG, q, 2, 20000);
	ASSERT_EQ(0, ret) {
		TH_LOG("FENCE_WAIT of fence 2 after the stall: %s", err_name(ret));
	}
	TH_LOG("fence 2 done %.0f ms after the stall ended", now_ms() - t0);
	ASSERT_EQ(0, fence_status(x->fd, ENG, q, 1, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_DONE, fs.state);
	EXPECT_EQ(0, fs.error);
	EXPECT_EQ(2ULL, fs.completed);
	EXPECT_EQ(2ULL, fs.submitted);
	EXPECT_FENCE(x->fd, ENG, q, 2, NEURON_UDMA_FENCE_DONE, 0);
	/* A done fence: FENCE_WAIT returns at once. */
	EXPECT_EQ(0, fence_wait(x->fd, ENG, q, 1, 10));
	ASSERT_BYTES(x->b.map, x->a.map, 4096);
	ASSERT_BYTES(x->b.map + 8 * KIB, x->a.map + 8 * KIB, 65536);
	ASSERT_BYTES(x->b.map + 4096, x->save + 4096, 8 * KIB - 4096);
	ASSERT_BYTES(x->b.map + 8 * KIB + 65536, x->save + 8 * KIB + 65536, BUF - 8 * KIB - 65536);
	/* Retired: the ring is empty again, and no reset happened. */
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);
	EXPECT_EQ(st.rx.sw_next, st.rx.sw_ack);
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ(2ULL, f);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);
}

/*
 * An engine error (the model fails the next Tx descriptor of the queue) fails the fence it
 * covers: FENCE_WAIT EIO, FENCE_STATUS FAILED with error EIO (completed still the earlier
 * fence), the failing packet wrote nothing; the earlier done fence stays DONE, and the fences
 * submitted after it succeed.
 */
TEST_F_TIMEOUT(fence, failed_fence_eio, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 2;
	struct neuron_udma_queue_state st;
	struct neuron_udma_fence_status fs;
	__u64 f = 0;
	int ret;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 1, 20000));

	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_FAIL_NTH, ENG, q, 1));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 4096, &x->b, 64 * KIB, 4096), &f));
	ASSERT_EQ(2ULL, f);
	ret = fence_wait(x->fd, ENG, q, 2, 20000);
	ASSERT_EQ(-EIO, ret) {
		TH_LOG("FENCE_WAIT of the failed fence: %s", err_name(ret));
	}
	EXPECT_EQ(ERR_INJECTED_FAIL, bar2_read(&x->bar2, BAR2_LAST_ERROR));
	EXPECT_EQ(ENG, bar2_read(&x->bar2, BAR2_LAST_ENGINE));
	EXPECT_EQ(q, bar2_read(&x->bar2, BAR2_LAST_QUEUE));
	ASSERT_EQ(0, fence_status(x->fd, ENG, q, 2, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_FAILED, fs.state) {
		TH_LOG("fence 2 is %s", fence_state_name(fs.state));
	}
	EXPECT_EQ(EIO, fs.error);
	EXPECT_EQ(1ULL, fs.completed);
	EXPECT_EQ(2ULL, fs.submitted);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	/* It stays failed. */
	EXPECT_EQ(-EIO, fence_wait(x->fd, ENG, q, 2, 100));
	/* The failing packet wrote nothing; the queue was reset once. */
	ASSERT_BYTES(x->b.map + 4096, x->save + 4096, BUF - 4096);
	ASSERT_BYTES(x->b.map, x->a.map, 4096);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(1U, st.resets);
	EXPECT_EQ(0U, st.tx.sw_pending);
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);

	/* The fences after it succeed. */
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 8192, &x->b, 128 * KIB, 65536), &f));
	EXPECT_EQ(3ULL, f);
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 100, &x->b, 200 * KIB, 5000), &f));
	EXPECT_EQ(4ULL, f);
	ret = fence_wait(x->fd, ENG, q, 4, 20000);
	ASSERT_EQ(0, ret) {
		TH_LOG("FENCE_WAIT of the fence after the failure: %s", err_name(ret));
	}
	ASSERT_EQ(0, fence_status(x->fd, ENG, q, 3, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_DONE, fs.state);
	EXPECT_EQ(4ULL, fs.completed);
	EXPECT_EQ(4ULL, fs.submitted);
	EXPECT_FENCE(x->fd, ENG, q, 4, NEURON_UDMA_FENCE_DONE, 0);
	EXPECT_FENCE(x->fd, ENG, q, 2, NEURON_UDMA_FENCE_FAILED, EIO);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_BYTES(x->b.map + 128 * KIB, x->a.map + 8192, 65536);
	ASSERT_BYTES(x->b.map + 200 * KIB, x->a.map + 100, 5000);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(1U, st.resets);
}

/*
 * An engine aborted while its queues are idle (the model's ABORT: every state field of the
 * engine in abort, no cause bit, as after another queue's error on silicon). A queue whose
 * fences all completed before it says so: COPY_WAIT and FENCE_WAIT return 0 and nothing is
 * reset. The next copy on the engine, here on a queue set up after the abort, fails with EIO
 * and its wait resets that queue, which brings the engine out of abort: the copies after it
 * succeed on both queues, each with its bytes. This is the rule udma-fuzz's model follows
 * (an engine is healthy again only after a wait that saw the failure, or a success of a copy
 * submitted after the fault).
 */
TEST_F_TIMEOUT(fence, abort_idle_engine, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 0, q2 = 4;
	struct neuron_udma_queue_state st;
	__u64 f = 0, done = 0;
	int i, ret;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 1, 20000));

	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_ABORT, ENG, 0, 0));
	/* Nothing of q's ran after the abort: its waits say done and reset nothing. */
	ASSERT_EQ(0, copy_wait(x->fd, ENG, q, 1000, &done));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 1, 1000));
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);

	/* A queue set up after the abort: its first copy meets the aborted engine. */
	ASSERT_EQ(0, queue_init(x->fd, ENG, q2, 64, 64));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q2, ucopy(&x->a, 4096, &x->b, 64 * KIB, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ret = fence_wait(x->fd, ENG, q2, 1, 20000);
	ASSERT_EQ(-EIO, ret) {
		TH_LOG("FENCE_WAIT of a copy submitted to an aborted engine: %s", err_name(ret));
	}
	ASSERT_BYTES(x->b.map + 64 * KIB, x->save + 64 * KIB, 4096);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q2, &st));
	EXPECT_EQ(1U, st.resets);

	/* The engine is out of abort: both queues copy again (each its fence 2). */
	for (i = 0; i < 2; i++) {
		const __u32 qq = i ? q : q2;
		const __u32 src = 8192 + i * 4096, dst = (128 + i * 64) * KIB;

		ASSERT_EQ(0, submit_one(x->fd, ENG, qq, ucopy(&x->a, src, &x->b, dst, 4096), &f));
		ASSERT_EQ(2ULL, f);
		ret = fence_wait(x->fd, ENG, qq, 2, 20000);
		ASSERT_EQ(0, ret) {
			TH_LOG("FENCE_WAIT after the reset, queue %u: %s", qq, err_name(ret));
		}
		ASSERT_BYTES(x->b.map + dst, x->a.map + src, 4096);
	}
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);
}

/*
 * FENCE_STATUS, FENCE_WAIT and COPY_SUBMIT refuse what the header lists: fence 0 and a fence
 * newer than the newest submitted (EINVAL), reserved fields and flags (EINVAL), a queue the
 * file does not have, of another file or of nobody (ENOENT). None of them changes the queue,
 * its pending copy or its fences, nor the other file's.
 */
TEST_F_TIMEOUT(fence, status_wait_submit_errors, 60)
{
	static const __u64 bad[] = { 0, 3, 4, 1000, ~0ULL };
	struct fx *x = &self->x;
	const __u32 q = 3, q_other = 4, q_none = 5;
	struct neuron_udma_queue_state st, st_other;
	struct neuron_udma_fence_status fs;
	struct neuron_udma_fence_wait w;
	struct neuron_udma_copy_submit s;
	struct ubuf oa, ob;
	__u64 f = 0;
	int fd2, ret;
	size_t i;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	/* No fence yet: even fence 1 is newer than the newest. */
	EXPECT_EQ(-EINVAL, fence_status(x->fd, ENG, q, 0, &fs));
	EXPECT_EQ(-EINVAL, fence_status(x->fd, ENG, q, 1, &fs));
	EXPECT_EQ(-EINVAL, fence_wait(x->fd, ENG, q, 0, 100));
	EXPECT_EQ(-EINVAL, fence_wait(x->fd, ENG, q, 1, 100));

	/* Fence 1 done, fence 2 pending on the stalled queue, a third copy prepared. */
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 1, 20000));
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 4096, &x->b, 4096, 4096), &f));
	ASSERT_EQ(2ULL, f);
	ASSERT_EQ(0, prep_one(x->fd, ENG, q, ucopy(&x->a, 8192, &x->b, 8192, 4096)));
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	ASSERT_EQ(1U, st.tx.sw_pending);

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		ret = fence_status(x->fd, ENG, q, bad[i], &fs);
		EXPECT_EQ(-EINVAL, ret) {
			TH_LOG("FENCE_STATUS of fence %llu (newest 2): %s",
			       (unsigned long long)bad[i], err_name(ret));
		}
		ret = fence_wait(x->fd, ENG, q, bad[i], 100);
		EXPECT_EQ(-EINVAL, ret) {
			TH_LOG("FENCE_WAIT of fence %llu (newest 2): %s",
			       (unsigned long long)bad[i], err_name(ret));
		}
	}
	/* FENCE_WAIT's reserved field; COPY_SUBMIT's flags and reserved field. */
	w = (struct neuron_udma_fence_wait){ .engine = ENG, .queue = q, .fence = 1, .reserved = 1 };
	EXPECT_EQ(-EINVAL, udma_ioc(x->fd, NEURON_UDMA_FENCE_WAIT, &w));
	s = (struct neuron_udma_copy_submit){ .engine = ENG, .queue = q, .flags = 1 };
	EXPECT_EQ(-EINVAL, udma_ioc(x->fd, NEURON_UDMA_COPY_SUBMIT, &s));
	s = (struct neuron_udma_copy_submit){ .engine = ENG, .queue = q, .flags = 0x80000000U };
	EXPECT_EQ(-EINVAL, udma_ioc(x->fd, NEURON_UDMA_COPY_SUBMIT, &s));
	s = (struct neuron_udma_copy_submit){ .engine = ENG, .queue = q, .reserved = 1 };
	EXPECT_EQ(-EINVAL, udma_ioc(x->fd, NEURON_UDMA_COPY_SUBMIT, &s));
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);

	/* A queue of another file (of this process), and the other way round. */
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, queue_init(fd2, ENG, q_other, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &oa));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &ob));
	ASSERT_EQ(0, submit_one(fd2, ENG, q_other, ucopy(&oa, 0, &ob, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(fd2, ENG, q_other, 1, 20000));
	ASSERT_EQ(0, prep_one(fd2, ENG, q_other, ucopy(&oa, 0, &ob, 4096, 4096)));
	ASSERT_EQ(0, queue_state(fd2, ENG, q_other, &st_other));
	EXPECT_EQ(-ENOENT, fence_status(x->fd, ENG, q_other, 1, &fs));
	EXPECT_EQ(-ENOENT, fence_wait(x->fd, ENG, q_other, 1, 100));
	EXPECT_EQ(-ENOENT, copy_submit(x->fd, ENG, q_other, &f));
	EXPECT_EQ(-ENOENT, fence_status(fd2, ENG, q, 1, &fs));
	EXPECT_EQ(-ENOENT, fence_status(fd2, ENG, q, 2, &fs));
	EXPECT_EQ(-ENOENT, fence_wait(fd2, ENG, q, 2, 100));
	EXPECT_EQ(-ENOENT, copy_submit(fd2, ENG, q, &f));
	/* A queue nobody took. */
	EXPECT_EQ(-ENOENT, fence_status(x->fd, ENG, q_none, 1, &fs));
	EXPECT_EQ(-ENOENT, fence_wait(x->fd, ENG, q_none, 1, 100));
	EXPECT_EQ(-ENOENT, copy_submit(x->fd, ENG, q_none, &f));
	ASSERT_UNCHANGED(fd2, ENG, q_other, &st_other);
	EXPECT_FENCE(fd2, ENG, q_other, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	EXPECT_FENCE(x->fd, ENG, q, 2, NEURON_UDMA_FENCE_PENDING, 0);
	ASSERT_BYTES(x->b.map + 4096, x->save + 4096, BUF - 4096);

	/* Everything still works: fence 2 completes, the prepared copy becomes fence 3. */
	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 2, 20000));
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ(3ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 3, 20000));
	ASSERT_BYTES(x->b.map, x->a.map, 3 * 4096);
	ASSERT_EQ(0, copy_submit(fd2, ENG, q_other, &f));
	EXPECT_EQ(2ULL, f);
	EXPECT_EQ(0, fence_wait(fd2, ENG, q_other, 2, 20000));
	close(fd2);
}

/*
 * FENCE_WAIT that times out on a stalled queue: ETIMEDOUT after about its timeout (at least
 * 10 ms however small), the queue unchanged (no reset: it is not stuck for 10 s), the fence
 * still PENDING; COPY_WAIT with nothing new joins the same fence: ETIMEDOUT too, no marker
 * added. Once the stall ends the copy lands by itself (no wait needed), FENCE_WAIT and
 * COPY_WAIT return 0.
 */
TEST_F_TIMEOUT(fence, wait_timeout_keeps_copies, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 6;
	struct neuron_udma_queue_state st;
	double t_stall, t0, dt;
	__u64 f = 0;
	long d = 0;
	int ret;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	t_stall = now_ms();
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));

	t0 = now_ms();
	ret = fence_wait(x->fd, ENG, q, 1, 200);
	dt = now_ms() - t0;
	EXPECT_EQ(-ETIMEDOUT, ret) {
		TH_LOG("FENCE_WAIT (200 ms) on the stalled queue: %s", err_name(ret));
	}
	TH_LOG("FENCE_WAIT with a 200 ms timeout returned after %.0f ms", dt);
	EXPECT_GE(dt, 190.0);
	EXPECT_LT(dt, 5000.0);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_PENDING, 0);

	/* A timeout of 1 ms waits the minimum 10 ms. */
	t0 = now_ms();
	EXPECT_EQ(-ETIMEDOUT, fence_wait(x->fd, ENG, q, 1, 1));
	dt = now_ms() - t0;
	EXPECT_GE(dt, 9.0);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);

	ret = copy_wait(x->fd, ENG, q, 200, NULL);
	EXPECT_EQ(-ETIMEDOUT, ret) {
		TH_LOG("COPY_WAIT (200 ms) on the stalled queue: %s", err_name(ret));
	}
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_PENDING, 0);
	ASSERT_BYTES(x->b.map, x->save, BUF);
	ASSERT_LT(now_ms() - t_stall, (double)STALL_MS) {
		TH_LOG("the host is too slow: the stall ended before the checks");
	}

	/* The stall ends: the copy lands without anybody waiting. */
	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	t0 = now_ms();
	while (now_ms() - t0 < SOON_MS) {
		d = first_diff(x->b.map, x->a.map, 4096);
		if (d < 0)
			break;
		sleep_ms(10);
	}
	EXPECT_EQ(-1, d) {
		TH_LOG("the copy did not land within %u ms of the stall's end (byte %ld)", SOON_MS, d);
	}
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 1, 20000));
	EXPECT_EQ(0, copy_wait(x->fd, ENG, q, 0, NULL));
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_BYTES(x->b.map, x->a.map, 4096);
	ASSERT_BYTES(x->b.map + 4096, x->save + 4096, BUF - 4096);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);
}

/*
 * FENCE_WAIT interrupted by a signal: EINTR well before its timeout, the queue unchanged and
 * the fence still PENDING; the fence then completes (FENCE_WAIT 0, the bytes there, no reset).
 */
TEST_F_TIMEOUT(fence, wait_interrupted_eintr, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 7;
	struct neuron_udma_queue_state st;
	double t0, dt;
	__u64 f = 0;
	int ret;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 65536), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	ASSERT_EQ(0, alarm_ms(200));
	t0 = now_ms();
	ret = fence_wait(x->fd, ENG, q, 1, 30000);
	dt = now_ms() - t0;
	alarm_ms(0);
	EXPECT_EQ(-EINTR, ret) {
		TH_LOG("FENCE_WAIT with a signal after 200 ms: %s after %.0f ms", err_name(ret), dt);
	}
	EXPECT_LT(dt, (double)STALL_MS - 1000);
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_PENDING, 0);
	ASSERT_BYTES(x->b.map, x->save, BUF);

	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ret = fence_wait(x->fd, ENG, q, 1, 20000);
	ASSERT_EQ(0, ret) {
		TH_LOG("FENCE_WAIT after the interrupted one: %s", err_name(ret));
	}
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_BYTES(x->b.map, x->a.map, 65536);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);
}

/*
 * max_queue_fences fences in flight on a stalled queue: the next COPY_SUBMIT is EBUSY and
 * changes nothing (its prepared copy stays prepared); once the stall ends all of them complete
 * and the prepared copy gets the next fence.
 */
TEST_F_TIMEOUT(fence, submit_ebusy_past_max_fences, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 8;
	__u32 max = x->info.max_queue_fences, ring = 64, i;
	struct neuron_udma_queue_state st;
	double t_stall;
	__u64 f = 0;
	int ret = 0;

	ASSERT_LE(1U, max);
	ASSERT_GE(4096U, max) {
		TH_LOG("max_queue_fences %u: more than this test fills", max);
	}
	/* Two pairs per fence (a copy and the marker), one more copy, the 16-slot reserve. */
	while (ring < 2 * max + 2 + 16)
		ring *= 2;
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, ring, ring));
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	t_stall = now_ms();
	for (i = 1; i <= max; i++) {
		ret = submit_one(x->fd, ENG, q, ucopy(&x->a, (i % 64) * 64, &x->b, (i % 4096) * 64, 64),
				 &f);
		if (ret || f != i)
			break;
	}
	ASSERT_EQ(max + 1, i) {
		TH_LOG("fence %u of %u: %s, fence %llu", i, max, err_name(ret), (unsigned long long)f);
	}
	ASSERT_EQ(0, prep_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, BUF - 4096, 4096)));
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	ret = copy_submit(x->fd, ENG, q, &f);
	EXPECT_EQ(-EBUSY, ret) {
		TH_LOG("COPY_SUBMIT with %u fences in flight: %s (fence %llu)", max, err_name(ret),
		       (unsigned long long)f);
	}
	ASSERT_UNCHANGED(x->fd, ENG, q, &st);
	EXPECT_FENCE(x->fd, ENG, q, max, NEURON_UDMA_FENCE_PENDING, 0);
	ASSERT_LT(now_ms() - t_stall, (double)STALL_MS) {
		TH_LOG("the host is too slow: the stall ended before the checks");
	}
	TH_LOG("%u fences submitted on the stalled queue in %.0f ms", max, now_ms() - t_stall);

	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ret = fence_wait(x->fd, ENG, q, max, 20000);
	ASSERT_EQ(0, ret) {
		TH_LOG("FENCE_WAIT of fence %u: %s", max, err_name(ret));
	}
	EXPECT_FENCE(x->fd, ENG, q, 1, NEURON_UDMA_FENCE_DONE, 0);
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ((__u64)max + 1, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, f, 20000));
	ASSERT_BYTES(x->b.map + BUF - 4096, x->a.map, 4096);
	ASSERT_EQ(0, queue_state(x->fd, ENG, q, &st));
	EXPECT_EQ(0U, st.resets);
}

/* ---- fences of a queue instance: numbering across QUEUE_INIT, a release under a waiter ---- */

/*
 * Fences belong to a queue instance (one QUEUE_INIT), their numbers to the file's queue id. The
 * same file taking the same id again continues its numbering: the new instance has no fence
 * (COPY_SUBMIT with nothing prepared: 0) until it submits one, numbered after the old ones
 * (here 3), PENDING with completed 0 while stalled, then DONE; an instance without fences uses
 * no number. A fence of a released instance, done or pending then, answers FENCE_STATUS and
 * FENCE_WAIT with ECANCELED (ENOENT while the id is not taken; EINVAL for fence 0 and for a
 * fence never submitted); no QUEUE_EVENTS record of the new instance reports an old completion;
 * the pending copy of the old instance never ran. Another file numbers the id from 1, and so
 * does this file an id it never took; after the other file gave the id back, this file's
 * numbering of it goes on.
 */
/*
 * One 4 KiB copy from @src to @dst at @dst_off on queue @q of @fd, submitted with its own
 * fence, which must be @want; then waits for it. @what names the step in the log.
 */
static void copy_expect_fence(struct __test_metadata *_metadata, int fd, __u32 q,
			      const struct ubuf *src, const struct ubuf *dst, __u64 dst_off,
			      __u64 want, const char *what)
{
	__u64 f = ~0ULL;

	ASSERT_EQ(0, submit_one(fd, ENG, q, ucopy(src, 0, dst, dst_off, 4096), &f));
	EXPECT_EQ(want, f) {
		TH_LOG("%s: fence %llu, not %llu", what, (unsigned long long)f,
		       (unsigned long long)want);
	}
	ASSERT_EQ(0, fence_wait(fd, ENG, q, f, 20000));
}

TEST_F_TIMEOUT(fence, reinit_continues_numbers, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 3, q_unused = 4;
	struct neuron_udma_queue_event ev[8];
	struct neuron_udma_fence_status fs;
	__u64 f = ~0ULL, i, last;
	__u32 count = 0, k;
	struct ubuf oa, ob;
	int fd2, ret;

	/* Instance 1: fence 1 done, fence 2 pending on the stalled queue; released. */
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, 1, 20000));
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 4096, &x->b, 4096, 4096), &f));
	ASSERT_EQ(2ULL, f);
	ASSERT_EQ(0, queue_release(x->fd, ENG, q));
	EXPECT_EQ(-ENOENT, fence_status(x->fd, ENG, q, 1, &fs));
	EXPECT_EQ(-ENOENT, fence_wait(x->fd, ENG, q, 2, 100));

	/* Instance 2: no fence of its own yet; the old ones are cancelled. */
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ(0ULL, f) {
		TH_LOG("COPY_SUBMIT with nothing prepared on a new instance: fence %llu",
		       (unsigned long long)f);
	}
	for (i = 1; i <= 2; i++) {
		ret = fence_status(x->fd, ENG, q, i, &fs);
		EXPECT_EQ(-ECANCELED, ret) {
			TH_LOG("FENCE_STATUS of fence %llu of the released instance: %s (%s)",
			       (unsigned long long)i, err_name(ret),
			       ret ? "" : fence_state_name(fs.state));
		}
		ret = fence_wait(x->fd, ENG, q, i, 100);
		EXPECT_EQ(-ECANCELED, ret) {
			TH_LOG("FENCE_WAIT of fence %llu of the released instance: %s",
			       (unsigned long long)i, err_name(ret));
		}
	}
	EXPECT_EQ(-EINVAL, fence_status(x->fd, ENG, q, 0, &fs));
	EXPECT_EQ(-EINVAL, fence_status(x->fd, ENG, q, 3, &fs));
	EXPECT_EQ(-EINVAL, fence_wait(x->fd, ENG, q, 3, 100));
	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	for (k = 0; k < count; k++) {
		if (ev[k].engine != ENG || ev[k].queue != q)
			continue;
		EXPECT_EQ(0ULL, ev[k].completed) {
			TH_LOG("QUEUE_EVENTS of the new instance: completed %llu",
			       (unsigned long long)ev[k].completed);
		}
	}

	/* Its first fence follows the old ones: PENDING (completed 0) while stalled, then DONE. */
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 8192, &x->b, 8192, 4096), &f));
	EXPECT_EQ(3ULL, f) {
		TH_LOG("the new instance's first fence is %llu, not 3 (the old newest + 1)",
		       (unsigned long long)f);
	}
	last = f;
	ASSERT_EQ(0, fence_status(x->fd, ENG, q, last, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_PENDING, fs.state);
	EXPECT_EQ(0ULL, fs.completed);
	EXPECT_EQ(last, fs.submitted);
	EXPECT_EQ(-ECANCELED, fence_status(x->fd, ENG, q, 2, &fs));
	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ret = fence_wait(x->fd, ENG, q, last, 20000);
	ASSERT_EQ(0, ret) {
		TH_LOG("FENCE_WAIT of the new instance's fence %llu: %s", (unsigned long long)last,
		       err_name(ret));
	}
	ASSERT_EQ(0, fence_status(x->fd, ENG, q, last, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_DONE, fs.state);
	EXPECT_EQ(last, fs.completed);
	EXPECT_EQ(last, fs.submitted);
	EXPECT_EQ(-ECANCELED, fence_status(x->fd, ENG, q, 1, &fs));
	EXPECT_EQ(-ECANCELED, fence_wait(x->fd, ENG, q, 2, 100));
	ASSERT_BYTES(x->b.map, x->a.map, 4096);
	ASSERT_BYTES(x->b.map + 8192, x->a.map + 8192, 4096);
	/* Fence 2's copy never ran (stalled, then released). */
	ASSERT_BYTES(x->b.map + 4096, x->save + 4096, 4096);
	ASSERT_BYTES(x->b.map + 12288, x->save + 12288, BUF - 12288);

	/* Instance 3 submits nothing; instance 4's first fence is the next number. */
	ASSERT_EQ(0, queue_release(x->fd, ENG, q));
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, copy_submit(x->fd, ENG, q, &f));
	EXPECT_EQ(0ULL, f);
	ASSERT_EQ(0, queue_release(x->fd, ENG, q));
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	copy_expect_fence(_metadata, x->fd, q, &x->a, &x->b, 16384, last + 1,
			  "after an instance without fences");
	for (i = 1; i <= last; i++)
		EXPECT_EQ(-ECANCELED, fence_status(x->fd, ENG, q, i, &fs));
	last++;

	/* Another file numbers the id from 1; this file an id it never took from 1. */
	ASSERT_EQ(0, queue_release(x->fd, ENG, q));
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, queue_init(fd2, ENG, q, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &oa));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &ob));
	copy_expect_fence(_metadata, fd2, q, &oa, &ob, 0, 1, "another file's first fence on the id");
	EXPECT_EQ(-ENOENT, fence_status(x->fd, ENG, q, 1, &fs));
	ASSERT_EQ(0, queue_init(x->fd, ENG, q_unused, 64, 64));
	copy_expect_fence(_metadata, x->fd, q_unused, &x->a, &x->b, 20480, 1,
			  "this file's first fence on an id it never took");

	/* The id back to this file: its own numbering goes on. */
	ASSERT_EQ(0, queue_release(fd2, ENG, q));
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	copy_expect_fence(_metadata, x->fd, q, &x->a, &x->b, 24576, last + 1,
			  "this file's fence after the other file's instance");
	EXPECT_EQ(-ECANCELED, fence_status(x->fd, ENG, q, 1, &fs));
	ASSERT_BYTES(x->b.map + 16384, x->a.map, 4096);
	ASSERT_BYTES(x->b.map + 20480, x->a.map, 4096);
	ASSERT_BYTES(x->b.map + 24576, x->a.map, 4096);
	close(fd2);
}

/* A FENCE_WAIT (of @fence) or, with @fence 0, a COPY_WAIT in a thread of its own. */
struct blocked {
	int fd;
	__u32 q;
	__u64 fence;
	int ret;
	double end_ms;		/* when it returned */
	int done;		/* atomic */
};

static void *blocked_wait(void *arg)
{
	struct blocked *w = arg;

	w->ret = w->fence ? fence_wait(w->fd, ENG, w->q, w->fence, 30000) :
			    copy_wait(w->fd, ENG, w->q, 30000, NULL);
	w->end_ms = now_ms();
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool blocked_done(struct blocked *w)
{
	return __atomic_load_n(&w->done, __ATOMIC_ACQUIRE);
}

/*
 * A FENCE_WAIT and a COPY_WAIT (which submits the copy prepared before it) blocked in two
 * threads on a stalled queue that the main thread releases: both return ECANCELED (not ENODEV)
 * promptly; so do they when the main thread takes the same id again at once and a copy of the
 * new instance completes. The cancelled copies never ran.
 */
TEST_F_TIMEOUT(fence, wait_cancelled_by_release, 60)
{
	static const char *const what[2] = { "QUEUE_RELEASE", "QUEUE_RELEASE + QUEUE_INIT" };
	struct fx *x = &self->x;
	const __u32 q = 5;
	struct blocked w[2];
	pthread_t th[2];
	int round, i, ret;
	__u64 f = 0;
	double t0;

	for (round = 0; round < 2; round++) {
		const __u64 off = round * 16 * KIB;

		ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
		ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
		ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, off, &x->b, off, 4096), &f));
		ASSERT_EQ(0, prep_one(x->fd, ENG, q, ucopy(&x->a, off, &x->b, off + 4096, 4096)));
		memset(w, 0, sizeof(w));
		for (i = 0; i < 2; i++) {
			w[i].fd = x->fd;
			w[i].q = q;
			w[i].fence = i ? 0 : f;
			ASSERT_EQ(0, pthread_create(&th[i], NULL, blocked_wait, &w[i]));
		}
		sleep_ms(300);
		for (i = 0; i < 2; i++) {
			ASSERT_FALSE(blocked_done(&w[i])) {
				TH_LOG("%s returned before the release: %s",
				       i ? "COPY_WAIT" : "FENCE_WAIT", err_name(w[i].ret));
			}
		}
		t0 = now_ms();
		ASSERT_EQ(0, queue_release(x->fd, ENG, q));
		if (round) {
			ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
			ASSERT_EQ(0, submit_one(x->fd, ENG, q,
						ucopy(&x->a, off, &x->b, off + 8192, 4096), &f));
			ret = fence_wait(x->fd, ENG, q, f, 20000);
			ASSERT_EQ(0, ret) {
				TH_LOG("the new instance's fence %llu: %s", (unsigned long long)f,
				       err_name(ret));
			}
		}
		while (now_ms() - t0 < SOON_MS && !(blocked_done(&w[0]) && blocked_done(&w[1])))
			sleep_ms(10);
		for (i = 0; i < 2; i++) {
			ASSERT_TRUE(blocked_done(&w[i])) {
				TH_LOG("%s still blocked %u ms after %s",
				       i ? "COPY_WAIT" : "FENCE_WAIT", SOON_MS, what[round]);
			}
			pthread_join(th[i], NULL);
			EXPECT_EQ(-ECANCELED, w[i].ret) {
				TH_LOG("%s blocked while another thread did %s: %s",
				       i ? "COPY_WAIT" : "FENCE_WAIT", what[round],
				       err_name(w[i].ret));
			}
			TH_LOG("%s returned %.0f ms after %s", i ? "COPY_WAIT" : "FENCE_WAIT",
			       w[i].end_ms - t0, what[round]);
		}
		ASSERT_BYTES(x->b.map + off, x->save + off, 8192);
		if (round)
			ASSERT_BYTES(x->b.map + off + 8192, x->a.map + off, 4096);
	}
}

/* ---- events: poll()/epoll, QUEUE_EVENTS, the eventfd of a queue ---- */

FIXTURE(events) {
	struct fx x;
	int ep;
};

FIXTURE_SETUP(events)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDNORM | EPOLLPRI };

	fx_setup(_metadata, &self->x);
	self->ep = epoll_create1(EPOLL_CLOEXEC);
	ASSERT_LE(0, self->ep);
	ev.data.fd = self->x.fd;
	ASSERT_EQ(0, epoll_ctl(self->ep, EPOLL_CTL_ADD, self->x.fd, &ev));
}

FIXTURE_TEARDOWN_PARENT(events)
{
	model_clear();
}

/* epoll_wait on @ep for at most @ms: the events of the one ready file (0: none), or -errno. */
static int ep_wait(int ep, int ms, __u32 *events)
{
	struct epoll_event out[4];
	double t0 = now_ms();
	int n;

	*events = 0;
	do {
		int left = ms - (int)(now_ms() - t0);

		n = epoll_wait(ep, out, 4, left > 0 ? left : 0);
	} while (n < 0 && errno == EINTR && now_ms() - t0 < ms);
	if (n < 0)
		return -errno;
	if (n > 0)
		*events = out[0].events;
	return n;
}

#define EV_FAIL_BITS (EPOLLPRI | EPOLLERR)
#define EV_DONE_BITS (EPOLLIN | EPOLLRDNORM)

/*
 * poll()/epoll and QUEUE_EVENTS (nothing else waits, so the driver's completion engine is what
 * notices): no event while the only fence is stalled; EPOLLIN | EPOLLRDNORM soon after the
 * stall ends; one QUEUE_EVENTS record (COMPLETED, completed = the fence), after which epoll has
 * nothing; an engine error gives EPOLLPRI | EPOLLERR (no EPOLLIN) and a FAILED record (failed =
 * the fence, error EIO, completed the fence before); the queue's next completion is an event
 * again.
 */
TEST_F_TIMEOUT(events, epoll_completion_and_failure, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 9;
	struct neuron_udma_queue_event ev[8];
	struct pollfd p;
	__u32 count = ~0U, got = 0;
	double t0;
	__u64 f = 0;
	int n;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	EXPECT_EQ(0, ep_wait(self->ep, 0, &got)) {
		TH_LOG("an event before any fence: %#x", got);
	}

	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	n = ep_wait(self->ep, 300, &got);
	EXPECT_EQ(0, n) {
		TH_LOG("event %#x while the only fence is stalled", got);
	}
	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	EXPECT_EQ(0U, count);

	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	t0 = now_ms();
	n = ep_wait(self->ep, SOON_MS, &got);
	ASSERT_EQ(1, n) {
		TH_LOG("no event within %u ms of the stall's end", SOON_MS);
	}
	TH_LOG("EPOLLIN %.0f ms after the stall ended", now_ms() - t0);
	EXPECT_EQ((__u32)EV_DONE_BITS, got & (EV_DONE_BITS | EV_FAIL_BITS)) {
		TH_LOG("events %#x", got);
	}
	p = (struct pollfd){ .fd = x->fd, .events = POLLIN | POLLRDNORM | POLLPRI };
	ASSERT_EQ(1, poll(&p, 1, 0));
	EXPECT_EQ(POLLIN | POLLRDNORM, p.revents);
	ASSERT_BYTES(x->b.map, x->a.map, 4096);

	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	ASSERT_EQ(1U, count);
	EXPECT_EQ(ENG, ev[0].engine);
	EXPECT_EQ(q, ev[0].queue);
	EXPECT_EQ((__u32)NEURON_UDMA_EVENT_COMPLETED, ev[0].flags);
	EXPECT_EQ(1ULL, ev[0].completed);
	EXPECT_EQ(0ULL, ev[0].failed);
	EXPECT_EQ(0, ev[0].error);
	/* Reported: nothing left to show. */
	EXPECT_EQ(0, ep_wait(self->ep, 0, &got)) {
		TH_LOG("event %#x after QUEUE_EVENTS reported everything", got);
	}
	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	EXPECT_EQ(0U, count);

	/* An engine error on the queue's next copy. */
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_FAIL_NTH, ENG, q, 1));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 4096, &x->b, 4096, 4096), &f));
	ASSERT_EQ(2ULL, f);
	t0 = now_ms();
	n = ep_wait(self->ep, SOON_MS, &got);
	ASSERT_EQ(1, n) {
		TH_LOG("no event within %u ms of the engine error", SOON_MS);
	}
	TH_LOG("failure event %#x after %.0f ms", got, now_ms() - t0);
	EXPECT_EQ((__u32)EV_FAIL_BITS, got & (EV_DONE_BITS | EV_FAIL_BITS)) {
		TH_LOG("events %#x", got);
	}
	EXPECT_EQ(ERR_INJECTED_FAIL, bar2_read(&x->bar2, BAR2_LAST_ERROR));
	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	ASSERT_EQ(1U, count);
	EXPECT_EQ(ENG, ev[0].engine);
	EXPECT_EQ(q, ev[0].queue);
	EXPECT_EQ((__u32)NEURON_UDMA_EVENT_FAILED, ev[0].flags);
	EXPECT_EQ(2ULL, ev[0].failed);
	EXPECT_EQ(EIO, ev[0].error);
	EXPECT_EQ(1ULL, ev[0].completed);
	EXPECT_EQ(0, ep_wait(self->ep, 0, &got)) {
		TH_LOG("event %#x after the failure was reported", got);
	}
	EXPECT_FENCE(x->fd, ENG, q, 2, NEURON_UDMA_FENCE_FAILED, EIO);
	ASSERT_BYTES(x->b.map + 4096, x->save + 4096, BUF - 4096);

	/* The queue works again, and its next completion is an event again. */
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 8192, &x->b, 8192, 4096), &f));
	ASSERT_EQ(3ULL, f);
	n = ep_wait(self->ep, SOON_MS, &got);
	ASSERT_EQ(1, n);
	EXPECT_EQ((__u32)EV_DONE_BITS, got & (EV_DONE_BITS | EV_FAIL_BITS));
	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	ASSERT_EQ(1U, count);
	EXPECT_EQ(NEURON_UDMA_EVENT_COMPLETED, ev[0].flags & (NEURON_UDMA_EVENT_COMPLETED |
							      NEURON_UDMA_EVENT_FAILED));
	EXPECT_EQ(3ULL, ev[0].completed);
	ASSERT_BYTES(x->b.map + 8192, x->a.map + 8192, 4096);
}

/*
 * QUEUE_EVENTS reports at most @max queues: max 0 reports (and clears) nothing, max 1 of two
 * queues with completions reports one and leaves the other to show in poll() and the next
 * call; a bad pointer to the argument is EFAULT. Completions a FENCE_WAIT noticed are events
 * too.
 */
TEST_F_TIMEOUT(events, queue_events_max, 60)
{
	struct fx *x = &self->x;
	const __u32 q1 = 10, q2 = 11;
	struct neuron_udma_queue_event ev[8];
	__u32 count = ~0U, got = 0;
	bool seen1 = false, seen2 = false;
	__u64 f = 0;
	int i;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q1, 64, 64));
	ASSERT_EQ(0, queue_init(x->fd, ENG, q2, 64, 64));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q1, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, submit_one(x->fd, ENG, q2, ucopy(&x->a, 4096, &x->b, 4096, 4096), &f));
	ASSERT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q1, 1, 20000));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q2, 1, 20000));
	ASSERT_EQ(1, ep_wait(self->ep, SOON_MS, &got));
	EXPECT_TRUE(!!(got & EPOLLIN));

	/* max 0: nothing reported, nothing cleared. */
	ASSERT_EQ(0, queue_events(x->fd, NULL, 0, &count));
	EXPECT_EQ(0U, count);
	ASSERT_EQ(1, ep_wait(self->ep, 0, &got)) {
		TH_LOG("QUEUE_EVENTS with max 0 cleared the events");
	}
	/* A bad pointer to the argument itself. */
	EXPECT_EQ(-EFAULT, udma_ioc(x->fd, NEURON_UDMA_QUEUE_EVENTS, (void *)8));
	ASSERT_EQ(1, ep_wait(self->ep, 0, &got));

	/* max 1 of 2: one record, the other queue's stays. */
	memset(ev, 0xa5, sizeof(ev));
	ASSERT_EQ(0, queue_events(x->fd, ev, 1, &count));
	ASSERT_EQ(1U, count);
	/* Only one record written. */
	EXPECT_EQ(0xa5a5a5a5U, ev[1].engine);
	ASSERT_EQ(1, ep_wait(self->ep, 0, &got)) {
		TH_LOG("the second queue's completion was cleared by a call that did not report it");
	}
	EXPECT_TRUE(!!(got & EPOLLIN));
	ASSERT_EQ(0, queue_events(x->fd, ev + 1, 7, &count));
	ASSERT_EQ(1U, count);
	for (i = 0; i < 2; i++) {
		EXPECT_EQ(ENG, ev[i].engine);
		EXPECT_EQ((__u32)NEURON_UDMA_EVENT_COMPLETED, ev[i].flags);
		EXPECT_EQ(1ULL, ev[i].completed);
		seen1 |= ev[i].queue == q1;
		seen2 |= ev[i].queue == q2;
	}
	EXPECT_TRUE(seen1 && seen2) {
		TH_LOG("records of queues %u and %u, not %u and %u", ev[0].queue, ev[1].queue, q1, q2);
	}
	EXPECT_EQ(0, ep_wait(self->ep, 0, &got));
	ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
	EXPECT_EQ(0U, count);
}

/*
 * QUEUE_EVENTS into an array it cannot write: EFAULT, and the events it could not deliver are
 * not lost (poll() still shows them, the next call reports them).
 */
TEST_F_TIMEOUT(events, queue_events_efault_keeps_events, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 12;
	struct neuron_udma_queue_event ev[4];
	__u32 count = ~0U, got = 0;
	__u64 f = 0;
	void *ro;

	ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, ro);
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, f, 20000));
	ASSERT_EQ(1, ep_wait(self->ep, SOON_MS, &got));

	EXPECT_EQ(-EFAULT, queue_events(x->fd, (void *)8, 4, &count));
	EXPECT_EQ(-EFAULT, queue_events(x->fd, ro, 4, &count));
	EXPECT_EQ(1, ep_wait(self->ep, 0, &got)) {
		TH_LOG("a QUEUE_EVENTS that failed with EFAULT cleared the events");
	}
	ASSERT_EQ(0, queue_events(x->fd, ev, 4, &count));
	EXPECT_EQ(1U, count) {
		TH_LOG("the completion was lost with the EFAULT");
	}
	EXPECT_EQ(q, ev[0].queue);
	EXPECT_EQ(1ULL, ev[0].completed);
	munmap(ro, 4096);
}

#define EFD_FENCES 8

/*
 * An eventfd on a queue counts its settled fences: 8 fences (copy + COPY_SUBMIT each, then
 * FENCE_WAIT of the last) add up to 8, and no more arrive later; after unregistering (fd -1)
 * fences add nothing; registering a second eventfd replaces the first (only it counts).
 */
TEST_F_TIMEOUT(events, eventfd_counts_fences, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 13;
	int efd, efd2, i, ret = 0;
	__u64 f = 0, total = 0, total2 = 0;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 256, 256));
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	efd2 = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_LE(0, efd);
	ASSERT_LE(0, efd2);
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, efd));
	EXPECT_EQ(0ULL, efd_collect(efd, 1, 100));

	for (i = 1; i <= EFD_FENCES; i++) {
		ret = submit_one(x->fd, ENG, q, ucopy(&x->a, i * 4096, &x->b, i * 4096, 4096), &f);
		if (ret || f != (__u64)i)
			break;
	}
	ASSERT_EQ(EFD_FENCES + 1, i) {
		TH_LOG("fence %d: %s, %llu", i, err_name(ret), (unsigned long long)f);
	}
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, EFD_FENCES, 20000));
	total = efd_collect(efd, EFD_FENCES, SOON_MS);
	EXPECT_EQ((__u64)EFD_FENCES, total);
	/* No more later. */
	sleep_ms(300);
	ASSERT_EQ(0, efd_drain(efd, &total));
	EXPECT_EQ((__u64)EFD_FENCES, total);
	ASSERT_BYTES(x->b.map + 4096, x->a.map + 4096, EFD_FENCES * 4096);

	/* Unregistered: nothing counts any more (unregistering twice is fine). */
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, -1));
	EXPECT_EQ(0, queue_eventfd(x->fd, ENG, q, -1));
	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, f, 20000));
	sleep_ms(300);
	total = 0;
	ASSERT_EQ(0, efd_drain(efd, &total));
	EXPECT_EQ(0ULL, total) {
		TH_LOG("the unregistered eventfd counted %llu more", (unsigned long long)total);
	}

	/* A second registration replaces the first. */
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, efd));
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, efd2));
	for (i = 0; i < 2; i++)
		ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, f, 20000));
	total2 = efd_collect(efd2, 2, SOON_MS);
	sleep_ms(300);
	ASSERT_EQ(0, efd_drain(efd2, &total2));
	total = 0;
	ASSERT_EQ(0, efd_drain(efd, &total));
	EXPECT_EQ(2ULL, total2);
	EXPECT_EQ(0ULL, total) {
		TH_LOG("the replaced eventfd counted %llu", (unsigned long long)total);
	}
	close(efd);
	close(efd2);
}

/*
 * COPY_WAIT tells the queue's listeners of the fence it settled before it returns (the caller
 * looks at the queue itself; the completion engine is not started for an idle queue): right
 * after each of 20 waits the eventfd reads 1 and epoll_wait with no timeout reports EPOLLIN
 * (the file's wait queue was woken: epoll polls only a file on its ready list). QUEUE_EVENTS
 * and an empty epoll_wait then clear both before the next round. The queue's debugfs line shows
 * that the completion engine was never asked to watch it.
 */
TEST_F_TIMEOUT(events, copy_wait_tells_listeners_first, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 10;
	struct neuron_udma_queue_event ev[8];
	__u32 count, got = 0;
	__u64 v;
	int efd, i, n;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_LE(0, efd);
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, efd));
	if (queue_watches(ENG, q) < 0)
		SKIP(return, "no debugfs queues file with the queue's listeners line");
	ASSERT_EQ(0, queue_watches(ENG, q));
	for (i = 0; i < 20; i++) {
		ASSERT_EQ(0, prep_one(x->fd, ENG, q, ucopy(&x->a, i * 64, &x->b, i * 64, 64)));
		ASSERT_EQ(0, copy_wait(x->fd, ENG, q, 20000, NULL));
		v = 0;
		EXPECT_EQ((ssize_t)sizeof(v), read(efd, &v, sizeof(v))) {
			TH_LOG("round %d: the eventfd was not signalled when COPY_WAIT returned: %s", i,
			       strerror(errno));
		}
		EXPECT_EQ(1ULL, v);
		n = ep_wait(self->ep, 0, &got);
		EXPECT_EQ(1, n) {
			TH_LOG("round %d: no epoll event when COPY_WAIT returned", i);
		}
		EXPECT_EQ((__u32)EV_DONE_BITS, got & (EV_DONE_BITS | EV_FAIL_BITS));
		count = ~0U;
		ASSERT_EQ(0, queue_events(x->fd, ev, 8, &count));
		EXPECT_EQ(1U, count);
		EXPECT_EQ(0, ep_wait(self->ep, 0, &got)) {
			TH_LOG("round %d: an event %#x after QUEUE_EVENTS", i, got);
		}
	}
	ASSERT_BYTES(x->b.map, x->a.map, 20 * 64);
	EXPECT_EQ(0, queue_watches(ENG, q)) {
		TH_LOG("COPY_WAIT had the completion engine watch the idle queue");
	}
	close(efd);
}

/*
 * QUEUE_EVENTFD refuses a descriptor that is not an eventfd (a pipe: EINVAL), one that is not
 * open (EBADF), a reserved field (EINVAL) and a queue the file does not have (ENOENT); none of
 * them replaces or drops the eventfd registered before (on this file's queue, or on the other
 * file's).
 */
TEST_F_TIMEOUT(events, eventfd_errors, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 14, q_other = 11;
	struct neuron_udma_eventfd e;
	struct ubuf oa, ob;
	int efd, efd_other, efd_spare, closed, p[2], fd2;
	__u64 f = 0, total = 0;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	efd_other = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	efd_spare = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_LE(0, efd);
	ASSERT_LE(0, efd_other);
	ASSERT_LE(0, efd_spare);
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, efd));

	ASSERT_EQ(0, pipe2(p, O_CLOEXEC | O_NONBLOCK));
	EXPECT_EQ(-EINVAL, queue_eventfd(x->fd, ENG, q, p[0]));
	EXPECT_EQ(-EINVAL, queue_eventfd(x->fd, ENG, q, p[1]));
	EXPECT_EQ(-EINVAL, queue_eventfd(x->fd, ENG, q, x->fd));
	closed = dup(efd_spare);
	ASSERT_LE(0, closed);
	ASSERT_EQ(0, close(closed));
	EXPECT_EQ(-EBADF, queue_eventfd(x->fd, ENG, q, closed));
	EXPECT_EQ(-EBADF, queue_eventfd(x->fd, ENG, q, -2));
	e = (struct neuron_udma_eventfd){ .engine = ENG, .queue = q, .fd = efd_spare, .reserved = 1 };
	EXPECT_EQ(-EINVAL, udma_ioc(x->fd, NEURON_UDMA_QUEUE_EVENTFD, &e));

	/* Another file's queue, with its own eventfd; a queue nobody took. */
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, queue_init(fd2, ENG, q_other, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &oa));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &ob));
	ASSERT_EQ(0, queue_eventfd(fd2, ENG, q_other, efd_other));
	EXPECT_EQ(-ENOENT, queue_eventfd(x->fd, ENG, q_other, efd_spare));
	EXPECT_EQ(-ENOENT, queue_eventfd(x->fd, ENG, q_other, -1));
	EXPECT_EQ(-ENOENT, queue_eventfd(fd2, ENG, q, efd_spare));
	EXPECT_EQ(-ENOENT, queue_eventfd(fd2, ENG, q, -1));
	EXPECT_EQ(-ENOENT, queue_eventfd(x->fd, ENG, 1, efd_spare));

	/* Both registrations are intact: each eventfd counts its own queue's fence, once. */
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 0, 4096), &f));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, f, 20000));
	ASSERT_EQ(0, submit_one(fd2, ENG, q_other, ucopy(&oa, 0, &ob, 0, 4096), &f));
	ASSERT_EQ(0, fence_wait(fd2, ENG, q_other, f, 20000));
	EXPECT_EQ(1ULL, efd_collect(efd, 1, SOON_MS)) {
		TH_LOG("a refused QUEUE_EVENTFD dropped this queue's eventfd");
	}
	EXPECT_EQ(1ULL, efd_collect(efd_other, 1, SOON_MS)) {
		TH_LOG("another file's QUEUE_EVENTFD dropped this queue's eventfd");
	}
	sleep_ms(200);
	ASSERT_EQ(0, efd_drain(efd_spare, &total));
	EXPECT_EQ(0ULL, total);
	close(fd2);
	close(p[0]);
	close(p[1]);
	close(efd);
	close(efd_other);
	close(efd_spare);
}

/*
 * QUEUE_RELEASE of a queue with a registered eventfd (of which the process closed every
 * descriptor: only the driver's reference keeps it) and fences in flight on a stalled queue
 * returns promptly and the queue is gone (ENOENT); closing a file with a queue in the same
 * state (its eventfd still open here) returns promptly too, and that eventfd never counts more
 * fences than there were. Once the stalls end both queues can be taken again and copy (the
 * released queue's fences numbered on from 4, the closed file's queue, new to this file, from 1).
 * No hang, no crash (the gate checks the kernel log).
 */
TEST_F_TIMEOUT(events, release_and_close_with_eventfd, 60)
{
	struct fx *x = &self->x;
	const __u32 q = 1, q2 = 2;
	struct neuron_udma_fence_status fs;
	struct ubuf oa, ob;
	int efd, efd2, fd2, i, ret = -1;
	__u64 f = 0, total = 0;
	double t0, dt;

	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_LE(0, efd);
	ASSERT_EQ(0, queue_eventfd(x->fd, ENG, q, efd));
	ASSERT_EQ(0, close(efd));
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, bar2_add_fault(&x->bar2, FAULT_STALL, ENG, q2, STALL_MS));
	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, i * 4096, &x->b, i * 4096, 4096),
					&f));
	ASSERT_EQ(3ULL, f);
	t0 = now_ms();
	ret = queue_release(x->fd, ENG, q);
	dt = now_ms() - t0;
	ASSERT_EQ(0, ret) {
		TH_LOG("QUEUE_RELEASE with fences in flight: %s", err_name(ret));
	}
	TH_LOG("QUEUE_RELEASE with 3 fences in flight and an eventfd: %.0f ms", dt);
	EXPECT_LT(dt, 5000.0);
	EXPECT_EQ(-ENOENT, fence_status(x->fd, ENG, q, 1, &fs));
	EXPECT_EQ(-ENOENT, queue_eventfd(x->fd, ENG, q, -1));

	/* A second file in the same state, closed. */
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, queue_init(fd2, ENG, q2, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &oa));
	ASSERT_EQ(0, ubuf_host(fd2, 64 * KIB, &ob));
	efd2 = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ASSERT_LE(0, efd2);
	ASSERT_EQ(0, queue_eventfd(fd2, ENG, q2, efd2));
	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, submit_one(fd2, ENG, q2, ucopy(&oa, i * 4096, &ob, i * 4096, 4096), &f));
	/* The mappings hold the file: without them the close releases it. */
	munmap(oa.map, oa.size);
	munmap(ob.map, ob.size);
	t0 = now_ms();
	ASSERT_EQ(0, close(fd2));
	dt = now_ms() - t0;
	TH_LOG("close with 3 fences in flight and an eventfd: %.0f ms", dt);
	EXPECT_LT(dt, 5000.0);
	total = 0;
	ASSERT_EQ(0, efd_drain(efd2, &total));
	EXPECT_GE(3ULL, total);

	/* The stalls end: both queues can be taken again (the closed file's once released). */
	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, queue_init(x->fd, ENG, q, 64, 64));
	t0 = now_ms();
	while (now_ms() - t0 < SOON_MS) {
		ret = queue_init(x->fd, ENG, q2, 64, 64);
		if (ret != -EBUSY)
			break;
		sleep_ms(50);
	}
	ASSERT_EQ(0, ret) {
		TH_LOG("the closed file's queue: QUEUE_INIT %s", err_name(ret));
	}
	/* The file's fence numbers on this id go on after the released instance's 1..3. */
	ASSERT_EQ(0, submit_one(x->fd, ENG, q, ucopy(&x->a, 0, &x->b, 64 * KIB, 4096), &f));
	EXPECT_EQ(4ULL, f);
	EXPECT_EQ(-ECANCELED, fence_status(x->fd, ENG, q, 3, &fs));
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q, f, 20000));
	ASSERT_EQ(0, submit_one(x->fd, ENG, q2, ucopy(&x->a, 0, &x->b, 128 * KIB, 4096), &f));
	EXPECT_EQ(1ULL, f);
	ASSERT_EQ(0, fence_wait(x->fd, ENG, q2, f, 20000));
	ASSERT_BYTES(x->b.map + 64 * KIB, x->a.map, 4096);
	ASSERT_BYTES(x->b.map + 128 * KIB, x->a.map, 4096);
	/* Nothing the closed file's queue left behind counts on its eventfd later. */
	sleep_ms(200);
	ASSERT_EQ(0, efd_drain(efd2, &total));
	EXPECT_GE(3ULL, total);
	close(efd2);
}

/* ---- another uid ---- */

FIXTURE(isolation) {
	struct fx x;
};

FIXTURE_SETUP(isolation)
{
	fx_setup(_metadata, &self->x);
	ASSERT_EQ(0, sec_setup(0666));
}

FIXTURE_TEARDOWN_PARENT(isolation)
{
	model_clear();
}

/* What uid 1002 got from each call on uid 1001's queue, and what uid 1001 saw. */
enum { B_STATUS, B_STATUS2, B_WAIT, B_SUBMIT, B_EFD, B_EFD_OFF, B_STATE, B_RELEASE, B_INIT,
	B_EVENTS, B_POLL, B_CALLS };

static const char *const b_call_names[B_CALLS] = {
	"FENCE_STATUS", "FENCE_STATUS(2)", "FENCE_WAIT", "COPY_SUBMIT", "QUEUE_EVENTFD",
	"QUEUE_EVENTFD(-1)", "QUEUE_STATE", "QUEUE_RELEASE", "QUEUE_INIT", "QUEUE_EVENTS count",
	"poll revents",
};

static const int b_call_want[B_CALLS] = {
	-ENOENT, -ENOENT, -ENOENT, -ENOENT, -ENOENT, -ENOENT, -ENOENT, -ENOENT, -EBUSY, 0, 0,
};

struct iso_report {
	int a_step;		/* the step of uid 1001 that failed (0: none) */
	int a_err;
	__u64 a_efd_count;
	char a_why[256];	/* what changed in the queue's state, for step 13 */
	int b_ret[B_CALLS];
};

#define ISO_Q 3U

struct iso_a_arg {
	struct iso_report *r;
	int ready, go;		/* pipe ends: to the parent, from the parent */
};

/*
 * uid 1001: a queue with fence 1 pending (the parent stalls it), an eventfd on it; tells the
 * parent, waits while uid 1002 tries; then its queue must be as it left it, and once the parent
 * ended the stall the fence completes and the eventfd counts exactly it.
 */
static int iso_owner(void *arg)
{
	struct iso_a_arg *a = arg;
	struct iso_report *r = a->r;
	struct neuron_udma_queue_state st, now;
	struct neuron_udma_fence_status fs;
	struct ubuf s, d;
	char why[256];
	int fd, efd, ret;
	__u64 f = 0;

#define A_STEP(n, expr) do {						\
		ret = (expr);						\
		if (ret) {						\
			r->a_step = (n);				\
			r->a_err = ret;					\
			return 1;					\
		}							\
	} while (0)

	fd = udma_open();
	A_STEP(1, fd < 0 ? -errno : 0);
	A_STEP(2, queue_init(fd, ENG, ISO_Q, 64, 64));
	A_STEP(3, ubuf_host(fd, 64 * KIB, &s));
	A_STEP(4, ubuf_host(fd, 64 * KIB, &d));
	fill_pattern(s.map, 64 * KIB, 7);
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	A_STEP(5, efd < 0 ? -errno : 0);
	A_STEP(6, queue_eventfd(fd, ENG, ISO_Q, efd));
	/* The parent stalls the queue now that it exists (QUEUE_INIT resets the queue). */
	A_STEP(30, pipe_say(a->ready));
	A_STEP(31, pipe_wait(a->go, 30000));
	A_STEP(7, submit_one(fd, ENG, ISO_Q, ucopy(&s, 0, &d, 0, 4096), &f));
	A_STEP(8, f == 1 ? 0 : -ERANGE);
	A_STEP(9, queue_state(fd, ENG, ISO_Q, &st));
	A_STEP(10, pipe_say(a->ready));
	A_STEP(11, pipe_wait(a->go, 30000));
	/* uid 1002 is done: nothing of this queue changed. */
	A_STEP(12, queue_state(fd, ENG, ISO_Q, &now));
	if (state_diff(&st, &now, why, sizeof(why)))
		snprintf(r->a_why, sizeof(r->a_why), "%s", why);
	A_STEP(13, r->a_why[0] ? -EPERM : 0);
	A_STEP(14, fence_status(fd, ENG, ISO_Q, 1, &fs));
	A_STEP(15, fs.state == NEURON_UDMA_FENCE_PENDING && fs.submitted == 1 ? 0 : -EPERM);
	A_STEP(16, pipe_say(a->ready));
	A_STEP(17, pipe_wait(a->go, 30000));
	/* The stall is over. */
	A_STEP(18, fence_wait(fd, ENG, ISO_Q, 1, 20000));
	A_STEP(19, first_diff(s.map, d.map, 4096) < 0 ? 0 : -EIO);
	r->a_efd_count = efd_collect(efd, 1, SOON_MS);
	sleep_ms(200);
	A_STEP(20, efd_drain(efd, &r->a_efd_count));
	A_STEP(21, r->a_efd_count == 1 ? 0 : -ERANGE);
	A_STEP(22, queue_state(fd, ENG, ISO_Q, &now));
	A_STEP(23, now.resets == 0 ? 0 : -EPERM);
#undef A_STEP
	return 0;
}

/* uid 1002, with a file of its own: every new call on uid 1001's queue. */
static int iso_other(void *arg)
{
	struct iso_report *r = arg;
	struct neuron_udma_queue_event ev[4];
	struct neuron_udma_fence_status fs;
	struct neuron_udma_queue_state st;
	struct pollfd p;
	__u32 count = ~0U;
	int fd, efd, i;
	__u64 f = 0;

	for (i = 0; i < B_CALLS; i++)
		r->b_ret[i] = 1;
	fd = udma_open();
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (fd < 0 || efd < 0)
		return 2;
	r->b_ret[B_STATUS] = fence_status(fd, ENG, ISO_Q, 1, &fs);
	r->b_ret[B_STATUS2] = fence_status(fd, ENG, ISO_Q, 2, &fs);
	r->b_ret[B_WAIT] = fence_wait(fd, ENG, ISO_Q, 1, 100);
	r->b_ret[B_SUBMIT] = copy_submit(fd, ENG, ISO_Q, &f);
	r->b_ret[B_EFD] = queue_eventfd(fd, ENG, ISO_Q, efd);
	r->b_ret[B_EFD_OFF] = queue_eventfd(fd, ENG, ISO_Q, -1);
	r->b_ret[B_STATE] = queue_state(fd, ENG, ISO_Q, &st);
	r->b_ret[B_RELEASE] = queue_release(fd, ENG, ISO_Q);
	r->b_ret[B_INIT] = queue_init(fd, ENG, ISO_Q, 64, 64);
	/* The other file's completions are not this file's events. */
	r->b_ret[B_EVENTS] = queue_events(fd, ev, 4, &count);
	if (!r->b_ret[B_EVENTS])
		r->b_ret[B_EVENTS] = (int)count;
	p = (struct pollfd){ .fd = fd, .events = POLLIN | POLLPRI };
	r->b_ret[B_POLL] = poll(&p, 1, 0) < 0 ? -errno : p.revents;
	for (i = 0; i < B_CALLS; i++)
		if (r->b_ret[i] != b_call_want[i])
			return 3;
	return 0;
}

/*
 * A file of uid 1002 names the queue of a file of uid 1001 (with a pending fence and an
 * eventfd) in FENCE_STATUS, FENCE_WAIT, COPY_SUBMIT and QUEUE_EVENTFD: ENOENT each (EBUSY for
 * QUEUE_INIT), no events of it on its own file; uid 1001's queue, fence and eventfd are
 * unchanged and its fence completes once the stall ends.
 */
TEST_F_TIMEOUT(isolation, other_uid_fence_calls_enoent, 60)
{
	struct fx *x = &self->x;
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
	if (pipe_wait(ready[0], 20000)) {
		TH_LOG("uid %d did not make its queue: step %d, %s", UID_A, r->a_step,
		       err_name(r->a_err));
		kill(a, SIGKILL);
		ASSERT_TRUE(false);
	}
	/*
	 * Stalled once the queue exists (its QUEUE_INIT resets it), ended by BAR2_CLEAR below: long
	 * enough for both users under a debug kernel.
	 */
	ASSERT_EQ(0, bar2_fault(&x->bar2, FAULT_STALL, ENG, ISO_Q, 3 * STALL_MS));
	ASSERT_EQ(0, pipe_say(go[1]));
	if (pipe_wait(ready[0], 20000)) {
		TH_LOG("uid %d did not set up its queue: step %d, %s", UID_A, r->a_step,
		       err_name(r->a_err));
		kill(a, SIGKILL);
		ASSERT_TRUE(false);
	}
	rc_b = sec_reap(sec_spawn(UID_B, iso_other, r));
	EXPECT_EQ(0, rc_b);
	for (i = 0; i < B_CALLS; i++) {
		EXPECT_EQ(b_call_want[i], r->b_ret[i]) {
			TH_LOG("uid %d, %s on uid %d's queue: %d (%s), want %s", UID_B,
			       b_call_names[i], UID_A, r->b_ret[i],
			       r->b_ret[i] < 0 ? err_name(r->b_ret[i]) : "-",
			       err_name(b_call_want[i]));
		}
	}
	if (pipe_say(go[1]) || pipe_wait(ready[0], 20000)) {
		rc_a = sec_reap(a);
		TH_LOG("uid %d (exit %d) after uid %d's calls: step %d failed: %s %s", UID_A, rc_a,
		       UID_B, r->a_step, err_name(r->a_err), r->a_why);
		ASSERT_TRUE(false);
	}
	bar2_write(&x->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, pipe_say(go[1]));
	rc_a = sec_reap(a);
	EXPECT_EQ(0, rc_a) {
		TH_LOG("uid %d: step %d failed: %s (eventfd count %llu)", UID_A, r->a_step,
		       err_name(r->a_err), (unsigned long long)r->a_efd_count);
	}
}

TEST_HARNESS_MAIN
