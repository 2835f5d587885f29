// SPDX-License-Identifier: GPL-2.0
/*
 * Cross-device copies (the multi-device pass, scripts/vm-run --devices N --switch): device A's
 * dma-buf export of device memory, imported by a file of device B, is a copy's source or
 * destination on B, so B's engine copies HBM(A) -> HBM(B) and back peer-to-peer through the
 * PCIe switch both devices sit behind (the kernel's P2PDMA accepts that path: a common upstream
 * bridge, no host bridge). The bytes are checked through each device's own host buffers, and
 * the unbind of either side in the middle of B's copies is bounded, fails the copies it cuts
 * with an errno, and never reports a copy that did not move its bytes; a PCI reset of the
 * exporter keeps the path.
 */
#include <pthread.h>
#include <stdlib.h>

#include "kselftest_harness.h"
#include "udma_multi.h"

#define XLEN (4U << 20)		/* one export: 4 MiB (a host buffer holds at most 4 MiB) */
#define XQ 11			/* B's user queue (engine UDMA_HOST_ENGINE): reserved on none */

FIXTURE(xdev) {
	char bdf[2][16];
	int fd[2];
	/* A's buffer (exported), B's import of it, B's buffer, and a host buffer on each. */
	struct ubuf a_dev, b_dev, im, a_host, b_host;
	int dbfd;
	unsigned char *want;	/* A's pattern (seed 1) */
};

/* Opens the node of @bdf: its file descriptor, or -errno. */
static int open_bdf(const char *bdf)
{
	int k = node_of_bdf(bdf);

	return k < 0 ? k : node_open(k);
}

FIXTURE_SETUP(xdev)
{
	struct udma_pci pci[UDMA_MAX_DEVS];
	int i, n = udma_pci_list(pci, UDMA_MAX_DEVS);

	self->fd[0] = self->fd[1] = self->dbfd = -1;
	ASSERT_GE(n, 2) TH_LOG("this test needs two Neuron devices (vm-run --devices 2 --switch)");
	for (i = 0; i < 2; i++) {
		memcpy(self->bdf[i], pci[i].bdf, sizeof(self->bdf[i]));
		ASSERT_TRUE(wait_until(pci_bound(self->bdf[i]), 5000));
		self->fd[i] = open_bdf(self->bdf[i]);
		ASSERT_LE(0, self->fd[i]) TH_LOG("%s: no node", self->bdf[i]);
	}
	ASSERT_EQ(0, ubuf_dev(self->fd[0], XLEN, &self->a_dev));
	ASSERT_EQ(0, ubuf_host(self->fd[0], XLEN, &self->a_host));
	ASSERT_EQ(0, ubuf_dev(self->fd[1], XLEN, &self->b_dev));
	ASSERT_EQ(0, ubuf_host(self->fd[1], XLEN, &self->b_host));
	/* A's buffer holds pattern 1 (written by A's engine from A's host buffer). */
	self->want = malloc(XLEN);
	ASSERT_NE(NULL, self->want);
	fill_pattern(self->want, XLEN, 1);
	memcpy(self->a_host.map, self->want, XLEN);
	ASSERT_EQ(0, udma_memcpy(self->fd[0], &self->a_host, 0, &self->a_dev, 0, XLEN, 0));
	self->dbfd = db_export(self->fd[0], self->a_dev.handle, O_CLOEXEC);
	ASSERT_LE(0, self->dbfd);
	i = db_import(self->fd[1], self->dbfd, NEURON_UDMA_IMPORT_WRITE, &self->im, NULL);
	ASSERT_EQ(0, i) TH_LOG("%s imports %s's export: %s (P2PDMA: are both behind one switch?)",
			       self->bdf[1], self->bdf[0], strerror(-i));
	ASSERT_EQ(XLEN, self->im.size);
}

FIXTURE_TEARDOWN(xdev)
{
	int i;

	free(self->want);
	if (self->dbfd >= 0)
		close(self->dbfd);
	for (i = 0; i < 2; i++)
		if (self->fd[i] >= 0)
			close(self->fd[i]);
}

