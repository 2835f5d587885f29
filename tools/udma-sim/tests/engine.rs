// SPDX-License-Identifier: GPL-2.0
//! Engine semantics against in-memory guest RAM (no QEMU).

mod common;

use common::*;
use std::time::{Duration, Instant};
use udma_sim::layout::Model;
use udma_sim::mem::GuestMemory;
use udma_sim::regs::{self, desc};

const TX_RING: u64 = RAM_BASE;
const RX_RING: u64 = RAM_BASE + 0x40000;
const SRC: u64 = RAM_BASE + 0x10_0000;
const DST: u64 = RAM_BASE + 0x80_0000;
/// V2 H2T engine of NC0 (hardware.rst §2.3).
const E: u32 = 32;

fn setup(model: Model, size: u32) -> (Rig, SwQueue) {
    let rig = Rig::new(model);
    rig.init_engine(E);
    let sq = rig.init_queue(E, 0, TX_RING, RX_RING, size);
    (rig, sq)
}

#[test]
fn reset_values_and_readback() {
    let rig = Rig::new(Model::Trn1);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.rd(E, regs::S2M_STATE), regs::STATE_NORMAL);
    assert_eq!(rig.rd(E, Rig::bank(true, 3) + regs::Q_CFG), regs::Q_CFG_RESET);
    assert_eq!(rig.rd(E, Rig::bank(true, 3) + regs::M2S_Q_RLIMIT_MASK), regs::RLIMIT_MASK_RESET);
    assert_eq!(rig.head(E, 3, true), 1 << 30);
    assert_eq!(rig.tail(E, 3, false), 1 << 30);
    // Arbitrary registers and the spare register read back what was written.
    rig.wr(E, 0x3C400, 0xFFFF_FFFF);
    rig.wr(E, regs::SPARE_REG, 0x1234_5678);
    rig.wr(E, 0x20128, 0x4080_4080);
    assert_eq!(rig.rd(E, 0x3C400), 0xFFFF_FFFF);
    assert_eq!(rig.rd(E, regs::SPARE_REG), 0x1234_5678);
    assert_eq!(rig.rd(E, 0x20128), 0x4080_4080);
    // Registers are 32-bit only: a sub-word or unaligned access is dropped (reads all ones).
    rig.dev.bar0_write(rig.base(E) + u64::from(regs::SPARE_REG) + 1, &[0xAB]);
    rig.dev.bar0_write(rig.base(E) + u64::from(regs::SPARE_REG), &[0xAB, 0xCD]);
    rig.dev.bar0_write(rig.base(E) + u64::from(regs::SPARE_REG) + 2, &[0; 4]);
    assert_eq!(rig.rd(E, regs::SPARE_REG), 0x1234_5678);
    let mut half = [0u8; 2];
    rig.dev.bar0_read(rig.base(E) + u64::from(regs::SPARE_REG), &mut half);
    assert_eq!(half, [0xFF; 2]);
    // Unknown BAR0 offsets read 0 and ignore writes.
    rig.dev.bar0_write(0x10, &7u32.to_le_bytes());
    let mut b = [0xFFu8; 4];
    rig.dev.bar0_read(0x10, &mut b);
    assert_eq!(b, [0; 4]);
    // change_state: disable, normal, abort.
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_DISABLE);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_IDLE);
    rig.wr(E, regs::M2S_CHANGE_STATE, regs::CHANGE_STATE_NORMAL);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    // IOFIC: cause_set, W0C, main-D summary, mask_clear.
    rig.wr(E, regs::IOFIC_SEC_B + regs::IOFIC_CAUSE_SET, 1 << 5);
    assert_eq!(rig.cause_b(E), 1 << 5);
    assert_eq!(rig.rd(E, regs::IOFIC_MAIN_D) & regs::MAIN_D_SUM_B, regs::MAIN_D_SUM_B);
    rig.wr(E, regs::IOFIC_SEC_B + regs::IOFIC_CAUSE, !(1 << 5));
    assert_eq!(rig.cause_b(E), 0);
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_MASK, 0xFFFF_FFFF);
    rig.wr(E, regs::IOFIC_SEC_A + regs::IOFIC_MASK_CLEAR, 0xF000_0000);
    assert_eq!(rig.rd(E, regs::IOFIC_SEC_A + regs::IOFIC_MASK), 0xF000_0000);
}

