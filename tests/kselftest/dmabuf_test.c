// SPDX-License-Identifier: GPL-2.0
/*
 * dma-buf export and import (ABI 3: NEURON_UDMA_DMABUF_EXPORT, NEURON_UDMA_DMABUF_IMPORT).
 *
 * Import: a udmabuf (memfd -> /dev/udmabuf -> dma-buf) as copy source and destination, MEMCPY
 * and queue copies, with byte checks through the memfd's own mapping; a read-only import is no
 * destination (EPERM); EBADF for descriptors that are not dma-bufs; the attachment goes with
 * MEM_FREE and close (the dma-buf core's bufinfo lists it).
 *
 * Export: a device buffer of a file as a dma-buf: EINVAL for host buffers and imports, MEM_FREE
 * EBUSY while any descriptor of the dma-buf is open, the device memory back (and scrubbed) only
 * once the last one is closed, also when the file was closed first; the driver's own import of
 * its export reaches the buffer (copies through it land in the exported buffer).
 *
 * Lifetime and isolation: fork (the child's descriptors change nothing of the parent's), a
 * second user cannot use another file's handles (ENOENT) but imports a dma-buf descriptor it
 * was given (a dma-buf descriptor is the capability), unbind with a live export and import
 * (ENODEV, the export revoked: nothing can attach it any more; the module stays referenced by
 * the open dma-buf until it is closed; the imported udmabuf loses its attachment).
 *
 * Peer-to-peer (a second device importing an export) is covered by the neuron_udma_dmabuf KUnit
 * suite: the device model cannot serve DMA into another device's BAR (Documentation/udma-sim.rst,
 * "Limits").
 */
#define _GNU_SOURCE
#include <linux/udmabuf.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL
#define MIB (1024 * KIB)
#define ENGINE 13
#define QUEUE 3
#define BUFINFO "/sys/kernel/debug/dma_buf/bufinfo"

/* A udmabuf: a sealed memfd, its mapping, and the dma-buf of it. */
struct udbuf {
	int memfd;
	int dbfd;
	size_t size;
	unsigned char *map;
};

static int udbuf_create(size_t size, struct udbuf *u)
{
	struct udmabuf_create c = { .flags = UDMABUF_FLAGS_CLOEXEC, .size = size };
	int dev, ret;

	memset(u, 0, sizeof(*u));
	u->dbfd = -1;
	u->size = size;
	u->memfd = memfd_create("dmabuf_test", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (u->memfd < 0)
		return -errno;
	if (ftruncate(u->memfd, size) || fcntl(u->memfd, F_ADD_SEALS, F_SEAL_SHRINK))
		return -errno;
	u->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, u->memfd, 0);
	if (u->map == MAP_FAILED) {
		u->map = NULL;
		return -errno;
	}
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -errno;
	c.memfd = u->memfd;
	u->dbfd = ioctl(dev, UDMABUF_CREATE, &c);
	ret = u->dbfd < 0 ? -errno : 0;
	close(dev);
	return ret;
}

static void udbuf_destroy(struct udbuf *u)
{
	if (u->map)
		munmap(u->map, u->size);
	if (u->dbfd >= 0)
		close(u->dbfd);
	if (u->memfd >= 0)
		close(u->memfd);
	u->map = NULL;
	u->dbfd = u->memfd = -1;
}

static unsigned long db_ino(int dbfd)
{
	struct stat st;

	return fstat(dbfd, &st) ? 0 : st.st_ino;
}

/*
 * The devices attached to the dma-buf of inode @ino (the dma-buf core's bufinfo), -1 if there
 * is no such dma-buf any more, -2 if bufinfo cannot be read.
 */
