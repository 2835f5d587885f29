// SPDX-License-Identifier: GPL-2.0
//! The strict rules (Documentation/udma-sim.rst, "Strictness"): one test per rule; each shows
//! the wrong sequence failing with the right cause bits (or the data not landing), and the
//! right one working.

mod common;

use common::*;
use std::time::Duration;
use udma_sim::engine::{Dir, ErrorKind, POSTED_WRITE_MAX};
use udma_sim::layout::Model;
use udma_sim::mem::GuestMemory;
use udma_sim::regs::{self, desc, m2s_cause, s2m_cause};
use udma_sim::Options;

const TX_RING: u64 = RAM_BASE;
const RX_RING: u64 = RAM_BASE + 0x40000;
const SRC: u64 = RAM_BASE + 0x10_0000;
const DST: u64 = RAM_BASE + 0x80_0000;
const MARK: u64 = RAM_BASE + 0xF0_0000;
const MARKER: u32 = 0xABCD_EF01;
const E: u32 = 32;

fn rig_with_delay(ms: u64) -> Rig {
    Rig::with_options(
        Model::Trn1,
        None,
        Options { unordered_delay: Some(Duration::from_millis(ms)), ..Options::default() },
    )
}

/// One pair like `udma_m2m_copy_prepare_one` with extra `len_ctrl` bits and a `meta_ctrl`.
fn pair(rig: &Rig, sq: &mut SwQueue, src: u64, dst: u64, len: u32, w0_extra: u32, meta: u32) {
    let l = len & desc::LEN_MASK;
    let (ri, rrid) = sq.rx.take();
    let (ti, trid) = sq.tx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | l, 0, dst);
    rig.put_desc(&sq.tx, ti, desc::FIRST | desc::LAST | w0_extra | trid << 24 | l, meta, src);
}

/// A 16 KiB data pair (barrier `data_w0`/`data_meta`) then the 4-byte marker pair (`mark_w0`).
fn data_then_marker(rig: &Rig, data_w0: u32, data_meta: u32, mark_w0: u32) -> (SwQueue, Vec<u8>) {
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 16384, 9);
    assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
    pair(rig, &mut sq, rig.host(SRC), rig.host(DST), 16384, data_w0, data_meta);
    pair(rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, mark_w0, desc::META_COPY);
    rig.start(&sq, 2);
    wait_until("marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
    (sq, data)
}

#[test]
fn unordered_marker_lands_before_barrier_free_data() {
    let rig = rig_with_delay(400);
    let (sq, data) = data_then_marker(&rig, 0, desc::META_COPY, 0);
    // The marker is there, the data is not: completion proves nothing without a barrier.
    assert_eq!(rig.ram_bytes(DST, 16384), vec![0u8; 16384]);
    assert_eq!(rig.dev.held_writes(), 1);
    // It lands after the delay.
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 16384), data);
}

#[test]
fn dmb_on_the_marker_orders_it_after_the_data() {
    let rig = rig_with_delay(5000);
    let (_, data) = data_then_marker(&rig, 0, desc::META_COPY, desc::DMB);
    assert_eq!(rig.ram_bytes(DST, 16384), data);
    assert_eq!(rig.dev.held_writes(), 0);
}

#[test]
fn write_barrier_on_the_last_data_pair_orders_the_marker() {
    let rig = rig_with_delay(5000);
    let (_, data) = data_then_marker(&rig, 0, desc::META_COPY_WB, 0);
    assert_eq!(rig.ram_bytes(DST, 16384), data);
}

