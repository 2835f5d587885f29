// SPDX-License-Identifier: GPL-2.0
/*
 * What one user can do to another user and to the device through the neuron_udma ABI
 * (Documentation/userspace-api.rst, "Security model"): mmap racing MEM_FREE while another user
 * reuses the pages, one user's MEMCPY timeouts against another user's MEMCPYs, device memory
 * handed from one owner to the next, the RLIMIT_MEMLOCK charge of host buffers, files with many
 * buffers, MEM_ALLOC failing with EFAULT, and read-only file descriptors.
 *
 * The tests run as root and set up the guest themselves: "/" and /tmp usable by everybody,
 * the device node's mode; the unprivileged users are uid 1001 and 1002 (setresuid in forked
 * children, no /etc/passwd needed). The one queue is on engine 6, which uapi_test does not use,
 * so that a queue a broken driver leaves aborted does not fail the tests that run next.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sched.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024U
#define MIB (1024U * 1024)

/* Tests that need nothing but a timeout of their own. */
FIXTURE(misc) {
	int unused;
};

FIXTURE_SETUP(misc)
{
	self->unused = 0;
}

FIXTURE_TEARDOWN(misc)
{
}

/* ---- mmap racing MEM_FREE ---- */

#define RACE_BUF MIB
#define RACE_ITERS 300
#define RACE_MS 5000
#define RACE_MAX_SPIN 4000000	/* a few ms on the emulated guest */
#define FILL_MAGIC 0x3230303144495521ULL	/* "!UID1002" little-endian */

struct race_report {
	volatile int stop, filler_ready;
	int filler_fills;
	int iters, raced_maps, both_ok, free_refused;
	int violations, leaks, setup_err;
	long bad_page;
	int bad_sig, bad_mapping, final_delay;
};

/* uid B: allocates 1 MiB host buffers, fills them through its mapping, frees them, again. */
static int race_filler(void *arg)
{
	struct race_report *r = arg;
	struct ubuf bufs[4] = { 0 };
	int fd = udma_open(), i = 0;
	size_t w;

	if (fd < 0)
		return 1;
	r->filler_ready = 1;
	while (!r->stop) {
		if (bufs[i].handle)
			ubuf_free(fd, &bufs[i]);
		if (!ubuf_host(fd, RACE_BUF, &bufs[i])) {
			for (w = 0; w < RACE_BUF / 8; w++)
				((__u64 *)bufs[i].map)[w] = FILL_MAGIC;
			r->filler_fills++;
		}
		i = (i + 1) % 4;
		sleep_ms(5);
	}
	return 0;
}

/* The mmap side of the race: a thread that maps (fd, off) once the main thread says go. */
struct racer {
	pthread_t t;
	int fd;
	__u64 off;
	int delay;		/* spins before the mmap */
	int ready, go;
	void *map;
};

/* Runs the calling thread on CPU @cpu (of those online), so that racing threads overlap. */
static void pin_cpu(int cpu)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(n > 0 ? cpu % n : 0, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

static void spin(int n)
{
	volatile int k;

	for (k = 0; k < n; k++)
		;
}

static void *mmap_racer(void *arg)
{
	struct racer *r = arg;

	pin_cpu(1);
	__atomic_store_n(&r->ready, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&r->go, __ATOMIC_ACQUIRE))
		;
	spin(r->delay);
	r->map = mmap(NULL, RACE_BUF, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, r->off);
	return NULL;
}

static const long race_pages[] = { 0, RACE_BUF / 4096 / 2, RACE_BUF / 4096 - 1 };

/*
 * Probes three pages of a mapping of a freed buffer: each access must raise SIGBUS. Returns
 * the number of accesses that did not.
 */
static int probe_freed(struct race_report *r, unsigned char *map, int which)
{
	int bad = 0, sig;
	unsigned char v;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(race_pages); i++) {
		unsigned char *p = map + race_pages[i] * 4096;

		sig = sec_probe(p, false, &v);
		if (sig == SIGBUS) {
			/* Writing is safe only where reading already faulted. */
			sig = sec_probe(p, true, NULL);
			if (sig == SIGBUS)
				continue;
		}
		if (!bad++ && !r->violations) {
			r->bad_page = race_pages[i];
			r->bad_sig = sig;
			r->bad_mapping = which;
		}
	}
	return bad;
}

