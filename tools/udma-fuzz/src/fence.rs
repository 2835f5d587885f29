// SPDX-License-Identifier: GPL-2.0
//! Fences as values and their events (ABI 3): `COPY_SUBMIT`, `FENCE_STATUS`, `FENCE_WAIT`,
//! `QUEUE_EVENTS`, `QUEUE_EVENTFD` and `poll()` of the file, checked against the model's
//! fences (`model::QueueM`: the newest fence, what each one may read, what `QUEUE_EVENTS`
//! reported last).

use crate::dev::{abi3, eventfd, eventfd_take, ioctl_ret, poll};
use crate::fuzz::{expect, fact, fail, name, slot_queue, with_alarm, Sut};
use crate::model::*;
use libc::{EBADF, EBUSY, ECANCELED, EINTR, EINVAL, EIO, ENOENT, ESTALE, ETIMEDOUT};
use neuron_udma::sys;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The model's bit of a `FENCE_STATUS` state and error.
fn state_bit(state: u32, error: i32) -> Option<u8> {
    match (state, error) {
        (sys::NEURON_UDMA_FENCE_PENDING, 0) => Some(fs::PENDING),
        (sys::NEURON_UDMA_FENCE_DONE, 0) => Some(fs::DONE),
        (sys::NEURON_UDMA_FENCE_FAILED, EIO) => Some(fs::FAIL_EIO),
        (sys::NEURON_UDMA_FENCE_FAILED, ETIMEDOUT) => Some(fs::FAIL_TMO),
        (sys::NEURON_UDMA_FENCE_EXPIRED, 0) => Some(fs::EXPIRED),
        _ => None,
    }
}

fn show_bits(s: u8) -> String {
    [
        (fs::PENDING, "pending"),
        (fs::DONE, "done"),
        (fs::FAIL_EIO, "failed EIO"),
        (fs::FAIL_TMO, "failed ETIMEDOUT"),
        (fs::EXPIRED, "expired"),
    ]
    .iter()
    .filter(|(b, _)| s & b != 0)
    .map(|(_, n)| *n)
    .collect::<Vec<_>>()
    .join(" or ")
}

/// A fence of a queue whose newest is `newest`: `which` % 16 0 is fence 0, 1 the next one
/// (both invalid), otherwise a submitted one, mostly the newest.
fn pick_fence(newest: u64, which: u8) -> u64 {
    match which % 16 {
        0 => 0,
        1 => newest + 1,
        _ if newest == 0 => 1,
        _ => newest - u64::from(which / 16) % newest.min(4),
    }
}

impl Sut {
    /// `COPY_SUBMIT` on queue slot `q` (`how` 1, 2: flags, reserved; 3: the other file).
    pub(crate) fn submit(&mut self, other: u8, q: usize, how: u8) {
        let q = self.qslot(q);
        self.refresh(q);
        self.resync(q);
        let f = if how % 4 == 3 { 1 - self.qfile(q, 0) } else { self.qfile(q, other) };
        let (engine, queue, _) = slot_queue(q);
        let mut a = sys::neuron_udma_copy_submit { engine, queue, ..Default::default() };
        let owned = self.queues[q].as_ref().is_some_and(|m| m.owner == f);
        let mut errs = vec![];
        match how % 4 {
            1 => a.flags = 1,
            2 => a.reserved = 1,
            _ => {}
        }
        if matches!(how % 4, 1 | 2) {
            errs.push(EINVAL);
        } else if !owned {
            errs.push(ENOENT);
        }
        let ok = errs.is_empty();
        if ok && self.queues[q].as_ref().is_some_and(|m| m.groups.len() as u64 >= MAX_FENCES) {
            errs.push(EBUSY);
        }
        let r = ioctl_ret(self.devs[f].raw(), abi3::COPY_SUBMIT, &mut a);
        let what = format!("COPY_SUBMIT on queue slot {q}");
        if expect(&what, r, ok, &errs).is_err() {
            return;
        }
        let m = self.queues[q].as_mut().expect("owned");
        let n = m.newest.1;
        // S1: 0 while the instance has no fence of its own (its numbering continues the id's).
        let fence = if a.fence == m.shown(n) { n } else { a.fence };
        if m.maybe_reset {
            // The unfenced pairs may have been dropped by a reset: then nothing is appended.
            if fence != n && !(m.unf > 0 && fence == n + 1) {
                fail!(
                    "{what}: fence {}, the model says {}{}",
                    a.fence,
                    m.shown(n),
                    if m.unf > 0 { format!(" or {}", n + 1) } else { String::new() }
                );
            }
            if fence == n + 1 {
                m.fence_now();
                m.learn_newest(fence);
            } else {
                let gone: Vec<PendingCopy> = m.pending.iter().filter(|p| p.fence == 0).cloned().collect();
                m.pending.retain(|p| p.fence != 0);
                (m.unf, m.prep) = (0, Some((0, 0)));
                drop_pending(&mut self.mem, gone);
            }
        } else {
            let want = if m.unf > 0 { n + 1 } else { n };
            if a.fence != m.shown(want) {
                fail!(
                    "{what}: fence {}, the model says {} ({} pairs prepared since fence {n}, the instance's first fence {})",
                    a.fence,
                    m.shown(want),
                    m.unf,
                    m.first
                );
            }
            m.fence_now();
        }
        if fence != n {
            fact("fences submitted", 1);
        }
    }

