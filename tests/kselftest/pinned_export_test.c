// SPDX-License-Identifier: GPL-2.0
/*
 * dma-buf exports to pinned importers (Documentation/neuron-udma.rst, "dma-buf"): importers
 * that cannot be revoked (peer-to-peer, no invalidate_mappings, dma_buf_pin(): how RDMA's
 * ib_umem_dmabuf_get_pinned() and so EFA register a dma-buf) attach only with the module
 * parameter dmabuf_pinned_importers; an unbind waits for them at most
 * dmabuf_pinned_unbind_wait_ms, logs the importer, and the range stays reserved, across the
 * rebind, until the importer detaches.
 *
 * The pinned importer is the KUnit build's debugfs file neuron_udma_pinned_importer
 * (rust/kfac/dmabuf_kunit.c): writing a dma-buf descriptor imports it as EFA's registration
 * does; closing the file detaches. vgem, an importer written elsewhere, attaches statically
 * (no peer-to-peer): refused with the parameter or without it, while it imports a udmabuf.
 * The unbind's wait is one deadline for all its exports; the reservation follows the PCI
 * function (domain, bus, devfn) through a remove and rescan (v2 only: see that case).
 */
#define _GNU_SOURCE
#include <drm/drm.h>
#include <dirent.h>
#include <linux/udmabuf.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "kselftest_harness.h"
#include "udma_util.h"

#define MIB (1024UL * 1024)
#define PARAMS "/sys/module/neuron_udma/parameters/"
#define PINNED_PARAM PARAMS "dmabuf_pinned_importers"
#define WAIT_PARAM PARAMS "dmabuf_pinned_unbind_wait_ms"
#define IMPORTER "/sys/kernel/debug/neuron_udma_pinned_importer"
/* The unbind's wait for a pinned importer in this test, in ms. */
#define WAIT_MS 500

