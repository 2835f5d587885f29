// SPDX-License-Identifier: GPL-2.0
/*
 * MEM_FREE against the references copies take on buffers. Copies are prepared without the file
 * lock (a buffer's reference and MEM_FREE settle by a fully ordered handshake), COPY_PREPARE
 * caches the buffers of a batch, buffers live in handle indexes sharded by owner. Threads of
 * one file race MEM_FREE and MEM_ALLOC against COPY_PREPARE(_ONE) into the buffer being freed;
 * a failed batch keeps no reference, a failing MEM_FREE fails no concurrent prepare; a second
 * file names the first one's handles.
 *
 * Each test fails when the driver breaks the rule it checks: the engine never writes memory
 * that was freed (the pattern of a buffer that reuses it stays intact), a failed batch keeps
 * no reference (MEM_FREE succeeds after it), another file's work is not touched.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL
#define BUF (64 * KIB)
#define CHUNK (8 * KIB)
#define ENGINE 13
#define QUEUE 1
#define FILL 0xA5
#define ROUNDS 300
#define NFAIL 40	/* entries: more than a 32-descriptor ring takes */

/* ---- MEM_FREE + MEM_ALLOC race COPY_PREPARE into the freed buffer ---- */

struct race {
	int fd;
	bool batch;
	struct ubuf src;
	_Atomic __u64 target;	/* handle the preparer copies into, 0 = none */
	_Atomic unsigned long cycles;	/* preparer: completed prepare+wait cycles */
	_Atomic bool stop;
	unsigned long prepared, refused, freed_busy, corrupt, rounds;
	int bad_prep, bad_wait, bad_free;
	long first_bad;
};

static void *preparer(void *arg)
{
	struct race *r = arg;
	struct neuron_udma_copy c[BUF / CHUNK];
	unsigned int i;

	while (!atomic_load(&r->stop)) {
		struct ubuf dst = { .handle = atomic_load(&r->target), .size = BUF };
		int ret;

		if (!dst.handle) {
			atomic_fetch_add(&r->cycles, 1);
			continue;
		}
		if (r->batch) {
			for (i = 0; i < BUF / CHUNK; i++)
				c[i] = ucopy(&r->src, i * CHUNK, &dst, i * CHUNK, CHUNK);
			ret = prep(r->fd, ENGINE, QUEUE, c, BUF / CHUNK);
		} else {
			ret = prep_one(r->fd, ENGINE, QUEUE, ucopy(&r->src, 0, &dst, 0, BUF));
		}
		if (ret == 0) {
			r->prepared++;
			ret = copy_wait(r->fd, ENGINE, QUEUE, 5000, NULL);
			if (ret && !r->bad_wait)
				r->bad_wait = ret;
		} else if (ret == -ENOENT) {
			r->refused++;
		} else if (!r->bad_prep) {
			r->bad_prep = ret;
		}
		atomic_fetch_add(&r->cycles, 1);
	}
	return NULL;
}

/* Waits until the preparer has finished two more cycles (so every copy it had is waited for). */
static void settle(struct race *r)
{
	unsigned long c = atomic_load(&r->cycles);

	while (atomic_load(&r->cycles) < c + 2)
		sched_yield();
}

static void run_race(struct __test_metadata *_metadata, bool batch)
{
	struct race *r = calloc(1, sizeof(*r));
	struct ubuf x, y;
	pthread_t t;
	unsigned int round;
	long d;
	int ret;

	ASSERT_NE(NULL, r);
	r->batch = batch;
	r->first_bad = -1;
	r->fd = udma_open();
	ASSERT_LE(0, r->fd);
	ASSERT_EQ(0, queue_init(r->fd, ENGINE, QUEUE, 256, 256));
	ASSERT_EQ(0, ubuf_host(r->fd, BUF, &r->src));
	fill_pattern(r->src.map, BUF, 3);
	ASSERT_EQ(0, pthread_create(&t, NULL, preparer, r));
	for (round = 0; round < ROUNDS; round++) {
		ret = ubuf_host(r->fd, BUF, &x);
		if (ret)
			break;
		atomic_store(&r->target, x.handle);
		/* Let the preparer get going on x, then free it while copies are in flight. */
		for (d = 0; d < (long)(round % 7) * 200; d++)
			sched_yield();
		munmap(x.map, BUF);
		while ((ret = mem_free(r->fd, x.handle)) == -EBUSY)
			r->freed_busy++;
		if (ret) {
			r->bad_free = ret;
			break;
		}
		/* Likely the freed pages again; nothing may write them from now on. */
		ret = ubuf_host(r->fd, BUF, &y);
		if (ret) {
			r->bad_free = ret;
			break;
		}
		memset(y.map, FILL, BUF);
		settle(r);
		atomic_store(&r->target, 0);
		settle(r);
		for (d = 0; d < (long)BUF; d++)
			if (y.map[d] != FILL)
				break;
		if (d < (long)BUF) {
			if (r->first_bad < 0)
				r->first_bad = d;
			r->corrupt++;
		}
		ASSERT_EQ(0, ubuf_free(r->fd, &y));
		r->rounds++;
	}
	atomic_store(&r->stop, true);
	pthread_join(t, NULL);
	TH_LOG("%s: %lu rounds, %lu copies prepared, %lu refused (ENOENT), %lu MEM_FREE EBUSY, %lu corrupted (first at byte %ld)",
	       batch ? "COPY_PREPARE x8" : "COPY_PREPARE_ONE", r->rounds, r->prepared, r->refused,
	       r->freed_busy, r->corrupt, r->first_bad);
	EXPECT_EQ(ROUNDS, (int)r->rounds);
	EXPECT_EQ(0, r->bad_free);
	EXPECT_EQ(0, r->bad_prep);
	EXPECT_EQ(0, r->bad_wait);
	EXPECT_EQ(0UL, r->corrupt);
	/* The race really happened: some copies got in, some were refused or blocked a free. */
	EXPECT_LT(0UL, r->prepared);
	ASSERT_EQ(0, ubuf_free(r->fd, &r->src));
	ASSERT_EQ(0, queue_release(r->fd, ENGINE, QUEUE));
	close(r->fd);
	free(r);
}

