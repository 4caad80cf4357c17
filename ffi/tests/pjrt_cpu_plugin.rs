//! The bindings against the XLA CPU plugin (`scripts/install-xla-cpu`).
//!
//! These tests fail, not skip, when the plugin is missing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use trainium_ffi::pjrt::{
    Client, CompileOptions, CreateOption, Distributed, ElementType, KeyValueError, KeyValueStore,
    OptionValue, PjrtError, Plugin, ProgramFormat,
};

fn plugin_path() -> PathBuf {
    let path = std::env::var_os("TRAINIUM_PJRT_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(
                ".cache/burn-trainium/xla-cpu-2026.6.23/fastatomstruct_xla_cpu/libpjrt_cpu.so",
            )
        });
    assert!(
        path.is_file(),
        "the XLA CPU PJRT plugin is missing at {}: run `scripts/install-xla-cpu` and set \
         TRAINIUM_PJRT_PLUGIN to the path it prints",
        path.display()
    );
    path
}

fn plugin() -> Arc<Plugin> {
    Plugin::load(plugin_path()).expect("the CPU plugin loads")
}

const ADD: &str = r#"
func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}
"#;

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

#[test]
fn compiles_uploads_runs_and_reads_back_on_every_device() {
    let plugin = plugin();
    assert_eq!(plugin.api_version().0, 0);
    let client = Client::new(
        &plugin,
        &[CreateOption::new("cpu_device_count", OptionValue::Int(2))],
    )
    .unwrap();
    assert_eq!(client.platform_name().unwrap(), "cpu");
    let version = client.platform_version().unwrap();
    assert!(
        !version.is_empty() && !version.contains('\0'),
        "{version:?}"
    );
    assert_eq!(client.devices().len(), 2);
    for device in client.devices() {
        assert!(!client.describe(device).unwrap().is_empty());
        assert_eq!(client.device_kind(device).unwrap().to_lowercase(), "cpu");
        let executable = client
            .compile(
                ADD.as_bytes(),
                ProgramFormat::Mlir,
                &CompileOptions::on_device(device.id),
            )
            .unwrap();
        assert_eq!(executable.num_outputs(), 1);
        let a = client
            .buffer_from_host(
                &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
                ElementType::F32,
                &[2, 3],
                device,
            )
            .unwrap();
        let b = client
            .buffer_from_host(
                &f32_bytes(&[10., 20., 30., 40., 50., 60.]),
                ElementType::F32,
                &[2, 3],
                device,
            )
            .unwrap();
        let outputs = executable.execute(&[&a, &b]).unwrap();
        let mut bytes = vec![0u8; 24];
        outputs[0].copy_to_host(&mut bytes).unwrap();
        assert_eq!(bytes, f32_bytes(&[11., 22., 33., 44., 55., 66.]));
    }
}

#[test]
fn a_program_the_plugin_rejects_is_an_error_with_its_message() {
    let client = Client::new(&plugin(), &[]).unwrap();
    let error = client
        .compile(
            b"this is not a module",
            ProgramFormat::Hlo,
            &CompileOptions::default(),
        )
        .err()
        .expect("garbage does not compile");
    match &error {
        PjrtError::Call {
            function, message, ..
        } => {
            assert_eq!(*function, "PJRT_Client_Compile");
            assert!(!message.is_empty(), "{error}");
        }
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn host_data_of_the_wrong_size_is_refused_before_the_plugin_sees_it() {
    let client = Client::new(&plugin(), &[]).unwrap();
    let device = client.devices()[0];
    let error = client
        .buffer_from_host(&[0u8; 7], ElementType::F32, &[2], &device)
        .unwrap_err();
    assert!(matches!(error, PjrtError::InvalidRequest(_)), "{error}");
}

#[test]
fn missing_and_non_library_files_are_load_errors() {
    let missing = Plugin::load("/nonexistent/libpjrt.so").unwrap_err();
    assert!(matches!(missing, PjrtError::Load { .. }), "{missing}");
    assert!(
        missing.to_string().contains("/nonexistent/libpjrt.so"),
        "{missing}"
    );
    let text_file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let not_a_library = Plugin::load(&text_file).unwrap_err();
    assert!(
        matches!(not_a_library, PjrtError::Load { .. }),
        "{not_a_library}"
    );
    assert!(
        not_a_library.to_string().contains("Cargo.toml"),
        "{not_a_library}"
    );
}

#[test]
fn compiler_options_reach_the_compiler_and_unknown_ones_are_refused_by_name() {
    let plugin = plugin();
    let client = Client::new(&plugin, &[]).unwrap();
    let device = &client.devices()[0];
    let mut options = CompileOptions::on_device(device.id);
    options.compiler_options = vec![
        (
            "xla_cpu_use_fusion_emitters".into(),
            OptionValue::Bool(false),
        ),
        ("xla_backend_optimization_level".into(), OptionValue::Int(0)),
    ];
    client
        .compile(ADD.as_bytes(), ProgramFormat::Mlir, &options)
        .expect("known compiler options compile");
    options.compiler_options = vec![("xla_no_such_option".into(), OptionValue::Bool(true))];
    let Err(error) = client.compile(ADD.as_bytes(), ProgramFormat::Mlir, &options) else {
        panic!("an unknown compiler option must be refused");
    };
    let message = error.to_string();
    assert!(
        message.contains("xla_no_such_option"),
        "the error names the option: {message}"
    );
}

/// A store that answers nothing: the CPU plugin never calls it.
struct Unreachable;

impl KeyValueStore for Unreachable {
    fn put(&self, _key: &[u8], _value: &[u8]) -> Result<(), KeyValueError> {
        Err(KeyValueError::Unavailable("no job".into()))
    }

    fn get(&self, _key: &[u8], _timeout: Duration) -> Result<Vec<u8>, KeyValueError> {
        Err(KeyValueError::Unavailable("no job".into()))
    }

    fn try_get(&self, _key: &[u8]) -> Result<Option<Vec<u8>>, KeyValueError> {
        Err(KeyValueError::Unavailable("no job".into()))
    }
}

#[test]
fn the_cpu_plugin_does_not_join_other_processes() {
    // It takes the distributed options without a word and makes a client of its own devices:
    // every device it reports is addressable (what `burn-trainium` checks before refusing).
    let plugin = plugin();
    let options = [CreateOption::new("cpu_device_count", OptionValue::Int(2))];
    let client = Client::joining(
        &plugin,
        &options,
        &Distributed {
            node_id: 1,
            num_nodes: 2,
            store: Arc::new(Unreachable),
        },
    )
    .unwrap();
    let global: Vec<i64> = client
        .global_devices()
        .unwrap()
        .iter()
        .map(|d| d.id)
        .collect();
    let local: Vec<i64> = client.devices().iter().map(|d| d.id).collect();
    assert_eq!(local.len(), 2);
    assert_eq!(global, local);
}
