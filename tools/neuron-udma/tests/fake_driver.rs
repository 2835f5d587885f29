// SPDX-License-Identifier: MIT OR Apache-2.0
//! End to end against a stand-in of the driver: `tests/fake/fake_udma.c`, built here with the C
//! compiler and loaded with LD_PRELOAD, answers the ioctls of an "/fake/neuron_udma0" whose file
//! is an eventfd (readable while completions are not reported, as poll() on the real file). Not
//! the driver: it checks that udmactl's and the crate's fence and event paths (COPY_SUBMIT,
//! FENCE_STATUS, FENCE_WAIT, QUEUE_EVENTS, epoll on the file, QUEUE_EVENTFD, the INFO fallback to
//! the ABI 2 size) work together. Skipped, saying so, where there is no C compiler.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Output};
use std::sync::OnceLock;

const FAKE_PATH: &str = "/fake/neuron_udma0";

/// The shim, built once per test process; `None` without a C compiler.
fn shim() -> Option<&'static Path> {
    static SHIM: OnceLock<Option<PathBuf>> = OnceLock::new();
    SHIM.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("libfake_udma_{}.so", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
            .arg(&out)
            .arg(manifest.join("tests/fake/fake_udma.c"))
            .arg("-I")
            .arg(manifest.join("../../include/uapi"))
            .args(["-lpthread", "-ldl"])
            .status();
        match status {
            Ok(s) => {
                assert!(s.success(), "{cc} failed to build the fake driver: {s}");
                Some(out)
            }
            Err(e) => {
                eprintln!("skipped: no C compiler ({cc}: {e}) to build the fake driver");
                None
            }
        }
    })
    .as_deref()
}

fn fake(cmd: &mut Command, shim: &Path) -> Output {
    cmd.env("LD_PRELOAD", shim).env("FAKE_UDMA_PATH", FAKE_PATH).output().expect("spawn")
}

fn udmactl(shim: &Path, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udmactl"));
    cmd.arg("-d").arg(FAKE_PATH).args(args).envs(env.iter().copied());
    let o = fake(&mut cmd, shim);
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

/// A closed stdout (`udmactl info | head -1` once head is gone) ends udmactl by SIGPIPE's default
/// action, as it ends `cat`: no panic.
#[test]
fn closed_stdout_ends_by_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let Some(shim) = shim() else { return };
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_udmactl"));
    cmd.arg("-d").arg(FAKE_PATH).arg("info").stdout(writer);
    let o = fake(&mut cmd, shim);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{:?}: {err}", o.status);
}

#[test]
fn multiqueue_one_thread_and_threads() {
    let Some(shim) = shim() else { return };
    let small = ["multiqueue", "--queues", "4", "--passes", "2", "--iters", "1", "--target", "0"];
    let (ok, out, err) = udmactl(shim, &[], &small);
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(lines[0].starts_with("one thread + epoll: 4 queues (engines 0-3 queue 1), 2.0 MiB in "), "{out}");
    assert!(lines[0].ends_with("; byte-exact") && lines[0].contains("8 fences (batches of 4 x 64.0 KiB, depth 2)"));
    assert!(lines[1].starts_with("4 threads in FENCE_WAIT: 4 queues"), "{out}");
    assert!(lines[2].starts_with("verdict: OK: one thread + epoll drove 4 queues at "), "{out}");

    let mut copy_wait = small.to_vec();
    copy_wait.extend(["--thread-wait", "copy-wait", "--json", "--engine", "5"]);
    let (ok, out, err) = udmactl(shim, &[], &copy_wait);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["modes"][1]["wait"], "COPY_WAIT");
    assert_eq!(v["modes"][0]["fences"], 8);
    assert_eq!(v["queues"][3], serde_json::json!({"engine": 5, "queue": 0}));
}

#[test]
fn multiqueue_failures_end_in_a_verdict() {
    let Some(shim) = shim() else { return };
    for mode in ["epoll", "threads"] {
        let (ok, out, _) = udmactl(
            shim,
            &[("FAKE_UDMA_FAIL_FENCE", "2")],
            &["multiqueue", "--queues", "2", "--passes", "4", "--iters", "1", "--mode", mode],
        );
        assert!(!ok);
        assert!(out.starts_with("verdict: FAILED: ") && out.contains("fence 2 of queue 0/1 failed"), "{out}");
        assert!(out.trim_end().ends_with("an engine error; the queue was reset (EIO)"), "{out}");
    }
    // An ABI 2 driver: INFO falls back to its 88-byte size; multiqueue says what it needs.
    let (ok, out, _) = udmactl(shim, &[("FAKE_UDMA_ABI", "2")], &["info"]);
    assert!(ok && out.contains("abi_version:        2") && !out.contains("max_queue_fences"), "{out}");
    let (ok, out, _) = udmactl(shim, &[("FAKE_UDMA_ABI", "2")], &["multiqueue"]);
    assert!(!ok && out.contains("needs ABI 3"), "{out}");
    let (ok, out, _) = udmactl(shim, &[], &["info", "--json"]);
    assert!(ok && out.contains("\"max_queue_fences\":64"), "{out}");
}

