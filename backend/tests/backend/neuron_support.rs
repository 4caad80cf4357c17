//! Shared by the `neuron_*` tests: a stand-in for `neuronx-cc`, written by the tests into a
//! temporary folder. It is NOT the Neuron compiler: it answers `--version`, records every
//! `compile` invocation in a file beside itself, sleeps a little so concurrent callers overlap,
//! and writes `NEFF(<module bytes>)` as the "NEFF", or fails when the module contains `FAIL`.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use burn_trainium::neuron::{
    FlashAttention, NeffCache, NeuronCompiler, NeuronSettings, NeuronTarget,
};

const STAND_IN_COMPILER: &str = r#"#!/bin/sh
# Stand-in for neuronx-cc written by the tests of burn-trainium. NOT the Neuron compiler.
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
sleep 0.3
if grep -q FAIL "$input"; then
    echo "stand-in neuronx-cc: error: unsupported operator in $input" >&2
    exit 1
fi
{ printf 'NEFF('; cat "$input"; printf ')'; } > "$output"
echo "stand-in neuronx-cc: compiled $input"
"#;

/// A stand-in for the kernel tracer (`HLAT_NEURON_KERNEL_TRACER`). It is NOT the Neuron SDK's
/// tracer: it answers `--probe`, records every request it reads in `requests` beside itself, and
/// answers with a fixed configuration and the output the request names.
const STAND_IN_TRACER: &str = r#"#!/usr/bin/env python3
# Stand-in for the NKI kernel tracer written by the tests of burn-trainium. NOT the Neuron SDK.
import json, os, sys
if "--probe" in sys.argv:
    sys.exit(0)
request = json.load(sys.stdin)
with open(os.path.join(os.path.dirname(sys.argv[0]), "requests"), "a") as log:
    log.write(json.dumps({"arguments": sys.argv[1:], "request": request}) + "\n")
json.dump({
    "custom_call_target": "AwsNeuronCustomNativeKernel",
    "backend_config": "stand-in-config:" + request["kernel"],
    "output": request["output"],
}, sys.stdout)
"#;

/// A temporary folder holding the stand-in compiler and a cache root; removed on drop.
pub struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    pub fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("hlat-neff-cache-{name}-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        let script = dir.join("bin").join("stand-in-neuronx-cc");
        std::fs::write(&script, STAND_IN_COMPILER).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let workspace = Self { dir };
        workspace.write_tracer("stand-in-kernel-tracer", STAND_IN_TRACER);
        workspace
    }

    pub fn compiler_path(&self) -> PathBuf {
        self.dir.join("bin").join("stand-in-neuronx-cc")
    }

    pub fn compiler(&self) -> NeuronCompiler {
        NeuronCompiler::new(
            self.compiler_path(),
            NeuronTarget::Trn1,
            vec!["--model-type".into(), "transformer".into()],
        )
        .unwrap()
    }

    pub fn tracer_path(&self) -> PathBuf {
        self.dir.join("bin").join("stand-in-kernel-tracer")
    }

    /// Writes an executable tracer `script` named `name` beside the stand-ins.
    pub fn write_tracer(&self, name: &str, script: &str) -> PathBuf {
        let path = self.dir.join("bin").join(name);
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Every request the stand-in tracer read, with its command-line arguments, in order.
    pub fn traced_requests(&self) -> Vec<serde_json::Value> {
        match std::fs::read_to_string(self.dir.join("bin").join("requests")) {
            Ok(text) => text
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    pub fn cache_root(&self) -> PathBuf {
        self.dir.join("cache")
    }

    pub fn cache(&self) -> NeffCache {
        NeffCache::new(self.cache_root(), false)
    }

    /// How many times the stand-in compiled.
    pub fn invocations(&self) -> usize {
        match std::fs::read_to_string(self.dir.join("bin").join("invocations")) {
            Ok(text) => text.lines().count(),
            Err(_) => 0,
        }
    }

    pub fn last_arguments(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("bin").join("last-arguments")).unwrap();
        text.trim_end().to_string()
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Points the `neuron` executors opened from now on at the stand-in compiler and a cache in
/// `workspace`, in compile-only mode, without the SDK's flash kernel.
pub fn use_stand_in_for_the_executor(workspace: &Workspace) {
    burn_trainium::neuron::set_settings(Some(stand_in_settings(workspace, FlashAttention::Off)));
    burn_trainium::neuron::set_compile_only(true);
}

/// As [`use_stand_in_for_the_executor`], with attention as the SDK's flash kernel traced by the
/// stand-in tracer.
pub fn use_stand_ins_with_flash_attention(workspace: &Workspace) {
    burn_trainium::neuron::set_settings(Some(stand_in_settings(workspace, FlashAttention::On)));
    burn_trainium::neuron::set_compile_only(true);
}

/// The settings of the stand-in compiler and tracer in `workspace`.
pub fn stand_in_settings(workspace: &Workspace, flash_attention: FlashAttention) -> NeuronSettings {
    NeuronSettings {
        compiler: workspace.compiler_path(),
        target: NeuronTarget::Trn1,
        compiler_flags: vec!["--model-type".into(), "transformer".into()],
        cache_root: workspace.cache_root(),
        retry_failed: false,
        flash_attention,
        kernel_tracer: Some(workspace.tracer_path()),
        lint: Default::default(),
    }
}

/// Every `model.hlo_module.pb` under `root`, sorted.
pub fn cached_modules(root: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path
                .file_name()
                .is_some_and(|name| name == burn_trainium::neuron::MODULE_FILE)
            {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
