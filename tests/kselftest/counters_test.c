// SPDX-License-Identifier: GPL-2.0
/*
 * Usage counters (Documentation/userspace-api.rst, "Counters";
 * Documentation/ABI/testing/sysfs-driver-neuron_udma): per open file in /proc/PID/fdinfo/FD
 * (host, device and imported bytes held, memlock charged, bytes copied, fences completed and
 * failed), per device in sysfs (memory held by type, its peak, the device memory available).
 * Every figure is checked exactly against what the test did.
 */
#define _GNU_SOURCE
#include "kselftest_harness.h"
#include "udma_fence.h"

#define KIB 1024LL

/* Field @key of the fdinfo of @fd, or -1. */
static long long fdinfo(int fd, const char *key)
{
	char path[64], line[256];
	size_t n = strlen(key);
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':') {
			v = strtoll(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* Counter @name of the device's sysfs group, or -1. */
static long long usage(const char *bdf, const char *name)
{
	char path[256], buf[64] = "";
	FILE *f;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/neuron_udma/%s", bdf, name);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return buf[0] ? strtoll(buf, NULL, 10) : -1;
}

/* A fixture only for the harness's per-test timeouts. */
FIXTURE(cnt) {
	int unused;
};

FIXTURE_SETUP(cnt)
{
}

FIXTURE_TEARDOWN(cnt)
{
}

#define FI(key) fdinfo(fd, "neuron_udma-" key)

/* Engine 15 is host-connected on both generations (as in fence_test). */
#define ENG 15
#define QID 5

TEST_F_TIMEOUT(cnt, fdinfo_tracks_buffers_copies_and_fences, 120)
{
	struct ubuf host, dev;
	unsigned char *page;
	__u64 imp, fence = 0;
	int fd = udma_open();
	long long rings;

	ASSERT_LE(0, fd);
	EXPECT_EQ(0, FI("buffers"));
	EXPECT_EQ(0, FI("host-bytes"));
	EXPECT_EQ(0, FI("memlock-bytes"));
	EXPECT_EQ(0, FI("copy-bytes"));
	EXPECT_EQ(0, FI("fences-completed"));
	ASSERT_EQ(0, ubuf_host(fd, 12 * KIB, &host));		/* charged 16 KiB (a power of two) */
	ASSERT_EQ(0, ubuf_dev(fd, 64 * KIB, &dev));
	page = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, page);
	memset(page, 1, 4 * 4096);
	ASSERT_EQ(0, udma_import(fd, page + 100, 2 * 4096, 0, &imp, NULL));	/* 3 pages */
	EXPECT_EQ(3, FI("buffers"));
	EXPECT_EQ(12 * KIB, FI("host-bytes"));
	EXPECT_EQ(64 * KIB, FI("device-bytes"));
	EXPECT_EQ(2 * 4096, FI("imported-bytes"));
	EXPECT_EQ(16 * KIB + 3 * 4096, FI("memlock-bytes"));
	ASSERT_EQ(0, queue_init(fd, ENG, QID, 64, 64));
	EXPECT_EQ(1, FI("queues"));
	rings = FI("memlock-bytes") - (16 * KIB + 3 * 4096);
	EXPECT_LT(0, rings);

	/* Copies: MEMCPY, MEMSET, and prepared pairs, each counted by its bytes. */
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &dev, 0, 4096, 0));
	EXPECT_EQ(4096, FI("copy-bytes"));
	struct neuron_udma_memset ms = { .handle = dev.handle, .size = 10, .value = 7 };
	ASSERT_EQ(0, udma_ioc(fd, NEURON_UDMA_MEMSET, &ms));
	EXPECT_EQ(4096 + 10, FI("copy-bytes"));
	ASSERT_EQ(0, prep_one(fd, ENG, QID, ucopy(&host, 0, &dev, 100, 100)));
	ASSERT_EQ(0, prep_one(fd, ENG, QID, ucopy(&host, 200, &dev, 300, 100)));
	EXPECT_EQ(4096 + 10 + 200, FI("copy-bytes"));
	ASSERT_EQ(0, copy_submit(fd, ENG, QID, &fence));
	ASSERT_EQ(1ULL, fence);
	ASSERT_EQ(0, fence_wait(fd, ENG, QID, fence, 0));
	EXPECT_EQ(1, FI("fences-completed"));
	EXPECT_EQ(0, FI("fences-failed"));
	/* Released queues keep their fences counted; their rings are no longer charged. */
	ASSERT_EQ(0, queue_release(fd, ENG, QID));
	EXPECT_EQ(0, FI("queues"));
	EXPECT_EQ(1, FI("fences-completed"));
	EXPECT_EQ(16 * KIB + 3 * 4096, FI("memlock-bytes"));
	/* Frees take their bytes away. */
	ASSERT_EQ(0, mem_free(fd, imp));
	ASSERT_EQ(0, ubuf_free(fd, &host));
	EXPECT_EQ(1, FI("buffers"));
	EXPECT_EQ(0, FI("host-bytes"));
	EXPECT_EQ(0, FI("imported-bytes"));
	EXPECT_EQ(0, FI("memlock-bytes"));
	EXPECT_EQ(64 * KIB, FI("device-bytes"));
	close(fd);
	munmap(page, 4 * 4096);
}

