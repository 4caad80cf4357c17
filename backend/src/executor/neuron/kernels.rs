//! The Neuron SDK's kernels: the lowering's kernel requests (`crate::lower::KernelRequest`) become
//! `AwsNeuronCustomNativeKernel` calls before `neuronx-cc` sees a module.
//!
//! Only the SDK's NKI tracer can write such a call's configuration, so a *kernel tracer* does it:
//! a command that reads a request (JSON) on its standard input and writes the call (JSON:
//! `custom_call_target`, `backend_config`, `output`) on its standard output, and that answers
//! `--probe` with success when it can trace a small request. The default tracer is the
//! project's own script (`kernel_tracer.py`, run by `python3`); `HLAT_NEURON_KERNEL_TRACER` names
//! another.
//!
//! Programs are hashed and cached with their requests, not the traced calls: a request names
//! everything the kernel is compiled from (shapes, types, compile-time arguments), the NEFF cache
//! key of a module holding requests names the tracer ([`KernelTracer::identity`]), and the
//! compiler's version stands for the SDK's. Each distinct request is traced once per process,
//! and only when a program is compiled.

use core::str::FromStr;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use prost::Message;
use serde::Deserialize;

use super::cache::sha256_hex;
use super::compiler::printed;
use super::{NeuronError, NeuronTarget};
use crate::executor::atomic_write::write_atomically;
use crate::hlo::HloModuleProto;
use crate::lower::{KERNEL_REQUEST_TARGET, KernelRequest, KernelTensor};

/// The environment variable choosing whether attention runs as the SDK's flash kernel
/// (`auto`, `on` or `off`).
pub const FLASH_ATTENTION_ENV: &str = crate::settings::NEURON_FLASH_ATTENTION.name;
/// The environment variable naming the kernel tracer executable (default: the project's script).
pub const KERNEL_TRACER_ENV: &str = crate::settings::NEURON_KERNEL_TRACER.name;
/// The custom-call target of the Neuron SDK's NKI kernels.
pub const NEURON_KERNEL_TARGET: &str = "AwsNeuronCustomNativeKernel";
/// The default kernel tracer: a Python script that calls the SDK's NKI tracer.
pub const TRACER_SCRIPT: &str = include_str!("kernel_tracer.py");
/// The interpreter that runs [`TRACER_SCRIPT`].
const PYTHON: &str = "python3";

/// Whether Burn's attention module runs as the Neuron SDK's flash-attention kernel where the
/// kernel computes the same thing (see `crate::lower::AttentionLowering::NeuronFlash`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlashAttention {
    /// When the kernel tracer finds the SDK's kernels (`auto`, the default); HLO operations
    /// otherwise, as the executor's log says when it opens.
    #[default]
    Auto,
    /// Always: an executor whose tracer does not find the kernels fails to open (`on`).
    On,
    /// Never: attention is lowered with HLO operations (`off`).
    Off,
}

impl FromStr for FlashAttention {
    type Err = NeuronError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "on" | "1" | "true" => Ok(Self::On),
            "off" | "0" | "false" => Ok(Self::Off),
            _ => Err(NeuronError::InvalidSetting {
                name: FLASH_ATTENTION_ENV,
                value: text.to_string(),
                reason: "expected `auto`, `on` or `off`".to_string(),
            }),
        }
    }
}

/// A vendor kernel call, as the tracer writes it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TracedKernel {
    /// The custom-call target ([`NEURON_KERNEL_TARGET`]).
    pub custom_call_target: String,
    /// The call's configuration, as the SDK wrote it.
    pub backend_config: String,
    /// The tensors the call returns, in order.
    pub outputs: Vec<KernelTensor>,
}

/// Runs a kernel tracer and remembers what it traced.
#[derive(Debug, Clone)]
pub struct KernelTracer {
    program: PathBuf,
    arguments: Vec<PathBuf>,
    target: NeuronTarget,
    traced: Arc<Mutex<HashMap<String, TracedKernel>>>,
}

impl PartialEq for KernelTracer {
    fn eq(&self, other: &Self) -> bool {
        (&self.program, &self.arguments, self.target)
            == (&other.program, &other.arguments, other.target)
    }
}

impl Eq for KernelTracer {}

impl KernelTracer {
    /// The tracer `executable`, for `target`.
    pub fn new(executable: impl Into<PathBuf>, target: NeuronTarget) -> Self {
        Self {
            program: executable.into(),
            arguments: Vec::new(),
            target,
            traced: Arc::default(),
        }
    }

