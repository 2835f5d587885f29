// SPDX-License-Identifier: GPL-2.0
/*
 * PCI function reset of the device of /dev/neuron_udma0 through sysfs
 * (/sys/bus/pci/devices/<bdf>/reset; the device model resets on its D3hot -> D0 transition,
 * reset_method "pm"): every fence in flight on every queue fails with EIO and its destination
 * is not written any more, fences done before stay done, every file keeps its queues and
 * buffers and copies byte-exact on them afterwards; an idle reset and two in a row; a
 * FENCE_WAIT blocked in a thread returns EIO promptly; the device's sysfs counters
 * device_resets and queue_resets_device count the resets; INFO and MEMCPY work after them.
 *
 * Under load, the device model's slow-down fault is set just before the reset (the reset
 * clears it): on a fast host the engine finishes each fence while its worker checks the
 * previous one, so without it the reset could find every queue idle and prove nothing.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>

#include "kselftest_harness.h"
#include "udma_fence.h"
#include "udma_multi.h"
#include "udma_sec.h"

#define ENG FENCE_ENG
#define MIB (1024U * 1024)
#define CHUNK 65536U		/* the largest copy: one descriptor pair */
#define BUF MIB			/* host buffers of 1 MiB, as other tests take */
#define FENCE_BUFS 2		/* destinations of one fence: 2 MiB, 32 pairs */
#define DEPTH 3			/* fences a worker keeps in flight */
#define WORKERS 3
#define LOAD_ENG 12		/* worker i: engine 12 + i (host-connected on v2 and v3) */
#define LOAD_Q 2
#define RING 512		/* DEPTH fences of 33 pairs, and the reserve */
#define SLOW 100		/* the model's slow-down factor while the reset comes */
#define WAIT_MS 10000U		/* one fence's FENCE_WAIT */
#define PROMPT_MS 2000.0	/* a blocked FENCE_WAIT returns within this of the reset */
#define SETTLE_MS 200U		/* a failed fence's destination must keep its bytes this long */

FIXTURE(reset) {
	char bdf[16];
	char path[128];		/* its sysfs reset file */
	struct ubar2 bar2;
};

FIXTURE_SETUP(reset)
{
	struct udma_pci pci[UDMA_MAX_DEVS];
	struct neuron_udma_info info;
	char first[64];
	int i, fd, n = udma_pci_list(pci, UDMA_MAX_DEVS);

	ASSERT_LE(1, n);
	for (i = 0; i < n; i++) {
		snprintf(self->bdf, sizeof(self->bdf), "%.15s", pci[i].bdf);
		if (pci_bound(self->bdf) && node_of_bdf(self->bdf) == 0)
			break;
	}
	ASSERT_LT(i, n) TH_LOG("no PCI device owns " UDMA_DEV);
	/* bar2_open() and model_clear() take the first bound device: it must be this one. */
	ASSERT_EQ(0, udma_bdf(first, sizeof(first)));
	ASSERT_STREQ(self->bdf, first);
	snprintf(self->path, sizeof(self->path), PCI_DEVS_DIR "/%s/reset", self->bdf);
	ASSERT_EQ(0, access(self->path, W_OK)) TH_LOG("%s: %s", self->path, strerror(errno));
	ASSERT_EQ(0, bar2_open(&self->bar2));
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	ASSERT_EQ((__u32)NEURON_UDMA_ABI_VERSION, info.abi_version);
	ASSERT_EQ(0xF000ULL, info.host_engines[0] & 0xF000ULL);	/* engines 12..15 */
	close(fd);
}

/* In the harness's parent: a slow-down or stall left by a test that died must not stay. */
FIXTURE_TEARDOWN_PARENT(reset)
{
	model_clear();
}

/*
 * Copies of all of @src into each of the @n buffers @dst on (@eng, @q), one fence: 0 or -errno.
 * *@prepared (if set) tells whether COPY_PREPARE succeeded (an error then came from COPY_SUBMIT).
 */
