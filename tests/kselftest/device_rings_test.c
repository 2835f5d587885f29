// SPDX-License-Identifier: GPL-2.0
/*
 * Queues with their rings in device memory (NEURON_UDMA_QUEUE_DEVICE_RINGS, ABI 3;
 * Documentation/neuron-udma.rst, "Rings in device memory"): the engine fetches the descriptors
 * from HBM and writes the completion markers there, so every engine serves such a queue,
 * including the Trainium2 engines without host connectivity that refuse a queue with host rings
 * (hardware.rst §2.5). Checked here:
 *
 *   - INFO's device_ring_engines (every engine when the device has device memory);
 *   - an HBM->HBM copy with byte checks on each engine a host-ring QUEUE_INIT refuses (Trainium2:
 *     96 engines; Trainium1/Inferentia2 have none, so every engine there), queues varying, and
 *     passes over the ring's wrap with both ways descriptors reach the ring (the module
 *     parameter device_ring_fill: bar4 and engine);
 *   - EINVAL / EBUSY / ENOMEM / EOPNOTSUPP, and that the rings come from the device-memory
 *     allocator and go back to it;
 *   - QUEUE_RELEASE and close() while copies are in flight (stalled, and running): the device
 *     memory comes back and the engine writes nothing afterwards;
 *   - a host buffer on a device-ring queue of an engine without host connectivity fails in the
 *     engine with EIO (the queue is reset and usable), without touching other queues; on
 *     Trainium1 every engine reaches host memory, so the same copy succeeds;
 *   - fences, poll() and QUEUE_EVENTS on a device-ring queue (completion polled through BAR4).
 */
#include <poll.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_util.h"

#define BUF (1U << 20)		/* host and device buffers */
#define SLICE 4096U		/* each engine's part of the destination */
#define FILL_PARAM "/sys/module/neuron_udma/parameters/device_ring_fill"
#define DR NEURON_UDMA_QUEUE_DEVICE_RINGS

static int qinit(int fd, __u32 eng, __u32 q, __u32 tx, __u32 rx, __u32 flags)
{
	struct neuron_udma_queue_init i = {
		.engine = eng, .queue = q, .tx_descs = tx, .rx_descs = rx, .flags = flags,
	};

	return udma_ioc(fd, NEURON_UDMA_QUEUE_INIT, &i);
}

static bool in_map(const __u64 *map, __u32 e)
{
	return (map[e / 64] >> (e % 64)) & 1;
}

/*
 * A queue of engine @eng that nothing reserves (hardware.rst §2.4: queues 0/1 of the H2T engines,
 * 14 and 15 of the others; the dmaengine channels take 15 down to 12 of the last H2T engine),
 * varying with @i.
 */
static __u32 pick_queue(__u32 eng, unsigned int i)
{
	static const __u32 qs[] = { 2, 3, 5, 7, 9, 11 };

	return qs[(eng + i) % 6];
}

/* The device_ring_fill module parameter ("bar4" or "engine"), or "" if it cannot be read. */
static void fill_get(char *buf, size_t len)
{
	FILE *f = fopen(FILL_PARAM, "re");

	buf[0] = 0;
	if (!f)
		return;
	if (!fgets(buf, len, f))
		buf[0] = 0;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
}

static int fill_set(const char *how)
{
	return sysfs_write(FILL_PARAM, how);
}

/* Copies @len bytes of device buffer @d at @off to host buffer @h at 0 (MEMCPY, H2T queue). */
static int dev_read(int fd, const struct ubuf *d, __u64 off, const struct ubuf *h, __u64 len)
{
	return udma_memcpy(fd, d, off, h, 0, len, 0);
}

/*
 * Allocates 1 MiB device buffers until MEM_ALLOC fails, gives the last one back, then 4 KiB
 * buffers until MEM_ALLOC fails: all device memory is taken, the last buffers 4 KiB ones.
 * Returns how many buffers are in @bufs.
 */
static unsigned int dev_exhaust(int fd, struct ubuf *bufs, unsigned int max)
{
	unsigned int n = 0;

	while (n < max && !ubuf_dev(fd, 1 << 20, &bufs[n]))
		n++;
	if (n)
		ubuf_free(fd, &bufs[--n]);
	while (n < max && !ubuf_dev(fd, 4096, &bufs[n]))
		n++;
	return n;
}

