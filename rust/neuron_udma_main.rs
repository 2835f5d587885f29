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
    sync::{Arc, Mutex},
    InPlaceModule, //
};

mod arch;
mod desc;
mod device;
mod driver;
mod engine;
mod queue;
mod regs;
mod ring;
#[cfg(neuron_udma_kunit)]
mod live_tests;

/// Bound devices, in probe order.
pub(crate) struct Registry {
    devs: KVec<Arc<device::UdmaDevice>>,
}

kernel::sync::global_lock! {
    // SAFETY: `REGISTRY.init()` runs in the module init, before the PCI driver (its first user)
    // is registered.
    pub(crate) unsafe(uninit) static REGISTRY: Mutex<Registry> = Registry { devs: KVec::new() };
}

impl Registry {
    /// Adds a device.
    pub(crate) fn add(dev: Arc<device::UdmaDevice>) -> Result {
        REGISTRY.lock().devs.push(dev, GFP_KERNEL)?;
        Ok(())
    }

    /// Removes a device.
    pub(crate) fn remove(dev: &device::UdmaDevice) {
        REGISTRY.lock().devs.retain(|d| !core::ptr::eq(&**d, dev));
    }

    /// The first bound device, if any.
    #[cfg_attr(not(neuron_udma_kunit), expect(dead_code))]
    pub(crate) fn first() -> Option<Arc<device::UdmaDevice>> {
        REGISTRY.lock().devs.first().cloned()
    }
}

#[pin_data]
struct NeuronUdmaModule {
    #[pin]
    _driver: Registration<pci::Adapter<driver::NeuronUdmaDriver>>,
}

impl InPlaceModule for NeuronUdmaModule {
    fn init(module: &'static kernel::ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Called once, before the driver that uses the registry is registered.
        unsafe { REGISTRY.init() };
        try_pin_init!(Self {
            _driver <- Registration::new(<LocalModule as kernel::ModuleMetadata>::NAME, module),
        })
    }
}

module! {
    type: NeuronUdmaModule,
    name: "neuron_udma",
    authors: ["The neuron-udma developers"],
    description: "AWS Neuron UDMA memory-to-memory DMA driver",
    license: "GPL v2",
}
