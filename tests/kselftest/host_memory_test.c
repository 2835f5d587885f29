// SPDX-License-Identifier: GPL-2.0
/*
 * Host memory an unprivileged user holds (Documentation/userspace-api.rst, "Security model"):
 * what it pins past its RLIMIT_MEMLOCK (buffers of allocators that exited, queue rings), what
 * its mappings still reach after MEM_FREE (pieces of a mapping that was split, moved and
 * re-faulted; two buffers mapped back to back), and a storm of waits, signals, queue releases,
 * mappings, frees, forks and a close on one file, for lockdep and KASAN.
 *
 * Each test fails when the driver breaks the rule it checks. Queues are on engines 12 and 15
 * (host-connected on v2 and v3), which neither uapi_test nor isolation_test uses.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024U
#define MIB (1024U * 1024)
#define MEMLOCK (8 * MIB)

static void on_signal(int sig)
{
	(void)sig;
}

/* Installs a handler for @sig without SA_RESTART, so that ioctls see EINTR. */
static int no_restart(int sig)
{
	struct sigaction sa = { .sa_handler = on_signal };

	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL) ? -errno : 0;
}

/* Tests that need nothing but a timeout of their own. */
FIXTURE(att) {
	int unused;
};

FIXTURE_SETUP(att)
{
	self->unused = 0;
}

FIXTURE_TEARDOWN(att)
{
}

/* ---- host buffers charged to a process that exited stay pinned, uncharged ---- */

#define ESC_CHILDREN 6
#define ESC_PER_CHILD 8		/* 1 MiB buffers: the whole 8 MiB budget of each child */

struct esc_report {
	int step, err;
	int children_ok;
	__u64 handles[ESC_CHILDREN * ESC_PER_CHILD];
	__u64 offsets[ESC_CHILDREN * ESC_PER_CHILD];
	int mapped, touched;
	long vmlck_before, vmlck_after;
	int own_enomem;
};

static int esc_fill(int fd, struct esc_report *r, int base)
{
	int i, err;

	for (i = 0; i < ESC_PER_CHILD; i++) {
		err = raw_alloc(fd, NEURON_UDMA_MEM_HOST, MIB, &r->handles[base + i],
				&r->offsets[base + i]);
		if (err)
			return -err;
	}
	return 0;
}

/* uid A: one file; children fork, fill their budget on the shared file and exit. */
static int esc_holder(void *arg)
{
	struct esc_report *r = arg;
	__u64 h;
	int fd = udma_open(), i;

	r->step = 1;
	if (fd < 0)
		return r->err = fd, 1;
	r->vmlck_before = vmlck_kib();
	for (i = 0; i < ESC_CHILDREN; i++) {
		pid_t pid = fork();

		if (pid < 0)
			return r->err = -errno, 2;
		if (pid == 0)
			_exit(esc_fill(fd, r, i * ESC_PER_CHILD));
		if (sec_reap(pid) == 0)
			r->children_ok++;
	}
	r->step = 3;
	/* Every child has exited: the holder can use all of their buffers. */
	for (i = 0; i < r->children_ok * ESC_PER_CHILD; i++) {
		unsigned char *p = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
					r->offsets[i]);

		if (p == MAP_FAILED)
			continue;
		r->mapped++;
		memset(p, 0x5a, MIB);
		if (p[MIB - 1] == 0x5a)
			r->touched++;
		munmap(p, MIB);
	}
	/* The holder's own budget is untouched as well. */
	for (i = 0; i < ESC_PER_CHILD + 1; i++)
		if (raw_alloc(fd, NEURON_UDMA_MEM_HOST, MIB, &h, NULL))
			break;
	r->own_enomem = i;
	r->vmlck_after = vmlck_kib();
	r->step = 4;
	pause();	/* keeps everything pinned until the parent has looked */
	return 0;
}

/*
 * Security model: "Host buffers are ... charged to the allocating process's RLIMIT_MEMLOCK".
 * The charge goes to the mm of whoever called MEM_ALLOC, and is dropped unaccounted when that
 * mm exits (neuron_udma_uncharge skips a dead mm), while the buffer lives on in the file. One
 * process with an 8 MiB limit ends up holding 7 x 8 MiB of pinned memory, charged to nobody.
 */
