// SPDX-License-Identifier: GPL-2.0
//! `udma-sim`: a software model of the AWS Neuron UDMA (M2M) engine.
//!
//! The [`Device`] is usable without QEMU: tests and benchmarks drive it through
//! the same BAR0/BAR2/BAR4 entry points ([`Device::bar0_write`] etc.) that the
//! vfio-user server ([`server`]) uses. Host memory is any
//! [`mem::GuestMemory`]; device memory (HBM) is a memfd-backed
//! [`mem::FlatMemory`] exposed as BAR4.
//!
//! Behaviour follows `Documentation/hardware.rst` §1-4 and §8; model-specific
//! choices are documented in `Documentation/udma-sim.rst`.

pub mod control;
pub mod engine;
pub mod fault;
pub mod layout;
pub mod mem;
pub mod peer;
pub mod regs;
pub mod server;
pub mod trace;

use engine::{Engine, ErrorRecord, Memories};
use fault::{CounterValues, Fault};
use layout::{Gen, Model};
use mem::{FlatMemory, GuestMemory};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Device construction parameters.
#[derive(Clone, Debug)]
pub struct Config {
    /// Chip model (PCI id, engine layout, address routing).
    pub model: Model,
    /// HBM (BAR4) size in bytes.
    pub hbm_size: u64,
    /// Descriptor trace file, if any.
    pub trace: Option<PathBuf>,
    /// Behaviour where hardware.rst only infers what the silicon does (\[I\] rules).
    pub options: Options,
}

/// Model choices for the rules hardware.rst marks as inference \[I\]; [`Options::default`] is the
/// strict setting (as strict as the silicon may be), [`Options::lenient`] the old model.
/// `Documentation/udma-sim.rst` ("Strictness") lists every rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Unordered completion (hardware.rst §4.2 bit 30, §4.3 bit 26, §5.1, §8.2 item 7): the writes
    /// of a packet without DMB or write barrier longer than [`engine::POSTED_WRITE_MAX`] bytes are
    /// held for this long (or until a later DMB packet, or a write-barrier packet completes),
    /// while later packets' writes land. `None`: every packet lands in order at once.
    pub unordered_delay: Option<Duration>,
    /// V3 SENG engines outside 32i + {4-7, 12-15, 20-23, 28-31} cannot reach host memory
    /// (hardware.rst §2.5: "assume they cannot \[I\]"). `false`: every engine reaches host memory.
    pub host_connectivity: bool,
    /// Registers the driver must program reset to values that do not help it (hardware.rst §8.1
    /// \[I\]): `cfg_len` 0 (no 64 KiB encoding, maximum packet 0), `desc_pref_cfg_2` 0, IOFIC masks
    /// and abort masks all ones. `false`: driver-like values.
    pub strict_reset: bool,
    /// An abort ends only by change_state NORMAL, and cause bits stay until software clears
    /// them (hardware.rst §3.5, §8.3 \[I\]). `false`: a queue reset plus re-enable also clears the
    /// abort and that error's cause bits.
    pub sticky_errors: bool,
    /// Device-memory reads pass the queue's unordered writes (hardware.rst §4.2 bit 30, §8.2
    /// \[I\]): a packet without DMB reads, for device bytes an earlier packet of the queue wrote
    /// since its last DMB (within the unordered delay), what was there before. `false`: such a
    /// read lands the held writes it overlaps first, as a host-memory read does, and sees the
    /// queue's unpublished device writes ([`Options::private_device_writes`]).
    pub unordered_device_reads: bool,
    /// A queue's device-memory writes are its own until it publishes them (hardware.rst §4.2
    /// bit 30: DMB orders a queue's own transfers only, §5.1 \[I\]): other queues and engines, and
    /// the CPU through BAR4, read the old bytes until a later DMB packet of the queue (the
    /// driver's fence marker), the queue going idle, or the unordered-completion delay. `false`:
    /// a device-memory write is visible to every reader once it lands, the writing queue's own
    /// later reads included.
    pub private_device_writes: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            unordered_delay: Some(Duration::from_millis(100)),
            host_connectivity: true,
            strict_reset: true,
            sticky_errors: true,
            unordered_device_reads: true,
            private_device_writes: true,
        }
    }
}

