// SPDX-License-Identifier: GPL-2.0
//! Two benchmarks (run: `cargo bench`; `cargo bench -- copy` or `-- cpu` runs one):
//!
//! * `copy`: copies 1 GiB in 64 KiB descriptor pairs through the model (in-memory guest RAM,
//!   4096-slot rings, host -> host on V2 engine 32 queue 0) and compares with a plain memcpy of
//!   the same chunks.
//! * `cpu`: the engine workers' host CPU time per descriptor pair, with one worker and with two
//!   workers running at once (engines 32 and 33, one queue each, each driven by its own "guest"
//!   thread), with guest RAM behind the vfio-user DMA map table as in the server. Whatever the
//!   workers share per packet (locks, reference counts) shows up as a higher per-pair figure in
//!   the two-worker row. A third row has one worker copy host -> device memory (HBM), the
//!   driver's copies to device memory: what a queue's pending device writes cost.

use std::sync::Arc;
use std::time::{Duration, Instant};
use udma_sim::layout::Model;
use udma_sim::mem::{DmaTable, FlatMemory, GuestMemory};
use udma_sim::regs::{self, desc};
use udma_sim::{Config, Device};

const RAM_BASE: u64 = 0x10_0000;
const RING: u32 = 4096;
const CHUNK: usize = 64 << 10;
const AREA: usize = 64 << 20;
const TOTAL: usize = 1 << 30;
const TX_RING: u64 = RAM_BASE;
const RX_RING: u64 = RAM_BASE + 0x10_0000;
const SRC: u64 = RAM_BASE + 0x20_0000;
const DST: u64 = SRC + AREA as u64;
const E: u32 = 32;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |name: &str| args.is_empty() || args.iter().any(|a| a == name);
    if want("copy") {
        copy_bench();
    }
    if want("cpu") {
        cpu_bench();
    }
}

