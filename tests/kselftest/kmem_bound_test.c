// SPDX-License-Identifier: GPL-2.0
/*
 * What one user can make the kernel hold (Documentation/userspace-api.rst, "Security model"):
 * a file holds at most INFO's max_buffers live buffers (EMFILE past it, nothing else changes),
 * and the kernel memory behind every buffer and import is charged to the caller's memory cgroup,
 * so a cgroup's memory.max stops a user who allocates small buffers in a loop before the slab
 * grows past it.
 *
 * The memory cgroup tests make a child cgroup under /sys/fs/cgroup (cgroup2, mounted by the
 * guest's init) and run the allocating process in it. Past memory.max a charged allocation fails
 * as every charged kernel allocation does: the cgroup's OOM killer ends the task (its report,
 * which names the task EXPECTED_OOM_COMM, is expected by tests/parse-results.py) and the call
 * returns ENOMEM.
 */
#define _GNU_SOURCE
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "kselftest_harness.h"
#include "udma_sec.h"

#define KIB 1024UL
#define MIB (1024UL * 1024)
#define CG_ROOT "/sys/fs/cgroup"
#define CG_DIR CG_ROOT "/nu_kmem"
#define EXPECTED_OOM_COMM "nu_memcg_oom"

/* ---- memory cgroup helpers (0 or -errno, values in bytes) ---- */

static int cg_write(const char *file, const char *val)
{
	char path[256];

	snprintf(path, sizeof(path), CG_DIR "/%s", file);
	return sysfs_write(path, val);
}

/* Field @key of @file of the test cgroup ("memory.stat", "memory.events") or the single number
 * of @file when @key is NULL; -1 if missing. */
