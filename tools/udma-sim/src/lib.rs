//! `udma-sim`: a software model of the AWS Neuron UDMA (M2M) engine.
//!
//! The [`Device`] is usable without QEMU: tests and benchmarks drive it through
//! the same BAR0/BAR2/BAR4 entry points ([`Device::bar0_write`] etc.) that the
//! vfio-user server ([`server`]) uses. Host memory is any
//! [`mem::GuestMemory`]; device memory (HBM) is a memfd-backed
//! [`mem::FlatMemory`] exposed as BAR4.
//!
//! Behaviour follows `shared/spec/udma-hw-spec.md` §1-4 and §8; model-specific
//! choices are documented in `Documentation/udma-sim.rst`.

pub mod control;
pub mod engine;
pub mod fault;
pub mod layout;
pub mod mem;
pub mod regs;
pub mod server;
pub mod trace;

use engine::{Engine, EnvOwned, ErrorRecord};
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
}

/// The last error raised on any engine (for BAR2 and the control socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastError {
    /// Engine id.
    pub engine: u32,
    /// The error.
    pub record: ErrorRecord,
}

/// State shared between the device front end and the engine workers.
pub(crate) struct Shared {
    pub(crate) model: Model,
    pub(crate) gen: Gen,
    pub(crate) host: Arc<dyn GuestMemory>,
    pub(crate) hbm: Arc<FlatMemory>,
    pub(crate) engines: Vec<OnceLock<Arc<Engine>>>,
    pub(crate) bus_master: AtomicBool,
    pub(crate) slow: AtomicU32,
    pub(crate) tracer: Option<Arc<trace::Tracer>>,
    pub(crate) last_error: Mutex<Option<LastError>>,
    pub(crate) bar2: Mutex<control::Bar2Stage>,
}

/// The simulated PCI function: BAR0 engines, BAR2 model-control window, BAR4 HBM.
pub struct Device {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
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
                host,
                hbm,
                engines: (0..gen.engine_count()).map(|_| OnceLock::new()).collect(),
                bus_master: AtomicBool::new(true),
                slow: AtomicU32::new(0),
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

    /// HBM (BAR4 backing), device address 0 = BAR4 offset 0.
    pub fn hbm(&self) -> &Arc<FlatMemory> {
        &self.shared.hbm
    }

    /// Sets PCI bus-master enable (config command bit 2). While clear, every
    /// DMA attempt aborts the engine (`bus_master_off`). Default: enabled.
    pub fn set_bus_master(&self, on: bool) {
        self.shared.bus_master.store(on, Ordering::Relaxed);
    }

    /// The engine with id `id`, allocated on first use.
    pub fn engine(&self, id: u32) -> Option<&Arc<Engine>> {
        let slot = self.shared.engines.get(id as usize)?;
        Some(slot.get_or_init(|| Arc::new(Engine::new(id))))
    }

    fn ensure_worker(&self, eng: &Arc<Engine>) {
        if !eng.claim_worker() {
            eng.kick();
            return;
        }
        let shared = self.shared.clone();
        let e2 = eng.clone();
        let h = std::thread::Builder::new().name(format!("udma-eng{}", eng.id)).spawn(move || {
            let env = || EnvOwned {
                gen: shared.gen,
                host: shared.host.clone(),
                hbm: shared.hbm.clone(),
                bus_master: shared.bus_master.load(Ordering::Relaxed),
                slow: shared.slow.load(Ordering::Relaxed),
                trace: shared.tracer.clone(),
            };
            let on_error = |rec: ErrorRecord| {
                *shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(LastError { engine: e2.id, record: rec });
            };
            e2.run(&env, &on_error);
        });
        match h {
            Ok(h) => self.workers.lock().unwrap_or_else(|e| e.into_inner()).push(h),
            Err(e) => log::error!("cannot spawn worker for engine {}: {e}", eng.id),
        }
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
        let Some(eng) = self.engine(id).cloned() else { return };
        let fx = eng.write(unit & !3, val);
        if let Some(rec) = fx.error {
            *self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(LastError { engine: id, record: rec });
        }
        if fx.kick {
            self.ensure_worker(&eng);
        }
    }

    /// BAR0 read of any size/alignment (split into 32-bit register accesses).
    pub fn bar0_read(&self, off: u64, data: &mut [u8]) {
        for_each_word(off, data.len(), |word, lo, n, at| {
            let v = self.read32(word).to_le_bytes();
            data[at..at + n].copy_from_slice(&v[lo..lo + n]);
        });
    }

    /// BAR0 write of any size/alignment; partial words are read-modify-write.
    pub fn bar0_write(&self, off: u64, data: &[u8]) {
        for_each_word(off, data.len(), |word, lo, n, at| {
            let mut v = if n == 4 { [0u8; 4] } else { self.read32(word).to_le_bytes() };
            v[lo..lo + n].copy_from_slice(&data[at..at + n]);
            self.write32(word, u32::from_le_bytes(v));
        });
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
            Fault::Slow { factor } => self.shared.slow.store(factor, Ordering::Relaxed),
        }
        log::info!("fault injected: {f:?}");
        Ok(())
    }

    /// Clears all faults, counters and the last error.
    pub fn clear(&self) {
        self.shared.slow.store(0, Ordering::Relaxed);
        for e in self.shared.engines.iter().filter_map(|s| s.get()) {
            e.clear_faults();
            e.counters.clear();
        }
        *self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Counters summed over all engines.
    pub fn counters(&self) -> CounterValues {
        self.shared
            .engines
            .iter()
            .filter_map(|s| s.get())
            .fold(CounterValues::default(), |a, e| a.sum(e.counters.get()))
    }

    /// Counters of every allocated engine that did something.
    pub fn engine_counters(&self) -> Vec<(u32, CounterValues)> {
        self.shared
            .engines
            .iter()
            .filter_map(|s| s.get())
            .map(|e| (e.id, e.counters.get()))
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
        for h in self.workers.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
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
