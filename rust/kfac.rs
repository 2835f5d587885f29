// SPDX-License-Identifier: GPL-2.0

//! Kernel facilities that Linux 7.3's Rust does not wrap, behind small safe modules, one per
//! subsystem, shaped as upstream abstractions: types that own their kernel references (their
//! `Drop` gives them back), no raw pointer in the API the rest of the driver uses where the
//! facility allows it.
//!
//! A module calls the kernel's exported functions itself (`kernel::bindings`). What Rust cannot
//! call, static inlines, macros, operations tables and the state they need, is C of the module:
//! `rust/kfac/<name>.c` with its header `rust/kfac/<name>.h` (the dma-buf one in
//! `dmabuf_export.c`, `dmabuf_import.c` and, in KUnit builds, `dmabuf_kunit.c`; [`eventfd`]
//! needs none). Kbuild generates the Rust declarations of the C functions from each header with
//! bindgen (`rust/kfac/<name>_generated.rs`, not in git); the functions C calls back into Rust
//! are declared in the headers for C only (outside bindgen's view, `__BINDGEN__`) and defined as
//! `unsafe extern "C"` functions where their types live (`buffer.rs`, `dmabuf.rs`,
//! `dmaengine.rs`, `file.rs`, `device/reset.rs`).
//!
//! - [`dmabuf`]: the dma-buf exporter of device memory and the importer of other dma-bufs;
//! - [`dmaengine`]: the `dma_device` of the dmaengine provider, its cookies and descriptors;
//! - [`dmem`]: the device-memory cgroup controller: a device's HBM as a region, charges of it;
//! - [`eventfd`]: eventfd references (no C);
//! - [`pci`]: PCI error recovery, function-level reset and shutdown, a device's NUMA node;
//! - [`mm`]: VMA operations of buffer mappings, page insertion, the removal of user mappings,
//!   pinned user pages, the locked-memory charge and the DMA segment boundary;
//! - [`sched`]: `fatal_signal_pending()`, `cond_resched()`, whether another task wants the CPU
//!   and `flush_work()`;
//! - [`sysfs`]: the usage counters of a device and the module parameters;
//! - [`trace`]: the tracepoints (`rust/kfac/trace_internal.h` defines them);
//! - [`uring`]: the `uring_cmd`, `uring_cmd_iopoll` and `poll` file operations and io_uring
//!   command completion.

pub(crate) mod dmabuf;
pub(crate) mod dmaengine;
pub(crate) mod dmem;
pub(crate) mod eventfd;
pub(crate) mod mm;
pub(crate) mod pci;
pub(crate) mod sched;
pub(crate) mod sysfs;
pub(crate) mod trace;
pub(crate) mod uring;

/// The `struct device` of `dev`, for the C side: `Device` is a transparent wrapper of it (7.3
/// keeps `Device::as_raw` private). Valid while `dev` is borrowed.
pub(crate) fn raw_device<Ctx: kernel::device::DeviceContext>(
    dev: &kernel::device::Device<Ctx>,
) -> *mut kernel::bindings::device {
    core::ptr::from_ref(dev)
        .cast::<kernel::bindings::device>()
        .cast_mut()
}

/// The module `ffi` of the declarations bindgen generated from a header of `rust/kfac/` (Kbuild),
/// given as `include!("<name>_generated.rs")`, with the kernel's types in scope: the kernel
/// structs a header only names are the kernel crate's bindings (bindgen's
/// `--no-recursive-allowlist`), the driver's own types are generated.
macro_rules! generated {
    ($($include:tt)*) => {
        #[allow(
            non_camel_case_types,
            non_upper_case_globals,
            dead_code,
            improper_ctypes,
            missing_docs,
            unreachable_pub,
            unused_imports,
            clippy::all,
            clippy::undocumented_unsafe_blocks
        )]
        mod ffi {
            use kernel::bindings::*;
            $($include)*
        }
    };
}
pub(crate) use generated;