#[test]
fn single_pair_host_to_host() {
    let (rig, mut sq) = setup(Model::Trn1, 64);
    let data = rig.fill(SRC, 4096, 1);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 4096);
    rig.start(&sq, 1);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 4096), data);
    assert_eq!(rig.tail(E, 0, true), 1 | 1 << 30);
    assert_eq!(rig.rd(E, Rig::bank(false, 0) + regs::Q_COMP_HEAD), 1 | 1 << 30);
    let c = rig.dev.counters();
    assert_eq!((c.descriptors, c.packets, c.bytes, c.errors), (2, 1, 4096, 0));
}

#[test]
fn host_to_hbm_and_back_with_completion_marker() {
    let (rig, mut sq) = setup(Model::Inf2, 64);
    let data = rig.fill(SRC, 8192, 7);
    // host -> HBM at device address 0x1000, HBM -> host (with DMB: it reads what the first pair
    // wrote), then the 4-byte marker pair (hardware.rst §5.1).
    assert!(rig.ram.write(DST + 0x10000, &0xABCD_EF01u32.to_le_bytes()));
    rig.prepare(&mut sq, rig.host(SRC), 0x1000, 8192);
    rig.prepare_dmb(&mut sq, 0x1000, rig.host(DST), 8192);
    rig.prepare(&mut sq, rig.host(DST + 0x10000), rig.host(DST + 0x10004), 4);
    rig.start(&sq, 3);
    wait_until("marker", || rig.ram_bytes(DST + 0x10004, 4) == 0xABCD_EF01u32.to_le_bytes());
    rig.wait_done(&sq);
    assert_eq!(rig.hbm_bytes(0x1000, 8192), data);
    assert_eq!(rig.ram_bytes(DST, 8192), data);
}

#[test]
fn len_zero_is_64k() {
    let (rig, mut sq) = setup(Model::Trn1, 64);
    let data = rig.fill(SRC, 65536, 3);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 65536);
    rig.start(&sq, 1);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 65536), data);
    assert_eq!(rig.dev.counters().bytes, 65536);
}

#[test]
fn ring_wrap_200_pairs_32_slots() {
    let (rig, mut sq) = setup(Model::Trn1, 32);
    let data = rig.fill(SRC, 200 * 64, 9);
    let mut seen_rids = std::collections::BTreeSet::new();
    let mut done = 0u32;
    while done < 200 {
        let n = 10.min(200 - done);
        for i in done..done + n {
            let o = u64::from(i) * 64;
            rig.prepare(&mut sq, rig.host(SRC + o), rig.host(DST + o), 64);
        }
        rig.start(&sq, n);
        rig.wait_done(&sq);
        seen_rids.insert(rig.head(E, 0, true) >> 30);
        done += n;
    }
    assert_eq!(rig.ram_bytes(DST, 200 * 64), data);
    // 200 slots over a 32-slot ring: 6 full passes, ring id 1,2,3,0,1,2,(3) at the head.
    assert_eq!(seen_rids.len(), 4, "ring id must take all four values");
    assert_eq!(rig.head(E, 0, true), (200 % 32) | ((1 + 200 / 32) & 3) << 30);
    assert_eq!(rig.tail(E, 0, false), (200 % 32) | ((1 + 200 / 32) & 3) << 30);
}

/// Writes a raw Tx packet of `lens` (FIRST on the first, LAST on the last).
fn put_tx_packet(rig: &Rig, sq: &mut SwQueue, src: u64, lens: &[u32]) {
    let mut off = 0u64;
    for (i, &l) in lens.iter().enumerate() {
        let (ti, trid) = sq.tx.take();
        let mut w0 = trid << 24 | (l & 0xFFFF);
        if i == 0 {
            w0 |= desc::FIRST;
        }
        if i + 1 == lens.len() {
            w0 |= desc::LAST;
        }
        rig.put_desc(&sq.tx, ti, w0, desc::META_COPY, rig.host(src + off));
        off += u64::from(l);
    }
}

fn put_rx(rig: &Rig, sq: &mut SwQueue, dst: u64, len: u32) {
    let (ri, rrid) = sq.rx.take();
    rig.put_desc(&sq.rx, ri, rrid << 24 | (len & 0xFFFF), 0, dst);
}

