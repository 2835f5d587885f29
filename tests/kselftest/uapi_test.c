// SPDX-License-Identifier: GPL-2.0
/*
 * The ioctl ABI of neuron_udma (include/uapi/linux/neuron_udma.h) against /dev/neuron_udma0 on
 * the device model: every ioctl's happy path with the bytes checked through mmap, every
 * documented error (each followed by a check that the queue state and the buffers did not
 * change), reserved fields, copy sizes, ring wrap, big batches, two processes, threads, closing
 * with copies in flight, and fault injection through the model's BAR2 window.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_util.h"

#define ENG 4U	/* has host connectivity on v2 and v3 (hardware.rst §2.5) */
#define QID 1U
#define RING 256
#define BUF (256U * 1024)
#define BAD_HANDLE 0xdead0000beefULL

/* The queue state must be exactly @before again. */
#define ASSERT_UNCHANGED(fd, eng, q, before) do {					\
	struct neuron_udma_queue_state __now;						\
	char __why[256] = "";								\
	ASSERT_EQ(0, queue_state(fd, eng, q, &__now));					\
	ASSERT_EQ(0, state_diff(before, &__now, __why, sizeof(__why))) {		\
		TH_LOG("%s", __why);							\
	}										\
} while (0)

/* The bytes of @buf must equal @saved. */
#define ASSERT_BYTES(buf, saved, len) do {						\
	long __d = first_diff(buf, saved, len);					\
	ASSERT_EQ(-1, __d) {								\
		TH_LOG("byte %ld differs", __d);					\
	}										\
} while (0)

/* ---- device-level tests: no queue ---- */

FIXTURE(dev) {
	int fd;
	struct neuron_udma_info info;
};

FIXTURE_SETUP(dev)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
}

FIXTURE_TEARDOWN(dev)
{
	if (self->fd >= 0)
		close(self->fd);
}

TEST_F(dev, info)
{
	struct neuron_udma_info *i = &self->info;

	EXPECT_EQ((__u32)NEURON_UDMA_ABI_VERSION, i->abi_version);
	EXPECT_EQ(0x1d0fU, i->vendor_id);
	if (i->device_id == 0x7364) {
		EXPECT_EQ((__u32)NEURON_UDMA_GEN_V3, i->generation);
	} else {
		EXPECT_EQ((__u32)NEURON_UDMA_GEN_V2, i->generation);
	}
	EXPECT_TRUE(i->device_id == 0x7164 || i->device_id == 0x7264 || i->device_id == 0x7364);
	EXPECT_LE(4U, i->engines);
	EXPECT_EQ(16U, i->queues_per_engine);
	EXPECT_EQ(UDMA_MAX_COPY, i->max_copy_size);
	EXPECT_LT(0U, i->device_mem_size);
	EXPECT_EQ(32U, i->min_ring_descs);
	EXPECT_EQ(1U << 23, i->max_ring_descs);
	EXPECT_EQ(16U, i->ring_reserve_descs);
	EXPECT_LE(1U, i->max_batch);
	EXPECT_LE((__u64)BUF, i->max_host_buffer);
	EXPECT_EQ(1ULL << 30, i->max_import_size);
	/* The engine these tests use reaches host memory; engine 0 does only on v2. */
	EXPECT_TRUE(!!(i->host_engines[ENG / 64] & (1ULL << (ENG % 64))));
	EXPECT_EQ(i->generation == NEURON_UDMA_GEN_V2, !!(i->host_engines[0] & 1));
}

/* INFO's numa_node is the PCI device's (sysfs numa_node: -1 without a node), its padding 0. */
TEST_F(dev, info_numa_node)
{
	char bdf[64], path[128];
	int node = -2;
	FILE *f;

	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/numa_node", bdf);
	f = fopen(path, "re");
	ASSERT_NE(NULL, f);
	ASSERT_EQ(1, fscanf(f, "%d", &node));
	fclose(f);
	EXPECT_EQ(node, self->info.numa_node);
	EXPECT_EQ(NEURON_UDMA_FEATURE_URING_FIXED, self->info.features);
	EXPECT_EQ(0ULL, self->info.reserved[0] | self->info.reserved[1] | self->info.reserved[2]);
}

TEST_F(dev, unknown_ioctl_enotty)
{
	char buf[256] = { 0 };

	EXPECT_EQ(-ENOTTY, udma_ioc(self->fd, _IOWR(NEURON_UDMA_IOC_MAGIC, 0x0C, struct neuron_udma_copy), buf));
	EXPECT_EQ(-ENOTTY, udma_ioc(self->fd, _IO(NEURON_UDMA_IOC_MAGIC, 0x7F), buf));
	EXPECT_EQ(-ENOTTY, udma_ioc(self->fd, _IOR(NEURON_UDMA_IOC_MAGIC + 1, 0x00, struct neuron_udma_info), buf));
	/* A known number with the wrong size or direction is a different command. */
	EXPECT_EQ(-ENOTTY, udma_ioc(self->fd, _IOR(NEURON_UDMA_IOC_MAGIC, 0x00, __u64), buf));
	EXPECT_EQ(-ENOTTY, udma_ioc(self->fd, _IOW(NEURON_UDMA_IOC_MAGIC, 0x00, struct neuron_udma_info), buf));
	EXPECT_EQ(-ENOTTY, udma_ioc(self->fd, _IOR(NEURON_UDMA_IOC_MAGIC, 0x02, struct neuron_udma_mem_free), buf));
}

TEST_F(dev, bad_pointer_efault)
{
	static const unsigned long cmds[] = {
		NEURON_UDMA_INFO, NEURON_UDMA_MEM_ALLOC, NEURON_UDMA_MEM_FREE, NEURON_UDMA_QUEUE_INIT,
		NEURON_UDMA_QUEUE_RELEASE, NEURON_UDMA_COPY_PREPARE_ONE, NEURON_UDMA_COPY_PREPARE,
		NEURON_UDMA_COPY_START, NEURON_UDMA_COPY_WAIT, NEURON_UDMA_QUEUE_STATE, NEURON_UDMA_MEMCPY,
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cmds); i++) {
		EXPECT_EQ(-EFAULT, udma_ioc(self->fd, cmds[i], (void *)8)) {
			TH_LOG("ioctl %#lx", cmds[i]);
		}
	}
}

TEST_F(dev, mem_alloc_free)
{
	struct ubuf h, h2, d;
	size_t i;

	ASSERT_EQ(0, ubuf_host(self->fd, 5000, &h));
	ASSERT_NE(0U, h.handle);
	memset(h.map, 0x5a, 5000);
	/* A size that is not a multiple of 4 KiB maps and holds all its bytes. */
	for (i = 0; i < 5000; i++)
		ASSERT_EQ(0x5aU, h.map[i]);
	ASSERT_EQ(0, ubuf_host(self->fd, 4096, &h2));
	ASSERT_NE(h.handle, h2.handle);
	ASSERT_NE(h.mmap_offset, h2.mmap_offset);
	ASSERT_EQ(0, ubuf_dev(self->fd, 1 << 20, &d));
	ASSERT_NE(0U, d.handle);
	ASSERT_NE(h.handle, d.handle);
	/* ABI 3: device buffers map too (through BAR4), each at an offset of its own. */
	EXPECT_NE(0U, d.mmap_offset);
	EXPECT_NE(h.mmap_offset, d.mmap_offset);
	EXPECT_NE(h2.mmap_offset, d.mmap_offset);
	ASSERT_EQ(0, ubuf_free(self->fd, &h));
	EXPECT_EQ(-ENOENT, mem_free(self->fd, h.handle));
	EXPECT_EQ(0, ubuf_free(self->fd, &d));
	EXPECT_EQ(-ENOENT, mem_free(self->fd, d.handle));
	EXPECT_EQ(-ENOENT, mem_free(self->fd, 0));
	EXPECT_EQ(-ENOENT, mem_free(self->fd, BAD_HANDLE));
	EXPECT_EQ(0, ubuf_free(self->fd, &h2));
}

/* MEM_ALLOC with every field given; a buffer it makes anyway is leaked to the file. */
static int alloc_raw(int fd, __u64 size, __u32 type, __u32 flags, __u64 r0, __u64 r1)
{
	struct neuron_udma_mem_alloc a = {
		.size = size, .type = type, .flags = flags, .reserved = { r0, r1 },
	};

	return udma_ioc(fd, NEURON_UDMA_MEM_ALLOC, &a);
}