/* B's buffer read back through B's host buffer: the first difference from A's pattern 1. */
static long b_dev_diff(struct _test_data_xdev *self, __u64 off, __u64 len)
{
	memset(self->b_host.map + off, 0, len);
	if (udma_memcpy(self->fd[1], &self->b_dev, off, &self->b_host, off, len, 0))
		return -3;
	return first_diff(self->b_host.map + off, self->want + off, len);
}

/*
 * B -> A, checked: pattern @seed into B's buffer (from B's host buffer), B's engine copies it
 * into A's memory through the import, and A reads it back through its own host buffer.
 */
static void b_writes_a(struct __test_metadata *_metadata, struct _test_data_xdev *self,
		       __u32 seed)
{
	fill_pattern(self->b_host.map, XLEN, seed);
	ASSERT_EQ(0, udma_memcpy(self->fd[1], &self->b_host, 0, &self->b_dev, 0, XLEN, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd[1], &self->b_dev, 0, &self->im, 0, XLEN, 0));
	memset(self->a_host.map, 0, XLEN);
	ASSERT_EQ(0, udma_memcpy(self->fd[0], &self->a_dev, 0, &self->a_host, 0, XLEN, 0));
	EXPECT_EQ(-1, first_diff(self->a_host.map, self->b_host.map, XLEN));
}

/*
 * HBM(A) -> HBM(B) by MEMCPY and by a queue copy at odd offsets, then HBM(B) -> HBM(A), each
 * checked byte for byte through the other device's host buffer.
 */
TEST_F_TIMEOUT(xdev, hbm_to_hbm_and_back, 300)
{
	int a = self->fd[0], b = self->fd[1];

	/* A -> B, the whole export (striped over B's H2T engines, split at 64 KiB). */
	ASSERT_EQ(0, udma_memcpy(b, &self->im, 0, &self->b_dev, 0, XLEN, 0));
	EXPECT_EQ(-1, b_dev_diff(self, 0, XLEN));

	/* A -> B on a user queue of B: odd offsets and a length across a 64 KiB boundary. */
	memset(self->b_host.map, 0, XLEN);
	ASSERT_EQ(0, udma_memcpy(b, &self->b_host, 0, &self->b_dev, 0, XLEN, 0));
	ASSERT_EQ(0, queue_init(b, UDMA_HOST_ENGINE, XQ, 64, 64));
	ASSERT_EQ(0, copy_sync(b, UDMA_HOST_ENGINE, XQ,
			       ucopy(&self->im, 65536 + 7, &self->b_dev, 65536 + 7, 60000)));
	EXPECT_EQ(0, queue_release(b, UDMA_HOST_ENGINE, XQ));
	ASSERT_EQ(0, udma_memcpy(b, &self->b_dev, 0, &self->b_host, 0, XLEN, 0));
	EXPECT_EQ(-1, first_diff(self->b_host.map + 65536 + 7, self->want + 65536 + 7, 60000));
	EXPECT_EQ(0, self->b_host.map[65536 + 6]);
	EXPECT_EQ(0, self->b_host.map[65536 + 7 + 60000]);

	/* B -> A: pattern 2 into B's buffer, then B's engine writes it into A's memory. */
	b_writes_a(_metadata, self, 2);

	/* The import holds A's buffer; freed in order, everything goes. */
	EXPECT_EQ(-EBUSY, mem_free(a, self->a_dev.handle));
	EXPECT_EQ(0, mem_free(b, self->im.handle));
	close(self->dbfd);
	self->dbfd = -1;
	EXPECT_EQ(0, mem_free(a, self->a_dev.handle));
}

/*
 * A PCI function reset of the exporter (its sysfs `reset`) keeps the peer-to-peer path: the
 * import stays valid and B copies A -> B and B -> A again, byte for byte (the bytes written anew
 * after the reset: a reset need not keep device memory).
 */
