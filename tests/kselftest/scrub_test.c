// SPDX-License-Identifier: GPL-2.0
/*
 * The scrub of device memory (Documentation/userspace-api.rst, "What is scrubbed"): a device
 * buffer reads as zeros whatever the previous owner wrote. Buffers of 4 MiB and more are
 * scrubbed on every H2T engine at once (rust/h2t.rs: v2 engines 32 and 33, v3 128-131): every
 * part must be zeroed, and a SIGKILL during the scrub keeps the whole range reserved until no
 * part is in flight.
 */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024ULL

/* A fixture only for the harness's per-test timeouts. */
FIXTURE(scrub) {
	int unused;
};

FIXTURE_SETUP(scrub)
{
}

FIXTURE_TEARDOWN(scrub)
{
}
#define MIB (1024ULL * 1024)

static int do_memset(int fd, __u64 handle, __u64 off, __u64 size, __u32 value)
{
	struct neuron_udma_memset m = { .handle = handle, .offset = off, .size = size,
					.value = value };

	return udma_ioc(fd, NEURON_UDMA_MEMSET, &m);
}

/* The second H2T engine's scrub queue (queue 0): 33 on v2, 129 on v3. */
static __u32 scrub_engine(const struct neuron_udma_info *info)
{
	return info->generation == NEURON_UDMA_GEN_V2 ? 33 : 129;
}

/*
 * Dirty most of device memory (a MEMSET of 0xEE), free it, allocate it again: every byte of the
 * large buffer reads as zero, in every part the engines scrubbed.
 */
TEST_F_TIMEOUT(scrub, large_buffers_read_zeros, 300)
{
	struct neuron_udma_info info;
	struct ubuf dev, host;
	__u64 size;
	int fd = udma_open();
	double t0, ms;

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	size = (info.device_mem_size / 2) & ~(4 * MIB - 1);
	ASSERT_LE(8 * MIB, size);
	ASSERT_EQ(0, ubuf_host(fd, 4 * MIB, &host));
	ASSERT_EQ(0, ubuf_dev(fd, size, &dev));
	ASSERT_EQ(0, do_memset(fd, dev.handle, 0, size, 0xEE));
	ASSERT_EQ(0, ubuf_free(fd, &dev));
	t0 = now_ms();
	ASSERT_EQ(0, ubuf_dev(fd, size, &dev));
	ms = now_ms() - t0;
	TH_LOG("MEM_ALLOC of %llu MiB (scrubbed on every H2T engine): %.1f ms", size >> 20, ms);
	for (__u64 off = 0; off < size; off += 4 * MIB) {
		memset(host.map, 0x55, 4 * MIB);
		ASSERT_EQ(0, udma_memcpy(fd, &dev, off, &host, 0, 4 * MIB, 0));
		for (__u64 i = 0; i < 4 * MIB; i++) {
			ASSERT_EQ(0, host.map[i]) {
				TH_LOG("byte %llu is not zero", off + i);
			}
		}
	}
	close(fd);
}

/* ---- SIGKILL while one engine's part is stalled ---- */

struct kill_report {
	int step, err;
	__u64 size;
};

static int kill_child(void *arg)
{
	struct kill_report *r = arg;
	__u64 h;
	int fd = udma_open();

	if (fd < 0)
		return r->err = fd, 2;
	r->step = 1;
	r->err = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, r->size, &h, NULL);
	r->step = 2;
	return 0;
}

TEST_F_TIMEOUT(scrub, sigkill_keeps_the_range_until_every_part_is_done, 120)
{
	struct kill_report *r = sec_shared(sizeof(*r));
	struct neuron_udma_info info;
	struct ubar2 bar2;
	__u64 h;
	pid_t pid;
	int fd = udma_open(), ret;

	ASSERT_NE(NULL, r);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	/* More than half: a second one fits only once the first range is back. */
	r->size = (info.device_mem_size * 5 / 8) & ~(MIB - 1);
	ASSERT_EQ(0, bar2_open(&bar2));
	/* Only the second engine's part stalls (3 s); the others finish at once. */
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_STALL, scrub_engine(&info), 0, 3000));
	pid = sec_spawn(0, kill_child, r);
	ASSERT_LT(0, pid);
	for (int i = 0; i < 200 && r->step < 1; i++)
		sleep_ms(10);
	sleep_ms(500);
	ASSERT_EQ(1, r->step);
	kill(pid, SIGKILL);
	EXPECT_EQ(128 + SIGKILL, sec_reap(pid));
	/* The stalled part is still in flight: the range is not given back yet. */
	EXPECT_EQ(-ENOMEM, raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, r->size, &h, NULL));
	/* It is once the stall is over (and the reaper looked). */
	ret = -ENOMEM;
	for (int i = 0; i < 100 && ret; i++) {
		ret = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, r->size, &h, NULL);
		if (ret)
			sleep_ms(100);
	}
	EXPECT_EQ(0, ret);
	if (!ret)
		EXPECT_EQ(0, mem_free(fd, h));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);
	close(fd);
	munmap(r, sizeof(*r));
}

TEST_HARNESS_MAIN
