// SPDX-License-Identifier: GPL-2.0
/*
 * Unbind under load (the multi-device pass of `make check`): a device is unbound through sysfs
 * while 4 processes copy on it (user queues and MEMCPY, host buffers mmap'ed) and, when the image
 * has it, the ABI fuzzer runs on it: every process gets ENODEV, nothing hangs (every wait is
 * bounded), the mappings raise SIGBUS, the other devices keep copying byte-exact, and after the
 * rebind the device works again; 20 times. Also: rmmod while a file or only a mapping is open
 * fails and changes nothing, and PCI remove + rescan with a file open.
 *
 * The victim is the device of /dev/neuron_udma0 (the fuzzer's default node); a rebound device
 * gets the lowest free name, so it is /dev/neuron_udma0 again.
 */
#define _GNU_SOURCE
#include <poll.h>
#include <stdlib.h>
#include <sys/syscall.h>

#include "kselftest_harness.h"
#include "udma_multi.h"

#define CYCLES 10
#define WORKERS 4
#define COPY_SIZE 16384
#define FUZZER "/usr/bin/udma-fuzz"

FIXTURE(victim) {
	struct udma_pci pci[UDMA_MAX_DEVS];
	int n;
	char bdf[16];		/* the device of /dev/neuron_udma0 */
};

FIXTURE_SETUP(victim)
{
	int i;

	self->n = udma_pci_list(self->pci, UDMA_MAX_DEVS);
	ASSERT_GE(self->n, 1);
	self->bdf[0] = 0;
	for (i = 0; i < self->n; i++) {
		ASSERT_TRUE(wait_until(pci_bound(self->pci[i].bdf), 5000));
		if (node_of_bdf(self->pci[i].bdf) == 0)
			snprintf(self->bdf, sizeof(self->bdf), "%.15s", self->pci[i].bdf);
	}
	ASSERT_NE(0, self->bdf[0]) TH_LOG("no PCI device owns /dev/neuron_udma0");
}

FIXTURE_TEARDOWN(victim)
{
	/* Leave every device bound for what follows, whatever failed. */
	if (access(PCI_DEVS_DIR "/", F_OK) == 0 && self->bdf[0] && !pci_bound(self->bdf)) {
		sysfs_write(UDMA_DRV_DIR "/bind", self->bdf);
		sysfs_write("/sys/bus/pci/rescan", "1");
	}
}

/* Copies on /dev/neuron_udma@node, returns the worker's verdict (WK_OK when byte-exact). */
static int quick_copy(int node, unsigned int queue, __u32 seed)
{
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (!pid)
		_exit(copy_worker(node, queue, seed, 8192, 2, false, 0, -1, -1));
	return wait_bounded(pid, 60);
}

static bool worker_ok(int status)
{
	return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == WK_OK;
}

/* Reads @n bytes from @fd within @secs seconds: 0, or -ETIMEDOUT / -EPIPE / -errno. */
static int read_n_bounded(int fd, int n, double secs)
{
	double end = now_s() + secs;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	while (n > 0) {
		int left = (int)((end - now_s()) * 1000);

		if (left <= 0)
			return -ETIMEDOUT;
		if (poll(&p, 1, left) < 0)
			return -errno;
		if (!(p.revents & (POLLIN | POLLHUP)))
			continue;
		if (read(fd, &c, 1) != 1)
			return -EPIPE;	/* every writer exited before saying ready */
		n--;
	}
	return 0;
}

