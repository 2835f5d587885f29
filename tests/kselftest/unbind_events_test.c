// SPDX-License-Identifier: GPL-2.0
/*
 * Unbind with completion listeners (ABI 3; the multi-device pass of `make check`): a device is
 * unbound while a file has a fence in flight on a stalled queue, an eventfd registered on that
 * queue, a thread blocked in epoll_wait() on the file, and an io_uring NEURON_UDMA_URING_COPY
 * waiting for its fence. The unbind returns in bounded time; the io_uring command completes
 * with -ECANCELED; the epoll waiter wakes with EPOLLERR | EPOLLHUP; FENCE_WAIT, COPY_SUBMIT and
 * QUEUE_EVENTFD then fail with ENODEV; the eventfd is given back (closing our last descriptor
 * frees it: nothing of the driver holds it); the file closes; after the rebind the device
 * works and a second device was never disturbed.
 *
 * An io_uring command waiting on a stalled queue at unbind, on a normal and on an IOPOLL ring,
 * completes with -ECANCELED, its destination (imported memory, readable after the unbind)
 * untouched, also after the CQE.
 *
 * The victim is the device of /dev/neuron_udma0; its stall comes from its own BAR2 window.
 */
#define _GNU_SOURCE
#include <liburing.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "kselftest_harness.h"
#include "udma_multi.h"
#include "udma_uring.h"

#define ENG 15
#define QID 7
#define BUF (64U * 1024)

static int ioc(int fd, unsigned long req, void *arg)
{
	return ioctl(fd, req, arg) ? -errno : 0;
}