    /// `FENCE_STATUS` of a fence of queue slot `q` (also from the read-only file: `ENOENT`).
    pub(crate) fn fence_status(&mut self, other: u8, q: usize, which: u8, ro: bool) {
        let q = self.qslot(q);
        self.refresh(q);
        self.resync(q);
        let f = self.qfile(q, other);
        let (engine, queue, _) = slot_queue(q);
        let newest = self.queues[q].as_ref().map_or(0, |m| m.newest.1);
        let fence = pick_fence(newest, which);
        let mut a = sys::neuron_udma_fence_status { engine, queue, fence, ..Default::default() };
        if ro {
            let r = ioctl_ret(self.ro.raw(), abi3::FENCE_STATUS, &mut a);
            expect("FENCE_STATUS from a read-only file (not its queue)", r, false, &[ENOENT]).ok();
            return;
        }
        if self.queues[q].as_ref().is_none_or(|m| m.owner != f) {
            let r = ioctl_ret(self.devs[f].raw(), abi3::FENCE_STATUS, &mut a);
            expect("FENCE_STATUS of a queue not of this file", r, false, &[ENOENT]).ok();
            return;
        }
        let valid = fence != 0 && fence <= newest;
        // S2: a fence of an earlier instance of the id.
        let canceled = valid && self.queues[q].as_ref().is_some_and(|m| fence < m.first);
        let r = ioctl_ret(self.devs[f].raw(), abi3::FENCE_STATUS, &mut a);
        let what = format!("FENCE_STATUS of fence {fence} of queue slot {q}");
        if expect(&what, r, valid && !canceled, if canceled { &[ECANCELED] } else { &[EINVAL] }).is_err() {
            return;
        }
        self.fence_answer(q, fence, &a, &what);
    }

    /// Checks a `FENCE_STATUS` answer for fence `fence` of queue slot `q` and learns from it.
    pub(crate) fn fence_answer(&mut self, q: usize, fence: u64, a: &sys::neuron_udma_fence_status, what: &str) {
        let m = self.queues[q].as_mut().expect("queue");
        let may = m.may(fence);
        let Some(bit) = state_bit(a.state, a.error) else {
            fail!("{what}: state {} error {}, not a state of the ABI", a.state, a.error);
        };
        if may & bit == 0 {
            fail!("{what}: {}, the model says {}", show_bits(bit), show_bits(may));
        }
        let c = a.completed;
        let (floor, ceiling) = (m.done_floor(), m.done_ceiling());
        if a.submitted != m.shown(m.newest.1)
            || c < floor
            || c > ceiling
            || (c != 0 && m.may(c) & fs::DONE == 0)
            || (bit == fs::DONE && c < fence)
            || (bit == fs::PENDING && c >= fence)
        {
            fail!(
                "{what}: {} with completed {c} submitted {}; the model says completed {floor}..={ceiling}, submitted {}",
                show_bits(bit),
                a.submitted,
                m.shown(m.newest.1)
            );
        }
        let mut landed = m.done(c);
        match bit {
            fs::DONE => landed.extend(m.done(fence)),
            fs::FAIL_EIO | fs::FAIL_TMO => m.set_may(fence, bit),
            _ => {}
        }
        self.land_all(landed);
    }

