// SPDX-License-Identifier: GPL-2.0
/*
 * Striped MEMCPY and MEMSET (Documentation/userspace-api.rst, MEMCPY): a call of 4 MiB or more
 * is cut into one part per H2T engine (v2: engines 32 and 33; v3: 128-131), whole 64 KiB pairs
 * each, and the parts run at once; the call returns when every part is done. Every byte lands
 * where a one-engine copy would put it (any offsets, imported memory of scattered pages on
 * either side), and a fault in one engine's part fails the whole call with EIO: no success is
 * reported for a copy that did not move all its bytes; a part an early end abandoned that then
 * fails does not fail another file's next call.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "kselftest_harness.h"
#include "udma_util.h"

#define KIB 1024ULL
#define MIB (1024ULL * 1024)
/* Above the 4 MiB threshold and not a whole number of pairs or parts. */
#define BIG (9 * MIB + 12 * KIB + 5)
/* Host memory of the copies: imported (MEM_IMPORT), as host buffers stop at 4 MiB. */
#define HOST (BIG + 64 * KIB)

FIXTURE(stripe) {
	int fd;
	struct neuron_udma_info info;
	unsigned char *src, *dst;
	struct ubuf isrc, idst, hbm;
};

FIXTURE_SETUP(stripe)
{
	__u64 h;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	if (self->info.device_mem_size < 2 * HOST)
		SKIP(return, "device memory below %llu bytes", 2 * HOST);
	self->src = malloc(HOST);
	self->dst = malloc(HOST);
	ASSERT_NE(NULL, self->src);
	ASSERT_NE(NULL, self->dst);
	fill_pattern(self->src, HOST, 77);
	memset(self->dst, 0, HOST);
	ASSERT_EQ(0, udma_import(self->fd, self->src, HOST, 0, &h, NULL));
	self->isrc = import_ubuf(h, HOST);
	ASSERT_EQ(0, udma_import(self->fd, self->dst, HOST, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	self->idst = import_ubuf(h, HOST);
	ASSERT_EQ(0, ubuf_dev(self->fd, 2 * HOST, &self->hbm));
}

FIXTURE_TEARDOWN(stripe)
{
	close(self->fd);
	free(self->src);
	free(self->dst);
}

/* The second H2T engine (queue 0, the driver's queue there): 33 on v2, 129 on v3. */
static __u32 second_engine(const struct neuron_udma_info *info)
{
	return info->generation == NEURON_UDMA_GEN_V2 ? 33 : 129;
}

static int do_memset(int fd, __u64 handle, __u64 off, __u64 size, __u32 value)
{
	struct neuron_udma_memset m = { .handle = handle, .offset = off, .size = size,
					.value = value };

	return udma_ioc(fd, NEURON_UDMA_MEMSET, &m);
}

/* host -> HBM -> HBM -> host, odd offsets everywhere: the bytes arrive whole and in place. */
TEST_F_TIMEOUT(stripe, memcpy_is_byte_exact, 300)
{
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->isrc, 3, &self->hbm, 4096 + 1, BIG, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->hbm, 4096 + 1, &self->hbm, HOST + 7, BIG, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->hbm, HOST + 7, &self->idst, 11, BIG, 0));
	EXPECT_EQ(-1, first_diff(self->dst + 11, self->src + 3, BIG));
	/* Nothing outside the range was written. */
	for (int i = 0; i < 11; i++)
		EXPECT_EQ(0, self->dst[i]);
	for (__u64 i = 11 + BIG; i < HOST; i++)
		ASSERT_EQ(0, self->dst[i]);
}

/* A striped MEMSET fills exactly its range, in every part. */
TEST_F_TIMEOUT(stripe, memset_is_byte_exact, 300)
{
	unsigned char *want = malloc(HOST);

	ASSERT_NE(NULL, want);
	ASSERT_EQ(0, do_memset(self->fd, self->hbm.handle, 0, HOST, 0x11));
	ASSERT_EQ(0, do_memset(self->fd, self->hbm.handle, 5, BIG, 0xA5));
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->hbm, 0, &self->idst, 0, HOST, 0));
	memset(want, 0x11, HOST);
	memset(want + 5, 0xA5, BIG);
	EXPECT_EQ(-1, first_diff(self->dst, want, HOST));
	/* Straight into imported host memory too. */
	ASSERT_EQ(0, do_memset(self->fd, self->idst.handle, 1, BIG, 0x3C));
	memset(want + 1, 0x3C, BIG);
	EXPECT_EQ(-1, first_diff(self->dst, want, HOST));
	free(want);
}

