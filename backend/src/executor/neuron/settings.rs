use core::fmt;
use core::str::FromStr;
use std::path::PathBuf;

use super::NeuronError;
use super::kernels::FlashAttention;
use super::lint::{LINT_ENV, LintMode};

/// The environment variable naming the compiler executable (a path or a name on `PATH`).
pub const COMPILER_ENV: &str = crate::settings::NEURON_CC.name;
/// The compiler run when [`COMPILER_ENV`] is unset.
pub const DEFAULT_COMPILER: &str = crate::settings::NEURON_CC.default;
/// The environment variable holding extra compiler flags, as for torch-neuronx.
pub const FLAGS_ENV: &str = crate::settings::NEURON_CC_FLAGS.name;
/// The compiler flags used when [`FLAGS_ENV`] is unset.
pub const DEFAULT_FLAGS: &str = crate::settings::NEURON_CC_FLAGS.default;
/// The environment variable choosing the compile target (`trn1` or `trn2`).
pub const TARGET_ENV: &str = crate::settings::NEURON_TARGET.name;
/// The environment variable naming the compile cache folder, as for torch-neuronx.
pub const CACHE_URL_ENV: &str = crate::settings::NEURON_COMPILE_CACHE_URL.name;
/// The compile cache folder used when [`CACHE_URL_ENV`] is unset, as for torch-neuronx.
pub const DEFAULT_CACHE_ROOT: &str = crate::settings::NEURON_COMPILE_CACHE_URL.default;

/// The Trainium generation a NEFF is compiled for (`neuronx-cc --target`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NeuronTarget {
    /// trn1 / trn1n instances (NeuronCore-v2).
    #[default]
    Trn1,
    /// trn2 instances (NeuronCore-v3).
    Trn2,
}

impl NeuronTarget {
    /// The name `neuronx-cc --target` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Trn1 => "trn1",
            Self::Trn2 => "trn2",
        }
    }
}

impl fmt::Display for NeuronTarget {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

impl FromStr for NeuronTarget {
    type Err = NeuronError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "trn1" => Ok(Self::Trn1),
            "trn2" => Ok(Self::Trn2),
            _ => Err(NeuronError::InvalidSetting {
                name: TARGET_ENV,
                value: text.to_string(),
                reason: "expected `trn1` or `trn2`".to_string(),
            }),
        }
    }
}

/// How the Neuron toolchain is configured: compiler, target, flags and cache folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronSettings {
    /// The compiler executable.
    pub compiler: PathBuf,
    /// The compile target.
    pub target: NeuronTarget,
    /// Flags passed to `neuronx-cc compile` after `--framework XLA --target ...`.
    pub compiler_flags: Vec<String>,
    /// The root folder of the NEFF cache.
    pub cache_root: PathBuf,
    /// Whether a remembered compile failure is retried instead of reported.
    pub retry_failed: bool,
    /// Whether Burn's attention module runs as the SDK's flash-attention kernel.
    pub flash_attention: FlashAttention,
    /// The kernel tracer executable; `None`: the project's script, run by `python3`.
    pub kernel_tracer: Option<PathBuf>,
    /// What a module breaking the Neuron lint's rules does ([`super::LINT_ENV`]).
    pub lint: LintMode,
}

/// The raw text of each setting, as read from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawSettings {
    /// [`COMPILER_ENV`].
    pub compiler: Option<String>,
    /// [`FLAGS_ENV`].
    pub flags: Option<String>,
    /// [`TARGET_ENV`].
    pub target: Option<String>,
    /// [`CACHE_URL_ENV`].
    pub cache_url: Option<String>,
    /// [`FLASH_ATTENTION_ENV`](super::FLASH_ATTENTION_ENV).
    pub flash_attention: Option<String>,
    /// [`KERNEL_TRACER_ENV`](super::KERNEL_TRACER_ENV).
    pub kernel_tracer: Option<String>,
    /// [`LINT_ENV`].
    pub lint: Option<String>,
}