/* A fence dropped by an engine error counts as failed. */
TEST_F_TIMEOUT(cnt, fdinfo_counts_failed_fences, 120)
{
	struct ubar2 bar2;
	struct ubuf host;
	__u64 fence = 0;
	int fd = udma_open();

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, bar2_open(&bar2));
	ASSERT_EQ(0, ubuf_host(fd, 8 * KIB, &host));
	ASSERT_EQ(0, queue_init(fd, ENG, QID + 1, 64, 64));
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_FAIL_NTH, ENG, QID + 1, 1));
	ASSERT_EQ(0, prep_one(fd, ENG, QID + 1, ucopy(&host, 0, &host, 4096, 64)));
	ASSERT_EQ(0, copy_submit(fd, ENG, QID + 1, &fence));
	EXPECT_EQ(-EIO, fence_wait(fd, ENG, QID + 1, fence, 0));
	EXPECT_EQ(1, FI("fences-failed"));
	EXPECT_EQ(0, FI("fences-completed"));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);
	close(fd);
}

/* The device's counters: bytes held per type by every file, their peak, the total. */
TEST_F_TIMEOUT(cnt, sysfs_usage_by_type, 120)
{
	struct neuron_udma_info info;
	struct ubuf a, b, c;
	long long host0, dev0, peak;
	char bdf[64];
	int fa = udma_open(), fb = udma_open();

	ASSERT_LE(0, fa);
	ASSERT_LE(0, fb);
	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	ASSERT_EQ(0, udma_info(fa, &info));
	EXPECT_EQ((long long)info.device_mem_size, usage(bdf, "mem_device_total_bytes"));
	host0 = usage(bdf, "mem_host_bytes");
	dev0 = usage(bdf, "mem_device_bytes");
	ASSERT_LE(0, host0);
	ASSERT_LE(0, dev0);
	ASSERT_EQ(0, ubuf_dev(fa, 1024 * KIB, &a));
	ASSERT_EQ(0, ubuf_dev(fb, 256 * KIB, &b));
	ASSERT_EQ(0, ubuf_host(fb, 64 * KIB, &c));
	/* A mapping holds its file open: closing fb below must release it. */
	munmap(c.map, c.size);
	EXPECT_EQ(dev0 + 1280 * (long long)KIB, usage(bdf, "mem_device_bytes"));
	EXPECT_EQ(host0 + 64 * (long long)KIB, usage(bdf, "mem_host_bytes"));
	peak = usage(bdf, "mem_device_peak_bytes");
	EXPECT_LE(dev0 + 1280 * (long long)KIB, peak);
	EXPECT_LE(usage(bdf, "mem_host_bytes"), usage(bdf, "mem_host_peak_bytes"));
	ASSERT_EQ(0, ubuf_free(fa, &a));
	EXPECT_EQ(dev0 + 256 * (long long)KIB, usage(bdf, "mem_device_bytes"));
	/* Closing a file gives back what it held; the peak stays. */
	close(fb);
	EXPECT_EQ(dev0, usage(bdf, "mem_device_bytes"));
	EXPECT_EQ(host0, usage(bdf, "mem_host_bytes"));
	EXPECT_EQ(peak, usage(bdf, "mem_device_peak_bytes"));
	close(fa);
}

TEST_HARNESS_MAIN
