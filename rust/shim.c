// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers of neuron_udma for what Linux 7.3 has no Rust abstraction for; rust/shim.h declares
 * them, and says for each which abstraction is missing.
 */
#include <linux/dma-buf.h>
#include <linux/dma-buf-mapping.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/eventfd.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/io_uring/cmd.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/sched/mm.h>
#include <linux/sched/user.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "shim.h"
#include "../include/uapi/linux/neuron_udma.h"

static void neuron_udma_vm_open(struct vm_area_struct *vma)
{
	neuron_udma_vma_get(vma->vm_private_data);
}

static void neuron_udma_vm_close(struct vm_area_struct *vma)
{
	neuron_udma_vma_put(vma->vm_private_data);
}

static vm_fault_t neuron_udma_vm_fault(struct vm_fault *vmf)
{
	u32 ret = neuron_udma_vma_fault(vmf->vma->vm_private_data, vmf->pgoff, vmf);

	return ret == U32_MAX ? VM_FAULT_SIGBUS : (vm_fault_t)ret;
}

static const struct vm_operations_struct neuron_udma_vm_ops = {
	.open = neuron_udma_vm_open,
	.close = neuron_udma_vm_close,
	.fault = neuron_udma_vm_fault,
};

/*
 * No vm_operations_struct in Rust: make @vma a mapping of a whole host buffer whose pages are
 * inserted one by one on fault (rust/buffer.rs decides under the buffer's lock whether the page
 * still exists). @buf is a counted reference to the buffer, dropped by ->close. Nothing is
 * mapped here, so a mapping that is linked after the buffer was freed never reaches its memory.
 */
int neuron_udma_mmap_buffer(struct vm_area_struct *vma, const struct neuron_udma_buffer *buf,
			    u64 size, bool wc)
{
	if (vma->vm_end - vma->vm_start != PAGE_ALIGN(size))
		return -EINVAL;
	/*
	 * Device memory (BAR4) is mapped write-combined, as the reference driver maps it; where
	 * the platform tracks memory types (x86 PAT) a page keeps the type the BAR already has.
	 */
	if (wc)
		vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	/* VM_IO, VM_DONTEXPAND, VM_DONTDUMP and VM_DONTCOPY are set by Rust (VmaNew). */
	vm_flags_set(vma, VM_PFNMAP);
	vma->vm_private_data = (void *)buf;
	vma->vm_ops = &neuron_udma_vm_ops;
	return 0;
}

/*
 * No vmf_insert_pfn() in Rust: map the page of coherent memory at @cpu_addr at the faulting
 * address. Coherent memory is either in the linear map (dma-direct) or vmap'ed (an IOMMU or a
 * remapping allocator); the pfn is looked up accordingly.
 */
vm_fault_t neuron_udma_insert_page(struct vm_fault *vmf, void *cpu_addr)
{
	unsigned long pfn = is_vmalloc_addr(cpu_addr) ? vmalloc_to_pfn(cpu_addr) :
							page_to_pfn(virt_to_page(cpu_addr));

	return vmf_insert_pfn(vmf->vma, vmf->address, pfn);
}

/* A page of device memory (BAR4), mapped with the VMA's protection (write-combined). */
vm_fault_t neuron_udma_insert_pfn(struct vm_fault *vmf, u64 pfn)
{
	return vmf_insert_pfn_prot(vmf->vma, vmf->address, pfn, vmf->vma->vm_page_prot);
}

/*
 * No sysfs attribute abstraction in Rust: the device's usage counters as read-only files of the
 * group "neuron_udma" of the PCI device (Documentation/ABI/testing/sysfs-driver-neuron_udma).
 * Each attribute reads one u64 that Rust owns and keeps alive until neuron_udma_usage_remove(),
 * which the unbind calls (sysfs drains the readers first).
 */
static const char *const neuron_udma_usage_names[NEURON_UDMA_USAGE_NR] = {
	"mem_host_bytes", "mem_device_bytes", "mem_imported_bytes",
	"mem_host_peak_bytes", "mem_device_peak_bytes", "mem_imported_peak_bytes",
	"mem_device_total_bytes",
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
 * No locked-memory accounting in Rust: charge @pages of pinned memory to the calling user's
 * locked_vm, limited by RLIMIT_MEMLOCK unless the caller has CAP_IPC_LOCK (as io_uring charges
 * its pinned pages). The charge belongs to the user, not to a process: it lasts as long as the
 * memory, also when the allocating process exits while the file lives on in others. On success
 * *@userp holds a reference to the charged user for neuron_udma_uncharge().
 */
#if !(defined(CONFIG_NET) || defined(CONFIG_IO_URING) || defined(CONFIG_VFIO_PCI_ZDEV_KVM) || \
      IS_ENABLED(CONFIG_IOMMUFD) || defined(CONFIG_SECRETMEM))
#error "neuron_udma charges pinned memory to user_struct::locked_vm: it needs CONFIG_NET or CONFIG_IO_URING"
#endif
int neuron_udma_charge(unsigned long pages, struct user_struct **userp)
{
	struct user_struct *user = get_current_user();
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	unsigned long cur = atomic_long_read(&user->locked_vm), new;

	do {
		new = cur + pages;
		if (new > limit && !capable(CAP_IPC_LOCK)) {
			free_uid(user);
			return -ENOMEM;
		}
	} while (!atomic_long_try_cmpxchg(&user->locked_vm, &cur, new));
	*userp = user;
	return 0;
}

