// SPDX-License-Identifier: MIT OR Apache-2.0
//! `udmactl copy`: host -> HBM -> host, every byte verified, with one progress bar (on a
//! terminal) or a progress line on stderr every few seconds (a log, a pipe, TERM=dumb) while it
//! runs, then one line about the copy and a verdict line (or, with --json, one JSON object):
//!
//! ```text
//! /tmp/data.bin (64.0 MiB) host -> HBM -> host via queue 0/1 (ring 4096), 16 rounds of up to 4.0 MiB: 1.23 s ...
//! verdict: OK: copied 64.0 MiB host -> HBM -> host through a user queue (engine 0 queue 1), byte-exact (sha256 ...), 1.23 s
//! ```
//!
//! or `verdict: FAILED: <reason>` (exit status 1), whatever failed: the device node, a limit,
//! the DMA or the verification.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use neuron_udma::{Device, Info};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::limits::{self, Remedy};
use crate::{human_bytes, human_rate, open_queues, process_buffer, verify, CopyArgs, Mover, XorShift, DEFAULT_WINDOW};

/// What a copy did: for its line and its verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The file, or "generated data (seed N)".
    pub name: String,
    /// Bytes copied each way.
    pub total: u64,
    /// Rounds, and the largest round's bytes.
    pub rounds: u64,
    pub window: u64,
    /// `Mover::via`: "queue 0/1 (ring 4096)", "MEMCPY", ...
    pub via: String,
    /// How the bytes travelled, for the verdict: "through a user queue (engine 0 queue 1)".
    pub route: String,
    /// For --zero-copy: what was imported as the source ("its own mapping", ...) and the
    /// physically contiguous runs of the source and destination imports.
    pub zero_copy: Option<(String, u64, u64)>,
    /// DMA time of each direction, and the loop's wall time.
    pub t_h2d: Duration,
    pub t_d2h: Duration,
    pub t_all: Duration,
    /// The other time of the loop: (what, time).
    pub other: Vec<(&'static str, Duration)>,
    /// sha256 of the bytes read back (equal to the source's: every byte was compared).
    pub sha256: String,
}

/// `udmactl copy`: opens `path`, copies, prints the copy's line and the verdict (with --json,
/// one [`CopyJson`] object). The verdict line is the report of a failure too: the caller must
/// not print the error again.
pub fn run(path: &Path, a: &CopyArgs) -> Result<(), crate::Reported> {
    let r = crate::nodes::open(path, false).and_then(|(dev, info)| copy(&dev, &info, a));
    if a.json {
        let device = path.display().to_string();
        let out = match &r {
            Ok(o) => CopyJson::ok(&device, o, throughput_label()),
            Err(e) => CopyJson::failed(&device, e),
        };
        // Strings and numbers only: serialising cannot fail.
        println!("{}", serde_json::to_string(&out).unwrap_or_default());
        return r.map(drop).map_err(|_| crate::Reported);
    }
    match r {
        Ok(o) => {
            println!("{}", copy_line(&o, throughput_label()));
            println!("{}", verdict_ok(&o));
            Ok(())
        }
        Err(e) => {
            println!("verdict: FAILED: {e:#}");
            Err(crate::Reported)
        }
    }
}

/// `copy --json`: the copy's line and verdict as one object. A failure has only "device", "ok"
/// (false), "verdict" and "error".
#[derive(Serialize, Debug)]
pub struct CopyJson {
    /// The device node.
    pub device: String,
    /// Whether every byte came back equal.
    pub ok: bool,
    /// The verdict line of the text output.
    pub verdict: String,
    /// Why it failed (the verdict's reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What was copied and how, when it succeeded.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub copy: Option<CopyDone>,
}

