/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers of the kselftests that run with several Neuron devices in one guest (the multi-device
 * pass of `make check`): the devices on the PCI bus, which /dev/neuron_udmaN belongs to which PCI
 * device, a copy worker that tells a lost device (ENODEV, SIGBUS) from a wrong result, and
 * bounded waits for child processes.
 */
#ifndef _UDMA_MULTI_H
#define _UDMA_MULTI_H

#include <dirent.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "udma_util.h"

#define UDMA_MAX_DEVS 32
#define UDMA_NODE_FMT "/dev/neuron_udma%d"
#define UDMA_DEBUGFS "/sys/kernel/debug/neuron_udma"
/* An engine with host connectivity on every generation (userspace-api.rst): user queues on it. */
#define UDMA_HOST_ENGINE 5
/* The queue that node_of_bdf() claims for a moment to find a node's device. */
#define UDMA_PROBE_QUEUE 13	/* not reserved on any generation (userspace-api.rst) */

struct udma_pci {
	char bdf[16];
	unsigned int device;	/* PCI device id */
};

static inline int pci_cmp(const void *a, const void *b)
{
	return strcmp(((const struct udma_pci *)a)->bdf, ((const struct udma_pci *)b)->bdf);
}

/* The Neuron devices (1d0f:7164/7264/7364) on the PCI bus, bound or not, sorted by address. */
static inline int udma_pci_list(struct udma_pci *out, int max)
{
	struct dirent *e;
	DIR *d = opendir(PCI_DEVS_DIR);
	int n = 0;

	if (!d)
		return -errno;
	while ((e = readdir(d)) && n < max) {
		unsigned long dev;

		if (e->d_name[0] == '.' || pci_attr_hex(e->d_name, "vendor") != 0x1d0f)
			continue;
		dev = pci_attr_hex(e->d_name, "device");
		if (dev != 0x7164 && dev != 0x7264 && dev != 0x7364)
			continue;
		snprintf(out[n].bdf, sizeof(out[n].bdf), "%.15s", e->d_name);
		out[n].device = dev;
		n++;
	}
	closedir(d);
	qsort(out, n, sizeof(*out), pci_cmp);
	return n;
}

/* Whether PCI device @bdf is bound to neuron_udma. */
static inline bool pci_bound(const char *bdf)
{
	char path[512], link[128];
	ssize_t n;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/driver", bdf);
	n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return false;
	link[n] = 0;
	return !strcmp(strrchr(link, '/') ? strrchr(link, '/') + 1 : link, "neuron_udma");
}

/* Polls @cond every 50 ms for at most @ms milliseconds: its last value. */
#define wait_until(cond, ms) ({					\
	int __i; bool __ok = false;					\
	for (__i = 0; __i <= (ms) / 50; __i++) {			\
		__ok = (cond);						\
		if (__ok)						\
			break;						\
		usleep(50000);						\
	}								\
	__ok;								\
})

static inline int node_open(int k)
{
	char path[32];

	snprintf(path, sizeof(path), UDMA_NODE_FMT, k);
	return open(path, O_RDWR | O_CLOEXEC);
}

/* Whether the debugfs `rings` file of @bdf lists user queue (@eng, @q). */
static inline bool debugfs_has_queue(const char *bdf, unsigned int eng, unsigned int q)
{
	char path[512], head[64], line[512];
	bool found = false;
	FILE *f;

	snprintf(path, sizeof(path), UDMA_DEBUGFS "/%s/rings", bdf);
	f = fopen(path, "re");
	if (!f)
		return false;
	snprintf(head, sizeof(head), "engine %u queue %u owner ", eng, q);
	while (!found && fgets(line, sizeof(line), f))
		found = !strncmp(line, head, strlen(head));
	fclose(f);
	return found;
}

/*
 * The number N of /dev/neuron_udmaN that belongs to PCI device @bdf, or -ENOENT: each node in
 * turn claims queue (UDMA_HOST_ENGINE, UDMA_PROBE_QUEUE) and the one whose queue shows in @bdf's
 * debugfs directory is it. The queue is released again; no other file may hold it meanwhile.
 */
