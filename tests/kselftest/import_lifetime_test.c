// SPDX-License-Identifier: GPL-2.0
/*
 * The lifetime of MEM_IMPORT's pins (ABI 2), with NEURON_UDMA_COPY_SPLIT: a user imports its own
 * memory and then does everything a process can do to that memory (munmap, MADV_DONTNEED,
 * fork, hugetlb, memfd truncation, read-only and PROT_NONE mappings, the driver's own buffer
 * mapping, ranges with holes past the first pin batch, SIGKILL during a large pin), under a
 * small RLIMIT_MEMLOCK as an unprivileged user, with split copies on a 32-descriptor ring.
 *
 * Each test fails when the driver breaks a rule of the contract: pins and locked-memory
 * charges are given back on every error, MEM_FREE and close (the pinned-page counters of
 * /proc/vmstat balance, the user's limit is usable again), a failing call changes nothing,
 * the engine never writes a read-only import, the pinned pages stay the importer's whatever
 * the process does with the range (the new mapping is not written), and a success moved the
 * bytes.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mman.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL
#define MIB (1024 * KIB)
#define PG 4096UL
#define ENGINE 13
#define QUEUE 2

static int import_raw(int fd, __u64 addr, __u64 size, __u32 flags)
{
	struct neuron_udma_mem_import m = { .addr = addr, .size = size, .flags = flags };
	int ret = udma_ioc(fd, NEURON_UDMA_MEM_IMPORT, &m);

	if (!ret)
		mem_free(fd, m.handle);
	return ret;
}

/*
 * @pages pages of anonymous memory, each allocated with another page in between (and in
 * reverse order), so that neighbours are rarely physically contiguous: an import of it has
 * several runs.
 */
static unsigned char *scattered(size_t pages, void **spacer)
{
	unsigned char *p = mmap(NULL, pages * PG, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *s = mmap(NULL, pages * PG, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	size_t i;

	if (p == MAP_FAILED || s == MAP_FAILED)
		return NULL;
	madvise(p, pages * PG, MADV_NOHUGEPAGE);
	madvise(s, pages * PG, MADV_NOHUGEPAGE);
	for (i = pages; i-- > 0;) {
		p[i * PG] = 1;
		s[i * PG] = 1;
	}
	*spacer = s;
	return p;
}

#define prep_one_q(fd, q, c) prep_one_pairs(fd, ENGINE, q, c)
#define prep_q(fd, q, c, n) prep_pairs(fd, ENGINE, q, c, n)
#define prep_one_n(fd, c) prep_one_q(fd, QUEUE, c)
#define prep_n(fd, c, n) prep_q(fd, QUEUE, c, n)
/* How long the pins may take to come back (deferred work, a killed copy's last submission). */
#define SETTLE_MS 10000

/*
 * Runs go up to the physically contiguous length the page allocator gave (anonymous memory
 * faulted in order often comes in runs of hundreds of KiB), not just the engine's 64 KiB: the
 * DMA mapping must not hand the device segments longer than it declared (the DMA API debug
 * code warns about those). Runs first: that code reports only the first error of a boot.
 */
TEST(import_long_runs_within_dma_limits)
{
	const char *warn = "longer than device claims to support";
	const size_t len = 32 * MIB;
	long before = pins_held();
	unsigned char *mem;
	struct ubuf dev, im;
	__u32 segs = 0;
	__u64 h;
	int fd;

	ASSERT_EQ(0, klog_has(warn)) TH_LOG("the kernel log already holds the warning");
	fd = udma_open();
	ASSERT_LE(0, fd);
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, mem);
	memset(mem, 0x6b, len);
	ASSERT_EQ(0, udma_import(fd, mem, len, NEURON_UDMA_IMPORT_WRITE, &h, &segs));
	TH_LOG("32 MiB in %u runs", segs);
	im = import_ubuf(h, len);
	ASSERT_EQ(0, ubuf_dev(fd, len, &dev));
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &dev, 0, len, 0));
	memset(mem, 0, len);
	ASSERT_EQ(0, udma_memcpy(fd, &dev, 0, &im, 0, len, 0));
	EXPECT_EQ(0x6b, mem[0]);
	EXPECT_EQ(0x6b, mem[len / 2 + 12345]);
	EXPECT_EQ(0x6b, mem[len - 1]);
	EXPECT_EQ(0, mem_free(fd, h));
	EXPECT_EQ(0, klog_has(warn));
	close(fd);
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
	munmap(mem, len);
}

