// SPDX-License-Identifier: GPL-2.0
/*
 * ENODEV of the neuron_udma ABI: a file kept open across an unbind of its device fails every
 * ioctl with ENODEV, its host- and device-buffer mappings raise SIGBUS, and it can still be
 * closed; after a rebind a new file works again.
 */
#include <stdlib.h>

#include "kselftest_harness.h"
#include "udma_util.h"

TEST(unbound_file_enodev)
{
	struct neuron_udma_queue_state st;
	struct neuron_udma_info info;
	struct ubuf a, b, a2, kept;
	unsigned char *dmap;
	char bdf[64];
	int fd, fd2, ret;

	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	ASSERT_EQ(0, queue_init(fd, 5, 1, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd, 8192, &a));
	ASSERT_EQ(0, ubuf_dev(fd, 8192, &b));
	/* One mapping goes before the unbind; the other stays and must fault afterwards. */
	munmap(a.map, a.size);
	a.map = NULL;
	ASSERT_EQ(0, ubuf_host(fd, 8192, &kept));
	memset(kept.map, 0x5a, 8192);
	ASSERT_EQ(0, touch_signal(kept.map + 4096, false));
	/* ABI 3: a device buffer's mapping (BAR4) must fault after the unbind too. */
	dmap = mmap(NULL, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, b.mmap_offset);
	ASSERT_NE(MAP_FAILED, dmap);
	dmap[0] = 0x33;
	ASSERT_EQ(0, touch_signal(dmap + 4096, false));

	ret = sysfs_write(UDMA_DRV_DIR "/unbind", bdf);
	ASSERT_EQ(0, ret) {
		TH_LOG("unbind %s: %s", bdf, strerror(-ret));
	}
	EXPECT_EQ(-ENODEV, udma_info(fd, &info));
	EXPECT_EQ(-ENODEV, ubuf_host(fd, 4096, &a2));
	EXPECT_EQ(-ENODEV, mem_free(fd, b.handle));
	EXPECT_EQ(-ENODEV, queue_init(fd, 5, 2, 64, 64));
	EXPECT_EQ(-ENODEV, queue_state(fd, 5, 1, &st));
	EXPECT_EQ(-ENODEV, prep_one(fd, 5, 1, ucopy(&a, 0, &b, 0, 16)));
	EXPECT_EQ(-ENODEV, copy_start(fd, 5, 1, 1, 1));
	EXPECT_EQ(-ENODEV, copy_wait(fd, 5, 1, 0, NULL));
	EXPECT_EQ(-ENODEV, udma_memcpy(fd, &a, 0, &b, 0, 16, 0));
	EXPECT_EQ(-ENODEV, queue_release(fd, 5, 1));
	/* The coherent memory went with the device: the mapping is empty. */
	EXPECT_EQ(SIGBUS, touch_signal(kept.map, false));
	EXPECT_EQ(SIGBUS, touch_signal(kept.map + 4096, true));
	EXPECT_EQ(SIGBUS, touch_signal(dmap, false));
	EXPECT_EQ(SIGBUS, touch_signal(dmap + 4096, true));
	munmap(kept.map, kept.size);
	munmap(dmap, b.size);
	EXPECT_EQ(0, close(fd));

	ret = sysfs_write(UDMA_DRV_DIR "/bind", bdf);
	ASSERT_EQ(0, ret) {
		TH_LOG("bind %s: %s", bdf, strerror(-ret));
	}
	fd2 = udma_open_wait();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, udma_info(fd2, &info));
	ASSERT_EQ(0, queue_init(fd2, 5, 1, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd2, 8192, &a2));
	fill_pattern(a2.map, 8192, 3);
	ASSERT_EQ(0, copy_sync(fd2, 5, 1, ucopy(&a2, 0, &a2, 4096, 4096)));
	ASSERT_EQ(-1, first_diff(a2.map + 4096, a2.map, 4096));
	close(fd2);
}

TEST_HARNESS_MAIN
