// SPDX-License-Identifier: MIT OR Apache-2.0
//! udmactl: inspect and exercise a neuron_udma device from the command line.
//!
//! Exit status: 0 on success, 1 on an error (the message on stderr names the errno and its
//! meaning; `copy` reports it in its `verdict: FAILED: ...` line on stdout instead), 2 on a
//! usage error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand};
use indicatif::ProgressBar;
use neuron_udma::{Buffer, Device, DeviceUsage, Info, Pipeline, Queue, QueueState, RingState, UsageError};

#[path = "udmactl/cdi.rs"]
mod cdi;
#[path = "udmactl/copy.rs"]
mod copy;
#[path = "udmactl/json.rs"]
mod json;
#[cfg(test)]
#[path = "udmactl/jsonschema.rs"]
mod jsonschema;
#[path = "udmactl/limits.rs"]
mod limits;
#[path = "udmactl/metrics.rs"]
mod metrics;
#[path = "udmactl/multiqueue.rs"]
mod multiqueue;
#[path = "udmactl/nodes.rs"]
mod nodes;
#[path = "udmactl/selftest.rs"]
mod selftest;
#[path = "udmactl/top.rs"]
mod top;

/// Default largest buffer: big coherent host allocations are hard to get in a small guest.
const DEFAULT_WINDOW: u64 = 4 << 20;

#[derive(Parser, Debug)]
#[command(
    name = "udmactl",
    version,
    about = "Inspect and exercise a neuron_udma (AWS Neuron UDMA) device",
    after_help = "`udmactl list` shows the device nodes. `info`, `list`, `copy`, `queue-state`, `multiqueue`, \
                  `top` and `selftest` print JSON with --json. `udmactl completions SHELL` and `udmactl man` \
                  generate shell completions and manual pages.\nExit status: 0 ok, 1 error (the message names the \
                  errno; `copy` says it in its `verdict: FAILED: ...` line), 2 usage error."
)]
struct Cli {
    /// The device file [default: /dev/neuron_udma0]. `list` finds every node itself.
    #[arg(short, long, global = true)]
    device: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

impl Cli {
    fn device(&self) -> &Path {
        self.device.as_deref().unwrap_or(Path::new(nodes::DEFAULT_DEVICE))
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List every device node (/dev/neuron_udma*, in numeric order): a header row, then one row
    /// each: model, generation, engines, host-connected engines, device memory, max batch.
    ///
    /// A node that cannot be opened or whose INFO fails is listed with the reason. Exit status 1
    /// if there is no node at all, or (after the listing) if any node could not be read. Needs
    /// only read access to the nodes.
    List(ListArgs),
    /// Print the device and driver facts (NEURON_UDMA_INFO), the PCI device and the memory its
    /// files use (the driver's usage counters: in use and peak per type, device memory total).
    Info(JsonArg),
    /// Copy a file (or generated data) host -> HBM -> host, verify every byte, and end with a
    /// verdict line.
    ///
    /// On a terminal (stderr a TTY, TERM not dumb) one progress bar; otherwise a progress line
    /// on stderr every 5 s (bytes moved, rate, time left). Then one line about the copy (bytes,
    /// rounds, times, rates: labelled model or emulator throughput when the device is a QEMU
    /// model or the CPU is emulated, so they do not read as hardware figures) and the verdict,
    /// e.g. `verdict: OK: copied 64.0 MiB host -> HBM -> host through a user queue (engine 0
    /// queue 1), byte-exact (sha256 ...), 1.23 s`; on any failure `verdict: FAILED: <reason>`
    /// instead (on stdout, exit status 1). --json prints one JSON object instead of the two
    /// lines.
    ///
    /// The default window (host buffers of up to 4 MiB) shrinks to fit the soft RLIMIT_MEMLOCK
    /// (ulimit -l, often 8 MiB) with the queue rings; a limit too low even for 64K, or a
    /// --window that does not fit, fails naming the limit and the size needed.
    Copy(CopyArgs),
    /// Take a queue, run copies on it and print its QUEUE_STATE.
    QueueState(QueueStateArgs),
    /// Take a queue, run copies on it and print its QUEUE_STATE with every field decoded.
    RingDump(StateArgs),
    /// Measure DMA throughput (host->host, host->HBM, HBM->host) against an in-process memcpy,
    /// or (--against-memcpy) a user queue against MEMCPY, or (--zero-copy) MEM_IMPORT against a
    /// copy through a coherent buffer.
    Bench(BenchArgs),
    /// Drive N queues from one thread (COPY_SUBMIT, epoll on the device file, QUEUE_EVENTS)
    /// and compare it with N threads blocked in FENCE_WAIT on the same work (ABI 3).
    ///
    /// Every queue copies its slice of a host source into its own host buffer, --passes times
    /// over, in fences of --batch copies, --depth fences in flight per queue; every byte is
    /// verified after each run. One line per mode (rate, fences, epoll wakeups, CPU time), then
    /// `verdict: OK: one thread + epoll drove 16 queues at 0.97x the rate of 16 threads blocked
    /// in FENCE_WAIT (target >= 0.90x), byte-exact`, or `verdict: FAILED: <reason>` (exit
    /// status 1) for a ratio below --target or any error.
    Multiqueue(multiqueue::MultiqueueArgs),
    /// Show what every device and every process holding one open uses, refreshed in place.
    ///
    /// Per device (all nodes, or --device): host, device and imported memory in use and peak,
    /// device memory total (sysfs). Per process with device files open (/proc/PID/fd): files,
    /// buffers, host/device/imported bytes, locked memory charged, queues, bytes copied and their
    /// rate since the last refresh, fences completed and failed (fdinfo). Processes whose
    /// descriptors cannot be read (another user's, unless root) are counted as not readable.
    /// On a terminal (stdout a TTY, TERM not dumb) the screen is redrawn every --interval;
    /// otherwise the reports follow one another. --once prints one report (exit status 1 if a
    /// device's counters could not be read).
    Top(top::TopArgs),
    /// Write every device's counters (sysfs: copies, bytes, fences completed and failed, queue
    /// resets by cause, device resets, engine aborts, ring and buffer memory) in the Prometheus text format, for
    /// node_exporter's textfile collector: to stdout, or with --output to a file written beside
    /// it and renamed into place. Needs only read access to the nodes.
    Metrics(metrics::MetricsArgs),
    /// Write a Container Device Interface spec of the device nodes present (kind
    /// aws.amazon.com/neuron_udma; a device per node, named by its number, and "all") for
    /// container runtimes: to stdout, or with --output to a file (e.g. /etc/cdi/neuron_udma.json)
    /// written beside it and renamed into place.
    Cdi(cdi::CdiArgs),
    /// Exercise every call of the client library against the device and print TAP (exit 1 if
    /// any test fails). Uses queues 1..3 of the first engine that reaches host memory (0 on
    /// Trn1/Inf2, 4 on Trn2) and the driver's MEMCPY queue.
    Selftest(SelftestArgs),
    /// Print a shell completion script for udmactl (bash, zsh, fish, elvish, powershell) on
    /// stdout, generated from its command-line definition.
    ///
    /// bash: `udmactl completions bash > /usr/share/bash-completion/completions/udmactl`;
    /// zsh: `udmactl completions zsh > /usr/local/share/zsh/site-functions/_udmactl`; fish:
    /// `udmactl completions fish > ~/.config/fish/completions/udmactl.fish`.
    Completions(CompletionsArgs),
    /// Print the manual page udmactl(1) (roff) on stdout, or with --dir write udmactl.1 and a page
    /// per command (udmactl-copy.1, ...) into a directory, generated from the command-line
    /// definition.
    ///
    /// E.g. `udmactl man --dir /usr/local/share/man/man1`, then `man udmactl-copy`; or `udmactl
    /// man | man -l -`.
    Man(ManArgs),
}

#[derive(Args, Debug)]
struct SelftestArgs {
    /// Print one JSON object instead of TAP: "device", "tests" (per group "name", "ok" and, for
    /// a failure, "error"), "notes" (the TAP comments), "passed", "failed".
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct CompletionsArgs {
    /// The shell.
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
struct ManArgs {
    /// Write udmactl.1 and udmactl-<command>.1 for every command into this directory (made if
    /// missing) instead.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Print a JSON array instead: per node "device" and the fields of `info --json`, or
    /// "device", "error" and "errno" for a node that could not be read.
    #[arg(long)]
    json: bool,
    /// The directory searched for neuron_udma* nodes (tests point it elsewhere).
    #[arg(long, hide = true, default_value = nodes::DEV_DIR)]
    dev_dir: PathBuf,
}

#[derive(Args, Debug)]
struct JsonArg {
    /// Print one JSON object instead: every INFO field as a number, plus "device", "model"
    /// (null if unknown), "host_engines" (engine numbers), "host_engine_count",
    /// "host_engines_bitmap" (the raw words, as "0x..." strings), "driver_h2t_queues",
    /// "pci_device" and "usage" (the sysfs counters by file name, or null and "usage_error").
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug, Clone)]
struct QueueOpts {
    /// Engine of the user queue: one that reaches host memory (host_engines of `udmactl info`;
    /// default: the first with queues 1..3 free: 0 on Trn1/Inf2, 4 on Trn2).
    #[arg(long)]
    engine: Option<u32>,
    /// Queue within the engine, 0..queues_per_engine-1 (queues 1..3 are never reserved).
    #[arg(long, default_value_t = 1)]
    queue: u32,
    /// Descriptors per ring (a power of two, 32..2^23).
    #[arg(long, default_value_t = 4096)]
    ring_size: u32,
    /// COPY_WAIT / MEMCPY timeout in milliseconds (default: the driver's, 10 s).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Stream through two queues (--queue and the next one), preparing the next batch while the
    /// engine works on the previous one (neuron_udma::Pipeline).
    #[arg(long)]
    pipeline: bool,
}

impl QueueOpts {
    fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("input").required(true).args(["file", "bytes"])))]
struct CopyArgs {
    /// File to copy (or use --bytes).
    file: Option<PathBuf>,
    /// Copy this many bytes of generated pseudo-random data instead of a file (K, M, G suffixes).
    #[arg(long, value_parser = parse_size)]
    bytes: Option<u64>,
    /// Seed of the generated data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Copy with the driver's own queue (MEMCPY) instead of a user queue.
    #[arg(long)]
    memcpy: bool,
    /// Zero-copy: import (MEM_IMPORT) the file's own mapping as the source and a process buffer
    /// as the destination instead of staging the bytes in driver host buffers.
    #[arg(long, requires = "file", conflicts_with = "bytes")]
    zero_copy: bool,
    /// Largest buffer used per round, at least 64K (default: min(4M, max host buffer, device
    /// memory / 2); with --zero-copy: min(max import size, device memory / 2)). A smaller window
    /// pins less memory (RLIMIT_MEMLOCK); the default shrinks to fit the soft limit.
    #[arg(long, value_parser = limits::parse_window)]
    window: Option<u64>,
    /// Print one JSON object instead of the copy's line and verdict: "device", "ok", "verdict",
    /// and on success the figures ("bytes", "rounds", "window", "seconds", the rates in bytes
    /// per second, "sha256", ...), on failure "error".
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    q: QueueOpts,
}

#[derive(Args, Debug)]
struct StateArgs {
    /// Copies (4 KiB each, host->host) to run before reading the state.
    #[arg(long, default_value_t = 8)]
    copies: u32,
    /// Leave the copies prepared but not started (shows sw_pending); with --start, started but
    /// not waited for.
    #[arg(long)]
    no_wait: bool,
    /// With --no-wait: ring the doorbells (COPY_START) for the prepared copies.
    #[arg(long, requires = "no_wait")]
    start: bool,
    #[command(flatten)]
    q: QueueOpts,
}

#[derive(Args, Debug)]
struct QueueStateArgs {
    /// Print one JSON object instead: "device", "engine", "queue", the engine registers and
    /// "tx" / "rx" with every ring field, all as numbers.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    s: StateArgs,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Copy sizes, comma separated (K, M, G suffixes).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4K,64K,1M,64M")]
    sizes: Vec<u64>,
    /// Largest buffer, at least 64K; bigger sizes are moved in rounds of it (default: min(4M, max
    /// host buffer, device memory / 2)).
    #[arg(long, value_parser = limits::parse_window)]
    window: Option<u64>,
    /// Runs per measurement; the best is reported (with --against-memcpy and --zero-copy:
    /// repetitions of each side, alternating; the medians and the ratios' range).
    #[arg(long, default_value_t = 3)]
    iters: u32,
    /// Copy with the driver's own queue (MEMCPY) instead of a user queue.
    #[arg(long)]
    memcpy: bool,
    /// Streaming: per size, host->HBM and HBM->host through the user queue (with --pipeline, two)
    /// and through MEMCPY, alternating (--iters repetitions of each, which goes first
    /// alternating); prints the rates' medians and the per-repetition ratios' median, min and
    /// max, and a `NU-BENCH {json}` line per row for `make bench`.
    #[arg(long, conflicts_with_all = ["memcpy", "zero_copy"])]
    against_memcpy: bool,
    /// Measure zero-copy (MEM_IMPORT of the process's own buffer) host->HBM and HBM->host
    /// against the copy-into-coherent path of the same bytes (a CPU memcpy between the process
    /// buffer and a driver host buffer of --window bytes, plus the DMA).
    #[arg(long)]
    zero_copy: bool,
    #[command(flatten)]
    q: QueueOpts,
}

/// An error already reported on stdout (the verdict line of `copy`): exit status 1, no message.
#[derive(Debug)]
struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("reported above")
    }
}