/* The pinned importer: an open importer file, or -errno. */
static int pinned_open(void)
{
	int fd = open(IMPORTER, O_RDWR | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

/* Imports dma-buf @dbfd through the importer file @imp: 0 or -errno. */
static int pinned_import(int imp, int dbfd)
{
	char num[16];
	int n = snprintf(num, sizeof(num), "%d", dbfd);

	return write(imp, num, n) == n ? 0 : -errno;
}

/* The bus address and length of the importer's mapping (read once per file): 0 or -errno. */
static int pinned_mapping(int imp, unsigned long long *addr, unsigned long *len)
{
	char text[64] = "";
	ssize_t n = read(imp, text, sizeof(text) - 1);

	if (n < 0)
		return -errno;
	return sscanf(text, "%llx %lu", addr, len) == 2 ? 0 : -EINVAL;
}

/* The first value of the sysfs file @path (at most 31 bytes), in @out. */
static int sysfs_read(const char *path, char *out, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, out, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	out[n] = 0;
	out[strcspn(out, "\n")] = 0;
	return 0;
}

/* Pinned importers admitted, an unbind waiting @wait_ms for them: 0 or -errno. */
static int admit_pinned(unsigned int wait_ms)
{
	char ms[16];
	int ret = sysfs_write(PINNED_PARAM, "Y");

	snprintf(ms, sizeof(ms), "%u", wait_ms);
	return ret ? ret : sysfs_write(WAIT_PARAM, ms);
}

/* A vgem device (DRM's virtual GEM driver), opened, or -errno. */
static int vgem_open(void)
{
	struct dirent *e;
	DIR *d = opendir("/dev/dri");
	int ret = -ENOENT;

	if (!d)
		return -errno;
	while ((e = readdir(d))) {
		char path[300], name[16] = "";
		struct drm_version v = { .name = name, .name_len = sizeof(name) - 1 };
		int fd;

		if (strncmp(e->d_name, "card", 4))
			continue;
		snprintf(path, sizeof(path), "/dev/dri/%s", e->d_name);
		fd = open(path, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (!ioctl(fd, DRM_IOCTL_VERSION, &v) && !strcmp(name, "vgem")) {
			ret = fd;
			break;
		}
		close(fd);
	}
	closedir(d);
	return ret;
}

/* vgem's PRIME import of @dbfd (DRM_IOCTL_PRIME_FD_TO_HANDLE): 0 or -errno. */
static int vgem_import(int vgem, int dbfd, __u32 *handle)
{
	struct drm_prime_handle p = { .fd = dbfd };

	if (ioctl(vgem, DRM_IOCTL_PRIME_FD_TO_HANDLE, &p))
		return -errno;
	*handle = p.handle;
	return 0;
}

static void vgem_close_handle(int vgem, __u32 handle)
{
	struct drm_gem_close c = { .handle = handle };

	ioctl(vgem, DRM_IOCTL_GEM_CLOSE, &c);
}

/* A udmabuf of @size bytes (its memfd in *@memfd), or -errno. */
static int udmabuf_new(size_t size, int *memfd)
{
	struct udmabuf_create c = { .flags = UDMABUF_FLAGS_CLOEXEC, .size = size };
	int dev, fd;

	*memfd = memfd_create("pinned_export_test", MFD_ALLOW_SEALING | MFD_CLOEXEC);
	if (*memfd < 0)
		return -errno;
	if (ftruncate(*memfd, size) || fcntl(*memfd, F_ADD_SEALS, F_SEAL_SHRINK))
		return -errno;
	dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
	if (dev < 0)
		return -errno;
	c.memfd = *memfd;
	fd = ioctl(dev, UDMABUF_CREATE, &c);
	fd = fd < 0 ? -errno : fd;
	close(dev);
	return fd;
}

FIXTURE(pin) {
	int fd;
	struct neuron_udma_info info;
	char pinned[32];
	char wait_ms[32];
};

FIXTURE_SETUP(pin)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ(0, sysfs_read(PINNED_PARAM, self->pinned, sizeof(self->pinned)));
	ASSERT_EQ(0, sysfs_read(WAIT_PARAM, self->wait_ms, sizeof(self->wait_ms)));
	/* The defaults, as the module documents them. */
	ASSERT_STREQ("N", self->pinned);
	ASSERT_STREQ("10000", self->wait_ms);
	ASSERT_EQ(0, access(IMPORTER, R_OK | W_OK)) TH_LOG("%s: a KUnit build is needed", IMPORTER);
}

FIXTURE_TEARDOWN(pin)
{
	sysfs_write(PINNED_PARAM, self->pinned);
	sysfs_write(WAIT_PARAM, self->wait_ms);
	if (self->fd >= 0)
		close(self->fd);
}

/*
 * By default a pinned importer is refused (EOPNOTSUPP) and changes nothing: the buffer is
 * freed once the dma-buf is closed.
 */
TEST_F(pin, refused_by_default)
{
	struct ubuf dev;
	int dbfd, imp;

	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &dev));
	dbfd = db_export(self->fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	imp = pinned_open();
	ASSERT_LE(0, imp);
	EXPECT_EQ(-EOPNOTSUPP, pinned_import(imp, dbfd));
	close(imp);
	close(dbfd);
	EXPECT_EQ(0, mem_free(self->fd, dev.handle));
}

/*
 * vgem's PRIME import is static (no importer ops, so not peer-to-peer): device memory has no
 * pages it could map, so it is refused with the parameter or without it, while vgem imports a
 * udmabuf (host memory) from the same process.
 */
TEST_F(pin, vgem_static_import_is_refused)
{
	struct ubuf dev;
	int dbfd, vgem, ufd, memfd;
	__u32 handle = 0;

	vgem = vgem_open();
	ASSERT_LE(0, vgem) TH_LOG("no vgem device under /dev/dri: %s", strerror(-vgem));
	ufd = udmabuf_new(MIB, &memfd);
	ASSERT_LE(0, ufd);
	ASSERT_EQ(0, vgem_import(vgem, ufd, &handle));
	vgem_close_handle(vgem, handle);

	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &dev));
	dbfd = db_export(self->fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	EXPECT_EQ(-EOPNOTSUPP, vgem_import(vgem, dbfd, &handle));
	ASSERT_EQ(0, sysfs_write(PINNED_PARAM, "Y"));
	EXPECT_EQ(-EOPNOTSUPP, vgem_import(vgem, dbfd, &handle));
	close(dbfd);
	EXPECT_EQ(0, mem_free(self->fd, dev.handle));
	close(ufd);
	close(memfd);
	close(vgem);
}

/*
 * With the parameter a pinned importer attaches and maps exactly the buffer's bytes of BAR4; it
 * keeps the buffer busy (MEM_FREE is EBUSY) after the dma-buf's descriptor is closed, until it
 * detaches; the buffer is still a copy's source and destination meanwhile. Turning the
 * parameter off refuses the next importer, not the one attached.
 */
