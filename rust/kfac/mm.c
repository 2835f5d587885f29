// SPDX-License-Identifier: GPL-2.0
/*
 * Memory of user mappings and pinned user pages (rust/kfac/mm.h says what Linux 7.3's Rust
 * lacks): the VMA operations of a host buffer's mapping, which call rust/buffer.rs, page
 * insertion on fault, the charge of pinned memory to the user's locked_vm, and pinned user
 * pages with their DMA mapping.
 */
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/user.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "mm.h"

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
