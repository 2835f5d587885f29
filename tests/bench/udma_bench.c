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
 *       and with 1,000 open, the copies between the first and the last one allocated, then with
 *       every entry of a call on buffers no other entry of that call names;
 *   batch scale: the time inside COPY_PREPARE per pair for 1, 16, 256, 2032 and 4096 entries per
 *       call (8192-slot rings; START + WAIT outside the timed part), and the user copy of one
 *       entry (what each entry adds to a COPY_PREPARE that fails right after reading its array);
 *   latency: one 4-byte copy from COPY_PREPARE_ONE to a completed COPY_WAIT, p50/p99, against
 *       a null ioctl (NEURON_UDMA_INFO) as the syscall floor, with the model's BAR2 counters;
 *       then, in one phase, PREPARE_ONE + START + WAIT interleaved with its floor PREPARE_ONE +
 *       START (the same calls without the wait) and with PREPARE_ONE + WAIT: p50, p99, p99.9 and
 *       the floor's spread, with the guest's /proc/loadavg before and after;
 *   latency scale: PREPARE_ONE + START + WAIT p50/p99 (and its interleaved floor) with 1, 2, 10,
 *       100 and 1,000 host buffers open in the file, and with 1, 4 and 16 queues initialised;
 *   rings in device memory: the time of PREPARE_ONE (or COPY_PREPARE xN) + COPY_START per pair on
 *       a queue whose rings are in HBM (NEURON_UDMA_QUEUE_DEVICE_RINGS), the descriptors written
 *       through BAR4 or moved by the driver's H2T queue (the device_ring_fill module parameter),
 *       against the same calls on a queue with host rings.
 *
 * Every result is one line `NU-BENCH {json}` on stdout (name, value, unit, baseline, ratio,
 * how, and for some rows more fields: load_start/load_end, floor_us). Progress and errors go to
 * stderr. Built statically by scripts/bench in the toolchain root.
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

#define SCALE_RING 8192U	/* batch scale: rings that hold 4096 pairs + marker + reserve */
#define SCALE_PAIRS 4096U	/* batch scale: most pairs per submission (MAX_BATCH) */
#define UCOPY_BATCH 2032U	/* user-copy row: entries of the failing COPY_PREPARE */
#define UCOPY_REPS 2000U	/* user-copy row: failing calls of each size */
#define UNOWNED_Q 3U		/* a queue of engine 0 that no file of this program takes */
#define SMALL_BUF 4096U		/* the buffers of the lookup and open-buffer rows */

#define DR_ENG 0U		/* rings in device memory: the engine of the three queues */
#define DR_FILL "/sys/module/neuron_udma/parameters/device_ring_fill"

/* Entries per COPY_PREPARE call of the batch-scale rows. */
static const unsigned int scale_batches[] = { 1, 16, 256, 2032, 4096 };
/* Host buffers open in the file, then queues initialised, of the latency-scale rows. */
static const unsigned int scale_bufs[] = { 1, 2, 10, 100, 1000 };
static const unsigned int scale_queues[] = { 1, 4, 16 };

static unsigned int subs = 8;		/* submissions per measurement */
static unsigned int lat_runs = 10000;
static unsigned int scale_runs = 2000;	/* rounds per point of the latency-scale rows */
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
 * cost as the file's buffer set grows, with the same two buffers touched in both runs. Then, with
 * the same LOOKUP_BUFS buffers, copy i of a submission goes from buffer 2i to buffer 2i + 1
 * (modulo LOOKUP_BUFS, in allocation order): the 256 entries of a call name 512 buffers, no two
 * entries the same one, so no per-call reuse of a lookup helps.
 */
