// SPDX-License-Identifier: GPL-2.0

//! Benchmark suite, compiled in only with `NEURON_UDMA_BENCH=y` (`scripts/bench`), never by
//! `make check`: the cost of building descriptor pairs inside the kernel.
//!
//! It takes a driver-owned queue with 2^16-slot rings, fills it with `prepare_one` (no doorbell,
//! so the engine never runs) in rounds, resetting the software ring state between rounds with
//! `hw_init` outside the timed region, and compares, in the same rounds and on the same ring
//! memory, with the reference driver's own sequence re-expressed in C (`tests/bench/kernel/bench_ref.c`) and
//! with the physical floor: the same 32 bytes per pair written with plain 16-byte stores (two
//! 8-byte volatile stores each). It also times one doorbell-sized BAR0 write, the unit of the
//! small-copy latency floor of `tests/bench/udma_bench.c`. A second case times the scrub of
//! 64 MiB of device memory on the driver's shared H2T queue alone (one engine) against the
//! production scrub, which splits a range that large over every H2T engine (`h2t.rs`). Results
//! are printed as `NU-BENCH {json}` lines, which `scripts/bench` reads from the guest's kernel
//! log.

use crate::{
    channel::{Finish, Job, OnTimeout, Owner, Policy, WaitMode, DEFAULT_TIMEOUT},
    desc::{Barrier, DescLen},
    h2t::STRIPE_BYTES,
    queue::{Copy, Queue},
    regs,
    ring::Ring,
    span::Span,
    Registry,
};
use kernel::{
    io::{register::Array, Io},
    prelude::*,
    str::CString,
    time::{delay::udelay, Delta, Instant, Monotonic},
};

mod ffi {
    use kernel::prelude::*;

    /// Software state of one ring as `tests/bench/kernel/bench_ref.c` keeps it (`struct nu_ref_ring`).
    #[repr(C)]
    pub(super) struct RefRing {
        /// The ring memory: `size` descriptors of 16 bytes.
        pub(super) slots: *mut c_void,
        /// Descriptors in the ring, a power of two.
        pub(super) size: u32,
        /// Next slot to hand out.
        pub(super) next: u32,
        /// First slot not yet completed.
        pub(super) ack: u32,
        /// Ring id (phase) of the next slot.
        pub(super) ring_id: u32,
    }

    extern "C" {
        /// `tests/bench/kernel/bench_ref.c`: prepares `pairs` copies of `len` bytes the reference's way.
        pub(super) fn neuron_udma_bench_ref_fill(
            tx: *mut RefRing,
            rx: *mut RefRing,
            pairs: u32,
            src: u64,
            dst: u64,
            len: u32,
            inlined: bool,
        ) -> c_int;
    }
}

/// Fills slots `0..pairs` of both rings with the C reference sequence (`tests/bench/kernel/bench_ref.c`),
/// starting from empty rings (next and ack at 0, ring id 1), pair `i` copying `len` bytes from
/// `src + i * len` to `dst + i * len`, the pair builder called once per pair or (`inlined`)
/// inlined in the loop. The rings' software state is not touched.
///
/// # Errors
///
/// `EINVAL` if a ring is smaller than `pairs` + 16 slots or its size is not a power of two (the
/// reference's free-space arithmetic needs one), else the C sequence's error (`ENOMEM`, `EINVAL`).
fn ref_fill(
    (tx, rx): (&Ring, &Ring),
    pairs: u32,
    src: u64,
    dst: u64,
    len: u32,
    inlined: bool,
) -> Result {
    let ring = |r: &Ring| -> Result<ffi::RefRing> {
        let size = u32::try_from(r.memory().len()).map_err(|_| EINVAL)?;
        if !size.is_power_of_two() || size < pairs.saturating_add(16) {
            return Err(EINVAL);
        }
        Ok(ffi::RefRing {
            slots: r.memory().as_mut_ptr().cast(),
            size,
            next: 0,
            ack: 0,
            ring_id: 1,
        })
    };
    let (mut t, mut r) = (ring(tx)?, ring(rx)?);
    // SAFETY: each `RefRing` points at its ring's coherent memory of `size` 16-byte slots, which
    // outlives the call; the C side writes only slots below `size` (its indices are masked with
    // `size - 1`, a power of two). The callers hold the queue's lock and never doorbell the
    // queue while these slots are written, so neither the driver nor the engine uses them
    // concurrently.
    let ret =
        unsafe { ffi::neuron_udma_bench_ref_fill(&mut t, &mut r, pairs, src, dst, len, inlined) };
    kernel::error::to_result(ret)
}