static bool all_zero(const unsigned char *p, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

static __u32 resets(int fd, __u32 eng, __u32 q)
{
	struct neuron_udma_queue_state st;

	return queue_state(fd, eng, q, &st) ? ~0U : st.resets;
}

FIXTURE(dr) {
	int fd;
	struct neuron_udma_info info;
	struct ubuf a, b;	/* host: the pattern, and what is read back */
	struct ubuf d1, d2;	/* device: source, destination */
	char fill[16];		/* device_ring_fill at setup, put back at teardown */
};

FIXTURE_SETUP(dr)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	fill_get(self->fill, sizeof(self->fill));
	if (!self->info.device_mem_size)
		return;
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->b));
	ASSERT_EQ(0, ubuf_dev(self->fd, BUF, &self->d1));
	ASSERT_EQ(0, ubuf_dev(self->fd, BUF, &self->d2));
	fill_pattern(self->a.map, BUF, 26);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->a, 0, &self->d1, 0, BUF, 0));
}

FIXTURE_TEARDOWN(dr)
{
	if (self->fill[0])
		fill_set(self->fill);
	close(self->fd);
}

#define NEED_DEVICE_MEMORY()                                                                      \
	do {                                                                                      \
		if (!self->info.device_mem_size)                                                  \
			SKIP(return, "the device has no device memory (DEVICE_RINGS is EOPNOTSUPP)"); \
	} while (0)

/* INFO: every engine serves DEVICE_RINGS when the device has device memory, none otherwise. */
TEST_F(dr, info_engines)
{
	__u32 e;

	for (e = 0; e < 192; e++)
		EXPECT_EQ(self->info.device_mem_size && e < self->info.engines,
			  in_map(self->info.device_ring_engines, e)) {
			TH_LOG("engine %u", e);
		}
	if (!self->info.device_mem_size)
		EXPECT_EQ(-EOPNOTSUPP, qinit(self->fd, 4, 2, 32, 32, DR));
}

/*
 * Each engine a host-ring QUEUE_INIT refuses (every engine where none is refused) takes a
 * device-ring queue and copies HBM->HBM: four copies of different sizes into its own slice of
 * the destination, checked byte for byte.
 */
TEST_F(dr, copy_each_engine)
{
	bool any_refused = false;
	unsigned int k = 0;
	__u32 e;

	NEED_DEVICE_MEMORY();
	for (e = 0; e < self->info.engines; e++)
		any_refused |= !in_map(self->info.host_engines, e);
	for (e = 0; e < self->info.engines; e++) {
		__u32 q = pick_queue(e, 0), sz[4] = { 1, 100, 1000, 2995 };
		struct neuron_udma_copy c[4];
		__u64 at = 0;
		int i, ret;

		if (any_refused && in_map(self->info.host_engines, e))
			continue;
		k++;
		if (any_refused)
			EXPECT_EQ(-EOPNOTSUPP, qinit(self->fd, e, q, 32, 32, 0));
		ret = qinit(self->fd, e, q, 32, 32, DR);
		ASSERT_EQ(0, ret) {
			TH_LOG("engine %u queue %u: %s", e, q, strerror(-ret));
		}
		for (i = 0; i < 4; i++) {
			/* Source offsets differ per engine: a copy on the wrong engine shows. */
			c[i] = ucopy(&self->d1, (__u64)e * 977 + at, &self->d2, (__u64)e * SLICE + at,
				     sz[i]);
			at += sz[i];
		}
		ASSERT_EQ(0, prep(self->fd, e, q, c, 4));
		ret = copy_wait(self->fd, e, q, 0, NULL);
		EXPECT_EQ(0, ret) {
			TH_LOG("engine %u queue %u: COPY_WAIT %s", e, q, strerror(-ret));
		}
		EXPECT_EQ(0U, resets(self->fd, e, q));
		ASSERT_EQ(0, queue_release(self->fd, e, q));
	}
	ASSERT_EQ(0, dev_read(self->fd, &self->d2, 0, &self->b, (__u64)self->info.engines * SLICE));
	for (e = 0; e < self->info.engines; e++) {
		if (any_refused && in_map(self->info.host_engines, e))
			continue;
		EXPECT_EQ(-1, first_diff(self->b.map + e * SLICE, self->a.map + e * 977, SLICE))
		{
			TH_LOG("engine %u: bytes differ", e);
		}
	}
	TH_LOG("%u engines (%s)", k, any_refused ? "those without host connectivity" : "all");
}