TEST_F_TIMEOUT(att, memlock_escapes_through_exited_children, 120)
{
	struct esc_report *r = sec_shared(sizeof(*r));
	struct rlimit lim = { MEMLOCK, MEMLOCK }, old;
	long avail0, avail1;
	pid_t pid;
	int rc;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, getrlimit(RLIMIT_MEMLOCK, &old));
	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &lim));
	avail0 = mem_available_kib();
	pid = sec_spawn(UID_A, esc_holder, r);
	setrlimit(RLIMIT_MEMLOCK, &old);
	ASSERT_LT(0, pid);
	while (r->step != 4 && !waitpid(pid, NULL, WNOHANG))
		sleep_ms(50);
	avail1 = mem_available_kib();
	kill(pid, SIGKILL);
	rc = sec_reap(pid);
	TH_LOG("holder (uid %d, RLIMIT_MEMLOCK 8 MiB): %d children filled 8 MiB each and exited; "
	       "holder mapped %d/%d of their 1 MiB buffers; its own allocations hit ENOMEM after "
	       "%d MiB; VmLck %ld -> %ld KiB; MemAvailable dropped by %ld MiB",
	       UID_A, r->children_ok, r->touched, r->children_ok * ESC_PER_CHILD, r->own_enomem,
	       r->vmlck_before, r->vmlck_after, (avail0 - avail1) / 1024);
	EXPECT_EQ(128 + SIGKILL, rc);
	/* Pinned memory reachable by one process with an 8 MiB limit. */
	EXPECT_LE((__u64)(r->touched + r->own_enomem) * MIB, (__u64)MEMLOCK) {
		TH_LOG("one process holds %d MiB of pinned host buffers with RLIMIT_MEMLOCK 8 MiB",
		       r->touched + r->own_enomem);
	}
}

/* ---- queue rings are pinned, contiguous, and charged to nothing ---- */

#define RING_DESCS (1U << 17)	/* 2 MiB per ring */
#define RING_QUEUES 10

struct ring_report {
	int inited, first_err;
	long avail_drop_kib;
};

static int ring_child(void *arg)
{
	struct ring_report *r = arg;
	long a0 = mem_available_kib();
	int fd = udma_open(), i;

	if (fd < 0)
		return 1;
	for (i = 0; i < RING_QUEUES; i++) {
		int err = queue_init(fd, 12, i, RING_DESCS, RING_DESCS);

		if (err) {
			r->first_err = err;
			break;
		}
		r->inited++;
	}
	r->avail_drop_kib = a0 - mem_available_kib();
	for (i = 0; i < r->inited; i++)
		queue_release(fd, 12, i);
	close(fd);
	return 0;
}

/*
 * Each QUEUE_INIT pins two physically contiguous rings (up to 2 x 4 MiB) plus a vmalloc'ed
 * reference table, none of it charged to RLIMIT_MEMLOCK and with no per-file queue limit: an
 * unprivileged user with an 8 MiB limit pins far more than 8 MiB (and takes every queue).
 */
TEST_F_TIMEOUT(att, queue_rings_escape_memlock, 60)
{
	struct ring_report *r = sec_shared(sizeof(*r));
	struct rlimit lim = { MEMLOCK, MEMLOCK }, old;
	int rc;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, getrlimit(RLIMIT_MEMLOCK, &old));
	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &lim));
	rc = sec_reap(sec_spawn(UID_A, ring_child, r));
	setrlimit(RLIMIT_MEMLOCK, &old);
	ASSERT_EQ(0, rc);
	TH_LOG("uid %d (RLIMIT_MEMLOCK 8 MiB): %d queues of 2 x %u descriptors (%u MiB of rings "
	       "each), first error %s; MemAvailable dropped by %ld MiB", UID_A, r->inited,
	       RING_DESCS, 2 * RING_DESCS * 16 / MIB, r->first_err ? strerror(-r->first_err) : "none",
	       r->avail_drop_kib / 1024);
	EXPECT_LE((__u64)r->inited * 2 * RING_DESCS * 16, (__u64)MEMLOCK) {
		TH_LOG("%u MiB of rings pinned past an 8 MiB RLIMIT_MEMLOCK",
		       r->inited * 2 * RING_DESCS * 16 / MIB);
	}
}

/* ---- split, re-protected, moved and re-faulted pieces of a mapping after MEM_FREE ---- */

#define PIECES 4

struct split_report {
	int step, err;
	int sig[PIECES + 1];
	int child_sig;
};

