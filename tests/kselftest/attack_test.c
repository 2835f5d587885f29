// SPDX-License-Identifier: GPL-2.0
/*
 * Attacks on the neuron_udma security model (Documentation/userspace-api.rst, "Security
 * model") by an unprivileged second user: pinned memory that escapes RLIMIT_MEMLOCK (buffers
 * of exited allocators, queue rings), split, moved and adjacent mappings after MEM_FREE, orphaned
 * MEMCPYs (of a closed file, of several threads, MEM_FREE after they settled), a default
 * timeout resetting the shared queue early, fence slots under a stall, SIGKILL during a
 * device-memory scrub, and a storm of signals, releases, forks and a close for lockdep/KASAN.
 *
 * Each test fails when the driver breaks the rule it checks. Queues are on engines 12, 14 and
 * 15 (host-connected on v2 and v3), which neither uapi_test nor security_test uses; stalls and slow-downs come from the device
 * model's BAR2 window.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024U
#define MIB (1024U * 1024)
#define MEMLOCK (8 * MIB)

static __u32 h2t_engine(const struct neuron_udma_info *info)
{
	return info->generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
}

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

static int alarm_us(unsigned int us)
{
	struct itimerval it = { .it_value = { .tv_sec = us / 1000000, .tv_usec = us % 1000000 } };

	return setitimer(ITIMER_REAL, &it, NULL);
}

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

/* ---- 1: host buffers charged to a process that exited stay pinned, uncharged ---- */

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

/* ---- 2: queue rings are pinned, contiguous, and charged to nothing ---- */

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

/* ---- 3: split, re-protected, moved and re-faulted pieces of a mapping after MEM_FREE ---- */

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

/* ---- 5: 256 fences in flight on a stalled queue, then normal use ---- */

FIXTURE(stall) {
	int fd;
	struct ubar2 bar2;
	struct ubuf a, b;
};

FIXTURE_SETUP(stall)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, bar2_open(&self->bar2));
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, no_restart(SIGALRM));
	ASSERT_EQ(0, ubuf_host(self->fd, 64 * KIB, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, 64 * KIB, &self->b));
}

FIXTURE_TEARDOWN(stall)
{
	alarm_us(0);
	if (self->bar2.regs)
		bar2_write(&self->bar2, BAR2_CLEAR, 1);
	bar2_close(&self->bar2);
	if (self->fd >= 0)
		close(self->fd);
}

/*
 * Every COPY_WAIT after a new copy appends a fence; interrupted at once, it leaves the fence
 * in flight. 300 of them on a stalled queue fill all 256 completion slots; once the stall ends,
 * a wait returns 0 and 300 more copy+wait rounds work: no registration leaks a slot (fence()
 * returning EBUSY forever).
 */
TEST_F_TIMEOUT(stall, fence_slots_survive_interrupted_waits, 120)
{
	__u32 eng = 14, q = 2, i;
	int eintr = 0, other = 0, other_err = 0, ret;
	struct neuron_udma_queue_state st;
	double t0;

	ASSERT_EQ(0, queue_init(self->fd, eng, q, 4096, 4096));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, eng, q, 6000));
	t0 = now_ms();
	for (i = 0; i < 300 && now_ms() - t0 < 4500; i++) {
		ASSERT_EQ(0, prep_one(self->fd, eng, q,
				      ucopy(&self->a, (i % 16) * 4096, &self->b, (i % 16) * 4096, 4096)));
		ASSERT_EQ(0, alarm_us(1000));
		ret = copy_wait(self->fd, eng, q, 0, NULL);
		alarm_us(0);
		if (ret == -EINTR)
			eintr++;
		else if (!other++)
			other_err = ret;
	}
	TH_LOG("%u interrupted waits in %.0f ms: %d EINTR, %d other (first %s)", i, now_ms() - t0,
	       eintr, other, other_err ? strerror(-other_err) : "0");
	EXPECT_EQ(0, other);
	/* The stall ends: everything completes. */
	ret = copy_wait(self->fd, eng, q, 8000, NULL);
	EXPECT_EQ(0, ret) {
		TH_LOG("wait after the stall: %s", strerror(-ret));
	}
	ASSERT_EQ(0, queue_state(self->fd, eng, q, &st));
	EXPECT_EQ(0U, st.resets);
	for (i = 0; i < 300; i++) {
		ret = prep_one(self->fd, eng, q, ucopy(&self->a, 0, &self->b, 0, 4096));
		if (!ret)
			ret = copy_wait(self->fd, eng, q, 2000, NULL);
		if (ret)
			break;
	}
	EXPECT_EQ(300U, i) {
		TH_LOG("round %u after the stall: %s", i, strerror(-ret));
	}
	EXPECT_EQ(0, mem_free(self->fd, self->a.handle));
	EXPECT_EQ(0, mem_free(self->fd, self->b.handle));
}

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

