// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * An LD_PRELOAD stand-in for the neuron_udma driver, for end-to-end tests of the client crate
 * and udmactl without a device: opening $FAKE_UDMA_PATH gives an eventfd that plays the device
 * file (readable while completions are not reported, as poll() on the real file), and the
 * ioctls of include/uapi/linux/neuron_udma.h on it are answered here. One "engine" thread runs
 * the submitted batches in order, copying the bytes after a delay of $FAKE_UDMA_NS_PER_KIB
 * (default 200) per KiB. $FAKE_UDMA_ABI=2 plays an ABI 2 driver (88-byte INFO only, ENOTTY
 * for ABI 3 commands). $FAKE_UDMA_FAIL_FENCE=N fails fence N of every queue (EIO).
 *
 * Not a model of the hardware: no rings (no ENOSPC), no descriptors, no resets. Only what the
 * client's fence and event paths need.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/neuron_udma.h>

#define MAX_BUFS 4096
#define MAX_QUEUES 256
#define INFO_SIZE_V2 88

struct buf {
	int used;
	uint64_t size;
	void *mem;
};

struct batch {
	struct batch *next;
	int q;
	uint64_t fence;
	uint32_t count;
	struct neuron_udma_copy *copies;
};

struct queue {
	int used;
	uint32_t engine, queue;
	uint32_t pending_count;
	struct neuron_udma_copy *pending;
	uint64_t submitted, completed, reported, failed, failed_reported;
	int error;
	int eventfd;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static struct buf bufs[MAX_BUFS];
static struct queue queues[MAX_QUEUES];
static struct batch *work_head, *work_tail;
static int engine_busy;
/* Open files of the fake device (they share one state: no per-file ownership). */
#define MAX_FILES 16
static int dev_fds[MAX_FILES] = { -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1 };
static int abi = 3;
static long ns_per_kib = 200;
static uint64_t fail_fence;
static pthread_t engine;

static int (*real_ioctl)(int, unsigned long, ...);

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 0) : def;
}

static void signal_fd(int fd, uint64_t n)
{
	if (fd >= 0)
		(void)!write(fd, &n, sizeof(n));
}

/* close() without the wrapper below (which takes the lock the ioctls hold). */
static int real_close(int fd)
{
	int (*f)(int) = dlsym(RTLD_NEXT, "close");
	return f(fd);
}

static int is_dev_fd(int fd)
{
	for (int i = 0; fd >= 0 && i < MAX_FILES; i++)
		if (dev_fds[i] == fd)
			return 1;
	return 0;
}

static void signal_files(void)
{
	for (int i = 0; i < MAX_FILES; i++)
		signal_fd(dev_fds[i], 1);
}

static void clear_files(void)
{
	uint64_t v;
	for (int i = 0; i < MAX_FILES; i++)
		if (dev_fds[i] >= 0)
			(void)!read(dev_fds[i], &v, sizeof(v));
}

static void *engine_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!work_head)
			pthread_cond_wait(&work_cv, &mu);
		struct batch *b = work_head;
		engine_busy = 1;
		work_head = b->next;
		if (!work_head)
			work_tail = NULL;
		uint64_t bytes = 0;
		for (uint32_t i = 0; i < b->count; i++)
			bytes += b->copies[i].size;
		pthread_mutex_unlock(&mu);
		struct timespec d = { 0, (long)(bytes / 1024) * ns_per_kib };
		while (d.tv_nsec >= 1000000000L) {
			d.tv_sec++;
			d.tv_nsec -= 1000000000L;
		}
		nanosleep(&d, NULL);
		pthread_mutex_lock(&mu);
		struct queue *q = &queues[b->q];
		if (fail_fence && b->fence == fail_fence) {
			q->failed = b->fence;
			q->error = EIO;
		} else {
			for (uint32_t i = 0; i < b->count; i++) {
				struct neuron_udma_copy *c = &b->copies[i];
				memmove((char *)bufs[c->dst_handle - 1].mem + c->dst_offset,
					(char *)bufs[c->src_handle - 1].mem + c->src_offset, c->size);
			}
			q->completed = b->fence;
		}
		engine_busy = 0;
		signal_files();
		signal_fd(q->eventfd, 1);
		pthread_cond_broadcast(&done_cv);
		free(b->copies);
		free(b);
	}
	return NULL;
}