static int split_child(void *arg)
{
	struct split_report *r = arg;
	unsigned char *map, *moved, *spare, v;
	struct ubuf b;
	int fd = udma_open(), i, st;
	pid_t pid;

	r->step = 1;
	if (fd < 0 || sec_probe_install())
		return 1;
	if ((r->err = ubuf_host(fd, PIECES * 4096, &b)))
		return 2;
	map = b.map;
	memset(map, 0x11, PIECES * 4096);
	r->step = 2;
	/* Split in three (page 1 read-only), move page 3 away, drop page 0's PTE and re-fault. */
	if (mprotect(map + 4096, 4096, PROT_READ))
		return r->err = -errno, 3;
	spare = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (spare == MAP_FAILED)
		return 4;
	moved = mremap(map + 3 * 4096, 4096, 4096, MREMAP_MAYMOVE | MREMAP_FIXED, spare);
	if (moved == MAP_FAILED)
		return r->err = -errno, 5;
	/* No growth, no execution. */
	if (mremap(moved, 4096, 8192, MREMAP_MAYMOVE) != MAP_FAILED)
		return 9;
	if (!mprotect(map, 4096, PROT_READ | PROT_EXEC))
		return 10;
	if (map[0] != 0x11 || moved[0] != 0x11 || map[2 * 4096] != 0x11)
		return 7;
	/* A fork does not inherit the mapping. */
	pid = fork();
	if (pid == 0)
		_exit(sec_probe(map + 2 * 4096, false, &v));
	st = sec_reap(pid);
	r->child_sig = st;
	r->step = 3;
	r->err = mem_free(fd, b.handle);
	if (r->err)
		return 8;
	for (i = 0; i < PIECES - 1; i++)
		r->sig[i] = sec_probe(map + i * 4096, false, &v);
	r->sig[PIECES - 1] = sec_probe(moved, false, &v);
	r->sig[PIECES] = sec_probe(moved, true, &v);
	r->step = 4;
	munmap(map, 3 * 4096);
	munmap(moved, 4096);
	close(fd);
	return 0;
}

/*
 * "after MEM_FREE ... an access raises SIGBUS": also through every piece of a mapping that was
 * split by mprotect and moved by mremap; it cannot grow or become executable; a forked child
 * does not see the mapping at all.
 */
TEST_F_TIMEOUT(att, split_moved_mapping_sigbus_after_free, 60)
{
	struct split_report *r = sec_shared(sizeof(*r));
	int rc, i;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	rc = sec_reap(sec_spawn(UID_A, split_child, r));
	ASSERT_EQ(0, rc) {
		TH_LOG("step %d: %s", r->step, r->err ? strerror(-r->err) : "-");
	}
	EXPECT_EQ(SIGSEGV, r->child_sig);
	for (i = 0; i < PIECES; i++)
		EXPECT_EQ(SIGBUS, r->sig[i]) {
			TH_LOG("piece %d after MEM_FREE: signal %d, want SIGBUS", i, r->sig[i]);
		}
	EXPECT_EQ(SIGBUS, r->sig[PIECES]);
}

/* ---- two buffers mapped back to back, one freed ---- */

struct adj_report {
	int err, step;
	int a_after, b_after;
	unsigned char a_val;
};

static int adj_child(void *arg)
{
	struct adj_report *r = arg;
	unsigned char *area, *pa, *pb, v;
	__u64 ha, hb, oa, ob;
	int fd = udma_open();

	if (fd < 0 || sec_probe_install())
		return 1;
	/* Two buffers (the second with the higher mmap offset), mapped back to back. */
	if ((r->err = raw_alloc(fd, NEURON_UDMA_MEM_HOST, 2 * 4096, &ha, &oa)) ||
	    (r->err = raw_alloc(fd, NEURON_UDMA_MEM_HOST, 2 * 4096, &hb, &ob)))
		return 2;
	r->step = 1;
	if (ob <= oa)
		return 3;
	area = mmap(NULL, 4 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED)
		return 4;
	pa = mmap(area, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, oa);
	pb = mmap(area + 2 * 4096, 2 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, ob);
	if (pa == MAP_FAILED || pb == MAP_FAILED)
		return r->err = -errno, 5;
	memset(pa, 0xaa, 2 * 4096);
	memset(pb, 0xbb, 2 * 4096);
	r->step = 2;
	/* If the two VMAs were merged, B's pages would be faulted through A's record. */
	if ((r->err = mem_free(fd, hb)))
		return 6;
	r->b_after = sec_probe(pb + 4096, false, &v);
	r->a_after = sec_probe(pa + 4096, false, &r->a_val);
	munmap(area, 4 * 4096);
	close(fd);
	return 0;
}