static int submit_copies_at(int fd, __u32 eng, __u32 q, const struct ubuf *src,
			    const struct ubuf *dst, int n, __u64 *fence, bool *prepared)
{
	struct neuron_udma_copy c[FENCE_BUFS * (BUF / CHUNK)];
	int b, k, nc = 0, ret;

	for (b = 0; b < n; b++)
		for (k = 0; k < (int)(BUF / CHUNK); k++)
			c[nc++] = ucopy(src, k * CHUNK, &dst[b], k * CHUNK, CHUNK);
	ret = prep(fd, eng, q, c, nc);
	if (prepared)
		*prepared = !ret;
	return ret ? ret : copy_submit(fd, eng, q, fence);
}

static int submit_copies(int fd, __u32 eng, __u32 q, const struct ubuf *src,
			 const struct ubuf *dst, int n, __u64 *fence)
{
	return submit_copies_at(fd, eng, q, src, dst, n, fence, NULL);
}

/* New bytes (@seed) in @a copied to a cleared @b on (ENG, @q) with one fence, waited for. */
static void fresh_copy(struct __test_metadata *_metadata, int fd, __u32 q, struct ubuf *a,
		       struct ubuf *b, __u32 seed, __u64 *fence)
{
	int ret;

	fill_pattern(a->map, BUF, seed);
	memset(b->map, 0, BUF);
	ret = submit_copies(fd, ENG, q, a, b, 1, fence);
	ASSERT_EQ(0, ret) TH_LOG("submit on queue %u: %s", q, err_name(ret));
	ret = fence_wait(fd, ENG, q, *fence, WAIT_MS);
	ASSERT_EQ(0, ret) TH_LOG("fence %llu: %s", (unsigned long long)*fence, err_name(ret));
	ASSERT_BYTES(b->map, a->map, BUF);
}

/* ---- under load: 3 processes keep fences in flight on their own queues ---- */

/* What a worker saw, in memory shared with the test. */
struct wres {
	int done;		/* fences done, their destination byte-exact */
	int failed;		/* fences failed with EIO, their destination settled */
	int refused;		/* submissions refused with EIO */
	double eio_ms;		/* when the first EIO came back (0: none) */
	double late_ms;		/* the latest submission that ended in EIO was made then */
	char why[240];		/* the first thing that was wrong */
};

struct worker {
	int fd;
	__u32 eng, seed;
	struct ubuf src, dst[DEPTH][FENCE_BUFS];
	__u64 fence[DEPTH];
	double sub_ms[DEPTH];		/* when the fence was submitted */
	unsigned char *snap[DEPTH];	/* a failed fence's destination when its EIO came */
	struct wres *r;
};

static __printf(2, 3) int wfail(struct wres *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->why, sizeof(r->why), fmt, ap);
	va_end(ap);
	return 1;
}

/* The first byte of slot @s's destinations that differs from @ref (FENCE_BUFS x BUF), or -1. */
static long slot_diff(struct worker *w, int s, const unsigned char *ref, bool from_src)
{
	long d;
	int b;

	for (b = 0; b < FENCE_BUFS; b++) {
		d = first_diff(w->dst[s][b].map, from_src ? ref : ref + b * BUF, BUF);
		if (d >= 0)
			return b * BUF + d;
	}
	return -1;
}

static int worker_setup(struct worker *w)
{
	int s, b, ret;

	w->fd = udma_open();
	if (w->fd < 0)
		return wfail(w->r, "open %s: %s", UDMA_DEV, strerror(errno));
	ret = queue_init(w->fd, w->eng, LOAD_Q, RING, RING);
	if (ret)
		return wfail(w->r, "QUEUE_INIT (%u, %u): %s", w->eng, LOAD_Q, err_name(ret));
	ret = ubuf_host(w->fd, BUF, &w->src);
	for (s = 0; s < DEPTH && !ret; s++)
		for (b = 0; b < FENCE_BUFS && !ret; b++)
			ret = ubuf_host(w->fd, BUF, &w->dst[s][b]);
	if (ret)
		return wfail(w->r, "MEM_ALLOC: %s", err_name(ret));
	fill_pattern(w->src.map, BUF, w->seed);
	return 0;
}

/*
 * Keeps DEPTH fences in flight until an EIO (the reset came) or the word from @go_fd (the
 * reset returned), checking each fence as it ends: done and byte-exact, or EIO and then its
 * destination must not change. Then 3 more copies on the same file and queue. 0 or 1 (why).
 */