#[test]
fn write_barrier_alone_does_not_order_a_marker_after_earlier_data() {
    // Barrier-free data, then a marker with only the write barrier (no DMB): the write barrier
    // orders the marker before later writes, not after earlier ones. The marker lands, the data
    // stays held (here until a later write, at the latest the delay).
    let rig = rig_with_delay(5000);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 16384, 9);
    assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
    pair(&rig, &mut sq, rig.host(SRC), rig.host(DST), 16384, 0, desc::META_COPY);
    pair(&rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, 0, desc::META_COPY_WB);
    rig.start(&sq, 2);
    wait_until("marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rig.ram_bytes(DST, 16384), vec![0u8; 16384], "write-barrier marker ordered after earlier data");
    assert_eq!(rig.dev.held_writes(), 1);
    // A later write lands the data the write barrier fenced first.
    let later = rig.fill(SRC + 0x10000, 64, 3);
    pair(&rig, &mut sq, rig.host(SRC + 0x10000), rig.host(DST + 0x10000), 64, 0, desc::META_COPY);
    rig.start(&sq, 1);
    wait_until("later write", || rig.ram_bytes(DST + 0x10000, 64) == later);
    assert_eq!(rig.ram_bytes(DST, 16384), data);
    // The reference driver's order, a write barrier on the last data pair and a barrier-free
    // marker, and the driver's, DMB on the marker, both order the marker after all the data.
    for (last_meta, mark_w0) in [(desc::META_COPY_WB, 0), (desc::META_COPY, desc::DMB)] {
        let rig = rig_with_delay(5000);
        rig.init_engine(E);
        let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        let data = rig.fill(SRC, 32768, 5);
        assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
        pair(&rig, &mut sq, rig.host(SRC), rig.host(DST), 16384, 0, desc::META_COPY);
        pair(&rig, &mut sq, rig.host(SRC + 16384), rig.host(DST + 16384), 16384, 0, last_meta);
        pair(&rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, mark_w0, desc::META_COPY);
        rig.start(&sq, 3);
        wait_until("marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
        assert_eq!(rig.ram_bytes(DST, 32768), data, "meta 0x{last_meta:x} marker 0x{mark_w0:x}");
    }
}

#[test]
fn device_memory_reads_do_not_see_unordered_writes_of_the_queue() {
    // A pair writes device memory, a later pair of the same queue reads it back without DMB:
    // the read returns the bytes from before the write, whatever the writer carried (held,
    // write barrier, a short write, DMB on the writer itself). With DMB on the reader it returns
    // the new bytes; so does a later submission after the DMB marker.
    const HBM: u64 = 0x2000;
    let writers = [
        (0u32, desc::META_COPY, 4096u32),
        (0, desc::META_COPY_WB, 4096),
        (0, desc::META_COPY, 64),
        (desc::DMB, desc::META_COPY, 4096),
    ];
    for (w0, meta, len) in writers {
        for reader_dmb in [false, true] {
            let rig = rig_with_delay(5000);
            rig.init_engine(E);
            let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
            let old: Vec<u8> = (0..len).map(|i| (i * 3) as u8 | 1).collect();
            rig.dev.bar4_write(HBM, &old);
            let new = rig.fill(SRC, len as usize, 0x40);
            assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
            pair(&rig, &mut sq, rig.host(SRC), HBM, len, w0, meta);
            let r_w0 = if reader_dmb { desc::DMB } else { 0 };
            pair(&rig, &mut sq, HBM, rig.host(DST), len, r_w0, desc::META_COPY);
            pair(&rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, desc::DMB, desc::META_COPY);
            rig.start(&sq, 3);
            rig.wait_done(&sq);
            let what = format!("writer w0 0x{w0:x} meta 0x{meta:x} len {len}, reader DMB {reader_dmb}");
            assert!(rig.hbm_bytes(HBM, len as usize) == new, "{what}: device memory not written");
            let got = rig.ram_bytes(DST, len as usize);
            let want = if reader_dmb { &new } else { &old };
            assert!(got == *want, "{what}: read {} bytes", if got == new { "new" } else { "other" });
            // The next submission (after the DMB marker) sees the new bytes without a barrier.
            assert!(rig.ram.write(MARK + 4, &[0; 4]));
            pair(&rig, &mut sq, HBM, rig.host(DST + 0x10000), len, 0, desc::META_COPY);
            pair(&rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, desc::DMB, desc::META_COPY);
            rig.start(&sq, 2);
            rig.wait_done(&sq);
            assert!(rig.ram_bytes(DST + 0x10000, len as usize) == new, "{what}: next submission");
        }
    }
    // Host memory is different: a read sees the queue's earlier writes to it (a read request does
    // not pass posted writes), held or not.
    let rig = rig_with_delay(5000);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 0x11);
    pair(&rig, &mut sq, rig.host(SRC), rig.host(DST), 4096, 0, desc::META_COPY);
    pair(&rig, &mut sq, rig.host(DST), rig.host(DST + 0x10000), 4096, 0, desc::META_COPY);
    pair(&rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, desc::DMB, desc::META_COPY);
    rig.start(&sq, 3);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST + 0x10000, 4096), data);
}

#[test]
fn ordered_device_reads_see_the_queues_earlier_writes() {
    // With unordered_device_reads off (the guest runs' setting), a device-memory read without
    // DMB sees what an earlier packet of the queue wrote, held or not: the held write lands first.
    const HBM: u64 = 0x2000;
    for (w0, meta, len) in [(0u32, desc::META_COPY, 4096u32), (0, desc::META_COPY_WB, 4096), (0, desc::META_COPY, 64)] {
        let rig = Rig::with_options(
            Model::Trn1,
            None,
            Options {
                unordered_delay: Some(Duration::from_millis(5000)),
                unordered_device_reads: false,
                ..Options::default()
            },
        );
        rig.init_engine(E);
        let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        let old: Vec<u8> = (0..len).map(|i| (i * 3) as u8 | 1).collect();
        rig.dev.bar4_write(HBM, &old);
        let new = rig.fill(SRC, len as usize, 0x40);
        assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
        pair(&rig, &mut sq, rig.host(SRC), HBM, len, w0, meta);
        pair(&rig, &mut sq, HBM, rig.host(DST), len, 0, desc::META_COPY);
        pair(&rig, &mut sq, rig.host(MARK), rig.host(MARK + 4), 4, desc::DMB, desc::META_COPY);
        rig.start(&sq, 3);
        rig.wait_done(&sq);
        assert!(rig.ram_bytes(DST, len as usize) == new, "meta 0x{meta:x} len {len}: read the old bytes");
    }
}

#[test]
fn short_writes_are_never_held_and_ordered_mode_holds_nothing() {
    let rig = rig_with_delay(5000);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 3);
    pair(&rig, &mut sq, rig.host(SRC), rig.host(DST), POSTED_WRITE_MAX as u32, 0, desc::META_COPY);
    rig.start(&sq, 1);
    wait_until("short write", || rig.ram_bytes(DST, 64) == data[..64]);
    // With unordered completion off, a long barrier-free packet lands at once.
    let rig = Rig::with_options(Model::Trn1, None, Options { unordered_delay: None, ..Options::default() });
    let (_, data) = data_then_marker(&rig, 0, desc::META_COPY, 0);
    assert_eq!(rig.ram_bytes(DST, 16384), data);
}