/*
 * Passes over the ring's wrap (32-slot rings: 12 copies and a marker per wait, five waits), with
 * each way descriptors reach a ring in device memory, on two engines (one without host
 * connectivity where there is one).
 */
TEST_F(dr, wrap_both_fills)
{
	static const char *const fills[] = { "bar4", "engine" };
	__u32 engs[2] = { 0, 5 };
	unsigned int f, r, i, n = 0;

	NEED_DEVICE_MEMORY();
	if (!self->fill[0])
		SKIP(return, "no %s", FILL_PARAM);
	for (f = 0; f < 2; f++) {
		ASSERT_EQ(0, fill_set(fills[f]));
		for (i = 0; i < 2; i++) {
			__u32 e = engs[i], q = pick_queue(e, f + 1);

			ASSERT_EQ(0, qinit(self->fd, e, q, 32, 32, DR));
			for (r = 0; r < 5; r++, n++) {
				struct neuron_udma_copy c[12];
				unsigned int j;

				for (j = 0; j < 12; j++)
					c[j] = ucopy(&self->d1, n * 12 * 64 + j * 64 + n, &self->d2,
						     n * 12 * 64 + j * 64, 64);
				ASSERT_EQ(0, prep(self->fd, e, q, c, 12));
				ASSERT_EQ(0, copy_wait(self->fd, e, q, 0, NULL)) {
					TH_LOG("fill %s engine %u round %u", fills[f], e, r);
				}
			}
			ASSERT_EQ(0, queue_release(self->fd, e, q));
		}
	}
	ASSERT_EQ(0, dev_read(self->fd, &self->d2, 0, &self->b, n * 12 * 64));
	for (r = 0; r < n; r++)
		EXPECT_EQ(-1, first_diff(self->b.map + r * 12 * 64, self->a.map + r * 12 * 64 + r,
					 12 * 64)) {
			TH_LOG("round %u (fill %s)", r, fills[r / 10]);
		}
}

/* Arguments: EINVAL, EBUSY, ENOMEM; the rings come from the device-memory allocator. */
TEST_F(dr, errors)
{
	bool v3 = self->info.generation == NEURON_UDMA_GEN_V3;
	struct ubuf *bufs = calloc(65536, sizeof(*bufs));
	unsigned int n, i;
	struct ubuf one;

	NEED_DEVICE_MEMORY();
	ASSERT_NE(NULL, bufs);
	EXPECT_EQ(-EINVAL, qinit(self->fd, 0, 2, 32, 32, 2));
	EXPECT_EQ(-EINVAL, qinit(self->fd, 0, 2, 32, 32, DR | 0x80000000U));
	EXPECT_EQ(-EINVAL, qinit(self->fd, 0, 2, 48, 32, DR));
	EXPECT_EQ(-EINVAL, qinit(self->fd, 0, 2, 32, 1U << 24, DR));
	EXPECT_EQ(-EINVAL, qinit(self->fd, self->info.engines, 2, 32, 32, DR));
	EXPECT_EQ(-EINVAL, qinit(self->fd, 0, 16, 32, 32, DR));
	/* Reserved for the driver: the H2T queue, whatever the placement. */
	EXPECT_EQ(-EBUSY, qinit(self->fd, v3 ? 128 : 32, 0, 32, 32, DR));
	/* Taken, by either placement. */
	ASSERT_EQ(0, qinit(self->fd, 4, 2, 32, 32, DR));
	EXPECT_EQ(-EBUSY, qinit(self->fd, 4, 2, 32, 32, DR));
	EXPECT_EQ(-EBUSY, qinit(self->fd, 4, 2, 32, 32, 0));
	ASSERT_EQ(0, queue_release(self->fd, 4, 2));
	ASSERT_EQ(0, qinit(self->fd, 4, 2, 32, 32, 0));
	EXPECT_EQ(-EBUSY, qinit(self->fd, 4, 2, 32, 32, DR));
	ASSERT_EQ(0, queue_release(self->fd, 4, 2));
	/* Without device memory left: ENOMEM; 32-slot rings take one 4 KiB unit. */
	n = dev_exhaust(self->fd, bufs, 65536);
	ASSERT_LT(0U, n);
	EXPECT_EQ(-ENOMEM, qinit(self->fd, 0, 2, 32, 32, DR));
	/* Host rings do not need device memory (engine 4 reaches the host on every model). */
	EXPECT_EQ(0, qinit(self->fd, 4, 3, 32, 32, 0));
	EXPECT_EQ(0, queue_release(self->fd, 4, 3));
	ASSERT_EQ(4096ULL, bufs[n - 1].size);
	ASSERT_EQ(0, ubuf_free(self->fd, &bufs[--n]));
	ASSERT_EQ(0, qinit(self->fd, 0, 2, 32, 32, DR));
	EXPECT_EQ(-ENOMEM, ubuf_dev(self->fd, 4096, &one));
	/* Released: the 4 KiB are back, and larger rings do not fit in them. */
	ASSERT_EQ(0, queue_release(self->fd, 0, 2));
	EXPECT_EQ(-ENOMEM, qinit(self->fd, 0, 2, 4096, 4096, DR));
	ASSERT_EQ(0, ubuf_dev(self->fd, 4096, &one));
	EXPECT_EQ(0, ubuf_free(self->fd, &one));
	for (i = 0; i < n; i++)
		EXPECT_EQ(0, ubuf_free(self->fd, &bufs[i]));
	/* Every byte back: 4096-slot rings (128 KiB + the completion slots) fit again. */
	EXPECT_EQ(0, qinit(self->fd, 0, 2, 4096, 4096, DR));
	EXPECT_EQ(0, queue_release(self->fd, 0, 2));
	free(bufs);
}