TEST(free_races_prepare_one)
{
	run_race(_metadata, false);
}

TEST(free_races_prepare_batch)
{
	run_race(_metadata, true);
}

/* ---- a failed batch keeps no reference; double MEM_FREE ---- */

TEST(failed_batch_drops_references)
{
	struct neuron_udma_copy c[NFAIL];
	struct ubuf s, x, bogus = { .handle = ~0ULL >> 20, .size = BUF };
	unsigned int i;
	int fd = udma_open();

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, ENGINE, QUEUE, 32, 32));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &s));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &x));
	/* Unknown handle in the 8th entry: ENOENT after 7 entries took references on x. */
	for (i = 0; i < 8; i++)
		c[i] = ucopy(&s, 0, i == 7 ? &bogus : &x, 0, CHUNK);
	EXPECT_EQ(-ENOENT, prep(fd, ENGINE, QUEUE, c, 8));
	/* Out of range in the 8th entry: ERANGE. */
	c[7] = ucopy(&s, 0, &x, BUF - 1, CHUNK);
	EXPECT_EQ(-ERANGE, prep(fd, ENGINE, QUEUE, c, 8));
	/* More pairs than the 32-descriptor ring holds: ENOSPC after every entry was translated. */
	for (i = 0; i < NFAIL; i++)
		c[i] = ucopy(&s, 0, &x, 0, CHUNK);
	EXPECT_EQ(-ENOSPC, prep(fd, ENGINE, QUEUE, c, NFAIL));
	/* Nothing was prepared, so nothing references x. */
	EXPECT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 1000, NULL));
	munmap(x.map, BUF);
	EXPECT_EQ(0, mem_free(fd, x.handle));
	EXPECT_EQ(-ENOENT, mem_free(fd, x.handle));
	/* The freed handle is ENOENT for a prepare, alone and cached within a batch. */
	c[0] = ucopy(&s, 0, &s, CHUNK, CHUNK);
	c[1] = ucopy(&s, 0, &x, 0, CHUNK);
	EXPECT_EQ(-ENOENT, prep(fd, ENGINE, QUEUE, c, 2));
	EXPECT_EQ(-ENOENT, prep_one(fd, ENGINE, QUEUE, ucopy(&s, 0, &x, 0, CHUNK)));
	EXPECT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 1000, NULL));
	EXPECT_EQ(0, ubuf_free(fd, &s));
	close(fd);
}

/* ---- another file's handles: ENOENT, and its copies and frees go on ---- */