/*
 * A mapping of a freed buffer that still reads: watch it for 100 ms while uid B reallocates;
 * counts the pages where uid B's data shows up.
 */
static void watch_leak(struct race_report *r, unsigned char *map)
{
	bool seen[ARRAY_SIZE(race_pages)] = { false };
	unsigned char v;
	size_t i;
	int t;

	for (t = 0; t < 10; t++) {
		sleep_ms(10);
		for (i = 0; i < ARRAY_SIZE(race_pages); i++) {
			unsigned char *p = map + race_pages[i] * 4096;

			if (seen[i] || sec_probe(p, false, &v) != PROBE_OK)
				continue;
			if (*(volatile __u64 *)p == FILL_MAGIC) {
				seen[i] = true;
				r->leaks++;
			}
		}
	}
}

/* uid A: maps and frees its buffers, racing the mmap against the free, and probes the result. */
static int race_main(void *arg)
{
	struct race_report *r = arg;
	int fd, i, delay = 0, step;
	double t0;

	fd = udma_open();
	if (fd < 0 || sec_probe_install())
		return 1;
	pin_cpu(0);
	while (!r->filler_ready)
		sleep_ms(1);
	t0 = now_ms();
	for (i = 0; i < RACE_ITERS && now_ms() - t0 < RACE_MS; i++) {
		/* delay > 0 holds the free back, delay < 0 the mmap. */
		struct racer rc = { .fd = fd, .delay = delay < 0 ? -delay : 0 };
		unsigned char *m0;
		__u64 handle;
		int fr, bad;
		size_t k;

		if (raw_alloc(fd, NEURON_UDMA_MEM_HOST, RACE_BUF, &handle, &rc.off)) {
			r->setup_err = 2;
			break;
		}
		/* A mapping made (and faulted in) before the free. */
		m0 = mmap(NULL, RACE_BUF, PROT_READ | PROT_WRITE, MAP_SHARED, fd, rc.off);
		if (m0 == MAP_FAILED) {
			r->setup_err = 3;
			break;
		}
		for (k = 0; k < ARRAY_SIZE(race_pages); k++)
			m0[race_pages[k] * 4096] = 0x11;
		if (pthread_create(&rc.t, NULL, mmap_racer, &rc)) {
			r->setup_err = 4;
			break;
		}
		while (!__atomic_load_n(&rc.ready, __ATOMIC_ACQUIRE))
			sched_yield();
		__atomic_store_n(&rc.go, 1, __ATOMIC_RELEASE);
		spin(delay > 0 ? delay : 0);
		fr = mem_free(fd, handle);
		pthread_join(rc.t, NULL);
		r->iters++;
		/*
		 * Aim at the free landing just as the mmap found the buffer (each wins half of
		 * the races): the free won, so hold it back more next time; the mmap won, so
		 * less. The steps scale with the delay and vary, to spread the races around it.
		 */
		step = 10 + abs(delay) / 6 + (i * 37) % 90;
		delay += rc.map == MAP_FAILED ? step : -step;
		delay = delay > RACE_MAX_SPIN ? RACE_MAX_SPIN : delay < -RACE_MAX_SPIN ? -RACE_MAX_SPIN : delay;
		if (rc.map != MAP_FAILED)
			r->raced_maps++;
		if (fr) {
			/* Refusing the free is allowed; the buffer must then still work. */
			r->free_refused++;
			if (rc.map != MAP_FAILED)
				munmap(rc.map, RACE_BUF);
			munmap(m0, RACE_BUF);
			if (mem_free(fd, handle)) {
				r->setup_err = 5;
				break;
			}
			continue;
		}
		if (rc.map != MAP_FAILED) {
			r->both_ok++;
			bad = probe_freed(r, rc.map, 2);
			if (bad && r->violations < 10)
				watch_leak(r, rc.map);
			r->violations += bad;
			munmap(rc.map, RACE_BUF);
		}
		bad = probe_freed(r, m0, 1);
		if (bad && r->violations < 10)
			watch_leak(r, m0);
		r->violations += bad;
		munmap(m0, RACE_BUF);
	}
	r->final_delay = delay;
	return 0;
}