/*
 * A fault in the second engine's part (its first descriptor fails) fails the whole MEMCPY with
 * EIO; the device reports the error on that engine; the next call on the same buffers is whole.
 */
TEST_F_TIMEOUT(stripe, fault_in_one_part_fails_the_call, 300)
{
	__u32 eng = second_engine(&self->info);
	struct ubar2 bar2;

	ASSERT_EQ(0, bar2_open(&bar2));
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_FAIL_NTH, eng, 0, 1));
	EXPECT_EQ(-EIO, udma_memcpy(self->fd, &self->isrc, 0, &self->hbm, 0, BIG, 0));
	EXPECT_EQ(ERR_INJECTED_FAIL, bar2_read(&bar2, BAR2_LAST_ERROR));
	EXPECT_EQ(eng, bar2_read(&bar2, BAR2_LAST_ENGINE));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_FAIL_NTH, eng, 0, 1));
	EXPECT_EQ(-EIO, do_memset(self->fd, self->hbm.handle, 0, BIG, 0x77));
	EXPECT_EQ(eng, bar2_read(&bar2, BAR2_LAST_ENGINE));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);

	ASSERT_EQ(0, udma_memcpy(self->fd, &self->isrc, 0, &self->hbm, 0, BIG, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->hbm, 0, &self->idst, 0, BIG, 0));
	EXPECT_EQ(-1, first_diff(self->dst, self->src, BIG));
}

/*
 * A MEMCPY that ends early (its timeout) leaves its parts in flight, slowed; the second engine
 * then aborts (an engine error) while nobody waits for its part. The next striped MEMCPY, of
 * another file, is not failed by that abort: the orphans' reap at its start resets the aborted
 * queue (the abandoned copy's fence there settles as lost, the engine back to normal), and its
 * bytes arrive whole. (Without it the abort stood until the 10 s stuck rule, and the next call's
 * part on that engine found it and failed with EIO.) The first file's next copy works too.
 *
 * The parts are kept in flight by slowing every engine down, not by stalling a queue: the device
 * model let a stalled part run early after the earlier cases' resets (2026-12-06).
 */
TEST_F_TIMEOUT(stripe, early_end_with_a_failed_part_spares_the_next_call, 300)
{
	__u32 eng = second_engine(&self->info);
	unsigned char *src2 = malloc(HOST), *dst2 = malloc(HOST);
	struct ubuf isrc2, idst2;
	struct ubar2 bar2;
	__u64 h;
	int fd2;

	ASSERT_NE(NULL, src2);
	ASSERT_NE(NULL, dst2);
	fill_pattern(src2, HOST, 91);
	memset(dst2, 0, HOST);
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, udma_import(fd2, src2, HOST, 0, &h, NULL));
	isrc2 = import_ubuf(h, HOST);
	ASSERT_EQ(0, udma_import(fd2, dst2, HOST, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	idst2 = import_ubuf(h, HOST);

	ASSERT_EQ(0, bar2_open(&bar2));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	/*
	 * Every engine slowed down (each packet's completion 2000x later, about 40 ms): the call
	 * times out with its parts in flight on every H2T engine.
	 */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_SLOW, 0, 0, 2000));
	ASSERT_EQ(-ETIMEDOUT, udma_memcpy(self->fd, &self->isrc, 0, &self->hbm, 0, BIG, 20));
	/* The second engine aborts with nobody waiting for its part; the slow-down ends. */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_ABORT, eng, 0, 0));
	EXPECT_EQ(eng, bar2_read(&bar2, BAR2_LAST_ENGINE));
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_SLOW, 0, 0, 1));
	bar2_close(&bar2);

	/* Another file's striped copy: whole, no EIO. */
	EXPECT_EQ(0, udma_memcpy(fd2, &isrc2, 5, &idst2, 9, BIG, 0));
	EXPECT_EQ(-1, first_diff(dst2 + 9, src2 + 5, BIG));
	/* The first file's next copy (it waits for its abandoned one, settled by then). */
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->isrc, 0, &self->hbm, 0, BIG, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->hbm, 0, &self->idst, 0, BIG, 0));
	EXPECT_EQ(-1, first_diff(self->dst, self->src, BIG));
	close(fd2);
	free(src2);
	free(dst2);
}

TEST_HARNESS_MAIN
