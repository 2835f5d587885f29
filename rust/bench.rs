// SPDX-License-Identifier: GPL-2.0

//! Benchmark suite, compiled in only with `NEURON_UDMA_BENCH=y` (`scripts/bench`), never by
//! `make check`: the cost of building descriptor pairs inside the kernel.
//!
//! It takes a driver-owned queue with 2^16-slot rings, fills it with `prepare_one` (no doorbell,
//! so the engine never runs) in rounds, resetting the software ring state between rounds with
//! `hw_init` outside the timed region, and compares with the physical floor: the same 32 bytes per
//! pair written with plain 16-byte stores (two 8-byte volatile stores each) into the same coherent
//! ring memory. Results are printed as `NU-BENCH {json}` lines, which `scripts/bench` reads from
//! the guest's kernel log.

use crate::{
    channel::Owner,
    desc::{Barrier, DescLen},
    queue::Copy,
    Registry,
};
use kernel::{
    prelude::*,
    time::{Instant, Monotonic},
};

/// Descriptors per ring of the bench queue.
const RING_DESCS: u32 = 1 << 16;
/// Rounds of one full ring each: 16 x 65520 pairs = 1,048,320 pairs.
const ROUNDS: u32 = 16;
/// Queue of the H2T engine used by the bench (not reserved, not used by the other suites).
const BENCH_QUEUE: u32 = 5;
/// Bytes per prepared copy (the copies never run).
const COPY_LEN: u32 = 64;

/// `num / den` with three decimals, as a JSON number.
struct Fixed3(u64, u64);

impl kernel::fmt::Display for Fixed3 {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        let milli = self.0.saturating_mul(1000) / self.1.max(1);
        write!(f, "{}.{:03}", milli / 1000, milli % 1000)
    }
}

/// Nanoseconds elapsed since `t`.
fn ns_since(t: Instant<Monotonic>) -> u64 {
    // CAST: elapsed time is never negative.
    t.elapsed().as_nanos() as u64
}

#[kunit_tests(neuron_udma_bench)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_pair_build() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let (eng, _) = dev.arch.h2t[0];
        let q = dev.queue_init(eng, BENCH_QUEUE, RING_DESCS, RING_DESCS, Owner::Driver)?;
        let src0 = dev.arch.host_addr(0x1000_0000);
        let dst0 = dev.arch.host_addr(0x2000_0000);
        let r = q.with(|queue, io| {
            let len = DescLen::new(COPY_LEN)?;
            let (mut prep_ns, mut floor_ns, mut pairs) = (0u64, 0u64, 0u64);
            for _ in 0..ROUNDS {
                // Not timed: back to empty rings (also reprograms the queue registers).
                queue.hw_init(io)?;
                let n = queue.available_pairs();
                let t = Instant::<Monotonic>::now();
                for i in 0..n {
                    let off = u64::from(i) * u64::from(COPY_LEN);
                    queue.prepare_one(&Copy {
                        src: src0 + off,
                        dst: dst0 + off,
                        len,
                        barrier: Barrier::None,
                        set_dst_int: false,
                    })?;
                }
                prep_ns += ns_since(t);
                pairs += u64::from(n);

                // The floor: the same slots, 2 x 16 bytes per pair, plain stores.
                let (tx_ring, rx_ring) = queue.rings();
                let tx = tx_ring.memory().as_mut_ptr().cast::<u64>();
                let rx = rx_ring.memory().as_mut_ptr().cast::<u64>();
                let t = Instant::<Monotonic>::now();
                for i in 0..n as usize {
                    let off = i as u64 * u64::from(COPY_LEN);
                    let w0 = u64::from(COPY_LEN) | (1 << 24);
                    // SAFETY: `i < n <= RING_DESCS`, the length of both rings (2 words per slot);
                    // the queue is not doorbelled, so the engine never reads these slots, and the
                    // queue lock is held.
                    unsafe {
                        tx.add(2 * i).write_volatile(w0 | (0xC << 28));
                        tx.add(2 * i + 1).write_volatile(src0 + off);
                        rx.add(2 * i).write_volatile(w0);
                        rx.add(2 * i + 1).write_volatile(dst0 + off);
                    }
                }
                floor_ns += ns_since(t);
            }
            queue.hw_init(io)?;
            Ok((prep_ns, floor_ns, pairs))
        });
        dev.queue_release(q.owner, q.eng, q.qid)?;
        let (prep_ns, floor_ns, pairs) = r?;
        assert!(pairs >= 1_000_000);
        pr_info!(
            "NU-BENCH {{\"name\":\"prepare_one (in kernel)\",\"value\":{},\"unit\":\"ns/pair\",\
             \"baseline\":{},\"ratio\":{},\"how\":\"{} pairs ({} rounds filling a {}-slot ring, \
             {}-byte copies, no doorbell, hw_init between rounds not timed); baseline: 2 x 16-byte \
             plain stores per pair into the same coherent ring slots\"}}\n",
            Fixed3(prep_ns, pairs),
            Fixed3(floor_ns, pairs),
            Fixed3(prep_ns, floor_ns),
            pairs,
            ROUNDS,
            RING_DESCS,
            COPY_LEN,
        );

        // Per-call cost of COPY_PREPARE that COPY_PREPARE_ONE does not have: its entry array,
        // allocated and freed on every call (KVVec, as in `file.rs`).
        const ALLOCS: u64 = 10_000;
        let t = Instant::<Monotonic>::now();
        for _ in 0..ALLOCS {
            let v = KVVec::<(Copy, u64, u64)>::with_capacity(1, GFP_KERNEL)?;
            drop(core::hint::black_box(v));
        }
        let alloc_ns = ns_since(t);
        // The same with KVec (plain kmalloc), to tell the allocator's cost from kvmalloc's.
        let t = Instant::<Monotonic>::now();
        for _ in 0..ALLOCS {
            let v = KVec::<(Copy, u64, u64)>::with_capacity(1, GFP_KERNEL)?;
            drop(core::hint::black_box(v));
        }
        let kmalloc_ns = ns_since(t);
        pr_info!(
            "NU-BENCH {{\"name\":\"COPY_PREPARE entry array alloc+free (in kernel)\",\"value\":{},\
             \"unit\":\"ns/call\",\"baseline\":{},\"ratio\":{},\"how\":\"{} x \
             KVVec::with_capacity(1) + drop, the per-call allocation of COPY_PREPARE; baseline: \
             prepare_one ns/pair above\"}}\n",
            Fixed3(alloc_ns, ALLOCS),
            Fixed3(prep_ns, pairs),
            Fixed3(alloc_ns * pairs / ALLOCS, prep_ns),
            ALLOCS,
        );
        pr_info!(
            "NU-BENCH {{\"name\":\"KVec alloc+free of one entry (in kernel)\",\"value\":{},\
             \"unit\":\"ns/call\",\"baseline\":{},\"ratio\":{},\"how\":\"{} x \
             KVec::with_capacity(1) + drop (kmalloc/kfree, same entry type); baseline: prepare_one \
             ns/pair above\"}}\n",
            Fixed3(kmalloc_ns, ALLOCS),
            Fixed3(prep_ns, pairs),
            Fixed3(kmalloc_ns * pairs / ALLOCS, prep_ns),
            ALLOCS,
        );
        Ok(())
    }
}
