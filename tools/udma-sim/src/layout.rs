// SPDX-License-Identifier: GPL-2.0
//! Per-generation facts: PCI identity, BAR sizes, engine block offsets and
//! device-fabric address decoding (hardware.rst §1, §2.2, §1.3, §8.2 item 8).

use crate::regs::UNIT_FOOTPRINT;

/// PCI vendor id of all Neuron devices (hardware.rst §1.1).
pub const PCI_VENDOR_ID: u16 = 0x1D0F;

/// Chip model served by the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Trainium1, arch V2, device 0x7164.
    Trn1,
    /// Inferentia2, arch V2, device 0x7264.
    Inf2,
    /// Trainium2, arch V3, device 0x7364.
    Trn2,
}

/// Neuron architecture generation (hardware.rst §1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gen {
    /// V2: Trn1/Inf2.
    V2,
    /// V3: Trn2.
    V3,
}

/// Where a device-fabric address points after decoding (hardware.rst §1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Host memory at this guest-physical address (route bits stripped).
    Host(u64),
    /// Device memory (HBM) at this device address; [`Gen::hbm_windows`] maps it to BAR4.
    Device(u64),
}

impl Model {
    /// Parses `trn1`, `inf2` or `trn2`.
    pub fn parse(s: &str) -> Option<Model> {
        match s {
            "trn1" => Some(Model::Trn1),
            "inf2" => Some(Model::Inf2),
            "trn2" => Some(Model::Trn2),
            _ => None,
        }
    }

    /// PCI device id (hardware.rst §1.1).
    pub fn device_id(self) -> u16 {
        match self {
            Model::Trn1 => 0x7164,
            Model::Inf2 => 0x7264,
            Model::Trn2 => 0x7364,
        }
    }

    /// Architecture generation.
    pub fn gen(self) -> Gen {
        match self {
            Model::Trn1 | Model::Inf2 => Gen::V2,
            Model::Trn2 => Gen::V3,
        }
    }
}

/// V2 engines 0-15 (hardware.rst §2.2).
const V2_NC0_BASE: u64 = 0x3000_0000;
/// V2 engines 16-31 (hardware.rst §2.2).
const V2_NC1_BASE: u64 = 0x3070_0000;
/// V2 engine spacing (hardware.rst §2.2).
const V2_STRIDE: u64 = 0x40000;
/// V2 engine 32 (D2H) and 33 (H2D) (hardware.rst §2.2).
const V2_H2T: [u64; 2] = [0x3060_0000, 0x30D0_0000];
/// V3 SENG bases (hardware.rst §2.2).
const V3_SENG_BASE: [u64; 4] = [0x8200_0000, 0x9400_0000, 0xA200_0000, 0xB400_0000];
/// V3 engine spacing inside a SENG (hardware.rst §2.2).
const V3_STRIDE: u64 = 0x10_0000;
/// V2 HBM1: device address 0x10_0000_0000, BAR4 offset 16 GiB (hardware.rst §1.2, §1.3).
const V2_HBM1: (u64, u64) = (0x10_0000_0000, 16 << 30);
/// V2 HBM size: 16 GiB each (hardware.rst §1.3).
const V2_HBM_SIZE: u64 = 16 << 30;
/// V3 HBM n device addresses (hardware.rst §1.3).
const V3_HBM_BASE: [u64; 4] = [0, 0x40_0000_0000, 0x8000_0000_0000, 0x8040_0000_0000];
/// V3 active bytes of each HBM (hardware.rst §1.3).
const V3_HBM_ACTIVE: u64 = 24 << 30;
/// V3 engines 128-131 (hardware.rst §2.2).
const V3_H2T: [u64; 4] = [0x0680_0000, 0x0690_0000, 0x4680_0000, 0x4690_0000];

impl Gen {
    /// Number of engine ids (V2: 0-33, V3: 0-131).
    pub fn engine_count(self) -> u32 {
        match self {
            Gen::V2 => 34,
            Gen::V3 => 132,
        }
    }

    /// BAR0 size in bytes: 1 GiB (V2), 4 GiB (V3).
    pub fn bar0_size(self) -> u64 {
        match self {
            Gen::V2 => 0x4000_0000,
            Gen::V3 => 0x1_0000_0000,
        }
    }

