// SPDX-License-Identifier: GPL-2.0
//! Queues whose rings and completion slot live in device memory (HBM): what the driver's
//! `NEURON_UDMA_QUEUE_DEVICE_RINGS` queues need from the model (descriptor fetch from HBM on both
//! rings, HBM-to-HBM copies and the completion marker written to HBM), on V3 engines without host
//! connectivity (hardware.rst §2.5) as on the others, and the host accesses such an engine must
//! still refuse: a host source, a host destination, a completion slot in host memory, and a ring
//! in host memory.

mod common;

use common::*;
use udma_sim::engine::ErrorKind;
use udma_sim::layout::Model;
use udma_sim::mem::GuestMemory;
use udma_sim::regs::{self, desc, m2s_cause, s2m_cause};

/// Device addresses (HBM0: device address = BAR4 offset; the rig's Trn2 HBM0 is 4 MiB).
const TX_RING: u64 = 0x1000;
const RX_RING: u64 = 0x2000;
const MARK: u64 = 0x3000;
const SRC: u64 = 0x10_0000;
const DST: u64 = 0x20_0000;
/// Guest RAM, for the host accesses that must fail.
const HOST_BUF: u64 = RAM_BASE + 0x10_0000;
const HOST_RING: u64 = RAM_BASE;
const MARKER: u32 = 0xABCD_EF01;
/// A V3 SENG engine without host connectivity, and one with it (hardware.rst §2.5).
const HOSTLESS: u32 = 0;
const HOSTED: u32 = 4;
const RING: u32 = 32;

/// Queue init (hardware.rst §3.7) with both rings at device addresses `tx` and `rx`.
fn init_device_queue(rig: &Rig, eng: u32, q: u32, tx: u64, rx: u64) -> SwQueue {
    for (is_tx, a) in [(true, tx), (false, rx)] {
        let b = Rig::bank(is_tx, q);
        if is_tx {
            rig.wr(eng, b + regs::M2S_Q_RLIMIT_MASK, 3);
        }
        rig.wr(eng, b + regs::Q_CFG, 0x0300_0000);
        rig.wr(eng, b + if is_tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL }, 0x100);
        rig.wr(eng, b + regs::Q_BASE_LO, a as u32);
        rig.wr(eng, b + regs::Q_BASE_HI, (a >> 32) as u32);
        rig.wr(eng, b + regs::Q_LEN, RING);
        rig.wr(eng, b + if is_tx { regs::M2S_Q_COMP_CFG } else { regs::S2M_Q_COMP_CFG }, 0);
        rig.wr(eng, b + regs::Q_CFG, 0x0303_0000);
    }
    SwQueue { eng, q, tx: SwRing::new(tx, RING), rx: SwRing::new(rx, RING) }
}

/// Writes a descriptor into a ring in device memory, through BAR4 (as the driver's CPU does).
fn put(rig: &Rig, ring: &SwRing, idx: u32, w0: u32, w1: u32, addr: u64) {
    let mut d = [0u8; 16];
    d[0..4].copy_from_slice(&w0.to_le_bytes());
    d[4..8].copy_from_slice(&w1.to_le_bytes());
    d[8..16].copy_from_slice(&addr.to_le_bytes());
    rig.dev.bar4_write(ring.gpa + u64::from(idx) * 16, &d);
}

/// One pair as the driver builds it (hardware.rst §4.5), into rings in device memory.
fn pair(rig: &Rig, sq: &mut SwQueue, src: u64, dst: u64, len: u32, w0_extra: u32) {
    let (ri, rrid) = sq.rx.take();
    let (ti, trid) = sq.tx.take();
    put(rig, &sq.rx, ri, rrid << 24 | (len & desc::LEN_MASK), 0, dst);
    let w0 = w0_extra | desc::FIRST | desc::LAST | trid << 24 | (len & desc::LEN_MASK);
    put(rig, &sq.tx, ti, w0, desc::META_COPY, src);
}

/// Arms the completion slot at device address `at` (word 0 the marker, word 1 zero).
fn arm(rig: &Rig, at: u64) {
    rig.dev.bar4_write(at, &MARKER.to_le_bytes());
    rig.dev.bar4_write(at + 4, &0u32.to_le_bytes());
}

fn hbm_word(rig: &Rig, at: u64) -> u32 {
    let b = rig.hbm_bytes(at, 4);
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn fill_hbm(rig: &Rig, at: u64, len: usize, seed: u8) -> Vec<u8> {
    let v: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed)).collect();
    rig.dev.bar4_write(at, &v);
    v
}

#[test]
fn hostless_engine_runs_rings_and_markers_in_device_memory() {
    let rig = Rig::new(Model::Trn2);
    rig.init_engine(HOSTLESS);
    let mut sq = init_device_queue(&rig, HOSTLESS, 1, TX_RING, RX_RING);
    // 5 passes over a 32-slot ring (every ring id), one HBM->HBM copy and one marker per round.
    for round in 0..80u32 {
        let len = 64 + round * 8;
        let (src, dst) = (SRC + u64::from(round) * 0x1000, DST + u64::from(round) * 0x1000);
        let data = fill_hbm(&rig, src, len as usize, round as u8);
        arm(&rig, MARK);
        pair(&rig, &mut sq, src, dst, len, 0);
        pair(&rig, &mut sq, MARK, MARK + 4, 4, desc::DMB);
        rig.start(&sq, 2);
        wait_until("marker in device memory", || hbm_word(&rig, MARK + 4) == MARKER);
        assert!(rig.hbm_bytes(dst, len as usize) == data, "round {round}: data differs");
    }
    assert!(rig.dev.engine(HOSTLESS).unwrap().error().is_none());
    assert_eq!(sq.tx.rid, (1 + 160 / RING) & 3);
}

