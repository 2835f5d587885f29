// SPDX-License-Identifier: GPL-2.0
/*
 * Memory of user mappings and pinned user pages (rust/kfac/mm.h says what Linux 7.3's Rust
 * lacks): the VMA operations of a host buffer's mapping, which call rust/buffer.rs, page
 * insertion on fault, the charge of pinned memory to the user's locked_vm, and the DMA segment
 * boundary of a device.
 */
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/user.h>

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
 * Drop the page references of @n pages (taken with get_page(), as neuron_udma_uring_fixed_pages()
 * does: no Rust for either), marking each dirty first if @dirty (the device may have written it).
 */
void neuron_udma_put_pages(struct page **pages, unsigned long n, bool dirty)
{
	unsigned long i;

	for (i = 0; i < n; i++) {
		if (dirty)
			set_page_dirty_lock(pages[i]);
		put_page(pages[i]);
	}
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