fn copy_bench() {
    let ram = Arc::new(FlatMemory::anonymous(RAM_BASE, 0x20_0000 + 2 * AREA).expect("ram"));
    let dev = Device::new(
        Config { model: Model::Trn1, hbm_size: 1 << 20, trace: None, options: Default::default() },
        ram.clone() as Arc<dyn GuestMemory>,
    )
    .expect("device");
    let gen = dev.gen();
    let base = gen.engine_base(E).expect("engine");
    let route = gen.host_route();
    let wr = |unit: u32, v: u32| dev.write32(base + u64::from(unit), v);
    let rd = |unit: u32| dev.read32(base + u64::from(unit));
    // Engine init steps the model depends on (hardware.rst §3.6 steps 6 and 19).
    wr(regs::M2S_CFG_LEN, 0x010F_FFFF);
    wr(regs::M2S_DESC_PREF_CFG_2, 0x0001_0041);
    for (tx, gpa) in [(true, TX_RING), (false, RX_RING)] {
        let b = if tx { regs::M2S_Q_BASE } else { regs::S2M_Q_BASE };
        wr(b + regs::Q_CFG, 0x0300_0000);
        wr(b + if tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL }, regs::Q_SW_CTRL_RESET);
        wr(b + regs::Q_BASE_LO, (gpa | route) as u32);
        wr(b + regs::Q_BASE_HI, ((gpa | route) >> 32) as u32);
        wr(b + regs::Q_LEN, RING);
        wr(b + regs::Q_CFG, 0x0303_0000);
    }
    // Warm both areas (fault the pages in) so neither side pays first-touch costs.
    let pattern: Vec<u8> = (0..AREA).map(|i| (i * 7) as u8).collect();
    assert!(ram.write(SRC, &pattern));
    assert!(ram.write(DST, &pattern));
    let chunks_per_area = (AREA / CHUNK) as u64;
    let n_pairs = (TOTAL / CHUNK) as u64;

    // Pre-build all ring slots once per pass position; descriptors only differ by ring id.
    let put = |ring: u64, idx: u32, w0: u32, w1: u32, addr: u64| {
        let mut d = [0u8; 16];
        d[0..4].copy_from_slice(&w0.to_le_bytes());
        d[4..8].copy_from_slice(&w1.to_le_bytes());
        d[8..16].copy_from_slice(&addr.to_le_bytes());
        ram.write(ring + u64::from(idx) * 16, &d);
    };
    let batch: u64 = 1024;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut last_head = rd(regs::M2S_Q_BASE + regs::Q_HEAD) & regs::PTR_INDEX_MASK;
    while done < n_pairs {
        while posted < n_pairs && posted - done + batch < u64::from(RING) - 16 {
            let n = batch.min(n_pairs - posted);
            for k in posted..posted + n {
                let idx = (k % u64::from(RING)) as u32;
                let rid = ((1 + k / u64::from(RING)) & 3) as u32;
                let off = (k % chunks_per_area) * CHUNK as u64;
                put(RX_RING, idx, rid << 24, 0, (DST + off) | route);
                // The driver's ordering: a write barrier on the last pair of each submission.
                let meta = if k + 1 == posted + n { desc::META_COPY_WB } else { desc::META_COPY };
                put(TX_RING, idx, desc::FIRST | desc::LAST | rid << 24, meta, (SRC + off) | route);
            }
            wr(regs::S2M_Q_BASE + regs::Q_DOORBELL, n as u32);
            wr(regs::M2S_Q_BASE + regs::Q_DOORBELL, n as u32);
            posted += n;
        }
        let h = rd(regs::M2S_Q_BASE + regs::Q_HEAD) & regs::PTR_INDEX_MASK;
        done += u64::from((h + RING - last_head) % RING);
        last_head = h;
        if let Some(e) = dev.last_error() {
            panic!("engine error {e:?}");
        }
        std::thread::yield_now();
    }
    let model_t = t0.elapsed();
    let c = dev.counters();
    assert_eq!(c.bytes, TOTAL as u64);
    let mut check = vec![0u8; CHUNK];
    assert!(ram.read(DST, &mut check));
    assert_eq!(check[..], pattern[..CHUNK]);

    // Baseline: plain memcpy of the same chunks between the same areas.
    let mut buf_src = vec![0u8; AREA];
    let mut buf_dst = vec![0u8; AREA];
    buf_src.copy_from_slice(&pattern);
    buf_dst.copy_from_slice(&pattern);
    let t1 = Instant::now();
    for k in 0..n_pairs {
        let off = ((k % chunks_per_area) as usize) * CHUNK;
        buf_dst[off..off + CHUNK].copy_from_slice(&buf_src[off..off + CHUNK]);
        std::hint::black_box(&buf_dst);
    }
    let memcpy_t = t1.elapsed();
    let gib = TOTAL as f64 / (1u64 << 30) as f64;
    let model_bps = TOTAL as f64 / model_t.as_secs_f64();
    let memcpy_bps = TOTAL as f64 / memcpy_t.as_secs_f64();
    println!("copied {gib:.0} GiB in {} pairs of {} KiB (ring {RING} slots)", n_pairs, CHUNK >> 10);
    println!("model : {:8.3} s  {:8.2} GB/s", model_t.as_secs_f64(), model_bps / 1e9);
    println!("memcpy: {:8.3} s  {:8.2} GB/s", memcpy_t.as_secs_f64(), memcpy_bps / 1e9);
    println!("ratio model/memcpy: {:.2}x", model_bps / memcpy_bps);
}

/// Guest RAM of the CPU benchmark, at guest-physical `CPU_RAM`.
const CPU_RAM: u64 = 0x1_0000_0000;
const CPU_RAM_SIZE: usize = 16 << 20;
/// Ring slots per queue.
const CPU_RING: u32 = 1024;
/// Device address (BAR4 offset, HBM0) the host -> HBM lane copies to.
const HBM_DST: u64 = 0x10_0000;
/// Bytes per data pair.
const CPU_PAIR: usize = 4096;
/// Data pairs per submission; each submission is followed by the completion marker pair.
const CPU_BATCH: u32 = 256;
/// Submissions per worker and measurement.
const CPU_SUBMISSIONS: u32 = 2000;
const MARKER: u32 = 0xABCD_EF01;

/// One engine's queue 0 as a driver thread drives it: rings, a source and a destination area,
/// and two completion buffers (two submissions in flight).
struct Lane {
    eng: u32,
    tx: u64,
    rx: u64,
    src: u64,
    dst: u64,
    /// `dst` is a device address (HBM), not guest RAM.
    device: bool,
    mark: [u64; 2],
}

impl Lane {
    fn new(k: u64, eng: u32) -> Lane {
        let b = CPU_RAM + k * (4 << 20);
        Lane {
            eng,
            tx: b,
            rx: b + 0x1_0000,
            src: b + 0x10_0000,
            dst: b + 0x20_0000,
            device: false,
            mark: [b + 0x2_0000, b + 0x2_0040],
        }
    }