/* ---- 4: orphaned MEMCPYs of several threads of a closed file ---- */

#define ORPH_SIZE (16 * MIB)
#define ORPH_THREADS 4

struct orph_thread {
	int fd;
	struct ubuf *s, *d;
	int ret;
};

static void *orph_memcpy(void *arg)
{
	struct orph_thread *t = arg;

	t->ret = udma_memcpy(t->fd, t->s, 0, t->d, 0, ORPH_SIZE, 10);
	return NULL;
}

/*
 * Several threads of one file leave MEMCPYs behind (10 ms timeouts while the model stalls the
 * H2T queue for 1.5 s), the file is closed at once. The device memory comes back (a new owner can allocate all of
 * it) and the new owner's memory reads zeros: no late copy of the dead file lands in it.
 */
TEST_F_TIMEOUT(stall, closed_file_orphans_never_reach_next_owner, 120)
{
	struct neuron_udma_info info;
	struct orph_thread t[ORPH_THREADS];
	pthread_t th[ORPH_THREADS];
	struct ubuf s, d, hb, big;
	int fd = udma_open(), fd2, i, timeouts = 0, busy, ret = -1;
	__u64 room, off;
	unsigned char *zero;
	double t0;

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	room = info.device_mem_size;
	ASSERT_LE((__u64)2 * ORPH_SIZE, room);
	ASSERT_EQ(0, ubuf_dev(fd, ORPH_SIZE, &s));
	ASSERT_EQ(0, ubuf_dev(fd, ORPH_SIZE, &d));
	ASSERT_EQ(0, ubuf_host(fd, 4 * MIB, &hb));
	fill_pattern(hb.map, 4 * MIB, 99);
	for (off = 0; off < ORPH_SIZE; off += 4 * MIB)
		ASSERT_EQ(0, udma_memcpy(fd, &hb, 0, &s, off, 4 * MIB, 0));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, h2t_engine(&info), 0, 1500));
	for (i = 0; i < ORPH_THREADS; i++) {
		t[i] = (struct orph_thread){ .fd = fd, .s = &s, .d = &d };
		ASSERT_EQ(0, pthread_create(&th[i], NULL, orph_memcpy, &t[i]));
	}
	for (i = 0; i < ORPH_THREADS; i++) {
		pthread_join(th[i], NULL);
		timeouts += t[i].ret == -ETIMEDOUT;
	}
	busy = mem_free(fd, d.handle);
	TH_LOG("%d of %d MEMCPYs timed out; MEM_FREE of their destination: %s", timeouts,
	       ORPH_THREADS, busy ? strerror(-busy) : "0");
	/* The mapping holds the file: without it the close releases everything. */
	munmap(hb.map, hb.size);
	close(fd);

	/* A new owner takes all device memory (retrying while the copies drain). */
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	t0 = now_ms();
	while (now_ms() - t0 < 20000) {
		ret = ubuf_dev(fd2, room, &big);
		if (ret != -ENOMEM)
			break;
		sleep_ms(100);
	}
	ASSERT_EQ(0, ret) {
		TH_LOG("all %llu bytes of device memory after the close: %s",
		       (unsigned long long)room, strerror(-ret));
	}
	TH_LOG("device memory back %.0f ms after the close", now_ms() - t0);
	/* Let any late copy land, then read every byte back. */
	sleep_ms(1000);
	ASSERT_EQ(0, ubuf_host(fd2, 4 * MIB, &hb));
	zero = calloc(1, 4 * MIB);
	ASSERT_NE(NULL, zero);
	for (off = 0; off < room; off += 4 * MIB) {
		__u64 n = room - off < 4 * MIB ? room - off : 4 * MIB;
		long diff;

		memset(hb.map, 0xee, n);
		ASSERT_EQ(0, udma_memcpy(fd2, &big, off, &hb, 0, n, 0));
		diff = first_diff(hb.map, zero, n);
		EXPECT_EQ(-1, diff) {
			TH_LOG("byte %llu of the new owner's memory is %#x, not zero",
			       (unsigned long long)(off + diff), hb.map[diff]);
			break;
		}
	}
	free(zero);
	close(fd2);
}