/// The figures of a successful copy (times in seconds, rates in bytes per second).
#[derive(Serialize, Debug)]
pub struct CopyDone {
    /// The file, or "generated data (seed N)".
    pub source: String,
    /// Bytes copied each way.
    pub bytes: u64,
    pub rounds: u64,
    /// The largest round's bytes (the window).
    pub window: u64,
    pub via: String,
    pub route: String,
    /// With --zero-copy: what was imported as the source and the imports' contiguous runs.
    pub zero_copy: Option<ZeroCopyJson>,
    pub seconds: f64,
    pub host_to_hbm_seconds: f64,
    pub hbm_to_host_seconds: f64,
    /// The rest of the loop's time, by what it was spent on.
    pub other_seconds: std::collections::BTreeMap<&'static str, f64>,
    pub host_to_hbm_bytes_per_second: f64,
    pub hbm_to_host_bytes_per_second: f64,
    /// What the rates measure ("model throughput (TCG emulation, not hardware)", ...).
    pub throughput_label: &'static str,
    /// sha256 of the bytes read back, lower-case hex.
    pub sha256: String,
}

/// The imports of `copy --zero-copy`.
#[derive(Serialize, Debug)]
pub struct ZeroCopyJson {
    pub imported: String,
    pub source_runs: u64,
    pub destination_runs: u64,
}

impl CopyJson {
    /// The object of a copy that succeeded.
    pub fn ok(device: &str, o: &Outcome, label: &'static str) -> Self {
        let rate = |t: Duration| o.total as f64 / t.as_secs_f64().max(f64::MIN_POSITIVE);
        CopyJson {
            device: device.to_string(),
            ok: true,
            verdict: verdict_ok(o),
            error: None,
            copy: Some(CopyDone {
                source: o.name.clone(),
                bytes: o.total,
                rounds: o.rounds,
                window: o.window,
                via: o.via.clone(),
                route: o.route.clone(),
                zero_copy: o.zero_copy.as_ref().map(|(from, src, dst)| ZeroCopyJson {
                    imported: from.clone(),
                    source_runs: *src,
                    destination_runs: *dst,
                }),
                seconds: o.t_all.as_secs_f64(),
                host_to_hbm_seconds: o.t_h2d.as_secs_f64(),
                hbm_to_host_seconds: o.t_d2h.as_secs_f64(),
                other_seconds: o.other.iter().map(|(what, t)| (*what, t.as_secs_f64())).collect(),
                host_to_hbm_bytes_per_second: rate(o.t_h2d),
                hbm_to_host_bytes_per_second: rate(o.t_d2h),
                throughput_label: label,
                sha256: o.sha256.clone(),
            }),
        }
    }

    /// The object of a copy that failed with `e`.
    pub fn failed(device: &str, e: &anyhow::Error) -> Self {
        let error = format!("{e:#}");
        CopyJson {
            device: device.to_string(),
            ok: false,
            verdict: format!("verdict: FAILED: {error}"),
            error: Some(error),
            copy: None,
        }
    }
}

