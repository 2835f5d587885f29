// SPDX-License-Identifier: GPL-2.0

//! Per-generation facts of the Neuron devices, as data.
//!
//! Everything that differs between Trainium1/Inferentia2 (arch v2) and Trainium2 (arch v3) lives in
//! one [`Arch`] value per PCI device ID, so that no other module matches on the generation.
//! Sources are the sections of `Documentation/hardware.rst` named on each item.

use crate::{desc::Barrier, regs, uapi};
use kernel::{num::Bounded, pci};

/// PCI vendor of every Neuron device: Amazon, 0x1d0f (hardware.rst §1.1).
pub(crate) const PCI_VENDOR: pci::Vendor = pci::Vendor::AMAZON;

/// The Neuron architecture generation (hardware.rst §1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Generation {
    /// Trainium1 (0x7164) and Inferentia2 (0x7264).
    V2,
    /// Trainium2 (0x7364).
    V3,
}

/// Number of DMA queues of every UDMA engine (hardware.rst §2.1, `DMA_MAX_Q_V4`).
pub(crate) const QUEUES_PER_ENGINE: u32 = 16;

/// Per-generation data the driver needs to program the UDMA engines.
#[derive(Debug)]
pub(crate) struct Arch {
    /// Generation.
    pub(crate) generation: Generation,
    /// Product name as the reference driver reports it (hardware.rst §1.1).
    pub(crate) product: &'static str,
    /// PCI device ID.
    pub(crate) device_id: u16,
    /// Host route bits OR-ed onto a host DMA address to form a device-fabric address
    /// (hardware.rst §1.3).
    pub(crate) host_route: u64,
    /// Number of UDMA engines, engine ids `0..engines` (hardware.rst §2.1: v2 32 + 2 H2T, v3 128
    /// + 4 H2T).
    pub(crate) engines: u32,
    /// `(engine, queue)` of the host-to-device ("H2T") queue of each NeuronCore, indexed by NC
    /// (hardware.rst §2.3).
    pub(crate) h2t: &'static [(u32, u32)],
    /// Barrier applied to the last data descriptor of each submission (hardware.rst §4.4).
    pub(crate) final_barrier: Barrier,
    /// Maximum descriptors per packet programmed into `desc_pref_cfg_2` (hardware.rst §3.6
    /// step 19).
    pub(crate) max_descs_per_packet: Bounded<u32, 8>,
    /// M2S outstanding-transaction configuration (hardware.rst §3.6 step 3).
    pub(crate) m2s_ostand_cfg: u32,
    /// S2M outstanding read configuration (hardware.rst §3.6 step 12).
    pub(crate) s2m_ostand_cfg_rd: u32,
    /// M2S data FIFO depth in beats (hardware.rst §3.2, `0x310`).
    pub(crate) m2s_data_fifo_beats: Bounded<u32, 12>,
    /// Whether AXI errors are routed to an engine abort at init (v2 only, hardware.rst §3.6
    /// step 21).
    pub(crate) axi_error_abort: bool,
    /// Value written to SDMA wrapper + 0x800 at init, if the generation has that register (v3
    /// only, hardware.rst §3.6 step 20).
    pub(crate) sdma_cfg: Option<u32>,
    /// Whether the device may come up without its device-memory BAR (BAR4) mapped, losing only
    /// device memory (v3; hardware.rst §1.2). On v2 probe fails without it.
    pub(crate) dram_bar_optional: bool,
}

/// v2 SENG engines whose SDMA wrapper enables broadcast to the whole group, by engine index
/// inside its 16-engine half (hardware.rst §3.6 step 0).
const V2_SDMA_BROADCAST_SOURCES: [u32; 5] = [0, 3, 6, 9, 15];
/// All 16 engines of a v2 SDMA broadcast group (hardware.rst §3.6 step 0).
const V2_SDMA_BROADCAST_ALL: u32 = 0xFFFF;

/// SDMA broadcast configuration of one v2 SENG engine (hardware.rst §3.6 step 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SdmaBroadcast {
    /// Value of the broadcast group mask (SDMA + 0x100).
    pub(crate) group: u32,
    /// Value of the broadcast enable mask (SDMA + 0x104).
    pub(crate) enable: u32,
}

