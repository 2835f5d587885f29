// SPDX-License-Identifier: GPL-2.0
//! Fault injection (control API, control socket, BAR2 window) and the trace file.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};
use udma_sim::control::{self, kind};
use udma_sim::engine::ErrorKind;
use udma_sim::layout::Model;
use udma_sim::regs::{self, m2s_cause};
use udma_sim::Options;

const TX_RING: u64 = RAM_BASE;
const RX_RING: u64 = RAM_BASE + 0x40000;
const SRC: u64 = RAM_BASE + 0x10_0000;
const DST: u64 = RAM_BASE + 0x80_0000;
const E: u32 = 32;

/// These tests are about fault injection, not ordering or recovery: packets land in order and a
/// queue re-init ends an abort (the strict rules have their own tests in `errors.rs` and
/// `strict.rs`).
fn setup() -> (Rig, SwQueue) {
    let rig = Rig::with_options(
        Model::Trn1,
        None,
        Options { unordered_delay: None, sticky_errors: false, ..Options::default() },
    );
    rig.init_engine(E);
    let sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.fill(SRC, 0x10000, 0x11);
    (rig, sq)
}

fn post(rig: &Rig, sq: &mut SwQueue, n: u32) {
    for i in 0..n {
        let o = u64::from(i) * 256;
        rig.prepare(sq, rig.host(SRC + o), rig.host(DST + o), 256);
    }
    rig.start(sq, n);
}

/// fail_nth n=3: the first two pairs complete, the third aborts with a data-read error.
fn check_fail_third(rig: &Rig, sq: &mut SwQueue) {
    post(rig, sq, 5);
    rig.wait_abort(E);
    assert_eq!(rig.head(E, 0, true), 2 | 1 << 30);
    assert_eq!(rig.ram_bytes(DST, 512), rig.ram_bytes(SRC, 512));
    assert_eq!(rig.ram_bytes(DST + 512, 256), vec![0u8; 256]);
    assert_eq!(rig.cause_a(E), m2s_cause::DATA_READ);
    let le = rig.dev.last_error().unwrap();
    assert_eq!((le.record.kind, le.record.queue, le.record.index), (ErrorKind::InjectedFail, Some(0), Some(2)));
}

#[test]
fn fail_nth_via_control_api() {
    let (rig, mut sq) = setup();
    let r = rig.dev.control(&json!({"cmd":"fail_nth","engine":E,"queue":0,"n":3}));
    assert_eq!(r["ok"], true, "{r}");
    check_fail_third(&rig, &mut sq);
    let r = rig.dev.control(&json!({"cmd":"last_error"}));
    assert_eq!(r["error"]["kind"], "injected_fail");
    assert_eq!(r["error"]["index"], 2);
    let r = rig.dev.control(&json!({"cmd":"counters"}));
    assert_eq!(r["total"]["packets"], 2);
    assert_eq!(r["total"]["errors"], 1);
    assert_eq!(r["engines"][0]["engine"], E);
    // Recovery: re-init the queue; the fault was one-shot.
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    post(&rig, &mut sq, 3);
    rig.wait_done(&sq);
    assert_eq!(rig.dev.control(&json!({"cmd":"clear"}))["ok"], true);
    assert_eq!(rig.dev.counters(), Default::default());
    assert_eq!(rig.dev.control(&json!({"cmd":"last_error"}))["error"], Value::Null);
}