/*
 * "A timeout shorter than 10 s ... its buffers stay busy (MEM_FREE gives EBUSY) until the engine
 * is done". Only MEM_ALLOC, MEMCPY and a release reap orphans, MEM_FREE does not: after the
 * engine finished the abandoned copy, MEM_FREE of its buffers stays EBUSY for good.
 */
TEST_F_TIMEOUT(stall, mem_free_after_abandoned_memcpy_settled, 60)
{
	struct neuron_udma_info info;
	int ret, tries = 0;
	double t0;

	ASSERT_EQ(0, udma_info(self->fd, &info));
	fill_pattern(self->a.map, 64 * KIB, 3);
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, h2t_engine(&info), 0, 1000));
	t0 = now_ms();
	ret = udma_memcpy(self->fd, &self->a, 0, &self->b, 0, 64 * KIB, 10);
	ASSERT_EQ(-ETIMEDOUT, ret);
	EXPECT_EQ(-EBUSY, mem_free(self->fd, self->b.handle));
	/* The stall ends after 1 s; the copy lands. */
	sleep_ms(2000);
	EXPECT_EQ(-1, first_diff(self->a.map, self->b.map, 64 * KIB)) {
		TH_LOG("the abandoned copy did not land after the stall");
	}
	do {
		ret = mem_free(self->fd, self->b.handle);
		tries++;
		if (ret == -EBUSY)
			sleep_ms(100);
	} while (ret == -EBUSY && tries < 30);
	TH_LOG("MEM_FREE %.0f ms after the abandoned copy: %s after %d tries", now_ms() - t0,
	       ret ? strerror(-ret) : "0", tries);
	EXPECT_EQ(0, ret);
	if (ret == -EBUSY) {
		/* Any MEM_ALLOC reaps the orphan. */
		struct ubuf x;

		ASSERT_EQ(0, ubuf_host(self->fd, 4096, &x));
		TH_LOG("after one unrelated MEM_ALLOC: MEM_FREE %s",
		       strerror(-mem_free(self->fd, self->b.handle)));
	}
}

/* ---- 7: a default-timeout MEMCPY resets the shared queue after a short wait of its own ---- */

struct late {
	int fd;
	struct ubuf *s, *d;
	__u64 size;
	__u32 timeout_ms, delay_ms;
	int ret;
	double end_ms, t0;
};

static void *late_memcpy(void *arg)
{
	struct late *l = arg;

	sleep_ms(l->delay_ms);
	l->ret = udma_memcpy(l->fd, l->s, 0, l->d, 0, l->size, l->timeout_ms);
	l->end_ms = now_ms() - l->t0;
	return NULL;
}

/*
 * memcpy_for_file() first waits (within the caller's timeout) for the file's abandoned copy,
 * then waits for its own submission only for what is left of the timeout, but decides whether
 * a timeout may reset the shared H2T queue from the whole timeout (timeout >= 10 s). File F
 * leaves a long copy behind (10 ms timeout on a slowed engine), then calls MEMCPY with the
 * default timeout: its own submission gets the ~2 s left, times out behind file V's copy, and
 * resets the shared queue: V, which asked for 30 s on a working engine, gets EIO.
 */