static void bench_lookup(void)
{
	struct ubuf *bufs, **all;
	struct qctx c;
	double two, many, spread;
	char how[640];
	unsigned int i;
	int ret;

	bufs = calloc(LOOKUP_BUFS, sizeof(*bufs));
	all = calloc(LOOKUP_BUFS, sizeof(*all));
	if (!bufs || !all)
		die("calloc", -ENOMEM);
	qctx_open(&c, 0, 1);
	if (file_max_buffers(c.fd) < LOOKUP_BUFS) {
		fprintf(stderr, "udma_bench: a file may hold %u buffers (INFO max_buffers), the lookup "
			"rows need %u: left out\n", file_max_buffers(c.fd), LOOKUP_BUFS);
		qctx_close(&c);
		free(all);
		free(bufs);
		return;
	}
	ret = submit(&c, 256, 1);		/* warm-up */
	if (ret)
		die("lookup, 2 buffers", ret);
	two = lookup_best(&c);
	/* The queue's two buffers count: LOOKUP_BUFS in all. */
	for (i = 2; i < LOOKUP_BUFS; i++) {
		ret = ubuf_host(c.fd, SMALL_BUF, &bufs[i]);
		if (ret)
			die("MEM_ALLOC (lookup buffers)", ret);
	}
	for (i = 0; i < PER_SUB; i++)
		c.copies[i] = ucopy(&c.src, i * 64, &bufs[LOOKUP_BUFS - 1], (i * COPY_SIZE) % SMALL_BUF,
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

	/* Every entry of a call on two buffers of its own: the queue's two, then the others. */
	all[0] = &c.src;
	all[1] = &c.dst;
	for (i = 2; i < LOOKUP_BUFS; i++)
		all[i] = &bufs[i];
	for (i = 0; i < PER_SUB; i++)
		c.copies[i] = ucopy(all[(2 * i) % LOOKUP_BUFS], (i * COPY_SIZE) % SMALL_BUF,
				    all[(2 * i + 1) % LOOKUP_BUFS], (i * COPY_SIZE) % SMALL_BUF, COPY_SIZE);
	ret = submit(&c, 256, 1);		/* warm-up */
	if (ret)
		die("lookup, a different buffer per entry", ret);
	spread = lookup_best(&c);
	snprintf(how, sizeof(how),
		 "COPY_PREPARE x256 on one queue, best of %u runs of %u submissions of %u pairs, time "
		 "inside the COPY_PREPARE calls only, %u buffers open in the file, copy i from buffer "
		 "2i to buffer 2i+1 (mod %u, allocation order): the 256 entries of a call name 512 "
		 "different buffers; baseline: the same calls with every copy between the 2 buffers of "
		 "a file holding only them (the baseline of the row above)",
		 LOOKUP_REPS, subs, PER_SUB, LOOKUP_BUFS, LOOKUP_BUFS);
	result("COPY_PREPARE x256 per pair, 1000 buffers, a different buffer per entry",
	       spread * 1e9 / ((double)subs * PER_SUB), "ns/pair", two * 1e9 / ((double)subs * PER_SUB),
	       how);
	for (i = 2; i < LOOKUP_BUFS; i++)
		ubuf_free(c.fd, &bufs[i]);
	qctx_close(&c);
	free(all);
	free(bufs);
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
	unsigned int r, k;
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
	for (r = 0; r < UCOPY_REPS; r++)
		for (k = 0; k < 2; k++) {
			unsigned int n = (r + k) % 2 ? UCOPY_BATCH : 1;
			double t0 = now();

			ret = prep(c->fd, 0, UNOWNED_Q, c->copies, n);
			(n == 1 ? one : many)[r] = now() - t0;
			if (ret != -ENOENT)
				die("COPY_PREPARE on a foreign queue (expected ENOENT)", ret ? ret : -EPROTO);
		}
	m1 = median(one, UCOPY_REPS);
	mn = median(many, UCOPY_REPS);
	per = (mn - m1) * 1e9 / (UCOPY_BATCH - 1);
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
 * Per-pair cost of COPY_PREPARE against its batch size: one queue (engine 0, queue 2) with
 * SCALE_RING-slot rings, 4-byte host->host copies between two 1 MiB buffers, for each size of
 * scale_batches best of LOOKUP_REPS runs of @subs submissions. Before them, the user copy of one
 * entry (bench_user_copy), the other half of these rows' baseline.
 */
static void bench_batch(void)
{
	struct neuron_udma_info info;
	unsigned int b, r;
	char name[96], how[640];
	struct qctx c;
	int ret;

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

/* Kinds of latency sample: the floor, the copy with START, the copy without. */
enum { K_FLOOR, K_START_WAIT, K_WAIT, K_NUM };

/*
 * @n rounds on queue (@eng, @q) of file @fd, each one sample of each of the first @nkinds kinds,
 * the order rotating from round to round (no kind always follows the same one):
 *   K_FLOOR       PREPARE_ONE + COPY_START (1, 1), timed; then an untimed COPY_WAIT retires the
 *                 pair (the queue is idle again before the next sample);
 *   K_START_WAIT  PREPARE_ONE + COPY_START (1, 1) + COPY_WAIT: the floor's calls, then the wait
 *                 (which appends the marker pair, rings for it and waits);
 *   K_WAIT        PREPARE_ONE + COPY_WAIT (the wait rings for the data and the marker pair at once).
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
 * three kinds of lat_samples() on engine 0 queue 1, interleaved. The floor (PREPARE_ONE +
 * START) is the copy's own submission: the same two system calls, the same descriptor pair and
 * the same two doorbell writes, without the wait, so every copy sample costs at least one floor
 * sample's work. The guest's load average is read before and after.
 */
static void bench_latency_floor(void)
{
	double **s = lat_arrays(lat_runs);
	double *fl, *sw, *w, f50;
	char how[900], extra[160], l0[40], l1[40];
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
	qsort(fl, lat_runs, sizeof(double), cmp_double);
	qsort(sw, lat_runs, sizeof(double), cmp_double);
	qsort(w, lat_runs, sizeof(double), cmp_double);
	f50 = pctf(fl, lat_runs, 0.5);
	snprintf(extra, sizeof(extra), "\"load_start\":\"%s\",\"load_end\":\"%s\"", l0, l1);
	snprintf(how, sizeof(how),
		 "%u rounds on engine 0 queue 1, each one sample of three kinds, interleaved (order "
		 "rotating): PREPARE_ONE + START (1,1) (the floor: the copy's two system calls, pair and "
		 "two doorbells without the wait; an untimed COPY_WAIT retires it), PREPARE_ONE + START "
		 "+ WAIT, PREPARE_ONE + WAIT; 4 B host->host; floor p50 %.1f, p99 %.1f, min %.1f, max "
		 "%.1f us; START + WAIT p50 %.1f, p99 %.1f, p99.9 %.1f us; WAIT only p50 %.1f, p99 %.1f, "
		 "p99.9 %.1f us; guest load average %s before, %s after",
		 lat_runs, f50 * 1e6, pctf(fl, lat_runs, 0.99) * 1e6, fl[0] * 1e6, fl[lat_runs - 1] * 1e6,
		 pctf(sw, lat_runs, 0.5) * 1e6, pctf(sw, lat_runs, 0.99) * 1e6,
		 pctf(sw, lat_runs, 0.999) * 1e6, pctf(w, lat_runs, 0.5) * 1e6,
		 pctf(w, lat_runs, 0.99) * 1e6, pctf(w, lat_runs, 0.999) * 1e6, l0, l1);
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

int main(int argc, char **argv)
{
	enum { M_SUB = 1, M_LOOKUP = 2, M_BATCH = 4, M_LAT = 8, M_SCALE = 16, M_DEVRINGS = 32 };
	unsigned int only = 0;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--subs") && i + 1 < argc)
			subs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
			lat_runs = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--scale-runs") && i + 1 < argc)
			scale_runs = atoi(argv[++i]);
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
		else if (!strcmp(argv[i], "--only-devrings"))
			only |= M_DEVRINGS;
		else {
			fprintf(stderr, "usage: udma_bench [--subs N] [--runs N] [--scale-runs N] [--threads 1|2] "
				"[--batch N] [--only-submit] [--only-lookup] [--only-batch] [--only-latency] "
				"[--only-scale] [--only-devrings]\n"
				"  --batch selects the submission rows' batch (0: PREPARE_ONE) and the batch-scale "
				"row (then without the user-copy row); --threads the submission rows' threads;\n"
				"  the --only-* options add up; without any, everything runs\n");
			return 2;
		}
	}
	if (!subs || !lat_runs || !scale_runs || only_threads > 2)
		return 2;
	if (!only)
		only = M_SUB | M_LOOKUP | M_BATCH | M_LAT | M_SCALE | M_DEVRINGS;
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
	if (only & M_DEVRINGS)
		bench_device_rings();
	return 0;
}
