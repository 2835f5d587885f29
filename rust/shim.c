// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers of neuron_udma for what Linux 7.3 has no Rust abstraction for; rust/shim.h declares
 * them, and says for each which abstraction is missing.
 */
#include <linux/dma-mapping.h>
#include <linux/eventfd.h>
#include <linux/fs.h>
#include <linux/io_uring/cmd.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/sched/mm.h>
#include <linux/sched/user.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

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
			    u64 size)
{
	if (vma->vm_end - vma->vm_start != PAGE_ALIGN(size))
		return -EINVAL;
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
MODULE_PARM_DESC(dma_channels, "dmaengine memcpy channels per device (0: no dmaengine provider; at most 8)");

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
MODULE_PARM_DESC(device_ring_fill, "how descriptors reach rings in device memory: bar4 (CPU writes through BAR4) or engine (the H2T queue copies them)");

bool neuron_udma_device_rings_by_engine(void)
{
	return READ_ONCE(device_ring_fill) == 1;
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

static struct dma_async_tx_descriptor *
neuron_udma_prep_memcpy(struct dma_chan *chan, dma_addr_t dst, dma_addr_t src, size_t len,
			unsigned long flags)
{
	struct neuron_udma_txd *d = kzalloc(sizeof(*d), GFP_NOWAIT);
	struct neuron_udma_dma_desc *rs;

	if (!d)
		return NULL;
	dma_async_tx_descriptor_init(&d->txd, chan);
	d->txd.flags = flags;
	d->txd.tx_submit = neuron_udma_tx_submit;
	/* From here on Rust owns @d: it has freed it if it returns NULL. */
	rs = neuron_udma_dma_prep(neuron_udma_rs(chan), &d->txd, dst, src, len);
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
 * Registers a DMA_MEMCPY dma_device of @dev with @nr channels backed by the Rust channels
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
	dma_cap_set(DMA_PRIVATE, dd->cap_mask);
	/* The engine copies any byte count from any byte address. */
	dd->copy_align = DMAENGINE_ALIGN_1_BYTE;
	dd->directions = BIT(DMA_MEM_TO_MEM);
	dd->residue_granularity = DMA_RESIDUE_GRANULARITY_DESCRIPTOR;
	dd->device_alloc_chan_resources = neuron_udma_alloc_chan_resources;
	dd->device_free_chan_resources = neuron_udma_free_chan_resources;
	dd->device_prep_dma_memcpy = neuron_udma_prep_memcpy;
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

/* What a queued NEURON_UDMA_URING_COPY keeps in its io_uring_cmd: its queue and fence. */
struct neuron_udma_uring_pdu {
	u32 engine;
	u32 queue;
	u64 fence;
	int res;
};

void neuron_udma_uring_pdu_set(struct io_uring_cmd *cmd, u32 engine, u32 queue, u64 fence)
{
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	pdu->engine = engine;
	pdu->queue = queue;
	pdu->fence = fence;
}

void neuron_udma_uring_pdu_get(struct io_uring_cmd *cmd, u32 *engine, u32 *queue, u64 *fence)
{
	struct neuron_udma_uring_pdu *pdu = io_uring_cmd_to_pdu(cmd, struct neuron_udma_uring_pdu);

	*engine = pdu->engine;
	*queue = pdu->queue;
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
