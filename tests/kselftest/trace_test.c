// SPDX-License-Identifier: GPL-2.0
/*
 * The tracepoints (system neuron_udma, Documentation/neuron-udma.rst "Tracepoints"): enabled
 * through tracefs, a known sequence of calls, then the trace read back: every event of the
 * sequence is there, with the fields the calls imply, in the order the calls made them. Other
 * users of the device (the completion engine, the driver's H2T queue) may add events of their
 * own: the checks follow this test's queue instance and buffer handles.
 */
#define _GNU_SOURCE
#include <sys/mount.h>
#include "kselftest_harness.h"
#include "udma_fence.h"

#define TRACEFS "/sys/kernel/tracing"
#define ENG 15
#define QID 7
#define MAX_EVENTS 4096

/* One event of the trace: its name and the text of its fields. */
struct tev {
	char name[48];
	char fields[320];
};

/* Writes @val to the tracefs file @file: 0 or -errno. */
static int tracefs_write(const char *file, const char *val)
{
	char path[256];

	snprintf(path, sizeof(path), TRACEFS "/%s", file);
	return sysfs_write(path, val);
}

/* Empties the trace buffer (an open for writing with O_TRUNC, as `echo > trace`): 0 or -errno. */
static int trace_clear(void)
{
	int fd = open(TRACEFS "/trace", O_WRONLY | O_TRUNC | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	close(fd);
	return 0;
}

/* Mounts tracefs if the guest did not, turns the driver's events on, empties the buffer. */
static int trace_on(void)
{
	char path[256];

	snprintf(path, sizeof(path), TRACEFS "/events/neuron_udma/enable");
	if (access(path, F_OK) && mount("tracefs", TRACEFS, "tracefs", 0, NULL) && errno != EBUSY)
		return -errno;
	if (access(path, F_OK))
		return -ENOENT;
	if (tracefs_write("buffer_size_kb", "2048") || trace_clear() ||
	    tracefs_write("events/neuron_udma/enable", "1"))
		return -EIO;
	return tracefs_write("tracing_on", "1");
}

/*
 * Turns the events off and reads the trace: the events of device @bdf into @ev (at most
 * MAX_EVENTS), their count, or -errno. A line reads "<task>-<pid> [cpu] flags ts: name: fields".
 */
static int trace_read(const char *bdf, struct tev *ev)
{
	char line[512], *name, *fields;
	int n = 0;
	FILE *f;

	if (tracefs_write("events/neuron_udma/enable", "0"))
		return -EIO;
	f = fopen(TRACEFS "/trace", "re");
	if (!f)
		return -errno;
	while (n < MAX_EVENTS && fgets(line, sizeof(line), f)) {
		if (line[0] == '#')
			continue;
		name = strstr(line, ": neuron_udma_");
		if (!name)
			continue;
		name += 2;
		fields = strstr(name, ": ");
		if (!fields)
			continue;
		*fields = 0;
		fields += 2;
		fields[strcspn(fields, "\n")] = 0;
		/* Every event names its device first. */
		if (strncmp(fields, bdf, strlen(bdf)) || fields[strlen(bdf)] != ' ')
			continue;
		snprintf(ev[n].name, sizeof(ev[n].name), "%s", name);
		snprintf(ev[n].fields, sizeof(ev[n].fields), "%s", fields + strlen(bdf) + 1);
		n++;
	}
	fclose(f);
	trace_clear();
	return n;
}

/* Where the value of field @key of @e starts (after "key="), or NULL if @e has no such field. */
static const char *field_at(const struct tev *e, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "%s=", key);
	for (p = e->fields; (p = strstr(p, pat)); p++)
		if (p == e->fields || p[-1] == ' ')
			return p + strlen(pat);
	return NULL;
}

/* Field @key of @e as an integer (decimal or 0x hex), or -1 if absent. */
static long long field(const struct tev *e, const char *key)
{
	const char *v = field_at(e, key);

	return v ? strtoll(v, NULL, 0) : -1;
}

