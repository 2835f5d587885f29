//! Copies 1 GiB in 64 KiB descriptor pairs through the model (in-memory guest
//! RAM, 4096-slot rings, host -> host on V2 engine 32 queue 0) and compares
//! with a plain memcpy of the same chunks. Run: `cargo bench`.

use std::sync::Arc;
use std::time::Instant;
use udma_sim::layout::Model;
use udma_sim::mem::{FlatMemory, GuestMemory};
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