static int load_worker(struct worker *w, int ready_fd, int go_fd)
{
	struct pollfd go = { .fd = go_fd, .events = POLLIN };
	struct neuron_udma_fence_status fs;
	struct neuron_udma_queue_event ev[4];
	__u64 f, newest = 0, last_done = 0, last_failed = 0, lost = 0;
	int head = 0, inflight = 0, s, b, k, ret;
	bool stop = false, told = false, heard = false, prepared;
	struct wres *r = w->r;
	__u32 n = 0;
	double t;
	long d;

	if (worker_setup(w))
		return 1;
	for (;;) {
		while (!stop && inflight < DEPTH) {
			s = (head + inflight) % DEPTH;
			for (b = 0; b < FENCE_BUFS; b++)
				memset(w->dst[s][b].map, 0, BUF);
			t = now_ms();
			ret = submit_copies_at(w->fd, w->eng, LOAD_Q, &w->src, w->dst[s], FENCE_BUFS,
					       &w->fence[s], &prepared);
			if (ret == -EIO) {
				/*
				 * The reset is running: no fence, nothing to check. Refused by
				 * COPY_SUBMIT, the pairs COPY_PREPARE had written were dropped by
				 * the reset with no fence over them: the reset gave them the next
				 * fence number, failed (userspace-api.rst, device reset: "the
				 * queue's newest fence reads FAILED/EIO").
				 */
				if (prepared)
					lost = newest + 1;
				r->refused++;
				r->late_ms = t;
				r->eio_ms = r->eio_ms ? r->eio_ms : now_ms();
				stop = true;
				break;
			}
			if (ret)
				return wfail(r, "submit: %s", err_name(ret));
			newest = w->fence[s];
			w->sub_ms[s] = t;
			inflight++;
		}
		if (!heard && poll(&go, 1, 0) == 1) {
			if (pipe_wait(go_fd, 0))
				return wfail(r, "the test ended before the reset");
			heard = stop = true;
		}
		if (!inflight)
			break;
		s = head;
		f = w->fence[s];
		head = (head + 1) % DEPTH;
		inflight--;
		ret = fence_wait(w->fd, w->eng, LOAD_Q, f, WAIT_MS);
		if (ret == -EIO) {
			/* Read at once: nothing may write it from now on. */
			w->snap[s] = malloc(FENCE_BUFS * BUF);
			if (!w->snap[s])
				return wfail(r, "malloc");
			for (b = 0; b < FENCE_BUFS; b++)
				memcpy(w->snap[s] + b * BUF, w->dst[s][b].map, BUF);
			r->eio_ms = r->eio_ms ? r->eio_ms : now_ms();
			r->late_ms = r->late_ms > w->sub_ms[s] ? r->late_ms : w->sub_ms[s];
			r->failed++;
			last_failed = f;
			stop = true;
			continue;
		}
		if (ret)
			return wfail(r, "FENCE_WAIT of fence %llu: %s (only done or EIO are right)",
				     (unsigned long long)f, err_name(ret));
		d = slot_diff(w, s, w->src.map, true);
		if (d >= 0)
			return wfail(r, "fence %llu done, but byte %ld of its destination is wrong",
				     (unsigned long long)f, d);
		r->done++;
		if (!last_failed)
			last_done = f;
		if (!told && pipe_say(ready_fd))
			return wfail(r, "pipe");
		told = true;
	}
	sleep_ms(SETTLE_MS);
	for (s = 0; s < DEPTH; s++) {
		d = w->snap[s] ? slot_diff(w, s, w->snap[s], false) : -1;
		if (d >= 0)
			return wfail(r, "fence %llu failed, then byte %ld of its destination changed",
				     (unsigned long long)w->fence[s], d);
	}
	if (!heard && pipe_wait(go_fd, 60000))
		return wfail(r, "no word from the test within 60 s after the reset");

	/* After the reset: what ended stays as it ended, and the queue reported the failure. */
	if (last_done && (fence_status(w->fd, w->eng, LOAD_Q, last_done, &fs) ||
			  fs.state != NEURON_UDMA_FENCE_DONE))
		return wfail(r, "fence %llu, done before the reset, is now %s",
			     (unsigned long long)last_done, fence_state_name(fs.state));
	for (s = 0; s < DEPTH; s++) {
		if (!w->snap[s])
			continue;
		ret = fence_status(w->fd, w->eng, LOAD_Q, w->fence[s], &fs);
		if (ret || fs.state != NEURON_UDMA_FENCE_FAILED || fs.error != EIO)
			return wfail(r, "FENCE_STATUS of failed fence %llu: %s, %s, error %d",
				     (unsigned long long)w->fence[s], err_name(ret),
				     fence_state_name(fs.state), fs.error);
	}
	/* The newest failed fence: a waited one, or the one the reset gave to unfenced pairs. */
	if (lost > last_failed)
		last_failed = lost;
	if (last_failed) {
		ret = queue_events(w->fd, ev, 4, &n);
		if (ret || n != 1 || ev[0].engine != w->eng || ev[0].queue != LOAD_Q ||
		    !(ev[0].flags & NEURON_UDMA_EVENT_FAILED) || ev[0].error != EIO ||
		    ev[0].failed != last_failed)
			return wfail(r, "QUEUE_EVENTS: %s, %u records; flags %#x error %d failed %llu, not FAILED EIO %llu",
				     err_name(ret), n, n ? ev[0].flags : 0, n ? ev[0].error : 0,
				     n ? (unsigned long long)ev[0].failed : 0ULL,
				     (unsigned long long)last_failed);
	}

	/*
	 * Pairs a refused COPY_SUBMIT left prepared were failed by the reset: the first submission
	 * call after it says so, once, with EIO, and changes nothing (userspace-api.rst, device
	 * reset).
	 */
	if (lost) {
		ret = submit_copies(w->fd, w->eng, LOAD_Q, &w->src, w->dst[0], FENCE_BUFS, &f);
		if (ret != -EIO)
			return wfail(r, "the first submission after a reset that failed unfenced pairs: %s, not EIO",
				     err_name(ret));
	}
	for (k = 0; k < 3; k++) {
		fill_pattern(w->src.map, BUF, w->seed + 1 + k);
		for (b = 0; b < FENCE_BUFS; b++)
			memset(w->dst[k][b].map, 0, BUF);
		ret = submit_copies(w->fd, w->eng, LOAD_Q, &w->src, w->dst[k], FENCE_BUFS, &f);
		if (!ret && f <= newest)
			return wfail(r, "copy %d after the reset: fence %llu, not after %llu", k,
				     (unsigned long long)f, (unsigned long long)newest);
		if (!ret)
			ret = fence_wait(w->fd, w->eng, LOAD_Q, f, WAIT_MS);
		if (ret)
			return wfail(r, "copy %d after the reset: %s", k, err_name(ret));
		d = slot_diff(w, k, w->src.map, true);
		if (d >= 0)
			return wfail(r, "copy %d after the reset: byte %ld is wrong", k, d);
		newest = f;
	}
	return close(w->fd) ? wfail(r, "close: %s", strerror(errno)) : 0;
}