TEST_F(dev, mem_alloc_errors)
{
	struct neuron_udma_mem_free f = { .handle = BAD_HANDLE, .reserved = 1 };
	struct ubuf h;

	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 0, NEURON_UDMA_MEM_HOST, 0, 0, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 0, NEURON_UDMA_MEM_DEVICE, 0, 0, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 4096, 2, 0, 0, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 4096, ~0U, 0, 0, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 4096, NEURON_UDMA_MEM_HOST, 1, 0, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 4096, NEURON_UDMA_MEM_DEVICE, 0x80000000U, 0, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 4096, NEURON_UDMA_MEM_HOST, 0, 1, 0));
	EXPECT_EQ(-EINVAL, alloc_raw(self->fd, 4096, NEURON_UDMA_MEM_DEVICE, 0, 0, 1));
	EXPECT_EQ(-ENOMEM, alloc_raw(self->fd, self->info.device_mem_size + 4096, NEURON_UDMA_MEM_DEVICE, 0, 0, 0));
	/* MEM_FREE with reserved set is refused before the handle is looked up. */
	ASSERT_EQ(0, ubuf_host(self->fd, 4096, &h));
	f.handle = h.handle;
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_MEM_FREE, &f));
	/* ... and did not free it. */
	h.map[0] = 1;
	EXPECT_EQ(0, ubuf_free(self->fd, &h));
}

TEST_F(dev, queue_init_release)
{
	struct neuron_udma_queue_state st;
	int ret;

	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 32, 64));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(ENG, st.engine);
	EXPECT_EQ(QID, st.queue);
	EXPECT_EQ(32U, st.tx.size);
	EXPECT_EQ(64U, st.rx.size);
	EXPECT_EQ(32U, RING_INDEX(st.tx.hw_len));
	EXPECT_EQ(64U, RING_INDEX(st.rx.hw_len));
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);
	EXPECT_EQ(0U, st.tx.sw_pending);
	EXPECT_EQ(0U, st.rx.sw_pending);
	EXPECT_EQ(32U - 16, st.tx.sw_available);
	EXPECT_EQ(64U - 16, st.rx.sw_available);
	/* prefetch (16) and scheduling (17) enabled; engine normal. */
	EXPECT_EQ(3U, (st.tx.hw_cfg >> 16) & 3);
	EXPECT_EQ(3U, (st.rx.hw_cfg >> 16) & 3);
	EXPECT_EQ(0x1111U, st.m2s_engine_state);
	EXPECT_EQ(0x1111U, st.s2m_engine_state);
	EXPECT_EQ(0U, st.m2s_error_cause);
	EXPECT_EQ(0U, st.s2m_error_cause);
	EXPECT_EQ(0U, st.resets);
	EXPECT_EQ(0U, st.reserved);

	EXPECT_EQ(-EBUSY, queue_init(self->fd, ENG, QID, 32, 32));
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	EXPECT_EQ(-ENOENT, queue_release(self->fd, ENG, QID));
	EXPECT_EQ(-ENOENT, queue_state(self->fd, ENG, QID, &st));
	/* 2^23 descriptors is a valid size; its 128 MiB of contiguous memory may not exist. */
	ret = queue_init(self->fd, ENG, QID, 1U << 23, 32);
	ASSERT_TRUE(ret == 0 || ret == -ENOMEM);
	if (ret == 0) {
		ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
		EXPECT_EQ(1U << 23, st.tx.size);
		ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	}
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 1U << 16, 32));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(1U << 16, st.tx.size);
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
}

static int qinit_raw(int fd, __u32 eng, __u32 q, __u32 tx, __u32 rx, __u32 flags, __u32 r0,
		     __u64 r1, __u64 r2)
{
	struct neuron_udma_queue_init qi = {
		.engine = eng, .queue = q, .tx_descs = tx, .rx_descs = rx, .flags = flags,
		.reserved0 = r0, .reserved = { r1, r2 },
	};

	return udma_ioc(fd, NEURON_UDMA_QUEUE_INIT, &qi);
}

TEST_F(dev, queue_init_errors)
{
	struct neuron_udma_queue_id id = { .engine = ENG, .queue = QID, .reserved = 1 };

	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, self->info.engines, QID, 64, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ~0U, QID, 64, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, self->info.queues_per_engine, 64, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 0, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 16, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 48, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 1U << 24, 64, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 0, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 100, 0, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 1U << 24, 0, 0, 0, 0));
	/* Flag bit 0 is NEURON_UDMA_QUEUE_DEVICE_RINGS (ABI 3, device_rings_test.c); bit 1 is none. */
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 64, 2, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 64, NEURON_UDMA_QUEUE_DEVICE_RINGS | 2, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 64, 0x80000000U, 0, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 64, 0, 1, 0, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 64, 0, 0, 1, 0));
	EXPECT_EQ(-EINVAL, qinit_raw(self->fd, ENG, QID, 64, 64, 0, 0, 0, 1));
	/* None of them took the queue. */
	ASSERT_EQ(0, qinit_raw(self->fd, ENG, QID, 64, 64, 0, 0, 0, 0));
	/* QUEUE_RELEASE with reserved set is refused and keeps the queue. */
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_QUEUE_RELEASE, &id));
	EXPECT_EQ(-EBUSY, queue_init(self->fd, ENG, QID, 64, 64));
	EXPECT_EQ(0, queue_release(self->fd, ENG, QID));
	EXPECT_EQ(-ENOENT, queue_release(self->fd, 1, 2));
}

TEST_F(dev, reserved_queues_ebusy)
{
	if (self->info.generation == NEURON_UDMA_GEN_V2) {
		/* engine 32 queue 0: the driver's H2T queue */
		EXPECT_EQ(-EBUSY, queue_init(self->fd, 32, 0, 64, 64));
		EXPECT_EQ(0, queue_init(self->fd, 32, 1, 64, 64));
	} else {
		ASSERT_EQ((__u32)NEURON_UDMA_GEN_V3, self->info.generation);
		EXPECT_EQ(-EBUSY, queue_init(self->fd, 128, 0, 64, 64));
		EXPECT_EQ(-EBUSY, queue_init(self->fd, 128, 1, 64, 64));
		EXPECT_EQ(0, queue_init(self->fd, 128, 2, 64, 64));
	}
	/* The free queues of the user range. */
	EXPECT_EQ(0, queue_init(self->fd, 7, 3, 32, 32));
}

/* ---- one queue and three buffers ---- */

FIXTURE(q) {
	int fd;
	struct neuron_udma_info info;
	struct ubuf a, b, d;	/* host, host, device */
	unsigned char *save;	/* scratch copy of a buffer */
};

FIXTURE_SETUP(q)
{
	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, RING, RING));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->b));
	ASSERT_EQ(0, ubuf_dev(self->fd, BUF, &self->d));
	fill_pattern(self->a.map, BUF, 1);
	fill_pattern(self->b.map, BUF, 2);
	self->save = malloc(BUF);
	ASSERT_NE(NULL, self->save);
}

FIXTURE_TEARDOWN(q)
{
	free(self->save);
	if (self->fd >= 0)
		close(self->fd);
}

/* Copies @len bytes A@src_off -> D@dev_off -> B@dst_off through the queue, waiting for each. */
static int via_hbm(int fd, struct ubuf *a, struct ubuf *d, struct ubuf *b, __u64 src_off,
		   __u64 dev_off, __u64 dst_off, __u32 len)
{
	int ret = copy_sync(fd, ENG, QID, ucopy(a, src_off, d, dev_off, len));

	return ret ? ret : copy_sync(fd, ENG, QID, ucopy(d, dev_off, b, dst_off, len));
}

TEST_F(q, prepare_start_wait)
{
	struct neuron_udma_queue_state st0, st;
	__u64 completed = 0;
	int i;

	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st0));
	for (i = 0; i < 3; i++)
		ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, i * 4096, &self->b, i * 4096, 4096)));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(3U, st.tx.sw_pending);
	EXPECT_EQ(3U, st.rx.sw_pending);
	EXPECT_EQ((st0.tx.sw_next + 3) % RING, st.tx.sw_next);
	EXPECT_EQ(st0.tx.sw_available - 3, st.tx.sw_available);
	EXPECT_EQ(st0.tx.hw_tail, st.tx.hw_tail);
	/* Nothing started: the destination is untouched. */
	fill_pattern(self->save, BUF, 2);
	ASSERT_BYTES(self->b.map, self->save, BUF);

	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, 3, 3));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(0U, st.tx.sw_pending);
	EXPECT_EQ(0U, st.rx.sw_pending);
	EXPECT_EQ(st.tx.sw_next, RING_INDEX(st.tx.hw_tail));
	EXPECT_EQ(st.rx.sw_next, RING_INDEX(st.rx.hw_tail));

	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &completed));
	EXPECT_EQ(4U, completed);	/* three pairs and the marker */
	ASSERT_BYTES(self->b.map, self->a.map, 3 * 4096);
	ASSERT_BYTES(self->b.map + 3 * 4096, self->save + 3 * 4096, BUF - 3 * 4096);
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);
	EXPECT_EQ(st.rx.sw_next, st.rx.sw_ack);
	EXPECT_EQ(st0.tx.sw_available, st.tx.sw_available);
	EXPECT_EQ(st0.rx.sw_available, st.rx.sw_available);
	EXPECT_EQ((st0.tx.sw_next + 4) % RING, st.tx.sw_next);
	EXPECT_EQ(st.tx.sw_next, RING_INDEX(st.tx.hw_head));
	EXPECT_EQ(st.rx.sw_next, RING_INDEX(st.rx.hw_head));

	/* A wait with nothing outstanding succeeds (with a marker "when needed", or none). */
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 1000, &completed));
	EXPECT_GE(1U, completed);
}