TEST_F_TIMEOUT(stall, default_timeout_resets_shared_queue_early, 120)
{
	struct neuron_udma_info info;
	struct ubuf os, od, vs, vd, fh;
	struct late orphan, victim, late;
	pthread_t th[2];
	__u64 osize;
	double t0, pp;
	__u32 factor = 2000;
	int fd_f = self->fd, fd_v = udma_open();

	ASSERT_LE(0, fd_v);
	ASSERT_EQ(0, udma_info(fd_f, &info));
	ASSERT_EQ(0, ubuf_dev(fd_f, 12 * MIB, &os));
	ASSERT_EQ(0, ubuf_dev(fd_f, 12 * MIB, &od));
	ASSERT_EQ(0, ubuf_dev(fd_v, 8 * MIB, &vs));
	ASSERT_EQ(0, ubuf_dev(fd_v, 8 * MIB, &vd));
	ASSERT_EQ(0, ubuf_host(fd_f, 64 * KIB, &fh));
	/* Slow the engines down to ~40 ms per 64 KiB packet (calibrated on 1 MiB). */
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_SLOW, h2t_engine(&info), 0, factor));
	t0 = now_ms();
	ASSERT_EQ(0, udma_memcpy(fd_v, &vs, 0, &vd, 0, MIB, 30000));
	pp = (now_ms() - t0) / 16;
	if (pp < 35) {
		factor = (__u32)(factor * 40 / (pp > 1 ? pp : 1));
		ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_SLOW, h2t_engine(&info), 0, factor));
		t0 = now_ms();
		ASSERT_EQ(0, udma_memcpy(fd_v, &vs, 0, &vd, 0, MIB, 30000));
		pp = (now_ms() - t0) / 16;
	}
	/* F's abandoned copy ends ~8 s from now. */
	osize = (__u64)(8000 / pp) * 64 * KIB;
	if (osize > 12 * MIB)
		osize = 12 * MIB;
	TH_LOG("slow factor %u: %.1f ms per 64 KiB packet; F's copy %llu KiB", factor, pp,
	       (unsigned long long)osize / KIB);
	t0 = now_ms();
	orphan = (struct late){ fd_f, &os, &od, osize, 10, 0, 0, 0, t0 };
	victim = (struct late){ fd_v, &vs, &vd, 8 * MIB, 30000, 100, 0, 0, t0 };
	late = (struct late){ fd_f, &fh, &fh, 32 * KIB, 0, 300, 0, 0, t0 };
	late_memcpy(&orphan);
	ASSERT_EQ(-ETIMEDOUT, orphan.ret);
	ASSERT_EQ(0, pthread_create(&th[0], NULL, late_memcpy, &victim));
	ASSERT_EQ(0, pthread_create(&th[1], NULL, late_memcpy, &late));
	pthread_join(th[0], NULL);
	pthread_join(th[1], NULL);
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	TH_LOG("F's default-timeout MEMCPY: %s at %.0f ms; V's MEMCPY (30 s timeout): %s at %.0f ms",
	       late.ret ? strerror(-late.ret) : "0", late.end_ms,
	       victim.ret ? strerror(-victim.ret) : "0", victim.end_ms);
	EXPECT_EQ(0, victim.ret) {
		TH_LOG("another file's timeout failed V's copy on a working (slow) engine");
	}
	close(fd_v);
}

/*
 * "One unfinished copy per file: a caller with a tiny timeout cannot fill the queue"
 * (memcpy_for_file): the check looks for an orphan of the file before submitting, but the
 * orphan is recorded only after the submission timed out, so threads of one file pass it
 * together. 8 threads with 10 ms timeouts put 8 MiB on the slowed shared queue; another
 * file's 64 KiB copy then waits for all of it instead of for one abandoned copy.
 */
#define FLOOD_THREADS 8