/*
 * mmap racing MEM_FREE. Once MEM_FREE returned, every access through any mapping of the freed
 * buffer is SIGBUS; the pages another uid's new buffer reuses are never visible through it. uid 1001 races, uid 1002 reallocates and fills 1 MiB buffers meanwhile.
 */
TEST_F_TIMEOUT(misc, mmap_races_mem_free, 60)
{
	struct race_report *r = sec_shared(sizeof(*r));
	pid_t filler, racer;
	int rc_f, rc_r;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, sec_memlock(64 * MIB));
	filler = sec_spawn(UID_B, race_filler, r);
	ASSERT_LT(0, filler);
	racer = sec_spawn(UID_A, race_main, r);
	ASSERT_LT(0, racer);
	rc_r = sec_reap(racer);
	r->stop = 1;
	rc_f = sec_reap(filler);
	TH_LOG("%d iterations, %d mmaps succeeded, %d with the free succeeding too, %d frees refused, %d fills by uid %d, final delay %d",
	       r->iters, r->raced_maps, r->both_ok, r->free_refused, r->filler_fills, UID_B,
	       r->final_delay);
	ASSERT_EQ(0, rc_r);
	ASSERT_EQ(0, rc_f);
	ASSERT_EQ(0, r->setup_err);
	ASSERT_LT(0, r->iters);
	EXPECT_EQ(0, r->violations) {
		TH_LOG("accesses to freed buffers that were not SIGBUS: %d (first: mapping %s, page %ld, %s)",
		       r->violations, r->bad_mapping == 2 ? "raced" : "earlier", r->bad_page,
		       r->bad_sig ? strsignal(r->bad_sig) : "no fault");
	}
	EXPECT_EQ(0, r->leaks) {
		TH_LOG("uid %d's data seen through a freed mapping of uid %d: %d pages", UID_B, UID_A,
		       r->leaks);
	}
}

/* ---- one user's MEMCPY timeout against another user's MEMCPY ---- */

#define MC_A_SIZE (256 * KIB)
#define MC_B_SIZE (16 * MIB)
#define MC_MS 3000

struct mc_report {
	volatile int go, stop;
	int a_setup, a_iters, a_fail, a_first_err, a_eio, a_bad;
	long a_first_diff;
	int b_setup, b_iters, b_ok, b_timeout, b_other, b_first_other;
};

/* uid A: 256 KiB host -> host with the default timeout, bytes checked each time. */
static int mc_a(void *arg)
{
	struct mc_report *r = arg;
	struct ubuf s, d;
	int fd = udma_open(), ret;
	long diff;

	if (fd < 0 || ubuf_host(fd, MC_A_SIZE, &s) || ubuf_host(fd, MC_A_SIZE, &d)) {
		r->a_setup = 1;
		return 1;
	}
	while (!r->go)
		sleep_ms(1);
	while (!r->stop) {
		fill_pattern(s.map, MC_A_SIZE, r->a_iters + 1);
		memset(d.map, 0, MC_A_SIZE);
		ret = udma_memcpy(fd, &s, 0, &d, 0, MC_A_SIZE, 0);
		r->a_iters++;
		if (ret) {
			if (!r->a_fail++)
				r->a_first_err = -ret;
			r->a_eio += ret == -EIO;
			continue;
		}
		diff = first_diff(d.map, s.map, MC_A_SIZE);
		if (diff >= 0 && !r->a_bad++)
			r->a_first_diff = diff;
	}
	return 0;
}

