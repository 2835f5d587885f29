// SPDX-License-Identifier: GPL-2.0
/*
 * What pinned memory costs an unprivileged user, and when the charge comes back
 * (Documentation/userspace-api.rst, "Security model"; the charges go to the user_struct's
 * locked_vm): host buffers and queues are charged for all the coherent memory behind them (a
 * power-of-two block per buffer, at least a page per ring), a closed file's orphaned MEMCPY
 * gives its charge back once the engine is done with it, an unbind gives back everything of a
 * file that outlives it; and a stuck shared queue whose completion slots all belong to orphans
 * is reset.
 *
 * Each test fails when the driver breaks the rule it checks. Queues are on engine 13 (and
 * 20-23), host-connected on v2 and v3 and unused by the other tests; stalls come from the
 * device model's BAR2 window, mapped by root before the test drops to an unprivileged uid.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL
#define MIB (1024UL * 1024)

static __u32 h2t_engine(const struct neuron_udma_info *info)
{
	return info->generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
}

/* ---- host buffers pin more than they charge (power-of-two coherent allocations) ---- */

#define ROUND_LIMIT (32 * MIB)
#define ROUND_SIZE (2 * MIB + 4 * KIB)	/* charged 513 pages; dma-direct takes order 10 */

struct round_report {
	int step, err, count;
	long avail_before, avail_after;
};

static int round_child(void *arg)
{
	struct round_report *r = arg;
	__u64 h;
	int fd, ret;

	r->step = 1;
	fd = udma_open();
	if (fd < 0)
		return r->err = fd, 2;
	r->avail_before = mem_available_kib();
	while (r->count < 64) {
		ret = raw_alloc(fd, NEURON_UDMA_MEM_HOST, ROUND_SIZE, &h, NULL);
		if (ret) {
			r->err = ret;
			break;
		}
		r->count++;
	}
	r->avail_after = mem_available_kib();
	r->step = 2;
	close(fd);
	return 0;
}

/*
 * Security model: host buffers are "charged to the allocating user's locked memory and limited
 * by RLIMIT_MEMLOCK". The charge is size rounded up to pages, but the coherent allocation behind
 * a buffer is a power-of-two block (dma-direct, get_order): a user whose buffers are just over
 * a power of two pins close to twice RLIMIT_MEMLOCK.
 */
TEST(host_buffers_pin_at_most_memlock)
{
	struct round_report *r = sec_shared(sizeof(*r));
	long pinned_kib;
	pid_t pid;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	/* Above the default hard limit: raised as root, inherited by the unprivileged child. */
	ASSERT_EQ(0, sec_memlock(ROUND_LIMIT));
	pid = sec_spawn(UID_A, round_child, r);
	ASSERT_LT(0, pid);
	ASSERT_EQ(0, sec_reap(pid)) {
		TH_LOG("child failed at step %d: %s", r->step, strerror(-r->err));
	}
	pinned_kib = r->avail_before - r->avail_after;
	TH_LOG("RLIMIT_MEMLOCK %lu KiB: %d buffers of %lu KiB (then %s), charged %lu KiB, MemAvailable dropped by %ld KiB",
	       ROUND_LIMIT / KIB, r->count, ROUND_SIZE / KIB, strerror(-r->err),
	       r->count * ROUND_SIZE / KIB, pinned_kib);
	EXPECT_EQ(-ENOMEM, r->err);
	/* 4 MiB of slack for unrelated activity in the guest. */
	EXPECT_LE(pinned_kib, (long)((ROUND_LIMIT + 4 * MIB) / KIB));
	munmap(r, sizeof(*r));
}

/* ---- a closed file's settled MEMCPY orphan keeps its charge until somebody reaps ---- */

#define ORPH_LIMIT (8 * MIB)
#define ORPH_ENGINE 13

struct orph_report {
	int step, err;
	int memcpy_ret, queue_ret, queue_ret_after_alloc, alloc_ret;
};

static struct ubar2 orph_bar2;
static __u32 orph_h2t;

