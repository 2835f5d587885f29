// SPDX-License-Identifier: GPL-2.0
//! Model control: the JSON control protocol (Unix socket, newline-delimited; one
//! [`Command`] per line, parsed by serde) and the in-band BAR2 control window. Both reach the same
//! [`Device::inject`]/[`Device::clear`]/[`Device::counters`] entry points.

use crate::engine::{Dir, ErrorKind};
use crate::fault::{CounterValues, Fault};
use crate::Device;
use serde::Deserialize;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

/// BAR2 size in bytes.
pub const BAR2_SIZE: u64 = 0x1000;
/// BAR2 0x000 (RO): magic "UDMA" = 0x55444D41.
pub const B2_MAGIC: u64 = 0x000;
/// Value of [`B2_MAGIC`].
pub const MAGIC: u32 = 0x5544_4D41;
/// BAR2 0x004 (RO): window version (1).
pub const B2_VERSION: u64 = 0x004;
/// BAR2 0x008 (RO): PCI device id of the model.
pub const B2_MODEL: u64 = 0x008;
/// BAR2 0x010 (RW): staged fault kind (0 none, 1 fail_nth, 2 abort, 3 stall, 4 slow).
pub const B2_FAULT_KIND: u64 = 0x010;
/// BAR2 0x014 (RW): staged engine id.
pub const B2_FAULT_ENGINE: u64 = 0x014;
/// BAR2 0x018 (RW): staged queue id.
pub const B2_FAULT_QUEUE: u64 = 0x018;
/// BAR2 0x01C (RW): staged argument (n / ms / factor).
pub const B2_FAULT_ARG: u64 = 0x01C;
/// BAR2 0x020: write 1 = apply the staged fault; reads the last commit status (0 ok, 1 rejected).
pub const B2_FAULT_COMMIT: u64 = 0x020;
/// BAR2 0x040 (RO): descriptors consumed, low 32 bits.
pub const B2_DESCS_LO: u64 = 0x040;
/// BAR2 0x044 (RO): descriptors consumed, high 32 bits.
pub const B2_DESCS_HI: u64 = 0x044;
/// BAR2 0x048 (RO): bytes copied, low 32 bits.
pub const B2_BYTES_LO: u64 = 0x048;
/// BAR2 0x04C (RO): bytes copied, high 32 bits.
pub const B2_BYTES_HI: u64 = 0x04C;
/// BAR2 0x050 (RO): errors raised.
pub const B2_ERRORS: u64 = 0x050;
/// BAR2 0x054 (RO): last error kind code (0 none; see `ErrorKind`).
pub const B2_LAST_ERROR: u64 = 0x054;
/// BAR2 0x058 (RO): engine of the last error.
pub const B2_LAST_ERROR_ENGINE: u64 = 0x058;
/// BAR2 0x05C (RO): queue of the last error (0xFFFFFFFF if none).
pub const B2_LAST_ERROR_QUEUE: u64 = 0x05C;
/// BAR2 0x060 (WO): write 1 = clear faults, counters and last error.
pub const B2_CLEAR: u64 = 0x060;
/// BAR2 0x068 (RO): packets completed, low 32 bits.
pub const B2_PACKETS_LO: u64 = 0x068;
/// BAR2 0x06C (RO): packets completed, high 32 bits.
pub const B2_PACKETS_HI: u64 = 0x06C;

/// Fault kind codes of [`B2_FAULT_KIND`].
pub mod kind {
    /// No fault.
    pub const NONE: u32 = 0;
    /// fail_nth bad address.
    pub const FAIL_NTH: u32 = 1;
    /// Abort engine.
    pub const ABORT: u32 = 2;
    /// Stall queue.
    pub const STALL: u32 = 3;
    /// Slow factor.
    pub const SLOW: u32 = 4;
}

/// Staging registers of the BAR2 window.
#[derive(Default, Debug, Clone, Copy)]
pub struct Bar2Stage {
    kind: u32,
    engine: u32,
    queue: u32,
    arg: u32,
    status: u32,
}

fn staged_fault(s: &Bar2Stage) -> Option<Fault> {
    match s.kind {
        kind::FAIL_NTH => Some(Fault::FailNth { engine: s.engine, queue: s.queue, n: s.arg }),
        kind::ABORT => Some(Fault::Abort { engine: s.engine }),
        kind::STALL => Some(Fault::Stall { engine: s.engine, queue: s.queue, ms: s.arg }),
        kind::SLOW => Some(Fault::Slow { factor: s.arg }),
        _ => None,
    }
}

