// SPDX-License-Identifier: GPL-2.0

//! neuron_udma: driver for the memory-to-memory DMA engines (UDMA) of AWS Neuron devices
//! (Trainium1 / Inferentia2: arch v2; Trainium2: arch v3).
//!
//! The crate root only wires the parts together: the PCI driver ([`driver`]), the device state
//! ([`device`]), and the registry through which the KUnit suites reach bound devices.

use kernel::{
    driver::Registration,
    pci,
    prelude::*,
    sync::Arc,
    InPlaceModule, //
};

mod arch;
mod bar0;
#[cfg(neuron_udma_bench)]
mod bench;
mod channel;
mod debugfs;
mod desc;
mod device;
mod dmaengine;
mod driver;
mod engine;
mod file;
mod h2t;
#[cfg(neuron_udma_kunit)]
mod live_tests;
mod mem;
mod queue;
mod regs;
mod ring;
mod shim;
#[cfg(neuron_udma_kunit)]
mod testing;
mod uapi;

/// Names of the character devices, one per bound device (`MiscDeviceOptions` needs `'static`).
pub(crate) const NAMES: [&CStr; 8] = [
    c"neuron_udma0",
    c"neuron_udma1",
    c"neuron_udma2",
    c"neuron_udma3",
    c"neuron_udma4",
    c"neuron_udma5",
    c"neuron_udma6",
    c"neuron_udma7",
];

/// Bound devices with their character device names, in probe order.
pub(crate) struct Registry {
    devs: KVec<(&'static CStr, Arc<device::UdmaDevice>)>,
}

kernel::sync::global_lock! {
    // SAFETY: `REGISTRY.init()` runs in the module init, before the PCI driver (its first user)
    // is registered.
    pub(crate) unsafe(uninit) static REGISTRY: Mutex<Registry> = Registry { devs: KVec::new() };
}

impl Registry {
    /// Adds a device under the first free name, which it returns.
    ///
    /// # Errors
    ///
    /// `EBUSY` if all names are taken, `ENOMEM`.
    pub(crate) fn add(dev: Arc<device::UdmaDevice>) -> Result<&'static CStr> {
        let mut reg = REGISTRY.lock();
        let name = NAMES
            .into_iter()
            .find(|n| reg.devs.iter().all(|(m, _)| m != n))
            .ok_or(EBUSY)?;
        reg.devs.push((name, dev), GFP_KERNEL)?;
        Ok(name)
    }

    /// Removes a device.
    pub(crate) fn remove(dev: &device::UdmaDevice) {
        REGISTRY
            .lock()
            .devs
            .retain(|(_, d)| !core::ptr::eq(&**d, dev));
    }

    /// The device registered under `name`.
    pub(crate) fn by_name(name: &CStr) -> Option<Arc<device::UdmaDevice>> {
        REGISTRY
            .lock()
            .devs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| d.clone())
    }

    /// The first bound device, if any.
    #[cfg_attr(not(any(neuron_udma_kunit, neuron_udma_bench)), expect(dead_code))]
    pub(crate) fn first() -> Option<Arc<device::UdmaDevice>> {
        REGISTRY.lock().devs.first().map(|(_, d)| d.clone())
    }
}

/// Empties the registry at module unload, after the driver is unregistered (fields drop in
/// declaration order): its array would otherwise outlive the module as a leak.
struct RegistryCleanup;

impl Drop for RegistryCleanup {
    fn drop(&mut self) {
        let old = core::mem::replace(&mut REGISTRY.lock().devs, KVec::new());
        drop(old);
    }
}

#[pin_data]
struct NeuronUdmaModule {
    #[pin]
    _driver: Registration<pci::Adapter<driver::NeuronUdmaDriver>>,
    /// Removes the `neuron_udma` debugfs directory, after the driver (fields drop in
    /// declaration order).
    _debugfs: debugfs::RootGuard,
    _registry: RegistryCleanup,
    /// Frees the released dmaengine devices, after the driver.
    _dma: dmaengine::ReleasedGuard,
}

impl InPlaceModule for NeuronUdmaModule {
    fn init(module: &'static kernel::ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Called once, before the driver that uses the registry is registered.
        unsafe { REGISTRY.init() };
        // SAFETY: Called once, before the driver that creates the devices' directories is
        // registered; the guard is dropped after the driver is unregistered.
        let debugfs = unsafe { debugfs::RootGuard::create() };
        try_pin_init!(Self {
            _driver <- Registration::new(<LocalModule as kernel::ModuleMetadata>::NAME, module),
            _debugfs: debugfs,
            _registry: RegistryCleanup,
            _dma: dmaengine::ReleasedGuard,
        })
    }
}

module! {
    type: NeuronUdmaModule,
    name: "neuron_udma",
    authors: ["The neuron-udma developers"],
    description: "AWS Neuron UDMA memory-to-memory DMA driver",
    license: "GPL v2",
    params: {
        dma_channels: u32 {
            default: 4,
            description: "dmaengine memcpy channels per device (0: no dmaengine provider; at most 8)",
        },
    },
}