/* Slot @idx of ring @tx of the fixture's queue, read back from the debugfs ring dump. */
#define READ_SLOT(tx, idx, slot) do {							\
	int __r = ring_slot(ENG, QID, tx, idx, slot);					\
	ASSERT_EQ(0, __r) {								\
		TH_LOG("%s[%u] in the debugfs rings file: %s", (tx) ? "tx" : "rx",	\
		       (unsigned int)(idx), strerror(-__r));				\
	}										\
} while (0)

TEST_F(q, barriers_and_flags)
{
	struct neuron_udma_copy c[3] = {
		ucopy(&self->a, 0, &self->d, 0, 8192),
		ucopy(&self->d, 0, &self->b, 100, 8192),
		ucopy(&self->a, 9000, &self->b, 20000, 777),
	};
	static const __u32 len[3] = { 8192, 8192, 777 };
	struct neuron_udma_queue_state st;
	struct uslot tx, rx;
	__u32 i, t0, r0;

	c[1].barrier = NEURON_UDMA_BARRIER_DMB;
	c[2].barrier = NEURON_UDMA_BARRIER_WRITE;
	/* ABI 3: DST_INT is reserved (no interrupt is handled): EINVAL, nothing written. */
	c[2].flags = NEURON_UDMA_COPY_DST_INT;
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	ASSERT_EQ(-EINVAL, prep(self->fd, ENG, QID, c, 3));
	c[2].flags = 0;
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	t0 = st.tx.sw_next;
	r0 = st.rx.sw_next;
	ASSERT_EQ(0, prep(self->fd, ENG, QID, c, 3));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map + 100, self->a.map, 8192);
	ASSERT_BYTES(self->b.map + 20000, self->a.map + 9000, 777);

	/* The descriptors as written in ring memory: the barrier and flag bits of each pair. */
	for (i = 0; i < 3; i++) {
		READ_SLOT(true, (t0 + i) % RING, &tx);
		READ_SLOT(false, (r0 + i) % RING, &rx);
		EXPECT_EQ(len[i], tx.len_ctrl & DESC_LEN_MASK);
		EXPECT_EQ(len[i], rx.len_ctrl & DESC_LEN_MASK);
		EXPECT_EQ(DESC_FIRST | DESC_LAST, tx.len_ctrl & (DESC_FIRST | DESC_LAST));
		EXPECT_EQ(i == 1 ? DESC_DMB : 0, tx.len_ctrl & DESC_DMB) {
			TH_LOG("pair %u: tx len_ctrl %#x", i, tx.len_ctrl);
		}
		EXPECT_EQ(i == 2 ? META_WRITE_BARRIER : 0, tx.word1 & META_WRITE_BARRIER) {
			TH_LOG("pair %u: tx meta_ctrl %#x", i, tx.word1);
		}
		/* No descriptor asks for an interrupt; the barriers are Tx bits only. */
		EXPECT_EQ(0U, rx.len_ctrl & DESC_INT_EN);
		EXPECT_EQ(0U, tx.len_ctrl & DESC_INT_EN);
		EXPECT_EQ(0U, rx.len_ctrl & DESC_DMB);
		EXPECT_EQ(0U, rx.word1);
	}
}

TEST_F(q, partial_start)
{
	struct neuron_udma_queue_state st;
	__u64 completed;
	int i;

	for (i = 0; i < 4; i++)
		ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, i * 100, &self->b, i * 100, 100)));
	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, 2, 2));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(2U, st.tx.sw_pending);
	EXPECT_EQ(2U, st.rx.sw_pending);
	/* Rx may run ahead of Tx. */
	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, 0, 1));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
	EXPECT_EQ(2U, st.tx.sw_pending);
	EXPECT_EQ(1U, st.rx.sw_pending);
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &completed));
	EXPECT_EQ(5U, completed);
	ASSERT_BYTES(self->b.map, self->a.map, 400);
}

TEST_F(q, start_errors)
{
	struct neuron_udma_queue_state before;
	struct neuron_udma_copy_start s = {
		.engine = ENG, .queue = QID, .m2s_count = 1, .s2m_count = 1, .reserved = 1,
	};

	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 0, &self->b, 0, 4096)));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 0, &self->b, 4096, 4096)));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	memcpy(self->save, self->b.map, BUF);

	EXPECT_EQ(-EINVAL, copy_start(self->fd, ENG, QID, 1, 0));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-EINVAL, copy_start(self->fd, ENG, QID, 0, 0));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-EINVAL, copy_start(self->fd, ENG, QID, 3, 1));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-EINVAL, copy_start(self->fd, ENG, QID, 1, 3));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-EINVAL, copy_start(self->fd, ENG, QID, ~0U, ~0U));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_COPY_START, &s));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-ENOENT, copy_start(self->fd, ENG, QID + 1, 1, 1));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	usleep(20000);
	ASSERT_BYTES(self->b.map, self->save, BUF);

	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	ASSERT_BYTES(self->b.map + 4096, self->a.map, 4096);
}

TEST_F(q, wait_state_release_errors)
{
	struct neuron_udma_queue_state before, st;
	struct neuron_udma_copy_wait w = { .engine = ENG, .queue = QID, .reserved = 1 };

	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 0, &self->b, 0, 4096)));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	memcpy(self->save, self->b.map, BUF);

	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_COPY_WAIT, &w));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-ENOENT, copy_wait(self->fd, ENG, QID + 1, 0, NULL));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);

	memset(&st, 0, sizeof(st));
	st.engine = ENG;
	st.queue = QID;
	st.reserved = 1;
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_QUEUE_STATE, &st));
	EXPECT_EQ(-ENOENT, queue_state(self->fd, ENG, QID + 1, &st));
	EXPECT_EQ(-ENOENT, queue_release(self->fd, ENG, QID + 1));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	usleep(20000);
	ASSERT_BYTES(self->b.map, self->save, BUF);
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
}

/* Every way one copy can be wrong, and the errno it must produce. */
struct bad_copy {
	const char *what;
	int err;
	struct neuron_udma_copy c;
};

static int bad_copies(struct ubuf *a, struct ubuf *b, struct bad_copy *out)
{
	struct bad_copy *p = out;
	struct neuron_udma_copy ok = ucopy(a, 0, b, 0, 4096);

#define BAD(w, e, field, val) do { *p = (struct bad_copy){ w, e, ok }; p->c.field = val; p++; } while (0)
	BAD("unknown src handle", ENOENT, src_handle, BAD_HANDLE);
	BAD("unknown dst handle", ENOENT, dst_handle, BAD_HANDLE);
	BAD("src handle 0", ENOENT, src_handle, 0);
	BAD("src offset at end", ERANGE, src_offset, BUF);
	BAD("src offset + size past end", ERANGE, src_offset, BUF - 4095);
	BAD("dst offset + size past end", ERANGE, dst_offset, BUF - 1);
	BAD("src offset overflow", ERANGE, src_offset, ~0ULL - 100);
	BAD("dst offset overflow", ERANGE, dst_offset, ~0ULL);
	BAD("size 0", EINVAL, size, 0);
	BAD("size 65537", EINVAL, size, UDMA_MAX_COPY + 1);
	BAD("size ~0", EINVAL, size, ~0U);
	BAD("barrier 3", EINVAL, barrier, 3);
	BAD("flags bit 2", EINVAL, flags, 4);
	BAD("flags bit 31", EINVAL, flags, 0x80000000U);
	BAD("reserved", EINVAL, reserved, 1);
#undef BAD
	return p - out;
}

TEST_F(q, prepare_errors)
{
	struct neuron_udma_queue_state before;
	struct bad_copy bad[32];
	int i, n = bad_copies(&self->a, &self->b, bad);

	/* Something prepared, something started: the state to keep. */
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 0, &self->d, 0, 4096)));
	ASSERT_EQ(0, copy_start(self->fd, ENG, QID, 1, 1));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->a, 4096, &self->d, 4096, 4096)));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	memcpy(self->save, self->b.map, BUF);

	for (i = 0; i < n; i++) {
		EXPECT_EQ(-bad[i].err, prep_one(self->fd, ENG, QID, bad[i].c)) {
			TH_LOG("PREPARE_ONE %s", bad[i].what);
		}
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
		EXPECT_EQ(-bad[i].err, prep(self->fd, ENG, QID, &bad[i].c, 1)) {
			TH_LOG("PREPARE %s", bad[i].what);
		}
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	}
	/* A queue of no file, of another engine, beyond the engines. */
	EXPECT_EQ(-ENOENT, prep_one(self->fd, ENG, QID + 1, ucopy(&self->a, 0, &self->b, 0, 1)));
	EXPECT_EQ(-ENOENT, prep_one(self->fd, ENG + 1, QID, ucopy(&self->a, 0, &self->b, 0, 1)));
	EXPECT_EQ(-ENOENT, prep(self->fd, ENG, QID + 1, &bad[0].c, 1));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	ASSERT_BYTES(self->b.map, self->save, BUF);

	/* All of it still works. */
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, after_dmb(ucopy(&self->d, 0, &self->b, 1, 8192))));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map + 1, self->a.map, 8192);
}