/// Runs the library test `name` of this binary in a child process with the shim preloaded.
fn in_child(name: &str) {
    let Some(shim) = shim() else { return };
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads", "1"]).env("IN_FAKE_UDMA", "1");
    let o = fake(&mut cmd, shim);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn fences_and_events_through_the_library() {
    in_child("child_fences_and_events");
}

#[cfg(feature = "tokio")]
#[test]
fn tokio_completions_through_the_library() {
    in_child("child_tokio_completions");
}

mod child {
    use neuron_udma::{Copy, HostBuffer, Queue};
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    /// Whether this process runs under the fake driver (a child of the tests above).
    pub fn under_fake() -> bool {
        std::env::var_os("IN_FAKE_UDMA").is_some()
    }

    /// Blocks on `f` with a thread-parking waker. A future that stays pending for 10 s without
    /// a wakeup fails the test: a lost wakeup must not pass for a slow one.
    pub fn block_on<F: Future>(f: F) -> F::Output {
        struct Unpark(std::thread::Thread, AtomicBool);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.1.store(true, Ordering::SeqCst);
                self.0.unpark();
            }
        }
        let unpark = Arc::new(Unpark(std::thread::current(), AtomicBool::new(false)));
        let waker = Waker::from(unpark.clone());
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            let t = std::time::Instant::now();
            while !unpark.1.swap(false, Ordering::SeqCst) {
                assert!(t.elapsed() < Duration::from_secs(10), "pending for 10 s without a wakeup");
                std::thread::park_timeout(Duration::from_millis(100));
            }
        }
    }

    /// Polls every future until all are ready; counts the polls.
    pub async fn join_all<T>(mut fs: Vec<Pin<Box<dyn Future<Output = T> + '_>>>) -> (Vec<T>, usize) {
        let mut out: Vec<Option<T>> = fs.iter().map(|_| None).collect();
        let mut polls = 0;
        std::future::poll_fn(|cx| {
            for (f, o) in fs.iter_mut().zip(out.iter_mut()) {
                if o.is_none() {
                    polls += 1;
                    if let Poll::Ready(v) = f.as_mut().poll(cx) {
                        *o = Some(v);
                    }
                }
            }
            if out.iter().all(Option::is_some) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        (out.into_iter().map(Option::unwrap).collect(), polls)
    }

    /// Prepares `n` copies of 64 KiB from `src` to `dst` on `q` and submits them.
    pub fn submit<'q>(q: &'q Queue<'_>, src: &HostBuffer, dst: &HostBuffer, n: u64) -> neuron_udma::Fence<'q> {
        let copies: Vec<Copy> = (0..n).map(|i| Copy::new(src, i * 65536, dst, i * 65536, 65536).unwrap()).collect();
        q.prepare(&copies).unwrap();
        q.submit().unwrap()
    }
}

#[test]
#[ignore = "run by fences_and_events_through_the_library under the fake driver"]
fn child_fences_and_events() {
    use child::*;
    use neuron_udma::{DeviceEvents, FenceStatus};
    if !under_fake() {
        return;
    }
    let dev = neuron_udma::Device::open(FAKE_PATH).unwrap();
    assert_eq!(dev.info().unwrap().abi_version, 3);
    let mut src = dev.alloc_host(1 << 20).unwrap();
    src.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7 % 251) as u8);
    let dsts: Vec<_> = (0..4).map(|_| dev.alloc_host(1 << 20).unwrap()).collect();
    let queues: Vec<_> = (0..4).map(|e| dev.queue(e, 1, 256).unwrap()).collect();

    // Blocking: submit, is_done/status, wait.
    let f = submit(&queues[0], &src, &dsts[0], 4);
    assert_eq!(f.number(), 1);
    f.wait(Some(std::time::Duration::from_secs(5))).unwrap();
    assert!(f.is_done().unwrap());
    assert_eq!(f.status().unwrap(), FenceStatus::Done);
    let r = f.report().unwrap();
    assert_eq!((r.completed, r.submitted), (1, 1));
    assert_eq!(&dsts[0][..4 << 16], &src[..4 << 16]);
    // Nothing new prepared: the same fence again.
    assert_eq!(queues[0].submit().unwrap(), f);
    let events = dev.queue_events().unwrap();
    assert!(events.iter().any(|e| (e.engine(), e.queue(), e.completed()) == (0, 1, 1)), "{events:?}");
    assert!(dev.queue_events().unwrap().is_empty());

    // An eventfd per queue counts its fences.
    let efd = queues[1].eventfd().unwrap();
    assert!(matches!(queues[1].eventfd(), Err(neuron_udma::Error::Argument(_))));
    let f1 = submit(&queues[1], &src, &dsts[1], 2);
    let f2 = submit(&queues[1], &src, &dsts[1], 8);
    f2.wait(None).unwrap();
    assert!(f1.is_done().unwrap());
    assert_eq!(efd.read().unwrap(), 2);
    assert_eq!(efd.read().unwrap(), 0);
    drop(efd);
    let _reg = queues[1].eventfd().unwrap();

    // Futures on the runtime-neutral listener: 12 fences on 4 queues awaited together.
    dev.queue_events().unwrap();
    let events = DeviceEvents::with_thread(&dev).unwrap();
    let mut fences = Vec::new();
    for (q, dst) in queues.iter().zip(&dsts) {
        for k in 0..3 {
            fences.push(submit(q, &src, dst, 4 + k));
        }
    }
    let futs: Vec<Pin<Box<dyn Future<Output = neuron_udma::Result<()>> + '_>>> =
        fences.iter().map(|f| Box::pin(f.completion(&events)) as Pin<Box<dyn Future<Output = _>>>).collect();
    let (results, polls) = block_on(join_all(futs));
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(fences.iter().all(|f| f.is_done().unwrap()));
    // Woken by completions, not spinning: a bounded number of polls for 12 futures.
    assert!(polls < 12 * 40, "{polls} polls");
    for dst in &dsts {
        assert_eq!(&dst[..6 << 16], &src[..6 << 16]);
    }
    println!("{polls} polls for 12 fences");
}

