// SPDX-License-Identifier: GPL-2.0

//! The PCI driver: binds Neuron devices, maps their BARs, and releases them on unbind.

use crate::{
    arch::{self, Arch},
    device::UdmaDevice,
    node::Node,
    regs, Registry,
};
use kernel::{
    device::Core,
    dma::{Device as _, DmaMask},
    io::Io,
    pci,
    prelude::*,
    sync::Arc, //
};

/// BAR holding the APB register space, UDMA engines included (hardware.rst §1.2).
const APB_BAR: u32 = 0;
/// BAR holding device memory (HBM) (hardware.rst §1.2).
const DRAM_BAR: u32 = 4;

/// Driver data of one bound device. Fields drop in declaration order.
#[pin_data]
pub(crate) struct NeuronUdma<'bound> {
    /// The character device; first, so that it is gone before anything else is torn down.
    #[pin]
    node: Node,
    /// debugfs files (`neuron_udma/<pci name>/`); before `dev`, so they go away first.
    #[pin]
    _debugfs: crate::debugfs::DeviceDir,
    /// The usage counters in sysfs (`neuron_udma/` of the PCI device); removed before `dev` is
    /// dropped, whose counters they read.
    _usage: crate::kfac::sysfs::UsageAttrs,
    /// The dmaengine provider; unregistered first at unbind.
    dma: Pin<KBox<crate::dmaengine::DmaProvider>>,
    /// State shared with open files and the KUnit suites; BAR0 lives in it (revocable).
    dev: Arc<UdmaDevice>,
    /// Registry entry: how `open()` finds `dev`.
    _entry: RegistryEntry,
    /// The data lives while the device is bound (its BARs are device-managed, in `dev`).
    _bound: core::marker::PhantomData<&'bound ()>,
}

/// The PCI driver type.
pub(crate) struct NeuronUdmaDriver;

kernel::pci_device_table!(
    PCI_TABLE,
    <NeuronUdmaDriver as pci::Driver>::IdInfo,
    [
        (
            pci::DeviceId::from_id(pci::Vendor::AMAZON, 0x7164),
            &arch::TRN1
        ),
        (
            pci::DeviceId::from_id(pci::Vendor::AMAZON, 0x7264),
            &arch::INF2
        ),
        (
            pci::DeviceId::from_id(pci::Vendor::AMAZON, 0x7364),
            &arch::TRN2
        ),
    ]
);

impl pci::Driver for NeuronUdmaDriver {
    type IdInfo = &'static Arch;
    type Data<'bound> = NeuronUdma<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        pin_init::pin_init_scope(move || Self::setup(pdev, info))
    }

    fn unbind<'bound>(pdev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>) {
        // dmaengine clients first: no new transfer, no callback after this.
        this.dma.shutdown();
        // The registry entry stays until the driver data goes, after the device node: the name
        // is an id another device's probe could take while this node still exists, and an
        // open() of this node would then find that device (the open of a dead device gets
        // ENODEV from every call instead).
        // Quiesce every queue and free its rings and buffers while the device is still bound.
        this.dev.shutdown();
        // 7.3 has no pci_clear_master(): stop the device from mastering the bus by hand.
        pdev.config_space()
            .update(regs::PCI_COMMAND, |c| c.with_bus_master(false));
        dev_info!(pdev, "unbound, bus mastering off\n");
    }
}