static int db_attached(unsigned long ino)
{
	char line[512], name[128];
	unsigned long size, i;
	unsigned int flags, mode;
	long count;
	int n = -1, in = 0, devs = 0;
	FILE *f = fopen(BUFINFO, "re");

	if (!f)
		return -2;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lu %x %x %ld %127s %lu", &size, &flags, &mode, &count, name,
			   &i) == 6) {
			in = i == ino;
			devs = 0;
			if (in)
				n = 0;
		} else if (!strncmp(line, "\tAttached Devices:", 18)) {
			devs = in;
		} else if (!strncmp(line, "Total", 5)) {
			in = devs = 0;
		} else if (devs && line[0] == '\t') {
			n++;
		}
	}
	fclose(f);
	return n;
}

/* The "KEY:\tVALUE" line of /proc/self/fdinfo/@fd in @val, or -ENOENT. */
static int fdinfo_value(int fd, const char *key, char *val, size_t len)
{
	char path[64], line[256];
	size_t n = strlen(key);
	int ret = -ENOENT;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':') {
			snprintf(val, len, "%s", line + n + 1 + strspn(line + n + 1, " \t"));
			val[strcspn(val, "\n")] = 0;
			ret = 0;
			break;
		}
	fclose(f);
	return ret;
}

static long module_refcnt(void)
{
	FILE *f = fopen("/sys/module/neuron_udma/refcnt", "re");
	long n = -1;

	if (!f)
		return -1;
	if (fscanf(f, "%ld", &n) != 1)
		n = -1;
	fclose(f);
	return n;
}

FIXTURE(db) {
	int fd;
	struct neuron_udma_info info;
};

FIXTURE_SETUP(db)
{
	ASSERT_EQ(0, sec_setup(0666));
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ(3U, self->info.abi_version);
}

FIXTURE_TEARDOWN(db)
{
	if (self->fd >= 0)
		close(self->fd);
}

/* A udmabuf imported with IMPORT_WRITE: MEMCPY and queue copies both ways, byte-exact. */
TEST_F_TIMEOUT(db, import_udmabuf_source_and_destination, 120)
{
	const size_t len = 512 * KIB;
	struct neuron_udma_copy c[8];
	unsigned char *want;
	struct ubuf host, im;
	struct udbuf u;
	__u32 segs = 0;
	int fd = self->fd, ret, i, pairs = 0;

	ASSERT_EQ(0, udbuf_create(len, &u));
	want = malloc(len);
	ASSERT_NE(NULL, want);
	fill_pattern(u.map, len, 11);
	ASSERT_EQ(0, db_import(fd, u.dbfd, NEURON_UDMA_IMPORT_WRITE, &im, &segs));
	EXPECT_EQ(len, im.size);
	EXPECT_LE(1U, segs);
	TH_LOG("512 KiB udmabuf: %u runs", segs);
	/* The descriptor may go: the import holds the dma-buf. */
	close(u.dbfd);
	u.dbfd = -1;
	ASSERT_EQ(0, ubuf_host(fd, len, &host));

	/* MEMCPY: the import as source (run by run), then as destination at odd offsets. */
	memset(host.map, 0, len);
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &host, 0, len, 0));
	EXPECT_EQ(-1, first_diff(host.map, u.map, len));
	fill_pattern(host.map, len, 12);
	memcpy(want, u.map, len);
	memcpy(want + 5, host.map + 3, len - 100);
	ASSERT_EQ(0, udma_memcpy(fd, &host, 3, &im, 5, len - 100, 0));
	EXPECT_EQ(-1, first_diff(u.map, want, len));
	EXPECT_EQ(-ERANGE, udma_memcpy(fd, &host, 0, &im, 1, len, 0));

	/* Queue copies with COPY_SPLIT: 64 KiB windows, 4 KiB off the page boundaries. */
	ASSERT_EQ(0, queue_init(fd, ENGINE, QUEUE, 512, 512));
	fill_pattern(u.map, len, 13);
	memset(host.map, 0, len);
	for (i = 0; i < 4; i++) {
		c[i] = ucopy(&im, i * 65536 + 4096, &host, i * 65536, 65536);
		c[i].flags = NEURON_UDMA_COPY_SPLIT;
	}
	for (i = 4; i < 8; i++) {
		c[i] = ucopy(&host, (i - 4) * 65536, &im, 300 * KIB + (i - 4) * 50000, 50000);
		c[i].flags = NEURON_UDMA_COPY_SPLIT;
	}
	c[3].barrier = NEURON_UDMA_BARRIER_WRITE;
	ret = prep_pairs(fd, ENGINE, QUEUE, c, 4);
	ASSERT_LE(4, ret);
	pairs += ret;
	ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 0, NULL));
	EXPECT_EQ(-1, first_diff(host.map, u.map + 4096, 4 * 65536));
	memcpy(want, u.map, len);
	for (i = 0; i < 4; i++)
		memcpy(want + 300 * KIB + i * 50000, host.map + i * 65536, 50000);
	c[7].barrier = NEURON_UDMA_BARRIER_WRITE;
	ret = prep_pairs(fd, ENGINE, QUEUE, c + 4, 4);
	ASSERT_LE(4, ret);
	pairs += ret;
	ASSERT_EQ(0, copy_wait(fd, ENGINE, QUEUE, 0, NULL));
	EXPECT_EQ(-1, first_diff(u.map, want, len));
	TH_LOG("8 queue copies took %d pairs", pairs);

	ASSERT_EQ(0, queue_release(fd, ENGINE, QUEUE));
	EXPECT_EQ(0, mem_free(fd, im.handle));
	EXPECT_EQ(-ENOENT, mem_free(fd, im.handle));
	EXPECT_EQ(0, ubuf_free(fd, &host));
	udbuf_destroy(&u);
	free(want);
}