    /// BAR0 offset of engine `id`'s register block (hardware.rst §2.2).
    pub fn engine_base(self, id: u32) -> Option<u64> {
        let id64 = u64::from(id);
        match self {
            Gen::V2 => match id {
                0..=15 => Some(V2_NC0_BASE + id64 * V2_STRIDE),
                16..=31 => Some(V2_NC1_BASE + (id64 - 16) * V2_STRIDE),
                32 | 33 => Some(V2_H2T[(id - 32) as usize]),
                _ => None,
            },
            Gen::V3 => match id {
                0..=127 => Some(V3_SENG_BASE[(id / 32) as usize] + (id64 % 32) * V3_STRIDE),
                128..=131 => Some(V3_H2T[(id - 128) as usize]),
                _ => None,
            },
        }
    }

    /// Maps a BAR0 offset to (engine id, unit offset), if it falls inside an
    /// engine's register footprint.
    pub fn decode_bar0(self, off: u64) -> Option<(u32, u32)> {
        let inside = |base: u64| -> Option<u32> {
            let d = off.checked_sub(base)?;
            (d < u64::from(UNIT_FOOTPRINT)).then_some(d as u32)
        };
        let strided = |base: u64, stride: u64, n: u64| -> Option<(u64, u32)> {
            let d = off.checked_sub(base)?;
            let idx = d / stride;
            if idx >= n {
                return None;
            }
            inside(base + idx * stride).map(|u| (idx, u))
        };
        match self {
            Gen::V2 => {
                if let Some((i, u)) = strided(V2_NC0_BASE, V2_STRIDE, 16) {
                    return Some((i as u32, u));
                }
                if let Some((i, u)) = strided(V2_NC1_BASE, V2_STRIDE, 16) {
                    return Some((16 + i as u32, u));
                }
                V2_H2T.iter().enumerate().find_map(|(i, &b)| inside(b).map(|u| (32 + i as u32, u)))
            }
            Gen::V3 => {
                for (s, &b) in V3_SENG_BASE.iter().enumerate() {
                    if let Some((i, u)) = strided(b, V3_STRIDE, 32) {
                        return Some((s as u32 * 32 + i as u32, u));
                    }
                }
                V3_H2T.iter().enumerate().find_map(|(i, &b)| inside(b).map(|u| (128 + i as u32, u)))
            }
        }
    }

    /// Host route base OR-ed onto host DMA addresses (hardware.rst §1.3).
    pub fn host_route(self) -> u64 {
        match self {
            Gen::V2 => 0x0000_1000_0000_0000,
            Gen::V3 => 0x0000_4000_0000_0000,
        }
    }

    /// Decodes a device-fabric address (hardware.rst §1.3, §8.2 item 8).
    ///
    /// V2: bits 44-63 select the route; 0x001 = host (bits 44-48 = 0x01), 0 =
    /// device memory. V3: bit 46 = host (bits 47-63 must be 0); bits 46-63 all
    /// zero (HBM0/1) or bit 47 alone (HBM2/3 at 0x8000_0000_0000) = device
    /// memory. Any other route (neighbour devices, east/west) is unsupported and
    /// returns `None` (the caller reports an address error). A device address is
    /// valid only inside an HBM window ([`Gen::hbm_windows`]).
    pub fn decode_addr(self, a: u64) -> Option<Target> {
        let shift = match self {
            Gen::V2 => 44,
            Gen::V3 => 46,
        };
        let low = a & ((1u64 << shift) - 1);
        match (self, a >> shift) {
            (_, 0) | (Gen::V3, 2) => Some(Target::Device(a)),
            (_, 1) => Some(Target::Host(low)),
            _ => None,
        }
    }

    /// The device-memory windows of a BAR4 of `bar4_size` bytes: `(device address, BAR4
    /// offset, length)` of each HBM (hardware.rst §1.2, §1.3). V2: HBM0 at device address 0 = BAR4
    /// 0, HBM1 at 0x10_0000_0000 = BAR4 + 16 GiB, 16 GiB each. V3 (QEMU flavour, hardware.rst §1.2:
    /// the per-HBM size is BAR4 / 4): HBM n at its device address = BAR4 n x (size / 4), at most
    /// 24 GiB active. Parts beyond the BAR are absent.
    pub fn hbm_windows(self, bar4_size: u64) -> Vec<(u64, u64, u64)> {
        let fit = |dev: u64, off: u64, len: u64| (off < bar4_size).then(|| (dev, off, len.min(bar4_size - off)));
        match self {
            Gen::V2 => [(0, 0), V2_HBM1].iter().filter_map(|&(d, o)| fit(d, o, V2_HBM_SIZE)).collect(),
            Gen::V3 => {
                let per = bar4_size / 4;
                (0..4u64).filter_map(|n| fit(V3_HBM_BASE[n as usize], n * per, per.min(V3_HBM_ACTIVE))).collect()
            }
        }
    }

