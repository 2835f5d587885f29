// SPDX-License-Identifier: GPL-2.0
/*
 * MEM_IMPORT (ABI 2): the caller's own memory pinned for DMA (zero-copy).
 *
 * Lifetime: import/free, close with imports live, fork while imported (the child gets copies,
 * the parent keeps the pinned pages), munmap while imported (the pages stay pinned and valid
 * until MEM_FREE); the pinned-page counters of /proc/vmstat (nr_foll_pin_acquired and
 * nr_foll_pin_released) come back to balance after every free and close. Limits:
 * RLIMIT_MEMLOCK exceeded is ENOMEM with nothing pinned or charged. Access: a read-only import
 * as destination is EPERM, IMPORT_WRITE of a read-only mapping EFAULT. Geometry: unaligned
 * starts and ends copied byte-exact with their neighbours untouched; a copy crossing a run
 * boundary is EXDEV without NEURON_UDMA_COPY_SPLIT and one pair per piece with it. Size: a
 * 64 MiB import copied host -> HBM -> host byte-exact with MEMCPY and with queue copies.
 */
#include <linux/capability.h>
#include <sys/syscall.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

/* Host connectivity on every generation (hardware.rst §2.5). */
#define ENG 4U
#define QID 1U
#define RING 4096U
#define KIB 1024UL
#define MIB (1024UL * KIB)
#define BIG (64 * MIB)

/* ---- helpers ---- */

static long page_sz(void)
{
	return sysconf(_SC_PAGESIZE);
}

/* COPY_PREPARE(_ONE) on the test's queue, keeping the pair count. */
#define prep_one_n(fd, c) prep_one_pairs(fd, ENG, QID, c)
#define prep_n(fd, c, n) prep_pairs(fd, ENG, QID, c, n)
/* How long a close may take to unpin (deferred work). */
#define SETTLE_MS 5000

/* Anonymous private memory of @len bytes, or NULL. */
static unsigned char *anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* Host -> import (or import -> host) through the user queue: COPY_PREPARE_ONE + COPY_WAIT. */
static int qcopy(int fd, struct neuron_udma_copy c)
{
	int ret;

	c.flags |= NEURON_UDMA_COPY_SPLIT;
	ret = prep_one_n(fd, c);
	if (ret < 0)
		return ret;
	return copy_wait(fd, ENG, QID, 0, NULL);
}

/*
 * Two pages at a page-aligned @*out whose import has two runs: the physical pages are swapped
 * (mremap) if they happen to be contiguous. 0 or -errno.
 */
static int two_runs(int fd, unsigned char **out)
{
	long pg = page_sz();
	unsigned char *p = anon(2 * pg), *t = anon(pg);
	__u64 h;
	__u32 segs = 0;
	int ret;

	if (!p || !t)
		return -ENOMEM;
	memset(p, 0x11, 2 * pg);
	ret = udma_import(fd, p, 2 * pg, 0, &h, &segs);
	if (ret)
		return ret;
	mem_free(fd, h);
	if (segs == 1) {
		/* Contiguous (X, X + 1): swapped they are (X + 1, X), two runs. */
		if (mremap(p, pg, pg, MREMAP_MAYMOVE | MREMAP_FIXED, t) == MAP_FAILED ||
		    mremap(p + pg, pg, pg, MREMAP_MAYMOVE | MREMAP_FIXED, p) == MAP_FAILED ||
		    mremap(t, pg, pg, MREMAP_MAYMOVE | MREMAP_FIXED, p + pg) == MAP_FAILED)
			return -errno;
	} else {
		munmap(t, pg);
	}
	*out = p;
	return 0;
}

FIXTURE(imp) {
	int fd;
	long pins0;
	struct neuron_udma_info info;
	struct ubuf h;		/* host buffer, 1 MiB */
	struct ubuf d;		/* device buffer, 1 MiB */
};