/* Without IMPORT_WRITE the import is a source only: EPERM as destination, nothing written. */
TEST_F(db, read_only_import_is_no_destination)
{
	const size_t len = 64 * KIB;
	struct ubuf host, im;
	struct udbuf u;
	int fd = self->fd;

	ASSERT_EQ(0, udbuf_create(len, &u));
	fill_pattern(u.map, len, 21);
	ASSERT_EQ(0, db_import(fd, u.dbfd, 0, &im, NULL));
	ASSERT_EQ(0, ubuf_host(fd, len, &host));
	fill_pattern(host.map, len, 22);
	EXPECT_EQ(-EPERM, udma_memcpy(fd, &host, 0, &im, 0, len, 0));
	ASSERT_EQ(0, queue_init(fd, ENGINE, QUEUE, 64, 64));
	EXPECT_EQ(-EPERM, prep_one(fd, ENGINE, QUEUE, ucopy(&host, 0, &im, 0, 4096)));
	/* A source it is. */
	EXPECT_EQ(0, copy_sync(fd, ENGINE, QUEUE, ucopy(&im, 0, &host, 0, 4096)));
	EXPECT_EQ(-1, first_diff(host.map, u.map, 4096));
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &host, 0, len, 0));
	EXPECT_EQ(-1, first_diff(host.map, u.map, len));
	fill_pattern(host.map, len, 21);
	EXPECT_EQ(-1, first_diff(host.map, u.map, len));
	EXPECT_EQ(0, queue_release(fd, ENGINE, QUEUE));
	EXPECT_EQ(0, mem_free(fd, im.handle));
	EXPECT_EQ(0, ubuf_free(fd, &host));
	udbuf_destroy(&u);
}