impl NeuronUdmaDriver {
    /// Probe: enable the device, map the BARs, bring up the H2T queue, create the device node.
    fn setup<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        info: Option<&'bound &'static Arch>,
    ) -> Result<impl PinInit<NeuronUdma<'bound>, Error> + 'bound> {
        let arch: &'static Arch = *info.ok_or(ENODEV)?;

        pdev.enable_device_mem()?;
        pdev.set_master();
        let bits = arch.dma_address_bits();
        // SAFETY: No DMA allocation or mapping exists for this device yet.
        unsafe { pdev.dma_set_mask_and_coherent(DmaMask::try_new(bits)?) }
            .inspect_err(|e| dev_err!(pdev, "no {}-bit DMA mask: {:?}\n", bits, e))?;
        // The engine never walks a scatter-gather list: the driver splits copies into descriptor
        // pairs within one mapped segment itself (`span.rs`), so imported buffers' segments may
        // be of any length and cross any boundary (DMA-API debug checks mappings against both).
        // SAFETY: No DMA allocation or mapping exists for this device yet.
        unsafe { pdev.dma_set_max_seg_size(u32::MAX) };
        // SAFETY: As above.
        unsafe { crate::kfac::mm::dma_no_seg_boundary(pdev.as_ref()) };

        let bar0 = pdev.iomap_region(APB_BAR, c"neuron_udma/apb")?;
        let bar0_len = (&bar0).size();
        if bar0_len < arch.bar0_min_size() {
            dev_err!(
                pdev,
                "BAR0 is {:#x} bytes, the {} engines need {:#x}\n",
                bar0_len,
                arch.product,
                arch.bar0_min_size()
            );
            return Err(ENODEV);
        }
        let bar4 = match pdev.iomap_region(DRAM_BAR, c"neuron_udma/bar4") {
            Ok(bar) => Some(bar),
            Err(e) if arch.dram_bar_optional => {
                dev_warn!(
                    pdev,
                    "BAR4 not mapped ({:?}); device memory unavailable\n",
                    e
                );
                None
            }
            Err(e) => return Err(e),
        };

        dev_info!(
            pdev,
            "{} (arch {:?}, device {:#06x}, revision {}): BAR0 {} MiB, BAR4 {} MiB, {} engines\n",
            arch.product,
            arch.generation,
            pdev.device_id(),
            pdev.revision_id(),
            bar0_len >> 20,
            bar4.as_ref().map_or(0, |b| b.size() >> 20),
            arch.engines
        );

        // Device buffers come from HBM0, where device address = BAR4 offset (hardware.rst §1.2,
        // 1.3).
        let dram_size = bar4.as_ref().map_or(0, |b| arch.hbm0_len(b.size() as u64));
        let bar4_phys = match bar4 {
            Some(_) => pdev.resource_start(DRAM_BAR)?,
            None => 0,
        };
        // BAR4 (optional on v3, as in the reference driver, hardware.rst §1.2) is revoked at
        // unbind like BAR0: queues with rings in device memory reach them through it.
        let bar4 = bar4.map(|b| b.into_devres()).transpose()?;
        let dev = UdmaDevice::new(
            pdev,
            arch,
            bar0.into_devres()?,
            (bar4, dram_size),
            bar4_phys,
            #[cfg(neuron_udma_kunit)]
            crate::testing::ModelCtl::map(pdev),
        )?;
        // Before anything takes device memory: what a pinned importer may still reach.
        crate::dmabuf::adopt_stranded(&dev).inspect_err(|e| {
            dev_err!(pdev, "reserving stranded dma-buf ranges failed: {:?}\n", e)
        })?;
        dev.setup_h2t()
            .inspect_err(|e| dev_err!(pdev, "H2T queue init failed: {:?}\n", e))?;
        let dma =
            crate::dmaengine::DmaProvider::register(&dev, pdev, crate::kfac::sysfs::dma_channels())
                .inspect_err(|e| dev_err!(pdev, "dmaengine registration failed: {:?}\n", e))?;
        let debugfs = crate::debugfs::device_dir(dev.clone(), pdev.as_ref().name());
        // The memory usage counters, then the activity counters (`rust/kfac/sysfs.c`'s order);
        // their counts add up (checked at build time), so the copies below cannot panic.
        const _: () = assert!(8 + crate::counters::COUNTERS_NR == crate::kfac::sysfs::USAGE_NR);
        let mut vals = [core::ptr::null(); crate::kfac::sysfs::USAGE_NR];
        let (mem, activity) = vals.split_at_mut(8);
        mem.copy_from_slice(&dev.pool.usage.raw());
        activity.copy_from_slice(&dev.counters.raw());
        // SAFETY: the counters live in `dev` (the pool's, and `dev.counters`, an `Arc` it holds
        // for its lifetime), which this driver data holds longer than the group (`_usage` is
        // declared, so dropped, before `dev`).
        let usage = unsafe { crate::kfac::sysfs::UsageAttrs::add(pdev.as_ref(), &vals)? };
        let entry = RegistryEntry::new(dev.clone())?;
        // A stranded export released before that, which found no binding to tell.
        crate::dmabuf::sweep_stranded(&dev);
        // Once the device is in the registry, where the callbacks find it.
        crate::kfac::pci::install(pdev);
        let name = entry.name;
        let parent = crate::kfac::raw_device(pdev.as_ref());
        Ok(try_pin_init!(NeuronUdma {
            dma,
            dev,
            _usage: usage,
            _entry: entry,
            _bound: core::marker::PhantomData,
            _debugfs <- debugfs,
            // SAFETY: the node is the first field: dropped (deregistered) before the driver data
            // goes, while the PCI device is still bound.
            node <- unsafe { Node::register(name, parent) },
        }))
    }
}

/// The device's registry entry (its name and its reachability from `open()`), removed on drop.
struct RegistryEntry {
    name: &'static CStr,
    dev: Arc<UdmaDevice>,
}

impl RegistryEntry {
    fn new(dev: Arc<UdmaDevice>) -> Result<Self> {
        Ok(Self {
            name: Registry::add(dev.clone())?,
            dev,
        })
    }
}

impl Drop for RegistryEntry {
    fn drop(&mut self) {
        Registry::remove(&self.dev);
    }
}