FIXTURE_SETUP(imp)
{
	self->pins0 = pins_held();
	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("cannot open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_LE(2U, self->info.abi_version);	/* MEM_IMPORT came with ABI 2 */
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, RING, RING));
	ASSERT_EQ(0, ubuf_host(self->fd, MIB, &self->h));
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &self->d));
}

FIXTURE_TEARDOWN(imp)
{
	long now;

	ubuf_free(self->fd, &self->h);
	ubuf_free(self->fd, &self->d);
	close(self->fd);
	/* Whatever a case imported is unpinned once its file is closed. */
	now = pins_settle(self->pins0, SETTLE_MS);
	EXPECT_EQ(self->pins0, now) {
		TH_LOG("%ld pages still pinned after close", now - self->pins0);
	}
}

/* Import and free: the pins come and go with the handle. */
TEST_F(imp, import_free_balance)
{
	size_t len = 256 * KIB;
	unsigned char *p = anon(len);
	long pins;
	__u64 h, h2;
	__u32 segs = 0;

	ASSERT_NE(NULL, p);
	memset(p, 0x5a, len);
	pins = pins_held();
	ASSERT_EQ(0, udma_import(self->fd, p, len, NEURON_UDMA_IMPORT_WRITE, &h, &segs));
	EXPECT_NE(0ULL, h);
	EXPECT_LE(1U, segs);
	EXPECT_GE((__u32)(len / page_sz()), segs);
	EXPECT_EQ(pins + (long)(len / page_sz()), pins_held());
	/* The same range twice: two handles, twice the pins. */
	ASSERT_EQ(0, udma_import(self->fd, p, len, 0, &h2, NULL));
	EXPECT_NE(h, h2);
	EXPECT_EQ(pins + 2 * (long)(len / page_sz()), pins_held());
	/* The import reads what the process wrote. */
	ASSERT_EQ(0, udma_memcpy(self->fd, &(struct ubuf){ .handle = h2, .size = len }, 0, &self->h, 0, len, 0));
	EXPECT_EQ(-1, first_diff(self->h.map, p, len));
	EXPECT_EQ(0, mem_free(self->fd, h));
	EXPECT_EQ(0, mem_free(self->fd, h2));
	EXPECT_EQ(-ENOENT, mem_free(self->fd, h));
	EXPECT_EQ(pins, pins_held());
	munmap(p, len);
}

/* Bad arguments are refused before anything is pinned. */
TEST_F(imp, bad_arguments)
{
	struct neuron_udma_mem_import m;
	unsigned char *p = anon(2 * page_sz());
	long pins = pins_held();
	__u64 h;
	int ret;

	ASSERT_NE(NULL, p);
	p[0] = 1;
	EXPECT_EQ(-EINVAL, udma_import(self->fd, p, 0, 0, &h, NULL));
	EXPECT_EQ(-EINVAL, udma_import(self->fd, p, self->info.max_import_size + 1, 0, &h, NULL));
	EXPECT_EQ(-EINVAL, udma_import(self->fd, (void *)(uintptr_t)~0xFFFUL, 0x2000, 0, &h, NULL));
	EXPECT_EQ(-EINVAL, udma_import(self->fd, p, 4096, 1U << 5, &h, NULL));
	memset(&m, 0, sizeof(m));
	m.addr = (uintptr_t)p;
	m.size = 4096;
	m.reserved[1] = 1;
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_MEM_IMPORT, &m));
	/* Unmapped memory. */
	munmap(p + page_sz(), page_sz());
	EXPECT_EQ(-EFAULT, udma_import(self->fd, p, 2 * page_sz(), 0, &h, NULL));
	/* A driver host buffer's mapping (coherent pages mapped by the driver) cannot be pinned. */
	ret = udma_import(self->fd, self->h.map, 4096, 0, &h, NULL);
	EXPECT_TRUE(ret == -EFAULT || ret == -EOPNOTSUPP) {
		TH_LOG("import of a host buffer mapping: %d (%s)", ret, strerror(-ret));
	}
	EXPECT_EQ(pins, pins_held());
	munmap(p, page_sz());
}