impl Options {
    /// The lenient model of earlier versions: in-order completion, host memory from every
    /// engine, driver-like reset values, queue re-init clears an abort.
    pub fn lenient() -> Options {
        Options {
            unordered_delay: None,
            host_connectivity: false,
            strict_reset: false,
            sticky_errors: false,
            unordered_device_reads: false,
            private_device_writes: false,
        }
    }
}

/// The last error raised on any engine (for BAR2 and the control socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastError {
    /// Engine id.
    pub engine: u32,
    /// The error.
    pub record: ErrorRecord,
}

/// The settings every engine worker reads per packet, on cache lines of their own: the locks
/// beside them in [`Shared`] (last error, BAR2 staging) are written by other threads.
#[repr(align(128))]
pub(crate) struct Knobs {
    /// PCI bus-master enable.
    pub(crate) bus_master: AtomicBool,
    /// Slow-down factor.
    pub(crate) slow: AtomicU32,
}

/// State shared between the device front end and the engine workers.
pub(crate) struct Shared {
    pub(crate) model: Model,
    pub(crate) gen: Gen,
    pub(crate) options: Options,
    pub(crate) host: Arc<dyn GuestMemory>,
    pub(crate) hbm: Arc<FlatMemory>,
    pub(crate) hbm_map: Arc<mem::HbmMap>,
    pub(crate) engines: Vec<OnceLock<Arc<Engine>>>,
    /// Read by every worker for every packet; written only when the guest changes them.
    pub(crate) knobs: Knobs,
    pub(crate) tracer: Option<Arc<trace::Tracer>>,
    pub(crate) last_error: Mutex<Option<LastError>>,
    pub(crate) bar2: Mutex<control::Bar2Stage>,
}

/// The simulated PCI function: BAR0 engines, BAR2 model-control window, BAR4 HBM.
pub struct Device {
    shared: Arc<Shared>,
    /// Engine worker threads, by engine id.
    workers: Mutex<Vec<(u32, JoinHandle<()>)>>,
}

impl Device {
    /// Creates a device whose DMA reaches host memory through `host`.
    pub fn new(cfg: Config, host: Arc<dyn GuestMemory>) -> std::io::Result<Device> {
        let gen = cfg.model.gen();
        let hbm_len = usize::try_from(cfg.hbm_size).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let hbm = Arc::new(FlatMemory::memfd(0, hbm_len, "udma-sim-hbm")?);
        let tracer = match &cfg.trace {
            Some(p) => Some(Arc::new(trace::Tracer::create(p)?)),
            None => None,
        };
        Ok(Device {
            shared: Arc::new(Shared {
                model: cfg.model,
                gen,
                options: cfg.options.clone(),
                host,
                hbm_map: Arc::new(mem::HbmMap::new(gen, hbm.clone())),
                hbm,
                engines: (0..gen.engine_count()).map(|_| OnceLock::new()).collect(),
                knobs: Knobs { bus_master: AtomicBool::new(true), slow: AtomicU32::new(0) },
                tracer,
                last_error: Mutex::new(None),
                bar2: Mutex::new(control::Bar2Stage::default()),
            }),
            workers: Mutex::new(Vec::new()),
        })
    }

    /// Chip model.
    pub fn model(&self) -> Model {
        self.shared.model
    }

    /// Architecture generation.
    pub fn gen(&self) -> Gen {
        self.shared.gen
    }

    /// HBM (BAR4 backing), by BAR4 offset; [`Device::hbm_map`] maps device addresses to it.
    pub fn hbm(&self) -> &Arc<FlatMemory> {
        &self.shared.hbm
    }

    /// Sets PCI bus-master enable (config command bit 2). While clear, every
    /// DMA attempt aborts the engine (`bus_master_off`). Default: enabled.
    pub fn set_bus_master(&self, on: bool) {
        self.shared.knobs.bus_master.store(on, Ordering::Relaxed);
    }

    /// The engine with id `id`, allocated on first use.
    pub fn engine(&self, id: u32) -> Option<&Arc<Engine>> {
        let slot = self.shared.engines.get(id as usize)?;
        Some(slot.get_or_init(|| Arc::new(Engine::new(id, self.shared.gen, &self.shared.options))))
    }