#[cfg(feature = "tokio")]
#[test]
#[ignore = "run by tokio_completions_through_the_library under the fake driver"]
fn child_tokio_completions() {
    use child::*;
    use neuron_udma::DeviceEvents;
    if !under_fake() {
        return;
    }
    let dev = neuron_udma::Device::open(FAKE_PATH).unwrap();
    let src = dev.alloc_host(1 << 20).unwrap();
    let dst = dev.alloc_host(1 << 20).unwrap();
    let queues: Vec<_> = (0..3).map(|e| dev.queue(e, 2, 256).unwrap()).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    rt.block_on(async {
        let events = DeviceEvents::with_tokio(&dev).unwrap();
        let fences: Vec<_> = queues.iter().flat_map(|q| (0..4).map(|_| submit(q, &src, &dst, 2))).collect();
        let futs: Vec<Pin<Box<dyn Future<Output = neuron_udma::Result<()>> + '_>>> =
            fences.iter().map(|f| Box::pin(f.completion(&events)) as Pin<Box<dyn Future<Output = _>>>).collect();
        let (results, polls) = join_all(futs).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert!(polls < 12 * 40, "{polls} polls");
        println!("{polls} polls for 12 fences (tokio)");
    });
}

/// The path of example `name` of this package, which `cargo test` (without `--test`: that
/// builds only the test named) builds beside this test binary, in `target/<profile>/examples/`.
fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join("examples").join(name);
    assert!(bin.exists(), "{} is not built: run cargo test without --test (it builds the examples)", bin.display());
    bin
}

/// Runs `bin` against the fake with `env`: (exit status 0, stdout + stderr).
fn run_example(shim: &Path, bin: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(bin);
    cmd.arg(FAKE_PATH).envs(env.iter().copied());
    let o = fake(&mut cmd, shim);
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// An example ends with its `NAME: OK:` line, and with a fence the fake fails, with one
/// `NAME: FAILED: ...` line naming the failure and exit status 1.
fn example_ok_and_failed(shim: &Path, bin: &Path, name: &str) {
    let (ok, out) = run_example(shim, bin, &[]);
    assert!(ok && out.trim_end().lines().last().unwrap_or("").starts_with(&format!("{name}: OK: ")), "{out}");
    let (ok, out) = run_example(shim, bin, &[("FAKE_UDMA_FAIL_FENCE", "1")]);
    let last = out.trim_end().lines().last().unwrap_or("").to_string();
    assert!(!ok && last.starts_with(&format!("{name}: FAILED: ")) && last.contains("EIO"), "{out}");
}

#[test]
fn rust_examples_against_the_fake() {
    let Some(shim) = shim() else { return };
    for name in ["fence_copy", "multi_queue"] {
        example_ok_and_failed(shim, &example_bin(name), name);
    }
    #[cfg(feature = "tokio")]
    example_ok_and_failed(shim, &example_bin("async_fence"), "async_fence");
}

#[test]
fn c_example_against_the_fake() {
    let Some(shim) = shim() else { return };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fence_copy_c_{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&bin)
        .arg(manifest.join("../../examples/fence_copy.c"))
        .arg("-I")
        .arg(manifest.join("../../include/uapi"))
        .status()
        .expect("the C compiler ran for the shim already");
    assert!(status.success(), "{cc} failed to build examples/fence_copy.c: {status}");
    example_ok_and_failed(shim, &bin, "fence_copy");
}
