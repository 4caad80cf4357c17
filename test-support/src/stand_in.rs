//! Stand-ins for the Neuron SDK's programs, for compile-only runs on machines without it. They
//! are NOT the Neuron compiler or tracer: they answer as those do, and record what they were
//! asked in files beside themselves.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The stand-in `neuronx-cc`'s file name.
pub const COMPILER: &str = "stand-in-neuronx-cc";

/// The stand-in kernel tracer's file name.
pub const TRACER: &str = "stand-in-kernel-tracer";

/// A stand-in for `neuronx-cc`: answers `--version` (`0.0.0+stand-in`); `compile IN ... --output
/// OUT` writes `NEFF(<the module's bytes>)` to OUT ([`module_of_neff`] reads it back), or fails
/// when the module contains `FAIL`. Beside itself it records each compile's process id in
/// `invocations` and its arguments after the input in `last-arguments`, and sleeps the seconds
/// a file `delay` holds (so that concurrent callers overlap), if there is one.
pub const COMPILER_SCRIPT: &str = r#"#!/bin/sh
# Stand-in for neuronx-cc written by the tests. NOT the Neuron compiler.
here=$(dirname "$0")
if [ "$1" = "--version" ]; then
    echo "NeuronX Compiler version 0.0.0+stand-in"
    exit 0
fi
if [ "$1" != "compile" ]; then
    echo "stand-in neuronx-cc: unexpected command '$1'" >&2
    exit 2
fi
input=$2
shift 2
echo "$*" > "$here/last-arguments"
output=""
while [ $# -gt 0 ]; do
    if [ "$1" = "--output" ]; then output=$2; fi
    shift
done
echo "$$" >> "$here/invocations"
if [ -f "$here/delay" ]; then sleep "$(cat "$here/delay")"; fi
if grep -q FAIL "$input"; then
    echo "stand-in neuronx-cc: error: unsupported operator in $input" >&2
    exit 1
fi
{ printf 'NEFF('; cat "$input"; printf ')'; } > "$output"
echo "stand-in neuronx-cc: compiled $input"
"#;

/// A stand-in for the NKI kernel tracer (`HLAT_NEURON_KERNEL_TRACER`): answers `--probe`,
/// records every request it reads, with its arguments, as a JSON line in `requests` beside
/// itself, and answers with the fixed configuration `stand-in-config:<kernel>` and the outputs
/// the request names.
pub const TRACER_SCRIPT: &str = r#"#!/usr/bin/env python3
# Stand-in for the NKI kernel tracer written by the tests. NOT the Neuron SDK.
import json, os, sys
if "--probe" in sys.argv:
    sys.exit(0)
request = json.load(sys.stdin)
with open(os.path.join(os.path.dirname(sys.argv[0]), "requests"), "a") as log:
    log.write(json.dumps({"arguments": sys.argv[1:], "request": request}) + "\n")
json.dump({
    "custom_call_target": "AwsNeuronCustomNativeKernel",
    "backend_config": "stand-in-config:" + request["kernel"],
    "outputs": request["outputs"],
}, sys.stdout)
"#;

/// Writes `body` as the executable `name` in `folder`; returns its path.
pub fn write_executable(folder: &Path, name: &str, body: &str) -> PathBuf {
    let path = folder.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Writes the stand-in `neuronx-cc` ([`COMPILER_SCRIPT`]) into `folder`; returns its path.
pub fn compiler(folder: &Path) -> PathBuf {
    write_executable(folder, COMPILER, COMPILER_SCRIPT)
}

/// Writes the stand-in kernel tracer ([`TRACER_SCRIPT`]) into `folder`; returns its path.
pub fn tracer(folder: &Path) -> PathBuf {
    write_executable(folder, TRACER, TRACER_SCRIPT)
}

/// The module the stand-in compiler received, from the "NEFF" it wrote.
pub fn module_of_neff(neff: &[u8]) -> &[u8] {
    neff.strip_prefix(b"NEFF(")
        .and_then(|rest| rest.strip_suffix(b")"))
        .expect("not a NEFF of the stand-in compiler")
}