TEST_F(q, prepare_batch_errors)
{
	struct neuron_udma_queue_state before;
	struct neuron_udma_copy_prepare p = { .engine = ENG, .queue = QID, .count = 1 };
	struct neuron_udma_copy batch[64], one = ucopy(&self->a, 0, &self->b, 200000, 64);
	struct bad_copy bad[32];
	int i, k, n = bad_copies(&self->a, &self->b, bad);

	for (i = 0; i < 64; i++)
		batch[i] = ucopy(&self->a, i * 1024, &self->b, i * 1024 + 1, 1000);
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, one));
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	memcpy(self->save, self->b.map, BUF);

	for (k = 0; k < n; k++) {
		struct neuron_udma_copy good = batch[32];

		batch[32] = bad[k].c;
		EXPECT_EQ(-bad[k].err, prep(self->fd, ENG, QID, batch, 64)) {
			TH_LOG("batch with %s at 32", bad[k].what);
		}
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
		batch[32] = good;
	}
	/*
	 * The bad copy second and last, in a run of copies between the same two buffers and amid
	 * copies that alternate between two pairs of buffers; the first copy from a buffer just
	 * allocated (F: the call translates its copies first, then writes them, "two passes") or
	 * from A (every buffer resident on the queue: each copy checked and its pair written in one
	 * pass). The same answer either way, and nothing changed.
	 */
	for (k = 0; k < n; k++) {
		static const int at[] = { 1, 63 };
		struct neuron_udma_copy mixed[64];
		int j, alt, fresh;
		struct ubuf f;

		for (j = 0; j < 2; j++)
			for (alt = 0; alt < 2; alt++)
				for (fresh = 1; fresh >= 0; fresh--) {
					ASSERT_EQ(0, ubuf_dev(self->fd, BUF, &f));
					for (i = 0; i < 64; i++)
						mixed[i] = ucopy(alt && i % 2 ? &self->d : &self->a,
								 i * 1024, &self->b, i * 1024 + 1, 1000);
					if (fresh)
						mixed[0] = ucopy(&f, 0, &self->b, 1, 1000);
					mixed[at[j]] = bad[k].c;
					EXPECT_EQ(-bad[k].err, prep(self->fd, ENG, QID, mixed, 64)) {
						TH_LOG("batch with %s at %d%s, %s", bad[k].what, at[j],
						       alt ? ", alternating" : "",
						       fresh ? "two passes" : "one pass");
					}
					ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
					/* Not kept busy by the failed call. */
					ASSERT_EQ(0, ubuf_free(self->fd, &f));
				}
	}
	/*
	 * D was named only by the failed calls, the last of them checked in one pass (D resident
	 * on the queue by then): each put its stamp on D back, so D goes while the copy prepared
	 * first is still in flight.
	 */
	ASSERT_EQ(0, ubuf_free(self->fd, &self->d));
	EXPECT_EQ(-EINVAL, prep(self->fd, ENG, QID, batch, 0));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	if (self->info.max_batch < ~0U) {
		EXPECT_EQ(-EINVAL, prep(self->fd, ENG, QID, batch, self->info.max_batch + 1));
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	}
	p.copies = 8;
	EXPECT_EQ(-EFAULT, udma_ioc(self->fd, NEURON_UDMA_COPY_PREPARE, &p));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	p.copies = (uintptr_t)batch;
	p.reserved = 1;
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_COPY_PREPARE, &p));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	ASSERT_BYTES(self->b.map, self->save, BUF);

	ASSERT_EQ(0, prep(self->fd, ENG, QID, batch, 64));
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	for (i = 0; i < 64; i++)
		ASSERT_BYTES(self->b.map + i * 1024 + 1, self->a.map + i * 1024, 1000);
	ASSERT_BYTES(self->b.map + 200000, self->a.map, 64);
}

TEST_F(q, copy_sizes)
{
	static const __u32 sizes[] = { 1, 3, 4095, 65535, 65536 };
	struct neuron_udma_queue_state before;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(sizes); i++) {
		__u32 n = sizes[i];

		/* host -> host at odd offsets; the bytes around the copy stay. */
		fill_pattern(self->b.map, BUF, 100 + i);
		memcpy(self->save, self->b.map, BUF);
		ASSERT_EQ(0, copy_sync(self->fd, ENG, QID, ucopy(&self->a, 1 + 2 * i, &self->b, 3, n)));
		ASSERT_BYTES(self->b.map + 3, self->a.map + 1 + 2 * i, n);
		ASSERT_BYTES(self->b.map, self->save, 3);
		ASSERT_BYTES(self->b.map + 3 + n, self->save + 3 + n, BUF - 3 - n);

		/* host -> HBM -> host */
		fill_pattern(self->b.map, BUF, 200 + i);
		memcpy(self->save, self->b.map, BUF);
		ASSERT_EQ(0, via_hbm(self->fd, &self->a, &self->d, &self->b, 5, 7 + 64 * 1024, 65537, n));
		ASSERT_BYTES(self->b.map + 65537, self->a.map + 5, n);
		ASSERT_BYTES(self->b.map, self->save, 65537);
		ASSERT_BYTES(self->b.map + 65537 + n, self->save + 65537 + n, BUF - 65537 - n);
	}
	/* The last byte of each buffer. */
	ASSERT_EQ(0, via_hbm(self->fd, &self->a, &self->d, &self->b, BUF - 1, BUF - 1, BUF - 1, 1));
	ASSERT_EQ(self->a.map[BUF - 1], self->b.map[BUF - 1]);

	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	memcpy(self->save, self->b.map, BUF);
	EXPECT_EQ(-EINVAL, prep_one(self->fd, ENG, QID, ucopy(&self->a, 1, &self->b, 3, UDMA_MAX_COPY + 1)));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	EXPECT_EQ(-EINVAL, prep_one(self->fd, ENG, QID, ucopy(&self->a, 1, &self->b, 3, 0)));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	ASSERT_BYTES(self->b.map, self->save, BUF);
}

TEST_F(q, reserved_fields)
{
	struct neuron_udma_queue_state before;
	struct neuron_udma_copy c = ucopy(&self->a, 0, &self->b, 0, 16);
	struct neuron_udma_copy_prepare_one p1 = { .engine = ENG, .queue = QID, .copy = c };
	struct neuron_udma_memcpy m = {
		.src_handle = self->a.handle, .dst_handle = self->b.handle, .size = 16, .reserved = 1,
	};

	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	memcpy(self->save, self->b.map, BUF);
	p1.copy.reserved = 0x100;
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_COPY_PREPARE_ONE, &p1));
	EXPECT_EQ(-EINVAL, udma_ioc(self->fd, NEURON_UDMA_MEMCPY, &m));
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	ASSERT_BYTES(self->b.map, self->save, BUF);
	/* The other structs' reserved fields are covered with their ioctls' errors. */
}

TEST_F(q, memcpy)
{
	const __u64 n = (1 << 20) + 7;
	struct ubuf src, dst, hbm;
	long d;

	if (self->info.max_host_buffer < (2 << 20))
		SKIP(return, "max_host_buffer %llu < 2 MiB", (unsigned long long)self->info.max_host_buffer);
	ASSERT_EQ(0, ubuf_host(self->fd, 2 << 20, &src));
	ASSERT_EQ(0, ubuf_host(self->fd, 2 << 20, &dst));
	ASSERT_EQ(0, ubuf_dev(self->fd, 2 << 20, &hbm));
	fill_pattern(src.map, 2 << 20, 7);
	fill_pattern(dst.map, 2 << 20, 8);
	memcpy(self->save, dst.map, BUF);	/* the head of dst, before the copy */
	ASSERT_EQ(0, udma_memcpy(self->fd, &src, 3, &hbm, 5, n, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &hbm, 5, &dst, 11, n, 0));
	d = first_diff(dst.map + 11, src.map + 3, n);
	ASSERT_EQ(-1, d) {
		TH_LOG("byte %ld differs", d);
	}
	ASSERT_BYTES(dst.map, self->save, 11);
	/* host -> host, and one byte. */
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->a, 1, &dst, 0, 1, 0));
	ASSERT_EQ(self->a.map[1], dst.map[0]);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->a, 0, &self->b, 0, BUF, 0));
	ASSERT_BYTES(self->b.map, self->a.map, BUF);
	EXPECT_EQ(0, ubuf_free(self->fd, &src));
	EXPECT_EQ(0, ubuf_free(self->fd, &dst));
	EXPECT_EQ(0, ubuf_free(self->fd, &hbm));
}