TEST_F_TIMEOUT(stall, threads_bypass_one_orphan_per_file, 120)
{
	struct neuron_udma_info info;
	struct ubuf fs[FLOOD_THREADS], fd_[FLOOD_THREADS], vh;
	struct late t[FLOOD_THREADS], v;
	pthread_t th[FLOOD_THREADS];
	int fd_v = udma_open(), i, timeouts = 0;
	double t0, flood_ms;

	ASSERT_LE(0, fd_v);
	ASSERT_EQ(0, udma_info(self->fd, &info));
	for (i = 0; i < FLOOD_THREADS; i++) {
		ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &fs[i]));
		ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &fd_[i]));
	}
	ASSERT_EQ(0, ubuf_host(fd_v, 64 * KIB, &vh));
	/* ~40 ms per 64 KiB packet: 640 ms per 1 MiB copy. */
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_SLOW, h2t_engine(&info), 0, 2000));
	t0 = now_ms();
	for (i = 0; i < FLOOD_THREADS; i++) {
		t[i] = (struct late){ self->fd, &fs[i], &fd_[i], MIB, 10, 0, 0, 0, t0 };
		ASSERT_EQ(0, pthread_create(&th[i], NULL, late_memcpy, &t[i]));
	}
	for (i = 0; i < FLOOD_THREADS; i++) {
		pthread_join(th[i], NULL);
		timeouts += t[i].ret == -ETIMEDOUT;
	}
	flood_ms = now_ms() - t0;
	v = (struct late){ fd_v, &vh, &vh, 32 * KIB, 30000, 0, 0, 0, now_ms() };
	late_memcpy(&v);
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	TH_LOG("%d threads of one file: %d ETIMEDOUT within %.0f ms; another file's 32 KiB "
	       "MEMCPY then took %.0f ms (%s)", FLOOD_THREADS, timeouts, flood_ms,
	       v.end_ms, v.ret ? strerror(-v.ret) : "0");
	EXPECT_EQ(0, v.ret);
	/* One abandoned 1 MiB copy is ~640 ms of engine time; allow two. */
	EXPECT_LT(v.end_ms, 1500.0) {
		TH_LOG("the file had about %.0f copies in flight, not one", v.end_ms / 640);
	}
	close(fd_v);
}

/* ---- 6: SIGKILL while MEM_ALLOC scrubs device memory on a hung H2T queue ---- */

/*
 * The scrub of MEM_ALLOC waits uninterruptibly (WaitMode::Uninterruptible, up to the 10 s
 * default timeout per submission): a process killed in it does not die, unlike one killed in
 * MEMCPY. When the wait times out, the scrub resets the shared H2T queue.
 */
TEST_F_TIMEOUT(stall, sigkill_during_scrub, 60)
{
	struct neuron_udma_info info;
	int ready[2], status;
	double t_kill, reaped;
	char c = 0;
	pid_t pid;

	ASSERT_EQ(0, udma_info(self->fd, &info));
	ASSERT_EQ(0, sec_setup(0666));
	ASSERT_EQ(0, pipe(ready));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, h2t_engine(&info), 0, 6000));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		__u64 h;
		int fd;

		if (sec_drop(UID_A))
			_exit(125);
		fd = udma_open();
		if (fd < 0 || write(ready[1], &c, 1) != 1)
			_exit(2);
		_exit(raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, MIB, &h, NULL) ? 3 : 0);
	}
	ASSERT_EQ(1, read(ready[0], &c, 1));
	sleep_ms(300);
	ASSERT_EQ(0, kill(pid, SIGKILL));
	t_kill = now_ms();
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	reaped = now_ms() - t_kill;
	TH_LOG("child in MEM_ALLOC (device) reaped %.0f ms after SIGKILL", reaped);
	EXPECT_LT(reaped, 1000.0);
	sleep_ms(6500 - (reaped < 6000 ? (unsigned int)reaped : 6000));
}

/* ---- 8: a storm of waits, signals, releases, mappings and a close ---- */

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
