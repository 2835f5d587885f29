// SPDX-License-Identifier: GPL-2.0
/*
 * Usage counters (Documentation/userspace-api.rst, "Counters";
 * Documentation/ABI/testing/sysfs-driver-neuron_udma): per open file in /proc/PID/fdinfo/FD
 * (host, device and imported bytes held, memlock charged, bytes copied, fences completed and
 * failed), per device in sysfs (memory held by type, its peak, the device memory available).
 * And the device's activity counters in sysfs (copies, bytes, fences completed and failed,
 * queue resets by cause, engine aborts, ring memory). Every figure is checked exactly against
 * what the test did.
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
	EXPECT_EQ((long long)info.device_mem_size, udma_counter(bdf, "mem_device_total_bytes"));
	host0 = udma_counter(bdf, "mem_host_bytes");
	dev0 = udma_counter(bdf, "mem_device_bytes");
	ASSERT_LE(0, host0);
	ASSERT_LE(0, dev0);
	ASSERT_EQ(0, ubuf_dev(fa, 1024 * KIB, &a));
	ASSERT_EQ(0, ubuf_dev(fb, 256 * KIB, &b));
	ASSERT_EQ(0, ubuf_host(fb, 64 * KIB, &c));
	/* A mapping holds its file open: closing fb below must release it. */
	munmap(c.map, c.size);
	EXPECT_EQ(dev0 + 1280 * (long long)KIB, udma_counter(bdf, "mem_device_bytes"));
	EXPECT_EQ(host0 + 64 * (long long)KIB, udma_counter(bdf, "mem_host_bytes"));
	peak = udma_counter(bdf, "mem_device_peak_bytes");
	EXPECT_LE(dev0 + 1280 * (long long)KIB, peak);
	EXPECT_LE(udma_counter(bdf, "mem_host_bytes"), udma_counter(bdf, "mem_host_peak_bytes"));
	ASSERT_EQ(0, ubuf_free(fa, &a));
	EXPECT_EQ(dev0 + 256 * (long long)KIB, udma_counter(bdf, "mem_device_bytes"));
	/* Closing a file gives back what it held; the peak stays. */
	close(fb);
	EXPECT_EQ(dev0, udma_counter(bdf, "mem_device_bytes"));
	EXPECT_EQ(host0, udma_counter(bdf, "mem_host_bytes"));
	EXPECT_EQ(peak, udma_counter(bdf, "mem_device_peak_bytes"));
	close(fa);
}

/* The device's activity counters, read all at once (sysfs names, in this order). */
static const char *const activity[] = {
	"copies", "copy_bytes", "fences_completed", "fences_failed", "queue_resets_engine_error",
	"queue_resets_timeout", "queue_resets_other", "engine_aborts", "ring_host_bytes",
	"ring_device_bytes",
};

enum { COPIES, COPY_BYTES, FENCES_DONE, FENCES_FAILED, RESETS_EIO, RESETS_TIMEOUT, RESETS_OTHER,
       ABORTS, RING_HOST, RING_DEVICE, NR_ACTIVITY };

static void read_activity(const char *bdf, long long *v)
{
	for (int i = 0; i < NR_ACTIVITY; i++)
		v[i] = udma_counter(bdf, activity[i]);
}

/*
 * A known sequence against the device's activity counters: the copies and bytes of prepared
 * copies and of a MEMCPY, a fence done, a fence failed by an engine error (one abort, one
 * reset for EIO), the ring memory while the queue is held; they stay after the file is closed.
 */
