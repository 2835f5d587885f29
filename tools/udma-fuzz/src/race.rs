// SPDX-License-Identifier: GPL-2.0
//! Two threads calling into one file at once: a burst of 1..3 rounds, each of two calls
//! started together (a barrier) on the same open file. Each answer must be one the model allows
//! in some order of the two calls (or, where the ABI says so, for calls that overlap: a copy
//! racing `MEM_FREE` of its buffer either took its reference first or fails with `ENOENT`);
//! the model then follows the outcome, and the queues' state (`QUEUE_STATE`) must agree with it.

use crate::dev::{abi3, ioctl_ret, poll, Errno};
use crate::fuzz::{expect, fact, fail, name, show, slot_queue, CopyOp, Sut};
use crate::model::*;
use libc::{EBUSY, EIO, ENOENT, ENOSPC, ESTALE};
use neuron_udma::sys;
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// Runs `a` and `b` on two threads started together; their results.
fn two<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    let gate = Barrier::new(2);
    std::thread::scope(|s| {
        let ta = s.spawn(|| {
            gate.wait();
            a()
        });
        let tb = s.spawn(|| {
            gate.wait();
            b()
        });
        (ta.join().expect("thread A"), tb.join().expect("thread B"))
    })
}

fn copy_op(src: u8, dst: u8, x: u16) -> CopyOp {
    CopyOp {
        src,
        dst,
        soff: x,
        doff: x.rotate_left(7),
        size: (x % 8) as u8,
        barrier: (x % 3) as u8,
        split: true,
        bad: 0,
    }
}

fn ok_or(r: Result<i32, Errno>) -> Result<(), Errno> {
    r.map(|_| ())
}

impl Sut {
    /// Two threads on one file: `kind` picks the pair of calls, `a`, `b`, `x` their arguments.
    pub(crate) fn race(&mut self, kind: u8, a: u8, b: u8, x: u16) {
        let rounds = 1 + x % 3;
        for r in 0..rounds {
            let x = x.wrapping_mul(31).wrapping_add(r);
            match kind % 11 {
                0 => self.race_free_prepare(a, b, x),
                1 => self.race_two_queues(a, b, x),
                2 => self.race_memcpy(a, b, x),
                3 => self.race_init(a, b),
                4 => self.race_release_prepare(a, b, x),
                5 => self.race_wait_prepare(a, b, x),
                6 => self.race_poll_wait(a, b, x),
                7 => self.race_fence_waits(a),
                8 => self.race_submits(a, b, x),
                10 => self.race_memset_memcpy(a, b, x),
                _ => self.race_events(a),
            }
        }
    }