TEST_F_TIMEOUT(xdev, exporter_reset_keeps_the_path, 300)
{
	long long resets = udma_counter(self->bdf[0], "device_resets");
	char path[96];
	int a = self->fd[0], b = self->fd[1], ret;

	ASSERT_LE(0, resets);
	ASSERT_EQ(0, udma_memcpy(b, &self->im, 0, &self->b_dev, 0, XLEN, 0));
	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/reset", self->bdf[0]);
	ret = sysfs_write(path, "1");
	ASSERT_EQ(0, ret) TH_LOG("reset %s: %s", self->bdf[0], strerror(-ret));
	/* It was a reset of A, as the driver saw it (the device model's: D3hot -> D0). */
	EXPECT_EQ(resets + 1, udma_counter(self->bdf[0], "device_resets"));

	fill_pattern(self->a_host.map, XLEN, 3);
	ASSERT_EQ(0, udma_memcpy(a, &self->a_host, 0, &self->a_dev, 0, XLEN, 0));
	memset(self->b_host.map, 0, XLEN);
	ASSERT_EQ(0, udma_memcpy(b, &self->b_host, 0, &self->b_dev, 0, XLEN, 0));
	ASSERT_EQ(0, udma_memcpy(b, &self->im, 0, &self->b_dev, 0, XLEN, 0));
	ASSERT_EQ(0, udma_memcpy(b, &self->b_dev, 0, &self->b_host, 0, XLEN, 0));
	EXPECT_EQ(-1, first_diff(self->b_host.map, self->a_host.map, XLEN));

	b_writes_a(_metadata, self, 4);
}

/*
 * The copier: a thread of this process driving B's engines, the whole 4 MiB each time (MEMCPY
 * stripes it over every H2T engine of B): the destination zeroed (a MEMCPY from B's zeroed host
 * buffer), then copied between the two memories, then read back through the device that stays
 * bound and compared, until a call of B fails. The copies go toward the device that stays: into
 * B (A -> B) when A is unbound, into A (B -> A) when B is. The CPU touches only the mappings of
 * the device that stays (no fault after the unbind).
 */
struct copier {
	struct _test_data_xdev *self;
	int side;			/* the device unbound: 0 (A, the exporter) or 1 (B) */
	struct ubuf zero;		/* B's host buffer of zeroes */
	int done;			/* copies reported done (atomic: the test reads it) */
	int bad;			/* of those, copies whose bytes were not there */
	int last_err;			/* the call of B that stopped it */
	double stopped_at;
};

/* The device that stays bound: its file, the memory the copies write, and its host buffer. */
#define KEEP_FD(self, side)	((self)->fd[!(side)])
#define KEEP_MEM(self, side)	((side) == 0 ? &(self)->b_dev : &(self)->a_dev)
#define KEEP_HOST(self, side)	((side) == 0 ? &(self)->b_host : &(self)->a_host)

static void *copier_run(void *arg)
{
	struct copier *c = arg;
	struct _test_data_xdev *self = c->self;
	const struct ubuf *dst = c->side == 0 ? &self->b_dev : &self->im;
	const struct ubuf *src = c->side == 0 ? &self->im : &self->b_dev;
	const struct ubuf *host = KEEP_HOST(self, c->side);
	double end = now_s() + 120;
	int ret;

	while (now_s() < end) {
		ret = udma_memcpy(self->fd[1], &c->zero, 0, dst, 0, XLEN, 0);
		if (!ret)
			ret = udma_memcpy(self->fd[1], src, 0, dst, 0, XLEN, 0);
		if (ret) {
			c->last_err = ret;
			break;
		}
		memset(host->map, 0, XLEN);
		if (udma_memcpy(KEEP_FD(self, c->side), KEEP_MEM(self, c->side), 0, host, 0, XLEN, 0) ||
		    first_diff(host->map, self->want, XLEN) != -1)
			c->bad++;
		__atomic_fetch_add(&c->done, 1, __ATOMIC_RELAXED);
	}
	c->stopped_at = now_s();
	return NULL;
}

/*
 * B copies between the two memories while this unbinds device @side (0: the exporter A, 1: the
 * importer B). The unbind is bounded, the copier stops with the errno of the device gone
 * (ENXIO: the import revoked; ENODEV: its own device), every copy reported done moved its
 * bytes, nothing of B writes A's memory once B's unbind has returned, the other device goes on
 * working, and the unbound one binds again.
 */