fn copy(dev: &Device, info: &Info, a: &CopyArgs) -> Result<Outcome> {
    if a.zero_copy {
        let path = a.file.as_ref().context("--zero-copy needs a FILE")?;
        return copy_zero_copy(dev, info, a, path);
    }
    enum Source {
        File(File),
        Gen(XorShift),
    }
    let (mut source, total, name) = match (&a.file, a.bytes) {
        (Some(path), _) => {
            let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
            let len = f.metadata()?.len();
            (Source::File(f), len, path.display().to_string())
        }
        (None, Some(n)) => (Source::Gen(XorShift::new(a.seed)), n, format!("generated data (seed {})", a.seed)),
        (None, None) => bail!("give a FILE or --bytes N"),
    };
    if total == 0 {
        bail!("nothing to copy: {name} is empty");
    }
    // Two host buffers of the window (source, destination) and the queues' rings are pinned
    // (RLIMIT_MEMLOCK): the default window is the largest that fits.
    let want = DEFAULT_WINDOW.min(info.max_host_buffer).min(info.device_mem_size / 2).min(total);
    let pinned = limits::Pinned { buffers: 2, fixed: queues_charge(a) };
    let cap = limits::plan_window(a.window, want, limits::memlock_budget(), pinned).map_err(anyhow::Error::msg)?;
    let cap = cap.min(info.max_host_buffer).min(info.device_mem_size / 2);
    let chunk = u64::from(info.max_copy_size.max(1));
    let window = if cap >= chunk { cap / chunk * chunk } else { cap }.min(total);
    if window == 0 {
        bail!("no usable window (max_host_buffer {}, device memory {})", info.max_host_buffer, info.device_mem_size);
    }
    let (queue, second) = open_queues(dev, info, a.memcpy, &a.q)?;
    let mover = Mover { dev, info, queue: queue.as_ref(), second: second.as_ref(), timeout: a.q.timeout() };
    let mut src = limits::or_memlock(dev.alloc_host(window), "NEURON_UDMA_MEM_ALLOC host source", Remedy::Window)?;
    let hbm = dev.alloc_device(window).context("NEURON_UDMA_MEM_ALLOC device buffer")?;
    let dst = limits::or_memlock(dev.alloc_host(window), "NEURON_UDMA_MEM_ALLOC host destination", Remedy::Window)?;

    let pb = Progress::new(2 * total);
    let rounds = total.div_ceil(window);
    let (mut t_h2d, mut t_d2h, mut t_read, mut t_verify) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut sum = Sha256::new();
    let t_all = Instant::now();
    let mut done = 0u64;
    for round in 1..=rounds {
        let n = (total - done).min(window);
        let at = || format!("round {round} of {rounds} (bytes {done}..{})", done + n);
        let part = &mut src[..n as usize];
        let t = Instant::now();
        match &mut source {
            Source::File(f) => f.read_exact(part).with_context(|| format!("read {name}"))?,
            Source::Gen(g) => g.fill(part),
        }
        t_read += t.elapsed();
        let t = Instant::now();
        mover.copy(&src, &hbm, n, &pb.bar).with_context(|| format!("{}: host -> HBM", at()))?;
        t_h2d += t.elapsed();
        let t = Instant::now();
        mover.copy(&hbm, &dst, n, &pb.bar).with_context(|| format!("{}: HBM -> host", at()))?;
        t_d2h += t.elapsed();
        let t = Instant::now();
        let got = &dst[..n as usize];
        verify(&src[..n as usize], got, done).with_context(at)?;
        sum.update(got);
        t_verify += t.elapsed();
        done += n;
        pb.bar.set_message(bar_rate(done, t_h2d + t_d2h));
    }
    let t_all = t_all.elapsed();
    pb.finish();
    Ok(Outcome {
        name,
        total,
        rounds,
        window,
        via: mover.via(),
        route: mover.route(),
        zero_copy: None,
        t_h2d,
        t_d2h,
        t_all,
        other: vec![("reading", t_read), ("verifying and hashing", t_verify)],
        sha256: hex(&sum.finalize()),
    })
}

