// SPDX-License-Identifier: GPL-2.0
/*
 * Several Neuron devices in one guest (the multi-device pass of `make check`, scripts/vm-run
 * --devices N): every device binds, each gets its own /dev/neuron_udmaN and debugfs directory,
 * and copies on all devices at once (one process per device, user queues and MEMCPY, host ->
 * HBM -> host) are byte-exact and do not disturb each other.
 *
 * NU_EXPECT_DEVICES (environment) is the number of devices the guest must have (the guest test
 * plan sets it from tests/expected.toml); without it, at least 2.
 */
#include <stdlib.h>

#include "kselftest_harness.h"
#include "udma_multi.h"

/*
 * A queue per node, different for each of up to 48 nodes: engines 4-7 reach host memory on every
 * generation, queues 1-12 are reserved on none (userspace-api.rst, QUEUE_INIT).
 */
#define NODE_ENG(i) (4 + (i) / 12)
#define NODE_Q(i) (1 + (i) % 12)

FIXTURE(devices) {
	struct udma_pci pci[UDMA_MAX_DEVS];
	int n;
};

FIXTURE_SETUP(devices)
{
	const char *want = getenv("NU_EXPECT_DEVICES");
	int i, expect = want ? atoi(want) : 0;

	/* Probing is synchronous, but give a slow (TCG) guest a moment for the last ones. */
	self->n = udma_pci_list(self->pci, UDMA_MAX_DEVS);
	ASSERT_GE(self->n, 0);
	if (expect) {
		ASSERT_EQ(expect, self->n) TH_LOG("%d Neuron PCI devices, NU_EXPECT_DEVICES=%d",
						  self->n, expect);
	} else {
		ASSERT_GE(self->n, 2) TH_LOG("this test needs at least 2 Neuron devices (vm-run --devices)");
	}
	for (i = 0; i < self->n; i++)
		ASSERT_TRUE(wait_until(pci_bound(self->pci[i].bdf), 5000))
			TH_LOG("%s is not bound to neuron_udma", self->pci[i].bdf);
}

FIXTURE_TEARDOWN(devices)
{
}

/* One generation per host: every device has the first one's PCI id. */
TEST_F_TIMEOUT(devices, all_bound_one_generation, 300)
{
	int i;

	for (i = 0; i < self->n; i++) {
		EXPECT_TRUE(pci_bound(self->pci[i].bdf));
		EXPECT_EQ(self->pci[0].device, self->pci[i].device);
	}
}

/*
 * /dev/neuron_udma0 .. N-1 exist, are distinct character devices, and N does not exist; each
 * reports the bound devices' PCI id.
 */
TEST_F_TIMEOUT(devices, one_node_each, 300)
{
	struct neuron_udma_info info;
	dev_t rdev[UDMA_MAX_DEVS];
	char path[32];
	struct stat st;
	int i, j, fd;

	for (i = 0; i < self->n; i++) {
		snprintf(path, sizeof(path), UDMA_NODE_FMT, i);
		ASSERT_EQ(0, stat(path, &st)) TH_LOG("%s: %s", path, strerror(errno));
		EXPECT_TRUE(S_ISCHR(st.st_mode));
		rdev[i] = st.st_rdev;
		for (j = 0; j < i; j++)
			EXPECT_NE(rdev[j], rdev[i]);
		fd = node_open(i);
		ASSERT_LE(0, fd);
		ASSERT_EQ(0, udma_info(fd, &info));
		EXPECT_EQ(0x1d0f, info.vendor_id);
		EXPECT_EQ(self->pci[0].device, info.device_id);
		close(fd);
	}
	snprintf(path, sizeof(path), UDMA_NODE_FMT, self->n);
	EXPECT_NE(0, stat(path, &st)) TH_LOG("%s exists with only %d devices", path, self->n);
}

/*
 * Each PCI device has its own debugfs directory, and each node belongs to exactly one of them:
 * a queue claimed on node i shows in exactly one directory, a different one for every node.
 */
TEST_F_TIMEOUT(devices, node_to_debugfs_is_one_to_one, 300)
{
	int owner[UDMA_MAX_DEVS], fds[UDMA_MAX_DEVS];
	char path[512];
	int i, j, hits;

	for (j = 0; j < self->n; j++) {
		snprintf(path, sizeof(path), UDMA_DEBUGFS "/%s/rings", self->pci[j].bdf);
		ASSERT_EQ(0, access(path, R_OK)) TH_LOG("%s: %s", path, strerror(errno));
		snprintf(path, sizeof(path), UDMA_DEBUGFS "/%s/queues", self->pci[j].bdf);
		ASSERT_EQ(0, access(path, R_OK)) TH_LOG("%s: %s", path, strerror(errno));
		owner[j] = -1;
	}
	/* Node i claims a queue of its own: (NODE_ENG(i), NODE_Q(i)) differs per node. */
	for (i = 0; i < self->n; i++) {
		fds[i] = node_open(i);
		ASSERT_LE(0, fds[i]);
		ASSERT_EQ(0, queue_init(fds[i], NODE_ENG(i), NODE_Q(i), 32, 32));
	}
	for (i = 0; i < self->n; i++) {
		hits = 0;
		for (j = 0; j < self->n; j++) {
			if (!debugfs_has_queue(self->pci[j].bdf, NODE_ENG(i), NODE_Q(i)))
				continue;
			hits++;
			EXPECT_EQ(-1, owner[j]) TH_LOG("%s shows the queues of nodes %d and %d",
						       self->pci[j].bdf, owner[j], i);
			owner[j] = i;
		}
		EXPECT_EQ(1, hits) TH_LOG("queue %d/%d of node %d shows in %d debugfs directories",
					  NODE_ENG(i), NODE_Q(i), i, hits);
	}
	for (i = 0; i < self->n; i++) {
		EXPECT_EQ(0, queue_release(fds[i], NODE_ENG(i), NODE_Q(i)));
		close(fds[i]);
	}
	for (j = 0; j < self->n; j++)
		if (owner[j] >= 0)
			EXPECT_FALSE(debugfs_has_queue(self->pci[j].bdf, NODE_ENG(owner[j]),
						       NODE_Q(owner[j])));
}

/*
 * One process per device, started together (a pipe is the starting gun), each copying host ->
 * HBM through a user queue and back through MEMCPY with its own bytes: every copy is byte-exact.
 * The node_to_debugfs test shows the nodes are distinct devices, so this is N devices at once.
 */
TEST_F_TIMEOUT(devices, concurrent_copies_are_independent, 300)
{
	pid_t pid[UDMA_MAX_DEVS];
	int gun[2], i, status;
	char c;

	ASSERT_EQ(0, pipe(gun));
	for (i = 0; i < self->n; i++) {
		pid[i] = fork();
		ASSERT_LE(0, pid[i]);
		if (!pid[i]) {
			close(gun[1]);
			if (read(gun[0], &c, 1) != 0)
				_exit(WK_SETUP);
			/* Same queue id on every device: queues of different devices are unrelated. */
			_exit(copy_worker(i, 1, 0x1000 * (i + 1), 32768, 12, false, 0, -1, -1));
		}
	}
	close(gun[0]);
	close(gun[1]);	/* EOF: all start */
	for (i = 0; i < self->n; i++) {
		status = wait_bounded(pid[i], 120);
		EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == WK_OK)
			TH_LOG("device %d (/dev/neuron_udma%d): %s", i, i, worker_what(status));
	}
}

TEST_HARNESS_MAIN