TEST_F(q, memcpy_errors)
{
	struct ubuf bad = { .handle = BAD_HANDLE, .size = BUF };

	memcpy(self->save, self->b.map, BUF);
	EXPECT_EQ(-ENOENT, udma_memcpy(self->fd, &bad, 0, &self->b, 0, 16, 0));
	EXPECT_EQ(-ENOENT, udma_memcpy(self->fd, &self->a, 0, &bad, 0, 16, 0));
	EXPECT_EQ(-ERANGE, udma_memcpy(self->fd, &self->a, 1, &self->b, 0, BUF, 0));
	EXPECT_EQ(-ERANGE, udma_memcpy(self->fd, &self->a, 0, &self->b, BUF, 1, 0));
	EXPECT_EQ(-ERANGE, udma_memcpy(self->fd, &self->a, ~0ULL, &self->b, 0, 2, 0));
	EXPECT_EQ(-ERANGE, udma_memcpy(self->fd, &self->a, 0, &self->d, 0, ~0ULL, 0));
	EXPECT_EQ(-EINVAL, udma_memcpy(self->fd, &self->a, 0, &self->b, 0, 0, 0));
	ASSERT_BYTES(self->b.map, self->save, BUF);
}

TEST_F(q, ring_full_enospc)
{
	struct neuron_udma_queue_state before;
	int i, err = 0;

	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 32, 32));
	for (i = 0; i < 32; i++) {
		ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
		err = prep_one(self->fd, ENG, QID, ucopy(&self->a, i * 64, &self->b, i * 64, 64));
		if (err)
			break;
	}
	ASSERT_EQ(-ENOSPC, err);
	EXPECT_EQ(32 - 16, i);	/* the 16-slot reserve stays free */
	ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	{
		struct neuron_udma_copy two[2] = {
			ucopy(&self->a, 0, &self->b, 0, 1), ucopy(&self->a, 0, &self->b, 0, 1),
		};

		EXPECT_EQ(-ENOSPC, prep(self->fd, ENG, QID, two, 2));
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
	}
	/* COPY_WAIT frees the space (the header's promise for ENOSPC of COPY_PREPARE). */
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, i * 64);
	ASSERT_EQ(0, copy_sync(self->fd, ENG, QID, ucopy(&self->a, 5000, &self->b, 5001, 3000)));
	ASSERT_BYTES(self->b.map + 5001, self->a.map + 5000, 3000);
}

TEST_F_TIMEOUT(q, ring_wrap, 180)
{
	struct neuron_udma_queue_state st;
	unsigned int ids = 0, done = 0, i;
	__u64 completed, total = 0, waits = 0;

	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 32, 32));
	fill_pattern(self->b.map, BUF, 3);
	while (done < 1000) {
		struct neuron_udma_copy batch[8];
		unsigned int n = 1000 - done < 8 ? 1000 - done : 8;

		for (i = 0; i < n; i++) {
			__u32 k = done + i;

			/* 1000 distinct 200-byte pieces, alternating host->host and host->HBM. */
			if (k % 2)
				batch[i] = ucopy(&self->a, k * 200, &self->b, k * 200 + 1, 200);
			else
				batch[i] = ucopy(&self->a, k * 200, &self->d, k * 200, 200);
		}
		ASSERT_EQ(0, prep(self->fd, ENG, QID, batch, n));
		ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &completed));
		ASSERT_EQ(n + 1, completed);
		total += completed;
		waits++;
		ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &st));
		ids |= 1U << st.tx.sw_ring_id;
		ASSERT_EQ(st.tx.sw_next, st.tx.sw_ack);
		ASSERT_EQ(st.rx.sw_next, st.rx.sw_ack);
		ASSERT_EQ(st.tx.sw_next, RING_INDEX(st.tx.hw_head));
		ASSERT_EQ(st.tx.sw_ring_id, RING_ID(st.tx.hw_head));
		ASSERT_EQ(st.rx.sw_ring_id, RING_ID(st.rx.hw_head));
		done += n;
	}
	EXPECT_EQ(1000 + waits, total);
	EXPECT_EQ(0xFU, ids);	/* all four ring ids were used */
	EXPECT_EQ((1000 + waits) % 32, st.tx.sw_next);
	/* The HBM pieces, back to the host, 8 per wait. */
	for (i = 0; i < 1000; i += 2) {
		ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&self->d, i * 200, &self->b, i * 200 + 1, 200)));
		if (i % 16 == 14)
			ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	}
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, NULL));
	ASSERT_BYTES(self->b.map + 1, self->a.map, 1000 * 200);
}

TEST_F_TIMEOUT(q, batch_2032, 180)
{
	const __u32 pairs = 2032, sz = 100;
	struct neuron_udma_queue_state before;
	struct neuron_udma_copy *c = calloc(pairs, sizeof(*c));
	__u64 completed, total = 0;
	__u32 i, off;

	ASSERT_NE(NULL, c);
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 4096, 4096));
	for (i = 0; i < pairs; i++)
		c[i] = ucopy(&self->a, i * sz, &self->b, i * sz + 3, sz);
	for (off = 0; off < pairs; off += self->info.max_batch) {
		__u32 n = pairs - off < self->info.max_batch ? pairs - off : self->info.max_batch;

		ASSERT_EQ(0, prep(self->fd, ENG, QID, c + off, n));
	}
	ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &completed));
	EXPECT_EQ(pairs + 1, completed);
	ASSERT_BYTES(self->b.map + 3, self->a.map, pairs * sz);

	/* The same batch to HBM with one bad entry in the middle changes nothing. */
	for (i = 0; i < pairs; i++)
		c[i] = ucopy(&self->a, i * sz, &self->d, i * sz, sz);
	c[pairs / 2].size = 0;
	ASSERT_EQ(0, queue_state(self->fd, ENG, QID, &before));
	if (self->info.max_batch >= pairs) {
		EXPECT_EQ(-EINVAL, prep(self->fd, ENG, QID, c, pairs));
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
		c[pairs / 2].size = sz;
		c[pairs / 2].dst_handle = BAD_HANDLE;
		EXPECT_EQ(-ENOENT, prep(self->fd, ENG, QID, c, pairs));
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
		c[pairs / 2].dst_handle = self->d.handle;
		c[pairs / 2].dst_offset = BUF;
		EXPECT_EQ(-ERANGE, prep(self->fd, ENG, QID, c, pairs));
		ASSERT_UNCHANGED(self->fd, ENG, QID, &before);
		c[pairs / 2].dst_offset = pairs / 2 * sz;
		ASSERT_EQ(0, prep(self->fd, ENG, QID, c, pairs));
		ASSERT_EQ(0, copy_wait(self->fd, ENG, QID, 0, &completed));
		total = completed;
		EXPECT_EQ(pairs + 1, total);
		/* Back to the host, to see the bytes. */
		memset(self->b.map, 0, BUF);
		ASSERT_EQ(0, udma_memcpy(self->fd, &self->d, 0, &self->b, 0, pairs * sz, 0));
		ASSERT_BYTES(self->b.map, self->a.map, pairs * sz);
	} else {
		TH_LOG("max_batch %u < %u: bad-entry batch skipped", self->info.max_batch, pairs);
	}
	free(c);
}

/* ---- two processes, threads, close ---- */