/// The 16 bytes of slot `idx` of `ring`, as two words.
///
/// # Panics
///
/// If `idx` is not below the ring size.
fn slot_words(ring: &Ring, idx: usize) -> [u64; 2] {
    assert!(idx < ring.memory().len());
    let p = ring.memory().as_mut_ptr().cast::<u64>();
    // SAFETY: `idx` is below the ring length (checked above), 2 words per 16-byte slot; the
    // memory is coherent and the queue lock is held, so nothing writes it concurrently.
    unsafe {
        [
            p.add(2 * idx).read_volatile(),
            p.add(2 * idx + 1).read_volatile(),
        ]
    }
}

/// Descriptors per ring of the bench queue.
const RING_DESCS: u32 = 1 << 16;
/// Rounds of one full ring each: 16 x 65520 pairs = 1,048,320 pairs.
const ROUNDS: u32 = 16;
/// Queue of the H2T engine used by the bench (not reserved, not used by the other suites).
const BENCH_QUEUE: u32 = 5;
/// Bytes per prepared copy (the copies never run).
const COPY_LEN: u32 = 64;
/// Doorbell-sized BAR0 writes timed, each on its own.
const MMIO_WRITES: usize = 1000;
/// Pause between two timed BAR0 writes, so that each is as isolated as a copy's doorbells are
/// (back-to-back writes would measure how fast the model drains a queue of them).
const MMIO_GAP: Delta = Delta::from_micros(200);

/// Bytes of device memory the scrub rows zero (at least [`STRIPE_BYTES`], so that the
/// production scrub splits it).
const SCRUB_SIZE: u64 = 64 << 20;
const _: () = assert!(SCRUB_SIZE >= STRIPE_BYTES);
/// Scrubs of each kind, alternating; the fastest of each counts.
const SCRUB_REPS: u32 = 5;

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

// The timed Rust functions live in a section of their own that starts a 4 KiB page (the
// `.balign` raises the section's alignment wherever the assembler puts it; the module's linker
// script gathers `.text.*` into `.text` keeping it): under TCG a jump or call to another guest
// page is not chained and costs a lookup, so a fill loop or its builder straddling a page was
// timed up to 1.8x slower for where the code before it happened to end. `bench_ref.c` does the
// same for the C side (`.text.nu_bench_ref`).
core::arch::global_asm!(
    ".pushsection .text.nu_bench,\"ax\",@progbits",
    ".balign 4096",
    ".popsection"
);

/// The driver's pair builder behind one call per pair, as the C sequence's builder is called:
/// the rings' owner and the copy's fields as arguments (the C function takes both rings, source,
/// destination, length, barrier and interrupt flag), the copy built inside.
#[inline(never)]
#[link_section = ".text.nu_bench"]
fn prepare_call(queue: &mut Queue, src: u64, dst: u64, len: DescLen, barrier: Barrier) -> Result {
    queue.prepare_one(&Copy {
        src,
        dst,
        len,
        barrier,
    })
}

/// Fills `pairs` pairs with [`prepare_call`], a call per pair, pair `i` copying `len` bytes from
/// `src + i * len` to `dst + i * len`: the loop the C side's fill runs, in a function of its own
/// next to the builder, as the C one is (under TCG a call to another 4 KiB page is not chained
/// and costs a lookup per pair: the placement is printed with the row).
#[inline(never)]
#[link_section = ".text.nu_bench"]
fn fill_calls(queue: &mut Queue, pairs: u32, src: u64, dst: u64, len: DescLen) -> Result {
    let step = u64::from(len.bytes());
    for i in 0..u64::from(pairs) {
        prepare_call(queue, src + i * step, dst + i * step, len, Barrier::None)?;
    }
    Ok(())
}

