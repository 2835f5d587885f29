// SPDX-License-Identifier: GPL-2.0
/*
 * MEMSET (ABI 3, Documentation/userspace-api.rst): a range of a host, device or writable
 * imported buffer of this file filled with one byte value by the engine, on the driver's shared
 * H2T queue with MEMCPY's rules: the bytes around the range stay, errors leave the buffer as it
 * was, a read-only import is EPERM, another file's handle ENOENT, and a MEMSET abandoned by
 * SIGKILL keeps its buffer busy (MEM_FREE EBUSY) until the engine is done with it.
 */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL
#define MIB (1024UL * 1024)

static int do_memset(int fd, __u64 handle, __u64 off, __u64 size, __u32 value, __u32 timeout_ms)
{
	struct neuron_udma_memset m = {
		.handle = handle, .offset = off, .size = size, .value = value,
		.timeout_ms = timeout_ms,
	};

	return udma_ioc(fd, NEURON_UDMA_MEMSET, &m);
}

/* Whether @len bytes at @p all equal @v. */
static bool all_eq(const unsigned char *p, size_t len, unsigned char v)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != v)
			return false;
	return true;
}

static __u32 h2t_engine(const struct neuron_udma_info *info)
{
	return info->generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
}

FIXTURE(fill) {
	int fd;
	struct neuron_udma_info info;
	struct ubuf host;
};

#define HOST_SIZE (4 * MIB)

FIXTURE_SETUP(fill)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ(0, ubuf_host(self->fd, HOST_SIZE, &self->host));
	memset(self->host.map, 0x11, HOST_SIZE);
}

FIXTURE_TEARDOWN(fill)
{
	close(self->fd);
}

/* Host buffer: odd offsets and sizes across the 64 KiB pieces; the bytes around stay. */
TEST_F_TIMEOUT(fill, host_ranges, 120)
{
	static const struct { __u64 off, size; __u32 value; } cases[] = {
		{ 0, 1, 0xAB }, { 3, 4093, 0x00 }, { 65535, 2, 0xFF },
		{ 100, 65536, 0x5A }, { 7, 3 * 65536 + 11, 0xC3 }, { 0, HOST_SIZE, 0x7E },
	};
	unsigned char *m = self->host.map;

	for (unsigned int i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		__u64 off = cases[i].off, size = cases[i].size;

		memset(m, 0x11, HOST_SIZE);
		ASSERT_EQ(0, do_memset(self->fd, self->host.handle, off, size, cases[i].value, 0))
			TH_LOG("case %u", i);
		EXPECT_TRUE(all_eq(m + off, size, cases[i].value)) TH_LOG("case %u", i);
		EXPECT_TRUE(all_eq(m, off, 0x11)) TH_LOG("case %u: bytes before", i);
		EXPECT_TRUE(all_eq(m + off + size, HOST_SIZE - off - size, 0x11))
			TH_LOG("case %u: bytes after", i);
	}
}

/* Device buffer: filled, then copied out by MEMCPY; every value of a byte works. */
TEST_F_TIMEOUT(fill, device_buffer_every_value, 120)
{
	struct ubuf dev;
	unsigned char *m = self->host.map;

	ASSERT_EQ(0, ubuf_dev(self->fd, 256 * 4096, &dev));
	for (unsigned int v = 0; v < 256; v++) {
		ASSERT_EQ(0, do_memset(self->fd, dev.handle, v * 4096, 4096, v, 0)) {
			TH_LOG("value %u", v);
		}
	}
	ASSERT_EQ(0, do_memset(self->fd, dev.handle, 5 * 4096 + 9, 10, 0x99, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &dev, 0, &self->host, 0, 256 * 4096, 0));
	for (unsigned int v = 0; v < 256; v++) {
		if (v == 5) {
			EXPECT_TRUE(all_eq(m + 5 * 4096, 9, 5));
			EXPECT_TRUE(all_eq(m + 5 * 4096 + 9, 10, 0x99));
			EXPECT_TRUE(all_eq(m + 5 * 4096 + 19, 4096 - 19, 5));
			continue;
		}
		EXPECT_TRUE(all_eq(m + v * 4096, 4096, v)) TH_LOG("value %u", v);
	}
	EXPECT_EQ(0, ubuf_free(self->fd, &dev));
}