/* Descriptors that are not dma-bufs, bad flags and reserved fields import nothing. */
TEST_F(db, import_bad_input)
{
	struct neuron_udma_dmabuf_import a;
	struct ubuf im;
	struct udbuf u;
	int fd = self->fd, other;

	ASSERT_EQ(0, udbuf_create(16 * KIB, &u));
	EXPECT_EQ(-EBADF, db_import(fd, -1, 0, &im, NULL));
	EXPECT_EQ(-EBADF, db_import(fd, 1000000, 0, &im, NULL));
	EXPECT_EQ(-EBADF, db_import(fd, u.memfd, 0, &im, NULL));
	EXPECT_EQ(-EBADF, db_import(fd, fd, 0, &im, NULL));
	other = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	ASSERT_LE(0, other);
	EXPECT_EQ(-EBADF, db_import(fd, other, 0, &im, NULL));
	close(other);
	EXPECT_EQ(-EINVAL, db_import(fd, u.dbfd, 2, &im, NULL));
	memset(&a, 0, sizeof(a));
	a.fd = u.dbfd;
	a.reserved = 1;
	EXPECT_EQ(-EINVAL, udma_ioc(fd, NEURON_UDMA_DMABUF_IMPORT, &a));
	EXPECT_EQ(0, db_attached(db_ino(u.dbfd)));
	/* A read-only file may not import (it could not use the buffer). */
	other = open(UDMA_DEV, O_RDONLY | O_CLOEXEC);
	ASSERT_LE(0, other);
	EXPECT_EQ(-EBADF, db_import(other, u.dbfd, 0, &im, NULL));
	close(other);
	udbuf_destroy(&u);
}

/* The attachment goes with MEM_FREE and with close, also with copies done through it. */
TEST_F(db, import_attachment_follows_the_buffer)
{
	struct ubuf host, im, im2;
	unsigned long ino;
	struct udbuf u;
	int fd = self->fd, fd2;

	ASSERT_EQ(0, udbuf_create(64 * KIB, &u));
	ino = db_ino(u.dbfd);
	ASSERT_EQ(0, db_attached(ino)) TH_LOG("%s not readable?", BUFINFO);
	ASSERT_EQ(0, db_import(fd, u.dbfd, NEURON_UDMA_IMPORT_WRITE, &im, NULL));
	ASSERT_EQ(0, db_import(fd, u.dbfd, 0, &im2, NULL));
	EXPECT_EQ(2, db_attached(ino));
	ASSERT_EQ(0, ubuf_host(fd, 64 * KIB, &host));
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &im, 0, 64 * KIB, 0));
	EXPECT_EQ(0, mem_free(fd, im.handle));
	EXPECT_EQ(1, db_attached(ino));
	/* Closing the dma-buf descriptor: the second import keeps the dma-buf. */
	close(u.dbfd);
	u.dbfd = -1;
	EXPECT_EQ(1, db_attached(ino));
	ASSERT_EQ(0, udma_memcpy(fd, &im2, 0, &host, 0, 64 * KIB, 0));
	EXPECT_EQ(-1, first_diff(host.map, u.map, 64 * KIB));
	/* Closing the file gives back the last attachment and reference: the dma-buf is gone. */
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	/* A mapping holds the file open. */
	munmap(host.map, host.size);
	close(fd);
	self->fd = -1;
	EXPECT_EQ(-1, db_attached(ino));
	close(fd2);
	udbuf_destroy(&u);
}

/* DMABUF_EXPORT of @handle with every descriptor of the process taken: its result. */
static int export_without_fds(int fd, __u64 handle)
{
	struct rlimit old, lim;
	int fds[64], n = 0, ret;

	if (getrlimit(RLIMIT_NOFILE, &old))
		return -errno;
	lim = old;
	lim.rlim_cur = 64;
	if (setrlimit(RLIMIT_NOFILE, &lim))
		return -errno;
	while (n < 64) {
		fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (fds[n] < 0)
			break;
		n++;
	}
	ret = db_export(fd, handle, 0);
	if (ret >= 0)
		close(ret);
	while (n > 0)
		close(fds[--n]);
	setrlimit(RLIMIT_NOFILE, &old);
	return ret;
}

