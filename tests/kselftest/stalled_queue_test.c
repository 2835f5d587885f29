// SPDX-License-Identifier: GPL-2.0
/*
 * A queue the device model stalls: ring accounting when the completion marker takes a slot of
 * the ring's reserve (a full ring stays full, more copies are ENOSPC, the queued buffers stay
 * busy), waits that signals interrupt again and again without wedging the queue, and a MEMCPY
 * on a hung engine that SIGKILL ends at once.
 *
 * The tests run as root. Stalls come from the device model's BAR2 window. The user queues are
 * on engines 4 and 5, which uapi_test does not use, so that a queue a broken driver leaves
 * aborted does not fail the tests that run next; the MEMCPY is on the driver's own queue.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/time.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024U
#define CHUNK 4096U	/* bytes of each copy of the ring tests */
#define PAIRS 16U	/* pairs that fill a 32-slot ring down to its reserve */

/* The driver's own MEMCPY queue: queue 0 of the H2T engine of NeuronCore 0 (hardware.rst §2.3). */
static __u32 h2t_engine(const struct neuron_udma_info *info)
{
	return info->generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* SIGALRM after @ms milliseconds (0 disarms). */
static int alarm_ms(unsigned int ms)
{
	struct itimerval it = { .it_value = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 } };

	return setitimer(ITIMER_REAL, &it, NULL);
}


FIXTURE(stall) {
	int fd;
	struct neuron_udma_info info;
	struct ubar2 bar2;
	struct ubuf a, b;
	bool a_freed, b_freed;
	unsigned char *save;
};

FIXTURE_SETUP(stall)
{
	struct sigaction sa = { .sa_handler = on_alarm };	/* no SA_RESTART */
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, sigaction(SIGALRM, &sa, NULL));
	ASSERT_EQ(0, ubuf_host(self->fd, PAIRS * CHUNK, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, PAIRS * CHUNK, &self->b));
	fill_pattern(self->a.map, PAIRS * CHUNK, 1001);
	memset(self->b.map, 0, PAIRS * CHUNK);
	self->save = malloc(PAIRS * CHUNK);
	ASSERT_NE(NULL, self->save);
	memcpy(self->save, self->a.map, PAIRS * CHUNK);
}

FIXTURE_TEARDOWN(stall)
{
	alarm_ms(0);
	if (self->bar2.regs)
		bar2_write(&self->bar2, BAR2_CLEAR, 1);
	bar2_close(&self->bar2);
	free(self->save);
	if (self->fd >= 0)
		close(self->fd);
}

/* Rings of 32 descriptors on (@eng, @q) with 16 pairs a -> b prepared: the 17th is ENOSPC. */
static int fill_ring(struct __test_metadata *_metadata, FIXTURE_DATA(stall) *self, __u32 eng, __u32 q)
{
	struct neuron_udma_queue_state st;
	__u32 i;

	ASSERT_EQ(0, queue_init(self->fd, eng, q, 32, 32));
	for (i = 0; i < PAIRS; i++)
		ASSERT_EQ(0, prep_one(self->fd, eng, q, ucopy(&self->a, i * CHUNK, &self->b, i * CHUNK, CHUNK)));
	ASSERT_EQ(-ENOSPC, prep_one(self->fd, eng, q, ucopy(&self->a, 0, &self->b, 0, CHUNK)));
	ASSERT_EQ(0, queue_state(self->fd, eng, q, &st));
	EXPECT_EQ(0U, st.tx.sw_available);
	EXPECT_EQ(0U, st.rx.sw_available);
	return 0;
}

/* Both rings report no free space; logs what they say otherwise. */
#define EXPECT_RING_FULL(self, eng, q, when) do {						\
	struct neuron_udma_queue_state __st;							\
	ASSERT_EQ(0, queue_state((self)->fd, eng, q, &__st));					\
	EXPECT_TRUE(__st.tx.sw_available == 0 && __st.rx.sw_available == 0) {			\
		TH_LOG("%s: sw_available tx %u rx %u (next %u ack %u), want 0 below the reserve",\
		       when, __st.tx.sw_available, __st.rx.sw_available, __st.tx.sw_next,	\
		       __st.tx.sw_ack);								\
	}											\
} while (0)

/* The 16 copies a -> b landed byte-exact (unless b was freed under them). */
#define EXPECT_COPIES_LANDED(self) do {								\
	long __d;										\
	EXPECT_FALSE((self)->b_freed);								\
	if (!(self)->b_freed) {									\
		__d = first_diff((self)->b.map, (self)->save, PAIRS * CHUNK);			\
		EXPECT_EQ(-1, __d) {								\
			TH_LOG("copy %ld: byte %ld not copied", __d / CHUNK, __d);		\
		}										\
	}											\
} while (0)

/*
 * Ring accounting when the completion marker uses the reserve. With a full ring (16 pairs +
 * marker of 32 slots) the free space is 0, more copies are ENOSPC, the queued buffers are busy,
 * and once the stall ends every copy has landed.
 */
