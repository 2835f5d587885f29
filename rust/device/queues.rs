// SPDX-License-Identifier: GPL-2.0

//! The queue table of a bound device: taking a queue for an owner (its rings in host memory,
//! or in device memory filled through BAR4 or by the H2T queue), finding it by owner, listing
//! the queues in use, and releasing one (pause, then its ring memory given back).

use super::UdmaDevice;
use crate::{
    channel::{Channel, Gone, Owner},
    charge::Charge,
    devring::{DeviceMemory, Fill},
    engine::QueueId,
    events::FileEvents,
    queue::Queue,
    resident::Resident,
    ring::RingSize,
};
use kernel::{prelude::*, sync::Arc};

impl UdmaDevice {
    /// Takes queue `id` for `owner` with rings in host memory ([`Self::queue_init_placed`]).
    ///
    /// # Errors
    ///
    /// See [`Self::queue_init_placed`].
    pub(crate) fn queue_init(
        &self,
        id: QueueId,
        tx_descs: u32,
        rx_descs: u32,
        owner: Owner,
        events: Option<Arc<FileEvents>>,
    ) -> Result<Arc<Channel>> {
        self.queue_init_placed(id, (tx_descs, rx_descs), owner, events, false, 1)
    }

    /// Whether queues may keep their rings in device memory: the device has device memory to
    /// give out.
    pub(crate) fn has_device_rings(&self) -> bool {
        self.devmem.is_some() && self.pool.dram_capacity() > 0
    }

    /// Takes queue `id` for `owner`: allocates rings of `tx_descs`/`rx_descs` descriptors (in
    /// device memory, from the device-memory allocator, with `device_rings`: `devring.rs`),
    /// initialises the engine if needed and programs the queue (hardware.rst §3.7); a file's
    /// queue wakes the file's pollers `events`. Its fences are numbered from `first_fence` on
    /// (1, or where the file's previous instance of `id` stopped: [`Quiesced::next_fence`]).
    ///
    /// [`Quiesced::next_fence`]: crate::channel::Quiesced::next_fence
    ///
    /// # Errors
    ///
    /// `EINVAL` for a bad ring size, `EBUSY` if the queue is in use or (for a file) reserved
    /// by the driver, `ENOMEM` (also when a file's queue memory would exceed
    /// `RLIMIT_MEMLOCK`, or no device memory is left for `device_rings`), `EOPNOTSUPP` for
    /// `device_rings` without device memory, `EIO` while the device is reset (`reset.rs`),
    /// `ENODEV` after unbind.
    pub(crate) fn queue_init_placed(
        &self,
        id: QueueId,
        sizes: (u32, u32),
        owner: Owner,
        events: Option<Arc<FileEvents>>,
        device_rings: bool,
        first_fence: u64,
    ) -> Result<Arc<Channel>> {
        // How descriptors reach rings in device memory: the module parameter, read now.
        let fill = match (device_rings, crate::kfac::sysfs::device_rings_by_engine()) {
            (false, _) => None,
            (true, false) => Some(Fill::Bar4),
            (true, true) => Some(Fill::Engine),
        };
        self.queue_init_filled(id, sizes, owner, events, fill, first_fence)
    }

    /// [`Self::queue_init_placed`] with the rings in host memory (`fill` `None`) or in device
    /// memory, filled by `fill`.
    ///
    /// # Errors
    ///
    /// See [`Self::queue_init_placed`].
    pub(crate) fn queue_init_filled(
        &self,
        id: QueueId,
        (tx_descs, rx_descs): (u32, u32),
        owner: Owner,
        events: Option<Arc<FileEvents>>,
        fill: Option<Fill>,
        first_fence: u64,
    ) -> Result<Arc<Channel>> {
        if owner != Owner::Driver && self.arch.is_reserved_queue(id.eng.get(), id.q.number()) {
            return Err(EBUSY);
        }
        // A file's queue is pinned memory like a host buffer: charged to RLIMIT_MEMLOCK (after
        // the sizes are validated, so that a bad size is EINVAL, not ENOMEM).
        for (ring, n) in [("tx", tx_descs), ("rx", rx_descs)] {
            if let Some(why) = RingSize::problem(n) {
                // Debug level: user space can trigger it at will.
                pr_debug!(
                    "queue {}/{}: {} ring of {} descriptors: {}\n",
                    id.eng.get(),
                    id.q.number(),
                    ring,
                    n,
                    why
                );
                return Err(EINVAL);
            }
        }
        // Rings in device memory: who moves their descriptors when the engine fills them (the
        // H2T queue, taken before the state lock).
        let mover = match fill {
            None => None,
            Some(_) if !self.has_device_rings() => return Err(EOPNOTSUPP),
            Some(Fill::Bar4) => None,
            Some(Fill::Engine) => Some(self.h2t()?.channel()),
        };
        let dram = match fill {
            Some(_) => {
                let len = Queue::device_bytes(tx_descs, rx_descs)?;
                Some((self.pool.alloc_dram(len)?, len))
            }
            None => None,
        };
        let r = self.with_bound(|dev| {
            // Under the state lock, which a device reset's stop takes to close the gate.
            self.bar.check()?;
            if self.queues.lock().get(id.key()).is_some() {
                return Err(EBUSY);
            }
            let charge = match owner {
                Owner::Driver => None,
                Owner::File(_) => Some(Charge::new(Queue::memory_bytes(tx_descs, rx_descs))?),
            };
            // A file's queue keeps the buffers its copies name (`resident.rs`); made before the
            // engine is programmed, as everything that can fail.
            let resident = match owner {
                Owner::Driver => None,
                Owner::File(f) => Some(KBox::pin_init(
                    Resident::new(self.pool.shard(f).clone()),
                    GFP_KERNEL_ACCOUNT,
                )?),
            };
            let device = match (dram, fill, &self.devmem) {
                (Some((base, len)), Some(fill), Some(mem)) => Some(DeviceMemory {
                    mem: mem.clone(),
                    base,
                    len,
                    fill,
                }),
                _ => None,
            };
            let mut q = Queue::new(
                dev,
                self.arch,
                id.q,
                (tx_descs, rx_descs),
                device,
                first_fence,
            )?;
            self.bar.ensure_engine(id.eng)?;
            {
                let regs = self.bar.access()?;
                q.hw_init(regs.engine(id.eng)?);
            }
            let chan = Channel::new(
                (self.bar.clone(), self.counters.clone()),
                (id, owner),
                q,
                mover,
                (charge, resident),
                events,
            )?;
            // The table's lock goes before the quiesce below (which sleeps).
            let stored = self
                .queues
                .lock()
                .store(id.key(), chan.clone(), GFP_KERNEL_ACCOUNT);
            if let Err(e) = stored {
                // The device memory is given back below. Never published: no call uses its set.
                let _ = chan.quiesce(Gone::Released);
                chan.end_resident();
                return Err(e.into());
            }
            Ok(chan)
        });
        if r.is_err() {
            self.give_back_rings(dram);
        }
        r
    }