/*
 * A device-ring queue of file @qfd with copies in flight is given up by @how (QUEUE_RELEASE or
 * close), while the queue is stalled by the model (the copies cannot have run) or runs a long
 * batch: the device memory comes back at once, and the engine writes nothing after it.
 */
static void give_up_in_flight(struct __test_metadata *_metadata, FIXTURE_DATA(dr) *self,
			      bool close_file, bool stalled)
{
	struct ubuf *bufs = calloc(65536, sizeof(*bufs)), s1, s2, h, back[3], none;
	__u32 e = 1, q = 3;
	struct neuron_udma_copy c[16];
	unsigned int n, i;
	struct ubar2 bar2 = { .fd = -1 };
	int qfd = close_file ? udma_open() : self->fd;

	ASSERT_NE(NULL, bufs);
	ASSERT_LE(0, qfd);
	/* The queue's file: its own 64 KiB source and destination, the source filled. */
	ASSERT_EQ(0, ubuf_dev(qfd, 65536, &s1));
	ASSERT_EQ(0, ubuf_dev(qfd, 65536, &s2));
	ASSERT_EQ(0, ubuf_host(qfd, 65536, &h));
	memset(h.map, 0x5A, 65536);
	ASSERT_EQ(0, udma_memcpy(qfd, &h, 0, &s1, 0, 65536, 0));
	ASSERT_EQ(0, qinit(qfd, e, q, 64, 64, DR));
	/* Everything else of device memory taken by this file. */
	n = dev_exhaust(self->fd, bufs, 65536);
	ASSERT_LT(0U, n);
	if (stalled) {
		ASSERT_EQ(0, bar2_open(&bar2));
		ASSERT_EQ(0, bar2_fault(&bar2, FAULT_STALL, e, q, 400));
	}
	/* Stalled: 16 small copies that cannot start; running: 1 MiB in 64 KiB copies. */
	for (i = 0; i < 16; i++)
		c[i] = stalled ? ucopy(&s1, 0, &s2, 4096 * i, 4096) : ucopy(&s1, 0, &s2, 0, 65536);
	ASSERT_EQ(0, prep(qfd, e, q, c, 16));
	ASSERT_EQ(0, copy_start(qfd, e, q, 16, 16));
	if (close_file) {
		ubuf_free(qfd, &h);
		close(qfd);
	} else {
		ASSERT_EQ(0, queue_release(qfd, e, q));
	}
	/*
	 * The queue's device memory (4 KiB) is free again; after a close, so are the file's two
	 * buffers (the engine was stopped first: nothing holds them).
	 */
	ASSERT_EQ(0, ubuf_dev(self->fd, 4096, &back[0]));
	if (close_file) {
		ASSERT_EQ(0, ubuf_dev(self->fd, 65536, &back[1]));
		ASSERT_EQ(0, ubuf_dev(self->fd, 65536, &back[2]));
	} else {
		ASSERT_EQ(0, mem_free(qfd, s1.handle));
		ASSERT_EQ(0, mem_free(qfd, s2.handle));
		ASSERT_EQ(0, ubuf_dev(self->fd, 65536, &back[1]));
		ASSERT_EQ(0, ubuf_dev(self->fd, 65536, &back[2]));
		ubuf_free(qfd, &h);
	}
	EXPECT_EQ(-ENOMEM, ubuf_dev(self->fd, 4096, &none));
	/* After the stall, the new owner's memory (scrubbed when allocated) stays zero. */
	usleep(stalled ? 600000 : 100000);
	for (i = 0; i < 3; i++) {
		ASSERT_EQ(0, dev_read(self->fd, &back[i], 0, &self->b, back[i].size));
		EXPECT_TRUE(all_zero(self->b.map, back[i].size)) {
			TH_LOG("buffer %u of the given-back memory was written", i);
		}
		EXPECT_EQ(0, ubuf_free(self->fd, &back[i]));
	}
	for (i = 0; i < n; i++)
		EXPECT_EQ(0, ubuf_free(self->fd, &bufs[i]));
	/* The engine and the queue work again. */
	ASSERT_EQ(0, qinit(self->fd, e, q, 64, 64, DR));
	ASSERT_EQ(0, copy_sync(self->fd, e, q, ucopy(&self->d1, 0, &self->d2, 0, 8192)));
	ASSERT_EQ(0, dev_read(self->fd, &self->d2, 0, &self->b, 8192));
	EXPECT_EQ(-1, first_diff(self->b.map, self->a.map, 8192));
	EXPECT_EQ(0, queue_release(self->fd, e, q));
	if (stalled)
		bar2_close(&bar2);
	free(bufs);
}

