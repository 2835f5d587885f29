// SPDX-License-Identifier: GPL-2.0
/*
 * io_uring registered buffers as a copy's host side (INFO features
 * NEURON_UDMA_FEATURE_URING_FIXED, include/uapi/linux/neuron_udma.h): a NEURON_UDMA_URING_COPY
 * SQE with IORING_URING_CMD_FIXED names a range of a registered buffer (buf_index, addr; it ends
 * at the furthest byte its copies name), which its copies name as NEURON_UDMA_FIXED_BUFFER. On
 * a normal and an IOPOLL ring, a range at an odd address is copied to device memory, back into
 * another range, to a host buffer and onto itself, byte-exact, nothing else written. Bad SQEs
 * (the handle without the flag, an index nobody registered, a range outside the buffer, past
 * 1 GiB or wrapping, len set, no copy naming the range) complete with their errno and prepare
 * nothing. A copy whose registered buffer is unregistered and unmapped while the copy waits on
 * a stalled queue still moves its bytes: into a memfd's pages (read back through a new
 * mapping), and out of anonymous pages the process gave back (and then churned 64 MiB of fresh
 * memory) into a host buffer. A range is charged to RLIMIT_MEMLOCK while its command runs, as a
 * MEM_IMPORT of it: ENOMEM past the limit, the charge back once the engine is done. Unbind and
 * rebind while ranges are being mapped leave no mapping behind.
 *
 * Built with liburing (LDLIBS_uring_fixed_test in the Makefile). Engine 15 (host-connected on
 * v2 and v3), one queue number per test; stalls come from the device model's BAR2 window,
 * cleared by the harness's parent after every test.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <liburing.h>

#include "kselftest_harness.h"
#include "udma_fence.h"
#include "udma_sec.h"
#include "udma_uring.h"

#define ENG FENCE_ENG
#define KIB 1024U
#define PAGE 4096U
#define REG (256U * KIB)	/* the registered buffer */
#define DEV (128U * KIB)	/* the device buffer */
#define SPLIT NEURON_UDMA_COPY_SPLIT

/* A copy of @size bytes, either side the registered range (handle NEURON_UDMA_FIXED_BUFFER). */
static struct neuron_udma_copy fcopy(__u64 src, __u64 src_off, __u64 dst, __u64 dst_off,
				     __u32 size)
{
	struct neuron_udma_copy c = {
		.src_handle = src,
		.src_offset = src_off,
		.dst_handle = dst,
		.dst_offset = dst_off,
		.size = size,
		.flags = SPLIT,
	};

	return c;
}

#define FIXED NEURON_UDMA_FIXED_BUFFER

/*
 * One NEURON_UDMA_URING_COPY SQE whose copies may name the range at @addr of the registered
 * buffer @index (IORING_URING_CMD_FIXED; the range ends at the furthest byte they name), with
 * the SQE's len @len (reserved: 0), submitted. 0 or -errno.
 */
static int submit_fixed(struct io_uring *ring, int fd, __u32 q, const struct neuron_udma_copy *c,
			__u32 count, __u16 index, const void *addr, __u32 len, __u64 data)
{
	struct io_uring_sqe *sqe;
	int ret;

	sqe = sqe_copy_get(ring, fd, NEURON_UDMA_URING_COPY, ENG, q, c, count, data);
	if (!sqe)
		return -EBUSY;
	sqe->uring_cmd_flags = IORING_URING_CMD_FIXED;
	sqe->buf_index = index;
	sqe->addr = (uintptr_t)addr;
	sqe->len = len;
	ret = io_uring_submit(ring);
	return ret == 1 ? 0 : ret < 0 ? ret : -EIO;
}

/* Registers [@p, @p + @len) as buffer 0 of @ring. 0 or -errno. */
static int register_one(struct io_uring *ring, void *p, size_t len)
{
	struct iovec iov = { .iov_base = p, .iov_len = len };

	return io_uring_register_buffers(ring, &iov, 1);
}