#[test]
fn queue_reset_drops_held_writes() {
    let rig = rig_with_delay(300);
    let (_, _) = data_then_marker(&rig, 0, desc::META_COPY, 0);
    rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    wait_until("held writes dropped", || rig.dev.held_writes() == 0);
    assert_eq!(rig.ram_bytes(DST, 16384), vec![0u8; 16384]);
}

#[test]
fn v3_engines_without_host_connectivity_cannot_fetch_host_rings() {
    let rig = Rig::new(Model::Trn2);
    rig.init_engine(0);
    let mut sq = rig.init_queue(0, 1, TX_RING, RX_RING, 64);
    rig.fill(SRC, 4096, 1);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    // The Rx doorbell comes first: the Rx prefetch cannot fetch the host Rx ring (S2M 9).
    rig.start(&sq, 1);
    rig.wait_abort(0);
    let le = rig.dev.last_error().unwrap();
    assert_eq!((le.engine, le.record.kind, le.record.dir), (0, ErrorKind::DescFetch, Some(Dir::Rx)));
    assert_eq!((rig.cause_a(0), rig.cause_b(0)), (0, s2m_cause::DESC_FETCH));
    // A Tx doorbell alone: the Tx fetch of the host Tx ring fails (M2S 11).
    let rig = Rig::new(Model::Trn2);
    rig.init_engine(0);
    let mut sq = rig.init_queue(0, 1, TX_RING, RX_RING, 64);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.doorbell(0, 1, true, 1);
    rig.wait_abort(0);
    let le = rig.dev.last_error().unwrap();
    assert_eq!((le.engine, le.record.kind, le.record.dir), (0, ErrorKind::DescFetch, Some(Dir::Tx)));
    assert_eq!((rig.cause_a(0), rig.cause_b(0)), (m2s_cause::DESC_FETCH, 0));
    // Engine 4 of the same SENG (hardware.rst §2.5) and the H2T engine 128 reach host memory.
    for e in [4, 128] {
        rig.init_engine(e);
        let mut sq = rig.init_queue(e, 2, TX_RING + 0x8000, RX_RING + 0x8000, 64);
        rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
        rig.prepare(&mut sq, rig.host(MARK), rig.host(MARK + 4), 4);
        rig.start(&sq, 2);
        rig.wait_done(&sq);
    }
    assert_eq!(rig.ram_bytes(DST, 4096), rig.ram_bytes(SRC, 4096));
    // Lenient option: every engine reaches the host.
    let rig = Rig::with_options(Model::Trn2, None, Options { host_connectivity: false, ..Options::default() });
    rig.init_engine(0);
    let mut sq = rig.init_queue(0, 1, TX_RING, RX_RING, 64);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.start(&sq, 1);
    rig.wait_done(&sq);
}

/// Queue init without the engine init's error unmasking: cfg_len and max descriptors written,
/// abort masks at their reset value (all masked).
fn engine_without_unmask(rig: &Rig) -> SwQueue {
    rig.wr(E, regs::M2S_CFG_LEN, 0x010F_FFFF);
    rig.wr(E, regs::M2S_DESC_PREF_CFG_2, 0x0001_0041);
    rig.init_queue(E, 0, TX_RING, RX_RING, 64)
}

#[test]
fn masked_error_does_not_abort_and_the_marker_still_lands() {
    let rig = Rig::new(Model::Trn1);
    assert_eq!(rig.rd(E, regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK), u32::MAX, "reset value: masked");
    let mut sq = engine_without_unmask(&rig);
    assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
    // A copy to an unmapped destination, then the marker pair.
    rig.prepare(&mut sq, rig.host(SRC), rig.host(0x7000_0000), 4096);
    rig.prepare(&mut sq, rig.host(MARK), rig.host(MARK + 4), 4);
    rig.start(&sq, 2);
    // The failed copy looks successful: marker there, engine normal, only the cause bit says it.
    wait_until("marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
    rig.wait_done(&sq);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.cause_b(E), s2m_cause::DATA_WRITE);
    assert!(rig.dev.last_error().is_none());
    // The driver's init (hardware.rst §3.6 steps 15/16) unmasks: the same copy aborts.
    rig.init_engine(E);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(0x7000_0000), 4096);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::DataWrite);
}

#[test]
fn cause_bits_stay_until_software_clears_them() {
    let rig = Rig::new(Model::Trn1);
    let mut sq = engine_without_unmask(&rig);
    rig.prepare(&mut sq, rig.host(0x7000_0000), rig.host(DST), 64);
    rig.start(&sq, 1);
    rig.wait_done(&sq);
    assert_eq!(rig.cause_a(E), m2s_cause::DATA_READ);
    // Queue re-init does not clear them; write-0-to-clear does.
    rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    assert_eq!(rig.cause_a(E), m2s_cause::DATA_READ);
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_CAUSE, !m2s_cause::DATA_READ);
    assert_eq!(rig.cause_a(E), 0);
}

