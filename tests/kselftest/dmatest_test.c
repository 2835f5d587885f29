// SPDX-License-Identifier: GPL-2.0
/*
 * The kernel's own dmaengine test client (drivers/dma/dmatest.c) on the dmaengine provider of
 * neuron_udma (Documentation/neuron-udma.rst, "dmaengine"): every channel of the bound device,
 * two threads per channel, with data verification; then polled completion, the 64 KiB chunk
 * boundary, the engine's copy alignment, DMA_MEMSET fills, an injected engine fault (the
 * model's BAR2 window) and an unbind during a run, each followed by a clean run.
 *
 * Each phase writes a marker to the kernel log ("neuron_udma-dmatest: phase NAME channels N min M
 * expect clean|failures|any"), so that tests/parse-results.py checks dmatest's own summary lines
 * of that phase too; this program checks them from /dev/kmsg.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "udma_util.h"

#define PARAMS "/sys/module/dmatest/parameters/"
#define MAX_CHANS 16
/* dmatest iterations per thread; two threads per channel. */
#define ITER_RANDOM 250
#define ITER_SHORT 100
/* Longest a phase may take before its missing summaries fail it, in seconds. */
#define PHASE_LIMIT_S 600

struct tally {
	int nchans;
	char chan[MAX_CHANS][32];
	unsigned int tests[MAX_CHANS];
	unsigned int failures[MAX_CHANS];
	unsigned int summaries;
	unsigned int results;
};

static int param(const char *name, const char *val)
{
	char path[128];

	snprintf(path, sizeof(path), PARAMS "%s", name);
	return sysfs_write(path, val);
}

static int read_param(const char *name, char *buf, size_t len)
{
	char path[128];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), PARAMS "%s", name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	return 0;
}

static void kmsg(const char *msg)
{
	int fd = open("/dev/kmsg", O_WRONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (write(fd, msg, strlen(msg)) < 0)
			perror("kmsg");
		close(fd);
	}
}

