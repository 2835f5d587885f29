// SPDX-License-Identifier: MIT OR Apache-2.0
//! `udmactl multiqueue`: N queues driven by one thread against N threads, one per queue, on the
//! same work (ABI 3).
//!
//! Each queue copies its own slice of one source host buffer into its own destination host
//! buffer, `--passes` times over, in batches of `--batch` copies; each batch is prepared
//! (COPY_PREPARE) and submitted with a fence (COPY_SUBMIT), with up to `--depth` fences in
//! flight per queue. Two ways to wait:
//!
//! - `epoll`: one thread submits to every queue and learns completions from epoll on the device
//!   file (EPOLLIN: fences completed; EPOLLPRI/EPOLLERR: a failure) and QUEUE_EVENTS (which
//!   clears it), refilling each queue as its fences complete. No thread blocks per queue.
//! - `threads`: one thread per queue, blocked in FENCE_WAIT for its oldest fence (or, with
//!   `--thread-wait copy-wait`, in COPY_WAIT after each batch).
//!
//! After each run every destination is compared with its source byte for byte. Output: one line
//! per mode (rate, fences, wakeups, CPU time, byte-exact), then a verdict:
//!
//! ```text
//! one thread + epoll: 16 queues (engines 0-15 queue 1), 32.0 MiB in 0.406 s: throughput 82.65 MB/s; 128 fences (batches of 4 x 64.0 KiB, depth 2), 97 epoll wakeups, cpu 0.101 s; byte-exact
//! 16 threads in FENCE_WAIT: 16 queues (engines 0-15 queue 1), 32.0 MiB in 0.398 s: throughput 84.31 MB/s; 128 fences (batches of 4 x 64.0 KiB, depth 2), cpu 0.180 s; byte-exact
//! verdict: OK: one thread + epoll drove 16 queues at 0.98x the rate of 16 threads blocked in FENCE_WAIT (target >= 0.90x), byte-exact
//! ```

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use neuron_udma::{Copy, Device, HostBuffer, Info, Queue};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use serde::Serialize;

use crate::limits::{self, Remedy};
use crate::{engine_ranges, human_bytes, human_rate, parse_size, XorShift};

#[derive(Args, Debug)]
pub struct MultiqueueArgs {
    /// Queues to drive (N).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub queues: u32,
    /// Put every queue on this engine (default: spread over the engines that reach host memory,
    /// queue 1 of each first, skipping reserved queues).
    #[arg(long)]
    pub engine: Option<u32>,
    /// Bytes each queue copies per pass (its destination buffer; K, M, G suffixes).
    #[arg(long, value_parser = parse_size, default_value = "256K")]
    pub window: u64,
    /// Passes over each queue's window per run.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub passes: u32,
    /// Bytes per copy (default: max_copy_size of INFO).
    #[arg(long, value_parser = parse_size)]
    pub copy_size: Option<u64>,
    /// Copies per fence (one COPY_PREPARE + COPY_SUBMIT).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch: u32,
    /// Fences in flight per queue.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub depth: u32,
    /// Descriptors per ring (a power of two); it must hold depth x (batch + 1) pairs plus the
    /// ring reserve.
    #[arg(long, default_value_t = 256)]
    pub ring_size: u32,
    /// Which ways to run the work: epoll (one thread), threads (one per queue), or both and
    /// compare.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    pub mode: Mode,
    /// How the per-queue threads wait: fence-wait (COPY_SUBMIT, FENCE_WAIT on the oldest of
    /// --depth fences) or copy-wait (COPY_PREPARE + COPY_WAIT per batch, depth 1).
    #[arg(long, value_enum, default_value_t = ThreadWait::FenceWait)]
    pub thread_wait: ThreadWait,
    /// Iterations, each running the chosen modes (with --mode both, which goes first alternates);
    /// the best run of each mode is reported; with --mode both the verdict judges the median of
    /// the iterations' ratios (printed with min and max, and in --json).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Least rate of one thread + epoll over the threads' rate for an OK verdict (--mode both).
    #[arg(long, default_value_t = 0.9)]
    pub target: f64,
    /// Longest wait for a completion, in milliseconds (epoll, FENCE_WAIT, COPY_WAIT; default:
    /// 10000).
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Print one JSON object instead of the text lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Epoll,
    Threads,
    Both,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadWait {
    FenceWait,
    CopyWait,
}

impl ThreadWait {
    fn ioctl(self) -> &'static str {
        match self {
            ThreadWait::FenceWait => "FENCE_WAIT",
            ThreadWait::CopyWait => "COPY_WAIT",
        }
    }
}