#[test]
fn rx_prefetch_checks_ring_ids_up_to_the_tail() {
    // An Rx doorbell one larger than the descriptors written: the packet itself is complete,
    // but the prefetched slot 1 has a stale ring id (S2M cause 11).
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.fill(SRC, 4096, 2);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.doorbell(E, 0, false, 2);
    rig.doorbell(E, 0, true, 1);
    rig.wait_abort(E);
    let le = rig.dev.last_error().unwrap();
    assert_eq!((le.record.kind, le.record.index), (ErrorKind::RingId, Some(1)));
    assert_eq!(rig.cause_b(E), s2m_cause::RING_ID);
    assert_eq!(rig.ram_bytes(DST, 4096), vec![0u8; 4096]);
    // The same with the descriptor written first works.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST + 4096), 4096);
    rig.doorbell(E, 0, false, 2);
    rig.doorbell(E, 0, true, 2);
    rig.wait_done(&sq);
}

#[test]
fn rx_descriptors_are_checked_at_the_rx_doorbell() {
    // A bad Rx descriptor rung without any Tx packet is reported by the Rx prefetch: a stale ring
    // id (S2M 11), a destination that is not mapped (S2M 1), an undefined len_ctrl bit (M2S 1).
    let cases = [
        (ErrorKind::RingId, 0, s2m_cause::RING_ID),
        (ErrorKind::DataWrite, 0, s2m_cause::DATA_WRITE),
        (ErrorKind::Unsupported, m2s_cause::UNSUPPORTED, 0),
    ];
    for (kind, a, b) in cases {
        let rig = Rig::new(Model::Trn1);
        rig.init_engine(E);
        let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        let (ri, rrid) = sq.rx.take();
        let (w0, dst) = match kind {
            ErrorKind::RingId => (((rrid + 1) & 3) << 24 | 64, rig.host(DST)),
            ErrorKind::DataWrite => (rrid << 24 | 64, rig.host(0x7000_0000)),
            _ => (desc::FIRST | rrid << 24 | 64, rig.host(DST)),
        };
        rig.put_desc(&sq.rx, ri, w0, 0, dst);
        rig.doorbell(E, 0, false, 1);
        rig.wait_abort(E);
        let le = rig.dev.last_error().unwrap();
        assert_eq!((le.record.kind, le.record.dir, le.record.index), (kind, Some(Dir::Rx), Some(0)));
        assert_eq!((rig.cause_a(E), rig.cause_b(E)), (a, b), "{kind:?}");
        assert_eq!((rig.head(E, 0, true), rig.head(E, 0, false)), (1 << 30, 1 << 30));
    }
    // Masked (abort masks at their reset value), a bad destination only sets its cause bit.
    let rig = Rig::new(Model::Trn1);
    let mut sq = engine_without_unmask(&rig);
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | 64, 0, rig.host(0x7000_0000));
    rig.doorbell(E, 0, false, 1);
    wait_until("cause bit", || rig.cause_b(E) == s2m_cause::DATA_WRITE);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    // The correct sequence: valid Rx descriptors rung ahead of their Tx packets wait for them.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 8192, 8);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.prepare(&mut sq, rig.host(SRC + 4096), rig.host(DST + 4096), 4096);
    rig.doorbell(E, 0, false, 2);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    assert!(rig.dev.last_error().is_none());
    rig.doorbell(E, 0, true, 2);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 8192), data);
}

#[test]
fn rx_prefetch_reads_at_most_64_ahead_of_the_head() {
    // 100 Rx descriptors posted, slot 70 stale: the prefetch at the doorbell checks slots 0-63
    // only; the error comes once the head is within 64 slots of it, after 7 packets.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 128);
    rig.fill(SRC, 64 * 100, 1);
    for i in 0..100u64 {
        rig.prepare(&mut sq, rig.host(SRC + i * 64), rig.host(DST + i * 64), 64);
    }
    let mut d = [0u8; 16];
    assert!(rig.ram.read(RX_RING + 70 * 16, &mut d));
    d[3] ^= 2; // ring id 1 -> 3
    assert!(rig.ram.write(RX_RING + 70 * 16, &d));
    rig.doorbell(E, 0, false, 100);
    std::thread::sleep(Duration::from_millis(20));
    assert!(rig.dev.last_error().is_none(), "slot 70 is beyond the prefetch window");
    rig.doorbell(E, 0, true, 100);
    rig.wait_abort(E);
    let le = rig.dev.last_error().unwrap();
    assert_eq!((le.record.kind, le.record.dir, le.record.index), (ErrorKind::RingId, Some(Dir::Rx), Some(70)));
    assert_eq!(rig.head(E, 0, true), 7 | 1 << 30);
}

