// SPDX-License-Identifier: GPL-2.0
/*
 * Log flooding: what one user can make the driver print. Engine errors are logged at error
 * level at most 10 times per 5 s per device; a timeout the caller chose is logged at debug
 * level only. The kernel log is read from /dev/kmsg.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "kselftest_harness.h"
#include "udma_util.h"

/* Burst and window of the driver's rate limit of wait failures (rust/device.rs). */
#define LOG_BURST 10
#define LOG_WINDOW_S 5.0
/* A queue nothing else in the kselftests uses; engine 7 has host connectivity on v3 too. */
#define ENG 7
#define Q 9

/* /dev/kmsg positioned at its end (only new records are read), non-blocking. */
static int kmsg_open(void)
{
	int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);

	if (fd >= 0 && lseek(fd, 0, SEEK_END) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Counts the new kernel log records of priority error or more urgent that contain @what. */
static int kmsg_count(int fd, const char *what)
{
	char rec[2048];
	ssize_t n;
	int count = 0;

	for (;;) {
		n = read(fd, rec, sizeof(rec) - 1);
		if (n < 0) {
			if (errno == EPIPE)	/* overwritten records: go on */
				continue;
			break;
		}
		rec[n] = 0;
		/* "<prio>,<seq>,<ts>,<flags>;<text>": prio = facility * 8 + level. */
		if (atoi(rec) % 8 <= 3 && strstr(rec, what))
			count++;
	}
	return count;
}

FIXTURE(logs) {
	int fd, kmsg;
	struct ubar2 bar2;
	struct ubuf a, b;
};

FIXTURE_SETUP(logs)
{
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &self->b));
	ASSERT_EQ(0, queue_init(self->fd, ENG, Q, 64, 64));
	self->kmsg = kmsg_open();
	ASSERT_LE(0, self->kmsg);
}

FIXTURE_TEARDOWN(logs)
{
	if (self->bar2.regs)
		bar2_write(&self->bar2, BAR2_CLEAR, 1);
	bar2_close(&self->bar2);
	if (self->kmsg >= 0)
		close(self->kmsg);
	close(self->fd);
}

/* 40 engine errors in a row: EIO each time, at most 10 error lines per 5 s window. */
TEST_F_TIMEOUT(logs, engine_errors_are_rate_limited, 120)
{
	double t0 = now_s(), secs;
	int i, lines, allowed;

	for (i = 0; i < 40; i++) {
		ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_FAIL_NTH, ENG, Q, 1));
		ASSERT_EQ(0, prep_one(self->fd, ENG, Q, ucopy(&self->a, 0, &self->b, 0, 4096)));
		ASSERT_EQ(-EIO, copy_wait(self->fd, ENG, Q, 0, NULL));
	}
	secs = now_s() - t0;
	lines = kmsg_count(self->kmsg, "fence");
	allowed = LOG_BURST * (int)(secs / LOG_WINDOW_S + 2);
	TH_LOG("40 engine errors in %.1f s: %d error lines (at most %d)", secs, lines, allowed);
	EXPECT_GE(lines, 1);
	EXPECT_LE(lines, allowed);
	/* The queue works afterwards. */
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	EXPECT_EQ(0, copy_sync(self->fd, ENG, Q, ucopy(&self->a, 0, &self->b, 4096, 4096)));
}

/* 20 waits that time out after the 10 ms the caller chose: no error line at all. */
TEST_F_TIMEOUT(logs, caller_timeouts_are_not_errors, 120)
{
	int i, lines;

	for (i = 0; i < 20; i++) {
		ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, Q, 300));
		ASSERT_EQ(0, prep_one(self->fd, ENG, Q, ucopy(&self->a, 0, &self->b, 0, 4096)));
		ASSERT_EQ(-ETIMEDOUT, copy_wait(self->fd, ENG, Q, 10, NULL));
	}
	lines = kmsg_count(self->kmsg, "timed out");
	TH_LOG("20 caller timeouts: %d error lines", lines);
	EXPECT_EQ(0, lines);
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	usleep(400 * 1000);
	EXPECT_EQ(0, copy_sync(self->fd, ENG, Q, ucopy(&self->a, 0, &self->b, 4096, 4096)));
}

TEST_HARNESS_MAIN