    fn ensure_worker(&self, eng: &Arc<Engine>) {
        if !eng.claim_worker() {
            eng.kick();
            return;
        }
        let shared = self.shared.clone();
        let e2 = eng.clone();
        let h = std::thread::Builder::new().name(format!("udma-eng{}", eng.id)).spawn(move || {
            // Everything the worker reaches is borrowed for the thread's life; host memory
            // through the worker's own reader (see `mem::MemReader`).
            let mut mem = Memories {
                gen: shared.gen,
                host: shared.host.reader(),
                hbm: &*shared.hbm_map,
                bus_master: &shared.knobs.bus_master,
                slow: &shared.knobs.slow,
                trace: shared.tracer.as_deref(),
            };
            let on_error = |rec: ErrorRecord| {
                *shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(LastError { engine: e2.id, record: rec });
            };
            e2.run(&mut mem, &on_error);
        });
        match h {
            Ok(h) => self.workers.lock().unwrap_or_else(|e| e.into_inner()).push((eng.id, h)),
            Err(e) => log::error!("cannot spawn worker for engine {}: {e}", eng.id),
        }
    }

    /// Device memory by device address (hardware.rst §1.3 HBM windows over BAR4).
    pub fn hbm_map(&self) -> &Arc<mem::HbmMap> {
        &self.shared.hbm_map
    }

    /// Posted writes held by unordered completion, summed over all engines (packets).
    pub fn held_writes(&self) -> usize {
        self.shared.engines.iter().filter_map(|s| s.get()).map(|e| e.held_writes()).sum()
    }