TEST_F(dr, release_in_flight)
{
	NEED_DEVICE_MEMORY();
	give_up_in_flight(_metadata, self, false, true);
	give_up_in_flight(_metadata, self, false, false);
}

TEST_F(dr, close_in_flight)
{
	NEED_DEVICE_MEMORY();
	give_up_in_flight(_metadata, self, true, true);
	give_up_in_flight(_metadata, self, true, false);
}

/*
 * A copy that names a host buffer on a device-ring queue of an engine without host connectivity
 * fails in the engine: COPY_WAIT is EIO, the queue is reset and copies again; queues of other
 * engines, with work in flight meanwhile, are not touched. Where every engine reaches host
 * memory (Trainium1, Inferentia2), the same copies succeed.
 */
TEST_F(dr, host_buffer)
{
	bool hostless = !in_map(self->info.host_engines, 0);
	__u32 e = 0, q = 2, f = 1, fq = 3, g = 4, gq = 2;
	struct neuron_udma_copy cf[8], cg;
	struct ubar2 bar2;
	int ret;
	unsigned int i;

	NEED_DEVICE_MEMORY();
	ASSERT_EQ(0, bar2_open(&bar2));
	ASSERT_EQ(0, qinit(self->fd, e, q, 64, 64, DR));
	ASSERT_EQ(0, qinit(self->fd, f, fq, 64, 64, DR));
	ASSERT_EQ(0, qinit(self->fd, g, gq, 64, 64, 0));
	/* Work in flight on the other queues while engine 0 fails: stalled for 300 ms. */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_STALL, f, fq, 300));
	for (i = 0; i < 8; i++)
		cf[i] = ucopy(&self->d1, 65536 + i * 4096, &self->d2, 65536 + i * 4096, 4096);
	ASSERT_EQ(0, prep(self->fd, f, fq, cf, 8));
	ASSERT_EQ(0, copy_start(self->fd, f, fq, 8, 8));
	cg = ucopy(&self->a, 0, &self->d2, 262144, 65536);
	ASSERT_EQ(0, prep_one(self->fd, g, gq, cg));
	ASSERT_EQ(0, copy_start(self->fd, g, gq, 1, 1));
	/* Host source, then host destination, on engine 0's device-ring queue. */
	memset(self->b.map, 0xEE, 8192);
	ASSERT_EQ(0, prep_one(self->fd, e, q, ucopy(&self->a, 0, &self->d2, 0, 4096)));
	ret = copy_wait(self->fd, e, q, 0, NULL);
	EXPECT_EQ(hostless ? -EIO : 0, ret);
	ASSERT_EQ(0, prep_one(self->fd, e, q, ucopy(&self->d1, 0, &self->b, 4096, 4096)));
	ret = copy_wait(self->fd, e, q, 0, NULL);
	EXPECT_EQ(hostless ? -EIO : 0, ret);
	EXPECT_EQ(hostless ? 2U : 0U, resets(self->fd, e, q));
	if (hostless) {
		for (i = 0; i < 8192; i++)
			if (self->b.map[i] != 0xEE)
				break;
		EXPECT_EQ(8192U, i) {
			TH_LOG("the host buffer was written at %u", i);
		}
	} else {
		EXPECT_EQ(-1, first_diff(self->b.map + 4096, self->a.map, 4096));
	}
	/* Engine 0's queue copies device memory again. */
	ASSERT_EQ(0, copy_sync(self->fd, e, q, ucopy(&self->d1, 4096, &self->d2, 4096, 4096)));
	/* The other queues finish their work, untouched. */
	EXPECT_EQ(0, copy_wait(self->fd, f, fq, 0, NULL));
	EXPECT_EQ(0, copy_wait(self->fd, g, gq, 0, NULL));
	EXPECT_EQ(0U, resets(self->fd, f, fq));
	EXPECT_EQ(0U, resets(self->fd, g, gq));
	ASSERT_EQ(0, dev_read(self->fd, &self->d2, 0, &self->b, 327680));
	EXPECT_EQ(-1, first_diff(self->b.map + 4096, self->a.map + 4096, 4096));
	EXPECT_EQ(-1, first_diff(self->b.map + 65536, self->a.map + 65536, 32768));
	EXPECT_EQ(-1, first_diff(self->b.map + 262144, self->a.map, 65536));
	EXPECT_EQ(0, queue_release(self->fd, e, q));
	EXPECT_EQ(0, queue_release(self->fd, f, fq));
	EXPECT_EQ(0, queue_release(self->fd, g, gq));
	bar2_close(&bar2);
}