/* A read-only import is never a destination: EPERM, nothing written. */
TEST_F(imp, read_only_as_destination_eperm)
{
	struct neuron_udma_queue_state st0, st1;
	struct neuron_udma_copy c;
	size_t len = 64 * KIB, i;
	unsigned char *p = anon(len);
	struct ubuf ib;
	char why[256];
	__u64 h;

	ASSERT_NE(NULL, p);
	memset(p, 0x33, len);
	ASSERT_EQ(0, udma_import(self->fd, p, len, 0, &h, NULL));
	ib = import_ubuf(h, len);
	memset(self->h.map, 0x44, len);
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st0));
	c = ucopy(&self->h, 0, &ib, 0, 4096);
	EXPECT_EQ(-EPERM, prep_one_n(self->fd, c));
	c.flags = NEURON_UDMA_COPY_SPLIT;
	EXPECT_EQ(-EPERM, prep_one_n(self->fd, c));
	EXPECT_EQ(-EPERM, prep_n(self->fd, &c, 1));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st1));
	EXPECT_EQ(0, state_diff(&st0, &st1, why, sizeof(why))) {
		TH_LOG("%s", why);
	}
	EXPECT_EQ(-EPERM, udma_memcpy(self->fd, &self->h, 0, &ib, 0, len, 0));
	EXPECT_EQ(-EPERM, udma_memcpy(self->fd, &self->d, 0, &ib, 0, 4096, 0));
	/* As a source it works. */
	ASSERT_EQ(0, qcopy(self->fd, ucopy(&ib, 0, &self->h, 0, len)));
	EXPECT_EQ(-1, first_diff(self->h.map, p, len));
	for (i = 0; i < len && p[i] == 0x33; i++)
		;
	EXPECT_EQ(len, i);
	EXPECT_EQ(0, mem_free(self->fd, h));
	munmap(p, len);
}

