// SPDX-License-Identifier: GPL-2.0

//! KUnit suite that runs copies on the bound device (the device model in QEMU): host->host and
//! host->HBM->host round trips, many wraps of a small ring, two queues in parallel. Its child
//! `reset` is the suite of the device across a reset.

mod reset;

use crate::{
    channel::{Channel, Owner, DEFAULT_TIMEOUT},
    completion::Member,
    desc::{Barrier, DescLen},
    device::UdmaDevice,
    dmaengine::DmaChan,
    pattern::PATTERN_BYTES,
    queue::Copy,
    Registry,
};
use kernel::{
    dma::Coherent,
    new_mutex,
    prelude::*,
    sync::{Arc, ArcBorrow, Completion},
    time::{
        hrtimer::{
            HrTimer, HrTimerCallback, HrTimerCallbackContext, HrTimerPointer, HrTimerRestart,
            RelativeSoftMode,
        },
        Delta, Monotonic,
    },
};

/// Sizes copied by the round-trip tests (bytes).
const SIZES: [u64; 6] = [1, 3, 4096, 65535, 65536, (1 << 20) + 7];

fn device() -> Result<Arc<UdmaDevice>> {
    Registry::first().ok_or(ENODEV)
}

/// A deterministic byte pattern, different per `seed`.
fn pattern(i: usize, seed: u8) -> u8 {
    // CAST: keeping the low byte is the point.
    ((i * 131 + (i >> 8) * 7) as u8) ^ seed
}

fn fill(buf: &Coherent<[u8]>, seed: u8) {
    // SAFETY: no DMA to or from `buf` is in flight: each test waits for its copies.
    let b = unsafe { buf.as_mut() };
    for (i, x) in b.iter_mut().enumerate() {
        *x = pattern(i, seed);
    }
}

fn clear(buf: &Coherent<[u8]>) {
    // SAFETY: as in `fill`.
    unsafe { buf.as_mut() }.fill(0);
}

/// Whether `dst[doff..doff + len]` equals the pattern of `src` at `soff`, and the bytes just
/// around the destination range are untouched (zero).
fn copied(dst: &Coherent<[u8]>, doff: usize, soff: usize, len: usize, seed: u8) -> bool {
    // SAFETY: as in `fill`.
    let d = unsafe { dst.as_ref() };
    let inside = (0..len).all(|i| d[doff + i] == pattern(soff + i, seed));
    let before = doff == 0 || d[doff - 1] == 0;
    let after = doff + len >= d.len() || d[doff + len] == 0;
    inside && before && after
}

/// Reads `read` every millisecond until `done` holds for its value (at most 5 s); returns
/// that value.
fn poll_until<T>(read: impl FnMut() -> Result<T>, done: impl FnMut(&T) -> bool) -> Result<T> {
    kernel::io::poll::read_poll_timeout(
        read,
        done,
        kernel::time::Delta::from_millis(1),
        kernel::time::Delta::from_secs(5),
    )
}

/// Waits (at most 5 s) for the engine of `q` to abort; returns its error registers.
fn engine_aborted(q: &Channel) -> Result<crate::engine::EngineErrors> {
    poll_until(
        || q.with(|_, io| Ok(crate::engine::engine_errors(io))),
        |e| e.aborted(),
    )
}

/// Waits (at most 5 s) until `done` holds for the queue of `q` (looked at under its lock).
fn queue_until(q: &Channel, mut done: impl FnMut(&mut crate::queue::Queue) -> bool) -> Result {
    poll_until(|| q.with(|queue, _| Ok(done(queue))), |&d| d).map(|_| ())
}

/// The number of resets of `q` so far.
fn resets(q: &Channel) -> Result<u32> {
    q.with(|queue, _| Ok(queue.resets))
}

/// A driver-owned test queue on the H2T engine (queues 2 and 3 are free on both generations).
fn test_queue(dev: &UdmaDevice, qid: u32, descs: u32) -> Result<Arc<Channel>> {
    dev.queue_init_at(dev.arch.h2t[0].0, qid, descs, descs, Owner::Driver)
}

/// A driver-owned test queue and two coherent buffers of `bytes` bytes (`src` filled with the
/// pattern of `seed`, `dst` zeroed) at device-fabric addresses `s` and `d`; the queue is
/// released on drop, before the buffers are freed.
struct Fixture {
    dev: Arc<UdmaDevice>,
    q: Arc<Channel>,
    /// The source buffer (kept alive for the copies).
    _src: Coherent<[u8]>,
    dst: Coherent<[u8]>,
    s: u64,
    d: u64,
    /// The seed of the source's pattern.
    seed: u8,
}

impl Fixture {
    fn new(qid: u32, descs: u32, bytes: usize, seed: u8) -> Result<Self> {
        let dev = device()?;
        let src = dev.alloc_coherent(bytes)?;
        let dst = dev.alloc_coherent(bytes)?;
        let (s, d) = (
            dev.arch.host_addr(src.dma_address()),
            dev.arch.host_addr(dst.dma_address()),
        );
        fill(&src, seed);
        let q = test_queue(&dev, qid, descs)?;
        Ok(Self {
            dev,
            q,
            _src: src,
            dst,
            s,
            d,
            seed,
        })
    }
}

impl Fixture {
    /// Clears the destination, copies the first `len` bytes of the source to it with `copy`
    /// (called with the source's and destination's addresses and `len`), and answers whether
    /// the destination then holds them ([`copied`]).
    fn recopy(&self, len: u64, copy: impl FnOnce(u64, u64, u64) -> Result) -> Result<bool> {
        clear(&self.dst);
        copy(self.s, self.d, len)?;
        // CAST: small test values.
        Ok(copied(&self.dst, 0, 0, len as usize, self.seed))
    }

    /// Prepares one 4 KiB copy at `off` bytes into both buffers (write barrier) and a fence
    /// after it; returns the fence.
    fn fenced_copy(&self, off: u64) -> Result<u64> {
        self.fenced_copy_on(&self.q, off)
    }

    /// [`Self::fenced_copy`] on queue `q` (another instance of the fixture's queue id).
    fn fenced_copy_on(&self, q: &Channel, off: u64) -> Result<u64> {
        let copy = Copy {
            src: self.s + off,
            dst: self.d + off,
            len: DescLen::new(4096)?,
            barrier: Barrier::Write,
        };
        q.with(|queue, io| {
            queue.prepare_one(&copy)?;
            queue.fence(io)
        })
    }