static void init(void)
{
	real_ioctl = dlsym(RTLD_NEXT, "ioctl");
	abi = (int)env_u64("FAKE_UDMA_ABI", 3);
	ns_per_kib = (long)env_u64("FAKE_UDMA_NS_PER_KIB", 200);
	fail_fence = env_u64("FAKE_UDMA_FAIL_FENCE", 0);
	pthread_create(&engine, NULL, engine_main, NULL);
}

static int is_fake(const char *path)
{
	const char *p = getenv("FAKE_UDMA_PATH");
	return p && path && strcmp(p, path) == 0;
}

static int open_fake(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, init);
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_FILES; i++) {
		if (dev_fds[i] < 0) {
			dev_fds[i] = fd;
			pthread_mutex_unlock(&mu);
			return fd;
		}
	}
	pthread_mutex_unlock(&mu);
	real_close(fd);
	errno = EMFILE;
	return -1;
}

static int real_open_va(const char *sym, int dirfd, const char *path, int flags, mode_t mode, int at)
{
	if (at) {
		int (*f)(int, const char *, int, ...) = dlsym(RTLD_NEXT, sym);
		return f(dirfd, path, flags, mode);
	}
	int (*f)(const char *, int, ...) = dlsym(RTLD_NEXT, sym);
	return f(path, flags, mode);
}

int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_arg(ap, mode_t);
	va_end(ap);
	return is_fake(path) ? open_fake() : real_open_va("open", 0, path, flags, mode, 0);
}

int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_arg(ap, mode_t);
	va_end(ap);
	return is_fake(path) ? open_fake() : real_open_va("open64", 0, path, flags, mode, 0);
}

int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_arg(ap, mode_t);
	va_end(ap);
	return is_fake(path) ? open_fake() : real_open_va("openat", dirfd, path, flags, mode, 1);
}

int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_arg(ap, mode_t);
	va_end(ap);
	return is_fake(path) ? open_fake() : real_open_va("openat64", dirfd, path, flags, mode, 1);
}

static void *fake_mmap(size_t len, off_t off)
{
	uint64_t idx = ((uint64_t)off >> 32);
	void *r = MAP_FAILED;
	pthread_mutex_lock(&mu);
	if (idx >= 1 && idx <= MAX_BUFS && bufs[idx - 1].used && len <= bufs[idx - 1].size)
		r = bufs[idx - 1].mem;
	pthread_mutex_unlock(&mu);
	if (r == MAP_FAILED)
		errno = EINVAL;
	return r;
}

int close(int fd)
{
	pthread_mutex_lock(&mu);
	for (int i = 0; fd >= 0 && i < MAX_FILES; i++)
		if (dev_fds[i] == fd)
			dev_fds[i] = -1;
	pthread_mutex_unlock(&mu);
	return real_close(fd);
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (is_dev_fd(fd))
		return fake_mmap(len, off);
	void *(*f)(void *, size_t, int, int, int, off_t) = dlsym(RTLD_NEXT, "mmap");
	return f(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (is_dev_fd(fd))
		return fake_mmap(len, off);
	void *(*f)(void *, size_t, int, int, int, off_t) = dlsym(RTLD_NEXT, "mmap64");
	return f(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len)
{
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAX_BUFS; i++) {
		if (bufs[i].used && bufs[i].mem == addr) {
			pthread_mutex_unlock(&mu);
			return 0; /* freed by MEM_FREE */
		}
	}
	pthread_mutex_unlock(&mu);
	int (*f)(void *, size_t) = dlsym(RTLD_NEXT, "munmap");
	return f(addr, len);
}

static struct queue *find_queue(uint32_t engine, uint32_t queue)
{
	for (int i = 0; i < MAX_QUEUES; i++)
		if (queues[i].used && queues[i].engine == engine && queues[i].queue == queue)
			return &queues[i];
	return NULL;
}

static int check_copy(const struct neuron_udma_copy *c)
{
	if (!c->size || c->size > 65536 || c->reserved || (c->flags & ~NEURON_UDMA_COPY_SPLIT))
		return -EINVAL;
	uint64_t h[2] = { c->src_handle, c->dst_handle }, o[2] = { c->src_offset, c->dst_offset };
	for (int i = 0; i < 2; i++) {
		if (!h[i] || h[i] > MAX_BUFS || !bufs[h[i] - 1].used)
			return -ENOENT;
		if (o[i] + c->size > bufs[h[i] - 1].size)
			return -ERANGE;
	}
	return 0;
}

static int add_pending(struct queue *q, const struct neuron_udma_copy *c, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		int r = check_copy(&c[i]);
		if (r)
			return r;
	}
	q->pending = realloc(q->pending, (q->pending_count + n) * sizeof(*c));
	memcpy(q->pending + q->pending_count, c, n * sizeof(*c));
	q->pending_count += n;
	return 0;
}

