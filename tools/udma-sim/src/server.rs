// SPDX-License-Identifier: GPL-2.0
//! vfio-user server backend: PCI config space, BAR dispatch and the DMA map
//! table (platform notes: crate `vfio_user` 0.1.7).

use crate::control::BAR2_SIZE;
use crate::layout::{Model, PCI_VENDOR_ID};
use crate::mem::DmaTable;
use crate::peer::PeerDir;
use crate::Device;
use std::fs::File;
use std::mem::size_of;
use std::sync::Arc;
use vfio_bindings::bindings::vfio::{
    vfio_region_info, vfio_region_sparse_mmap_area, VFIO_IRQ_INFO_EVENTFD, VFIO_PCI_BAR0_REGION_INDEX,
    VFIO_PCI_BAR2_REGION_INDEX, VFIO_PCI_BAR4_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_PCI_INTX_IRQ_INDEX,
    VFIO_PCI_NUM_IRQS, VFIO_PCI_NUM_REGIONS, VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_user::{DmaMapFlags, DmaUnmapFlags, IrqInfo, ServerBackend, ServerRegion, SparseArea};

/// Size of the emulated configuration space in bytes.
pub const CONFIG_SIZE: usize = 256;
/// Class code: other system peripheral (0x08/0x80/0x00).
pub const CLASS_CODE: u32 = 0x08_8000;
/// PCI command bits the guest may set: I/O, memory, bus master, SERR, parity, INTx disable.
const COMMAND_MASK: u16 = 0x0547;
/// PCI command bit 1: memory space enable.
pub const CMD_MEMORY: u16 = 1 << 1;
/// PCI command bit 2: bus master enable.
pub const CMD_BUS_MASTER: u16 = 1 << 2;
/// BAR type bits: 64-bit memory BAR.
const BAR_MEM64: u32 = 0b100;
/// Status register bit 4: the device has a capability list.
const STATUS_CAP_LIST: u16 = 1 << 4;
/// Where the power-management capability is (the only one: the capability pointer at 0x34).
pub const PM_CAP: usize = 0x40;
/// Its control/status register (PMCSR): power state in bits 1:0, NoSoftReset (bit 3) clear, so
/// a D3hot -> D0 transition resets the device (PCI PM 1.2 §5.3.1.4; Linux's "pm" reset method,
/// what /sys/bus/pci/devices/<bdf>/reset uses for a device without FLR).
const PMCSR: usize = PM_CAP + 4;
/// PMCSR power state D3hot.
const D3HOT: u8 = 3;
/// BAR type bit: prefetchable.
const BAR_PREFETCH: u32 = 0b1000;

/// One BAR as seen by config space.
#[derive(Clone, Copy, Debug)]
struct Bar {
    size: u64,
    flags: u32,
    is64: bool,
}

/// The 256-byte type-0 configuration space.
pub struct PciConfig {
    space: [u8; CONFIG_SIZE],
    /// BAR per index 0..6 (a 64-bit BAR also uses index+1).
    bars: [Option<Bar>; 6],
    /// Current BAR register values (address bits as written).
    bar_regs: [u32; 6],
    /// The BAR registers as software last wrote them (masked), kept over a reset: what the
    /// client (QEMU emulates the BARs and restores none it thinks unchanged) routes to them.
    bar_written: [u32; 6],
}

impl PciConfig {
    /// Config space for `model` with BAR0/BAR2/BAR4 of the given sizes (bytes, powers of two).
    pub fn new(model: Model, bar0: u64, bar2: u64, bar4: u64) -> PciConfig {
        let mut s = [0u8; CONFIG_SIZE];
        s[0..2].copy_from_slice(&PCI_VENDOR_ID.to_le_bytes());
        s[2..4].copy_from_slice(&model.device_id().to_le_bytes());
        s[8] = 0; // revision 0: real hardware flavour (not 255 QEMU / 240 EMU, hardware.rst §1.1)
        s[9..12].copy_from_slice(&CLASS_CODE.to_le_bytes()[..3]);
        s[0x2C..0x2E].copy_from_slice(&PCI_VENDOR_ID.to_le_bytes());
        s[0x2E..0x30].copy_from_slice(&model.device_id().to_le_bytes());
        s[0x3D] = 1; // INTA# (never asserted)
        s[6..8].copy_from_slice(&STATUS_CAP_LIST.to_le_bytes());
        s[0x34] = PM_CAP as u8;
        s[PM_CAP] = 0x01; // capability ID: power management
        s[PM_CAP + 1] = 0; // the last capability
        s[PM_CAP + 2..PM_CAP + 4].copy_from_slice(&3u16.to_le_bytes()); // PMC: version 1.2, D0/D3hot only
        let mut bars = [None; 6];
        bars[0] = Some(Bar { size: bar0, flags: BAR_MEM64 | BAR_PREFETCH, is64: true });
        bars[2] = Some(Bar { size: bar2, flags: 0, is64: false });
        bars[4] = Some(Bar { size: bar4, flags: BAR_MEM64 | BAR_PREFETCH, is64: true });
        let mut c = PciConfig { space: s, bars, bar_regs: [0; 6], bar_written: [0; 6] };
        for i in 0..6 {
            c.bar_regs[i] = c.bar_type_bits(i);
        }
        c
    }

    fn bar_type_bits(&self, i: usize) -> u32 {
        match self.bars[i] {
            Some(b) => b.flags,
            None => 0,
        }
    }

    /// Size mask of BAR register `i` (what reads back after writing all-ones).
    fn bar_mask(&self, i: usize) -> u32 {
        if let Some(b) = self.bars[i] {
            let m = !(b.size - 1);
            return (m as u32) & !0xF;
        }
        if i > 0 {
            if let Some(b) = self.bars[i - 1] {
                if b.is64 {
                    return (!(b.size - 1) >> 32) as u32;
                }
            }
        }
        0
    }

    /// The bus address BAR4 was last placed at (its 64-bit register pair as software last wrote
    /// it, without the type bits). A reset clears the registers but not this: the client keeps
    /// routing the old address, and the OS's restore skips a BAR whose read-back (the client's
    /// emulated copy) already matches.
    pub fn bar4_address(&self) -> u64 {
        (u64::from(self.bar_written[5]) << 32 | u64::from(self.bar_written[4])) & !0xF
    }

    /// Where BAR4 decodes now: [`Self::bar4_address`] while memory decoding is on (command bit
    /// 1), else 0 (not reachable: also while software sizes or moves it, which it does with
    /// decoding off). A reset clears the command register, and the guest's restore of it turns
    /// decoding on again at the kept address.
    pub fn bar4_decoded(&self) -> u64 {
        if self.command() & CMD_MEMORY != 0 {
            self.bar4_address()
        } else {
            0
        }
    }

    /// Command register.
    pub fn command(&self) -> u16 {
        u16::from_le_bytes([self.space[4], self.space[5]])
    }

    /// Reads `data.len()` bytes at `off`.
    pub fn read(&self, off: u64, data: &mut [u8]) {
        for (k, b) in data.iter_mut().enumerate() {
            let a = off as usize + k;
            *b = if a >= CONFIG_SIZE {
                0
            } else if (0x10..0x28).contains(&a) {
                let i = (a - 0x10) / 4;
                self.bar_regs[i].to_le_bytes()[a % 4]
            } else {
                self.space[a]
            };
        }
    }

    /// Writes `data` at `off`; read-only fields are preserved. Returns true when the write
    /// moved the device from D3hot to D0: the device resets (its config space here: command,
    /// BARs; the caller resets the engines).
    pub fn write(&mut self, off: u64, data: &[u8]) -> bool {
        let mut reset = false;
        for (k, &b) in data.iter().enumerate() {
            let Some(a) = (off as usize).checked_add(k).filter(|&a| a < CONFIG_SIZE) else { break };
            match a {
                4 | 5 => {
                    let mut v = self.space[4..6].to_vec();
                    v[a - 4] = b;
                    let cmd = u16::from_le_bytes([v[0], v[1]]) & COMMAND_MASK;
                    self.space[4..6].copy_from_slice(&cmd.to_le_bytes());
                }
                PMCSR => {
                    let from = self.space[PMCSR] & 3;
                    let to = b & 3;
                    // D1 and D2 are not supported (PMC): such a write keeps the state.
                    if to == 0 || to == D3HOT {
                        self.space[PMCSR] = to;
                        reset |= from == D3HOT && to == 0;
                    }
                }
                0x0C | 0x0D => self.space[a] = b, // cache line size, latency timer
                0x3C => self.space[a] = b,        // interrupt line
                0x10..=0x27 => {
                    let i = (a - 0x10) / 4;
                    let mut v = self.bar_regs[i].to_le_bytes();
                    v[a % 4] = b;
                    let mask = self.bar_mask(i);
                    self.bar_regs[i] = (u32::from_le_bytes(v) & mask) | self.bar_type_bits(i);
                    self.bar_written[i] = self.bar_regs[i];
                }
                _ => {}
            }
        }
        if reset {
            // What a conventional reset clears: decoding, bus mastering and the BARs (the OS
            // restores them).
            self.space[4..6].copy_from_slice(&0u16.to_le_bytes());
            for i in 0..6 {
                self.bar_regs[i] = self.bar_type_bits(i);
            }
        }
        reset
    }
}

/// Parameters of the region table.
pub fn regions(dev: &Device) -> Vec<ServerRegion> {
    let hbm_fd = dev.hbm().raw_fd();
    (0..VFIO_PCI_NUM_REGIONS)
        .map(|index| {
            let mut info =
                vfio_region_info { argsz: size_of::<vfio_region_info>() as u32, index, ..Default::default() };
            let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
            let mut sparse_areas = Vec::new();
            let mut mmap_fd = None;
            match index {
                VFIO_PCI_CONFIG_REGION_INDEX => {
                    info.size = CONFIG_SIZE as u64;
                    info.flags = rw;
                }
                VFIO_PCI_BAR0_REGION_INDEX => {
                    info.size = dev.gen().bar0_size();
                    info.flags = rw;
                }
                VFIO_PCI_BAR2_REGION_INDEX => {
                    info.size = BAR2_SIZE;
                    info.flags = rw;
                }
                VFIO_PCI_BAR4_REGION_INDEX => {
                    info.size = dev.hbm().len() as u64;
                    info.flags = rw;
                    if let Some(fd) = hbm_fd {
                        // The client mmaps the memfd (offset 0) for fast guest CPU access.
                        info.flags |= VFIO_REGION_INFO_FLAG_MMAP;
                        info.offset = 0;
                        sparse_areas
                            .push(SparseArea { area: vfio_region_sparse_mmap_area { offset: 0, size: info.size } });
                        mmap_fd = Some(fd);
                    }
                }
                _ => {}
            }
            ServerRegion { region_info: info, sparse_areas, mmap_fd }
        })
        .collect()
}

/// Interrupt table: one INTx line (never asserted), nothing else.
pub fn irqs() -> Vec<IrqInfo> {
    (0..VFIO_PCI_NUM_IRQS)
        .map(|index| {
            if index == VFIO_PCI_INTX_IRQ_INDEX {
                IrqInfo { index, count: 1, flags: VFIO_IRQ_INFO_EVENTFD }
            } else {
                IrqInfo { index, count: 0, flags: 0 }
            }
        })
        .collect()
}

/// The vfio-user backend.
pub struct Backend {
    dev: Arc<Device>,
    dma: Arc<DmaTable>,
    config: PciConfig,
    peers: Option<PeerDir>,
    _irq_fds: Vec<File>,
}

impl Backend {
    /// Backend for `dev`, whose host memory must be `dma`. With `peers`, it publishes its BAR4
    /// there and maps the other models' BAR4s for peer-to-peer DMA ([`crate::peer`]).
    pub fn new(dev: Arc<Device>, dma: Arc<DmaTable>, peers: Option<PeerDir>) -> Backend {
        let config = PciConfig::new(dev.model(), dev.gen().bar0_size(), BAR2_SIZE, dev.hbm().len() as u64);
        dev.set_bus_master(false);
        let b = Backend { dev, dma, config, peers, _irq_fds: Vec::new() };
        b.publish_bar4();
        b
    }

    /// Tells the peers where BAR4 decodes now ([`PciConfig::bar4_decoded`]; after a write to
    /// the command register or to BAR4's).
    fn publish_bar4(&self) {
        if let Some(p) = &self.peers {
            if let Err(e) = p.publish(self.config.bar4_decoded()) {
                log::warn!("peer directory: publishing BAR4: {e}");
            }
        }
    }
}

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EINVAL)
}