    /// Gives back the device memory `(device address, bytes)` of a queue whose rings were there,
    /// once the engine no longer uses it: scrubbed (it held the queue's descriptors, the device
    /// addresses of the owner's buffers), then freed.
    pub(super) fn give_back_rings(&self, range: Option<(u64, u64)>) {
        const CHUNK: u64 = 64 << 10;
        let Some((addr, len)) = range else {
            return;
        };
        if let Some(mem) = &self.devmem {
            // In chunks, each in its own BAR4 guard (an RCU read section).
            let mut at = 0;
            while at < len {
                let n = (len - at).min(CHUNK);
                if mem.access().and_then(|io| io.zero(addr + at, n)).is_err() {
                    // Unbound: the allocator goes away with the device.
                    break;
                }
                at += n;
            }
        }
        self.pool.free_dram(addr);
    }

    /// [`Self::queue_init`] of queue `qid` of engine `eng` (KUnit: numbers as the suites
    /// write them).
    ///
    /// # Errors
    ///
    /// `EINVAL` for an engine or queue that does not exist; those of [`Self::queue_init`].
    #[cfg(any(neuron_udma_kunit, neuron_udma_bench))]
    pub(crate) fn queue_init_at(
        &self,
        eng: u32,
        qid: u32,
        tx_descs: u32,
        rx_descs: u32,
        owner: Owner,
    ) -> Result<Arc<Channel>> {
        let id = QueueId::new(self.arch, eng, qid).ok_or(EINVAL)?;
        self.queue_init(id, tx_descs, rx_descs, owner, None)
    }

    /// The completion engine's state for debugfs ([`Completer::state`]).
    pub(crate) fn completer_state(&self) -> (bool, usize) {
        self.completer.state()
    }

    /// Queue `id` if `owner` holds it.
    ///
    /// # Errors
    ///
    /// `ENOENT` if the queue is not in use by `owner`, `ENODEV` if it is gone because the device
    /// was unbound.
    pub(crate) fn queue(&self, owner: Owner, id: QueueId) -> Result<Arc<Channel>> {
        let xa = self.queues.lock();
        // [`Self::shutdown`] marks the device dead before it empties the table under this lock:
        // a call that raced with the unbind finds no queue and must say why.
        let chan = xa
            .get(id.key())
            .ok_or_else(|| if self.is_alive() { ENOENT } else { ENODEV })?;
        if chan.owner != owner {
            return Err(ENOENT);
        }
        Ok(chan.into())
    }

    /// The queues in use (driver's and files'), by engine and queue id.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn queues(&self) -> Result<KVec<Arc<Channel>>> {
        let mut v = KVec::new();
        for key in 0..self.queue_keys() {
            let chan = self.queues.lock().get(key).map(Arc::from);
            if let Some(chan) = chan {
                v.push(chan, GFP_KERNEL)?;
            }
        }
        Ok(v)
    }

    /// Keys of the queue table: one per queue of every engine.
    pub(super) fn queue_keys(&self) -> usize {
        (self.arch.engines * crate::arch::QUEUES_PER_ENGINE) as usize
    }

    /// Releases queue `id` of `owner`: pauses it and frees its rings; whoever still holds the
    /// instance sees `ECANCELED`. Returns the fence number the instance would have given next
    /// ([`Quiesced::next_fence`]).
    ///
    /// # Errors
    ///
    /// `ENOENT` if the queue is not in use by `owner`; nothing changes then.
    ///
    /// [`Quiesced::next_fence`]: crate::channel::Quiesced::next_fence
    pub(crate) fn queue_release(&self, owner: Owner, id: QueueId) -> Result<u64> {
        let (chan, gone) = {
            let _st = self.state.lock();
            let chan = self.queue(owner, id)?;
            // Paused before the id is free: a QUEUE_INIT of the id (by any file) cannot take it
            // while the old instance still runs, nor be paused by this release, and a lookup by
            // id meanwhile (an IOPOLL command's) finds the old instance until it is stopped.
            let gone = chan.quiesce(Gone::Released);
            drop(self.queues.lock().remove(id.key()));
            (chan, gone)
        };
        // Outside the state lock: it may wait for a prepare call building its batch.
        chan.end_resident();
        self.give_back_rings(gone.range);
        Ok(gone.next_fence)
    }
}