/* uid B: 16 MiB device -> device with a 1 ms timeout. */
static int mc_b(void *arg)
{
	struct mc_report *r = arg;
	struct ubuf s, d;
	int fd = udma_open(), ret;

	if (fd < 0 || ubuf_dev(fd, MC_B_SIZE, &s) || ubuf_dev(fd, MC_B_SIZE, &d)) {
		r->b_setup = 1;
		return 1;
	}
	while (!r->go)
		sleep_ms(1);
	while (!r->stop) {
		ret = udma_memcpy(fd, &s, 0, &d, 0, MC_B_SIZE, 1);
		r->b_iters++;
		if (!ret) {
			r->b_ok++;
		} else if (ret == -ETIMEDOUT) {
			r->b_timeout++;
		} else if (!r->b_other++) {
			r->b_first_other = -ret;
		}
	}
	return 0;
}

/*
 * uid 1002's MEMCPYs timing out (timeout_ms 1) must not break uid 1001's MEMCPYs: every one of
 * them returns 0 with the bytes written.
 */
TEST_F_TIMEOUT(misc, memcpy_timeout_isolation, 60)
{
	struct mc_report *r = sec_shared(sizeof(*r));
	pid_t a, b;
	int rc_a, rc_b;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, sec_memlock(64 * MIB));
	a = sec_spawn(UID_A, mc_a, r);
	ASSERT_LT(0, a);
	b = sec_spawn(UID_B, mc_b, r);
	ASSERT_LT(0, b);
	sleep_ms(300);
	r->go = 1;
	sleep_ms(MC_MS);
	r->stop = 1;
	rc_a = sec_reap(a);
	rc_b = sec_reap(b);
	ASSERT_EQ(0, rc_a);
	ASSERT_EQ(0, rc_b);
	TH_LOG("uid %d: %d MEMCPYs, %d failed (%d EIO), %d returned 0 with wrong bytes",
	       UID_A, r->a_iters, r->a_fail, r->a_eio, r->a_bad);
	TH_LOG("uid %d: %d MEMCPYs, %d ok, %d ETIMEDOUT, %d other errors", UID_B, r->b_iters,
	       r->b_ok, r->b_timeout, r->b_other);
	ASSERT_LT(0, r->a_iters);
	ASSERT_LT(0, r->b_iters);
	EXPECT_EQ(0, r->a_fail) {
		TH_LOG("first failure of uid %d: %s", UID_A, strerror(r->a_first_err));
	}
	EXPECT_EQ(0, r->a_bad) {
		TH_LOG("first wrong byte at %ld", r->a_first_diff);
	}
	EXPECT_EQ(0, r->b_other) {
		TH_LOG("uid %d: %s (want 0 or ETIMEDOUT)", UID_B, strerror(r->b_first_other));
	}
}

/* ---- device memory from one owner to the next ---- */

#define SECRET_SIZE MIB

struct clear_report {
	__u64 dev_bufs, nonzero_bufs, secret_bufs;
	long first_nonzero;
	int step;
};

/* uid A: DMA-copies a secret into a 1 MiB device buffer and exits. */
static int clear_owner_a(void *arg)
{
	struct clear_report *r = arg;
	struct ubuf s, d, back;
	int fd = udma_open();

	r->step = 1;
	if (fd < 0 || ubuf_host(fd, SECRET_SIZE, &s) || ubuf_host(fd, SECRET_SIZE, &back) ||
	    ubuf_dev(fd, SECRET_SIZE, &d))
		return 1;
	fill_pattern(s.map, SECRET_SIZE, 0x5ec7e7);
	r->step = 2;
	if (udma_memcpy(fd, &s, 0, &d, 0, SECRET_SIZE, 0) ||
	    udma_memcpy(fd, &d, 0, &back, 0, SECRET_SIZE, 0))
		return 2;
	r->step = 3;
	return first_diff(back.map, s.map, SECRET_SIZE) == -1 ? 0 : 3;
}