    /// Makes the model fail the queue's next Tx descriptor (the engine aborts on it).
    fn fail_next_tx(&self) -> Result {
        self.dev.model.as_ref().ok_or(ENODEV)?.inject_fail_nth(
            self.q.id.eng.get(),
            self.q.id.q.number(),
            1,
        )
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.dev.queue_release(self.q.owner, self.q.id);
    }
}

/// A one-shot timer in softirq context that takes a dmaengine channel's state lock once
/// (`dmaengine_state_lock_in_interrupt`).
#[pin_data]
struct InInterrupt {
    #[pin]
    timer: HrTimer<Self>,
    chan: Arc<DmaChan>,
    #[pin]
    done: Completion,
}

impl HrTimerCallback for InInterrupt {
    type Pointer<'a> = Arc<Self>;

    fn run(this: ArcBorrow<'_, Self>, _ctx: HrTimerCallbackContext<'_, Self>) -> HrTimerRestart {
        // An idle channel: the look takes the state lock and returns.
        let _ = this.chan.look(false);
        this.done.complete_all();
        HrTimerRestart::NoRestart
    }
}

kernel::impl_has_hr_timer! {
    impl HasHrTimer<Self> for InInterrupt {
        mode: RelativeSoftMode<Monotonic>, field: self.timer
    }
}

#[kunit_tests(neuron_udma_live)]
mod tests {
    use super::*;
    use crate::{
        desc::{Desc, Dir},
        engine::EngineIo,
        holds::Holds,
        queue::Queue,
    };

    /// Copies each of [`SIZES`] between two host buffers at odd offsets with `copy(src, dst,
    /// size, n)` (device-fabric addresses, bytes, the size's index) and checks the bytes and
    /// their surroundings.
    fn round_trips(seed0: u8, copy: impl Fn(u64, u64, u64, usize) -> Result) -> Result {
        let dev = device()?;
        let src = dev.alloc_coherent((2 << 20) + 64)?;
        let dst = dev.alloc_coherent((2 << 20) + 64)?;
        for (n, &size) in SIZES.iter().enumerate() {
            // CAST: small test values.
            let seed = seed0 + n as u8;
            fill(&src, seed);
            clear(&dst);
            let (soff, doff) = (3 + n, 17 + 2 * n);
            copy(
                dev.arch.host_addr(src.dma_address()) + soff as u64,
                dev.arch.host_addr(dst.dma_address()) + doff as u64,
                size,
                n,
            )?;
            assert!(copied(&dst, doff, soff, size as usize, seed));
        }
        Ok(())
    }

    #[test]
    fn host_to_host_round_trips() -> Result {
        let dev = device()?;
        round_trips(0, |s, d, size, _| dev.memcpy(s, d, size, DEFAULT_TIMEOUT))
    }

    #[test]
    fn host_to_hbm_to_host() -> Result {
        let dev = device()?;
        assert!(dev.dram_size >= 4 << 20);
        round_trips(0x40, |s, d, size, n| {
            let hbm = 0x10_0000 + 5 * n as u64;
            dev.memcpy(s, hbm, size, DEFAULT_TIMEOUT)?;
            dev.memcpy(hbm, d, size, DEFAULT_TIMEOUT)
        })
    }

    /// Fill blocks: one per value however many users, kept while used, the unused ones beyond
    /// the idle allowance freed by the next new value; a fill through the shared queue writes the
    /// value and nothing around it.
    #[test]
    fn fill_blocks_are_shared_and_trimmed() -> Result {
        let dev = device()?;
        let base = dev.patterns.blocks();
        let a = dev.patterns.get(0xA5)?;
        let b = dev.patterns.get(0xA5)?;
        assert_eq!(a.addr(), b.addr());
        assert_eq!(dev.patterns.blocks(), base + 1);
        let dst = dev.alloc_coherent(3 * PATTERN_BYTES)?;
        clear(&dst);
        let at = dev.arch.host_addr(dst.dma_address()) + 7;
        let len = 2 * PATTERN_BYTES as u64 + 100;
        dev.fill(a.addr(), at, len, DEFAULT_TIMEOUT)?;
        // SAFETY: the fill is complete; nothing else writes `dst`.
        let bytes = unsafe { dst.as_ref() };
        assert_eq!(bytes[6], 0);
        assert!(bytes[7..7 + len as usize].iter().all(|&x| x == 0xA5));
        assert_eq!(bytes[7 + len as usize], 0);
        // Twenty more values, each dropped at once: the unused blocks stay few.
        for v in 1..=20u8 {
            drop(dev.patterns.get(v)?);
        }
        assert!(dev.patterns.blocks() <= base + 1 + 5 + 1);
        // Still in use: still there (the same address).
        assert_eq!(dev.patterns.get(0xA5)?.addr(), a.addr());
        Ok(())
    }

    #[test]
    fn ten_thousand_copies_through_a_32_slot_ring() -> Result {
        let dev = device()?;
        let q = test_queue(&dev, 2, 32)?;
        const COPIES: usize = 10_000;
        const CHUNK: usize = 8;
        let src = dev.alloc_coherent(COPIES * CHUNK)?;
        let dst = dev.alloc_coherent(COPIES * CHUNK)?;
        fill(&src, 0x77);
        let (s, d) = (
            dev.arch.host_addr(src.dma_address()),
            dev.arch.host_addr(dst.dma_address()),
        );
        let mut done = 0;
        let mut submissions = 0;
        let result = (|| -> Result {
            while done < COPIES {
                let seq = q.with(|queue, io| {
                    // Leave one pair for the marker.
                    while done < COPIES && queue.available_pairs() > 1 {
                        let off = (done * CHUNK) as u64;
                        queue.prepare_one(&Copy {
                            src: s + off,
                            dst: d + off,
                            len: DescLen::new(CHUNK as u32)?,
                            barrier: Barrier::None,
                        })?;
                        done += 1;
                    }
                    queue.fence(io)
                })?;
                q.wait_fence(seq, DEFAULT_TIMEOUT)?;
                submissions += 1;
            }
            Ok(())
        })();
        let (next, ack) =
            q.with(|queue, _| Ok((queue.tx_state().next_index(), queue.tx_state().ack_index())))?;
        dev.queue_release(q.owner, q.id)?;
        result?;
        // 15 data pairs + 1 marker per submission on a 32-slot ring: many wraps.
        assert!(submissions >= COPIES / 15);
        assert_eq!(next, ack);
        assert!(copied(&dst, 0, 0, COPIES * CHUNK, 0x77));
        Ok(())
    }

