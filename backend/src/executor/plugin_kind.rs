//! Which PJRT plugin the `xla` executor loaded, and what each needs from its environment: the
//! XLA CPU plugin is sized by the `cpu_device_count` create option; the Neuron SDK's plugin
//! (`libneuronxla`'s `libneuronpjrt.so`, the route AWS supports for training on trn1 through
//! JAX) reads its multi-process topology from `NEURON_PJRT_PROCESS_INDEX` and
//! `NEURON_PJRT_PROCESSES_NUM_DEVICES` instead of the create options JAX's distributed client
//! passes, and picks its NeuronCores by `NEURON_RT_VISIBLE_CORES`.

use std::path::Path;

use trainium_ffi::pjrt::{CreateOption, OptionValue};

/// The Neuron plugin's variable naming this process's index in the job.
pub const NEURON_PROCESS_INDEX_ENV: &str = crate::settings::NEURON_PJRT_PROCESS_INDEX.name;
/// The Neuron plugin's variable listing the NeuronCores of every process of the job.
pub const NEURON_PROCESS_DEVICES_ENV: &str =
    crate::settings::NEURON_PJRT_PROCESSES_NUM_DEVICES.name;

/// A family of PJRT plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// The Neuron SDK's plugin (`libneuronxla`).
    Neuron,
    /// JAX's CUDA or ROCm plugin (`jax_plugins/xla_cuda13/xla_cuda_plugin.so`).
    Gpu,
    /// Any other plugin (XLA's CPU plugin): configured by create options.
    Xla,
}

impl PluginKind {
    /// The kind of the plugin at `path`, from what its file or folder name says.
    pub fn of(path: &Path) -> Self {
        let names = |test: fn(&str) -> bool| {
            [path.file_name(), path.parent().and_then(Path::file_name)]
                .into_iter()
                .flatten()
                .any(|part| test(&part.to_string_lossy().to_lowercase()))
        };
        if names(|part| part.contains("neuronpjrt") || part == "libneuronxla") {
            PluginKind::Neuron
        } else if names(|part| part.contains("cuda") || part.contains("rocm")) {
            PluginKind::Gpu
        } else {
            PluginKind::Xla
        }
    }