TEST_F_TIMEOUT(reset, reset_under_load, 120)
{
	struct wres *res = sec_shared(WORKERS * sizeof(*res));
	int ready[2], go[2], i, ret, status, failed = 0;
	double t0 = 0, t1 = 0;
	pid_t pid[WORKERS];
	long long dev0, q0;
	bool started;

	ASSERT_NE(NULL, res);
	dev0 = udma_counter(self->bdf, "device_resets");
	q0 = udma_counter(self->bdf, "queue_resets_device");
	ASSERT_LE(0, dev0) TH_LOG("no counter %s/neuron_udma/device_resets", self->bdf);
	ASSERT_LE(0, q0) TH_LOG("no counter %s/neuron_udma/queue_resets_device", self->bdf);
	ASSERT_EQ(0, pipe2(ready, O_CLOEXEC));
	ASSERT_EQ(0, pipe2(go, O_CLOEXEC));
	for (i = 0; i < WORKERS; i++) {
		pid[i] = fork();
		ASSERT_LE(0, pid[i]);
		if (!pid[i]) {
			struct worker w = {
				.eng = LOAD_ENG + i, .seed = 0x5e70 + 16 * i, .r = &res[i],
			};

			close(ready[0]);
			close(go[1]);
			_exit(load_worker(&w, ready[1], go[0]));
		}
	}
	close(ready[1]);
	close(go[0]);
	for (i = 0, ret = 0; i < WORKERS && !ret; i++)
		ret = pipe_wait(ready[0], 30000);
	started = !ret;
	for (i = 0; i < WORKERS && !started; i++)
		kill(pid[i], SIGKILL);

	/* The reset, with each worker's fences crawling through the engines. */
	if (started) {
		ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_SLOW, 0, 0, SLOW));
		sleep_ms(500);
		t0 = now_ms();
		ret = sysfs_write(self->path, "1");
		t1 = now_ms();
		bar2_write(&self->bar2, BAR2_CLEAR, 1);
		EXPECT_EQ(0, ret) TH_LOG("write 1 to %s: %s", self->path, err_name(ret));
		TH_LOG("the reset took %.0f ms", t1 - t0);
		for (i = 0; i < WORKERS; i++)
			pipe_say(go[1]);
	}
	close(go[1]);
	for (i = 0; i < WORKERS; i++) {
		status = wait_bounded(pid[i], 90);
		EXPECT_TRUE(status >= 0 && WIFEXITED(status) && !WEXITSTATUS(status))
			TH_LOG("worker %d (engine %d): %s; %s", i, LOAD_ENG + i, worker_what(status),
			       res[i].why);
		TH_LOG("worker %d: %d fences done, %d failed with EIO, %d submissions refused", i,
		       res[i].done, res[i].failed, res[i].refused);
		failed += res[i].failed;
		if (!res[i].eio_ms)
			continue;
		EXPECT_LE(t0, res[i].eio_ms) TH_LOG("worker %d: EIO before the reset", i);
		EXPECT_GE(t1, res[i].late_ms)
			TH_LOG("worker %d: a submission after the reset ended in EIO", i);
	}
	ASSERT_TRUE(started) TH_LOG("the workers did not all complete a fence");
	EXPECT_LE(1, failed) TH_LOG("no fence was in flight at the reset: the test proved nothing");
	EXPECT_EQ(dev0 + 1, udma_counter(self->bdf, "device_resets"));
	EXPECT_LE(q0 + WORKERS, udma_counter(self->bdf, "queue_resets_device"));
}