/* EXPORT's errors: only device buffers of this file, O_CLOEXEC the only flag. */
TEST_F(db, export_bad_input)
{
	struct neuron_udma_dmabuf_export e;
	struct ubuf host, dev, im;
	struct udbuf u;
	int fd = self->fd, dbfd, other;

	ASSERT_EQ(0, ubuf_host(fd, 64 * KIB, &host));
	ASSERT_EQ(0, ubuf_dev(fd, 64 * KIB, &dev));
	ASSERT_EQ(0, udbuf_create(16 * KIB, &u));
	ASSERT_EQ(0, db_import(fd, u.dbfd, 0, &im, NULL));
	EXPECT_EQ(-EINVAL, db_export(fd, host.handle, 0));
	EXPECT_EQ(-EINVAL, db_export(fd, im.handle, 0));
	EXPECT_EQ(-ENOENT, db_export(fd, 0, 0));
	EXPECT_EQ(-ENOENT, db_export(fd, dev.handle + 1000000, 0));
	EXPECT_EQ(-EINVAL, db_export(fd, dev.handle, O_NONBLOCK));
	EXPECT_EQ(-EINVAL, db_export(fd, dev.handle, 1));
	memset(&e, 0, sizeof(e));
	e.handle = dev.handle;
	e.reserved = 1;
	EXPECT_EQ(-EINVAL, udma_ioc(fd, NEURON_UDMA_DMABUF_EXPORT, &e));
	/* Another file's buffer does not exist for this one. */
	other = udma_open();
	ASSERT_LE(0, other);
	EXPECT_EQ(-ENOENT, db_export(other, dev.handle, 0));
	close(other);
	/* A bad result pointer: no descriptor is left behind, the buffer is not busy. */
	EXPECT_EQ(-EFAULT, udma_ioc(fd, NEURON_UDMA_DMABUF_EXPORT, (void *)8));
	/* No free descriptor: EMFILE, and nothing stays exported. */
	EXPECT_EQ(-EMFILE, export_without_fds(fd, dev.handle));
	dbfd = db_export(fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	EXPECT_EQ(FD_CLOEXEC, fcntl(dbfd, F_GETFD) & FD_CLOEXEC);
	close(dbfd);
	EXPECT_EQ(0, mem_free(fd, dev.handle));
	EXPECT_EQ(0, mem_free(fd, im.handle));
	EXPECT_EQ(0, ubuf_free(fd, &host));
	udbuf_destroy(&u);
}

/* MEM_FREE is EBUSY while any descriptor of the dma-buf is open, then works. */
TEST_F(db, export_busy_until_closed)
{
	char val[64];
	struct ubuf dev;
	int fd = self->fd, dbfd, dup1;

	ASSERT_EQ(0, ubuf_dev(fd, 256 * KIB, &dev));
	dbfd = db_export(fd, dev.handle, 0);
	ASSERT_LE(0, dbfd);
	EXPECT_EQ(0, fcntl(dbfd, F_GETFD) & FD_CLOEXEC);
	ASSERT_EQ(0, fdinfo_value(dbfd, "exp_name", val, sizeof(val)));
	EXPECT_STREQ("neuron_udma", val);
	ASSERT_EQ(0, fdinfo_value(dbfd, "size", val, sizeof(val)));
	EXPECT_EQ(256 * KIB, strtoul(val, NULL, 10));
	EXPECT_EQ(0, db_attached(db_ino(dbfd)));
	EXPECT_EQ(-EBUSY, mem_free(fd, dev.handle));
	dup1 = dup(dbfd);
	close(dbfd);
	EXPECT_EQ(-EBUSY, mem_free(fd, dev.handle));
	/* Twice exported: busy until both dma-bufs are closed. */
	dbfd = db_export(fd, dev.handle, 0);
	ASSERT_LE(0, dbfd);
	close(dup1);
	EXPECT_EQ(-EBUSY, mem_free(fd, dev.handle));
	close(dbfd);
	EXPECT_EQ(0, mem_free(fd, dev.handle));
}

/*
 * The file is closed first: the exported device memory stays reserved until the dma-buf's
 * last descriptor is closed, then goes back to the allocator, scrubbed before it is handed out.
 */
TEST_F_TIMEOUT(db, export_outlives_its_file, 180)
{
	__u64 big = (self->info.device_mem_size * 3 / 4) & ~(MIB - 1);
	struct ubuf dev, host, again;
	int fd = self->fd, dbfd;
	long i;

	ASSERT_LE(4 * MIB, big);
	ASSERT_EQ(0, ubuf_dev(fd, big, &dev));
	ASSERT_EQ(0, ubuf_host(fd, MIB, &host));
	fill_pattern(host.map, MIB, 31);
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &dev, 0, MIB, 0));
	dbfd = db_export(fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	/* A mapping would hold the file open. */
	munmap(host.map, host.size);
	close(fd);
	fd = self->fd = udma_open();
	ASSERT_LE(0, fd);
	EXPECT_EQ(-ENOMEM, ubuf_dev(fd, big, &again));
	close(dbfd);
	ASSERT_EQ(0, ubuf_dev(fd, big, &again));
	ASSERT_EQ(0, ubuf_host(fd, MIB, &host));
	memset(host.map, 0x77, MIB);
	ASSERT_EQ(0, udma_memcpy(fd, &again, 0, &host, 0, MIB, 0));
	for (i = 0; i < (long)MIB && !host.map[i]; i++)
		;
	EXPECT_EQ((long)MIB, i) TH_LOG("byte %ld of the new buffer is %#x", i, host.map[i]);
	EXPECT_EQ(0, mem_free(fd, again.handle));
	EXPECT_EQ(0, ubuf_free(fd, &host));
}