impl std::error::Error for Reported {}

fn main() -> ExitCode {
    // A closed stdout (`udmactl info | head -1`) ends the command as it ends `cat`, by SIGPIPE's
    // default action, not with a panic in `println!`: Rust's runtime ignores SIGPIPE.
    // SAFETY: the first thing in main, before any thread exists; SIG_DFL is a valid disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("udmactl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ends with a usage error (`why`, exit status 2) if --device was given to a command that reads
/// every node.
fn refuse_device(cli: &Cli, why: &str) {
    if cli.device.is_some() {
        Cli::command().error(clap::error::ErrorKind::ArgumentConflict, why).exit();
    }
}

fn run(cli: &Cli) -> Result<()> {
    if let Cmd::List(a) = &cli.cmd {
        refuse_device(cli, "list finds every /dev/neuron_udma* node itself: --device does not apply");
        return nodes::cmd_list(&a.dev_dir, a.json);
    }
    if let Cmd::Copy(a) = &cli.cmd {
        return Ok(copy::run(cli.device(), a)?);
    }
    if let Cmd::Multiqueue(a) = &cli.cmd {
        return Ok(multiqueue::run(cli.device(), a)?);
    }
    if let Cmd::Top(a) = &cli.cmd {
        return top::run(cli.device.as_deref(), a);
    }
    if let Cmd::Metrics(a) = &cli.cmd {
        return metrics::run(cli.device.as_deref(), a);
    }
    if let Cmd::Cdi(a) = &cli.cmd {
        refuse_device(cli, "cdi describes every /dev/neuron_udma* node: --device does not apply");
        return cdi::run(a);
    }
    if let Cmd::Completions(a) = &cli.cmd {
        print!("{}", completions(a.shell)?);
        return Ok(());
    }
    if let Cmd::Man(a) = &cli.cmd {
        return match &a.dir {
            Some(dir) => std::fs::create_dir_all(dir)
                .and_then(|()| clap_mangen::generate_to(Cli::command(), dir))
                .with_context(|| format!("writing the manual pages to {}", dir.display())),
            None => {
                use std::io::Write;
                std::io::stdout().write_all(&man_page()?).context("writing the manual page")
            }
        };
    }
    // `info` only reads: a read-only open works for users who may not write the node.
    let (dev, info) = nodes::open(cli.device(), matches!(cli.cmd, Cmd::Info(_)))?;
    match &cli.cmd {
        Cmd::List(_)
        | Cmd::Copy(_)
        | Cmd::Multiqueue(_)
        | Cmd::Top(_)
        | Cmd::Metrics(_)
        | Cmd::Cdi(_)
        | Cmd::Completions(_)
        | Cmd::Man(_) => {
            unreachable!("handled above")
        }
        Cmd::Info(a) if a.json => {
            let (pci, usage) = device_usage(&dev);
            let out = json::DeviceInfo {
                device: dev.path().display().to_string(),
                info: json::InfoJson::new(&info),
                dmaengine_queues: dmaengine_queues(&info, pci.as_deref())
                    .map(|q| q.into_iter().map(|(engine, queue)| json::QueueId { engine, queue }).collect()),
                pci_device: pci,
                usage: usage.as_ref().ok().map(Into::into),
                usage_error: usage.as_ref().err().map(|e| error_text(e)),
            };
            println!("{}", serde_json::to_string(&out)?);
            Ok(())
        }
        Cmd::Info(_) => {
            print_info(&dev, &info);
            let (pci, usage) = device_usage(&dev);
            let dma = match dmaengine_queues(&info, pci.as_deref()) {
                Some(q) if q.is_empty() => "- (no dmaengine channels)".to_string(),
                Some(q) => q.iter().map(|(e, q)| format!("{e}/{q}")).collect::<Vec<_>>().join(" "),
                None => "unknown (the PCI device is not in sysfs)".to_string(),
            };
            println!("dmaengine queues:   {dma}");
            for line in usage_lines(pci.as_deref(), usage.as_ref()) {
                println!("{line}");
            }
            Ok(())
        }
        Cmd::QueueState(a) => cmd_state(&dev, &info, &a.s, if a.json { Show::Json } else { Show::Table }),
        Cmd::RingDump(a) => cmd_state(&dev, &info, a, Show::Decoded),
        Cmd::Bench(a) => cmd_bench(&dev, &info, a),
        Cmd::Selftest(a) => selftest::run(&dev, &info, a.json),
    }
}

/// The completion script of udmactl for `shell`.
fn completions(shell: clap_complete::Shell) -> Result<String> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "udmactl", &mut out);
    String::from_utf8(out).context("the completion script is not UTF-8")
}

