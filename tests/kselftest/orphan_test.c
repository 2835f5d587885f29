// SPDX-License-Identifier: GPL-2.0
/*
 * Work a caller leaves behind on a stalled queue (Documentation/userspace-api.rst, "Security
 * model"; an abandoned submission is an orphan, Documentation/neuron-udma.rst): the fences of
 * waits that signals interrupt, MEMCPYs abandoned by a short timeout (by several threads of a
 * file that is then closed: the device memory comes back and no late copy reaches its next
 * owner; MEM_FREE once the abandoned copy settled; one orphan per file, not one per thread), a
 * default-timeout MEMCPY behind its own file's orphan that must not reset the shared queue
 * under another file's copy, and SIGKILL while MEM_ALLOC scrubs device memory on a hung queue.
 *
 * Each test fails when the driver breaks the rule it checks. The user queue is on engine 14
 * (host-connected on v2 and v3), which neither uapi_test nor stalled_queue_test uses; MEMCPY
 * and the scrub use the driver's own queue of the H2T engine. Stalls and slow-downs come from
 * the device model's BAR2 window.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/time.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024U
#define MIB (1024U * 1024)

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

/* ---- fences of interrupted waits: 256 in flight on a stalled queue, then normal use ---- */

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
	/* Before the stall starts: a completion seen at t0 + 6000 or later is after its end. */
	t0 = now_ms();
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, eng, q, 6000));
	for (i = 0; i < 300 && now_ms() - t0 < 4500; i++) {
		ASSERT_EQ(0, prep_one(self->fd, eng, q,
				      ucopy(&self->a, (i % 16) * 4096, &self->b, (i % 16) * 4096, 4096)));
		ASSERT_EQ(0, alarm_us(1000));
		ret = copy_wait(self->fd, eng, q, 0, NULL);
		alarm_us(0);
		if (ret == -EINTR)
			eintr++;
		/*
		 * A wait that returns once the stall is over saw its fence complete (it looks at the
		 * fence before the signal): only a loaded host stretches one round that far.
		 */
		else if (!(ret == 0 && now_ms() - t0 >= 6000) && !other++)
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

/* ---- orphaned MEMCPYs of several threads of a closed file ---- */

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

/* ---- a default-timeout MEMCPY resets the shared queue after a short wait of its own ---- */

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
 * file's 32 KiB copy then waits for all of it instead of for one abandoned copy. The bound is
 * in units of one 1 MiB copy timed on the slowed engine first (the slow fault's delay is
 * nominal, 40 ms per 64 KiB packet at factor 2,000; the host's scheduling adds to it. Until
 * the model's delay stopped scaling the packet's measured copy time, a host hiccup inside one
 * packet made a trn1 run's copy take 1.8 s instead of 0.8).
 */
#define FLOOD_THREADS 8

TEST_F_TIMEOUT(stall, threads_bypass_one_orphan_per_file, 120)
{
	struct neuron_udma_info info;
	struct ubuf fs[FLOOD_THREADS], fd_[FLOOD_THREADS], vh;
	struct late t[FLOOD_THREADS], v;
	pthread_t th[FLOOD_THREADS];
	int fd_v = udma_open(), i, timeouts = 0;
	double t0, flood_ms, copy_ms;

	ASSERT_LE(0, fd_v);
	ASSERT_EQ(0, udma_info(self->fd, &info));
	for (i = 0; i < FLOOD_THREADS; i++) {
		ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &fs[i]));
		ASSERT_EQ(0, ubuf_dev(self->fd, MIB, &fd_[i]));
	}
	ASSERT_EQ(0, ubuf_host(fd_v, 64 * KIB, &vh));
	/* 40 ms per 64 KiB packet: about 0.65 s per 1 MiB copy (and the host's share), timed here. */
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_SLOW, h2t_engine(&info), 0, 2000));
	t0 = now_ms();
	ASSERT_EQ(0, udma_memcpy(self->fd, &fs[0], 0, &fd_[0], 0, MIB, 30000));
	copy_ms = now_ms() - t0;
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
	TH_LOG("one 1 MiB copy on the slowed engine: %.0f ms; %d threads of one file: %d "
	       "ETIMEDOUT within %.0f ms; another file's 32 KiB MEMCPY then took %.0f ms (%s)",
	       copy_ms, FLOOD_THREADS, timeouts, flood_ms, v.end_ms,
	       v.ret ? strerror(-v.ret) : "0");
	EXPECT_EQ(0, v.ret);
	/* One abandoned 1 MiB copy is one copy_ms of engine time; allow two (the bug: eight). */
	EXPECT_LT(v.end_ms, 2 * copy_ms + 200.0) {
		TH_LOG("the file had about %.1f copies in flight, not one", v.end_ms / copy_ms);
	}
	close(fd_v);
}

/* ---- SIGKILL while MEM_ALLOC scrubs device memory on a hung H2T queue ---- */

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

TEST_HARNESS_MAIN