#[test]
fn multi_descriptor_packets() {
    let (rig, mut sq) = setup(Model::Trn1, 64);
    let data = rig.fill(SRC, 3000, 5);
    // 3 Tx descriptors -> 1 Rx descriptor.
    put_tx_packet(&rig, &mut sq, SRC, &[1000, 1500, 500]);
    put_rx(&rig, &mut sq, rig.host(DST), 3000);
    // 3 Tx descriptors -> 2 Rx descriptors (split inside the second Tx buffer).
    put_tx_packet(&rig, &mut sq, SRC, &[1000, 1500, 500]);
    put_rx(&rig, &mut sq, rig.host(DST + 0x10000), 1700);
    put_rx(&rig, &mut sq, 0x2000, 1300); // second half to HBM
    rig.doorbell(E, 0, false, 3);
    rig.doorbell(E, 0, true, 6);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 3000), data);
    assert_eq!(rig.ram_bytes(DST + 0x10000, 1700), data[..1700]);
    assert_eq!(rig.hbm_bytes(0x2000, 1300), data[1700..]);
    let c = rig.dev.counters();
    assert_eq!((c.descriptors, c.packets, c.bytes), (9, 2, 6000));
}

#[test]
fn packet_waits_for_rx_doorbell() {
    let (rig, mut sq) = setup(Model::Trn1, 64);
    let data = rig.fill(SRC, 256, 2);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 256);
    rig.doorbell(E, 0, true, 1); // Tx first: nothing can move yet
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(rig.head(E, 0, true), 1 << 30);
    rig.doorbell(E, 0, false, 1);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 256), data);
}

#[test]
fn v3_h2t_engine_with_bit46_route() {
    let rig = Rig::new(Model::Trn2);
    let e = 130;
    rig.init_engine(e);
    let mut sq = rig.init_queue(e, 1, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 1024, 4);
    assert_eq!(rig.host(SRC) >> 44, 4);
    rig.prepare(&mut sq, rig.host(SRC), 0x3000, 1024);
    rig.prepare_dmb(&mut sq, 0x3000, rig.host(DST), 1024);
    rig.start(&sq, 2);
    rig.wait_done(&sq);
    assert_eq!(rig.ram_bytes(DST, 1024), data);
}

#[test]
fn two_engines_and_queues_concurrently() {
    let rig = std::sync::Arc::new(Rig::new(Model::Trn1));
    let jobs: Vec<(u32, u32)> = vec![(32, 0), (32, 1), (33, 0), (5, 3)];
    for &(e, _) in &jobs {
        rig.init_engine(e);
    }
    let handles: Vec<_> = jobs
        .iter()
        .enumerate()
        .map(|(k, &(e, q))| {
            let rig = rig.clone();
            std::thread::spawn(move || {
                let k64 = k as u64;
                let mut sq = rig.init_queue(e, q, TX_RING + k64 * 0x4000, RX_RING + k64 * 0x4000, 128);
                let src = SRC + k64 * 0x10_0000;
                let dst = DST + k64 * 0x10_0000;
                let data = rig.fill(src, 100 * 1024, k as u8);
                for round in 0..10u64 {
                    for i in 0..10u64 {
                        let o = (round * 10 + i) * 1024;
                        rig.prepare(&mut sq, rig.host(src + o), rig.host(dst + o), 1024);
                    }
                    rig.start(&sq, 10);
                    rig.wait_done(&sq);
                }
                assert_eq!(rig.ram_bytes(dst, 100 * 1024), data);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(rig.dev.counters().packets, 400);
    assert_eq!(rig.dev.engine_counters().len(), 3);
}

#[test]
fn doorbell_returns_immediately() {
    let (rig, mut sq) = setup(Model::Trn1, 64);
    rig.fill(SRC, 65536, 1);
    rig.dev.inject(udma_sim::fault::Fault::Slow { factor: 2000 }).unwrap();
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 65536);
    let t0 = Instant::now();
    rig.start(&sq, 1);
    let dt = t0.elapsed();
    assert!(dt < Duration::from_millis(20), "doorbell took {dt:?}");
    rig.dev.inject(udma_sim::fault::Fault::Slow { factor: 0 }).unwrap();
    rig.wait_done(&sq);
}

#[test]
fn queue_reset_drops_pending_work() {
    let (rig, mut sq) = setup(Model::Trn1, 64);
    rig.fill(SRC, 512, 1);
    rig.dev.inject(udma_sim::fault::Fault::Stall { engine: E, queue: 0, ms: 100 }).unwrap();
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 512);
    rig.start(&sq, 1);
    let sq2 = rig.init_queue(E, 0, TX_RING, RX_RING, 64); // q_sw_ctrl reset on both rings
    assert_eq!(rig.tail(E, 0, true), 1 << 30);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(rig.ram_bytes(DST, 512), vec![0u8; 512]);
    assert_eq!(rig.head(E, 0, true), 1 << 30);
    assert_eq!(rig.dev.counters().packets, 0);
    // The queue is usable again from slot 0 / ring id 1.
    let mut sq2 = sq2;
    let data = rig.fill(SRC, 512, 8);
    rig.prepare(&mut sq2, rig.host(SRC), rig.host(DST), 512);
    rig.start(&sq2, 1);
    rig.wait_done(&sq2);
    assert_eq!(rig.ram_bytes(DST, 512), data);
}

/// Panics seen in the model's own threads (`udma-*`), whose join results the device drops.
static MODEL_PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts every panic of a model thread in [`MODEL_PANICS`] (then prints it as usual).
fn watch_model_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name().is_some_and(|n| n.starts_with("udma-")) {
                MODEL_PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            prev(info);
        }));
    });
}