/* ---- an idle queue; two resets in a row ---- */

TEST_F_TIMEOUT(reset, idle_reset_then_copy, 60)
{
	const __u32 q = 6;
	struct neuron_udma_queue_event ev[4];
	struct ubuf a, b;
	__u64 f1 = 0, f2 = 0, f3 = 0;
	long long dev0, q0;
	int fd = udma_open(), i;
	__u32 n = 0;

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, ENG, q, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &a));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &b));
	fresh_copy(_metadata, fd, q, &a, &b, 1, &f1);
	dev0 = udma_counter(self->bdf, "device_resets");
	q0 = udma_counter(self->bdf, "queue_resets_device");
	ASSERT_LE(0, dev0);
	ASSERT_LE(0, q0);

	ASSERT_EQ(0, sysfs_write(self->path, "1"));
	EXPECT_FENCE(fd, ENG, q, f1, NEURON_UDMA_FENCE_DONE, 0);
	/* Nothing was in flight: nothing failed. */
	ASSERT_EQ(0, queue_events(fd, ev, 4, &n));
	for (i = 0; i < (int)n; i++)
		EXPECT_FALSE(!!(ev[i].flags & NEURON_UDMA_EVENT_FAILED))
			TH_LOG("queue (%u, %u): failed fence %llu, error %d", ev[i].engine,
			       ev[i].queue, (unsigned long long)ev[i].failed, ev[i].error);
	fresh_copy(_metadata, fd, q, &a, &b, 2, &f2);
	EXPECT_LT(f1, f2);

	ASSERT_EQ(0, sysfs_write(self->path, "1"));
	ASSERT_EQ(0, sysfs_write(self->path, "1"));
	fresh_copy(_metadata, fd, q, &a, &b, 3, &f3);
	EXPECT_LT(f2, f3);
	EXPECT_FENCE(fd, ENG, q, f1, NEURON_UDMA_FENCE_DONE, 0);
	EXPECT_FENCE(fd, ENG, q, f2, NEURON_UDMA_FENCE_DONE, 0);
	EXPECT_EQ(dev0 + 3, udma_counter(self->bdf, "device_resets"));
	EXPECT_LE(q0 + 3, udma_counter(self->bdf, "queue_resets_device"));
	close(fd);
}