/* uid B: allocates all the device memory it can in 1 MiB buffers; each must read as zeros. */
static int clear_owner_b(void *arg)
{
	struct clear_report *r = arg;
	unsigned char *secret = malloc(SECRET_SIZE), *zero = calloc(1, SECRET_SIZE);
	struct neuron_udma_info info;
	struct ubuf h, d;
	int fd = udma_open();
	__u64 i;

	r->step = 11;
	if (!secret || !zero || fd < 0 || udma_info(fd, &info) || ubuf_host(fd, SECRET_SIZE, &h))
		return 11;
	fill_pattern(secret, SECRET_SIZE, 0x5ec7e7);
	for (i = 0; i < info.device_mem_size / SECRET_SIZE; i++) {
		long diff;

		if (ubuf_dev(fd, SECRET_SIZE, &d))
			break;
		memset(h.map, 0xEE, SECRET_SIZE);
		r->step = 12;
		if (udma_memcpy(fd, &d, 0, &h, 0, SECRET_SIZE, 0))
			return 12;
		r->dev_bufs++;
		diff = first_diff(h.map, zero, SECRET_SIZE);
		if (diff >= 0) {
			if (!r->nonzero_bufs++)
				r->first_nonzero = (long)(i * SECRET_SIZE) + diff;
			r->secret_bufs += !memcmp(h.map, secret, SECRET_SIZE);
		}
	}
	r->step = 0;
	return 0;
}

/*
 * Device memory is cleared between owners. uid 1001 leaves a secret in a device buffer; every
 * device buffer uid 1002 then gets reads as zeros.
 */
TEST_F_TIMEOUT(misc, device_memory_cleared_between_owners, 120)
{
	struct clear_report *r = sec_shared(sizeof(*r));
	int rc;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, sec_memlock(64 * MIB));
	rc = sec_reap(sec_spawn(UID_A, clear_owner_a, r));
	ASSERT_EQ(0, rc) {
		TH_LOG("uid %d failed at step %d", UID_A, r->step);
	}
	rc = sec_reap(sec_spawn(UID_B, clear_owner_b, r));
	ASSERT_EQ(0, rc) {
		TH_LOG("uid %d failed at step %d", UID_B, r->step);
	}
	TH_LOG("uid %d read %llu MiB of new device buffers", UID_B, (unsigned long long)r->dev_bufs);
	ASSERT_LE(1ULL, r->dev_bufs);
	EXPECT_EQ(0ULL, r->nonzero_bufs) {
		TH_LOG("%llu buffers not zero (first byte at %ld); %llu hold uid %d's secret",
		       (unsigned long long)r->nonzero_bufs, r->first_nonzero,
		       (unsigned long long)r->secret_bufs, UID_A);
	}
	EXPECT_EQ(0ULL, r->secret_bufs);
}

/* ---- pinned host memory is charged to RLIMIT_MEMLOCK; many buffers ---- */

#define MEMLOCK (8 * MIB)

struct memlock_report {
	int step, err;
};

#define MSTEP(r, n, expr, want) do {						\
	int __ret = (expr);							\
	(r)->step = (n);							\
	if (__ret != (want)) {							\
		(r)->err = __ret;						\
		return n;							\
	}									\
} while (0)

static int memlock_child(void *arg)
{
	struct memlock_report *r = arg;
	__u64 h1, h2, h3, h4, h5;
	int fd = udma_open();

	MSTEP(r, 1, fd < 0 ? -errno : 0, 0);
	MSTEP(r, 2, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &h1, NULL), 0);
	MSTEP(r, 3, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &h2, NULL), 0);
	MSTEP(r, 4, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * KIB, &h3, NULL), -ENOMEM);
	MSTEP(r, 5, mem_free(fd, h1), 0);
	MSTEP(r, 6, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &h3, NULL), 0);
	MSTEP(r, 7, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * KIB, &h4, NULL), -ENOMEM);
	close(fd);
	fd = udma_open();
	MSTEP(r, 8, fd < 0 ? -errno : 0, 0);
	MSTEP(r, 9, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &h4, NULL), 0);
	MSTEP(r, 10, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * MIB, &h5, NULL), 0);
	MSTEP(r, 11, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4 * KIB, &h1, NULL), -ENOMEM);
	close(fd);
	r->step = 0;
	return 0;
}