#[test]
fn abort_stall_slow_via_control_api() {
    let (rig, mut sq) = setup();
    // abort
    assert_eq!(rig.dev.control(&json!({"cmd":"abort","engine":E}))["ok"], true);
    rig.wait_abort(E);
    assert_eq!(rig.dev.last_error().unwrap().record.kind, ErrorKind::Abort);
    post(&rig, &mut sq, 1);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(rig.head(E, 0, true), 1 << 30);
    // An injected abort is cleared by re-initialising any queue of the engine.
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    assert_eq!(rig.rd(E, regs::M2S_STATE), regs::STATE_NORMAL);
    // stall: nothing completes for 150 ms, then the copy finishes.
    assert_eq!(rig.dev.control(&json!({"cmd":"stall","engine":E,"queue":0,"ms":150}))["ok"], true);
    let t0 = Instant::now();
    post(&rig, &mut sq, 1);
    rig.wait_done(&sq);
    assert!(t0.elapsed() >= Duration::from_millis(140), "stall ignored: {:?}", t0.elapsed());
    // slow: 50 small packets with factor 100 take >= 50 * 99 * 20 us ~ 99 ms.
    assert_eq!(rig.dev.control(&json!({"cmd":"slow","factor":100}))["ok"], true);
    let t0 = Instant::now();
    for _ in 0..5 {
        post(&rig, &mut sq, 10);
        rig.wait_done(&sq);
    }
    assert!(t0.elapsed() >= Duration::from_millis(90), "slow ignored: {:?}", t0.elapsed());
    assert_eq!(rig.dev.control(&json!({"cmd":"slow","factor":1}))["ok"], true);
    assert_eq!(rig.dev.control(&json!({"cmd":"nope"}))["ok"], false);
    assert_eq!(rig.dev.control(&json!({"cmd":"stall","engine":E,"queue":16,"ms":1}))["ok"], false);
}