    /// The same lane copying to device address `dst` (HBM) instead.
    fn with_device_dst(self, dst: u64) -> Lane {
        Lane { dst, device: true, ..self }
    }
}

/// Drives `lane` for `subs` submissions of [`CPU_BATCH`] pairs plus a marker pair with DMB (the
/// driver's in-kernel copy: the last data pair carries the write barrier), keeping two
/// submissions in flight; waits for each marker by polling guest RAM, sleeping 100 us in between
/// (rare wake-ups: the driver threads share the two cores with the workers).
fn drive(dev: &Device, ram: &FlatMemory, lane: &Lane, slot: &mut u64, subs: u32) {
    let gen = dev.gen();
    let route = gen.host_route();
    let base = gen.engine_base(lane.eng).expect("engine");
    let put = |ring: u64, k: u64, w0: u32, w1: u32, addr: u64| {
        let idx = (k % u64::from(CPU_RING)) as u32;
        let rid = ((1 + k / u64::from(CPU_RING)) & 3) as u32;
        let mut d = [0u8; 16];
        d[0..4].copy_from_slice(&(w0 | rid << 24).to_le_bytes());
        d[4..8].copy_from_slice(&w1.to_le_bytes());
        d[8..16].copy_from_slice(&addr.to_le_bytes());
        assert!(ram.write(ring + u64::from(idx) * 16, &d));
    };
    let wait = |m: u64| {
        let t0 = Instant::now();
        let mut w = [0u8; 4];
        loop {
            assert!(ram.read(m + 4, &mut w));
            if u32::from_le_bytes(w) == MARKER {
                return;
            }
            if let Some(e) = dev.last_error() {
                panic!("engine error {e:?}");
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "marker timeout");
            std::thread::sleep(Duration::from_micros(100));
        }
    };
    let chunks = (0x10_0000 / CPU_PAIR) as u64;
    for s in 0..u64::from(subs) {
        let m = lane.mark[(s % 2) as usize];
        if s >= 2 {
            wait(m);
        }
        let mut arm = [0u8; 8];
        arm[..4].copy_from_slice(&MARKER.to_le_bytes());
        assert!(ram.write(m, &arm));
        for i in 0..u64::from(CPU_BATCH) {
            let off = ((s * u64::from(CPU_BATCH) + i) % chunks) * CPU_PAIR as u64;
            let l = CPU_PAIR as u32 & desc::LEN_MASK;
            let dst = if lane.device { lane.dst + off } else { (lane.dst + off) | route };
            put(lane.rx, *slot, l, 0, dst);
            let meta = if i + 1 == u64::from(CPU_BATCH) { desc::META_COPY_WB } else { desc::META_COPY };
            put(lane.tx, *slot, desc::FIRST | desc::LAST | l, meta, (lane.src + off) | route);
            *slot += 1;
        }
        put(lane.rx, *slot, 4, 0, (m + 4) | route);
        put(lane.tx, *slot, desc::FIRST | desc::LAST | desc::DMB | 4, desc::META_COPY, m | route);
        *slot += 1;
        let n = CPU_BATCH + 1;
        dev.write32(base + u64::from(regs::S2M_Q_BASE + regs::Q_DOORBELL), n);
        dev.write32(base + u64::from(regs::M2S_Q_BASE + regs::Q_DOORBELL), n);
    }
    for s in u64::from(subs).saturating_sub(2)..u64::from(subs) {
        wait(lane.mark[(s % 2) as usize]);
    }
}

/// Runs `subs` submissions on each of `lanes` at once, one driver thread per lane; returns the
/// summed worker CPU time per data pair and the wall time.
fn cpu_run(dev: &Device, ram: &FlatMemory, lanes: &[Lane], slots: &mut [u64], subs: u32) -> (Duration, Duration) {
    let cpu = |e: u32| dev.worker_cpu_time(e).unwrap_or_default();
    let before: Vec<Duration> = lanes.iter().map(|l| cpu(l.eng)).collect();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (lane, slot) in lanes.iter().zip(slots.iter_mut()) {
            s.spawn(move || drive(dev, ram, lane, slot, subs));
        }
    });
    let wall = t0.elapsed();
    let used: Duration = lanes.iter().zip(&before).map(|(l, b)| cpu(l.eng) - *b).sum();
    let pairs = u64::from(subs) * u64::from(CPU_BATCH) * lanes.len() as u64;
    (used / pairs as u32, wall)
}