    /// The project's own tracer script, written into `folder` (under a name holding its hash, so
    /// processes of other versions keep theirs) and run by `python3`.
    pub fn default_script(folder: &Path, target: NeuronTarget) -> Result<Self, NeuronError> {
        let hash = sha256_hex(&[TRACER_SCRIPT.as_bytes()], 12);
        let script = folder.join(format!("hlat-kernel-tracer-{hash}.py"));
        if !script.is_file() {
            std::fs::create_dir_all(folder).map_err(NeuronError::io("create", folder))?;
            write_atomically(&script, TRACER_SCRIPT.as_bytes())
                .map_err(NeuronError::io("write", &script))?;
        }
        Ok(Self {
            arguments: vec![script],
            ..Self::new(PYTHON, target)
        })
    }

    /// The command line, as shown in messages.
    fn shown(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.arguments)
            .map(|part| part.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.arguments);
        command
    }

    fn failure(&self, kernel: &str, reason: impl Into<String>) -> NeuronError {
        NeuronError::KernelTracer {
            kernel: kernel.to_string(),
            command: self.shown(),
            reason: reason.into(),
        }
    }

    /// What identifies the tracer in NEFF cache keys: its command line (the default script's
    /// file name holds its hash) and target.
    pub fn identity(&self) -> String {
        format!("{} --target {}", self.shown(), self.target.name())
    }

    /// Whether the tracer traces a small request (`--probe`); if not, why. Asked once per process
    /// and tracer.
    pub fn probe(&self) -> Result<(), NeuronError> {
        static PROBED: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);
        let mut probed = PROBED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let answer = probed
            .get_or_insert_with(HashMap::new)
            .entry(self.identity())
            .or_insert_with(|| {
                let output = self
                    .command()
                    .arg("--probe")
                    .arg("--target")
                    .arg(self.target.name())
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|error| error.to_string())?;
                if output.status.success() {
                    return Ok(());
                }
                Err(format!("{} {}", output.status, printed(&output).trim()))
            });
        answer
            .clone()
            .map_err(|reason| self.failure("the probe", reason))
    }

    /// The vendor call for `request`, traced once per distinct request.
    pub fn trace(&self, request: &KernelRequest) -> Result<TracedKernel, NeuronError> {
        let text = serde_json::to_string(request).expect("a kernel request is plain JSON");
        let mut traced = self
            .traced
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(found) = traced.get(&text) {
            return Ok(found.clone());
        }
        let kernel = request.kernel.as_str();
        log::info!("tracing the Neuron kernel {kernel} with `{}`", self.shown());
        let mut child = self
            .command()
            .arg("--target")
            .arg(self.target.name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| self.failure(kernel, error.to_string()))?;
        let mut stdin = child.stdin.take().expect("the tracer's input is piped");
        let written = stdin.write_all(text.as_bytes());
        drop(stdin);
        let output = child
            .wait_with_output()
            .map_err(|error| self.failure(kernel, error.to_string()))?;
        if !output.status.success() {
            let said = printed(&output);
            return Err(self.failure(kernel, format!("{} {}", output.status, said.trim())));
        }
        written.map_err(|error| self.failure(kernel, format!("writing the request: {error}")))?;
        let call: TracedKernel = serde_json::from_slice(&output.stdout).map_err(|error| {
            let printed = String::from_utf8_lossy(&output.stdout);
            self.failure(kernel, format!("unreadable answer ({error}): {printed}"))
        })?;
        if call.custom_call_target != NEURON_KERNEL_TARGET {
            return Err(self.failure(
                kernel,
                format!(
                    "the call's target is `{}`, expected `{NEURON_KERNEL_TARGET}`",
                    call.custom_call_target
                ),
            ));
        }
        if call.outputs != request.outputs {
            return Err(self.failure(
                kernel,
                format!(
                    "the traced kernel returns {:?}, the program expects {:?}",
                    call.outputs, request.outputs
                ),
            ));
        }
        traced.insert(text, call.clone());
        Ok(call)
    }

    /// `module` with every kernel request replaced by the SDK's call.
    pub fn materialize(&self, module: &mut HloModuleProto) -> Result<(), NeuronError> {
        for instruction in module
            .computations
            .iter_mut()
            .flat_map(|computation| &mut computation.instructions)
        {
            let Some(request) = KernelRequest::of_instruction(instruction) else {
                continue;
            };
            let request = request.map_err(|reason| self.failure("a request", reason))?;
            let call = self.trace(&request)?;
            instruction.custom_call_target = call.custom_call_target;
            instruction.backend_config = call.backend_config.into_bytes();
        }
        Ok(())
    }
}

/// Whether `module` (serialized) holds a kernel request.
pub(crate) fn has_kernel_requests(module: &[u8]) -> bool {
    let marker = KERNEL_REQUEST_TARGET.as_bytes();
    module.windows(marker.len()).any(|window| window == marker)
}