/// `copy --zero-copy FILE`: the file's own mapping is imported read-only (or, if the kernel
/// cannot pin it long-term, its bytes read into process memory first) and copied to HBM; a
/// process buffer, imported writable, receives them back; both are compared byte for byte.
/// No byte passes through a driver host buffer or a CPU copy on the way.
fn copy_zero_copy(dev: &Device, info: &Info, a: &CopyArgs, path: &Path) -> Result<Outcome> {
    if info.max_import_size == 0 {
        bail!("the driver has no MEM_IMPORT (ABI {}); --zero-copy needs ABI 2", info.abi_version);
    }
    let name = path.display().to_string();
    let f = File::open(path).with_context(|| format!("open {name}"))?;
    let total = f.metadata()?.len();
    if total == 0 {
        bail!("nothing to copy: {name} is empty");
    }
    let len = usize::try_from(total).with_context(|| format!("{name}: {total} bytes do not fit in memory"))?;
    // SAFETY: a private read-only mapping; its bytes are only read (by the CPU and the device).
    // If another process truncates the file meanwhile, reading the lost pages faults (SIGBUS);
    // the import pins the pages, so the device's view stays what was imported.
    let map = unsafe { memmap2::Mmap::map(&f) }.with_context(|| format!("mmap {name}"))?;
    // One import of the window at a time (source, then destination) and the queues' rings are
    // pinned (RLIMIT_MEMLOCK): the default window is the largest that fits.
    let want = info.max_import_size.min(info.device_mem_size / 2).min(total).max(1);
    let pinned = limits::Pinned { buffers: 1, fixed: queues_charge(a) };
    let window = limits::plan_window(a.window, want, limits::memlock_budget(), pinned).map_err(anyhow::Error::msg)?;
    let window = window.min(info.max_import_size).min(info.device_mem_size / 2).min(total).max(1);
    // The mapping's pages may be ones the kernel cannot pin long-term (EOPNOTSUPP): then the
    // bytes are read into process memory once, which is imported instead.
    let probe = (window as usize).min(len);
    let owned: Vec<u8>;
    let (src_bytes, from): (&[u8], &str) = match dev.import(&map[..probe]) {
        Ok(imp) => {
            imp.free().context("NEURON_UDMA_MEM_FREE of the probe import")?;
            (&map[..], "the file's own mapping")
        }
        Err(neuron_udma::Error::NotSupported) => {
            owned = map.to_vec();
            (&owned[..], "a copy of the file in process memory (its mapping cannot be pinned: EOPNOTSUPP)")
        }
        Err(e) => {
            let what = format!("NEURON_UDMA_MEM_IMPORT of {} of the mapping of {name}", human_bytes(probe as u64));
            return limits::or_memlock(Err(e), what, Remedy::Window);
        }
    };
    let (queue, second) = open_queues(dev, info, a.memcpy, &a.q)?;
    let mover = Mover { dev, info, queue: queue.as_ref(), second: second.as_ref(), timeout: a.q.timeout() };
    let hbm = dev.alloc_device(window).context("NEURON_UDMA_MEM_ALLOC device buffer")?;
    // Written once so that its pages exist before the first import pins them.
    let mut out = process_buffer(window as usize)?;
    out.fill(0xA5);

    let pb = Progress::new(2 * total);
    let rounds = total.div_ceil(window);
    let (mut t_h2d, mut t_d2h, mut t_pin, mut t_verify) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut segs_src, mut segs_dst) = (0u64, 0u64);
    let mut sum = Sha256::new();
    let t_all = Instant::now();
    let mut done = 0u64;
    for round in 1..=rounds {
        let n = (total - done).min(window);
        let at = || format!("round {round} of {rounds} (bytes {done}..{})", done + n);
        let part = &src_bytes[done as usize..(done + n) as usize];
        let t = Instant::now();
        let what = || format!("{}: NEURON_UDMA_MEM_IMPORT of {} (source)", at(), human_bytes(n));
        let src = limits::or_memlock(dev.import(part), what(), Remedy::Window)?;
        t_pin += t.elapsed();
        segs_src += u64::from(src.segments());
        let t = Instant::now();
        mover.copy(&src, &hbm, n, &pb.bar).with_context(|| format!("{}: host -> HBM", at()))?;
        t_h2d += t.elapsed();
        let t = Instant::now();
        src.free().with_context(|| format!("{}: NEURON_UDMA_MEM_FREE source", at()))?;
        let what = format!("{}: NEURON_UDMA_MEM_IMPORT of {} (destination)", at(), human_bytes(n));
        let dst = limits::or_memlock(dev.import_mut(&mut out[..n as usize]), what, Remedy::Window)?;
        t_pin += t.elapsed();
        segs_dst += u64::from(dst.segments());
        let t = Instant::now();
        mover.copy(&hbm, &dst, n, &pb.bar).with_context(|| format!("{}: HBM -> host", at()))?;
        t_d2h += t.elapsed();
        let t = Instant::now();
        dst.try_free().map_err(|(_, e)| e).with_context(|| format!("{}: NEURON_UDMA_MEM_FREE destination", at()))?;
        t_pin += t.elapsed();
        let t = Instant::now();
        let got = &out[..n as usize];
        verify(part, got, done).with_context(at)?;
        sum.update(got);
        t_verify += t.elapsed();
        done += n;
        pb.bar.set_message(bar_rate(done, t_h2d + t_d2h));
    }
    let t_all = t_all.elapsed();
    pb.finish();
    Ok(Outcome {
        name,
        total,
        rounds,
        window,
        via: mover.via(),
        route: mover.route(),
        zero_copy: Some((from.to_string(), segs_src, segs_dst)),
        t_h2d,
        t_d2h,
        t_all,
        other: vec![("importing and freeing (pin, unpin)", t_pin), ("verifying and hashing", t_verify)],
        sha256: hex(&sum.finalize()),
    })
}

/// Whether to draw a progress bar: only when stderr (where the bar is drawn) is a terminal that
/// can move the cursor. A log, a pipe or TERM=dumb (e.g. a serial console captured to a file)
/// gets a progress line every [`LINE_INTERVAL`] instead.
fn bar_wanted() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
}

