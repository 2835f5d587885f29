/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Helpers of the neuron_udma security kselftests: the guest set up for unprivileged users,
 * children running as another uid, memory shared with them, clocks, and probes of a mapping
 * that may raise SIGBUS, and dropping CAP_IPC_LOCK.
 */
#ifndef _UDMA_SEC_H
#define _UDMA_SEC_H

#include <grp.h>
#include <linux/capability.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#include "udma_util.h"

#define UID_A 1001
#define UID_B 1002

/*
 * Makes the guest usable by unprivileged users (as root): "/" searchable, /tmp sticky and
 * world-writable, the device node of mode @node_mode. 0 or -errno.
 */
static inline int sec_setup(mode_t node_mode)
{
	if (chmod("/", 0755) || chmod("/dev", 0755) || chmod("/tmp", 01777))
		return -errno;
	return chmod(UDMA_DEV, node_mode) ? -errno : 0;
}

/* Drops every privilege of this process for uid = gid = @uid. 0 or -errno. */
static inline int sec_drop(uid_t uid)
{
	if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
		return -errno;
	return geteuid() == uid && getegid() == uid ? 0 : -EPERM;
}

/*
 * Drops CAP_IPC_LOCK from this process (its uids stay as they are: an effective uid 0 can still
 * write /proc/sys/vm), so that RLIMIT_MEMLOCK limits it. 0 or -errno.
 */
static inline int drop_ipc_lock(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[2];

	if (syscall(SYS_capget, &hdr, data))
		return -errno;
	data[CAP_IPC_LOCK / 32].effective &= ~(1U << (CAP_IPC_LOCK % 32));
	data[CAP_IPC_LOCK / 32].permitted &= ~(1U << (CAP_IPC_LOCK % 32));
	data[CAP_IPC_LOCK / 32].inheritable &= ~(1U << (CAP_IPC_LOCK % 32));
	return syscall(SYS_capset, &hdr, data) ? -errno : 0;
}

/*
 * Lets this process and its children pin @bytes of host buffers (RLIMIT_MEMLOCK, which host
 * buffers are charged to): the default 8 MiB of an unprivileged user is tight for some tests.
 */
static inline int sec_memlock(rlim_t bytes)
{
	struct rlimit lim = { bytes, bytes };

	return setrlimit(RLIMIT_MEMLOCK, &lim) ? -errno : 0;
}

/* The "KEY: N kB" line of the proc file @path, in KiB, or -1. */
static inline long proc_kib(const char *path, const char *key)
{
	char line[256];
	size_t n = strlen(key);
	long kb = -1;
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':' &&
		    sscanf(line + n + 1, " %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* VmLck of this process in KiB (locked_vm, what RLIMIT_MEMLOCK is checked against), or -1. */
static inline long vmlck_kib(void)
{
	return proc_kib("/proc/self/status", "VmLck");
}

/* MemAvailable of the system in KiB, or -1. */
static inline long mem_available_kib(void)
{
	return proc_kib("/proc/meminfo", "MemAvailable");
}

/* Anonymous memory shared with forked children (zeroed), or NULL. */
static inline void *sec_shared(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

/* Monotonic time in milliseconds. */
static inline double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline void sleep_ms(unsigned int ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/*
 * Forks a child that becomes @uid (unless @uid is 0) and exits with fn(arg); a failed drop
 * exits 125. Returns the pid or -errno.
 */
static inline pid_t sec_spawn(uid_t uid, int (*fn)(void *), void *arg)
{
	pid_t pid = fork();

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		if (uid && sec_drop(uid))
			_exit(125);
		_exit(fn(arg));
	}
	return pid;
}

/* Waits for @pid: its exit status, 128 + signal if killed, -errno on a wait error. */
static inline int sec_reap(pid_t pid)
{
	int status;

	if (waitpid(pid, &status, 0) != pid)
		return -errno;
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return WEXITSTATUS(status);
}

/* MEM_ALLOC without a mapping: 0 and the handle/offset, or -errno. */
static inline int raw_alloc(int fd, __u32 type, __u64 size, __u64 *handle, __u64 *off)
{
	struct neuron_udma_mem_alloc a = { .size = size, .type = type };
	int ret = udma_ioc(fd, NEURON_UDMA_MEM_ALLOC, &a);

	if (!ret) {
		*handle = a.handle;
		if (off)
			*off = a.mmap_offset;
	}
	return ret;
}

/* ---- probing memory that may be gone: SIGBUS/SIGSEGV are caught ---- */

static sigjmp_buf sec_probe_env;
static volatile sig_atomic_t sec_probe_armed;

static inline void sec_probe_handler(int sig)
{
	if (sec_probe_armed)
		siglongjmp(sec_probe_env, sig);
	signal(sig, SIG_DFL);
	raise(sig);
}

static inline int sec_probe_install(void)
{
	struct sigaction sa = { .sa_handler = sec_probe_handler };

	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) || sigaction(SIGSEGV, &sa, NULL))
		return -errno;
	return 0;
}

#define PROBE_OK 0	/* the access worked */

/*
 * Reads (or writes, if @write) the byte at @p in the calling thread: PROBE_OK, or the signal
 * the access raised (SIGBUS, SIGSEGV). A read stores the byte in *@val.
 */
static inline int sec_probe(volatile unsigned char *p, bool write, unsigned char *val)
{
	int sig = sigsetjmp(sec_probe_env, 1);

	if (sig) {
		sec_probe_armed = 0;
		return sig;
	}
	sec_probe_armed = 1;
	if (write)
		*p = 0xA5;
	else
		*val = *p;
	sec_probe_armed = 0;
	return PROBE_OK;
}

#endif /* _UDMA_SEC_H */
