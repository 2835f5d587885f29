// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * fence_copy: the ABI 3 path of neuron_udma, from open() to the last byte checked, with nothing
 * but <linux/neuron_udma.h> (include/uapi/) and libc.
 *
 *   1. open the device node and ask INFO (ABI 3 or newer; the engines that reach host memory);
 *   2. MEM_ALLOC a host source and destination (mmap'ed) and a device (HBM) buffer;
 *   3. QUEUE_INIT a queue on the first engine that reaches host memory;
 *   4. COPY_PREPARE the copies host -> HBM, then HBM -> host (the first of those with a DMB
 *      barrier: it waits for the writes to HBM before it reads HBM; the last with a WRITE
 *      barrier, as the driver's own submissions end);
 *   5. COPY_SUBMIT: ring the doorbells and get the fence, without waiting;
 *   6. poll() on the device file until it is readable, QUEUE_EVENTS to read what completed
 *      (EPOLLPRI / EPOLLERR and a FAILED event say a fence failed);
 *   7. FENCE_STATUS of the fence: DONE;
 *   8. compare the destination with the source; QUEUE_RELEASE, MEM_FREE, close.
 *
 * usage: fence_copy [DEVICE] [SIZE]   (default /dev/neuron_udma0, 1 MiB; SIZE in bytes, a multiple
 *                                      of 4096 up to 4 MiB: the copies of one fence fill one batch)
 * Prints one line per step and `fence_copy: OK: ...` at the end (exit 0); any failure prints
 * `fence_copy: FAILED: <what>: <errno name and text>` and exits 1.
 *
 * Build it statically (the guest of scripts/vm-run is busybox, without a C library):
 *   gcc -O2 -Wall -static -I include/uapi -o fence_copy examples/fence_copy.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/neuron_udma.h>

#define QUEUE 1			/* queue 1 is free for users on the first host engine of every model */
#define RING_DESCS 256		/* descriptors per ring (a power of two, 32 .. 2^23) */
#define POLL_TIMEOUT_MS 10000	/* the longest poll() waits for the fence's event */

static const char *dev_path = "/dev/neuron_udma0";

/* Prints `fence_copy: FAILED: <what>: <errno>` and exits 1. Call it right after the failing call. */
static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
	int err = errno;
	va_list ap;

	fprintf(stderr, "fence_copy: FAILED: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (err)
		fprintf(stderr, ": %s (%s)", strerrorname_np(err) ?: "?", strerror(err));
	fprintf(stderr, "\n");
	exit(1);
}

/* A failure that is not a system call's: no errno. */
#define fail(...) do { errno = 0; die(__VA_ARGS__); } while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* MEM_ALLOC of @size bytes of @type; returns the handle, and the mmap offset in @mmap_offset. */
static __u64 mem_alloc(int fd, __u32 type, __u64 size, __u64 *mmap_offset)
{
	struct neuron_udma_mem_alloc a = { .size = size, .type = type };

	if (ioctl(fd, NEURON_UDMA_MEM_ALLOC, &a))
		die("MEM_ALLOC of %" PRIu64 " bytes of %s memory", (uint64_t)size,
		    type == NEURON_UDMA_MEM_HOST ? "host" : "device");
	if (mmap_offset)
		*mmap_offset = a.mmap_offset;
	return a.handle;
}

static void *map(int fd, __u64 size, __u64 mmap_offset)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, mmap_offset);

	if (p == MAP_FAILED)
		die("mmap of a host buffer (%" PRIu64 " bytes at offset 0x%" PRIx64 ")",
		    (uint64_t)size, (uint64_t)mmap_offset);
	return p;
}

static void mem_free(int fd, __u64 handle)
{
	struct neuron_udma_mem_free f = { .handle = handle };

	if (ioctl(fd, NEURON_UDMA_MEM_FREE, &f))
		die("MEM_FREE of handle %" PRIu64, (uint64_t)handle);
}

/* The first engine whose bit is set in INFO's host_engines (user queues need host memory). */
static int first_host_engine(const struct neuron_udma_info *info)
{
	for (__u32 e = 0; e < info->engines && e < 64 * 3; e++)
		if (info->host_engines[e / 64] >> (e % 64) & 1)
			return e;
	return -1;
}