static int orph_child(void *arg)
{
	struct orph_report *r = arg;
	struct ubuf a = { 0 }, b = { 0 }, c;
	int fd, fd2;

	r->step = 1;
	if (sec_memlock(ORPH_LIMIT))
		return 1;
	fd = udma_open();
	if (fd < 0)
		return r->err = fd, 2;
	r->step = 2;
	/* The whole budget: two 4 MiB host buffers. */
	r->err = raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &a.handle, NULL);
	if (r->err)
		return 3;
	r->err = raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &b.handle, NULL);
	if (r->err)
		return 4;
	a.size = b.size = 4 * MIB;
	r->step = 3;
	/* The shared queue stalls for 1 s: a 10 ms MEMCPY leaves its copy behind. */
	if (bar2_fault(&orph_bar2, FAULT_STALL, orph_h2t, 0, 1000))
		return 5;
	r->memcpy_ret = udma_memcpy(fd, &a, 0, &b, 0, 64 * KIB, 10);
	close(fd);
	/* The engine finishes the abandoned copy long before this. */
	sleep_ms(3000);
	r->step = 4;
	fd2 = udma_open();
	if (fd2 < 0)
		return r->err = fd2, 6;
	r->queue_ret = queue_init(fd2, ORPH_ENGINE, 0, 32, 32);
	r->alloc_ret = ubuf_host(fd2, 4096, &c);
	if (r->queue_ret)
		r->queue_ret_after_alloc = queue_init(fd2, ORPH_ENGINE, 0, 32, 32);
	close(fd2);
	r->step = 5;
	return 0;
}

/*
 * userspace-api.rst: the memory of a closed file is given back; QUEUE_INIT gives ENOMEM only
 * past RLIMIT_MEMLOCK. A file that used its whole budget, left a MEMCPY behind (short timeout
 * on a stalled shared queue) and was closed still holds the charge after the copy settled:
 * release found the buffers busy and only MEM_ALLOC, MEM_FREE or MEMCPY reap orphans, so the
 * user's next QUEUE_INIT fails with ENOMEM until an unrelated MEM_ALLOC happens to reap.
 */
TEST(closed_orphan_charge_comes_back)
{
	struct orph_report *r = sec_shared(sizeof(*r));
	struct neuron_udma_info info;
	int fd;
	pid_t pid;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	close(fd);
	orph_h2t = h2t_engine(&info);
	ASSERT_EQ(0, bar2_open(&orph_bar2));
	bar2_write(&orph_bar2, BAR2_CLEAR, 1);
	pid = sec_spawn(UID_A, orph_child, r);
	ASSERT_LT(0, pid);
	ASSERT_EQ(0, sec_reap(pid)) {
		TH_LOG("child failed at step %d: %s", r->step, strerror(-r->err));
	}
	bar2_write(&orph_bar2, BAR2_CLEAR, 1);
	bar2_close(&orph_bar2);
	TH_LOG("MEMCPY %s; 3 s after close: QUEUE_INIT %s, MEM_ALLOC %s, QUEUE_INIT again %s",
	       strerror(-r->memcpy_ret), strerror(-r->queue_ret), strerror(-r->alloc_ret),
	       strerror(-r->queue_ret_after_alloc));
	ASSERT_EQ(-ETIMEDOUT, r->memcpy_ret);
	EXPECT_EQ(0, r->queue_ret);
	munmap(r, sizeof(*r));
}

/* ---- queues pin more than they charge (one page per ring, whatever its size) ---- */

#define QCH_LIMIT (64 * KIB)

struct qch_report {
	int step, err, count;
};

static const __u32 qch_engines[] = { 13, 20, 21, 22, 23 };

static int qch_child(void *arg)
{
	struct qch_report *r = arg;
	unsigned int e, q;
	int fd, ret;

	r->step = 1;
	if (sec_memlock(QCH_LIMIT))
		return 1;
	fd = udma_open();
	if (fd < 0)
		return r->err = fd, 2;
	r->step = 2;
	for (e = 0; e < sizeof(qch_engines) / sizeof(qch_engines[0]); e++)
		for (q = 0; q < 16; q++) {
			ret = queue_init(fd, qch_engines[e], q, 32, 32);
			if (ret == -ENOMEM) {
				r->err = ret;
				goto out;
			}
			if (!ret)
				r->count++;
		}
out:
	close(fd);
	return 0;
}

