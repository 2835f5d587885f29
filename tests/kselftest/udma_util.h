/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers of the neuron_udma ABI kselftests: thin ioctl wrappers that return 0 or -errno,
 * buffers, queue-state snapshots and the device model's BAR2 fault-injection window.
 */
#ifndef _UDMA_UTIL_H
#define _UDMA_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/neuron_udma.h>

/* Descriptor bits (neuron-udma.rst, hardware.rst §4.2/4.3): len_ctrl (word 0), meta_ctrl. */
#define DESC_LEN_MASK		0xFFFFU
#define DESC_RING_ID(w0)	(((w0) >> 24) & 3U)
#define DESC_FIRST		(1U << 26)
#define DESC_LAST		(1U << 27)
#define DESC_INT_EN		(1U << 28)
#define DESC_DMB		(1U << 30)
#define META_WRITE_BARRIER	(1U << 26)

#define UDMA_DEV "/dev/neuron_udma0"
#define UDMA_DRV_DIR "/sys/bus/pci/drivers/neuron_udma"
#define UDMA_MAX_COPY 65536U

/* BAR2 window of the device model (Documentation/udma-sim.rst). */
#define BAR2_MAGIC		0x000
#define BAR2_MAGIC_VALUE	0x55444D41
#define BAR2_FAULT_KIND		0x010
#define BAR2_FAULT_ENGINE	0x014
#define BAR2_FAULT_QUEUE	0x018
#define BAR2_FAULT_ARG		0x01C
#define BAR2_FAULT_COMMIT	0x020
#define BAR2_ERRORS		0x050
#define BAR2_LAST_ERROR		0x054
#define BAR2_LAST_ENGINE	0x058
#define BAR2_LAST_QUEUE		0x05C
#define BAR2_CLEAR		0x060

#define FAULT_FAIL_NTH	1
#define FAULT_ABORT	2
#define FAULT_STALL	3
#define FAULT_SLOW	4
#define ERR_INJECTED_FAIL 14U

#define PCI_DEVS_DIR "/sys/bus/pci/devices"

/* PCI attribute @attr (a hex number in sysfs, e.g. "vendor") of device @bdf, or ~0UL. */
static inline unsigned long pci_attr_hex(const char *bdf, const char *attr)
{
	char path[512], buf[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/%s", bdf, attr);
	f = fopen(path, "re");
	if (!f)
		return ~0UL;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return strtoul(buf, NULL, 16);
}

static inline int udma_ioc(int fd, unsigned long req, void *arg)
{
	return ioctl(fd, req, arg) ? -errno : 0;
}

static inline int udma_open(void)
{
	return open(UDMA_DEV, O_RDWR | O_CLOEXEC);
}

/* udma_open(), retried every 100 ms for up to 10 s: the node of a device just (re)bound. */
static inline int udma_open_wait(void)
{
	for (int i = 0; i < 100; i++) {
		int fd = udma_open();

		if (fd >= 0)
			return fd;
		usleep(100000);
	}
	return -ENOENT;
}

static inline int udma_info(int fd, struct neuron_udma_info *info)
{
	memset(info, 0, sizeof(*info));
	return udma_ioc(fd, NEURON_UDMA_INFO, info);
}

/* A buffer of a file: handle, size and (host buffers) the mapping. */
struct ubuf {
	__u64 handle;
	__u64 size;
	__u64 mmap_offset;
	unsigned char *map;
};

static inline int ubuf_alloc(int fd, __u32 type, __u64 size, struct ubuf *b)
{
	struct neuron_udma_mem_alloc a = { .size = size, .type = type };
	int ret;

	memset(b, 0, sizeof(*b));
	ret = udma_ioc(fd, NEURON_UDMA_MEM_ALLOC, &a);
	if (ret)
		return ret;
	b->handle = a.handle;
	b->size = size;
	b->mmap_offset = a.mmap_offset;
	if (type != NEURON_UDMA_MEM_HOST)
		return 0;
	b->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, a.mmap_offset);
	if (b->map == MAP_FAILED) {
		ret = -errno;
		b->map = NULL;
		return ret;
	}
	return 0;
}

static inline int ubuf_host(int fd, __u64 size, struct ubuf *b)
{
	return ubuf_alloc(fd, NEURON_UDMA_MEM_HOST, size, b);
}