#[test]
fn rx_descriptors_are_used_as_read_at_the_rx_doorbell() {
    // The S2M prefetcher reads the Rx descriptors an Rx doorbell posts (within 64 of the head)
    // at that doorbell: a slot rewritten afterwards, with the same ring id, does not change where
    // the packet's bytes go (silicon DMAs to the address it prefetched).
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 0x21);
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | 4096, 0, rig.host(DST));
    rig.doorbell(E, 0, false, 1);
    rig.put_desc(&sq.rx, ri, rrid << 24 | 4096, 0, rig.host(DST + 0x10000));
    let (ti, trid) = sq.tx.take();
    rig.put_desc(&sq.tx, ti, desc::FIRST | desc::LAST | trid << 24 | 4096, desc::META_COPY, rig.host(SRC));
    rig.doorbell(E, 0, true, 1);
    rig.wait_done(&sq);
    assert!(rig.ram_bytes(DST + 0x10000, 4096) == vec![0u8; 4096], "the packet used the Rx slot as rewritten");
    assert!(rig.ram_bytes(DST, 4096) == data, "the packet did not use the Rx descriptor read at the doorbell");
    // A slot beyond the prefetch window at the doorbell (70 of 100 posted) is read when the head
    // comes within 64 of it: a rewrite before then is seen.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 128);
    let data = rig.fill(SRC, 64 * 100, 1);
    for i in 0..100u64 {
        rig.prepare(&mut sq, rig.host(SRC + i * 64), rig.host(DST + i * 64), 64);
    }
    rig.doorbell(E, 0, false, 100);
    rig.put_desc(&sq.rx, 70, 1 << 24 | 64, 0, rig.host(DST + 0x10000));
    rig.doorbell(E, 0, true, 100);
    rig.wait_done(&sq);
    assert!(rig.ram_bytes(DST + 0x10000, 64) == data[70 * 64..71 * 64], "slot 70 read at the doorbell");
    assert!(rig.ram_bytes(DST + 70 * 64, 64) == vec![0u8; 64]);
    // A descriptor that fails its check is not kept: with the Rx ring-id error masked (V3 SENG,
    // hardware.rst §3.5), a stale slot read at the doorbell is read again until it is valid.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let m = rig.rd(E, regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK) | s2m_cause::RING_ID;
    rig.wr(E, regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK, m);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 0x33);
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, ((rrid + 1) & 3) << 24 | 4096, 0, rig.host(DST));
    rig.doorbell(E, 0, false, 1);
    let (ti, trid) = sq.tx.take();
    rig.put_desc(&sq.tx, ti, desc::FIRST | desc::LAST | trid << 24 | 4096, desc::META_COPY, rig.host(SRC));
    rig.doorbell(E, 0, true, 1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.head(E, 0, false), 1 << 30, "a stale Rx slot was consumed");
    rig.put_desc(&sq.rx, ri, rrid << 24 | 4096, 0, rig.host(DST));
    rig.wait_done(&sq);
    assert!(rig.ram_bytes(DST, 4096) == data);
    // A packet of one Tx and eight Rx descriptors uses all eight as read at the doorbell.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 0x44);
    for i in 0..8u64 {
        let (ri, rrid) = sq.rx.take();
        rig.put_desc(&sq.rx, ri, rrid << 24 | 512, 0, rig.host(DST + i * 512));
    }
    rig.doorbell(E, 0, false, 8);
    for i in 0..8u32 {
        rig.put_desc(&sq.rx, i, 1 << 24 | 512, 0, rig.host(DST + 0x10000));
    }
    let (ti, trid) = sq.tx.take();
    rig.put_desc(&sq.tx, ti, desc::FIRST | desc::LAST | trid << 24 | 4096, desc::META_COPY, rig.host(SRC));
    rig.doorbell(E, 0, true, 1);
    rig.wait_done(&sq);
    assert!(rig.ram_bytes(DST, 4096) == data, "a packet of 8 Rx descriptors used rewritten slots");
}

/// The shapes of a pair that writes device memory (`len_ctrl` extra bits, `meta_ctrl`, bytes):
/// the write barrier (the driver's last data pair on V2/V3), DMB on the writer itself, a short
/// write (never held), a long barrier-free write (held).
const DEVICE_WRITERS: [(u32, u32, u32); 4] = [
    (0, desc::META_COPY_WB, 4096),
    (desc::DMB, desc::META_COPY, 4096),
    (0, desc::META_COPY, 64),
    (0, desc::META_COPY, 4096),
];