TEST_F(q, other_process_enoent)
{
	pid_t pid;
	int status;

	pid = fork();
	ASSERT_LE(0, pid);
	if (pid == 0) {
		struct neuron_udma_queue_state st;
		struct ubuf mine;
		int fd = udma_open(), step = 0;

#define STEP(cond) do { step++; if (!(cond)) _exit(step); } while (0)
		STEP(fd >= 0);
		STEP(queue_state(fd, ENG, QID, &st) == -ENOENT);
		STEP(prep_one(fd, ENG, QID, ucopy(&self->a, 0, &self->b, 0, 16)) == -ENOENT);
		STEP(copy_start(fd, ENG, QID, 1, 1) == -ENOENT);
		STEP(copy_wait(fd, ENG, QID, 0, NULL) == -ENOENT);
		STEP(queue_release(fd, ENG, QID) == -ENOENT);
		STEP(mem_free(fd, self->a.handle) == -ENOENT);
		STEP(mem_free(fd, self->d.handle) == -ENOENT);
		STEP(queue_init(fd, ENG, QID, 64, 64) == -EBUSY);
		STEP(udma_memcpy(fd, &self->a, 0, &self->b, 0, 16, 0) == -ENOENT);
		/* Its own queue cannot name the parent's buffers either. */
		STEP(queue_init(fd, ENG, QID + 1, 64, 64) == 0);
		STEP(prep_one(fd, ENG, QID + 1, ucopy(&self->a, 0, &self->b, 0, 16)) == -ENOENT);
		STEP(ubuf_host(fd, 4096, &mine) == 0);
		STEP(prep_one(fd, ENG, QID + 1, ucopy(&mine, 0, &self->b, 0, 16)) == -ENOENT);
		STEP(prep_one(fd, ENG, QID + 1, ucopy(&self->a, 0, &mine, 0, 16)) == -ENOENT);
		STEP(copy_sync(fd, ENG, QID + 1, ucopy(&mine, 0, &mine, 100, 16)) == 0);
		_exit(0);
#undef STEP
	}
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	ASSERT_EQ(0, WEXITSTATUS(status)) {
		TH_LOG("child failed at step %d", WEXITSTATUS(status));
	}
	/* The child's queue went with its file. */
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID + 1, 32, 32));
	/* The parent's queue and buffers are intact and work. */
	ASSERT_EQ(0, via_hbm(self->fd, &self->a, &self->d, &self->b, 0, 0, 0, 4096));
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
}

struct worker {
	int fd;
	__u32 eng;
	int failed_step;
	int err;
};

/* In a worker thread: runs @expr, and on a nonzero result notes the step and its error and ends. */
#define WSTEP(expr) do { step++; ret = (expr); if (ret) { w->failed_step = step; w->err = ret; \
		return NULL; } } while (0)

/*
 * Runs @fn in @n threads (at most 4) on the file @fd, thread i on queue 1 of engine ENG + i, and
 * checks that each got through every step.
 */
static void run_workers(struct __test_metadata *_metadata, int fd, void *(*fn)(void *), int n)
{
	struct worker w[4];
	pthread_t t[4];
	int i;

	ASSERT_LE(n, 4);
	for (i = 0; i < n; i++) {
		w[i] = (struct worker){ .fd = fd, .eng = ENG + i };
		ASSERT_EQ(0, pthread_create(&t[i], NULL, fn, &w[i]));
	}
	for (i = 0; i < n; i++)
		ASSERT_EQ(0, pthread_join(t[i], NULL));
	for (i = 0; i < n; i++) {
		EXPECT_EQ(0, w[i].failed_step) {
			TH_LOG("engine %u: step %d failed: %s", w[i].eng, w[i].failed_step, strerror(-w[i].err));
		}
	}
}

static void *worker_fn(void *arg)
{
	struct worker *w = arg;
	struct ubuf a, b, d;
	__u32 seed = w->eng * 7919 + 1, i;
	int step = 0, ret;

	WSTEP(queue_init(w->fd, w->eng, 1, 64, 64));
	WSTEP(ubuf_host(w->fd, 2 * UDMA_MAX_COPY, &a));
	WSTEP(ubuf_host(w->fd, 2 * UDMA_MAX_COPY, &b));
	WSTEP(ubuf_dev(w->fd, 2 * UDMA_MAX_COPY, &d));
	fill_pattern(a.map, 2 * UDMA_MAX_COPY, w->eng + 10);
	for (i = 0; i < 40; i++) {
		__u32 size, so, doff;

		seed = seed * 1103515245 + 12345;
		size = 1 + (seed >> 8) % UDMA_MAX_COPY;
		so = (seed >> 3) % (2 * UDMA_MAX_COPY - size + 1);
		doff = (seed >> 5) % (2 * UDMA_MAX_COPY - size + 1);
		memset(b.map, 0, 2 * UDMA_MAX_COPY);
		WSTEP(prep_one(w->fd, w->eng, 1, ucopy(&a, so, &d, doff, size)));
		WSTEP(prep_one(w->fd, w->eng, 1, after_dmb(ucopy(&d, doff, &b, doff, size))));
		WSTEP(copy_wait(w->fd, w->eng, 1, 0, NULL));
		WSTEP(first_diff(b.map + doff, a.map + so, size) == -1 ? 0 : -EILSEQ);
	}
	WSTEP(ubuf_free(w->fd, &a));
	WSTEP(ubuf_free(w->fd, &b));
	WSTEP(ubuf_free(w->fd, &d));
	WSTEP(queue_release(w->fd, w->eng, 1));
	return NULL;
}

TEST_F_TIMEOUT(dev, threads, 180)
{
	run_workers(_metadata, self->fd, worker_fn, 4);
}

/*
 * Batches above the 16 entries read onto the stack are read into an array of the call's own: two
 * threads of one file prepare 200-entry batches on queues of their own at once, each batch's
 * bytes checked.
 */
static void *large_batch_fn(void *arg)
{
	struct worker *w = arg;
	struct neuron_udma_copy c[200];
	struct ubuf a, b;
	__u32 i, k;
	int step = 0, ret;

	WSTEP(queue_init(w->fd, w->eng, 1, 512, 512));
	WSTEP(ubuf_host(w->fd, 200 * 16, &a));
	WSTEP(ubuf_host(w->fd, 200 * 16, &b));
	for (i = 0; i < 30; i++) {
		fill_pattern(a.map, 200 * 16, w->eng * 100 + i);
		memset(b.map, 0, 200 * 16);
		/* Entry k copies block 199 - k: a mix-up of two threads' entries shows. */
		for (k = 0; k < 200; k++)
			c[k] = ucopy(&a, (199 - k) * 16, &b, k * 16, 16);
		WSTEP(prep(w->fd, w->eng, 1, c, 200));
		WSTEP(copy_wait(w->fd, w->eng, 1, 0, NULL));
		for (k = 0; k < 200; k++)
			WSTEP(memcmp(b.map + k * 16, a.map + (199 - k) * 16, 16) ? -EILSEQ : 0);
	}
	WSTEP(ubuf_free(w->fd, &a));
	WSTEP(ubuf_free(w->fd, &b));
	WSTEP(queue_release(w->fd, w->eng, 1));
	return NULL;
}

TEST_F_TIMEOUT(dev, threads_large_batches, 180)
{
	run_workers(_metadata, self->fd, large_batch_fn, 2);
}

#define CLOSE_PROBES 16

TEST_F_TIMEOUT(dev, close_with_copies_in_flight, 120)
{
	struct ubuf a, d, probe[CLOSE_PROBES];
	struct ubar2 bar2;
	int fd, i, j, n = 1024, ret;
	__u64 nonzero = 0;

	ret = bar2_open(&bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&bar2, BAR2_CLEAR, 1);
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, queue_init(fd, ENG, 3, 4096, 4096));
	ASSERT_EQ(0, ubuf_host(fd, 1 << 20, &a));
	ASSERT_EQ(0, ubuf_dev(fd, 1 << 20, &d));
	/* Device memory full of non-zero bytes, the source of the copies into host memory. */
	memset(a.map, 0xC3, 1 << 20);
	for (i = 0; i < 16; i++)
		ASSERT_EQ(0, prep_one(fd, ENG, 3, ucopy(&a, i * UDMA_MAX_COPY, &d, i * UDMA_MAX_COPY,
						     UDMA_MAX_COPY)));
	ASSERT_EQ(0, copy_wait(fd, ENG, 3, 0, NULL));
	memset(a.map, 0, 1 << 20);

	/* HBM -> host copies held back by a stall of 1 s, then the file is closed. */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_STALL, ENG, 3, 1000));
	for (i = 0; i < n; i++) {
		struct neuron_udma_copy c = ucopy(&d, (i % 16) * UDMA_MAX_COPY, &a,
						  ((i + 5) % 16) * UDMA_MAX_COPY, UDMA_MAX_COPY);

		ASSERT_EQ(0, prep_one(fd, ENG, 3, c));
	}
	ASSERT_EQ(0, copy_start(fd, ENG, 3, n, n));
	/* The mapping holds a reference to the file: drop it too, then close. */
	munmap(a.map, a.size);
	ASSERT_EQ(0, close(fd));

	/*
	 * The freed 1 MiB of host memory is handed out again at once (new zeroed coherent
	 * buffers of the same size); none of it may change when the stall ends and later:
	 * a copy still running after the close would write 0xC3 bytes into it.
	 */
	fd = udma_open();
	ASSERT_LE(0, fd);
	for (i = 0; i < CLOSE_PROBES; i++)
		ASSERT_EQ(0, ubuf_host(fd, 1 << 20, &probe[i]));
	/* Watch them until well after the stall would have ended (2.5 s from here). */
	for (j = 0; j < 25; j++) {
		for (i = 0; i < CLOSE_PROBES; i++) {
			const __u64 *w = (const __u64 *)probe[i].map;
			size_t k;

			for (k = 0; k < (1 << 20) / 8; k++)
				nonzero += w[k] != 0;
		}
		usleep(100 * 1000);
	}
	EXPECT_EQ(0ULL, nonzero) {
		TH_LOG("%llu words of host memory freed at close were written after it",
		       (unsigned long long)nonzero);
	}
	for (i = 0; i < CLOSE_PROBES; i++)
		ubuf_free(fd, &probe[i]);

	ASSERT_EQ(0, queue_init(fd, ENG, 3, 64, 64)) {
		TH_LOG("the queue was not released at close");
	}
	ASSERT_EQ(0, ubuf_host(fd, 1 << 20, &a));
	fill_pattern(a.map, 1 << 20, 9);
	ASSERT_EQ(0, copy_sync(fd, ENG, 3, ucopy(&a, 0, &a, 1 << 19, 65536)));
	ASSERT_BYTES(a.map + (1 << 19), a.map, 65536);
	close(fd);
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);
}