/* Bad input: every error leaves nothing pinned, and the range checks hold. */
TEST(import_bad_input_pins_nothing)
{
	struct neuron_udma_mem_import m;
	struct neuron_udma_info info;
	long before = pins_held();
	unsigned char *ro, *none, *big;
	struct ubuf host;
	int fd, ret;

	ASSERT_LE(0, before);
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	ASSERT_EQ(1ULL << 30, info.max_import_size);
	ro = mmap(NULL, 68 * KIB, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	none = mmap(NULL, 64 * KIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, ro);
	ASSERT_NE(MAP_FAILED, none);
	ASSERT_EQ(0, mprotect(ro + 64 * KIB, 4 * KIB, PROT_NONE));

	EXPECT_EQ(-EINVAL, import_raw(fd, (uintptr_t)ro, 0, 0));
	EXPECT_EQ(-EINVAL, import_raw(fd, (uintptr_t)ro, info.max_import_size + 1, 0));
	EXPECT_EQ(-EINVAL, import_raw(fd, ~0ULL - 100, 4096, 0));
	EXPECT_EQ(-EINVAL, import_raw(fd, (uintptr_t)ro, 4096, 2));
	memset(&m, 0, sizeof(m));
	m.addr = (uintptr_t)ro;
	m.size = 4096;
	m.reserved[1] = 1;
	EXPECT_EQ(-EINVAL, udma_ioc(fd, NEURON_UDMA_MEM_IMPORT, &m));
	/* Kernel and unmapped addresses, read-only with IMPORT_WRITE, PROT_NONE. */
	EXPECT_EQ(-EFAULT, import_raw(fd, 0xffff888000000000ULL, 4096, 0));
	EXPECT_EQ(-EFAULT, import_raw(fd, 0xffffffffff600000ULL, 4096, 0));
	EXPECT_EQ(-EFAULT, import_raw(fd, 0x1000, 4096, 0));
	EXPECT_EQ(-EFAULT, import_raw(fd, (uintptr_t)ro, 64 * KIB, NEURON_UDMA_IMPORT_WRITE));
	EXPECT_EQ(-EFAULT, import_raw(fd, (uintptr_t)none, 4096, 0));
	EXPECT_EQ(-EFAULT, import_raw(fd, (uintptr_t)none, 4096, NEURON_UDMA_IMPORT_WRITE));
	/* The range may end in PROT_NONE after valid pages: partial pins are given back. */
	EXPECT_EQ(-EFAULT, import_raw(fd, (uintptr_t)ro, 64 * KIB + 4096, 0));

	/* The driver's own host buffer mapping (PFN map): never pinned. */
	ASSERT_EQ(0, ubuf_host(fd, 64 * KIB, &host));
	memset(host.map, 0x5a, 64 * KIB);
	ret = import_raw(fd, (uintptr_t)host.map, 64 * KIB, 0);
	EXPECT_TRUE(ret == -EFAULT || ret == -EOPNOTSUPP) TH_LOG("own mapping: %d", ret);
	ret = import_raw(fd, (uintptr_t)host.map, 64 * KIB, NEURON_UDMA_IMPORT_WRITE);
	EXPECT_TRUE(ret == -EFAULT || ret == -EOPNOTSUPP) TH_LOG("own mapping, write: %d", ret);

	/* A hole after the first pin batch (4096 pages): the pinned part is given back. */
	big = mmap(NULL, 24 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, big);
	memset(big, 1, 24 * MIB);
	ASSERT_EQ(0, munmap(big + 20 * MIB, PG));
	EXPECT_EQ(-EFAULT, import_raw(fd, (uintptr_t)big, 24 * MIB, NEURON_UDMA_IMPORT_WRITE));
	EXPECT_EQ(-EFAULT, import_raw(fd, (uintptr_t)big + 1, 24 * MIB - 2, 0));
	EXPECT_EQ(before, pins_held());
	ASSERT_EQ(0, ubuf_free(fd, &host));
	close(fd);
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
	munmap(big, 24 * MIB);
	munmap(ro, 68 * KIB);
	munmap(none, 64 * KIB);
}

/* Round trips at odd offsets through an import, split copies, EXDEV without the flag. */
TEST(import_roundtrip_and_split)
{
	const size_t pages = 48;
	unsigned char *mem, *want;
	void *spacer;
	struct neuron_udma_queue_state s0, s1;
	struct neuron_udma_copy c[40];
	long before = pins_held();
	__u64 h, size = pages * PG - 200, off;
	struct ubuf host, im;
	__u32 segs = 0;
	char why[256];
	int fd, ret, n, i;

	fd = udma_open();
	ASSERT_LE(0, fd);
	mem = scattered(pages, &spacer);
	ASSERT_NE(NULL, mem);
	want = malloc(pages * PG);
	ASSERT_NE(NULL, want);
	fill_pattern(mem, pages * PG, 1);
	ASSERT_EQ(0, udma_import(fd, mem + 100, size, NEURON_UDMA_IMPORT_WRITE, &h, &segs));
	EXPECT_LE(2U, segs) TH_LOG("a scattered range of %zu pages has %u runs", pages, segs);
	im = import_ubuf(h, size);
	EXPECT_EQ(before + (long)pages, pins_held());
	ASSERT_EQ(0, ubuf_host(fd, 256 * KIB, &host));

	/* MEMCPY both ways (run by run). */
	memset(host.map, 0, 256 * KIB);
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &host, 7, size, 0));
	EXPECT_EQ(-1, first_diff(host.map + 7, mem + 100, size));
	fill_pattern(host.map, 256 * KIB, 2);
	memcpy(want, mem, pages * PG);
	memcpy(want + 100 + 3, host.map + 11, size - 3);
	ASSERT_EQ(0, udma_memcpy(fd, &host, 11, &im, 3, size - 3, 0));
	EXPECT_EQ(-1, first_diff(mem, want, pages * PG));
	/* Out of range by one byte. */
	EXPECT_EQ(-ERANGE, udma_memcpy(fd, &host, 0, &im, 1, size, 0));
	EXPECT_EQ(-ERANGE, udma_memcpy(fd, &im, size, &host, 0, 1, 0));

	/* Queue copies: 64 KiB windows cross runs; EXDEV without SPLIT changes nothing. */
	ASSERT_EQ(0, queue_init(fd, ENGINE, QUEUE, 256, 256));
	ASSERT_EQ(0, queue_init(fd, ENGINE, QUEUE + 1, 32, 32));
	ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE, &s0));
	ret = -1;
	for (off = 0; off + 65536 <= size && segs >= 2; off += 4096) {
		ret = prep_one_n(fd, ucopy(&host, 0, &im, off, 65536));
		if (ret == -EXDEV)
			break;
		ASSERT_EQ(0, ret);
		ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 5000, NULL));
		ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE, &s0));
	}
	if (segs >= 2) {
		ASSERT_EQ(-EXDEV, ret);
		ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE, &s1));
		EXPECT_EQ(0, state_diff(&s0, &s1, why, sizeof(why))) TH_LOG("%s", why);
		/* The same copy with SPLIT: several pairs, all moved. */
		fill_pattern(host.map, 256 * KIB, 3);
		c[0] = ucopy(&host, 5, &im, off + 1, 65535);
		c[0].flags = NEURON_UDMA_COPY_SPLIT;
		n = prep_one_n(fd, c[0]);
		ASSERT_LE(2, n);
		ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE, &s1));
		EXPECT_EQ((unsigned int)n, s1.tx.sw_pending);
		EXPECT_EQ((unsigned int)n, s1.rx.sw_pending);
		/* COPY_START may not start more than the pairs written. */
		EXPECT_EQ(-EINVAL, copy_start(fd, ENGINE, QUEUE, n + 1, n));
		EXPECT_EQ(0, copy_start(fd, ENGINE, QUEUE, n, n));
		EXPECT_EQ(-EBUSY, mem_free(fd, h));
		ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 5000, NULL));
		EXPECT_EQ(-1, first_diff(mem + 100 + off + 1, host.map + 5, 65535));

		/*
		 * All or nothing on a 32-descriptor ring (16 pairs): a batch of split copies that
		 * does not fit fails with ENOSPC and writes nothing, or with E2BIG when one of its
		 * copies alone has more pieces than the empty ring takes; a single such copy is
		 * E2BIG (ENOSPC would tell the caller to wait for space that never comes).
		 */
		for (i = 0; i < 40; i++) {
			c[i] = ucopy(&im, off, &host, 0, 65536);
			c[i].flags = NEURON_UDMA_COPY_SPLIT;
		}
		ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE + 1, &s0));
		ret = prep_q(fd, QUEUE + 1, c, 14);
		EXPECT_TRUE(ret == -ENOSPC || ret == -E2BIG) TH_LOG("batch of 14: %d", ret);
		ret = prep_q(fd, QUEUE + 1, c, 1);
		TH_LOG("one split copy of %d pairs (%d on the big ring) on an empty 32-ring (%u free): %d",
		       n, prep_one_q(fd, QUEUE, c[0]), s0.tx.sw_available, ret);
		if (ret > 0)
			ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE + 1, 5000, NULL));
		ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 5000, NULL));
		ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE + 1, &s0));
		c[0] = ucopy(&host, 5, &im, off + 1, 65535);
		c[0].flags = NEURON_UDMA_COPY_SPLIT;
		ret = prep_one_q(fd, QUEUE + 1, c[0]);
		if (ret < 0) {
			EXPECT_EQ(-E2BIG, ret);
			ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE + 1, &s1));
			EXPECT_EQ(0, state_diff(&s0, &s1, why, sizeof(why))) TH_LOG("%s", why);
		} else {
			ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE + 1, 5000, NULL));
		}
		/* Nothing kept a reference: the import can be freed now and again later. */
		EXPECT_EQ(0, mem_free(fd, h));
		ASSERT_EQ(0, udma_import(fd, mem + 100, size, NEURON_UDMA_IMPORT_WRITE, &h, &segs));
		im = import_ubuf(h, size);
		/* An import without IMPORT_WRITE is never a destination (EPERM, nothing written). */
	}
	EXPECT_EQ(0, mem_free(fd, h));
	ASSERT_EQ(0, udma_import(fd, mem, pages * PG, 0, &h, NULL));
	im = import_ubuf(h, pages * PG);
	memcpy(want, mem, pages * PG);
	ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE, &s0));
	c[0] = ucopy(&host, 0, &host, 4096, 4096);
	c[1] = ucopy(&host, 0, &im, 0, 4096);
	c[1].flags = NEURON_UDMA_COPY_SPLIT;
	EXPECT_EQ(-EPERM, prep_n(fd, c, 2));
	EXPECT_EQ(-EPERM, prep_one_n(fd, c[1]));
	EXPECT_EQ(-EPERM, udma_memcpy(fd, &host, 0, &im, 0, 4096, 0));
	ASSERT_EQ(0, queue_state(fd, ENGINE, QUEUE, &s1));
	EXPECT_EQ(0, state_diff(&s0, &s1, why, sizeof(why))) TH_LOG("%s", why);
	EXPECT_EQ(-1, first_diff(mem, want, pages * PG));
	EXPECT_EQ(0, mem_free(fd, h));
	EXPECT_EQ(before, pins_held());

	/* Prepared, never started pairs on an import: close gives every pin back. */
	ASSERT_EQ(0, udma_import(fd, mem, pages * PG, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	im = import_ubuf(h, pages * PG);
	c[0] = ucopy(&host, 0, &im, 0, 65536);
	c[0].flags = NEURON_UDMA_COPY_SPLIT;
	ASSERT_LE(1, prep_one_n(fd, c[0]));
	EXPECT_EQ(-EBUSY, mem_free(fd, h));
	EXPECT_EQ(-EBUSY, ubuf_free(fd, &host));
	close(fd);
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
	munmap(mem, pages * PG);
	munmap(spacer, pages * PG);
	free(want);
}

/*
 * The pinned pages stay the importer's whatever the process does with the range: after
 * munmap + a new mapping at the same address, or MADV_DONTNEED, the engine writes the old
 * pages, never the new ones; fork gives the child copies.
 */
TEST(import_survives_munmap_dontneed_fork)
{
	const size_t len = 64 * KIB;
	unsigned char *mem, *again;
	long before = pins_held();
	struct ubuf host, host2, im;
	__u64 h;
	int fd, st;
	pid_t pid;

	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ubuf_host(fd, len, &host));
	ASSERT_EQ(0, ubuf_host(fd, len, &host2));
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, mem);
	memset(mem, 0x11, len);
	ASSERT_EQ(0, udma_import(fd, mem, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	im = import_ubuf(h, len);

	/* munmap, and a new mapping at the same address. */
	ASSERT_EQ(0, munmap(mem, len));
	again = mmap(mem, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		     -1, 0);
	ASSERT_EQ(mem, again);
	memset(again, 0x22, len);
	memset(host.map, 0x33, len);
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &im, 0, len, 0));
	EXPECT_EQ(0x22, again[0]);
	EXPECT_EQ(0x22, again[len - 1]);
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &host2, 0, len, 0));
	EXPECT_EQ(0x33, host2.map[0]);
	EXPECT_EQ(0x33, host2.map[len - 1]);
	EXPECT_EQ(0, mem_free(fd, h));
	EXPECT_EQ(before, pins_held());

	/* MADV_DONTNEED: the process gets new zero pages, the import keeps the old ones. */
	memset(again, 0x44, len);
	ASSERT_EQ(0, udma_import(fd, again, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	im = import_ubuf(h, len);
	ASSERT_EQ(0, madvise(again, len, MADV_DONTNEED));
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &im, 0, len, 0));
	EXPECT_EQ(0, again[0]);
	EXPECT_EQ(0, again[len - 1]);
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &host2, 0, len, 0));
	EXPECT_EQ(0x33, host2.map[len / 2]);
	EXPECT_EQ(0, mem_free(fd, h));
	EXPECT_EQ(before, pins_held());

	/* fork: the child's copy is its own; the child's copies through the file reach the parent's pages. */
	memset(again, 0x55, len);
	ASSERT_EQ(0, udma_import(fd, again, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	im = import_ubuf(h, len);
	memset(host.map, 0x66, len);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		int bad = 0;

		if (udma_memcpy(fd, &host, 0, &im, 0, len, 0))
			bad |= 1;
		if (again[0] != 0x55 || again[len - 1] != 0x55)
			bad |= 2;
		/* The child's own memory is not the import: writing it changes nothing there. */
		memset(again, 0x77, len);
		_exit(bad);
	}
	st = sec_reap(pid);
	EXPECT_EQ(0, st);
	EXPECT_EQ(0x66, again[0]);
	EXPECT_EQ(0x66, again[len - 1]);
	EXPECT_EQ(0, mem_free(fd, h));
	EXPECT_EQ(before, pins_held());
	ubuf_free(fd, &host);
	ubuf_free(fd, &host2);
	close(fd);
	munmap(again, len);
}

