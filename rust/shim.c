// SPDX-License-Identifier: GPL-2.0
/*
 * C helpers of neuron_udma for what Linux 7.3 has no Rust abstraction for. Each function names
 * the missing abstraction.
 */
#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/mm.h>

/* Called from Rust (rust/file.rs, rust/mem.rs); no header, as nothing in C calls them. */
int neuron_udma_mmap_coherent(struct device *dev, struct vm_area_struct *vma, void *cpu_addr,
			      dma_addr_t dma_addr, size_t size);
void neuron_udma_zap(struct file *file, u64 offset, u64 len);

/*
 * No dma_mmap_coherent() in Rust: map a whole coherent buffer at the start of @vma. The page
 * offset of @vma names the buffer (it is the buffer's mmap offset), not an offset inside it, so
 * it is cleared for the call and restored afterwards: the mapping must stay indexed by its real
 * offset so that neuron_udma_zap() finds it.
 */
int neuron_udma_mmap_coherent(struct device *dev, struct vm_area_struct *vma, void *cpu_addr,
			      dma_addr_t dma_addr, size_t size)
{
	unsigned long pgoff = vma->vm_pgoff;
	int ret;

	if (vma->vm_end - vma->vm_start != PAGE_ALIGN(size))
		return -EINVAL;
	vma->vm_pgoff = 0;
	ret = dma_mmap_coherent(dev, vma, cpu_addr, dma_addr, size);
	vma->vm_pgoff = pgoff;
	return ret;
}

/*
 * No unmap_mapping_range() in Rust: remove every user mapping of bytes [@offset, @offset +
 * @len) of @file's mapping, before the memory behind them is freed. Later accesses fault
 * (SIGBUS) instead of reaching freed memory.
 */
void neuron_udma_zap(struct file *file, u64 offset, u64 len)
{
	unmap_mapping_range(file->f_mapping, offset, len, 1);
}