/*
 * Queue memory is "charged to the allocating user's locked memory": Queue::memory_bytes sums
 * the ring bytes and charges whole pages of the sum, but each ring and the completion slots
 * are separate coherent allocations of at least one page each (3 pages for a 32/32 queue that
 * is charged one). With RLIMIT_MEMLOCK of 64 KiB a user pins far more than 64 KiB of rings.
 */
TEST(queue_rings_pin_at_most_memlock)
{
	struct qch_report *r = sec_shared(sizeof(*r));
	long pinned;
	pid_t pid;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	pid = sec_spawn(UID_A, qch_child, r);
	ASSERT_LT(0, pid);
	ASSERT_EQ(0, sec_reap(pid)) {
		TH_LOG("child failed at step %d: %s", r->step, strerror(-r->err));
	}
	/* tx ring, rx ring and completion slots: one page each at least. */
	pinned = r->count * 3L * getpagesize();
	TH_LOG("RLIMIT_MEMLOCK %lu KiB: %d queues of 32/32 descriptors (then %s), >= %ld KiB of coherent pages",
	       QCH_LIMIT / KIB, r->count, r->err ? strerror(-r->err) : "no ENOMEM", pinned / 1024);
	EXPECT_LE(pinned, (long)QCH_LIMIT);
	munmap(r, sizeof(*r));
}

/* ---- unbind and rebind with an orphan, a mapping and a queue of a live file ---- */

struct unb_report {
	volatile int ready, rebound;
	int step, err;
	int memcpy_ret, alloc1, alloc2, queue_ret, old_ioctl, probe;
};

static int unb_child(void *arg)
{
	struct unb_report *r = arg;
	struct ubuf a, b, c, d;
	unsigned char v;
	double t0;
	int fd, fd2;

	r->step = 1;
	if (sec_memlock(8 * MIB) || sec_probe_install())
		return 1;
	fd = udma_open();
	if (fd < 0)
		return r->err = fd, 2;
	r->step = 2;
	r->err = ubuf_host(fd, 4 * MIB, &a);
	if (!r->err)
		r->err = ubuf_host(fd, 2 * MIB, &b);
	if (r->err)
		return 3;
	memset(a.map, 0x5a, 4 * MIB);
	r->err = queue_init(fd, ORPH_ENGINE, 1, 32, 32);
	if (r->err)
		return 4;
	r->step = 3;
	if (bar2_fault(&orph_bar2, FAULT_STALL, orph_h2t, 0, 2000))
		return 5;
	r->memcpy_ret = udma_memcpy(fd, &a, 0, &b, 0, 64 * KIB, 10);
	r->ready = 1;
	t0 = now_ms();
	while (!r->rebound && now_ms() - t0 < 30000)
		sleep_ms(10);
	if (!r->rebound)
		return 6;
	r->step = 4;
	/*
	 * The unbound device's memory and charges are gone: 6 MiB and a queue fit the 8 MiB
	 * budget again (with the old 6 MiB and queue still charged they would not). Host buffers
	 * are charged for their power-of-two block, so both sizes are powers of two.
	 */
	fd2 = udma_open();
	if (fd2 < 0)
		return r->err = fd2, 7;
	r->alloc1 = ubuf_host(fd2, 4 * MIB, &c);
	r->alloc2 = ubuf_host(fd2, 2 * MIB, &d);
	if (!r->alloc1)
		munmap(c.map, 4 * MIB);
	if (!r->alloc2)
		munmap(d.map, 2 * MIB);
	r->queue_ret = queue_init(fd2, ORPH_ENGINE, 1, 32, 32);
	r->old_ioctl = queue_init(fd, ORPH_ENGINE, 2, 32, 32);
	r->probe = sec_probe(a.map, false, &v);
	close(fd2);
	close(fd);
	r->step = 5;
	return 0;
}

/*
 * Unbind frees every buffer and queue and drops every orphan: a file that outlives the unbind
 * keeps nothing pinned or charged (its user gets the whole RLIMIT_MEMLOCK back on the rebound
 * device), its old mapping raises SIGBUS and its ioctls give ENODEV. The test also leaves the
 * console for lockdep/KASAN to speak.
 */