/// Trainium1 / Inferentia2 H2T queues: NC0 -> engine 32, NC1 -> engine 33, queue 0
/// (hardware.rst §2.3).
const V2_H2T: [(u32, u32); 2] = [(32, 0), (33, 0)];
/// Trainium2 H2T queues: NC n -> engine {128,129,130,131}[n/2], queue n%2 (hardware.rst §2.3).
const V3_H2T: [(u32, u32); 8] = [
    (128, 0),
    (128, 1),
    (129, 0),
    (129, 1),
    (130, 0),
    (130, 1),
    (131, 0),
    (131, 1),
];

const fn v2(product: &'static str, device_id: u16) -> Arch {
    Arch {
        generation: Generation::V2,
        product,
        device_id,
        host_route: 0x0000_1000_0000_0000,
        engines: 34,
        h2t: &V2_H2T,
        final_barrier: Barrier::Write,
        max_descs_per_packet: Bounded::<u32, 8>::new::<65>(),
        m2s_ostand_cfg: 0x0000_086F,
        s2m_ostand_cfg_rd: 0x0040_0008,
        m2s_data_fifo_beats: Bounded::<u32, 12>::new::<1024>(),
        axi_error_abort: true,
        sdma_cfg: None,
        dram_bar_optional: false,
    }
}

/// Trainium1 (arch v2).
pub(crate) const TRN1: Arch = v2("Trn1", 0x7164);
/// Inferentia2 (arch v2).
pub(crate) const INF2: Arch = v2("Inf2", 0x7264);
/// Trainium2 (arch v3).
pub(crate) const TRN2: Arch = Arch {
    generation: Generation::V3,
    product: "Trn2",
    device_id: 0x7364,
    host_route: 0x0000_4000_0000_0000,
    engines: 132,
    h2t: &V3_H2T,
    final_barrier: Barrier::Write,
    max_descs_per_packet: Bounded::<u32, 8>::new::<65>(),
    m2s_ostand_cfg: 0x2080_8080,
    s2m_ostand_cfg_rd: 0x0040_0080,
    m2s_data_fifo_beats: Bounded::<u32, 12>::new::<2296>(),
    axi_error_abort: false,
    sdma_cfg: Some(regs::SDMA_V3_CFG_INIT),
    dram_bar_optional: true,
};

impl Arch {
    /// The generation number `INFO` reports (`NEURON_UDMA_GEN_*`).
    pub(crate) fn uapi_generation(&self) -> u32 {
        match self.generation {
            Generation::V2 => uapi::NEURON_UDMA_GEN_V2,
            Generation::V3 => uapi::NEURON_UDMA_GEN_V3,
        }
    }

    /// SDMA broadcast configuration that the init of engine `eng` writes first, or `None` if it
    /// writes none: v2 SENG engines only (hardware.rst §3.6 step 0). For engine index `e` inside
    /// its 16-engine half, the group mask is 0xFFFF with bits 15 down to 16 - `e` cleared, and
    /// broadcast is enabled for the engines of [`V2_SDMA_BROADCAST_SOURCES`].
    pub(crate) fn sdma_broadcast(&self, eng: u32) -> Option<SdmaBroadcast> {
        if self.generation != Generation::V2 || self.is_h2t_engine(eng) {
            return None;
        }
        let e = eng % 16;
        let group = if e == 0 {
            V2_SDMA_BROADCAST_ALL
        } else {
            V2_SDMA_BROADCAST_ALL & !(V2_SDMA_BROADCAST_ALL << (16 - e))
        };
        let enable = if V2_SDMA_BROADCAST_SOURCES.contains(&e) {
            V2_SDMA_BROADCAST_ALL
        } else {
            0
        };
        Some(SdmaBroadcast { group, enable })
    }