static inline int node_of_bdf(const char *bdf)
{
	int k, fd, found = -ENOENT;

	for (k = 0; k < UDMA_MAX_DEVS && found < 0; k++) {
		fd = node_open(k);
		if (fd < 0)
			continue;
		if (!queue_init(fd, UDMA_HOST_ENGINE, UDMA_PROBE_QUEUE, 32, 32)) {
			if (debugfs_has_queue(bdf, UDMA_HOST_ENGINE, UDMA_PROBE_QUEUE))
				found = k;
			queue_release(fd, UDMA_HOST_ENGINE, UDMA_PROBE_QUEUE);
		}
		close(fd);
	}
	return found;
}

/*
 * Waits for child @pid at most @secs seconds; kills it (SIGKILL) when it takes longer. Returns
 * its wait status, or -ETIMEDOUT (it was killed) or -errno.
 */
static inline int wait_bounded(pid_t pid, double secs)
{
	double end = now_s() + secs;
	int status;
	pid_t r;

	for (;;) {
		r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return status;
		if (r < 0)
			return -errno;
		if (now_s() > end) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -ETIMEDOUT;
		}
		usleep(20000);
	}
}

/* Exit codes of copy_worker(): what went wrong, for the parent's log. */
enum worker_exit {
	WK_OK = 0,		/* done (gone = false) or the device went away as specified */
	WK_SETUP = 10,		/* open, QUEUE_INIT or MEM_ALLOC failed */
	WK_DATA = 11,		/* a copy that reported success left wrong bytes */
	WK_ERRNO = 12,		/* a call failed with an errno other than ENODEV */
	WK_AFTER = 13,		/* after ENODEV, a call did not fail with ENODEV */
	WK_NOBUS = 14,		/* after ENODEV, the mapping did not raise SIGBUS */
	WK_STUCK = 15,		/* the device did not go away within the time limit */
	WK_CLOSE = 16,		/* close() failed */
};

static sigjmp_buf worker_jmp;

static inline void worker_sigbus(int sig)
{
	(void)sig;
	siglongjmp(worker_jmp, 1);
}

/*
 * One process's copy loop on /dev/neuron_udma@node, user queue (UDMA_HOST_ENGINE, @queue):
 * host -> HBM through the user queue (COPY_PREPARE_ONE + COPY_WAIT), HBM -> host through MEMCPY,
 * each round with fresh bytes (seed @seed), checked byte for byte. @size bytes per copy
 * (<= UDMA_MAX_COPY). After the first good round, one byte is written to @ready_fd.
 *
 * With @expect_gone false it runs @rounds rounds and returns WK_OK. With @expect_gone true it runs
 * until the device goes away (at most @limit_s seconds): the first failing call must fail with
 * ENODEV (a SIGBUS while touching the buffers counts as the device going away too); then every
 * call must fail with ENODEV. Once the unbind has returned (end of file on @gone_fd: the
 * parent closes its end; the driver's remove may still be running when the first ENODEV comes),
 * both mappings must raise SIGBUS, and close() must work. Every wait is bounded (timeout_ms
 * 5000, @limit_s for @gone_fd). Returns an enum worker_exit.
 */
