// SPDX-License-Identifier: GPL-2.0
/*
 * The device-memory cgroup controller (CONFIG_CGROUP_DMEM; Documentation/userspace-api.rst,
 * "Security model"): each device's HBM is the dmem region "neuron_udma/<PCI address>", sized
 * as INFO's device_mem_size; device buffers and queue rings in device memory are charged to the
 * allocating task's cgroup while their range is allocated (an exported buffer's until its
 * dma-buf is released). Past the cgroup's dmem.max the call fails with EDQUOT and allocates
 * nothing; the charge goes back on MEM_FREE, QUEUE_RELEASE, close, the dma-buf's release and
 * unbind.
 *
 * Each test runs in its own process (the harness forks), which joins a fresh child cgroup
 * under /sys/fs/cgroup (cgroup2, mounted by the guest's init) with the dmem controller enabled.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sys/stat.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024LL
#define MIB (1024LL * 1024)
#define CG_ROOT "/sys/fs/cgroup"
#define CG_DIR CG_ROOT "/nu_dmem"
#define DR NEURON_UDMA_QUEUE_DEVICE_RINGS
/* A queue nothing reserves (hardware.rst §2.4), for the rings in device memory. */
#define ENG 5U
#define QID 2U

/*
 * The value of @region in the dmem file @path ("<region> <value>" per line): bytes, LLONG_MAX
 * for "max", -1 if the region is not listed or the file cannot be read.
 */
static long long dmem_read(const char *path, const char *region)
{
	char line[256];
	size_t n = strlen(region);
	long long v = -1;
	FILE *f = fopen(path, "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, region, n) || line[n] != ' ')
			continue;
		v = strncmp(line + n + 1, "max", 3) ? strtoll(line + n + 1, NULL, 10) : LLONG_MAX;
		break;
	}
	fclose(f);
	return v;
}

/* dmem.current of the test cgroup for @region. */
static long long dmem_current(const char *region)
{
	return dmem_read(CG_DIR "/dmem.current", region);
}

/* Polls dmem.current until it is @want (a charge freed by a worker), at most 2 s. */
static long long dmem_settle(const char *region, long long want)
{
	long long v = dmem_current(region);

	for (int i = 0; i < 200 && v != want; i++) {
		usleep(10000);
		v = dmem_current(region);
	}
	return v;
}

/* Sets the test cgroup's dmem.max for @region to @bytes (-1: "max"). */
static int dmem_set_max(const char *region, long long bytes)
{
	char val[160];

	if (bytes < 0)
		snprintf(val, sizeof(val), "%s max", region);
	else
		snprintf(val, sizeof(val), "%s %lld", region, bytes);
	return sysfs_write(CG_DIR "/dmem.max", val);
}

static int qinit(int fd, __u32 flags)
{
	struct neuron_udma_queue_init i = {
		.engine = ENG, .queue = QID, .tx_descs = 1024, .rx_descs = 1024, .flags = flags,
	};

	return udma_ioc(fd, NEURON_UDMA_QUEUE_INIT, &i);
}

FIXTURE(dmem) {
	int fd;
	char bdf[64];
	char region[128];
	struct neuron_udma_info info;
};

/*
 * A fresh child cgroup with the dmem controller, joined by this test's process; the region of
 * the device. The test kernel has the controller: its absence fails the test.
 */
FIXTURE_SETUP(dmem)
{
	char pid[32];
	struct stat st;

	ASSERT_EQ(0, stat(CG_ROOT "/cgroup.controllers", &st)) {
		TH_LOG("no cgroup2 at " CG_ROOT);
	}
	ASSERT_EQ(0, sysfs_write(CG_ROOT "/cgroup.subtree_control", "+dmem")) {
		TH_LOG("no dmem controller (CONFIG_CGROUP_DMEM)");
	}
	rmdir(CG_DIR);
	ASSERT_EQ(0, mkdir(CG_DIR, 0755));
	snprintf(pid, sizeof(pid), "%d", getpid());
	ASSERT_EQ(0, sysfs_write(CG_DIR "/cgroup.procs", pid));
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ(0, udma_bdf(self->bdf, sizeof(self->bdf)));
	snprintf(self->region, sizeof(self->region), "neuron_udma/%s", self->bdf);
	if (!self->info.device_mem_size)
		SKIP(return, "the device has no device memory");
	ASSERT_EQ(0, dmem_current(self->region));
}

FIXTURE_TEARDOWN(dmem)
{
	if (self->fd >= 0)
		close(self->fd);
	/* The cgroup is removed by the next test's setup, once this process has exited. */
}

/* The region is listed with the device's memory as its capacity, unlimited by default. */
TEST_F(dmem, region_listed_with_its_capacity)
{
	EXPECT_EQ((long long)self->info.device_mem_size,
		  dmem_read(CG_ROOT "/dmem.capacity", self->region));
	EXPECT_EQ(LLONG_MAX, dmem_read(CG_DIR "/dmem.max", self->region));
}