static inline int ubuf_dev(int fd, __u64 size, struct ubuf *b)
{
	return ubuf_alloc(fd, NEURON_UDMA_MEM_DEVICE, size, b);
}

static inline int mem_free(int fd, __u64 handle)
{
	struct neuron_udma_mem_free f = { .handle = handle };

	return udma_ioc(fd, NEURON_UDMA_MEM_FREE, &f);
}

static inline int ubuf_free(int fd, struct ubuf *b)
{
	if (b->map)
		munmap(b->map, b->size);
	b->map = NULL;
	return b->handle ? mem_free(fd, b->handle) : 0;
}

static inline int queue_init(int fd, __u32 eng, __u32 q, __u32 tx, __u32 rx)
{
	struct neuron_udma_queue_init i = { .engine = eng, .queue = q, .tx_descs = tx, .rx_descs = rx };

	return udma_ioc(fd, NEURON_UDMA_QUEUE_INIT, &i);
}

static inline int queue_release(int fd, __u32 eng, __u32 q)
{
	struct neuron_udma_queue_id id = { .engine = eng, .queue = q };

	return udma_ioc(fd, NEURON_UDMA_QUEUE_RELEASE, &id);
}

static inline struct neuron_udma_copy ucopy(const struct ubuf *src, __u64 src_off,
					    const struct ubuf *dst, __u64 dst_off, __u32 size)
{
	struct neuron_udma_copy c = {
		.src_handle = src->handle,
		.src_offset = src_off,
		.dst_handle = dst->handle,
		.dst_offset = dst_off,
		.size = size,
	};

	return c;
}

/*
 * @c with DMB: it waits for every earlier transfer of its queue. A copy that reads device memory
 * an earlier copy of the same queue wrote (since the queue's last fence) needs it: without DMB
 * it may read the bytes from before that write (hardware.rst §4.2 bit 30; udma-sim
 * --unordered-device-reads).
 */
static inline struct neuron_udma_copy after_dmb(struct neuron_udma_copy c)
{
	c.barrier = NEURON_UDMA_BARRIER_DMB;
	return c;
}

static inline int prep_one(int fd, __u32 eng, __u32 q, struct neuron_udma_copy c)
{
	struct neuron_udma_copy_prepare_one p = { .engine = eng, .queue = q, .copy = c };

	return udma_ioc(fd, NEURON_UDMA_COPY_PREPARE_ONE, &p);
}

static inline int prep(int fd, __u32 eng, __u32 q, const struct neuron_udma_copy *c, __u32 n)
{
	struct neuron_udma_copy_prepare p = {
		.engine = eng, .queue = q, .count = n, .copies = (uintptr_t)c,
	};

	return udma_ioc(fd, NEURON_UDMA_COPY_PREPARE, &p);
}

static inline int copy_start(int fd, __u32 eng, __u32 q, __u32 m2s, __u32 s2m)
{
	struct neuron_udma_copy_start s = { .engine = eng, .queue = q, .m2s_count = m2s, .s2m_count = s2m };

	return udma_ioc(fd, NEURON_UDMA_COPY_START, &s);
}

static inline int copy_wait(int fd, __u32 eng, __u32 q, __u32 timeout_ms, __u64 *completed)
{
	struct neuron_udma_copy_wait w = { .engine = eng, .queue = q, .timeout_ms = timeout_ms };
	int ret = udma_ioc(fd, NEURON_UDMA_COPY_WAIT, &w);

	if (completed)
		*completed = w.completed;
	return ret;
}

static inline int queue_state(int fd, __u32 eng, __u32 q, struct neuron_udma_queue_state *st)
{
	memset(st, 0, sizeof(*st));
	st->engine = eng;
	st->queue = q;
	return udma_ioc(fd, NEURON_UDMA_QUEUE_STATE, st);
}

static inline int udma_memcpy(int fd, const struct ubuf *src, __u64 src_off, const struct ubuf *dst,
			      __u64 dst_off, __u64 size, __u32 timeout_ms)
{
	struct neuron_udma_memcpy m = {
		.src_handle = src->handle,
		.src_offset = src_off,
		.dst_handle = dst->handle,
		.dst_offset = dst_off,
		.size = size,
		.timeout_ms = timeout_ms,
	};

	return udma_ioc(fd, NEURON_UDMA_MEMCPY, &m);
}

