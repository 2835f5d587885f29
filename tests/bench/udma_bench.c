// SPDX-License-Identifier: GPL-2.0
/*
 * udma_bench: guest side of `make bench` (scripts/bench). Measures, through the ioctl ABI of
 * /dev/neuron_udma0:
 *
 *   submission rate: pairs/s of COPY_PREPARE_ONE (one pair per call) and of COPY_PREPARE with
 *       1, 16, 256 and 2032 pairs per call, each submission of 2032 pairs closed by COPY_WAIT
 *       (start + fence + wait amortised over the 2032 pairs); one thread, then one thread per
 *       queue on two queues (two engines) at once;
 *       with the time spent inside the COPY_PREPARE calls alone, per pair (the ABI's cost over
 *       the in-kernel prepare_one of tests/bench/kernel/bench.rs, which scripts/bench's report puts next to it);
 *   buffer lookups: that time per pair for COPY_PREPARE x256 in a file holding 2 buffers,
 *       interleaved with a file holding 1,000, the copies between the first and the last one
 *       allocated, and with every entry of a call on buffers no other entry of that call names;
 *   batch scale: the time inside COPY_PREPARE per pair for 1, 16, 256, 2032 and 4096 entries per
 *       call (8192-slot rings; START + WAIT outside the timed part), and the user copy of one
 *       entry (what each entry adds to a COPY_PREPARE that fails right after reading its array);
 *   latency: one 4-byte copy from COPY_PREPARE_ONE to a completed COPY_WAIT, p50/p99, against
 *       a null ioctl (NEURON_UDMA_INFO) as the syscall floor, with the model's BAR2 counters;
 *       then, in one phase, PREPARE_ONE + START + WAIT interleaved with its floor PREPARE_ONE +
 *       START (the same calls without the wait), with PREPARE_ONE + WAIT and with PREPARE_ONE +
 *       COPY_SUBMIT + FENCE_WAIT: p50, p99, p99.9 and the floor's spread, with the guest's
 *       /proc/loadavg before and after;
 *   latency scale: PREPARE_ONE + START + WAIT p50/p99 (and its interleaved floor) with 1, 2, 10,
 *       100 and 1,000 host buffers open in the file, and with 1, 4 and 16 queues initialised;
 *   io_uring: the time per pair of submitting 2032 copies as NEURON_UDMA_URING_COPY SQEs (one of
 *       2032, eight of 254 on eight queues, in one io_uring_enter) until their fences are
 *       submitted, against COPY_PREPARE of the same batches, and against COPY_PREPARE +
 *       COPY_SUBMIT (raw io_uring system calls: no library linked); the same on queues with an
 *       eventfd (both sides then arrange a completion notice) and on an IOPOLL ring (neither
 *       does); and one SQE of 4 KiB or 16 x 64 KiB host->HBM at a time from an io_uring
 *       registered buffer against the same from an import of that memory;
 *   wake-up: the time from COPY_SUBMIT (io_uring: from the URING_COPY issue), and from a copy's
 *       bytes landing (a thread spins on the destination), to the wake-up of its waiter, epoll +
 *       QUEUE_EVENTS, an eventfd read and an io_uring CQE wait against COPY_WAIT;
 *   fills: MEMSET against MEMCPY of the same bytes, 4 MiB host, 4 MiB and 64 MiB device; 16
 *       striped MEMCPYs of 4 MiB HBM->HBM against 16 of 4 MiB - 64 KiB (one engine each);
 *   fragmented device memory: MEM_ALLOC that fails and one that succeeds with 8,192 one-slot
 *       holes against the same with 1 hole;
 *   rings in device memory: the time of PREPARE_ONE (or COPY_PREPARE xN) + COPY_START per pair on
 *       a queue whose rings are in HBM (NEURON_UDMA_QUEUE_DEVICE_RINGS), the descriptors written
 *       through BAR4 or moved by the driver's H2T queue (the device_ring_fill module parameter),
 *       against the same calls on a queue with host rings;
 *   kernel memory per buffer: the slab a memory cgroup is charged per 4 KiB device buffer and
 *       per one-page import (5 rounds of 1,024 of each, alternating), against the bound of 512 B.
 *
 * Every result is one line `NU-BENCH {json}` on stdout (name, value, unit, baseline, ratio,
 * how, and for some rows more fields: load_start/load_end, floor_us). Progress and errors go to
 * stderr. Built statically by scripts/bench in the toolchain root.
 */
#define _GNU_SOURCE
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#include "udma_util.h"

#define RING 4096U
#define PER_SUB 2032U		/* pairs per COPY_WAIT (the driver's MAX_PAIRS_PER_SUBMISSION) */
#define COPY_SIZE 4U
#define BUF_SIZE (1U << 20)

#define LOOKUP_BUFS 1000U	/* buffers open in the file for the lookup row */
#define LOOKUP_REPS 3U		/* runs per batch-scale and device-ring figure, the best counts */

#define SCALE_RING 8192U	/* batch scale: rings that hold 4096 pairs + marker + reserve */
#define SCALE_PAIRS 4096U	/* batch scale: most pairs per submission (MAX_BATCH) */
#define UCOPY_BATCH 2032U	/* user-copy row: entries of the failing COPY_PREPARE */
#define UCOPY_REPS 2000U	/* user-copy row: failing calls of each size */
#define UNOWNED_Q 3U		/* a queue of engine 0 that no file of this program takes */
#define BATCH_REPS 7U		/* batch scale x2032: interleaved repetitions of its three parts */
#define BATCH_UCOPY_CALLS 40U	/* ... failing calls of each size per repetition (user copy) */
/* KUnit's debugfs file that runs the in-kernel bench suite again (prepare_one's ns/pair). */
#define KUNIT_BENCH_RUN "/sys/kernel/debug/kunit/neuron_udma_bench/run"
#define DR_ENG 0U		/* rings in device memory: the engine of the three queues */
#define DR_FILL "/sys/module/neuron_udma/parameters/device_ring_fill"
#define SMALL_BUF 4096U		/* the buffers of the lookup and open-buffer rows */

#define HOLES 8192U		/* holes of the fragmented device memory of the MEM_ALLOC rows */
#define HOLE_SLOTS (2 * HOLES)	/* slot: device_mem_size / HOLE_SLOTS, rounded down to 4 KiB */
#define HOLE_REPS 401U		/* MEM_ALLOCs of each kind per measurement (median) */
#define HOLE_ROUNDS 5U		/* 1 hole, then HOLES, this often; the best median of each counts */
#define FILL_VALUE 0x5AU	/* the byte of the MEMSET rows */
#define FILL_REPS 5U		/* MEMSETs and MEMCPYs per fill row: the fastest, the ratio per round */
#define URING_SQES 8U		/* SQEs of the batched io_uring submission: 8 x 254 = PER_SUB copies */

/* Entries per COPY_PREPARE call of the batch-scale rows. */
static const unsigned int scale_batches[] = { 1, 16, 256, 2032, 4096 };
/* Host buffers open in the file, then queues initialised, of the latency-scale rows. */
static const unsigned int scale_bufs[] = { 1, 2, 10, 100, 1000 };
static const unsigned int scale_queues[] = { 1, 4, 16 };

static unsigned int subs = 8;		/* submissions per measurement */
static unsigned int lat_runs = 10000;
static unsigned int scale_runs = 2000;	/* rounds per point of the latency-scale rows */
static unsigned int wake_runs = 2000;	/* rounds of the completion-to-wake-up rows */
static unsigned int only_threads;	/* 0: one thread, then two; else only this many */
static unsigned int only_batch = ~0U;	/* ~0: every batch size; else only this one */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, int err)
{
	fprintf(stderr, "udma_bench: %s: %s\n", what, strerror(-err));
	exit(1);
}

/* One row; @extra (NULL or more JSON members, `"key":value,...`) goes after "how". */
static void result_x(const char *name, double value, const char *unit, double baseline,
		     const char *how, const char *extra)
{
	printf("NU-BENCH {\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"baseline\":%.6g,"
	       "\"ratio\":%.4g,\"how\":\"%s\"%s%s}\n",
	       name, value, unit, baseline, baseline > 0 ? value / baseline : 0.0, how,
	       extra ? "," : "", extra ? extra : "");
	fflush(stdout);
}

static void result(const char *name, double value, const char *unit, double baseline,
		   const char *how)
{
	result_x(name, value, unit, baseline, how, NULL);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, unsigned int n)
{
	qsort(v, n, sizeof(double), cmp_double);
	return v[n / 2];
}

/*
 * A row of interleaved repetitions: @value and @baseline (medians of each side), the median of
 * the per-repetition ratios @r (sorted in place, @n of them), their min and max.
 */
static void result_range(const char *name, double value, const char *unit, double baseline,
			 double *r, unsigned int n, const char *how, const char *extra)
{
	qsort(r, n, sizeof(double), cmp_double);
	printf("NU-BENCH {\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"baseline\":%.6g,"
	       "\"ratio\":%.4f,\"min\":%.4f,\"max\":%.4f,\"reps\":%u,\"how\":\"%s\"%s%s}\n",
	       name, value, unit, baseline, r[n / 2], r[0], r[n - 1], n, how, extra ? "," : "",
	       extra ? extra : "");
	fflush(stdout);
}

/* The guest's load averages (the first three fields of /proc/loadavg), or "?". */
static void loadavg(char *buf, size_t len)
{
	double a, b, c;
	FILE *f = fopen("/proc/loadavg", "re");

	snprintf(buf, len, "?");
	if (!f)
		return;
	if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
		snprintf(buf, len, "%.2f %.2f %.2f", a, b, c);
	fclose(f);
}

/* One queue with its buffers, owned by one file. */
struct qctx {
	int fd;
	__u32 eng, q;
	struct ubuf src, dst;
	struct neuron_udma_copy *copies;	/* ncopies entries, 64 bytes apart */
	unsigned int ncopies;
	/* in: batch (0 = PREPARE_ONE), out: seconds */
	unsigned int batch;
	double secs;
	double prep_secs;	/* of which inside COPY_PREPARE(_ONE) calls */
	int err;
};

/*
 * Buffers one file may hold (INFO's max_buffers, ABI 3; no limit when the driver reports 0), so
 * that a row needing more is left out with a message instead of failing the whole program.
 */
static unsigned int file_max_buffers(int fd)
{
	struct neuron_udma_info info;

	if (udma_info(fd, &info) || !info.max_buffers)
		return ~0U;
	return info.max_buffers;
}

/* A file with queue (@eng, @q) of @ring-slot rings, two 1 MiB host buffers, @ncopies copies. */
static void qctx_open_ring(struct qctx *c, __u32 eng, __u32 q, __u32 ring, unsigned int ncopies)
{
	unsigned int i;
	int ret;

	memset(c, 0, sizeof(*c));
	c->eng = eng;
	c->q = q;
	c->ncopies = ncopies;
	c->fd = udma_open();
	if (c->fd < 0)
		die("open " UDMA_DEV, -errno);
	ret = queue_init(c->fd, eng, q, ring, ring);
	if (ret)
		die("QUEUE_INIT", ret);
	ret = ubuf_host(c->fd, BUF_SIZE, &c->src);
	if (!ret)
		ret = ubuf_host(c->fd, BUF_SIZE, &c->dst);
	if (ret)
		die("MEM_ALLOC", ret);
	fill_pattern(c->src.map, BUF_SIZE, eng * 16 + q);
	c->copies = calloc(ncopies, sizeof(*c->copies));
	if (!c->copies)
		die("calloc", -ENOMEM);
	for (i = 0; i < ncopies; i++)
		c->copies[i] = ucopy(&c->src, i * 64, &c->dst, i * 64, COPY_SIZE);
}

static void qctx_open(struct qctx *c, __u32 eng, __u32 q)
{
	qctx_open_ring(c, eng, q, RING, PER_SUB);
}

static void qctx_close(struct qctx *c)
{
	queue_release(c->fd, c->eng, c->q);
	ubuf_free(c->fd, &c->src);
	ubuf_free(c->fd, &c->dst);
	free(c->copies);
	close(c->fd);
}

/* @subs submissions of PER_SUB pairs each, prepared @batch at a time (0: PREPARE_ONE). */
static int submit(struct qctx *c, unsigned int batch, unsigned int n_subs)
{
	unsigned int s, i, n;
	double t0;
	int ret;

	c->prep_secs = 0;
	for (s = 0; s < n_subs; s++) {
		for (i = 0; i < PER_SUB; i += n) {
			t0 = now();
			if (batch == 0) {
				n = 1;
				ret = prep_one(c->fd, c->eng, c->q, c->copies[i]);
			} else {
				n = PER_SUB - i < batch ? PER_SUB - i : batch;
				ret = prep(c->fd, c->eng, c->q, &c->copies[i], n);
			}
			c->prep_secs += now() - t0;
			if (ret)
				return ret;
		}
		ret = copy_wait(c->fd, c->eng, c->q, 0, NULL);
		if (ret)
			return ret;
	}
	return 0;
}

static void *submit_thread(void *arg)
{
	struct qctx *c = arg;
	double t0 = now();

	c->err = submit(c, c->batch, subs);
	c->secs = now() - t0;
	return NULL;
}

static const unsigned int batches[] = { 0, 1, 16, 256, 2032 };

static void mode_name(char *buf, size_t len, unsigned int batch)
{
	if (batch == 0)
		snprintf(buf, len, "PREPARE_ONE");
	else
		snprintf(buf, len, "PREPARE x%u", batch);
}

static void bench_submission(void)
{
	double single[5] = { 0 };
	struct qctx qs[2];
	unsigned int b, t, nthreads;
	char name[96], mode[32], how[512];
	__u64 pairs = (__u64)subs * PER_SUB;

	for (nthreads = 1; nthreads <= 2; nthreads++) {
		if (only_threads && nthreads != only_threads)
			continue;
		for (t = 0; t < nthreads; t++)
			qctx_open(&qs[t], t, 1);
		/* Warm up: page in the buffers, settle the model's queue. */
		for (t = 0; t < nthreads; t++) {
			int ret = submit(&qs[t], 2032, 1);

			if (ret)
				die("warm-up", ret);
		}
		for (b = 0; b < sizeof(batches) / sizeof(batches[0]); b++) {
			pthread_t th[2];
			double rate = 0, slowest = 0;

			if (only_batch != ~0U && batches[b] != only_batch)
				continue;
			for (t = 0; t < nthreads; t++) {
				qs[t].batch = batches[b];
				if (pthread_create(&th[t], NULL, submit_thread, &qs[t]))
					die("pthread_create", -EAGAIN);
			}
			for (t = 0; t < nthreads; t++) {
				pthread_join(th[t], NULL);
				if (qs[t].err)
					die("submission", qs[t].err);
				if (qs[t].secs > slowest)
					slowest = qs[t].secs;
			}
			/* Aggregate rate: all pairs over the wall time of the slowest thread. */
			rate = (double)pairs * nthreads / slowest;
			mode_name(mode, sizeof(mode), batches[b]);
			if (nthreads == 1) {
				single[b] = rate;
				snprintf(name, sizeof(name), "submit %s, 1 thread", mode);
				snprintf(how, sizeof(how),
					 "%llu pairs of %u B host->host on 1 queue (engine 0 queue 1, %u-slot rings), "
					 "COPY_WAIT every %u pairs; baseline: PREPARE_ONE, 1 thread",
					 (unsigned long long)pairs, COPY_SIZE, RING, PER_SUB);
				result(name, rate, "pairs/s", single[0], how);
				if (batches[b] >= 256) {
					snprintf(name, sizeof(name), "COPY_PREPARE x%u time per pair", batches[b]);
					snprintf(how, sizeof(how),
						 "time inside the COPY_PREPARE calls of the row above (ioctl entry, user "
						 "copy of the entries, validation, buffer lookups, slot writes; not "
						 "COPY_WAIT nor the copies), over %llu pairs; baseline: the in-kernel "
						 "prepare_one ns/pair of the same run",
						 (unsigned long long)pairs);
					result(name, qs[0].prep_secs * 1e9 / pairs, "ns/pair", 0, how);
				}
			} else {
				snprintf(name, sizeof(name), "submit %s, 2 threads", mode);
				snprintf(how, sizeof(how),
					 "2 threads x %llu pairs of %u B, one file + queue each (engines 0 and 1, queue 1), "
					 "COPY_WAIT every %u pairs, aggregate rate over the slower thread's time; "
					 "baseline: same mode, 1 thread",
					 (unsigned long long)pairs, COPY_SIZE, PER_SUB);
				result(name, rate, "pairs/s", single[b], how);
			}
			fprintf(stderr, "udma_bench: %s, %u thread(s): %.0f pairs/s\n", mode, nthreads, rate);
		}
		for (t = 0; t < nthreads; t++)
			qctx_close(&qs[t]);
	}
}

#define LOOKUP_RUNS 5U		/* lookup rows: runs of each of the four, interleaved */

/* Seconds inside the COPY_PREPARE x256 calls of one run of @c's copies, @copies copied in first. */
static double lookup_run(struct qctx *c, const struct neuron_udma_copy *copies)
{
	int ret;

	memcpy(c->copies, copies, PER_SUB * sizeof(*copies));
	ret = submit(c, 256, subs);
	if (ret)
		die("lookup", ret);
	return c->prep_secs;
}

