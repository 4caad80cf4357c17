//! Shared by the `neuron_*` tests: the workspace's stand-in `neuronx-cc` and kernel tracer
//! (`test_support::stand_in`: NOT the Neuron SDK), written by the tests into a temporary folder
//! with a cache root beside them. Here the stand-in compiler sleeps 0.3 s a compile, so that
//! concurrent callers overlap.

use std::path::PathBuf;

use burn_trainium::neuron::{
    FlashAttention, NeffCache, NeuronCompiler, NeuronSettings, NeuronTarget,
};
pub use test_support::files::cached_modules;
use test_support::stand_in;

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
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        stand_in::compiler(&bin);
        std::fs::write(bin.join("delay"), "0.3").unwrap();
        stand_in::tracer(&bin);
        Self { dir }
    }

    /// The stand-in compiler.
    pub fn compiler_path(&self) -> PathBuf {
        self.dir.join("bin").join(stand_in::COMPILER)
    }

    /// A compiler object on the stand-in compiler, for trn1, with `--model-type transformer`.
    pub fn compiler(&self) -> NeuronCompiler {
        NeuronCompiler::new(
            self.compiler_path(),
            NeuronTarget::Trn1,
            vec!["--model-type".into(), "transformer".into()],
        )
        .unwrap()
    }

    /// The stand-in kernel tracer.
    pub fn tracer_path(&self) -> PathBuf {
        self.dir.join("bin").join(stand_in::TRACER)
    }

    /// Writes an executable tracer `script` named `name` beside the stand-ins.
    pub fn write_tracer(&self, name: &str, script: &str) -> PathBuf {
        stand_in::write_executable(&self.dir.join("bin"), name, script)
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