/* One copy, waited for. */
static inline int copy_sync(int fd, __u32 eng, __u32 q, struct neuron_udma_copy c)
{
	int ret = prep_one(fd, eng, q, c);

	return ret ? ret : copy_wait(fd, eng, q, 0, NULL);
}

/* Deterministic pseudo-random bytes (xorshift32), different for each seed. */
static inline void fill_pattern(void *buf, size_t len, __u32 seed)
{
	unsigned char *p = buf;
	__u32 x = seed * 2654435761U + 0x9E3779B9U;
	size_t i;

	if (!x)
		x = 1;
	for (i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = x >> 24;
	}
}

/* Index of the first differing byte, or -1 if equal. */
static inline long first_diff(const void *a, const void *b, size_t len)
{
	const unsigned char *x = a, *y = b;
	size_t i;

	for (i = 0; i < len; i++)
		if (x[i] != y[i])
			return (long)i;
	return -1;
}

#define RING_INDEX(reg) ((reg) & 0xFFFFFFU)
#define RING_ID(reg) ((reg) >> 30)

/*
 * Compares what an error must not change: sw_next, sw_ack, sw_pending, sw_available and hw_tail
 * of both rings. Returns 0 if equal, else 1 with a description in @why.
 */
static inline int state_diff(const struct neuron_udma_queue_state *a,
			     const struct neuron_udma_queue_state *b, char *why, size_t len)
{
	const struct neuron_udma_ring_state *ra[2] = { &a->tx, &a->rx }, *rb[2] = { &b->tx, &b->rx };
	int i;

	for (i = 0; i < 2; i++) {
		if (ra[i]->sw_next != rb[i]->sw_next || ra[i]->sw_ack != rb[i]->sw_ack ||
		    ra[i]->sw_pending != rb[i]->sw_pending || ra[i]->sw_available != rb[i]->sw_available ||
		    ra[i]->hw_tail != rb[i]->hw_tail) {
			snprintf(why, len,
				 "%s ring changed: next %u->%u ack %u->%u pending %u->%u avail %u->%u tail %#x->%#x",
				 i ? "rx" : "tx", ra[i]->sw_next, rb[i]->sw_next, ra[i]->sw_ack, rb[i]->sw_ack,
				 ra[i]->sw_pending, rb[i]->sw_pending, ra[i]->sw_available,
				 rb[i]->sw_available, ra[i]->hw_tail, rb[i]->hw_tail);
			return 1;
		}
	}
	if (a->resets != b->resets) {
		snprintf(why, len, "resets %u->%u", a->resets, b->resets);
		return 1;
	}
	return 0;
}

/* Counter @name of the device @bdf's sysfs group (neuron_udma/), or -1 if it cannot be read. */
static inline long long udma_counter(const char *bdf, const char *name)
{
	char path[256], buf[64] = "";
	FILE *f;

	snprintf(path, sizeof(path), PCI_DEVS_DIR "/%s/neuron_udma/%s", bdf, name);
	f = fopen(path, "re");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return buf[0] ? strtoll(buf, NULL, 10) : -1;
}

/* Writes @val to the sysfs attribute @path (bind, unbind, ...): 0 or -errno. */
static inline int sysfs_write(const char *path, const char *val)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = write(fd, val, strlen(val));
	close(fd);
	return n == (ssize_t)strlen(val) ? 0 : -errno;
}

/* The PCI address (0000:bb:dd.f) of the first device bound to neuron_udma. */
static inline int udma_bdf(char *bdf, size_t len)
{
	glob_t g;
	int ret = -ENOENT;

	if (glob(UDMA_DRV_DIR "/0000:*", 0, NULL, &g))
		return -ENOENT;
	if (g.gl_pathc >= 1) {
		snprintf(bdf, len, "%s", strrchr(g.gl_pathv[0], '/') + 1);
		ret = 0;
	}
	globfree(&g);
	return ret;
}

/* Seconds on the monotonic clock. */
static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Calls @fn(tid, arg) for each io-wq worker of this process: the threads named iou-wrk-<tid>,
 * io_uring's async workers, created when an SQE is first punted to them (its issue returned
 * -EAGAIN); the last one of a ring stays while the ring is open. The number of workers, or -1
 * if /proc/self/task cannot be read or @fn returned non-zero.
 */