/* Opens buffers 2..LOOKUP_BUFS - 1 of the lookup rows in @b's file, named in @many and @spread. */
static void lookup_open(struct qctx *b, struct ubuf *bufs, struct neuron_udma_copy *many,
			struct neuron_udma_copy *spread)
{
	struct ubuf *all[LOOKUP_BUFS];
	unsigned int i;
	int ret;

	for (i = 2; i < LOOKUP_BUFS; i++) {
		ret = ubuf_host(b->fd, SMALL_BUF, &bufs[i]);
		if (ret)
			die("MEM_ALLOC (lookup buffers)", ret);
	}
	all[0] = &b->src;
	all[1] = &b->dst;
	for (i = 2; i < LOOKUP_BUFS; i++)
		all[i] = &bufs[i];
	for (i = 0; i < PER_SUB; i++) {
		many[i] = ucopy(&b->src, i * 64, &bufs[LOOKUP_BUFS - 1], (i * COPY_SIZE) % SMALL_BUF,
				COPY_SIZE);
		spread[i] = ucopy(all[(2 * i) % LOOKUP_BUFS], (i * COPY_SIZE) % SMALL_BUF,
				  all[(2 * i + 1) % LOOKUP_BUFS], (i * COPY_SIZE) % SMALL_BUF, COPY_SIZE);
	}
}

/* Frees what lookup_open() opened. */
static void lookup_close(struct qctx *b, struct ubuf *bufs)
{
	unsigned int i;
	int ret;

	for (i = 2; i < LOOKUP_BUFS; i++) {
		/* A buffer left open would make the 2-buffer baseline a file of more. */
		ret = ubuf_free(b->fd, &bufs[i]);
		if (ret)
			die("MEM_FREE (lookup buffers)", ret);
	}
}

/*
 * COPY_PREPARE x256 time per pair in four settings, all on one file and queue (engine 0 queue 2),
 * so on the same ring memory (under TCG two queues' rings alone differed by up to 1.45x from boot
 * to boot, which moved the buffers-open ratio between 0.99x and 1.46x), LOOKUP_RUNS runs of each,
 * interleaved: (two) the file holding only its queue's 2 buffers, every copy between them;
 * (many) the file holding LOOKUP_BUFS buffers, every copy from the first buffer allocated to the
 * last (the far end of a list for a lookup that scans from either end); (same) the file holding
 * LOOKUP_BUFS buffers, every copy between its queue's 2 buffers; (spread) copy i from buffer 2i
 * to buffer 2i + 1 (modulo LOOKUP_BUFS, in allocation order): the 256 entries of a call name 512
 * buffers, no two entries the same one. The other LOOKUP_BUFS - 2 buffers are opened and freed
 * (untimed) between the runs, so that the runs alternate between "two" and the other three (whose
 * order reverses every two runs). The rows: many against two (the buffers open), spread against
 * same (a buffer per entry), medians and the per-run ratios' range.
 */
static void bench_lookup(void)
{
	struct neuron_udma_copy *two_c, *many_c, *spread_c;
	double t[4][LOOKUP_RUNS], rm[LOOKUP_RUNS], rs[LOOKUP_RUNS], m[4];
	bool opened = false;
	struct ubuf *bufs;
	unsigned int r, k;
	struct qctx b;
	char how[1000];

	bufs = calloc(LOOKUP_BUFS, sizeof(*bufs));
	two_c = calloc(PER_SUB, sizeof(*two_c));
	many_c = calloc(PER_SUB, sizeof(*many_c));
	spread_c = calloc(PER_SUB, sizeof(*spread_c));
	if (!bufs || !two_c || !many_c || !spread_c)
		die("calloc", -ENOMEM);
	qctx_open(&b, 0, 2);
	if (file_max_buffers(b.fd) < LOOKUP_BUFS) {
		fprintf(stderr, "udma_bench: a file may hold %u buffers (INFO max_buffers), the lookup "
			"rows need %u: left out\n", file_max_buffers(b.fd), LOOKUP_BUFS);
		goto out;
	}
	memcpy(two_c, b.copies, PER_SUB * sizeof(*two_c));
	/* Warm-up, one run of each. */
	lookup_run(&b, two_c);
	lookup_open(&b, bufs, many_c, spread_c);
	opened = true;
	lookup_run(&b, many_c);
	lookup_run(&b, two_c);
	lookup_run(&b, spread_c);
	for (r = 0; r < LOOKUP_RUNS; r++) {
		/* Runs alternate: the 2-buffer file before the LOOKUP_BUFS one, or after it. */
		bool two_first = !opened;

		if (two_first) {
			t[0][r] = lookup_run(&b, two_c);
			lookup_open(&b, bufs, many_c, spread_c);
			opened = true;
		}
		for (k = 0; k < 3; k++) {
			const struct neuron_udma_copy *c[3] = { many_c, two_c, spread_c };
			unsigned int i = r % 4 < 2 ? k : 2 - k;

			t[i + 1][r] = lookup_run(&b, c[i]);
		}
		if (!two_first) {
			lookup_close(&b, bufs);
			opened = false;
			t[0][r] = lookup_run(&b, two_c);
		}
	}
	for (r = 0; r < LOOKUP_RUNS; r++) {
		rm[r] = t[1][r] / t[0][r];
		rs[r] = t[3][r] / t[2][r];
	}
	for (k = 0; k < 4; k++)
		m[k] = median(t[k], LOOKUP_RUNS) * 1e9 / ((double)subs * PER_SUB);
	snprintf(how, sizeof(how),
		 "COPY_PREPARE x256, %u runs of %u submissions of %u pairs in each of four settings, "
		 "time inside the COPY_PREPARE calls only, all on one file and queue (engine 0 queue 2: "
		 "the same ring memory): the file holding only its 2 buffers, every copy between them "
		 "(the buffers-open baseline); the file holding %u buffers (opened and freed untimed "
		 "between the runs, which alternate), every copy from the first buffer allocated to the "
		 "last (buffers open); every copy between the queue's 2 buffers (the per-entry "
		 "baseline); copy i from buffer 2i to 2i+1 (mod %u, allocation order), 512 buffers per "
		 "call (a different buffer per entry); medians, the ratio the median of the per-run "
		 "ratios, min and max beside it",
		 LOOKUP_RUNS, subs, PER_SUB, LOOKUP_BUFS, LOOKUP_BUFS);
	result_range("COPY_PREPARE x256 per pair, 1000 buffers open", m[1], "ns/pair", m[0], rm,
		     LOOKUP_RUNS, how, NULL);
	result_range("COPY_PREPARE x256 per pair, 1000 buffers, a different buffer per entry", m[3],
		     "ns/pair", m[2], rs, LOOKUP_RUNS, how, NULL);
out:
	if (opened)
		lookup_close(&b, bufs);
	qctx_close(&b);
	free(spread_c);
	free(many_c);
	free(two_c);
	free(bufs);
}



/*
 * The user copy of one entry now: @calls failing COPY_PREPARE calls of UCOPY_BATCH entries and
 * @calls of 1 entry on a queue this file does not own, alternating (@one and @many get their
 * times); ns per entry. *@m1 and *@mn, if set, get the two medians in seconds.
 */
static double user_copy_now(struct qctx *c, double *one, double *many, unsigned int calls,
			    double *m1, double *mn)
{
	double a, b;

	unsigned int r, k;
	int ret;

	for (r = 0; r < calls; r++)
		for (k = 0; k < 2; k++) {
			unsigned int n = (r + k) % 2 ? UCOPY_BATCH : 1;
			double t0 = now();

			ret = prep(c->fd, 0, UNOWNED_Q, c->copies, n);
			(n == 1 ? one : many)[r] = now() - t0;
			if (ret != -ENOENT)
				die("COPY_PREPARE on a foreign queue (expected ENOENT)", ret ? ret : -EPROTO);
		}
	a = median(one, calls);
	b = median(many, calls);
	if (m1)
		*m1 = a;
	if (mn)
		*mn = b;
	return (b - a) * 1e9 / (UCOPY_BATCH - 1);
}

/*
 * The user copy of one entry: COPY_PREPARE of UCOPY_BATCH entries and of 1 entry, both on a queue
 * this file does not own (engine 0, queue UNOWNED_Q), UCOPY_REPS calls each, alternating. The
 * driver reads the whole entry array (for more than 16 entries into a heap array it allocates and
 * initialises first) before it looks the queue up, then fails with ENOENT: the difference of the
 * two medians over UCOPY_BATCH - 1 is what one entry adds to the call through that read. Checked
 * first: the same call with an unreadable array must fail with EFAULT (the array is read before
 * the queue lookup), else the row would time nothing and is left out.
 * Returns the figure in ns per entry, or a negative value when left out.
 */
static double bench_user_copy(struct qctx *c)
{
	double *one = calloc(UCOPY_REPS, sizeof(double));
	double *many = calloc(UCOPY_REPS, sizeof(double));
	double m1, mn, per;
	char how[640];
	int ret;

	if (!one || !many)
		die("calloc", -ENOMEM);
	ret = prep(c->fd, 0, UNOWNED_Q, NULL, UCOPY_BATCH);
	if (ret != -EFAULT) {
		fprintf(stderr, "udma_bench: COPY_PREPARE of an unreadable array on a foreign queue "
			"returned %d, not -EFAULT: the queue is checked before the user copy, no "
			"user-copy row\n", ret);
		free(one);
		free(many);
		return -1;
	}
	per = user_copy_now(c, one, many, UCOPY_REPS, &m1, &mn);
	snprintf(how, sizeof(how),
		 "%u COPY_PREPARE calls of %u entries and %u of 1 entry, alternating, on a queue this "
		 "file does not own (engine 0 queue %u): the driver reads the entry array (above 16 "
		 "entries into a heap array it allocates and initialises first), then fails the queue "
		 "lookup with ENOENT; (median of the %u-entry call %.1f us - median of the 1-entry call "
		 "%.2f us) / %u: the staging and user copy one entry adds to a call; baseline: the "
		 "in-kernel prepare_one ns/pair of the same run",
		 UCOPY_REPS, UCOPY_BATCH, UCOPY_REPS, UNOWNED_Q, UCOPY_BATCH, mn * 1e6, m1 * 1e6,
		 UCOPY_BATCH - 1);
	result("COPY_PREPARE user copy per entry (x2032)", per, "ns/entry", 0, how);
	free(one);
	free(many);
	return per;
}

/*
 * @n_subs submissions, each of SCALE_PAIRS / @batch calls of COPY_PREPARE with @batch entries
 * (one call of SCALE_PAIRS when @batch is larger; 2 x 2032 = 4064 pairs for 2032) and then a
 * COPY_WAIT (which rings the doorbells, appends the marker and waits): only the calls are timed
 * (c->prep_secs). Returns 0 or -errno; *@pairs gets the pairs prepared.
 */