static void unbind_mid_copy(struct __test_metadata *_metadata, struct _test_data_xdev *self,
			    int side)
{
	const struct ubuf *host = KEEP_HOST(self, side);
	struct copier c = { .self = self, .side = side };
	double t0, t1;
	pthread_t th;
	int ret;

	/* B's memory holds A's pattern too (the source of the B -> A copies). */
	ASSERT_EQ(0, udma_memcpy(self->fd[1], &self->im, 0, &self->b_dev, 0, XLEN, 0));
	ASSERT_EQ(0, ubuf_host(self->fd[1], XLEN, &c.zero));
	memset(c.zero.map, 0, XLEN);
	ASSERT_EQ(0, pthread_create(&th, NULL, copier_run, &c));
	/* Let some copies complete first, so that the unbind lands among them. */
	EXPECT_TRUE(wait_until(__atomic_load_n(&c.done, __ATOMIC_RELAXED) >= 3, 60000));
	t0 = now_s();
	ret = sysfs_write(UDMA_DRV_DIR "/unbind", self->bdf[side]);
	t1 = now_s();
	ASSERT_EQ(0, ret) TH_LOG("unbind %s: %s", self->bdf[side], strerror(-ret));
	ASSERT_EQ(0, pthread_join(th, NULL));
	TH_LOG("unbind of %s %s: %.2f s; B's copier: %d copies done, stopped %.2f s after the unbind began (%s)",
	       side ? "the importer" : "the exporter", self->bdf[side], t1 - t0, c.done,
	       c.stopped_at - t0, strerror(-c.last_err));
	EXPECT_GE(c.done, 3);
	EXPECT_EQ(0, c.bad);
	EXPECT_EQ(side == 0 ? -ENXIO : -ENODEV, c.last_err);
	EXPECT_LT(c.stopped_at - t0, 60);
	if (side == 1) {
		/* Nothing of B writes A's memory once B's unbind has returned. */
		unsigned char *before = malloc(XLEN);

		ASSERT_NE(NULL, before);
		memset(host->map, 0, XLEN);
		ASSERT_EQ(0, udma_memcpy(self->fd[0], &self->a_dev, 0, host, 0, XLEN, 0));
		memcpy(before, host->map, XLEN);
		usleep(300000);
		memset(host->map, 0, XLEN);
		ASSERT_EQ(0, udma_memcpy(self->fd[0], &self->a_dev, 0, host, 0, XLEN, 0));
		EXPECT_EQ(-1, first_diff(host->map, before, XLEN));
		free(before);
	}

	if (side == 0) {
		/* B names the revoked import no more, and frees it; the export attaches to nothing. */
		EXPECT_EQ(-ENXIO, udma_memcpy(self->fd[1], &self->im, 0, &self->b_dev, 0, 4096, 0));
		EXPECT_EQ(0, mem_free(self->fd[1], self->im.handle));
		EXPECT_EQ(-EOPNOTSUPP, db_import(self->fd[1], self->dbfd, 0, &self->im, NULL));
	} else {
		/* A's export is no longer imported: once its descriptor is closed, it frees. */
		close(self->dbfd);
		self->dbfd = -1;
		EXPECT_TRUE(wait_until(!mem_free(self->fd[0], self->a_dev.handle), 5000));
	}
	close(self->fd[side]);
	self->fd[side] = -1;
	ret = sysfs_write(UDMA_DRV_DIR "/bind", self->bdf[side]);
	ASSERT_EQ(0, ret) TH_LOG("bind %s: %s", self->bdf[side], strerror(-ret));
	ASSERT_TRUE(wait_until(pci_bound(self->bdf[side]), 5000));
}

TEST_F_TIMEOUT(xdev, unbind_exporter_mid_copy, 300)
{
	unbind_mid_copy(_metadata, self, 0);
}

TEST_F_TIMEOUT(xdev, unbind_importer_mid_copy, 300)
{
	unbind_mid_copy(_metadata, self, 1);
}

TEST_HARNESS_MAIN
