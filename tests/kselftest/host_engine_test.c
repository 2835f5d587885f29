// SPDX-License-Identifier: GPL-2.0
/*
 * Host connectivity (hardware.rst §2.5): user queues have their rings in host memory, so QUEUE_INIT
 * accepts only engines that can reach it. Every Trainium1/Inferentia2 engine can; on Trainium2
 * only the SENG engines 32i + 4..7, 12..15, 20..23, 28..31 and the H2T engines 128..131 can, the
 * others are refused with EOPNOTSUPP.
 */
#include "kselftest_harness.h"
#include "udma_util.h"

static bool v3_host_engine(__u32 eng)
{
	return (eng >= 128 && eng < 132) || (eng < 128 && eng % 8 >= 4);
}

FIXTURE(he) {
	int fd;
	struct neuron_udma_info info;
};

FIXTURE_SETUP(he)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
}

FIXTURE_TEARDOWN(he)
{
	close(self->fd);
}

/* Queue 2 (no engine reserves it) of every engine: taken where the engine reaches host memory, else EOPNOTSUPP. */
TEST_F(he, queue_init_per_engine)
{
	struct ubuf a;
	__u32 eng;

	for (eng = 0; eng < self->info.engines; eng++) {
		bool host = self->info.generation == NEURON_UDMA_GEN_V2 || v3_host_engine(eng);
		int ret = queue_init(self->fd, eng, 2, 32, 32);

		EXPECT_EQ(host ? 0 : -EOPNOTSUPP, ret) {
			TH_LOG("engine %u: %s", eng, strerror(-ret));
		}
		if (!ret)
			EXPECT_EQ(0, queue_release(self->fd, eng, 2));
	}
	/* A refused engine stays refused, and a queue on a host engine copies. */
	if (self->info.generation == NEURON_UDMA_GEN_V3)
		EXPECT_EQ(-EOPNOTSUPP, queue_init(self->fd, 0, 3, 32, 32));
	ASSERT_EQ(0, queue_init(self->fd, 12, 3, 32, 32));
	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &a));
	fill_pattern(a.map, 4096, 5);
	ASSERT_EQ(0, copy_sync(self->fd, 12, 3, ucopy(&a, 0, &a, 4096, 4096)));
	EXPECT_EQ(-1, first_diff(a.map + 4096, a.map, 4096));
	ubuf_free(self->fd, &a);
}

TEST_HARNESS_MAIN