/*
 * Two buffers of one file mapped back to back form two adjacent VMAs of the same file: they
 * must stay two mappings of two buffers (the driver spaces mmap offsets 4 MiB apart per handle,
 * so the VMAs are never contiguous in offset either). After MEM_FREE of the second, it raises
 * SIGBUS and the first still reads its data.
 */
TEST_F_TIMEOUT(att, adjacent_mappings_stay_separate, 60)
{
	struct adj_report *r = sec_shared(sizeof(*r));
	int rc;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, sec_setup(0666));
	rc = sec_reap(sec_spawn(UID_A, adj_child, r));
	ASSERT_EQ(0, rc) {
		TH_LOG("step %d: %s", r->step, r->err ? strerror(-r->err) : "-");
	}
	EXPECT_EQ(SIGBUS, r->b_after);
	EXPECT_EQ(PROBE_OK, r->a_after);
	EXPECT_EQ(0xaa, r->a_val);
}

/* ---- a storm of waits, signals, releases, mappings and a close ---- */

struct storm {
	int fd;
	volatile int stop;
	pthread_t waiter, copier;
	struct ubuf a, b, da, db;
	volatile __u64 a_handle;
	int waits, eintr, prepared, inits, maps, frees, memcpys, sigs, sigbus, refreed;
	int mc_ok, mc_timedout, mc_other, prep_err;
};

static void *storm_waiter(void *arg)
{
	struct storm *s = arg;
	struct neuron_udma_copy c[8];
	int i;

	while (!s->stop) {
		int n = 1 + s->waits % 8, ret;

		for (i = 0; i < 8; i++) {
			c[i] = ucopy(&s->a, i * 4096, &s->b, i * 4096, 4096);
			c[i].src_handle = s->a_handle;
		}

		ret = prep(s->fd, 15, 1, c, n);
		if (!ret)
			s->prepared++;
		else if (!s->prep_err)
			s->prep_err = ret;
		if (copy_wait(s->fd, 15, 1, s->waits % 2 ? 10 : 0, NULL) == -EINTR)
			s->eintr++;
		s->waits++;
	}
	return NULL;
}

static void *storm_queues(void *arg)
{
	struct storm *s = arg;
	unsigned int n = 0;

	while (!s->stop) {
		queue_release(s->fd, 15, 1);
		n++;
		if (!queue_init(s->fd, 15, 1, 32 << (n % 3), 32 << (n % 2)))
			s->inits++;
		sleep_ms(20 + n % 17);
	}
	return NULL;
}

static void *storm_maps(void *arg)
{
	struct storm *s = arg;
	unsigned char *p, *q;
	struct ubuf b;
	unsigned char v;

	while (!s->stop) {
		if (ubuf_host(s->fd, 64 * KIB, &b))
			continue;
		p = b.map;
		p[0] = 1;
		q = mremap(p, 64 * KIB, 32 * KIB, MREMAP_MAYMOVE);
		if (q != MAP_FAILED) {
			p = q;
			q[4096] = 2;
		}
		if (!mem_free(s->fd, b.handle))
			s->frees++;
		if (sec_probe(p + 4096, false, &v) == SIGBUS)
			s->sigbus++;
		munmap(p, q != MAP_FAILED ? 32 * KIB : 64 * KIB);
		/* Frees of buffers that queued copies use must be refused; a free one is replaced. */
		if (!mem_free(s->fd, s->a_handle)) {
			__u64 h;

			if (!raw_alloc(s->fd, NEURON_UDMA_MEM_HOST, 64 * KIB, &h, NULL))
				s->a_handle = h;
			s->refreed++;
		}
		/* A forked child shares the file, not the mappings. */
		if (s->maps % 8 == 0) {
			pid_t pid = fork();
			__u64 h;

			if (pid == 0) {
				if (!raw_alloc(s->fd, NEURON_UDMA_MEM_HOST, 4096, &h, NULL)) {
					copy_wait(s->fd, 15, 1, 10, NULL);
					mem_free(s->fd, h);
				}
				_exit(0);
			}
			if (pid > 0)
				waitpid(pid, NULL, 0);
		}
		s->maps++;
	}
	return NULL;
}