/// The work of one run, checked against the device's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub window: u64,
    pub copy_size: u32,
    /// Copies per window (the last one may be short).
    pub pieces: u64,
    /// Copies per queue per run.
    pub copies: u64,
    pub batch: u32,
    pub depth: u32,
    pub ring: u32,
}

impl Plan {
    pub fn new(info: &Info, a: &MultiqueueArgs, thread_wait: ThreadWait) -> Result<Self, String> {
        if a.window == 0 {
            return Err("--window 0".into());
        }
        let copy_size = a.copy_size.unwrap_or(info.max_copy_size.into());
        if copy_size == 0 || copy_size > info.max_copy_size.into() {
            return Err(format!("--copy-size {copy_size}: not in 1..={} (max_copy_size of INFO)", info.max_copy_size));
        }
        if a.batch > info.max_batch {
            return Err(format!("--batch {}: above max_batch {} of INFO", a.batch, info.max_batch));
        }
        if info.max_queue_fences > 0 && a.depth > info.max_queue_fences {
            return Err(format!(
                "--depth {}: above max_queue_fences {} of INFO (COPY_SUBMIT would be EBUSY)",
                a.depth, info.max_queue_fences
            ));
        }
        if !a.ring_size.is_power_of_two() || !(info.min_ring_descs..=info.max_ring_descs).contains(&a.ring_size) {
            return Err(format!(
                "--ring-size {}: not a power of two in {}..={}",
                a.ring_size, info.min_ring_descs, info.max_ring_descs
            ));
        }
        // Every fence in flight holds its batch and its marker pair.
        let depth = if thread_wait == ThreadWait::CopyWait { a.depth.max(1) } else { a.depth };
        let need = u64::from(depth) * (u64::from(a.batch) + 1) + u64::from(info.ring_reserve_descs);
        if need > a.ring_size.into() {
            return Err(format!(
                "--ring-size {}: {} fences of {} copies need {need} descriptors (each fence its batch and a marker, \
                 plus the reserve of {}): use a larger ring, or a smaller --batch or --depth",
                a.ring_size, depth, a.batch, info.ring_reserve_descs
            ));
        }
        let pieces = a.window.div_ceil(copy_size);
        Ok(Plan {
            window: a.window,
            copy_size: copy_size as u32,
            pieces,
            copies: pieces * u64::from(a.passes),
            batch: a.batch,
            depth: a.depth,
            ring: a.ring_size,
        })
    }

    /// (offset, size) of copy `j` of a queue's sequence: piece `j % pieces` of the window.
    pub fn piece(&self, j: u64) -> (u64, u32) {
        let off = (j % self.pieces) * u64::from(self.copy_size);
        (off, (self.window - off).min(self.copy_size.into()) as u32)
    }

    /// Bytes one queue copies per run.
    pub fn bytes_per_queue(&self) -> u64 {
        (0..self.copies).map(|j| u64::from(self.piece(j).1)).sum()
    }

    /// Fences one queue submits per run.
    pub fn fences_per_queue(&self) -> u64 {
        self.copies.div_ceil(self.batch.into())
    }
}

/// The (engine, queue) pairs for `n` user queues: all on `engine`, or spread over the engines
/// that reach host memory, queue 1 of each first (queues 1..3 are never reserved), then 2, 3,
/// 0, 4, ...; reserved queues are skipped.
pub fn pick_queues(info: &Info, n: u32, engine: Option<u32>) -> Result<Vec<(u32, u32)>, String> {
    let engines = match engine {
        Some(e) => {
            limits::check_user_queue(info, e, 1)?;
            vec![e]
        }
        None => info.host_engine_list(),
    };
    let order = [1, 2, 3, 0].into_iter().chain(4..info.queues_per_engine).filter(|&q| q < info.queues_per_engine);
    let all: Vec<(u32, u32)> = order
        .flat_map(|q| engines.iter().map(move |&e| (e, q)))
        .filter(|&(e, q)| !info.is_reserved_queue(e, q))
        .collect();
    if all.len() < n as usize {
        return Err(format!(
            "--queues {n}: {} has only {} free user queues on {}",
            limits::this_device(info),
            all.len(),
            match engine {
                Some(e) => format!("engine {e}"),
                None => format!("its host-connected engines ({})", engine_ranges(engines.into_iter())),
            }
        ));
    }
    Ok(all.into_iter().take(n as usize).collect())
}