/* Give back a charge of neuron_udma_charge(). */
void neuron_udma_uncharge(struct user_struct *user, unsigned long pages)
{
	atomic_long_sub(pages, &user->locked_vm);
	free_uid(user);
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
 * No fatal_signal_pending() in Rust: whether the current task was killed, for waits that must
 * not be interrupted by other signals but must end on SIGKILL.
 */
bool neuron_udma_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

/*
 * Pinned user memory of a MEM_IMPORT. No pin_user_pages() in Rust, and the Rust SGTable only
 * takes pages it allocated itself.
 */
struct neuron_udma_pin {
	struct sg_table sgt;
	struct page **pages;
	unsigned long npages;
	/* The device the table is mapped for (a counted reference), NULL while unmapped. */
	struct device *dev;
	bool write;
};

/* Pages pinned per pin_user_pages_fast() call: bounds the time between signal checks. */
#define NEURON_UDMA_PIN_BATCH 4096

static enum dma_data_direction neuron_udma_pin_dir(const struct neuron_udma_pin *pin)
{
	return pin->write ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
}

/*
 * Pin the caller's pages under [@addr, @addr + @size) for long-term DMA (FOLL_LONGTERM, so
 * they are migrated out of movable zones first; FOLL_WRITE if the device may write them) and
 * build the scatter-gather table of exactly those bytes (the first entry starts at @addr's
 * offset in its page, physically contiguous pages share an entry). Nothing is mapped for a
 * device yet. Returns the pin, or ERR_PTR(-EFAULT) (a page not mapped, or read-only with
 * @write), -ENOMEM, -EOPNOTSUPP (memory that cannot be pinned long-term), -EINTR (a fatal
 * signal); nothing stays pinned on error.
 */
struct neuron_udma_pin *neuron_udma_pin_user(u64 addr, u64 size, bool write)
{
	unsigned int gup = FOLL_LONGTERM | (write ? FOLL_WRITE : 0);
	unsigned long first = addr >> PAGE_SHIFT;
	unsigned long done = 0, npages;
	struct neuron_udma_pin *pin;
	long ret;

	if (!size || addr + size < addr)
		return ERR_PTR(-EINVAL);
	npages = ((addr + size - 1) >> PAGE_SHIFT) - first + 1;
	pin = kzalloc(sizeof(*pin), GFP_KERNEL_ACCOUNT);
	if (!pin)
		return ERR_PTR(-ENOMEM);
	pin->write = write;
	pin->pages = kvmalloc_array(npages, sizeof(*pin->pages), GFP_KERNEL_ACCOUNT);
	if (!pin->pages) {
		ret = -ENOMEM;
		goto free_pin;
	}
	while (done < npages) {
		if (fatal_signal_pending(current)) {
			ret = -EINTR;
			goto unpin;
		}
		ret = pin_user_pages_fast((first + done) << PAGE_SHIFT,
					  min(npages - done, (unsigned long)NEURON_UDMA_PIN_BATCH),
					  gup, pin->pages + done);
		if (ret <= 0) {
			ret = ret ?: -EFAULT;
			goto unpin;
		}
		done += ret;
		cond_resched();
	}
	ret = sg_alloc_table_from_pages_segment(&pin->sgt, pin->pages, npages,
						offset_in_page(addr), size,
						UINT_MAX & PAGE_MASK, GFP_KERNEL_ACCOUNT);
	if (ret)
		goto unpin;
	pin->npages = npages;
	return pin;

unpin:
	unpin_user_pages(pin->pages, done);
	kvfree(pin->pages);
free_pin:
	kfree(pin);
	return ERR_PTR(ret);
}

/*
 * No DMA mapping of foreign pages in Rust: map @pin's table for @dev. Memory that @dev could
 * only reach through bounce buffers is refused with -EOPNOTSUPP: the engine writes the pages at
 * any time, and a bounce buffer would be copied back only at unmap.
 */
int neuron_udma_pin_map(struct neuron_udma_pin *pin, struct device *dev)
{
	int ret;

	/*
	 * DMA_ATTR_REQUIRE_COHERENT: dma-direct and dma-iommu refuse (-EIO) a non-coherent device
	 * and any bounce buffer, so no mapping needs a sync; and DMA-API debug does not track
	 * cacheline overlaps (a user may import one page any number of times).
	 */
	ret = dma_map_sgtable(dev, &pin->sgt, neuron_udma_pin_dir(pin), DMA_ATTR_REQUIRE_COHERENT);
	if (ret)
		return ret == -EIO ? -EOPNOTSUPP : ret;
	pin->dev = get_device(dev);
	return 0;
}

/*
 * No dma_set_seg_boundary() in Rust: the engine takes 64-bit addresses and the driver splits
 * copies itself (rust/span.rs), so a mapped segment may cross any boundary (the segment length
 * is lifted in Rust, dma_set_max_seg_size()). Called at probe, before any mapping.
 */
void neuron_udma_dma_no_seg_boundary(struct device *dev)
{
	dma_set_seg_boundary(dev, ULONG_MAX);
}

/* The scatter-gather table of @pin (DMA addresses valid once mapped). */
struct sg_table *neuron_udma_pin_sgt(struct neuron_udma_pin *pin)
{
	return &pin->sgt;
}

/*
 * Unmap @pin (if mapped), unpin its pages (dirtied if the device may have written them) and
 * free it. The caller made sure no descriptor can reach the pages any more.
 */
void neuron_udma_pin_release(struct neuron_udma_pin *pin)
{
	if (pin->dev) {
		dma_unmap_sgtable(pin->dev, &pin->sgt, neuron_udma_pin_dir(pin),
				  DMA_ATTR_REQUIRE_COHERENT);
		put_device(pin->dev);
	}
	sg_free_table(&pin->sgt);
	unpin_user_pages_dirty_lock(pin->pages, pin->npages, pin->write);
	kvfree(pin->pages);
	kfree(pin);
}

/*
 * No unmap_mapping_range() in Rust: remove every user mapping of bytes [@offset, @offset +
 * @len) of @file's mapping, before the memory behind them is freed. Later accesses fault and
 * find the buffer gone (SIGBUS).
 */
void neuron_udma_zap(struct file *file, u64 offset, u64 len)
{
	unmap_mapping_range(file->f_mapping, offset, len, 1);
}

/*
 * No dmaengine abstraction in Rust: the provider of rust/dmaengine.rs, laid out as idxd's: one
 * allocation per device holds the dma_device and one struct dma_chan per channel, each pointing to
 * its Rust channel (a counted reference, owned by the dma_device until its release); a client
 * descriptor embeds its struct dma_async_tx_descriptor and points to its Rust descriptor. Cookies
 * are the dmaengine core's (dma_cookie_*() of drivers/dma/dmaengine.h); channel state, descriptor
 * building and completion are Rust's.
 */
#if __has_include("dmaengine.h")
#include "dmaengine.h"
#else
#error "neuron_udma needs drivers/dma/dmaengine.h of the kernel's source tree (the dmaengine core's cookie helpers): build against a kernel build tree with its sources, not a header package"
#endif

struct neuron_udma_dchan {
	struct dma_chan chan;
	const struct neuron_udma_dma_chan *rs;
};

struct neuron_udma_dma {
	struct dma_device ddev;
	struct list_head released;
	unsigned int nr;
	struct neuron_udma_dchan chans[];
};

struct neuron_udma_txd {
	struct dma_async_tx_descriptor txd;
	struct neuron_udma_dma_desc *rs;
};

static const struct neuron_udma_dma_chan *neuron_udma_rs(struct dma_chan *chan)
{
	return container_of(chan, struct neuron_udma_dchan, chan)->rs;
}

static int neuron_udma_alloc_chan_resources(struct dma_chan *chan)
{
	int ret = neuron_udma_dma_alloc_chan(neuron_udma_rs(chan));

	if (!ret)
		dma_cookie_init(chan);
	return ret;
}

static void neuron_udma_free_chan_resources(struct dma_chan *chan)
{
	neuron_udma_dma_free_chan(neuron_udma_rs(chan));
}

static dma_cookie_t neuron_udma_tx_submit(struct dma_async_tx_descriptor *txd)
{
	struct neuron_udma_txd *d = container_of(txd, struct neuron_udma_txd, txd);

	return neuron_udma_dma_submit(neuron_udma_rs(txd->chan), d->rs);
}

/* A descriptor of @chan for Rust to fill in, or NULL (GFP_NOWAIT: prep may be atomic). */
static struct neuron_udma_txd *neuron_udma_txd_new(struct dma_chan *chan, unsigned long flags)
{
	struct neuron_udma_txd *d = kzalloc(sizeof(*d), GFP_NOWAIT);

	if (!d)
		return NULL;
	dma_async_tx_descriptor_init(&d->txd, chan);
	d->txd.flags = flags;
	d->txd.tx_submit = neuron_udma_tx_submit;
	return d;
}

static struct dma_async_tx_descriptor *
neuron_udma_prep_memcpy(struct dma_chan *chan, dma_addr_t dst, dma_addr_t src, size_t len,
			unsigned long flags)
{
	struct neuron_udma_txd *d = neuron_udma_txd_new(chan, flags);
	struct neuron_udma_dma_desc *rs;

	if (!d)
		return NULL;
	/* From here on Rust owns @d: it has freed it if it returns NULL (so @d is not touched). */
	rs = neuron_udma_dma_prep(neuron_udma_rs(chan), &d->txd, dst, src, len);
	if (!rs)
		return NULL;
	d->rs = rs;
	return &d->txd;
}

/* DMA_MEMSET: @value's low byte, as dmatest and the other providers read it. */
static struct dma_async_tx_descriptor *
neuron_udma_prep_memset(struct dma_chan *chan, dma_addr_t dst, int value, size_t len,
			unsigned long flags)
{
	struct neuron_udma_txd *d = neuron_udma_txd_new(chan, flags);
	struct neuron_udma_dma_desc *rs;

	if (!d)
		return NULL;
	/* As for memcpy: Rust owns @d now. */
	rs = neuron_udma_dma_prep_memset(neuron_udma_rs(chan), &d->txd, dst, (u8)value, len);
	if (!rs)
		return NULL;
	d->rs = rs;
	return &d->txd;
}

static void neuron_udma_issue_pending(struct dma_chan *chan)
{
	neuron_udma_dma_issue(neuron_udma_rs(chan));
}

/*
 * DMA_COMPLETE, or DMA_ERROR for a cookie whose transfer was aborted (rust/dmaengine.rs keeps
 * the last failed ranges), or DMA_IN_PROGRESS with the residue of its descriptor.
 */
static enum dma_status neuron_udma_tx_status(struct dma_chan *chan, dma_cookie_t cookie,
					     struct dma_tx_state *state)
{
	const struct neuron_udma_dma_chan *rs = neuron_udma_rs(chan);
	enum dma_status st = dma_cookie_status(chan, cookie, state);

	if (st == DMA_COMPLETE)
		return neuron_udma_dma_failed(rs, cookie) ? DMA_ERROR : DMA_COMPLETE;
	dma_set_residue(state, neuron_udma_dma_residue(rs, cookie));
	return st;
}

static int neuron_udma_terminate_all(struct dma_chan *chan)
{
	neuron_udma_dma_terminate(neuron_udma_rs(chan));
	return 0;
}

static void neuron_udma_synchronize(struct dma_chan *chan)
{
	neuron_udma_dma_sync(neuron_udma_rs(chan));
}

/*
 * Released dma_devices, freed at module unload. When the last client lets go of a channel after
 * unregister, the release runs inside dma_release_channel() -> dma_chan_put() ->
 * dma_device_put(), and dma_release_channel() still reads and writes the channel (chan->slave,
 * chan->dbg_client_name) after dma_chan_put() returns: the struct dma_chan, embedded here, must
 * outlive the release. A client holds a module reference until dma_chan_put() ends, so the
 * memory is kept until the module is unloaded.
 */
static LIST_HEAD(neuron_udma_released);
static DEFINE_SPINLOCK(neuron_udma_released_lock);

/* The last reference is gone (after unregister): give the channels back to Rust. */
static void neuron_udma_release(struct dma_device *ddev)
{
	struct neuron_udma_dma *dma = container_of(ddev, struct neuron_udma_dma, ddev);
	unsigned int i;

	for (i = 0; i < dma->nr; i++)
		neuron_udma_dma_put_chan(dma->chans[i].rs);
	spin_lock(&neuron_udma_released_lock);
	list_add(&dma->released, &neuron_udma_released);
	spin_unlock(&neuron_udma_released_lock);
}

/* Module unload: frees the released dma_devices (no client holds a channel any more). */
void neuron_udma_dma_free_released(void)
{
	struct neuron_udma_dma *dma, *next;
	LIST_HEAD(list);

	spin_lock(&neuron_udma_released_lock);
	list_splice_init(&neuron_udma_released, &list);
	spin_unlock(&neuron_udma_released_lock);
	list_for_each_entry_safe(dma, next, &list, released)
		kfree(dma);
}

/*
 * Registers a DMA_MEMCPY and DMA_MEMSET dma_device of @dev with @nr channels backed by the Rust channels
 * @chans; on success the dma_device owns one reference of each (given back by the release). The
 * channels are private (DMA_PRIVATE): only clients that ask for a channel get one, never async_tx
 * or the opportunistic dma_find_channel() users (Documentation/neuron-udma.rst, "dmaengine").
 */
struct neuron_udma_dma *neuron_udma_dma_register(struct device *dev,
						 struct neuron_udma_dma_chan *const *chans,
						 unsigned int nr)
{
	struct neuron_udma_dma *dma = kzalloc(struct_size(dma, chans, nr), GFP_KERNEL);
	struct dma_device *dd;
	unsigned int i;
	int ret;

	if (!dma)
		return ERR_PTR(-ENOMEM);
	dd = &dma->ddev;
	dma->nr = nr;
	dd->dev = dev;
	INIT_LIST_HEAD(&dd->channels);
	dma_cap_set(DMA_MEMCPY, dd->cap_mask);
	dma_cap_set(DMA_MEMSET, dd->cap_mask);
	dma_cap_set(DMA_PRIVATE, dd->cap_mask);
	/* The engine copies any byte count from any byte address. */
	dd->copy_align = DMAENGINE_ALIGN_1_BYTE;
	dd->directions = BIT(DMA_MEM_TO_MEM);
	dd->residue_granularity = DMA_RESIDUE_GRANULARITY_DESCRIPTOR;
	dd->device_alloc_chan_resources = neuron_udma_alloc_chan_resources;
	dd->device_free_chan_resources = neuron_udma_free_chan_resources;
	dd->device_prep_dma_memcpy = neuron_udma_prep_memcpy;
	dd->device_prep_dma_memset = neuron_udma_prep_memset;
	dd->device_issue_pending = neuron_udma_issue_pending;
	dd->device_tx_status = neuron_udma_tx_status;
	dd->device_terminate_all = neuron_udma_terminate_all;
	dd->device_synchronize = neuron_udma_synchronize;
	dd->device_release = neuron_udma_release;
	for (i = 0; i < nr; i++) {
		dma->chans[i].rs = chans[i];
		dma->chans[i].chan.device = dd;
		dma_cookie_init(&dma->chans[i].chan);
		list_add_tail(&dma->chans[i].chan.device_node, &dd->channels);
	}
	ret = dma_async_device_register(dd);
	if (ret) {
		/* The release never runs: the channels stay the caller's. */
		kfree(dma);
		return ERR_PTR(ret);
	}
	return dma;
}

/*
 * Unregisters @dma: no new client finds its channels. The dma_device (and the Rust channels it
 * holds) is freed by the release once the last client gave its channel back.
 */
void neuron_udma_dma_unregister(struct neuron_udma_dma *dma)
{
	dma_async_device_unregister(&dma->ddev);
}

/* The next cookie of @txd's channel (the caller serialises submissions of a channel). */
dma_cookie_t neuron_udma_txd_assign_cookie(struct dma_async_tx_descriptor *txd)
{
	return dma_cookie_assign(txd);
}

/* @txd is done (or dropped): its channel's completed cookie moves up to it, in cookie order. */
void neuron_udma_txd_cookie_complete(struct dma_async_tx_descriptor *txd)
{
	dma_cookie_complete(txd);
}

bool neuron_udma_txd_acked(struct dma_async_tx_descriptor *txd)
{
	return async_tx_test_ack(txd);
}

/*
 * Finishes @txd: unmaps what the client asked to be unmapped, then runs its callback if it
 * asked for one (DMA_PREP_INTERRUPT), with @result (enum dmaengine_tx_result) and @residue in
 * bytes. Called without any lock of the driver held: the callback may submit more work.
 */
void neuron_udma_txd_callback(struct dma_async_tx_descriptor *txd, u32 result, u32 residue)
{
	struct dmaengine_result res = { .result = result, .residue = residue };

	dma_descriptor_unmap(txd);
	if (txd->flags & DMA_PREP_INTERRUPT)
		dmaengine_desc_get_callback_invoke(txd, &res);
}

/* Frees @txd (and the client's unmap data if it never completed). */
void neuron_udma_txd_free(struct dma_async_tx_descriptor *txd)
{
	dma_descriptor_unmap(txd);
	kfree(container_of(txd, struct neuron_udma_txd, txd));
}

/* No eventfd in Rust: the eventfd of @fd (a counted reference), or an error pointer. */
struct eventfd_ctx *neuron_udma_eventfd_get(int fd)
{
	return eventfd_ctx_fdget(fd);
}

/* Adds 1 to @ctx's counter, waking its readers. */
void neuron_udma_eventfd_signal(struct eventfd_ctx *ctx)
{
	eventfd_signal(ctx);
}

/* Gives back a reference of neuron_udma_eventfd_get(). */
void neuron_udma_eventfd_put(struct eventfd_ctx *ctx)
{
	eventfd_ctx_put(ctx);
}

/*
 * 7.3's MiscDevice has no poll (rust/node.rs adds this to its file operations): the file's
 * private data is the Rust open file (rust/file.rs).
 */
__poll_t neuron_udma_poll(struct file *file, struct poll_table_struct *wait)
{
	return neuron_udma_file_poll(file->private_data, file, wait);
}

/*
 * What a queued NEURON_UDMA_URING_COPY keeps in its io_uring_cmd: its queue, the queue's
 * instance (ids are reused after a release, instances never are) and its fence.
 */
struct neuron_udma_uring_pdu {
	u32 engine;
	u32 queue;
	u64 instance;
	u64 fence;
	int res;
};

void neuron_udma_uring_pdu_set(struct io_uring_cmd *cmd, u32 engine, u32 queue, u64 instance,
			       u64 fence)
{
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	pdu->engine = engine;
	pdu->queue = queue;
	pdu->instance = instance;
	pdu->fence = fence;
}

void neuron_udma_uring_pdu_get(struct io_uring_cmd *cmd, u32 *engine, u32 *queue, u64 *instance,
			       u64 *fence)
{
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	*engine = pdu->engine;
	*queue = pdu->queue;
	*instance = pdu->instance;
	*fence = pdu->fence;
}

/*
 * No io_uring command abstraction in Rust: the uring_cmd file operation. The command's fields
 * are read once from the SQE (user-shared memory); the copies are prepared where the command may
 * sleep (a non-blocking issue is sent back to io_uring's workers with -EAGAIN).
 */
int neuron_udma_uring_cmd(struct io_uring_cmd *cmd, unsigned int issue_flags)
{
	const struct neuron_udma_uring_copy *c;
	u32 engine, queue, count;
	u64 copies;

	if (cmd->cmd_op != NEURON_UDMA_URING_COPY)
		return -ENOTTY;
	if (issue_flags & IO_URING_F_NONBLOCK)
		return -EAGAIN;
	c = io_uring_sqe_cmd(cmd->sqe, struct neuron_udma_uring_copy);
	engine = READ_ONCE(c->engine);
	queue = READ_ONCE(c->queue);
	count = READ_ONCE(c->count);
	copies = READ_ONCE(c->copies);
	return neuron_udma_uring_submit(cmd->file->private_data, cmd, engine, queue, count, copies,
					issue_flags & IO_URING_F_IOPOLL,
					cmd->file->f_mode & FMODE_WRITE);
}

/* The uring_cmd_iopoll file operation: 1 if @cmd completed. */
int neuron_udma_uring_cmd_iopoll(struct io_uring_cmd *cmd, struct io_comp_batch *iob,
				 unsigned int poll_flags)
{
	return neuron_udma_uring_poll(cmd->file->private_data, cmd);
}

static void neuron_udma_uring_task_cb(struct io_tw_req tw_req, io_tw_token_t tw)
{
	struct io_uring_cmd *cmd = io_uring_cmd_from_tw(tw_req);
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	io_uring_cmd_done(cmd, pdu->res, IO_URING_CMD_TASK_WORK_ISSUE_FLAGS);
}

/*
 * Completes a queued (non-IOPOLL) command with @res from any context: the CQE is posted from the
 * submitter's task work.
 */
void neuron_udma_uring_cmd_complete(struct io_uring_cmd *cmd, int res)
{
	io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu)->res = res;
	io_uring_cmd_complete_in_task(cmd, neuron_udma_uring_task_cb);
}