static long long cg_read(const char *file, const char *key)
{
	char path[256], line[256];
	size_t n = key ? strlen(key) : 0;
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), CG_DIR "/%s", file);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!key) {
			v = strtoll(line, NULL, 10);
			break;
		}
		if (!strncmp(line, key, n) && line[n] == ' ') {
			v = strtoll(line + n + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return v;
}

/* A fresh test cgroup with the memory controller, unlimited. */
static int cg_create(void)
{
	struct stat st;

	if (stat(CG_ROOT "/cgroup.controllers", &st))
		return -ENOENT;
	rmdir(CG_DIR);
	if (sysfs_write(CG_ROOT "/cgroup.subtree_control", "+memory"))
		return -EIO;
	if (mkdir(CG_DIR, 0755))
		return -errno;
	return 0;
}

static void cg_join(void)
{
	char pid[32];

	snprintf(pid, sizeof(pid), "%d", getpid());
	if (cg_write("cgroup.procs", pid))
		_exit(124);
}

static void cg_remove(void)
{
	/* The cgroup is empty once its tasks were reaped; rmdir may race their exit once. */
	for (int i = 0; i < 50 && rmdir(CG_DIR) && errno == EBUSY; i++)
		sleep_ms(100);
}

/* ---- the per-file bound ---- */

#define MAX_BUFFERS_PARAM "/sys/module/neuron_udma/parameters/max_buffers"
/* The bound of buffers_per_file_end_with_emfile: reached in seconds under the debug kernel. */
#define EMFILE_BOUND 4096U

/* The max_buffers module parameter, 0 if unreadable. */
static unsigned int param_max_buffers(void)
{
	unsigned int v = 0;
	FILE *f = fopen(MAX_BUFFERS_PARAM, "re");

	if (f) {
		if (fscanf(f, "%u", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* As uid 1001: writing the parameter must fail (EACCES). */
static int param_write_as_user(void *arg)
{
	(void)arg;
	return sysfs_write(MAX_BUFFERS_PARAM, "1") == -EACCES ? 0 : 1;
}

/* No state: a fixture only for the harness's per-test timeouts (TEST has 30 s). */
FIXTURE(kmem) {
	int unused;
};

FIXTURE_SETUP(kmem)
{
}

FIXTURE_TEARDOWN(kmem)
{
}

TEST_F(kmem, info_reports_the_bounds)
{
	struct neuron_udma_info info;
	int fd = udma_open();

	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &info));
	TH_LOG("max_buffers %u, max_queue_fences %u", info.max_buffers, info.max_queue_fences);
	EXPECT_EQ(65536U, info.max_buffers);
	EXPECT_EQ(65536U, param_max_buffers());
	EXPECT_LE(1U, info.max_queue_fences);
	close(fd);
}

/*
 * The module parameter: read when a file is opened (an open file keeps its bound), 1 to 2^20,
 * root only.
 */
TEST_F(kmem, max_buffers_parameter)
{
	struct neuron_udma_info info;
	int fd = udma_open(), fd2;

	ASSERT_LE(0, fd);
	EXPECT_EQ(-EINVAL, sysfs_write(MAX_BUFFERS_PARAM, "0"));
	EXPECT_EQ(-EINVAL, sysfs_write(MAX_BUFFERS_PARAM, "1048577"));
	EXPECT_EQ(-EINVAL, sysfs_write(MAX_BUFFERS_PARAM, "many"));
	EXPECT_EQ(65536U, param_max_buffers());
	ASSERT_EQ(0, sysfs_write(MAX_BUFFERS_PARAM, "7"));
	fd2 = udma_open();
	ASSERT_LE(0, fd2);
	EXPECT_EQ(0, sysfs_write(MAX_BUFFERS_PARAM, "65536"));
	ASSERT_EQ(0, udma_info(fd, &info));
	EXPECT_EQ(65536U, info.max_buffers);
	ASSERT_EQ(0, udma_info(fd2, &info));
	EXPECT_EQ(7U, info.max_buffers);
	/* Not for other users (0644). */
	EXPECT_EQ(0, sec_reap(sec_spawn(UID_A, param_write_as_user, NULL)));
	EXPECT_EQ(65536U, param_max_buffers());
	close(fd2);
	close(fd);
}

/*
 * MEM_IMPORT of one byte of a page until the file's bound: exactly max_buffers imports succeed,
 * the next is EMFILE and changes nothing; another file is not affected; a MEM_FREE makes room
 * for exactly one more. The file is opened with the module parameter at EMFILE_BOUND (65536
 * imports and their close take 4 minutes under the debug kernel; the default's value is checked
 * above). The imports cycle over PAGES pages: DMA-API debugging (the test kernel) keeps the
 * mappings of one 8 KiB bus-address range in one hash chain.
 */
#define PAGES 1024
TEST_F_TIMEOUT(kmem, buffers_per_file_end_with_emfile, 900)
{
	struct neuron_udma_info info;
	struct rlimit unlimited = { RLIM_INFINITY, RLIM_INFINITY };
	__u64 *handles, h = 0, extra = 0;
	unsigned char *page;
	int fd, fd2, ret = 0;
	__u32 n = 0;
	double t0;

	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &unlimited));
	ASSERT_EQ(0, sysfs_write(MAX_BUFFERS_PARAM, "4096"));
	fd = udma_open();
	ASSERT_EQ(0, sysfs_write(MAX_BUFFERS_PARAM, "65536"));
	fd2 = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_LE(0, fd2);
	ASSERT_EQ(0, udma_info(fd, &info));
	ASSERT_EQ(EMFILE_BOUND, info.max_buffers);
	handles = calloc(info.max_buffers, sizeof(*handles));
	page = mmap(NULL, PAGES * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(NULL, handles);
	ASSERT_NE(MAP_FAILED, page);
	for (int i = 0; i < PAGES; i++)
		page[i * 4096] = 1;
	t0 = now_ms();
	while (n <= info.max_buffers) {
		ret = udma_import(fd, page + (n % PAGES) * 4096, 1, 0, &h, NULL);
		if (ret)
			break;
		handles[n++] = h;
		if (n > info.max_buffers)
			break;
	}
	TH_LOG("%u imports in %.0f ms, then %s", n, now_ms() - t0, strerror(-ret));
	ASSERT_EQ(info.max_buffers, n);
	ASSERT_EQ(-EMFILE, ret);
	/* Again: still EMFILE, and every handle still works. */
	EXPECT_EQ(-EMFILE, udma_import(fd, page, 1, 0, &h, NULL));
	EXPECT_EQ(-EMFILE, raw_alloc(fd, NEURON_UDMA_MEM_HOST, 4096, &h, NULL));
	/* Another file has its own bound. */
	EXPECT_EQ(0, udma_import(fd2, page, 1, 0, &extra, NULL));
	EXPECT_EQ(0, mem_free(fd2, extra));
	/* One free, one more import. */
	EXPECT_EQ(0, mem_free(fd, handles[n - 1]));
	EXPECT_EQ(0, udma_import(fd, page, 1, 0, &handles[n - 1], NULL));
	EXPECT_EQ(-EMFILE, udma_import(fd, page, 1, 0, &h, NULL));
	for (__u32 i = 0; i < n; i += 256)
		EXPECT_EQ(0, mem_free(fd, handles[i]));
	t0 = now_ms();
	close(fd);
	TH_LOG("close with %u imports: %.0f ms", n - (n + 255) / 256, now_ms() - t0);
	close(fd2);
	munmap(page, PAGES * 4096);
	free(handles);
}

/* ---- what the memory cgroup is charged ---- */

#define CHARGE_BUFFERS 1024

struct charge_report {
	int step, err;
	long long slab_before, slab_after, slab_freed;
	long long dev_slab, import_slab;
};

static int charge_child(void *arg)
{
	struct charge_report *r = arg;
	static __u64 h[CHARGE_BUFFERS];
	unsigned char *page;
	int fd;

	cg_join();
	r->step = 1;
	fd = udma_open();
	if (fd < 0)
		return r->err = fd, 2;
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 3;
	page[0] = 1;
	/* A first buffer of each kind: the per-file records that are made once are not counted. */
	if ((r->err = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, 4096, &h[0], NULL)) ||
	    (r->err = mem_free(fd, h[0])))
		return 4;
	sleep_ms(2500);	/* memory.stat is flushed every 2 s */
	r->slab_before = cg_read("memory.stat", "slab");
	r->step = 2;
	for (int i = 0; i < CHARGE_BUFFERS; i++)
		if ((r->err = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, 4096, &h[i], NULL)))
			return 5;
	sleep_ms(2500);
	r->slab_after = cg_read("memory.stat", "slab");
	r->dev_slab = r->slab_after - r->slab_before;
	r->step = 3;
	for (int i = 0; i < CHARGE_BUFFERS; i++)
		if ((r->err = mem_free(fd, h[i])))
			return 6;
	sleep_ms(2500);
	r->slab_freed = cg_read("memory.stat", "slab");
	r->step = 4;
	for (int i = 0; i < CHARGE_BUFFERS; i++)
		if ((r->err = udma_import(fd, page, 1, 0, &h[i], NULL)))
			return 7;
	sleep_ms(2500);
	r->import_slab = cg_read("memory.stat", "slab") - r->slab_freed;
	close(fd);
	return 0;
}