#[test]
fn device_writes_are_invisible_to_other_queues_until_the_writers_fence() {
    // Queue A writes device memory and keeps work posted (a pair whose Rx descriptor is not
    // posted yet, then its fence: the DMB marker). Until the marker runs, a read of those bytes
    // on another queue of the engine, or on another engine, returns the old bytes, even with DMB
    // (DMB orders a queue's own transfers only), and so does BAR4. Once A's marker is there,
    // every reader sees the new bytes, without a barrier.
    const HBM: u64 = 0x4000;
    const MARK_B: u64 = MARK + 0x100;
    for (w0, meta, len) in DEVICE_WRITERS {
        for (be, bq) in [(E, 1u32), (33, 0)] {
            let what = format!("writer w0 0x{w0:x} meta 0x{meta:x} len {len}, reader engine {be} queue {bq}");
            let rig = rig_with_delay(5000);
            rig.init_engine(E);
            rig.init_engine(33);
            let mut a = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
            let mut b = rig.init_queue(be, bq, TX_RING + 0x8000, RX_RING + 0x8000, 64);
            let old: Vec<u8> = (0..len).map(|i| (i * 5) as u8 | 1).collect();
            rig.dev.bar4_write(HBM, &old);
            let new = rig.fill(SRC, len as usize, 0x40);
            for m in [MARK, MARK_B] {
                assert!(rig.ram.write(m, &MARKER.to_le_bytes()));
            }
            pair(&rig, &mut a, rig.host(SRC), HBM, len, w0, meta);
            pair(&rig, &mut a, rig.host(SRC + 0x8000), rig.host(DST + 0x30000), 64, 0, desc::META_COPY);
            pair(&rig, &mut a, rig.host(MARK), rig.host(MARK + 4), 4, desc::DMB, desc::META_COPY);
            rig.doorbell(E, 0, false, 1);
            rig.doorbell(E, 0, true, 3);
            wait_until("A's device write", || rig.head(E, 0, true) == 1 | 1 << 30);
            pair(&rig, &mut b, HBM, rig.host(DST), len, desc::DMB, desc::META_COPY);
            pair(&rig, &mut b, rig.host(MARK_B), rig.host(MARK_B + 4), 4, desc::DMB, desc::META_COPY);
            rig.start(&b, 2);
            rig.wait_heads(&b);
            assert!(rig.ram_bytes(DST, len as usize) == old, "{what}: another queue read unfenced bytes");
            assert!(rig.hbm_bytes(HBM, len as usize) == old, "{what}: BAR4 read unfenced bytes");
            // A's fence: its marker (DMB) publishes the write before it lands.
            rig.doorbell(E, 0, false, 2);
            wait_until("A's marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
            assert!(rig.hbm_bytes(HBM, len as usize) == new, "{what}: BAR4 after the fence");
            pair(&rig, &mut b, HBM, rig.host(DST + 0x10000), len, 0, desc::META_COPY);
            pair(&rig, &mut b, rig.host(MARK_B), rig.host(MARK_B + 4), 4, desc::DMB, desc::META_COPY);
            rig.start(&b, 2);
            rig.wait_heads(&b);
            assert!(rig.ram_bytes(DST + 0x10000, len as usize) == new, "{what}: read after the fence");
        }
    }
}

#[test]
fn device_writes_are_published_by_a_write_barrier_before_a_later_host_write_and_when_idle() {
    const HBM: u64 = 0x4000;
    const MARK_B: u64 = MARK + 0x100;
    // The reference driver's order: the write barrier on the last data pair, a barrier-free
    // marker. The write barrier makes the data visible before any later write (hardware.rst §4.3
    // bit 26): once the marker is in host memory, another queue reads the new bytes, although
    // A still has work posted.
    let rig = rig_with_delay(5000);
    rig.init_engine(E);
    let mut a = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let mut b = rig.init_queue(E, 1, TX_RING + 0x8000, RX_RING + 0x8000, 64);
    let new = rig.fill(SRC, 8192, 0x52);
    assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
    assert!(rig.ram.write(MARK_B, &MARKER.to_le_bytes()));
    pair(&rig, &mut a, rig.host(SRC), HBM, 4096, 0, desc::META_COPY);
    pair(&rig, &mut a, rig.host(SRC + 4096), HBM + 4096, 4096, 0, desc::META_COPY_WB);
    pair(&rig, &mut a, rig.host(MARK), rig.host(MARK + 4), 4, 0, desc::META_COPY);
    pair(&rig, &mut a, rig.host(SRC), rig.host(DST + 0x30000), 64, 0, desc::META_COPY);
    rig.doorbell(E, 0, false, 3);
    rig.doorbell(E, 0, true, 4);
    wait_until("A's marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
    pair(&rig, &mut b, HBM, rig.host(DST), 8192, 0, desc::META_COPY);
    pair(&rig, &mut b, rig.host(MARK_B), rig.host(MARK_B + 4), 4, desc::DMB, desc::META_COPY);
    rig.start(&b, 2);
    rig.wait_heads(&b);
    assert!(rig.ram_bytes(DST, 8192) == new, "write-barrier data not visible after the marker");
    // A queue that runs out of posted work with nothing held publishes its device writes (it
    // has no transfer in flight): a write barrier or DMB writer, or a short write, is visible as
    // soon as the queue's head shows it done; a held (long barrier-free) write once it lands.
    for (w0, meta, len) in DEVICE_WRITERS {
        let rig = rig_with_delay(if len == 4096 && w0 | meta == desc::META_COPY { 50 } else { 5000 });
        rig.init_engine(E);
        let mut a = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        let new = rig.fill(SRC, len as usize, 0x61);
        pair(&rig, &mut a, rig.host(SRC), HBM, len, w0, meta);
        rig.start(&a, 1);
        rig.wait_done(&a);
        assert!(rig.hbm_bytes(HBM, len as usize) == new, "w0 0x{w0:x} meta 0x{meta:x} len {len}: idle writer");
    }
}

#[test]
fn a_device_ring_filled_by_another_queue_is_fetched_only_after_its_fence() {
    // The driver's device-ring fill (Documentation/udma-sim.rst): queue A (the H2T queue) copies
    // staged descriptors from host memory into rings in device memory; queue C fetches them from
    // there. Rung before A's fence, C's prefetch reads the old slots (a stale ring id: S2M 11);
    // rung after it, C runs the copy.
    const C_TX: u64 = 0x8000;
    const C_RX: u64 = 0x9000;
    const STAGE_TX: u64 = RAM_BASE + 0x60000;
    const STAGE_RX: u64 = RAM_BASE + 0x70000;
    const C_ENG: u32 = 33;
    for fenced in [false, true] {
        let rig = rig_with_delay(5000);
        rig.init_engine(E);
        rig.init_engine(C_ENG);
        let mut a = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        // C's rings in device memory (queue init with device addresses).
        let mut c = rig.init_queue(C_ENG, 2, TX_RING + 0x8000, RX_RING + 0x8000, 64);
        for (tx, at) in [(true, C_TX), (false, C_RX)] {
            let bank = Rig::bank(tx, 2);
            rig.wr(C_ENG, bank + if tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL }, 0x100);
            rig.wr(C_ENG, bank + regs::Q_BASE_LO, at as u32);
            rig.wr(C_ENG, bank + regs::Q_BASE_HI, 0);
        }
        // C's pair, staged in host memory, copied by A into C's rings (16 bytes each).
        c.tx = SwRing::new(STAGE_TX, 64);
        c.rx = SwRing::new(STAGE_RX, 64);
        let data = rig.fill(SRC, 64, 0x77);
        rig.prepare(&mut c, rig.host(SRC), rig.host(DST), 64);
        assert!(rig.ram.write(MARK, &MARKER.to_le_bytes()));
        pair(&rig, &mut a, rig.host(STAGE_TX), C_TX, 16, 0, desc::META_COPY);
        pair(&rig, &mut a, rig.host(STAGE_RX), C_RX, 16, 0, desc::META_COPY_WB);
        pair(&rig, &mut a, rig.host(MARK), rig.host(MARK + 4), 4, desc::DMB, desc::META_COPY);
        // Unfenced: A keeps its marker until its last Rx descriptor is posted.
        rig.doorbell(E, 0, false, if fenced { 3 } else { 2 });
        rig.doorbell(E, 0, true, 3);
        if fenced {
            wait_until("A's marker", || rig.ram_bytes(MARK + 4, 4) == MARKER.to_le_bytes());
        } else {
            wait_until("A's ring copy", || rig.head(E, 0, true) == 2 | 1 << 30);
        }
        rig.start(&c, 1);
        let done = 1 | 1 << 30;
        wait_until("C fetched", || rig.dev.last_error().is_some() || rig.head(C_ENG, 2, true) == done);
        if fenced {
            rig.wait_done(&c);
            assert!(rig.ram_bytes(DST, 64) == data);
        } else {
            let le = rig.dev.last_error();
            assert!(le.is_some(), "C fetched descriptors A had not fenced");
            let le = le.unwrap();
            assert_eq!((le.engine, le.record.kind, le.record.dir), (C_ENG, ErrorKind::RingId, Some(Dir::Rx)));
            assert_eq!(rig.cause_b(C_ENG), s2m_cause::RING_ID);
        }
    }
}

#[test]
fn unwritten_cfg_len_has_no_64k_encoding_and_no_packet_fits() {
    let rig = Rig::new(Model::Trn1);
    assert_eq!(rig.rd(E, regs::M2S_CFG_LEN), 0);
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0xF000_0000);
    rig.wr(E, regs::M2S_DESC_PREF_CFG_2, 0x0001_0041);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.cause_a(E), m2s_cause::PKT_TOO_LONG);
    // cfg_len written without bit 24: a length-0 descriptor is 0 bytes, not 64 KiB.
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    rig.wr(E, regs::M2S_CFG_LEN, 0x000F_FFFF);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.fill(SRC, 65536, 4);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 65536);
    rig.start(&sq, 1);
    wait_until("tx head", || rig.head(E, 0, true) == 1 | 1 << 30);
    assert_eq!(rig.head(E, 0, false), 1 << 30, "no Rx byte consumed");
    assert_eq!(rig.ram_bytes(DST, 65536), vec![0u8; 65536]);
}