impl Device {
    /// Reads a 32-bit BAR2 register (model control window).
    pub fn bar2_read32(&self, off: u64) -> u32 {
        let c = self.counters();
        let le = self.last_error();
        let st = *self.shared.bar2.lock().unwrap_or_else(|e| e.into_inner());
        match off {
            B2_MAGIC => MAGIC,
            B2_VERSION => 1,
            B2_MODEL => u32::from(self.model().device_id()),
            B2_FAULT_KIND => st.kind,
            B2_FAULT_ENGINE => st.engine,
            B2_FAULT_QUEUE => st.queue,
            B2_FAULT_ARG => st.arg,
            B2_FAULT_COMMIT => st.status,
            B2_DESCS_LO => c.descriptors as u32,
            B2_DESCS_HI => (c.descriptors >> 32) as u32,
            B2_BYTES_LO => c.bytes as u32,
            B2_BYTES_HI => (c.bytes >> 32) as u32,
            B2_ERRORS => c.errors.min(u64::from(u32::MAX)) as u32,
            B2_LAST_ERROR => le.map_or(0, |l| l.record.kind as u32),
            B2_LAST_ERROR_ENGINE => le.map_or(0, |l| l.engine),
            B2_LAST_ERROR_QUEUE => le.and_then(|l| l.record.queue).map_or(u32::MAX, u32::from),
            B2_PACKETS_LO => c.packets as u32,
            B2_PACKETS_HI => (c.packets >> 32) as u32,
            _ => 0,
        }
    }

    /// Writes a 32-bit BAR2 register (model control window).
    pub fn bar2_write32(&self, off: u64, val: u32) {
        let mut commit = None;
        {
            let mut st = self.shared.bar2.lock().unwrap_or_else(|e| e.into_inner());
            match off {
                B2_FAULT_KIND => st.kind = val,
                B2_FAULT_ENGINE => st.engine = val,
                B2_FAULT_QUEUE => st.queue = val,
                B2_FAULT_ARG => st.arg = val,
                B2_FAULT_COMMIT if val == 1 => commit = Some(*st),
                B2_CLEAR if val == 1 => {}
                _ => {
                    log::debug!("BAR2 write to 0x{off:x} = 0x{val:x} ignored");
                    return;
                }
            }
        }
        if off == B2_CLEAR {
            self.clear();
            return;
        }
        if let Some(s) = commit {
            let ok = match staged_fault(&s) {
                Some(f) => self.inject(f).is_ok(),
                None => s.kind == kind::NONE,
            };
            self.shared.bar2.lock().unwrap_or_else(|e| e.into_inner()).status = u32::from(!ok);
        }
    }

    /// BAR2 access of any size (split into 32-bit words).
    pub fn bar2_read(&self, off: u64, data: &mut [u8]) {
        crate::for_each_word(off, data.len(), |w, lo, n, at| {
            let v = self.bar2_read32(w).to_le_bytes();
            data[at..at + n].copy_from_slice(&v[lo..lo + n]);
        });
    }

    /// BAR2 write of any size; only whole 32-bit words have an effect.
    pub fn bar2_write(&self, off: u64, data: &[u8]) {
        crate::for_each_word(off, data.len(), |w, _lo, n, at| {
            if n == 4 {
                let mut b = [0u8; 4];
                b.copy_from_slice(&data[at..at + 4]);
                self.bar2_write32(w, u32::from_le_bytes(b));
            }
        });
    }

    /// Executes one JSON control command (a [`Command`] object) and returns the reply object:
    /// `{"ok":true, ...}`, or `{"ok":false,"error":"..."}` for a command that does not parse
    /// (unknown `cmd`, a missing or out-of-range field) or a fault the device rejects.
    pub fn control(&self, cmd: &Value) -> Value {
        match Command::deserialize(cmd) {
            Ok(c) => self.execute(c),
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        }
    }

    /// Executes one parsed control command and returns the reply object (see [`Device::control`]).
    pub fn execute(&self, cmd: Command) -> Value {
        if let Some(f) = cmd.fault() {
            return match self.inject(f) {
                Ok(()) => json!({"ok": true}),
                Err(e) => json!({"ok": false, "error": e}),
            };
        }
        match cmd {
            Command::Counters => {
                let engines: Vec<Value> = self
                    .engine_counters()
                    .into_iter()
                    .map(|(id, c)| {
                        let mut v = counters_json(c);
                        v["engine"] = json!(id);
                        v
                    })
                    .collect();
                json!({"ok": true, "total": counters_json(self.counters()), "engines": engines})
            }
            Command::LastError => {
                let error = self.last_error().map(|l| {
                    json!({
                        "engine": l.engine, "kind": l.record.kind.name(), "code": l.record.kind as u32,
                        "queue": l.record.queue, "ring": l.record.dir.map(Dir::name),
                        "index": l.record.index, "m2s_cause": l.record.m2s_bits, "s2m_cause": l.record.s2m_bits,
                    })
                });
                json!({"ok": true, "error": error})
            }
            Command::Clear => {
                self.clear();
                json!({"ok": true})
            }
            // Ping; the fault commands were applied above.
            _ => json!({"ok": true}),
        }
    }
}