#[test]
fn malicious_register_writes_do_not_panic() {
    watch_model_panics();
    let rig = Rig::new(Model::Trn2);
    let mut x: u64 = 0x1234_5678_9ABC_DEF1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    // Hostile descriptors through real queues, so the engine workers parse and run them: on each
    // of 64 engines, two queues of 32 slots get a few valid pairs (host->host and host->HBM of
    // random length) followed by random descriptors (random flags, ring ids, lengths and
    // addresses), random doorbell counts and random writes to that engine's registers.
    const RING: u32 = 32;
    for round in 0..64u32 {
        let eng = round * 2 + (next() % 2) as u32;
        rig.init_engine(eng);
        for q in 0..2u32 {
            let slot = u64::from(round * 2 + q) * 0x1000;
            let tx = RAM_BASE + slot;
            let rx = RAM_BASE + 0x8_0000 + slot;
            let mut sq = rig.init_queue(eng, q, tx, rx, RING);
            let valid = 1 + (next() % 4) as u32;
            for _ in 0..valid {
                let len = 1 + (next() % 8192) as u32;
                let src = rig.host(RAM_BASE + 0x10_0000 + next() % 0x40_0000);
                let dst = if next() & 1 == 0 {
                    rig.host(RAM_BASE + 0x80_0000 + next() % 0x40_0000)
                } else {
                    next() % 0x80_0000
                };
                rig.prepare(&mut sq, src, dst, len);
            }
            for _ in valid..RING {
                let (ti, _) = sq.tx.take();
                let (ri, _) = sq.rx.take();
                let addr = match next() % 3 {
                    0 => rig.host(RAM_BASE + next() % RAM_SIZE as u64),
                    1 => next() % (32 << 20),
                    _ => next(),
                };
                rig.put_desc(&sq.tx, ti, next() as u32, next() as u32, addr);
                rig.put_desc(&sq.rx, ri, next() as u32, next() as u32, next());
            }
            rig.start(&sq, valid);
            let extra = (next() % 40) as u32;
            rig.doorbell(eng, q, next() & 1 == 0, extra);
        }
        for _ in 0..200 {
            let r = next();
            let unit = ((r >> 8) % u64::from(regs::UNIT_FOOTPRINT)) as u32 & !3;
            let unit = if r & 1 == 0 { Rig::bank(r & 2 == 0, (r >> 2) as u32 % 2) + (unit & 0xFC) } else { unit };
            rig.wr(eng, unit, (next() >> 3) as u32);
        }
    }
    // Random writes anywhere in BAR0 (every engine and unit).
    for _ in 0..20000 {
        let r = next();
        let eng = (r % 132) as u32;
        let unit = ((r >> 8) % u64::from(regs::UNIT_FOOTPRINT)) as u32 & !3;
        let unit = if r & 1 == 0 { Rig::bank(r & 2 == 0, 0) + (unit & 0xFC) } else { unit };
        rig.wr(eng, unit, (next() >> 3) as u32);
    }
    for _ in 0..2000 {
        let off = next() % (1 << 32);
        let mut b = [0u8; 3];
        rig.dev.bar0_read(off, &mut b);
        rig.dev.bar0_write(off, &b);
        rig.dev.bar4_write(next(), &b);
        rig.dev.bar2_write(next() % 0x1000, &b);
    }
    // Garbage control commands.
    for c in [
        r#"{}"#,
        r#"{"cmd":"fail_nth"}"#,
        r#"{"cmd":"stall","engine":999,"queue":0,"ms":1}"#,
        r#"{"cmd":"abort","engine":-1}"#,
    ] {
        let v: serde_json::Value = serde_json::from_str(c).unwrap();
        assert_eq!(rig.dev.control(&v)["ok"], false, "{c}");
    }
    // The workers really ran packets and raised errors, and none of them panicked.
    std::thread::sleep(Duration::from_millis(300));
    let c = rig.dev.counters();
    assert!(c.packets > 0 && c.descriptors > c.packets && c.errors > 0, "the hostile work did not run: {c:?}");
    assert_eq!(MODEL_PANICS.load(std::sync::atomic::Ordering::SeqCst), 0, "a model thread panicked");
    eprintln!("hostile work: {c:?}");
    // Shutting down joins every worker (a panic while stopping counts too).
    drop(rig);
    assert_eq!(MODEL_PANICS.load(std::sync::atomic::Ordering::SeqCst), 0, "a model thread panicked");
}