    /// CPU time used so far by the worker thread of engine `engine` (its
    /// `CLOCK_THREAD_CPUTIME_ID`, read through `pthread_getcpuclockid`); `None` if the engine has
    /// no worker yet. For benchmarks.
    pub fn worker_cpu_time(&self, engine: u32) -> Option<Duration> {
        use std::os::unix::thread::JoinHandleExt;
        let workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        let (_, h) = workers.iter().find(|(id, _)| *id == engine)?;
        let mut clk: libc::clockid_t = 0;
        // SAFETY: the pthread_t belongs to a thread that is not joined yet (joined only in Drop,
        // which cannot run while `workers` is borrowed); `clk` is a valid out pointer.
        if unsafe { libc::pthread_getcpuclockid(h.as_pthread_t(), &mut clk) } != 0 {
            return None;
        }
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid out pointer.
        if unsafe { libc::clock_gettime(clk, &mut ts) } != 0 {
            return None;
        }
        Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// Model options.
    pub fn options(&self) -> &Options {
        &self.shared.options
    }

    /// Reads a 32-bit BAR0 register at byte offset `off`.
    pub fn read32(&self, off: u64) -> u32 {
        match self.shared.gen.decode_bar0(off) {
            Some((id, unit)) => self.engine(id).map_or(0, |e| e.read(unit & !3)),
            None => {
                log::debug!("BAR0 read of unmodelled offset 0x{off:x}");
                0
            }
        }
    }

    /// Writes a 32-bit BAR0 register at byte offset `off`. Returns at once; DMA
    /// runs on the engine's worker thread.
    pub fn write32(&self, off: u64, val: u32) {
        let Some((id, unit)) = self.shared.gen.decode_bar0(off) else {
            log::debug!("BAR0 write of unmodelled offset 0x{off:x} = 0x{val:x} ignored");
            return;
        };
        let Some(eng) = self.engine(id) else { return };
        // What an Rx doorbell's prefetch reads the posted descriptors through, at once.
        let env = engine::Env {
            gen: self.shared.gen,
            host: &*self.shared.host,
            hbm: &*self.shared.hbm_map,
            bus_master: self.shared.knobs.bus_master.load(Ordering::Relaxed),
            slow: 0,
            trace: None,
        };
        let fx = eng.write(unit & !3, val, &env);
        if let Some(rec) = fx.error {
            *self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(LastError { engine: id, record: rec });
        }
        if fx.kick {
            self.ensure_worker(eng);
        }
    }

    /// BAR0 read. Registers are accessed with aligned 32-bit reads only (hardware.rst §0,
    /// `writel`/`readl`); any other size or alignment is logged as an error and reads all ones
    /// (as an unclaimed PCIe read does).
    pub fn bar0_read(&self, off: u64, data: &mut [u8]) {
        if data.len() != 4 || off & 3 != 0 {
            log::error!("BAR0 read of {} bytes at 0x{off:x}: registers are 32-bit only; reads all ones", data.len());
            data.fill(0xFF);
            return;
        }
        data.copy_from_slice(&self.read32(off).to_le_bytes());
    }

    /// BAR0 write. Only aligned 32-bit writes reach a register (hardware.rst §0); any other size or
    /// alignment is logged as an error and dropped.
    pub fn bar0_write(&self, off: u64, data: &[u8]) {
        if data.len() != 4 || off & 3 != 0 {
            log::error!("BAR0 write of {} bytes at 0x{off:x}: registers are 32-bit only; dropped", data.len());
            return;
        }
        self.write32(off, u32::from_le_bytes([data[0], data[1], data[2], data[3]]));
    }

    /// BAR4 (HBM) read; out-of-range bytes read as 0.
    pub fn bar4_read(&self, off: u64, data: &mut [u8]) {
        if !self.shared.hbm.read(off, data) {
            data.fill(0);
        }
    }

    /// BAR4 (HBM) write; out-of-range writes are ignored.
    pub fn bar4_write(&self, off: u64, data: &[u8]) {
        if !self.shared.hbm.is_mapped(off, data.len()) || !self.shared.hbm.write(off, data) {
            log::debug!("BAR4 write outside HBM at 0x{off:x} ignored");
        }
    }

    /// Applies a fault (control socket / BAR2).
    pub fn inject(&self, f: Fault) -> Result<(), String> {
        let eng = |id: u32| self.engine(id).cloned().ok_or_else(|| format!("no engine {id}"));
        let queue = |q: u32| {
            if (q as usize) < regs::QUEUES_PER_ENGINE {
                Ok(q as usize)
            } else {
                Err(format!("no queue {q}"))
            }
        };
        match f {
            Fault::FailNth { engine, queue: q, n } => eng(engine)?.inject_fail_nth(queue(q)?, n),
            Fault::Abort { engine } => {
                let e = eng(engine)?;
                let rec = e.inject_abort();
                *self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(LastError { engine, record: rec });
            }
            Fault::Stall { engine, queue: q, ms } => {
                let e = eng(engine)?;
                e.inject_stall(queue(q)?, Duration::from_millis(u64::from(ms)));
            }
            Fault::Slow { factor } => self.shared.knobs.slow.store(factor, Ordering::Relaxed),
        }
        log::info!("fault injected: {f:?}");
        Ok(())
    }

    /// Clears all faults, counters and the last error.
    pub fn clear(&self) {
        self.shared.knobs.slow.store(0, Ordering::Relaxed);
        for e in self.shared.engines.iter().filter_map(|s| s.get()) {
            e.clear_faults();
            e.clear_counters();
        }
        *self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Counters summed over all engines.
    pub fn counters(&self) -> CounterValues {
        self.shared.engines.iter().filter_map(|s| s.get()).fold(CounterValues::default(), |a, e| a.sum(e.counters()))
    }

    /// Counters of every allocated engine that did something.
    pub fn engine_counters(&self) -> Vec<(u32, CounterValues)> {
        self.shared
            .engines
            .iter()
            .filter_map(|s| s.get())
            .map(|e| (e.id, e.counters()))
            .filter(|(_, c)| *c != CounterValues::default())
            .collect()
    }

    /// The most recent error on any engine.
    pub fn last_error(&self) -> Option<LastError> {
        *self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Device reset (vfio-user DEVICE_RESET): all engines return to power-on
    /// state, faults and counters are cleared.
    pub fn reset(&self) {
        for e in self.shared.engines.iter().filter_map(|s| s.get()) {
            e.reset();
        }
        self.clear();
        *self.shared.bar2.lock().unwrap_or_else(|e| e.into_inner()) = control::Bar2Stage::default();
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        for e in self.shared.engines.iter().filter_map(|s| s.get()) {
            e.shutdown();
        }
        for (_, h) in self.workers.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = h.join();
        }
    }
}

/// Splits `[off, off+len)` into 32-bit words: f(word_addr, byte_in_word, count, data_index).
fn for_each_word(off: u64, len: usize, mut f: impl FnMut(u64, usize, usize, usize)) {
    let mut at = 0usize;
    while at < len {
        let a = off.wrapping_add(at as u64);
        let word = a & !3;
        let lo = (a & 3) as usize;
        let n = (4 - lo).min(len - at);
        f(word, lo, n, at);
        at += n;
    }
}

/// Parses a size such as `64M`, `1G`, `4096`, `512K` into bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult).filter(|&v| v > 0)
}