/// Fills `pairs` pairs with the driver's builder inlined in the loop, pair `i` copying `len`
/// bytes from `src + i * len` to `dst + i * len`: the loop the C side's `inlined` fill runs, in
/// a function of its own as that one is (so that neither loop's code placement depends on the
/// test around it).
#[inline(never)]
#[link_section = ".text.nu_bench"]
fn fill_inlined(queue: &mut Queue, pairs: u32, src: u64, dst: u64, len: DescLen) -> Result {
    let step = u64::from(len.bytes());
    for i in 0..u64::from(pairs) {
        queue.prepare_one(&Copy {
            src: src + i * step,
            dst: dst + i * step,
            len,
            barrier: Barrier::None,
        })?;
    }
    Ok(())
}

/// Nanoseconds per round of each side of the pair-build rows.
#[derive(Default)]
struct Times {
    rust_call: [u64; ROUNDS as usize],
    c_call: [u64; ROUNDS as usize],
    rust_inline: [u64; ROUNDS as usize],
    c_inline: [u64; ROUNDS as usize],
    floor: [u64; ROUNDS as usize],
}

/// The median, least and greatest of per-round ratios `a[i] / b[i]`, in thousandths.
struct Spread {
    median: u64,
    min: u64,
    max: u64,
}

impl Spread {
    fn of(a: &[u64; ROUNDS as usize], b: &[u64; ROUNDS as usize]) -> Self {
        let mut r = [0u64; ROUNDS as usize];
        let mut max = 0;
        for (x, (a, b)) in r.iter_mut().zip(a.iter().zip(b.iter())) {
            let b = (*b).max(1);
            *x = a.saturating_mul(1000) / b;
            // Rounded up: a round just over a bound is not judged as meeting it.
            max = max.max(a.saturating_mul(1000).div_ceil(b));
        }
        r.sort_unstable();
        // PANIC: ROUNDS > 0 entries.
        let (lo, hi) = (r[(r.len() - 1) / 2], r[r.len() / 2]);
        Self {
            median: lo / 2 + hi / 2 + (lo % 2 + hi % 2) / 2,
            min: r[0],
            max,
        }
    }
}