    /// One look at the Tx ring of `cell`: whether it has descriptors in flight (written and
    /// doorbelled, not yet retired by a completed fence: the queue state's `sw_next != sw_ack`
    /// with nothing pending), its ack index, and whether the engine itself still has some
    /// (hardware head behind the tail). Two register reads only, to keep samples short.
    fn tx_look(cell: &Channel) -> Result<(bool, u32, bool)> {
        use crate::regs::{M2s, Q_DRHP, Q_DRTP};
        use kernel::io::{register::WithBase, Io};
        let q = cell.id.q.get();
        cell.with(|queue, io| {
            let head = io
                .read(Q_DRHP::of::<M2s>().try_at(q).ok_or(EINVAL)?)
                .into_raw();
            let tail = io
                .read(Q_DRTP::of::<M2s>().try_at(q).ok_or(EINVAL)?)
                .into_raw();
            let tx = queue.tx_state();
            let started = tx.outstanding() > queue.pending().0;
            Ok((started, tx.ack_index(), head != tail))
        })
    }

    #[test]
    fn two_queues_in_parallel() -> Result {
        let dev = device()?;
        // Queue 2 of the first and the last H2T engine (v2: 32, 33; v3: 128, 131): two engines,
        // so the model runs them at once.
        let qa = test_queue(&dev, 2, 256)?;
        let last = dev.arch.h2t.last().ok_or(EINVAL)?.0;
        let qb = dev.queue_init_at(last, 2, 256, 256, Owner::Driver)?;
        const LEN: usize = 3 << 20;
        let bufs = [
            dev.alloc_coherent(LEN)?,
            dev.alloc_coherent(LEN)?,
            dev.alloc_coherent(LEN)?,
            dev.alloc_coherent(LEN)?,
        ];
        fill(&bufs[0], 0x11);
        fill(&bufs[2], 0x22);
        let (a_src, a_dst) = (
            dev.arch.host_addr(bufs[0].dma_address()),
            dev.arch.host_addr(bufs[1].dma_address()),
        );
        let (b_src, b_dst) = (
            dev.arch.host_addr(bufs[2].dma_address()),
            dev.arch.host_addr(bufs[3].dma_address()),
        );

        // Both queues copy from their own worker, over and over until this thread, which
        // watches the two queues' registers, has seen enough (bounded: 1000 rounds each).
        let stop = Arc::pin_init(new_mutex!(false), GFP_KERNEL)?;
        let mut workers = KVec::new();
        for (q, src, dst) in [(&qa, a_src, a_dst), (&qb, b_src, b_dst)] {
            let done = Arc::pin_init(Completion::new(), GFP_KERNEL)?;
            let result = Arc::pin_init(new_mutex!(Err(EINPROGRESS)), GFP_KERNEL)?;
            {
                let (q, done, result, stop) =
                    (q.clone(), done.clone(), result.clone(), stop.clone());
                crate::kfac::sched::system_dfl().try_spawn(GFP_KERNEL, move || {
                    let mut r = Ok(());
                    for _ in 0..1000 {
                        r = q.memcpy(src, dst, LEN as u64, DEFAULT_TIMEOUT);
                        if r.is_err() || *stop.lock() {
                            break;
                        }
                    }
                    *result.lock() = r;
                    done.complete_all();
                })?;
            }
            workers.push((done, result), GFP_KERNEL)?;
        }
        // Both in flight at one instant: A has started, unretired descriptors before and after
        // B is seen with some, and A's ack index did not move in between, so A's work was in
        // flight all along. The engines' own overlap (hardware head behind the tail on both)
        // is counted too, for the log: the model copies so fast that it is rarely seen.
        let running = |i: usize| -> bool {
            let r = workers[i].1.lock();
            *r == Err(EINPROGRESS)
        };
        let (mut overlaps, mut hw_overlaps, mut samples) = (0u32, 0u32, 0u32);
        let watched = (|| -> Result {
            while running(0) && running(1) && overlaps < 20 && samples < 5000 {
                let (a1, ack1, ha1) = tx_look(&qa)?;
                let (b, _, hb) = tx_look(&qb)?;
                let (a2, ack2, ha2) = tx_look(&qa)?;
                samples += 1;
                if a1 && b && a2 && ack1 == ack2 {
                    overlaps += 1;
                    hw_overlaps += u32::from(ha1 && hb && ha2);
                }
            }
            Ok(())
        })();
        *stop.lock() = true;
        for (done, _) in workers.iter() {
            done.wait_for_completion();
        }
        let ra: Result = *workers[0].1.lock();
        let rb: Result = *workers[1].1.lock();
        dev.queue_release(qa.owner, qa.id)?;
        dev.queue_release(qb.owner, qb.id)?;
        watched?;
        ra?;
        rb?;
        assert!(copied(&bufs[1], 0, 0, LEN, 0x11));
        assert!(copied(&bufs[3], 0, 0, LEN, 0x22));
        kernel::pr_info!(
            "two_queues_in_parallel: both in flight in {overlaps} of {samples} samples (both engines busy in {hw_overlaps})\n"
        );
        assert!(overlaps > 0);
        Ok(())
    }