    /// Whether engine `id` can reach host memory (hardware.rst §2.5): every V2 engine; on V3 the
    /// H2T engines 128-131 and the SENG engines 32i + {4-7, 12-15, 20-23, 28-31}. hardware.rst
    /// lists the engines the driver gives host addresses to \[D\] and assumes the others cannot reach
    /// the host \[I\]; [`crate::Options::host_connectivity`] turns the rule off.
    pub fn has_host_connectivity(self, id: u32) -> bool {
        match self {
            Gen::V2 => id < 34,
            Gen::V3 => (128..132).contains(&id) || (id < 128 && (id % 8) >= 4),
        }
    }

    /// True for V3 SENG engines (ids < 128), whose driver init masks ring-id errors
    /// (hardware.rst §3.5).
    pub fn is_seng(self, id: u32) -> bool {
        self == Gen::V3 && id < 128
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_offsets_roundtrip() {
        for g in [Gen::V2, Gen::V3] {
            for id in 0..g.engine_count() {
                let b = g.engine_base(id).unwrap();
                assert!(b + u64::from(UNIT_FOOTPRINT) <= g.bar0_size());
                assert_eq!(g.decode_bar0(b), Some((id, 0)));
                assert_eq!(g.decode_bar0(b + 0x3C7FC), Some((id, 0x3C7FC)));
                assert_eq!(g.decode_bar0(b + 0x3C800), None);
            }
            assert_eq!(g.engine_base(g.engine_count()), None);
        }
        assert_eq!(Gen::V2.engine_base(33), Some(0x30D0_0000));
        assert_eq!(Gen::V2.engine_base(17), Some(0x3074_0000));
        assert_eq!(Gen::V3.engine_base(37), Some(0x9450_0000));
        assert_eq!(Gen::V3.engine_base(131), Some(0x4690_0000));
        assert_eq!(Gen::V2.decode_bar0(0x3040_0000), None);
    }

    #[test]
    fn host_connectivity_table() {
        assert!((0..34).all(|e| Gen::V2.has_host_connectivity(e)));
        let v3: Vec<u32> = (0..132).filter(|&e| Gen::V3.has_host_connectivity(e)).collect();
        let mut want: Vec<u32> = (0..4)
            .flat_map(|i| [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31].map(|e| 32 * i + e))
            .collect();
        want.extend(128..132);
        assert_eq!(v3, want);
        assert!(!Gen::V3.has_host_connectivity(0) && !Gen::V3.has_host_connectivity(132));
    }

    #[test]
    fn address_decoding() {
        assert_eq!(Gen::V2.decode_addr(0x1000_0000_1234), Some(Target::Host(0x1234)));
        assert_eq!(Gen::V2.decode_addr(0x1234), Some(Target::Device(0x1234)));
        assert_eq!(Gen::V2.decode_addr(0x3000_0000_1234), None);
        assert_eq!(Gen::V3.decode_addr(0x4000_0000_1234), Some(Target::Host(0x1234)));
        assert_eq!(Gen::V3.decode_addr(0x1000_0000_0000), Some(Target::Device(0x1000_0000_0000)));
        assert_eq!(Gen::V3.decode_addr(0x8040_0000_0010), Some(Target::Device(0x8040_0000_0010)));
        assert_eq!(Gen::V3.decode_addr(0xC000_0000_0000), None);
        assert_eq!(Gen::V3.decode_addr(0x10_0000_0000_0000), None);
        assert_eq!(Gen::V2.decode_addr(0x10_0000_0000), Some(Target::Device(0x10_0000_0000)));
    }

    #[test]
    fn hbm_windows() {
        assert_eq!(Gen::V2.hbm_windows(64 << 20), vec![(0, 0, 64 << 20)]);
        assert_eq!(Gen::V2.hbm_windows(32 << 30), vec![(0, 0, 16 << 30), (0x10_0000_0000, 16 << 30, 16 << 30)]);
        let m = 1u64 << 20;
        assert_eq!(
            Gen::V3.hbm_windows(256 * m),
            vec![
                (0, 0, 64 * m),
                (0x40_0000_0000, 64 * m, 64 * m),
                (0x8000_0000_0000, 128 * m, 64 * m),
                (0x8040_0000_0000, 192 * m, 64 * m)
            ]
        );
        assert_eq!(Gen::V3.hbm_windows(256 << 30)[3], (0x8040_0000_0000, 192 << 30, 24 << 30));
    }
}