#[kunit_tests(neuron_udma_bench)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_pair_build() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let (eng, _) = dev.arch.h2t[0];
        let q = dev.queue_init_at(eng, BENCH_QUEUE, RING_DESCS, RING_DESCS, Owner::Driver)?;
        let mut mmio = KVec::<u64>::with_capacity(MMIO_WRITES, GFP_KERNEL)?;
        let src0 = dev.arch.host_addr(0x1000_0000);
        let dst0 = dev.arch.host_addr(0x2000_0000);
        let r = q.with(|queue, io| {
            let len = DescLen::new(COPY_LEN)?;
            // Per round: the driver's builder and the C sequence, a call per pair and inlined,
            // each pair of sides timed back to back in alternating order, and the floor.
            let mut t = Times::default();
            let mut pairs = 0u64;
            let mut same = true;
            for round in 0..ROUNDS as usize {
                queue.hw_init(io);
                let n = queue.available_pairs();
                pairs += u64::from(n);
                let c_first = round % 2 == 1;
                for inlined in [false, true] {
                    for c_side in [c_first, !c_first] {
                        let ns = if c_side {
                            let rings = queue.rings();
                            let t0 = Instant::<Monotonic>::now();
                            ref_fill(rings, n, src0, dst0, COPY_LEN, inlined)?;
                            ns_since(t0)
                        } else {
                            // Not timed: back to empty rings (also reprograms the queue
                            // registers).
                            queue.hw_init(io);
                            let t0 = Instant::<Monotonic>::now();
                            if inlined {
                                fill_inlined(queue, n, src0, dst0, len)?;
                            } else {
                                fill_calls(queue, n, src0, dst0, len)?;
                            }
                            ns_since(t0)
                        };
                        let slot = match (inlined, c_side) {
                            (false, false) => &mut t.rust_call,
                            (false, true) => &mut t.c_call,
                            (true, false) => &mut t.rust_inline,
                            (true, true) => &mut t.c_inline,
                        };
                        slot[round] = ns;
                    }
                }
                // On the rounds where the driver's builder wrote last (the C sequence went
                // first), its bytes must be the C sequence's: compared with a fresh C fill.
                let (tx_ring, rx_ring) = queue.rings();
                if c_first {
                    let probe = [0, n as usize / 2, n as usize - 1];
                    let mut before = [[0u64; 2]; 6];
                    for (k, &i) in probe.iter().enumerate() {
                        before[2 * k] = slot_words(tx_ring, i);
                        before[2 * k + 1] = slot_words(rx_ring, i);
                    }
                    ref_fill((tx_ring, rx_ring), n, src0, dst0, COPY_LEN, false)?;
                    for (k, &i) in probe.iter().enumerate() {
                        same &= before[2 * k] == slot_words(tx_ring, i)
                            && before[2 * k + 1] == slot_words(rx_ring, i);
                    }
                }

                // The floor: the same slots, 2 x 16 bytes per pair, plain stores.
                let tx = tx_ring.memory().as_mut_ptr().cast::<u64>();
                let rx = rx_ring.memory().as_mut_ptr().cast::<u64>();
                let t0 = Instant::<Monotonic>::now();
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
                t.floor[round] = ns_since(t0);
            }
            queue.hw_init(io);

            // One doorbell-sized BAR0 write: the queue's M2S rate-limit mask, rewritten with
            // the value `hw_init` programmed (no effect on the engine). Each is one 32-bit MMIO
            // write, as a doorbell is; under QEMU a vfio-user message to the model.
            let reg = || regs::M2S_Q_RLIMIT_MASK::try_at(BENCH_QUEUE as usize).ok_or(EINVAL);
            let val = regs::M2S_Q_RLIMIT_MASK::zeroed().with_const_mask::<3>();
            for _ in 0..MMIO_WRITES {
                let t = Instant::<Monotonic>::now();
                io.write(reg()?, val);
                mmio.push_within_capacity(ns_since(t)).map_err(|_| ENOMEM)?;
                udelay(MMIO_GAP);
            }
            Ok((t, pairs, same))
        });
        dev.queue_release(q.owner, q.id)?;
        let (t, pairs, same) = r?;
        let sum = |v: &[u64; ROUNDS as usize]| v.iter().sum::<u64>();
        let (prep_ns, ref_ns, floor_ns) = (sum(&t.rust_call), sum(&t.c_call), sum(&t.floor));
        mmio.sort_unstable();
        // PANIC: `mmio` holds MMIO_WRITES > 0 entries (pushed above, or `r` was an error).
        let mmio_p50 = mmio[mmio.len() / 2];
        let mmio_sum: u64 = mmio.iter().sum();
        assert!(pairs >= 1_000_000);
        let how = |what: &str| {
            CString::try_from_fmt(fmt!(
                "{} pairs ({} rounds filling a {}-slot ring, {}-byte copies, no doorbell, hw_init \
                 between rounds not timed); {}",
                pairs,
                ROUNDS,
                RING_DESCS,
                COPY_LEN,
                what
            ))
        };
        pr_info!(
            "NU-BENCH {{\"name\":\"prepare_one (in kernel)\",\"value\":{},\"unit\":\"ns/pair\",\
             \"baseline\":{},\"ratio\":{},\"how\":\"{}\"}}\n",
            Fixed3(prep_ns, pairs),
            Fixed3(floor_ns, pairs),
            Fixed3(prep_ns, floor_ns),
            how("baseline: 2 x 16-byte plain stores per pair into the same coherent ring slots")?
                .to_str()?,
        );
        pr_info!(
            "NU-BENCH {{\"name\":\"C reference pair sequence (in kernel)\",\"value\":{},\
             \"unit\":\"ns/pair\",\"baseline\":{},\"ratio\":{},\"how\":\"{}\"}}\n",
            Fixed3(ref_ns, pairs),
            Fixed3(floor_ns, pairs),
            Fixed3(ref_ns, floor_ns),
            how(if same {
                "tests/bench/kernel/bench_ref.c (both rings' free-space check, Rx then Tx slot, ring ids, \
                 descriptors built in a zeroed stack union and copied into the slots, one \
                 non-inlined call per pair) over the same slots right after prepare_one, wrote \
                 the same bytes; baseline: the plain-store floor"
            } else {
                "tests/bench/kernel/bench_ref.c over the same slots right after prepare_one: WROTE OTHER \
                 BYTES than prepare_one; baseline: the plain-store floor"
            })?
            .to_str()?,
        );
        // Where the timed Rust functions start in their 4 KiB pages (the C ones are placed by
        // the same linker, in bench_ref.c's section, one after the other).
        type Fill = fn(&mut Queue, u32, u64, u64, DescLen) -> Result;
        type Build = fn(&mut Queue, u64, u64, DescLen, Barrier) -> Result;
        let (calls, call, inline): (Fill, Build, Fill) = (fill_calls, prepare_call, fill_inlined);
        let (calls, call, inline) = (calls as usize, call as usize, inline as usize);
        let at = |f: usize| f & 0xfff;
        let same_page = calls >> 12 == call >> 12;
        let placement = CString::try_from_fmt(fmt!(
            "fill_calls at page offset {:#x}, prepare_call {} page ({:#x}), fill_inlined at {:#x}",
            at(calls),
            if same_page {
                "on the same"
            } else {
                "on another"
            },
            at(call),
            at(inline),
        ))?;
        for (inlined, rust, c) in [
            (false, &t.rust_call, &t.c_call),
            (true, &t.rust_inline, &t.c_inline),
        ] {
            let r = Spread::of(rust, c);
            pr_info!(
                "NU-BENCH {{\"name\":\"prepare_one vs C reference, {} (in kernel)\",\
                 \"value\":{},\"unit\":\"ns/pair\",\"baseline\":{},\"ratio\":{},\"min\":{},\
                 \"max\":{},\"reps\":{},\"how\":\"{}\"}}\n",
                if inlined {
                    "inlined"
                } else {
                    "a call per pair"
                },
                Fixed3(sum(rust), pairs),
                Fixed3(sum(c), pairs),
                Fixed3(r.median, 1000),
                Fixed3(r.min, 1000),
                Fixed3(r.max, 1000),
                ROUNDS,
                how(CString::try_from_fmt(fmt!(
                    "{}, timed back to back in each round (alternating which goes first) on the \
                     same ring memory; ratio: the median of the rounds' ratios (min and max \
                     beside it); baseline: the C sequence; code placement (TCG chains a jump only \
                     within a 4 KiB page, so a loop or call across pages costs a lookup per \
                     pair): {}",
                    if inlined {
                        "the driver's prepare_one inlined in its fill loop (fill_inlined) against \
                         the C sequence's builder inlined in its loop"
                    } else {
                        "a non-inlined call per pair on both sides, each loop in a function of its \
                         own (fill_calls calling prepare_call, the driver's prepare_one behind \
                         one call with the copy's fields as arguments; the C fill calling \
                         nu_ref_prepare_one)"
                    },
                    placement.to_str()?
                ))?
                .to_str()?)?
                .to_str()?,
            );
        }
        pr_info!(
            "NU-BENCH {{\"name\":\"BAR0 doorbell-sized write (in kernel)\",\"value\":{},\
             \"unit\":\"ns/write\",\"baseline\":{},\"ratio\":{},\"how\":\"p50 of {} writes \
             timed one by one, 200 us apart (mean {} ns), of the bench queue's M2S rate-limit \
             mask with its programmed value (one 32-bit MMIO write each, like a doorbell; a \
             vfio-user message to the model under QEMU); baseline: prepare_one ns/pair above\"}}\n",
            mmio_p50,
            Fixed3(prep_ns, pairs),
            Fixed3(mmio_p50 * pairs, prep_ns),
            MMIO_WRITES,
            // CAST: MMIO_WRITES is a small constant.
            Fixed3(mmio_sum, MMIO_WRITES as u64),
        );
        // The C reference sequence must have written the same bytes as prepare_one.
        assert!(same);

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