impl ServerBackend for Backend {
    fn region_read(&mut self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), std::io::Error> {
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX => self.config.read(offset, data),
            VFIO_PCI_BAR0_REGION_INDEX => self.dev.bar0_read(offset, data),
            VFIO_PCI_BAR2_REGION_INDEX => self.dev.bar2_read(offset, data),
            VFIO_PCI_BAR4_REGION_INDEX => self.dev.bar4_read(offset, data),
            _ => return Err(einval()),
        }
        log::trace!("read region {region} off 0x{offset:x} {:02x?}", data);
        Ok(())
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        log::trace!("write region {region} off 0x{offset:x} {:02x?}", data);
        match region {
            VFIO_PCI_CONFIG_REGION_INDEX => {
                let reset = self.config.write(offset, data);
                if reset {
                    log::info!("D3hot -> D0: device reset");
                    self.dev.reset();
                }
                // The command register (0x04..0x06) or BAR4's pair (0x20..0x28): where BAR4
                // decodes may have changed (a reset leaves its placement alone, see
                // PciConfig::bar4_address).
                let end = offset + data.len() as u64;
                if (offset < 0x06 && end > 0x04) || (offset < 0x28 && end > 0x20) {
                    self.publish_bar4();
                }
                self.dev.set_bus_master(self.config.command() & CMD_BUS_MASTER != 0);
            }
            VFIO_PCI_BAR0_REGION_INDEX => self.dev.bar0_write(offset, data),
            VFIO_PCI_BAR2_REGION_INDEX => self.dev.bar2_write(offset, data),
            VFIO_PCI_BAR4_REGION_INDEX => self.dev.bar4_write(offset, data),
            _ => return Err(einval()),
        }
        Ok(())
    }

    fn dma_map(
        &mut self,
        flags: DmaMapFlags,
        offset: u64,
        address: u64,
        size: u64,
        fd: Option<File>,
    ) -> Result<(), std::io::Error> {
        let writable = flags.contains(DmaMapFlags::WRITE);
        let (file, offset) = match fd {
            Some(f) => (f, offset),
            // Another device's BAR (QEMU has no descriptor for it): a peer model's BAR4, or
            // unreachable.
            None => match self.peers.as_ref().and_then(|p| p.find(address, size, writable)) {
                Some((f, off)) => {
                    log::debug!("DMA_MAP 0x{address:x}+0x{size:x}: a peer's BAR4 (its offset 0x{off:x})");
                    (f, off)
                }
                None => {
                    // Worth seeing when peers are expected, unless it is this device's own BAR4.
                    let own = address == self.config.bar4_address();
                    let level = if self.peers.is_some() && !own { log::Level::Info } else { log::Level::Debug };
                    log::log!(level, "DMA_MAP 0x{address:x}+0x{size:x} without fd ignored (unreachable for DMA)");
                    return Ok(());
                }
            },
        };
        match self.dma.map(address, size, &file, offset, writable) {
            Ok(()) => log::debug!("DMA_MAP 0x{address:x}+0x{size:x} (fd offset 0x{offset:x}, {flags:?})"),
            Err(e) => log::warn!("DMA_MAP 0x{address:x}+0x{size:x}: mmap failed: {e}; region stays unmapped"),
        }
        Ok(())
    }

    fn dma_unmap(&mut self, flags: DmaUnmapFlags, address: u64, size: u64) -> Result<(), std::io::Error> {
        if flags.contains(DmaUnmapFlags::UNMAP_ALL) {
            self.dma.clear();
        } else {
            let n = self.dma.unmap(address, size);
            log::debug!("DMA_UNMAP 0x{address:x}+0x{size:x}: {n} entries removed");
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<(), std::io::Error> {
        log::info!("device reset");
        self.dev.reset();
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), std::io::Error> {
        log::debug!("SET_IRQS index {index} flags 0x{flags:x} start {start} count {count} fds {}", fds.len());
        self._irq_fds = fds;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rd32(c: &PciConfig, off: u64) -> u32 {
        let mut b = [0u8; 4];
        c.read(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn wr32(c: &mut PciConfig, off: u64, v: u32) {
        let _ = c.write(off, &v.to_le_bytes());
    }

    #[test]
    fn identity_and_command() {
        let mut c = PciConfig::new(Model::Trn2, 1 << 32, 4096, 64 << 20);
        assert_eq!(rd32(&c, 0), 0x7364_1D0F);
        assert_eq!(rd32(&c, 8), 0x0880_0000); // class 088000, revision 0
        assert_eq!(rd32(&c, 0x2C), 0x7364_1D0F);
        wr32(&mut c, 4, 0xFFFF_0006);
        assert_eq!(c.command(), CMD_MEMORY | CMD_BUS_MASTER);
        assert_eq!(rd32(&c, 4) & 0xFFFF, 6);
        wr32(&mut c, 0, 0);
        assert_eq!(rd32(&c, 0), 0x7364_1D0F);
    }

    #[test]
    fn bar_sizing() {
        let mut c = PciConfig::new(Model::Trn1, 1 << 30, 4096, 64 << 20);
        for off in (0x10..0x28).step_by(4) {
            wr32(&mut c, off, 0xFFFF_FFFF);
        }
        assert_eq!(rd32(&c, 0x10), 0xC000_000C);
        assert_eq!(rd32(&c, 0x14), 0xFFFF_FFFF);
        assert_eq!(rd32(&c, 0x18), 0xFFFF_F000);
        assert_eq!(rd32(&c, 0x1C), 0);
        assert_eq!(rd32(&c, 0x20), 0xFC00_000C);
        assert_eq!(rd32(&c, 0x24), 0xFFFF_FFFF);
        wr32(&mut c, 0x10, 0x8000_0000);
        wr32(&mut c, 0x14, 0x1);
        assert_eq!(rd32(&c, 0x10), 0x8000_000C);
        assert_eq!(rd32(&c, 0x14), 1);
        let mut c3 = PciConfig::new(Model::Trn2, 1 << 32, 4096, 64 << 20);
        wr32(&mut c3, 0x10, 0xFFFF_FFFF);
        wr32(&mut c3, 0x14, 0xFFFF_FFFF);
        assert_eq!(rd32(&c3, 0x10), 0x0000_000C);
        assert_eq!(rd32(&c3, 0x14), 0xFFFF_FFFF);
    }

    #[test]
    fn pm_capability_resets_on_d3hot_to_d0() {
        let mut c = PciConfig::new(Model::Trn1, 1 << 30, 4096, 64 << 20);
        assert_ne!(rd32(&c, 4) >> 16 & u32::from(STATUS_CAP_LIST), 0);
        assert_eq!(rd32(&c, 0x34) & 0xFF, PM_CAP as u32);
        assert_eq!(rd32(&c, PM_CAP as u64) & 0xFFFF, 0x0001); // ID 1, no next
        wr32(&mut c, 4, 6);
        wr32(&mut c, 0x10, 0x8000_0000);
        // D0 -> D0 and D0 -> D3hot do not reset; D3hot -> D0 does (NoSoftReset is clear).
        assert!(!c.write(PMCSR as u64, &[0]));
        assert!(!c.write(PMCSR as u64, &[3]));
        assert_eq!(rd32(&c, PMCSR as u64) & 3, 3);
        assert_eq!(c.command(), 6);
        assert!(c.write(PMCSR as u64, &[0]));
        assert_eq!(rd32(&c, PMCSR as u64) & 0xB, 0);
        assert_eq!(c.command(), 0);
        assert_eq!(rd32(&c, 0x10), 0xC);
        // BAR4 decodes only with memory decoding on: not while it is sized or moved.
        wr32(&mut c, 4, 0);
        wr32(&mut c, 0x20, 0xFFFF_FFFF);
        wr32(&mut c, 0x24, 0xFFFF_FFFF);
        assert_eq!(c.bar4_decoded(), 0);
        wr32(&mut c, 0x20, 0x4000_0000);
        assert_eq!(c.bar4_decoded(), 0);
        wr32(&mut c, 0x24, 0xff);
        assert_eq!(c.bar4_decoded(), 0);
        wr32(&mut c, 4, u32::from(CMD_MEMORY));
        assert_eq!(c.bar4_decoded(), 0xff_4000_0000);
        // Its placement survives the reset (the client still routes it), decoding does not
        // until the command register is restored.
        assert!(!c.write(PMCSR as u64, &[3]));
        assert!(c.write(PMCSR as u64, &[0]));
        assert_eq!(rd32(&c, 0x20), 0xC);
        assert_eq!(c.bar4_address(), 0xff_4000_0000);
        assert_eq!(c.bar4_decoded(), 0);
        wr32(&mut c, 4, u32::from(CMD_MEMORY));
        assert_eq!(c.bar4_decoded(), 0xff_4000_0000);
        // D1/D2 are not supported: the state stays.
        assert!(!c.write(PMCSR as u64, &[1]));
        assert_eq!(rd32(&c, PMCSR as u64) & 3, 0);
    }
}