impl RawSettings {
    /// Reads the variables; empty values count as unset.
    pub fn from_env() -> Self {
        let read = |variable: crate::settings::Variable| {
            variable.value().filter(|value| !value.trim().is_empty())
        };
        Self {
            compiler: read(crate::settings::NEURON_CC),
            flags: read(crate::settings::NEURON_CC_FLAGS),
            target: read(crate::settings::NEURON_TARGET),
            cache_url: read(crate::settings::NEURON_COMPILE_CACHE_URL),
            flash_attention: read(crate::settings::NEURON_FLASH_ATTENTION),
            kernel_tracer: read(crate::settings::NEURON_KERNEL_TRACER),
            lint: read(crate::settings::NEURON_LINT),
        }
    }
}

/// Settings given in code, which take the place of the environment's (see [`set_settings`]).
static SETTINGS_OVERRIDE: std::sync::Mutex<Option<NeuronSettings>> = std::sync::Mutex::new(None);

/// Makes `neuron` executors opened from now on use `settings` instead of the environment
/// variables of this module (`None`: the environment again). Executors already open keep theirs.
pub fn set_settings(settings: Option<NeuronSettings>) {
    *SETTINGS_OVERRIDE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = settings;
}

impl NeuronSettings {
    /// The settings named by the environment variables of this module.
    pub fn from_env() -> Result<Self, NeuronError> {
        Self::parse(&RawSettings::from_env())
    }

    /// The settings an executor opens with: those of [`set_settings`], else the environment's.
    pub fn current() -> Result<Self, NeuronError> {
        let given = SETTINGS_OVERRIDE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        given.map_or_else(Self::from_env, Ok)
    }

    /// Validates raw settings.
    ///
    /// `NEURON_CC_FLAGS` is split on whitespace. Two of its flags belong to the cache rather than
    /// the compiler, as in torch-neuronx: `--cache_dir=PATH` (takes precedence over
    /// `NEURON_COMPILE_CACHE_URL`) and `--retry_failed_compilation`. `--target` is rejected: the
    /// target is part of the cache key and comes from `HLAT_NEURON_TARGET`.
    pub fn parse(raw: &RawSettings) -> Result<Self, NeuronError> {
        let target = raw
            .target
            .as_deref()
            .map(str::parse)
            .transpose()?
            .unwrap_or_default();
        let flags_text = raw.flags.as_deref().unwrap_or(DEFAULT_FLAGS);
        let invalid_flags = |reason: &str| NeuronError::InvalidSetting {
            name: FLAGS_ENV,
            value: flags_text.to_string(),
            reason: reason.to_string(),
        };
        let mut compiler_flags = Vec::new();
        let mut cache_dir = None;
        let mut retry_failed = false;
        let mut words = flags_text.split_whitespace();
        while let Some(word) = words.next() {
            if word == "--retry_failed_compilation" {
                retry_failed = true;
            } else if let Some(path) = word.strip_prefix("--cache_dir=") {
                cache_dir = Some(path.to_string());
            } else if word == "--cache_dir" {
                let path = words
                    .next()
                    .ok_or_else(|| invalid_flags("`--cache_dir` needs a path"))?;
                cache_dir = Some(path.to_string());
            } else if word == "--target" || word.starts_with("--target=") {
                return Err(invalid_flags(&format!(
                    "set the target with {TARGET_ENV} instead of `--target`"
                )));
            } else {
                compiler_flags.push(word.to_string());
            }
        }
        let cache_root = match cache_dir {
            Some(path) => local_cache_root("--cache_dir", &path)?,
            None => match raw.cache_url.as_deref() {
                Some(url) => local_cache_root(CACHE_URL_ENV, url)?,
                None => PathBuf::from(DEFAULT_CACHE_ROOT),
            },
        };
        Ok(Self {
            compiler: PathBuf::from(raw.compiler.as_deref().unwrap_or(DEFAULT_COMPILER)),
            target,
            compiler_flags,
            cache_root,
            retry_failed,
            flash_attention: raw
                .flash_attention
                .as_deref()
                .map(str::parse)
                .transpose()?
                .unwrap_or_default(),
            kernel_tracer: raw.kernel_tracer.as_deref().map(PathBuf::from),
            lint: match raw.lint.as_deref() {
                None => LintMode::default(),
                Some(text) => text.parse().map_err(|reason| NeuronError::InvalidSetting {
                    name: LINT_ENV,
                    value: text.to_string(),
                    reason,
                })?,
            },
        })
    }
}