/* Field @key of @e as a string (up to the next space) into @out ("" if absent). */
static const char *field_str(const struct tev *e, const char *key, char *out, size_t len)
{
	const char *v = field_at(e, key);

	out[0] = 0;
	if (v)
		snprintf(out, len, "%.*s", (int)strcspn(v, " "), v);
	return out;
}

/*
 * The index of the first event named @name at or after @from whose fields include every
 * "key=value" of @match (space-separated), or -1.
 */
static int find(const struct tev *ev, int n, int from, const char *name, const char *match)
{
	char want[256], *tok, *save;
	int i;

	for (i = from; i < n; i++) {
		bool ok = true;

		if (strcmp(ev[i].name, name))
			continue;
		snprintf(want, sizeof(want), "%s", match);
		for (tok = strtok_r(want, " ", &save); tok && ok; tok = strtok_r(NULL, " ", &save)) {
			char key[64], got[96];
			const char *eq = strchr(tok, '=');

			if (!eq)
				continue;
			snprintf(key, sizeof(key), "%.*s", (int)(eq - tok), tok);
			ok = !strcmp(field_str(&ev[i], key, got, sizeof(got)), eq + 1);
		}
		if (ok)
			return i;
	}
	return -1;
}

FIXTURE(tr) {
	struct tev *ev;
	char bdf[64];
	int fd;
};

FIXTURE_SETUP(tr)
{
	self->ev = calloc(MAX_EVENTS, sizeof(*self->ev));
	ASSERT_NE(NULL, self->ev);
	ASSERT_EQ(0, udma_bdf(self->bdf, sizeof(self->bdf)));
	ASSERT_EQ(0, trace_on());
	self->fd = udma_open();
	ASSERT_LE(0, self->fd);
}

FIXTURE_TEARDOWN(tr)
{
	tracefs_write("events/neuron_udma/enable", "0");
	if (self->fd >= 0)
		close(self->fd);
	free(self->ev);
}

/*
 * A queue's life: init, two prepared copies, COPY_SUBMIT (its doorbell, then its fence), the
 * fence done, release; the buffers' alloc (the device buffer after its scrub) and free.
 */
