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
mod batch;
/// The benchmark suite of `make bench` (not part of the driver: `tests/bench/kernel/`).
#[cfg(neuron_udma_bench)]
#[path = "../tests/bench/kernel/bench.rs"]
mod bench;
mod buffer;
mod channel;
mod charge;
mod completion;
mod counters;
mod debugfs;
mod desc;
mod device;
mod devmem;
mod devring;
mod dmabuf;
mod dmaengine;
mod dram;
mod driver;
mod engine;
mod events;
mod fence;
mod file;
mod h2t;
mod holds;
mod kfac;
#[cfg(neuron_udma_kunit)]
mod live_tests;
mod node;
mod orphan;
mod pattern;
mod pool;
mod queue;
mod regs;
mod resident;
mod ring;
mod span;
mod split;
mod submit;
#[cfg(neuron_udma_kunit)]
mod testing;
mod uapi;

/// The most devices the driver binds at once (one character device name each). Real hosts have
/// up to 16 Neuron devices (trn1.32xlarge, trn2.48xlarge); a probe beyond this fails with `EBUSY`.
pub(crate) const MAX_DEVICES: usize = 32;

/// `[c"neuron_udma0", c"neuron_udma1", ...]` for the decimal numbers given.
macro_rules! device_names {
    ($($n:literal)*) => {
        [$(kernel::c_str!(concat!("neuron_udma", $n))),*]
    };
}

/// Names of the character devices, one per bound device (`MiscDeviceOptions` needs `'static`).
/// The array type makes the list exactly [`MAX_DEVICES`] long.
pub(crate) const NAMES: [&CStr; MAX_DEVICES] = device_names!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
);

/// The first name of [`NAMES`] for which `taken` is false, or `None` if all are taken.
fn free_name(taken: impl Fn(&CStr) -> bool) -> Option<&'static CStr> {
    NAMES.into_iter().find(|n| !taken(n))
}

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
    /// `EBUSY` if all [`MAX_DEVICES`] names are taken, `ENOMEM`.
    pub(crate) fn add(dev: Arc<device::UdmaDevice>) -> Result<&'static CStr> {
        let mut reg = REGISTRY.lock();
        let name = free_name(|n| reg.devs.iter().any(|(m, _)| *m == n)).ok_or(EBUSY)?;
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

    /// Calls `f` for every bound device, under the registry's lock (`f` takes no lock that is
    /// held while the registry's is taken).
    pub(crate) fn for_each(mut f: impl FnMut(&device::UdmaDevice)) {
        for (_, d) in REGISTRY.lock().devs.iter() {
            f(d);
        }
    }

    /// The device whose PCI device's `struct device` is `dev` (the C side's callbacks).
    pub(crate) fn by_device(
        dev: *const kernel::bindings::device,
    ) -> Option<Arc<device::UdmaDevice>> {
        REGISTRY
            .lock()
            .devs
            .iter()
            .find(|(_, d)| core::ptr::eq(kfac::raw_device(d.pdev.as_ref()), dev))
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

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_names)]
mod tests {
    use super::*;
    use kernel::str::CString;

    #[test]
    fn names_are_numbered_and_distinct() -> Result {
        for (i, n) in NAMES.iter().enumerate() {
            let want = CString::try_from_fmt(fmt!("neuron_udma{i}"))?;
            assert_eq!(n.to_bytes(), want.to_bytes());
            assert!(NAMES[..i].iter().all(|m| m != n));
        }
        Ok(())
    }

    #[test]
    fn free_name_takes_the_lowest_and_stops_at_the_limit() -> Result {
        assert_eq!(free_name(|_| false), Some(NAMES[0]));
        // Names 0..=16 taken except 5: the hole is filled first.
        let hole = |n: &CStr| NAMES[..17].contains(&n) && n != NAMES[5];
        assert_eq!(free_name(hole), Some(NAMES[5]));
        let all_but_last = |n: &CStr| n != NAMES[MAX_DEVICES - 1];
        assert_eq!(free_name(all_but_last), Some(c"neuron_udma31"));
        assert_eq!(free_name(|_| true), None);
        Ok(())
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
    /// KUnit builds: the pinned dma-buf importer user space drives (a debugfs file).
    _pinned_importer: kfac::dmabuf::PinnedImporterFile,
    /// Dropped last: its drop waits for the releases the devices queued.
    _release: kfac::sched::ReleaseQueue,
}

impl InPlaceModule for NeuronUdmaModule {
    fn init(module: &'static kernel::ThisModule) -> impl PinInit<Self, Error> {
        // SAFETY: Called once, before the driver that uses the registry is registered.
        unsafe { REGISTRY.init() };
        // SAFETY: Called once, before the driver that creates the devices' directories is
        // registered; the guard is dropped after the driver is unregistered.
        let debugfs = unsafe { debugfs::RootGuard::create() };
        let release = kfac::sched::ReleaseQueue::create();
        try_pin_init!(Self {
            // First: the driver's devices use it from their probe on.
            _release: release?,
            _driver <- Registration::new(<LocalModule as kernel::ModuleMetadata>::NAME, module),
            _debugfs: debugfs,
            _registry: RegistryCleanup,
            _dma: dmaengine::ReleasedGuard,
            _pinned_importer: kfac::dmabuf::PinnedImporterFile::create(),
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