TEST_F_TIMEOUT(victim, unbind_under_load, 900)
{
	bool fuzz = access(FUZZER, X_OK) == 0;
	int cycle, i, status, ready[2], gone[2], bystander = self->n > 1 ? 1 : -1;
	pid_t pid[WORKERS], fpid, bpid;
	double t0 = now_s();

	TH_LOG("victim %s, %d devices, fuzzer %s", self->bdf, self->n, fuzz ? FUZZER : "not in the image");
	for (cycle = 0; cycle < CYCLES; cycle++) {
		ASSERT_EQ(0, pipe(ready));
		ASSERT_EQ(0, pipe2(gone, O_CLOEXEC));
		for (i = 0; i < WORKERS; i++) {
			pid[i] = fork();
			ASSERT_LE(0, pid[i]);
			if (!pid[i]) {
				close(ready[0]);
				close(gone[1]);
				_exit(copy_worker(0, 1 + i, cycle * 16 + i, COPY_SIZE, 0, true, 120,
						  ready[1], gone[0]));
			}
		}
		close(gone[0]);
		close(ready[1]);
		fpid = -1;
		if (fuzz) {
			fpid = fork();
			ASSERT_LE(0, fpid);
			if (!fpid) {
				char seed[16];
				int null_fd;

				/*
				 * Without fault injection: a fault would hit the workers'
				 * queues, whose errors must be ENODEV only. More operations
				 * than it can do before the unbind.
				 */
				snprintf(seed, sizeof(seed), "%d", cycle + 1);
				close(gone[1]);
				/*
				 * Its own TAP report ends in "not ok" when the device goes away
				 * under it (ENODEV, ENOENT: expected here); it must not be read as
				 * this test's cases, and its exit status is not judged.
				 */
				null_fd = open("/dev/null", O_WRONLY);
				if (null_fd >= 0) {
					dup2(null_fd, STDOUT_FILENO);
					dup2(null_fd, STDERR_FILENO);
					close(null_fd);
				}
				execl(FUZZER, FUZZER, "--device", "/dev/neuron_udma0", "--faults", "off",
				      "--seed", seed, "--ops", "100000000", (char *)NULL);
				_exit(127);
			}
		}
		/* Another device copies meanwhile: it must not notice the unbind. */
		bpid = -1;
		if (bystander > 0) {
			bpid = fork();
			ASSERT_LE(0, bpid);
			if (!bpid) {
				close(gone[1]);
				_exit(copy_worker(bystander, 2, 0xb000 + cycle, 8192, 6, false, 0, -1,
						  -1));
			}
		}
		/* Unbind once every worker has completed a round and is copying. */
		status = read_n_bounded(ready[0], WORKERS, 120);
		close(ready[0]);
		EXPECT_EQ(0, status) TH_LOG("cycle %d: the workers did not start copying: %s", cycle,
					    strerror(-status));
		usleep(20000 * (cycle % 5));
		if (fpid > 0)
			EXPECT_EQ(0, waitpid(fpid, &status, WNOHANG))
				TH_LOG("cycle %d: the fuzzer ended before the unbind (status %#x)", cycle,
				       status);
		status = sysfs_write(UDMA_DRV_DIR "/unbind", self->bdf);
		ASSERT_EQ(0, status) TH_LOG("cycle %d: unbind %s: %s", cycle, self->bdf, strerror(-status));
		EXPECT_FALSE(pci_bound(self->bdf));
		close(gone[1]);	/* the unbind returned: the workers check their mappings */
		for (i = 0; i < WORKERS; i++) {
			status = wait_bounded(pid[i], 60);
			EXPECT_TRUE(worker_ok(status))
				TH_LOG("cycle %d, worker %d: %s", cycle, i, worker_what(status));
		}
		if (fpid > 0) {
			/*
			 * The fuzzer's own model does not expect the device to vanish: its verdict
			 * (and how long it takes to shrink its "failure") is not ours. It gets 20 s
			 * to end, then SIGKILL; a task stuck in the driver would not die and the
			 * harness's timeout (and the hung-task detector) would report it.
			 */
			status = wait_bounded(fpid, 20);
			if (status == -ETIMEDOUT)
				TH_LOG("cycle %d: the fuzzer was still running 20 s after the unbind: killed",
				       cycle);
		}
		if (bpid > 0) {
			status = wait_bounded(bpid, 120);
			EXPECT_TRUE(worker_ok(status))
				TH_LOG("cycle %d: bystander /dev/neuron_udma%d: %s", cycle, bystander,
				       worker_what(status));
		}
		status = sysfs_write(UDMA_DRV_DIR "/bind", self->bdf);
		ASSERT_EQ(0, status) TH_LOG("cycle %d: bind %s: %s", cycle, self->bdf, strerror(-status));
		ASSERT_TRUE(wait_until(node_of_bdf(self->bdf) == 0, 5000))
			TH_LOG("cycle %d: %s is not /dev/neuron_udma0 after the rebind", cycle, self->bdf);
		status = quick_copy(0, 3, 0xc000 + cycle);
		ASSERT_TRUE(worker_ok(status))
			TH_LOG("cycle %d: after the rebind: %s", cycle, worker_what(status));
		if (!__test_passed(_metadata))
			break;
	}
	TH_LOG("%d cycles in %.1f s", cycle, now_s() - t0);
	for (i = 0; i < self->n; i++) {
		status = quick_copy(i, 4, 0xd000 + i);
		EXPECT_TRUE(worker_ok(status)) TH_LOG("/dev/neuron_udma%d at the end: %s", i,
						      worker_what(status));
	}
}