TEST_F_TIMEOUT(tr, queue_copy_and_buffer_events_in_order, 120)
{
	char m[256], inst[32];
	struct ubuf host, dev;
	int n, i, init, sub1, sub2, bell, fen, done, rel, free_at;
	__u64 fence = 0;
	long long scrub;

	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &host));
	ASSERT_EQ(0, ubuf_dev(self->fd, 65536, &dev));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID, 64, 128));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&host, 0, &dev, 0, 100)));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID, ucopy(&host, 100, &dev, 4096, 300)));
	ASSERT_EQ(0, copy_submit(self->fd, ENG, QID, &fence));
	ASSERT_EQ(1ULL, fence);
	ASSERT_EQ(0, fence_wait(self->fd, ENG, QID, fence, 0));
	ASSERT_EQ(0, queue_release(self->fd, ENG, QID));
	ASSERT_EQ(0, ubuf_free(self->fd, &host));
	n = trace_read(self->bdf, self->ev);
	ASSERT_LT(0, n);

	/* The buffers: host (8 KiB), then the device buffer after the scrub of its range. */
	snprintf(m, sizeof(m), "handle=%llu size=8192 kind=host", (unsigned long long)host.handle);
	i = find(self->ev, n, 0, "neuron_udma_buffer_alloc", m);
	ASSERT_LE(0, i);
	EXPECT_LT(0, field(&self->ev[i], "owner"));
	snprintf(m, sizeof(m), "handle=%llu size=65536 kind=device", (unsigned long long)dev.handle);
	i = find(self->ev, n, i, "neuron_udma_buffer_alloc", m);
	ASSERT_LE(0, i);
	scrub = -1;
	for (int j = 0; j < i; j++)
		if (!strcmp(self->ev[j].name, "neuron_udma_scrub") && field(&self->ev[j], "size") == 65536)
			scrub = j;
	EXPECT_LE(0, scrub);
	if (scrub >= 0)
		EXPECT_EQ(0, field(&self->ev[scrub], "error"));

	/* The queue instance: every later event of the queue names it. */
	snprintf(m, sizeof(m), "engine=%d queue=%d tx_descs=64 rx_descs=128 device_rings=0", ENG, QID);
	init = find(self->ev, n, 0, "neuron_udma_queue_init", m);
	ASSERT_LE(0, init);
	EXPECT_LT(0, field(&self->ev[init], "owner"));
	field_str(&self->ev[init], "instance", inst, sizeof(inst));
	ASSERT_NE(0, inst[0]);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s pairs=1 bytes=100", ENG, QID, inst);
	sub1 = find(self->ev, n, init, "neuron_udma_submit", m);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s pairs=1 bytes=300", ENG, QID, inst);
	sub2 = find(self->ev, n, sub1 + 1, "neuron_udma_submit", m);
	/* One doorbell for both copies and the fence's marker pair: 3 Tx, 3 Rx. */
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s tx=3 rx=3", ENG, QID, inst);
	bell = find(self->ev, n, sub2 + 1, "neuron_udma_doorbell", m);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s fence=1", ENG, QID, inst);
	fen = find(self->ev, n, bell + 1, "neuron_udma_fence", m);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s fence=1 fences=1", ENG, QID, inst);
	done = find(self->ev, n, fen + 1, "neuron_udma_fence_done", m);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s next_fence=2", ENG, QID, inst);
	rel = find(self->ev, n, done + 1, "neuron_udma_queue_release", m);
	EXPECT_LT(init, sub1);
	EXPECT_LT(sub1, sub2);
	EXPECT_LT(sub2, bell);
	EXPECT_LT(bell, fen);
	EXPECT_LT(fen, done);
	EXPECT_LT(done, rel);
	/* Nothing failed or reset on this instance. */
	snprintf(m, sizeof(m), "instance=%s", inst);
	EXPECT_EQ(-1, find(self->ev, n, 0, "neuron_udma_fence_failed", m));
	EXPECT_EQ(-1, find(self->ev, n, 0, "neuron_udma_queue_reset", m));

	snprintf(m, sizeof(m), "handle=%llu size=8192 kind=host", (unsigned long long)host.handle);
	free_at = find(self->ev, n, rel, "neuron_udma_buffer_free", m);
	EXPECT_LT(rel, free_at);
	/* The device buffer is still allocated. */
	snprintf(m, sizeof(m), "handle=%llu", (unsigned long long)dev.handle);
	EXPECT_EQ(-1, find(self->ev, n, 0, "neuron_udma_buffer_free", m));
}

/*
 * An engine error: the abort seen, the queue reset for EIO, the fence in flight failed with
 * EIO, in that order; the instance stays, and its next copy is traced as done.
 */