/* IMPORT_WRITE of a read-only mapping: EFAULT; read-only import of it works. */
TEST_F(imp, write_import_of_read_only_mapping_efault)
{
	size_t len = 4 * page_sz();
	unsigned char *p = anon(len);
	long pins;
	__u64 h;

	ASSERT_NE(NULL, p);
	memset(p, 0x77, len);
	ASSERT_EQ(0, mprotect(p, len, PROT_READ));
	pins = pins_held();
	EXPECT_EQ(-EFAULT, udma_import(self->fd, p, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	EXPECT_EQ(pins, pins_held());
	ASSERT_EQ(0, udma_import(self->fd, p, len, 0, &h, NULL));
	ASSERT_EQ(0, udma_memcpy(self->fd, &(struct ubuf){ .handle = h, .size = len }, 0, &self->h, 0, len, 0));
	EXPECT_EQ(-1, first_diff(self->h.map, p, len));
	EXPECT_EQ(0, mem_free(self->fd, h));
	munmap(p, len);
}

/*
 * Unaligned start and end (addr + 1, 3 pages + 5 bytes) as destination and source, with MEMCPY
 * and with queue copies: byte-exact, and the bytes around the import untouched.
 */
TEST_F(imp, unaligned_start_and_end)
{
	long pg = page_sz();
	size_t len = 3 * pg + 5, area = 5 * pg;
	unsigned char *p = anon(area), *want = malloc(area);
	struct ubuf ib;
	__u64 h;
	int via;

	ASSERT_NE(NULL, p);
	ASSERT_NE(NULL, want);
	for (via = 0; via < 2; via++) {
		memset(p, 0xEE, area);
		ASSERT_EQ(0, udma_import(self->fd, p + 1, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
		ib = import_ubuf(h, len);
		fill_pattern(self->h.map, len + 7, 30 + via);
		if (via == 0) {
			ASSERT_EQ(0, udma_memcpy(self->fd, &self->h, 7, &ib, 0, len, 0));
		} else {
			ASSERT_EQ(0, qcopy(self->fd, ucopy(&self->h, 7, &ib, 0, len)));
		}
		memset(want, 0xEE, area);
		memcpy(want + 1, self->h.map + 7, len);
		EXPECT_EQ(-1, first_diff(p, want, area)) {
			TH_LOG("%s: byte %ld of the area (import at +1, %zu bytes)",
			       via ? "queue" : "MEMCPY", first_diff(p, want, area), len);
		}
		/* Back out, from mid first page to the import's end, to an odd host offset. */
		memset(self->h.map, 0, len + 64);
		if (via == 0) {
			ASSERT_EQ(0, udma_memcpy(self->fd, &ib, pg - 2, &self->h, 3, 2 * pg + 7, 0));
		} else {
			ASSERT_EQ(0, qcopy(self->fd, ucopy(&ib, pg - 2, &self->h, 3, 2 * pg + 7)));
		}
		EXPECT_EQ(-1, first_diff(self->h.map + 3, p + 1 + pg - 2, 2 * pg + 7));
		EXPECT_EQ(0, self->h.map[2]);
		EXPECT_EQ(0, self->h.map[3 + 2 * pg + 7]);
		/* The last byte of the import and one beyond: ERANGE. */
		EXPECT_EQ(0, udma_memcpy(self->fd, &ib, len - 1, &self->h, 0, 1, 0));
		EXPECT_EQ(-ERANGE, udma_memcpy(self->fd, &ib, len - 1, &self->h, 0, 2, 0));
		EXPECT_EQ(-ERANGE, prep_one_n(self->fd, ucopy(&self->h, 0, &ib, len - 1, 2)));
		EXPECT_EQ(0, mem_free(self->fd, h));
	}
	free(want);
	munmap(p, area);
}

/*
 * A copy crossing the run boundary of an import: EXDEV without COPY_SPLIT (nothing written);
 * with it, the number of pairs written, which COPY_START takes and COPY_WAIT completes.
 */
TEST_F(imp, split_at_run_boundary)
{
	struct neuron_udma_queue_state st0, st1;
	struct neuron_udma_copy c[3];
	long pg = page_sz();
	unsigned char *p = NULL;
	struct ubuf ib;
	char why[256];
	__u64 h, done;
	__u32 segs = 0;
	int n;

	ASSERT_EQ(0, two_runs(self->fd, &p));
	ASSERT_EQ(0, udma_import(self->fd, p, 2 * pg, NEURON_UDMA_IMPORT_WRITE, &h, &segs));
	ASSERT_EQ(2U, segs);
	ib = import_ubuf(h, 2 * pg);
	fill_pattern(self->h.map, 2 * pg, 51);
	memset(p, 0, 2 * pg);

	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st0));
	EXPECT_EQ(-EXDEV, prep_one_n(self->fd, ucopy(&self->h, 0, &ib, pg - 100, 200)));
	EXPECT_EQ(-EXDEV, prep_one_n(self->fd, ucopy(&ib, pg - 1, &self->h, 0, 2)));
	c[0] = ucopy(&self->h, 0, &ib, 0, 64);
	c[1] = ucopy(&self->h, 0, &ib, pg - 100, 200);
	EXPECT_EQ(-EXDEV, prep_n(self->fd, c, 2));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st1));
	EXPECT_EQ(0, state_diff(&st0, &st1, why, sizeof(why))) {
		TH_LOG("EXDEV changed the queue: %s", why);
	}

	/* Within one run: one pair, returned as 0 without the flag, as 1 with it. */
	EXPECT_EQ(0, prep_one_n(self->fd, ucopy(&self->h, 0, &ib, 0, pg)));
	c[0] = ucopy(&self->h, pg, &ib, pg, pg);
	c[0].flags = NEURON_UDMA_COPY_SPLIT;
	EXPECT_EQ(1, prep_one_n(self->fd, c[0]));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	EXPECT_EQ(-1, first_diff(p, self->h.map, 2 * pg));

	/* Across: two pairs, started by hand with that count. */
	memset(p, 0, 2 * pg);
	fill_pattern(self->h.map, 2 * pg, 52);
	c[0] = ucopy(&self->h, 10, &ib, pg - 1000, 3000);
	c[0].flags = NEURON_UDMA_COPY_SPLIT;
	n = prep_one_n(self->fd, c[0]);
	ASSERT_EQ(2, n);
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st1));
	EXPECT_EQ(2U, st1.tx.sw_pending);
	EXPECT_EQ(2U, st1.rx.sw_pending);
	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, n, n));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &done));
	EXPECT_EQ(3ULL, done);	/* two pairs and the marker */
	EXPECT_EQ(-1, first_diff(p + pg - 1000, self->h.map + 10, 3000));
	EXPECT_EQ(0, p[pg - 1001]);
	EXPECT_EQ(0, p[pg + 2000]);

	/* A batch: one split entry counts all its pairs; the import as source too. */
	c[0] = ucopy(&ib, 0, &self->h, 8192, 2 * pg);
	c[0].flags = NEURON_UDMA_COPY_SPLIT;
	c[1] = ucopy(&self->h, 0, &self->d, 0, 4096);
	c[2] = ucopy(&ib, pg, &self->d, 4096, 100);
	n = prep_n(self->fd, c, 3);
	EXPECT_EQ(4, n);
	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, n, n));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &done));
	EXPECT_EQ(5ULL, done);
	EXPECT_EQ(-1, first_diff(self->h.map + 8192, p, 2 * pg));
	/* COPY_START beyond what was prepared is refused, as before. */
	EXPECT_EQ(-EINVAL, copy_start(self->fd, ENG, QID, 1, 1));
	EXPECT_EQ(0, mem_free(self->fd, h));
	munmap(p, 2 * pg);
}