    /// Byte offset of engine `eng`'s UDMA register block inside BAR0, or `None` if the generation
    /// has no such engine (hardware.rst §2.2).
    pub(crate) fn engine_offset(&self, eng: u32) -> Option<usize> {
        let off: u32 = match self.generation {
            Generation::V2 => match eng {
                0..=15 => 0x3000_0000 + eng * 0x4_0000,
                16..=31 => 0x3070_0000 + (eng - 16) * 0x4_0000,
                32 => 0x3060_0000,
                33 => 0x30D0_0000,
                _ => return None,
            },
            Generation::V3 => match eng {
                0..=127 => {
                    const SENG_BASE: [u32; 4] =
                        [0x8200_0000, 0x9400_0000, 0xA200_0000, 0xB400_0000];
                    SENG_BASE[(eng / 32) as usize] + (eng % 32) * 0x10_0000
                }
                128 => 0x0680_0000,
                129 => 0x0690_0000,
                130 => 0x4680_0000,
                131 => 0x4690_0000,
                _ => return None,
            },
        };
        Some(off as usize)
    }

    /// Byte offset of engine `eng`'s SDMA wrapper block inside BAR0 (hardware.rst §2.2).
    pub(crate) fn sdma_offset(&self, eng: u32) -> Option<usize> {
        let off: u32 = match self.generation {
            Generation::V2 => match eng {
                0..=15 => 0x3040_0000 + eng * 0x7000,
                16..=31 => 0x30B0_0000 + (eng - 16) * 0x7000,
                32 => 0x3064_0000,
                33 => 0x30D4_0000,
                _ => return None,
            },
            Generation::V3 => return self.engine_offset(eng).map(|o| o + 0x4_0000),
        };
        Some(off as usize)
    }

    /// Byte offset of v3 SENG engine `eng`'s "user FIS" error-trigger block inside BAR0, whose
    /// masks take part in the ring-id error masking (hardware.rst §2.2, 3.5); `None` elsewhere.
    pub(crate) fn fis_offset(&self, eng: u32) -> Option<usize> {
        const FIS_BASE: [u32; 4] = [0x8C00_0000, 0x9C40_0000, 0xAC00_0000, 0xBC40_0000];
        if !self.masks_ring_id_error(eng) {
            return None;
        }
        Some((FIS_BASE[(eng / 32) as usize] + (eng % 32) * 0x2_0000) as usize)
    }

    /// Whether `(eng, queue)` is reserved for the driver, the NX cores or collectives, and so must
    /// not be handed to user space (hardware.rst §2.4).
    pub(crate) fn is_reserved_queue(&self, eng: u32, queue: u32) -> bool {
        if self.h2t.contains(&(eng, queue)) {
            return true;
        }
        match self.generation {
            Generation::V2 => eng < 32 && ((queue == 14 && eng % 16 < 11) || queue == 15),
            Generation::V3 => eng < 128 && queue == 14 && matches!(eng % 16, 0..=4 | 7 | 8),
        }
    }

    /// The driver's queues that scrub device memory beside its shared H2T queue (`h2t[0]`):
    /// the first reserved queue of each other H2T engine (v2: engine 33; v3: 129-131), so a
    /// large scrub runs on every H2T engine at once.
    pub(crate) fn scrub_queues(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let main = self.h2t[0].0;
        self.h2t
            .iter()
            .enumerate()
            .filter(move |&(i, &(e, _))| e != main && !self.h2t[..i].iter().any(|&(p, _)| p == e))
            .map(|(_, &q)| q)
    }

    /// Whether `eng` is one of the generation's dedicated host DMA (H2T) engines
    /// (hardware.rst §2.1).
    pub(crate) fn is_h2t_engine(&self, eng: u32) -> bool {
        self.h2t.iter().any(|&(e, _)| e == eng)
    }

    /// Whether engine `eng` can reach host memory (hardware.rst §2.5,
    /// `ndma_get_engines_with_host_connectivity`): every v2 engine; on v3 the H2T engines 128-131
    /// and, for HBM i, the SENG engines 32i + {4-7, 12-15, 20-23, 28-31}. The reference driver
    /// never gives other v3 engines a host address, so rings and buffers in host memory are used
    /// only on these engines.
    pub(crate) fn has_host_connectivity(&self, eng: u32) -> bool {
        match self.generation {
            Generation::V2 => eng < self.engines,
            Generation::V3 => (128..132).contains(&eng) || (eng < 128 && eng % 8 >= 4),
        }
    }

    /// [`Self::has_host_connectivity`] of every engine as a bitmap (bit `e % 64` of word
    /// `e / 64`), as `INFO` reports it.
    pub(crate) fn host_engine_bitmap(&self) -> [u64; 3] {
        self.bitmap(|e| self.has_host_connectivity(e))
    }