#[test]
fn unwritten_max_descriptors_rejects_every_packet() {
    let rig = Rig::new(Model::Trn1);
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0xF000_0000);
    rig.wr(E, regs::M2S_CFG_LEN, 0x010F_FFFF);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.cause_a(E), m2s_cause::TOO_MANY_DESCS);
}

#[test]
fn a_paused_queue_stops_running_posted_work() {
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 5);
    // Hold the engine, post, pause the queue, release the engine: nothing may run.
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_DISABLE);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.prepare(&mut sq, rig.host(MARK), rig.host(MARK + 4), 4);
    rig.start(&sq, 2);
    rig.wr(E, Rig::bank(true, 0) + regs::Q_CFG, 0x0300_0000);
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(rig.head(E, 0, true), 1 << 30, "paused queue ran");
    // A disabled M2S stream (stream_cfg bit 0) also stops it.
    rig.wr(E, regs::M2S_STREAM_CFG, 0x103);
    rig.wr(E, Rig::bank(true, 0) + regs::Q_CFG, 0x0303_0000);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(rig.head(E, 0, true), 1 << 30, "disabled stream ran");
    rig.wr(E, regs::M2S_STREAM_CFG, 0x102);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 4096), data);
}

#[test]
fn ring_registers_are_not_rewritten_with_work_pending() {
    let rig = Rig::new(Model::Trn1);
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_DISABLE);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 64);
    rig.start(&sq, 1);
    let base = rig.rd(E, Rig::bank(true, 0) + regs::Q_BASE_LO);
    rig.wr(E, Rig::bank(true, 0) + regs::Q_BASE_LO, base + 0x1000);
    rig.wr(E, Rig::bank(true, 0) + regs::Q_LEN, 128);
    assert_eq!(rig.rd(E, Rig::bank(true, 0) + regs::Q_BASE_LO), base);
    assert_eq!(rig.rd(E, Rig::bank(true, 0) + regs::Q_LEN), 64);
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    rig.wait_done(&sq);
}