    /// `FENCE_WAIT` for a fence of queue slot `q` (`how` 1: a short timeout, 2: a signal, 3:
    /// reserved).
    pub(crate) fn fence_wait(&mut self, other: u8, q: usize, which: u8, how: u8, us: u16) {
        let q = self.qslot(q);
        self.refresh(q);
        self.resync(q);
        let f = self.qfile(q, other);
        let (engine, queue, _) = slot_queue(q);
        let lenient = self.lenient(q);
        let m = self.queues[q].as_ref().filter(|m| m.owner == f);
        let newest = m.map_or(0, |m| m.newest.1);
        let fence = pick_fence(newest, which);
        let mut a = sys::neuron_udma_fence_wait { engine, queue, fence, ..Default::default() };
        let mut errs = vec![];
        let mut ok = false;
        match (how % 4, m) {
            (3, _) => {
                a.reserved = 1;
                errs.push(EINVAL);
            }
            (_, None) => errs.push(ENOENT),
            _ if fence == 0 || fence > newest => errs.push(EINVAL),
            // S2: a fence of an earlier instance of the id.
            (_, Some(m)) if fence < m.first => errs.push(ECANCELED),
            (h, Some(m)) => {
                let may = m.may(fence);
                ok = may & (fs::DONE | fs::PENDING) != 0;
                if may & fs::FAIL != 0 {
                    errs.push(EIO);
                }
                if may & fs::EXPIRED != 0 {
                    errs.push(ESTALE);
                }
                if h == 1 {
                    a.timeout_ms = 10 + u32::from(us) % 40;
                }
                if may & fs::PENDING != 0 && (h == 1 || lenient) {
                    errs.push(ETIMEDOUT);
                }
                // Only a signal whose handler runs: io_uring's task work restarts the call.
                if h == 2 && may & fs::PENDING != 0 {
                    errs.push(EINTR);
                }
            }
        }
        let fd = self.devs[f].raw();
        let r = with_alarm(how % 4 == 2, us, || ioctl_ret(fd, abi3::FENCE_WAIT, &mut a));
        let what = format!("FENCE_WAIT for fence {fence} of queue slot {q}");
        let r = expect(&what, r, ok, &errs);
        if !ok {
            return;
        }
        let m = self.queues[q].as_mut().expect("owned");
        match r {
            Ok(_) => {
                let landed = m.done(fence);
                self.land_all(landed);
            }
            Err(EIO) => self.fence_wait_failed(q, fence),
            Err(ETIMEDOUT) if m.tainted => m.maybe_reset_now(),
            Err(_) => {}
        }
    }

    /// What the model learns when a `FENCE_WAIT` for `fence` of queue slot `q` answered `EIO`
    /// (one wait, or both of the two-thread race): a fence in flight failed and the wait reset
    /// the queue (or may have, after a reset the model did not see); a settled fence's wait
    /// answers from its state alone, so it failed earlier ([`QueueM::failed_seen`]).
    pub(crate) fn fence_wait_failed(&mut self, q: usize, fence: u64) {
        let m = self.queues[q].as_mut().expect("queue");
        let settled = m.may(fence) & fs::PENDING == 0;
        if m.maybe_reset {
            m.maybe_reset_now();
        } else if !settled {
            let dropped = m.reset(fence);
            drop_pending(&mut self.mem, dropped);
        }
        if settled {
            m.failed_seen(fence);
        }
    }

    /// `QUEUE_EVENTS` of file `f` (`how` 1: room for one record, 2: for none).
    pub(crate) fn events(&mut self, f: usize, how: u8) {
        let mut order: Vec<usize> =
            (0..QUEUE_SLOTS).filter(|&q| self.queues[q].as_ref().is_some_and(|m| m.owner == f)).collect();
        for &q in &order {
            self.refresh(q);
            self.resync(q);
        }
        order.sort_by_key(|&q| self.queues[q].as_ref().map_or(0, |m| m.serial));
        let max = [8u32, 1, 0][how as usize % 3];
        let mut recs = [sys::neuron_udma_queue_event::default(); 8];
        let mut a = sys::neuron_udma_events { events: recs.as_mut_ptr() as u64, max, count: 0 };
        let r = ioctl_ret(self.devs[f].raw(), abi3::QUEUE_EVENTS, &mut a);
        expect("QUEUE_EVENTS", r, true, &[]).ok();
        if a.count > max {
            fail!("QUEUE_EVENTS: {} records for room for {max}", a.count);
        }
        let mut ri = 0usize;
        for q in order {
            if ri == max as usize {
                break;
            }
            let (engine, queue, _) = slot_queue(q);
            let what = format!("QUEUE_EVENTS of queue slot {q}");
            if ri < a.count as usize && recs[ri].engine == engine && recs[ri].queue == queue {
                let rec = recs[ri];
                ri += 1;
                self.event_record(q, &rec, &what);
            } else {
                let m = self.queues[q].as_ref().expect("queue");
                if m.done_floor() > m.reported.0 || m.known_failed > m.reported.1 {
                    fail!(
                        "{what}: no record, but fence {} is done (reported {}) or fence {} failed (reported {})",
                        m.done_floor(),
                        m.reported.0,
                        m.known_failed,
                        m.reported.1
                    );
                }
            }
        }
        if ri != a.count as usize {
            let r = recs[ri];
            fail!(
                "QUEUE_EVENTS: record {ri} is for engine {} queue {}, not a queue of this file in its order",
                r.engine,
                r.queue
            );
        }
        if a.count > 0 {
            fact("queue event records", u64::from(a.count));
        }
    }