/// The scrub of device memory: its own suite, so that the `kernel` profile of `make bench` (the
/// pair-build suite run again through debugfs) does not include it.
#[kunit_tests(neuron_udma_bench_scrub)]
mod scrub_tests {
    use super::*;

    #[test]
    fn scrub_one_engine_vs_all() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let h2t = dev.h2t()?;
        let (chan, zeros, engines) = h2t.scrub_parts();
        let zeros = zeros.ok_or(ENODEV)?;
        // SCRUB_SIZE, or half the device memory of a smaller device (a whole number of stripes).
        let size = SCRUB_SIZE
            .min(dev.pool.dram_capacity() / 2 / STRIPE_BYTES * STRIPE_BYTES)
            .max(STRIPE_BYTES);
        let addr = dev.pool.alloc_dram(size)?;
        // The shared queue's own submission loop over the whole range, as `H2t::scrub` runs a
        // range below STRIPE_BYTES; a timeout resets the queue, so nothing stays in flight.
        let policy = Policy {
            signals: WaitMode::Uninterruptible,
            timeout: DEFAULT_TIMEOUT,
            on_timeout: OnTimeout::Reset,
        };
        let job = Job {
            src: Span::Repeat(zeros),
            dst: Span::Linear(addr),
            size,
        };
        let (mut one, mut all) = (u64::MAX, u64::MAX);
        for _ in 0..SCRUB_REPS {
            let t = Instant::<Monotonic>::now();
            match chan.transfer(job, &policy) {
                Finish::Done => {}
                Finish::Failed(e) => {
                    dev.pool.free_dram(addr);
                    return Err(e);
                }
                // Still in flight: the range stays allocated (until unbind) rather than reused.
                Finish::InFlight { err, .. } => return Err(err),
            }
            one = one.min(ns_since(t));
            // The production path (MEM_ALLOC's scrub): every H2T engine at once. On error the
            // range is no longer ours (given back, or held until its parts settled).
            let t = Instant::<Monotonic>::now();
            h2t.scrub(&dev.pool, addr, size)?;
            all = all.min(ns_since(t));
        }
        dev.pool.free_dram(addr);
        let rate = |ns: u64| size * 1_000_000_000 / ns.max(1);
        pr_info!(
            "NU-BENCH {{\"name\":\"scrub {}M: all H2T engines vs 1 (in kernel)\",\"value\":{},\
             \"unit\":\"B/s\",\"baseline\":{},\"ratio\":{},\"how\":\"zeroing {} MiB of device \
             memory, fastest of {} runs each, alternating: H2t::scrub (the MEM_ALLOC path, striped \
             as MEMCPY and MEMSET are by H2t::run: a range of 4 MiB or more is cut into one part per H2T engine, {} \
             engines here, run at once by Channel::transfer_split) {} us; baseline: Channel::transfer of the whole range on the \
             driver's shared H2T queue alone (one engine, the zeroed 64 KiB block repeated) {} us; \
             the ideal ratio is the engine count\",\"engines\":{}}}\n",
            size >> 20,
            rate(all),
            rate(one),
            Fixed3(one, all),
            size >> 20,
            SCRUB_REPS,
            engines,
            all / 1000,
            one / 1000,
            engines,
        );
        Ok(())
    }
}