/* A memfd truncated and unmapped while imported: the pages stay pinned, then given back. */
TEST(import_truncated_memfd)
{
	const size_t len = 1 * MIB;
	long before = pins_held();
	struct ubuf dev, im;
	unsigned char *mf;
	__u64 h;
	int fd, mfd;

	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ubuf_dev(fd, len, &dev));
	mfd = memfd_create("imp", 0);
	ASSERT_LE(0, mfd);
	ASSERT_EQ(0, ftruncate(mfd, 1 * MIB));
	mf = mmap(NULL, 1 * MIB, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	ASSERT_NE(MAP_FAILED, mf);
	memset(mf, 0x3c, 1 * MIB);
	ASSERT_EQ(0, udma_import(fd, mf, 1 * MIB, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	im = import_ubuf(h, 1 * MIB);
	/* Truncated and unmapped: the engine still only writes the pinned (orphaned) pages. */
	ASSERT_EQ(0, ftruncate(mfd, 0));
	ASSERT_EQ(0, munmap(mf, 1 * MIB));
	ASSERT_EQ(0, udma_memcpy(fd, &dev, 0, &im, 0, 1 * MIB, 0));
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &dev, 0, 1 * MIB, 0));
	EXPECT_EQ(0, mem_free(fd, h));
	close(mfd);
	close(fd);
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
}