/// How often a copy off a terminal prints its progress line on stderr.
pub const LINE_INTERVAL: Duration = Duration::from_secs(5);

/// The progress of a copy over `total` bytes (both directions): the bar on a terminal; off one,
/// the same count (a hidden bar) and a thread that prints a [`progress_line`] on stderr every
/// [`LINE_INTERVAL`] until [`Progress::finish`].
struct Progress {
    bar: ProgressBar,
    /// The line printer: dropping the sender stops it.
    lines: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Progress {
    fn new(total: u64) -> Self {
        if bar_wanted() {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "host -> HBM -> host {bar:40} {binary_bytes}/{binary_total_bytes} moved {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            return Progress { bar, lines: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        let (stop, stopped) = mpsc::channel::<()>();
        let counted = bar.clone();
        let start = Instant::now();
        let printer = std::thread::spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(LINE_INTERVAL) {
                eprintln!("{}", progress_line(counted.position(), total, start.elapsed()));
            }
        });
        Progress { bar, lines: Some((stop, printer)) }
    }

    /// Stops the line printer and clears the bar.
    fn finish(self) {
        if let Some((stop, printer)) = self.lines {
            drop(stop);
            let _ = printer.join();
        }
        self.bar.finish_and_clear();
    }
}

/// The progress line of a copy off a terminal: bytes moved (both directions) of `total`, the
/// share, the rate since the start (wall time: reading and verifying included) and an estimate
/// of the time left.
pub fn progress_line(done: u64, total: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let pct = if total == 0 { 100.0 } else { 100.0 * done as f64 / total as f64 };
    let left = if done == 0 || secs <= 0.0 {
        "time left unknown".to_string()
    } else {
        let rest = (total.saturating_sub(done)) as f64 * secs / done as f64;
        format!("about {} left", duration_text(rest))
    };
    format!(
        "udmactl copy: {} of {} moved ({pct:.1}%), {}, {} elapsed, {left}",
        human_bytes(done),
        human_bytes(total),
        human_rate(done, elapsed),
        duration_text(secs)
    )
}

/// `s` seconds as "42 s", "3 min 05 s", "2 h 07 min".
fn duration_text(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

/// Bytes the user queues of a copy are charged (none for --memcpy; two with --pipeline).
fn queues_charge(a: &CopyArgs) -> u64 {
    match (a.memcpy, a.q.pipeline) {
        (true, _) => 0,
        (false, false) => limits::queue_charge(a.q.ring_size),
        (false, true) => 2 * limits::queue_charge(a.q.ring_size),
    }
}

/// The bar's message: the DMA rate so far (both directions), with the short label.
fn bar_rate(done: u64, dma: Duration) -> String {
    let label = throughput_label();
    let short = label.split(" (").next().unwrap_or(label);
    format!("{short}: {}", human_rate(2 * done, dma))
}

/// What the rates measure, so that they do not read as hardware figures: under TCG (QEMU's "QEMU
/// TCG CPU" model name) every figure is of an emulation; a device of PCI revision 0xff (QEMU) or
/// 0xf0 (the vendor's emulator, hardware.rst §1.1) is no hardware; in a QEMU virtual machine
/// (DMI vendor QEMU) the device may be a model (this project's udma-sim presents revision 0).
pub fn throughput_label() -> &'static str {
    static LABEL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    LABEL.get_or_init(|| {
        let tcg = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| s.contains("QEMU TCG CPU"));
        let qemu_vm = std::fs::read_to_string("/sys/class/dmi/id/sys_vendor").is_ok_and(|s| s.trim() == "QEMU");
        label_for(&pci_revisions(), tcg, qemu_vm)
    })
}

/// The PCI revisions of the devices bound to neuron_udma (sysfs).
fn pci_revisions() -> Vec<u8> {
    let Ok(dir) = std::fs::read_dir("/sys/bus/pci/drivers/neuron_udma") else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.contains(':')))
        .filter_map(|e| std::fs::read_to_string(e.path().join("revision")).ok())
        .filter_map(|s| u8::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        .collect()
}