TEST_F(pin, admitted_with_the_parameter)
{
	static unsigned char want[64 * 1024];
	unsigned long long addr = 0;
	unsigned long len = 0;
	struct ubuf dev, host;
	int dbfd, imp, imp2;

	ASSERT_EQ(0, sysfs_write(PINNED_PARAM, "Y"));
	ASSERT_EQ(0, ubuf_dev(self->fd, 2 * MIB, &dev));
	ASSERT_EQ(0, ubuf_host(self->fd, sizeof(want), &host));
	dbfd = db_export(self->fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	imp = pinned_open();
	ASSERT_LE(0, imp);
	ASSERT_EQ(0, pinned_import(imp, dbfd));
	ASSERT_EQ(0, pinned_mapping(imp, &addr, &len));
	EXPECT_EQ(2 * MIB, len);
	EXPECT_NE(0ULL, addr);
	/* One import per importer file. */
	EXPECT_EQ(-EBUSY, pinned_import(imp, dbfd));

	ASSERT_EQ(0, sysfs_write(PINNED_PARAM, "N"));
	imp2 = pinned_open();
	ASSERT_LE(0, imp2);
	EXPECT_EQ(-EOPNOTSUPP, pinned_import(imp2, dbfd));
	close(imp2);

	close(dbfd);
	EXPECT_EQ(-EBUSY, mem_free(self->fd, dev.handle));
	fill_pattern(host.map, host.size, 7);
	ASSERT_EQ(0, udma_memcpy(self->fd, &host, 0, &dev, MIB, host.size, 0));
	memset(host.map, 0, host.size);
	ASSERT_EQ(0, udma_memcpy(self->fd, &dev, MIB, &host, 0, host.size, 0));
	fill_pattern(want, host.size, 7);
	EXPECT_EQ(-1, first_diff(host.map, want, host.size));
	close(imp);
	/* The dma-buf's release follows the importer's put at once. */
	EXPECT_EQ(0, mem_free(self->fd, dev.handle));
	EXPECT_EQ(0, ubuf_free(self->fd, &host));
}

/* An allocation of @size bytes of device memory in @fd, freed at once: 0 or -errno. */
static int alloc_and_free(int fd, __u64 size)
{
	struct neuron_udma_mem_alloc a = { .type = NEURON_UDMA_MEM_DEVICE, .size = size };
	int ret = udma_ioc(fd, NEURON_UDMA_MEM_ALLOC, &a);

	return ret ? ret : mem_free(fd, a.handle);
}

/*
 * The kernel log's timestamps (s) of its lines holding @needle, at most @max of them: how many,
 * or -1 if the log is unreadable.
 */
static int klog_times(const char *needle, double *t, int max)
{
	char *buf = klog_read(), *line, *save = NULL;
	int n = 0;

	if (!buf)
		return -1;
	for (line = strtok_r(buf, "\n", &save); line && n < max; line = strtok_r(NULL, "\n", &save)) {
		char *at = strchr(line, '[');

		if (at && strstr(line, needle))
			t[n++] = strtod(at + 1, NULL);
	}
	free(buf);
	return n;
}

/*
 * Unbind with pinned importers of three exports attached, two of them of one buffer: the unbind
 * waits dmabuf_pinned_unbind_wait_ms for them in all, one deadline and not one wait per export
 * (the three are logged together, when it passed), and names them in the log; the device bound
 * anew keeps both ranges reserved (an allocation of all its memory fails with ENOMEM; the
 * shared range does not fail the probe); a range stays reserved until every export of it is
 * released, and then all of the memory can be allocated again, which the log says. Last: it
 * unbinds and binds the device.
 */
TEST_F_TIMEOUT(pin, unbind_strands_the_ranges_until_the_importers_detach, 240)
{
	const unsigned int wait_ms = 6 * WAIT_MS;
	char bdf[64], path[PATH_MAX];
	int dbfd, imp[3], fd, ret, i, n;
	struct ubuf dev[2];
	double t0, took, t[8];

	if (!self->info.device_mem_size)
		SKIP(return, "the device has no device memory");
	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	ASSERT_EQ(0, admit_pinned(wait_ms));
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &dev[0]));
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &dev[1]));
	/* Buffer 0 twice, buffer 1 once. */
	for (i = 0; i < 3; i++) {
		dbfd = db_export(self->fd, dev[i / 2].handle, O_CLOEXEC);
		ASSERT_LE(0, dbfd);
		imp[i] = pinned_open();
		ASSERT_LE(0, imp[i]);
		ASSERT_EQ(0, pinned_import(imp[i], dbfd));
		close(dbfd);
	}
	close(self->fd);
	self->fd = -1;

	t0 = now_s();
	ret = sysfs_write(UDMA_DRV_DIR "/unbind", bdf);
	took = now_s() - t0;
	ASSERT_EQ(0, ret) TH_LOG("unbind %s: %s", bdf, strerror(-ret));
	TH_LOG("the unbind took %.2f s with three pinned importers and a %u ms wait", took,
	       wait_ms);
	EXPECT_LE(wait_ms / 1000.0, took);
	snprintf(path, sizeof(path),
		 "still mapped when the unbind's wait for pinned importers (%u ms) ended", wait_ms);
	n = klog_times(path, t, 8);
	ASSERT_EQ(3, n);
	/* One wait per export would log them wait_ms apart. */
	EXPECT_GT(wait_ms / 2000.0, t[2] - t[0]) TH_LOG("logged %.3f s apart", t[2] - t[0]);
	EXPECT_EQ(1, klog_has("may still reach it"));

	ret = sysfs_write(UDMA_DRV_DIR "/bind", bdf);
	ASSERT_EQ(0, ret) TH_LOG("bind %s: %s", bdf, strerror(-ret));
	fd = udma_open_wait();
	ASSERT_LE(0, fd);
	self->fd = fd;
	EXPECT_EQ(1, klog_has("stays reserved: a pinned importer of a dma-buf of an earlier binding"));
	/* The importers still map their ranges: they are not handed out, and sysfs counts them. */
	EXPECT_EQ(-ENOMEM, alloc_and_free(fd, self->info.device_mem_size));
	EXPECT_EQ((long long)(2 * MIB), udma_counter(bdf, "mem_device_stranded_bytes"));

	/* Buffer 1's range is given back; buffer 0's stays while one export of it is left. */
	close(imp[2]);
	EXPECT_EQ(1, klog_has("released (no importer or descriptor left); the range is free again"));
	EXPECT_EQ(-ENOMEM, alloc_and_free(fd, self->info.device_mem_size));
	EXPECT_EQ((long long)MIB, udma_counter(bdf, "mem_device_stranded_bytes"));
	close(imp[0]);
	EXPECT_EQ(-ENOMEM, alloc_and_free(fd, self->info.device_mem_size));
	EXPECT_EQ((long long)MIB, udma_counter(bdf, "mem_device_stranded_bytes"));
	close(imp[1]);
	EXPECT_EQ(0, alloc_and_free(fd, self->info.device_mem_size));
	EXPECT_EQ(0, udma_counter(bdf, "mem_device_stranded_bytes"));
}