static inline int iou_each_worker(int (*fn)(const char *tid, void *arg), void *arg)
{
	char path[300], comm[32];
	struct dirent *e;
	int n = 0;
	DIR *d;

	d = opendir("/proc/self/task");
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		FILE *f;
		bool worker;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		worker = fgets(comm, sizeof(comm), f) && !strncmp(comm, "iou-wrk-", 8);
		fclose(f);
		if (!worker)
			continue;
		n++;
		if (fn && fn(e->d_name, arg)) {
			n = -1;
			break;
		}
	}
	closedir(d);
	return n;
}

/* The io-wq workers of this process (iou_each_worker()), or -1. */
static inline int iou_workers(void)
{
	return iou_each_worker(NULL, NULL);
}

/* Adds worker @tid's context switches to *@arg; non-zero if it is running or unreadable. */
static inline int iou_add_switches(const char *tid, void *arg)
{
	char path[300], line[128];
	long long v, *sum = arg;
	int ret = 1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
	f = fopen(path, "re");
	if (!f)
		return 1;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "State:", 6) && strchr(line, 'R'))
			break;
		if (sscanf(line, "voluntary_ctxt_switches: %lld", &v) == 1 ||
		    sscanf(line, "nonvoluntary_ctxt_switches: %lld", &v) == 1) {
			*sum += v;
			ret = 0;
		}
	}
	fclose(f);
	return ret;
}

/*
 * The context switches of this process's io-wq workers added up, or -1 if one is running
 * (state R) or cannot be read. Two equal readings mean that no worker ran in between: one that
 * ran is still running, or it went to sleep again, which counts a switch.
 */
static inline long long iou_worker_switches(void)
{
	long long sum = 0;

	return iou_each_worker(iou_add_switches, &sum) < 0 ? -1 : sum;
}

/* The kernel log (root: SYSLOG_ACTION_READ_ALL) as a string to free(), or NULL if unreadable. */
static inline char *klog_read(void)
{
	int len = klogctl(10, NULL, 0), n;
	char *buf;

	if (len <= 0)
		return NULL;
	buf = malloc(len + 1);
	if (!buf)
		return NULL;
	n = klogctl(3, buf, len);
	if (n < 0) {
		free(buf);
		return NULL;
	}
	buf[n] = 0;
	return buf;
}

/* Whether the kernel log holds @needle: 1 or 0, -1 if it cannot be read. */
static inline int klog_has(const char *needle)
{
	char *buf = klog_read();
	int found;

	if (!buf)
		return -1;
	found = strstr(buf, needle) != NULL;
	free(buf);
	return found;
}

/* DMABUF_EXPORT of buffer @handle (@flags: O_CLOEXEC or 0): the dma-buf descriptor, or -errno. */
static inline int db_export(int fd, __u64 handle, __u32 flags)
{
	struct neuron_udma_dmabuf_export e = { .handle = handle, .flags = flags, .fd = -1 };
	int ret = udma_ioc(fd, NEURON_UDMA_DMABUF_EXPORT, &e);

	return ret ? ret : e.fd;
}

/* The model's BAR2 control window, mapped through sysfs. */
struct ubar2 {
	int fd;
	volatile __u32 *regs;
};

static inline int bar2_open(struct ubar2 *b)
{
	char bdf[64], path[128];
	void *p;
	int ret;

	b->fd = -1;
	b->regs = NULL;
	ret = udma_bdf(bdf, sizeof(bdf));
	if (ret)
		return ret;
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource2", bdf);
	b->fd = open(path, O_RDWR | O_SYNC | O_CLOEXEC);
	if (b->fd < 0)
		return -errno;
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
	if (p == MAP_FAILED) {
		ret = -errno;
		close(b->fd);
		b->fd = -1;
		return ret;
	}
	b->regs = p;
	return b->regs[BAR2_MAGIC / 4] == BAR2_MAGIC_VALUE ? 0 : -EPROTO;
}

static inline void bar2_close(struct ubar2 *b)
{
	if (b->regs)
		munmap((void *)b->regs, 4096);
	if (b->fd >= 0)
		close(b->fd);
	b->regs = NULL;
	b->fd = -1;
}

static inline __u32 bar2_read(struct ubar2 *b, __u32 off)
{
	return b->regs[off / 4];
}

static inline void bar2_write(struct ubar2 *b, __u32 off, __u32 val)
{
	b->regs[off / 4] = val;
}