/* Fences, poll() and QUEUE_EVENTS on a device-ring queue: its markers are polled in HBM. */
TEST_F(dr, fences_and_events)
{
	struct neuron_udma_copy_submit s = { .engine = 2, .queue = 5 };
	struct neuron_udma_fence_wait w = { .engine = 2, .queue = 5 };
	struct neuron_udma_fence_status st = { .engine = 2, .queue = 5 };
	struct neuron_udma_queue_event ev[4];
	struct neuron_udma_events evs = { .events = (uintptr_t)ev, .max = 4 };
	struct pollfd p = { .fd = self->fd, .events = POLLIN };
	unsigned int i;

	NEED_DEVICE_MEMORY();
	ASSERT_EQ(0, qinit(self->fd, 2, 5, 64, 64, DR));
	/* Poll first, so the completion engine watches the queue's fences. */
	EXPECT_EQ(0, poll(&p, 1, 0));
	for (i = 0; i < 3; i++) {
		ASSERT_EQ(0, prep_one(self->fd, 2, 5,
				      ucopy(&self->d1, i * 8192, &self->d2, i * 8192, 8192)));
		ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_COPY_SUBMIT, &s));
		EXPECT_EQ(i + 1, s.fence);
	}
	ASSERT_EQ(1, poll(&p, 1, 10000));
	EXPECT_TRUE(p.revents & POLLIN);
	w.fence = s.fence;
	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_FENCE_WAIT, &w));
	st.fence = 2;
	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_FENCE_STATUS, &st));
	EXPECT_EQ((__u32)NEURON_UDMA_FENCE_DONE, st.state);
	EXPECT_EQ(3U, st.completed);
	ASSERT_EQ(0, udma_ioc(self->fd, NEURON_UDMA_QUEUE_EVENTS, &evs));
	ASSERT_EQ(1U, evs.count);
	EXPECT_EQ(2U, ev[0].engine);
	EXPECT_EQ(5U, ev[0].queue);
	EXPECT_EQ(3U, ev[0].completed);
	EXPECT_NE(0U, ev[0].flags & NEURON_UDMA_EVENT_COMPLETED);
	ASSERT_EQ(0, dev_read(self->fd, &self->d2, 0, &self->b, 3 * 8192));
	EXPECT_EQ(-1, first_diff(self->b.map, self->a.map, 3 * 8192));
	EXPECT_EQ(0, queue_release(self->fd, 2, 5));
}

TEST_HARNESS_MAIN