/* Completes an IOPOLL command with @res, from its uring_cmd_iopoll. */
void neuron_udma_uring_cmd_done(struct io_uring_cmd *cmd, int res)
{
	io_uring_cmd_done(cmd, res, 0);
}

/* No flush_work() in Rust: wait until @work is neither queued nor running. */
void neuron_udma_flush_work(struct work_struct *work)
{
	flush_work(work);
}

/*
 * ---- dma-buf: no Rust abstraction in 7.3 ----
 *
 * Export (NEURON_UDMA_DMABUF_EXPORT): a dma-buf of a range of device memory, which is BAR4 (a
 * device address is its BAR4 offset, rust/arch.rs). Importers get the bus addresses of that
 * range from the PCI P2PDMA provider of BAR4 (dma_buf_phys_vec_to_sgt(), as vfio-pci exports
 * BARs). Only importers that can be revoked attach (a dynamic attachment with
 * invalidate_mappings, as vfio-pci requires): at unbind every export is revoked
 * (neuron_udma_dmabuf_revoke_all()) and the unbind waits until every importer unmapped, so no
 * importer reaches the BAR (nor the provider, which devres frees) after it. The dma-buf holds a
 * module reference (exp_info.owner) and, through its Rust hold, the buffer: the device memory
 * goes back to the allocator only when the last reference to the dma-buf is gone, and it is
 * scrubbed before its next MEM_ALLOC.
 */