static bool module_loaded(void)
{
	char line[256];
	bool found = false;
	FILE *f = fopen("/proc/modules", "re");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f))
		found = !strncmp(line, "neuron_udma ", 12);
	fclose(f);
	return found;
}

/* delete_module(2) as rmmod does it: 0 or -errno. */
static int try_rmmod(void)
{
	return syscall(SYS_delete_module, "neuron_udma", O_NONBLOCK) ? -errno : 0;
}

/*
 * rmmod while a file is open, and while only a mapping of a closed file is left: delete_module
 * fails with EWOULDBLOCK (the kernel's "in use", the module's reference count is held) and
 * changes nothing: the module stays, every device stays bound, the open file keeps copying.
 */
TEST_F_TIMEOUT(victim, rmmod_while_open_fails, 300)
{
	struct ubuf a;
	int fd, i, status;

	fd = node_open(0);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, UDMA_HOST_ENGINE, 1, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd, 8192, &a));
	fill_pattern(a.map, 4096, 77);

	EXPECT_EQ(-EWOULDBLOCK, try_rmmod());
	EXPECT_TRUE(module_loaded());
	for (i = 0; i < self->n; i++)
		EXPECT_TRUE(pci_bound(self->pci[i].bdf)) TH_LOG("%s", self->pci[i].bdf);
	ASSERT_EQ(0, copy_sync(fd, UDMA_HOST_ENGINE, 1, ucopy(&a, 0, &a, 4096, 4096)));
	EXPECT_EQ(-1, first_diff(a.map, a.map + 4096, 4096));

	/* Only the mapping holds the file now. */
	EXPECT_EQ(0, close(fd));
	EXPECT_EQ(-EWOULDBLOCK, try_rmmod());
	EXPECT_TRUE(module_loaded());
	EXPECT_EQ(0, touch_signal(a.map, true));
	munmap(a.map, a.size);

	for (i = 0; i < self->n; i++) {
		status = quick_copy(i, 2, 0xe000 + i);
		EXPECT_TRUE(worker_ok(status)) TH_LOG("/dev/neuron_udma%d: %s", i, worker_what(status));
	}
}

/*
 * PCI remove (/sys/bus/pci/devices/X/remove) with a file open on the device: the file gets
 * ENODEV and its mapping SIGBUS; a rescan (/sys/bus/pci/rescan) finds the device again, the
 * driver binds it, and it copies byte-exact.
 */
TEST_F_TIMEOUT(victim, pci_remove_and_rescan, 300)
{
	char path[512];
	int status;
	pid_t pid;

	/* The worker holds /dev/neuron_udma0 with a queue and two mappings across the remove. */
	int ready[2], gone[2];

	ASSERT_EQ(0, pipe(ready));
	ASSERT_EQ(0, pipe(gone));
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid) {
		close(ready[0]);
		close(gone[1]);
		_exit(copy_worker(0, 1, 0xf000, COPY_SIZE, 0, true, 120, ready[1], gone[0]));
	}
	close(ready[1]);
	close(gone[0]);
	EXPECT_EQ(0, read_n_bounded(ready[0], 1, 120));
	close(ready[0]);

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/remove", self->bdf);
	ASSERT_EQ(0, sysfs_write(path, "1"));
	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s", self->bdf);
	EXPECT_NE(0, access(path, F_OK)) TH_LOG("%s still exists after remove", self->bdf);
	close(gone[1]);
	status = wait_bounded(pid, 60);
	EXPECT_TRUE(worker_ok(status)) TH_LOG("the file across the remove: %s", worker_what(status));

	ASSERT_EQ(0, sysfs_write("/sys/bus/pci/rescan", "1"));
	ASSERT_TRUE(wait_until(pci_bound(self->bdf), 10000))
		TH_LOG("%s is not bound after the rescan", self->bdf);
	ASSERT_TRUE(wait_until(node_of_bdf(self->bdf) == 0, 5000))
		TH_LOG("%s is not /dev/neuron_udma0 after the rescan", self->bdf);
	status = quick_copy(0, 2, 0xf100);
	EXPECT_TRUE(worker_ok(status)) TH_LOG("after the rescan: %s", worker_what(status));
}

TEST_HARNESS_MAIN