/*
 * Closing a file with imports live (one with a prepared, unstarted copy, one with copies in
 * flight) unpins everything: the teardown's check sees the pins balanced.
 */
TEST_F(imp, close_with_imports_live)
{
	struct neuron_udma_copy_prepare_one po = { .engine = ENG, .queue = QID + 1 };
	size_t len = 512 * KIB;
	unsigned char *a = anon(len), *b = anon(len);
	struct ubuf ia, ib;
	long pins;
	__u64 ha, hb;
	int fd2;

	ASSERT_NE(NULL, a);
	ASSERT_NE(NULL, b);
	fill_pattern(a, len, 61);
	memset(b, 0, len);
	pins = pins_held();
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, queue_init(fd2, ENG, QID + 1, 64, 64));
	ASSERT_EQ(0, udma_import(fd2, a, len, 0, &ha, NULL));
	ASSERT_EQ(0, udma_import(fd2, b, len, NEURON_UDMA_IMPORT_WRITE, &hb, NULL));
	EXPECT_EQ(pins + 2 * (long)(len / page_sz()), pins_held());
	ia = import_ubuf(ha, len);
	ib = import_ubuf(hb, len);
	po.copy = ucopy(&ia, 0, &ib, 0, UDMA_MAX_COPY);
	po.copy.flags = NEURON_UDMA_COPY_SPLIT;
	ASSERT_LE(1, ioctl(fd2, NEURON_UDMA_COPY_PREPARE_ONE, &po));
	/* Busy while a descriptor can reach it. */
	EXPECT_EQ(-EBUSY, mem_free(fd2, hb));
	close(fd2);
	EXPECT_EQ(pins, pins_settle(pins, SETTLE_MS));
	munmap(a, len);
	munmap(b, len);
}

/*
 * fork while imported: the child gets copies of the pinned pages (its writes never reach the
 * device's view), the parent keeps the pinned ones (its writes do, and the device's writes
 * reach it).
 */