MODULE_IMPORT_NS("DMA_BUF");

/* BAR holding device memory (rust/driver.rs). */
#define NEURON_UDMA_DRAM_BAR 4

struct neuron_udma_export {
	/* In neuron_udma_exports while the dma-buf lives and is not being revoked. */
	struct list_head node;
	struct dma_buf *dmabuf;
	/* The exporting device: an address to compare, kept alive by @hold. */
	struct device *dev;
	struct p2pdma_provider *provider;
	/* The CPU physical range of the buffer in BAR4. */
	struct phys_vec phys;
	/* One per live mapping, and one until the export is revoked. */
	struct kref maps;
	struct completion unmapped;
	/* Under the dma-buf's reservation lock: no new mapping (the device is going away). */
	bool revoked;
	/* rust/dmabuf.rs: the exported buffer (busy) and its device, given back by ->release. */
	struct neuron_udma_export_hold *hold;
};

static LIST_HEAD(neuron_udma_exports);
static DEFINE_MUTEX(neuron_udma_exports_lock);

static void neuron_udma_export_unmapped(struct kref *kref)
{
	complete(&container_of(kref, struct neuron_udma_export, maps)->unmapped);
}

/*
 * Only importers that reach the BAR (peer-to-peer) and can be revoked: a pinned importer
 * without invalidate_mappings could keep its mapping past unbind.
 */
