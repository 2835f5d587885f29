// SPDX-License-Identifier: GPL-2.0

//! The PCI callbacks Linux 7.3's Rust `pci::Driver` does not offer (probe and remove only): PCI
//! error recovery (`error_detected`, `slot_reset`, `resume`), function-level reset
//! (`reset_prepare`, `reset_done`) and `shutdown`. C in `rust/kfac/pci.c` holds the operations
//! table and adds it to the driver at probe ([`install`]); the callbacks call
//! `neuron_udma_pci_stop` and `neuron_udma_pci_restart`, defined in `device/reset.rs`. And the
//! device's NUMA node ([`node`]).

use kernel::{device::Core, pci, prelude::*};

super::generated! { include!("pci_generated.rs"); }

/// Why a device stops (`neuron_udma_pci_stop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// A function-level reset begins (`reset_prepare`); `reset_done` follows.
    Reset,
    /// PCI error recovery begins (`error_detected`); `resume` follows unless the device is
    /// disconnected (then remove follows).
    Error,
    /// The system shuts down, reboots or kexecs (`shutdown`): the device stays stopped.
    Shutdown,
}

impl Stop {
    /// The C value `why` (`enum neuron_udma_pci_stop`).
    pub(crate) fn from_raw(why: ffi::neuron_udma_pci_stop) -> Self {
        match why {
            ffi::neuron_udma_pci_stop_NEURON_UDMA_PCI_STOP_RESET => Self::Reset,
            ffi::neuron_udma_pci_stop_NEURON_UDMA_PCI_STOP_SHUTDOWN => Self::Shutdown,
            _ => Self::Error,
        }
    }

    /// The name the log and the tracepoint give it.
    pub(crate) fn name(self) -> &'static CStr {
        match self {
            Self::Reset => c"reset",
            Self::Error => c"error",
            Self::Shutdown => c"shutdown",
        }
    }
}

/// The C type of [`Stop`], for `neuron_udma_pci_stop`'s definition.
pub(crate) type RawStop = ffi::neuron_udma_pci_stop;

/// The NUMA node of `dev` (`dev_to_node()`), -1 (`NUMA_NO_NODE`) if the kernel knows none.
pub(crate) fn node<Ctx: kernel::device::DeviceContext>(dev: &kernel::device::Device<Ctx>) -> i32 {
    // SAFETY: `dev` is borrowed for the call, which only reads its node.
    unsafe { ffi::neuron_udma_dev_node(super::raw_device(dev)) }
}

/// Saves `pdev`'s config space (what `slot_reset` restores) and adds the error handlers and
/// `shutdown` to the driver; from probe, before it returns.
pub(crate) fn install(pdev: &pci::Device<Core<'_>>) {
    let dev: &kernel::device::Device<Core<'_>> = pdev.as_ref();
    // SAFETY: `dev` is a PCI device in its probe (the `Core` context): this driver is bound
    // to it, so its `driver` is this module's `pci_driver`, registered until the module unloads.
    unsafe { ffi::neuron_udma_pci_hooks(super::raw_device(dev)) }
}

/// KUnit: runs the PCI error recovery of a frozen link on `dev` as the AER core does
/// (`error_detected`, a reset of the function, `slot_reset`, `resume`), under its device lock.
///
/// # Errors
///
/// `EIO` if a step failed or a callback answered otherwise than the recovery needs (also if
/// the driver is no longer bound: no callback then).
#[cfg(neuron_udma_kunit)]
pub(crate) fn recover_frozen(dev: &pci::Device) -> Result {
    let dev: &kernel::device::Device = dev.as_ref();
    // SAFETY: `dev` is a PCI device (borrowed, so alive, for the call); the C side takes its
    // device lock, as the AER core does, and calls the handlers only while a driver is bound.
    kernel::error::to_result(unsafe { ffi::neuron_udma_pci_recover_frozen(super::raw_device(dev)) })
}