/* The BAR2 window of the model device @bdf (its fault injection). */
static volatile __u32 *bar2_of(const char *bdf, int *fd)
{
	char path[64];
	void *p;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%.15s/resource2", bdf);
	*fd = open(path, O_RDWR | O_SYNC | O_CLOEXEC);
	if (*fd < 0)
		return NULL;
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void stall(volatile __u32 *r, __u32 eng, __u32 q, __u32 ms)
{
	r[BAR2_FAULT_KIND / 4] = FAULT_STALL;
	r[BAR2_FAULT_ENGINE / 4] = eng;
	r[BAR2_FAULT_QUEUE / 4] = q;
	r[BAR2_FAULT_ARG / 4] = ms;
	r[BAR2_FAULT_COMMIT / 4] = 1;
}

struct waiter {
	int ep;
	__u32 events;
	int n;
	double woke_s;
};

static void *epoll_waiter(void *arg)
{
	struct waiter *w = arg;
	struct epoll_event ev;

	w->n = epoll_wait(w->ep, &ev, 1, 30000);
	w->events = w->n == 1 ? ev.events : 0;
	w->woke_s = now_s();
	return NULL;
}

FIXTURE(victim) {
	struct udma_pci pci[UDMA_MAX_DEVS];
	int n;
	char bdf[16];		/* the device of /dev/neuron_udma0 */
};

/* The Neuron devices, all bound, in @pci (*@n), and in @bdf the one of /dev/neuron_udma0. */
static void victim_find(struct __test_metadata *_metadata, struct udma_pci *pci, int *n, char *bdf)
{
	int i;

	*n = udma_pci_list(pci, UDMA_MAX_DEVS);
	ASSERT_GE(*n, 1);
	bdf[0] = 0;
	for (i = 0; i < *n; i++) {
		ASSERT_TRUE(wait_until(pci_bound(pci[i].bdf), 5000));
		if (node_of_bdf(pci[i].bdf) == 0)
			snprintf(bdf, 16, "%.15s", pci[i].bdf);
	}
	ASSERT_NE(0, bdf[0]) TH_LOG("no PCI device owns /dev/neuron_udma0");
}

FIXTURE_SETUP(victim)
{
	victim_find(_metadata, self->pci, &self->n, self->bdf);
}

FIXTURE_TEARDOWN(victim)
{
}

TEST_F_TIMEOUT(victim, unbind_with_pollers_eventfds_and_sqes, 300)
{
	struct neuron_udma_mem_alloc a = { .size = BUF, .type = NEURON_UDMA_MEM_HOST };
	struct neuron_udma_queue_init qi = { .engine = ENG, .queue = QID, .tx_descs = 64,
					     .rx_descs = 64 };
	struct neuron_udma_copy c = { .size = 4096 };
	struct neuron_udma_copy_prepare_one p = { .engine = ENG, .queue = QID };
	struct neuron_udma_copy_submit sub = { .engine = ENG, .queue = QID };
	struct neuron_udma_fence_wait fw = { .engine = ENG, .queue = QID, .timeout_ms = 100 };
	struct neuron_udma_eventfd reg = { .engine = ENG, .queue = QID };
	struct epoll_event ev = { .events = EPOLLIN | EPOLLPRI };
	struct waiter w = { 0 };
	struct io_uring ring;
	struct io_uring_cqe *cqe;
	struct __kernel_timespec ts = { .tv_sec = 20 };
	volatile __u32 *bar2;
	pthread_t th;
	char bdf[16], path[64];
	int fd, efd, b2fd, ndev, bystander_ok;
	double t0;

	ndev = self->n;
	snprintf(bdf, sizeof(bdf), "%.15s", self->bdf);
	bar2 = bar2_of(bdf, &b2fd);
	ASSERT_NE(NULL, bar2);
	fd = node_open(0);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ioc(fd, NEURON_UDMA_MEM_ALLOC, &a));
	ASSERT_EQ(0, ioc(fd, NEURON_UDMA_QUEUE_INIT, &qi));
	c.src_handle = c.dst_handle = a.handle;
	c.dst_offset = 8192;
	p.copy = c;

	/* A fence in flight on a queue stalled for longer than the test. */
	stall(bar2, ENG, QID, 60000);
	ASSERT_EQ(0, ioc(fd, NEURON_UDMA_COPY_PREPARE_ONE, &p));
	ASSERT_EQ(0, ioc(fd, NEURON_UDMA_COPY_SUBMIT, &sub));
	ASSERT_EQ(1ULL, sub.fence);
	/* An eventfd on the queue. */
	efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ASSERT_LE(0, efd);
	reg.fd = efd;
	ASSERT_EQ(0, ioc(fd, NEURON_UDMA_QUEUE_EVENTFD, &reg));
	/* An io_uring command waiting for its fence. */
	ASSERT_EQ(0, io_uring_queue_init(4, &ring, 0));
	c.dst_offset = 16384;
	ASSERT_EQ(0, submit_copy(&ring, fd, NEURON_UDMA_URING_COPY, ENG, QID, &c, 1, 42));
	/* A thread in epoll_wait() on the file: nothing to report yet. */
	w.ep = epoll_create1(EPOLL_CLOEXEC);
	ASSERT_LE(0, w.ep);
	ASSERT_EQ(0, epoll_ctl(w.ep, EPOLL_CTL_ADD, fd, &ev));
	ASSERT_EQ(0, pthread_create(&th, NULL, epoll_waiter, &w));
	usleep(300 * 1000);
	ASSERT_EQ(0, w.n) TH_LOG("the waiter woke before the unbind");

	t0 = now_s();
	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/unbind", bdf));
	TH_LOG("unbind with listeners: %.2f s", now_s() - t0);
	EXPECT_LT(now_s() - t0, 20.0);

	/* The io_uring command: cancelled. */
	ASSERT_EQ(0, io_uring_wait_cqe_timeout(&ring, &cqe, &ts));
	EXPECT_EQ(42ULL, cqe->user_data);
	EXPECT_EQ(-ECANCELED, cqe->res);
	io_uring_cqe_seen(&ring, cqe);
	/* The epoll waiter: woken with the hang-up. */
	pthread_join(th, NULL);
	EXPECT_EQ(1, w.n);
	EXPECT_TRUE((w.events & EPOLLERR) != 0) TH_LOG("events %#x", w.events);
	EXPECT_TRUE((w.events & EPOLLHUP) != 0) TH_LOG("events %#x", w.events);
	EXPECT_LT(w.woke_s - t0, 20.0);
	/* Every later call: ENODEV. */
	fw.fence = 1;
	EXPECT_EQ(-ENODEV, ioc(fd, NEURON_UDMA_FENCE_WAIT, &fw));
	EXPECT_EQ(-ENODEV, ioc(fd, NEURON_UDMA_COPY_SUBMIT, &sub));
	reg.fd = -1;
	EXPECT_EQ(-ENODEV, ioc(fd, NEURON_UDMA_QUEUE_EVENTFD, &reg));
	close(w.ep);
	io_uring_queue_exit(&ring);
	EXPECT_EQ(0, close(efd));
	EXPECT_EQ(0, close(fd));
	munmap((void *)bar2, 4096);
	close(b2fd);

	/* A second device kept working all along. */
	if (ndev > 1) {
		pid_t pid = fork();

		ASSERT_LE(0, pid);
		if (!pid)
			_exit(copy_worker(1, 3, 0x7700, 8192, 2, false, 0, -1, -1));
		bystander_ok = wait_bounded(pid, 60);
		EXPECT_TRUE(bystander_ok >= 0 && WIFEXITED(bystander_ok) &&
			    WEXITSTATUS(bystander_ok) == WK_OK)
			TH_LOG("the second device: %s", worker_what(bystander_ok));
	}
	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/bind", bdf));
	ASSERT_TRUE(wait_until(pci_bound(bdf), 10000));
	ASSERT_TRUE(wait_until(node_of_bdf(bdf) == 0, 5000));
	snprintf(path, sizeof(path), "/dev/neuron_udma0");
	fd = open(path, O_RDWR | O_CLOEXEC);
	ASSERT_LE(0, fd);
	a = (struct neuron_udma_mem_alloc){ .size = BUF, .type = NEURON_UDMA_MEM_HOST };
	EXPECT_EQ(0, ioc(fd, NEURON_UDMA_MEM_ALLOC, &a));
	EXPECT_EQ(0, ioc(fd, NEURON_UDMA_QUEUE_INIT, &qi));
	close(fd);
}

