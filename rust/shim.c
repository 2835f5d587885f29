// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers of neuron_udma for what Linux 7.3 has no Rust abstraction for. Each function names
 * the missing abstraction.
 */
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/sched/mm.h>
#include <linux/sched/user.h>
#include <linux/sched/signal.h>

/* Called from Rust through the typed wrappers of rust/shim.rs. */
int neuron_udma_mmap_buffer(struct vm_area_struct *vma, const void *priv, u64 size);
void neuron_udma_zap(struct file *file, u64 offset, u64 len);
vm_fault_t neuron_udma_insert_page(struct vm_fault *vmf, void *cpu_addr);
int neuron_udma_charge(unsigned long pages, struct user_struct **userp);
void neuron_udma_uncharge(struct user_struct *user, unsigned long pages);
bool neuron_udma_fatal_signal_pending(void);

/* Implemented in Rust (rust/mem.rs): the buffer behind a mapping, counted per VMA. */
void neuron_udma_vma_get(const void *priv);
void neuron_udma_vma_put(const void *priv);
u32 neuron_udma_vma_fault(const void *priv, u64 pgoff, struct vm_fault *vmf);

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
 * inserted one by one on fault (rust/mem.rs decides under the buffer's lock whether the page
 * still exists). @priv is a counted reference to the buffer, dropped by ->close. Nothing is
 * mapped here, so a mapping that is linked after the buffer was freed never reaches its memory.
 */
int neuron_udma_mmap_buffer(struct vm_area_struct *vma, const void *priv, u64 size)
{
	if (vma->vm_end - vma->vm_start != PAGE_ALIGN(size))
		return -EINVAL;
	vm_flags_set(vma, VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP | VM_DONTCOPY);
	vma->vm_private_data = (void *)priv;
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
 * No fatal_signal_pending() in Rust: whether the current task was killed, for waits that must
 * not be interrupted by other signals but must end on SIGKILL.
 */
bool neuron_udma_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
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