/*
 * dmem.current follows device buffers (rounded to 4 KiB, as MEM_ALLOC rounds them) and a queue's
 * rings in device memory; host buffers and host rings are not device memory.
 */
TEST_F(dmem, current_follows_alloc_and_free)
{
	struct ubuf a, b, h;
	long long rings;

	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &a));
	EXPECT_EQ(MIB, dmem_current(self->region));
	ASSERT_EQ(0, ubuf_dev(self->fd, 100 * KIB + 1, &b));
	EXPECT_EQ(MIB + 104 * KIB, dmem_current(self->region));
	ASSERT_EQ(0, ubuf_host(self->fd, MIB, &h));
	EXPECT_EQ(MIB + 104 * KIB, dmem_current(self->region));
	ASSERT_EQ(0, qinit(self->fd, 0));
	EXPECT_EQ(MIB + 104 * KIB, dmem_current(self->region));
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));

	ASSERT_EQ(0, qinit(self->fd, DR));
	rings = dmem_current(self->region) - (MIB + 104 * KIB);
	/* 16 bytes per descriptor of each ring + 2 KiB of completion slots, in 4 KiB units. */
	EXPECT_EQ(36 * KIB, rings);
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	EXPECT_EQ(MIB + 104 * KIB, dmem_settle(self->region, MIB + 104 * KIB));

	ASSERT_EQ(0, ubuf_free(self->fd, &a));
	EXPECT_EQ(104 * KIB, dmem_current(self->region));
	ASSERT_EQ(0, ubuf_free(self->fd, &b));
	EXPECT_EQ(0, dmem_current(self->region));
	ASSERT_EQ(0, ubuf_free(self->fd, &h));
}

/*
 * Past dmem.max MEM_ALLOC and QUEUE_INIT with device rings fail with EDQUOT and allocate
 * nothing (the charge, the device's usage counter and the memory are as before); up to the
 * limit exactly succeeds; raising the limit lets the same call through.
 */
TEST_F(dmem, max_refuses_with_edquot_and_allocates_nothing)
{
	long long dev0 = udma_counter(self->bdf, "mem_device_bytes");
	struct ubuf a, b, c;

	ASSERT_EQ(0, dmem_set_max(self->region, 2 * MIB));
	EXPECT_EQ(2 * MIB, dmem_read(CG_DIR "/dmem.max", self->region));
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &a));
	EXPECT_EQ(-EDQUOT, ubuf_dev(self->fd, MIB + 1, &b));
	EXPECT_EQ(MIB, dmem_current(self->region));
	EXPECT_EQ(dev0 + MIB, udma_counter(self->bdf, "mem_device_bytes"));
	/* Exactly up to the limit. */
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &b));
	EXPECT_EQ(2 * MIB, dmem_current(self->region));
	EXPECT_EQ(-EDQUOT, ubuf_dev(self->fd, 4096, &c));
	EXPECT_EQ(-EDQUOT, qinit(self->fd, DR));
	EXPECT_EQ(-ENOENT, queue_release(self->fd, ENG, QID));
	EXPECT_EQ(2 * MIB, dmem_current(self->region));
	EXPECT_EQ(dev0 + 2 * MIB, udma_counter(self->bdf, "mem_device_bytes"));

	/* A freed buffer makes room again; so does a higher limit. */
	ASSERT_EQ(0, ubuf_free(self->fd, &b));
	ASSERT_EQ(0, ubuf_dev(self->fd, 4096, &c));
	ASSERT_EQ(0, ubuf_free(self->fd, &c));
	EXPECT_EQ(-EDQUOT, ubuf_dev(self->fd, 2 * MIB, &b));
	ASSERT_EQ(0, dmem_set_max(self->region, -1));
	ASSERT_EQ(0, ubuf_dev(self->fd, 2 * MIB, &b));
	EXPECT_EQ(3 * MIB, dmem_current(self->region));
	ASSERT_EQ(0, ubuf_free(self->fd, &b));
	ASSERT_EQ(0, ubuf_free(self->fd, &a));
	EXPECT_EQ(0, dmem_current(self->region));
	EXPECT_EQ(dev0, udma_counter(self->bdf, "mem_device_bytes"));
}

/* Closing the file gives back everything it held: buffers and device rings. */
TEST_F(dmem, close_gives_the_charge_back)
{
	struct ubuf a, b;

	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &a));
	ASSERT_EQ(0, ubuf_dev(self->fd, 64 * KIB, &b));
	ASSERT_EQ(0, qinit(self->fd, DR));
	EXPECT_LT(MIB + 64 * KIB, dmem_current(self->region));
	ASSERT_EQ(0, close(self->fd));
	self->fd = -1;
	EXPECT_EQ(0, dmem_settle(self->region, 0));
}

/*
 * A dma-buf export keeps its buffer's range, and so the charge, after the file that allocated
 * it is closed; the charge goes back with the dma-buf's last descriptor.
 */