    /// Every engine of the generation as a bitmap like [`Self::host_engine_bitmap`].
    pub(crate) fn engine_bitmap(&self) -> [u64; 3] {
        self.bitmap(|_| true)
    }

    fn bitmap(&self, pick: impl Fn(u32) -> bool) -> [u64; 3] {
        let mut map = [0u64; 3];
        for e in (0..self.engines).filter(|&e| pick(e)) {
            if let Some(w) = map.get_mut((e / 64) as usize) {
                *w |= 1 << (e % 64);
            }
        }
        map
    }

    /// Whether `eng` is a v3 SENG engine (id < 128), where the ring-id error is masked
    /// (hardware.rst §3.5).
    pub(crate) fn masks_ring_id_error(&self, eng: u32) -> bool {
        self.generation == Generation::V3 && eng < 128
    }

    /// Lowest BAR0 size, in bytes, that holds every engine block of this generation.
    pub(crate) fn bar0_min_size(&self) -> usize {
        (0..self.engines)
            .filter_map(|e| self.engine_offset(e))
            .max()
            .map_or(0, |o| o + crate::regs::ENGINE_SIZE)
    }

    /// Width in bits of the host DMA addresses the fabric can carry: the bits below the host
    /// route (hardware.rst §1.3), 44 on v2 and 46 on v3. The DMA mask is set to it, so that no host
    /// address reaches into the route field.
    pub(crate) fn dma_address_bits(&self) -> u32 {
        self.host_route.trailing_zeros()
    }

    /// Bytes at the start of BAR4 that are HBM0, whose device-fabric addresses equal their BAR4
    /// offsets (hardware.rst §1.2, 1.3): v2 `min(bar4_size, 16 GiB)` (HBM1 is device address
    /// 0x10_0000_0000 at BAR4 + 16 GiB); v3 `min(bar4_size / 4, 24 GiB)` (each of the four HBMs
    /// has a quarter of BAR4 on the QEMU device, the others start at device addresses
    /// 0x40_0000_0000, 0x8000_0000_0000, 0x8040_0000_0000). Device memory is allocated from HBM0
    /// only, so a buffer's device address is its BAR4 offset.
    pub(crate) fn hbm0_len(&self, bar4_size: u64) -> u64 {
        match self.generation {
            Generation::V2 => bar4_size.min(16 << 30),
            Generation::V3 => (bar4_size / 4).min(24 << 30),
        }
    }

    /// Device-fabric address of a host DMA address (hardware.rst §1.3).
    pub(crate) fn host_addr(&self, dma: u64) -> u64 {
        dma | self.host_route
    }
}

#[cfg(neuron_udma_kunit)]
#[kernel::prelude::kunit_tests(neuron_udma_arch)]
mod tests {
    use super::*;

    /// The first three scrub queues of `arch` ([`Arch::scrub_queues`]) and how many of them
    /// there are.
    fn scrub_queues(arch: &Arch) -> ([(u32, u32); 3], usize) {
        let mut v = [(0, 0); 3];
        let mut n = 0;
        for q in arch.scrub_queues() {
            v[n] = q;
            n += 1;
        }
        (v, n)
    }

    #[test]
    fn v2_engine_offsets() {
        assert_eq!(TRN1.engine_offset(0), Some(0x3000_0000));
        assert_eq!(TRN1.engine_offset(15), Some(0x303C_0000));
        assert_eq!(TRN1.engine_offset(16), Some(0x3070_0000));
        assert_eq!(TRN1.engine_offset(31), Some(0x30AC_0000));
        assert_eq!(TRN1.engine_offset(32), Some(0x3060_0000));
        assert_eq!(INF2.engine_offset(33), Some(0x30D0_0000));
        assert_eq!(TRN1.engine_offset(34), None);
        // `EngineId::new` bounds engine numbers by `engines`: every engine below it has a block.
        for arch in [&TRN1, &INF2, &TRN2] {
            assert!((0..arch.engines).all(|e| arch.engine_offset(e).is_some()));
            assert_eq!(arch.engine_offset(arch.engines), None);
        }
        assert_eq!(TRN1.sdma_offset(32), Some(0x3064_0000));
    }