/* ---- a FENCE_WAIT blocked in a thread ---- */

#define WAIT_Q 7

struct blocked {
	int fd;
	__u64 fence;
	int ret;
	double end_ms;		/* when it returned */
	int done;		/* atomic */
};

static void *blocked_wait(void *arg)
{
	struct blocked *w = arg;

	w->ret = fence_wait(w->fd, ENG, WAIT_Q, w->fence, 30000);
	w->end_ms = now_ms();
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * The model stalls the queue (for STALL_MS, far below the wait's 30 s), so the fence is still
 * in flight at the reset and its copies never ran: its destination must stay as it was.
 */
TEST_F_TIMEOUT(reset, reset_while_waiting_blocked, 60)
{
	const __u32 q = WAIT_Q;
	struct blocked w = { 0 };
	struct ubuf a, b;
	unsigned char *zero = calloc(1, BUF);
	pthread_t th;
	double t0, t1;
	__u64 f = 0;
	int fd = udma_open(), ret;

	ASSERT_NE(NULL, zero);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, ENG, q, 64, 64));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &a));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &b));
	fill_pattern(a.map, BUF, 7);
	memset(b.map, 0, BUF);
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_copies(fd, ENG, q, &a, &b, 1, &f));
	w.fd = fd;
	w.fence = f;
	ASSERT_EQ(0, pthread_create(&th, NULL, blocked_wait, &w));
	sleep_ms(300);
	ASSERT_FALSE(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE))
		TH_LOG("FENCE_WAIT returned before the reset: %s", err_name(w.ret));
	EXPECT_FENCE(fd, ENG, q, f, NEURON_UDMA_FENCE_PENDING, 0);

	t0 = now_ms();
	ret = sysfs_write(self->path, "1");
	t1 = now_ms();
	ASSERT_EQ(0, ret) TH_LOG("write 1 to %s: %s", self->path, err_name(ret));
	while (!__atomic_load_n(&w.done, __ATOMIC_ACQUIRE) && now_ms() - t1 < SOON_MS)
		sleep_ms(10);
	ASSERT_TRUE(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE))
		TH_LOG("FENCE_WAIT still blocked %u ms after the reset", SOON_MS);
	pthread_join(th, NULL);
	TH_LOG("the reset took %.0f ms; FENCE_WAIT returned %.0f ms after it began", t1 - t0,
	       w.end_ms - t0);
	EXPECT_EQ(-EIO, w.ret) TH_LOG("FENCE_WAIT across the reset: %s", err_name(w.ret));
	EXPECT_GT(PROMPT_MS, w.end_ms - t1);
	sleep_ms(SETTLE_MS);
	ASSERT_BYTES(b.map, zero, BUF);
	EXPECT_FENCE(fd, ENG, q, f, NEURON_UDMA_FENCE_FAILED, EIO);

	/* A stall the reset did not end would only slow the next copy down: end it. */
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	fresh_copy(_metadata, fd, q, &a, &b, 8, &w.fence);
	EXPECT_LT(f, w.fence);
	close(fd);
	free(zero);
}

/*
 * Work no fence covered when the reset came is reported, never taken for done: pairs prepared
 * but not started, then the reset; the first submission call after it (here COPY_PREPARE of
 * other pairs) fails with EIO and writes nothing, the newest fence reads FAILED/EIO, and a later
 * fence that reads DONE covers only what was submitted after (the dropped pairs never ran).
 */