FIXTURE(fixed) {
	int fd;
	struct neuron_udma_info info;
	struct ubar2 bar2;
	struct ubuf host, dev;
	unsigned char *reg;	/* REG bytes of anonymous memory, registered as buffer 0 */
	unsigned char *save;	/* their bytes as the test began */
	struct io_uring ring;
};

FIXTURE_VARIANT(fixed) {
	bool iopoll;		/* an IORING_SETUP_IOPOLL ring */
	__u32 q;		/* a queue of its own */
};

FIXTURE_VARIANT_ADD(fixed, normal) { .iopoll = false, .q = 1 };
FIXTURE_VARIANT_ADD(fixed, iopoll) { .iopoll = true, .q = 2 };

FIXTURE_SETUP(fixed)
{
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd) {
		TH_LOG("open %s: %s", UDMA_DEV, strerror(errno));
	}
	ASSERT_EQ(0, udma_info(self->fd, &self->info));
	ASSERT_EQ(NEURON_UDMA_FEATURE_URING_FIXED,
		  self->info.features & NEURON_UDMA_FEATURE_URING_FIXED);
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, ubuf_host(self->fd, 64 * KIB, &self->host));
	ASSERT_EQ(0, ubuf_dev(self->fd, DEV, &self->dev));
	fill_pattern(self->host.map, 64 * KIB, 51);
	self->reg = mmap(NULL, REG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, self->reg);
	fill_pattern(self->reg, REG, 52);
	self->save = malloc(REG);
	ASSERT_NE(NULL, self->save);
	memcpy(self->save, self->reg, REG);
	ret = io_uring_queue_init(16, &self->ring, variant->iopoll ? IORING_SETUP_IOPOLL : 0);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_queue_init: %s", err_name(ret));
	}
	ret = register_one(&self->ring, self->reg, REG);
	ASSERT_EQ(0, ret) {
		TH_LOG("io_uring_register_buffers: %s", err_name(ret));
	}
	ASSERT_EQ(0, queue_init(self->fd, ENG, variant->q, 256, 256));
}

FIXTURE_TEARDOWN_PARENT(fixed)
{
	model_clear();
}

/* The SQE's CQE within SOON_MS: its res (and a failed assertion if none came or another did). */
#define CQE_RES(self, want_data) ({								\
	struct cqe_out _o = { 0 };							\
	int _r = cqe_next(&(self)->ring, variant->iopoll, SOON_MS, &_o);		\
	ASSERT_EQ(0, _r) {								\
		TH_LOG("no CQE within %u ms", SOON_MS);					\
	}										\
	ASSERT_EQ((__u64)(want_data), _o.data);						\
	_o.res;										\
})

/*
 * A range at an odd address (12 KiB + 7) to device memory (64 KiB and 5000 bytes, each copy
 * across pages: SPLIT), back into another range (at 160 KiB + 1), then a copy of the first
 * range to a host buffer and one from the first range into the second in one SQE (both sides
 * the registered buffer, one range from r1 past r2). Every CQE 0; the registered memory and the host buffer hold
 * exactly what the copies wrote; one fence per SQE.
 */