/* ---- an io_uring command at unbind, on a normal and an IOPOLL ring ---- */

#define PAGE 4096U

/* The next CQE of @ring within @ms (an IOPOLL ring polled): 0 and its user_data/res, or -ETIME. */
static int cqe_within(struct io_uring *ring, bool iopoll, int ms, __u64 *data, int *res)
{
	struct io_uring_cqe *cqe = NULL;
	double end = now_s() + ms / 1000.0;

	for (;;) {
		if (iopoll)
			io_uring_get_events(ring);
		if (!io_uring_peek_cqe(ring, &cqe) && cqe)
			break;
		if (now_s() > end)
			return -ETIME;
		usleep(1000);
	}
	*data = cqe->user_data;
	*res = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return 0;
}

/*
 * A file of /dev/neuron_udma0 with queue (ENG, QID), and in @s and @d imports of the first and
 * the second page of @mem (copies' buffers the test can read also after the unbind).
 */
static int uring_file(unsigned char *mem, struct ubuf *s, struct ubuf *d)
{
	__u64 h = 0;
	int fd, ret;

	fd = node_open(0);
	if (fd < 0)
		return -errno;
	ret = queue_init(fd, ENG, QID, 64, 64);
	if (!ret)
		ret = udma_import(fd, mem, PAGE, 0, &h, NULL);
	*s = import_ubuf(h, PAGE);
	if (!ret)
		ret = udma_import(fd, mem + PAGE, PAGE, NEURON_UDMA_IMPORT_WRITE, &h, NULL);
	*d = import_ubuf(h, PAGE);
	if (ret) {
		close(fd);
		return ret;
	}
	return fd;
}

FIXTURE(uring_unbind) {
	struct udma_pci pci[UDMA_MAX_DEVS];
	int n;
	char bdf[16];		/* the device of /dev/neuron_udma0 */
};

FIXTURE_VARIANT(uring_unbind) {
	bool iopoll;		/* an IORING_SETUP_IOPOLL ring */
};

FIXTURE_VARIANT_ADD(uring_unbind, normal) { .iopoll = false };
FIXTURE_VARIANT_ADD(uring_unbind, iopoll) { .iopoll = true };

FIXTURE_SETUP(uring_unbind)
{
	victim_find(_metadata, self->pci, &self->n, self->bdf);
}

/* In the harness's parent, also after a failed assertion: the device is bound again. */
FIXTURE_TEARDOWN_PARENT(uring_unbind)
{
	if (self->bdf[0] && !pci_bound(self->bdf)) {
		sysfs_write(UDMA_DRV_DIR "/bind", self->bdf);
		wait_until(pci_bound(self->bdf), 10000);
	}
}

/*
 * An io_uring NEURON_UDMA_URING_COPY waiting on a stalled queue at unbind, on a normal and an
 * IOPOLL ring (the variants): the unbind returns in bounded time and the command completes with
 * ECANCELED (it ended with its queue instance; not ENODEV). Its buffers are imports of the
 * test's own memory, readable after the unbind: res 0 would mean its bytes are there; after
 * ECANCELED its destination is as it was, also a while after the CQE (the stall kept the copy
 * from starting, the unbind paused the queue). No second CQE. After the rebind the device
 * copies through a ring of the same type.
 */