#[test]
fn control_socket_round_trip() {
    let (rig, mut sq) = setup();
    let dir = std::env::temp_dir().join(format!("udma-sim-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ctl.sock");
    control::serve(rig.dev.clone(), &path).unwrap();
    let s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut ask = |line: &str| -> Value {
        writeln!(w, "{line}").unwrap();
        let mut out = String::new();
        r.read_line(&mut out).unwrap();
        serde_json::from_str(&out).unwrap()
    };
    assert_eq!(ask(r#"{"cmd":"ping"}"#)["ok"], true);
    assert_eq!(ask("not json")["ok"], false);
    assert_eq!(ask(&format!(r#"{{"cmd":"fail_nth","engine":{E},"queue":0,"n":3}}"#))["ok"], true);
    check_fail_third(&rig, &mut sq);
    let c = ask(r#"{"cmd":"counters"}"#);
    assert_eq!(c["total"]["descriptors"], 4);
    assert_eq!(c["total"]["bytes"], 512);
    let _ = std::fs::remove_dir_all(&dir);
}

fn b2r(rig: &Rig, off: u64) -> u32 {
    rig.dev.bar2_read32(off)
}

fn b2w(rig: &Rig, off: u64, v: u32) {
    rig.dev.bar2_write(off, &v.to_le_bytes());
}

#[test]
fn bar2_window() {
    let (rig, mut sq) = setup();
    assert_eq!(b2r(&rig, control::B2_MAGIC), 0x5544_4D41);
    assert_eq!(b2r(&rig, control::B2_VERSION), 1);
    assert_eq!(b2r(&rig, control::B2_MODEL), 0x7164);
    // Stage fail_nth 3 on (E, 0) and commit.
    b2w(&rig, control::B2_FAULT_KIND, kind::FAIL_NTH);
    b2w(&rig, control::B2_FAULT_ENGINE, E);
    b2w(&rig, control::B2_FAULT_QUEUE, 0);
    b2w(&rig, control::B2_FAULT_ARG, 3);
    assert_eq!(b2r(&rig, control::B2_FAULT_ARG), 3);
    b2w(&rig, control::B2_FAULT_COMMIT, 1);
    assert_eq!(b2r(&rig, control::B2_FAULT_COMMIT), 0);
    check_fail_third(&rig, &mut sq);
    assert_eq!(b2r(&rig, control::B2_DESCS_LO), 4);
    assert_eq!(b2r(&rig, control::B2_DESCS_LO + 4), 0);
    assert_eq!(b2r(&rig, control::B2_BYTES_LO), 512);
    assert_eq!(b2r(&rig, control::B2_PACKETS_LO), 2);
    assert_eq!(b2r(&rig, control::B2_ERRORS), 1);
    assert_eq!(b2r(&rig, control::B2_LAST_ERROR), ErrorKind::InjectedFail as u32);
    assert_eq!(control::error_kind_name(b2r(&rig, control::B2_LAST_ERROR)), Some("injected_fail"));
    assert_eq!(b2r(&rig, control::B2_LAST_ERROR_ENGINE), E);
    assert_eq!(b2r(&rig, control::B2_LAST_ERROR_QUEUE), 0);
    // Rejected commit (bad engine) reports status 1.
    b2w(&rig, control::B2_FAULT_KIND, kind::ABORT);
    b2w(&rig, control::B2_FAULT_ENGINE, 500);
    b2w(&rig, control::B2_FAULT_COMMIT, 1);
    assert_eq!(b2r(&rig, control::B2_FAULT_COMMIT), 1);
    // Abort via BAR2.
    let _ = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    b2w(&rig, control::B2_CLEAR, 1);
    assert_eq!(b2r(&rig, control::B2_ERRORS), 0);
    assert_eq!(b2r(&rig, control::B2_LAST_ERROR), 0);
    assert_eq!(b2r(&rig, control::B2_LAST_ERROR_QUEUE), u32::MAX);
    b2w(&rig, control::B2_FAULT_ENGINE, E);
    b2w(&rig, control::B2_FAULT_COMMIT, 1);
    rig.wait_abort(E);
    assert_eq!(b2r(&rig, control::B2_LAST_ERROR), ErrorKind::Abort as u32);
    // Stall and slow via BAR2.
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    b2w(&rig, control::B2_FAULT_KIND, kind::STALL);
    b2w(&rig, control::B2_FAULT_QUEUE, 0);
    b2w(&rig, control::B2_FAULT_ARG, 100);
    b2w(&rig, control::B2_FAULT_COMMIT, 1);
    let t0 = Instant::now();
    post(&rig, &mut sq, 1);
    rig.wait_done(&sq);
    assert!(t0.elapsed() >= Duration::from_millis(90));
    b2w(&rig, control::B2_FAULT_KIND, kind::SLOW);
    b2w(&rig, control::B2_FAULT_ARG, 4);
    b2w(&rig, control::B2_FAULT_COMMIT, 1);
    assert_eq!(b2r(&rig, control::B2_FAULT_COMMIT), 0);
}

#[test]
fn trace_file_lines() {
    let path = std::env::temp_dir().join(format!("udma-sim-trace-{}.jsonl", std::process::id()));
    let rig = Rig::with_trace(Model::Trn1, Some(path.clone()));
    rig.init_engine(E);
    let mut sq = rig.init_queue(E, 0, TX_RING, RX_RING, 64);
    rig.fill(SRC, 4096, 3);
    rig.prepare(&mut sq, rig.host(SRC), 0x1000, 4096);
    rig.prepare(&mut sq, rig.host(SRC), rig.host(DST), 65536);
    rig.start(&sq, 2);
    rig.wait_done(&sq);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    let tx = &lines[0];
    assert_eq!(tx["engine"], E);
    assert_eq!(tx["queue"], 0);
    assert_eq!(tx["ring"], "tx");
    assert_eq!(tx["index"], 0);
    assert_eq!(tx["len_ctrl"], "0x0d001000");
    assert_eq!(tx["meta_ctrl"], "0x01080003");
    assert_eq!(tx["addr"], format!("0x{:x}", rig.host(SRC)));
    assert_eq!(tx["len"], 4096);
    assert_eq!(tx["ring_id"], 1);
    assert_eq!((tx["first"].as_bool(), tx["last"].as_bool()), (Some(true), Some(true)));
    assert_eq!((tx["dmb"].as_bool(), tx["wb"].as_bool()), (Some(false), Some(false)));
    let raw = tx["raw"].as_str().unwrap();
    assert_eq!(raw.len(), 32);
    assert!(raw.starts_with("0010000d03000801"));
    let rx = &lines[1];
    assert_eq!(
        (rx["ring"].as_str(), rx["addr"].as_str(), rx["first"].as_bool()),
        (Some("rx"), Some("0x1000"), Some(false))
    );
    assert_eq!(lines[2]["len"], 65536);
    assert_eq!(lines[3]["index"], 1);
    drop(rig);
    let _ = std::fs::remove_file(&path);
}