TEST_F_TIMEOUT(fixed, round_trip, 60)
{
	const __u32 q = variant->q;
	unsigned char *r1 = self->reg + 12 * KIB + 7, *r2 = self->reg + 160 * KIB + 1;
	struct neuron_udma_copy in[2] = {
		fcopy(FIXED, 100, self->dev.handle, 0, 65536),
		fcopy(FIXED, 70000, self->dev.handle, 65536, 5000),
	};
	struct neuron_udma_copy out[2] = {
		fcopy(self->dev.handle, 0, FIXED, 0, 65536),
		fcopy(self->dev.handle, 65536, FIXED, 70000, 5000),
	};
	/* r2's offset in a range that starts at r1. */
	const __u64 r12 = (__u64)(r2 - r1);
	struct neuron_udma_copy mixed[2] = {
		fcopy(FIXED, 3, self->host.handle, 9, 20000),
		fcopy(FIXED, 1000, FIXED, r12 + 66000, 4000),
	};
	unsigned char *want, *want_host;
	int res;

	want = malloc(REG);
	want_host = malloc(64 * KIB);
	ASSERT_NE(NULL, want);
	ASSERT_NE(NULL, want_host);
	memcpy(want, self->save, REG);
	memcpy(want_host, self->host.map, 64 * KIB);

	ASSERT_EQ(0, submit_fixed(&self->ring, self->fd, q, in, 2, 0, r1, 0, 1));
	res = CQE_RES(self, 1);
	ASSERT_EQ(0, res) {
		TH_LOG("registered -> device: CQE res %d (%s)", res, err_name(res));
	}
	ASSERT_EQ(0, submit_fixed(&self->ring, self->fd, q, out, 2, 0, r2, 0, 2));
	res = CQE_RES(self, 2);
	ASSERT_EQ(0, res) {
		TH_LOG("device -> registered: CQE res %d (%s)", res, err_name(res));
	}
	memcpy(want + (r2 - self->reg), self->save + (r1 - self->reg) + 100, 65536);
	memcpy(want + (r2 - self->reg) + 70000, self->save + (r1 - self->reg) + 70000, 5000);
	ASSERT_BYTES(self->reg, want, REG);

	/* One range covering both: from r1 to the last byte the second copy writes. */
	ASSERT_EQ(0, submit_fixed(&self->ring, self->fd, q, mixed, 2, 0, r1, 0, 3));
	res = CQE_RES(self, 3);
	ASSERT_EQ(0, res) {
		TH_LOG("registered -> host, registered -> registered: CQE res %d (%s)", res,
		       err_name(res));
	}
	memcpy(want_host + 9, want + (r1 - self->reg) + 3, 20000);
	memmove(want + (r2 - self->reg) + 66000, want + (r1 - self->reg) + 1000, 4000);
	ASSERT_BYTES(self->host.map, want_host, 64 * KIB);
	ASSERT_BYTES(self->reg, want, REG);
	EXPECT_FENCE(self->fd, ENG, q, 3, NEURON_UDMA_FENCE_DONE, 0);
	free(want);
	free(want_host);
}

/*
 * Bad SQEs complete with their errno and change nothing: the queue as it was, no fence, the
 * registered memory and the host buffer untouched; a good SQE then works on the same queue.
 */