TEST_F_TIMEOUT(stall, marker_in_reserve_accounting, 60)
{
	struct neuron_udma_copy c = ucopy(&self->a, CHUNK, &self->b, CHUNK, CHUNK);
	__u32 eng = 4, q = 4;
	double t0;
	int ret;

	fill_ring(_metadata, self, eng, q);
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, eng, q, 2000));
	t0 = now_ms();
	ASSERT_EQ(0, alarm_ms(200));
	ret = copy_wait(self->fd, eng, q, 0, NULL);
	alarm_ms(0);
	ASSERT_EQ(-EINTR, ret);

	EXPECT_RING_FULL(self, eng, q, "after the interrupted wait");
	/* Nothing more fits: a copy here would overwrite a slot the engine has not run. */
	EXPECT_EQ(-ENOSPC, prep_one(self->fd, eng, q, ucopy(&self->a, 0, &self->b, 0, CHUNK)));
	EXPECT_EQ(-ENOSPC, prep(self->fd, eng, q, &c, 1));
	EXPECT_RING_FULL(self, eng, q, "after the refused copies");
	/* The queued copies still use both buffers. */
	ret = mem_free(self->fd, self->a.handle);
	self->a_freed = !ret;
	EXPECT_EQ(-EBUSY, ret);
	ret = mem_free(self->fd, self->b.handle);
	self->b_freed = !ret;
	EXPECT_EQ(-EBUSY, ret);
	EXPECT_LT(now_ms() - t0, 1800.0) {
		TH_LOG("the checks ran past the stall (%.0f ms): they proved nothing", now_ms() - t0);
	}

	ret = copy_wait(self->fd, eng, q, 5000, NULL);
	EXPECT_EQ(0, ret) {
		TH_LOG("wait after the stall: %s (%.0f ms after the stall began)", strerror(-ret),
		       now_ms() - t0);
	}
	EXPECT_COPIES_LANDED(self);
	if (!ret) {
		struct neuron_udma_queue_state st;

		ASSERT_EQ(0, queue_state(self->fd, eng, q, &st));
		EXPECT_EQ(32U - 16, st.tx.sw_available);
		EXPECT_EQ(32U - 16, st.rx.sw_available);
		EXPECT_EQ(0U, st.resets);
		EXPECT_EQ(0, mem_free(self->fd, self->a.handle));
		EXPECT_EQ(0, mem_free(self->fd, self->b.handle));
	}
}

/*
 * Interrupted waits must not wedge the queue. 15 waits, each interrupted after 20 ms, all EINTR
 * (an earlier fence is still pending, so never ENOSPC); after the stall a wait returns 0, the
 * copies landed and the buffers can be freed.
 */
TEST_F_TIMEOUT(stall, interrupted_waits_no_wedge, 60)
{
	__u32 eng = 5, q = 4, i;
	int ret, bad = 0;
	double t0;

	fill_ring(_metadata, self, eng, q);
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, eng, q, 2000));
	t0 = now_ms();
	for (i = 0; i < 15; i++) {
		ASSERT_EQ(0, alarm_ms(20));
		ret = copy_wait(self->fd, eng, q, 0, NULL);
		alarm_ms(0);
		if (ret != -EINTR && !bad++)
			TH_LOG("wait %u: %s, want EINTR", i + 1, ret ? strerror(-ret) : "0");
	}
	EXPECT_EQ(0, bad);
	EXPECT_LT(now_ms() - t0, 1800.0) {
		TH_LOG("the waits ran past the stall (%.0f ms)", now_ms() - t0);
	}
	EXPECT_RING_FULL(self, eng, q, "after 15 interrupted waits");

	/* The stall ends; give the engine time to consume everything. */
	sleep_ms(2500 - (unsigned int)(now_ms() - t0 < 2000 ? now_ms() - t0 : 2000));
	ret = copy_wait(self->fd, eng, q, 5000, NULL);
	EXPECT_EQ(0, ret) {
		TH_LOG("wait after the engine finished: %s", strerror(-ret));
	}
	EXPECT_COPIES_LANDED(self);
	EXPECT_EQ(0, mem_free(self->fd, self->a.handle));
	EXPECT_EQ(0, mem_free(self->fd, self->b.handle));
}

/*
 * A MEMCPY on a hung engine must die with SIGKILL at once, not after its timeout; the device
 * works afterwards.
 */
TEST_F_TIMEOUT(stall, memcpy_sigkill_on_hung_engine, 60)
{
	__u32 h2t = h2t_engine(&self->info);
	int go[2], ready[2], status;
	double t_stall, t_kill, reaped;
	char c = 0;
	pid_t pid;
	int ret;

	ASSERT_EQ(0, pipe(go));
	ASSERT_EQ(0, pipe(ready));
	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		struct ubuf s, d;
		int fd = udma_open();

		if (fd < 0 || ubuf_host(fd, 256 * KIB, &s) || ubuf_host(fd, 256 * KIB, &d))
			_exit(2);
		fill_pattern(s.map, 256 * KIB, 7);
		if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(3);
		_exit(udma_memcpy(fd, &s, 0, &d, 0, 256 * KIB, 4000) ? 4 : 0);
	}
	ASSERT_EQ(1, read(ready[0], &c, 1));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, h2t, 0, 4000));
	t_stall = now_ms();
	ASSERT_EQ(1, write(go[1], &c, 1));
	sleep_ms(200);
	ASSERT_EQ(0, kill(pid, SIGKILL));
	t_kill = now_ms();
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	reaped = now_ms() - t_kill;
	TH_LOG("child reaped %.0f ms after SIGKILL", reaped);
	EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
		TH_LOG("the MEMCPY returned before the kill: status %#x", status);
	}
	EXPECT_LT(reaped, 1000.0);

	/* After the stall the device still works. */
	if (now_ms() - t_stall < 4300)
		sleep_ms(4300 - (unsigned int)(now_ms() - t_stall));
	fill_pattern(self->a.map, PAIRS * CHUNK, 77);
	ret = udma_memcpy(self->fd, &self->a, 0, &self->b, 0, PAIRS * CHUNK, 0);
	ASSERT_EQ(0, ret) {
		TH_LOG("MEMCPY after the stall: %s", strerror(-ret));
	}
	ASSERT_EQ(-1, first_diff(self->b.map, self->a.map, PAIRS * CHUNK));
}
TEST_HARNESS_MAIN