/// `module` (serialized) as the compiler must receive it: its kernel requests replaced by the
/// SDK's calls through `tracer`. A module without requests is returned as it is.
pub(crate) fn with_kernels<'a>(
    module: &'a [u8],
    tracer: Option<&KernelTracer>,
) -> Result<Cow<'a, [u8]>, NeuronError> {
    if !has_kernel_requests(module) {
        return Ok(Cow::Borrowed(module));
    }
    let tracer = tracer.ok_or_else(|| NeuronError::UntracedKernelRequests {
        reason: format!(
            "no kernel tracer is configured ({FLASH_ATTENTION_ENV} is off, or the SDK was not \
             found when the device opened)"
        ),
    })?;
    let mut decoded = HloModuleProto::decode(module).map_err(|error| {
        tracer.failure(
            "the module's kernel requests",
            format!("the module does not decode: {error}"),
        )
    })?;
    tracer.materialize(&mut decoded)?;
    Ok(Cow::Owned(decoded.encode_to_vec()))
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::hlo::{HloComputationProto, HloInstructionProto};

    fn request() -> KernelRequest {
        let tensor = |shape: &[i64]| KernelTensor {
            dtype: "float32".to_string(),
            shape: shape.to_vec(),
        };
        KernelRequest {
            kernel: "flash_fwd".to_string(),
            grid: vec![1, 2],
            inputs: vec![tensor(&[1, 2, 8, 512]), tensor(&[1, 2, 8, 512])],
            outputs: vec![tensor(&[1, 2, 512, 8])],
            arguments: serde_json::Map::new(),
        }
    }

    /// An executable shell script `body` in `folder`.
    fn script(folder: &Path, body: &str) -> PathBuf {
        test_support::stand_in::write_executable(folder, "tracer", &format!("#!/bin/sh\n{body}\n"))
    }

    #[test]
    fn a_failing_tracer_is_named_with_what_it_said() {
        let folder = tempfile::tempdir().unwrap();
        let path = script(
            folder.path(),
            "cat > /dev/null; echo 'no such kernel' >&2; exit 3",
        );
        let tracer = KernelTracer::new(&path, NeuronTarget::Trn2);
        let message = tracer.trace(&request()).unwrap_err().to_string();
        for expected in [
            "flash_fwd",
            path.to_str().unwrap(),
            "no such kernel",
            KERNEL_TRACER_ENV,
        ] {
            assert!(message.contains(expected), "{expected}: {message}");
        }
        assert!(tracer.probe().is_err());
    }

    #[test]
    fn a_call_of_another_shape_is_refused() {
        let folder = tempfile::tempdir().unwrap();
        let answer = r#"{"custom_call_target": "AwsNeuronCustomNativeKernel", "backend_config": "x", "outputs": [{"dtype": "float32", "shape": [1]}]}"#;
        let path = script(folder.path(), &format!("cat > /dev/null; echo '{answer}'"));
        let message = KernelTracer::new(&path, NeuronTarget::Trn1)
            .trace(&request())
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("shape: [1]") && message.contains("shape: [1, 2, 512, 8]"),
            "{message}"
        );
    }

    #[test]
    fn modules_without_requests_pass_and_requests_need_a_tracer() {
        let bytes = b"not even a module";
        assert_eq!(with_kernels(bytes, None).unwrap().as_ref(), bytes);
        let module = HloModuleProto {
            computations: vec![HloComputationProto {
                instructions: vec![HloInstructionProto {
                    name: "custom_call.1".to_string(),
                    opcode: "custom-call".to_string(),
                    custom_call_target: KERNEL_REQUEST_TARGET.to_string(),
                    backend_config: serde_json::to_vec(&request()).unwrap(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let message = with_kernels(&module.encode_to_vec(), None)
            .unwrap_err()
            .to_string();
        assert!(message.contains("no kernel tracer"), "{message}");
    }

    /// The project's own tracer finds the SDK exactly when Python can import its flash kernel;
    /// without it, it says so.
    #[test]
    fn the_default_tracer_probes_for_the_sdk() {
        let folder = tempfile::tempdir().unwrap();
        let tracer = KernelTracer::default_script(folder.path(), NeuronTarget::Trn1).unwrap();
        let importable = Command::new(PYTHON)
            .args(["-c", "import neuronxcc.nki.kernels.attention"])
            .output()
            .is_ok_and(|output| output.status.success());
        match tracer.probe() {
            Ok(()) => assert!(importable),
            Err(error) => {
                assert!(!importable, "{error}");
                let message = error.to_string();
                assert!(message.contains("do not import"), "{message}");
            }
        }
    }

    #[test]
    fn flash_attention_settings_parse() {
        assert_eq!(
            "AUTO".parse::<FlashAttention>().unwrap(),
            FlashAttention::Auto
        );
        assert_eq!("on".parse::<FlashAttention>().unwrap(), FlashAttention::On);
        assert_eq!("0".parse::<FlashAttention>().unwrap(), FlashAttention::Off);
        let message = "maybe".parse::<FlashAttention>().unwrap_err().to_string();
        assert!(message.contains(FLASH_ATTENTION_ENV), "{message}");
    }
}
