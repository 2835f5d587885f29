// SPDX-License-Identifier: GPL-2.0
/*
 * The device's NUMA node (the NUMA pass of make check: scripts/vm-run --numa gives the guest two
 * nodes and puts the PCI root bus, so the device, on node 1): INFO reports the node the kernel
 * gave the PCI device (sysfs numa_node), node 1 here, and the driver's completion work is queued
 * on that node (the workqueue_queue_work tracepoint's req_cpu is a CPU of node 1 for every run
 * of the completion engine that an eventfd's fences cause).
 */
#define _GNU_SOURCE
#include <sys/eventfd.h>
#include <sys/mount.h>
#include "kselftest_harness.h"
#include "udma_fence.h"

#define TRACEFS "/sys/kernel/tracing"
#define ENG 15
#define QID 6
#define FENCES 8
#define SIZE 65536

/* The PCI device's numa_node attribute: the node, -1 for none; -1000 if unreadable. */
static int sysfs_node(const char *bdf)
{
	char path[128];
	int node = -1000;
	FILE *f;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/numa_node", bdf);
	f = fopen(path, "re");
	if (!f)
		return -1000;
	if (fscanf(f, "%d", &node) != 1)
		node = -1000;
	fclose(f);
	return node;
}

/* Whether CPU @cpu is in node @node's cpulist ("0", "1-3", "0,2"). */
static bool cpu_of_node(int cpu, int node)
{
	char path[96], list[128], *tok, *save = NULL;
	bool in = false;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
	f = fopen(path, "re");
	if (!f)
		return false;
	if (!fgets(list, sizeof(list), f))
		list[0] = 0;
	fclose(f);
	for (tok = strtok_r(list, ",\n", &save); tok; tok = strtok_r(NULL, ",\n", &save)) {
		int a, b;

		if (sscanf(tok, "%d-%d", &a, &b) == 2)
			in |= cpu >= a && cpu <= b;
		else if (sscanf(tok, "%d", &a) == 1)
			in |= cpu == a;
	}
	return in;
}

static int tracefs_write(const char *file, const char *val)
{
	char path[256];

	snprintf(path, sizeof(path), TRACEFS "/%s", file);
	return sysfs_write(path, val);
}

FIXTURE(numa) {
	char bdf[32];
	int fd;
	int node;
};

FIXTURE_SETUP(numa)
{
	ASSERT_EQ(0, udma_bdf(self->bdf, sizeof(self->bdf)));
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	self->node = sysfs_node(self->bdf);
}

FIXTURE_TEARDOWN(numa)
{
	close(self->fd);
}

/* INFO's node is the kernel's, and the NUMA pass put the device on node 1 of two. */
TEST_F(numa, info_reports_the_device_node)
{
	struct neuron_udma_info info;

	ASSERT_EQ(0, udma_info(self->fd, &info));
	EXPECT_EQ(self->node, info.numa_node);
	ASSERT_EQ(0, access("/sys/devices/system/node/node1", F_OK))
		TH_LOG("one NUMA node: this test runs in the NUMA pass (scripts/vm-run --numa)");
	EXPECT_EQ(1, info.numa_node);
}

/*
 * Fences with an eventfd on the queue, each submitted while the model stalls the queue for 20 ms
 * (so COPY_SUBMIT's own look finds it in flight and has the completion engine watch it): the
 * engine retires them and signals; each time it is queued (workqueue_queue_work on
 * events_unbound, the Completer's work function) the CPU it was queued for is one of the
 * device's node.
 */
TEST_F(numa, completion_work_is_queued_on_the_device_node)
{
	char line[1024];
	int efd, queued = 0, elsewhere = 0;
	struct ubuf src, dst;
	struct ubar2 bar2;
	__u64 fence;
	FILE *f;

	ASSERT_LE(0, self->node);
	ASSERT_EQ(0, bar2_open(&bar2));
	if (access(TRACEFS "/events/workqueue", F_OK))
		ASSERT_EQ(0, mount("tracefs", TRACEFS, "tracefs", 0, NULL) ? -errno : 0);
	ASSERT_EQ(0, tracefs_write("events/workqueue/workqueue_queue_work/filter",
				   "workqueue == \"events_unbound\""));
	ASSERT_EQ(0, tracefs_write("buffer_size_kb", "1024"));
	ASSERT_EQ(0, tracefs_write("trace", ""));
	ASSERT_EQ(0, tracefs_write("events/workqueue/workqueue_queue_work/enable", "1"));
	ASSERT_EQ(0, tracefs_write("tracing_on", "1"));

	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 256, 256));
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ASSERT_LE(0, efd);
	ASSERT_EQ(0, queue_eventfd(self->fd, ENG, QID, efd));
	ASSERT_EQ(0, ubuf_host(self->fd, SIZE, &src));
	ASSERT_EQ(0, ubuf_host(self->fd, SIZE, &dst));
	fill_pattern(src.map, SIZE, 41);
	for (int i = 0; i < FENCES; i++) {
		memset(dst.map, 0, SIZE);
		ASSERT_EQ(0, bar2_fault(&bar2, FAULT_STALL, ENG, QID, 20));
		ASSERT_EQ(0, submit_one(self->fd, ENG, QID, ucopy(&src, 0, &dst, 0, SIZE), &fence));
		ASSERT_EQ(1ULL, efd_collect(efd, 1, 10000));
		ASSERT_GT(0, first_diff(src.map, dst.map, SIZE));
	}
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);
	tracefs_write("events/workqueue/workqueue_queue_work/enable", "0");
	tracefs_write("events/workqueue/workqueue_queue_work/filter", "0");

	f = fopen(TRACEFS "/trace", "re");
	ASSERT_NE(NULL, f);
	while (fgets(line, sizeof(line), f)) {
		char *req = strstr(line, "req_cpu=");

		if (line[0] == '#' || !req || !strstr(line, "Completer"))
			continue;
		queued++;
		if (!cpu_of_node(atoi(req + strlen("req_cpu=")), self->node)) {
			elsewhere++;
			TH_LOG("queued off node %d: %s", self->node, line);
		}
	}
	fclose(f);
	close(efd);
	TH_LOG("%d runs of the completion engine queued, %d off the device's node %d", queued,
	       elsewhere, self->node);
	EXPECT_LT(0, queued);
	EXPECT_EQ(0, elsewhere);
	EXPECT_EQ(0, queue_release(self->fd, ENG, QID));
}

TEST_HARNESS_MAIN