/* The dmaengine channels of PCI device @bdf (/sys/class/dma/dmaXchanY/device -> bdf). */
static int dma_channels(const char *bdf)
{
	char link[256], target[256];
	glob_t g;
	size_t i;
	int n = 0;

	if (glob("/sys/class/dma/dma*chan*", 0, NULL, &g))
		return 0;
	for (i = 0; i < g.gl_pathc; i++) {
		ssize_t len;

		snprintf(link, sizeof(link), "%s/device", g.gl_pathv[i]);
		len = readlink(link, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = 0;
		if (!strcmp(strrchr(target, '/') ? strrchr(target, '/') + 1 : target, bdf))
			n++;
	}
	globfree(&g);
	return n;
}

static int chan_index(struct tally *t, const char *name)
{
	int i;

	for (i = 0; i < t->nchans; i++)
		if (!strcmp(t->chan[i], name))
			return i;
	if (t->nchans == MAX_CHANS)
		return -1;
	snprintf(t->chan[t->nchans], sizeof(t->chan[0]), "%s", name);
	return t->nchans++;
}

/* Reads the kernel log records after the position of @fd: dmatest's summary and result lines. */
static void collect(int fd, struct tally *t)
{
	char rec[8192];
	ssize_t n;

	for (;;) {
		char *msg, *sum, *dash;
		unsigned int tests, failures;
		int i;

		n = read(fd, rec, sizeof(rec) - 1);
		if (n < 0 && errno == EPIPE)
			continue;
		if (n <= 0)
			break;
		rec[n] = 0;
		msg = strchr(rec, ';');
		if (!msg || strncmp(msg + 1, "dmatest: ", 9))
			continue;
		msg += 10;
		if (strstr(msg, ": result #")) {
			t->results++;
			continue;
		}
		sum = strstr(msg, ": summary ");
		if (!sum || sscanf(sum, ": summary %u tests, %u failures", &tests, &failures) != 2)
			continue;
		*sum = 0;
		/* A thread is <channel>-<op><n>: copy0, set1 (memset), ... */
		dash = strrchr(msg, '-');
		if (dash)
			*dash = 0;
		i = chan_index(t, msg);
		if (i < 0)
			continue;
		t->tests[i] += tests;
		t->failures[i] += failures;
		t->summaries++;
	}
}

struct phase {
	const char *name;
	const char *expect;		/* clean, failures, any */
	unsigned int iterations;	/* per thread */
	unsigned int threads;		/* per channel; 0: 2 */
	const char *extra[4][2];	/* more dmatest parameters */
	void (*during)(void *arg);	/* runs while dmatest runs */
	void *arg;
};

static unsigned int threads(const struct phase *p)
{
	return p->threads ?: 2;
}

/*
 * Runs one dmatest phase on every channel of @bdf and tallies its summary lines. Returns 0 or
 * -errno (a parameter could not be set).
 */
static int run_phase(const char *bdf, int nchans, const struct phase *p, struct tally *t)
{
	static const char *const defaults[][2] = {
		{ "threads_per_chan", "2" }, { "max_channels", "0" }, { "polled", "N" },
		{ "norandom", "N" }, { "noverify", "N" }, { "transfer_size", "0" },
		{ "alignment", "-1" }, { "test_buf_size", "16384" }, { "timeout", "3000" },
		{ "dmatest", "0" },
	};
	char buf[256];
	unsigned int i;
	time_t start;
	int fd, ret;

	memset(t, 0, sizeof(*t));
	for (i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
		ret = param(defaults[i][0], defaults[i][1]);
		if (ret)
			return ret;
	}
	snprintf(buf, sizeof(buf), "%u", p->iterations);
	ret = param("iterations", buf) ?: param("device", bdf);
	if (!ret && p->threads) {
		snprintf(buf, sizeof(buf), "%u", p->threads);
		ret = param("threads_per_chan", buf);
	}
	for (i = 0; !ret && i < 4 && p->extra[i][0]; i++)
		ret = param(p->extra[i][0], p->extra[i][1]);
	if (ret)
		return ret;
	snprintf(buf, sizeof(buf), "neuron_udma-dmatest: phase %s channels %d min %u expect %s\n",
		 p->name, nchans, threads(p) * p->iterations, p->expect);
	kmsg(buf);
	fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	lseek(fd, 0, SEEK_END);
	ret = param("run", "1");
	if (!ret && p->during)
		p->during(p->arg);
	/*
	 * `wait` blocks until the threads are done, but returns at once while they have not
	 * started yet: wait until every thread printed its summary (bounded by PHASE_LIMIT_S).
	 */
	start = time(NULL);
	while (!ret) {
		ret = read_param("wait", buf, sizeof(buf));
		collect(fd, t);
		if (t->summaries >= threads(p) * (unsigned int)nchans ||
		    time(NULL) - start > PHASE_LIMIT_S)
			break;
		usleep(100 * 1000);
	}
	/* Reading `run` releases the channels. */
	if (!ret)
		ret = read_param("run", buf, sizeof(buf));
	collect(fd, t);
	close(fd);
	snprintf(buf, sizeof(buf), "neuron_udma-dmatest: phase %s end\n", p->name);
	kmsg(buf);
	return ret;
}

static void report(struct __test_metadata *_metadata, const struct phase *p, struct tally *t)
{
	int i;

	for (i = 0; i < t->nchans; i++)
		TH_LOG("%s %s: %u tests, %u failures", p->name, t->chan[i], t->tests[i],
		       t->failures[i]);
	TH_LOG("%s: %u result lines", p->name, t->results);
}

/* A clean phase: every channel ran its threads' tests, none failed. */
#define ASSERT_CLEAN(t, nc, p)                                                      \
	do {                                                                          \
		int _i;                                                               \
		report(_metadata, (p), (t));                                          \
		ASSERT_EQ((nc), (t)->nchans);                                     \
		ASSERT_EQ(threads(p) * (nc), (t)->summaries);                         \
		ASSERT_EQ(0U, (t)->results);                                          \
		for (_i = 0; _i < (t)->nchans; _i++) {                                \
			EXPECT_EQ(0U, (t)->failures[_i]);                             \
			EXPECT_LE(threads(p) * (p)->iterations, (t)->tests[_i]);      \
		}                                                                     \
	} while (0)

FIXTURE(dma)
{
	char bdf[64];
	int nchans;
};

FIXTURE_SETUP(dma)
{
	struct stat st;

	ASSERT_EQ(0, udma_bdf(self->bdf, sizeof(self->bdf)))
		TH_LOG("no device bound to neuron_udma");
	if (stat("/sys/module/dmatest", &st))
		ASSERT_EQ(0, system("insmod /lib/modules/dmatest.ko"));
	self->nchans = dma_channels(self->bdf);
	ASSERT_LE(1, self->nchans) TH_LOG("%s registered no dmaengine channel", self->bdf);
}

FIXTURE_TEARDOWN(dma)
{
}

/* (a) Random sizes and offsets, verified, 2 threads on every channel. */
TEST_F_TIMEOUT(dma, random_verified, 1200)
{
	struct phase p = { .name = "random", .expect = "clean", .iterations = ITER_RANDOM };
	struct tally t;

	ASSERT_EQ(4, self->nchans) TH_LOG("dma_channels defaults to 4");
	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
	ASSERT_CLEAN(&t, self->nchans, &p);
}

/*
 * (b) Polled completion: no callback, dmatest spins on tx_status. One thread per channel:
 * dmatest's polled mode terminates the channel after each test (dmaengine_terminate_sync),
 * which aborts what another thread has in flight on it.
 */
TEST_F_TIMEOUT(dma, polled, 600)
{
	struct phase p = { .name = "polled", .expect = "clean", .iterations = 2 * ITER_SHORT,
			   .threads = 1, .extra = { { "polled", "Y" } } };
	struct tally t;

	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
	ASSERT_CLEAN(&t, self->nchans, &p);
}

/*
 * (f) DMA_MEMSET (dmatest=1): random sizes and offsets filled with dmatest's byte and verified,
 * 2 threads on every channel; the fills read the device's fill blocks (rust/pattern.rs).
 */
TEST_F_TIMEOUT(dma, memset_verified, 900)
{
	struct phase p = { .name = "memset", .expect = "clean", .iterations = ITER_SHORT,
			   .extra = { { "dmatest", "1" } } };
	struct tally t;

	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
	ASSERT_CLEAN(&t, self->nchans, &p);
}

/* (c) One 64 KiB descriptor, and one byte more: the chunk boundary. */
TEST_F_TIMEOUT(dma, chunk_boundary, 600)
{
	static const char *const sizes[] = { "65536", "65537" };
	struct tally t;
	unsigned int i;

	for (i = 0; i < 2; i++) {
		struct phase p = { .name = i ? "size65537" : "size65536", .expect = "clean",
				   .iterations = 50,
				   .extra = { { "test_buf_size", "131072" },
					      { "transfer_size", sizes[i] },
					      { "norandom", "Y" } } };

		ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
		ASSERT_CLEAN(&t, self->nchans, &p);
	}
}

/* (d) Addresses at the engine's copy_align (1 byte: alignment 2^0). */
TEST_F_TIMEOUT(dma, copy_align, 600)
{
	struct phase p = { .name = "align", .expect = "clean", .iterations = ITER_SHORT,
			   .extra = { { "alignment", "0" } } };
	struct tally t;

	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
	ASSERT_CLEAN(&t, self->nchans, &p);
}

struct fault_arg {
	__u32 eng, queue;
	int ret;
};

/* Fails a Tx descriptor of the first channel's queue, once dmatest is under way. */
static void inject(void *arg)
{
	struct fault_arg *f = arg;
	struct ubar2 b;

	usleep(500 * 1000);
	f->ret = bar2_open(&b);
	if (f->ret)
		return;
	f->ret = bar2_fault(&b, FAULT_FAIL_NTH, f->eng, f->queue, 3);
	bar2_close(&b);
}

/* The channels' queues: the last H2T engine's, from queue 15 down (rust/dmaengine.rs). */
static __u32 dma_engine(void)
{
	struct neuron_udma_info info;
	int fd = udma_open();
	__u32 eng;

	if (fd < 0)
		return ~0U;
	eng = udma_info(fd, &info) ? ~0U : info.generation == NEURON_UDMA_GEN_V2 ? 33 : 131;
	close(fd);
	return eng;
}

/* The provider's queues are the driver's: QUEUE_INIT reports them busy, like the H2T queues. */
TEST_F(dma, queues_reserved)
{
	__u32 eng = dma_engine();
	int fd = udma_open(), q;

	ASSERT_LE(0, fd);
	for (q = 0; q < self->nchans; q++)
		EXPECT_EQ(-EBUSY, queue_init(fd, eng, 15 - q, 32, 32));
	close(fd);
}

/* An engine fault during a run: dmatest reports failures; the next run is clean. */
TEST_F_TIMEOUT(dma, engine_fault_then_clean, 900)
{
	struct fault_arg f = { .eng = dma_engine(), .queue = 15, .ret = -1 };
	struct phase p = { .name = "fault", .expect = "failures", .iterations = 300,
			   .during = inject, .arg = &f };
	struct phase clean = { .name = "after-fault", .expect = "clean",
			       .iterations = ITER_SHORT };
	unsigned int failures = 0;
	struct tally t;
	int i;

	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
	report(_metadata, &p, &t);
	ASSERT_EQ(0, f.ret) TH_LOG("the model did not take the fault");
	for (i = 0; i < t.nchans; i++)
		failures += t.failures[i];
	ASSERT_LE(1U, failures) TH_LOG("the injected fault failed no dmatest test");
	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &clean, &t));
	ASSERT_CLEAN(&t, self->nchans, &clean);
}