#[test]
fn dma_unmap_is_seen_by_the_next_packet() {
    use std::sync::Arc;
    use udma_sim::engine::ErrorKind;
    use udma_sim::mem::{DmaTable, FlatMemory, GuestMemory};
    use udma_sim::{Config, Device, Options};
    // Guest RAM behind the vfio-user DMA map table, as in the server: rings and source in one
    // entry, the destination in another.
    let ram = Arc::new(FlatMemory::memfd(RAM_BASE, RAM_SIZE, "ram").unwrap());
    // SAFETY: dup of a valid memfd; the File owns the duplicate.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(ram.raw_fd().unwrap())) };
    let dma = Arc::new(DmaTable::new());
    dma.map(RAM_BASE, DST - RAM_BASE, &file, 0, true).unwrap();
    dma.map(DST, 0x10_0000, &file, DST - RAM_BASE, true).unwrap();
    let dev = Arc::new(
        Device::new(
            Config {
                model: Model::Trn1,
                hbm_size: 1 << 20,
                trace: None,
                // Held writes land after 2 ms (not 100), so that the rounds do not wait long.
                options: Options { unordered_delay: Some(Duration::from_millis(2)), ..Options::default() },
            },
            dma.clone() as Arc<dyn GuestMemory>,
        )
        .unwrap(),
    );
    let rig = Rig { dev, ram, gen: Model::Trn1.gen() };
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    let data = rig.fill(SRC, 8192, 3);
    // Map churn of an unrelated range while copies run: every update waits for the worker's
    // grace period, and nothing deadlocks.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                dma.map(0x9000_0000, 0x1000, &file, 0, true).unwrap();
                dma.unmap(0x9000_0000, 0x1000);
            }
        });
        for round in 0..20u64 {
            for i in 0..8u64 {
                rig.prepare(&mut sq, rig.host(SRC + i * 1024), rig.host(DST + (round % 4) * 8192 + i * 1024), 1024);
            }
            rig.start(&sq, 8);
            rig.wait_done(&sq);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(rig.ram_bytes(DST, 8192), data);
    // Once DMA_UNMAP has returned, the next packet no longer reaches the region: a data-write
    // error, nothing written.
    assert_eq!(dma.unmap(DST, 0x10_0000), 1);
    rig.fill(SRC, 8192, 4);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 8192);
    rig.start(&sq, 1);
    rig.wait_abort(E);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::DataWrite);
    assert_eq!(rig.ram_bytes(DST, 8192), data);
}
