// SPDX-License-Identifier: GPL-2.0
/*
 * sysfs files of the driver (rust/kfac/sysfs.h says what Linux 7.3's Rust lacks): a bound
 * device's usage counters and the module parameters.
 */
#include <linux/device.h>
#include <linux/kernel.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/sysfs.h>

#include "dmabuf_internal.h"
#include "sysfs.h"

/*
 * No sysfs attribute abstraction in Rust: the device's counters (memory usage, then activity:
 * rust/counters.rs) as read-only files of the
 * group "neuron_udma" of the PCI device (Documentation/ABI/testing/sysfs-driver-neuron_udma).
 * Each attribute reads one u64 that Rust owns and keeps alive until neuron_udma_usage_remove(),
 * which the unbind calls (sysfs drains the readers first).
 */
static const char *const neuron_udma_usage_names[NEURON_UDMA_USAGE_NR] = {
	"mem_host_bytes", "mem_device_bytes", "mem_imported_bytes",
	"mem_host_peak_bytes", "mem_device_peak_bytes", "mem_imported_peak_bytes",
	"mem_device_total_bytes", "mem_device_stranded_bytes",
	"copies", "copy_bytes", "fences_completed", "fences_failed",
	"queue_resets_engine_error", "queue_resets_timeout", "queue_resets_other", "engine_aborts",
	"ring_host_bytes", "ring_device_bytes", "queue_resets_device", "device_resets",
};

struct neuron_udma_usage {
	struct device *dev;
	struct dev_ext_attribute ext[NEURON_UDMA_USAGE_NR];
	struct attribute *attrs[NEURON_UDMA_USAGE_NR + 1];
	struct attribute_group group;
};

static ssize_t neuron_udma_usage_show(struct device *dev, struct device_attribute *attr,
				      char *buf)
{
	struct dev_ext_attribute *ea = container_of(attr, struct dev_ext_attribute, attr);

	return sysfs_emit(buf, "%llu\n", (unsigned long long)READ_ONCE(*(const u64 *)ea->var));
}

struct neuron_udma_usage *neuron_udma_usage_add(struct device *dev, const u64 *const *vals)
{
	struct neuron_udma_usage *u = kzalloc(sizeof(*u), GFP_KERNEL);
	int i, ret;

	if (!u)
		return ERR_PTR(-ENOMEM);
	u->dev = dev;
	for (i = 0; i < NEURON_UDMA_USAGE_NR; i++) {
		sysfs_attr_init(&u->ext[i].attr.attr);
		u->ext[i].attr.attr.name = neuron_udma_usage_names[i];
		u->ext[i].attr.attr.mode = 0444;
		u->ext[i].attr.show = neuron_udma_usage_show;
		u->ext[i].var = (void *)vals[i];
		u->attrs[i] = &u->ext[i].attr.attr;
	}
	u->group.name = "neuron_udma";
	u->group.attrs = u->attrs;
	ret = sysfs_create_group(&dev->kobj, &u->group);
	if (ret) {
		kfree(u);
		return ERR_PTR(ret);
	}
	return u;
}

void neuron_udma_usage_remove(struct neuron_udma_usage *u)
{
	sysfs_remove_group(&u->dev->kobj, &u->group);
	kfree(u);
}

/*
 * 7.3's module! macro registers Rust parameters with perm 0 (rust/macros/module.rs): they never
 * appear in sysfs. This one is read-only in /sys/module/neuron_udma/parameters/dma_channels.
 */
static unsigned int dma_channels = 4;
module_param(dma_channels, uint, 0444);
MODULE_PARM_DESC(dma_channels, "dmaengine memcpy/memset channels per device (default 4; 0: no dmaengine provider; at most 8)");

unsigned int neuron_udma_dma_channels(void)
{
	return READ_ONCE(dma_channels);
}

/*
 * How descriptors reach the rings of a queue whose rings are in device memory
 * (NEURON_UDMA_QUEUE_DEVICE_RINGS): "bar4", the CPU writes them through BAR4 before each doorbell,
 * or "engine", the driver's H2T queue copies them there from a host staging ring. Read when such
 * a queue is created; writable in /sys/module/neuron_udma/parameters/device_ring_fill (the
 * benchmark measures both). Documentation/neuron-udma.rst says which is the default and why.
 */