/*
 * Host buffers are charged to RLIMIT_MEMLOCK of the opener (8 MiB here, for uid 1001):
 * 4 + 4 MiB fit, 4 KiB more is ENOMEM, a free or a close gives the charge back.
 */
TEST_F_TIMEOUT(misc, host_memory_rlimit_memlock, 60)
{
	static const char *const what[] = {
		"", "open", "4 MiB", "second 4 MiB", "4 KiB beyond the limit (want ENOMEM)",
		"free", "4 MiB after the free", "4 KiB beyond the limit again (want ENOMEM)",
		"reopen", "4 MiB on the new file", "second 4 MiB on the new file",
		"4 KiB beyond the limit on the new file (want ENOMEM)",
	};
	struct memlock_report *r = sec_shared(sizeof(*r));
	struct rlimit lim = { MEMLOCK, MEMLOCK }, old;
	int rc;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, getrlimit(RLIMIT_MEMLOCK, &old));
	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &lim));
	rc = sec_reap(sec_spawn(UID_A, memlock_child, r));
	setrlimit(RLIMIT_MEMLOCK, &old);
	EXPECT_EQ(0, rc) {
		TH_LOG("uid %d, RLIMIT_MEMLOCK 8 MiB: step %d (%s) returned %s", UID_A, r->step,
		       r->step < (int)ARRAY_SIZE(what) ? what[r->step] : "?",
		       r->err ? strerror(-r->err) : "0");
	}
}

/* Allocates @n 4 KiB buffers, device memory first while it lasts: how many, and the time. */
static int alloc_many(int fd, __u64 dev_room, int n, double *ms, int *err)
{
	double t0 = now_ms();
	__u64 h;
	int i;

	*err = 0;
	for (i = 0; i < n; i++) {
		__u32 type = (__u64)i * 4096 < dev_room ? NEURON_UDMA_MEM_DEVICE : NEURON_UDMA_MEM_HOST;

		*err = raw_alloc(fd, type, 4096, &h, NULL);
		if (*err)
			break;
	}
	*ms = now_ms() - t0;
	return i;
}

/*
 * A file holds more than 4096 buffers (5000 here), and closing a file with 20,000 small buffers
 * takes less than 2 s.
 */
TEST_F_TIMEOUT(misc, many_buffers_and_fast_close, 300)
{
	struct rlimit inf = { RLIM_INFINITY, RLIM_INFINITY };
	struct neuron_udma_info info;
	double alloc_ms, close_ms, close_small_ms, t0;
	__u64 dev_room;
	int fd, n, err;

	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &inf));
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	/* Keep 1 MiB of device memory free; the rest of the buffers are host pages. */
	dev_room = info.device_mem_size > MIB ? info.device_mem_size - MIB : 0;

	n = alloc_many(fd, dev_room, 5000, &alloc_ms, &err);
	TH_LOG("5000 buffers: %d allocated in %.0f ms", n, alloc_ms);
	EXPECT_EQ(5000, n) {
		TH_LOG("buffer %d: %s", n + 1, strerror(-err));
	}
	t0 = now_ms();
	close(fd);
	close_small_ms = now_ms() - t0;
	TH_LOG("close with %d buffers: %.0f ms", n, close_small_ms);

	fd = udma_open();
	ASSERT_LE(0, fd);
	n = alloc_many(fd, dev_room, 20000, &alloc_ms, &err);
	TH_LOG("20000 buffers: %d allocated in %.0f ms", n, alloc_ms);
	EXPECT_EQ(20000, n) {
		TH_LOG("buffer %d: %s", n + 1, strerror(-err));
	}
	t0 = now_ms();
	close(fd);
	close_ms = now_ms() - t0;
	TH_LOG("close with %d buffers: %.0f ms", n, close_ms);
	/*
	 * Linear, not quadratic: 4x the buffers may take at most 6x the time (plus slack for a
	 * busy emulated machine), and closing costs at most twice what allocating did (a close
	 * frees what each MEM_ALLOC made, and wall time on a 2-core host running several guests
	 * varies by tens of per cent between the two phases). Absolute times are the debug
	 * kernel's under emulation (the close of 20,000 buffers took 28.7 s when it was
	 * quadratic, 72 s with a linear-scan device-memory allocator, against ~9 s to allocate).
	 */
	EXPECT_LT(close_ms, 6 * close_small_ms + 1000.0);
	EXPECT_LT(close_ms, 2 * alloc_ms + 1000.0);
}