/*
 * The kernel memory behind a 4 KiB device buffer and behind a one-page import is charged to
 * the memory cgroup of the task that made it, and given back by MEM_FREE.
 */
TEST_F_TIMEOUT(kmem, buffers_are_charged_to_the_memory_cgroup, 300)
{
	struct charge_report *r = sec_shared(sizeof(*r));
	struct rlimit unlimited = { RLIM_INFINITY, RLIM_INFINITY };
	pid_t pid;
	int ret;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &unlimited));
	ret = cg_create();
	if (ret == -ENOENT)
		SKIP(return, "no cgroup2 at " CG_ROOT);
	ASSERT_EQ(0, ret);
	pid = sec_spawn(0, charge_child, r);
	ASSERT_LT(0, pid);
	ret = sec_reap(pid);
	cg_remove();
	ASSERT_EQ(0, ret) {
		TH_LOG("child failed at step %d: %s", r->step, strerror(-r->err));
	}
	TH_LOG("slab charged per 4 KiB device buffer: %lld bytes; per one-page import: %lld bytes; "
	       "after MEM_FREE of the device buffers %+lld bytes",
	       r->dev_slab / CHARGE_BUFFERS, r->import_slab / CHARGE_BUFFERS,
	       r->slab_freed - r->slab_before);
	/* The buffer record alone is several hundred bytes. */
	EXPECT_LE(256LL, r->dev_slab / CHARGE_BUFFERS);
	EXPECT_LE(256LL, r->import_slab / CHARGE_BUFFERS);
	/* Given back: at most a tenth stays (the per-CPU charge caches). */
	EXPECT_LE(r->slab_freed - r->slab_before, r->dev_slab / 10);
	munmap(r, sizeof(*r));
}

/* ---- memory.max stops a loop of small allocations ---- */

#define HEADROOM (2 * MIB)
#define LOOP_LIMIT 65536