static int neuron_udma_dmabuf_attach(struct dma_buf *dmabuf, struct dma_buf_attachment *attach)
{
	struct neuron_udma_export *exp = dmabuf->priv;

	if (!attach->peer2peer || !dma_buf_attach_revocable(attach))
		return -EOPNOTSUPP;
	/* Rechecked under the reservation lock by ->map_dma_buf. */
	if (READ_ONCE(exp->revoked))
		return -ENODEV;
	/* A device the BAR cannot reach (no common switch or allow-listed host bridge). */
	if (pci_p2pdma_distance_many(to_pci_dev(exp->dev), &attach->dev, 1, false) < 0)
		return -EOPNOTSUPP;
	return 0;
}

static struct sg_table *neuron_udma_dmabuf_map(struct dma_buf_attachment *attach,
					       enum dma_data_direction dir)
{
	struct neuron_udma_export *exp = attach->dmabuf->priv;
	struct sg_table *sgt;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (exp->revoked)
		return ERR_PTR(-ENODEV);
	sgt = dma_buf_phys_vec_to_sgt(attach, exp->provider, &exp->phys, 1, exp->phys.len, dir);
	if (!IS_ERR(sgt))
		kref_get(&exp->maps);
	return sgt;
}

static void neuron_udma_dmabuf_unmap(struct dma_buf_attachment *attach, struct sg_table *sgt,
				     enum dma_data_direction dir)
{
	struct neuron_udma_export *exp = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	/*
	 * Linux 7.3's dma_buf_phys_vec_to_sgt() sets orig_nents to 0 (no CPU list), and
	 * dma_buf_free_sgt()'s sg_free_table() frees orig_nents entries: the scatterlist of every
	 * mapping leaked (kmemleak, one object per map). It allocated nents entries: say so first.
	 */
	sgt->orig_nents = sgt->nents;
	dma_buf_free_sgt(attach, sgt, dir);
	kref_put(&exp->maps, neuron_udma_export_unmapped);
}

/* The last reference is gone: no attachment (nor mapping) is left. */
static void neuron_udma_dmabuf_release(struct dma_buf *dmabuf)
{
	struct neuron_udma_export *exp = dmabuf->priv;

	mutex_lock(&neuron_udma_exports_lock);
	list_del_init(&exp->node);
	mutex_unlock(&neuron_udma_exports_lock);
	/* The buffer is no longer busy: freed now if its file was closed. */
	neuron_udma_dmabuf_released(exp->hold);
	kfree(exp);
}

static const struct dma_buf_ops neuron_udma_dmabuf_ops = {
	.attach = neuron_udma_dmabuf_attach,
	.map_dma_buf = neuron_udma_dmabuf_map,
	.unmap_dma_buf = neuron_udma_dmabuf_unmap,
	.release = neuron_udma_dmabuf_release,
};

