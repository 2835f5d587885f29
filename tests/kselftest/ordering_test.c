// SPDX-License-Identifier: GPL-2.0
/*
 * Completion ordering: COPY_WAIT and MEMCPY must return only once the data of every earlier
 * copy is visible, whatever barriers the copies carry.
 *
 * On the hardware, descriptors are consumed in order but their writes are not ordered: without a
 * barrier, the 4-byte completion marker can land before the data of earlier pairs (hardware.rst
 * §4.4, 5.1). The device model holds the writes of barrier-free packets longer than 64 bytes (its
 * "unordered completion" rule, Documentation/udma-sim.rst), so a driver whose marker pair does
 * not wait for them returns from COPY_WAIT with the destination still unwritten.
 */
#include <stdlib.h>

#include "kselftest_harness.h"
#include "udma_util.h"

/* Host connectivity on every generation (hardware.rst §2.5: v2 all, v3 32i + 4..7, ...). */
#define ENG 4U
#define QID 1U
#define BUF (4 * UDMA_MAX_COPY)

#define ASSERT_BYTES(buf, saved, len) do {						\
	long __d = first_diff(buf, saved, len);					\
	ASSERT_EQ(-1, __d) {								\
		TH_LOG("byte %ld differs: the completion was reported before the data landed", __d); \
	}										\
} while (0)

FIXTURE(ord) {
	int fd;
	struct ubuf a, b, d;
};

FIXTURE_SETUP(ord)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("cannot open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 64, 64));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->b));
	ASSERT_EQ(0, ubuf_dev(self->fd, BUF, &self->d));
}

FIXTURE_TEARDOWN(ord)
{
	ubuf_free(self->fd, &self->a);
	ubuf_free(self->fd, &self->b);
	ubuf_free(self->fd, &self->d);
	close(self->fd);
}

/* Barrier-free host-to-host copies, then COPY_WAIT: the bytes are there when it returns. */
TEST_F(ord, no_barrier_copies_then_copy_wait)
{
	struct neuron_udma_copy c[4];
	int round, i;

	for (round = 0; round < 8; round++) {
		fill_pattern(self->a.map, BUF, 100 + round);
		memset(self->b.map, 0, BUF);
		for (i = 0; i < 4; i++)
			c[i] = ucopy(&self->a, i * UDMA_MAX_COPY, &self->b, i * UDMA_MAX_COPY, UDMA_MAX_COPY);
		ASSERT_EQ(0, prep(self->fd, ENG, QID, c, 4));
		ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
		ASSERT_BYTES(self->b.map, self->a.map, BUF);
	}
}

/* The copies started by COPY_START before the wait posts its marker. */
TEST_F(ord, copy_start_then_copy_wait)
{
	fill_pattern(self->a.map, BUF, 7);
	memset(self->b.map, 0, BUF);
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 0, &self->b, 0, UDMA_MAX_COPY)));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, UDMA_MAX_COPY, &self->b,
							 UDMA_MAX_COPY, 4096)));
	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, 2, 2));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, UDMA_MAX_COPY + 4096);
}

/* Through device memory: host -> HBM, wait, HBM -> host, wait; no barrier anywhere. */
TEST_F(ord, via_device_memory_without_barriers)
{
	fill_pattern(self->a.map, BUF, 21);
	memset(self->b.map, 0, BUF);
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 0, &self->d, 4096, 60000)));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->d, 4096, &self->b, 100, 60000)));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map + 100, self->a.map, 60000);
}

/* The driver's own chunked copy (MEMCPY): byte-exact when the ioctl returns. */
TEST_F(ord, memcpy_returns_after_the_data)
{
	int round;

	for (round = 0; round < 4; round++) {
		fill_pattern(self->a.map, BUF, 300 + round);
		memset(self->b.map, 0, BUF);
		ASSERT_EQ(0, udma_memcpy(self->fd, &self->a, 0, &self->b, 0, BUF, 0));
		ASSERT_BYTES(self->b.map, self->a.map, BUF);
	}
}

TEST_HARNESS_MAIN