static const char *const device_ring_fills[] = { "bar4", "engine" };
static unsigned int device_ring_fill;

static int device_ring_fill_set(const char *val, const struct kernel_param *kp)
{
	int i = sysfs_match_string(device_ring_fills, val);

	if (i < 0)
		return -EINVAL;
	WRITE_ONCE(device_ring_fill, i);
	return 0;
}

static int device_ring_fill_get(char *buf, const struct kernel_param *kp)
{
	return scnprintf(buf, PAGE_SIZE, "%s\n", device_ring_fills[READ_ONCE(device_ring_fill)]);
}

static const struct kernel_param_ops device_ring_fill_ops = {
	.set = device_ring_fill_set,
	.get = device_ring_fill_get,
};
module_param_cb(device_ring_fill, &device_ring_fill_ops, NULL, 0644);
MODULE_PARM_DESC(device_ring_fill, "how descriptors reach rings in device memory: bar4 (the default: CPU writes through BAR4) or engine (the H2T queue copies them)");

bool neuron_udma_device_rings_by_engine(void)
{
	return READ_ONCE(device_ring_fill) == 1;
}

/*
 * The most live buffers (allocated and imported) one open file may hold: EMFILE past it. Read
 * when a file is opened; writable by root in /sys/module/neuron_udma/parameters/max_buffers
 * (1 to 1048576), so an administrator can bound the kernel memory one file holds, and the
 * kselftest reaches the bound in seconds instead of minutes.
 */
#define NEURON_UDMA_MAX_BUFFERS_LIMIT (1U << 20)
static unsigned int max_buffers = 65536;

static int max_buffers_set(const char *val, const struct kernel_param *kp)
{
	unsigned int n;
	int ret = kstrtouint(val, 0, &n);

	if (ret)
		return ret;
	if (n == 0 || n > NEURON_UDMA_MAX_BUFFERS_LIMIT)
		return -EINVAL;
	WRITE_ONCE(max_buffers, n);
	return 0;
}

static int max_buffers_get(char *buf, const struct kernel_param *kp)
{
	return scnprintf(buf, PAGE_SIZE, "%u\n", READ_ONCE(max_buffers));
}

static const struct kernel_param_ops max_buffers_ops = {
	.set = max_buffers_set,
	.get = max_buffers_get,
};
module_param_cb(max_buffers, &max_buffers_ops, NULL, 0644);
MODULE_PARM_DESC(max_buffers, "most live buffers of one open file, read at open (1 to 1048576; default 65536)");

unsigned int neuron_udma_max_buffers(void)
{
	return READ_ONCE(max_buffers);
}

/*
 * dma-buf exports to pinned importers (rust/kfac/dmabuf_export.c), looked at on every attach
 * and unbind (a change applies from the next one).
 */
static bool dmabuf_pinned_importers;
module_param(dmabuf_pinned_importers, bool, 0644);
MODULE_PARM_DESC(dmabuf_pinned_importers, "admit dma-buf importers of device memory that cannot be revoked (pinned, as EFA registers dma-bufs), read at each attach; an unbind cannot take the memory back from them (default N)");

bool neuron_udma_dmabuf_pinned_importers(void)
{
	return READ_ONCE(dmabuf_pinned_importers);
}

/* Below the hung-task detector's default 120 s: the unbind waits uninterruptibly. */
#define NEURON_UDMA_PINNED_WAIT_MAX_MS 100000
static unsigned int dmabuf_pinned_unbind_wait_ms = 10000;

static int pinned_unbind_wait_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 0, NEURON_UDMA_PINNED_WAIT_MAX_MS);
}

static const struct kernel_param_ops pinned_unbind_wait_ops = {
	.set = pinned_unbind_wait_set,
	.get = param_get_uint,
};
module_param_cb(dmabuf_pinned_unbind_wait_ms, &pinned_unbind_wait_ops,
		&dmabuf_pinned_unbind_wait_ms, 0644);
MODULE_PARM_DESC(dmabuf_pinned_unbind_wait_ms, "how long an unbind waits in all for pinned importers to unmap device memory, in ms, before it leaves their ranges reserved and goes on (0 to 100000; default 10000)");

unsigned int neuron_udma_dmabuf_pinned_unbind_wait_ms(void)
{
	return READ_ONCE(dmabuf_pinned_unbind_wait_ms);
}