/*
 * The driver's own import of its export (same device): copies through the import land in the
 * exported buffer and come back from it; the export stays busy while imported.
 */
TEST_F_TIMEOUT(db, own_export_imported, 120)
{
	const size_t len = 256 * KIB;
	struct ubuf dev, host, im, host2;
	int fd = self->fd, fd2, dbfd;
	__u32 segs = 0;

	ASSERT_EQ(0, ubuf_dev(fd, len, &dev));
	ASSERT_EQ(0, ubuf_host(fd, len, &host));
	dbfd = db_export(fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	/* Another file of the same device imports it (a descriptor is all it takes). */
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, db_import(fd2, dbfd, NEURON_UDMA_IMPORT_WRITE, &im, &segs));
	EXPECT_EQ(len, im.size);
	EXPECT_EQ(1U, segs);
	EXPECT_EQ(1, db_attached(db_ino(dbfd)));
	close(dbfd);
	ASSERT_EQ(0, ubuf_host(fd2, len, &host2));

	/* Into the import (file 2), out of the exported buffer (file 1). */
	fill_pattern(host2.map, len, 41);
	ASSERT_EQ(0, udma_memcpy(fd2, &host2, 0, &im, 0, len, 0));
	memset(host.map, 0, len);
	ASSERT_EQ(0, udma_memcpy(fd, &dev, 0, &host, 0, len, 0));
	EXPECT_EQ(-1, first_diff(host.map, host2.map, len));
	/* Into the exported buffer, out of the import, by queue copies. */
	fill_pattern(host.map, len, 42);
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &dev, 0, len, 0));
	ASSERT_EQ(0, queue_init(fd2, ENGINE, QUEUE, 64, 64));
	memset(host2.map, 0, len);
	ASSERT_EQ(0, copy_sync(fd2, ENGINE, QUEUE, ucopy(&im, 65536 + 7, &host2, 3, 60000)));
	EXPECT_EQ(-1, first_diff(host2.map + 3, host.map + 65536 + 7, 60000));
	EXPECT_EQ(0, host2.map[2]);
	EXPECT_EQ(0, host2.map[60003]);

	/* The import holds the dma-buf: the exported buffer stays busy until it is freed. */
	EXPECT_EQ(-EBUSY, mem_free(fd, dev.handle));
	EXPECT_EQ(0, queue_release(fd2, ENGINE, QUEUE));
	EXPECT_EQ(0, mem_free(fd2, im.handle));
	EXPECT_EQ(0, mem_free(fd, dev.handle));
	EXPECT_EQ(0, ubuf_free(fd2, &host2));
	EXPECT_EQ(0, ubuf_free(fd, &host));
	close(fd2);
}