static int submit_scale(struct qctx *c, unsigned int batch, unsigned int n_subs, __u64 *pairs)
{
	unsigned int calls = batch >= SCALE_PAIRS ? 1 : SCALE_PAIRS / batch, s, k;
	double t0;
	int ret;

	c->prep_secs = 0;
	*pairs = 0;
	for (s = 0; s < n_subs; s++) {
		for (k = 0; k < calls; k++) {
			t0 = now();
			ret = prep(c->fd, c->eng, c->q, &c->copies[k * batch], batch);
			c->prep_secs += now() - t0;
			if (ret)
				return ret;
			*pairs += batch;
		}
		ret = copy_wait(c->fd, c->eng, c->q, 0, NULL);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * prepare_one's ns/pair now: the in-kernel bench suite run again through KUnit's debugfs
 * (synchronously), its "prepare_one (in kernel)" line read from /dev/kmsg. Negative if the suite
 * or the log cannot be reached (a module built without the bench suite).
 */
static double kunit_prepare_one(void)
{
	static const char key[] = "NU-BENCH {\"name\":\"prepare_one (in kernel)\",\"value\":";
	double v = -1;
	char rec[2048];
	int log, run;
	ssize_t n;

	log = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (log < 0)
		return -1;
	lseek(log, 0, SEEK_END);
	run = open(KUNIT_BENCH_RUN, O_WRONLY | O_CLOEXEC);
	if (run < 0 || write(run, "1", 1) != 1) {
		if (run >= 0)
			close(run);
		close(log);
		return -1;
	}
	close(run);
	/* One record per read; EPIPE: records were overwritten meanwhile, read on. */
	while ((n = read(log, rec, sizeof(rec) - 1)) > 0 || (n < 0 && errno == EPIPE)) {
		char *p;

		if (n <= 0)
			continue;
		rec[n] = 0;
		p = strstr(rec, key);
		if (p)
			v = strtod(p + strlen(key), NULL);
	}
	close(log);
	return v;
}

/*
 * The targeted batch-scale row, x2032, against (user copy + build) in the same phase:
 * BATCH_REPS repetitions of three parts, their order rotating: @subs submissions of COPY_PREPARE
 * x2032 (submit_scale: ns per pair inside the calls), the user copy of one entry
 * (user_copy_now) and prepare_one's ns/pair (kunit_prepare_one); per repetition the ratio of
 * the first to the sum of the other two. Left out (a note on stderr) without the bench suite.
 */
static void batch_scale_interleaved(struct qctx *c, double *one, double *many)
{
	double a[BATCH_REPS], u[BATCH_REPS], k[BATCH_REPS], base[BATCH_REPS], r[BATCH_REPS];
	unsigned int i, part;
	__u64 pairs = 0;
	char how[900];
	int ret;

	for (i = 0; i < BATCH_REPS; i++)
		for (part = 0; part < 3; part++)
			switch ((i + part) % 3) {
			case 0:
				ret = submit_scale(c, 2032, subs, &pairs);
				if (ret)
					die("batch scale", ret);
				a[i] = c->prep_secs * 1e9 / pairs;
				break;
			case 1:
				u[i] = user_copy_now(c, one, many, BATCH_UCOPY_CALLS, NULL, NULL);
				break;
			default:
				k[i] = kunit_prepare_one();
				if (k[i] < 0) {
					fprintf(stderr, "udma_bench: batch scale x2032: no in-kernel bench "
						"suite (%s), no interleaved row\n", KUNIT_BENCH_RUN);
					return;
				}
			}
	for (i = 0; i < BATCH_REPS; i++) {
		base[i] = u[i] + k[i];
		r[i] = a[i] / base[i];
	}
	snprintf(how, sizeof(how),
		 "%u repetitions, the order of their three parts rotating: the time inside COPY_PREPARE "
		 "calls of 2032 entries (%u submissions of 2 calls on engine 0 queue 2, %u-slot rings, "
		 "4 B host->host, each closed by an untimed COPY_WAIT), ns/pair; the user copy of one "
		 "entry (%u failing calls of %u entries and of 1 on a foreign queue, the difference of "
		 "the medians per entry); prepare_one ns/pair (the in-kernel bench suite run again "
		 "through KUnit's debugfs); ratio per repetition: the first over the sum of the other "
		 "two (user copy + build, the same phase); medians: COPY_PREPARE %.1f, user copy %.1f, "
		 "prepare_one %.1f ns",
		 BATCH_REPS, subs, SCALE_RING, BATCH_UCOPY_CALLS, UCOPY_BATCH,
		 median(a, BATCH_REPS), median(u, BATCH_REPS), median(k, BATCH_REPS));
	result_range("batch scale: COPY_PREPARE x2032 per pair", median(a, BATCH_REPS), "ns/pair",
		     median(base, BATCH_REPS), r, BATCH_REPS, how, NULL);
}

/*
 * Per-pair cost of COPY_PREPARE against its batch size: one queue (engine 0, queue 2) with
 * SCALE_RING-slot rings, 4-byte host->host copies between two 1 MiB buffers, for each size of
 * scale_batches best of LOOKUP_REPS runs of @subs submissions. Before them, the user copy of one
 * entry (bench_user_copy), the other half of these rows' baseline (with prepare_one). The
 * targeted x2032 row instead comes from batch_scale_interleaved (unless --batch picks one size:
 * the profile's run).
 */
static void bench_batch(void)
{
	struct neuron_udma_info info;
	unsigned int b, r;
	char name[96], how[640];
	struct qctx c;
	int ret;

	double *one = calloc(BATCH_UCOPY_CALLS, sizeof(double));
	double *many = calloc(BATCH_UCOPY_CALLS, sizeof(double));

	if (!one || !many)
		die("calloc", -ENOMEM);
	qctx_open_ring(&c, 0, 2, SCALE_RING, SCALE_PAIRS);
	ret = udma_info(c.fd, &info);
	if (ret)
		die("INFO", ret);
	if (only_batch == ~0U)
		bench_user_copy(&c);
	for (b = 0; b < sizeof(scale_batches) / sizeof(scale_batches[0]); b++) {
		unsigned int batch = scale_batches[b];
		double best = 0;
		__u64 pairs = 0;

		if (only_batch != ~0U && batch != only_batch)
			continue;
		if (batch > info.max_batch) {
			fprintf(stderr, "udma_bench: batch scale x%u: above max_batch %u, left out\n", batch,
				info.max_batch);
			continue;
		}
		ret = submit_scale(&c, batch, 1, &pairs);	/* warm-up */
		for (r = 0; !ret && r < LOOKUP_REPS; r++) {
			ret = submit_scale(&c, batch, subs, &pairs);
			if (!r || c.prep_secs < best)
				best = c.prep_secs;
		}
		if (ret)
			die("batch scale", ret);
		if (batch == 2032 && only_batch == ~0U) {
			/* The targeted row: interleaved, against its baseline in the same phase. */
			batch_scale_interleaved(&c, one, many);
			continue;
		}
		snprintf(name, sizeof(name), "batch scale: COPY_PREPARE x%u per pair", batch);
		snprintf(how, sizeof(how),
			 "time inside COPY_PREPARE calls of %u entries (ioctl, staging and user copy of the "
			 "entries, validation, buffer lookups, slot writes), best of %u runs of %u "
			 "submissions of %llu pairs of 4 B host->host on engine 0 queue 2 (%u-slot rings), "
			 "each closed by an untimed COPY_WAIT (doorbells, marker, wait); baseline: the user "
			 "copy of one entry + the in-kernel prepare_one ns/pair of the same run",
			 batch, LOOKUP_REPS, subs, (unsigned long long)(pairs / subs), SCALE_RING);
		result(name, best * 1e9 / pairs, "ns/pair", 0, how);
		fprintf(stderr, "udma_bench: batch scale x%u: %.1f ns/pair\n", batch, best * 1e9 / pairs);
	}
	qctx_close(&c);
	free(one);
	free(many);
}

static double pct(double *v, unsigned int n, unsigned int p)
{
	unsigned int i = (unsigned int)((__u64)n * p / 100);

	return v[i < n ? i : n - 1];
}

static __u64 bar2_read64(struct ubar2 *b, __u32 off)
{
	__u32 hi, lo;

	do {
		hi = bar2_read(b, off + 4);
		lo = bar2_read(b, off);
	} while (bar2_read(b, off + 4) != hi);
	return (__u64)hi << 32 | lo;
}

static void bench_latency(void)
{
	double *lat = calloc(lat_runs, sizeof(double));
	double *prep_t = calloc(lat_runs, sizeof(double));
	double *null_t = calloc(lat_runs, sizeof(double));
	double *bd_start = calloc(lat_runs, sizeof(double));
	double *bd_land = calloc(lat_runs, sizeof(double));
	double *bd_wait = calloc(lat_runs, sizeof(double));
	struct neuron_udma_info info;
	struct ubar2 bar2;
	__u64 desc0 = 0, pkt0 = 0, descs = 0, pkts = 0;
	bool have_bar2;
	struct qctx c;
	unsigned int i;
	char how[640];
	int ret;

	if (!lat || !prep_t || !null_t || !bd_start || !bd_land || !bd_wait)
		die("calloc", -ENOMEM);
	qctx_open(&c, 0, 1);
	for (i = 0; i < 100; i++) {	/* warm-up */
		ret = copy_sync(c.fd, 0, 1, c.copies[0]);
		if (ret)
			die("warm-up copy", ret);
	}
	have_bar2 = bar2_open(&bar2) == 0;
	if (have_bar2) {
		desc0 = bar2_read64(&bar2, 0x040);
		pkt0 = bar2_read64(&bar2, 0x068);
	}
	for (i = 0; i < lat_runs; i++) {
		double t0 = now(), t1;

		ret = prep_one(c.fd, 0, 1, c.copies[i % PER_SUB]);
		t1 = now();
		if (!ret)
			ret = copy_wait(c.fd, 0, 1, 0, NULL);
		if (ret)
			die("latency copy", ret);
		lat[i] = now() - t0;
		prep_t[i] = t1 - t0;
	}
	if (have_bar2) {
		descs = bar2_read64(&bar2, 0x040) - desc0;
		pkts = bar2_read64(&bar2, 0x068) - pkt0;
		bar2_close(&bar2);
	}
	for (i = 0; i < lat_runs; i++) {
		double t0 = now();

		ret = udma_info(c.fd, &info);
		if (ret)
			die("INFO", ret);
		null_t[i] = now() - t0;
	}
	/*
	 * Breakdown (separate runs): PREPARE_ONE, COPY_START (the doorbells), spin in user space
	 * until the 4 bytes land in the mapped destination, then COPY_WAIT (marker pair + wait).
	 */
	for (i = 0; i < lat_runs; i++) {
		volatile __u32 *s = (volatile __u32 *)c.src.map, *d = (volatile __u32 *)c.dst.map;
		__u32 v = i * 2654435761U + 1;
		double t0, t1, t2, t3;

		*s = v;
		*d = ~v;
		t0 = now();
		ret = prep_one(c.fd, 0, 1, c.copies[0]);
		if (!ret)
			ret = copy_start(c.fd, 0, 1, 1, 1);
		t1 = now();
		while (!ret && *d != v)
			if (now() - t1 > 10)
				ret = -ETIMEDOUT;
		t2 = now();
		if (!ret)
			ret = copy_wait(c.fd, 0, 1, 0, NULL);
		t3 = now();
		if (ret)
			die("breakdown copy", ret);
		bd_start[i] = t1 - t0;
		bd_land[i] = t2 - t1;
		bd_wait[i] = t3 - t2;
	}
	qctx_close(&c);
	qsort(bd_start, lat_runs, sizeof(double), cmp_double);
	qsort(bd_land, lat_runs, sizeof(double), cmp_double);
	qsort(bd_wait, lat_runs, sizeof(double), cmp_double);
	qsort(lat, lat_runs, sizeof(double), cmp_double);
	qsort(prep_t, lat_runs, sizeof(double), cmp_double);
	qsort(null_t, lat_runs, sizeof(double), cmp_double);
	snprintf(how, sizeof(how),
		 "%u runs of PREPARE_ONE (4 B host->host) + COPY_WAIT on engine 0 queue 1; of which "
		 "PREPARE_ONE p50 %.1f us, so COPY_WAIT (doorbell, marker, model, wake-up) p50 %.1f us; "
		 "model counted %.2f descriptors and %.2f packets per copy (BAR2); baseline: the same "
		 "percentile of %u null ioctls (INFO)",
		 lat_runs, pct(prep_t, lat_runs, 50) * 1e6,
		 (pct(lat, lat_runs, 50) - pct(prep_t, lat_runs, 50)) * 1e6,
		 (double)descs / lat_runs, (double)pkts / lat_runs, lat_runs);
	result("latency 4 B copy p50", pct(lat, lat_runs, 50) * 1e6, "us", pct(null_t, lat_runs, 50) * 1e6, how);
	result("latency 4 B copy p99", pct(lat, lat_runs, 99) * 1e6, "us", pct(null_t, lat_runs, 99) * 1e6, how);
	snprintf(how, sizeof(how), "the same %u runs: p99 of the copy latency; baseline: its p50", lat_runs);
	result("latency 4 B copy p99 vs p50", pct(lat, lat_runs, 99) * 1e6, "us", pct(lat, lat_runs, 50) * 1e6,
	       how);
	snprintf(how, sizeof(how),
		 "%u separate runs of PREPARE_ONE + COPY_START (p50 %.1f us), then a user-space spin on "
		 "the mapped destination until the 4 bytes land (this row: time left after START "
		 "returned), then COPY_WAIT (p50 %.1f us, "
		 "marker pair + poll back-off); baseline: the copy latency p50 above",
		 lat_runs, pct(bd_start, lat_runs, 50) * 1e6, pct(bd_wait, lat_runs, 50) * 1e6);
	result("latency: data landed after COPY_START p50", pct(bd_land, lat_runs, 50) * 1e6, "us",
	       pct(lat, lat_runs, 50) * 1e6, how);
	free(bd_start);
	free(bd_land);
	free(bd_wait);
	free(lat);
	free(prep_t);
	free(null_t);
}

/* The value at fraction @f (0.999 for p99.9) of the sorted @v. */
static double pctf(const double *v, unsigned int n, double f)
{
	unsigned int i = (unsigned int)(n * f);

	return v[i < n ? i : n - 1];
}

#define RANGE_BLOCKS 5U		/* (c) and wake-up rows: blocks of rounds for the range */

/*
 * For the range of a percentile ratio of interleaved samples: @a and @b (unsorted, @n each, the
 * same rounds) cut into RANGE_BLOCKS consecutive blocks; per block the @fa percentile of @a over the
 * @fb percentile of @b, into @out.
 */
static void block_ratios(const double *a, double fa, const double *b, double fb, unsigned int n,
			 double *out)
{
	double *t = calloc(n, sizeof(double));
	unsigned int i;

	if (!t)
		die("calloc", -ENOMEM);
	for (i = 0; i < RANGE_BLOCKS; i++) {
		unsigned int from = i * n / RANGE_BLOCKS, m = (i + 1) * n / RANGE_BLOCKS - from;
		double x;

		memcpy(t, &a[from], m * sizeof(double));
		qsort(t, m, sizeof(double), cmp_double);
		x = pctf(t, m, fa);
		memcpy(t, &b[from], m * sizeof(double));
		qsort(t, m, sizeof(double), cmp_double);
		out[i] = x / pctf(t, m, fb);
	}
	free(t);
}

/* COPY_SUBMIT and FENCE_WAIT (ABI 3; 0 or -errno). */
static int copy_submit(int fd, __u32 eng, __u32 q, __u64 *fence)
{
	struct neuron_udma_copy_submit s = { .engine = eng, .queue = q };
	int ret = udma_ioc(fd, NEURON_UDMA_COPY_SUBMIT, &s);

	if (!ret && fence)
		*fence = s.fence;
	return ret;
}

static int fence_wait(int fd, __u32 eng, __u32 q, __u64 fence)
{
	struct neuron_udma_fence_wait w = { .engine = eng, .queue = q, .fence = fence };

	return udma_ioc(fd, NEURON_UDMA_FENCE_WAIT, &w);
}

/*
 * Kinds of latency sample: the floor, the copy with START + COPY_WAIT, the copy with COPY_WAIT
 * only, the copy with COPY_SUBMIT + FENCE_WAIT.
 */
enum { K_FLOOR, K_START_WAIT, K_WAIT, K_SUBMIT_FWAIT, K_NUM };

/*
 * @n rounds on queue (@eng, @q) of file @fd, each one sample of each of the first @nkinds kinds,
 * the order rotating from round to round (no kind always follows the same one):
 *   K_FLOOR       PREPARE_ONE + COPY_START (1, 1), timed; then an untimed COPY_WAIT retires the
 *                 pair (the queue is idle again before the next sample);
 *   K_START_WAIT  PREPARE_ONE + COPY_START (1, 1) + COPY_WAIT: the floor's calls, then the wait
 *                 (which appends the marker pair, rings for it and waits);
 *   K_WAIT        PREPARE_ONE + COPY_WAIT (the wait rings for the data and the marker pair at once);
 *   K_SUBMIT_FWAIT PREPARE_ONE + COPY_SUBMIT + FENCE_WAIT (the submit rings once for the data and
 *                 its marker, the wait only waits): the runtime's way of a small copy.
 * Copy i % PER_SUB of @copies in round i. Seconds in out[kind][round].
 */
static void lat_samples(int fd, __u32 eng, __u32 q, const struct neuron_udma_copy *copies,
			unsigned int n, unsigned int nkinds, double *out[K_NUM])
{
	unsigned int i, k;

	for (i = 0; i < n; i++)
		for (k = 0; k < nkinds; k++) {
			unsigned int kind = (i + k) % nkinds;
			double t0, t1;
			int ret;

			t0 = now();
			ret = prep_one(fd, eng, q, copies[i % PER_SUB]);
			if (!ret && kind == K_SUBMIT_FWAIT) {
				__u64 fence = 0;

				ret = copy_submit(fd, eng, q, &fence);
				if (!ret)
					ret = fence_wait(fd, eng, q, fence);
				t1 = now();
				if (ret)
					die("latency sample", ret);
				out[kind][i] = t1 - t0;
				continue;
			}
			if (!ret && kind != K_WAIT)
				ret = copy_start(fd, eng, q, 1, 1);
			if (!ret && kind != K_FLOOR)
				ret = copy_wait(fd, eng, q, 0, NULL);
			t1 = now();
			if (!ret && kind == K_FLOOR)
				ret = copy_wait(fd, eng, q, 0, NULL);
			if (ret)
				die("latency sample", ret);
			out[kind][i] = t1 - t0;
		}
}

static double **lat_arrays(unsigned int n)
{
	double **a = calloc(K_NUM, sizeof(*a));
	unsigned int k;

	if (!a)
		die("calloc", -ENOMEM);
	for (k = 0; k < K_NUM; k++) {
		a[k] = calloc(n, sizeof(double));
		if (!a[k])
			die("calloc", -ENOMEM);
	}
	return a;
}

static void lat_free(double **a)
{
	unsigned int k;

	for (k = 0; k < K_NUM; k++)
		free(a[k]);
	free(a);
}

/*
 * The small-copy latency against a floor measured in the same phase: lat_runs rounds of the
 * four kinds of lat_samples() on engine 0 queue 1, interleaved. The floor (PREPARE_ONE +
 * START) is the copy's own submission: the same two system calls, the same descriptor pair and
 * the same two doorbell writes, without the wait, so every copy sample costs at least one floor
 * sample's work. The guest's load average is read before and after.
 */
static void bench_latency_floor(void)
{
	double **s = lat_arrays(lat_runs);
	double *fl, *sw, *w, *sf, f50, r50[RANGE_BLOCKS], r99[RANGE_BLOCKS];
	char how[1100], howr[1250], extra[160], l0[40], l1[40];
	struct qctx c;
	unsigned int i;
	int ret;

	qctx_open(&c, 0, 1);
	for (i = 0; i < 100; i++) {	/* warm-up */
		ret = copy_sync(c.fd, 0, 1, c.copies[0]);
		if (ret)
			die("warm-up copy", ret);
	}
	loadavg(l0, sizeof(l0));
	lat_samples(c.fd, 0, 1, c.copies, lat_runs, K_NUM, s);
	loadavg(l1, sizeof(l1));
	qctx_close(&c);
	fl = s[K_FLOOR];
	sw = s[K_START_WAIT];
	w = s[K_WAIT];
	sf = s[K_SUBMIT_FWAIT];
	block_ratios(sf, 0.5, fl, 0.5, lat_runs, r50);
	block_ratios(sf, 0.99, sf, 0.5, lat_runs, r99);
	qsort(fl, lat_runs, sizeof(double), cmp_double);
	qsort(sw, lat_runs, sizeof(double), cmp_double);
	qsort(w, lat_runs, sizeof(double), cmp_double);
	qsort(sf, lat_runs, sizeof(double), cmp_double);
	f50 = pctf(fl, lat_runs, 0.5);
	snprintf(extra, sizeof(extra), "\"load_start\":\"%s\",\"load_end\":\"%s\"", l0, l1);
	snprintf(how, sizeof(how),
		 "%u rounds on engine 0 queue 1, each one sample of four kinds, interleaved (order "
		 "rotating): PREPARE_ONE + START (1,1) (the floor: the copy's two system calls, pair and "
		 "two doorbells without the wait; an untimed COPY_WAIT retires it), PREPARE_ONE + START "
		 "+ WAIT, PREPARE_ONE + WAIT, PREPARE_ONE + COPY_SUBMIT + FENCE_WAIT; 4 B host->host; "
		 "floor p50 %.1f, p99 %.1f, min %.1f, max %.1f us; START + WAIT p50 %.1f, p99 %.1f, "
		 "p99.9 %.1f us; WAIT only p50 %.1f, p99 %.1f, p99.9 %.1f us; SUBMIT + FENCE_WAIT p50 "
		 "%.1f, p99 %.1f, p99.9 %.1f us; guest load average %s before, %s after",
		 lat_runs, f50 * 1e6, pctf(fl, lat_runs, 0.99) * 1e6, fl[0] * 1e6, fl[lat_runs - 1] * 1e6,
		 pctf(sw, lat_runs, 0.5) * 1e6, pctf(sw, lat_runs, 0.99) * 1e6,
		 pctf(sw, lat_runs, 0.999) * 1e6, pctf(w, lat_runs, 0.5) * 1e6,
		 pctf(w, lat_runs, 0.99) * 1e6, pctf(w, lat_runs, 0.999) * 1e6,
		 pctf(sf, lat_runs, 0.5) * 1e6, pctf(sf, lat_runs, 0.99) * 1e6,
		 pctf(sf, lat_runs, 0.999) * 1e6, l0, l1);
	result_x("latency floor (PREPARE_ONE + START) p50", f50 * 1e6, "us", fl[0] * 1e6, how, extra);
	result_x("latency floor (PREPARE_ONE + START) p99", pctf(fl, lat_runs, 0.99) * 1e6, "us",
		 f50 * 1e6, how, extra);
	result_x("latency floor (PREPARE_ONE + START) min", fl[0] * 1e6, "us", f50 * 1e6, how, extra);
	result_x("latency floor (PREPARE_ONE + START) max", fl[lat_runs - 1] * 1e6, "us", f50 * 1e6,
		 how, extra);
	result_x("latency 4 B copy (START + WAIT) p50 vs same-phase floor", pctf(sw, lat_runs, 0.5) * 1e6,
		 "us", f50 * 1e6, how, extra);
	result_x("latency 4 B copy (START + WAIT) p99 vs p50", pctf(sw, lat_runs, 0.99) * 1e6, "us",
		 pctf(sw, lat_runs, 0.5) * 1e6, how, extra);
	result_x("latency 4 B copy (START + WAIT) p99.9 vs p50", pctf(sw, lat_runs, 0.999) * 1e6, "us",
		 pctf(sw, lat_runs, 0.5) * 1e6, how, extra);
	result_x("latency 4 B copy (WAIT only) p50 vs same-phase floor", pctf(w, lat_runs, 0.5) * 1e6,
		 "us", f50 * 1e6, how, extra);
	result_x("latency 4 B copy (WAIT only) p99 vs p50", pctf(w, lat_runs, 0.99) * 1e6, "us",
		 pctf(w, lat_runs, 0.5) * 1e6, how, extra);
	snprintf(howr, sizeof(howr), "%s; ratio: the median of the ratios of %u consecutive blocks "
		 "of rounds, min and max beside it", how, RANGE_BLOCKS);
	result_range("latency 4 B copy (SUBMIT + FENCE_WAIT) p50 vs same-phase floor",
		     pctf(sf, lat_runs, 0.5) * 1e6, "us", f50 * 1e6, r50, RANGE_BLOCKS, howr, extra);
	result_range("latency 4 B copy (SUBMIT + FENCE_WAIT) p99 vs p50", pctf(sf, lat_runs, 0.99) * 1e6,
		     "us", pctf(sf, lat_runs, 0.5) * 1e6, r99, RANGE_BLOCKS, howr, extra);
	lat_free(s);
}

/*
 * One point of the latency-scale rows: scale_runs rounds of a floor and a START + WAIT sample
 * (interleaved) of @copy on queue (@eng, @q); the p50 and p99 rows, against those of the first
 * point (@base50, @base99: set when zero).
 */
static void scale_point(int fd, __u32 eng, __u32 q, struct neuron_udma_copy copy, unsigned int x,
			const char *what, const char *setup, double *base50, double *base99)
{
	double **s = lat_arrays(scale_runs);
	struct neuron_udma_copy *copies = calloc(PER_SUB, sizeof(*copies));
	double p50, p99, f50;
	char name[96], how[700], extra[200], l0[40], l1[40];
	unsigned int i;

	if (!copies)
		die("calloc", -ENOMEM);
	for (i = 0; i < PER_SUB; i++)
		copies[i] = copy;
	loadavg(l0, sizeof(l0));
	lat_samples(fd, eng, q, copies, scale_runs, 2, s);
	loadavg(l1, sizeof(l1));
	qsort(s[K_FLOOR], scale_runs, sizeof(double), cmp_double);
	qsort(s[K_START_WAIT], scale_runs, sizeof(double), cmp_double);
	f50 = pctf(s[K_FLOOR], scale_runs, 0.5) * 1e6;
	p50 = pctf(s[K_START_WAIT], scale_runs, 0.5) * 1e6;
	p99 = pctf(s[K_START_WAIT], scale_runs, 0.99) * 1e6;
	if (!*base50) {
		*base50 = p50;
		*base99 = p99;
	}
	snprintf(how, sizeof(how),
		 "%u rounds of PREPARE_ONE + START + WAIT of one 4 B copy (%s), interleaved with its "
		 "floor PREPARE_ONE + START (p50 %.1f us here); guest load average %s before, %s after; "
		 "baseline: the same percentile with 1 %s",
		 scale_runs, setup, f50, l0, l1, what);
	snprintf(extra, sizeof(extra),
		 "\"floor_us\":%.6g,\"load_start\":\"%s\",\"load_end\":\"%s\"", f50, l0, l1);
	snprintf(name, sizeof(name), "latency scale: p50, %u %s%s open", x, what, x == 1 ? "" : "s");
	result_x(name, p50, "us", *base50, how, extra);
	snprintf(name, sizeof(name), "latency scale: p99, %u %s%s open", x, what, x == 1 ? "" : "s");
	result_x(name, p99, "us", *base99, how, extra);
	fprintf(stderr, "udma_bench: latency, %u %s(s): p50 %.1f us, p99 %.1f us, floor p50 %.1f us\n",
		x, what, p50, p99, f50);
	free(copies);
	lat_free(s);
}

/*
 * Latency against the file's open buffers: one file, queue (0, 1), SMALL_BUF-byte host buffers
 * allocated one after the other up to each count of scale_bufs; the copy goes from the first
 * buffer to the last one allocated (with 1 buffer, within it: offset 0 to 2048). Then against
 * the queues initialised: a new file with the 2 buffers and queue (0, 1) of the copy, and queue 1
 * of further host-connected engines (INFO's host_engines; another queue of an engine when they
 * run out, a taken or reserved queue skipped) up to each count of scale_queues.
 */
static void bench_latency_scale(void)
{
	unsigned int nbufs = sizeof(scale_bufs) / sizeof(scale_bufs[0]);
	unsigned int maxb = scale_bufs[nbufs - 1], have = 0, p, i;
	struct neuron_udma_info info;
	double b50 = 0, b99 = 0;
	struct ubuf *bufs = calloc(maxb, sizeof(*bufs));
	struct { __u32 eng, q; } *extra_q;
	unsigned int nq = 1, maxq = scale_queues[sizeof(scale_queues) / sizeof(scale_queues[0]) - 1];
	char setup[200];
	struct qctx c;
	int fd, ret;

	if (!bufs)
		die("calloc", -ENOMEM);
	fd = udma_open();
	if (fd < 0)
		die("open " UDMA_DEV, -errno);
	ret = queue_init(fd, 0, 1, RING, RING);
	if (ret)
		die("QUEUE_INIT", ret);
	for (p = 0; p < nbufs; p++) {
		struct neuron_udma_copy cp;

		if (scale_bufs[p] > file_max_buffers(fd)) {
			fprintf(stderr, "udma_bench: a file may hold %u buffers (INFO max_buffers): the "
				"latency-scale points from %u buffers are left out\n", file_max_buffers(fd),
				scale_bufs[p]);
			break;
		}
		for (; have < scale_bufs[p]; have++) {
			ret = ubuf_host(fd, SMALL_BUF, &bufs[have]);
			if (ret)
				die("MEM_ALLOC (open buffers)", ret);
		}
		if (have == 1)
			cp = ucopy(&bufs[0], 0, &bufs[0], SMALL_BUF / 2, COPY_SIZE);
		else
			cp = ucopy(&bufs[0], 0, &bufs[have - 1], 0, COPY_SIZE);
		for (i = 0; i < 50; i++) {	/* warm-up */
			ret = copy_sync(fd, 0, 1, cp);
			if (ret)
				die("warm-up copy", ret);
		}
		snprintf(setup, sizeof(setup),
			 "engine 0 queue 1, %u host buffer%s of %u B open in the file, the copy %s", have,
			 have == 1 ? "" : "s", SMALL_BUF, have == 1 ? "within it, offset 0 to 2048" :
			 "from the first buffer allocated to the last");
		scale_point(fd, 0, 1, cp, have, "buffer", setup, &b50, &b99);
	}
	queue_release(fd, 0, 1);
	for (i = 0; i < have; i++)
		ubuf_free(fd, &bufs[i]);
	close(fd);
	free(bufs);

	qctx_open(&c, 0, 1);
	ret = udma_info(c.fd, &info);
	if (ret)
		die("INFO", ret);
	extra_q = calloc(maxq, sizeof(*extra_q));
	if (!extra_q)
		die("calloc", -ENOMEM);
	b50 = b99 = 0;
	for (p = 0; p < sizeof(scale_queues) / sizeof(scale_queues[0]); p++) {
		__u32 q, e;

		for (q = 1; nq < scale_queues[p] && q <= info.queues_per_engine; q++)
			for (e = 1; nq < scale_queues[p] && e < info.engines; e++) {
				__u32 qq = q % info.queues_per_engine;	/* 1 .. 15, then 0 */

				if (!(info.host_engines[e / 64] >> (e % 64) & 1))
					continue;
				/* Fails for a queue taken already (by this file too) or reserved. */
				if (queue_init(c.fd, e, qq, RING, RING))
					continue;
				extra_q[nq - 1].eng = e;
				extra_q[nq - 1].q = qq;
				nq++;
			}
		if (nq < scale_queues[p]) {
			fprintf(stderr, "udma_bench: only %u queues could be initialised, not %u\n", nq,
				scale_queues[p]);
			break;
		}
		for (i = 0; i < 50; i++) {	/* warm-up */
			ret = copy_sync(c.fd, 0, 1, c.copies[0]);
			if (ret)
				die("warm-up copy", ret);
		}
		snprintf(setup, sizeof(setup),
			 "engine 0 queue 1, %u queue%s (%u-slot rings) initialised in the file (the others: "
			 "queue 1 of the next host-connected engines), 2 host buffers", nq,
			 nq == 1 ? "" : "s", RING);
		scale_point(c.fd, 0, 1, c.copies[0], nq, "queue", setup, &b50, &b99);
	}
	for (i = 0; i + 1 < nq; i++)
		queue_release(c.fd, extra_q[i].eng, extra_q[i].q);
	free(extra_q);
	qctx_close(&c);
}

/* ---- ABI 3 calls of the rows below (0 or -errno) ---- */

/* QUEUE_EVENTS into @ev (at most @max records): the number of records, or -errno. */
static int queue_events(int fd, struct neuron_udma_queue_event *ev, __u32 max)
{
	struct neuron_udma_events e = { .events = (uintptr_t)ev, .max = max };
	int ret = udma_ioc(fd, NEURON_UDMA_QUEUE_EVENTS, &e);

	return ret ? ret : (int)e.count;
}

static int udma_memset(int fd, const struct ubuf *b, __u64 size, __u32 value)
{
	struct neuron_udma_memset m = { .handle = b->handle, .size = size, .value = value };

	return udma_ioc(fd, NEURON_UDMA_MEMSET, &m);
}

/* ---- MEM_ALLOC of fragmented device memory ---- */

/*
 * Median microseconds of HOLE_REPS MEM_ALLOCs of device memory that must fail (2 slots: no hole
 * holds them) and of HOLE_REPS that must succeed (1 slot, freed again untimed), interleaved.
 */
static void holes_measure(int fd, __u64 slot, double *fail_us, double *ok_us)
{
	double *f = calloc(HOLE_REPS, sizeof(double)), *o = calloc(HOLE_REPS, sizeof(double));
	struct ubuf b;
	unsigned int r;
	double t0;
	int ret;

	if (!f || !o)
		die("calloc", -ENOMEM);
	for (r = 0; r < HOLE_REPS; r++) {
		t0 = now();
		ret = ubuf_dev(fd, 2 * slot, &b);
		f[r] = now() - t0;
		if (ret != -ENOMEM)
			die("MEM_ALLOC of 2 slots (expected ENOMEM: no hole holds them)", ret ? ret : -EPROTO);
		t0 = now();
		ret = ubuf_dev(fd, slot, &b);
		o[r] = now() - t0;
		if (ret)
			die("MEM_ALLOC of 1 slot", ret);
		ret = ubuf_free(fd, &b);
		if (ret)
			die("MEM_FREE", ret);
	}
	*fail_us = median(f, HOLE_REPS) * 1e6;
	*ok_us = median(o, HOLE_REPS) * 1e6;
	free(f);
	free(o);
}

/*
 * MEM_ALLOC of device memory with HOLES holes against the same with 1 hole: one file fills device
 * memory with buffers of one slot (device_mem_size / HOLE_SLOTS rounded down to 4 KiB, so that at
 * least HOLE_SLOTS fit) until ENOMEM, then frees one buffer of every other slot of the first
 * HOLE_SLOTS (1 hole), measures, frees the other HOLES - 1 of them (HOLES one-slot holes, no two
 * adjacent) and measures again; then fills the holes again (best fit: exactly the freed slots)
 * and repeats, HOLE_ROUNDS times in all; the best median of each state counts. The failing
 * MEM_ALLOC asks for 2 slots, which no hole holds; the succeeding one for 1 slot (its scrub
 * included, the same in both states).
 */
static void bench_holes(void)
{
	unsigned int max = 0, n = 0, nh, i, k, round;
	double f1 = 0, o1 = 0, fn = 0, on = 0, f, o, rf[HOLE_ROUNDS], ro[HOLE_ROUNDS];
	char name[96], how[1200], extra[160], l0[40], l1[40], rounds[2][HOLE_ROUNDS * 40];
	size_t rl[2] = { 0, 0 };
	struct neuron_udma_info info;
	__u64 slot, *h, *hole;
	struct ubuf b;
	int fd, ret;

	fd = udma_open();
	if (fd < 0)
		die("open " UDMA_DEV, -errno);
	ret = udma_info(fd, &info);
	if (ret)
		die("INFO", ret);
	slot = (info.device_mem_size / HOLE_SLOTS) & ~4095ULL;
	if (slot < 4096)
		slot = 4096;
	/* A buffer more than the fill for the succeeding MEM_ALLOC. */
	max = file_max_buffers(fd) - 1;
	if (info.device_mem_size / slot < max)
		max = info.device_mem_size / slot;
	h = calloc(max, sizeof(*h));
	hole = calloc(HOLES, sizeof(*hole));
	if (!h || !hole)
		die("calloc", -ENOMEM);
	loadavg(l0, sizeof(l0));
	for (ret = 0; n < max; n++) {
		ret = ubuf_dev(fd, slot, &b);
		if (ret)
			break;
		h[n] = b.handle;
	}
	if (ret && ret != -ENOMEM)
		die("MEM_ALLOC (filling device memory)", ret);
	nh = n / 2 < HOLES ? n / 2 : HOLES;
	if (nh < 2)
		die("MEM_ALLOC: device memory too small for the holes rows", -ENOSPC);
	if (nh < HOLES)
		fprintf(stderr, "udma_bench: %u slots of %llu KiB fit in device memory: %u holes, not %u\n",
			n, (unsigned long long)slot >> 10, nh, HOLES);
	/* The hole set: every other slot, the middle one first (the 1-hole state). */
	for (k = 0; k < nh; k++)
		hole[k] = h[2 * ((k + nh / 2) % nh) + 1];
	for (round = 0; round < HOLE_ROUNDS; round++) {
		ret = mem_free(fd, hole[0]);
		if (ret)
			die("MEM_FREE (1 hole)", ret);
		holes_measure(fd, slot, &f, &o);
		f1 = round && f1 < f ? f1 : f;
		o1 = round && o1 < o ? o1 : o;
		rf[round] = f;
		ro[round] = o;
		rl[0] += snprintf(rounds[0] + rl[0], sizeof(rounds[0]) - rl[0], "%s%.1f/", round ? ", " : "", f);
		rl[1] += snprintf(rounds[1] + rl[1], sizeof(rounds[1]) - rl[1], "%s%.1f/", round ? ", " : "", o);
		for (k = 1; k < nh; k++) {
			ret = mem_free(fd, hole[k]);
			if (ret)
				die("MEM_FREE (holes)", ret);
		}
		holes_measure(fd, slot, &f, &o);
		fn = round && fn < f ? fn : f;
		on = round && on < o ? on : o;
		rf[round] = f / rf[round];
		ro[round] = o / ro[round];
		rl[0] += snprintf(rounds[0] + rl[0], sizeof(rounds[0]) - rl[0], "%.1f", f);
		rl[1] += snprintf(rounds[1] + rl[1], sizeof(rounds[1]) - rl[1], "%.1f", o);
		fprintf(stderr, "udma_bench: MEM_ALLOC round %u: failing %s us (1 hole / %u holes), "
			"succeeding %s us\n", round, rounds[0], nh, rounds[1]);
		if (round + 1 == HOLE_ROUNDS)
			break;
		/* Best fit puts each one-slot buffer into a hole: the same hole set next round. */
		for (k = 0; k < nh; k++) {
			ret = ubuf_dev(fd, slot, &b);
			if (ret)
				die("MEM_ALLOC (filling the holes again)", ret);
			hole[k] = b.handle;
		}
	}
	loadavg(l1, sizeof(l1));
	close(fd);	/* frees every buffer */
	snprintf(extra, sizeof(extra), "\"load_start\":\"%s\",\"load_end\":\"%s\",\"holes\":%u", l0, l1, nh);
	for (i = 0; i < 2; i++) {
		snprintf(how, sizeof(how),
			 "one file fills device memory (%llu MiB) with %u buffers of %llu KiB "
			 "(device_mem_size / %u rounded down to 4 KiB), then frees every other one of the "
			 "first %u: %u one-slot holes, no two adjacent; median of %u MEM_ALLOCs of %s, "
			 "interleaved with %u of %s; best of %u rounds (the holes filled again between "
			 "them; medians per round, 1 hole / %u holes: %s us); baseline: the same with 1 "
			 "hole (the middle one of the set); ratio: the median of the rounds' ratios, min and "
			 "max beside it; guest load average %s before, %s after",
			 (unsigned long long)info.device_mem_size >> 20, n,
			 (unsigned long long)slot >> 10, HOLE_SLOTS, 2 * nh, nh, HOLE_REPS,
			 i ? "1 slot, which succeeds (and its scrub), freed again untimed" :
			 "2 slots, which fail with ENOMEM (no hole holds them)",
			 HOLE_REPS, i ? "2 slots (failing)" : "1 slot (succeeding)", HOLE_ROUNDS, nh,
			 rounds[i], l0, l1);
		snprintf(name, sizeof(name), "MEM_ALLOC %s, %u holes vs 1 hole", i ? "succeeding" : "failing",
			 nh);
		result_range(name, i ? on : fn, "us", i ? o1 : f1, i ? ro : rf, HOLE_ROUNDS, how, extra);
	}
	free(hole);
	free(h);
}

/* ---- MEMSET against MEMCPY, striped MEMCPY against one engine ---- */

/* One side of a fill or stripe row: its calls on @src and @dst of @size bytes; 0 or -errno. */
typedef int (*side_fn)(int fd, const struct ubuf *src, const struct ubuf *dst, __u64 size);

/*
 * FILL_REPS rounds of the two sides @run[0] and @run[1], which goes first alternating (side 0
 * in even rounds): each round's time per side in @t, the fastest in @best. Dies naming @what of
 * the side that fails.
 */
static void alternate_rounds(int fd, const struct ubuf *src, const struct ubuf *dst, __u64 size,
			     const side_fn run[2], const char *const what[2],
			     double t[2][FILL_REPS], double best[2])
{
	unsigned int r, k;
	double t0;
	int ret;

	for (r = 0; r < FILL_REPS; r++)
		for (k = 0; k < 2; k++) {
			unsigned int side = (r + k) % 2;

			t0 = now();
			ret = run[side](fd, src, dst, size);
			t[side][r] = now() - t0;
			if (ret)
				die(what[side], ret);
			if (!r || t[side][r] < best[side])
				best[side] = t[side][r];
		}
}

static int fill_side(int fd, const struct ubuf *src, const struct ubuf *dst, __u64 size)
{
	(void)src;
	return udma_memset(fd, dst, size, FILL_VALUE);
}

static int copy_side(int fd, const struct ubuf *src, const struct ubuf *dst, __u64 size)
{
	return udma_memcpy(fd, src, 0, dst, 0, size, 0);
}

/*
 * MEMSET of @size bytes of a buffer of @type against MEMCPY of the same bytes into it from another
 * buffer of that type, FILL_REPS runs each (alternating which goes first), the fastest of each.
 * A host buffer is checked after the last MEMSET.
 */
static void fill_row(int fd, __u32 type, __u64 size, const char *sz)
{
	const char *where = type == NEURON_UDMA_MEM_HOST ? "host" : "HBM";
	static const side_fn run[2] = { fill_side, copy_side };
	static const char *const what[2] = { "MEMSET", "MEMCPY" };
	double best[2] = { 0, 0 }, t[2][FILL_REPS], ratio[FILL_REPS];
	char name[96], how[720], extra[120], l0[40], l1[40];
	struct ubuf src, dst;
	unsigned int r;
	size_t i;
	int ret;

	ret = ubuf_alloc(fd, type, size, &src);
	if (!ret)
		ret = ubuf_alloc(fd, type, size, &dst);
	if (ret)
		die("MEM_ALLOC (fill rows)", ret);
	if (src.map)
		fill_pattern(src.map, size, 7);
	/* Warm-up: the fill block of the value, the buffers' pages. */
	ret = udma_memset(fd, &dst, size, FILL_VALUE);
	if (!ret)
		ret = udma_memcpy(fd, &src, 0, &dst, 0, size, 0);
	if (ret)
		die("warm-up MEMSET / MEMCPY", ret);
	loadavg(l0, sizeof(l0));
	alternate_rounds(fd, &src, &dst, size, run, what, t, best);
	/* Rate over rate: the MEMCPY time over the MEMSET time of the same round. */
	for (r = 0; r < FILL_REPS; r++)
		ratio[r] = t[1][r] / t[0][r];
	loadavg(l1, sizeof(l1));
	if (dst.map) {
		ret = udma_memset(fd, &dst, size, FILL_VALUE);
		if (ret)
			die("MEMSET", ret);
		for (i = 0; i < size; i++)
			if (dst.map[i] != FILL_VALUE)
				die("MEMSET left a byte other than its value", -EIO);
	}
	ubuf_free(fd, &src);
	ubuf_free(fd, &dst);
	snprintf(name, sizeof(name), "MEMSET %s %s vs MEMCPY %s->%s", sz, where, where, where);
	snprintf(how, sizeof(how),
		 "MEMSET of %s of a %s buffer (value 0x%02x; the driver's shared H2T queue, each "
		 "descriptor reading the device's fill block of that value) %.3f ms, fastest of %u, "
		 "alternating with the baseline: MEMCPY of the same bytes into the same buffer from "
		 "another %s buffer (same queue) %.3f ms, fastest of %u; ratio: the median of the %u "
		 "rounds' ratios, min and max beside it; guest load average %s before, %s after",
		 sz, where, FILL_VALUE, best[0] * 1e3, FILL_REPS, where, best[1] * 1e3, FILL_REPS,
		 FILL_REPS, l0, l1);
	snprintf(extra, sizeof(extra), "\"load_start\":\"%s\",\"load_end\":\"%s\"", l0, l1);
	result_range(name, size / best[0], "B/s", size / best[1], ratio, FILL_REPS, how, extra);
	fprintf(stderr, "udma_bench: %s: MEMSET %.1f MB/s, MEMCPY %.1f MB/s\n", name,
		size / best[0] / 1e6, size / best[1] / 1e6);
}

/*
 * Striped MEMCPY against one engine, call for call: STRIPE_CALLS MEMCPYs of 4 MiB HBM->HBM (at
 * the threshold: one part per H2T engine, all at once) against STRIPE_CALLS MEMCPYs of 4 MiB -
 * 64 KiB (below it: the shared H2T queue alone), the same number of calls so that the per-call
 * costs weigh alike; FILL_REPS rounds alternating which goes first. The ratio is the striped
 * rate over the one-engine rate of the same round.
 */
#define STRIPE_CALL (4U << 20)
#define ONE_ENGINE_CALL (STRIPE_CALL - (64U << 10))
#define STRIPE_CALLS 16U

/* STRIPE_CALLS MEMCPYs of @len bytes each, at STRIPE_CALL intervals; 0 or -errno. */
static int copy_calls(int fd, const struct ubuf *src, const struct ubuf *dst, __u32 len)
{
	unsigned int p;
	int ret = 0;

	for (p = 0; p < STRIPE_CALLS && !ret; p++)
		ret = udma_memcpy(fd, src, (__u64)p * STRIPE_CALL, dst, (__u64)p * STRIPE_CALL, len,
				  0);
	return ret;
}

static int striped_side(int fd, const struct ubuf *src, const struct ubuf *dst, __u64 size)
{
	(void)size;
	return copy_calls(fd, src, dst, STRIPE_CALL);
}

static int one_engine_side(int fd, const struct ubuf *src, const struct ubuf *dst, __u64 size)
{
	(void)size;
	return copy_calls(fd, src, dst, ONE_ENGINE_CALL);
}

static void stripe_row(int fd)
{
	static const side_fn run[2] = { striped_side, one_engine_side };
	static const char *const what[2] = { "MEMCPY (stripe row)", "MEMCPY (stripe row)" };
	const __u64 size = (__u64)STRIPE_CALL * STRIPE_CALLS;
	double best[2] = { 0, 0 }, t[2][FILL_REPS], ratio[FILL_REPS];
	char how[720], extra[120], l0[40], l1[40];
	struct neuron_udma_info info;
	struct ubuf src, dst;
	unsigned int r, engines;
	int ret;

	ret = udma_info(fd, &info);
	if (ret)
		die("INFO", ret);
	engines = info.generation == NEURON_UDMA_GEN_V2 ? 2 : 4;
	ret = ubuf_alloc(fd, NEURON_UDMA_MEM_DEVICE, size, &src);
	if (!ret)
		ret = ubuf_alloc(fd, NEURON_UDMA_MEM_DEVICE, size, &dst);
	if (ret)
		die("MEM_ALLOC (stripe row)", ret);
	/* Warm-up: both paths once. */
	ret = udma_memcpy(fd, &src, 0, &dst, 0, STRIPE_CALL, 0);
	if (!ret)
		ret = udma_memcpy(fd, &src, 0, &dst, 0, ONE_ENGINE_CALL, 0);
	if (ret)
		die("warm-up MEMCPY", ret);
	loadavg(l0, sizeof(l0));
	alternate_rounds(fd, &src, &dst, size, run, what, t, best);
	/* Rate over rate: the calls move 4 MiB and 4 MiB - 64 KiB each. */
	for (r = 0; r < FILL_REPS; r++)
		ratio[r] = (t[1][r] / ONE_ENGINE_CALL) / (t[0][r] / STRIPE_CALL);
	loadavg(l1, sizeof(l1));
	ubuf_free(fd, &src);
	ubuf_free(fd, &dst);
	snprintf(how, sizeof(how),
		 "%u MEMCPYs of 4 MiB HBM->HBM, each striped over the %u H2T engines (one part each, "
		 "at once) %.3f ms, fastest of %u, alternating with the baseline: %u MEMCPYs of %u "
		 "KiB (below the 4 MiB threshold: the shared H2T queue alone) %.3f ms, fastest of %u; "
		 "ratio: the striped rate over the one-engine rate per round, median and min-max; the "
		 "ideal is the engine count; guest load average %s before, %s after",
		 STRIPE_CALLS, engines, best[0] * 1e3, FILL_REPS, STRIPE_CALLS,
		 ONE_ENGINE_CALL >> 10, best[1] * 1e3, FILL_REPS, l0, l1);
	snprintf(extra, sizeof(extra),
		 "\"load_start\":\"%s\",\"load_end\":\"%s\",\"engines\":%u", l0, l1, engines);
	result_range("MEMCPY 16 x 4M HBM->HBM: striped vs one engine", size / best[0], "B/s",
		     (double)ONE_ENGINE_CALL * STRIPE_CALLS / best[1], ratio, FILL_REPS, how,
		     extra);
	fprintf(stderr, "udma_bench: MEMCPY striped %.1f MB/s, one engine %.1f MB/s\n",
		size / best[0] / 1e6, (double)ONE_ENGINE_CALL * STRIPE_CALLS / best[1] / 1e6);
}

static void bench_fill(void)
{
	int fd = udma_open();

	if (fd < 0)
		die("open " UDMA_DEV, -errno);
	fill_row(fd, NEURON_UDMA_MEM_HOST, 4U << 20, "4M");
	fill_row(fd, NEURON_UDMA_MEM_DEVICE, 4U << 20, "4M");
	fill_row(fd, NEURON_UDMA_MEM_DEVICE, 64U << 20, "64M");
	stripe_row(fd);
	close(fd);
}

/* ---- io_uring (raw system calls: the bench links no library) ---- */

struct uring {
	int fd;
	unsigned int *sq_tail, *sq_mask, *sq_array;
	unsigned int *cq_head, *cq_tail, *cq_mask;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
	void *rings;
	size_t rings_len, sqes_len;
};

static int uring_open_flags(struct uring *u, unsigned int entries, __u32 flags)
{
	struct io_uring_params p;
	char *r;

	memset(&p, 0, sizeof(p));
	memset(u, 0, sizeof(*u));
	p.flags = flags;
	u->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
	if (u->fd < 0)
		return -errno;
	if (!(p.features & IORING_FEAT_SINGLE_MMAP)) {
		close(u->fd);
		return -EOPNOTSUPP;
	}
	u->rings_len = p.sq_off.array + p.sq_entries * sizeof(__u32);
	if (u->rings_len < p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe))
		u->rings_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	u->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
	r = mmap(NULL, u->rings_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
		 IORING_OFF_SQ_RING);
	u->sqes = mmap(NULL, u->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd,
		       IORING_OFF_SQES);
	if (r == MAP_FAILED || u->sqes == MAP_FAILED) {
		close(u->fd);
		return -ENOMEM;
	}
	u->rings = r;
	u->sq_tail = (unsigned int *)(r + p.sq_off.tail);
	u->sq_mask = (unsigned int *)(r + p.sq_off.ring_mask);
	u->sq_array = (unsigned int *)(r + p.sq_off.array);
	u->cq_head = (unsigned int *)(r + p.cq_off.head);
	u->cq_tail = (unsigned int *)(r + p.cq_off.tail);
	u->cq_mask = (unsigned int *)(r + p.cq_off.ring_mask);
	u->cqes = (struct io_uring_cqe *)(r + p.cq_off.cqes);
	return 0;
}

static int uring_open(struct uring *u, unsigned int entries)
{
	return uring_open_flags(u, entries, 0);
}

static void uring_close(struct uring *u)
{
	munmap(u->sqes, u->sqes_len);
	munmap(u->rings, u->rings_len);
	close(u->fd);
}

/* Queues (does not submit) one NEURON_UDMA_URING_COPY SQE of @n copies at @c. */
static void uring_queue_copy(struct uring *u, int fd, __u32 eng, __u32 q,
			     const struct neuron_udma_copy *c, __u32 n)
{
	unsigned int tail = *u->sq_tail, idx = tail & *u->sq_mask;
	struct io_uring_sqe *sqe = &u->sqes[idx];
	struct neuron_udma_uring_copy uc = {
		.engine = (__u16)eng, .queue = (__u16)q, .count = n, .copies = (uintptr_t)c,
	};

	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = fd;
	sqe->cmd_op = NEURON_UDMA_URING_COPY;
	memcpy((char *)sqe + offsetof(struct io_uring_sqe, addr3), &uc, sizeof(uc));
	u->sq_array[idx] = idx;
	__atomic_store_n(u->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

/* Submits the queued SQEs (io_uring_enter): how many it took, or -errno. */
static int uring_submit(struct uring *u, unsigned int n)
{
	int ret = (int)syscall(__NR_io_uring_enter, u->fd, n, 0, 0, NULL, 0);

	return ret < 0 ? -errno : ret;
}

/* Reaps @n CQEs, waiting for them: 0, or the first error (a CQE's res, or -errno). */
static int uring_reap(struct uring *u, unsigned int n)
{
	int err = 0;

	while (n) {
		unsigned int head = *u->cq_head;
		unsigned int tail = __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE);

		if (head == tail) {
			if (syscall(__NR_io_uring_enter, u->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0 &&
			    errno != EINTR)
				return -errno;
			continue;
		}
		if (u->cqes[head & *u->cq_mask].res < 0 && !err)
			err = u->cqes[head & *u->cq_mask].res;
		__atomic_store_n(u->cq_head, head + 1, __ATOMIC_RELEASE);
		n--;
	}
	return err;
}

/* Submission kinds of the io_uring rows: PER_SUB copies as @sqes SQEs (or ioctl batches) each. */

#define URING_REPS 7U		/* io_uring rows: runs of each side, alternating */
#define URING_EFD_Q 2U		/* ... the queue of each engine with an eventfd */

struct uring_kind {
	unsigned int sqes;
	/* On the IORING_SETUP_IOPOLL ring: completed by polling, nothing queued for the engine. */
	int iopoll;
	/*
	 * On queue URING_EFD_Q of each engine, which has an eventfd (QUEUE_EVENTFD): COPY_SUBMIT
	 * then also looks at the queue for its listener and has the completion worker watch it,
	 * as an interrupt-driven SQE does for its own completion.
	 */
	int efd;
	/*
	 * Seconds of each run: io_uring until the fences are submitted, of which inside
	 * io_uring_enter; COPY_PREPARE calls alone; COPY_PREPARE + COPY_SUBMIT.
	 */
	double uring[URING_REPS], enter[URING_REPS], prep[URING_REPS], ioctls[URING_REPS];
	/* Submissions timed to a FENCE_STATUS look, an io-wq worker having run (uring_run()). */
	unsigned int punted;
};

/*
 * The newest fence of queue (@eng, @c->q) of @c (FENCE_STATUS of fence 1, which never blocks);
 * 0 on a queue that has submitted none yet (fence 1 is then not submitted: EINVAL).
 */
static __u64 newest_fence(struct qctx *c, __u32 eng)
{
	struct neuron_udma_fence_status st = { .engine = eng, .queue = c->q, .fence = 1 };
	int ret = udma_ioc(c->fd, NEURON_UDMA_FENCE_STATUS, &st);

	if (ret == -EINVAL)
		return 0;
	if (ret)
		die("FENCE_STATUS (io_uring rows)", ret);
	return st.submitted;
}

/*
 * @n_subs submissions of the PER_SUB copies of @c through io_uring: @sqes NEURON_UDMA_URING_COPY
 * SQEs of PER_SUB / @sqes copies each, SQE k on queue 1 of engine @engs[k] (one queue each),
 * written and submitted with one io_uring_enter; timed from there until every SQE's fence is
 * submitted (the driver read the entries, wrote the pairs and rang the doorbells of the fence).
 * After each io_uring_enter, FENCE_STATUS looks until every fence shows as its queue's newest
 * (the submitter yields the CPU between looks). If no io-wq worker of the process ran from
 * before the SQEs were written until then (iou_worker_switches(): none exists, or their context
 * switches did not change and none is running), no SQE was punted to one: each was issued
 * inline, inside io_uring_enter, so its fence was submitted before that call returned, and the
 * submission is timed to the return; the looks are not timed. Otherwise it is timed to the look
 * that saw the last fence. *@enter gets the time inside the SQE writes and io_uring_enter alone,
 * *@punted the submissions timed to a look. The CQEs are then reaped (not timed). Returns the
 * seconds.
 */
static double uring_run(struct qctx *c, const __u32 *engs, struct uring *u, unsigned int sqes,
			unsigned int n_subs, double *enter, unsigned int *punted)
{
	unsigned int per = PER_SUB / sqes, s, k;
	__u64 want[URING_SQES];
	double t0, t1, t2, end, secs = 0;
	long long sw0, sw1;
	int ret;

	*enter = 0;
	for (s = 0; s < n_subs; s++) {
		for (k = 0; k < sqes; k++)
			want[k] = newest_fence(c, engs[k]) + 1;
		sw0 = iou_worker_switches();
		t0 = now();
		for (k = 0; k < sqes; k++)
			uring_queue_copy(u, c->fd, engs[k], c->q, &c->copies[k * per], per);
		ret = uring_submit(u, sqes);
		t1 = now();
		if (ret != (int)sqes)
			die("io_uring_enter (URING_COPY)", ret < 0 ? ret : -EIO);
		end = t1 + 10;
		for (k = 0; k < sqes; k++)
			while (newest_fence(c, engs[k]) < want[k]) {
				if (now() > end)
					die("a URING_COPY was not submitted", -ETIMEDOUT);
				sched_yield();
			}
		t2 = now();
		sw1 = iou_worker_switches();
		if (sw0 < 0 || sw1 != sw0) {
			secs += t2 - t0;
			(*punted)++;
		} else {
			secs += t1 - t0;
		}
		*enter += t1 - t0;
		ret = uring_reap(u, sqes);
		if (ret)
			die("URING_COPY completion", ret);
	}
	return secs;
}

/*
 * The same through the ioctls: @sqes x (COPY_PREPARE of PER_SUB / @sqes copies, COPY_SUBMIT) on
 * the queues of @engs, timed (*@ioctls), of which the COPY_PREPARE calls alone into *@prep_s;
 * then FENCE_WAIT of each fence (not timed).
 */
static void ioctl_run(struct qctx *c, const __u32 *engs, unsigned int sqes, unsigned int n_subs,
		      double *prep_s, double *ioctls)
{
	unsigned int per = PER_SUB / sqes, s, k;
	__u64 fence[URING_SQES] = { 0 };
	double t0, t1;
	int ret;

	*prep_s = *ioctls = 0;
	for (s = 0; s < n_subs; s++) {
		t0 = now();
		for (k = 0; k < sqes; k++) {
			t1 = now();
			ret = prep(c->fd, engs[k], c->q, &c->copies[k * per], per);
			*prep_s += now() - t1;
			if (!ret)
				ret = copy_submit(c->fd, engs[k], c->q, &fence[k]);
			if (ret)
				die("COPY_PREPARE + COPY_SUBMIT", ret);
		}
		*ioctls += now() - t0;
		for (k = 0; k < sqes; k++) {
			ret = fence_wait(c->fd, engs[k], c->q, fence[k]);
			if (ret)
				die("FENCE_WAIT", ret);
		}
	}
}

/*
 * io_uring batch submission against the ioctls, per pair: PER_SUB 4-byte host->host copies per
 * submission (RING-slot rings), as one SQE of PER_SUB copies on queue 1 of the first
 * host-connected engine, and as URING_SQES SQEs of PER_SUB / URING_SQES on queue 1 of the first
 * URING_SQES host-connected engines in one io_uring_enter, against COPY_PREPARE of the same
 * batches (and COPY_PREPARE + COPY_SUBMIT, the ioctls that submit what one SQE submits: the
 * SQE also arranges its completion notice, its CQE, which they leave to an untimed FENCE_WAIT);
 * both kinds again on queue URING_EFD_Q of the same engines, which has an eventfd, so that
 * COPY_SUBMIT arranges a notice too (a look at the queue, the completion worker watching it
 * while the fence is in flight): nearly the same work (the SQE still queues its command while
 * its fence is in flight); and both kinds on an IORING_SETUP_IOPOLL ring
 * (its commands complete by polling: the SQE, like the ioctls, arranges no notice);
 * URING_REPS runs of @subs submissions of each side, the sides alternating submission by
 * submission (which goes first alternating from run to run). The driver prepares a
 * URING_COPY inline unless its queue lock stays held (then io_uring's worker does, after
 * io_uring_enter returned), so the io_uring figure runs until every SQE's fence is submitted
 * (where COPY_SUBMIT returns, for the ioctls).
 */
#define FIXED_REPS 7U		/* registered-buffer row: runs of each side, alternating */
#define FIXED_SQES 20U		/* ... SQEs per run, one at a time (submit, then its CQE) */
#define FIXED_MEM (1U << 20)	/* ... the host memory: imported, and registered with the ring */

/*
 * @FIXED_SQES NEURON_UDMA_URING_COPY SQEs of @n copies of @size bytes each from host memory to
 * the device buffer @dev, one at a time: with @fixed, from the ring's registered buffer 0 at
 * @mem (IORING_URING_CMD_FIXED, NEURON_UDMA_FIXED_BUFFER), else from the import @imp of the same
 * memory. Seconds per SQE (submit to CQE).
 */
static double fixed_run(int fd, __u32 eng, struct uring *u, unsigned char *mem, __u64 imp,
			__u64 dev, bool fixed, unsigned int n, __u32 size)
{
	struct neuron_udma_copy c[16];
	unsigned int i, k;
	double t0;
	int ret;

	for (k = 0; k < n; k++)
		c[k] = (struct neuron_udma_copy){
			.src_handle = fixed ? NEURON_UDMA_FIXED_BUFFER : imp,
			.src_offset = (__u64)k * size,
			.dst_handle = dev,
			.dst_offset = (__u64)k * size,
			.size = size,
			.flags = NEURON_UDMA_COPY_SPLIT,
		};
	t0 = now();
	for (i = 0; i < FIXED_SQES; i++) {
		unsigned int idx = *u->sq_tail & *u->sq_mask;

		uring_queue_copy(u, fd, eng, 2, c, n);
		if (fixed) {
			u->sqes[idx].uring_cmd_flags = IORING_URING_CMD_FIXED;
			u->sqes[idx].buf_index = 0;
			u->sqes[idx].addr = (uintptr_t)mem;
		}
		ret = uring_submit(u, 1);
		if (ret != 1)
			die("io_uring_enter (registered-buffer row)", ret < 0 ? ret : -EIO);
		ret = uring_reap(u, 1);
		if (ret)
			die("URING_COPY (registered-buffer row)", ret);
	}
	return (now() - t0) / FIXED_SQES;
}

/*
 * The registered-buffer rows: URING_COPY from an io_uring registered buffer (mapped for the
 * device per command) against the same from a MEM_IMPORT of the same memory (mapped once), one
 * 4 KiB copy per SQE and 16 x 64 KiB; interleaved runs, which side first alternating.
 */
static void bench_uring_fixed(__u32 eng)
{
	static const struct { unsigned int n; __u32 size; const char *what; } kinds[] = {
		{ 1, 4096, "4 KiB" }, { 16, 65536, "16 x 64 KiB" },
	};
	double fx[FIXED_REPS], im[FIXED_REPS], rr[FIXED_REPS];
	struct iovec iov;
	struct ubuf dev;
	struct uring ur;
	unsigned char *mem;
	unsigned int k, r;
	char name[128], how[400];
	__u64 imp;
	int fd, ret;

	fd = udma_open();
	if (fd < 0)
		die("open (registered-buffer rows)", -errno);
	mem = mmap(NULL, FIXED_MEM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap (registered-buffer rows)", -errno);
	fill_pattern(mem, FIXED_MEM, 77);
	ret = queue_init(fd, eng, 2, RING, RING);
	if (!ret)
		ret = ubuf_dev(fd, FIXED_MEM, &dev);
	if (!ret)
		ret = udma_import(fd, mem, FIXED_MEM, 0, &imp, NULL);
	if (ret)
		die("setup (registered-buffer rows)", ret);
	ret = uring_open(&ur, 16);
	if (ret)
		die("io_uring_setup (registered-buffer rows)", ret);
	iov = (struct iovec){ .iov_base = mem, .iov_len = FIXED_MEM };
	if (syscall(__NR_io_uring_register, ur.fd, IORING_REGISTER_BUFFERS, &iov, 1) < 0)
		die("IORING_REGISTER_BUFFERS", -errno);
	for (k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		fixed_run(fd, eng, &ur, mem, imp, dev.handle, true, kinds[k].n, kinds[k].size);
		fixed_run(fd, eng, &ur, mem, imp, dev.handle, false, kinds[k].n, kinds[k].size);
		for (r = 0; r < FIXED_REPS; r++) {
			bool first = r % 2;

			fx[r] = fixed_run(fd, eng, &ur, mem, imp, dev.handle, first, kinds[k].n,
					  kinds[k].size);
			im[r] = fixed_run(fd, eng, &ur, mem, imp, dev.handle, !first, kinds[k].n,
					  kinds[k].size);
			if (!first) {
				double t = fx[r];

				fx[r] = im[r];
				im[r] = t;
			}
			rr[r] = fx[r] / im[r];
		}
		snprintf(name, sizeof(name), "io_uring: URING_COPY %s from a registered buffer",
			 kinds[k].what);
		snprintf(how, sizeof(how),
			 "us per SQE, submit to CQE, host->HBM on engine %u, one SQE at a time: the "
			 "copies' source an io_uring registered buffer (IORING_URING_CMD_FIXED: its "
			 "pages referenced, mapped and charged per command) against a MEM_IMPORT of "
			 "the same memory (mapped once); %u runs of %u SQEs each side, interleaved",
			 eng, FIXED_REPS, FIXED_SQES);
		result_range(name, median(fx, FIXED_REPS) * 1e6, "us", median(im, FIXED_REPS) * 1e6,
			     rr, FIXED_REPS, how, NULL);
	}
	uring_close(&ur);
	queue_release(fd, eng, 2);
	mem_free(fd, imp);
	ubuf_free(fd, &dev);
	munmap(mem, FIXED_MEM);
	close(fd);
}

/* The queue of each engine that the io_uring kind @kd runs on. */
static __u32 uring_kind_queue(const struct uring_kind *kd)
{
	return kd->efd ? URING_EFD_Q : 1;
}

/* Releases the io_uring rows' queues (queue 1 of engs[0] with @c), closes @c and @efd. */
static void uring_queues_release(struct qctx *c, const __u32 *engs, int efd)
{
	unsigned int k;

	for (k = 0; k < URING_SQES; k++) {
		if (k)
			queue_release(c->fd, engs[k], 1);
		queue_release(c->fd, engs[k], URING_EFD_Q);
	}
	c->q = 1;
	qctx_close(c);
	close(efd);
}

static void bench_uring(void)
{
	struct uring_kind kinds[] = { { .sqes = 1 }, { .sqes = URING_SQES },
				      { .sqes = 1, .efd = 1 }, { .sqes = URING_SQES, .efd = 1 },
				      { .sqes = 1, .iopoll = 1 }, { .sqes = URING_SQES, .iopoll = 1 } };
	unsigned int nk = sizeof(kinds) / sizeof(kinds[0]), r, k, sub, n = 0, warm = 0;
	double pairs = (double)subs * PER_SUB, u, e, p, i;
	char name[160], base[2400], how[2800], extra[120], l0[40], l1[40], engl[80], eng0[16];
	struct neuron_udma_info info;
	__u32 engs[URING_SQES], eng;
	struct uring ur, urp, *ring;
	struct qctx c;
	int fd, efd, ret;

	fd = udma_open();
	if (fd < 0 || udma_info(fd, &info))
		die("INFO", fd < 0 ? -errno : -EIO);
	close(fd);
	for (eng = 0; eng < info.engines && n < URING_SQES; eng++)
		if (info.host_engines[eng / 64] >> (eng % 64) & 1)
			engs[n++] = eng;
	if (n < URING_SQES)
		die("fewer host-connected engines than SQEs (io_uring rows)", -ENODEV);
	qctx_open(&c, engs[0], 1);
	efd = eventfd(0, EFD_CLOEXEC);
	if (efd < 0)
		die("eventfd (io_uring rows)", -errno);
	for (k = 0; k < URING_SQES; k++) {
		struct neuron_udma_eventfd r = { .engine = engs[k], .queue = URING_EFD_Q, .fd = efd };

		ret = k ? queue_init(c.fd, engs[k], 1, RING, RING) : 0;
		if (!ret)
			ret = queue_init(c.fd, engs[k], URING_EFD_Q, RING, RING);
		if (ret)
			die("QUEUE_INIT (io_uring rows)", ret);
		ret = udma_ioc(c.fd, NEURON_UDMA_QUEUE_EVENTFD, &r);
		if (ret)
			die("QUEUE_EVENTFD (io_uring rows)", ret);
	}
	snprintf(engl, sizeof(engl), "%u-%u", engs[0], engs[URING_SQES - 1]);
	snprintf(eng0, sizeof(eng0), "%u", engs[0]);
	ret = uring_open(&ur, 64);
	if (!ret) {
		ret = uring_open_flags(&urp, 64, IORING_SETUP_IOPOLL);
		if (ret)
			uring_close(&ur);
	}
	if (ret) {
		fprintf(stderr, "udma_bench: io_uring_setup: %s: no io_uring rows\n", strerror(-ret));
		uring_queues_release(&c, engs, efd);
		return;
	}
	for (k = 0; k < nk; k++) {	/* warm-up (io_uring's worker threads too) */
		ring = kinds[k].iopoll ? &urp : &ur;
		c.q = uring_kind_queue(&kinds[k]);
		uring_run(&c, engs, ring, kinds[k].sqes, 2, &e, &warm);
		ioctl_run(&c, engs, kinds[k].sqes, 2, &p, &i);
	}
	loadavg(l0, sizeof(l0));
	for (r = 0; r < URING_REPS; r++)
		for (k = 0; k < nk; k++) {
			struct uring_kind *kd = &kinds[k];

			ring = kd->iopoll ? &urp : &ur;
			c.q = uring_kind_queue(kd);
			kd->uring[r] = kd->enter[r] = kd->prep[r] = kd->ioctls[r] = 0;
			/*
			 * The two sides alternate submission by submission (which goes first
			 * alternating too): the host's speed drifts over tens of milliseconds
			 * under TCG, which alternating whole runs of @subs submissions turned
			 * into per-run ratios of 0.5-2.6x.
			 */
			for (sub = 0; sub < subs; sub++) {
				if ((sub + r) % 2) {
					ioctl_run(&c, engs, kd->sqes, 1, &p, &i);
					u = uring_run(&c, engs, ring, kd->sqes, 1, &e, &kd->punted);
				} else {
					u = uring_run(&c, engs, ring, kd->sqes, 1, &e, &kd->punted);
					ioctl_run(&c, engs, kd->sqes, 1, &p, &i);
				}
				kd->uring[r] += u;
				kd->enter[r] += e;
				kd->prep[r] += p;
				kd->ioctls[r] += i;
			}
		}
	loadavg(l1, sizeof(l1));
	uring_close(&urp);
	uring_close(&ur);
	uring_queues_release(&c, engs, efd);
	bench_uring_fixed(engs[0]);
	snprintf(extra, sizeof(extra), "\"load_start\":\"%s\",\"load_end\":\"%s\"", l0, l1);
	for (k = 0; k < nk; k++) {
		struct uring_kind *kd = &kinds[k];
		unsigned int per = PER_SUB / kd->sqes;
		double rp[URING_REPS], ri[URING_REPS], mu, me, mp, mi;
		char what[80];

		for (r = 0; r < URING_REPS; r++) {
			rp[r] = kd->uring[r] / kd->prep[r];
			ri[r] = kd->uring[r] / kd->ioctls[r];
		}
		mu = median(kd->uring, URING_REPS);
		me = median(kd->enter, URING_REPS);
		mp = median(kd->prep, URING_REPS);
		mi = median(kd->ioctls, URING_REPS);

		snprintf(what, sizeof(what), "%u SQE%s x%u%s", kd->sqes, kd->sqes == 1 ? "" : "s", per,
			 kd->iopoll ? " on an IOPOLL ring" : kd->efd ? " on queues with an eventfd" : "");
		snprintf(base, sizeof(base),
			 "%llu pairs of 4 B host->host (%u-slot rings), submissions of %u "
			 "NEURON_UDMA_URING_COPY SQE%s of %u copies (on queue %u of engine%s %s, one each) "
			 "%s%s"
			 "written and submitted with one io_uring_enter (%.1f ns/pair inside it: the driver "
			 "prepares an SQE inline, or sends it to io_uring's worker with -EAGAIN when its "
			 "queue lock stays held), timed until "
			 "every SQE's fence is submitted (the entries read, the pairs written, the doorbells "
			 "rung): to io_uring_enter's return when no io-wq worker of the process ran until "
			 "FENCE_STATUS saw every fence (no SQE was punted: each ran inside the call), else "
			 "to that look (%u of %u submissions), CQEs reaped untimed; %u runs of %u "
			 "submissions of each side, the sides alternating submission by submission on the "
			 "same queues (which goes first alternates): %u x (COPY_PREPARE x%u, %.1f ns/pair inside "
			 "its calls; + COPY_SUBMIT, %.1f ns/pair), FENCE_WAIT untimed; figures: the medians; "
			 "ratio: the median of the per-run ratios, min and max beside it; guest load average "
			 "%s before, %s after; baseline: ",
			 (unsigned long long)pairs, RING, kd->sqes, kd->sqes == 1 ? "" : "s", per,
			 uring_kind_queue(kd), kd->sqes == 1 ? "" : "s", kd->sqes == 1 ? eng0 : engl,
			 kd->efd ? "with an eventfd registered on each queue (QUEUE_EVENTFD: so "
			 "COPY_SUBMIT, like the SQE, looks at its queue for a listener and has the "
			 "completion worker watch it while its fence is in flight), " : "",
			 kd->iopoll ? "on an IORING_SETUP_IOPOLL ring (completed by polling in "
			 "io_uring_enter: the SQE queues nothing and starts no completion worker, as the "
			 "ioctls' untimed FENCE_WAIT does not), " : "", me * 1e9 / pairs,
			 kd->punted, subs * URING_REPS, URING_REPS, subs, kd->sqes, per, mp * 1e9 / pairs,
			 mi * 1e9 / pairs, l0, l1);
		if (!kd->iopoll && !kd->efd) {
			snprintf(name, sizeof(name), "URING_COPY %s submission per pair vs COPY_PREPARE",
				 what);
			snprintf(how, sizeof(how), "%sthe time inside the COPY_PREPARE calls alone (they "
				 "ring no doorbell)", base);
			result_range(name, mu * 1e9 / pairs, "ns/pair", mp * 1e9 / pairs, rp, URING_REPS,
				     how, extra);
		}
		snprintf(name, sizeof(name), "URING_COPY %s submission per pair vs COPY_PREPARE + COPY_SUBMIT",
			 what);
		snprintf(how, sizeof(how), "%sthe time inside COPY_PREPARE + COPY_SUBMIT, %s", base,
			 kd->iopoll ? "the same work (neither side arranges a completion notice)" :
			 kd->efd ? "nearly the same work (both sides arrange a completion notice: the "
			 "CQE, the eventfd; the SQE also queues its command while its fence is in flight)" :
			 "on queues without a listener: the SQE also arranges its completion notice (its "
			 "CQE), which the ioctls leave to their untimed FENCE_WAIT (no target: the eventfd "
			 "row compares nearly the same work)");
		result_range(name, mu * 1e9 / pairs, "ns/pair", mi * 1e9 / pairs, ri, URING_REPS, how,
			     extra);
		fprintf(stderr, "udma_bench: URING_COPY %s: %.1f ns/pair (io_uring_enter %.1f); COPY_PREPARE "
			"%.1f, + COPY_SUBMIT %.1f ns/pair (medians of %u runs)\n", what, mu * 1e9 / pairs,
			me * 1e9 / pairs, mp * 1e9 / pairs, mi * 1e9 / pairs, URING_REPS);
	}
}

/* ---- completion-to-wakeup latency: epoll against COPY_WAIT ---- */

/* The thread that notes when a copy's bytes land: it spins on the destination while armed. */
struct lander {
	volatile __u32 *dst;	/* the word to watch (set before arming) */
	__u32 want;		/* the value that lands */
	int state;		/* 0 idle, 1 armed, 2 landed (at @landed), -1 exit */
	double landed;
};

static void pin_to_cpu(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);	/* best effort: one CPU guests run as they can */
}

static void *lander_thread(void *arg)
{
	struct lander *l = arg;
	int st;

	pin_to_cpu(1);
	while ((st = __atomic_load_n(&l->state, __ATOMIC_ACQUIRE)) >= 0) {
		if (st == 1 && *l->dst == l->want) {
			l->landed = now();
			__atomic_store_n(&l->state, 2, __ATOMIC_RELEASE);
		}
		__builtin_ia32_pause();
	}
	return NULL;
}

enum { W_EPOLL, W_COPY_WAIT, W_EVENTFD, W_URING, W_IOPOLL, W_NUM };

/* Whether samples of @kind are io_uring SQEs (timed from the issue, prepare included). */
static bool wake_uring(unsigned int kind)
{
	return kind == W_URING || kind == W_IOPOLL;
}

static const char *const wake_kind[W_NUM] = {
	"epoll", "COPY_WAIT", "eventfd", "io_uring", "io_uring IOPOLL",
};
/* The eventfd of the W_EVENTFD queue, the io_urings of the W_URING and W_IOPOLL samples. */
static int wake_efd = -1;
static struct uring wake_ring, wake_poll_ring;

#define WQ_CPUMASK "/sys/devices/virtual/workqueue/cpumask"

/* The CPU mask of the unbound workqueues into @buf (empty when it cannot be read). */
static void wq_cpumask_get(char *buf, size_t len)
{
	FILE *f = fopen(WQ_CPUMASK, "re");

	buf[0] = 0;
	if (!f)
		return;
	if (!fgets(buf, (int)len, f))
		buf[0] = 0;
	buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

/* Sets the CPU mask of the unbound workqueues (hex, as the file shows it): 0 or -errno. */
static int wq_cpumask_set(const char *mask)
{
	int fd = open(WQ_CPUMASK, O_WRONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, mask, strlen(mask)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/*
 * One sample: a 4-byte copy of a new value prepared and submitted with COPY_SUBMIT on
 * @c's queue; then either (W_EPOLL) epoll_wait on the file, then QUEUE_EVENTS until its
 * fence is reported, (W_COPY_WAIT) COPY_WAIT (which waits for that fence: nothing new was
 * prepared), or (W_EVENTFD) a blocking read of the queue's eventfd (QUEUE_EVENTFD: signalled
 * once per fence settled); or (W_URING, W_IOPOLL) the copy as one NEURON_UDMA_URING_COPY SQE,
 * on an interrupt-driven ring or an IORING_SETUP_IOPOLL one (whose wait polls the command's
 * fence from the caller's io_uring_enter, as COPY_WAIT polls its own), submitted with
 * io_uring_enter waiting for its CQE (the time from that call: the SQE's prepare and fence
 * included). The lander notes when the bytes land. Seconds from landing to the wake-up (after
 * QUEUE_EVENTS for epoll), from COPY_SUBMIT to it, from COPY_PREPARE_ONE to it (the io_uring
 * kinds: from the issue, as @submit_wake: the same work, prepare, fence and wait), and (epoll)
 * from landing to epoll_wait's return.
 */
static void wake_sample(struct qctx *c, int kind, int ep, struct lander *l, __u32 v,
			double *land_wake, double *submit_wake, double *prep_wake, double *land_epoll)
{
	volatile __u32 *s32 = (volatile __u32 *)c->src.map, *d32 = (volatile __u32 *)c->dst.map;
	struct neuron_udma_queue_event ev[4];
	struct epoll_event e;
	double t0, t_p, t_ep = 0, t_wake, t_end;
	__u64 fence = 0, done = 0;
	int ret, i, n;

	*s32 = v;
	*d32 = ~v;
	l->dst = d32;
	l->want = v;
	__atomic_store_n(&l->state, 1, __ATOMIC_RELEASE);
	if (wake_uring(kind)) {
		struct uring *u = kind == W_URING ? &wake_ring : &wake_poll_ring;
		unsigned int head;

		uring_queue_copy(u, c->fd, c->eng, c->q, &c->copies[0], 1);
		t0 = now();
		t_p = t0;
		do
			ret = (int)syscall(__NR_io_uring_enter, u->fd, 1, 1, IORING_ENTER_GETEVENTS,
					   NULL, 0);
		while (ret < 0 && errno == EINTR);
		if (ret < 0)
			die("io_uring_enter (wake-up rows)", -errno);
		head = *u->cq_head;
		while (head == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE))
			if (syscall(__NR_io_uring_enter, u->fd, 0, 1, IORING_ENTER_GETEVENTS,
				    NULL, 0) < 0 && errno != EINTR)
				die("io_uring_enter (wake-up rows)", -errno);
		t_wake = now();
		ret = u->cqes[head & *u->cq_mask].res;
		__atomic_store_n(u->cq_head, head + 1, __ATOMIC_RELEASE);
		if (ret < 0)
			die("the URING_COPY CQE (wake-up rows)", ret);
		goto landed;
	}
	t_p = now();
	ret = prep_one(c->fd, c->eng, c->q, c->copies[0]);
	if (ret)
		die("COPY_PREPARE_ONE (wake-up rows)", ret);
	t0 = now();
	ret = copy_submit(c->fd, c->eng, c->q, &fence);
	if (ret)
		die("COPY_SUBMIT (wake-up rows)", ret);
	if (kind == W_EVENTFD) {
		__u64 n;

		while (read(wake_efd, &n, sizeof(n)) != sizeof(n))
			if (errno != EINTR)
				die("read of the eventfd (wake-up rows)", -errno);
	} else if (kind == W_EPOLL) {
		while (done < fence) {
			n = epoll_wait(ep, &e, 1, 10000);
			if (!t_ep)
				t_ep = now();
			if (n < 0 && errno == EINTR)
				continue;
			if (n != 1)
				die("epoll_wait (wake-up rows)", n < 0 ? -errno : -ETIMEDOUT);
			n = queue_events(c->fd, ev, 4);
			if (n < 0)
				die("QUEUE_EVENTS", n);
			for (i = 0; i < n; i++) {
				if (ev[i].flags & NEURON_UDMA_EVENT_FAILED)
					die("a fence failed (wake-up rows)", -ev[i].error);
				if (ev[i].engine == c->eng && ev[i].queue == c->q && ev[i].completed > done)
					done = ev[i].completed;
			}
		}
	} else {
		ret = copy_wait(c->fd, c->eng, c->q, 0, NULL);
		if (ret)
			die("COPY_WAIT (wake-up rows)", ret);
	}
	t_wake = now();
landed:
	t_end = t_wake + 10;
	while (__atomic_load_n(&l->state, __ATOMIC_ACQUIRE) != 2)
		if (now() > t_end)
			die("the copy's bytes did not land (wake-up rows)", -ETIMEDOUT);
	__atomic_store_n(&l->state, 0, __ATOMIC_RELEASE);
	*land_wake = t_wake - l->landed;
	*submit_wake = t_wake - t0;
	*prep_wake = t_wake - t_p;
	*land_epoll = t_ep ? t_ep - l->landed : 0;
}

/*
 * Wake-up latency through epoll, an eventfd and io_uring against a thread blocked in COPY_WAIT:
 * five files, one queue each (engine 0 queue 1, its file in an epoll set: EPOLLIN | EPOLLPRI;
 * engine 1 queue 1, a file nobody polls; engine 0 queue 2 with an eventfd; engine 1 queue 2, its
 * copies issued as URING_COPY SQEs; engine 1 queue 3, the same on an IOPOLL ring), wake_runs
 * rounds of one sample of each, the order rotating from round to round. Per sample the time from
 * COPY_SUBMIT (and from COPY_PREPARE_ONE) to the wake-up, and from the copy's landing to it: a
 * lander thread pinned to CPU 1 spins on the destination (the caller runs on CPU 0, and so do the
 * unbound workqueues, the driver's completion worker among them, while the phase lasts).
 */
static void bench_wakeup(void)
{
	double *lw[W_NUM], *sw[W_NUM], *le, *cw, cw50, cw99, le50;
	double p50[W_NUM], p99[W_NUM], s50[W_NUM], s99[W_NUM];
	double block_ratio[W_NUM][RANGE_BLOCKS];
	struct neuron_udma_queue_event ev[4];
	char how[1800], howr[1900], extra[120], l0[40], l1[40], wq[64], wq_note[160];
	struct epoll_event e = { .events = EPOLLIN | EPOLLPRI };
	struct qctx c[W_NUM];
	struct lander l = { 0 };
	unsigned int i, k;
	cpu_set_t cpus;
	pthread_t th;
	int ep, ret;

	qctx_open(&c[W_EPOLL], 0, 1);
	qctx_open(&c[W_COPY_WAIT], 1, 1);
	qctx_open(&c[W_EVENTFD], 0, 2);
	qctx_open(&c[W_URING], 1, 2);
	qctx_open(&c[W_IOPOLL], 1, 3);
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c[W_EPOLL].fd, &e))
		die("epoll", -errno);
	wake_efd = eventfd(0, EFD_CLOEXEC);
	if (wake_efd < 0)
		die("eventfd", -errno);
	{
		struct neuron_udma_eventfd r = { .engine = c[W_EVENTFD].eng,
						 .queue = c[W_EVENTFD].q, .fd = wake_efd };

		ret = udma_ioc(c[W_EVENTFD].fd, NEURON_UDMA_QUEUE_EVENTFD, &r);
		if (ret)
			die("QUEUE_EVENTFD (wake-up rows)", ret);
	}
	ret = uring_open(&wake_ring, 8);
	if (!ret)
		ret = uring_open_flags(&wake_poll_ring, 8, IORING_SETUP_IOPOLL);
	if (ret)
		die("io_uring_setup (wake-up rows)", ret);
	le = calloc(wake_runs, sizeof(double));
	cw = calloc(wake_runs, sizeof(double));
	for (k = 0; k < W_NUM; k++) {
		lw[k] = calloc(wake_runs, sizeof(double));
		sw[k] = calloc(wake_runs, sizeof(double));
		if (!lw[k] || !sw[k] || !le || !cw)
			die("calloc", -ENOMEM);
	}
	if (sched_getaffinity(0, sizeof(cpus), &cpus))
		die("sched_getaffinity", -errno);
	pin_to_cpu(0);
	wq_cpumask_get(wq, sizeof(wq));
	ret = wq[0] ? wq_cpumask_set("1") : -ENOENT;
	if (ret)
		snprintf(wq_note, sizeof(wq_note), "the unbound workqueues could not be kept on CPU 0 "
			 "(%s: %s)", WQ_CPUMASK, strerror(-ret));
	else
		snprintf(wq_note, sizeof(wq_note), "the unbound workqueues (the completion worker) on "
			 "CPU 0 (cpumask 1, was %s)", wq);
	if (pthread_create(&th, NULL, lander_thread, &l))
		die("pthread_create", -EAGAIN);
	for (i = 0; i < 50; i++)	/* warm-up */
		for (k = 0; k < W_NUM; k++) {
			double a, b, p, d;

			wake_sample(&c[k], k, ep, &l, 0x1000 + i * 2 + k, &a, &b, &p, &d);
		}
	loadavg(l0, sizeof(l0));
	for (i = 0; i < wake_runs; i++)
		for (k = 0; k < W_NUM; k++) {
			unsigned int kind = (i + k) % W_NUM;
			double p, d;

			wake_sample(&c[kind], kind, ep, &l, i * 2654435761U + kind + 1, &lw[kind][i],
				    &sw[kind][i], kind == W_COPY_WAIT ? &cw[i] : &p,
				    kind == W_EPOLL ? &le[i] : &d);
		}
	loadavg(l1, sizeof(l1));
	__atomic_store_n(&l.state, -1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	sched_setaffinity(0, sizeof(cpus), &cpus);
	if (!ret && wq_cpumask_set(wq))
		fprintf(stderr, "udma_bench: could not restore %s to %s\n", WQ_CPUMASK, wq);
	/* Nothing left unreported. */
	ret = queue_events(c[W_EPOLL].fd, ev, 4);
	if (ret < 0)
		die("QUEUE_EVENTS", ret);
	close(ep);
	uring_close(&wake_poll_ring);
	uring_close(&wake_ring);
	for (k = 0; k < W_NUM; k++)
		qctx_close(&c[k]);
	close(wake_efd);
	/*
	 * The range of the p50 rows: each block's p50 of each kind against COPY_WAIT's, timed from
	 * COPY_SUBMIT, or for the io_uring kinds (whose SQE prepares the copy) from its
	 * COPY_PREPARE_ONE.
	 */
	for (k = 0; k < W_NUM; k++)
		if (k != W_COPY_WAIT)
			block_ratios(sw[k], 0.5, wake_uring(k) ? cw : sw[W_COPY_WAIT], 0.5, wake_runs,
				     block_ratio[k]);
	qsort(cw, wake_runs, sizeof(double), cmp_double);
	cw50 = pctf(cw, wake_runs, 0.5) * 1e6;
	cw99 = pctf(cw, wake_runs, 0.99) * 1e6;
	for (k = 0; k < W_NUM; k++) {
		qsort(lw[k], wake_runs, sizeof(double), cmp_double);
		qsort(sw[k], wake_runs, sizeof(double), cmp_double);
		p50[k] = pctf(lw[k], wake_runs, 0.5) * 1e6;
		p99[k] = pctf(lw[k], wake_runs, 0.99) * 1e6;
		s50[k] = pctf(sw[k], wake_runs, 0.5) * 1e6;
		s99[k] = pctf(sw[k], wake_runs, 0.99) * 1e6;
	}
	qsort(le, wake_runs, sizeof(double), cmp_double);
	le50 = pctf(le, wake_runs, 0.5) * 1e6;
	snprintf(extra, sizeof(extra), "\"load_start\":\"%s\",\"load_end\":\"%s\"", l0, l1);
	for (k = 0; k < W_NUM; k++) {
		const char *start = wake_uring(k) ? "URING_COPY issue" : "COPY_SUBMIT";
		double b50 = wake_uring(k) ? cw50 : s50[W_COPY_WAIT];
		double b99 = wake_uring(k) ? cw99 : s99[W_COPY_WAIT];
		char name[120];

		if (k == W_COPY_WAIT)
			continue;
		snprintf(how, sizeof(how),
			 "%u rounds, each one sample of each of 5 kinds (order rotating), each kind on a "
			 "queue and file of its own: a 4 B host->host copy prepared, then COPY_SUBMIT, "
			 "then epoll_wait on the file (engine 0 queue 1; EPOLLIN | EPOLLPRI) and "
			 "QUEUE_EVENTS until its fence is reported, or COPY_WAIT on a file nobody polls "
			 "(engine 1 queue 1), or a blocking read of the queue's eventfd (engine 0 queue 2; "
			 "QUEUE_EVENTFD); or the copy as one URING_COPY SQE on engine 1 queue 2, "
			 "io_uring_enter waiting for its CQE (timed from that call: the SQE's prepare and "
			 "fence included), or the same on an IORING_SETUP_IOPOLL ring (engine 1 queue 3: "
			 "its io_uring_enter polls the fence, as COPY_WAIT does); a thread pinned to CPU 1 "
			 "spins on the destination and notes when the bytes land, the caller on CPU 0, "
			 "%s. %s: start to wake-up p50 %.1f us, p99 "
			 "%.1f us, landing to wake-up p50 %.1f us, p99 %.1f us%s; COPY_WAIT: %.1f, %.1f, "
			 "%.1f, %.1f us (from its COPY_PREPARE_ONE: p50 %.1f, p99 %.1f us); guest load "
			 "average %s before, %s after; baseline: COPY_WAIT, %s",
			 wake_runs, wq_note, wake_kind[k], s50[k], s99[k], p50[k], p99[k],
			 k == W_EPOLL ? " (epoll_wait's return)" : "", s50[W_COPY_WAIT],
			 s99[W_COPY_WAIT], p50[W_COPY_WAIT], p99[W_COPY_WAIT], cw50, cw99, l0, l1,
			 wake_uring(k) ? "timed from its COPY_PREPARE_ONE (the same work as the SQE's: "
					 "prepare, fence, wait)" : "timed from its COPY_SUBMIT");
		if (k == W_EPOLL) {
			size_t at = strlen(how);

			snprintf(how + at, sizeof(how) - at, "; epoll_wait returned %.1f us after the "
				 "landing (p50)", le50);
		}
		snprintf(name, sizeof(name), "%s to wake-up p50: %s vs COPY_WAIT", start,
			 wake_kind[k]);
		snprintf(howr, sizeof(howr), "%s; ratio: the median of the p50 ratios of %u "
			 "consecutive blocks of rounds, min and max beside it", how, RANGE_BLOCKS);
		result_range(name, s50[k], "us", b50, block_ratio[k], RANGE_BLOCKS, howr, extra);
		snprintf(name, sizeof(name), "%s to wake-up p99: %s vs COPY_WAIT", start,
			 wake_kind[k]);
		result_x(name, s99[k], "us", b99, how, extra);
		snprintf(name, sizeof(name), "completion to wake-up p50: %s vs COPY_WAIT", wake_kind[k]);
		result_x(name, p50[k], "us", p50[W_COPY_WAIT], how, extra);
		fprintf(stderr, "udma_bench: wake-up p50 from %s: %s %.1f us, COPY_WAIT %.1f us; "
			"landing to wake-up p50: %.1f / %.1f us\n", start, wake_kind[k], s50[k], b50,
			p50[k], p50[W_COPY_WAIT]);
	}
	for (k = 0; k < W_NUM; k++) {
		free(lw[k]);
		free(sw[k]);
	}
	free(cw);
	free(le);
}

/* Writes @val to the device_ring_fill module parameter: 0 or -errno. */
static int set_fill(const char *val)
{
	FILE *f = fopen(DR_FILL, "we");
	int ret = 0;

	if (!f)
		return -errno;
	if (fputs(val, f) < 0)
		ret = -EIO;
	if (fclose(f) && !ret)
		ret = -errno;
	return ret;
}

/*
 * One run of the device-ring rows' workload on queue @q of @fd: @n_subs submissions of PER_SUB
 * pairs, each prepared @batch at a time (1: PREPARE_ONE) and started right after each call
 * (COPY_START of the call's pairs), then an untimed COPY_WAIT. Returns the seconds inside the
 * prepare and start calls, or a negative errno.
 */
static double prep_start(int fd, __u32 q, const struct neuron_udma_copy *copies, unsigned int batch,
			 unsigned int n_subs)
{
	unsigned int s, i, n;
	double t0, secs = 0;
	int ret;

	for (s = 0; s < n_subs; s++) {
		for (i = 0; i < PER_SUB; i += n) {
			n = PER_SUB - i < batch ? PER_SUB - i : batch;
			t0 = now();
			ret = n == 1 ? prep_one(fd, DR_ENG, q, copies[i])
				     : prep(fd, DR_ENG, q, &copies[i], n);
			if (!ret)
				ret = copy_start(fd, DR_ENG, q, n, n);
			secs += now() - t0;
			if (ret)
				return ret;
		}
		ret = copy_wait(fd, DR_ENG, q, 0, NULL);
		if (ret)
			return ret;
	}
	return secs;
}

/*
 * Rings in device memory: three queues of engine DR_ENG in one file, 4096-slot rings: host rings
 * (queue 4), rings in HBM filled through BAR4 (queue 5) and by the engine (queue 6; the
 * device_ring_fill parameter is read at QUEUE_INIT, so it is set before each), 4-byte HBM->HBM
 * copies. Per batch size (1: PREPARE_ONE + START per pair; else COPY_PREPARE xN + START), best of
 * LOOKUP_REPS runs of @subs submissions per queue, the three queues' runs interleaved.
 */
static void bench_device_rings(void)
{
	static const unsigned int dr_batches[] = { 1, 16, 256, 2032 };
	static const char *const kinds[3] = { "host memory", "HBM via BAR4", "HBM via engine move" };
	static const char *const fills[3] = { NULL, "bar4", "engine" };
	struct neuron_udma_copy *copies = calloc(PER_SUB, sizeof(*copies));
	struct neuron_udma_info info;
	struct ubuf d1, d2;
	char name[128], how[640], old[16] = "";
	unsigned int b, r, k, i;
	FILE *f;
	int fd, ret;

	fd = udma_open();
	if (fd < 0 || !copies)
		die("open " UDMA_DEV, -errno);
	if (udma_info(fd, &info) || !info.device_mem_size) {
		fprintf(stderr, "udma_bench: no device memory: rings in device memory left out\n");
		close(fd);
		free(copies);
		return;
	}
	f = fopen(DR_FILL, "re");
	if (!f || !fgets(old, sizeof(old), f))
		die("read " DR_FILL, -errno);
	fclose(f);
	ret = ubuf_dev(fd, BUF_SIZE, &d1);
	if (!ret)
		ret = ubuf_dev(fd, BUF_SIZE, &d2);
	if (ret)
		die("MEM_ALLOC", ret);
	for (i = 0; i < PER_SUB; i++)
		copies[i] = ucopy(&d1, i * 64, &d2, i * 64, COPY_SIZE);
	for (k = 0; k < 3; k++) {
		struct neuron_udma_queue_init qi = {
			.engine = DR_ENG, .queue = 4 + k, .tx_descs = RING, .rx_descs = RING,
			.flags = fills[k] ? NEURON_UDMA_QUEUE_DEVICE_RINGS : 0,
		};

		if (fills[k] && (ret = set_fill(fills[k])))
			die("write " DR_FILL, ret);
		ret = udma_ioc(fd, NEURON_UDMA_QUEUE_INIT, &qi);
		if (ret)
			die("QUEUE_INIT", ret);
	}
	set_fill(old);
	for (b = 0; b < sizeof(dr_batches) / sizeof(dr_batches[0]); b++) {
		unsigned int batch = dr_batches[b];
		double best[3] = { 0 }, ns[3];

		for (k = 0; k < 3; k++)		/* warm-up */
			if (prep_start(fd, 4 + k, copies, batch, 1) < 0)
				die("device rings warm-up", -EIO);
		for (r = 0; r < LOOKUP_REPS; r++) {
			for (k = 0; k < 3; k++) {
				double t = prep_start(fd, 4 + k, copies, batch, subs);

				if (t < 0)
					die("device rings", (int)t);
				if (!r || t < best[k])
					best[k] = t;
			}
		}
		for (k = 0; k < 3; k++)
			ns[k] = best[k] * 1e9 / ((double)subs * PER_SUB);
		for (k = 0; k < 3; k++) {
			if (batch == 1)
				snprintf(name, sizeof(name), "prepare+start per pair, rings in %s", kinds[k]);
			else
				snprintf(name, sizeof(name), "prepare+start per pair, rings in %s (x%u)",
					 kinds[k], batch);
			snprintf(how, sizeof(how),
				 "time inside %s + COPY_START of each call's pairs, per pair, best of %u "
				 "runs of %u submissions of %u pairs of 4 B HBM->HBM on engine %u queue %u "
				 "(%u-slot rings in %s%s), each closed by an untimed COPY_WAIT; the three "
				 "queues' runs interleaved; baseline: the same calls on queue 4 (host rings)",
				 batch == 1 ? "PREPARE_ONE" : "COPY_PREPARE", LOOKUP_REPS, subs, PER_SUB,
				 DR_ENG, 4 + k, RING, k ? "HBM, " : "host memory",
				 k == 1 ? "descriptors written through BAR4 before each doorbell"
				 : k == 2 ? "descriptors moved by the H2T queue before each doorbell" : "");
			result(name, ns[k], "ns/pair", ns[0], how);
		}
		fprintf(stderr, "udma_bench: prepare+start x%u per pair: host %.0f, BAR4 %.0f, engine %.0f ns\n",
			batch, ns[0], ns[1], ns[2]);
	}
	for (k = 0; k < 3; k++)
		queue_release(fd, DR_ENG, 4 + k);
	ubuf_free(fd, &d1);
	ubuf_free(fd, &d2);
	free(copies);
	close(fd);
}

/* ---- (m) kernel memory per buffer ---- */

#define KMEM_CG "/sys/fs/cgroup/nu_bench_kmem"
#define KMEM_BUFS 1024U		/* buffers per round */
#define KMEM_ROUNDS 5U		/* rounds of each kind, alternating */
#define KMEM_BOUND 512.0	/* the (m) target, bytes per buffer */

/* The test cgroup's charged slab bytes (memory.stat "slab"), -1 if unreadable. */
static long long kmem_slab(void)
{
	char line[256];
	long long v = -1;
	FILE *f = fopen(KMEM_CG "/memory.stat", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "slab ", 5)) {
			v = strtoll(line + 5, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

static void kmem_settle(void)
{
	/* Frees that RCU defers done, and the cgroup's statistics flushed (every 2 s). */
	struct timespec ts = { 2, 200 * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/*
 * In a child in the memory cgroup KMEM_CG: KMEM_ROUNDS rounds of each kind, alternating (device,
 * import, device, ...): KMEM_BUFS 4 KiB device buffers (MEM_ALLOC) or one-page imports
 * (MEM_IMPORT of one byte of the same page) made, the cgroup's charged slab read before and
 * after, then all freed. A first buffer of each kind is made and freed first (the per-file
 * records made once are not counted). Prints the two rows; exits non-zero on an error.
 */
static int kmem_child(void)
{
	double per[2][KMEM_ROUNDS], ratio[KMEM_ROUNDS], mid;
	static __u64 h[KMEM_BUFS];
	unsigned char *page;
	char pid[32], how[600];
	unsigned int r, k, i;
	struct ubuf b;
	int fd, ret;

	snprintf(pid, sizeof(pid), "%d", getpid());
	if (sysfs_write(KMEM_CG "/cgroup.procs", pid))
		return 3;
	fd = udma_open();
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fd < 0 || page == MAP_FAILED)
		return 4;
	page[0] = 1;
	if (ubuf_alloc(fd, NEURON_UDMA_MEM_DEVICE, 4096, &b) || ubuf_free(fd, &b) ||
	    udma_import(fd, page, 1, 0, &h[0], NULL) || mem_free(fd, h[0]))
		return 5;
	for (r = 0; r < 2 * KMEM_ROUNDS; r++) {
		long long s0, s1;

		k = r % 2;
		kmem_settle();
		s0 = kmem_slab();
		for (i = 0; i < KMEM_BUFS; i++) {
			if (k == 0) {
				struct neuron_udma_mem_alloc a = { .size = 4096,
								   .type = NEURON_UDMA_MEM_DEVICE };

				ret = udma_ioc(fd, NEURON_UDMA_MEM_ALLOC, &a);
				h[i] = a.handle;
			} else {
				ret = udma_import(fd, page, 1, 0, &h[i], NULL);
			}
			if (ret)
				die(k ? "MEM_IMPORT (kmem rows)" : "MEM_ALLOC (kmem rows)", ret);
		}
		s1 = kmem_slab();
		if (s0 < 0 || s1 < 0)
			return 6;
		per[k][r / 2] = (double)(s1 - s0) / KMEM_BUFS;
		for (i = 0; i < KMEM_BUFS; i++)
			if ((ret = mem_free(fd, h[i])))
				die("MEM_FREE (kmem rows)", ret);
	}
	close(fd);
	snprintf(how, sizeof(how),
		 "%u rounds of each kind alternating (4 KiB device buffers, one-page imports), each %u "
		 "buffers made in a memory cgroup of their own and freed again: the cgroup's charged "
		 "slab (memory.stat) before and after, per buffer; the median round, min and max; the "
		 "buffers' user memory (device memory, the pinned page) not counted; baseline: the (m) "
		 "bound, %.0f B", KMEM_ROUNDS, KMEM_BUFS, KMEM_BOUND);
	for (k = 0; k < 2; k++) {
		for (r = 0; r < KMEM_ROUNDS; r++)
			ratio[r] = per[k][r] / KMEM_BOUND;
		mid = median(per[k], KMEM_ROUNDS);
		result_range(k ? "kernel memory per one-page import" :
			     "kernel memory per 4 KiB device buffer", mid, "B", KMEM_BOUND, ratio,
			     KMEM_ROUNDS, how, NULL);
	}
	fflush(stdout);
	return 0;
}

/* The (m) rows: kmem_child in a fresh memory cgroup, which is removed afterwards. */
static void bench_kmem(void)
{
	int status = 0;
	pid_t pid;

	rmdir(KMEM_CG);
	if (sysfs_write("/sys/fs/cgroup/cgroup.subtree_control", "+memory") ||
	    (mkdir(KMEM_CG, 0755) && errno != EEXIST))
		die("the memory cgroup of the kmem rows (cgroup2 at /sys/fs/cgroup)", -errno ?: -EIO);
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork", -errno);
	if (!pid)
		_exit(kmem_child());
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		die("the kmem rows' child", -EIO);
	for (int i = 0; i < 50 && rmdir(KMEM_CG) && errno == EBUSY; i++)
		kmem_settle();
}

int main(int argc, char **argv)
{
	enum {
		M_SUB = 1, M_LOOKUP = 2, M_BATCH = 4, M_LAT = 8, M_SCALE = 16, M_URING = 32,
		M_WAKE = 64, M_FILL = 128, M_HOLES = 256, M_DEVRINGS = 512, M_KMEM = 1024,
	};
	unsigned int only = 0;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--subs") && i + 1 < argc)
			subs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			lat_runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--scale-runs") && i + 1 < argc)
			scale_runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--wake-runs") && i + 1 < argc)
			wake_runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			only_threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			only_batch = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--only-latency"))
			only |= M_LAT;
		else if (!strcmp(argv[i], "--only-submit"))
			only |= M_SUB;
		else if (!strcmp(argv[i], "--only-lookup"))
			only |= M_LOOKUP;
		else if (!strcmp(argv[i], "--only-batch"))
			only |= M_BATCH;
		else if (!strcmp(argv[i], "--only-scale"))
			only |= M_SCALE;
		else if (!strcmp(argv[i], "--only-uring"))
			only |= M_URING;
		else if (!strcmp(argv[i], "--only-wakeup"))
			only |= M_WAKE;
		else if (!strcmp(argv[i], "--only-fill"))
			only |= M_FILL;
		else if (!strcmp(argv[i], "--only-holes"))
			only |= M_HOLES;
		else if (!strcmp(argv[i], "--only-devrings"))
			only |= M_DEVRINGS;
		else if (!strcmp(argv[i], "--only-kmem"))
			only |= M_KMEM;
		else {
			fprintf(stderr, "usage: udma_bench [--subs N] [--runs N] [--scale-runs N] [--wake-runs N] "
				"[--threads 1|2] [--batch N] [--only-submit] [--only-lookup] [--only-batch] "
				"[--only-latency] [--only-scale] [--only-uring] [--only-wakeup] [--only-fill] "
				"[--only-holes] [--only-devrings] [--only-kmem]\n"
				"  --batch selects the submission rows' batch (0: PREPARE_ONE) and the batch-scale "
				"row (then without the user-copy row); --threads the submission rows' threads;\n"
				"  the --only-* options add up; without any, everything runs\n");
			return 2;
		}
	}
	if (!subs || !lat_runs || !scale_runs || !wake_runs || only_threads > 2)
		return 2;
	if (!only)
		only = M_SUB | M_LOOKUP | M_BATCH | M_LAT | M_SCALE | M_URING | M_WAKE | M_FILL | M_HOLES |
		       M_DEVRINGS | M_KMEM;
	if (only & M_SUB)
		bench_submission();
	if (only & M_LOOKUP)
		bench_lookup();
	if (only & M_BATCH)
		bench_batch();
	if (only & M_LAT) {
		bench_latency();
		bench_latency_floor();
	}
	if (only & M_SCALE)
		bench_latency_scale();
	if (only & M_URING)
		bench_uring();
	if (only & M_WAKE)
		bench_wakeup();
	if (only & M_FILL)
		bench_fill();
	if (only & M_DEVRINGS)
		bench_device_rings();
	if (only & M_KMEM)
		bench_kmem();
	/* Last: it fills device memory (and frees it all again). */
	if (only & M_HOLES)
		bench_holes();
	return 0;
}
