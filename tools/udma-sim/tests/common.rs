// SPDX-License-Identifier: GPL-2.0
//! Test rig: a device with in-memory guest RAM, driven like the driver does
//! (hardware.rst §3.6 engine init, §3.7 queue init, §4.5 descriptor pairs, §3.8 doorbells).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};
use udma_sim::layout::{Gen, Model};
use udma_sim::mem::{FlatMemory, GuestMemory};
use udma_sim::regs::{self, desc};
use udma_sim::{Config, Device, Options};

/// Guest RAM starts at this guest-physical address.
pub const RAM_BASE: u64 = 0x10_0000;
/// Guest RAM size.
pub const RAM_SIZE: usize = 32 << 20;
/// Poll timeout.
pub const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Rig {
    pub dev: Arc<Device>,
    pub ram: Arc<FlatMemory>,
    pub gen: Gen,
}

/// Software view of one ring (driver side).
#[derive(Clone, Copy, Debug)]
pub struct SwRing {
    pub gpa: u64,
    pub size: u32,
    pub next: u32,
    pub rid: u32,
}

impl SwRing {
    pub fn new(gpa: u64, size: u32) -> SwRing {
        SwRing { gpa, size, next: 0, rid: 1 }
    }
    /// Takes a slot: (index, ring id to stamp).
    pub fn take(&mut self) -> (u32, u32) {
        let r = (self.next, self.rid);
        self.next = (self.next + 1) % self.size;
        if self.next == 0 {
            self.rid = (self.rid + 1) & 3;
        }
        r
    }
}

/// A queue as the driver sees it.
#[derive(Clone, Copy, Debug)]
pub struct SwQueue {
    pub eng: u32,
    pub q: u32,
    pub tx: SwRing,
    pub rx: SwRing,
}

pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < TIMEOUT, "timeout waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Rig {
    pub fn new(model: Model) -> Rig {
        Rig::with_trace(model, None)
    }

    pub fn with_trace(model: Model, trace: Option<std::path::PathBuf>) -> Rig {
        Rig::with_options(model, trace, Options::default())
    }

    pub fn with_options(model: Model, trace: Option<std::path::PathBuf>, options: Options) -> Rig {
        let ram = Arc::new(FlatMemory::anonymous(RAM_BASE, RAM_SIZE).unwrap());
        let dev = Arc::new(
            Device::new(Config { model, hbm_size: 16 << 20, trace, options }, ram.clone() as Arc<dyn GuestMemory>)
                .unwrap(),
        );
        Rig { gen: model.gen(), dev, ram }
    }

    /// Host device address for guest-physical `gpa`.
    pub fn host(&self, gpa: u64) -> u64 {
        gpa | self.gen.host_route()
    }

    pub fn base(&self, eng: u32) -> u64 {
        self.gen.engine_base(eng).unwrap()
    }

    pub fn wr(&self, eng: u32, unit: u32, v: u32) {
        self.dev.bar0_write(self.base(eng) + u64::from(unit), &v.to_le_bytes());
    }

    pub fn rd(&self, eng: u32, unit: u32) -> u32 {
        let mut b = [0u8; 4];
        self.dev.bar0_read(self.base(eng) + u64::from(unit), &mut b);
        u32::from_le_bytes(b)
    }

    pub fn bank(dir_tx: bool, q: u32) -> u32 {
        (if dir_tx { regs::M2S_Q_BASE } else { regs::S2M_Q_BASE }) + q * regs::Q_STRIDE
    }

    /// Engine init as in hardware.rst §3.6 (the parts with model semantics plus a few stored ones).
    pub fn init_engine(&self, eng: u32) {
        for q in 0..16 {
            self.wr(eng, Self::bank(true, q) + regs::Q_CFG, 0x0003_0000);
            self.wr(eng, Self::bank(false, q) + regs::Q_CFG, 0x0003_0000);
        }
        self.wr(eng, 0x310, 0x0100_0400);
        self.wr(eng, 0x124, 0x0000_086F);
        self.wr(eng, 0x3A300, 0x05F5_E100);
        self.wr(eng, regs::M2S_CFG_LEN, 0x010F_FFFF);
        self.wr(eng, 0x258, 0x102);
        let sp = self.rd(eng, regs::SPARE_REG);
        self.wr(eng, regs::SPARE_REG, sp & !1);
        self.wr(eng, 0x3A028, 0x28);
        self.wr(eng, 0x380E8, 0x28);
        self.wr(eng, 0x3A030, 0xF000_0000);
        self.wr(eng, 0x3A018, 0xF000_0000);
        self.wr(eng, 0x380D8, 0xFFFF_FAFF);
        self.wr(eng, 0x3A070, 0x0000_10F8);
        self.wr(eng, 0x3A058, 0x0000_10F8);
        self.wr(eng, 0x20380, 0x1004);
        self.wr(eng, regs::M2S_DESC_PREF_CFG_2, 0x0001_0041);
        self.wr(eng, 0x308, 0x4181);
    }

    /// Queue init as in hardware.rst §3.7 with rings at guest-physical tx_gpa / rx_gpa.
    pub fn init_queue(&self, eng: u32, q: u32, tx_gpa: u64, rx_gpa: u64, size: u32) -> SwQueue {
        for (tx, gpa) in [(true, tx_gpa), (false, rx_gpa)] {
            let b = Self::bank(tx, q);
            if tx {
                self.wr(eng, b + regs::M2S_Q_RLIMIT_MASK, 3);
            }
            self.wr(eng, b + regs::Q_CFG, 0x0300_0000);
            self.wr(eng, b + if tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL }, 0x100);
            let a = self.host(gpa);
            self.wr(eng, b + regs::Q_BASE_LO, a as u32);
            self.wr(eng, b + regs::Q_BASE_HI, (a >> 32) as u32);
            self.wr(eng, b + regs::Q_LEN, size);
            self.wr(eng, b + if tx { regs::M2S_Q_COMP_CFG } else { regs::S2M_Q_COMP_CFG }, 0);
            self.wr(eng, b + regs::Q_CFG, 0x0303_0000);
        }
        SwQueue { eng, q, tx: SwRing::new(tx_gpa, size), rx: SwRing::new(rx_gpa, size) }
    }

    pub fn put_desc(&self, ring: &SwRing, idx: u32, w0: u32, w1: u32, addr: u64) {
        let mut d = [0u8; 16];
        d[0..4].copy_from_slice(&w0.to_le_bytes());
        d[4..8].copy_from_slice(&w1.to_le_bytes());
        d[8..16].copy_from_slice(&addr.to_le_bytes());
        assert!(self.ram.write(ring.gpa + u64::from(idx) * 16, &d));
    }

    /// Builds one Tx+Rx pair like `udma_m2m_copy_prepare_one` (src/dst are device addresses).
    pub fn prepare(&self, sq: &mut SwQueue, src: u64, dst: u64, len: u32) {
        self.prepare_with(sq, src, dst, len, 0);
    }

    /// As [`Rig::prepare`], with DMB on the Tx descriptor: the pair waits for every earlier
    /// transfer of the queue. A pair that reads device memory an earlier pair of the queue wrote
    /// needs it (hardware.rst §4.2 bit 30; without it the read may see the old bytes).
    pub fn prepare_dmb(&self, sq: &mut SwQueue, src: u64, dst: u64, len: u32) {
        self.prepare_with(sq, src, dst, len, desc::DMB);
    }

    fn prepare_with(&self, sq: &mut SwQueue, src: u64, dst: u64, len: u32, w0_extra: u32) {
        let l = len & desc::LEN_MASK; // 65536 -> 0
        let (ri, rrid) = sq.rx.take();
        let (ti, trid) = sq.tx.take();
        self.put_desc(&sq.rx, ri, rrid << 24 | l, 0, dst);
        self.put_desc(&sq.tx, ti, desc::FIRST | desc::LAST | w0_extra | trid << 24 | l, desc::META_COPY, src);
    }

    pub fn doorbell(&self, eng: u32, q: u32, tx: bool, n: u32) {
        self.wr(eng, Self::bank(tx, q) + regs::Q_DOORBELL, n);
    }

    /// Copy start: Rx doorbell then Tx doorbell (hardware.rst §3.8).
    pub fn start(&self, sq: &SwQueue, n: u32) {
        self.doorbell(sq.eng, sq.q, false, n);
        self.doorbell(sq.eng, sq.q, true, n);
    }

    pub fn head(&self, eng: u32, q: u32, tx: bool) -> u32 {
        self.rd(eng, Self::bank(tx, q) + regs::Q_HEAD)
    }

    pub fn tail(&self, eng: u32, q: u32, tx: bool) -> u32 {
        self.rd(eng, Self::bank(tx, q) + regs::Q_TAIL)
    }

    /// Waits until both heads equal the software next index / ring id, and no write is held
    /// (on any engine).
    pub fn wait_done(&self, sq: &SwQueue) {
        self.wait_heads(sq);
        // Barrier-free packets may still have writes held (unordered completion).
        wait_until("held writes", || self.dev.held_writes() == 0);
    }

    /// Waits until both heads equal the software next index / ring id (writes may still be
    /// held, here or on other queues).
    pub fn wait_heads(&self, sq: &SwQueue) {
        let want_tx = sq.tx.next | sq.tx.rid << 30;
        let want_rx = sq.rx.next | sq.rx.rid << 30;
        wait_until("heads", || {
            assert!(
                self.dev.engine(sq.eng).unwrap().error().is_none(),
                "unexpected engine error {:?}",
                self.dev.last_error()
            );
            self.head(sq.eng, sq.q, true) == want_tx && self.head(sq.eng, sq.q, false) == want_rx
        });
    }

    pub fn wait_abort(&self, eng: u32) {
        wait_until("abort", || self.rd(eng, regs::M2S_STATE) == regs::STATE_ABORT);
        assert_eq!(self.rd(eng, regs::S2M_STATE), regs::STATE_ABORT);
    }

    pub fn cause_a(&self, eng: u32) -> u32 {
        self.rd(eng, regs::IOFIC_SEC_A + regs::IOFIC_CAUSE)
    }

    pub fn cause_b(&self, eng: u32) -> u32 {
        self.rd(eng, regs::IOFIC_SEC_B + regs::IOFIC_CAUSE)
    }

    pub fn fill(&self, gpa: u64, len: usize, seed: u8) -> Vec<u8> {
        let v: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        assert!(self.ram.write(gpa, &v));
        v
    }

    pub fn ram_bytes(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        assert!(self.ram.read(gpa, &mut v));
        v
    }

    pub fn hbm_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.dev.bar4_read(off, &mut v);
        v
    }
}
