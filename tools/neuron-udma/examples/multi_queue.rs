// SPDX-License-Identifier: MIT OR Apache-2.0
//! Several queues of one device file at once: one queue per engine that reaches host memory (up
//! to `QUEUES`), each with its own slice of one host source, copied into its own host
//! destination by a thread of its own that submits a fence ([`Queue::submit`]) and blocks in
//! [`Fence::wait`] (`FENCE_WAIT`). The queues run side by side; a queue's failure does not stop
//! the others, and each is reported.
//!
//! usage: `multi_queue [DEVICE] [QUEUES]` (default `/dev/neuron_udma0`, 4 queues); the last line
//! is `multi_queue: OK: ...` (exit status 0) or `multi_queue: FAILED: ...` (1).
//!
//! `cargo run --release --example multi_queue`; in the guest of `scripts/vm-run` it is
//! `multi_queue_rs`.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use neuron_udma::{Copy, Device, HostBuffer};

/// Bytes each queue copies.
const SLICE: u64 = 512 << 10;
/// Queue 1 of each engine (reserved on none of the engines `Info::user_engine` would pick).
const QUEUE: u32 = 1;
const RING_DESCS: u32 = 64;

fn main() {
    if let Err(e) = run() {
        println!("multi_queue: FAILED: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/dev/neuron_udma0".into());
    let want: usize = match args.next() {
        Some(s) => s.parse().with_context(|| format!("QUEUES {s}: not a number"))?,
        None => 4,
    };
    ensure!(want >= 1, "QUEUES: give at least 1");
    let dev = Device::open(&path)?;
    let info = dev.info()?;
    ensure!(info.has_abi3(), "{path} speaks ABI {}; fences need ABI 3", info.abi_version);
    // Engines whose queue QUEUE users may take (host connectivity, not reserved).
    let engines: Vec<u32> =
        info.host_engine_list().into_iter().filter(|&e| !info.is_reserved_queue(e, QUEUE)).take(want).collect();
    ensure!(engines.len() == want, "{path} has {} engines with a free queue {QUEUE}, {want} asked", engines.len());

    let mut src = dev.alloc_host(SLICE * want as u64)?;
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 31 + (i >> 9)) as u8;
    }
    let dsts = (0..want).map(|_| dev.alloc_host(SLICE)).collect::<neuron_udma::Result<Vec<HostBuffer>>>()?;
    let chunk = u64::from(info.max_copy_size);
    ensure!(
        SLICE.div_ceil(chunk) <= u64::from(info.pairs_per_round(RING_DESCS)),
        "a {RING_DESCS}-slot ring holds fewer than the {} copies of a slice",
        SLICE.div_ceil(chunk)
    );

    // One thread per queue; each takes its queue, prepares its copies, submits one fence and
    // waits for it. The queues, buffers and device are shared by reference (scoped threads).
    let results: Vec<Result<u64>> = std::thread::scope(|s| {
        let threads: Vec<_> = engines
            .iter()
            .zip(&dsts)
            .enumerate()
            .map(|(i, (&engine, dst))| {
                let (dev, src) = (&dev, &src);
                s.spawn(move || -> Result<u64> {
                    let q = dev.queue(engine, QUEUE, RING_DESCS)?;
                    let base = i as u64 * SLICE;
                    let copies = (0..SLICE)
                        .step_by(chunk as usize)
                        .map(|off| Copy::new(src, base + off, dst, off, chunk.min(SLICE - off) as u32))
                        .collect::<neuron_udma::Result<Vec<_>>>()?;
                    q.prepare(&copies)?;
                    let fence = q.submit()?;
                    fence.wait(Some(Duration::from_secs(10)))?;
                    Ok(fence.number())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the thread panicked")))).collect()
    });

    let mut failed = Vec::new();
    for (i, (r, &engine)) in results.into_iter().zip(&engines).enumerate() {
        let base = i * SLICE as usize;
        let what = match r {
            Err(e) => format!("FAILED: {e:#}"),
            Ok(fence) => match (0..SLICE as usize).find(|&j| dsts[i][j] != src[base + j]) {
                Some(j) => format!("FAILED: fence {fence} done, but byte {j} differs from the source"),
                None => format!("fence {fence} done, {} KiB byte-exact", SLICE >> 10),
            },
        };
        println!("queue {engine}/{QUEUE}: {what}");
        if let Some(why) = what.strip_prefix("FAILED: ") {
            failed.push(format!("queue {engine}/{QUEUE}: {why}"));
        }
    }
    ensure!(failed.is_empty(), "{} of {want} queues failed, the first: {}", failed.len(), failed[0]);
    println!(
        "multi_queue: OK: {want} queues on engines {engines:?} copied {} KiB each side by side, one thread in FENCE_WAIT per queue, byte-exact",
        SLICE >> 10
    );
    Ok(())
}