/*
 * A dma-buf of bytes [@offset, @offset + @size) of @dev's BAR4 (a bound device), with one
 * reference the caller owns (neuron_udma_dmabuf_install() or neuron_udma_dmabuf_put()). On
 * success the dma-buf owns @hold and gives it back to Rust when it is released; on error the
 * caller keeps it. ERR_PTR(-EINVAL) for a range outside BAR4, -EOPNOTSUPP without PCI
 * peer-to-peer support (CONFIG_PCI_P2PDMA, or a BAR that cannot be mapped), -ENOMEM, -ENOENT
 * (the module is going away).
 */
struct neuron_udma_export *neuron_udma_dmabuf_export(struct device *dev, u64 offset, u64 size,
						     struct neuron_udma_export_hold *hold)
{
	struct pci_dev *pdev = to_pci_dev(dev);
	DEFINE_DMA_BUF_EXPORT_INFO(exp_info);
	struct neuron_udma_export *exp;
	struct p2pdma_provider *provider;
	struct dma_buf *dmabuf;
	int ret;

	if (!size || offset + size < offset ||
	    offset + size > pci_resource_len(pdev, NEURON_UDMA_DRAM_BAR))
		return ERR_PTR(-EINVAL);
	/* Once per binding (devres frees it at unbind); the caller holds the device state lock. */
	ret = pcim_p2pdma_init(pdev);
	if (ret)
		return ERR_PTR(ret == -ENOMEM ? ret : -EOPNOTSUPP);
	provider = pcim_p2pdma_provider(pdev, NEURON_UDMA_DRAM_BAR);
	if (!provider)
		return ERR_PTR(-EOPNOTSUPP);
	exp = kzalloc(sizeof(*exp), GFP_KERNEL_ACCOUNT);
	if (!exp)
		return ERR_PTR(-ENOMEM);
	INIT_LIST_HEAD(&exp->node);
	exp->dev = dev;
	exp->provider = provider;
	exp->phys.paddr = pci_resource_start(pdev, NEURON_UDMA_DRAM_BAR) + offset;
	exp->phys.len = size;
	kref_init(&exp->maps);
	init_completion(&exp->unmapped);
	exp_info.ops = &neuron_udma_dmabuf_ops;
	exp_info.size = size;
	exp_info.flags = O_RDWR;
	exp_info.priv = exp;
	dmabuf = dma_buf_export(&exp_info);
	if (IS_ERR(dmabuf)) {
		kfree(exp);
		return ERR_CAST(dmabuf);
	}
	exp->dmabuf = dmabuf;
	exp->hold = hold;
	mutex_lock(&neuron_udma_exports_lock);
	list_add_tail(&exp->node, &neuron_udma_exports);
	mutex_unlock(&neuron_udma_exports_lock);
	return exp;
}

/* Drops the caller's reference to @exp's dma-buf (the release runs when it was the last). */
void neuron_udma_dmabuf_put(struct neuron_udma_export *exp)
{
	dma_buf_put(exp->dmabuf);
}

/* A file descriptor number for a later install (O_CLOEXEC in @flags or not), or -EMFILE. */
int neuron_udma_fd_reserve(u32 flags)
{
	return get_unused_fd_flags(flags & O_CLOEXEC);
}

/* Gives back a number of neuron_udma_fd_reserve() that was not installed. */
void neuron_udma_fd_unreserve(int fd)
{
	put_unused_fd(fd);
}

/*
 * Publishes @exp's dma-buf as the reserved @fd, with the caller's reference: cannot be undone,
 * so the caller did everything that may fail first.
 */
void neuron_udma_dmabuf_install(struct neuron_udma_export *exp, int fd)
{
	dma_buf_fd_install(exp->dmabuf, fd);
}

/*
 * Revokes @exp (the caller holds a reference to its dma-buf): no new mapping, every importer
 * is told to unmap (invalidate_mappings), and this returns once every mapping is gone, so the
 * BAR range and the provider are no longer reachable through it. Idempotent.
 */
void neuron_udma_dmabuf_revoke(struct neuron_udma_export *exp)
{
	struct dma_buf *dmabuf = exp->dmabuf;

	dma_resv_lock(dmabuf->resv, NULL);
	if (exp->revoked) {
		dma_resv_unlock(dmabuf->resv);
		return;
	}
	WRITE_ONCE(exp->revoked, true);
	dma_buf_invalidate_mappings(dmabuf);
	dma_resv_wait_timeout(dmabuf->resv, DMA_RESV_USAGE_BOOKKEEP, false, MAX_SCHEDULE_TIMEOUT);
	dma_resv_unlock(dmabuf->resv);
	/* Importers with invalidate_mappings unmap in bounded time (they alone may attach). */
	kref_put(&exp->maps, neuron_udma_export_unmapped);
	wait_for_completion(&exp->unmapped);
}

/*
 * Unbind of @dev: revokes every export of it. A dma-buf whose last reference is already gone
 * has no attachment left; its release only gives its hold back.
 */
void neuron_udma_dmabuf_revoke_all(struct device *dev)
{
	struct neuron_udma_export *exp, *next;
	LIST_HEAD(revoke);

	mutex_lock(&neuron_udma_exports_lock);
	list_for_each_entry_safe(exp, next, &neuron_udma_exports, node) {
		if (exp->dev == dev && get_file_active(&exp->dmabuf->file))
			list_move_tail(&exp->node, &revoke);
	}
	mutex_unlock(&neuron_udma_exports_lock);
	list_for_each_entry_safe(exp, next, &revoke, node) {
		neuron_udma_dmabuf_revoke(exp);
		mutex_lock(&neuron_udma_exports_lock);
		list_del_init(&exp->node);
		mutex_unlock(&neuron_udma_exports_lock);
		/* May release it (from task work or the delayed fput worker, not here). */
		fput(exp->dmabuf->file);
	}
}

/*
 * Import (NEURON_UDMA_DMABUF_IMPORT): another exporter's dma-buf, attached for the device and
 * pinned (dma_buf_pin()), then mapped once. Pinned, not moved on demand: descriptors carry the
 * mapped addresses and the engine runs them whenever it gets to them, with no way to stop or
 * retry one, so the memory must stay where it is for as long as a descriptor may reach it; an
 * exporter does not move a pinned buffer. The attachment is still dynamic, with
 * invalidate_mappings, because exporters revoke (vfio-pci, this driver at unbind): then the
 * buffer is marked revoked in Rust (no new copy can name it: ENXIO), and the mapping is
 * unmapped only once no descriptor or copy can reach it any more (rust/dmabuf.rs drains the
 * buffer from a work item, resetting the owner's queues that still hold it after a grace
 * period), which the exporter waits for before it reuses the memory.
 */