TEST(unbind_with_orphan_gives_everything_back)
{
	struct unb_report *r = sec_shared(sizeof(*r));
	struct neuron_udma_info info;
	char bdf[64];
	double t0;
	int fd, ret;
	pid_t pid;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	close(fd);
	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	orph_h2t = h2t_engine(&info);
	ASSERT_EQ(0, bar2_open(&orph_bar2));
	bar2_write(&orph_bar2, BAR2_CLEAR, 1);
	pid = sec_spawn(UID_A, unb_child, r);
	ASSERT_LT(0, pid);
	t0 = now_ms();
	while (!r->ready && now_ms() - t0 < 20000)
		sleep_ms(10);
	ASSERT_EQ(1, r->ready) {
		TH_LOG("child stuck at step %d: %s", r->step, strerror(-r->err));
	}
	ret = sysfs_write(UDMA_DRV_DIR "/unbind", bdf);
	ASSERT_EQ(0, ret);
	sleep_ms(2500);		/* the stall is over */
	bar2_write(&orph_bar2, BAR2_CLEAR, 1);
	ret = sysfs_write(UDMA_DRV_DIR "/bind", bdf);
	ASSERT_EQ(0, ret);
	t0 = now_ms();
	while (sec_setup(0666) && now_ms() - t0 < 5000)
		sleep_ms(50);
	r->rebound = 1;
	ret = sec_reap(pid);
	bar2_close(&orph_bar2);
	TH_LOG("MEMCPY %s; after unbind+bind: 4 + 2 MiB MEM_ALLOC %s / %s, QUEUE_INIT %s, old file's QUEUE_INIT %s, old mapping %s",
	       strerror(-r->memcpy_ret), strerror(-r->alloc1), strerror(-r->alloc2),
	       strerror(-r->queue_ret), strerror(-r->old_ioctl),
	       r->probe == PROBE_OK ? "readable" : strsignal(r->probe));
	ASSERT_EQ(0, ret) {
		TH_LOG("child failed at step %d: %s", r->step, strerror(-r->err));
	}
	EXPECT_EQ(-ETIMEDOUT, r->memcpy_ret);
	EXPECT_EQ(0, r->alloc1);
	EXPECT_EQ(0, r->alloc2);
	EXPECT_EQ(0, r->queue_ret);
	EXPECT_EQ(-ENODEV, r->old_ioctl);
	EXPECT_EQ(SIGBUS, r->probe);
	munmap(r, sizeof(*r));
}

/* ---- a hung shared queue whose fence slots all belong to abandoned copies ---- */

#define SLOTS_FILES 270		/* more than the 256 completion slots of the H2T queue */
#define SLOTS_STALL_MS 24000
#define SLOTS_PROCS 6		/* processes issuing them */

FIXTURE(hang) {
	int fds[SLOTS_FILES];
	struct ubuf src[SLOTS_FILES], dst[SLOTS_FILES];
};

FIXTURE_SETUP(hang)
{
	int i;

	ASSERT_EQ(0, bar2_open(&orph_bar2));
	bar2_write(&orph_bar2, BAR2_CLEAR, 1);
	for (i = 0; i < SLOTS_FILES; i++) {
		self->fds[i] = udma_open();
		ASSERT_LE(0, self->fds[i]);
		memset(&self->src[i], 0, sizeof(self->src[i]));
		memset(&self->dst[i], 0, sizeof(self->dst[i]));
		ASSERT_EQ(0, raw_alloc(self->fds[i], NEURON_UDMA_MEM_HOST, 4096,
				       &self->src[i].handle, NULL));
		ASSERT_EQ(0, raw_alloc(self->fds[i], NEURON_UDMA_MEM_HOST, 4096,
				       &self->dst[i].handle, NULL));
	}
}

FIXTURE_TEARDOWN(hang)
{
	int i;

	if (orph_bar2.regs)
		bar2_write(&orph_bar2, BAR2_CLEAR, 1);
	bar2_close(&orph_bar2);
	for (i = 0; i < SLOTS_FILES; i++)
		if (self->fds[i] >= 0)
			close(self->fds[i]);
}