struct child_report {
	int foreign_free, foreign_copy, foreign_export;
	int import, copy, own_free, match;
};

struct child_args {
	struct child_report *r;
	__u64 dev_handle, im_handle;
	int dbfd;
	size_t len;
};

/* uid B with its own file: the parent's handles are not its own; the dma-buf it was given is. */
static int other_user(void *arg)
{
	struct child_args *a = arg;
	struct child_report *r = a->r;
	struct ubuf dev = { .handle = a->dev_handle }, host, im;
	struct ubuf pim = import_ubuf(a->im_handle, a->len);
	int fd = udma_open();

	if (fd < 0 || ubuf_host(fd, a->len, &host))
		return 2;
	r->foreign_free = mem_free(fd, a->dev_handle);
	r->foreign_copy = udma_memcpy(fd, &pim, 0, &host, 0, 4096, 0);
	r->foreign_export = db_export(fd, dev.handle, 0);
	r->import = db_import(fd, a->dbfd, 0, &im, NULL);
	if (!r->import) {
		r->copy = udma_memcpy(fd, &im, 0, &host, 0, a->len, 0);
		r->match = host.map[0] == 0x5c && host.map[a->len - 1] == 0x5c;
		r->own_free = mem_free(fd, im.handle);
	}
	close(a->dbfd);
	close(fd);
	return 0;
}

/*
 * fork and a second user: the child's descriptors are copies (closing them changes nothing of
 * the parent's), another user's file cannot name this file's buffers (ENOENT), and a dma-buf
 * descriptor handed over is the capability to import it.
 */
TEST_F_TIMEOUT(db, fork_and_other_user, 120)
{
	const size_t len = 64 * KIB;
	struct child_report *r = sec_shared(sizeof(*r));
	struct ubuf dev, host, im;
	struct child_args a;
	struct udbuf u;
	int fd = self->fd, dbfd, rc;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, ubuf_dev(fd, len, &dev));
	ASSERT_EQ(0, ubuf_host(fd, len, &host));
	memset(host.map, 0x5c, len);
	ASSERT_EQ(0, udma_memcpy(fd, &host, 0, &dev, 0, len, 0));
	dbfd = db_export(fd, dev.handle, 0);
	ASSERT_LE(0, dbfd);
	ASSERT_EQ(0, udbuf_create(len, &u));
	fill_pattern(u.map, len, 51);
	ASSERT_EQ(0, db_import(fd, u.dbfd, NEURON_UDMA_IMPORT_WRITE, &im, NULL));

	a = (struct child_args){ .r = r, .dev_handle = dev.handle, .im_handle = im.handle,
				 .dbfd = dbfd, .len = len };
	rc = sec_reap(sec_spawn(UID_B, other_user, &a));
	ASSERT_EQ(0, rc);
	EXPECT_EQ(-ENOENT, r->foreign_free);
	EXPECT_EQ(-ENOENT, r->foreign_copy);
	EXPECT_EQ(-ENOENT, r->foreign_export);
	EXPECT_EQ(0, r->import);
	EXPECT_EQ(0, r->copy);
	EXPECT_EQ(1, r->match);
	EXPECT_EQ(0, r->own_free);

	/* A child of the same user closes everything it inherited: the parent's are untouched. */
	rc = fork();
	ASSERT_LE(0, rc);
	if (rc == 0) {
		close(dbfd);
		close(u.dbfd);
		close(fd);
		_exit(0);
	}
	ASSERT_EQ(0, sec_reap(rc));
	EXPECT_EQ(-EBUSY, mem_free(fd, dev.handle));
	memset(host.map, 0, len);
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &host, 0, len, 0));
	EXPECT_EQ(-1, first_diff(host.map, u.map, len));
	close(dbfd);
	EXPECT_EQ(0, mem_free(fd, dev.handle));
	EXPECT_EQ(0, mem_free(fd, im.handle));
	EXPECT_EQ(0, ubuf_free(fd, &host));
	udbuf_destroy(&u);
	munmap(r, sizeof(*r));
}