static void *storm_copier(void *arg)
{
	struct storm *s = arg;

	while (!s->stop) {
		int ret = udma_memcpy(s->fd, &s->da, 0, &s->db, 0, 4 * MIB, 10);

		if (ret == -EBADF)
			break;
		s->memcpys++;
		if (!ret)
			s->mc_ok++;
		else if (ret == -ETIMEDOUT)
			s->mc_timedout++;
		else
			s->mc_other++;
	}
	return NULL;
}

static int storm_child(void *arg)
{
	struct storm *s = arg;
	pthread_t th[2];
	double t0;

	s->fd = udma_open();
	if (s->fd < 0 || no_restart(SIGUSR1) || sec_probe_install())
		return 1;
	if (ubuf_host(s->fd, 64 * KIB, &s->a) || ubuf_host(s->fd, 64 * KIB, &s->b) ||
	    ubuf_dev(s->fd, 4 * MIB, &s->da) || ubuf_dev(s->fd, 4 * MIB, &s->db))
		return 2;
	if (queue_init(s->fd, 15, 1, 64, 64))
		return 3;
	s->a_handle = s->a.handle;
	if (pthread_create(&s->waiter, NULL, storm_waiter, s) ||
	    pthread_create(&th[0], NULL, storm_queues, s) ||
	    pthread_create(&th[1], NULL, storm_maps, s) ||
	    pthread_create(&s->copier, NULL, storm_copier, s))
		return 4;
	t0 = now_ms();
	while (now_ms() - t0 < 3000) {
		pthread_kill(s->waiter, SIGUSR1);
		pthread_kill(s->copier, SIGUSR1);
		s->sigs++;
		usleep(200);
	}
	/* Close in the middle of everything, then let the threads run on a dead descriptor. */
	close(s->fd);
	sleep_ms(200);
	s->stop = 1;
	pthread_join(s->waiter, NULL);
	pthread_join(th[0], NULL);
	pthread_join(th[1], NULL);
	pthread_join(s->copier, NULL);
	return 0;
}

/* For lockdep, KASAN and the sleep-in-atomic checks: the test only asks that it survives. */
TEST_F_TIMEOUT(att, storm_of_signals_releases_and_close, 120)
{
	struct storm *s = sec_shared(sizeof(*s));
	int rc, k;

	ASSERT_NE(NULL, s);
	ASSERT_EQ(0, sec_setup(0666));
	rc = sec_reap(sec_spawn(UID_B, storm_child, s));
	TH_LOG("storm: %d waits (%d EINTR), %d prepares, %d queue inits, %d maps (%d freed, %d "
	       "SIGBUS), %d idle source buffers freed, %d memcpys (%d ok, %d ETIMEDOUT, %d other), "
	       "%d signals; first prepare error %d", s->waits, s->eintr, s->prepared, s->inits, s->maps, s->frees,
	       s->sigbus, s->refreed, s->memcpys, s->mc_ok, s->mc_timedout, s->mc_other, s->sigs, s->prep_err);
	EXPECT_EQ(0, rc);
	/* The same, killed at random points. */
	for (k = 0; k < 4; k++) {
		pid_t pid;

		memset(s, 0, sizeof(*s));
		pid = sec_spawn(UID_B, storm_child, s);
		ASSERT_LT(0, pid);
		sleep_ms(300 + 400 * k);
		kill(pid, SIGKILL);
		rc = sec_reap(pid);
		EXPECT_EQ(128 + SIGKILL, rc);
	}
	/* The device still works for someone else. */
	{
		struct ubuf x, y;
		int fd = udma_open();

		ASSERT_LE(0, fd);
		ASSERT_EQ(0, ubuf_host(fd, 64 * KIB, &x));
		ASSERT_EQ(0, ubuf_host(fd, 64 * KIB, &y));
		fill_pattern(x.map, 64 * KIB, 5);
		EXPECT_EQ(0, udma_memcpy(fd, &x, 0, &y, 0, 64 * KIB, 0));
		EXPECT_EQ(-1, first_diff(x.map, y.map, 64 * KIB));
		close(fd);
	}
}

TEST_HARNESS_MAIN