/// A local cache folder: a plain path or a `file://` URL. Remote caches (`s3://`) are refused.
fn local_cache_root(name: &'static str, value: &str) -> Result<PathBuf, NeuronError> {
    let value = value.trim();
    if let Some(path) = value.strip_prefix("file://") {
        return Ok(PathBuf::from(path));
    }
    if value.contains("://") {
        return Err(NeuronError::InvalidSetting {
            name,
            value: value.to_string(),
            reason: "only a local folder is supported as the compile cache (no s3:// or other remote cache)".to_string(),
        });
    }
    Ok(PathBuf::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_torch_neuronx() {
        let settings = NeuronSettings::parse(&RawSettings::default()).unwrap();
        assert_eq!(settings.compiler, PathBuf::from("neuronx-cc"));
        assert_eq!(settings.target, NeuronTarget::Trn1);
        assert_eq!(settings.compiler_flags, ["--model-type", "transformer"]);
        assert_eq!(
            settings.cache_root,
            PathBuf::from("/var/tmp/neuron-compile-cache")
        );
        assert!(!settings.retry_failed);
        assert_eq!(settings.flash_attention, FlashAttention::Auto);
        assert_eq!(settings.kernel_tracer, None);
    }

    #[test]
    fn cache_flags_are_taken_out_of_the_compiler_flags() {
        let raw = RawSettings {
            flags: Some(
                "--model-type=transformer --cache_dir=/tmp/c -O1 --retry_failed_compilation".into(),
            ),
            cache_url: Some("/ignored".into()),
            target: Some("TRN2".into()),
            compiler: Some("/opt/cc".into()),
            flash_attention: Some("OFF".into()),
            kernel_tracer: Some("/opt/tracer".into()),
            lint: Some("warn".into()),
        };
        let settings = NeuronSettings::parse(&raw).unwrap();
        assert_eq!(settings.lint, LintMode::Warn);
        let bad = NeuronSettings::parse(&RawSettings {
            lint: Some("loud".into()),
            ..RawSettings::default()
        });
        assert!(
            matches!(&bad, Err(NeuronError::InvalidSetting { name, .. }) if *name == LINT_ENV),
            "{bad:?}"
        );
        assert_eq!(settings.compiler_flags, ["--model-type=transformer", "-O1"]);
        assert_eq!(settings.cache_root, PathBuf::from("/tmp/c"));
        assert!(settings.retry_failed);
        assert_eq!(settings.target, NeuronTarget::Trn2);
        assert_eq!(settings.compiler, PathBuf::from("/opt/cc"));
        assert_eq!(settings.flash_attention, FlashAttention::Off);
        assert_eq!(settings.kernel_tracer, Some(PathBuf::from("/opt/tracer")));
    }

    #[test]
    fn bad_values_are_named() {
        let parse = |raw: RawSettings| NeuronSettings::parse(&raw).unwrap_err().to_string();
        let error = parse(RawSettings {
            cache_url: Some("s3://bucket/cache".into()),
            ..Default::default()
        });
        assert!(
            error.contains("NEURON_COMPILE_CACHE_URL") && error.contains("s3://bucket/cache"),
            "{error}"
        );
        let error = parse(RawSettings {
            target: Some("inf1".into()),
            ..Default::default()
        });
        assert!(
            error.contains("HLAT_NEURON_TARGET") && error.contains("inf1"),
            "{error}"
        );
        let error = parse(RawSettings {
            flags: Some("--target trn2".into()),
            ..Default::default()
        });
        assert!(
            error.contains("NEURON_CC_FLAGS") && error.contains("HLAT_NEURON_TARGET"),
            "{error}"
        );
        let error = parse(RawSettings {
            flags: Some("--cache_dir".into()),
            ..Default::default()
        });
        assert!(error.contains("needs a path"), "{error}");
        let error = parse(RawSettings {
            flash_attention: Some("sometimes".into()),
            ..Default::default()
        });
        assert!(
            error.contains("HLAT_NEURON_FLASH_ATTENTION") && error.contains("sometimes"),
            "{error}"
        );
    }

    #[test]
    fn file_urls_are_local_paths() {
        let raw = RawSettings {
            cache_url: Some("file:///data/cache".into()),
            ..Default::default()
        };
        assert_eq!(
            NeuronSettings::parse(&raw).unwrap().cache_root,
            PathBuf::from("/data/cache")
        );
    }
}