TEST_F_TIMEOUT(fixed, bad_sqes, 60)
{
	const __u32 q = variant->q;
	const struct {
		const char *what;
		bool fixed;		/* IORING_URING_CMD_FIXED */
		__u16 index;
		__u64 at;		/* the range's offset in the registered buffer */
		__u32 len;		/* the SQE's len */
		__u64 off;		/* the second copy's offset in the range */
		__u64 handle;		/* the second copy's destination */
		int want;
	} cases[] = {
		{ "the handle without IORING_URING_CMD_FIXED", false, 0, 0, 0, 0, FIXED, -ENOENT },
		{ "an index nobody registered", true, 3, 0, 0, 0, FIXED, -EFAULT },
		{ "a copy past the buffer's end", true, 0, REG - 8192, 0, 8192 - 100, FIXED,
		  -EFAULT },
		{ "a range before the buffer", true, 0, (__u64)-4096, 0, 0, FIXED, -EFAULT },
		{ "a copy past 1 GiB", true, 0, 0, 0, 1ULL << 30, FIXED, -EFAULT },
		{ "an offset that wraps", true, 0, 0, 0, ~0ULL - 100, FIXED, -EFAULT },
		{ "len set (reserved)", true, 0, 0, 4096, 0, FIXED, -EINVAL },
		{ "no copy names the range", true, 0, 0, 0, 4096, 0, -EINVAL },
	};
	struct neuron_udma_queue_state st0;
	struct neuron_udma_fence_status fs;
	unsigned char *host0;
	size_t i;
	int res;

	host0 = malloc(64 * KIB);
	ASSERT_NE(NULL, host0);
	memcpy(host0, self->host.map, 64 * KIB);
	ASSERT_EQ(0, queue_state(self->fd, ENG, q, &st0));
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		struct neuron_udma_copy c[2] = {
			fcopy(self->host.handle, 0, self->dev.handle, 0, 4096),
			fcopy(self->host.handle, 0, cases[i].handle ? cases[i].handle :
			      self->dev.handle, cases[i].off, 4096),
		};
		void *addr = (void *)((uintptr_t)self->reg + cases[i].at);

		if (cases[i].fixed) {
			ASSERT_EQ(0, submit_fixed(&self->ring, self->fd, q, c, 2, cases[i].index,
						  addr, cases[i].len, 10 + i));
		} else {
			ASSERT_EQ(0, submit_copy(&self->ring, self->fd, NEURON_UDMA_URING_COPY,
						 ENG, q, c, 2, 10 + i));
		}
		res = CQE_RES(self, 10 + i);
		EXPECT_EQ(cases[i].want, res) {
			TH_LOG("%s: CQE res %d (%s), want %s", cases[i].what, res, err_name(res),
			       err_name(cases[i].want));
		}
		ASSERT_UNCHANGED(self->fd, ENG, q, &st0);
		EXPECT_EQ(-EINVAL, fence_status(self->fd, ENG, q, 1, &fs)) {
			TH_LOG("%s: a fence was submitted", cases[i].what);
		}
	}
	ASSERT_BYTES(self->reg, self->save, REG);
	ASSERT_BYTES(self->host.map, host0, 64 * KIB);

	/* A good SQE on the same queue: host -> registered. */
	{
		struct neuron_udma_copy c = fcopy(self->host.handle, 5, FIXED, 1, 9000);

		ASSERT_EQ(0, submit_fixed(&self->ring, self->fd, q, &c, 1, 0, self->reg + PAGE,
					  0, 99));
		res = CQE_RES(self, 99);
		ASSERT_EQ(0, res) {
			TH_LOG("the good SQE: CQE res %d (%s)", res, err_name(res));
		}
		memcpy(self->save + PAGE + 1, host0 + 5, 9000);
		ASSERT_BYTES(self->reg, self->save, REG);
	}
	free(host0);
}

/* ---- a copy in flight when its registered buffer goes ---- */

FIXTURE(fixed_gone) {
	int fd;
	struct ubar2 bar2;
	struct ubuf host;
	struct io_uring ring;
};

FIXTURE_VARIANT(fixed_gone) {
	bool to_fixed;		/* the registered buffer is the destination (else the source) */
	__u32 q;
};

FIXTURE_VARIANT_ADD(fixed_gone, destination) { .to_fixed = true, .q = 3 };
FIXTURE_VARIANT_ADD(fixed_gone, source) { .to_fixed = false, .q = 4 };

FIXTURE_SETUP(fixed_gone)
{
	int ret;

	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
	ret = bar2_open(&self->bar2);
	ASSERT_EQ(0, ret) {
		TH_LOG("BAR2 window of the model (sysfs resource2): %s", strerror(-ret));
	}
	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ASSERT_EQ(0, ubuf_host(self->fd, 64 * KIB, &self->host));
	fill_pattern(self->host.map, 64 * KIB, 61);
	ASSERT_EQ(0, io_uring_queue_init(8, &self->ring, 0));
	ASSERT_EQ(0, queue_init(self->fd, ENG, variant->q, 64, 64));
}

FIXTURE_TEARDOWN_PARENT(fixed_gone)
{
	model_clear();
}

/*
 * 64 KiB between a host buffer and a registered buffer, waiting on a stalled queue, when the
 * process unregisters the buffer and unmaps it. Unregistering returns at once, and the CQE
 * comes only after the stall ends, with res 0 and the bytes moved: the destination variant
 * registers a memfd's pages and reads them back through a new mapping; the source variant
 * registers anonymous pages, gives them back and touches 64 MiB of fresh memory before the stall
 * ends, and the host buffer then holds the bytes the pages had (the driver kept them).
 */