/// [`throughput_label`] for the PCI revisions of the bound devices, a TCG CPU, a QEMU machine.
pub fn label_for(revisions: &[u8], tcg: bool, qemu_vm: bool) -> &'static str {
    if revisions.contains(&0xf0) {
        "emulator throughput (vendor hardware emulator, not hardware)"
    } else if revisions.contains(&0xff) {
        "model throughput (QEMU device model, not hardware)"
    } else if tcg {
        "model throughput (TCG emulation, not hardware)"
    } else if qemu_vm {
        "throughput (QEMU virtual machine: the device may be a model, not hardware)"
    } else {
        "throughput"
    }
}

/// The one line about a copy: what, how many bytes, which way, the times and the rates.
pub fn copy_line(o: &Outcome, label: &str) -> String {
    let rounds = match o.rounds {
        1 => format!("1 round of {}", human_bytes(o.window)),
        n => format!("{n} rounds of up to {}", human_bytes(o.window)),
    };
    let zc = match &o.zero_copy {
        Some((_, src, dst)) => format!(", zero-copy (imported runs: source {src}, destination {dst})"),
        None => String::new(),
    };
    let other: Vec<String> = o.other.iter().map(|(what, t)| format!("{what} {:.3} s", t.as_secs_f64())).collect();
    format!(
        "{} ({}, {} bytes) host -> HBM -> host via {}{zc}, {rounds}: {:.2} s end to end (DMA host -> HBM {:.3} s, \
         HBM -> host {:.3} s; {}); {label}: host -> HBM {}, HBM -> host {}",
        o.name,
        human_bytes(o.total),
        o.total,
        o.via,
        o.t_all.as_secs_f64(),
        o.t_h2d.as_secs_f64(),
        o.t_d2h.as_secs_f64(),
        other.join(", "),
        human_rate(o.total, o.t_h2d),
        human_rate(o.total, o.t_d2h)
    )
}