/*
 * userspace-api.rst, MEMCPY: a timeout resets the shared queue when "the queue made no
 * progress at all for 10 s (it is stuck)". Only a caller whose own submission is in flight can
 * take that decision: when the H2T queue hangs while every completion slot belongs to an
 * abandoned MEMCPY (one 10 ms MEMCPY from each of 270 files), later callers cannot submit
 * (can_fence() is false), time out in copy_on()'s no-room branch without looking at the stall,
 * and nobody ever resets the stuck queue: MEMCPY and device MEM_ALLOC of every user fail until
 * the hang ends by itself (never, for a real hang) or the device is unbound.
 */
TEST_F_TIMEOUT(hang, full_slots_on_a_stuck_queue_are_recovered, 90)
{
	struct neuron_udma_info info;
	int i, timeouts = 0, victim = -1, freed = -1, fd_v = udma_open();
	struct ubuf vs = { 0 }, vd = { 0 };
	double t0, tv;

	ASSERT_LE(0, fd_v);
	ASSERT_EQ(0, raw_alloc(fd_v, NEURON_UDMA_MEM_HOST, 4096, &vs.handle, NULL));
	ASSERT_EQ(0, raw_alloc(fd_v, NEURON_UDMA_MEM_HOST, 4096, &vd.handle, NULL));

	ASSERT_EQ(0, udma_info(self->fds[0], &info));
	orph_h2t = h2t_engine(&info);
	ASSERT_EQ(0, bar2_fault(&orph_bar2, FAULT_STALL, orph_h2t, 0, SLOTS_STALL_MS));
	t0 = now_ms();
	/*
	 * The 270 callers run from SLOTS_PROCS processes at once, so that they are all done well
	 * before the queue has been stuck for 10 s even on a loaded host (one after another they
	 * took 11 s there, and the stuck-queue reset then came in the middle of them).
	 */
	{
		int *counts = sec_shared(SLOTS_PROCS * sizeof(int));
		pid_t pids[SLOTS_PROCS];
		int p;

		ASSERT_NE(NULL, counts);
		for (p = 0; p < SLOTS_PROCS; p++) {
			pids[p] = fork();
			ASSERT_LE(0, pids[p]);
			if (pids[p] == 0) {
				int n = 0;

				for (i = p; i < SLOTS_FILES; i += SLOTS_PROCS)
					if (udma_memcpy(self->fds[i], &self->src[i], 0, &self->dst[i], 0,
							4096, 10) == -ETIMEDOUT)
						n++;
				counts[p] = n;
				_exit(0);
			}
		}
		for (p = 0; p < SLOTS_PROCS; p++) {
			ASSERT_EQ(pids[p], waitpid(pids[p], NULL, 0));
			timeouts += counts[p];
		}
		munmap(counts, SLOTS_PROCS * sizeof(int));
	}
	TH_LOG("the %d MEMCPYs took %.0f ms", SLOTS_FILES, now_ms() - t0);
	/* The queue has made no progress for more than 10 s from here on. */
	while (now_ms() - t0 < 11000)
		sleep_ms(100);
	tv = now_ms();
	/* Another file's caller of the stuck queue, with a timeout of its own of 3 s. */
	victim = udma_memcpy(fd_v, &vs, 0, &vd, 0, 4096, 3000);
	tv = now_ms() - tv;
	/* After a reset every abandoned copy is settled: file 1's buffer (in flight) is free. */
	freed = mem_free(self->fds[1], self->dst[1].handle);
	TH_LOG("%d of %d 10 ms MEMCPYs timed out; at %.0f ms (stuck > 10 s) a 3 s MEMCPY: %s after %.0f ms; then MEM_FREE of an abandoned copy's buffer: %s",
	       timeouts, SLOTS_FILES, now_ms() - t0 - tv, victim ? strerror(-victim) : "0", tv,
	       freed ? strerror(-freed) : "0 (the queue was reset)");
	EXPECT_EQ(SLOTS_FILES, timeouts);
	EXPECT_EQ(0, freed) {
		TH_LOG("nobody reset the stuck shared queue");
	}
	/* Let the model's stall end before the next test. */
	while (now_ms() - t0 < SLOTS_STALL_MS + 500)
		sleep_ms(100);
	close(fd_v);
}

TEST_HARNESS_MAIN