TEST_F_TIMEOUT(reset, prepared_pairs_dropped_by_a_reset_are_reported, 60)
{
	const __u32 q = 9;
	struct neuron_udma_fence_status fs;
	struct ubuf a, b1, b2;
	__u64 f = 0, newest = 0;
	int fd = udma_open(), ret;

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, ENG, q, 256, 256));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &a));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &b1));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &b2));
	fill_pattern(a.map, BUF, 21);
	memset(b1.map, 0, BUF);
	memset(b2.map, 0, BUF);
	ASSERT_EQ(0, prep_one(fd, ENG, q, ucopy(&a, 0, &b1, 0, CHUNK)));
	ASSERT_EQ(0, sysfs_write(self->path, "1"));
	ret = prep_one(fd, ENG, q, ucopy(&a, 0, &b2, 0, CHUNK));
	EXPECT_EQ(-EIO, ret) TH_LOG("COPY_PREPARE after the reset: %s", err_name(ret));
	/* Nothing to fence: COPY_SUBMIT names the newest fence, the dropped pairs' own. */
	ASSERT_EQ(0, copy_submit(fd, ENG, q, &newest));
	ASSERT_EQ(0, fence_status(fd, ENG, q, newest, &fs));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_FAILED, fs.state);
	EXPECT_EQ(EIO, fs.error);
	EXPECT_EQ(-EIO, fence_wait(fd, ENG, q, newest, WAIT_MS));
	/* Later work goes on, its fence numbered after the failed one. */
	ASSERT_EQ(0, submit_one(fd, ENG, q, ucopy(&a, 0, &b2, 0, CHUNK), &f));
	EXPECT_LT(newest, f);
	ASSERT_EQ(0, fence_wait(fd, ENG, q, f, WAIT_MS));
	ASSERT_BYTES(b2.map, a.map, CHUNK);
	EXPECT_EQ(0, b1.map[0] | b1.map[CHUNK - 1]) TH_LOG("the dropped pair ran after all");
	close(fd);
}

/*
 * Pairs started without a fence on a stalled queue, then the reset: COPY_WAIT reports EIO (not
 * 0 for "nothing left to wait for"), once; the destination is never written; the queue copies
 * again afterwards.
 */
TEST_F_TIMEOUT(reset, started_pairs_dropped_by_a_reset_fail_copy_wait, 60)
{
	const __u32 q = 10;
	struct ubuf a, b;
	__u64 done = 0, f;
	int fd = udma_open(), ret;

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, ENG, q, 256, 256));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &a));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &b));
	fill_pattern(a.map, BUF, 22);
	memset(b.map, 0, BUF);
	ASSERT_EQ(0, prep_one(fd, ENG, q, ucopy(&a, 0, &b, 0, CHUNK)));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, copy_start(fd, ENG, q, 1, 1));
	ASSERT_EQ(0, sysfs_write(self->path, "1"));
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ret = copy_wait(fd, ENG, q, WAIT_MS, &done);
	EXPECT_EQ(-EIO, ret) TH_LOG("COPY_WAIT after the reset: %s", err_name(ret));
	sleep_ms(SETTLE_MS);
	EXPECT_EQ(0, b.map[0] | b.map[CHUNK - 1]) TH_LOG("the dropped pair ran after all");
	EXPECT_EQ(0, copy_wait(fd, ENG, q, WAIT_MS, &done));
	fresh_copy(_metadata, fd, q, &a, &b, 23, &f);
	close(fd);
}

/* After the resets: INFO, and MEMCPY through the driver's own queue to device memory and back. */
TEST_F_TIMEOUT(reset, device_works_after_resets, 60)
{
	struct neuron_udma_info info;
	struct ubuf a, b, dev;
	int fd = udma_open();

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	EXPECT_EQ((__u32)NEURON_UDMA_ABI_VERSION, info.abi_version);
	EXPECT_EQ(pci_attr_hex(self->bdf, "device"), info.device_id);
	ASSERT_EQ(0, ubuf_host(fd, BUF, &a));
	ASSERT_EQ(0, ubuf_host(fd, BUF, &b));
	ASSERT_EQ(0, ubuf_dev(fd, BUF, &dev));
	fill_pattern(a.map, BUF, 9);
	memset(b.map, 0, BUF);
	ASSERT_EQ(0, udma_memcpy(fd, &a, 0, &dev, 0, BUF, WAIT_MS));
	ASSERT_EQ(0, udma_memcpy(fd, &dev, 0, &b, 0, BUF, WAIT_MS));
	ASSERT_BYTES(b.map, a.map, BUF);
	close(fd);
}

TEST_HARNESS_MAIN
