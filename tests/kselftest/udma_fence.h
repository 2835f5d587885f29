/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers of the fence and event kselftests (ABI 3: fence_test, uring_test): wrappers of
 * COPY_SUBMIT, FENCE_STATUS, FENCE_WAIT, QUEUE_EVENTS and QUEUE_EVENTFD that return 0 or -errno,
 * a fault staged on the device model without clearing the others (a stall and a fail_nth on one
 * queue together), eventfd counters read until they would block, SIGALRM without SA_RESTART,
 * and assertions on a queue's state and a fence's state (include after kselftest_harness.h).
 */
#ifndef _UDMA_FENCE_H
#define _UDMA_FENCE_H

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/time.h>

#include "udma_sec.h"

/* Host-connected on v2 (every engine) and v3 (32i + 12..15): see INFO host_engines. */
#define FENCE_ENG 15U
/*
 * A stall of the model that the tests end with BAR2_CLEAR once they checked what they wanted
 * while it lasts (a second or two); bounded anyway, and below the driver's 10 s no-progress
 * rule, so that a test that dies leaves no queue the driver would reset.
 */
#define STALL_MS 8000U
/* Generous bound of anything that should happen "at once" on a loaded 2-core TCG host. */
#define SOON_MS 10000U

static inline int copy_submit(int fd, __u32 eng, __u32 q, __u64 *fence)
{
	struct neuron_udma_copy_submit s = { .engine = eng, .queue = q, .fence = ~0ULL };
	int ret = udma_ioc(fd, NEURON_UDMA_COPY_SUBMIT, &s);

	if (!ret && fence)
		*fence = s.fence;
	return ret;
}

/* COPY_PREPARE_ONE of @c, then COPY_SUBMIT: 0 and the fence, or the first -errno. */
static inline int submit_one(int fd, __u32 eng, __u32 q, struct neuron_udma_copy c, __u64 *fence)
{
	int ret = prep_one(fd, eng, q, c);

	return ret ? ret : copy_submit(fd, eng, q, fence);
}

static inline int fence_status(int fd, __u32 eng, __u32 q, __u64 fence,
			       struct neuron_udma_fence_status *st)
{
	memset(st, 0, sizeof(*st));
	st->engine = eng;
	st->queue = q;
	st->fence = fence;
	st->state = ~0U;
	return udma_ioc(fd, NEURON_UDMA_FENCE_STATUS, st);
}

static inline int fence_wait(int fd, __u32 eng, __u32 q, __u64 fence, __u32 timeout_ms)
{
	struct neuron_udma_fence_wait w = {
		.engine = eng, .queue = q, .fence = fence, .timeout_ms = timeout_ms,
	};

	return udma_ioc(fd, NEURON_UDMA_FENCE_WAIT, &w);
}

/* QUEUE_EVENTS into @ev (@max records): 0 and *@count, or -errno. */
static inline int queue_events(int fd, struct neuron_udma_queue_event *ev, __u32 max,
			       __u32 *count)
{
	struct neuron_udma_events e = { .events = (uintptr_t)ev, .max = max, .count = ~0U };
	int ret = udma_ioc(fd, NEURON_UDMA_QUEUE_EVENTS, &e);

	if (!ret && count)
		*count = e.count;
	return ret;
}

static inline int queue_eventfd(int fd, __u32 eng, __u32 q, int efd)
{
	struct neuron_udma_eventfd e = { .engine = eng, .queue = q, .fd = efd };

	return udma_ioc(fd, NEURON_UDMA_QUEUE_EVENTFD, &e);
}

/*
 * Stages and commits a fault without clearing the model's other faults (bar2_fault() clears
 * them first): a stall and a fail_nth of one queue are independent. 0 applied, 1 rejected.
 */
static inline int bar2_add_fault(struct ubar2 *b, __u32 kind, __u32 eng, __u32 q, __u32 arg)
{
	bar2_write(b, BAR2_FAULT_KIND, kind);
	bar2_write(b, BAR2_FAULT_ENGINE, eng);
	bar2_write(b, BAR2_FAULT_QUEUE, q);
	bar2_write(b, BAR2_FAULT_ARG, arg);
	bar2_write(b, BAR2_FAULT_COMMIT, 1);
	return (int)bar2_read(b, BAR2_FAULT_COMMIT);
}

/* Clears the model's faults through a window of its own (a teardown in the harness's parent). */
static inline void model_clear(void)
{
	struct ubar2 b;

	if (!bar2_open(&b))
		bar2_write(&b, BAR2_CLEAR, 1);
	bar2_close(&b);
}

/*
 * How many times the completion engine was asked to watch queue (@eng, @q) (the "watches" of
 * its listeners line in debugfs' queues file), or -1 if the line is not there.
 */