/// The manual page udmactl(1), roff.
fn man_page() -> Result<Vec<u8>> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut out).context("rendering the manual page")?;
    Ok(out)
}

fn print_info(dev: &Device, i: &Info) {
    println!("device:             {}", dev.path().display());
    println!("model:              {} ({})", nodes::model_name(i), nodes::gen_name(i));
    println!("abi_version:        {}", i.abi_version);
    println!("generation:         {:?} ({})", i.gen(), i.generation);
    println!("pci id:             {:04x}:{:04x}", i.vendor_id, i.device_id);
    println!("engines:            {}", i.engines);
    println!("queues_per_engine:  {}", i.queues_per_engine);
    println!("max_copy_size:      {}", i.max_copy_size);
    println!("device_mem_size:    {} ({})", i.device_mem_size, human_bytes(i.device_mem_size));
    println!("ring descs:         {}..{} (reserve {})", i.min_ring_descs, i.max_ring_descs, i.ring_reserve_descs);
    println!("max_batch:          {}", i.max_batch);
    println!("max_host_buffer:    {} ({})", i.max_host_buffer, human_bytes(i.max_host_buffer));
    println!("max_import_size:    {} ({})", i.max_import_size, human_bytes(i.max_import_size));
    let host = i.host_engine_list();
    println!("host_engines:       {} ({} of {} engines)", engine_ranges(host.iter().copied()), host.len(), i.engines);
    let h2t: Vec<String> = i.h2t_queues().iter().map(|(e, q)| format!("{e}/{q}")).collect();
    println!("driver H2T queues:  {}", if h2t.is_empty() { "-".into() } else { h2t.join(" ") });
    if i.has_abi3() {
        println!("max_buffers:        {}", i.max_buffers);
        println!("max_queue_fences:   {}", i.max_queue_fences);
        let dr = i.device_ring_engine_list();
        println!("device_ring_engines: {} ({} of {} engines)", engine_ranges(dr.iter().copied()), dr.len(), i.engines);
        println!("numa_node:          {}", if i.numa_node < 0 { "none".to_string() } else { i.numa_node.to_string() });
    }
}

/// The queues the dmaengine channels of PCI device `pci` hold (`None`: unknown).
fn dmaengine_queues(info: &Info, pci: Option<&str>) -> Option<Vec<(u32, u32)>> {
    Some(info.dmaengine_queues(limits::dmaengine_channels_of(pci?)?))
}

/// The PCI device of an open file (its fdinfo) and its device's usage counters (sysfs).
fn device_usage(dev: &Device) -> (Option<String>, std::result::Result<DeviceUsage, UsageError>) {
    match dev.usage() {
        Ok(file) => {
            let usage = DeviceUsage::read(&file.device);
            (Some(file.device), usage)
        }
        Err(e) => (None, Err(e)),
    }
}

/// An error and its sources, as one line ("cannot read X: Permission denied (os error 13)").
pub(crate) fn error_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The lines of `info` about the PCI device and its usage counters.
fn usage_lines(pci: Option<&str>, usage: std::result::Result<&DeviceUsage, &UsageError>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(pci) = pci {
        out.push(format!("pci device:         {pci}"));
    }
    match usage {
        Ok(u) => {
            let h = human_bytes;
            out.push(format!("host memory:        {} in use, peak {}", h(u.host_bytes), h(u.host_peak_bytes)));
            out.push(format!(
                "device memory:      {} in use of {}, peak {}",
                h(u.device_bytes),
                h(u.device_total_bytes),
                h(u.device_peak_bytes)
            ));
            out.push(format!("imported memory:    {} in use, peak {}", h(u.imported_bytes), h(u.imported_peak_bytes)));
        }
        Err(e) => out.push(format!("usage:              not available: {}", error_text(e))),
    }
    out
}

/// Fails with the first byte where `got` differs from `want`; `at` is the offset of byte 0 in
/// the copied file.
fn verify(want: &[u8], got: &[u8], at: u64) -> Result<()> {
    // Slice equality is a memcmp; look for the first difference only when there is one.
    if want != got {
        let i = want.iter().zip(got).position(|(x, y)| x != y).unwrap_or(0);
        bail!("verify failed at byte {}: wrote {:#04x}, read back {:#04x}", at + i as u64, want[i], got[i]);
    }
    Ok(())
}

/// `engines` (ascending) as ranges: "0-3 8 12-15"; "-" if none.
fn engine_ranges(engines: impl Iterator<Item = u32>) -> String {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for e in engines {
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == e => *hi = e,
            _ => out.push((e, e)),
        }
    }
    if out.is_empty() {
        return "-".into();
    }
    let parts: Vec<String> =
        out.iter().map(|&(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }).collect();
    parts.join(" ")
}

/// A parsed size: plain bytes or with a K/M/G (binary) suffix.
fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        _ => (s, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?} (e.g. 4096, 64K, 1M, 2G)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("size {s:?} too large"))
}

pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn human_rate(bytes: u64, t: Duration) -> String {
    let s = t.as_secs_f64();
    if s <= 0.0 {
        return "-".into();
    }
    human_bps(bytes as f64 / s)
}

/// A rate in bytes per second, as `human_rate` prints it.
fn human_bps(r: f64) -> String {
    if r >= 1e9 {
        format!("{:.2} GB/s", r / 1e9)
    } else if r >= 1e6 {
        format!("{:.2} MB/s", r / 1e6)
    } else {
        format!("{:.2} kB/s", r / 1e3)
    }
}

/// The pieces of at most `chunk` bytes (one copy, `max_copy_size` of INFO) of `len` bytes:
/// (offset, size).
fn chunks(len: u64, chunk: u32) -> impl Iterator<Item = (u64, u32)> {
    let chunk = u64::from(chunk.max(1));
    (0..len.div_ceil(chunk)).map(move |i| {
        let off = i * chunk;
        (off, (len - off).min(chunk) as u32)
    })
}

/// xorshift64* pseudo-random bytes: deterministic for a seed, no OS entropy needed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// A pipelined copy puts at most 1 / `PIPELINE_SPLIT` of its pieces (rounded up) in one batch
/// ([`Mover::copy_at`]; a stream of rounds, [`Mover::copy_rounds`], a round a batch): a 4 MiB
/// copy goes as four batches of 1 MiB. As one batch, the
/// pipeline's second queue had nothing to overlap with (the streaming row of `make bench`,
/// `Documentation/benchmarks.rst` (d)).
const PIPELINE_SPLIT: u64 = 4;