struct neuron_udma_import {
	struct dma_buf *dmabuf;
	struct dma_buf_attachment *attach;
	/* Under the reservation lock: the mapping, NULL once unmapped. */
	struct sg_table *sgt;
	enum dma_data_direction dir;
	/* Under the reservation lock. */
	bool pinned;
	bool revoked;
	/* Under the reservation lock: the Rust buffer (not counted: it outlives its backing). */
	const struct neuron_udma_buffer *buf;
	/* Drains a revoked buffer that was still in use, then unmaps. */
	struct work_struct drain;
};

static void neuron_udma_import_unmap_locked(struct neuron_udma_import *imp)
{
	dma_resv_assert_held(imp->dmabuf->resv);
	if (imp->sgt) {
		dma_buf_unmap_attachment(imp->attach, imp->sgt, imp->dir);
		imp->sgt = NULL;
	}
	if (imp->pinned) {
		dma_buf_unpin(imp->attach);
		imp->pinned = false;
	}
}

static void neuron_udma_import_invalidate(struct dma_buf_attachment *attach)
{
	struct neuron_udma_import *imp = attach->importer_priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (imp->revoked)
		return;
	imp->revoked = true;
	/*
	 * Not connected yet: the import is being made from the mapping, and fails at
	 * neuron_udma_import_connect(); its release unmaps (bounded). Released: unmapped already.
	 */
	if (!imp->buf)
		return;
	/* In use: the mapping stays until no descriptor can reach it (in bounded time). */
	if (neuron_udma_import_revoke(imp->buf)) {
		queue_work(system_unbound_wq, &imp->drain);
		return;
	}
	neuron_udma_import_unmap_locked(imp);
}

static void neuron_udma_import_drain_work(struct work_struct *work)
{
	struct neuron_udma_import *imp = container_of(work, struct neuron_udma_import, drain);
	const struct neuron_udma_buffer *buf;

	dma_resv_lock(imp->dmabuf->resv, NULL);
	buf = imp->buf;
	dma_resv_unlock(imp->dmabuf->resv);
	/* The release waits for this work before the buffer's record can go. */
	if (buf)
		neuron_udma_import_drain(buf);
}

static const struct dma_buf_attach_ops neuron_udma_import_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = neuron_udma_import_invalidate,
};

static int neuron_udma_import_error(int err)
{
	/* The exporter cannot give this device its memory (placement, peer-to-peer, revoked). */
	return err == -ENOMEM || err == -EINTR ? err : -EOPNOTSUPP;
}

/* neuron_udma_import_dmabuf() of @dmabuf, whose reference it takes over. */
static struct neuron_udma_import *neuron_udma_import_attach(struct dma_buf *dmabuf,
							    struct device *dev, bool write,
							    u64 *size)
{
	struct neuron_udma_import *imp;
	struct sg_table *sgt;
	long ret;

	if (write && !(dmabuf->file->f_mode & FMODE_WRITE)) {
		ret = -EACCES;
		goto put;
	}
	imp = kzalloc(sizeof(*imp), GFP_KERNEL_ACCOUNT);
	if (!imp) {
		ret = -ENOMEM;
		goto put;
	}
	imp->dmabuf = dmabuf;
	imp->dir = write ? DMA_BIDIRECTIONAL : DMA_TO_DEVICE;
	INIT_WORK(&imp->drain, neuron_udma_import_drain_work);
	imp->attach = dma_buf_dynamic_attach(dmabuf, dev, &neuron_udma_import_ops, imp);
	if (IS_ERR(imp->attach)) {
		ret = neuron_udma_import_error(PTR_ERR(imp->attach));
		goto free;
	}
	ret = dma_resv_lock_interruptible(dmabuf->resv, NULL);
	if (ret)
		goto detach;
	if (imp->revoked) {
		ret = -EOPNOTSUPP;
		goto unlock;
	}
	ret = dma_buf_pin(imp->attach);
	if (ret) {
		ret = neuron_udma_import_error(ret);
		goto unlock;
	}
	imp->pinned = true;
	sgt = dma_buf_map_attachment(imp->attach, imp->dir);
	if (IS_ERR(sgt)) {
		ret = neuron_udma_import_error(PTR_ERR(sgt));
		goto unmap;
	}
	imp->sgt = sgt;
	/* What the exporter still does to the memory (a move, a clear) ends first. */
	ret = dma_resv_wait_timeout(dmabuf->resv, DMA_RESV_USAGE_KERNEL, true,
				    MAX_SCHEDULE_TIMEOUT);
	if (ret < 0)
		goto unmap;
	dma_resv_unlock(dmabuf->resv);
	*size = dmabuf->size;
	return imp;

unmap:
	neuron_udma_import_unmap_locked(imp);
unlock:
	dma_resv_unlock(dmabuf->resv);
detach:
	dma_buf_detach(dmabuf, imp->attach);
free:
	kfree(imp);
put:
	dma_buf_put(dmabuf);
	return ERR_PTR(ret);
}

/*
 * Attaches the dma-buf @fd to the bound device @dev, pins it and maps it (to the device only,
 * unless @write); *@size is the dma-buf's size. Nothing is connected to a Rust buffer yet
 * (neuron_udma_import_connect()). ERR_PTR(-EBADF) (@fd is not a dma-buf), -EACCES (@write for
 * a dma-buf not open for writing), -EOPNOTSUPP (the exporter refused this device), -ENOMEM,
 * -EINTR.
 */
struct neuron_udma_import *neuron_udma_import_dmabuf(int fd, struct device *dev, bool write,
						     u64 *size)
{
	struct dma_buf *dmabuf = dma_buf_get(fd);

	if (IS_ERR(dmabuf))
		return ERR_PTR(-EBADF);
	return neuron_udma_import_attach(dmabuf, dev, write, size);
}

/* The mapping of @imp (DMA addresses only, nents entries), valid until it is unmapped. */
struct sg_table *neuron_udma_import_sgt(struct neuron_udma_import *imp)
{
	return imp->sgt;
}