TEST_F(dmem, export_keeps_the_charge_until_released)
{
	struct neuron_udma_dmabuf_export e = { .fd = -1 };
	struct ubuf a;

	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &a));
	e.handle = a.handle;
	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_DMABUF_EXPORT, &e));
	ASSERT_LE(0, e.fd);
	EXPECT_EQ(-EBUSY, mem_free(self->fd, a.handle));
	ASSERT_EQ(0, close(self->fd));
	self->fd = -1;
	usleep(100000);
	EXPECT_EQ(MIB, dmem_current(self->region));
	ASSERT_EQ(0, close(e.fd));
	EXPECT_EQ(0, dmem_settle(self->region, 0));
}

/* The child of killed_scrub_charge_comes_back_at_the_next_allocation: MEM_ALLOC on @arg's fd. */
static int alloc_child(void *arg)
{
	struct ubuf b;

	return ubuf_dev(*(int *)arg, MIB, &b) ? 1 : 0;
}

/*
 * A MEM_ALLOC killed during its scrub leaves the range (and its charge) to the driver until the
 * engine is done; the next allocating call of any file (here QUEUE_INIT with device rings, in a
 * cgroup whose dmem.max the stale charge would fill) finds the engine done and gives it back
 * first. The killed task's file stays open in this process, so no close reaps it.
 */
TEST_F_TIMEOUT(dmem, killed_scrub_charge_comes_back_at_the_next_allocation, 120)
{
	__u32 h2t = self->info.generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
	struct ubar2 bar2;
	pid_t pid;

	ASSERT_EQ(0, dmem_set_max(self->region, MIB));
	ASSERT_EQ(0, bar2_open(&bar2));
	/* The shared H2T queue stalls 1.5 s: the child's scrub waits there. */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_STALL, h2t, 0, 1500));
	pid = sec_spawn(0, alloc_child, &self->fd);
	ASSERT_LT(0, pid);
	sleep_ms(500);
	EXPECT_EQ(MIB, dmem_current(self->region));
	kill(pid, SIGKILL);
	EXPECT_EQ(128 + SIGKILL, sec_reap(pid));
	/* The scrub is still in flight: the range and its charge stay. */
	EXPECT_EQ(MIB, dmem_current(self->region));
	sleep_ms(2500);
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);
	/* Nothing reaped yet (no file was closed, nothing allocated) ... */
	EXPECT_EQ(MIB, dmem_current(self->region));
	/* ... until the next allocation, which reaps first and fits. */
	ASSERT_EQ(0, qinit(self->fd, DR));
	EXPECT_EQ(36 * KIB, dmem_current(self->region));
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	EXPECT_EQ(0, dmem_settle(self->region, 0));
}

/*
 * An unbind gives back the charge of every range at once, while the file that allocated them
 * is still open, and unregisters the region: it is no longer listed (nothing can be limited or
 * charged against a device that is gone). After a rebind the region is listed again, unlimited
 * and empty, and charges anew.
 */
TEST_F(dmem, unbind_gives_the_charge_back)
{
	struct ubuf a, b;
	int fd2, ret;

	ASSERT_EQ(0, dmem_set_max(self->region, 64 * MIB));
	ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &a));
	ASSERT_EQ(0, qinit(self->fd, DR));
	EXPECT_LT(MIB, dmem_current(self->region));
	ret = sysfs_write(UDMA_DRV_DIR "/unbind", self->bdf);
	ASSERT_EQ(0, ret) {
		TH_LOG("unbind %s: %s", self->bdf, strerror(-ret));
	}
	EXPECT_EQ(-1, dmem_read(CG_ROOT "/dmem.capacity", self->region));
	EXPECT_EQ(-1, dmem_current(self->region));
	EXPECT_EQ(-1, dmem_read(CG_DIR "/dmem.max", self->region));
	EXPECT_EQ(-ENODEV, ubuf_dev(self->fd, 4096, &b));
	EXPECT_EQ(-ENODEV, mem_free(self->fd, a.handle));
	EXPECT_EQ(0, close(self->fd));
	self->fd = -1;

	ret = sysfs_write(UDMA_DRV_DIR "/bind", self->bdf);
	ASSERT_EQ(0, ret) {
		TH_LOG("bind %s: %s", self->bdf, strerror(-ret));
	}
	fd2 = udma_open_wait();
	ASSERT_LE(0, fd2);
	EXPECT_EQ((long long)self->info.device_mem_size,
		  dmem_read(CG_ROOT "/dmem.capacity", self->region));
	EXPECT_EQ(0, dmem_current(self->region));
	EXPECT_EQ(LLONG_MAX, dmem_read(CG_DIR "/dmem.max", self->region));
	ASSERT_EQ(0, ubuf_dev(fd2, MIB, &b));
	EXPECT_EQ(MIB, dmem_current(self->region));
	ASSERT_EQ(0, ubuf_free(fd2, &b));
	EXPECT_EQ(0, dmem_current(self->region));
	close(fd2);
}

TEST_HARNESS_MAIN