TEST_F(imp, fork_while_imported)
{
	size_t len = 16 * page_sz();
	unsigned char *p = anon(len), *want = malloc(len);
	struct ubuf ib;
	__u64 h;
	pid_t pid;
	int st;

	ASSERT_NE(NULL, p);
	ASSERT_NE(NULL, want);
	fill_pattern(p, len, 71);
	memcpy(want, p, len);
	ASSERT_EQ(0, udma_import(self->fd, p, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	ib = import_ubuf(h, len);
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		/* The child's view starts as the parent's; then it scribbles over its copy. */
		int same = !memcmp(p, want, len);

		memset(p, 0xC1, len);
		_exit(same ? 0 : 3);
	}
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	ASSERT_TRUE(WIFEXITED(st));
	EXPECT_EQ(0, WEXITSTATUS(st));
	/* The device reads the parent's bytes, not the child's. */
	memset(self->h.map, 0, len);
	ASSERT_EQ(0, udma_memcpy(self->fd, &ib, 0, &self->h, 0, len, 0));
	EXPECT_EQ(-1, first_diff(self->h.map, want, len));
	/* The parent's later writes are what the device reads. */
	fill_pattern(p, len, 72);
	ASSERT_EQ(0, qcopy(self->fd, ucopy(&ib, 0, &self->h, 0, len)));
	EXPECT_EQ(-1, first_diff(self->h.map, p, len));
	/* And what the device writes is what the parent reads. */
	fill_pattern(self->h.map, len, 73);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->h, 0, &ib, 0, len, 0));
	EXPECT_EQ(-1, first_diff(p, self->h.map, len));
	EXPECT_EQ(0, mem_free(self->fd, h));
	free(want);
	munmap(p, len);
}

/*
 * munmap while imported: the pages stay pinned and valid for the device (a copy into the
 * import after the munmap works and reads back), and MEM_FREE releases every pin.
 */
TEST_F(imp, munmap_while_imported)
{
	size_t len = 32 * page_sz(), i;
	unsigned char *p = anon(len), *again, *want = malloc(len);
	long pins = pins_held();
	struct ubuf ib;
	__u64 h;

	ASSERT_NE(NULL, p);
	ASSERT_NE(NULL, want);
	fill_pattern(p, len, 81);
	fill_pattern(want, len, 81);
	ASSERT_EQ(0, udma_import(self->fd, p, len, NEURON_UDMA_IMPORT_WRITE, &h, NULL));
	ib = import_ubuf(h, len);
	ASSERT_EQ(0, munmap(p, len));
	EXPECT_EQ(pins + (long)(len / page_sz()), pins_held());
	/* Somebody else's mapping lands there (likely at the same address): untouched below. */
	again = anon(len);
	ASSERT_NE(NULL, again);
	memset(again, 0x99, len);
	/* The device still reads the old bytes... */
	memset(self->h.map, 0, len);
	ASSERT_EQ(0, udma_memcpy(self->fd, &ib, 0, &self->h, 0, len, 0));
	EXPECT_EQ(-1, first_diff(self->h.map, want, len));
	/* ...and writes the pinned pages, not the new mapping, with MEMCPY and a queue copy. */
	fill_pattern(self->h.map, len, 82);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->h, 0, &ib, 0, len / 2, 0));
	ASSERT_EQ(0, qcopy(self->fd, ucopy(&self->h, len / 2, &ib, len / 2, len / 2)));
	ASSERT_EQ(0, udma_memcpy(self->fd, &ib, 0, &self->d, 0, len, 0));
	memset(self->h.map + MIB / 2, 0, len);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->d, 0, &self->h, MIB / 2, len, 0));
	EXPECT_EQ(-1, first_diff(self->h.map + MIB / 2, self->h.map, len));
	for (i = 0; i < len && again[i] == 0x99; i++)
		;
	EXPECT_EQ(len, i);
	EXPECT_EQ(0, mem_free(self->fd, h));
	EXPECT_EQ(pins, pins_held());
	free(want);
	munmap(again, len);
}

/* ---- RLIMIT_MEMLOCK: a process without CAP_IPC_LOCK ---- */

/*
 * Imports are charged to the user's locked memory (user_struct::locked_vm, as io_uring charges
 * pinned pages; /proc shows no per-user figure), limited by RLIMIT_MEMLOCK. The child runs with
 * real uid UID_A (a user that pins nothing else: its budget is exactly the limit) and effective
 * uid 0 (it can still fold the vmstat counters), without CAP_IPC_LOCK. Budget arithmetic shows
 * that a refused import kept no charge: after each ENOMEM, exactly the rest of the budget can
 * still be imported.
 */