/* ---- a MEM_ALLOC that fails with EFAULT allocates nothing ---- */

/*
 * MEM_ALLOC whose argument is readable but not writable fails with EFAULT and keeps nothing:
 * after 1000 such calls for 1 MiB device buffers, a buffer of the whole device memory can still
 * be allocated.
 */
TEST_F_TIMEOUT(misc, mem_alloc_efault_allocates_nothing, 120)
{
	struct neuron_udma_mem_alloc *rw, *ro;
	struct neuron_udma_info info;
	int fd, mfd, i, efault = 0, other = 0, first_other = 0, ret;
	__u64 h;

	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	mfd = memfd_create("udma-alloc-arg", MFD_CLOEXEC);
	ASSERT_LE(0, mfd);
	ASSERT_EQ(0, ftruncate(mfd, 4096));
	rw = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	ASSERT_NE(MAP_FAILED, rw);
	ro = mmap(NULL, 4096, PROT_READ, MAP_SHARED, mfd, 0);
	ASSERT_NE(MAP_FAILED, ro);
	*rw = (struct neuron_udma_mem_alloc){ .size = MIB, .type = NEURON_UDMA_MEM_DEVICE };

	for (i = 0; i < 1000; i++) {
		ret = udma_ioc(fd, NEURON_UDMA_MEM_ALLOC, ro);
		if (ret == -EFAULT) {
			efault++;
		} else if (!other++) {
			first_other = i;
			TH_LOG("call %d: %s, want EFAULT", i + 1, ret ? strerror(-ret) : "0");
		}
	}
	TH_LOG("1000 calls: %d EFAULT, %d other (first at call %d)", efault, other, first_other + 1);
	EXPECT_EQ(1000, efault);
	ret = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, info.device_mem_size, &h, NULL);
	EXPECT_EQ(0, ret) {
		TH_LOG("all %llu bytes of device memory: %s",
		       (unsigned long long)info.device_mem_size, strerror(-ret));
	}
	close(mfd);
	close(fd);
}

/* ---- a read-only file descriptor cannot DMA ---- */

enum ro_op {
	RO_INFO, RO_QUEUE_STATE, RO_ALLOC_HOST, RO_ALLOC_DEV, RO_MEM_FREE, RO_QUEUE_INIT,
	RO_PREPARE_ONE, RO_PREPARE, RO_START, RO_WAIT, RO_MEMCPY, RO_QUEUE_RELEASE, RO_NR,
};

static const char *const ro_names[RO_NR] = {
	"INFO", "QUEUE_STATE", "MEM_ALLOC host", "MEM_ALLOC device", "MEM_FREE", "QUEUE_INIT",
	"COPY_PREPARE_ONE", "COPY_PREPARE", "COPY_START", "COPY_WAIT", "MEMCPY", "QUEUE_RELEASE",
};

#define RO_ENG 6U
#define RO_Q 5U

struct ro_report {
	int open_rdwr, open_wronly, open_rdonly;
	int ret[RO_NR];
};