    #[test]
    fn v3_engine_offsets() {
        assert_eq!(TRN2.engine_offset(0), Some(0x8200_0000));
        assert_eq!(TRN2.engine_offset(33), Some(0x9410_0000));
        assert_eq!(TRN2.engine_offset(127), Some(0xB5F0_0000));
        assert_eq!(TRN2.engine_offset(128), Some(0x0680_0000));
        assert_eq!(TRN2.engine_offset(131), Some(0x4690_0000));
        assert_eq!(TRN2.engine_offset(132), None);
        assert_eq!(TRN2.sdma_offset(129), Some(0x0694_0000));
        assert_eq!(TRN2.fis_offset(0), Some(0x8C00_0000));
        assert_eq!(TRN2.fis_offset(127), Some(0xBC7E_0000));
        assert_eq!(TRN2.fis_offset(128), None);
        assert_eq!(TRN1.fis_offset(0), None);
    }

    #[test]
    fn sdma_broadcast() {
        let b = |group, enable| Some(SdmaBroadcast { group, enable });
        assert_eq!(TRN1.sdma_broadcast(0), b(0xFFFF, 0xFFFF));
        assert_eq!(TRN1.sdma_broadcast(1), b(0x7FFF, 0));
        assert_eq!(TRN1.sdma_broadcast(3), b(0x1FFF, 0xFFFF));
        assert_eq!(TRN1.sdma_broadcast(31), b(0x0001, 0xFFFF));
        assert_eq!(TRN1.sdma_broadcast(32), None);
        assert_eq!(TRN2.sdma_broadcast(0), None);
    }

    #[test]
    fn reserved_queues() {
        assert!(TRN1.is_reserved_queue(32, 0));
        assert!(!TRN1.is_reserved_queue(32, 1));
        assert!(TRN1.is_reserved_queue(3, 14));
        assert!(!TRN1.is_reserved_queue(12, 14));
        assert!(TRN1.is_reserved_queue(12, 15));
        assert!(TRN2.is_reserved_queue(129, 1));
        assert!(!TRN2.is_reserved_queue(129, 2));
        assert!(TRN2.is_reserved_queue(7, 14));
        assert!(!TRN2.is_reserved_queue(5, 14));
    }

    #[test]
    fn host_connectivity() {
        assert!((0..34).all(|e| TRN1.has_host_connectivity(e)));
        assert!(!TRN1.has_host_connectivity(34));
        let v3 = (0..132).filter(|&e| TRN2.has_host_connectivity(e));
        let want = (0..4)
            .flat_map(|i| {
                [4, 12, 20, 28]
                    .into_iter()
                    .flat_map(move |b| (0..4).map(move |k| 32 * i + b + k))
            })
            .chain(128..132);
        assert!(v3.eq(want));
        assert!(TRN2.h2t.iter().all(|&(e, _)| TRN2.has_host_connectivity(e)));
        let (v1, n) = scrub_queues(&TRN1);
        assert_eq!(&v1[..n], &[(33, 0)]);
        let (v3, n) = scrub_queues(&TRN2);
        assert_eq!(&v3[..n], &[(129, 0), (130, 0), (131, 0)]);
        assert!(!TRN2.has_host_connectivity(0) && !TRN2.has_host_connectivity(3));
        assert_eq!(TRN1.engine_bitmap(), [u64::MAX >> 30, 0, 0]);
        assert_eq!(TRN2.engine_bitmap(), [u64::MAX, u64::MAX, 0xF]);
    }

    #[test]
    fn bar0_sizes_and_routes() {
        assert_eq!(TRN1.bar0_min_size(), 0x30D0_0000 + 0x3C800);
        assert_eq!(TRN2.bar0_min_size(), 0xB5F0_0000 + 0x3C800);
        assert_eq!(TRN1.host_addr(0x1234_5000), 0x0000_1000_1234_5000);
        assert_eq!(TRN2.host_addr(0x1234_5000), 0x0000_4000_1234_5000);
        assert_eq!(TRN1.hbm0_len(64 << 20), 64 << 20);
        assert_eq!(TRN1.hbm0_len(32 << 30), 16 << 30);
        assert_eq!(TRN2.hbm0_len(256 << 20), 64 << 20);
        assert_eq!(TRN2.hbm0_len(256 << 30), 24 << 30);
    }
}