/* Imports: writable ones are filled in the user's pages; a read-only one is EPERM, untouched. */
TEST_F(fill, imports)
{
	size_t len = 3 * 4096 + 123;
	unsigned char *p = malloc(len + 64);
	__u64 rw, ro;

	ASSERT_NE(NULL, p);
	memset(p, 0x22, len + 64);
	ASSERT_EQ(0, udma_import(self->fd, p + 5, len, NEURON_UDMA_IMPORT_WRITE, &rw, NULL));
	ASSERT_EQ(0, udma_import(self->fd, p + 5, len, 0, &ro, NULL));
	ASSERT_EQ(0, do_memset(self->fd, rw, 1, len - 2, 0xE1, 0));
	EXPECT_TRUE(all_eq(p, 6, 0x22));
	EXPECT_TRUE(all_eq(p + 6, len - 2, 0xE1));
	/* The last byte of the import, and the 59 after it that malloc gave. */
	EXPECT_TRUE(all_eq(p + 4 + len, 60, 0x22));
	EXPECT_EQ(-EPERM, do_memset(self->fd, ro, 0, 16, 0x33, 0));
	EXPECT_TRUE(all_eq(p + 6, len - 2, 0xE1));
	EXPECT_EQ(0, mem_free(self->fd, rw));
	EXPECT_EQ(0, mem_free(self->fd, ro));
	free(p);
}

/* Bad calls: each errno, and the buffer as it was. */
TEST_F(fill, errors_leave_the_buffer)
{
	int other = udma_open();
	struct ubuf theirs;
	unsigned char *m = self->host.map;

	ASSERT_LE(0, other);
	ASSERT_EQ(0, ubuf_host(other, 4096, &theirs));
	memset(m, 0x11, HOST_SIZE);
	EXPECT_EQ(-EINVAL, do_memset(self->fd, self->host.handle, 0, 0, 1, 0));
	EXPECT_EQ(-EINVAL, do_memset(self->fd, self->host.handle, 0, 16, 256, 0));
	EXPECT_EQ(-EINVAL, do_memset(self->fd, self->host.handle, 0, 16, 0xFFFFFFFF, 0));
	EXPECT_EQ(-ERANGE, do_memset(self->fd, self->host.handle, HOST_SIZE - 1, 2, 1, 0));
	EXPECT_EQ(-ERANGE, do_memset(self->fd, self->host.handle, ~0ULL, 2, 1, 0));
	EXPECT_EQ(-ERANGE, do_memset(self->fd, self->host.handle, 1, ~0ULL, 1, 0));
	EXPECT_EQ(-ENOENT, do_memset(self->fd, theirs.handle, 0, 16, 1, 0));
	EXPECT_EQ(-ENOENT, do_memset(self->fd, 0xdead0000, 0, 16, 1, 0));
	EXPECT_TRUE(all_eq(m, HOST_SIZE, 0x11));
	EXPECT_TRUE(all_eq(theirs.map, 4096, 0));
	close(other);
}

/* ---- SIGKILL mid-fill: the buffer stays busy until the engine is done ---- */

struct kill_report {
	int step, err;
	__u64 handle, size;
	volatile int go;
};

static struct ubar2 kill_bar2;
static __u32 kill_h2t;

/* Starts a fill of most of device memory on the stalled shared queue; the parent kills it. */
static int kill_child(void *arg)
{
	struct kill_report *r = arg;
	int fd = udma_open();

	if (fd < 0)
		return r->err = fd, 2;
	r->err = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, r->size, &r->handle, NULL);
	if (r->err)
		return 3;
	r->step = 1;
	/* The parent stalls the shared queue (after the allocation's own scrub), then says go. */
	while (!r->go)
		usleep(1000);
	r->step = 2;
	r->err = do_memset(fd, r->handle, 0, r->size, 0x5C, 30000);
	r->step = 2;
	return 0;
}