TEST_F_TIMEOUT(tr, engine_error_events, 120)
{
	char m[256], inst[32];
	struct ubar2 bar2;
	struct ubuf host;
	int n, init, abort_at, reset, failed, done;
	__u64 fence = 0;

	ASSERT_EQ(0, bar2_open(&bar2));
	ASSERT_EQ(0, ubuf_host(self->fd, 8192, &host));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID + 1, 64, 64));
	ASSERT_EQ(0, bar2_fault(&bar2, FAULT_FAIL_NTH, ENG, QID + 1, 1));
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID + 1, ucopy(&host, 0, &host, 4096, 64)));
	ASSERT_EQ(0, copy_submit(self->fd, ENG, QID + 1, &fence));
	EXPECT_EQ(-EIO, fence_wait(self->fd, ENG, QID + 1, fence, 0));
	bar2_write(&bar2, BAR2_CLEAR, 1);
	bar2_close(&bar2);
	ASSERT_EQ(0, prep_one(self->fd, ENG, QID + 1, ucopy(&host, 0, &host, 4096, 64)));
	ASSERT_EQ(0, copy_submit(self->fd, ENG, QID + 1, &fence));
	ASSERT_EQ(2ULL, fence);
	ASSERT_EQ(0, fence_wait(self->fd, ENG, QID + 1, fence, 0));
	n = trace_read(self->bdf, self->ev);
	ASSERT_LT(0, n);

	snprintf(m, sizeof(m), "engine=%d queue=%d", ENG, QID + 1);
	init = find(self->ev, n, 0, "neuron_udma_queue_init", m);
	ASSERT_LE(0, init);
	field_str(&self->ev[init], "instance", inst, sizeof(inst));
	abort_at = find(self->ev, n, init, "neuron_udma_engine_abort", m);
	ASSERT_LE(0, abort_at);
	/* An abort: some direction's state or cause register is not zero. */
	EXPECT_NE(0, field(&self->ev[abort_at], "m2s_cause") | field(&self->ev[abort_at], "s2m_cause") |
		     field(&self->ev[abort_at], "m2s_state") | field(&self->ev[abort_at], "s2m_state"));
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s cause=%d", ENG, QID + 1, inst, -EIO);
	reset = find(self->ev, n, abort_at, "neuron_udma_queue_reset", m);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s first=1 last=1 error=%d", ENG, QID + 1,
		 inst, -EIO);
	failed = find(self->ev, n, reset, "neuron_udma_fence_failed", m);
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s fence=2 fences=1", ENG, QID + 1, inst);
	done = find(self->ev, n, failed, "neuron_udma_fence_done", m);
	EXPECT_LT(abort_at, reset);
	EXPECT_LT(reset, failed);
	EXPECT_LT(failed, done);
	/* Fence 1 was never reported done. */
	snprintf(m, sizeof(m), "instance=%s fence=1", inst);
	EXPECT_EQ(-1, find(self->ev, n, 0, "neuron_udma_fence_done", m));
}

/* An import of the caller's pages and its free; a released file's queue ends with its instance. */
TEST_F_TIMEOUT(tr, import_and_release_events, 120)
{
	char m[256], inst[32];
	unsigned char *page;
	int n, imp_at, init, rel;
	__u64 imp;

	page = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(MAP_FAILED, page);
	memset(page, 1, 3 * 4096);
	ASSERT_EQ(0, udma_import(self->fd, page + 100, 2 * 4096, 0, &imp, NULL));
	ASSERT_EQ(0, queue_init(self->fd, ENG, QID + 2, 32, 32));
	ASSERT_EQ(0, mem_free(self->fd, imp));
	/* The file's release ends the queue (no QUEUE_RELEASE). */
	close(self->fd);
	self->fd = -1;
	munmap(page, 3 * 4096);
	n = trace_read(self->bdf, self->ev);
	ASSERT_LT(0, n);
	snprintf(m, sizeof(m), "handle=%llu size=8192 kind=pages", (unsigned long long)imp);
	imp_at = find(self->ev, n, 0, "neuron_udma_buffer_import", m);
	ASSERT_LE(0, imp_at);
	EXPECT_LT(imp_at, find(self->ev, n, imp_at, "neuron_udma_buffer_free", m));
	snprintf(m, sizeof(m), "engine=%d queue=%d tx_descs=32 rx_descs=32", ENG, QID + 2);
	init = find(self->ev, n, 0, "neuron_udma_queue_init", m);
	ASSERT_LE(0, init);
	field_str(&self->ev[init], "instance", inst, sizeof(inst));
	snprintf(m, sizeof(m), "engine=%d queue=%d instance=%s next_fence=1", ENG, QID + 2, inst);
	rel = find(self->ev, n, init, "neuron_udma_queue_release", m);
	EXPECT_LT(init, rel);
}

TEST_HARNESS_MAIN
