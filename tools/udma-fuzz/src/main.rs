// SPDX-License-Identifier: GPL-2.0
//! `udma-fuzz`: a stateful fuzzer of the `neuron_udma` ioctl ABI with a reference model
//! (Documentation/udma-fuzz.rst).
//!
//! It runs random sequences of operations (proptest state machines, `fuzz.rs`) against
//! `/dev/neuron_udma0` and checks every answer and every byte against the model; a failing
//! sequence is shrunk to a minimal one and printed with the seed that replays it. The output is
//! TAP: one case for the ABI pass, one for the pass with fault storms.
//!
//! ```text
//! udma-fuzz [--ops N] [--seed S] [--len L] [--device PATH] [--replay CASE_SEED] [--faults on|off|both]
//!           [--unbind]
//! ```

mod dev;
mod dmabuf;
mod fence;
mod fuzz;
mod import;
mod model;
mod race;
mod unbind;
mod uring;
mod workers;

use clap::Parser;
use proptest::test_runner::{Config, RngSeed, TestError, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Instant;

/// The message of the last panic of a test case (printed once, for the shrunk sequence).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// Command line (clap).
#[derive(Parser, Debug)]
#[command(about = "Stateful fuzzer of the neuron_udma ioctl ABI with a reference model")]
struct Args {
    /// Operations to run in total.
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Seed of the run (default: from the clock); each case's seed derives from it.
    #[arg(long, default_value_t = clock_seed())]
    seed: u64,
    /// Operations per test case (the length of one sequence).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    len: u64,
    /// The device node.
    #[arg(long, default_value = "/dev/neuron_udma0")]
    device: PathBuf,
    /// Replay the one case with this seed (as printed by a failure).
    #[arg(long)]
    replay: Option<u64>,
    /// Fault storms: on, off, or both passes.
    #[arg(long, default_value = "both", value_parser = ["on", "off", "both"])]
    faults: String,
    /// Also unbind and rebind the device mid-run (root; the multi-device pass).
    #[arg(long)]
    unbind: bool,
    /// With --replay: print each operation and each answer checked, and do not shrink.
    #[arg(long, requires = "replay")]
    trace: bool,
    /// Model the driver before the fix of issue 33: fence numbers restart at 1 with each
    /// QUEUE_INIT, no ECANCELED for fences of earlier instances, and an IOPOLL io_uring command
    /// of a released instance may complete with another instance's answer (never res 0
    /// without its bytes).
    #[arg(long)]
    before_i33: bool,
    /// io_uring operations (URING_COPY, reaping, a child exiting with commands in flight): on
    /// (the gate's quick passes and `make fuzz`) or off (the sequences of a driver without
    /// io_uring).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    uring: String,
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// splitmix64: the seed of case `i` of a run.
fn case_seed(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn total_ops() -> u64 {
    fuzz::OP_COUNTS.iter().map(|c| c.load(Relaxed)).sum()
}

/// Runs one test case (`len` operations) from `seed`; on failure prints the shrunk sequence.
fn run_case(seed: u64, len: usize, faults: bool) -> bool {
    fuzz::FAULTS.store(faults, Relaxed);
    let config = Config {
        cases: 1,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: if fuzz::TRACE.load(Relaxed) { 0 } else { 4096 },
        max_shrink_time: 300_000,
        verbose: 0,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config.clone());
    let strategy = fuzz::FuzzRef::sequential_strategy(len..=len);
    let run = || {
        runner.run(&strategy, |(init, ops, seen)| {
            fuzz::FuzzTest::test_sequential(config.clone(), init, ops, seen);
            Ok(())
        })
    };
    // Without shrinking (a replay), proptest-state-machine panics while it reports the failed
    // sequence ("Unexpected non-zero `seen_transitions_counter`"): the failure is the panic the
    // hook printed before it.
    let Ok(r) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) else {
        println!("# FAILED: the case failed (the first panic above says why)");
        return false;
    };
    match r {
        Ok(()) => true,
        Err(TestError::Fail(why, (_, ops, _))) => {
            // The failure of the minimal sequence (the last panic may be another candidate's,
            // or a later run's that the failed one left a queue taken for).
            let last = LAST_PANIC.lock().map(|s| s.clone()).unwrap_or_default();
            let why = why.message().to_string();
            println!("# FAILED: {why}");
            if !why.contains(last.split(" (").next().unwrap_or_default()) {
                println!("# (the last failure while shrinking: {last})");
            }
            println!(
                "# minimal sequence ({} operations), replay with: udma-fuzz --replay {seed} --len {len} --faults {}",
                ops.len(),
                if faults { "on" } else { "off" }
            );
            for (i, op) in ops.iter().enumerate() {
                println!("#   {:3}. {op:?}", i + 1);
            }
            false
        }
        Err(TestError::Abort(why)) => {
            println!("# aborted: {why}");
            false
        }
    }
}

/// Runs cases until `ops` operations ran; the pass's TAP verdict.
fn pass(a: &Args, ops: u64, faults: bool) -> bool {
    let start = total_ops();
    let mut i = 0u64;
    let t = Instant::now();
    let mut next_report = 100_000;
    while total_ops() - start < ops {
        let seed = case_seed(a.seed ^ u64::from(faults), i);
        if !run_case(seed, a.len as usize, faults) {
            return false;
        }
        i += 1;
        if total_ops() - start >= next_report {
            println!("# {} operations in {:.0} s", total_ops() - start, t.elapsed().as_secs_f64());
            next_report += 100_000;
        }
    }
    true
}

fn main() {
    let a = Args::parse();
    std::panic::set_hook(Box::new(|p| {
        let msg = p
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        let loc = p.location().map(|l| format!(" ({}:{})", l.file(), l.line())).unwrap_or_default();
        if fuzz::TRACE.load(Relaxed) {
            eprintln!("# panic: {msg}{loc}");
        }
        if let Ok(mut s) = LAST_PANIC.lock() {
            *s = format!("{msg}{loc}");
        }
    }));
    let dev = match dev::Dev::open(&a.device, false) {
        Ok(d) => d,
        Err(e) => {
            println!("1..0 # SKIP cannot open {}: errno {e}", a.device.display());
            std::process::exit(1);
        }
    };
    let mut info = neuron_udma::sys::neuron_udma_info::default();
    if let Err(e) = dev.ioctl(neuron_udma::sys::NEURON_UDMA_INFO, &mut info) {
        println!("1..0 # SKIP INFO failed: errno {e}");
        std::process::exit(1);
    }
    drop(dev);
    let host = |e: u32| info.host_engines[(e / 64) as usize] >> (e % 64) & 1 == 1;
    // Engines 4..7 reach host memory on every generation and hold no driver queue.
    let engines = [4, 5, 6, 7];
    assert!(engines.iter().all(|&e| host(e) && e < info.engines), "engines 4..7 must reach host memory");
    let bdf = dev::node_bdf(&a.device);
    if a.unbind && bdf.is_none() {
        println!("1..0 # SKIP --unbind: cannot find the PCI device of {}", a.device.display());
        std::process::exit(1);
    }
    let window = dev::FaultWindow::open(bdf.as_deref());
    fuzz::init(fuzz::Ctx { path: a.device.clone(), info, engines, window, bdf: bdf.clone(), unbind: a.unbind });
    let has_window = fuzz::has_window();
    println!("TAP version 13");
    println!(
        "# udma-fuzz: device {} ({}) generation {} seed {} ops {} len {} fault window {}{}",
        a.device.display(),
        bdf.as_deref().unwrap_or("PCI device unknown"),
        info.generation,
        a.seed,
        a.ops,
        a.len,
        if has_window { "mapped" } else { "absent" },
        if a.unbind { ", unbind on" } else { "" }
    );
    if a.before_i33 {
        println!("# model: the driver before the fix of issue 33 (--before-i33)");
    }
    let t0 = Instant::now();
    fuzz::TRACE.store(a.trace, Relaxed);
    fuzz::BEFORE_I33.store(a.before_i33, Relaxed);
    fuzz::URING.store(a.uring == "on", Relaxed);
    if let Some(seed) = a.replay {
        println!("1..1");
        let ok = run_case(seed, a.len as usize, a.faults != "off" && has_window);
        println!("{} 1 replay {seed}", if ok { "ok" } else { "not ok" });
        std::process::exit(i32::from(!ok));
    }
    let passes: Vec<(&str, bool, u64)> = match a.faults.as_str() {
        "off" => vec![("abi_model", false, a.ops)],
        "on" => vec![("fault_storm", true, a.ops)],
        _ => vec![("abi_model", false, a.ops / 2), ("fault_storm", true, a.ops - a.ops / 2)],
    };
    println!("1..{}", passes.len());
    let mut failed = 0;
    for (n, (name, faults, ops)) in passes.iter().enumerate() {
        let t = Instant::now();
        let before = total_ops();
        let ok = if *faults && !has_window {
            println!("# no fault window (not the model, or not root)");
            false
        } else {
            pass(&a, *ops, *faults)
        };
        println!("# {name}: {} operations in {:.1} s", total_ops() - before, t.elapsed().as_secs_f64());
        println!("{} {} {name}", if ok { "ok" } else { "not ok" }, n + 1);
        failed += usize::from(!ok);
    }
    if a.unbind {
        // Whatever failed, leave the device bound for what runs next.
        if let Some(b) = bdf.as_deref() {
            if !std::path::Path::new("/sys/bus/pci/drivers/neuron_udma").join(b).exists() {
                let _ = dev::sysfs_write("/sys/bus/pci/drivers/neuron_udma/bind", b);
            }
        }
    }
    let total = total_ops();
    println!(
        "# {total} operations in {:.1} s ({:.0}/s); mix:",
        t0.elapsed().as_secs_f64(),
        total as f64 / t0.elapsed().as_secs_f64()
    );
    let secs = |ns: &std::sync::atomic::AtomicU64| ns.load(Relaxed) as f64 / 1e9;
    let all: f64 = fuzz::OP_NANOS.iter().map(secs).sum();
    println!("#   {:15} {:>9} {:>6} {:>9} {:>9} {:>6}", "operation", "count", "share", "succeeded", "time (s)", "time");
    for (((name, c), ok), ns) in
        fuzz::OP_NAMES.iter().zip(fuzz::OP_COUNTS.iter()).zip(fuzz::OP_OK.iter()).zip(fuzz::OP_NANOS.iter())
    {
        let c = c.load(Relaxed);
        let s = secs(ns);
        let share = 100.0 * c as f64 / total.max(1) as f64;
        println!("#   {name:15} {c:9} {share:5.1}% {:9} {s:9.1} {:5.1}%", ok.load(Relaxed), 100.0 * s / all.max(1e-9));
    }
    let s = secs(&fuzz::OP_NANOS[fuzz::OPS]);
    println!("#   {:15} {:>9} {:>6} {:>9} {s:9.1} {:5.1}%", "(case open/close)", "", "", "", 100.0 * s / all.max(1e-9));
    let f: Vec<String> = ["fail_nth", "abort", "stall", "slow", "slow_off", "clear"]
        .iter()
        .zip(fuzz::FAULT_COUNTS.iter())
        .map(|(n, c)| format!("{n} {}", c.load(Relaxed)))
        .collect();
    println!("# faults injected: {}", f.join(", "));
    let o: Vec<String> = fuzz::OUTCOMES
        .iter()
        .enumerate()
        .filter(|(_, c)| c.load(Relaxed) != 0)
        .map(|(e, c)| format!("{} {}", if e == 0 { "success" } else { fuzz::name(e as i32) }, c.load(Relaxed)))
        .collect();
    println!("# answers checked: {}", o.join(", "));
    let parts = fuzz::PARTS.lock().map(|v| v.clone()).unwrap_or_default();
    let p: Vec<String> = parts.iter().map(|(k, ns)| format!("{k} {:.1} s", *ns as f64 / 1e9)).collect();
    println!("# time in parts: {}", p.join(", "));
    let facts = fuzz::FACTS.lock().map(|v| v.clone()).unwrap_or_default();
    let f: Vec<String> = facts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("# seen: {}", f.join(", "));
    std::process::exit(i32::from(failed != 0));
}