TEST_F_TIMEOUT(fill, sigkill_keeps_the_buffer_busy, 180)
{
	struct kill_report *r = sec_shared(sizeof(*r));
	struct ubuf probe;
	pid_t pid;
	int ret;

	ASSERT_NE(NULL, r);
	/* More than half of device memory: a second one fits only once the first is back. */
	r->size = (self->info.device_mem_size * 5 / 8) & ~(MIB - 1);
	ASSERT_EQ(0, bar2_open(&kill_bar2));
	kill_h2t = h2t_engine(&self->info);
	pid = sec_spawn(0, kill_child, r);
	ASSERT_LT(0, pid);
	for (int i = 0; i < 3000 && r->step < 1; i++)
		sleep_ms(10);
	if (r->step < 1)
		kill(pid, SIGKILL);
	ASSERT_EQ(1, r->step) TH_LOG("the child's allocation: %s", strerror(-r->err));
	/* The shared queue stalls for 3 s: the fill is on the ring when the kill comes. */
	ASSERT_EQ(0, bar2_fault(&kill_bar2, FAULT_STALL, kill_h2t, 0, 3000));
	r->go = 1;
	for (int i = 0; i < 200 && r->step < 2; i++)
		sleep_ms(10);
	sleep_ms(300);
	kill(pid, SIGKILL);
	ret = sec_reap(pid);
	EXPECT_EQ(128 + SIGKILL, ret);
	/* While the engine may still write it, the killed file's buffer is not given back... */
	EXPECT_EQ(-ENOMEM, raw_alloc(self->fd, NEURON_UDMA_MEM_DEVICE, r->size, &probe.handle, NULL));
	/* ...and it is once the fill is done (the stall and the reaper's time). */
	ret = -ENOMEM;
	for (int i = 0; i < 100 && ret; i++) {
		ret = raw_alloc(self->fd, NEURON_UDMA_MEM_DEVICE, r->size, &probe.handle, NULL);
		if (ret)
			sleep_ms(100);
	}
	EXPECT_EQ(0, ret);
	if (!ret)
		EXPECT_EQ(0, mem_free(self->fd, probe.handle));
	bar2_write(&kill_bar2, BAR2_CLEAR, 1);
	bar2_close(&kill_bar2);
	munmap(r, sizeof(*r));
}

/* A MEMSET on the stalled queue that times out leaves its buffer busy until it is done. */
TEST_F_TIMEOUT(fill, timeout_keeps_the_buffer_busy, 60)
{
	struct ubuf dev;
	int ret;

	ASSERT_EQ(0, bar2_open(&kill_bar2));
	ASSERT_EQ(0, ubuf_dev(self->fd, 4 * MIB, &dev));
	ASSERT_EQ(0, bar2_fault(&kill_bar2, FAULT_STALL, h2t_engine(&self->info), 0, 2000));
	EXPECT_EQ(-ETIMEDOUT, do_memset(self->fd, dev.handle, 0, 4 * MIB, 0x42, 50));
	EXPECT_EQ(-EBUSY, mem_free(self->fd, dev.handle));
	ret = -EBUSY;
	for (int i = 0; i < 100 && ret == -EBUSY; i++) {
		sleep_ms(100);
		ret = mem_free(self->fd, dev.handle);
		if (ret == -EBUSY)
			/* A MEMSET or MEMCPY of the file reaps what is done. */
			do_memset(self->fd, self->host.handle, 0, 1, 0, 1000);
	}
	EXPECT_EQ(0, ret);
	bar2_write(&kill_bar2, BAR2_CLEAR, 1);
	bar2_close(&kill_bar2);
}

TEST_HARNESS_MAIN