/* An unprivileged user is bounded by RLIMIT_MEMLOCK, and every error gives its charge back. */
static int memlock_child(void *arg)
{
	unsigned char *mem = arg;
	__u64 h, h2;
	int fd, ret;

	if (sec_memlock(64 * KIB))
		return 2;
	fd = udma_open();
	if (fd < 0)
		return 3;
	/* 16 pages at an unaligned address touch 17: too many. */
	if (udma_import(fd, mem + 1, 64 * KIB, 0, &h, NULL) != -ENOMEM)
		return 4;
	if (udma_import(fd, mem + 1, 64 * KIB - 1, NEURON_UDMA_IMPORT_WRITE, &h, NULL))
		return 5;
	if (udma_import(fd, mem, 1, 0, &h2, NULL) != -ENOMEM)
		return 6;
	if (mem_free(fd, h))
		return 7;
	/* Failed imports (a hole, read-only with IMPORT_WRITE) keep no charge. */
	for (int i = 0; i < 50; i++) {
		ret = udma_import(fd, mem + 64 * KIB, 8 * KIB, 0, &h2, NULL);
		if (ret != -EFAULT)
			return 8;
	}
	if (udma_import(fd, mem, 64 * KIB, NEURON_UDMA_IMPORT_WRITE, &h, NULL))
		return 9;
	/* Close gives it back, also with a second file of the same user. */
	close(fd);
	fd = udma_open();
	if (udma_import(fd, mem, 64 * KIB, 0, &h, NULL))
		return 10;
	close(fd);
	if (sec_memlock(0))
		return 11;
	fd = udma_open();
	ret = udma_import(fd, mem, 1, 0, &h, NULL);
	close(fd);
	return ret == -ENOMEM ? 0 : 12;
}