/*
 * Unbind with a live export (imported by the driver itself) and a live import: calls are
 * ENODEV, the export is revoked (nothing attaches it any more, also after the rebind), the
 * udmabuf's attachment is gone, and the open dma-buf keeps a module reference until it is
 * closed. Last: it unbinds the device.
 */
TEST_F_TIMEOUT(db, unbind_with_live_export_and_import, 180)
{
	struct ubuf dev, host, im, own;
	unsigned long uino;
	struct udbuf u;
	int fd = self->fd, fd2, dbfd, ret;
	long refs;
	char bdf[64];

	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	ASSERT_EQ(0, ubuf_dev(fd, 128 * KIB, &dev));
	ASSERT_EQ(0, ubuf_host(fd, 128 * KIB, &host));
	dbfd = db_export(fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	ASSERT_EQ(0, db_import(fd, dbfd, NEURON_UDMA_IMPORT_WRITE, &own, NULL));
	ASSERT_EQ(0, udbuf_create(128 * KIB, &u));
	uino = db_ino(u.dbfd);
	ASSERT_EQ(0, db_import(fd, u.dbfd, NEURON_UDMA_IMPORT_WRITE, &im, NULL));
	/* Copies through both, and pairs left prepared on a queue, not started. */
	ASSERT_EQ(0, udma_memcpy(fd, &im, 0, &own, 0, 128 * KIB, 0));
	ASSERT_EQ(0, queue_init(fd, ENGINE, QUEUE, 64, 64));
	ASSERT_EQ(0, prep_one(fd, ENGINE, QUEUE, ucopy(&own, 0, &im, 0, 4096)));
	EXPECT_EQ(1, db_attached(uino));
	EXPECT_EQ(1, db_attached(db_ino(dbfd)));

	ret = sysfs_write(UDMA_DRV_DIR "/unbind", bdf);
	ASSERT_EQ(0, ret) TH_LOG("unbind %s: %s", bdf, strerror(-ret));
	EXPECT_EQ(-ENODEV, db_export(fd, dev.handle, 0));
	EXPECT_EQ(-ENODEV, db_import(fd, u.dbfd, 0, &im, NULL));
	EXPECT_EQ(-ENODEV, mem_free(fd, own.handle));
	/* Nothing of this device is attached to anything any more. */
	EXPECT_EQ(0, db_attached(uino));
	EXPECT_EQ(0, db_attached(db_ino(dbfd)));
	munmap(host.map, host.size);
	close(fd);
	self->fd = -1;
	/* The export outlives the device; it holds the module until it is closed. */
	refs = module_refcnt();
	EXPECT_LE(1, refs);

	ret = sysfs_write(UDMA_DRV_DIR "/bind", bdf);
	ASSERT_EQ(0, ret) TH_LOG("bind %s: %s", bdf, strerror(-ret));
	fd2 = udma_open_wait();
	ASSERT_LE(0, fd2);
	/* The revoked export attaches to nothing, not even to the device bound anew. */
	EXPECT_EQ(-EOPNOTSUPP, db_import(fd2, dbfd, 0, &im, NULL));
	close(fd2);
	refs = module_refcnt();
	close(dbfd);
	EXPECT_EQ(refs - 1, module_refcnt());
	udbuf_destroy(&u);
}

TEST_HARNESS_MAIN