/// "engines 0-15 queue 1", "engine 4 queues 0-3 5-13", or a list.
pub fn describe_queues(qs: &[(u32, u32)]) -> String {
    let mut engines: Vec<u32> = qs.iter().map(|q| q.0).collect();
    let mut queues: Vec<u32> = qs.iter().map(|q| q.1).collect();
    engines.sort_unstable();
    engines.dedup();
    queues.sort_unstable();
    queues.dedup();
    let plural = |v: &[u32], one: &str, many: &str| {
        format!("{} {}", if v.len() == 1 { one } else { many }, engine_ranges(v.iter().copied()))
    };
    if engines.len() == 1 || queues.len() == 1 {
        format!("{} {}", plural(&engines, "engine", "engines"), plural(&queues, "queue", "queues"))
    } else {
        let l: Vec<String> = qs.iter().map(|(e, q)| format!("{e}/{q}")).collect();
        format!("queues {}", l.join(" "))
    }
}

/// One queue's part of a run.
struct Lane<'a> {
    q: &'a Queue<'a>,
    /// Where the queue's slice of the shared source begins.
    src_off: u64,
    dst: HostBuffer<'a>,
    /// The next copy of the sequence, and the fences in flight: (number, bytes).
    next: u64,
    inflight: VecDeque<(u64, u64)>,
    fences: u64,
    /// The queue's newest fence (numbers go on across runs).
    newest: u64,
}

impl Lane<'_> {
    fn reset(&mut self) {
        self.next = 0;
        self.inflight.clear();
        self.fences = 0;
        self.dst.fill(0);
    }

    /// Prepares the next batch; returns its bytes.
    fn prepare(&mut self, plan: &Plan, src: &HostBuffer) -> Result<u64> {
        let n = u64::from(plan.batch).min(plan.copies - self.next);
        let mut bytes = 0;
        let copies = (self.next..self.next + n)
            .map(|j| {
                let (off, size) = plan.piece(j);
                bytes += u64::from(size);
                Copy::new(src, self.src_off + off, &self.dst, off, size)
            })
            .collect::<neuron_udma::Result<Vec<_>>>()?;
        let mut r = self.q.prepare(&copies);
        if matches!(r, Err(neuron_udma::Error::RingFull)) && self.newest > 0 {
            // The plan leaves room for --depth fences: the space of the completed ones may not
            // have been retired yet. FENCE_STATUS retires completed fences first; then retry.
            self.q.fence(self.newest).report().context("NEURON_UDMA_FENCE_STATUS (retiring)")?;
            r = self.q.prepare(&copies);
        }
        r.with_context(|| {
            format!("NEURON_UDMA_COPY_PREPARE of {n} copies on queue {}/{}", self.q.engine(), self.q.queue())
        })?;
        self.next += n;
        Ok(bytes)
    }

    /// Prepares and submits the next batch with a fence.
    fn submit(&mut self, plan: &Plan, src: &HostBuffer) -> Result<()> {
        let bytes = self.prepare(plan, src)?;
        let fence = self
            .q
            .submit()
            .with_context(|| format!("NEURON_UDMA_COPY_SUBMIT on queue {}/{}", self.q.engine(), self.q.queue()))?;
        self.inflight.push_back((fence.number(), bytes));
        self.newest = fence.number();
        self.fences += 1;
        Ok(())
    }

    /// Submits while the queue has work and room for another fence.
    fn refill(&mut self, plan: &Plan, src: &HostBuffer) -> Result<()> {
        while self.next < plan.copies && self.inflight.len() < plan.depth as usize {
            self.submit(plan, src)?;
        }
        Ok(())
    }

    fn verify(&self, src: &HostBuffer, window: u64) -> Result<()> {
        let want = &src[self.src_off as usize..(self.src_off + window) as usize];
        crate::verify(want, &self.dst[..window as usize], 0)
            .with_context(|| format!("queue {}/{}", self.q.engine(), self.q.queue()))
    }
}

/// What one run of a mode measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Run {
    pub time: Duration,
    pub cpu: Duration,
    pub fences: u64,
    /// epoll_wait returns (epoll mode).
    pub wakeups: u64,
}

