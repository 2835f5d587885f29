// SPDX-License-Identifier: GPL-2.0
//! End to end through the real binary over vfio-user (no QEMU): the test acts
//! as the vfio-user client with `vfio_user::Client`, maps "guest RAM" (a
//! memfd) with DMA_MAP, programs BAR0 and checks the copy, BAR2, BAR4 mmap,
//! config space, the control socket and the ready file.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use udma_sim::mem::{FlatMemory, GuestMemory};
use udma_sim::regs::{self, desc};
use vfio_user::Client;

const BAR0: u32 = 0;
const BAR2: u32 = 2;
const BAR4: u32 = 4;
const CONFIG: u32 = 7;
const RAM_GPA: u64 = 0x4000_0000;
const RAM_SIZE: usize = 4 << 20;

fn rd32(c: &mut Client, region: u32, off: u64) -> u32 {
    let mut b = [0u8; 4];
    c.region_read(region, off, &mut b).unwrap();
    u32::from_le_bytes(b)
}

fn wr32(c: &mut Client, region: u32, off: u64, v: u32) {
    c.region_write(region, off, &v.to_le_bytes()).unwrap();
}

#[test]
fn vfio_user_end_to_end() {
    let dir = std::env::temp_dir().join(format!("udma-sim-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("dev.sock");
    let ctl = dir.join("ctl.sock");
    let ready = dir.join("ready");
    let trace = dir.join("trace.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_udma-sim"))
        .args(["--model", "trn1", "--hbm-size", "1M", "--socket"])
        .arg(&sock)
        .arg("--control")
        .arg(&ctl)
        .arg("--ready-file")
        .arg(&ready)
        .arg("--trace")
        .arg(&trace)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "server not ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = Client::new(&sock).unwrap();

    // Config space: identity, BAR sizing, command register.
    assert_eq!(rd32(&mut c, CONFIG, 0), 0x7164_1D0F);
    assert_eq!(rd32(&mut c, CONFIG, 8) & 0xFF, 0, "revision 0");
    wr32(&mut c, CONFIG, 0x10, 0xFFFF_FFFF);
    assert_eq!(rd32(&mut c, CONFIG, 0x10), 0xC000_000C, "BAR0: 1 GiB, 64-bit, prefetchable");
    wr32(&mut c, CONFIG, 4, 0x6);
    assert_eq!(rd32(&mut c, CONFIG, 4) & 0xFFFF, 0x6);

    // Region table: BAR4 is mmap-able through the memfd.
    let bar4 = c.region(BAR4).unwrap();
    assert_eq!(bar4.size, 1 << 20);
    assert_ne!(bar4.flags & 4, 0, "BAR4 must carry VFIO_REGION_INFO_FLAG_MMAP");
    let fo = bar4.file_offset.as_ref().expect("BAR4 fd");
    let hbm_view = udma_sim::mem::MmapRegion::from_file(fo.file(), fo.start(), 1 << 20, true).unwrap();
    assert_eq!(c.region(BAR0).unwrap().size, 1 << 30);
    assert_eq!(c.region(BAR2).unwrap().size, 4096);

    // "Guest RAM": a memfd mapped at RAM_GPA, announced with DMA_MAP (plus churn).
    let ram = FlatMemory::memfd(RAM_GPA, RAM_SIZE, "guest-ram").unwrap();
    let fd = ram.raw_fd().unwrap();
    c.dma_map(0, RAM_GPA, RAM_SIZE as u64, fd).unwrap();
    c.dma_map(0, 0x9000_0000, 0x1000, fd).unwrap();
    c.dma_unmap(0x9000_0000, 0x1000).unwrap();

    // BAR2 window.
    assert_eq!(rd32(&mut c, BAR2, 0), 0x5544_4D41);

    // One copy host -> HBM on engine 32 queue 0, then HBM -> host.
    let host = |gpa: u64| gpa | 0x1000_0000_0000;
    let eng = 0x3060_0000u64;
    let (tx_ring, rx_ring, src, dst) = (RAM_GPA, RAM_GPA + 0x10000, RAM_GPA + 0x20000, RAM_GPA + 0x30000);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    assert!(ram.write(src, &data));
    // The engine init steps the model depends on (hardware.rst §3.6 steps 6, 15, 16, 19).
    wr32(&mut c, BAR0, eng + u64::from(regs::M2S_CFG_LEN), 0x010F_FFFF);
    wr32(&mut c, BAR0, eng + u64::from(regs::M2S_DESC_PREF_CFG_2), 0x0001_0041);
    wr32(&mut c, BAR0, eng + u64::from(regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK), 0xF000_0000);
    wr32(&mut c, BAR0, eng + u64::from(regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK), 0x0000_10F8);
    for (tx, gpa) in [(true, tx_ring), (false, rx_ring)] {
        let b = eng + u64::from(if tx { regs::M2S_Q_BASE } else { regs::S2M_Q_BASE });
        wr32(&mut c, BAR0, b + u64::from(if tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL }), 0x100);
        wr32(&mut c, BAR0, b + u64::from(regs::Q_BASE_LO), host(gpa) as u32);
        wr32(&mut c, BAR0, b + u64::from(regs::Q_BASE_HI), (host(gpa) >> 32) as u32);
        wr32(&mut c, BAR0, b + u64::from(regs::Q_LEN), 64);
        wr32(&mut c, BAR0, b + u64::from(regs::Q_CFG), 0x0303_0000);
    }
    let put = |ring: u64, idx: u64, w0: u32, w1: u32, a: u64| {
        let mut d = [0u8; 16];
        d[0..4].copy_from_slice(&w0.to_le_bytes());
        d[4..8].copy_from_slice(&w1.to_le_bytes());
        d[8..16].copy_from_slice(&a.to_le_bytes());
        assert!(ram.write(ring + idx * 16, &d));
    };
    let fl = desc::FIRST | desc::LAST | 1 << 24 | 4096;
    put(rx_ring, 0, 1 << 24 | 4096, 0, 0x800);
    put(tx_ring, 0, fl, desc::META_COPY, host(src));
    put(rx_ring, 1, 1 << 24 | 4096, 0, host(dst));
    // DMB: the pair reads the device memory the first pair wrote.
    put(tx_ring, 1, fl | desc::DMB, desc::META_COPY_WB, 0x800);
    wr32(&mut c, BAR0, eng + 0x21038, 2);
    wr32(&mut c, BAR0, eng + 0x1038, 2);
    let t0 = Instant::now();
    while rd32(&mut c, BAR0, eng + 0x1034) != (2 | 1 << 30) {
        assert!(t0.elapsed() < Duration::from_secs(10), "copy did not complete");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut back = vec![0u8; 4096];
    assert!(ram.read(dst, &mut back));
    assert_eq!(back, data);
    // HBM through the BAR4 region (server side) and through the client's mmap.
    let mut h = vec![0u8; 4096];
    c.region_read(BAR4, 0x800, &mut h).unwrap();
    assert_eq!(h, data);
    let mut first = [0u8; 4];
    // SAFETY: the mapping is 1 MiB long.
    unsafe { std::ptr::copy_nonoverlapping(hbm_view.as_ptr().add(0x800), first.as_mut_ptr(), 4) };
    assert_eq!(first, data[..4]);
    assert_eq!(rd32(&mut c, BAR2, 0x48), 8192, "bytes counter");

    // Bus master off -> the next doorbell aborts the engine.
    wr32(&mut c, CONFIG, 4, 0x2);
    put(rx_ring, 2, 1 << 24 | 64, 0, host(dst));
    put(tx_ring, 2, desc::FIRST | desc::LAST | 1 << 24 | 64, desc::META_COPY, host(src));
    wr32(&mut c, BAR0, eng + 0x21038, 1);
    wr32(&mut c, BAR0, eng + 0x1038, 1);
    let t0 = Instant::now();
    while rd32(&mut c, BAR0, eng + 0x200) != 0x2222 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no abort with bus mastering off");
        std::thread::sleep(Duration::from_millis(1));
    }

    // Control socket.
    let s = std::os::unix::net::UnixStream::connect(&ctl).unwrap();
    let mut w = s.try_clone().unwrap();
    writeln!(w, r#"{{"cmd":"last_error"}}"#).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    assert!(line.contains("bus_master_off"), "{line}");

    // Disconnect: the server exits 0.
    drop(c);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "server did not exit");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success());
    let trace_text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(trace_text.lines().count(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}