/*
 * PCI remove with a pinned importer attached, then rescan: the new pci_dev of the same function
 * (same domain, bus and devfn) keeps the range reserved until the importer detaches. Last: it
 * removes and rescans the device.
 */
TEST_F_TIMEOUT(pin, rescan_keeps_the_range_reserved, 240)
{
	char bdf[64], path[PATH_MAX];
	int dbfd, imp, fd;
	struct ubuf dev;

	if (!self->info.device_mem_size)
		SKIP(return, "the device has no device memory");
	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	ASSERT_EQ(0, admit_pinned(WAIT_MS));
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &dev));
	dbfd = db_export(self->fd, dev.handle, O_CLOEXEC);
	ASSERT_LE(0, dbfd);
	imp = pinned_open();
	ASSERT_LE(0, imp);
	ASSERT_EQ(0, pinned_import(imp, dbfd));
	close(dbfd);
	close(self->fd);
	self->fd = -1;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/remove", bdf);
	ASSERT_EQ(0, sysfs_write(path, "1"));
	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/rescan", "1"));
	fd = udma_open_wait();
	ASSERT_LE(0, fd);
	self->fd = fd;
	EXPECT_EQ(-ENOMEM, alloc_and_free(fd, self->info.device_mem_size));
	EXPECT_EQ((long long)MIB, udma_counter(bdf, "mem_device_stranded_bytes"));
	close(imp);
	EXPECT_EQ(0, alloc_and_free(fd, self->info.device_mem_size));
	EXPECT_EQ(0, udma_counter(bdf, "mem_device_stranded_bytes"));
}

TEST_HARNESS_MAIN