    /// What the log calls a plugin of this kind.
    pub fn describe(self) -> &'static str {
        match self {
            PluginKind::Neuron => "the Neuron SDK's plugin",
            PluginKind::Gpu => "a GPU plugin",
            PluginKind::Xla => "an XLA plugin",
        }
    }

    /// The client create options a plugin of this kind gets unless `TRAINIUM_PJRT_CREATE_OPTIONS`
    /// says otherwise. The CUDA plugin refuses option names it does not know (the XLA CPU plugin
    /// ignores them), so each kind gets its own:
    /// a GPU plugin takes its memory as it needs it (its default preallocates 75% of the GPU at
    /// start, which a second process on the GPU, PyTorch beside it say, then lacks); the others
    /// make `cpu_devices` devices when they are the XLA CPU plugin.
    pub fn default_create_options(self, cpu_devices: i64) -> Vec<CreateOption> {
        match self {
            PluginKind::Gpu => vec![CreateOption::new("preallocate", OptionValue::Bool(false))],
            PluginKind::Neuron | PluginKind::Xla => vec![CreateOption::new(
                "cpu_device_count",
                OptionValue::Int(cpu_devices),
            )],
        }
    }

    /// Why this plugin cannot join a job of `processes` processes, each with `devices` devices,
    /// as process `index`, given the environment's `variable` values: the Neuron plugin needs its
    /// two topology variables set and consistent with the job.
    pub fn job_environment_error(
        self,
        index: usize,
        processes: usize,
        devices: usize,
        variable: impl Fn(&str) -> Option<String>,
    ) -> Option<String> {
        if self != PluginKind::Neuron {
            return None;
        }
        let expected_devices = vec![devices.to_string(); processes].join(",");
        let expected = format!(
            "{NEURON_PROCESS_INDEX_ENV}={index} {NEURON_PROCESS_DEVICES_ENV}={expected_devices}"
        );
        let index_value = variable(NEURON_PROCESS_INDEX_ENV);
        let devices_value = variable(NEURON_PROCESS_DEVICES_ENV);
        let consistent = index_value.as_deref().map(str::trim) == Some(&index.to_string())
            && devices_value.as_deref().is_some_and(|list| {
                list.split(',').count() == processes
                    && list
                        .split(',')
                        .all(|count| count.trim().parse::<usize>().is_ok())
            });
        (!consistent).then(|| {
            format!(
                "the Neuron PJRT plugin takes a job's topology from its environment, not from \
                 the launcher: this process (index {index} of {processes}) has \
                 {NEURON_PROCESS_INDEX_ENV}={} and {NEURON_PROCESS_DEVICES_ENV}={}; set {expected} \
                 (and NEURON_RT_VISIBLE_CORES to this process's cores) before starting it",
                index_value.as_deref().unwrap_or("(unset)"),
                devices_value.as_deref().unwrap_or("(unset)"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_neuron_plugin_is_known_by_its_library_or_package() {
        let neuron = [
            "/venv/lib/python3.11/site-packages/libneuronxla/libneuronpjrt.so",
            "/opt/libneuronxla/pjrt.so",
            "/tmp/libneuronpjrt.so",
        ];
        for path in neuron {
            assert_eq!(
                PluginKind::of(Path::new(path)),
                PluginKind::Neuron,
                "{path}"
            );
        }
        let xla = ["/cache/burn-trainium/xla-cpu-2026.6.23/fastatomstruct_xla_cpu/libpjrt_cpu.so"];
        for path in xla {
            assert_eq!(PluginKind::of(Path::new(path)), PluginKind::Xla, "{path}");
        }
        let gpu = [
            "/site-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "/opt/torch/.venv/lib/python3.12/site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so",
            "/site-packages/jax_plugins/xla_rocm7/xla_rocm_plugin.so",
        ];
        for path in gpu {
            assert_eq!(PluginKind::of(Path::new(path)), PluginKind::Gpu, "{path}");
        }
    }

    #[test]
    fn a_gpu_plugin_is_not_given_the_cpu_plugins_option() {
        let names = |kind: PluginKind| -> Vec<String> {
            kind.default_create_options(4)
                .into_iter()
                .map(|option| option.name)
                .collect()
        };
        assert_eq!(names(PluginKind::Gpu), ["preallocate"]);
        assert_eq!(names(PluginKind::Xla), ["cpu_device_count"]);
    }

    #[test]
    fn a_neuron_job_needs_its_topology_variables() {
        fn environment(
            index: Option<&'static str>,
            devices: Option<&'static str>,
        ) -> impl Fn(&str) -> Option<String> {
            move |name| match name {
                NEURON_PROCESS_INDEX_ENV => index.map(str::to_string),
                NEURON_PROCESS_DEVICES_ENV => devices.map(str::to_string),
                _ => None,
            }
        }
        let unset = PluginKind::Neuron
            .job_environment_error(1, 2, 16, environment(None, None))
            .unwrap();
        assert!(
            unset.contains("NEURON_PJRT_PROCESS_INDEX=(unset)")
                && unset.contains(
                    "NEURON_PJRT_PROCESS_INDEX=1 NEURON_PJRT_PROCESSES_NUM_DEVICES=16,16"
                ),
            "{unset}"
        );
        let wrong_index = PluginKind::Neuron.job_environment_error(
            1,
            2,
            16,
            environment(Some("0"), Some("16,16")),
        );
        assert!(wrong_index.is_some());
        let too_few =
            PluginKind::Neuron.job_environment_error(1, 2, 16, environment(Some("1"), Some("16")));
        assert!(too_few.is_some());
        assert_eq!(
            PluginKind::Neuron.job_environment_error(
                1,
                2,
                16,
                environment(Some("1"), Some("16,16"))
            ),
            None
        );
        assert_eq!(
            PluginKind::Xla.job_environment_error(1, 2, 16, environment(None, None)),
            None
        );
    }
}