static uint64_t submit(struct queue *q)
{
	if (!q->pending_count)
		return q->submitted;
	struct batch *b = calloc(1, sizeof(*b));
	b->q = (int)(q - queues);
	b->fence = ++q->submitted;
	b->count = q->pending_count;
	b->copies = q->pending;
	q->pending = NULL;
	q->pending_count = 0;
	if (work_tail)
		work_tail->next = b;
	else
		work_head = b;
	work_tail = b;
	pthread_cond_signal(&work_cv);
	return b->fence;
}

static int wait_fence(struct queue *q, uint64_t fence, uint32_t timeout_ms)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	uint64_t ms = timeout_ms ? timeout_ms : 10000;
	t.tv_sec += (time_t)(ms / 1000);
	t.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	while (q->completed < fence && q->failed < fence) {
		if (pthread_cond_timedwait(&done_cv, &mu, &t) == ETIMEDOUT)
			return -ETIMEDOUT;
	}
	return q->completed >= fence ? 0 : -EIO;
}

static int fake_ioctl(unsigned long req, void *arg)
{
	if (req == NEURON_UDMA_INFO || req == _IOC(_IOC_READ, NEURON_UDMA_IOC_MAGIC, 0, INFO_SIZE_V2)) {
		int v2 = req != NEURON_UDMA_INFO;
		if (!v2 && abi < 3)
			return -ENOTTY;
		struct neuron_udma_info i = { 0 };
		i.abi_version = (uint32_t)abi;
		i.generation = NEURON_UDMA_GEN_V2;
		i.vendor_id = 0x1d0f;
		i.device_id = 0x7164;
		i.engines = 34;
		i.queues_per_engine = 16;
		i.max_copy_size = 65536;
		i.device_mem_size = 256ull << 20;
		i.min_ring_descs = 32;
		i.max_ring_descs = 1u << 23;
		i.ring_reserve_descs = 16;
		i.max_batch = 4096;
		i.max_host_buffer = 64ull << 20;
		i.host_engines[0] = (1ull << 34) - 1;
		i.max_import_size = 1ull << 30;
		i.max_buffers = MAX_BUFS;
		i.max_queue_fences = 64;
		i.device_ring_engines[0] = (1ull << 34) - 1;
		memcpy(arg, &i, v2 ? INFO_SIZE_V2 : sizeof(i));
		return 0;
	}
	if (abi < 3 && _IOC_NR(req) >= 0x0C)
		return -ENOTTY;
	switch (req) {
	case NEURON_UDMA_MEM_ALLOC: {
		struct neuron_udma_mem_alloc *a = arg;
		for (int i = 0; i < MAX_BUFS; i++) {
			if (bufs[i].used)
				continue;
			uint64_t size = (a->size + 4095) & ~4095ull;
			void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (m == MAP_FAILED)
				return -ENOMEM;
			bufs[i] = (struct buf){ 1, size, m };
			a->handle = (uint64_t)i + 1;
			a->mmap_offset = (a->type == NEURON_UDMA_MEM_HOST || abi >= 3) ? ((uint64_t)i + 1) << 32 : 0;
			return 0;
		}
		return -EMFILE;
	}
	case NEURON_UDMA_MEM_FREE: {
		struct neuron_udma_mem_free *f = arg;
		if (!f->handle || f->handle > MAX_BUFS || !bufs[f->handle - 1].used)
			return -ENOENT;
		/* As the driver keeps a buffer while descriptors reach it: let the engine finish. */
		while (work_head || engine_busy)
			pthread_cond_wait(&done_cv, &mu);
		struct buf *b = &bufs[f->handle - 1];
		int (*unmap)(void *, size_t) = dlsym(RTLD_NEXT, "munmap");
		unmap(b->mem, b->size);
		b->used = 0;
		return 0;
	}
	case NEURON_UDMA_QUEUE_INIT: {
		struct neuron_udma_queue_init *a = arg;
		if (find_queue(a->engine, a->queue))
			return -EBUSY;
		for (int i = 0; i < MAX_QUEUES; i++) {
			if (!queues[i].used) {
				queues[i] = (struct queue){ .used = 1, .engine = a->engine, .queue = a->queue, .eventfd = -1 };
				return 0;
			}
		}
		return -ENOMEM;
	}
	case NEURON_UDMA_QUEUE_RELEASE: {
		struct neuron_udma_queue_id *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		/* Let its batches finish first: they name this queue by index. */
		while (q->completed < q->submitted && q->failed < q->submitted)
			pthread_cond_wait(&done_cv, &mu);
		free(q->pending);
		if (q->eventfd >= 0)
			real_close(q->eventfd);
		q->used = 0;
		return 0;
	}
	case NEURON_UDMA_COPY_PREPARE_ONE: {
		struct neuron_udma_copy_prepare_one *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		return q ? add_pending(q, &a->copy, 1) : -ENOENT;
	}
	case NEURON_UDMA_COPY_PREPARE: {
		struct neuron_udma_copy_prepare *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		if (!a->count || a->count > 4096)
			return -EINVAL;
		return add_pending(q, (const struct neuron_udma_copy *)(uintptr_t)a->copies, a->count);
	}
	case NEURON_UDMA_COPY_START:
		return find_queue(((struct neuron_udma_copy_start *)arg)->engine,
				  ((struct neuron_udma_copy_start *)arg)->queue) ? 0 : -ENOENT;
	case NEURON_UDMA_COPY_WAIT: {
		struct neuron_udma_copy_wait *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		uint64_t f = submit(q);
		int r = wait_fence(q, f, a->timeout_ms);
		a->completed = 1;
		return r;
	}
	case NEURON_UDMA_COPY_SUBMIT: {
		struct neuron_udma_copy_submit *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		if (a->flags || a->reserved)
			return -EINVAL;
		if (q->submitted - q->completed >= 64 && q->pending_count)
			return -EBUSY;
		a->fence = submit(q);
		return 0;
	}
	case NEURON_UDMA_FENCE_STATUS: {
		struct neuron_udma_fence_status *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		if (!a->fence || a->fence > q->submitted)
			return -EINVAL;
		if (q->completed >= a->fence) {
			a->state = NEURON_UDMA_FENCE_DONE;
		} else if (q->failed >= a->fence) {
			a->state = NEURON_UDMA_FENCE_FAILED;
			a->error = q->error;
		} else {
			a->state = NEURON_UDMA_FENCE_PENDING;
		}
		a->completed = q->completed;
		a->submitted = q->submitted;
		return 0;
	}
	case NEURON_UDMA_FENCE_WAIT: {
		struct neuron_udma_fence_wait *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		if (!a->fence || a->fence > q->submitted)
			return -EINVAL;
		return wait_fence(q, a->fence, a->timeout_ms);
	}
	case NEURON_UDMA_QUEUE_EVENTS: {
		struct neuron_udma_events *a = arg;
		struct neuron_udma_queue_event *out = (void *)(uintptr_t)a->events;
		uint32_t n = 0;
		int more = 0;
		if (!a->max)
			return -EINVAL;
		for (int i = 0; i < MAX_QUEUES; i++) {
			struct queue *q = &queues[i];
			int c = q->used && q->completed > q->reported;
			int f = q->used && q->failed > q->failed_reported;
			if (!c && !f)
				continue;
			if (n == a->max) {
				more = 1;
				break;
			}
			out[n] = (struct neuron_udma_queue_event){ .engine = q->engine, .queue = q->queue,
								   .completed = q->completed };
			if (c)
				out[n].flags |= NEURON_UDMA_EVENT_COMPLETED;
			if (f) {
				out[n].flags |= NEURON_UDMA_EVENT_FAILED;
				out[n].failed = q->failed;
				out[n].error = q->error;
			}
			q->reported = q->completed;
			q->failed_reported = q->failed;
			n++;
		}
		a->count = n;
		if (!more)
			clear_files();
		return 0;
	}
	case NEURON_UDMA_QUEUE_EVENTFD: {
		struct neuron_udma_eventfd *a = arg;
		struct queue *q = find_queue(a->engine, a->queue);
		if (!q)
			return -ENOENT;
		if (q->eventfd >= 0)
			real_close(q->eventfd);
		q->eventfd = a->fd < 0 ? -1 : fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
		return 0;
	}
	default:
		return -ENOTTY;
	}
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	pthread_mutex_lock(&mu);
	int fake = is_dev_fd(fd);
	pthread_mutex_unlock(&mu);
	if (!fake) {
		if (!real_ioctl)
			real_ioctl = dlsym(RTLD_NEXT, "ioctl");
		return real_ioctl(fd, req, arg);
	}
	pthread_mutex_lock(&mu);
	int r = fake_ioctl(req, arg);
	pthread_mutex_unlock(&mu);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return r;
}