struct loop_report {
	int step, err;
	int count;
};

static struct neuron_udma_info loop_info;

static int loop_child(void *arg)
{
	struct loop_report *r = arg;
	unsigned char *page;
	char max[32];
	__u64 h;
	int fd;

	prctl(PR_SET_NAME, EXPECTED_OOM_COMM);
	cg_join();
	fd = udma_open();
	if (fd < 0)
		return r->err = fd, 2;
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED)
		return 3;
	page[0] = 1;
	/* The limit: what this process holds now and HEADROOM more. */
	snprintf(max, sizeof(max), "%lld", cg_read("memory.current", NULL) + (long long)HEADROOM);
	if (cg_write("memory.max", max))
		return 4;
	r->step = 1;
	for (r->count = 0; r->count < LOOP_LIMIT; r->count++) {
		/* Alternating: 4 KiB device buffers and one-byte imports. */
		if (r->count % 2 && r->count / 2 * 4096 < (int)(loop_info.device_mem_size / 4))
			r->err = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, 4096, &h, NULL);
		else
			r->err = udma_import(fd, page, 1, 0, &h, NULL);
		if (r->err)
			break;
	}
	r->step = 2;
	return 0;
}

/*
 * A task in a cgroup whose memory.max leaves 2 MiB above what it holds allocates device buffers
 * and imports in a loop: the cgroup stops it (ENOMEM, or the cgroup's OOM killer ends it)
 * long before the file's bound or device memory would; memory.peak never passes memory.max by
 * more than the charge batches; and once the task is gone everything it held is back: the
 * cgroup's slab is empty and the device memory can be allocated again.
 */
TEST_F_TIMEOUT(kmem, memory_max_stops_allocations, 300)
{
	struct loop_report *r = sec_shared(sizeof(*r));
	struct rlimit unlimited = { RLIM_INFINITY, RLIM_INFINITY };
	long long max, peak, slab_left, oom, events_max;
	__u64 *handles;
	pid_t pid;
	int fd, ret, again = 0;

	ASSERT_NE(NULL, r);
	ASSERT_EQ(0, setrlimit(RLIMIT_MEMLOCK, &unlimited));
	fd = udma_open();
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, udma_info(fd, &loop_info));
	ret = cg_create();
	if (ret == -ENOENT)
		SKIP(return, "no cgroup2 at " CG_ROOT);
	ASSERT_EQ(0, ret);
	pid = sec_spawn(0, loop_child, r);
	ASSERT_LT(0, pid);
	ret = sec_reap(pid);
	sleep_ms(2500);
	max = cg_read("memory.max", NULL);
	peak = cg_read("memory.peak", NULL);
	slab_left = cg_read("memory.stat", "slab");
	oom = cg_read("memory.events", "oom_kill");
	events_max = cg_read("memory.events", "max");
	cg_remove();
	TH_LOG("exit %d at step %d after %d allocations (%s); memory.max %lld, peak %lld, "
	       "slab left %lld, events: max %lld, oom_kill %lld",
	       ret, r->step, r->count, strerror(-r->err), max, peak, slab_left, events_max, oom);
	/* Ended by the cgroup: ENOMEM returned, or killed by its OOM killer. */
	EXPECT_TRUE((ret == 0 && r->err == -ENOMEM) || ret == 128 + SIGKILL);
	EXPECT_LT(0, events_max);
	EXPECT_LT(r->count, LOOP_LIMIT);
	EXPECT_GT(r->count, 64);
	if (peak >= 0)
		EXPECT_LE(peak, max + (long long)(256 * KIB));
	EXPECT_LE(slab_left, (long long)(128 * KIB));
	/* The device memory the task held is back: the same count of device buffers fits again. */
	handles = calloc(r->count / 2 + 1, sizeof(*handles));
	ASSERT_NE(NULL, handles);
	for (int i = 0; i < r->count / 2; i++) {
		ret = raw_alloc(fd, NEURON_UDMA_MEM_DEVICE, 4096, &handles[again], NULL);
		if (ret)
			break;
		again++;
	}
	EXPECT_EQ(r->count / 2, again);
	for (int i = 0; i < again; i++)
		EXPECT_EQ(0, mem_free(fd, handles[i]));
	free(handles);
	close(fd);
	munmap(r, sizeof(*r));
}

TEST_HARNESS_MAIN