    /// Checks one `QUEUE_EVENTS` record of queue slot `q` and learns from it.
    pub(crate) fn event_record(&mut self, q: usize, rec: &sys::neuron_udma_queue_event, what: &str) {
        let m = self.queues[q].as_mut().expect("queue");
        let completed = rec.flags & sys::NEURON_UDMA_EVENT_COMPLETED != 0;
        let failed = rec.flags & sys::NEURON_UDMA_EVENT_FAILED != 0;
        let c = rec.completed;
        let (floor, ceiling) = (m.done_floor(), m.done_ceiling());
        let bad_done = if completed {
            c <= m.reported.0 || c < floor || c > ceiling || m.may(c) & fs::DONE == 0
        } else {
            c != m.reported.0 || floor > m.reported.0
        };
        let fail_bit = match rec.error {
            EIO => fs::FAIL_EIO,
            ETIMEDOUT => fs::FAIL_TMO,
            _ => 0,
        };
        let bad_fail = if failed {
            rec.failed <= m.reported.1
                || rec.failed < m.known_failed
                || rec.failed > m.newest.1
                || m.may(rec.failed) & fail_bit == 0
        } else {
            rec.failed != 0 || rec.error != 0 || m.known_failed > m.reported.1
        };
        if rec.flags == 0 || rec.flags & !3 != 0 || bad_done || bad_fail {
            fail!(
                "{what}: flags {:#x} completed {c} failed {} error {}; the model says done {floor}..={ceiling} (reported {}), failed at least {} (reported {})",
                rec.flags,
                rec.failed,
                rec.error,
                m.reported.0,
                m.known_failed,
                m.reported.1
            );
        }
        m.reported.0 = c;
        if failed {
            m.reported.1 = rec.failed;
            m.set_may(rec.failed, fail_bit);
        }
        let landed = m.done(c);
        self.land_all(landed);
    }

    /// `QUEUE_EVENTFD` on queue slot `q` (`how` 0: a new eventfd, 1: unregister, 2: read the
    /// eventfd and check its count, 3: a descriptor that is not an eventfd, 4: one that is not
    /// open, 5: reserved).
    pub(crate) fn eventfd(&mut self, other: u8, q: usize, how: u8) {
        let q = self.qslot(q);
        self.refresh(q);
        self.resync(q);
        let f = self.qfile(q, other);
        let owned = self.queues[q].as_ref().is_some_and(|m| m.owner == f);
        let how = how % 6;
        if how == 2 {
            if owned && self.queues[q].as_ref().is_some_and(|m| m.eventfd.is_some()) {
                self.eventfd_check(q);
            }
            return;
        }
        let (engine, queue, _) = slot_queue(q);
        let new = if how == 0 { Some(eventfd().unwrap_or_else(|e| fail!("eventfd: {}", name(e)))) } else { None };
        let fd = match how {
            0 => new.as_ref().expect("eventfd").as_raw_fd(),
            3 => self.devs[f].raw(),
            4 => 999_999,
            _ => -1,
        };
        let mut a = sys::neuron_udma_eventfd { engine, queue, fd, reserved: u32::from(how == 5) };
        let errs = match how {
            5 => vec![EINVAL],
            _ if !owned => vec![ENOENT],
            3 => vec![EINVAL],
            4 => vec![EBADF],
            _ => vec![],
        };
        let r = ioctl_ret(self.devs[f].raw(), abi3::QUEUE_EVENTFD, &mut a);
        let what = format!(
            "QUEUE_EVENTFD {} on queue slot {q}",
            ["register", "unregister", "", "of a device file", "of a closed descriptor", "with reserved set"]
                [how as usize]
        );
        if expect(&what, r, errs.is_empty(), &errs).is_err() {
            return;
        }
        let m = self.queues[q].as_mut().expect("owned");
        m.eventfd = new.map(|fd| EventFdM { fd, base: (m.settled_floor(), m.newest.1), read: 0 });
    }