static inline long long queue_watches(__u32 eng, __u32 q)
{
	char rest[512];
	const char *p;
	long long n;

	if (debugfs_queue_line("queues", eng, q, "listeners:", rest, sizeof(rest)))
		return -1;
	p = strstr(rest, " watches ");
	return p && sscanf(p, " watches %lld", &n) == 1 ? n : -1;
}

/*
 * Reads the non-blocking eventfd @efd until it would block, adding what it read to *@total.
 * 0, or the -errno of a read that failed otherwise.
 */
static inline int efd_drain(int efd, __u64 *total)
{
	__u64 v;

	for (;;) {
		ssize_t n = read(efd, &v, sizeof(v));

		if (n == (ssize_t)sizeof(v)) {
			*total += v;
			continue;
		}
		if (n < 0 && errno == EAGAIN)
			return 0;
		return n < 0 ? -errno : -EIO;
	}
}

/*
 * Reads @efd until the counts add up to @want or @max_ms passed (polling it in between):
 * the total read.
 */
static inline __u64 efd_collect(int efd, __u64 want, unsigned int max_ms)
{
	double t0 = now_ms();
	__u64 total = 0;

	for (;;) {
		struct pollfd p = { .fd = efd, .events = POLLIN };
		double left;

		if (efd_drain(efd, &total) || total >= want)
			return total;
		left = max_ms - (now_ms() - t0);
		if (left <= 0)
			return total;
		poll(&p, 1, left > 100 ? 100 : (int)left + 1);
	}
}

static void fence_on_signal(int sig)
{
	(void)sig;
}

/* A handler for @sig without SA_RESTART, so that a blocked ioctl returns EINTR. */
static inline int no_restart(int sig)
{
	struct sigaction sa = { .sa_handler = fence_on_signal };

	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL) ? -errno : 0;
}

/* SIGALRM in @ms milliseconds (0: cancel). */
static inline int alarm_ms(unsigned int ms)
{
	struct itimerval it = {
		.it_value = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 },
	};

	return setitimer(ITIMER_REAL, &it, NULL) ? -errno : 0;
}

static inline const char *fence_state_name(__u32 s)
{
	switch (s) {
	case NEURON_UDMA_FENCE_PENDING:
		return "PENDING";
	case NEURON_UDMA_FENCE_DONE:
		return "DONE";
	case NEURON_UDMA_FENCE_FAILED:
		return "FAILED";
	case NEURON_UDMA_FENCE_EXPIRED:
		return "EXPIRED";
	default:
		return "?";
	}
}

static inline const char *err_name(int ret)
{
	return ret ? strerror(ret < 0 ? -ret : ret) : "0";
}

/* ---- assertions (kselftest_harness.h) ---- */

/* Waits (bounded) for one byte on @fd: 0, or -1 on EOF, error or timeout. */
static inline int pipe_wait(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&p, 1, ms) != 1)
		return -1;
	return read(fd, &c, 1) == 1 ? 0 : -1;
}

/* Writes one byte to @fd: 0, or -1. */
static inline int pipe_say(int fd)
{
	char c = 1;

	return write(fd, &c, 1) == 1 ? 0 : -1;
}

#ifdef ASSERT_EQ

/* The queue state must be exactly @before again (state_diff(): ring indices, tail, resets). */
#define ASSERT_UNCHANGED(fd, eng, q, before) do {					\
	struct neuron_udma_queue_state __now;						\
	char __why[256] = "";								\
	ASSERT_EQ(0, queue_state(fd, eng, q, &__now));					\
	ASSERT_EQ(0, state_diff(before, &__now, __why, sizeof(__why))) {		\
		TH_LOG("%s", __why);							\
	}										\
} while (0)

/* FENCE_STATUS of @fence must say @want_state with error @want_err. */
#define EXPECT_FENCE(fd, eng, q, fence, want_state, want_err) do {			\
	struct neuron_udma_fence_status __fs;						\
	int __r = fence_status(fd, eng, q, fence, &__fs);				\
	ASSERT_EQ(0, __r) {								\
		TH_LOG("FENCE_STATUS of fence %llu: %s", (unsigned long long)(fence),	\
		       err_name(__r));							\
	}										\
	EXPECT_EQ((__u32)(want_state), __fs.state) {					\
		TH_LOG("fence %llu is %s (error %d, completed %llu, submitted %llu), not %s", \
		       (unsigned long long)(fence), fence_state_name(__fs.state),	\
		       __fs.error, (unsigned long long)__fs.completed,			\
		       (unsigned long long)__fs.submitted, fence_state_name(want_state)); \
	}										\
	EXPECT_EQ((__s32)(want_err), __fs.error);					\
} while (0)

/* The bytes of @buf must equal @saved. */
#define ASSERT_BYTES(buf, saved, len) do {						\
	long __d = first_diff(buf, saved, len);					\
	ASSERT_EQ(-1, __d) {								\
		TH_LOG("byte %ld of %s differs", __d, #buf);				\
	}										\
} while (0)

#endif /* ASSERT_EQ */

#endif /* _UDMA_FENCE_H */