/// User + system CPU time of the process so far.
fn cpu_time() -> Duration {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one struct rusage to the pointer it is given.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded and initialised it (and zeroed() already made it valid).
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec.max(0) as u64, (t.tv_usec.clamp(0, 999_999) as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One thread, every queue: submit up to --depth fences per queue, then sleep in epoll_wait
/// on the device file, read QUEUE_EVENTS, retire each queue's completed fences and refill it.
fn run_epoll(dev: &Device, lanes: &mut [Lane], src: &HostBuffer, plan: &Plan, timeout: Duration) -> Result<Run> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).context("epoll_create1")?;
    epoll
        .add(dev.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLPRI, 0))
        .context("epoll_ctl ADD of the device file")?;
    let index: HashMap<(u32, u32), usize> =
        lanes.iter().enumerate().map(|(i, l)| ((l.q.engine(), l.q.queue()), i)).collect();
    // Events of an earlier run are stale: fence numbers only grow, so they retire nothing new.
    dev.queue_events().context("NEURON_UDMA_QUEUE_EVENTS")?;
    let epoll_timeout = EpollTimeout::try_from(timeout).unwrap_or(EpollTimeout::NONE);
    let (t0, cpu0) = (Instant::now(), cpu_time());
    for l in lanes.iter_mut() {
        l.refill(plan, src)?;
    }
    let mut wakeups = 0u64;
    let mut evs = [EpollEvent::empty(); 4];
    while lanes.iter().any(|l| !l.inflight.is_empty()) {
        let n = match epoll.wait(&mut evs, epoll_timeout) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(anyhow::Error::new(e).context("epoll_wait on the device file")),
        };
        if n == 0 {
            let waiting: Vec<String> = lanes
                .iter()
                .filter_map(|l| l.inflight.front().map(|f| format!("{}/{} fence {}", l.q.engine(), l.q.queue(), f.0)))
                .collect();
            bail!("no completion event in {} ms (waiting for {})", timeout.as_millis(), waiting.join(", "));
        }
        wakeups += 1;
        for ev in dev.queue_events().context("NEURON_UDMA_QUEUE_EVENTS")? {
            let Some(&i) = index.get(&(ev.engine(), ev.queue())) else { continue };
            if let Some(e) = ev.failure_error() {
                return Err(anyhow::Error::new(e).context("QUEUE_EVENTS reported a failure"));
            }
            let l = &mut lanes[i];
            while l.inflight.front().is_some_and(|&(f, _)| f <= ev.completed()) {
                l.inflight.pop_front();
            }
            l.refill(plan, src)?;
        }
    }
    let run = Run { time: t0.elapsed(), cpu: cpu_time().saturating_sub(cpu0), fences: 0, wakeups };
    Ok(Run { fences: lanes.iter().map(|l| l.fences).sum(), ..run })
}