    /// `QUEUE_STATE` of queue slot `q` by its owner after a race: the model's counts.
    fn settle(&mut self, q: usize, what: &str) {
        let Some(m) = self.queues[q].as_ref() else { return };
        let (engine, queue, _) = slot_queue(q);
        let mut a = sys::neuron_udma_queue_state { engine, queue, ..Default::default() };
        let r = self.devs[m.owner].ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut a);
        expect(&format!("QUEUE_STATE after {what}"), r, true, &[]).ok();
        self.check_state(q, &a, &format!("QUEUE_STATE after {what}"));
    }

    /// A queue slot with a queue on a healthy engine (no fault in play), from `a`.
    fn healthy_queue(&self, a: u8) -> Option<usize> {
        let q = self.qslot(a as usize % QUEUE_SLOTS);
        (self.queues[q].is_some() && !self.lenient(q)).then_some(q)
    }

    /// A valid copy entry on queue slot `q` (of file `f`) from slot `src` to a writable slot
    /// from `dst`, with its prepare errors (never a certain failure).
    fn race_entry(
        &self,
        f: usize,
        q: usize,
        src: usize,
        dst: u8,
        x: u16,
    ) -> Option<(crate::fuzz::Entries, Vec<Errno>)> {
        let d = (0..BUF_SLOTS)
            .map(|i| (dst as usize + i) % BUF_SLOTS)
            .find(|&s| s != src && self.files[f].bufs[s].as_ref().is_some_and(|b| b.writable()))?;
        let e = self.entries(f, &[copy_op(src as u8, d as u8, x)]);
        if e.errs.is_some() {
            return None;
        }
        let (must, may) = self.space_errs(q, &e);
        (!must).then_some((e, may))
    }

    /// `COPY_PREPARE_ONE` naming a buffer against `MEM_FREE` of it.
    fn race_free_prepare(&mut self, a: u8, b: u8, x: u16) {
        let Some(q) = self.healthy_queue(a) else { return };
        let f = self.queues[q].as_ref().expect("queue").owner;
        let Some(xs) = (0..BUF_SLOTS).map(|i| (b as usize + i) % BUF_SLOTS).find(|&s| self.files[f].bufs[s].is_some())
        else {
            return;
        };
        let Some((e, may)) = self.race_entry(f, q, xs, b.wrapping_add(1), x) else { return };
        let h = self.files[f].bufs[xs].as_ref().expect("buffer").handle;
        // An exported device buffer is busy whatever the copies do.
        let busy = self.refs(f, h).0 || self.exported(h);
        let (engine, queue, _) = slot_queue(q);
        let fd = self.devs[f].raw();
        let mut pa = sys::neuron_udma_copy_prepare_one { engine, queue, copy: e.raw[0] };
        let mut fa = sys::neuron_udma_mem_free { handle: h, reserved: 0 };
        let (ra, rb) = two(
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut pa)),
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_MEM_FREE, &mut fa)),
        );
        crate::fuzz::count(ra);
        crate::fuzz::count(rb);
        let a_ok = match ra {
            Ok(()) => rb == Err(EBUSY),
            Err(ENOSPC) => may.contains(&ENOSPC) && (rb == Err(EBUSY) || (rb.is_ok() && !busy)),
            Err(ENOENT) => rb.is_ok(),
            Err(_) => false,
        };
        let b_ok = match rb {
            Ok(()) => !busy,
            Err(e) => e == EBUSY,
        };
        if !a_ok || !b_ok {
            fail!(
                "two threads: COPY_PREPARE_ONE from buffer {h} on queue slot {q}: {}, MEM_FREE of it: {} (it was {}busy); the allowed pairs: (success, EBUSY), (ENOENT, success){}",
                show(ra),
                show(rb),
                if busy { "" } else { "not " },
                if may.contains(&ENOSPC) { ", (ENOSPC, either)" } else { "" }
            );
        }
        fact("races: prepare against MEM_FREE", 1);
        if ra.is_ok() {
            self.prepared(q, e);
        }
        if rb.is_ok() {
            self.freed(f, xs);
        }
        self.settle(q, "a prepare raced MEM_FREE");
    }

    /// Two `COPY_PREPARE`s of one file on two of its queues.
    fn race_two_queues(&mut self, a: u8, b: u8, x: u16) {
        let Some(q1) = self.healthy_queue(a) else { return };
        let f = self.queues[q1].as_ref().expect("queue").owner;
        let Some(q2) = (1..QUEUE_SLOTS)
            .map(|i| (q1 + i) % QUEUE_SLOTS)
            .find(|&s| self.queues[s].as_ref().is_some_and(|m| m.owner == f) && !self.lenient(s))
        else {
            return;
        };
        let src = (b as usize) % BUF_SLOTS;
        if self.files[f].bufs[src].is_none() {
            return;
        }
        let Some((e1, may1)) = self.race_entry(f, q1, src, b, x) else { return };
        let Some((e2, may2)) = self.race_entry(f, q2, src, b.wrapping_add(2), x.rotate_left(3)) else { return };
        let fd = self.devs[f].raw();
        let (en1, qu1, _) = slot_queue(q1);
        let (en2, qu2, _) = slot_queue(q2);
        let mut p1 = sys::neuron_udma_copy_prepare {
            engine: en1,
            queue: qu1,
            count: 1,
            reserved: 0,
            copies: e1.raw.as_ptr() as u64,
        };
        let mut p2 = sys::neuron_udma_copy_prepare {
            engine: en2,
            queue: qu2,
            count: 1,
            reserved: 0,
            copies: e2.raw.as_ptr() as u64,
        };
        let (r1, r2) = two(
            || ioctl_ret(fd, sys::NEURON_UDMA_COPY_PREPARE, &mut p1),
            || ioctl_ret(fd, sys::NEURON_UDMA_COPY_PREPARE, &mut p2),
        );
        let w1 = (if e1.split { e1.total } else { 0 }) as i32;
        let w2 = (if e2.split { e2.total } else { 0 }) as i32;
        let r1 = expect(&format!("two threads: COPY_PREPARE on queue slot {q1}"), r1, true, &may1);
        let r2 = expect(&format!("two threads: COPY_PREPARE on queue slot {q2}"), r2, true, &may2);
        if r1.is_ok_and(|n| n != w1) || r2.is_ok_and(|n| n != w2) {
            fail!("two threads: COPY_PREPARE returned {r1:?} and {r2:?}, expected {w1} and {w2} pairs");
        }
        fact("races: prepares on two queues", 1);
        if r1.is_ok() {
            self.prepared(q1, e1);
        }
        if r2.is_ok() {
            self.prepared(q2, e2);
        }
        self.settle(q1, "two prepares at once");
        self.settle(q2, "two prepares at once");
    }

    /// Two `MEMCPY`s of one file (one runs at a time per file: the other waits its turn).
    fn race_memcpy(&mut self, a: u8, b: u8, x: u16) {
        let f = a as usize % FILES;
        let pa = self.memcpy_plan(f, a % 4, b % 4, x, x.rotate_left(5), (x % 8) as u8, 0);
        let pb = self.memcpy_plan(f, b % 4, (a / 4) % 4, x.rotate_left(9), x.rotate_left(2), (x / 8 % 8) as u8, 0);
        if !pa.ok || !pb.ok {
            return;
        }
        let fd = self.devs[f].raw();
        let (mut aa, mut ab) = (pa.arg, pb.arg);
        let (ra, rb) = two(
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_MEMCPY, &mut aa)),
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_MEMCPY, &mut ab)),
        );
        expect("two threads: MEMCPY (A)", ra, true, &[]).ok();
        expect("two threads: MEMCPY (B)", rb, true, &[]).ok();
        fact("races: two MEMCPYs", 1);
        // In either order: where one's destination meets the other's bytes, the result
        // depends on the order.
        let conflict = overlaps(pa.dst, pa.n, pb.dst, pb.n)
            || overlaps(pa.dst, pa.n, pb.src, pb.n)
            || overlaps(pb.dst, pb.n, pa.src, pa.n);
        if conflict {
            self.memcpy_apply(&pa);
            self.memcpy_apply(&pb);
            self.mem.forget(pa.dst, pa.n);
            self.mem.forget(pb.dst, pb.n);
        } else {
            self.memcpy_apply(&pa);
            self.memcpy_apply(&pb);
        }
    }

    /// A `MEMSET` and a `MEMCPY` of one file (they share the one-call-at-a-time slot of the file
    /// on the shared queue: the other waits its turn).
    fn race_memset_memcpy(&mut self, a: u8, b: u8, x: u16) {
        let f = a as usize % FILES;
        let pc = self.memcpy_plan(f, a % 4, b % 4, x, x.rotate_left(5), (x % 8) as u8, 0);
        let ps = self.memset_plan(f, (a / 4) % 4, x.rotate_left(11), (x / 8 % 8) as u8, b, 0);
        if !pc.ok || !ps.ok {
            return;
        }
        let fd = self.devs[f].raw();
        let (mut ac, mut aset) = (pc.arg, ps.arg);
        let (rc, rs) = two(
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_MEMCPY, &mut ac)),
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_MEMSET, &mut aset)),
        );
        expect("two threads: MEMCPY (against a MEMSET)", rc, true, &[]).ok();
        expect("two threads: MEMSET (against a MEMCPY)", rs, true, &[]).ok();
        fact("races: MEMSET against MEMCPY", 1);
        self.memcpy_apply(&pc);
        fill(&mut self.mem, &mut self.queues, ps.at, ps.n, b);
        // In either order: where the fill meets the copy's bytes, the result depends on it.
        if overlaps(ps.at, ps.n, pc.dst, pc.n) || overlaps(ps.at, ps.n, pc.src, pc.n) {
            self.mem.forget(pc.dst, pc.n);
            self.mem.forget(ps.at, ps.n);
        }
    }

    /// Two `QUEUE_INIT`s of the same queue (by one file, or by both): one wins.
    fn race_init(&mut self, a: u8, b: u8) {
        let q = a as usize % QUEUE_SLOTS;
        if self.held(q) {
            // A closed file may still hold the id (its io_uring commands in flight, S5).
            return;
        }
        let (fa, fb) = (a as usize / 4 % FILES, b as usize % FILES);
        let (engine, queue, e) = slot_queue(q);
        let mut ia = sys::neuron_udma_queue_init { engine, queue, tx_descs: 32, rx_descs: 64, ..Default::default() };
        let mut ib = sys::neuron_udma_queue_init { engine, queue, tx_descs: 64, rx_descs: 32, ..Default::default() };
        let (da, db) = (self.devs[fa].raw(), self.devs[fb].raw());
        let (ra, rb) = two(
            || ok_or(ioctl_ret(da, sys::NEURON_UDMA_QUEUE_INIT, &mut ia)),
            || ok_or(ioctl_ret(db, sys::NEURON_UDMA_QUEUE_INIT, &mut ib)),
        );
        crate::fuzz::count(ra);
        crate::fuzz::count(rb);
        let taken = self.queues[q].is_some();
        let good = if taken {
            ra == Err(EBUSY) && rb == Err(EBUSY)
        } else {
            (ra.is_ok() && rb == Err(EBUSY)) || (rb.is_ok() && ra == Err(EBUSY))
        };
        if !good {
            fail!(
                "two threads: QUEUE_INIT of queue slot {q} ({}): {} and {}; the model says {}",
                if fa == fb { "one file" } else { "two files" },
                show(ra),
                show(rb),
                if taken { "EBUSY twice" } else { "one success and one EBUSY" }
            );
        }
        fact("races: QUEUE_INIT of one queue", 1);
        if !taken {
            let eng = crate::fuzz::engines()[e];
            self.serial += 1;
            let (owner, tx, rx) = if ra.is_ok() { (fa, 32, 64) } else { (fb, 64, 32) };
            let m = QueueM::new(owner, self.serial, tx, rx, eng.armed || eng.maybe_aborted);
            self.queues[q] = Some(m.continue_after(self.fence_base(owner, q)));
            self.settle(q, "two QUEUE_INITs");
        }
    }

    /// `QUEUE_RELEASE` against `COPY_PREPARE_ONE` on the same queue.
    fn race_release_prepare(&mut self, a: u8, b: u8, x: u16) {
        let Some(q) = self.healthy_queue(a) else { return };
        let f = self.queues[q].as_ref().expect("queue").owner;
        let src = b as usize % BUF_SLOTS;
        if self.files[f].bufs[src].is_none() {
            return;
        }
        let Some((e, may)) = self.race_entry(f, q, src, b, x) else { return };
        self.ghost_room(q);
        let (engine, queue, _) = slot_queue(q);
        let fd = self.devs[f].raw();
        let mut rel = sys::neuron_udma_queue_id { engine, queue, reserved: 0 };
        let mut p = sys::neuron_udma_copy_prepare_one { engine, queue, copy: e.raw[0] };
        let (ra, rb) = two(
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_QUEUE_RELEASE, &mut rel)),
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut p)),
        );
        expect("two threads: QUEUE_RELEASE against a prepare", ra, true, &[]).ok();
        let mut errs = may.clone();
        // The queue is gone before the prepare looks it up: not this file's queue; or it
        // took the instance and found it released (issue 33: ECANCELED).
        errs.push(ENOENT);
        if !crate::fuzz::BEFORE_I33.load(std::sync::atomic::Ordering::Relaxed) {
            errs.push(libc::ECANCELED);
        }
        expect("two threads: COPY_PREPARE_ONE against QUEUE_RELEASE of its queue", rb, true, &errs).ok();
        fact("races: prepare against QUEUE_RELEASE", 1);
        if rb.is_ok() {
            self.prepared(q, e);
        }
        self.end_instance(q, Gone::Released, None);
    }

    /// `COPY_WAIT` against `COPY_PREPARE` on the same queue: the wait fences the new pairs or
    /// not, and `QUEUE_STATE` tells which.
    fn race_wait_prepare(&mut self, a: u8, b: u8, x: u16) {
        let Some(q) = self.healthy_queue(a) else { return };
        let m = self.queues[q].as_ref().expect("queue");
        if m.maybe_reset || m.prep.is_none() {
            return;
        }
        let f = m.owner;
        let src = b as usize % BUF_SLOTS;
        if self.files[f].bufs[src].is_none() {
            return;
        }
        let Some((e, mut may)) = self.race_entry(f, q, src, b, x) else { return };
        // The wait appends its marker pair first when it wins: the prepare then finds one pair
        // less, which a ring filled to the last pair lacks.
        let m = self.queues[q].as_ref().expect("queue");
        if !may.contains(&ENOSPC) && e.total + 1 > m.cap().saturating_sub(m.hi()) {
            may.push(ENOSPC);
        }
        let (engine, queue, _) = slot_queue(q);
        let fd = self.devs[f].raw();
        let mut w = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
        let mut p =
            sys::neuron_udma_copy_prepare { engine, queue, count: 1, reserved: 0, copies: e.raw.as_ptr() as u64 };
        let (ra, rb) = two(
            || ok_or(ioctl_ret(fd, sys::NEURON_UDMA_COPY_WAIT, &mut w)),
            || ioctl_ret(fd, sys::NEURON_UDMA_COPY_PREPARE, &mut p),
        );
        expect("two threads: COPY_WAIT against a prepare", ra, true, &[]).ok();
        let rb = expect("two threads: COPY_PREPARE against a COPY_WAIT", rb, true, &may);
        fact("races: prepare against COPY_WAIT", 1);
        let (engine, queue, _) = slot_queue(q);
        let mut s = sys::neuron_udma_queue_state { engine, queue, ..Default::default() };
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut s);
        expect("QUEUE_STATE after a prepare raced COPY_WAIT", r, true, &[]).ok();
        let before = rb.is_ok() && s.tx.sw_pending == 0;
        if rb.is_ok() && s.tx.sw_pending != 0 && s.tx.sw_pending != e.total {
            fail!("two threads: after COPY_WAIT and a prepare of {} pairs, {} Tx descriptors are prepared (0: the wait took them, {}: it did not)", e.total, s.tx.sw_pending, e.total);
        }
        let after = rb.is_ok() && !before;
        if before {
            self.prepared(q, e);
            self.finish_wait(q);
        } else {
            self.finish_wait(q);
            if after {
                self.prepared(q, e);
            }
        }
        self.check_state(q, &s, "QUEUE_STATE after a prepare raced COPY_WAIT");
    }

    /// The model after a `COPY_WAIT` of queue slot `q` that returned 0.
    fn finish_wait(&mut self, q: usize) {
        let m = self.queues[q].as_mut().expect("queue");
        m.fence_now();
        let landed = m.all_done();
        self.land_all(landed);
        self.resync(q);
    }

    /// `poll()` blocked on the file while another thread's `COPY_WAIT` completes a fence: the
    /// poller must wake with `EPOLLIN`.
    fn race_poll_wait(&mut self, a: u8, b: u8, x: u16) {
        let Some(q) = self.healthy_queue(a) else { return };
        let f = self.queues[q].as_ref().expect("queue").owner;
        let owned: Vec<usize> =
            (0..QUEUE_SLOTS).filter(|&s| self.queues[s].as_ref().is_some_and(|m| m.owner == f)).collect();
        if owned.iter().any(|&s| self.lenient(s)) {
            return;
        }
        // Work for the wait: one copy more.
        let src = b as usize % BUF_SLOTS;
        if self.files[f].bufs[src].is_none() {
            return;
        }
        let Some((e, may)) = self.race_entry(f, q, src, b, x) else { return };
        if !may.is_empty() {
            return;
        }
        // Nothing to report yet, so that the poll blocks.
        crate::fuzz::CUR_OP.store(23, std::sync::atomic::Ordering::Relaxed);
        self.events(f, 0);
        crate::fuzz::CUR_OP.store(27, std::sync::atomic::Ordering::Relaxed);
        if owned.iter().any(|&s| {
            let m = self.queues[s].as_ref().expect("queue");
            m.done_ceiling() > m.reported.0
        }) {
            return;
        }
        let (engine, queue, _) = slot_queue(q);
        let fd = self.devs[f].raw();
        let mut p = sys::neuron_udma_copy_prepare_one { engine, queue, copy: e.raw[0] };
        let r = ioctl_ret(fd, sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut p);
        if expect("COPY_PREPARE_ONE (before a poll and a wait)", r, true, &[]).is_err() {
            return;
        }
        self.prepared(q, e);
        self.files[f].polled = true;
        let mut w = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
        let t0 = Instant::now();
        let ((revents, woke), (rw, waited)) = two(
            || {
                let r = poll(fd, 3000);
                (r, t0.elapsed())
            },
            || {
                std::thread::sleep(Duration::from_millis(20));
                let r = ok_or(ioctl_ret(fd, sys::NEURON_UDMA_COPY_WAIT, &mut w));
                (r, t0.elapsed())
            },
        );
        expect("two threads: COPY_WAIT while another thread polls", rw, true, &[]).ok();
        self.finish_wait(q);
        let revents = revents.unwrap_or_else(|e| fail!("poll: {}", name(e)));
        crate::fuzz::count(Ok(()));
        if revents & libc::POLLIN == 0 || woke > waited + Duration::from_millis(1000) {
            fail!(
                "two threads: poll() blocked while COPY_WAIT on queue slot {q} completed a fence: revents {revents:#x} after {woke:?}, the wait returned after {waited:?} (EPOLLIN must wake the poller)"
            );
        }
        fact("races: poll woken by another thread's COPY_WAIT", 1);
    }

    /// Two `FENCE_WAIT`s for the newest fence of a queue.
    fn race_fence_waits(&mut self, a: u8) {
        let Some(q) = self.healthy_queue(a) else { return };
        self.resync(q);
        let m = self.queues[q].as_ref().expect("queue");
        let k = m.newest.1;
        if k == 0 || m.may(k) & (fs::DONE | fs::PENDING) == 0 {
            return;
        }
        let f = m.owner;
        let (engine, queue, _) = slot_queue(q);
        let fd = self.devs[f].raw();
        let mut wa = sys::neuron_udma_fence_wait { engine, queue, fence: k, ..Default::default() };
        let mut wb = wa;
        // As for one FENCE_WAIT (fence.rs): a fence the model says may have failed (a fault
        // earlier in the case, its outcome never seen by a wait) may answer EIO, an expired
        // one ESTALE. (A trn2 long run, 2026-12-02, saw EIO here where only success was
        // allowed: a COPY_WAIT with nothing in flight had left the failed fence "DONE or FAIL".)
        let may = m.may(k);
        let mut errs = vec![];
        if may & fs::FAIL != 0 {
            errs.push(EIO);
        }
        if may & fs::EXPIRED != 0 {
            errs.push(ESTALE);
        }
        let (ra, rb) =
            two(|| ok_or(ioctl_ret(fd, abi3::FENCE_WAIT, &mut wa)), || ok_or(ioctl_ret(fd, abi3::FENCE_WAIT, &mut wb)));
        let ra = expect(&format!("two threads: FENCE_WAIT for fence {k} (A)"), ra, true, &errs);
        let rb = expect(&format!("two threads: FENCE_WAIT for fence {k} (B)"), rb, true, &errs);
        fact("races: two FENCE_WAITs", 1);
        if ra != rb {
            fail!("two threads: FENCE_WAITs for fence {k} disagree: {} and {}", show(ra), show(rb));
        }
        if ra == Err(EIO) {
            fact("races: two FENCE_WAITs answered EIO", 1);
        }
        let m = self.queues[q].as_mut().expect("queue");
        match ra {
            Ok(()) => {
                let landed = m.done(k);
                self.land_all(landed);
                self.settle(q, "two FENCE_WAITs");
            }
            // As after one FENCE_WAIT (the queue is healthy: no unseen reset).
            Err(EIO) => self.fence_wait_failed(q, k),
            Err(_) => {}
        }
    }

    /// Two `COPY_SUBMIT`s on the same queue (after a prepare): one appends the fence, the
    /// other finds nothing new and returns the same fence.
    fn race_submits(&mut self, a: u8, b: u8, x: u16) {
        let Some(q) = self.healthy_queue(a) else { return };
        self.resync(q);
        let m = self.queues[q].as_ref().expect("queue");
        if m.maybe_reset || m.groups.len() as u64 + 1 >= MAX_FENCES {
            return;
        }
        let f = m.owner;
        let src = b as usize % BUF_SLOTS;
        if x.is_multiple_of(2) && self.files[f].bufs[src].is_some() {
            if let Some((e, may)) = self.race_entry(f, q, src, b, x) {
                if may.is_empty() {
                    let (engine, queue, _) = slot_queue(q);
                    let mut p = sys::neuron_udma_copy_prepare_one { engine, queue, copy: e.raw[0] };
                    let r = ioctl_ret(self.devs[f].raw(), sys::NEURON_UDMA_COPY_PREPARE_ONE, &mut p);
                    if expect("COPY_PREPARE_ONE (before two submits)", r, true, &[]).is_ok() {
                        self.prepared(q, e);
                    }
                }
            }
        }
        let m = self.queues[q].as_ref().expect("queue");
        let want = m.shown(if m.unf > 0 { m.newest.1 + 1 } else { m.newest.1 });
        let (engine, queue, _) = slot_queue(q);
        let fd = self.devs[f].raw();
        let mut sa = sys::neuron_udma_copy_submit { engine, queue, ..Default::default() };
        let mut sb = sa;
        let (ra, rb) = two(
            || ok_or(ioctl_ret(fd, abi3::COPY_SUBMIT, &mut sa)),
            || ok_or(ioctl_ret(fd, abi3::COPY_SUBMIT, &mut sb)),
        );
        expect("two threads: COPY_SUBMIT (A)", ra, true, &[]).ok();
        expect("two threads: COPY_SUBMIT (B)", rb, true, &[]).ok();
        if sa.fence != want || sb.fence != want {
            fail!(
                "two threads: COPY_SUBMIT on queue slot {q} returned fences {} and {}, the model says {want} for both",
                sa.fence,
                sb.fence
            );
        }
        fact("races: two COPY_SUBMITs", 1);
        self.queues[q].as_mut().expect("queue").fence_now();
        self.settle(q, "two COPY_SUBMITs");
    }

    /// Two `QUEUE_EVENTS` of one file: every event is reported once.
    fn race_events(&mut self, a: u8) {
        let f = a as usize % FILES;
        let mut order: Vec<usize> =
            (0..QUEUE_SLOTS).filter(|&q| self.queues[q].as_ref().is_some_and(|m| m.owner == f)).collect();
        for &q in &order {
            self.refresh(q);
            self.resync(q);
        }
        order.sort_by_key(|&q| self.queues[q].as_ref().map_or(0, |m| m.serial));
        let fd = self.devs[f].raw();
        let mut ra = [sys::neuron_udma_queue_event::default(); 8];
        let mut rb = ra;
        let mut ea = sys::neuron_udma_events { events: ra.as_mut_ptr() as u64, max: 8, count: 0 };
        let mut eb = sys::neuron_udma_events { events: rb.as_mut_ptr() as u64, max: 8, count: 0 };
        let (xa, xb) = two(
            || ok_or(ioctl_ret(fd, abi3::QUEUE_EVENTS, &mut ea)),
            || ok_or(ioctl_ret(fd, abi3::QUEUE_EVENTS, &mut eb)),
        );
        expect("two threads: QUEUE_EVENTS (A)", xa, true, &[]).ok();
        expect("two threads: QUEUE_EVENTS (B)", xb, true, &[]).ok();
        fact("races: two QUEUE_EVENTS", 1);
        let recs: Vec<sys::neuron_udma_queue_event> =
            ra[..ea.count as usize].iter().chain(rb[..eb.count as usize].iter()).copied().collect();
        for q in order {
            let (engine, queue, _) = slot_queue(q);
            let mut mine: Vec<_> = recs.iter().filter(|r| r.engine == engine && r.queue == queue).copied().collect();
            // The later report has the newer fences.
            mine.sort_by_key(|r| (r.completed, r.failed));
            let what = format!("two threads: QUEUE_EVENTS of queue slot {q}");
            if mine.is_empty() {
                let m = self.queues[q].as_ref().expect("queue");
                if m.done_floor() > m.reported.0 || m.known_failed > m.reported.1 {
                    fail!(
                        "{what}: neither call reported fence {} done or fence {} failed",
                        m.done_floor(),
                        m.known_failed
                    );
                }
            }
            for r in mine {
                self.event_record(q, &r, &what);
            }
        }
        let known = recs.iter().filter(|r| order_has(self, f, r)).count();
        if known != recs.len() {
            fail!("two threads: QUEUE_EVENTS reported queues that are not the file's: {recs:?}");
        }
    }
}

fn order_has(s: &Sut, f: usize, r: &sys::neuron_udma_queue_event) -> bool {
    (0..QUEUE_SLOTS).any(|q| {
        let (engine, queue, _) = slot_queue(q);
        s.queues[q].as_ref().is_some_and(|m| m.owner == f) && r.engine == engine && r.queue == queue
    })
}