TEST(import_memlock_unprivileged)
{
	long before = pins_held();
	unsigned char *mem;
	pid_t pid;

	ASSERT_EQ(0, sec_setup(0666));
	mem = mmap(NULL, 128 * KIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, mem);
	memset(mem, 1, 128 * KIB);
	ASSERT_EQ(0, munmap(mem + 64 * KIB + 4 * KIB, 4 * KIB));
	pid = sec_spawn(UID_A, memlock_child, mem);
	ASSERT_LT(0, pid);
	EXPECT_EQ(0, sec_reap(pid));
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
	munmap(mem, 128 * KIB);
}

/* SIGKILL during a large pin: nothing stays pinned. */
static int big_import_child(void *arg)
{
	size_t len = (size_t)(uintptr_t)arg;
	unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE,
				  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	int fd = udma_open();
	int ret;

	if (mem == MAP_FAILED || fd < 0)
		return 2;
	ret = udma_import(fd, mem, len, NEURON_UDMA_IMPORT_WRITE, NULL, NULL);
	printf("# import of %zu MiB: %d\n", len >> 20, ret);
	return ret == -ENOMEM || ret == -EFAULT || ret == -EINTR ? 0 : 3;
}

TEST(import_killed_while_pinning)
{
	long before = pins_held();
	pid_t pid;
	int st;

	pid = sec_spawn(0, big_import_child, (void *)(uintptr_t)(256 * MIB));
	ASSERT_LT(0, pid);
	sleep_ms(30);
	kill(pid, SIGKILL);
	st = sec_reap(pid);
	EXPECT_TRUE(st == 128 + SIGKILL || st == 0) TH_LOG("child: %d", st);
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));

}