TEST_F_TIMEOUT(cnt, sysfs_activity_follows_a_known_sequence, 120)
{
	long long a[NR_ACTIVITY], b[NR_ACTIVITY], rings;
	struct neuron_udma_copy two[2];
	struct neuron_udma_copy_prepare p = { .engine = ENG, .queue = QID + 2, .count = 2 };
	struct ubar2 bar2;
	struct ubuf host;
	__u64 fence = 0;
	char bdf[64];
	int fd = udma_open();

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	ASSERT_EQ(0, bar2_open(&bar2));
	ASSERT_EQ(0, ubuf_host(fd, 8 * KIB, &host));
	read_activity(bdf, a);
	for (int i = 0; i < NR_ACTIVITY; i++) {
		ASSERT_LE(0, a[i]) {
			TH_LOG("no counter %s", activity[i]);
		}
	}

	/* A queue: its host memory (what its owner is charged) while it is held. */
	rings = FI("memlock-bytes");
	ASSERT_EQ(0, queue_init(fd, ENG, QID + 2, 64, 64));
	rings = FI("memlock-bytes") - rings;
	read_activity(bdf, b);
	EXPECT_LT(0, rings);
	EXPECT_EQ(a[RING_HOST] + rings, b[RING_HOST]);
	EXPECT_EQ(a[RING_DEVICE], b[RING_DEVICE]);

	/* Four copies, 600 bytes, one fence. */
	ASSERT_EQ(0, prep_one(fd, ENG, QID + 2, ucopy(&host, 0, &host, 4096, 100)));
	ASSERT_EQ(0, prep_one(fd, ENG, QID + 2, ucopy(&host, 0, &host, 4096 + 100, 200)));
	two[0] = ucopy(&host, 0, &host, 4096 + 300, 150);
	two[1] = ucopy(&host, 0, &host, 4096 + 450, 150);
	p.copies = (__u64)(unsigned long)two;
	ASSERT_EQ(0, udma_ioc(fd, NEURON_UDMA_COPY_PREPARE, &p));
	ASSERT_EQ(0, copy_submit(fd, ENG, QID + 2, &fence));
	ASSERT_EQ(0, fence_wait(fd, ENG, QID + 2, fence, 0));
	read_activity(bdf, b);
	EXPECT_EQ(a[COPIES] + 4, b[COPIES]);
	EXPECT_EQ(a[COPY_BYTES] + 600, b[COPY_BYTES]);
	EXPECT_EQ(a[FENCES_DONE] + 1, b[FENCES_DONE]);
	EXPECT_EQ(a[FENCES_FAILED], b[FENCES_FAILED]);

	/* An engine error: one abort seen, one reset for EIO, one fence failed. */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_FAIL_NTH, ENG, QID + 2, 1));
	ASSERT_EQ(0, prep_one(fd, ENG, QID + 2, ucopy(&host, 0, &host, 4096, 64)));
	ASSERT_EQ(0, copy_submit(fd, ENG, QID + 2, &fence));
	EXPECT_EQ(-EIO, fence_wait(fd, ENG, QID + 2, fence, 0));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	read_activity(bdf, b);
	EXPECT_EQ(a[COPIES] + 5, b[COPIES]);
	EXPECT_EQ(a[COPY_BYTES] + 664, b[COPY_BYTES]);
	EXPECT_EQ(a[FENCES_DONE] + 1, b[FENCES_DONE]);
	EXPECT_EQ(a[FENCES_FAILED] + 1, b[FENCES_FAILED]);
	EXPECT_EQ(a[RESETS_EIO] + 1, b[RESETS_EIO]);
	EXPECT_EQ(a[RESETS_TIMEOUT], b[RESETS_TIMEOUT]);
	EXPECT_EQ(a[RESETS_OTHER], b[RESETS_OTHER]);
	EXPECT_EQ(a[ABORTS] + 1, b[ABORTS]);

	/* A MEMCPY: one copy of its bytes (its fences are the driver's queue's: done, not failed). */
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &host, 4096, 4096, 0));
	read_activity(bdf, b);
	EXPECT_EQ(a[COPIES] + 6, b[COPIES]);
	EXPECT_EQ(a[COPY_BYTES] + 664 + 4096, b[COPY_BYTES]);
	EXPECT_LT(a[FENCES_DONE] + 1, b[FENCES_DONE]);
	EXPECT_EQ(a[FENCES_FAILED] + 1, b[FENCES_FAILED]);

	/* The release gives the ring memory back; closing the file takes no count back. */
	ASSERT_EQ(0, queue_release(fd, ENG, QID + 2));
	close(fd);
	bar2_close(&bar2);
	read_activity(bdf, b);
	EXPECT_EQ(a[RING_HOST], b[RING_HOST]);
	EXPECT_EQ(a[COPIES] + 6, b[COPIES]);
	EXPECT_EQ(a[FENCES_FAILED] + 1, b[FENCES_FAILED]);
	EXPECT_EQ(a[RESETS_EIO] + 1, b[RESETS_EIO]);
	EXPECT_EQ(a[ABORTS] + 1, b[ABORTS]);
}

TEST_HARNESS_MAIN