TEST_F_TIMEOUT(fixed_gone, unregister_in_flight, 60)
{
	const __u32 q = variant->q, len = 64 * KIB;
	struct neuron_udma_fence_status fs;
	unsigned char *mem, *want, *churn;
	struct neuron_udma_copy c;
	struct cqe_out out;
	int mfd = -1, ret = -1;
	double t0, dt;

	want = malloc(len);
	ASSERT_NE(NULL, want);
	if (variant->to_fixed) {
		mfd = memfd_create("uring_fixed", MFD_CLOEXEC);
		ASSERT_LE(0, mfd);
		ASSERT_EQ(0, ftruncate(mfd, len));
		mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
		ASSERT_NE(MAP_FAILED, mem);
		memset(mem, 0xee, len);
		memcpy(want, self->host.map, len);
		c = fcopy(self->host.handle, 0, FIXED, 0, len);
	} else {
		mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		ASSERT_NE(MAP_FAILED, mem);
		fill_pattern(mem, len, 62);
		memcpy(want, mem, len);
		c = fcopy(FIXED, 0, self->host.handle, 0, len);
	}
	ASSERT_EQ(0, register_one(&self->ring, mem, len));
	ASSERT_EQ(0, bar2_fault(&self->bar2, FAULT_STALL, ENG, q, STALL_MS));
	ASSERT_EQ(0, submit_fixed(&self->ring, self->fd, q, &c, 1, 0, mem, 0, 7));
	/* Issued: its fence exists. */
	t0 = now_ms();
	while (now_ms() - t0 < SOON_MS && (ret = fence_status(self->fd, ENG, q, 1, &fs)))
		sleep_ms(10);
	ASSERT_EQ(0, ret);

	t0 = now_ms();
	ASSERT_EQ(0, io_uring_unregister_buffers(&self->ring));
	ASSERT_EQ(0, munmap(mem, len));
	dt = now_ms() - t0;
	TH_LOG("unregister + munmap with the copy waiting: %.0f ms", dt);
	EXPECT_LT(dt, 2000.0);
	if (!variant->to_fixed) {
		/* Fresh memory: pages given back to the system would be reused here. */
		churn = mmap(NULL, 64U << 20, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		ASSERT_NE(MAP_FAILED, churn);
		memset(churn, 0x5a, 64U << 20);
		munmap(churn, 64U << 20);
	}
	ret = cqe_next(&self->ring, false, 200, &out);
	ASSERT_EQ(-ETIME, ret) {
		TH_LOG("a CQE (res %d) while the queue is stalled", out.res);
	}

	bar2_write(&self->bar2, BAR2_CLEAR, 1);
	ret = cqe_next(&self->ring, false, SOON_MS, &out);
	ASSERT_EQ(0, ret) {
		TH_LOG("no CQE within %u ms of the stall's end", SOON_MS);
	}
	EXPECT_EQ(7ULL, out.data);
	ASSERT_EQ(0, out.res) {
		TH_LOG("CQE res %d (%s)", out.res, err_name(out.res));
	}
	if (variant->to_fixed) {
		mem = mmap(NULL, len, PROT_READ, MAP_SHARED, mfd, 0);
		ASSERT_NE(MAP_FAILED, mem);
		ASSERT_BYTES(mem, want, len);
		munmap(mem, len);
		close(mfd);
	} else {
		ASSERT_BYTES(self->host.map, want, len);
	}
	free(want);
}

/* ---- RLIMIT_MEMLOCK ---- */

/* A user no other test pins for: its locked-memory budget is exactly the limit. */
#define UID_FIXED 1003
#define LOCK_LIMIT (256U * KIB)

/*
 * One SQE of one copy (device -> the last page of the range [@p, @p + @len), so the range is
 * @len bytes) on a normal ring: its CQE res.
 */
static int fixed_res(struct io_uring *ring, int fd, __u32 q, __u64 dev, unsigned char *p,
		     __u32 len)
{
	struct neuron_udma_copy c = fcopy(dev, 0, FIXED, len - 4096, 4096);
	struct cqe_out out;
	int ret;

	ret = submit_fixed(ring, fd, q, &c, 1, 0, p, 0, 1);
	if (!ret)
		ret = cqe_next(ring, false, SOON_MS, &out);
	return ret ? -10000 + ret : out.res;
}

/*
 * The child of memlock_charged: a file with a queue and a device buffer, then real uid
 * UID_FIXED, no CAP_IPC_LOCK, RLIMIT_MEMLOCK 256 KiB, a ring with 192 KiB registered (io_uring
 * charges them: 64 KiB of the budget left). Exit status: 0, or the step that went wrong.
 */
static int memlock_child(__u32 q)
{
	unsigned char *p;
	struct io_uring ring;
	struct ubuf dev;
	int fd;

	/* As root: the queue's rings are charged to root, the budget stays whole. */
	fd = udma_open();
	if (fd < 0 || queue_init(fd, ENG, q, 64, 64) || ubuf_dev(fd, 64 * KIB, &dev))
		return 3;
	if (setresuid(UID_FIXED, 0, 0) || drop_ipc_lock())
		return 1;
	if (sec_memlock(LOCK_LIMIT))
		return 2;
	p = mmap(NULL, 192 * KIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || io_uring_queue_init(8, &ring, 0))
		return 4;
	memset(p, 0x11, 192 * KIB);
	if (register_one(&ring, p, 192 * KIB))
		return 5;
	/* 128 KiB of the range: above the 64 KiB left. */
	if (fixed_res(&ring, fd, q, dev.handle, p, 128 * KIB) != -ENOMEM)
		return 6;
	/* 64 KiB + 1 byte at an odd address touches 17 pages: one too many. */
	if (fixed_res(&ring, fd, q, dev.handle, p + 1, 64 * KIB) != -ENOMEM)
		return 7;
	/* Exactly the rest of the budget; then again: the first command gave its charge back. */
	if (fixed_res(&ring, fd, q, dev.handle, p + 64 * KIB, 64 * KIB) != 0)
		return 8;
	if (fixed_res(&ring, fd, q, dev.handle, p + 128 * KIB, 64 * KIB) != 0)
		return 9;
	return 0;
}

/*
 * A registered range is charged to RLIMIT_MEMLOCK while its command runs, as a MEM_IMPORT of it
 * (on top of io_uring's own charge of the registration): past the limit the CQE is ENOMEM, a
 * range exactly up to it works, and the charge comes back once the engine is done (the release
 * workqueue gives it back; a command past the limit waits for the releases queued first).
 */
TEST(memlock_charged)
{
	static const char *const what[] = {
		"ok", "setresuid / CAP_IPC_LOCK", "RLIMIT_MEMLOCK", "open, QUEUE_INIT, MEM_ALLOC",
		"mmap, io_uring_queue_init", "io_uring_register_buffers (192 KiB of 256)",
		"128 KiB over the 64 KiB left: not ENOMEM", "17 pages over 16: not ENOMEM",
		"exactly the rest: not 0", "the rest again: not 0 (a charge kept)",
	};
	int status = 0;
	pid_t pid;

	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(memlock_child(9));
	ASSERT_EQ(pid, waitpid(pid, &status, 0));
	ASSERT_TRUE(WIFEXITED(status));
	EXPECT_EQ(0, WEXITSTATUS(status)) {
		TH_LOG("the child stopped at: %s", what[WEXITSTATUS(status) % ARRAY_SIZE(what)]);
	}
}

/* ---- unbind while registered ranges are being mapped ---- */

#define RACE_LEN (32U << 20)
#define RACE_COPIES 4096

/* One thread's SQEs: each maps a 32 MiB range and fails (too many pairs for its ring). */
struct racer {
	int fd;
	__u32 q;
	volatile int stop;
	unsigned char *mem;
	long sqes, bad;		/* CQEs, and those with an unexpected res */
	int last_bad;
};

static void *race_thread(void *arg)
{
	struct racer *r = arg;
	struct neuron_udma_copy *c = calloc(RACE_COPIES, sizeof(*c));
	struct io_uring ring;
	int i;

	if (!c || io_uring_queue_init(8, &ring, 0) || register_one(&ring, r->mem, RACE_LEN)) {
		r->bad = -1;
		return NULL;
	}
	for (i = 0; i < RACE_COPIES; i++)
		c[i] = fcopy(FIXED, (__u64)i * PAGE + 100, FIXED, (__u64)i * PAGE + 7, 65536);
	while (!r->stop) {
		struct cqe_out out;

		if (submit_fixed(&ring, r->fd, r->q, c, RACE_COPIES, 0, r->mem, 0, 1) ||
		    cqe_next(&ring, false, SOON_MS, &out))
			break;
		r->sqes++;
		/* E2BIG: more pairs than the ring holds; the rest: the device went. */
		if (out.res != -E2BIG && out.res != -ENOSPC && out.res != -ENODEV &&
		    out.res != -ECANCELED) {
			r->bad++;
			r->last_bad = out.res;
		}
		if (out.res == -ENODEV || out.res == -ECANCELED)
			usleep(1000);
	}
	io_uring_queue_exit(&ring);
	free(c);
	return NULL;
}

/*
 * Two threads issue SQEs whose 32 MiB ranges (8192 pages, not physically contiguous) the driver
 * maps and lets go of, while the device is unbound and bound again 6 times. Every CQE is one of
 * the expected errors, and no mapping of a range outlives the binding (DMA-API debugging would
 * report the driver's mappings pending at unbind: the gate fails on it).
 */
FIXTURE(unbind) {
	int unused;
};

FIXTURE_SETUP(unbind)
{
}

FIXTURE_TEARDOWN(unbind)
{
}

TEST_F_TIMEOUT(unbind, while_mapping, 120)
{
	char bdf[64];
	int round, fd;

	ASSERT_EQ(0, udma_bdf(bdf, sizeof(bdf)));
	for (round = 0; round < 6; round++) {
		struct racer r[2] = { 0 };
		pthread_t t[2];
		int i;

		fd = udma_open_wait();
		ASSERT_LE(0, fd);
		for (i = 0; i < 2; i++) {
			r[i].fd = fd;
			r[i].q = 5 + i;
			r[i].mem = mmap(NULL, RACE_LEN, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			ASSERT_NE(MAP_FAILED, r[i].mem);
			/* Small pages touched backwards: many runs, a long mapping. */
			madvise(r[i].mem, RACE_LEN, MADV_NOHUGEPAGE);
			for (long o = RACE_LEN - PAGE; o >= 0; o -= PAGE)
				r[i].mem[o] = 1;
			ASSERT_EQ(0, queue_init(fd, ENG, r[i].q, 64, 64));
			ASSERT_EQ(0, pthread_create(&t[i], NULL, race_thread, &r[i]));
		}
		usleep(300000 + round * 37000);
		ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/unbind", bdf));
		usleep(200000);
		for (i = 0; i < 2; i++) {
			r[i].stop = 1;
			pthread_join(t[i], NULL);
			EXPECT_EQ(0, r[i].bad) {
				TH_LOG("round %d thread %d: %ld SQEs, %ld unexpected (last %s)", round,
				       i, r[i].sqes, r[i].bad, err_name(r[i].last_bad));
			}
			munmap(r[i].mem, RACE_LEN);
		}
		close(fd);
		ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/bind", bdf));
	}
	/* Bound again for the tests after this one. */
	fd = udma_open_wait();
	ASSERT_LE(0, fd);
	close(fd);
}

TEST_HARNESS_MAIN
