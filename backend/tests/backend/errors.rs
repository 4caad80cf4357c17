//! Errors of the `xla` executor are clear and never abort the process: a plugin path that does
//! not exist, a file that is not a plugin, a module the plugin rejects. (An unset
//! `TRAINIUM_PJRT_PLUGIN` is checked by the executor's unit tests, without touching the
//! environment of this process.)

use burn_trainium::hlo::{
    self, HloComputationProto, HloInstructionProto, HloModuleProto, PrimitiveType,
    ProgramShapeProto,
};
use prost::Message;
use trainium_ffi::pjrt::{Client, CompileOptions, PjrtError, Plugin, ProgramFormat};

use super::support;

#[test]
fn paths_that_are_not_plugins_are_reported_with_the_path() {
    let load_error = |path: &str| match Plugin::load(path) {
        Ok(_) => panic!("{path} loaded as a plugin"),
        Err(error) => error.to_string(),
    };
    let missing = load_error("/nonexistent/libpjrt_cpu.so");
    assert!(
        missing.contains("/nonexistent/libpjrt_cpu.so") && missing.contains("cannot load"),
        "{missing}"
    );
    let text_file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let not_a_plugin = load_error(text_file);
    assert!(
        not_a_plugin.contains("Cargo.toml") && not_a_plugin.contains("cannot load"),
        "{not_a_plugin}"
    );
}

/// `f32[2] add(f32[2], f32[3])`: well-formed protobuf, invalid HLO.
fn mismatched_add() -> Vec<u8> {
    let parameter = |id: i64, number: i64, size: i64| HloInstructionProto {
        name: format!("p{number}"),
        opcode: "parameter".into(),
        shape: Some(hlo::array_shape(PrimitiveType::F32, &[size])),
        parameter_number: number,
        id,
        ..Default::default()
    };
    let add = HloInstructionProto {
        name: "add".into(),
        opcode: "add".into(),
        shape: Some(hlo::array_shape(PrimitiveType::F32, &[2])),
        id: 3,
        operand_ids: vec![1, 2],
        ..Default::default()
    };
    let program_shape = ProgramShapeProto {
        parameters: vec![
            hlo::array_shape(PrimitiveType::F32, &[2]),
            hlo::array_shape(PrimitiveType::F32, &[3]),
        ],
        result: Some(hlo::array_shape(PrimitiveType::F32, &[2])),
        parameter_names: vec!["p0".into(), "p1".into()],
    };
    HloModuleProto {
        name: "mismatched".into(),
        entry_computation_name: "main".into(),
        computations: vec![HloComputationProto {
            name: "main".into(),
            instructions: vec![parameter(1, 0, 2), parameter(2, 1, 3), add],
            program_shape: Some(program_shape.clone()),
            id: 4,
            root_id: 3,
        }],
        host_program_shape: Some(program_shape),
        id: 1,
        entry_computation_id: 4,
        ..Default::default()
    }
    .encode_to_vec()
}

/// A module the plugin rejects is an error, and the process goes on.
#[test]
fn a_module_the_plugin_cannot_compile_is_an_error_not_an_abort() {
    let plugin = Plugin::load(support::plugin_path()).unwrap();
    let client = Client::new(&plugin, &[]).unwrap();
    let error = client
        .compile(
            &mismatched_add(),
            ProgramFormat::Hlo,
            &CompileOptions::default(),
        )
        .err()
        .expect("the plugin rejects the module");
    assert!(
        matches!(
            error,
            PjrtError::Call {
                function: "PJRT_Client_Compile",
                ..
            }
        ),
        "{error}"
    );
    assert!(!error.to_string().is_empty());
}