#define LOCK_LIMIT (256 * KIB)

struct lock_report {
	int step, err;
	long pins[4];
};

static int lock_child(void *arg)
{
	struct lock_report *r = arg;
	unsigned char *p = anon(2 * LOCK_LIMIT);
	__u64 h1, h2, h3;
	int fd, ret;

	r->step = 1;
	if (!p)
		return 1;
	memset(p, 0x3c, 2 * LOCK_LIMIT);
	r->step = 2;
	if (setresuid(UID_A, 0, 0)) {
		r->err = -errno;
		return 1;
	}
	r->err = drop_ipc_lock();
	if (!r->err)
		r->err = sec_memlock(LOCK_LIMIT);
	if (r->err)
		return 1;
	r->step = 3;
	fd = udma_open();
	if (fd < 0) {
		r->err = -errno;
		return 1;
	}
	r->pins[0] = pins_held();
	/* Above the limit at once. */
	r->step = 4;
	ret = udma_import(fd, p, LOCK_LIMIT + 4 * KIB, 0, &h1, NULL);
	if (ret != -ENOMEM) {
		r->err = ret;
		return 1;
	}
	r->pins[1] = pins_held();
	/* Half of it, then the other half plus a page: the charges add up. */
	r->step = 5;
	r->err = udma_import(fd, p, LOCK_LIMIT / 2, NEURON_UDMA_IMPORT_WRITE, &h1, NULL);
	if (r->err)
		return 1;
	r->pins[2] = pins_held();
	r->step = 6;
	ret = udma_import(fd, p + LOCK_LIMIT, LOCK_LIMIT / 2 + 4 * KIB, 0, &h2, NULL);
	if (ret != -ENOMEM) {
		r->err = ret;
		return 1;
	}
	r->pins[3] = pins_held();
	/* Exactly the rest of the budget: neither ENOMEM kept a charge. */
	r->step = 7;
	r->err = udma_import(fd, p + LOCK_LIMIT, LOCK_LIMIT / 2, 0, &h2, NULL);
	if (r->err)
		return 1;
	/* The budget is full: one more page is refused. */
	r->step = 8;
	ret = udma_import(fd, p, 4 * KIB, 0, &h3, NULL);
	if (ret != -ENOMEM) {
		r->err = ret;
		return 1;
	}
	/* MEM_FREE gives the charge back: the whole limit at once works. */
	r->step = 9;
	r->err = mem_free(fd, h1);
	if (!r->err)
		r->err = mem_free(fd, h2);
	if (!r->err)
		r->err = udma_import(fd, p, LOCK_LIMIT, 0, &h3, NULL);
	if (!r->err)
		r->err = mem_free(fd, h3);
	if (r->err)
		return 1;
	close(fd);
	r->step = 10;
	return 0;
}

TEST_F_TIMEOUT(imp, rlimit_memlock_enomem_pins_nothing, 60)
{
	struct lock_report *r = sec_shared(sizeof(*r));
	int rc;

	ASSERT_NE(NULL, r);
	rc = sec_reap(sec_spawn(0, lock_child, r));
	EXPECT_EQ(0, rc) {
		TH_LOG("step %d: %s", r->step, r->err ? strerror(-r->err) : "unexpected result");
	}
	TH_LOG("pins held: %ld at open, %ld after ENOMEM, %ld with half imported, %ld after ENOMEM",
	       r->pins[0], r->pins[1], r->pins[2], r->pins[3]);
	if (rc == 0) {
		/* ENOMEM pinned nothing. */
		EXPECT_EQ(r->pins[0], r->pins[1]);
		EXPECT_EQ(r->pins[0] + (long)(LOCK_LIMIT / 2 / page_sz()), r->pins[2]);
		EXPECT_EQ(r->pins[2], r->pins[3]);
	}
	munmap(r, sizeof(*r));
}