/// A hostless engine with device rings, given one pair that names host memory on `host_side`
/// (0 source, 1 destination, 2 the marker's destination): the engine aborts with the cause of
/// that access, and no byte moves.
fn hostless_refuses(host_side: u32) -> (Rig, u32, u32) {
    let rig = Rig::new(Model::Trn2);
    rig.init_engine(HOSTLESS);
    let mut sq = init_device_queue(&rig, HOSTLESS, 1, TX_RING, RX_RING);
    fill_hbm(&rig, SRC, 4096, 9);
    rig.fill(HOST_BUF, 4096, 3);
    arm(&rig, MARK);
    let host = rig.host(HOST_BUF);
    match host_side {
        0 => pair(&rig, &mut sq, host, DST, 4096, 0),
        1 => pair(&rig, &mut sq, SRC, host, 4096, 0),
        _ => pair(&rig, &mut sq, SRC, DST, 4096, 0),
    }
    let mark_dst = if host_side == 2 { host } else { MARK + 4 };
    pair(&rig, &mut sq, MARK, mark_dst, 4, desc::DMB);
    rig.start(&sq, 2);
    rig.wait_abort(HOSTLESS);
    if host_side == 1 {
        assert_eq!(rig.ram_bytes(HOST_BUF, 16), rig.fill(HOST_BUF + 0x10000, 16, 3), "host written");
    }
    if host_side != 2 {
        assert!(rig.hbm_bytes(DST, 4096).iter().all(|&b| b == 0), "destination written");
    }
    assert_eq!(hbm_word(&rig, MARK + 4), 0);
    let (a, b) = (rig.cause_a(HOSTLESS), rig.cause_b(HOSTLESS));
    (rig, a, b)
}

#[test]
fn hostless_engine_refuses_a_host_source() {
    let (rig, a, b) = hostless_refuses(0);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::DataRead);
    assert_eq!((a, b), (m2s_cause::DATA_READ, 0));
}

#[test]
fn hostless_engine_refuses_a_host_destination() {
    let (rig, a, b) = hostless_refuses(1);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::DataWrite);
    assert_eq!((a, b), (0, s2m_cause::DATA_WRITE));
}

#[test]
fn hostless_engine_refuses_a_completion_write_to_host_memory() {
    let (rig, a, b) = hostless_refuses(2);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::DataWrite);
    assert_eq!((a, b), (0, s2m_cause::DATA_WRITE));
    assert_eq!(rig.ram_bytes(HOST_BUF, 4), rig.fill(HOST_BUF + 0x10000, 4, 3));
}

#[test]
fn hostless_engine_refuses_an_rx_ring_in_host_memory() {
    // Tx ring in device memory (fetched fine), Rx ring in host memory: the S2M descriptor fetch
    // fails (S2M cause 9).
    let rig = Rig::new(Model::Trn2);
    rig.init_engine(HOSTLESS);
    let mut sq = init_device_queue(&rig, HOSTLESS, 1, TX_RING, RX_RING);
    let b = Rig::bank(false, 1);
    rig.wr(HOSTLESS, b + regs::S2M_Q_SW_CTRL, 0x100);
    let hr = rig.host(HOST_RING);
    rig.wr(HOSTLESS, b + regs::Q_BASE_LO, hr as u32);
    rig.wr(HOSTLESS, b + regs::Q_BASE_HI, (hr >> 32) as u32);
    sq.rx = SwRing::new(HOST_RING, RING);
    fill_hbm(&rig, SRC, 64, 1);
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | 64, 0, DST);
    let (ti, trid) = sq.tx.take();
    put(&rig, &sq.tx, ti, desc::FIRST | desc::LAST | trid << 24 | 64, desc::META_COPY, SRC);
    rig.start(&sq, 1);
    rig.wait_abort(HOSTLESS);
    let le = rig.dev.last_error().unwrap();
    assert_eq!((le.record.kind, le.record.dir.map(|d| d.name())), (ErrorKind::DescFetch, Some("rx")));
    assert_eq!(rig.cause_b(HOSTLESS), s2m_cause::DESC_FETCH);
    assert!(rig.hbm_bytes(DST, 64).iter().all(|&b| b == 0));
}

#[test]
fn device_rings_work_on_hosted_engines_with_any_buffer() {
    // An engine with host connectivity (V3 engine 4, every V2 engine) fetches device rings too,
    // and its copies may name host memory (hardware.rst §2.5).
    for (model, eng) in [(Model::Trn2, HOSTED), (Model::Trn1, 3)] {
        let rig = Rig::new(model);
        rig.init_engine(eng);
        let mut sq = init_device_queue(&rig, eng, 2, TX_RING, RX_RING);
        let data = rig.fill(HOST_BUF, 4096, 5);
        arm(&rig, MARK);
        pair(&rig, &mut sq, rig.host(HOST_BUF), DST, 4096, 0);
        pair(&rig, &mut sq, DST, rig.host(HOST_BUF + 0x8000), 4096, desc::DMB);
        pair(&rig, &mut sq, MARK, MARK + 4, 4, desc::DMB);
        rig.start(&sq, 3);
        wait_until("marker", || hbm_word(&rig, MARK + 4) == MARKER);
        assert!(rig.hbm_bytes(DST, 4096) == data, "{model:?}: HBM data differs");
        assert!(rig.ram_bytes(HOST_BUF + 0x8000, 4096) == data, "{model:?}: host data differs");
        assert!(rig.ram.is_mapped(HOST_BUF, 4096));
    }
}