int main(int argc, char **argv)
{
	__u64 size = 1 << 20;

	if (argc > 1)
		dev_path = argv[1];
	if (argc > 2) {
		char *end;

		size = strtoull(argv[2], &end, 0);
		if (*end || size == 0 || size % 4096 || size > (4 << 20))
			fail("SIZE %s: give a multiple of 4096 up to 4 MiB", argv[2]);
	}
	if (argc > 3)
		fail("usage: fence_copy [DEVICE] [SIZE]");

	/* 1. The device and what it offers. */
	int fd = open(dev_path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		die("open %s (is the neuron_udma module loaded and a device bound?)", dev_path);
	struct neuron_udma_info info = { 0 };

	if (ioctl(fd, NEURON_UDMA_INFO, &info))
		die("INFO on %s (a driver older than ABI 3 answers ENOTTY: this INFO is the ABI 3 size)",
		    dev_path);
	if (info.abi_version < 3)
		fail("%s speaks ABI %u; fences need ABI 3", dev_path, info.abi_version);
	int engine = first_host_engine(&info);

	if (engine < 0)
		fail("no engine of %s reaches host memory (INFO host_engines is empty)", dev_path);
	if (info.device_mem_size < size)
		fail("%s has %" PRIu64 " bytes of device memory, %" PRIu64 " needed",
		     dev_path, (uint64_t)info.device_mem_size, (uint64_t)size);
	__u32 chunk = info.max_copy_size;	/* one copy (descriptor pair) moves at most this */

	if (chunk == 0)
		fail("%s reports max_copy_size 0", dev_path);
	__u32 ncopies = 2 * ((size + chunk - 1) / chunk);

	if (ncopies > info.max_batch || ncopies + 1 + info.ring_reserve_descs > RING_DESCS)
		fail("%u copies do not fit one batch (max_batch %u) or a %u-slot ring: use a smaller SIZE",
		     ncopies, info.max_batch, RING_DESCS);
	printf("device %s: ABI %u, %04x:%04x, %u engines, %" PRIu64 " MiB of device memory; "
	       "queue %d/%d\n", dev_path, info.abi_version, info.vendor_id, info.device_id,
	       info.engines, (uint64_t)(info.device_mem_size >> 20), engine, QUEUE);

	/* 2. Buffers: host memory is mmap'ed at the offset MEM_ALLOC returns. */
	__u64 src_off, dst_off;
	__u64 src = mem_alloc(fd, NEURON_UDMA_MEM_HOST, size, &src_off);
	__u64 dst = mem_alloc(fd, NEURON_UDMA_MEM_HOST, size, &dst_off);
	__u64 hbm = mem_alloc(fd, NEURON_UDMA_MEM_DEVICE, size, NULL);
	unsigned char *s = map(fd, size, src_off);
	unsigned char *d = map(fd, size, dst_off);

	for (__u64 i = 0; i < size; i++)
		s[i] = (unsigned char)(i * 7 + (i >> 12) + 1);
	memset(d, 0, size);

	/* 3. A queue: Tx (source) and Rx (destination) rings of RING_DESCS descriptors. */
	struct neuron_udma_queue_init qi = {
		.engine = engine, .queue = QUEUE, .tx_descs = RING_DESCS, .rx_descs = RING_DESCS,
	};

	if (ioctl(fd, NEURON_UDMA_QUEUE_INIT, &qi))
		die("QUEUE_INIT %d/%d (EBUSY: another file holds it)", engine, QUEUE);

	/* 4. The copies, prepared in one batch: host -> HBM, then HBM -> host. */
	struct neuron_udma_copy *copies = calloc(ncopies, sizeof(*copies));

	if (!copies)
		die("calloc of %u copies", ncopies);
	__u32 n = 0;

	for (int leg = 0; leg < 2; leg++) {
		for (__u64 off = 0; off < size; off += chunk) {
			struct neuron_udma_copy *c = &copies[n++];

			c->src_handle = leg == 0 ? src : hbm;
			c->dst_handle = leg == 0 ? hbm : dst;
			c->src_offset = c->dst_offset = off;
			c->size = size - off < chunk ? size - off : chunk;
			/* The engine may run a queue's copies overlapped: the first read of HBM waits
			 * for every earlier transfer of the queue (all the writes to HBM). No barrier
			 * is needed at the end: the fence's completion marker, which the driver
			 * appends, waits for every transfer before it (a DMB of its own). */
			if (leg == 1 && off == 0)
				c->barrier = NEURON_UDMA_BARRIER_DMB;
		}
	}
	struct neuron_udma_copy_prepare prep = {
		.engine = engine, .queue = QUEUE, .count = n, .copies = (__u64)(uintptr_t)copies,
	};

	if (ioctl(fd, NEURON_UDMA_COPY_PREPARE, &prep) < 0)
		die("COPY_PREPARE of %u copies", n);

	/* 5. Submit: the doorbells and a completion marker; the fence comes back at once. */
	struct neuron_udma_copy_submit sub = { .engine = engine, .queue = QUEUE };
	double t0 = now_s();

	if (ioctl(fd, NEURON_UDMA_COPY_SUBMIT, &sub))
		die("COPY_SUBMIT on %d/%d", engine, QUEUE);
	printf("submitted %u copies (%" PRIu64 " KiB each way): fence %" PRIu64 "\n", n,
	       (uint64_t)(size >> 10), (uint64_t)sub.fence);

	/* 6. Wait for its event: poll() the device file, then read the events. */
	__u64 completed = 0;
	int wakeups = 0;

	while (completed < sub.fence) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN | POLLPRI };
		int r = poll(&pfd, 1, POLL_TIMEOUT_MS);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("poll on %s", dev_path);
		if (r == 0)
			fail("no event for fence %" PRIu64 " within %d ms", (uint64_t)sub.fence,
			     POLL_TIMEOUT_MS);
		wakeups++;
		struct neuron_udma_queue_event ev[8];
		struct neuron_udma_events evs = { .events = (__u64)(uintptr_t)ev, .max = 8 };

		if (ioctl(fd, NEURON_UDMA_QUEUE_EVENTS, &evs))
			die("QUEUE_EVENTS");
		for (__u32 i = 0; i < evs.count; i++) {
			if (ev[i].engine != (__u32)engine || ev[i].queue != QUEUE)
				continue;
			if (ev[i].flags & NEURON_UDMA_EVENT_FAILED) {
				errno = ev[i].error;
				die("queue %d/%d: fence %" PRIu64 " failed", engine, QUEUE,
				    (uint64_t)ev[i].failed);
			}
			if (ev[i].flags & NEURON_UDMA_EVENT_COMPLETED)
				completed = ev[i].completed;
		}
	}
	double secs = now_s() - t0;

	printf("event: fences up to %" PRIu64 " completed (%d wakeup%s of poll())\n",
	       (uint64_t)completed, wakeups, wakeups == 1 ? "" : "s");

	/* 7. The fence itself, without blocking. */
	struct neuron_udma_fence_status st = { .engine = engine, .queue = QUEUE, .fence = sub.fence };

	if (ioctl(fd, NEURON_UDMA_FENCE_STATUS, &st))
		die("FENCE_STATUS of fence %" PRIu64, (uint64_t)sub.fence);
	if (st.state != NEURON_UDMA_FENCE_DONE) {
		errno = st.state == NEURON_UDMA_FENCE_FAILED ? st.error : 0;
		die("FENCE_STATUS of fence %" PRIu64 ": state %u, not DONE", (uint64_t)sub.fence,
		    st.state);
	}
	printf("FENCE_STATUS: fence %" PRIu64 " DONE (queue: %" PRIu64 " completed, %" PRIu64
	       " submitted)\n", (uint64_t)st.fence, (uint64_t)st.completed, (uint64_t)st.submitted);

	/* 8. The bytes, then everything given back (close alone would free it all too). */
	for (__u64 i = 0; i < size; i++)
		if (d[i] != s[i])
			fail("byte %" PRIu64 " of the destination is 0x%02x, the source's 0x%02x",
			     (uint64_t)i, d[i], s[i]);
	struct neuron_udma_queue_id qid = { .engine = engine, .queue = QUEUE };

	if (ioctl(fd, NEURON_UDMA_QUEUE_RELEASE, &qid))
		die("QUEUE_RELEASE %d/%d", engine, QUEUE);
	if (munmap(s, size) || munmap(d, size))
		die("munmap");
	mem_free(fd, src);
	mem_free(fd, dst);
	mem_free(fd, hbm);
	free(copies);
	if (close(fd))
		die("close %s", dev_path);
	printf("fence_copy: OK: %" PRIu64 " KiB host -> HBM -> host in one fence on queue %d/%d, "
	       "every byte verified, %.1f ms from submit to event\n", (uint64_t)(size >> 10), engine,
	       QUEUE, secs * 1e3);
	return 0;
}