/* ---- fault injection through the model's BAR2 window ---- */

FIXTURE(fault) {
	int fd;
	struct neuron_udma_info info;
	struct ubar2 bar2;
	struct ubuf a, b;
	unsigned char *save;
};

FIXTURE_SETUP(fault)
{
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, queue_init(self->fd, ENG, 2, 64, 64));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->a));
	ASSERT_EQ(0, ubuf_host(self->fd, BUF, &self->b));
	fill_pattern(self->a.map, BUF, 4);
	fill_pattern(self->b.map, BUF, 5);
	self->save = malloc(BUF);
	ASSERT_NE(NULL, self->save);
	memcpy(self->save, self->b.map, BUF);
}

FIXTURE_TEARDOWN(fault)
{
	if (self->bar2.regs)
		bar2_write(&self->bar2, BAR2_CLEAR, 1);
	bar2_close(&self->bar2);
	free(self->save);
	if (self->fd >= 0)
		close(self->fd);
}

TEST_F(fault, engine_error_eio_then_recovery)
{
	struct neuron_udma_queue_state st;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_FAIL_NTH, ENG, 2, 1));
	ASSERT_EQ(0, prep_one(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 1, 4096)));
	ASSERT_EQ(-EIO, copy_wait(self->fd, ENG, 2, 0, NULL));
	EXPECT_EQ(ERR_INJECTED_FAIL, bar2_read(&self->bar2, BAR2_LAST_ERROR));
	EXPECT_EQ(ENG, bar2_read(&self->bar2, BAR2_LAST_ENGINE));
	EXPECT_EQ(2U, bar2_read(&self->bar2, BAR2_LAST_QUEUE));
	ASSERT_BYTES(self->b.map, self->save, BUF);	/* a failing packet writes nothing */
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &st));
	EXPECT_EQ(1U, st.resets);
	EXPECT_EQ(0x1111U, st.m2s_engine_state);
	EXPECT_EQ(0x1111U, st.s2m_engine_state);
	EXPECT_EQ(0U, st.tx.sw_pending);
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);

	/* The same queue works again. */
	ASSERT_EQ(0, copy_sync(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 1, 4096)));
	ASSERT_BYTES(self->b.map + 1, self->a.map, 4096);
	ASSERT_EQ(0, copy_sync(self->fd, ENG, 2, ucopy(&self->a, 7, &self->b, 10001, 65536)));
	ASSERT_BYTES(self->b.map + 10001, self->a.map + 7, 65536);
}

/*
 * ABI 3: a COPY_WAIT that times out on a queue that is only slow leaves its copies in flight
 * and the queue as it is (no reset: a queue is reset only when it made no progress for 10 s);
 * once the stall ends the copy lands and the next wait completes it.
 */
TEST_F(fault, wait_timeout_keeps_the_copies)
{
	struct neuron_udma_queue_state st;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, 2, 3000));
	ASSERT_EQ(0, prep_one(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 0, 4096)));
	ASSERT_EQ(-ETIMEDOUT, copy_wait(self->fd, ENG, 2, 200, NULL));
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &st));
	EXPECT_EQ(0U, st.resets);
	EXPECT_EQ(0U, st.tx.sw_pending);
	/* The copy and its marker are still on the ring. */
	EXPECT_NE(st.tx.sw_next, st.tx.sw_ack);
	ASSERT_BYTES(self->b.map, self->save, 4096);
	/* End the stall: the copy runs, and the next wait sees it done. */
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, copy_wait(self->fd, ENG, 2, 5000, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &st));
	EXPECT_EQ(0U, st.resets);
	EXPECT_EQ(st.tx.sw_next, st.tx.sw_ack);
	/* The queue goes on working, and nothing else was written. */
	ASSERT_EQ(0, copy_sync(self->fd, ENG, 2, ucopy(&self->a, 100, &self->b, 65536 + 3, 5000)));
	ASSERT_BYTES(self->b.map + 65536 + 3, self->a.map + 100, 5000);
	ASSERT_BYTES(self->b.map + 4096, self->save + 4096, 65536 + 3 - 4096);
}

/* COPY_WAIT in a thread: blocks until its marker arrives (or the timeout). */
struct plain_wait {
	pthread_t t;
	int fd, ret;
	__u32 eng, q;
};

static void *plain_wait_thread(void *arg)
{
	struct plain_wait *w = arg;

	w->ret = copy_wait(w->fd, w->eng, w->q, 60000, NULL);
	return NULL;
}

/*
 * A stalled 64-slot ring filled to the 16-slot reserve, then 32 waits at once: they share one
 * completion marker (never ENOSPC however many wait), nothing else is written, and when the
 * engine moves every wait returns 0 with the copies landed.
 */
TEST_F_TIMEOUT(fault, copy_wait_many_waits_share_one_marker, 120)
{
	struct neuron_udma_queue_state before, after;
	struct plain_wait w[32];
	int i;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, 2, 120000));
	for (i = 0; i < 64 - 16; i++)
		ASSERT_EQ(0, prep_one(self->fd, ENG, 2, ucopy(&self->a, i * 64, &self->b, i * 64, 64)));
	ASSERT_EQ(-ENOSPC, prep_one(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 0, 64)));
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &before));
	for (i = 0; i < 32; i++) {
		w[i] = (struct plain_wait){ .fd = self->fd, .ret = 1, .eng = ENG, .q = 2 };
		ASSERT_EQ(0, pthread_create(&w[i].t, NULL, plain_wait_thread, &w[i]));
	}
	usleep(300 * 1000);
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &after));
	/* One marker pair for all of them, started with the 48 pairs. */
	EXPECT_EQ((before.tx.sw_next + 1) % 64, after.tx.sw_next);
	EXPECT_EQ(0U, after.tx.sw_pending);
	EXPECT_EQ(0U, after.tx.sw_available);
	ASSERT_BYTES(self->b.map, self->save, BUF);
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	for (i = 0; i < 32; i++) {
		ASSERT_EQ(0, pthread_join(w[i].t, NULL));
		EXPECT_EQ(0, w[i].ret);
	}
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &after));
	EXPECT_EQ(after.tx.sw_next, after.tx.sw_ack);
	ASSERT_BYTES(self->b.map, self->a.map, 48 * 64);
	ASSERT_EQ(0, copy_sync(self->fd, ENG, 2, ucopy(&self->a, 7, &self->b, 70001, 9000)));
	ASSERT_BYTES(self->b.map + 70001, self->a.map + 7, 9000);
}

#define MAX_WAITS 256

static void on_tick(int sig)
{
	(void)sig;
}

/*
 * 256 waits on a stalled queue, each interrupted by a signal: EINTR every time, and they reuse
 * the one marker in flight instead of adding one each (so they can never exhaust the ring or
 * the completion slots). When the engine moves, the next wait returns 0 and frees the ring.
 */
TEST_F_TIMEOUT(fault, copy_wait_256_interrupted_waits, 120)
{
	struct sigaction sa = { .sa_handler = on_tick };	/* no SA_RESTART */
	struct itimerval tick = { .it_interval = { .tv_usec = 3000 }, .it_value = { .tv_usec = 3000 } };
	struct itimerval off = { 0 };
	struct neuron_udma_queue_state st0, after;
	int n, ret = 0;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, 2, 120000));
	ASSERT_EQ(0, prep_one(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 0, 4096)));
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &st0));
	ASSERT_EQ(0, sigaction(SIGALRM, &sa, NULL));
	ASSERT_EQ(0, setitimer(ITIMER_REAL, &tick, NULL));
	for (n = 0; n < MAX_WAITS; n++) {
		ret = copy_wait(self->fd, ENG, 2, 60000, NULL);
		if (ret != -EINTR)
			break;
	}
	ASSERT_EQ(0, setitimer(ITIMER_REAL, &off, NULL));
	ASSERT_EQ(-EINTR, ret) {
		TH_LOG("wait %d: %s", n, strerror(-ret));
	}
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &after));
	/* One marker pair in all. */
	EXPECT_EQ((st0.tx.sw_next + 1) % 64, after.tx.sw_next);
	ASSERT_BYTES(self->b.map, self->save, BUF);
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	EXPECT_EQ(0, copy_wait(self->fd, ENG, 2, 0, NULL));
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &after));
	EXPECT_EQ(after.tx.sw_next, after.tx.sw_ack);
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	ASSERT_EQ(0, copy_sync(self->fd, ENG, 2, ucopy(&self->a, 5, &self->b, 10000, 3000)));
	ASSERT_BYTES(self->b.map + 10000, self->a.map + 5, 3000);
}

