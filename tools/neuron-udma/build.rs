// SPDX-License-Identifier: MIT OR Apache-2.0
//! Generates the ABI structs and constants from `include/uapi/linux/neuron_udma.h` with bindgen.
//! The header is the single source of truth; nothing of it is written by hand here.

use std::env;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let uapi = manifest.join("../../include/uapi");
    let header = uapi.join("linux/neuron_udma.h");
    println!("cargo:rerun-if-changed={}", header.display());

    let bindings = bindgen::Builder::default()
        .header(header.to_str().expect("UTF-8 header path"))
        .clang_arg(format!("-I{}", uapi.display()))
        .allowlist_type("neuron_udma_.*")
        .allowlist_var("NEURON_UDMA_.*")
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .derive_eq(true)
        .layout_tests(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen failed on {}: {e} (is libclang installed? run scripts/host-deps)", header.display())
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("neuron_udma.rs");
    bindings.write_to_file(&out).expect("write bindings");
}