fn cpu_bench() {
    // Guest RAM is a memfd that the DMA table maps (as DMA_MAP does) beside a few other
    // entries; the driver threads write descriptors through their own mapping of it.
    let ram = FlatMemory::memfd(CPU_RAM, CPU_RAM_SIZE, "bench-ram").expect("ram");
    // SAFETY: dup of a valid memfd; the File owns the duplicate.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(libc::dup(ram.raw_fd().unwrap())) };
    let dma = Arc::new(DmaTable::new());
    dma.map(0, 0xA_0000, &file, 0, true).expect("map");
    dma.map(0xC_0000, 0x4_0000, &file, 0, true).expect("map");
    dma.map(CPU_RAM, CPU_RAM_SIZE as u64, &file, 0, true).expect("map");
    let dev = Device::new(
        Config { model: Model::Trn1, hbm_size: 4 << 20, trace: None, options: Default::default() },
        dma.clone() as Arc<dyn GuestMemory>,
    )
    .expect("device");
    let gen = dev.gen();
    let route = gen.host_route();
    let lanes = [Lane::new(0, 32), Lane::new(1, 33), Lane::new(2, 0).with_device_dst(HBM_DST)];
    for lane in &lanes {
        let base = gen.engine_base(lane.eng).expect("engine");
        let wr = |unit: u32, v: u32| dev.write32(base + u64::from(unit), v);
        wr(regs::M2S_CFG_LEN, 0x010F_FFFF);
        wr(regs::M2S_DESC_PREF_CFG_2, 0x0001_0041);
        wr(regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0xF000_0000);
        wr(regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK, 0x0000_10F8);
        for (tx, gpa) in [(true, lane.tx), (false, lane.rx)] {
            let b = if tx { regs::M2S_Q_BASE } else { regs::S2M_Q_BASE };
            wr(b + regs::Q_CFG, 0x0300_0000);
            wr(b + if tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL }, regs::Q_SW_CTRL_RESET);
            wr(b + regs::Q_BASE_LO, (gpa | route) as u32);
            wr(b + regs::Q_BASE_HI, ((gpa | route) >> 32) as u32);
            wr(b + regs::Q_LEN, CPU_RING);
            wr(b + regs::Q_CFG, 0x0303_0000);
        }
        let pattern: Vec<u8> = (0..0x10_0000u32).map(|i| (i * 13 + lane.eng) as u8).collect();
        assert!(ram.write(lane.src, &pattern));
        if lane.device {
            dev.bar4_write(lane.dst, &vec![0u8; 0x10_0000]);
        } else {
            assert!(ram.write(lane.dst, &vec![0u8; 0x10_0000]));
        }
    }
    let mut slots = [0u64; 3];
    // Warm-up: fault everything in, start the workers.
    cpu_run(&dev, &ram, &lanes, &mut slots, 50);
    let (one, one_wall) = cpu_run(&dev, &ram, &lanes[..1], &mut slots[..1], CPU_SUBMISSIONS);
    let (two, two_wall) = cpu_run(&dev, &ram, &lanes[..2], &mut slots[..2], CPU_SUBMISSIONS);
    let (hbm, hbm_wall) = cpu_run(&dev, &ram, &lanes[2..], &mut slots[2..], CPU_SUBMISSIONS);
    for lane in &lanes {
        let (mut a, mut b) = (vec![0u8; 0x10_0000], vec![0u8; 0x10_0000]);
        assert!(ram.read(lane.src, &mut a));
        if lane.device {
            dev.bar4_read(lane.dst, &mut b);
        } else {
            assert!(ram.read(lane.dst, &mut b));
        }
        assert!(a == b, "engine {}: destination differs from source", lane.eng);
    }
    let pairs = u64::from(CPU_SUBMISSIONS) * u64::from(CPU_BATCH);
    println!(
        "worker CPU per {} KiB pair ({} submissions of {} pairs + marker per worker, DMA-table guest RAM):",
        CPU_PAIR >> 10,
        CPU_SUBMISSIONS,
        CPU_BATCH
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("  1 worker : {:6.2} us/pair  ({} pairs in {:.3} s)", us(one), pairs, one_wall.as_secs_f64());
    println!("  2 workers: {:6.2} us/pair  ({} pairs in {:.3} s)", us(two), 2 * pairs, two_wall.as_secs_f64());
    println!("  ratio 2/1: {:.2}x", us(two) / us(one));
    println!("  1 worker, host -> HBM: {:6.2} us/pair  ({} pairs in {:.3} s)", us(hbm), pairs, hbm_wall.as_secs_f64());
}