/// One batch of a [`Mover`]'s plan: its copies and their bytes.
struct Batch {
    copies: Vec<neuron_udma::Copy>,
    bytes: u64,
}

/// Moves bytes with one device: through user queues in pairs of `max_copy_size` (with a second
/// queue, pipelined: the next batch is prepared and started while the engine works on the
/// previous one; with one, batched COPY_PREPARE + COPY_WAIT), or through MEMCPY when there is
/// no queue.
struct Mover<'a> {
    dev: &'a Device,
    info: &'a Info,
    queue: Option<&'a Queue<'a>>,
    second: Option<&'a Queue<'a>>,
    timeout: Option<Duration>,
}

impl Mover<'_> {
    /// Copies `len` bytes from `src` to `dst`, both at offset 0.
    fn copy(&self, src: &dyn Buffer, dst: &dyn Buffer, len: u64, progress: &ProgressBar) -> Result<()> {
        self.copy_at(src, 0, dst, 0, len, progress)
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`. A side may be imported
    /// memory: its copies are split by the driver at the runs it crosses, so a batch holds as
    /// many copies as their worst-case pair counts (`Copy::max_pairs`) fit in one round of the
    /// ring (pipelined, also at most [`PIPELINE_SPLIT`]'s share of them), and is started with the
    /// pair count the driver returns.
    fn copy_at(
        &self,
        src: &dyn Buffer,
        src_off: u64,
        dst: &dyn Buffer,
        dst_off: u64,
        len: u64,
        progress: &ProgressBar,
    ) -> Result<()> {
        let Some(q) = self.queue else {
            const STEP: u64 = 4 << 20;
            let mut off = 0;
            while off < len {
                let n = (len - off).min(STEP);
                self.dev
                    .memcpy(src, src_off + off, dst, dst_off + off, n, self.timeout)
                    .context("NEURON_UDMA_MEMCPY")?;
                progress.inc(n);
                off += n;
            }
            return Ok(());
        };
        let mut pipe = match self.second {
            Some(q2) => Some(Pipeline::new(q, q2, self.timeout)?),
            None => None,
        };
        self.batches(q, pipe.as_mut(), (src, src_off), (dst, dst_off), (len, PIPELINE_SPLIT), progress)?;
        if let Some(p) = &mut pipe {
            p.finish().context("NEURON_UDMA_FENCE_WAIT")?;
        }
        Ok(())
    }

    /// Copies `size` bytes from `src` to `dst` (both at offset 0) as rounds of at most `window`
    /// bytes of the same buffers (a benchmark's stream): with a pipeline, one for the whole
    /// stream, a round a batch (as long as a round of the rings takes it), so that each
    /// overlaps the one before on the other queue: as few doorbells per byte as `MEMCPY`. The
    /// rounds copy the same bytes, so their batches are built once (and once more for a
    /// shorter last round), as a runtime streaming through the same buffers keeps its list.
    fn copy_rounds(
        &self,
        src: &dyn Buffer,
        dst: &dyn Buffer,
        size: u64,
        window: u64,
        progress: &ProgressBar,
    ) -> Result<()> {
        let (Some(q), Some(q2)) = (self.queue, self.second) else {
            return in_rounds(size, window, |_, n| self.copy(src, dst, n, progress));
        };
        let mut pipe = Pipeline::new(q, q2, self.timeout)?;
        let split = if size > window { 1 } else { PIPELINE_SPLIT };
        let mut plan: Option<(u64, Vec<Batch>)> = None;
        in_rounds(size, window, |_, n| {
            if plan.as_ref().is_none_or(|(len, _)| *len != n) {
                plan = Some((n, self.plan(q, Some(&pipe), (src, 0), (dst, 0), (n, split))?));
            }
            let (_, batches) = plan.as_ref().expect("planned above");
            self.run(q, Some(&mut pipe), batches, progress)
        })?;
        pipe.finish().context("NEURON_UDMA_FENCE_WAIT")
    }

    /// The batches of a copy of `len` bytes from `src` (buffer, offset) to `dst` through user
    /// queue `q`, or through `pipe` (whose batches the caller collects, [`Pipeline::finish`]),
    /// at most 1 / `split` of the copy's pieces (rounded up) per pipelined batch.
    fn batches(
        &self,
        q: &Queue,
        pipe: Option<&mut Pipeline>,
        src: (&dyn Buffer, u64),
        dst: (&dyn Buffer, u64),
        len_split: (u64, u64),
        progress: &ProgressBar,
    ) -> Result<()> {
        let batches = self.plan(q, pipe.as_deref(), src, dst, len_split)?;
        self.run(q, pipe, &batches, progress)
    }

    /// The copies of [`Self::batches`], cut into batches: each as many copies as their
    /// worst-case pair counts fit in one round of the ring (pipelined, of the smaller ring of
    /// the two queues).
    fn plan(
        &self,
        q: &Queue,
        pipe: Option<&Pipeline>,
        (src, src_off): (&dyn Buffer, u64),
        (dst, dst_off): (&dyn Buffer, u64),
        (len, split): (u64, u64),
    ) -> Result<Vec<Batch>> {
        let per_round = match pipe {
            Some(p) => p.batch_len()?,
            None => {
                let (tx, rx) = q.ring_descs();
                self.info.pairs_per_round(tx.min(rx)) as usize
            }
        };
        // Pipelined, one copy alone goes as `split` batches: the engine works on one batch
        // while the next is prepared, also when every copy fits in one round of a ring (as one
        // batch it would leave nothing to overlap with).
        let copies = usize::try_from(len.div_ceil(u64::from(self.info.max_copy_size.max(1)))).unwrap_or(usize::MAX);
        let per_batch = if pipe.is_some() { copies.div_ceil(split.max(1) as usize) } else { usize::MAX };
        let mut batches = Vec::new();
        let mut pieces = chunks(len, self.info.max_copy_size).peekable();
        while pieces.peek().is_some() {
            let mut batch = Batch { copies: Vec::with_capacity(per_round.min(per_batch).min(copies)), bytes: 0 };
            let mut pairs = 0usize;
            while let Some(&(off, size)) = pieces.peek() {
                let (s, d) = (src_off + off, dst_off + off);
                let need = neuron_udma::Copy::max_pairs(src, s, dst, d, size) as usize;
                // The first copy of a batch always goes: alone it needs at most 1 + 2 *
                // max_copy_size / page size pairs, far below a round of the default ring.
                if !batch.copies.is_empty() && (pairs + need > per_round || batch.copies.len() >= per_batch) {
                    break;
                }
                batch.copies.push(neuron_udma::Copy::new(src, s, dst, d, size)?);
                batch.bytes += u64::from(size);
                pairs += need;
                pieces.next();
            }
            batches.push(batch);
        }
        Ok(batches)
    }

    /// Submits `batches` ([`Self::plan`]) through `pipe`, or prepares and waits for each on `q`.
    fn run(&self, q: &Queue, mut pipe: Option<&mut Pipeline>, batches: &[Batch], progress: &ProgressBar) -> Result<()> {
        for b in batches {
            let n = b.copies.len();
            match &mut pipe {
                Some(p) => p.submit(&b.copies).with_context(|| format!("pipelined batch of {n} pairs"))?,
                None => {
                    q.prepare(&b.copies).with_context(|| format!("NEURON_UDMA_COPY_PREPARE of {n} pairs"))?;
                    q.wait(self.timeout).context("NEURON_UDMA_COPY_WAIT")?;
                }
            }
            progress.inc(b.bytes);
        }
        Ok(())
    }

    /// How the bytes travel, for the verdict of a copy.
    fn route(&self) -> String {
        match (self.queue, self.second) {
            (Some(q), Some(q2)) => format!(
                "through two pipelined user queues (engine {} queues {} and {})",
                q.engine(),
                q.queue(),
                q2.queue()
            ),
            (Some(q), None) => format!("through a user queue (engine {} queue {})", q.engine(), q.queue()),
            (None, _) => "through MEMCPY (the driver's own queue)".into(),
        }
    }

    fn via(&self) -> String {
        match (self.queue, self.second) {
            (Some(q), Some(q2)) => format!(
                "queues {}/{} + {}/{} pipelined (ring {})",
                q.engine(),
                q.queue(),
                q2.engine(),
                q2.queue(),
                q.ring_descs().0
            ),
            (Some(q), None) => format!("queue {}/{} (ring {})", q.engine(), q.queue(), q.ring_descs().0),
            (None, _) => "MEMCPY".into(),
        }
    }
}

/// The queues of a copy: none for MEMCPY; the user queue, and with --pipeline the next queue of
/// the same engine for a [`Pipeline`].
fn open_queues<'d>(
    dev: &'d Device,
    info: &Info,
    memcpy: bool,
    o: &QueueOpts,
) -> Result<(Option<Queue<'d>>, Option<Queue<'d>>)> {
    if memcpy {
        return Ok((None, None));
    }
    let q = open_queue(dev, info, o)?;
    let second = if o.pipeline {
        let next = QueueOpts { engine: Some(q.engine()), queue: o.queue.saturating_add(1), ..o.clone() };
        Some(open_queue(dev, info, &next).context("the pipeline's second queue (--queue + 1)")?)
    } else {
        None
    };
    Ok((Some(q), second))
}

/// Takes the user queue of `o`, after checking the engine and queue against INFO (the error
/// names the valid range).
fn open_queue<'d>(dev: &'d Device, info: &Info, o: &QueueOpts) -> Result<Queue<'d>> {
    let engine = match o.engine {
        Some(e) => e,
        None => info.user_engine().with_context(|| {
            format!("{} has no engine that reaches host memory (host_engines of INFO)", limits::this_device(info))
        })?,
    };
    limits::check_user_queue(info, engine, o.queue).map_err(anyhow::Error::msg)?;
    dev.queue(engine, o.queue, o.ring_size)
        .map_err(|e| limits::queue_init_error(dev, info, engine, o.queue, o.ring_size, e))
}

/// How `cmd_state` prints the state.
enum Show {
    Table,
    Decoded,
    Json,
}

fn cmd_state(dev: &Device, info: &Info, a: &StateArgs, show: Show) -> Result<()> {
    const SIZE: u64 = 4096;
    let q = open_queue(dev, info, &a.q)?;
    let n = u64::from(a.copies.max(1));
    let src = dev.alloc_host(n * SIZE).context("NEURON_UDMA_MEM_ALLOC")?;
    let dst = dev.alloc_host(n * SIZE).context("NEURON_UDMA_MEM_ALLOC")?;
    let copies: Vec<_> = (0..u64::from(a.copies))
        .map(|i| neuron_udma::Copy::new(&src, i * SIZE, &dst, i * SIZE, SIZE as u32))
        .collect::<Result<_, _>>()?;
    let per_round = info.pairs_per_round(a.q.ring_size) as usize;
    let mut left = copies.as_slice();
    while !left.is_empty() {
        let (batch, rest) = left.split_at(left.len().min(per_round));
        q.prepare(batch).context("NEURON_UDMA_COPY_PREPARE")?;
        left = rest;
        if a.no_wait && left.is_empty() {
            if a.start {
                let c = batch.len() as u32;
                q.start(c, c).context("NEURON_UDMA_COPY_START")?;
            }
        } else {
            q.wait(a.q.timeout()).context("NEURON_UDMA_COPY_WAIT")?;
        }
    }
    let st = q.state().context("NEURON_UDMA_QUEUE_STATE")?;
    match show {
        Show::Table => print_state(&st),
        Show::Decoded => print_ring_dump(&st),
        Show::Json => {
            let out = json::QueueStateJson::new(&dev.path().display().to_string(), &st);
            println!("{}", serde_json::to_string(&out)?);
        }
    }
    Ok(())
}

fn print_state(s: &QueueState) {
    println!("engine {} queue {}", s.engine, s.queue);
    println!(
        "m2s_state {:#06x}  s2m_state {:#06x}  m2s_cause {:#010x}  s2m_cause {:#010x}  resets {}",
        s.m2s_engine_state, s.s2m_engine_state, s.m2s_error_cause, s.s2m_error_cause, s.resets
    );
    println!(
        "{:<4} {:>10} {:>10} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6} {:>9} {:>8} {:>8}",
        "ring",
        "hw_cfg",
        "hw_status",
        "hw_len",
        "hw_head",
        "hw_tail",
        "hw_comp",
        "sw_next",
        "sw_ack",
        "sw_id",
        "sw_avail",
        "sw_pend",
        "size"
    );
    for (name, r) in [("tx", &s.tx), ("rx", &s.rx)] {
        println!(
            "{:<4} {:#010x} {:#010x} {:>8} {:#010x} {:#010x} {:#010x} {:>8} {:>8} {:>6} {:>9} {:>8} {:>8}",
            name,
            r.hw_cfg,
            r.hw_status,
            r.hw_len,
            r.hw_head,
            r.hw_tail,
            r.hw_comp_head,
            r.sw_next,
            r.sw_ack,
            r.sw_ring_id,
            r.sw_available,
            r.sw_pending,
            r.size
        );
    }
}

/// The `m2s.state` / `s2m.state` register: four 4-bit fields (one per internal unit), whose
/// low two bits are 0 idle, 1 normal, 2 abort (hardware.rst §3.2, §3.3).
const STATE_FIELDS: u32 = 4;
const STATE_FIELD_BITS: u32 = 4;
const STATE_MASK: u32 = 3;
/// Queue cfg register: bit 16 enables descriptor prefetch, bit 17 scheduling (hardware.rst §3.4).
const Q_CFG_PREFETCH: u32 = 1 << 16;
const Q_CFG_SCHEDULING: u32 = 1 << 17;

fn engine_state(v: u32) -> String {
    let field = |i: u32| match (v >> (STATE_FIELD_BITS * i)) & STATE_MASK {
        0 => "idle",
        1 => "normal",
        2 => "abort",
        _ => "?",
    };
    let names: Vec<&str> = (0..STATE_FIELDS).map(field).collect();
    format!("{v:#06x} [{}]", names.join(", "))
}

fn cause_bits(v: u32) -> String {
    if v == 0 {
        return "0 (none)".into();
    }
    let bits: Vec<String> = (0..32).filter(|b| v >> b & 1 == 1).map(|b| b.to_string()).collect();
    format!("{v:#010x} (bits {})", bits.join(","))
}

fn print_ring(name: &str, r: &RingState) {
    let idx = neuron_udma::ring_index;
    let id = neuron_udma::ring_id;
    println!("{name} ring: {} descriptors", r.size);
    println!(
        "  hw cfg        {:#010x}  prefetch {}  scheduling {}",
        r.hw_cfg,
        if r.hw_cfg & Q_CFG_PREFETCH != 0 { "on" } else { "off" },
        if r.hw_cfg & Q_CFG_SCHEDULING != 0 { "on" } else { "off" }
    );
    println!("  hw status     {:#010x}", r.hw_status);
    println!("  hw len        {}", idx(r.hw_len));
    println!("  hw head       index {:>8}  ring id {}", idx(r.hw_head), id(r.hw_head));
    println!("  hw tail       index {:>8}  ring id {}", idx(r.hw_tail), id(r.hw_tail));
    println!("  hw comp head  index {:>8}  ring id {}", idx(r.hw_comp_head), id(r.hw_comp_head));
    println!(
        "  sw next {}  ack {}  ring id {}  available {}  pending {}",
        r.sw_next, r.sw_ack, r.sw_ring_id, r.sw_available, r.sw_pending
    );
    if r.size.is_power_of_two() {
        let used = r.sw_next.wrapping_sub(r.sw_ack) & (r.size - 1);
        let in_hw = idx(r.hw_tail).wrapping_sub(idx(r.hw_head)) & (r.size - 1);
        println!("  derived       in use {used} (next - ack), started not consumed {in_hw} (tail - head)");
        let tail_expected = r.sw_next.wrapping_sub(r.sw_pending) & (r.size - 1);
        if idx(r.hw_tail) != tail_expected {
            println!("  note          hw tail {} != sw next - pending {}", idx(r.hw_tail), tail_expected);
        }
    }
}

fn print_ring_dump(s: &QueueState) {
    println!("engine {} queue {}", s.engine, s.queue);
    println!("  m2s state     {}", engine_state(s.m2s_engine_state));
    println!("  s2m state     {}", engine_state(s.s2m_engine_state));
    println!("  m2s cause     {}", cause_bits(s.m2s_error_cause));
    println!("  s2m cause     {}", cause_bits(s.s2m_error_cause));
    println!("  resets        {}", s.resets);
    print_ring("tx (m2s)", &s.tx);
    print_ring("rx (s2m)", &s.rx);
}

/// Best time of `iters` runs of `f`.
fn best_of(iters: u32, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed());
    }
    Ok(best)
}

fn cmd_bench(dev: &Device, info: &Info, a: &BenchArgs) -> Result<()> {
    let (queue, second) = open_queues(dev, info, a.memcpy, &a.q)?;
    let mover = Mover { dev, info, queue: queue.as_ref(), second: second.as_ref(), timeout: a.q.timeout() };
    if a.zero_copy {
        return bench_zero_copy(dev, info, a, &mover);
    }
    if a.against_memcpy {
        return bench_against_memcpy(dev, info, a, &mover);
    }
    let hidden = ProgressBar::hidden();
    println!("{:>8}  {:<11} {:>14} {:>14} {:>7}   via {}", "size", "path", "dma", "memcpy", "ratio", mover.via());
    for &size in &a.sizes {
        if size == 0 {
            bail!("size 0 in --sizes");
        }
        // One buffer of up to `size` bytes, reused until `size` bytes have moved.
        let buf = size.min(bench_window(info, a, size)?).min(info.max_host_buffer).min(info.device_mem_size / 2).max(1);
        let rounds = size.div_ceil(buf);
        let mut h1 = limits::or_memlock(dev.alloc_host(buf), "NEURON_UDMA_MEM_ALLOC host", limits::Remedy::Window)?;
        let h2 = limits::or_memlock(dev.alloc_host(buf), "NEURON_UDMA_MEM_ALLOC host", limits::Remedy::Window)?;
        let d = dev.alloc_device(buf).context("NEURON_UDMA_MEM_ALLOC device")?;
        XorShift::new(size).fill(&mut h1);
        let mut v1 = vec![0u8; buf as usize];
        let mut v2 = vec![0u8; buf as usize];
        XorShift::new(size).fill(&mut v1);
        let t_mem = best_of(a.iters, || {
            let mut left = size;
            while left > 0 {
                let n = left.min(buf) as usize;
                v2[..n].copy_from_slice(std::hint::black_box(&v1[..n]));
                std::hint::black_box(&mut v2);
                left -= n as u64;
            }
            Ok(())
        })?;
        let paths: [(&str, &dyn Buffer, &dyn Buffer); 3] =
            [("host->host", &h1, &h2), ("host->HBM", &h1, &d), ("HBM->host", &d, &h2)];
        for (name, src, dst) in paths {
            let t = best_of(a.iters, || {
                let mut left = size;
                for _ in 0..rounds {
                    let n = left.min(buf);
                    mover.copy(src, dst, n, &hidden)?;
                    left -= n;
                }
                Ok(())
            })
            .with_context(|| format!("{name} {}", human_bytes(size)))?;
            let ratio = t_mem.as_secs_f64() / t.as_secs_f64().max(f64::MIN_POSITIVE);
            println!(
                "{:>8}  {:<11} {:>14} {:>14} {:>6.2}x",
                human_size(size),
                name,
                human_rate(size, t),
                human_rate(size, t_mem),
                ratio
            );
        }
        if h1[..] != h2[..] {
            bail!("{}: the HBM->host copy does not match the source", human_bytes(size));
        }
    }
    Ok(())
}

/// The window of a bench size: --window, or the default shrunk until two host buffers of it and
/// the queues' rings fit the soft RLIMIT_MEMLOCK (`limits::plan_window`).
fn bench_window(info: &Info, a: &BenchArgs, size: u64) -> Result<u64> {
    let queues = match (a.memcpy, a.q.pipeline) {
        (true, _) => 0,
        (false, pipeline) => (1 + u64::from(pipeline)) * limits::queue_charge(a.q.ring_size),
    };
    let want = DEFAULT_WINDOW.min(info.max_host_buffer).min(info.device_mem_size / 2).min(size);
    let pinned = limits::Pinned { buffers: 2, fixed: queues };
    limits::plan_window(a.window, want, limits::memlock_budget(), pinned).map_err(anyhow::Error::msg)
}

/// The median of `v` (sorted in place; the upper middle of an even count), 0 for none.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Per-repetition ratios of an interleaved measurement: (median, min, max).
fn spread(ratios: &mut [f64]) -> (f64, f64, f64) {
    let m = median(ratios);
    (m, ratios.first().copied().unwrap_or(0.0), ratios.last().copied().unwrap_or(0.0))
}

/// Interleaved repetitions of two sides each moving `size` bytes, `a[i]` and `b[i]` timed in
/// the same repetition: each side's median rate (bytes/s) and the per-repetition ratios of `a`'s
/// rate over `b`'s (median, min, max).
fn interleaved(size: u64, a: &[Duration], b: &[Duration]) -> (f64, f64, (f64, f64, f64)) {
    let rate = |d: &Duration| size as f64 / d.as_secs_f64().max(f64::MIN_POSITIVE);
    let mut ra: Vec<f64> = a.iter().map(rate).collect();
    let mut rb: Vec<f64> = b.iter().map(rate).collect();
    let mut ratios: Vec<f64> = ra.iter().zip(&rb).map(|(x, y)| x / y).collect();
    (median(&mut ra), median(&mut rb), spread(&mut ratios))
}

/// A range of ratios as the tables print it: `min-maxx`.
fn range_text(r: (f64, f64, f64)) -> String {
    format!("{:.3}-{:.3}x", r.1, r.2)
}

/// One `NU-BENCH {json}` line of a ratio of interleaved repetitions (`make bench`'s report
/// reads it): the figure and its baseline (medians, bytes/s), the per-repetition ratios'
/// median, min and max.
fn nu_bench_ratio(name: &str, value: f64, baseline: f64, ratios: (f64, f64, f64), reps: usize, how: &str) {
    let row = serde_json::json!({
        "name": name, "value": value, "unit": "B/s", "baseline": baseline,
        "ratio": ratios.0, "min": ratios.1, "max": ratios.2, "reps": reps, "how": how,
    });
    println!("NU-BENCH {row}");
}

/// `bench --against-memcpy`: per size, host->HBM and HBM->host through `mover` (the user
/// queue) and through MEMCPY, --iters repetitions of each alternating (which goes first
/// alternates), one host and one device buffer of up to --window bytes reused in rounds. Both
/// directions verified byte for byte at the end of each size.
fn bench_against_memcpy(dev: &Device, info: &Info, a: &BenchArgs, user: &Mover) -> Result<()> {
    let memcpy = Mover { dev, info, queue: None, second: None, timeout: user.timeout };
    let hidden = ProgressBar::hidden();
    let reps = a.iters.max(1) as usize;
    println!(
        "{:>8}  {:<11} {:>14} {:>14} {:>7} {:>17}   via {} against MEMCPY",
        "size",
        "path",
        "user queue",
        "MEMCPY",
        "ratio",
        "range",
        user.via()
    );
    for &size in &a.sizes {
        if size == 0 {
            bail!("size 0 in --sizes");
        }
        let buf = size.min(bench_window(info, a, size)?).min(info.max_host_buffer).min(info.device_mem_size / 2).max(1);
        let mut h1 = limits::or_memlock(dev.alloc_host(buf), "NEURON_UDMA_MEM_ALLOC host", limits::Remedy::Window)?;
        let h2 = limits::or_memlock(dev.alloc_host(buf), "NEURON_UDMA_MEM_ALLOC host", limits::Remedy::Window)?;
        let d = dev.alloc_device(buf).context("NEURON_UDMA_MEM_ALLOC device")?;
        XorShift::new(size).fill(&mut h1);
        let paths: [(&str, &dyn Buffer, &dyn Buffer); 2] = [("host->HBM", &h1, &d), ("HBM->host", &d, &h2)];
        for (name, src, dst) in paths {
            let timed = |m: &Mover| -> Result<Duration> {
                let t = Instant::now();
                m.copy_rounds(src, dst, size, buf, &hidden)?;
                Ok(t.elapsed())
            };
            let (mut tu, mut tm) = (Vec::new(), Vec::new());
            for i in 0..reps {
                if i % 2 == 0 {
                    tu.push(timed(user)?);
                    tm.push(timed(&memcpy)?);
                } else {
                    tm.push(timed(&memcpy)?);
                    tu.push(timed(user)?);
                }
            }
            let (u, m, r) = interleaved(size, &tu, &tm);
            println!(
                "{:>8}  {:<11} {:>14} {:>14} {:>6.3}x {:>17}",
                human_size(size),
                name,
                human_bps(u),
                human_bps(m),
                r.0,
                range_text(r)
            );
            let how = format!(
                "udmactl bench --against-memcpy: {reps} repetitions of each side alternating (which goes first \
                 alternates), {} through {} (--pipeline: the next batch prepared and started while the engine runs \
                 the previous one) against the MEMCPY ioctl of the same bytes, buffers of {} reused in rounds; rates: \
                 the medians; ratio: the median of the per-repetition ratios, min and max beside it",
                human_bytes(size),
                user.via(),
                human_bytes(buf)
            );
            nu_bench_ratio(
                &format!("streaming {} {name}: user queue vs MEMCPY", human_size(size)),
                u,
                m,
                r,
                reps,
                &how,
            );
        }
        if h1[..] != h2[..] {
            bail!("{}: the HBM->host copy does not match the source", human_bytes(size));
        }
    }
    Ok(())
}

/// `bench --zero-copy`: per size, host->HBM and HBM->host of a process buffer (a) zero-copy:
/// imported (MEM_IMPORT), copied, freed, the import and free timed with the copy; (b) through
/// a coherent driver host buffer of --window bytes: CPU memcpy between it and the process buffer,
/// plus the DMA, round by round. --iters repetitions, zero-copy and coherent alternating in
/// each direction: the rates' medians, the per-repetition ratios' median, min and max (range,
/// reps), the best import + free time (pin+unpin); both directions verified byte for byte.
fn bench_zero_copy(dev: &Device, info: &Info, a: &BenchArgs, mover: &Mover) -> Result<()> {
    if info.max_import_size == 0 {
        bail!("the driver has no MEM_IMPORT (ABI {}); --zero-copy needs ABI 2", info.abi_version);
    }
    let hidden = ProgressBar::hidden();
    println!(
        "{:>8}  {:<19} {:>14} {:>14} {:>7}  {:>10}  {:>6}  {:<13} {:>4}   via {}",
        "size",
        "path",
        "zero-copy",
        "coherent",
        "ratio",
        "pin+unpin",
        "runs",
        "range",
        "reps",
        mover.via()
    );
    for &size in &a.sizes {
        if size == 0 || size > info.max_import_size || size > info.device_mem_size {
            bail!("size {size} in --sizes: not in 1..=min(max import size, device memory)");
        }
        let len = usize::try_from(size)?;
        let window = size.min(a.window.unwrap_or(DEFAULT_WINDOW)).min(info.max_host_buffer).max(1);
        let mut stage = limits::or_memlock(
            dev.alloc_host(window),
            "NEURON_UDMA_MEM_ALLOC host (coherent staging)",
            limits::Remedy::Window,
        )?;
        let hbm = dev.alloc_device(size).context("NEURON_UDMA_MEM_ALLOC device")?;
        let mut data = process_buffer(len)?;
        XorShift::new(size).fill(&mut data);
        // Written once so that its pages exist, as a runtime's destination does: the first
        // import must not be charged with faulting in zero pages.
        let mut out = process_buffer(len)?;
        out.fill(0xA5);

        // Each repetition times the four runs, zero-copy and coherent alternating in each
        // direction (which goes first alternates), so that both sides of a ratio share the
        // phase; the table prints the medians and the per-repetition ratios' median and range.
        let reps = a.iters.max(1) as usize;
        let (mut pin_h2d, mut runs_h2d, mut pin_d2h, mut runs_d2h) = (Duration::MAX, 0, Duration::MAX, 0);
        let mut t = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
        for i in 0..reps {
            let zc_first = i % 2 == 0;
            let mut zc_h2d = || -> Result<Duration> {
                let t0 = Instant::now();
                let src = limits::or_memlock(dev.import(&data), "NEURON_UDMA_MEM_IMPORT", limits::Remedy::Sizes)?;
                let mut pin = t0.elapsed();
                runs_h2d = src.segments();
                mover.copy(&src, &hbm, size, &hidden)?;
                let t1 = Instant::now();
                src.free().context("NEURON_UDMA_MEM_FREE")?;
                pin += t1.elapsed();
                pin_h2d = pin_h2d.min(pin);
                Ok(t0.elapsed())
            };
            let mut co_h2d = || -> Result<Duration> {
                let t0 = Instant::now();
                in_rounds(size, window, |off, n| {
                    stage[..n as usize].copy_from_slice(&data[off as usize..(off + n) as usize]);
                    mover.copy_at(&stage, 0, &hbm, off, n, &hidden)
                })?;
                Ok(t0.elapsed())
            };
            let (z, c) = if zc_first {
                let z = zc_h2d().with_context(|| format!("zero-copy host->HBM {}", human_bytes(size)))?;
                (z, co_h2d().with_context(|| format!("coherent host->HBM {}", human_bytes(size)))?)
            } else {
                let c = co_h2d().with_context(|| format!("coherent host->HBM {}", human_bytes(size)))?;
                (zc_h2d().with_context(|| format!("zero-copy host->HBM {}", human_bytes(size)))?, c)
            };
            t[0][0].push(z);
            t[0][1].push(c);
            for zc in [zc_first, !zc_first] {
                out.fill(0);
                let d = if zc {
                    let t0 = Instant::now();
                    let dst =
                        limits::or_memlock(dev.import_mut(&mut out), "NEURON_UDMA_MEM_IMPORT", limits::Remedy::Sizes)
                            .with_context(|| format!("zero-copy HBM->host {}", human_bytes(size)))?;
                    let mut pin = t0.elapsed();
                    runs_d2h = dst.segments();
                    mover
                        .copy(&hbm, &dst, size, &hidden)
                        .with_context(|| format!("zero-copy HBM->host {}", human_bytes(size)))?;
                    let t1 = Instant::now();
                    dst.try_free().map_err(|(_, e)| e).context("NEURON_UDMA_MEM_FREE")?;
                    pin += t1.elapsed();
                    pin_d2h = pin_d2h.min(pin);
                    t0.elapsed()
                } else {
                    let t0 = Instant::now();
                    in_rounds(size, window, |off, n| {
                        mover.copy_at(&hbm, off, &stage, 0, n, &hidden)?;
                        out[off as usize..(off + n) as usize].copy_from_slice(&stage[..n as usize]);
                        Ok(())
                    })
                    .with_context(|| format!("coherent HBM->host {}", human_bytes(size)))?;
                    t0.elapsed()
                };
                t[1][usize::from(!zc)].push(d);
                if out[..] != data[..] {
                    let how = if zc { "zero-copy" } else { "coherent" };
                    bail!("{}: the {how} round trip does not match the source", human_bytes(size));
                }
            }
        }
        for (dir, (name, pin, runs)) in
            [("host->HBM", pin_h2d, runs_h2d), ("HBM->host", pin_d2h, runs_d2h)].into_iter().enumerate()
        {
            let (z, c, r) = interleaved(size, &t[dir][0], &t[dir][1]);
            println!(
                "{:>8}  zero-copy {:<9} {:>14} {:>14} {:>6.3}x  {:>8.3}ms  {:>6}  {:<13} {:>4}",
                human_size(size),
                name,
                human_bps(z),
                human_bps(c),
                r.0,
                pin.as_secs_f64() * 1e3,
                runs,
                range_text(r),
                reps
            );
        }
    }
    Ok(())
}

/// Anonymous process memory of `len` bytes for imports, with transparent huge pages asked for
/// (`MADV_HUGEPAGE`, where the kernel has them): the fewer physically contiguous runs a buffer
/// has, the fewer descriptor pairs its copies split into. Its pages exist once written.
fn process_buffer(len: usize) -> Result<memmap2::MmapMut> {
    let map = memmap2::MmapMut::map_anon(len.max(1)).with_context(|| format!("mmap of {len} bytes"))?;
    // EINVAL without CONFIG_TRANSPARENT_HUGEPAGE: 4 KiB pages then, which only split more.
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

/// Calls `f(offset, bytes)` for the consecutive pieces of at most `window` bytes of `size`.
fn in_rounds(size: u64, window: u64, mut f: impl FnMut(u64, u64) -> Result<()>) -> Result<()> {
    let mut off = 0;
    while off < size {
        let n = (size - off).min(window.max(1));
        f(off, n)?;
        off += n;
    }
    Ok(())
}

fn human_size(n: u64) -> String {
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every subcommand of the definition (clap's own `help` aside).
    fn subcommands() -> Vec<String> {
        Cli::command().get_subcommands().map(|c| c.get_name().to_string()).collect()
    }

    #[test]
    fn new_arguments_parse() {
        let cli = Cli::try_parse_from(["udmactl", "copy", "--bytes", "8M", "--json"]).unwrap();
        assert!(matches!(cli.cmd, Cmd::Copy(ref a) if a.json && a.bytes == Some(8 << 20) && a.window.is_none()));
        let cli = Cli::try_parse_from(["udmactl", "-d", "/dev/neuron_udma1", "selftest", "--json"]).unwrap();
        assert!(matches!(cli.cmd, Cmd::Selftest(SelftestArgs { json: true })));
        assert!(matches!(
            Cli::try_parse_from(["udmactl", "selftest"]).unwrap().cmd,
            Cmd::Selftest(SelftestArgs { json: false })
        ));
        let cli = Cli::try_parse_from(["udmactl", "completions", "zsh"]).unwrap();
        assert!(matches!(cli.cmd, Cmd::Completions(CompletionsArgs { shell: clap_complete::Shell::Zsh })));
        assert!(Cli::try_parse_from(["udmactl", "completions"]).is_err());
        assert!(Cli::try_parse_from(["udmactl", "completions", "tcsh"]).is_err());
        let cli = Cli::try_parse_from(["udmactl", "man", "--dir", "/tmp/m"]).unwrap();
        assert!(matches!(cli.cmd, Cmd::Man(ManArgs { dir: Some(ref d) }) if d == Path::new("/tmp/m")));
        assert!(matches!(Cli::try_parse_from(["udmactl", "man"]).unwrap().cmd, Cmd::Man(ManArgs { dir: None })));
    }

    #[test]
    fn completions_name_every_subcommand() {
        let names = subcommands();
        assert!(names.len() >= 13, "{names:?}");
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let script = completions(shell).unwrap();
            for name in &names {
                assert!(script.contains(name.as_str()), "{shell} completions lack {name}");
            }
            assert!(script.contains("--zero-copy") && script.contains("--json"), "{shell}: no options");
        }
    }

    #[test]
    fn man_page_names_every_subcommand() {
        let page = String::from_utf8(man_page().unwrap()).unwrap();
        assert!(page.contains(".TH udmactl 1") && page.contains(".SH SUBCOMMANDS"), "{page}");
        for name in subcommands() {
            // roff escapes each hyphen: udmactl\-queue\-state(1).
            let entry = format!("udmactl\\-{}(1)", name.replace('-', "\\-"));
            assert!(page.contains(&entry), "the man page lacks {entry}");
        }
        // --dir: one page per command.
        let dir = std::env::temp_dir().join(format!("udmactl-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        clap_mangen::generate_to(Cli::command(), &dir).unwrap();
        for name in subcommands() {
            let p = dir.join(format!("udmactl-{name}.1"));
            assert!(std::fs::metadata(&p).is_ok_and(|m| m.len() > 0), "no {}", p.display());
        }
        assert!(dir.join("udmactl.1").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The commands a documentation list names: the items of `text` from `start` to the first
    /// `end` after it, separated by commas or "and", each one's first word in backquotes
    /// (`` ``copy`` `` or `` `copy` ``); comments in parentheses are left out.
    fn listed_commands(text: &str, start: &str, end: &str) -> Vec<String> {
        let from = text.find(start).unwrap_or_else(|| panic!("no {start:?} in the document")) + start.len();
        let to = from + text[from..].find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?}"));
        let mut list = String::new();
        let mut depth = 0usize;
        for c in text[from..to].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                c if depth == 0 => list.push(c),
                _ => {}
            }
        }
        list.replace(" and ", ",")
            .split(',')
            .filter_map(|item| item.trim().strip_prefix('`'))
            .map(|item| item.trim_start_matches('`').split('`').next().unwrap_or_default().to_string())
            .collect()
    }

    #[test]
    fn docs_list_every_command() {
        let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut want = subcommands();
        want.sort();
        let docs = [
            ("Documentation/userspace-api.rst", "``udmactl`` (", ")"),
            ("tools/neuron-udma/README.md", "- `udmactl` (`src/bin/udmactl.rs`, `src/bin/udmactl/`):", "; see"),
        ];
        for (doc, start, end) in docs {
            let text = std::fs::read_to_string(top.join(doc)).unwrap();
            let mut got = listed_commands(&text, start, end);
            got.sort();
            assert_eq!(got, want, "{doc}: the udmactl commands it lists are not those of udmactl's definition");
        }
    }

    #[test]
    fn command_lists_are_read_item_by_item() {
        let got = listed_commands("x ``udmactl`` (``list``, ``copy``, and ``man``) y", "``udmactl`` (", ")");
        assert_eq!(got, ["list", "copy", "man"]);
        let got =
            listed_commands("- `udmactl` (a): `top` (per device, `--x`), `cdi` (CDI) and `man`; see", "(a):", "; see");
        assert_eq!(got, ["top", "cdi", "man"]);
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(65536));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("99999999999G").is_err());
        assert_eq!(human_size(64 << 20), "64M");
        assert_eq!(human_size(4097), "4097");
    }

    #[test]
    fn rounds_cover_exactly() {
        let mut v = Vec::new();
        in_rounds(10, 4, |o, n| {
            v.push((o, n));
            Ok(())
        })
        .unwrap();
        assert_eq!(v, vec![(0, 4), (4, 4), (8, 2)]);
        assert!(in_rounds(10, 4, |o, _| if o == 4 { bail!("stop") } else { Ok(()) }).is_err());
    }

    #[test]
    fn engine_ranges_group_consecutive_engines() {
        assert_eq!(engine_ranges([0, 1, 2, 3, 8, 12, 13].into_iter()), "0-3 8 12-13");
        assert_eq!(engine_ranges(std::iter::empty()), "-");
    }

    #[test]
    fn zero_copy_needs_a_file() {
        assert!(Cli::try_parse_from(["udmactl", "copy", "--zero-copy", "--bytes", "4K"]).is_err());
        assert!(Cli::try_parse_from(["udmactl", "copy", "--zero-copy"]).is_err());
        assert!(Cli::try_parse_from(["udmactl", "copy", "--zero-copy", "/tmp/f", "--memcpy"]).is_ok());
        assert!(Cli::try_parse_from(["udmactl", "bench", "--zero-copy", "--pipeline", "--sizes", "64M"]).is_ok());
    }

    #[test]
    fn chunks_cover_exactly() {
        let v: Vec<_> = chunks(2 * 65536 + 7, 65536).collect();
        assert_eq!(v, vec![(0, 65536), (65536, 65536), (131072, 7)]);
        assert_eq!(chunks(0, 65536).count(), 0);
        assert_eq!(chunks(1, 65536).collect::<Vec<_>>(), vec![(0, 1)]);
        assert_eq!(chunks(65536, 65536).count(), 1);
        assert_eq!(chunks(10, 4).collect::<Vec<_>>(), vec![(0, 4), (4, 4), (8, 2)]);
    }

    #[test]
    fn prng_is_deterministic() {
        let mut a = vec![0u8; 1003];
        let mut b = vec![0u8; 1003];
        XorShift::new(7).fill(&mut a);
        XorShift::new(7).fill(&mut b);
        assert_eq!(a, b);
        XorShift::new(8).fill(&mut b);
        assert_ne!(a, b);
        assert!(a.iter().any(|&x| x != 0));
    }

    #[test]
    fn decoders() {
        assert_eq!(engine_state(0x1111), "0x1111 [normal, normal, normal, normal]");
        assert_eq!(engine_state(0x2222), "0x2222 [abort, abort, abort, abort]");
        assert_eq!(cause_bits(0), "0 (none)");
        assert_eq!(cause_bits(0x100), "0x00000100 (bits 8)");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1 << 20), "1.0 MiB");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(human_rate(2_000_000_000, Duration::from_secs(1)), "2.00 GB/s");
    }
}