/// One thread per queue, each blocked in FENCE_WAIT (or COPY_WAIT) for its own queue.
fn run_threads(lanes: &mut [Lane], src: &HostBuffer, plan: &Plan, wait: ThreadWait, timeout: Duration) -> Result<Run> {
    let start = std::sync::Barrier::new(lanes.len() + 1);
    let (time, cpu, results) = std::thread::scope(|s| {
        let handles: Vec<_> = lanes
            .iter_mut()
            .map(|l| {
                let start = &start;
                s.spawn(move || -> Result<()> {
                    start.wait();
                    match wait {
                        ThreadWait::FenceWait => {
                            l.refill(plan, src)?;
                            while let Some(&(f, _)) = l.inflight.front() {
                                l.q.fence(f).wait(Some(timeout)).with_context(|| {
                                    format!(
                                        "NEURON_UDMA_FENCE_WAIT fence {f} on queue {}/{}",
                                        l.q.engine(),
                                        l.q.queue()
                                    )
                                })?;
                                l.inflight.pop_front();
                                l.refill(plan, src)?;
                            }
                        }
                        ThreadWait::CopyWait => {
                            while l.next < plan.copies {
                                l.prepare(plan, src)?;
                                l.q.wait(Some(timeout)).with_context(|| {
                                    format!("NEURON_UDMA_COPY_WAIT on queue {}/{}", l.q.engine(), l.q.queue())
                                })?;
                                l.fences += 1;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let (t0, cpu0) = (Instant::now(), cpu_time());
        start.wait();
        let results: Vec<Result<()>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a queue thread panicked"))))
            .collect();
        (t0.elapsed(), cpu_time().saturating_sub(cpu0), results)
    });
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(Run { time, cpu, fences: lanes.iter().map(|l| l.fences).sum(), wakeups: 0 })
}

/// How a mode is named in its line and the verdict.
pub fn mode_name(mode: Mode, n: usize, wait: ThreadWait) -> String {
    match mode {
        Mode::Epoll => "one thread + epoll".into(),
        _ => format!("{n} threads in {}", wait.ioctl()),
    }
}

/// The line of one mode.
pub fn mode_line(name: &str, queues: &str, n: usize, bytes: u64, plan: &Plan, r: &Run, label: &str) -> String {
    let wakeups = if r.wakeups > 0 { format!(", {} epoll wakeups", r.wakeups) } else { String::new() };
    format!(
        "{name}: {n} queues ({queues}), {} in {:.3} s: {label} {}; {} fences (batches of {} x {}, depth {}){wakeups}, \
         cpu {:.3} s; byte-exact",
        human_bytes(bytes),
        r.time.as_secs_f64(),
        human_rate(bytes, r.time),
        r.fences,
        plan.batch,
        human_bytes(plan.copy_size.into()),
        plan.depth,
        r.cpu.as_secs_f64(),
    )
}

/// The rate of one thread + epoll over the threads' rate (same bytes: the inverse time ratio).
pub fn ratio(epoll: &Run, threads: &Run) -> f64 {
    threads.time.as_secs_f64() / epoll.time.as_secs_f64().max(f64::MIN_POSITIVE)
}

/// The verdict line: `Ok` for an OK verdict, `Err` for a FAILED one.
pub fn verdict(
    n: usize,
    wait: ThreadWait,
    runs: (Option<&Run>, Option<&Run>),
    ratios: &[f64],
    target: f64,
    bytes: u64,
) -> Result<String, String> {
    match runs {
        (Some(e), Some(t)) => {
            // Several iterations: their ratios' median, as `make bench` judges; one: its ratio.
            let (r, of) = if ratios.len() > 1 {
                let (lo, mid, hi) = (ratios[0], ratios[ratios.len() / 2], ratios[ratios.len() - 1]);
                (mid, format!(" (the median of {} iterations' ratios, {lo:.2}-{hi:.2}x)", ratios.len()))
            } else {
                (ratio(e, t), String::new())
            };
            let what = format!(
                "one thread + epoll drove {n} queues at {r:.2}x{of} the rate of {n} threads blocked in {} (target >= {target:.2}x)",
                wait.ioctl()
            );
            if r >= target {
                Ok(format!("verdict: OK: {what}, byte-exact"))
            } else {
                Err(format!("verdict: FAILED: {what}"))
            }
        }
        (Some(e), None) => Ok(format!(
            "verdict: OK: one thread + epoll drove {n} queues, {} byte-exact, {}",
            human_bytes(bytes),
            human_rate(bytes, e.time)
        )),
        (None, Some(t)) => Ok(format!(
            "verdict: OK: {n} threads in {} drove {n} queues, {} byte-exact, {}",
            wait.ioctl(),
            human_bytes(bytes),
            human_rate(bytes, t.time)
        )),
        (None, None) => Err("verdict: FAILED: nothing ran".into()),
    }
}

#[derive(Serialize, Debug)]
pub struct ModeJson {
    pub mode: &'static str,
    pub threads: usize,
    pub wait: &'static str,
    pub seconds: f64,
    pub bytes: u64,
    pub bytes_per_second: f64,
    pub fences: u64,
    pub epoll_wakeups: u64,
    pub cpu_seconds: f64,
    pub byte_exact: bool,
}

/// The median, min and max of per-iteration ratios, and how many.
#[derive(Serialize, Debug)]
pub struct RatioRange {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub reps: usize,
}

#[derive(Serialize, Debug)]
pub struct MultiqueueJson {
    pub device: String,
    pub queues: Vec<crate::json::QueueId>,
    pub window: u64,
    pub passes: u32,
    pub copy_size: u32,
    pub batch: u32,
    pub depth: u32,
    pub ring_size: u32,
    pub iters: u32,
    pub label: &'static str,
    /// The CPUs this process may run on (`sched_getaffinity`; empty if unknown): one for a run
    /// under `taskset` on one CPU, as `make bench`'s one-CPU rows.
    pub cpus: Vec<usize>,
    /// The CPUs of the kernel's unbound workqueues, where the driver's completion engine runs
    /// (`/sys/devices/virtual/workqueue/cpumask`, a hex mask; absent if unreadable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workqueue_cpumask: Option<String>,
    pub modes: Vec<ModeJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The per-iteration ratios (each iteration runs both modes, alternating which goes first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratios: Option<RatioRange>,
    pub target: f64,
    /// The verdict line.
    pub verdict: String,
    pub ok: bool,
}

fn mode_json(mode: Mode, n: usize, wait: ThreadWait, bytes: u64, r: &Run) -> ModeJson {
    ModeJson {
        mode: if mode == Mode::Epoll { "epoll" } else { "threads" },
        threads: if mode == Mode::Epoll { 1 } else { n },
        wait: if mode == Mode::Epoll { "epoll+QUEUE_EVENTS" } else { wait.ioctl() },
        seconds: r.time.as_secs_f64(),
        bytes,
        bytes_per_second: bytes as f64 / r.time.as_secs_f64().max(f64::MIN_POSITIVE),
        fences: r.fences,
        epoll_wakeups: r.wakeups,
        cpu_seconds: r.cpu.as_secs_f64(),
        byte_exact: true,
    }
}

/// `udmactl multiqueue`: every outcome ends in a verdict line (or the JSON object), a failure
/// with exit status 1 (not repeated on stderr).
pub fn run(path: &std::path::Path, a: &MultiqueueArgs) -> Result<(), crate::Reported> {
    let r = crate::nodes::open(path, false).and_then(|(dev, info)| measure(&dev, &info, a));
    let fail = |line: String| {
        if a.json {
            let v = serde_json::json!({"device": path.display().to_string(), "verdict": line, "ok": false});
            println!("{v}");
        } else {
            println!("{line}");
        }
        Err(crate::Reported)
    };
    match r {
        Ok(out) => {
            if a.json {
                println!("{}", serde_json::to_string(&out).unwrap_or_default());
            }
            if out.ok {
                if !a.json {
                    println!("{}", out.verdict);
                }
                Ok(())
            } else if a.json {
                Err(crate::Reported)
            } else {
                fail(out.verdict)
            }
        }
        Err(e) => fail(format!("verdict: FAILED: {e:#}")),
    }
}

fn measure(dev: &Device, info: &Info, a: &MultiqueueArgs) -> Result<MultiqueueJson> {
    if !info.has_abi3() {
        bail!(
            "the driver has ABI {}: multiqueue needs ABI 3 (COPY_SUBMIT, QUEUE_EVENTS, poll on the device file)",
            info.abi_version
        );
    }
    let plan = Plan::new(info, a, a.thread_wait).map_err(anyhow::Error::msg)?;
    let ids = pick_queues(info, a.queues, a.engine).map_err(anyhow::Error::msg)?;
    let n = ids.len();
    let queues = ids
        .iter()
        .map(|&(e, q)| {
            dev.queue(e, q, plan.ring).map_err(|err| limits::queue_init_error(dev, info, e, q, plan.ring, err))
        })
        .collect::<Result<Vec<_>>>()?;
    // One source for all: queue i copies from 4 KiB * i on, so that no two destinations match.
    const STRIDE: u64 = 4096;
    let src_size = plan.window + STRIDE * n as u64;
    let mut src = limits::or_memlock(dev.alloc_host(src_size), "NEURON_UDMA_MEM_ALLOC host source", Remedy::Window)?;
    XorShift::new(0x5eed).fill(&mut src);
    let mut lanes = Vec::with_capacity(n);
    for (i, q) in queues.iter().enumerate() {
        let dst = limits::or_memlock(
            dev.alloc_host(plan.window),
            format!("NEURON_UDMA_MEM_ALLOC host destination of queue {}/{}", q.engine(), q.queue()),
            Remedy::Window,
        )?;
        lanes.push(Lane {
            q,
            src_off: STRIDE * i as u64,
            dst,
            next: 0,
            inflight: VecDeque::new(),
            fences: 0,
            newest: 0,
        });
    }
    let timeout = Duration::from_millis(a.timeout_ms.unwrap_or(10_000).max(10));
    let bytes = plan.bytes_per_queue() * n as u64;
    let (mut best_e, mut best_t): (Option<Run>, Option<Run>) = (None, None);
    let fences = plan.fences_per_queue() * n as u64;
    let better = |best: Option<Run>, r: Run| -> Result<Option<Run>> {
        if r.fences != fences {
            bail!("{} fences (or waits) for the {fences} batches of the run", r.fences);
        }
        Ok(Some(best.filter(|b| b.time <= r.time).unwrap_or(r)))
    };
    // Each iteration runs both modes, which goes first alternating; the ratio of each
    // iteration's two runs gives the range.
    let mut ratios = Vec::new();
    for i in 0..a.iters {
        let (mut this_e, mut this_t) = (None, None);
        for mode in if i % 2 == 0 { [Mode::Threads, Mode::Epoll] } else { [Mode::Epoll, Mode::Threads] } {
            if mode == Mode::Threads && a.mode != Mode::Epoll {
                lanes.iter_mut().for_each(Lane::reset);
                let r = run_threads(&mut lanes, &src, &plan, a.thread_wait, timeout)
                    .with_context(|| mode_name(Mode::Threads, n, a.thread_wait))?;
                verify_all(&lanes, &src, &plan).with_context(|| mode_name(Mode::Threads, n, a.thread_wait))?;
                this_t = Some(r);
                best_t = better(best_t, r)?;
            }
            if mode == Mode::Epoll && a.mode != Mode::Threads {
                lanes.iter_mut().for_each(Lane::reset);
                let r = run_epoll(dev, &mut lanes, &src, &plan, timeout).context("one thread + epoll")?;
                verify_all(&lanes, &src, &plan).context("one thread + epoll")?;
                this_e = Some(r);
                best_e = better(best_e, r)?;
            }
        }
        if let (Some(e), Some(t)) = (this_e, this_t) {
            ratios.push(ratio(&e, &t));
        }
    }
    ratios.sort_by(f64::total_cmp);
    let label = crate::copy::throughput_label();
    let desc = describe_queues(&ids);
    let mut modes = Vec::new();
    for (mode, r) in [(Mode::Epoll, &best_e), (Mode::Threads, &best_t)] {
        if let Some(r) = r {
            if !a.json {
                println!("{}", mode_line(&mode_name(mode, n, a.thread_wait), &desc, n, bytes, &plan, r, label));
            }
            modes.push(mode_json(mode, n, a.thread_wait, bytes, r));
        }
    }
    if !a.json && ratios.len() > 1 {
        println!(
            "iterations' ratios (one thread + epoll over the threads, each iteration's two runs): median {:.3}x, \
             min {:.3}x, max {:.3}x, {} iterations",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1],
            ratios.len()
        );
    }
    let v = verdict(n, a.thread_wait, (best_e.as_ref(), best_t.as_ref()), &ratios, a.target, bytes);
    Ok(MultiqueueJson {
        device: dev.path().display().to_string(),
        queues: ids.iter().map(|&(engine, queue)| crate::json::QueueId { engine, queue }).collect(),
        window: plan.window,
        passes: a.passes,
        copy_size: plan.copy_size,
        batch: plan.batch,
        depth: plan.depth,
        ring_size: plan.ring,
        iters: a.iters,
        label,
        cpus: allowed_cpus(),
        workqueue_cpumask: std::fs::read_to_string(WORKQUEUE_CPUMASK).ok().map(|m| m.trim().to_string()),
        modes,
        ratio: best_e.zip(best_t).map(|(e, t)| ratio(&e, &t)),
        ratios: (!ratios.is_empty()).then(|| RatioRange {
            median: ratios[ratios.len() / 2],
            min: ratios[0],
            max: ratios[ratios.len() - 1],
            reps: ratios.len(),
        }),
        target: a.target,
        ok: v.is_ok(),
        verdict: v.unwrap_or_else(|e| e),
    })
}

/// The CPUs of the kernel's unbound workqueues.
const WORKQUEUE_CPUMASK: &str = "/sys/devices/virtual/workqueue/cpumask";

/// The CPUs this process may run on, in order (empty if `sched_getaffinity` fails).
fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()
}

fn verify_all(lanes: &[Lane], src: &HostBuffer, plan: &Plan) -> Result<()> {
    lanes.iter().try_for_each(|l| l.verify(src, plan.window))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn trn1() -> Info {
        Info {
            abi_version: 3,
            generation: 2,
            device_id: 0x7164,
            engines: 34,
            queues_per_engine: 16,
            max_copy_size: 65536,
            min_ring_descs: 32,
            max_ring_descs: 1 << 23,
            ring_reserve_descs: 16,
            max_batch: 4096,
            host_engines: [(1 << 34) - 1, 0, 0],
            max_queue_fences: 64,
            ..Default::default()
        }
    }

    fn args(extra: &[&str]) -> MultiqueueArgs {
        let mut v = vec!["udmactl", "multiqueue"];
        v.extend_from_slice(extra);
        match crate::Cli::try_parse_from(v).unwrap().cmd {
            crate::Cmd::Multiqueue(a) => a,
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn queues_spread_over_engines_and_skip_reserved_ones() {
        let i = trn1();
        let q = pick_queues(&i, 16, None).unwrap();
        assert_eq!(q, (0..16).map(|e| (e, 1)).collect::<Vec<_>>());
        assert_eq!(describe_queues(&q), "engines 0-15 queue 1");
        let q = pick_queues(&i, 36, None).unwrap();
        assert_eq!(q[34..], [(0, 2), (1, 2)]);
        // One engine: 1, 2, 3, 0, 4.. without the reserved 14 and 15 of engine 0 on v2.
        let q = pick_queues(&i, 14, Some(0)).unwrap();
        assert_eq!(q.iter().map(|x| x.1).collect::<Vec<_>>(), [1, 2, 3, 0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
        assert_eq!(describe_queues(&q), "engine 0 queues 0-13");
        let e = pick_queues(&i, 15, Some(0)).unwrap_err();
        assert!(e.contains("only 14 free user queues on engine 0"), "{e}");
        // H2T engine 32: queue 0 is the driver's.
        assert!(!pick_queues(&i, 15, Some(32)).unwrap().contains(&(32, 0)));
        assert!(pick_queues(&i, 1, Some(40)).unwrap_err().contains("out of range"));
        assert_eq!(describe_queues(&[(0, 1), (1, 2)]), "queues 0/1 1/2");
    }

    #[test]
    fn plans_fit_the_ring_and_the_limits() {
        let i = trn1();
        let p = Plan::new(&i, &args(&[]), ThreadWait::FenceWait).unwrap();
        assert_eq!((p.copy_size, p.pieces, p.copies, p.batch, p.depth), (65536, 4, 32, 4, 2));
        assert_eq!((p.bytes_per_queue(), p.fences_per_queue()), (2 << 20, 8));
        let p =
            Plan::new(&i, &args(&["--window", "100K", "--copy-size", "40K", "--passes", "2"]), ThreadWait::FenceWait)
                .unwrap();
        assert_eq!(p.piece(0), (0, 40 << 10));
        assert_eq!(p.piece(2), (80 << 10, 20 << 10));
        assert_eq!(p.piece(3), (0, 40 << 10));
        assert_eq!(p.bytes_per_queue(), 200 << 10);
        let err = |a: &[&str]| Plan::new(&i, &args(a), ThreadWait::FenceWait).unwrap_err();
        assert!(Plan::new(&i, &args(&["--ring-size", "32"]), ThreadWait::FenceWait).is_ok());
        assert!(err(&["--ring-size", "32", "--batch", "8"]).contains("need 34 descriptors"));
        assert!(err(&["--ring-size", "100"]).contains("power of two"));
        assert!(err(&["--copy-size", "128K"]).contains("max_copy_size"));
        assert!(err(&["--depth", "65"]).contains("max_queue_fences"));
        assert!(err(&["--batch", "5000", "--ring-size", "16384"]).contains("max_batch"));
        assert!(crate::Cli::try_parse_from(["udmactl", "multiqueue", "--queues", "0"]).is_err());
    }

    #[test]
    fn lines_and_verdicts() {
        let p = Plan::new(&trn1(), &args(&[]), ThreadWait::FenceWait).unwrap();
        let e = Run { time: Duration::from_millis(400), cpu: Duration::from_millis(100), fences: 128, wakeups: 97 };
        let t = Run { time: Duration::from_millis(392), cpu: Duration::from_millis(180), fences: 128, wakeups: 0 };
        let bytes = 32 << 20;
        assert_eq!(
            mode_line("one thread + epoll", "engines 0-15 queue 1", 16, bytes, &p, &e, "throughput"),
            "one thread + epoll: 16 queues (engines 0-15 queue 1), 32.0 MiB in 0.400 s: throughput 83.89 MB/s; 128 \
             fences (batches of 4 x 64.0 KiB, depth 2), 97 epoll wakeups, cpu 0.100 s; byte-exact"
        );
        assert!(mode_line("16 threads in FENCE_WAIT", "x", 16, bytes, &p, &t, "throughput").contains("depth 2), cpu"));
        assert_eq!(
            verdict(16, ThreadWait::FenceWait, (Some(&e), Some(&t)), &[], 0.9, bytes).unwrap(),
            "verdict: OK: one thread + epoll drove 16 queues at 0.98x the rate of 16 threads blocked in FENCE_WAIT \
             (target >= 0.90x), byte-exact"
        );
        let slow = Run { time: Duration::from_millis(800), ..e };
        assert_eq!(
            verdict(16, ThreadWait::CopyWait, (Some(&slow), Some(&t)), &[], 0.9, bytes).unwrap_err(),
            "verdict: FAILED: one thread + epoll drove 16 queues at 0.49x the rate of 16 threads blocked in COPY_WAIT \
             (target >= 0.90x)"
        );
        // Several iterations: the median of their ratios is judged, not the best runs' ratio.
        assert_eq!(
            verdict(16, ThreadWait::FenceWait, (Some(&e), Some(&t)), &[0.7, 0.85, 1.1], 0.9, bytes).unwrap_err(),
            "verdict: FAILED: one thread + epoll drove 16 queues at 0.85x (the median of 3 iterations' ratios, \
             0.70-1.10x) the rate of 16 threads blocked in FENCE_WAIT (target >= 0.90x)"
        );
        assert!(verdict(4, ThreadWait::FenceWait, (Some(&e), None), &[], 0.9, bytes).unwrap().contains("byte-exact"));
        assert!(verdict(4, ThreadWait::FenceWait, (None, Some(&t)), &[], 0.9, bytes)
            .unwrap()
            .starts_with("verdict: OK: 4 threads"));
        let j = serde_json::to_value(mode_json(Mode::Epoll, 16, ThreadWait::FenceWait, bytes, &e)).unwrap();
        assert_eq!(
            (j["mode"].as_str(), j["threads"].as_u64(), j["fences"].as_u64()),
            (Some("epoll"), Some(1), Some(128))
        );
    }

    #[test]
    fn allowed_cpus_are_those_of_the_affinity() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let mut one = nix::sched::CpuSet::new();
        one.set(cpus[0]).unwrap();
        // A thread of its own: the affinity of the test's thread is left as it was.
        let only = std::thread::spawn(move || {
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(only, [cpus[0]]);
    }

    #[test]
    fn cpu_time_advances() {
        let a = cpu_time();
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_time() > a);
    }
}
