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
 *   buffer lookups: that time per pair for COPY_PREPARE x256 with 2 buffers open in the file,
 *       and with 1,000 open, the copies between the first and the last one allocated;
 *   latency: one 4-byte copy from COPY_PREPARE_ONE to a completed COPY_WAIT, p50/p99, against
 *       a null ioctl (NEURON_UDMA_INFO) as the syscall floor, with the model's BAR2 counters.
 *
 * Every result is one line `NU-BENCH {json}` on stdout (name, value, unit, baseline, ratio,
 * how). Progress and errors go to stderr. Built statically by scripts/bench in the toolchain root.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "udma_util.h"

#define RING 4096U
#define PER_SUB 2032U		/* pairs per COPY_WAIT (the driver's MAX_PAIRS_PER_SUBMISSION) */
#define COPY_SIZE 4U
#define BUF_SIZE (1U << 20)

#define LOOKUP_BUFS 1000U	/* buffers open in the file for the lookup row */
#define LOOKUP_REPS 3U		/* runs per lookup figure, the best counts */

static unsigned int subs = 8;		/* submissions per measurement */
static unsigned int lat_runs = 10000;
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

static void result(const char *name, double value, const char *unit, double baseline,
		   const char *how)
{
	printf("NU-BENCH {\"name\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"baseline\":%.6g,"
	       "\"ratio\":%.4g,\"how\":\"%s\"}\n",
	       name, value, unit, baseline, baseline > 0 ? value / baseline : 0.0, how);
	fflush(stdout);
}

/* One queue with its buffers, owned by one file. */
struct qctx {
	int fd;
	__u32 eng, q;
	struct ubuf src, dst;
	struct neuron_udma_copy *copies;	/* PER_SUB entries */
	/* in: batch (0 = PREPARE_ONE), out: seconds */
	unsigned int batch;
	double secs;
	double prep_secs;	/* of which inside COPY_PREPARE(_ONE) calls */
	int err;
};

static void qctx_open(struct qctx *c, __u32 eng, __u32 q)
{
	unsigned int i;
	int ret;

	memset(c, 0, sizeof(*c));
	c->eng = eng;
	c->q = q;
	c->fd = udma_open();
	if (c->fd < 0)
		die("open " UDMA_DEV, -errno);
	ret = queue_init(c->fd, eng, q, RING, RING);
	if (ret)
		die("QUEUE_INIT", ret);
	ret = ubuf_host(c->fd, BUF_SIZE, &c->src);
	if (!ret)
		ret = ubuf_host(c->fd, BUF_SIZE, &c->dst);
	if (ret)
		die("MEM_ALLOC", ret);
	fill_pattern(c->src.map, BUF_SIZE, eng * 16 + q);
	c->copies = calloc(PER_SUB, sizeof(*c->copies));
	if (!c->copies)
		die("calloc", -ENOMEM);
	for (i = 0; i < PER_SUB; i++)
		c->copies[i] = ucopy(&c->src, i * 64, &c->dst, i * 64, COPY_SIZE);
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

/* Time inside COPY_PREPARE x256 for @subs submissions, best of LOOKUP_REPS runs. */
static double lookup_best(struct qctx *c)
{
	double best = 0;
	unsigned int r;
	int ret;

	for (r = 0; r < LOOKUP_REPS; r++) {
		ret = submit(c, 256, subs);
		if (ret)
			die("lookup", ret);
		if (!r || c->prep_secs < best)
			best = c->prep_secs;
	}
	return best;
}

/*
 * COPY_PREPARE x256 time per pair with the file holding 2 buffers (every copy between them), then
 * with LOOKUP_BUFS buffers open, every copy from the first buffer allocated to the last one (the
 * far end of a list for a lookup that scans from either end): what the per-copy handle lookups
 * cost as the file's buffer set grows, with the same two buffers touched in both runs.
 */
static void bench_lookup(void)
{
	struct ubuf *bufs;
	struct qctx c;
	double two, many;
	char how[512];
	unsigned int i;
	int ret;

	bufs = calloc(LOOKUP_BUFS, sizeof(*bufs));
	if (!bufs)
		die("calloc", -ENOMEM);
	qctx_open(&c, 0, 1);
	ret = submit(&c, 256, 1);		/* warm-up */
	if (ret)
		die("lookup, 2 buffers", ret);
	two = lookup_best(&c);
	/* The queue's two buffers count: LOOKUP_BUFS in all. */
	for (i = 2; i < LOOKUP_BUFS; i++) {
		ret = ubuf_host(c.fd, 4096, &bufs[i]);
		if (ret)
			die("MEM_ALLOC (lookup buffers)", ret);
	}
	for (i = 0; i < PER_SUB; i++)
		c.copies[i] = ucopy(&c.src, i * 64, &bufs[LOOKUP_BUFS - 1], (i * COPY_SIZE) % 4096,
				    COPY_SIZE);
	ret = submit(&c, 256, 1);		/* warm-up */
	if (ret)
		die("lookup, many buffers", ret);
	many = lookup_best(&c);
	snprintf(how, sizeof(how),
		 "COPY_PREPARE x256 on one queue, best of %u runs of %u submissions of %u pairs, time "
		 "inside the COPY_PREPARE calls only, with %u buffers open in the file, every copy from "
		 "the first buffer allocated to the last; baseline: the same copies with 2 buffers open "
		 "in the file",
		 LOOKUP_REPS, subs, PER_SUB, LOOKUP_BUFS);
	result("COPY_PREPARE x256 per pair, 1000 buffers open", many * 1e9 / ((double)subs * PER_SUB),
	       "ns/pair", two * 1e9 / ((double)subs * PER_SUB), how);
	for (i = 2; i < LOOKUP_BUFS; i++)
		ubuf_free(c.fd, &bufs[i]);
	qctx_close(&c);
	free(bufs);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
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

int main(int argc, char **argv)
{
	bool do_sub = true, do_lat = true, do_lookup = true;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--subs") && i + 1 < argc)
			subs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			lat_runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			only_threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			only_batch = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--only-latency"))
			do_sub = do_lookup = false;
		else if (!strcmp(argv[i], "--only-submit"))
			do_lat = do_lookup = false;
		else if (!strcmp(argv[i], "--only-lookup"))
			do_sub = do_lat = false;
		else {
			fprintf(stderr, "usage: udma_bench [--subs N] [--runs N] [--threads 1|2] [--batch N] "
				"[--only-latency|--only-submit|--only-lookup]\n"
				"  --batch 0 is PREPARE_ONE; --threads and --batch select submission rows\n");
			return 2;
		}
	}
	if (!subs || !lat_runs || only_threads > 2)
		return 2;
	if (do_sub)
		bench_submission();
	if (do_lookup)
		bench_lookup();
	if (do_lat)
		bench_latency();
	return 0;
}