/* Clears the model's faults and counters, stages and commits a fault: 0 applied, 1 rejected. */
static inline int bar2_fault(struct ubar2 *b, __u32 kind, __u32 eng, __u32 q, __u32 arg)
{
	bar2_write(b, BAR2_CLEAR, 1);
	bar2_write(b, BAR2_FAULT_KIND, kind);
	bar2_write(b, BAR2_FAULT_ENGINE, eng);
	bar2_write(b, BAR2_FAULT_QUEUE, q);
	bar2_write(b, BAR2_FAULT_ARG, arg);
	bar2_write(b, BAR2_FAULT_COMMIT, 1);
	return (int)bar2_read(b, BAR2_FAULT_COMMIT);
}

/* One ring slot as the driver's debugfs `rings` file shows it: the 16 raw bytes, decoded. */
struct uslot {
	__u32 len_ctrl;		/* word 0 */
	__u32 word1;		/* Tx: meta_ctrl; Rx: 0 */
	__u64 addr;
};

/*
 * The first line of queue (@eng, @q)'s section of the driver's debugfs file @file
 * (/sys/kernel/debug/neuron_udma/<bdf>/@file: a section per queue, from its "engine E queue Q
 * owner ..." header to the next) that, leading blanks left out, is @want and a blank: what
 * follows into @rest. 0, -ENOENT (no device, queue or line), or the -errno of the open.
 */
static inline int debugfs_queue_line(const char *file, __u32 eng, __u32 q, const char *want,
				     char *rest, size_t len)
{
	char bdf[64], path[160], head[64], line[512];
	bool in_queue = false;
	int ret = -ENOENT;
	FILE *f;

	if (udma_bdf(bdf, sizeof(bdf)))
		return -ENOENT;
	snprintf(path, sizeof(path), "/sys/kernel/debug/neuron_udma/%s/%s", bdf, file);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	snprintf(head, sizeof(head), "engine %u queue %u owner ", eng, q);
	while (fgets(line, sizeof(line), f)) {
		const char *p = line;

		if (!strncmp(line, "engine ", 7)) {
			in_queue = !strncmp(line, head, strlen(head));
			continue;
		}
		while (*p == ' ')
			p++;
		if (!in_queue || strncmp(p, want, strlen(want)) || p[strlen(want)] != ' ')
			continue;
		snprintf(rest, len, "%s", p + strlen(want));
		ret = 0;
		break;
	}
	fclose(f);
	return ret;
}

/*
 * Reads slot @idx of the Tx (@tx) or Rx ring of (@eng, @q) from
 * /sys/kernel/debug/neuron_udma/<bdf>/rings. The file shows, per ring, the last 8 completed
 * slots and the outstanding ones. Returns 0, -ENOENT (queue or slot not shown) or -errno.
 */
static inline int ring_slot(__u32 eng, __u32 q, bool tx, __u32 idx, struct uslot *out)
{
	char want[32], rest[512];
	unsigned int b[16];
	int i, ret;

	snprintf(want, sizeof(want), "%s[%u]", tx ? "tx" : "rx", idx);
	ret = debugfs_queue_line("rings", eng, q, want, rest, sizeof(rest));
	if (ret)
		return ret;
	if (sscanf(rest, "%x %x %x %x %x %x %x %x %x %x %x %x %x %x %x %x",
		   &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9],
		   &b[10], &b[11], &b[12], &b[13], &b[14], &b[15]) != 16)
		return -EPROTO;
	out->len_ctrl = b[0] | b[1] << 8 | b[2] << 16 | (__u32)b[3] << 24;
	out->word1 = b[4] | b[5] << 8 | b[6] << 16 | (__u32)b[7] << 24;
	out->addr = 0;
	for (i = 15; i >= 8; i--)
		out->addr = out->addr << 8 | b[i];
	return 0;
}

static sigjmp_buf udma_fault_jmp;
static volatile sig_atomic_t udma_fault_sig;

static void udma_fault_handler(int sig)
{
	udma_fault_sig = sig;
	siglongjmp(udma_fault_jmp, 1);
}

/*
 * Reads (or, with @write, writes) the byte at @p and returns the signal that access raised
 * (SIGBUS, SIGSEGV) or 0 if it worked.
 */
