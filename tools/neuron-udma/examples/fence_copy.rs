// SPDX-License-Identifier: MIT OR Apache-2.0
//! The ABI 3 path of `examples/fence_copy.c` through the client crate: open the device, a host
//! source and destination and a device (HBM) buffer, one queue, the copies host -> HBM -> host
//! prepared in one batch, [`Queue::submit`] for a fence, `poll()` on the device file and
//! [`Device::queue_events`] for its event, [`Fence::status`], the bytes compared. Every buffer
//! and the queue are given back when they are dropped.
//!
//! usage: `fence_copy [DEVICE] [SIZE]` (default `/dev/neuron_udma0`, 1 MiB, at most 4 MiB); the
//! last line is `fence_copy: OK: ...` (exit status 0) or `fence_copy: FAILED: ...` (1).
//!
//! Run it on a host with the driver: `cargo run --release --example fence_copy`; in the guest of
//! `scripts/vm-run` it is `fence_copy_rs` (README, "Running your own command in the guest").

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use neuron_udma::{Barrier, Copy, Device, FenceStatus};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Queue 1 of the first engine that reaches host memory is free for users on every model.
const QUEUE: u32 = 1;
/// Descriptors per ring.
const RING_DESCS: u32 = 256;
/// The longest one `poll()` waits for the fence's event.
const POLL_TIMEOUT: Duration = Duration::from_secs(10);

fn main() {
    if let Err(e) = run() {
        println!("fence_copy: FAILED: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/dev/neuron_udma0".into());
    let size: u64 = match args.next() {
        Some(s) => s.parse().with_context(|| format!("SIZE {s}: not a number of bytes"))?,
        None => 1 << 20,
    };
    ensure!(
        size > 0 && size.is_multiple_of(4096) && size <= 4 << 20,
        "SIZE {size}: give a multiple of 4096 up to 4 MiB"
    );

    // 1. The device and what it offers (INFO).
    let dev = Device::open(&path)?;
    let info = dev.info()?;
    ensure!(info.has_abi3(), "{path} speaks ABI {}; fences need ABI 3", info.abi_version);
    let engine = info.user_engine().with_context(|| format!("no engine of {path} reaches host memory"))?;
    ensure!(info.device_mem_size >= size, "{path} has {} bytes of device memory, {size} needed", info.device_mem_size);
    println!(
        "device {path}: ABI {}, model {}, {} engines, {} MiB of device memory; queue {engine}/{QUEUE}",
        info.abi_version,
        info.model().unwrap_or("unknown"),
        info.engines,
        info.device_mem_size >> 20
    );

    // 2. Buffers: host buffers are mapped (they deref to [u8]).
    let mut src = dev.alloc_host(size)?;
    let mut dst = dev.alloc_host(size)?;
    let hbm = dev.alloc_device(size)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7 + (i >> 12) + 1) as u8;
    }
    dst.fill(0);

    // 3. The queue; 4. the copies in one batch: host -> HBM, then HBM -> host, the first read of
    // HBM behind a DMB barrier (it waits for every earlier transfer of the queue). Nothing is
    // needed at the end: the fence's completion marker waits for every transfer before it.
    let q = dev.queue(engine, QUEUE, RING_DESCS)?;
    let chunk = u64::from(info.max_copy_size);
    ensure!(chunk > 0, "the device reports max_copy_size 0");
    let pieces = || (0..size).step_by(chunk as usize).map(move |off| (off, (size - off).min(chunk) as u32));
    let mut copies = Vec::new();
    for (off, n) in pieces() {
        copies.push(Copy::new(&src, off, &hbm, off, n)?);
    }
    for (off, n) in pieces() {
        let c = Copy::new(&hbm, off, &dst, off, n)?;
        copies.push(if off == 0 { c.barrier(Barrier::Dmb) } else { c });
    }
    ensure!(
        copies.len() as u32 <= info.pairs_per_round(RING_DESCS),
        "{} copies do not fit one batch on a {RING_DESCS}-slot ring: use a smaller SIZE",
        copies.len()
    );
    q.prepare(&copies)?;

    // 5. Submit: the fence comes back at once.
    let t0 = Instant::now();
    let fence = q.submit()?;
    println!("submitted {} copies ({} KiB each way): fence {}", copies.len(), size >> 10, fence.number());

    // 6. Wait for its event: poll() the device file (EPOLLIN: completions, EPOLLPRI: a
    // failure), then read the events, which clears the readiness.
    let mut completed = 0;
    let mut wakeups = 0;
    while completed < fence.number() {
        let mut fds = [PollFd::new(dev.as_fd(), PollFlags::POLLIN | PollFlags::POLLPRI)];
        let timeout = PollTimeout::try_from(POLL_TIMEOUT).expect("10 s fits poll()'s timeout");
        match poll(&mut fds, timeout) {
            Ok(0) => bail!("no event for fence {} within {POLL_TIMEOUT:?}", fence.number()),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("poll on the device file"),
        }
        wakeups += 1;
        for ev in dev.queue_events()? {
            if (ev.engine(), ev.queue()) != (engine, QUEUE) {
                continue;
            }
            if let Some(e) = ev.failure_error() {
                return Err(e).context(format!("queue {engine}/{QUEUE}"));
            }
            completed = completed.max(ev.completed());
        }
    }
    let elapsed = t0.elapsed();
    println!("event: fences up to {completed} completed ({wakeups} wakeup(s) of poll())");

    // 7. The fence itself, without blocking (FENCE_STATUS).
    let report = fence.report()?;
    ensure!(
        report.status == FenceStatus::Done,
        "FENCE_STATUS of fence {}: {:?}, not done",
        fence.number(),
        report.status
    );
    println!(
        "FENCE_STATUS: fence {} done (queue: {} completed, {} submitted)",
        fence.number(),
        report.completed,
        report.submitted
    );

    // 8. The bytes.
    if let Some(i) = (0..src.len()).find(|&i| src[i] != dst[i]) {
        bail!("byte {i} of the destination is {:#04x}, the source's {:#04x}", dst[i], src[i]);
    }
    println!(
        "fence_copy: OK: {} KiB host -> HBM -> host in one fence on queue {engine}/{QUEUE}, every byte verified, {:.1} ms from submit to event",
        size >> 10,
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