/*
 * Whether @imp is this driver's own export of device memory of the device it is attached to:
 * then *@bus_base is the bus address of that device's BAR4, so an address of the mapping minus
 * it is a device address the engine reaches directly (rather than through the host route and
 * back into its own BAR).
 */
bool neuron_udma_import_local(struct neuron_udma_import *imp, u64 *bus_base)
{
	struct neuron_udma_export *exp = imp->dmabuf->priv;

	if (imp->dmabuf->ops != &neuron_udma_dmabuf_ops || exp->dev != imp->attach->dev)
		return false;
	*bus_base = pci_bus_address(to_pci_dev(exp->dev), NEURON_UDMA_DRAM_BAR);
	return true;
}

/*
 * Connects @imp to its Rust buffer @buf, whose revocation callbacks it calls from now on
 * (neuron_udma_import_revoke(), neuron_udma_import_drain()). -ENXIO if the exporter revoked it
 * meanwhile.
 */
int neuron_udma_import_connect(struct neuron_udma_import *imp,
			       const struct neuron_udma_buffer *buf)
{
	int ret = 0;

	dma_resv_lock(imp->dmabuf->resv, NULL);
	if (imp->revoked)
		ret = -ENXIO;
	else
		imp->buf = buf;
	dma_resv_unlock(imp->dmabuf->resv);
	return ret;
}

/* Unmaps and unpins @imp (a revoked buffer that no descriptor can reach any more). */
void neuron_udma_import_unmap(struct neuron_udma_import *imp)
{
	dma_resv_lock(imp->dmabuf->resv, NULL);
	neuron_udma_import_unmap_locked(imp);
	dma_resv_unlock(imp->dmabuf->resv);
}

/*
 * Releases @imp (no descriptor can reach it): no callback into Rust after this, unmapped,
 * unpinned, detached, and the dma-buf reference given back.
 */
void neuron_udma_import_release(struct neuron_udma_import *imp)
{
	struct dma_buf *dmabuf = imp->dmabuf;

	dma_resv_lock(dmabuf->resv, NULL);
	imp->buf = NULL;
	neuron_udma_import_unmap_locked(imp);
	dma_resv_unlock(dmabuf->resv);
	/* Not queued again: the invalidation needs imp->buf for that. */
	cancel_work_sync(&imp->drain);
	dma_buf_detach(dmabuf, imp->attach);
	kfree(imp);
	dma_buf_put(dmabuf);
}

#ifdef NEURON_UDMA_KUNIT
/*
 * KUnit builds only: an importer of an export of this driver in the kernel (rust/dmabuf.rs's
 * suite), as another device's driver would be: a static attachment (refused), then a dynamic,
 * revocable one that maps the buffer, sees the export revoked (its invalidate_mappings unmaps at
 * once, as the contract asks), and maps again after the revocation (refused).
 */
struct neuron_udma_kunit_importer {
	struct sg_table *sgt;
	unsigned int invalidations;
};

static void neuron_udma_kunit_invalidate(struct dma_buf_attachment *attach)
{
	struct neuron_udma_kunit_importer *k = attach->importer_priv;

	k->invalidations++;
	if (k->sgt) {
		dma_buf_unmap_attachment(attach, k->sgt, DMA_BIDIRECTIONAL);
		k->sgt = NULL;
	}
}

static const struct dma_buf_attach_ops neuron_udma_kunit_ops = {
	.allow_peer2peer = true,
	.invalidate_mappings = neuron_udma_kunit_invalidate,
};

static int neuron_udma_kunit_map(struct dma_buf_attachment *attach, struct sg_table **sgt)
{
	int ret;

	dma_resv_lock(attach->dmabuf->resv, NULL);
	*sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL);
	ret = PTR_ERR_OR_ZERO(*sgt);
	if (ret)
		*sgt = NULL;
	dma_resv_unlock(attach->dmabuf->resv);
	return ret;
}

/* Runs the importer on @exp from the bound device @dev; what it saw goes to @r. */
void neuron_udma_kunit_import(struct neuron_udma_export *exp, struct device *dev,
			      struct neuron_udma_kunit_report *r)
{
	struct neuron_udma_kunit_importer k = {};
	struct dma_buf_attachment *attach;
	struct scatterlist *sg;
	struct sg_table *sgt;
	unsigned int i;

	memset(r, 0, sizeof(*r));
	attach = dma_buf_attach(exp->dmabuf, dev);
	r->static_attach = PTR_ERR_OR_ZERO(attach);
	if (!IS_ERR(attach))
		dma_buf_detach(exp->dmabuf, attach);

	attach = dma_buf_dynamic_attach(exp->dmabuf, dev, &neuron_udma_kunit_ops, &k);
	r->attach = PTR_ERR_OR_ZERO(attach);
	if (IS_ERR(attach))
		return;
	r->map = neuron_udma_kunit_map(attach, &k.sgt);
	if (!r->map) {
		r->nents = k.sgt->nents;
		for_each_sgtable_dma_sg(k.sgt, sg, i) {
			if (!i)
				r->first_addr = sg_dma_address(sg);
			r->bytes += sg_dma_len(sg);
		}
	}
	neuron_udma_dmabuf_revoke(exp);
	r->invalidations = k.invalidations;
	r->unmapped = !k.sgt;
	r->map_after = neuron_udma_kunit_map(attach, &sgt);
	if (sgt) {
		dma_resv_lock(exp->dmabuf->resv, NULL);
		dma_buf_unmap_attachment(attach, sgt, DMA_BIDIRECTIONAL);
		dma_resv_unlock(exp->dmabuf->resv);
	}
	if (k.sgt) {
		dma_resv_lock(exp->dmabuf->resv, NULL);
		dma_buf_unmap_attachment(attach, k.sgt, DMA_BIDIRECTIONAL);
		dma_resv_unlock(exp->dmabuf->resv);
	}
	dma_buf_detach(exp->dmabuf, attach);
	attach = dma_buf_dynamic_attach(exp->dmabuf, dev, &neuron_udma_kunit_ops, &k);
	r->attach_after = PTR_ERR_OR_ZERO(attach);
	if (!IS_ERR(attach))
		dma_buf_detach(exp->dmabuf, attach);
}

/* The driver's own importer on @exp (as DMABUF_IMPORT of its descriptor), writable. */
struct neuron_udma_import *neuron_udma_kunit_import_export(struct neuron_udma_export *exp,
							   struct device *dev, u64 *size)
{
	get_dma_buf(exp->dmabuf);
	return neuron_udma_import_attach(exp->dmabuf, dev, true, size);
}
#endif