static inline int touch_signal(volatile unsigned char *p, bool write)
{
	struct sigaction sa = { .sa_handler = udma_fault_handler }, old_bus, old_segv;
	int sig;

	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &old_bus);
	sigaction(SIGSEGV, &sa, &old_segv);
	udma_fault_sig = 0;
	if (!sigsetjmp(udma_fault_jmp, 1)) {
		if (write)
			*p = 0xA5;
		else
			(void)*p;
	}
	sig = udma_fault_sig;
	sigaction(SIGBUS, &old_bus, NULL);
	sigaction(SIGSEGV, &old_segv, NULL);
	return sig;
}

/* ---- imported user memory (MEM_IMPORT, ABI 2) ---- */

/* MEM_IMPORT of [@addr, @addr + @size): 0 (handle and runs in *@h, *@segs if given) or -errno. */
static inline int udma_import(int fd, const void *addr, __u64 size, __u32 flags, __u64 *h,
			      __u32 *segs)
{
	struct neuron_udma_mem_import m = { .addr = (uintptr_t)addr, .size = size, .flags = flags };
	int ret = udma_ioc(fd, NEURON_UDMA_MEM_IMPORT, &m);

	if (!ret) {
		if (h)
			*h = m.handle;
		if (segs)
			*segs = m.segments;
	}
	return ret;
}

/* A buffer handle for ucopy()/udma_memcpy(): an import has no mapping of the driver's. */
static inline struct ubuf import_ubuf(__u64 handle, __u64 size)
{
	struct ubuf b = { .handle = handle, .size = size };

	return b;
}

/* DMABUF_IMPORT: 0 and the handle (and size, runs if asked), or -errno. */
static inline int db_import(int fd, int dbfd, __u32 flags, struct ubuf *b, __u32 *segs)
{
	struct neuron_udma_dmabuf_import a = { .fd = dbfd, .flags = flags };
	int ret = udma_ioc(fd, NEURON_UDMA_DMABUF_IMPORT, &a);

	if (!ret) {
		*b = import_ubuf(a.handle, a.size);
		if (segs)
			*segs = a.segments;
	}
	return ret;
}

/*
 * COPY_PREPARE_ONE keeping the ioctl's return value (udma_ioc() would map it to -errno): the
 * pairs written with NEURON_UDMA_COPY_SPLIT (else 0), or -errno.
 */
static inline int prep_one_pairs(int fd, __u32 eng, __u32 q, struct neuron_udma_copy c)
{
	struct neuron_udma_copy_prepare_one p = { .engine = eng, .queue = q, .copy = c };
	int ret = ioctl(fd, NEURON_UDMA_COPY_PREPARE_ONE, &p);

	return ret < 0 ? -errno : ret;
}

/* COPY_PREPARE keeping the ioctl's return value, as prep_one_pairs(). */
static inline int prep_pairs(int fd, __u32 eng, __u32 q, const struct neuron_udma_copy *c,
			     __u32 n)
{
	struct neuron_udma_copy_prepare p = {
		.engine = eng, .queue = q, .count = n, .copies = (uintptr_t)c,
	};
	int ret = ioctl(fd, NEURON_UDMA_COPY_PREPARE, &p);

	return ret < 0 ? -errno : ret;
}

/*
 * The node counter @key of /proc/vmstat, after folding the per-CPU deltas into it
 * (/proc/sys/vm/stat_refresh, root only: otherwise the counters lag by those deltas), or -1.
 */
static inline long vm_counter(const char *key)
{
	char line[256];
	size_t n = strlen(key);
	long v = -1;
	int fd = open("/proc/sys/vm/stat_refresh", O_WRONLY | O_CLOEXEC);
	FILE *f;

	if (fd >= 0) {
		ssize_t w = write(fd, "1", 1);

		(void)w;
		close(fd);
	}
	f = fopen("/proc/vmstat", "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ' ' && sscanf(line + n + 1, "%ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* Long-term pins held on the system now: nr_foll_pin_acquired - nr_foll_pin_released. */
static inline long pins_held(void)
{
	return vm_counter("nr_foll_pin_acquired") - vm_counter("nr_foll_pin_released");
}

/*
 * Waits up to @max_ms for the held pins to come back to @want (a close may unpin from deferred
 * work once nothing reaches the pages). The last value seen.
 */
static inline long pins_settle(long want, unsigned int max_ms)
{
	long now = pins_held();
	unsigned int i;

	for (i = 0; i < max_ms / 10 && now != want; i++) {
		usleep(10 * 1000);
		now = pins_held();
	}
	return now;
}

#endif /* _UDMA_UTIL_H */