/* Every ioctl on a read-only descriptor, with arguments that would work on a writable one. */
static void ro_ioctls(int fd, int *ret)
{
	struct neuron_udma_queue_state st;
	struct neuron_udma_info info;
	struct ubuf h = { .handle = 1, .size = 8192 }, d = { .handle = 2, .size = 8192 };
	struct neuron_udma_copy c;
	__u64 handle;

	ret[RO_INFO] = udma_info(fd, &info);
	ret[RO_QUEUE_STATE] = queue_state(fd, RO_ENG, RO_Q, &st);
	ret[RO_ALLOC_HOST] = raw_alloc(fd, NEURON_UDMA_MEM_HOST, 8192, &handle, NULL);
	if (!ret[RO_ALLOC_HOST])
		h.handle = handle;
	ret[RO_ALLOC_DEV] = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, 8192, &handle, NULL);
	if (!ret[RO_ALLOC_DEV])
		d.handle = handle;
	ret[RO_QUEUE_INIT] = queue_init(fd, RO_ENG, RO_Q, 32, 32);
	c = ucopy(&h, 0, &d, 0, 4096);
	ret[RO_PREPARE_ONE] = prep_one(fd, RO_ENG, RO_Q, c);
	ret[RO_PREPARE] = prep(fd, RO_ENG, RO_Q, &c, 1);
	ret[RO_START] = copy_start(fd, RO_ENG, RO_Q, 1, 1);
	ret[RO_WAIT] = copy_wait(fd, RO_ENG, RO_Q, 1000, NULL);
	ret[RO_MEMCPY] = udma_memcpy(fd, &h, 0, &h, 4096, 4096, 0);
	ret[RO_QUEUE_RELEASE] = queue_release(fd, RO_ENG, RO_Q);
	ret[RO_MEM_FREE] = mem_free(fd, h.handle);
}

static int ro_child(void *arg)
{
	struct ro_report *r = arg;
	int fd;

	fd = open(UDMA_DEV, O_RDWR | O_CLOEXEC);
	r->open_rdwr = fd < 0 ? -errno : 0;
	fd = open(UDMA_DEV, O_WRONLY | O_CLOEXEC);
	r->open_wronly = fd < 0 ? -errno : 0;
	fd = open(UDMA_DEV, O_RDONLY | O_CLOEXEC);
	r->open_rdonly = fd < 0 ? -errno : 0;
	if (fd < 0)
		return 1;
	ro_ioctls(fd, r->ret);
	return 0;
}

/* INFO and QUEUE_STATE work (the latter finds no queue of this file), everything else EBADF. */
static void check_ro(struct __test_metadata *_metadata, const int *ret, const char *who)
{
	int i;

	EXPECT_EQ(0, ret[RO_INFO]);
	EXPECT_EQ(-ENOENT, ret[RO_QUEUE_STATE]);
	for (i = RO_ALLOC_HOST; i < RO_NR; i++) {
		EXPECT_EQ(-EBADF, ret[i]) {
			TH_LOG("%s, O_RDONLY: %s returned %s, want EBADF", who, ro_names[i],
			       ret[i] ? strerror(-ret[i]) : "0");
		}
	}
}

/*
 * A read-only file descriptor cannot DMA: root with O_RDONLY, and uid 1001 with the node at
 * 0644 (which only lets it open O_RDONLY).
 */
TEST_F_TIMEOUT(misc, read_only_fd_cannot_dma, 60)
{
	struct ro_report *r = sec_shared(sizeof(*r));
	int ret[RO_NR], fd, rc;
	struct stat st;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, stat(UDMA_DEV, &st));
	ASSERT_EQ(0, sec_setup(0644));

	/* root */
	fd = open(UDMA_DEV, O_RDONLY | O_CLOEXEC);
	ASSERT_LE(0, fd);
	ro_ioctls(fd, ret);
	check_ro(_metadata, ret, "root");
	close(fd);
	fd = udma_open();
	ASSERT_LE(0, fd);
	EXPECT_EQ(0, queue_init(fd, RO_ENG, RO_Q, 32, 32)) {
		TH_LOG("the read-only file took queue %u/%u", RO_ENG, RO_Q);
	}
	close(fd);

	/* uid 1001, node 0644 */
	rc = sec_reap(sec_spawn(UID_A, ro_child, r));
	chmod(UDMA_DEV, st.st_mode & 07777);
	ASSERT_EQ(0, rc);
	EXPECT_EQ(-EACCES, r->open_rdwr);
	EXPECT_EQ(-EACCES, r->open_wronly);
	ASSERT_EQ(0, r->open_rdonly);
	check_ro(_metadata, r->ret, "uid 1001");
}

TEST_HARNESS_MAIN