    /// Reads the eventfd of queue slot `q`: it counts one per fence settled since it was
    /// registered. Once every fence is known settled, the count must reach that number (the
    /// completion engine signals it) and not pass it.
    fn eventfd_check(&mut self, q: usize) {
        let m = self.queues[q].as_mut().expect("queue");
        let newest = m.newest.1;
        let all = m.newest.0 == newest && m.settled_floor() == newest;
        let ev = m.eventfd.as_mut().expect("eventfd");
        let fd = ev.fd.as_raw_fd();
        let (lo, hi) = (newest.saturating_sub(ev.base.1), newest.saturating_sub(ev.base.0));
        ev.read += eventfd_take(fd);
        if all {
            let t = Instant::now();
            while ev.read < lo && t.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(1));
                ev.read += eventfd_take(fd);
            }
            std::thread::sleep(Duration::from_millis(2));
            ev.read += eventfd_take(fd);
            if ev.read < lo || ev.read > hi {
                fail!(
                    "eventfd of queue slot {q}: counted {} fences, but fences {}..={newest} settled since it was registered ({lo}..={hi}); waited {:?}",
                    ev.read,
                    ev.base.1 + 1,
                    t.elapsed()
                );
            }
            ev.base = (newest - ev.read, newest - ev.read);
            fact("eventfd counts checked", 1);
        } else if ev.read > hi {
            fail!(
                "eventfd of queue slot {q}: counted {} fences, at most {hi} settled since it was registered",
                ev.read
            );
        }
    }

    /// `poll()` of file `f`: `EPOLLIN` while a queue has fences done that `QUEUE_EVENTS` has
    /// not reported, `EPOLLPRI | EPOLLERR` for failures. `how` 1 blocks (5 s at most) when a
    /// fence in flight of a healthy queue must complete.
    pub(crate) fn poll(&mut self, f: usize, how: u8) {
        self.files[f].polled = true;
        let owned: Vec<usize> =
            (0..QUEUE_SLOTS).filter(|&q| self.queues[q].as_ref().is_some_and(|m| m.owner == f)).collect();
        let (mut must_in, mut may_in, mut must_err, mut may_err, mut will_complete) =
            (false, false, false, false, false);
        for &q in &owned {
            self.refresh(q);
            self.resync(q);
            let lenient = self.lenient(q);
            let m = self.queues[q].as_ref().expect("queue");
            must_in |= m.done_floor() > m.reported.0;
            may_in |= m.done_ceiling() > m.reported.0;
            must_err |= m.known_failed > m.reported.1;
            may_err |= m.may_have_failed_after(m.reported.1);
            will_complete |= !lenient && m.newest.1 > m.reported.0 && m.may(m.newest.1) & fs::PENDING != 0;
        }
        let block = how % 4 == 1 && will_complete && !may_err;
        let t = Instant::now();
        let revents =
            poll(self.devs[f].raw(), if block { 5000 } else { 0 }).unwrap_or_else(|e| fail!("poll: {}", name(e)));
        let got_in = revents & libc::POLLIN != 0;
        let got_err = revents & (libc::POLLPRI | libc::POLLERR) != 0;
        crate::fuzz::count(Ok(()));
        let bad = (must_in && !got_in)
            || (!may_in && got_in)
            || (must_err && !got_err)
            || (!may_err && got_err)
            || (block && !got_in)
            || revents & libc::POLLHUP != 0
            || (got_in && revents & libc::POLLRDNORM == 0);
        if bad {
            // Each queue of the file as the model and the driver (`FENCE_STATUS`) see it.
            let queues: Vec<String> = owned
                .iter()
                .map(|&q| {
                    let m = self.queues[q].as_ref().expect("queue");
                    let (engine, queue, _) = slot_queue(q);
                    let mut a = sys::neuron_udma_fence_status { engine, queue, fence: m.first, ..Default::default() };
                    let driver = match ioctl_ret(self.devs[f].raw(), abi3::FENCE_STATUS, &mut a) {
                        Ok(_) => format!("completed {} submitted {}", a.completed, a.submitted),
                        Err(e) => format!("FENCE_STATUS {}", name(e)),
                    };
                    format!(
                        "slot {q}: fences {}..={} done {} reported {:?}, driver: {driver}",
                        m.newest.0,
                        m.newest.1,
                        m.done_floor(),
                        m.reported
                    )
                })
                .collect();
            fail!(
                "poll{}: revents {revents:#x} after {:?}; the model says EPOLLIN {}, EPOLLPRI|EPOLLERR {} ({})",
                if block { " (blocking, a fence in flight must complete)" } else { "" },
                t.elapsed(),
                if must_in {
                    "set"
                } else if may_in {
                    "either"
                } else {
                    "clear"
                },
                if must_err {
                    "set"
                } else if may_err {
                    "either"
                } else {
                    "clear"
                },
                queues.join("; ")
            );
        }
        if block {
            fact("blocking polls woken by a completion", 1);
        }
    }
}
