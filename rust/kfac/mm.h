/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Memory of user mappings, for what Linux 7.3's Rust cannot call: VMA operations with a fault
 * handler, vmf_insert_pfn() on a fault's fields, locked-memory accounting
 * (user_struct::locked_vm), dma_set_seg_boundary(). Implemented in rust/kfac/mm.c; bindgen
 * generates the Rust declarations of the functions it defines (Kbuild), wrapped by
 * rust/kfac/mm.rs (which pins user pages itself, with the kernel's exported functions).
 */
#ifndef NEURON_UDMA_KFAC_MM_H
#define NEURON_UDMA_KFAC_MM_H

#include <linux/types.h>
#ifdef __BINDGEN__
/* bindgen reads only this header (and <linux/types.h>): <linux/mm_types.h>'s fault result. */
typedef unsigned int vm_fault_t;
#else
#include <linux/mm_types.h>
#endif

struct device;
struct page;
struct user_struct;
struct vm_area_struct;
struct vm_fault;

/* rust/buffer.rs: Buffer, one counted (Arc) reference; opaque to C. */
struct neuron_udma_buffer;

/* ---- implemented in rust/kfac/mm.c, called from Rust ---- */

/* No vm_operations_struct in Rust. */
int neuron_udma_mmap_buffer(struct vm_area_struct *vma, const struct neuron_udma_buffer *buf,
			    u64 size, bool wc);
/* No vmf_insert_pfn() in Rust. */
vm_fault_t neuron_udma_insert_page(struct vm_fault *vmf, void *cpu_addr);
vm_fault_t neuron_udma_insert_pfn(struct vm_fault *vmf, u64 pfn);
/* No locked-memory (user_struct::locked_vm) accounting in Rust. */
int neuron_udma_charge(unsigned long pages, struct user_struct **userp);
void neuron_udma_uncharge(struct user_struct *user, unsigned long pages);
/* No get_page()/put_page() in Rust: the references of neuron_udma_uring_fixed_pages(). */
void neuron_udma_put_pages(struct page **pages, unsigned long n, bool dirty);
/* No dma_set_seg_boundary() in Rust. */
void neuron_udma_dma_no_seg_boundary(struct device *dev);

/*
 * ---- implemented in Rust, called from rust/kfac/mm.c ----
 * Not given to bindgen (__BINDGEN__): their Rust definitions are their declarations.
 */
#ifndef __BINDGEN__
/* rust/buffer.rs: the buffer behind a mapping, counted per VMA. */
void neuron_udma_vma_get(const struct neuron_udma_buffer *buf);
void neuron_udma_vma_put(const struct neuron_udma_buffer *buf);
/* The vm_fault_t of the fault of page @pgoff of the mapping, or U32_MAX (SIGBUS). */
u32 neuron_udma_vma_fault(const struct neuron_udma_buffer *buf, u64 pgoff, struct vm_fault *vmf);
#endif

#endif /* NEURON_UDMA_KFAC_MM_H */