TEST(foreign_handles_touch_nothing)
{
	struct ubuf s, d, e;
	__u64 done = 0;
	int fa = udma_open(), fb = udma_open();

	ASSERT_LE(0, fa);
	ASSERT_LE(0, fb);
	ASSERT_EQ(0, queue_init(fa, ENGINE, QUEUE, 64, 64));
	ASSERT_EQ(0, queue_init(fb, ENGINE, QUEUE + 1, 64, 64));
	ASSERT_EQ(0, ubuf_host(fa, BUF, &s));
	ASSERT_EQ(0, ubuf_host(fa, BUF, &d));
	ASSERT_EQ(0, ubuf_host(fb, BUF, &e));
	fill_pattern(s.map, BUF, 9);
	memset(d.map, 0, BUF);
	/* File b names a's buffers: ENOENT for copies, frees and mappings, a's buffers intact. */
	EXPECT_EQ(-ENOENT, prep_one(fb, ENGINE, QUEUE + 1, ucopy(&s, 0, &e, 0, CHUNK)));
	EXPECT_EQ(-ENOENT, prep_one(fb, ENGINE, QUEUE + 1, ucopy(&e, 0, &d, 0, CHUNK)));
	EXPECT_EQ(-ENOENT, mem_free(fb, d.handle));
	EXPECT_EQ(MAP_FAILED, mmap(NULL, BUF, PROT_READ, MAP_SHARED, fb, d.mmap_offset));
	/* a's copy goes on; b's queue is not a's. */
	EXPECT_EQ(-ENOENT, prep_one(fa, ENGINE, QUEUE + 1, ucopy(&s, 0, &d, 0, BUF)));
	EXPECT_EQ(0, prep_one(fa, ENGINE, QUEUE, ucopy(&s, 0, &d, 0, BUF)));
	EXPECT_EQ(0, copy_wait(fa, ENGINE, QUEUE, 5000, &done));
	EXPECT_EQ(-1, first_diff(s.map, d.map, BUF));
	/* Closing b (its queue and buffer) leaves a's queue working. */
	close(fb);
	memset(d.map, 0, BUF);
	EXPECT_EQ(0, copy_sync(fa, ENGINE, QUEUE, ucopy(&s, 0, &d, 0, BUF)));
	EXPECT_EQ(-1, first_diff(s.map, d.map, BUF));
	EXPECT_EQ(0, ubuf_free(fa, &d));
	EXPECT_EQ(0, ubuf_free(fa, &s));
	close(fa);
}

/* ---- a MEM_FREE that fails (EBUSY) must not fail a concurrent prepare ---- */

struct busy_race {
	int fd;
	struct ubuf s, x;
	_Atomic bool stop;
	unsigned long frees, prepares, enoent;
	int bad_free, bad_prep;
};

static void *busy_freer(void *arg)
{
	struct busy_race *r = arg;
	int ret;

	while (!atomic_load(&r->stop)) {
		ret = mem_free(r->fd, r->x.handle);
		r->frees++;
		if (ret != -EBUSY) {
			r->bad_free = ret;
			break;
		}
	}
	return NULL;
}

/*
 * x stays referenced by a pair prepared (never started) on one queue, so every MEM_FREE of it
 * is EBUSY and x is never freed. Copies into x on a second queue are valid calls on a live
 * buffer: none may fail with ENOENT because a MEM_FREE looked at x at the same moment.
 */
TEST(failed_free_does_not_fail_prepare)
{
	struct busy_race *r = calloc(1, sizeof(*r));
	double end;
	pthread_t t;
	int ret;

	ASSERT_NE(NULL, r);
	r->fd = udma_open();
	ASSERT_LE(0, r->fd);
	ASSERT_EQ(0, queue_init(r->fd, ENGINE, QUEUE, 64, 64));
	ASSERT_EQ(0, queue_init(r->fd, ENGINE, QUEUE + 1, 256, 256));
	ASSERT_EQ(0, ubuf_host(r->fd, BUF, &r->s));
	ASSERT_EQ(0, ubuf_host(r->fd, BUF, &r->x));
	ASSERT_EQ(0, prep_one(r->fd, ENGINE, QUEUE, ucopy(&r->s, 0, &r->x, 0, CHUNK)));
	ASSERT_EQ(0, pthread_create(&t, NULL, busy_freer, r));
	end = now_ms() + 4000;
	while (now_ms() < end && r->prepares < 200000) {
		ret = prep_one(r->fd, ENGINE, QUEUE + 1, ucopy(&r->s, 0, &r->x, CHUNK, CHUNK));
		r->prepares++;
		if (ret == -ENOENT) {
			r->enoent++;
			continue;
		}
		if (ret) {
			r->bad_prep = ret;
			break;
		}
		ret = copy_wait(r->fd, ENGINE, QUEUE + 1, 5000, NULL);
		if (ret) {
			r->bad_prep = ret;
			break;
		}
	}
	atomic_store(&r->stop, true);
	pthread_join(t, NULL);
	TH_LOG("%lu prepares into a live buffer, %lu ENOENT; %lu MEM_FREE (EBUSY) meanwhile",
	       r->prepares, r->enoent, r->frees);
	EXPECT_EQ(0, r->bad_free);
	EXPECT_EQ(0, r->bad_prep);
	EXPECT_EQ(0UL, r->enoent);
	EXPECT_LT(100UL, r->frees);
	/* Started and waited for, the pending pair lets x go. */
	EXPECT_EQ(0, copy_wait(r->fd, ENGINE, QUEUE, 5000, NULL));
	EXPECT_EQ(0, ubuf_free(r->fd, &r->x));
	EXPECT_EQ(0, ubuf_free(r->fd, &r->s));
	close(r->fd);
	free(r);
}

TEST_HARNESS_MAIN