#[test]
fn undefined_descriptor_bits_are_rejected() {
    for (bit, tx) in [(1u32 << 29, true), (1 << 20, true), (desc::FIRST, false), (desc::DMB, false)] {
        let rig = Rig::new(Model::Trn1);
        rig.init_engine(E);
        let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        let (ri, rrid) = sq.rx.take();
        let (ti, trid) = sq.tx.take();
        let rx_extra = if tx { 0 } else { bit };
        let tx_extra = if tx { bit } else { 0 };
        rig.put_desc(&sq.rx, ri, rx_extra | rrid << 24 | 64, 0, rig.host(DST));
        rig.put_desc(&sq.tx, ti, tx_extra | desc::FIRST | desc::LAST | trid << 24 | 64, desc::META_COPY, rig.host(SRC));
        rig.start(&sq, 1);
        rig.wait_abort(E);
        let le = rig.dev.last_error().unwrap();
        assert_eq!(le.record.kind, ErrorKind::Unsupported, "bit 0x{bit:x} tx {tx}");
        assert_eq!(rig.cause_a(E), m2s_cause::UNSUPPORTED);
    }
}

#[test]
fn registers_are_32_bit_only() {
    let rig = Rig::new(Model::Trn1);
    let off = rig.base(E) + u64::from(regs::SPARE_REG);
    rig.wr(E, regs::SPARE_REG, 0x1111_1111);
    rig.dev.bar0_write(off, &0x2222_2222_2222_2222u64.to_le_bytes());
    rig.dev.bar0_write(off + 1, &[0x33]);
    assert_eq!(rig.rd(E, regs::SPARE_REG), 0x1111_1111);
    let mut b = [0u8; 8];
    rig.dev.bar0_read(off, &mut b);
    assert_eq!(b, [0xFF; 8]);
}

#[test]
fn device_addresses_follow_the_hbm_map() {
    // Trn2, 16 MiB BAR4: four HBM windows of 4 MiB (hardware.rst §1.2 QEMU flavour, 1.3 bases).
    let rig = Rig::new(Model::Trn2);
    let e = 128;
    rig.init_engine(e);
    let mut sq = rig.init_queue(e, 2, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 4096, 6);
    // HBM1 at its real base lands at BAR4 + 4 MiB; HBM3 at BAR4 + 12 MiB.
    rig.prepare(&mut sq, rig.host(SRC), 0x40_0000_0100, 4096);
    rig.prepare(&mut sq, rig.host(SRC), 0x8040_0000_0000, 4096);
    rig.prepare_dmb(&mut sq, 0x40_0000_0100, rig.host(DST), 4096);
    rig.start(&sq, 3);
    rig.wait_done(&sq);
    assert_eq!(rig.hbm_bytes((4 << 20) + 0x100, 4096), data);
    assert_eq!(rig.hbm_bytes(12 << 20, 4096), data);
    assert_eq!(rig.ram_bytes(DST, 4096), data);
    // A BAR4-linear address past HBM0's window is no device memory.
    rig.prepare(&mut sq, rig.host(SRC), 5 << 20, 4096);
    rig.start(&sq, 1);
    rig.wait_abort(e);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::DataWrite);
    assert_eq!(rig.cause_b(e), s2m_cause::DATA_WRITE);
}

#[test]
fn shared_device_writes_are_visible_to_every_reader_once_landed() {
    // Lenient option (`--shared-device-writes`): a device-memory write is visible to other queues
    // and BAR4 as soon as it lands, the writer's own later reads included; a held write still
    // lands later. (The reads carry the write barrier so that they are not held themselves.)
    const HBM: u64 = 0x4000;
    for (w0, meta, len) in DEVICE_WRITERS {
        let rig = Rig::with_options(
            Model::Trn1,
            None,
            Options {
                unordered_delay: Some(Duration::from_millis(5000)),
                private_device_writes: false,
                ..Options::default()
            },
        );
        rig.init_engine(E);
        let mut a = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
        let mut b = rig.init_queue(E, 1, TX_RING + 0x8000, RX_RING + 0x8000, 64);
        let old: Vec<u8> = (0..len).map(|i| (i * 5) as u8 | 1).collect();
        rig.dev.bar4_write(HBM, &old);
        let new = rig.fill(SRC, len as usize, 0x40);
        pair(&rig, &mut a, rig.host(SRC), HBM, len, w0, meta);
        pair(&rig, &mut a, HBM, rig.host(DST + 0x20000), len, 0, desc::META_COPY_WB);
        pair(&rig, &mut a, rig.host(SRC + 0x8000), rig.host(DST + 0x30000), 64, 0, desc::META_COPY);
        rig.doorbell(E, 0, false, 2);
        rig.doorbell(E, 0, true, 3);
        wait_until("A's device write", || rig.head(E, 0, true) == 2 | 1 << 30);
        let held = w0 | meta == desc::META_COPY && len > POSTED_WRITE_MAX as u32;
        let what = format!("writer w0 0x{w0:x} meta 0x{meta:x} len {len}");
        let want = if held { &old } else { &new };
        assert!(rig.hbm_bytes(HBM, len as usize) == *want, "{what}: BAR4");
        assert!(rig.ram_bytes(DST + 0x20000, len as usize) == *want, "{what}: the writer's own read");
        pair(&rig, &mut b, HBM, rig.host(DST), len, 0, desc::META_COPY_WB);
        rig.start(&b, 1);
        rig.wait_heads(&b);
        assert!(rig.ram_bytes(DST, len as usize) == *want, "{what}: another queue");
    }
}
