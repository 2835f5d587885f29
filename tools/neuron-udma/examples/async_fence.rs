// SPDX-License-Identifier: MIT OR Apache-2.0
//! Fences awaited as futures on tokio (feature `tokio`): [`DeviceEvents::with_tokio`] registers
//! the device file with tokio's reactor ([`neuron_udma::TokioReadiness`]), and
//! [`Fence::completion`](neuron_udma::Fence::completion) is a future that is ready when its
//! fence is done. Nothing blocks a thread and nothing spins: the task sleeps until the file
//! reports a completion.
//!
//! The example keeps `DEPTH` fences in flight on one queue: each fence covers a batch of copies
//! host -> HBM -> host of its own slice; it awaits the oldest fence, checks that slice and
//! submits the next batch in its place, until every slice was copied.
//!
//! usage: `async_fence [DEVICE]` (default `/dev/neuron_udma0`); the last line is
//! `async_fence: OK: ...` (exit status 0) or `async_fence: FAILED: ...` (1).
//!
//! `cargo run --release --features tokio --example async_fence`; in the guest of `scripts/vm-run`
//! it is `async_fence_rs`.

use std::collections::VecDeque;

use anyhow::{ensure, Context, Result};
use neuron_udma::{Barrier, Copy, Device, DeviceEvents};

/// Bytes per slice (one fence: its copies host -> HBM, then HBM -> host).
const SLICE: u64 = 256 << 10;
/// Slices copied in all.
const SLICES: u64 = 16;
/// Fences in flight at once.
const DEPTH: usize = 4;
/// Queue 1 of the first engine that reaches host memory is free for users on every model.
const QUEUE: u32 = 1;
const RING_DESCS: u32 = 256;

fn main() {
    // A current-thread runtime with the IO driver (DeviceEvents::with_tokio needs its reactor).
    let rt = match tokio::runtime::Builder::new_current_thread().enable_io().build() {
        Ok(rt) => rt,
        Err(e) => {
            println!("async_fence: FAILED: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run()) {
        println!("async_fence: FAILED: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "/dev/neuron_udma0".into());
    let dev = Device::open(&path)?;
    let info = dev.info()?;
    ensure!(info.has_abi3(), "{path} speaks ABI {}; fences need ABI 3", info.abi_version);
    let engine = info.user_engine().with_context(|| format!("no engine of {path} reaches host memory"))?;
    let total = SLICE * SLICES;
    ensure!(
        info.device_mem_size >= total,
        "{path} has {} bytes of device memory, {total} needed",
        info.device_mem_size
    );

    let mut src = dev.alloc_host(total)?;
    let dst = dev.alloc_host(total)?;
    let hbm = dev.alloc_device(total)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 13 + (i >> 10)) as u8 ^ 0x5a;
    }
    let q = dev.queue(engine, QUEUE, RING_DESCS)?;
    let chunk = u64::from(info.max_copy_size);

    // The copies of slice `s`: host -> HBM, then HBM -> host behind a DMB barrier.
    let slice_copies = |s: u64| -> neuron_udma::Result<Vec<Copy>> {
        let base = s * SLICE;
        let mut v = Vec::new();
        for off in (base..base + SLICE).step_by(chunk as usize) {
            v.push(Copy::new(&src, off, &hbm, off, chunk.min(base + SLICE - off) as u32)?);
        }
        for off in (base..base + SLICE).step_by(chunk as usize) {
            let c = Copy::new(&hbm, off, &dst, off, chunk.min(base + SLICE - off) as u32)?;
            v.push(if off == base { c.barrier(Barrier::Dmb) } else { c });
        }
        Ok(v)
    };

    let events = DeviceEvents::with_tokio(&dev).context("DeviceEvents::with_tokio")?;
    let mut in_flight = VecDeque::new();
    let mut next = 0;
    let mut done = 0;
    let mut most = 0;
    while done < SLICES {
        // Keep DEPTH fences in flight.
        while next < SLICES && in_flight.len() < DEPTH {
            q.prepare(&slice_copies(next)?)?;
            in_flight.push_back((next, q.submit()?));
            next += 1;
        }
        most = most.max(in_flight.len());
        let (s, fence) = in_flight.pop_front().expect("a fence is in flight");
        fence.completion(&events).await.with_context(|| format!("fence {} (slice {s})", fence.number()))?;
        let range = (s * SLICE) as usize..((s + 1) * SLICE) as usize;
        if let Some(i) = range.clone().find(|&i| src[i] != dst[i]) {
            anyhow::bail!("slice {s}: byte {i} is {:#04x}, the source's {:#04x}", dst[i], src[i]);
        }
        println!("fence {} done: slice {s} ({} KiB) byte-exact", fence.number(), SLICE >> 10);
        done += 1;
    }
    println!(
        "async_fence: OK: {SLICES} fences awaited on tokio, up to {most} in flight on queue {engine}/{QUEUE}, {} KiB host -> HBM -> host byte-exact",
        total >> 10
    );
    Ok(())
}