static inline int copy_worker(int node, unsigned int queue, __u32 seed, __u32 size, int rounds,
			      bool expect_gone, double limit_s, int ready_fd, int gone_fd)
{
	struct pollfd gone = { .fd = gone_fd, .events = POLLIN };
	char c;
	struct sigaction sa = { .sa_handler = worker_sigbus };
	struct ubuf src, dst, hbm, extra;
	double end = now_s() + limit_s;
	volatile int round = 0;
	volatile bool told = false;
	const char *volatile what = "";
	int fd, ret = 0;

	sigemptyset(&sa.sa_mask);
	fd = node_open(node);
	if (fd < 0)
		ret = -errno, what = "open";
	else if ((ret = queue_init(fd, UDMA_HOST_ENGINE, queue, 64, 64)))
		what = "QUEUE_INIT";
	else if ((ret = ubuf_host(fd, size, &src)) || (ret = ubuf_host(fd, size, &dst)))
		what = "MEM_ALLOC (host)";
	else if ((ret = ubuf_dev(fd, size, &hbm)))
		what = "MEM_ALLOC (device)";
	if (ret) {
		fprintf(stderr, "# worker on /dev/neuron_udma%d queue %u: %s: %s\n", node, queue,
			what, strerror(-ret));
		return WK_SETUP;
	}
	sigaction(SIGBUS, &sa, NULL);
	if (sigsetjmp(worker_jmp, 1)) {
		/* A buffer access faulted: only a lost device may do that. */
		if (!expect_gone)
			return WK_NOBUS;
		ret = -ENODEV;
		goto gone;
	}
	for (;;) {
		if (!expect_gone && round >= rounds)
			break;
		if (expect_gone && now_s() > end)
			return WK_STUCK;
		fill_pattern(src.map, size, seed + round);
		memset(dst.map, 0, size);
		what = "COPY_PREPARE_ONE";
		ret = prep_one(fd, UDMA_HOST_ENGINE, queue, ucopy(&src, 0, &hbm, 0, size));
		if (!ret) {
			what = "COPY_WAIT";
			ret = copy_wait(fd, UDMA_HOST_ENGINE, queue, 5000, NULL);
		}
		if (!ret) {
			what = "MEMCPY";
			ret = udma_memcpy(fd, &hbm, 0, &dst, 0, size, 5000);
		}
		if (ret)
			break;
		if (first_diff(src.map, dst.map, size) >= 0)
			return WK_DATA;
		round++;
		if (!told && ready_fd >= 0) {
			told = true;
			if (write(ready_fd, "r", 1) != 1)
				return WK_SETUP;
		}
	}
	if (!expect_gone)
		return close(fd) ? WK_CLOSE : WK_OK;
gone:
	if (ret != -ENODEV) {
		/* A TAP diagnostic line: which call, which errno. */
		fprintf(stderr, "# worker on /dev/neuron_udma%d queue %u, round %d: %s: %s\n", node,
			queue, round, what, strerror(-ret));
		return WK_ERRNO;
	}
	if (udma_memcpy(fd, &hbm, 0, &dst, 0, size, 1000) != -ENODEV ||
	    copy_wait(fd, UDMA_HOST_ENGINE, queue, 1000, NULL) != -ENODEV ||
	    ubuf_host(fd, 4096, &extra) != -ENODEV ||
	    queue_release(fd, UDMA_HOST_ENGINE, queue) != -ENODEV)
		return WK_AFTER;
	if (gone_fd >= 0 && (poll(&gone, 1, (int)(limit_s * 1000)) != 1 || read(gone_fd, &c, 1) != 0))
		return WK_STUCK;
	if (touch_signal(src.map, false) != SIGBUS || touch_signal(dst.map, true) != SIGBUS)
		return WK_NOBUS;
	munmap(src.map, size);
	munmap(dst.map, size);
	return close(fd) ? WK_CLOSE : WK_OK;
}

static inline const char *worker_what(int status)
{
	static char buf[64];

	if (status == -ETIMEDOUT)
		return "hung (killed after its time limit)";
	if (status < 0)
		return strerror(-status);
	if (WIFSIGNALED(status)) {
		snprintf(buf, sizeof(buf), "killed by signal %d", WTERMSIG(status));
		return buf;
	}
	switch (WEXITSTATUS(status)) {
	case WK_OK: return "ok";
	case WK_SETUP: return "setup (open, QUEUE_INIT, MEM_ALLOC) failed";
	case WK_DATA: return "a successful copy left wrong bytes";
	case WK_ERRNO: return "a call failed with an errno other than ENODEV";
	case WK_AFTER: return "after ENODEV, a call did not fail with ENODEV";
	case WK_NOBUS: return "a mapping did not raise SIGBUS (or raised it while bound)";
	case WK_STUCK: return "the device did not go away within the time limit";
	case WK_CLOSE: return "close() failed";
	}
	snprintf(buf, sizeof(buf), "exit status %d", WEXITSTATUS(status));
	return buf;
}

#endif /* _UDMA_MULTI_H */
