// SPDX-License-Identifier: GPL-2.0
/*
 * mmap() of device buffers (ABI 3, Documentation/userspace-api.rst): a device buffer of this
 * file maps its device memory through BAR4 (write-combined) at its mmap_offset, whole buffer
 * only; what the CPU writes there the engine reads, and what the engine writes the CPU reads;
 * after MEM_FREE every access raises SIGBUS, also on a second mapping; another file's offset,
 * a private mapping, a wrong length and an import are refused.
 */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL

FIXTURE(dmap) {
	int fd;
	struct ubuf host;
};

FIXTURE_SETUP(dmap)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, ubuf_host(self->fd, 256 * KIB, &self->host));
}

FIXTURE_TEARDOWN(dmap)
{
	close(self->fd);
}

static unsigned char *map_dev(int fd, __u64 size, __u64 off, int flags)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, fd, off);

	return p == MAP_FAILED ? NULL : p;
}

/* CPU writes through the mapping reach the engine; engine writes reach the CPU. */
TEST_F(dmap, cpu_and_engine_see_the_same_bytes)
{
	struct neuron_udma_mem_alloc a = { .size = 64 * KIB, .type = NEURON_UDMA_MEM_DEVICE };
	struct ubuf dev = { 0 };
	unsigned char *m;

	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_MEM_ALLOC, &a));
	ASSERT_NE(0ULL, a.mmap_offset);
	dev.handle = a.handle;
	dev.size = a.size;
	m = map_dev(self->fd, a.size, a.mmap_offset, MAP_SHARED);
	ASSERT_NE(NULL, m);
	/* A fresh device buffer reads as zeros (scrubbed). */
	for (size_t i = 0; i < a.size; i++)
		ASSERT_EQ(0, m[i]);
	fill_pattern(m, a.size, 7);
	ASSERT_EQ(0, udma_memcpy(self->fd, &dev, 0, &self->host, 0, a.size, 0));
	EXPECT_EQ(-1, first_diff(self->host.map, m, a.size));
	fill_pattern(self->host.map, a.size, 9);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->host, 0, &dev, 0, a.size, 0));
	EXPECT_EQ(-1, first_diff(m, self->host.map, a.size));
	munmap(m, a.size);
	EXPECT_EQ(0, mem_free(self->fd, dev.handle));
}

/* After MEM_FREE both mappings fault with SIGBUS; the range is not reachable any more. */
TEST_F(dmap, sigbus_after_free)
{
	struct neuron_udma_mem_alloc a = { .size = 16 * KIB, .type = NEURON_UDMA_MEM_DEVICE };
	unsigned char *m1, *m2;

	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_MEM_ALLOC, &a));
	m1 = map_dev(self->fd, a.size, a.mmap_offset, MAP_SHARED);
	m2 = map_dev(self->fd, a.size, a.mmap_offset, MAP_SHARED);
	ASSERT_NE(NULL, m1);
	ASSERT_NE(NULL, m2);
	m1[0] = 0x12;
	EXPECT_EQ(0x12, m2[0]);
	EXPECT_EQ(0, touch_signal(m2 + 8 * KIB, true));
	ASSERT_EQ(0, mem_free(self->fd, a.handle));
	EXPECT_EQ(SIGBUS, touch_signal(m1, false));
	EXPECT_EQ(SIGBUS, touch_signal(m2 + 8 * KIB, true));
	EXPECT_EQ(SIGBUS, touch_signal(m1 + 12 * KIB, false));
	munmap(m1, a.size);
	munmap(m2, a.size);
}

/* Refused mappings: private, wrong length, another file's buffer, an import, a freed one. */
TEST_F(dmap, refused_mappings)
{
	struct neuron_udma_mem_alloc a = { .size = 16 * KIB, .type = NEURON_UDMA_MEM_DEVICE };
	struct neuron_udma_mem_alloc theirs = { .size = 16 * KIB, .type = NEURON_UDMA_MEM_DEVICE };
	int other = udma_open();
	void *p;
	__u64 imp;
	unsigned char *page = map_dev(-1, 4096, 0, MAP_PRIVATE | MAP_ANONYMOUS);

	ASSERT_LE(0, other);
	ASSERT_NE(NULL, page);
	page[0] = 1;
	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_MEM_ALLOC, &a));
	ASSERT_EQ(0, udma_ioc(other, NEURON_UDMA_MEM_ALLOC, &theirs));
	EXPECT_EQ(NULL, map_dev(self->fd, a.size, a.mmap_offset, MAP_PRIVATE));
	EXPECT_EQ(NULL, map_dev(self->fd, a.size - 4096, a.mmap_offset, MAP_SHARED));
	EXPECT_EQ(NULL, map_dev(self->fd, a.size + 4096, a.mmap_offset, MAP_SHARED));
	EXPECT_EQ(NULL, map_dev(self->fd, theirs.size, theirs.mmap_offset, MAP_SHARED));
	p = mmap(NULL, a.size, PROT_READ | PROT_EXEC, MAP_SHARED, self->fd, a.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
	ASSERT_EQ(0, udma_import(self->fd, page, 4096, 0, &imp, NULL));
	/* An import has no mmap offset of its own: its handle's offset is not a buffer's. */
	EXPECT_EQ(NULL, map_dev(self->fd, 4096, imp << 22, MAP_SHARED));
	EXPECT_EQ(0, mem_free(self->fd, imp));
	EXPECT_EQ(0, mem_free(self->fd, a.handle));
	EXPECT_EQ(NULL, map_dev(self->fd, a.size, a.mmap_offset, MAP_SHARED));
	close(other);
	munmap(page, 4096);
}

/* A mapping is not inherited: the child's access faults, the parent's still works. */
TEST_F(dmap, not_inherited_by_fork)
{
	struct neuron_udma_mem_alloc a = { .size = 8 * KIB, .type = NEURON_UDMA_MEM_DEVICE };
	unsigned char *m;
	pid_t pid;
	int status;

	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_MEM_ALLOC, &a));
	m = map_dev(self->fd, a.size, a.mmap_offset, MAP_SHARED);
	ASSERT_NE(NULL, m);
	m[5] = 0x66;
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0)
		_exit(touch_signal(m, false) == SIGSEGV ? 0 : 1);
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	EXPECT_EQ(0x66, m[5]);
	munmap(m, a.size);
	EXPECT_EQ(0, mem_free(self->fd, a.handle));
}

TEST_HARNESS_MAIN