/// One command of the control protocol: a JSON object whose `"cmd"` member names the command,
/// with the command's arguments as further members (members a command does not take are
/// ignored). Engine and queue ids are checked when the command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// `{"cmd":"ping"}`: replies `{"ok":true}`.
    Ping,
    /// `{"cmd":"counters"}`: the counters summed over all engines (`total`) and per engine.
    Counters,
    /// `{"cmd":"clear"}`: clears faults, counters and the last error.
    Clear,
    /// `{"cmd":"last_error"}`: the most recent error on any engine, `null` if none.
    LastError,
    /// `{"cmd":"fail_nth","engine":E,"queue":Q,"n":N}`: [`Fault::FailNth`] (same fields).
    FailNth { engine: u32, queue: u32, n: u32 },
    /// `{"cmd":"abort","engine":E}`: [`Fault::Abort`].
    Abort { engine: u32 },
    /// `{"cmd":"stall","engine":E,"queue":Q,"ms":MS}`: [`Fault::Stall`] (same fields).
    Stall { engine: u32, queue: u32, ms: u32 },
    /// `{"cmd":"slow","factor":F}`: [`Fault::Slow`].
    Slow { factor: u32 },
}

impl Command {
    /// The fault a fault command injects; `None` for the other commands.
    pub fn fault(self) -> Option<Fault> {
        Some(match self {
            Command::FailNth { engine, queue, n } => Fault::FailNth { engine, queue, n },
            Command::Abort { engine } => Fault::Abort { engine },
            Command::Stall { engine, queue, ms } => Fault::Stall { engine, queue, ms },
            Command::Slow { factor } => Fault::Slow { factor },
            Command::Ping | Command::Counters | Command::Clear | Command::LastError => return None,
        })
    }
}

fn counters_json(c: CounterValues) -> Value {
    json!({"descriptors": c.descriptors, "packets": c.packets, "bytes": c.bytes, "errors": c.errors})
}

/// Error kind name for a BAR2 last-error code (inverse of `kind as u32`).
pub fn error_kind_name(code: u32) -> Option<&'static str> {
    ErrorKind::from_code(code).map(ErrorKind::name)
}

/// Serves the control protocol on `path` in background threads (one per connection).
pub fn serve(dev: Arc<Device>, path: &Path) -> std::io::Result<()> {
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::thread::Builder::new().name("udma-control".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(s) => {
                    let d = dev.clone();
                    let _ = std::thread::Builder::new().name("udma-control-conn".into()).spawn(move || handle(d, s));
                }
                Err(e) => log::warn!("control accept: {e}"),
            }
        }
    })?;
    Ok(())
}

fn handle(dev: Arc<Device>, stream: UnixStream) {
    let Ok(mut out) = stream.try_clone() else { return };
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(v) => dev.control(&v),
            Err(e) => json!({"ok": false, "error": format!("bad JSON: {e}")}),
        };
        if writeln!(out, "{reply}").is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Command, String> {
        serde_json::from_str::<Command>(s).map_err(|e| e.to_string())
    }

    #[test]
    fn commands_parse_from_the_wire_format() {
        assert_eq!(parse(r#"{"cmd":"ping"}"#), Ok(Command::Ping));
        assert_eq!(parse(r#"{"cmd":"counters"}"#), Ok(Command::Counters));
        assert_eq!(parse(r#"{"cmd":"clear"}"#), Ok(Command::Clear));
        assert_eq!(parse(r#"{"cmd":"last_error"}"#), Ok(Command::LastError));
        let c = parse(r#"{"cmd":"fail_nth","engine":32,"queue":0,"n":3}"#).unwrap();
        assert_eq!(c.fault(), Some(Fault::FailNth { engine: 32, queue: 0, n: 3 }));
        let c = parse(r#"{"n":1,"cmd":"abort","engine":4}"#).unwrap();
        assert_eq!(c.fault(), Some(Fault::Abort { engine: 4 }));
        let c = parse(r#"{"cmd":"stall","engine":32,"queue":1,"ms":500,"note":"x"}"#).unwrap();
        assert_eq!(c.fault(), Some(Fault::Stall { engine: 32, queue: 1, ms: 500 }));
        assert_eq!(parse(r#"{"cmd":"slow","factor":4}"#).unwrap().fault(), Some(Fault::Slow { factor: 4 }));
        assert_eq!(Command::Ping.fault(), None);
    }

    #[test]
    fn bad_commands_name_the_problem() {
        let bad = [
            (r#"{"cmd":"nope"}"#, "unknown variant `nope`"),
            (r#"{"engine":1}"#, "missing field `cmd`"),
            (r#"{"cmd":"fail_nth","engine":1,"queue":0}"#, "missing field `n`"),
            (r#"{"cmd":"abort","engine":-1}"#, "integer `-1`"),
            (r#"{"cmd":"slow","factor":4294967296}"#, "integer `4294967296`"),
            (r#"{"cmd":"stall","engine":1,"queue":"0","ms":1}"#, "expected u32"),
        ];
        for (s, want) in bad {
            let e = parse(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}