    #[test]
    fn queue_errors_change_nothing() -> Result {
        let dev = device()?;
        let q = test_queue(&dev, 2, 32)?;
        let r = q.with(|queue, io| {
            // The software view of both rings and the pending counts, plus the hardware tails
            // (a doorbell moves them).
            let snap = |queue: &Queue, io: EngineIo<'_>| -> Result<_> {
                let tx = crate::engine::queue_regs::<crate::regs::M2s>(io, queue.q());
                let rx = crate::engine::queue_regs::<crate::regs::S2m>(io, queue.q());
                Ok((
                    *queue.tx_state(),
                    *queue.rx_state(),
                    queue.pending(),
                    tx.tail,
                    rx.tail,
                ))
            };
            let before = snap(queue, io)?;
            // 16 pairs fill the 16 free slots; the 17th pair does not fit.
            let c = Copy {
                src: 0,
                dst: 0,
                len: DescLen::new(4)?,
                barrier: Barrier::None,
            };
            assert_eq!(queue.start(io, 0, 1), Err(EINVAL));
            assert!(snap(queue, io)? == before);
            for _ in 0..16 {
                queue.prepare_one(&c)?;
            }
            let full = snap(queue, io)?;
            assert!(before.0 != full.0);
            assert_eq!(queue.prepare_one(&c), Err(ENOSPC));
            assert!(snap(queue, io)? == full);
            assert_eq!(queue.start(io, 17, 16), Err(EINVAL));
            assert!(snap(queue, io)? == full);
            assert_eq!(queue.start(io, 0, 0), Err(EINVAL));
            assert!(snap(queue, io)? == full);
            Ok(())
        });
        dev.queue_release(q.owner, q.id)?;
        r
    }

    #[test]
    fn injected_fault_then_recovery() -> Result {
        let f = Fixture::new(2, 64, 8192, 0x5a)?;
        let (dev, q, dst, s, d) = (&f.dev, &f.q, &f.dst, f.s, f.d);
        // The model fails the next Tx descriptor with a bad address: the engine aborts.
        f.fail_next_tx()?;
        assert_eq!(q.memcpy(s, d, 4096, DEFAULT_TIMEOUT), Err(EIO));
        assert_eq!(resets(q)?, 1);
        // The queue (and the engine's other queues) work again.
        q.memcpy(s, d, 8192, DEFAULT_TIMEOUT)?;
        assert!(copied(dst, 0, 0, 8192, 0x5a));
        assert!(f.recopy(8192, |s, d, n| dev.memcpy(s, d, n, DEFAULT_TIMEOUT))?);
        Ok(())
    }

    #[test]
    fn hand_built_pair_then_wrong_ring_id_aborts() -> Result {
        let f = Fixture::new(3, 32, 8192, 0x3c)?;
        let (q, dst, s, d) = (&f.q, &f.dst, f.s, f.d);
        // A pair written slot by slot with the descriptor builders, doorbells by hand: the
        // engine copies the bytes.
        let seq = q.with(|queue, io| {
            queue.prepare_one(&Copy {
                src: s,
                dst: d,
                len: DescLen::new(4096)?,
                barrier: Barrier::Write,
            })?;
            queue.start(io, 1, 1)?;
            queue.fence(io)
        })?;
        q.wait_fence(seq, DEFAULT_TIMEOUT)?;
        assert!(copied(dst, 0, 0, 4096, 0x3c));
        // The same with the Tx slot stamped with the wrong ring id (2 instead of 1 on the
        // first pass): the engine must abort with the M2S prefetch ring-id error (bit 17).
        let idx = q.with(|queue, _| Ok(queue.tx_state().next_index()))?;
        q.with(|queue, io| {
            queue.prepare_one(&Copy {
                src: s + 4096,
                dst: d + 4096,
                len: DescLen::new(4096)?,
                barrier: Barrier::None,
            })?;
            let wrong = crate::desc::RingId::INITIAL.next();
            queue.tx_ring_mut().overwrite(
                idx,
                crate::desc::Desc::tx(DescLen::new(4096)?, wrong, Barrier::None, s + 4096),
            )?;
            queue.start(io, 1, 1)
        })?;
        let errors = engine_aborted(q)?;
        assert!(errors.m2s.cause & crate::regs::M2S_RING_ID_ERROR != 0);
        // Nothing of the broken pair was written.
        // SAFETY: the engine stopped; no DMA is in flight.
        assert!(unsafe { dst.as_ref() }[4096..8192].iter().all(|&b| b == 0));
        // Queue reset and engine recovery, then the queue works again.
        q.reset(EIO)?;
        q.memcpy(s, d, 8192, DEFAULT_TIMEOUT)?;
        assert!(copied(dst, 0, 0, 8192, 0x3c));
        Ok(())
    }

    #[test]
    fn pairs_written_ahead_are_the_pushed_pairs_and_nothing_until_published() -> Result {
        let f = Fixture::new(3, 32, 12 * 256, 0x5e)?;
        let (q, dst, s, d) = (&f.q, &f.dst, f.s, f.d);
        // Bring both rings to slot 26 (13 fenced submissions of one pair and its marker), so
        // that 12 pairs cross the wrap.
        for k in 0..13 {
            let seq = q.with(|queue, io| {
                queue.prepare_one(&Copy {
                    src: s,
                    dst: d + 256 * (k % 12),
                    len: DescLen::new(4)?,
                    barrier: Barrier::None,
                })?;
                queue.fence(io)
            })?;
            q.wait_fence(seq, DEFAULT_TIMEOUT)?;
        }
        clear(dst);
        let mut copies = KVec::new();
        for k in 0..12u64 {
            let barrier = [Barrier::None, Barrier::Dmb, Barrier::Write][(k % 3) as usize];
            let c = Copy {
                src: s + 256 * k,
                dst: d + 256 * k,
                len: DescLen::new(256)?,
                barrier,
            };
            copies.push(c, GFP_KERNEL)?;
        }
        // More than the free slots: 16 free pairs (the 16-slot reserve kept), one more.
        let mut more = KVec::new();
        for _ in 0..17 {
            more.push(copies[0], GFP_KERNEL)?;
        }
        // Under the queue's register access (an RCU read-side section): nothing allocates.
        let seq = q.with(|queue, io| {
            queue.retire();
            let (tx0, rx0) = (*queue.tx_state(), *queue.rx_state());
            assert_eq!((tx0.next_index(), rx0.next_index()), (26, 26));
            let first = tx0.ring_id();
            // Slots 26.. hold the copies' pairs, with the ring id of their pass.
            let slots_hold_the_copies = |queue: &Queue| -> Result {
                let (tx, rx) = (queue.ring(Dir::Tx), queue.ring(Dir::Rx));
                for (k, c) in (0u32..).zip(copies.iter()) {
                    let slot = (26 + k) % 32;
                    let id = if slot >= 26 { first } else { first.next() };
                    assert!(tx.read(slot)? == Desc::tx(c.len, id, c.barrier, c.src));
                    assert!(rx.read(slot)? == Desc::rx(c.len, id, false, c.dst));
                }
                Ok(())
            };
            // Written ahead and dropped: the slots hold the pairs, the queue does not.
            let mut ahead = queue.ahead();
            assert_eq!(ahead.write_while(&copies, |c| Ok(Some(*c)))?, 12);
            assert!((*queue.tx_state(), *queue.rx_state()) == (tx0, rx0));
            assert_eq!(queue.pending(), (0, 0));
            slots_hold_the_copies(queue)?;
            // A pair past the room: ENOSPC, after the pairs before it.
            let mut ahead = queue.ahead();
            assert_eq!(ahead.room(), 16);
            assert_eq!(ahead.write_while(&more, |c| Ok(Some(*c))), Err(ENOSPC));
            assert!((*queue.tx_state(), *queue.rx_state()) == (tx0, rx0));
            // What the rings take: their free slots from the next index on, no state of a
            // slot behind it or past them (the ring moved on since, or another ring's).
            let tx = queue.ring(Dir::Tx);
            let (mut far, mut behind) = (tx0, tx0);
            for _ in 0..16 {
                far.take();
            }
            assert!(tx.is_ahead(&far));
            far.take();
            assert!(!tx.is_ahead(&far));
            for _ in 0..31 {
                behind.take();
            }
            assert!(!tx.is_ahead(&behind));
            // Stopped by `pair` after 5, then on from the 6th: 12 written, one pair per copy,
            // published: the queue's pairs, the next index past the wrap with the ring id
            // after it.
            let mut ahead = queue.ahead();
            let mut n = 0;
            let wrote = ahead.write_while(&copies, |c| {
                n += 1;
                Ok((n <= 5).then_some(*c))
            })?;
            assert_eq!(wrote, 5);
            assert_eq!(ahead.write_while(&copies[5..], |c| Ok(Some(*c)))?, 7);
            let w = ahead.done();
            queue.publish(w, Holds::default(), || 0)?;
            assert_eq!(queue.tx_state().next_index(), 6);
            assert!(queue.tx_state().ring_id() == first.next());
            assert!(queue.rx_state().ring_id() == first.next());
            slots_hold_the_copies(queue)?;
            assert_eq!(queue.pending(), (12, 12));
            queue.fence(io)
        })?;
        q.wait_fence(seq, DEFAULT_TIMEOUT)?;
        assert!(copied(dst, 0, 0, 12 * 256, 0x5e));
        Ok(())
    }

    #[test]
    fn reset_fails_exactly_the_dropped_fences() -> Result {
        let f = Fixture::new(2, 64, 8192, 0x42)?;
        let (q, dst) = (&f.q, &f.dst);
        // Fence 1 completes.
        let first = f.fenced_copy(0)?;
        queue_until(q, |queue| queue.is_settled(first))?;
        // Fence 2 fails: the model fails its first Tx descriptor, and the wait resets the
        // queue.
        f.fail_next_tx()?;
        let second = f.fenced_copy(4096)?;
        assert_eq!(q.wait_fence(second, DEFAULT_TIMEOUT), Err(EIO));
        // The reset failed only the fence it dropped, with the engine error: fence 1 is still
        // a success, and its bytes are there.
        assert_eq!(q.state(second), Ok(crate::channel::FenceState::Failed(EIO)));
        assert_eq!(q.wait_fence(first, DEFAULT_TIMEOUT), Ok(()));
        assert_eq!(q.state(first), Ok(crate::channel::FenceState::Done));
        assert!(copied(dst, 0, 0, 4096, 0x42));
        Ok(())
    }

    /// A released queue instance answers every fence question with `ECANCELED`, and the next
    /// instance of the same id, numbered on from where the released one stopped, never takes
    /// a fence of the released one for its own (issue 33: an IOPOLL command was completed by
    /// the new instance's fence of the same number).
    #[test]
    fn released_instance_is_cancelled_and_numbers_go_on() -> Result {
        use crate::channel::FenceState;
        let f = Fixture::new(2, 64, 8192, 0x5d)?;
        let old = f.q.clone();
        let first = f.fenced_copy(0)?;
        assert_eq!(first, 1);
        assert_eq!(old.wait_fence(first, DEFAULT_TIMEOUT), Ok(()));
        // Released: gone for whoever still holds the instance.
        let next = f.dev.queue_release(old.owner, old.id)?;
        assert_eq!(next, first + 1);
        assert_eq!(old.wait_fence(first, DEFAULT_TIMEOUT), Err(ECANCELED));
        assert_eq!(old.state(first), Err(ECANCELED));
        assert_eq!(old.submit_fence(), Err(ECANCELED));
        // The next instance of the id: another instance number, fences from `next` on, and
        // the released instance's fence is not one of its own.
        let q = f
            .dev
            .queue_init_placed(old.id, (64, 64), old.owner, None, false, next)?;
        assert!(q.instance != old.instance);
        assert_eq!(q.state(first), Err(ECANCELED));
        assert_eq!(q.fence_state(first).err(), Some(ECANCELED));
        assert_eq!(q.submit_fence(), Ok(0));
        assert_eq!(q.fence_state(next).err(), Some(EINVAL));
        clear(&f.dst);
        let second = f.fenced_copy_on(&q, 4096)?;
        assert_eq!(second, next);
        assert_eq!(q.wait_fence(second, DEFAULT_TIMEOUT), Ok(()));
        assert_eq!(
            q.fence_state(second),
            Ok((FenceState::Done, second, second))
        );
        assert!(copied(&f.dst, 4096, 4096, 4096, 0x5d));
        // The fixture's drop releases the new instance (by id).
        Ok(())
    }

    /// A wait that finds the engine aborted resets the queue and answers with what the reset
    /// settled: a fence that completed before the reset (its marker arrived after the waiter
    /// last looked) is a success, not `EIO`; the fence the engine failed is `EIO`.
    #[test]
    fn failed_wait_answers_what_the_reset_settled() -> Result {
        let f = Fixture::new(2, 64, 8192, 0x6b)?;
        let (q, dst) = (&f.q, &f.dst);
        let first = f.fenced_copy(0)?;
        // The first fence's marker arrives; nothing retires it (its waiter looked before).
        queue_until(q, |queue| queue.marker_arrived(first))?;
        assert_eq!(q.with(|queue, _| Ok(queue.settled()))?, 0);
        // The model fails the next Tx descriptor: the engine aborts on the second fence.
        f.fail_next_tx()?;
        let second = f.fenced_copy(4096)?;
        let errors = engine_aborted(q)?;
        // The waiter of the first fence looked while it was pending and then saw the abort:
        // the reset retires the first fence (its marker is there) and drops the second.
        assert_eq!(q.with(|queue, _| Ok(queue.settled()))?, 0);
        assert_eq!(q.fail(first, EIO, &errors, DEFAULT_TIMEOUT), Ok(()));
        assert_eq!(q.state(first), Ok(crate::channel::FenceState::Done));
        assert!(copied(dst, 0, 0, 4096, 0x6b));
        assert_eq!(q.state(second), Ok(crate::channel::FenceState::Failed(EIO)));
        assert_eq!(q.wait_fence(second, DEFAULT_TIMEOUT), Err(EIO));
        assert_eq!(resets(q)?, 1);
        // The queue works again.
        assert!(f.recopy(4096, |s, d, n| q.memcpy(s, d, n, DEFAULT_TIMEOUT))?);
        Ok(())
    }

    #[test]
    fn dma_mask_stops_below_the_route() -> Result {
        let dev = device()?;
        // CAST: `device::Device` is a `repr(transparent)` wrapper of `struct device`.
        let raw = core::ptr::from_ref::<kernel::device::Device>(dev.pdev.as_ref())
            .cast::<kernel::bindings::device>();
        // SAFETY: `raw` is the bound PCI device's `struct device`; the PCI core points its
        // `dma_mask` at the device's own mask, which probe set.
        let mask = unsafe { *(*raw).dma_mask };
        // Every DMA address the device can get leaves the host route bit clear.
        assert_eq!(mask, dev.arch.host_route - 1);
        assert_eq!(mask & dev.arch.host_route, 0);
        Ok(())
    }

    #[test]
    fn reserved_and_taken_queues() -> Result {
        let dev = device()?;
        let (eng, qid) = dev.arch.h2t[0];
        // The H2T queue is the driver's: taken for everyone, reserved for files.
        assert!(matches!(dev.queue_init_at(eng, qid, 32, 32, Owner::Driver), Err(e) if e == EBUSY));
        assert!(
            matches!(dev.queue_init_at(eng, qid, 32, 32, Owner::File(1)), Err(e) if e == EBUSY)
        );
        assert!(
            matches!(dev.queue_init_at(eng, 16, 32, 32, Owner::File(1)), Err(e) if e == EINVAL)
        );
        assert!(
            matches!(dev.queue_init_at(dev.arch.engines, 1, 32, 32, Owner::File(1)), Err(e) if e == EINVAL)
        );
        assert!(matches!(dev.queue_init_at(eng, 2, 48, 32, Owner::File(1)), Err(e) if e == EINVAL));
        Ok(())
    }

    /// A queue with its rings in device memory, for each way descriptors reach them (through
    /// BAR4, moved by the H2T queue): HBM->HBM copies over many passes of a 32-slot ring (the
    /// staging ring's written slots wrap, so a doorbell publishes two ranges of it), checked
    /// byte for byte through host memory.
    #[test]
    fn device_rings_both_fills() -> Result {
        use crate::{
            devring::Fill,
            engine::QueueId,
            split::{Cut, Move},
        };
        const LEN: usize = 64 << 10;
        let dev = device()?;
        if !dev.has_device_rings() {
            return Ok(());
        }
        let host = dev.alloc_coherent(LEN)?;
        let back = dev.alloc_coherent(LEN)?;
        let (h, b) = (
            dev.arch.host_addr(host.dma_address()),
            dev.arch.host_addr(back.dma_address()),
        );
        // In the device memory the driver keeps (DRAM_RESERVED), clear of the other tests'.
        let (src, dst) = (0x40_0000, 0x50_0000);
        let id = QueueId::new(dev.arch, dev.arch.h2t[0].0, 4).ok_or(EINVAL)?;
        for (n, how) in [Fill::Bar4, Fill::Engine].into_iter().enumerate() {
            // CAST: small test values.
            let seed = 0x90 + n as u8;
            fill(&host, seed);
            clear(&back);
            dev.memcpy(h, src, LEN as u64, DEFAULT_TIMEOUT)?;
            dev.memcpy(b, dst, LEN as u64, DEFAULT_TIMEOUT)?;
            let q =
                dev.queue_init_filled(id, (32, 32), Owner::File(u64::MAX), None, Some(how), 1)?;
            let r = (|| -> Result {
                // 64 rounds of 3 copies and a marker: 8 passes over the ring.
                for round in 0..64u64 {
                    let at = round * 1024;
                    let mv = |off, bytes| Move {
                        src: src + at + off,
                        dst: dst + at + off,
                        bytes,
                        repeat: false,
                    };
                    let moves = [mv(0, 1), mv(1, 511), mv(512, 512)];
                    let seq = q.submit(&mut Cut::moves(&moves))?.ok_or(ENOSPC)?;
                    q.wait_fence(seq, DEFAULT_TIMEOUT)?;
                }
                Ok(())
            })();
            dev.queue_release(q.owner, q.id)?;
            r?;
            dev.memcpy(dst, b, LEN as u64, DEFAULT_TIMEOUT)?;
            assert!(copied(&back, 0, 0, LEN, seed));
        }
        Ok(())
    }

    /// Where a resident buffer is, or `EINVAL` for an import.
    fn resident_place(r: crate::resident::Resolved) -> Result<crate::resident::Place> {
        match r {
            crate::resident::Resolved::Resident(p) => Ok(p),
            crate::resident::Resolved::Import(_) => Err(EINVAL),
        }
    }

    /// A queue's resident set holds a driver-allocated buffer by one count of its pool shard
    /// however many submissions use it (a call may name it twice), and gives a call where the
    /// buffer is (its size and address) without the record. `MEM_FREE` (evict, then the pool's
    /// decision) is `EBUSY` while a submission uses it, and frees it once the last one is done,
    /// after which it cannot be found (`ENOENT`). A failed call leaves no use. Another file's
    /// handle is `ENOENT`, and a pool free that finds the buffer held keeps it, record and
    /// memory (never reached otherwise: every caller checks first).
    #[test]
    fn resident_buffers_keep_a_buffer_from_mem_free() -> Result {
        use crate::{holds::Holds, kfac::mm::MappedFile, resident::Resident};
        let dev = device()?;
        let route = dev.arch.host_route;
        let (owner, handle) = (u64::MAX >> 3, u64::MAX >> 25);
        let buf = dev.alloc_buffer(true, 4096, handle, owner, MappedFile::none())?;
        dev.pool.insert(&buf)?;
        let res = KBox::pin_init(Resident::new(dev.pool.shard(owner).clone()), GFP_KERNEL)?;
        let (mut a, mut b) = (Holds::default(), Holds::default());
        {
            let mut s = res.begin(&dev.pool, owner, route, None)?;
            let p = resident_place(s.resolve(handle)?)?;
            assert_eq!((p.size, p.base), (4096, buf.held_base(route)));
            assert!(p.writable);
            resident_place(s.resolve(handle)?)?;
            s.finish(&mut a)?;
            s.written();
        }
        {
            let mut s = res.begin(&dev.pool, owner, route, None)?;
            resident_place(s.resolve(handle)?)?;
            s.finish(&mut b)?;
            s.written();
        }
        assert_eq!(buf.pooled_holds(), 1);
        // A call that fails: its stamp goes back when its session is dropped unwritten.
        resident_place(res.begin(&dev.pool, owner, route, None)?.resolve(handle)?)?;
        // Another file's handle: its shard is another one, so a fresh set.
        let other = KBox::pin_init(Resident::new(dev.pool.shard(owner + 1).clone()), GFP_KERNEL)?;
        assert!(matches!(
            other.begin(&dev.pool, owner + 1, route, None)?.resolve(handle),
            Err(e) if e == ENOENT
        ));
        res.evict(handle);
        assert_eq!(dev.pool.free_handle(owner, handle), Err(EBUSY));
        dev.pool.free(&buf);
        assert!(dev.pool.get(owner, handle).is_ok() && buf.base(0).is_ok());
        drop(a);
        res.evict(handle);
        assert_eq!(buf.pooled_holds(), 1);
        assert_eq!(dev.pool.free_handle(owner, handle), Err(EBUSY));
        // The failed call's stamp went back: after `b`, nothing uses it.
        drop(b);
        res.evict(handle);
        assert_eq!(buf.pooled_holds(), 0);
        dev.pool.free_handle(owner, handle)?;
        assert!(matches!(
            res.begin(&dev.pool, owner, route, None)?.resolve(handle),
            Err(e) if e == ENOENT
        ));
        assert!(buf.base(0).is_err());
        Ok(())
    }

    /// Through a file's queue: a submission between two resident buffers, prepared and not
    /// started, keeps them from `MEM_FREE` (its use lasts until the engine is done); started
    /// and waited for, it gives the use back and the buffer frees. The queue's release lets
    /// the other buffer go, and no prepare call begins on the ended set (`ECANCELED`).
    #[test]
    fn resident_buffers_of_a_queue_stay_held_until_the_engine_is_done() -> Result {
        use crate::{
            desc::Barrier, holds::Holds, kfac::mm::MappedFile, queue::Copy, split::copy_len,
        };
        let dev = device()?;
        let route = dev.arch.host_route;
        let (owner, hs) = (u64::MAX >> 3, (u64::MAX >> 25) + 100);
        let hd = hs + 1;
        let src = dev.alloc_buffer(true, 4096, hs, owner, MappedFile::none())?;
        dev.pool.insert(&src)?;
        let dst = dev.alloc_buffer(true, 4096, hd, owner, MappedFile::none())?;
        dev.pool.insert(&dst)?;
        let chan = dev.queue_init_at(dev.arch.h2t[0].0, 2, 64, 64, Owner::File(owner))?;
        let r = (|| -> Result {
            let mut s = chan.resident()?.begin(&dev.pool, owner, route, None)?;
            let (sp, dp) = (
                resident_place(s.resolve(hs)?)?,
                resident_place(s.resolve(hd)?)?,
            );
            let mut holds = Holds::default();
            s.finish(&mut holds)?;
            let pair = Copy {
                src: sp.base,
                dst: dp.base,
                len: copy_len(4096)?,
                barrier: Barrier::None,
            };
            chan.prepare(&[pair], 1, holds)?;
            s.written();
            // Prepared, not started: the submission still uses both.
            chan.retire()?;
            chan.evict(hs);
            assert_eq!(dev.pool.free_handle(owner, hs), Err(EBUSY));
            assert_eq!(src.pooled_holds(), 1);
            chan.start(1, 1)?;
            chan.wait_all(DEFAULT_TIMEOUT)?;
            chan.retire()?;
            chan.evict(hs);
            assert_eq!(src.pooled_holds(), 0);
            dev.pool.free_handle(owner, hs)?;
            assert_eq!(dst.pooled_holds(), 1);
            Ok(())
        })();
        dev.queue_release(Owner::File(owner), chan.id)?;
        r?;
        assert_eq!(dst.pooled_holds(), 0);
        assert!(matches!(
            chan.resident()?.begin(&dev.pool, owner, route, None),
            Err(e) if e == ECANCELED
        ));
        dev.pool.free_handle(owner, hd)?;
        Ok(())
    }

    /// A resident set lets every buffer go at the close of its file: 40 buffers used by one
    /// call; `MEM_FREE` of one is `EBUSY` while the call's holds live; a later call that fails
    /// leaves its own 20 buffers unused (its stamps go back), so a flush lets them go while the
    /// first call's holds keep theirs; after their drop the flush gives every pool hold back
    /// (more than are given back per hold of the shard's lock) and every buffer frees.
    #[test]
    fn resident_buffers_all_go_back() -> Result {
        use crate::{holds::Holds, kfac::mm::MappedFile, resident::Resident};
        const N: u64 = 40;
        let dev = device()?;
        let route = dev.arch.host_route;
        let (owner, first) = (u64::MAX >> 3, (u64::MAX >> 25) + 1);
        const F: u64 = 20;
        let mut bufs = KVec::new();
        for h in first..first + N + F {
            let buf = dev.alloc_buffer(true, 4096, h, owner, MappedFile::none())?;
            dev.pool.insert(&buf)?;
            bufs.push(buf, GFP_KERNEL)?;
        }
        let res = KBox::pin_init(Resident::new(dev.pool.shard(owner).clone()), GFP_KERNEL)?;
        let mut holds = Holds::default();
        {
            let mut s = res.begin(&dev.pool, owner, route, None)?;
            for (h, b) in (first..first + N).zip(bufs.iter()) {
                assert_eq!(resident_place(s.resolve(h)?)?.base, b.held_base(route));
            }
            s.finish(&mut holds)?;
            s.written();
        }
        {
            // Fails after its lookups (its submission never written): one buffer of the
            // first call and F new ones.
            let mut s = res.begin(&dev.pool, owner, route, None)?;
            for h in first + N - 1..first + N + F {
                resident_place(s.resolve(h)?)?;
            }
            let mut unused = Holds::default();
            s.finish(&mut unused)?;
        }
        assert!(bufs.iter().all(|b| b.pooled_holds() == 1));
        res.evict(first + N - 1);
        assert_eq!(dev.pool.free_handle(owner, first + N - 1), Err(EBUSY));
        // The first call's are used: the flush keeps them, and lets the failed call's go.
        assert_eq!(res.flush(), N as usize);
        assert!(bufs.iter().skip(N as usize).all(|b| b.pooled_holds() == 0));
        drop(holds);
        assert_eq!(res.flush(), 0);
        assert!(bufs.iter().all(|b| b.pooled_holds() == 0));
        for h in first..first + N + F {
            dev.pool.free_handle(owner, h)?;
        }
        Ok(())
    }

    /// Reaping gives back what a settled orphan holds without allocating anything: with the
    /// next allocation of this thread set to fail (fault injection, `fail_nth`; the guest's init
    /// makes failslab count sleeping allocations too), a released device buffer held by an
    /// orphan is freed, its device memory allocatable again, and the injected failure unused.
    #[cfg(CONFIG_FAULT_INJECTION)]
    #[test]
    fn orphan_reaping_never_allocates() -> Result {
        use crate::{
            buffer::{Backing, Buffer},
            kfac::mm::MappedFile,
            orphan::{Hold, Orphan, Orphans},
        };
        let dev = device()?;
        let q = test_queue(&dev, 2, 64)?;
        // A fence of a marker pair only: it settles at once.
        let seq = q.with(|queue, io| queue.fence(io))?;
        poll_until(|| Ok(q.is_settled(seq)), |s| *s)?;
        // A released device buffer of some file, busy with an abandoned MEMCPY of it.
        let (owner, handle) = (u64::MAX >> 1, u64::MAX >> 23);
        let addr = dev.pool.alloc_dram(4096)?;
        let buf = Buffer::new(
            handle,
            4096,
            owner,
            MappedFile::none(),
            Backing::Device(addr, 0),
        )?;
        dev.pool.insert(&buf)?;
        let guards = [buf.busy()?, buf.busy()?];
        buf.mark_released();
        let orphans = KBox::pin_init(Orphans::new(), GFP_KERNEL)?;
        let slot = orphans.reserve()?;
        orphans.adopt(
            slot,
            Orphan::new(q.clone(), seq, owner, Hold::Buffers(guards)),
        );
        let task = kernel::current!().as_ptr();
        // SAFETY: the current task's own fault-injection counter, read and written by it only.
        unsafe { (*task).fail_nth = 1 };
        let left = orphans.reap(&dev.pool);
        // SAFETY: as above.
        let unused = unsafe { core::mem::replace(&mut (*task).fail_nth, 0) } == 1;
        assert_eq!(left, 0);
        // Reaping allocated nothing.
        assert!(unused);
        assert!(dev.pool.get(owner, handle).is_err());
        assert!(buf.mappable().is_none() && buf.base(0).is_err());
        // The range is back with the allocator.
        let again = dev.pool.alloc_dram(4096)?;
        dev.pool.free_dram(again);
        dev.queue_release(q.owner, q.id).map(|_| ())
    }

    /// An engine error while a dmaengine channel has more issued descriptors than its ring
    /// holds fails only those with pairs on the ring (at most two submissions' worth); the
    /// others run on the fresh queue (neuron-udma.rst, "dmaengine"). A client submits and
    /// issues 200 copies of 2 MiB (32 pairs each, 6400 pairs; a 4096-slot ring takes fewer
    /// than 128 of them), and the model fails the channel's third Tx descriptor. (Hostile
    /// review of 26e3639: every descriptor the writer had taken aside was failed.)
    #[test]
    fn dmaengine_error_fails_only_what_was_on_the_ring() -> Result {
        const N: u32 = 200;
        const LEN: u64 = 2 << 20;
        let dev = device()?;
        let Some(&(eng, _)) = dev.arch.h2t.last() else {
            return Ok(());
        };
        let model = dev.model.as_ref().ok_or(ENODEV)?;
        // Channel k is queue 15 - k of the last H2T engine (dmaengine.rs, MAX_CHANNELS).
        let r = {
            let entered = dev.enter()?;
            crate::kfac::dmaengine::kunit_burst(entered.bound(), N, LEN, |id| {
                model.inject_fail_nth(eng, 15 - id, 3)
            })?
        };
        let on_ring = 2 * 2032 / (LEN / 65536) + 1;
        pr_info!(
            "dmaengine burst: {} NOERROR, {} ABORTED, {} other, {} DMA_ERROR (at most {} on the ring)\n",
            r.noerror,
            r.aborted,
            r.other,
            r.status_error,
            on_ring
        );
        assert_eq!((r.noerror + r.aborted, r.other), (N, 0));
        assert!(r.aborted > 0 && u64::from(r.aborted) <= on_ring);
        assert_eq!(r.status_error, r.aborted);
        Ok(())
    }

    /// The state lock of a dmaengine channel is taken in interrupt context (here a softirq: a
    /// client's timer or tasklet; provider.rst lets clients call `prep`, `issue_pending` and
    /// `tx_status` in interrupt context) and in process context (the completion engine's
    /// looks): with a lock that leaves interrupts on, lockdep reports an inconsistent lock
    /// state (the splat fails the run), and an interrupt on the CPU holding it would deadlock.
    #[test]
    fn dmaengine_state_lock_in_interrupt() -> Result {
        let dev = device()?;
        let q = test_queue(&dev, 5, 64)?;
        let chan = DmaChan::new(&dev, q.clone())?;
        // Process context first: an idle channel's look takes the lock and returns.
        let _ = chan.look(false);
        let in_irq = chan.clone();
        let t = Arc::pin_init(
            pin_init!(InInterrupt {
                timer <- HrTimer::new(),
                chan: in_irq,
                done <- Completion::new(),
            }),
            GFP_KERNEL,
        )?;
        let handle = t.clone().start(Delta::from_micros(100));
        t.done.wait_for_completion();
        drop(handle);
        // And again from process context, after the interrupt's use.
        let _ = chan.look(false);
        drop(chan);
        dev.queue_release(q.owner, q.id).map(|_| ())
    }
}