/*
 * MEMCPY on the shared H2T queue with a short timeout: ETIMEDOUT, but the shared queue is not
 * reset (other files' copies go on), so the copy lands once the engine moves, and its buffers
 * stay busy until then.
 */
TEST_F(fault, memcpy_etimedout_then_usable)
{
	/* The driver's own H2T queue: engine 32 queue 0 (v2) or 128 queue 0 (v3). */
	__u32 h2t = self->info.generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
	int i;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, h2t, 0, 3000));
	ASSERT_EQ(-ETIMEDOUT, udma_memcpy(self->fd, &self->a, 0, &self->b, 0, 4096, 200));
	EXPECT_EQ(-EBUSY, mem_free(self->fd, self->b.handle));
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	/* The next MEMCPY of this file waits for the first one, then runs. */
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->a, 11, &self->b, 65536 + 1, 70000, 0));
	ASSERT_BYTES(self->b.map + 65536 + 1, self->a.map + 11, 70000);
	for (i = 0; i < 100 && first_diff(self->b.map, self->a.map, 4096) >= 0; i++)
		usleep(10 * 1000);
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	ASSERT_BYTES(self->b.map + 4096, self->save + 4096, 65536 + 1 - 4096);
}

static void on_alarm(int sig)
{
	(void)sig;
}

TEST_F(fault, wait_interrupted_eintr)
{
	struct sigaction sa = { .sa_handler = on_alarm };	/* no SA_RESTART */
	struct itimerval it = { .it_value = { .tv_usec = 200000 } };

	ASSERT_EQ(0, sigaction(SIGALRM, &sa, NULL));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, 2, 1500));
	ASSERT_EQ(0, prep_one(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 0, 4096)));
	ASSERT_EQ(0, setitimer(ITIMER_REAL, &it, NULL));
	ASSERT_EQ(-EINTR, copy_wait(self->fd, ENG, 2, 0, NULL));
	/* The copy goes on: the next wait sees it complete. */
	ASSERT_EQ(0, copy_wait(self->fd, ENG, 2, 0, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
}

TEST_F(fault, mem_free_busy_in_flight)
{
	struct neuron_udma_queue_state before;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, 2, 1000));
	ASSERT_EQ(0, prep_one(self->fd, ENG, 2, ucopy(&self->a, 0, &self->b, 0, 4096)));
	ASSERT_EQ(0, copy_start(self->fd, ENG, 2, 1, 1));
	ASSERT_EQ(0, queue_state(self->fd, ENG, 2, &before));
	EXPECT_EQ(-EBUSY, mem_free(self->fd, self->b.handle));
	EXPECT_EQ(-EBUSY, mem_free(self->fd, self->a.handle));
	ASSERT_UNCHANGED(self->fd, ENG, 2, &before);
	ASSERT_EQ(0, copy_wait(self->fd, ENG, 2, 0, NULL));
	ASSERT_BYTES(self->b.map, self->a.map, 4096);
	EXPECT_EQ(0, ubuf_free(self->fd, &self->b));
	EXPECT_EQ(0, ubuf_free(self->fd, &self->a));
}

TEST_F(fault, memcpy_eio_then_recovery)
{
	/* The driver's MEMCPY queue: H2T of NeuronCore 0 (hardware.rst §2.3), queue 0 of engine
	 * 32 (v2) or 128 (v3).
	 */
	__u32 h2t = self->info.generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
	struct ubuf hbm;

	ASSERT_EQ(0, ubuf_dev(self->fd, BUF, &hbm));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_FAIL_NTH, h2t, 0, 1));
	ASSERT_EQ(-EIO, udma_memcpy(self->fd, &self->a, 0, &self->b, 0, 4096, 0));
	EXPECT_EQ(ERR_INJECTED_FAIL, bar2_read(&self->bar2, BAR2_LAST_ERROR));
	EXPECT_EQ(h2t, bar2_read(&self->bar2, BAR2_LAST_ENGINE));
	ASSERT_BYTES(self->b.map, self->save, BUF);
	ASSERT_EQ(0, udma_memcpy(self->fd, &self->a, 9, &hbm, 1, 100000, 0));
	ASSERT_EQ(0, udma_memcpy(self->fd, &hbm, 1, &self->b, 3, 100000, 0));
	ASSERT_BYTES(self->b.map + 3, self->a.map + 9, 100000);
}

/* A MEMCPY holds its buffers: freeing one while it runs is EBUSY, afterwards it works. */
struct memcpy_job {
	int fd, ret;
	struct ubuf *src, *dst;
};

static void *memcpy_thread(void *arg)
{
	struct memcpy_job *j = arg;

	j->ret = udma_memcpy(j->fd, j->src, 0, j->dst, 0, BUF, 0);
	return NULL;
}

TEST_F(fault, mem_free_busy_during_memcpy)
{
	/* The driver's own H2T queue: engine 32 queue 0 (v2) or 128 queue 0 (v3). */
	__u32 h2t = self->info.generation == NEURON_UDMA_GEN_V2 ? 32 : 128;
	struct memcpy_job j = { .fd = self->fd, .src = &self->a, .dst = &self->b };
	pthread_t t;

	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, h2t, 0, 1500));
	ASSERT_EQ(0, pthread_create(&t, NULL, memcpy_thread, &j));
	usleep(300 * 1000);
	EXPECT_EQ(-EBUSY, mem_free(self->fd, self->a.handle));
	EXPECT_EQ(-EBUSY, mem_free(self->fd, self->b.handle));
	ASSERT_EQ(0, pthread_join(t, NULL));
	ASSERT_EQ(0, j.ret);
	ASSERT_EQ(-1, first_diff(self->b.map, self->a.map, BUF));
}

TEST_F(dev, mmap_wrong_offset_or_length_einval)
{
	struct ubuf a, b;
	void *p;

	ASSERT_EQ(0, ubuf_host(self->fd, 16384, &a));
	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &b));
	/* A length other than the buffer's size: shorter, longer, the other buffer's. */
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	p = mmap(NULL, 20480, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	/* An offset that is not a host buffer's: inside one, past the last, zero. */
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset + 4096);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd,
		 b.mmap_offset + (64ULL << 20));
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	if (a.mmap_offset && b.mmap_offset) {
		p = mmap(NULL, 16384, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, 0);
		EXPECT_EQ(MAP_FAILED, p);
		EXPECT_EQ(EINVAL, errno);
	}
	/* A freed buffer's offset is no longer a buffer's. */
	EXPECT_EQ(0, ubuf_free(self->fd, &b));
	p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, b.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	/* The right offset and length still map, and the first mapping is intact. */
	a.map[0] = 0x11;
	p = mmap(NULL, 16384, PROT_READ | PROT_WRITE, MAP_SHARED, self->fd, a.mmap_offset);
	ASSERT_NE(MAP_FAILED, p);
	EXPECT_EQ(0x11, ((unsigned char *)p)[0]);
	munmap(p, 16384);
	EXPECT_EQ(0, ubuf_free(self->fd, &a));
}

TEST_F(dev, sigbus_after_mem_free)
{
	struct ubuf a, b;
	unsigned char *stale;

	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &a));
	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &b));
	memset(a.map, 0x5a, 8192);
	EXPECT_EQ(0, touch_signal(a.map + 4096, false));
	/* Free it but keep the mapping: both pages are gone from it. */
	stale = a.map;
	ASSERT_EQ(0, mem_free(self->fd, a.handle));
	EXPECT_EQ(SIGBUS, touch_signal(stale, false));
	EXPECT_EQ(SIGBUS, touch_signal(stale + 4096, true));
	/* The other buffer's mapping is untouched. */
	EXPECT_EQ(0, touch_signal(b.map, true));
	munmap(stale, 8192);
	EXPECT_EQ(0, ubuf_free(self->fd, &b));
}

TEST_F(fault, mmap_private_or_exec_refused)
{
	void *p;

	p = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE, self->fd, self->a.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
	EXPECT_EQ(EINVAL, errno);
	p = mmap(NULL, BUF, PROT_READ | PROT_EXEC, MAP_SHARED, self->fd, self->a.mmap_offset);
	EXPECT_EQ(MAP_FAILED, p);
}

TEST_HARNESS_MAIN