/*
 * SIGKILL during a MEMCPY from an import: the copy's last submission is abandoned in flight
 * and the exiting process's file is released; once the engine is done the pages are
 * unpinned (and the charge given back) without any later call on the device.
 */
static int memcpy_child(void *arg)
{
	_Atomic int *go = arg;
	size_t len = 32 * MIB;
	unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				  -1, 0);
	struct ubuf dev, im;
	__u64 h;
	int fd = udma_open();

	if (mem == MAP_FAILED || fd < 0)
		return 2;
	memset(mem, 0x5a, len);
	if (udma_import(fd, mem, len, 0, &h, NULL) || ubuf_dev(fd, len, &dev))
		return 3;
	im = import_ubuf(h, len);
	atomic_store(go, 1);
	for (;;)
		udma_memcpy(fd, &im, 0, &dev, 0, len, 0);
	return 0;
}

FIXTURE(slow) {};
FIXTURE_SETUP(slow) {}
FIXTURE_TEARDOWN(slow) {}

TEST_F_TIMEOUT(slow, import_pins_return_after_killed_memcpy, 120)
{
	_Atomic int *go = sec_shared(4096);
	long before = pins_held(), after_kill;
	int i, killed_in_flight = 0;
	pid_t pid;

	ASSERT_NE(NULL, go);
	for (i = 0; i < 3; i++) {
		atomic_store(go, 0);
		pid = sec_spawn(0, memcpy_child, (void *)go);
		ASSERT_LT(0, pid);
		while (!atomic_load(go))
			sleep_ms(1);
		sleep_ms(40 + 13 * i);
		kill(pid, SIGKILL);
		EXPECT_EQ(128 + SIGKILL, sec_reap(pid));
		/* No call on the device from here on: only the driver may give the pins back. */
		after_kill = pins_settle(before, SETTLE_MS);
		if (after_kill != before)
			killed_in_flight++;
		EXPECT_EQ(before, after_kill) TH_LOG("round %d: %ld pages still pinned", i,
						      after_kill - before);
		if (after_kill != before) {
			/* Any later call reaps them. */
			int fd = udma_open();

			mem_free(fd, 12345);
			close(fd);
			EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
		}
	}
	munmap((void *)go, 4096);
}