/// `verdict: OK: copied 64.0 MiB host -> HBM -> host through a user queue (engine 0 queue 1),
/// byte-exact (sha256 ...), 1.23 s`.
pub fn verdict_ok(o: &Outcome) -> String {
    let how = match &o.zero_copy {
        Some((from, _, _)) => format!("by zero-copy import (MEM_IMPORT of {from}) {}", o.route),
        None => o.route.clone(),
    };
    format!(
        "verdict: OK: copied {} host -> HBM -> host {how}, byte-exact (sha256 {}), {:.2} s",
        human_bytes(o.total),
        o.sha256,
        o.t_all.as_secs_f64()
    )
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome() -> Outcome {
        Outcome {
            name: "/tmp/data.bin".into(),
            total: 64 << 20,
            rounds: 16,
            window: 4 << 20,
            via: "queue 0/1 (ring 4096)".into(),
            route: "through a user queue (engine 0 queue 1)".into(),
            zero_copy: None,
            t_h2d: Duration::from_millis(800),
            t_d2h: Duration::from_millis(400),
            t_all: Duration::from_millis(1234),
            other: vec![("reading", Duration::from_millis(10)), ("verifying and hashing", Duration::from_millis(20))],
            sha256: "ab".repeat(32),
        }
    }

    #[test]
    fn verdicts() {
        let mut o = outcome();
        assert_eq!(
            verdict_ok(&o),
            format!(
                "verdict: OK: copied 64.0 MiB host -> HBM -> host through a user queue (engine 0 queue 1), byte-exact \
                 (sha256 {}), 1.23 s",
                "ab".repeat(32)
            )
        );
        o.route = "through MEMCPY (the driver's own queue)".into();
        o.zero_copy = Some(("the file's own mapping".into(), 17, 16));
        assert!(verdict_ok(&o).starts_with(
            "verdict: OK: copied 64.0 MiB host -> HBM -> host by zero-copy import (MEM_IMPORT of the file's own \
             mapping) through MEMCPY (the driver's own queue), byte-exact (sha256 abab"
        ));
    }

    #[test]
    fn one_line_per_copy() {
        let mut o = outcome();
        let label = label_for(&[0], true, true);
        let line = copy_line(&o, label);
        assert!(!line.contains('\n'));
        assert_eq!(
            line,
            "/tmp/data.bin (64.0 MiB, 67108864 bytes) host -> HBM -> host via queue 0/1 (ring 4096), 16 rounds of \
             up to 4.0 MiB: 1.23 s end to end (DMA host -> HBM 0.800 s, HBM -> host 0.400 s; reading 0.010 s, \
             verifying and hashing 0.020 s); model throughput (TCG emulation, not hardware): host -> HBM 83.89 MB/s, \
             HBM -> host 167.77 MB/s"
        );
        o.rounds = 1;
        o.zero_copy = Some(("x".into(), 3, 2));
        let line = copy_line(&o, "throughput");
        assert!(line.contains("zero-copy (imported runs: source 3, destination 2), 1 round of 4.0 MiB: "), "{line}");
    }

    #[test]
    fn throughput_labels_say_what_was_measured() {
        assert_eq!(label_for(&[0], true, true), "model throughput (TCG emulation, not hardware)");
        assert_eq!(label_for(&[0xff], true, true), "model throughput (QEMU device model, not hardware)");
        assert_eq!(label_for(&[0xf0], false, false), "emulator throughput (vendor hardware emulator, not hardware)");
        assert!(label_for(&[0], false, true).contains("QEMU virtual machine"));
        assert_eq!(label_for(&[0x01], false, false), "throughput");
        assert_eq!(label_for(&[], false, false), "throughput");
    }

    #[test]
    fn progress_lines_off_a_terminal() {
        assert_eq!(
            progress_line(1 << 30, 4 << 30, Duration::from_secs(10)),
            "udmactl copy: 1.0 GiB of 4.0 GiB moved (25.0%), 107.37 MB/s, 10 s elapsed, about 30 s left"
        );
        assert_eq!(
            progress_line(0, 200 << 30, Duration::from_secs(5)),
            "udmactl copy: 0 B of 200.0 GiB moved (0.0%), 0.00 kB/s, 5 s elapsed, time left unknown"
        );
        let l = progress_line(10 << 30, 200 << 30, Duration::from_secs(400));
        assert!(l.ends_with("6 min 40 s elapsed, about 2 h 06 min left"), "{l}");
        assert_eq!(duration_text(59.6), "1 min 00 s");
    }

    #[test]
    fn copy_json_shape() {
        let v = serde_json::to_value(CopyJson::ok("/dev/neuron_udma0", &outcome(), "throughput")).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "bytes",
                "device",
                "hbm_to_host_bytes_per_second",
                "hbm_to_host_seconds",
                "host_to_hbm_bytes_per_second",
                "host_to_hbm_seconds",
                "ok",
                "other_seconds",
                "rounds",
                "route",
                "seconds",
                "sha256",
                "source",
                "throughput_label",
                "verdict",
                "via",
                "window",
                "zero_copy"
            ]
        );
        assert_eq!(v["ok"], true);
        assert_eq!(v["bytes"], 64 << 20);
        assert_eq!(v["host_to_hbm_bytes_per_second"], (64u64 << 20) as f64 / 0.8);
        assert_eq!(v["other_seconds"]["reading"], 0.01);
        assert_eq!(v["zero_copy"], serde_json::Value::Null);
        assert!(v["verdict"].as_str().unwrap().starts_with("verdict: OK: copied 64.0 MiB"));
        let mut o = outcome();
        o.zero_copy = Some(("the file's own mapping".into(), 17, 16));
        let v = serde_json::to_value(CopyJson::ok("/dev/neuron_udma0", &o, "throughput")).unwrap();
        assert_eq!(
            v["zero_copy"],
            serde_json::json!({"imported": "the file's own mapping", "source_runs": 17, "destination_runs": 16})
        );
        let e = anyhow::anyhow!("busy").context("NEURON_UDMA_QUEUE_INIT");
        let v = serde_json::to_value(CopyJson::failed("/dev/neuron_udma1", &e)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "device": "/dev/neuron_udma1",
                "ok": false,
                "verdict": "verdict: FAILED: NEURON_UDMA_QUEUE_INIT: busy",
                "error": "NEURON_UDMA_QUEUE_INIT: busy"
            })
        );
    }

    #[test]
    fn sha256_hex() {
        // FIPS 180-2 test vector.
        assert_eq!(hex(&Sha256::digest(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