struct unbind_arg {
	const char *bdf;
	pid_t pid;
};

/*
 * Unbinds the device from a child: unbind aborts the transfers in flight and waits for the
 * clients to give their channels back. dmatest does not stop on its own (its threads sleep
 * 100 ms after each failed prep), so it is stopped as a client that sees its channel fail would
 * stop: then the unbind completes.
 */
static void unbind(void *arg)
{
	struct unbind_arg *u = arg;

	usleep(1000 * 1000);
	u->pid = fork();
	if (u->pid == 0)
		_exit(sysfs_write(UDMA_DRV_DIR "/unbind", u->bdf) ? 1 : 0);
	usleep(500 * 1000);
	param("run", "0");
}

/* Unbind during a run: no splat (the gate checks the log), rebind, a fresh run is clean. */
TEST_F_TIMEOUT(dma, unbind_during_run_then_rebind, 900)
{
	struct unbind_arg u = { .bdf = self->bdf, .pid = -1 };
	struct phase p = { .name = "unbind", .expect = "any", .iterations = 2000,
			   .during = unbind, .arg = &u };
	struct phase clean = { .name = "after-rebind", .expect = "clean",
			       .iterations = ITER_SHORT };
	struct tally t;
	int status, i, n = 0;

	ASSERT_EQ(0, run_phase(self->bdf, self->nchans, &p, &t));
	report(_metadata, &p, &t);
	ASSERT_LT(0, u.pid);
	ASSERT_EQ(u.pid, waitpid(u.pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) TH_LOG("unbind failed");
	ASSERT_EQ(0, dma_channels(self->bdf));
	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/bind", self->bdf));
	for (i = 0; i < 50 && !n; i++) {
		n = dma_channels(self->bdf);
		if (!n)
			usleep(100 * 1000);
	}
	ASSERT_EQ(self->nchans, n);
	ASSERT_EQ(0, run_phase(self->bdf, n, &clean, &t));
	ASSERT_CLEAN(&t, n, &clean);
}

TEST_HARNESS_MAIN