TEST_F_TIMEOUT(uring_unbind, pending_copy, 120)
{
	const bool iopoll = variant->iopoll;
	const char *ring_name = iopoll ? "IOPOLL" : "normal";
	struct neuron_udma_fence_status fs = { .engine = ENG, .queue = QID, .fence = 1 };
	struct neuron_udma_copy c;
	struct io_uring ring;
	struct ubuf s, d;
	unsigned char *mem, *save;
	volatile __u32 *bar2;
	int fd, b2fd, res = 1, ret = -1;
	__u64 data = 0;
	double t0;

	mem = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, mem);
	fill_pattern(mem, 2 * PAGE, 0x4400);
	save = malloc(2 * PAGE);
	ASSERT_NE(NULL, save);
	memcpy(save, mem, 2 * PAGE);
	bar2 = bar2_of(self->bdf, &b2fd);
	ASSERT_NE(NULL, bar2);
	fd = uring_file(mem, &s, &d);
	ASSERT_LE(0, fd) TH_LOG("open, QUEUE_INIT, MEM_IMPORT: %s", strerror(-fd));
	ret = io_uring_queue_init(4, &ring, iopoll ? IORING_SETUP_IOPOLL : 0);
	ASSERT_EQ(0, ret) TH_LOG("io_uring_queue_init(%s): %s", ring_name, strerror(-ret));

	/* The command's copy on a queue stalled for longer than the test: issued, not done. */
	stall(bar2, ENG, QID, 60000);
	c = ucopy(&s, 0, &d, 0, PAGE);
	ASSERT_EQ(0, submit_copy(&ring, fd, NEURON_UDMA_URING_COPY, ENG, QID, &c, 1, 43));
	t0 = now_s();
	while (now_s() - t0 < 10 && (ret = ioc(fd, NEURON_UDMA_FENCE_STATUS, &fs)))
		usleep(10000);
	ASSERT_EQ(0, ret) TH_LOG("the command's fence was not submitted: %s", strerror(-ret));
	ret = cqe_within(&ring, iopoll, 300, &data, &res);
	ASSERT_EQ(-ETIME, ret) TH_LOG("a CQE (res %d) while the queue is stalled", res);

	t0 = now_s();
	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/unbind", self->bdf));
	TH_LOG("unbind with a command on the %s ring: %.2f s", ring_name, now_s() - t0);
	EXPECT_LT(now_s() - t0, 20.0);
	ret = cqe_within(&ring, iopoll, 20000, &data, &res);
	ASSERT_EQ(0, ret) TH_LOG("no CQE on the %s ring within 20 s of the unbind", ring_name);
	EXPECT_EQ(43ULL, data);
	EXPECT_EQ(-ECANCELED, res) {
		TH_LOG("%s ring, unbind: CQE res %d (%s), want %s", ring_name, res, strerror(-res),
		       strerror(ECANCELED));
	}
	if (!res) {
		EXPECT_EQ(-1, first_diff(mem + PAGE, mem, PAGE)) TH_LOG("res 0 without the bytes");
	} else {
		EXPECT_EQ(-1, first_diff(mem + PAGE, save + PAGE, PAGE))
			TH_LOG("the cancelled copy wrote its destination");
		usleep(300 * 1000);
		EXPECT_EQ(-1, first_diff(mem + PAGE, save + PAGE, PAGE))
			TH_LOG("the cancelled copy wrote its destination after its CQE");
	}
	ret = cqe_within(&ring, iopoll, 100, &data, &res);
	EXPECT_EQ(-ETIME, ret) TH_LOG("a second CQE: user_data %llu, res %d",
				      (unsigned long long)data, res);
	io_uring_queue_exit(&ring);
	EXPECT_EQ(0, close(fd));
	bar2[BAR2_CLEAR / 4] = 1;
	munmap((void *)bar2, 4096);
	close(b2fd);

	/* Bound again: a command on a new ring of the same type copies. */
	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/bind", self->bdf));
	ASSERT_TRUE(wait_until(pci_bound(self->bdf), 10000));
	ASSERT_TRUE(wait_until(node_of_bdf(self->bdf) == 0, 5000));
	memcpy(mem + PAGE, save + PAGE, PAGE);
	fd = uring_file(mem, &s, &d);
	ASSERT_LE(0, fd) TH_LOG("after the rebind: open, QUEUE_INIT, MEM_IMPORT: %s",
				strerror(-fd));
	ASSERT_EQ(0, io_uring_queue_init(4, &ring, iopoll ? IORING_SETUP_IOPOLL : 0));
	c = ucopy(&s, 0, &d, 0, PAGE);
	ASSERT_EQ(0, submit_copy(&ring, fd, NEURON_UDMA_URING_COPY, ENG, QID, &c, 1, 44));
	ASSERT_EQ(0, cqe_within(&ring, iopoll, 20000, &data, &res));
	EXPECT_EQ(44ULL, data);
	EXPECT_EQ(0, res) TH_LOG("after the rebind: CQE res %d (%s)", res, strerror(-res));
	EXPECT_EQ(-1, first_diff(mem + PAGE, mem, PAGE));
	io_uring_queue_exit(&ring);
	close(fd);
}

TEST_HARNESS_MAIN