/* ---- 64 MiB both ways ---- */

/*
 * 64 MiB of the process's memory, imported read-only, to HBM and back into another 64 MiB
 * imported writable, through an HBM window (the trn1 model has 64 MiB of HBM): with MEMCPY,
 * then with queue copies (COPY_SPLIT, started with the pair counts COPY_PREPARE returns).
 */
TEST_F_TIMEOUT(imp, big_import_round_trip, 600)
{
	__u64 win = self->info.device_mem_size / 2, off, n, hs, hd;
	unsigned char *src = anon(BIG), *dst = anon(BIG);
	struct neuron_udma_copy *c;
	struct ubuf is, id, hbm;
	__u32 segs_s = 0, segs_d = 0, i, k;
	int via, ret;

	ASSERT_NE(NULL, src);
	ASSERT_NE(NULL, dst);
	if (win > 16 * MIB)
		win = 16 * MIB;
	win &= ~(__u64)(UDMA_MAX_COPY - 1);
	ASSERT_LE((__u64)UDMA_MAX_COPY, win);
	ASSERT_EQ(0, ubuf_dev(self->fd, win, &hbm));
	c = calloc(win / UDMA_MAX_COPY, sizeof(*c));
	ASSERT_NE(NULL, c);
	fill_pattern(src, BIG, 91);
	ASSERT_EQ(0, udma_import(self->fd, src, BIG, 0, &hs, &segs_s));
	is = import_ubuf(hs, BIG);
	for (via = 0; via < 2; via++) {
		memset(dst, 0, BIG);
		ASSERT_EQ(0, udma_import(self->fd, dst, BIG, NEURON_UDMA_IMPORT_WRITE, &hd, &segs_d));
		id = import_ubuf(hd, BIG);
		for (off = 0; off < BIG; off += win) {
			n = BIG - off < win ? BIG - off : win;
			if (via == 0) {
				ASSERT_EQ(0, udma_memcpy(self->fd, &is, off, &hbm, 0, n, 0));
				ASSERT_EQ(0, udma_memcpy(self->fd, &hbm, 0, &id, off, n, 0));
				continue;
			}
			for (k = 0; k < 2; k++) {
				/* Batches of 64 copies: at most 64 * (1 + 16) pairs, within the ring. */
				for (i = 0; i < n / UDMA_MAX_COPY; i++) {
					__u64 o = (__u64)i * UDMA_MAX_COPY;

					c[i] = k ? ucopy(&hbm, o, &id, off + o, UDMA_MAX_COPY) :
						   ucopy(&is, off + o, &hbm, o, UDMA_MAX_COPY);
					c[i].flags = NEURON_UDMA_COPY_SPLIT;
				}
				for (i = 0; i < n / UDMA_MAX_COPY; i += 64) {
					__u32 cnt = n / UDMA_MAX_COPY - i < 64 ? n / UDMA_MAX_COPY - i : 64;

					ret = prep_n(self->fd, c + i, cnt);
					ASSERT_LE((int)cnt, ret) {
						TH_LOG("COPY_PREPARE of %u copies: %d", cnt, ret);
					}
					ASSERT_EQ(0, copy_start(self->fd, ENG, QID, ret, ret));
					ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
				}
			}
		}
		EXPECT_EQ(0, mem_free(self->fd, hd));
		EXPECT_EQ(-1, first_diff(dst, src, BIG)) {
			TH_LOG("%s: byte %ld differs", via ? "queue" : "MEMCPY", first_diff(dst, src, BIG));
		}
	}
	TH_LOG("64 MiB: source %u runs, destination %u runs, HBM window %llu MiB", segs_s, segs_d,
	       (unsigned long long)(win / MIB));
	EXPECT_EQ(0, mem_free(self->fd, hs));
	ubuf_free(self->fd, &hbm);
	free(c);
	munmap(src, BIG);
	munmap(dst, BIG);
}

TEST_HARNESS_MAIN