/*
 * The same page imported writable several times (legitimate: a process imports one buffer
 * for several uses) by an unprivileged user within the default RLIMIT_MEMLOCK: no kernel
 * warning (the DMA API debug code warns about overlapping device-writable mappings of one
 * cache line unless the mapping says the memory is cache-coherent).
 */
static int same_page_child(void *arg)
{
	unsigned char *page = arg;
	__u64 h[12];
	int fd = udma_open(), i;

	if (fd < 0)
		return 2;
	for (i = 0; i < 12; i++)
		if (udma_import(fd, page, 64, NEURON_UDMA_IMPORT_WRITE, &h[i], NULL))
			return 3;
	close(fd);
	return 0;
}

TEST(import_same_page_many_times_no_warning)
{
	const char *warn = "overlapping mappings of cacheline";
	long before = pins_held();
	unsigned char *page;
	pid_t pid;

	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, klog_has(warn)) TH_LOG("the kernel log already holds the warning");
	page = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, page);
	memset(page, 1, PG);
	pid = sec_spawn(UID_A, same_page_child, page);
	ASSERT_LT(0, pid);
	EXPECT_EQ(0, sec_reap(pid));
	EXPECT_EQ(0, klog_has(warn));
	EXPECT_EQ(before, pins_settle(before, SETTLE_MS));
	munmap(page, PG);
}

TEST_HARNESS_MAIN
