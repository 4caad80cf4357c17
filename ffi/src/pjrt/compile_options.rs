/// The compile options passed with every program (a serialized `CompileOptionsProto`).
///
/// A plugin aborts the process when the build options lack the replica or partition count, so
/// both are always written.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileOptions {
    /// `executable_build_options.num_replicas`.
    pub num_replicas: i64,
    /// `executable_build_options.num_partitions`.
    pub num_partitions: i64,
    /// The PJRT device ids (`PJRT_DeviceDescription_Id`) replica 0, 1, ... runs on; empty lets
    /// the plugin choose.
    pub device_ids: Vec<i64>,
    /// XLA compiler options set for this compile only (`env_option_overrides`, JAX's
    /// `compiler_options`): each names a field of XLA's `DebugOptions`, the others keep the
    /// plugin's defaults (and `XLA_FLAGS`). A plugin refuses a name it does not know.
    pub compiler_options: Vec<(String, CompilerOptionValue)>,
}

/// The value of one XLA compiler option (`OptionOverrideProto`).
#[derive(Debug, Clone, PartialEq)]
pub enum CompilerOptionValue {
    /// A boolean option.
    Bool(bool),
    /// An integer option.
    Int(i64),
    /// A floating-point option.
    Float(f64),
    /// A string (or enumeration) option.
    Text(String),
}

impl CompilerOptionValue {
    /// The value `text` spells: `true`/`false`, an integer (`2`), a number with a point or an
    /// exponent (`0.5`, `1e3`: XLA refuses an integer for a floating-point option), else the
    /// text itself (`inf` and `nan` stay text).
    pub fn from_text(text: &str) -> Self {
        let looks_like_float =
            text.contains(|c: char| c.is_ascii_digit()) && text.contains(['.', 'e', 'E']);
        match text {
            "true" => Self::Bool(true),
            "false" => Self::Bool(false),
            _ => match (text.parse::<i64>(), text.parse::<f64>()) {
                (Ok(integer), _) => Self::Int(integer),
                (_, Ok(float)) if looks_like_float => Self::Float(float),
                _ => Self::Text(text.to_string()),
            },
        }
    }

    /// The serialized `OptionOverrideProto`.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Self::Text(text) => put_bytes_field(&mut out, 1, text.as_bytes()),
            Self::Bool(value) => put_varint_field(&mut out, 2, u64::from(*value)),
            Self::Int(value) => put_varint_field(&mut out, 3, *value as u64),
            Self::Float(value) => {
                put_varint(&mut out, (4 << 3) | 1);
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        out
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self {
            num_replicas: 1,
            num_partitions: 1,
            device_ids: Vec::new(),
            compiler_options: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// One replica, one partition, pinned to the device with PJRT id `device_id`.
    pub fn on_device(device_id: i64) -> Self {
        Self::replicated(&[device_id])
    }

    /// One replica per device of `device_ids` (replica `r` on `device_ids[r]`), one partition.
    pub fn replicated(device_ids: &[i64]) -> Self {
        Self {
            num_replicas: device_ids.len() as i64,
            num_partitions: 1,
            device_ids: device_ids.to_vec(),
            compiler_options: Vec::new(),
        }
    }

    /// The protobuf encoding of `CompileOptionsProto`.
    pub fn encode(&self) -> Vec<u8> {
        let mut build = Vec::new();
        put_varint_field(&mut build, 4, self.num_replicas as u64); // num_replicas
        put_varint_field(&mut build, 5, self.num_partitions as u64); // num_partitions
        if !self.device_ids.is_empty() {
            // DeviceAssignmentProto { replica_count: N, computation_count: 1,
            //   computation_devices: [{ replica_device_ids: [id of replica 0, ...] }] }
            let mut computation_device = Vec::new();
            for &device_id in &self.device_ids {
                put_varint_field(&mut computation_device, 1, device_id as u64);
            }
            let mut assignment = Vec::new();
            put_varint_field(&mut assignment, 1, self.device_ids.len() as u64);
            put_varint_field(&mut assignment, 2, 1);
            put_bytes_field(&mut assignment, 3, &computation_device);
            put_bytes_field(&mut build, 9, &assignment); // device_assignment
        }
        let mut options = Vec::new();
        put_bytes_field(&mut options, 3, &build); // executable_build_options
        for (name, value) in &self.compiler_options {
            let mut entry = Vec::new();
            put_bytes_field(&mut entry, 1, name.as_bytes());
            put_bytes_field(&mut entry, 2, &value.encode());
            put_bytes_field(&mut options, 7, &entry); // env_option_overrides
        }
        options
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    put_varint(out, field << 3);
    put_varint(out, value);
}

fn put_bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_varint(out, (field << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_are_the_smallest_working_bytes() {
        assert_eq!(
            CompileOptions::default().encode(),
            [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]
        );
    }

    #[test]
    fn replicas_are_assigned_in_order() {
        let bytes = CompileOptions::replicated(&[2, 3]).encode();
        assert_eq!(
            bytes,
            [
                0x1a, 0x10, 0x20, 0x02, 0x28, 0x01, 0x4a, 0x0a, 0x08, 0x02, 0x10, 0x01, 0x1a, 0x04,
                0x08, 0x02, 0x08, 0x03
            ]
        );
    }

    #[test]
    fn compiler_options_are_map_entries_of_field_seven() {
        let options = CompileOptions {
            compiler_options: vec![
                ("a".into(), CompilerOptionValue::Bool(true)),
                ("b".into(), CompilerOptionValue::Int(-1)),
                ("c".into(), CompilerOptionValue::Float(0.5)),
                ("d".into(), CompilerOptionValue::Text("x".into())),
            ],
            ..CompileOptions::default()
        };
        let bytes = options.encode();
        let mut expected = vec![0x1a, 0x04, 0x20, 0x01, 0x28, 0x01];
        expected.extend([0x3a, 0x07, 0x0a, 0x01, b'a', 0x12, 0x02, 0x10, 0x01]);
        expected.extend([0x3a, 0x10, 0x0a, 0x01, b'b', 0x12, 0x0b, 0x18]);
        expected.extend([0xff; 9]);
        expected.push(0x01);
        expected.extend([0x3a, 0x0e, 0x0a, 0x01, b'c', 0x12, 0x09, 0x21]);
        expected.extend(0.5f64.to_le_bytes());
        expected.extend([0x3a, 0x08, 0x0a, 0x01, b'd', 0x12, 0x03, 0x0a, 0x01, b'x']);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn compiler_option_values_are_read_from_text() {
        use CompilerOptionValue::*;
        assert_eq!(CompilerOptionValue::from_text("true"), Bool(true));
        assert_eq!(CompilerOptionValue::from_text("false"), Bool(false));
        assert_eq!(CompilerOptionValue::from_text("0"), Int(0));
        assert_eq!(CompilerOptionValue::from_text("-3"), Int(-3));
        assert_eq!(CompilerOptionValue::from_text("0.25"), Float(0.25));
        assert_eq!(CompilerOptionValue::from_text("1e3"), Float(1000.0));
        assert_eq!(CompilerOptionValue::from_text("dot"), Text("dot".into()));
        assert_eq!(CompilerOptionValue::from_text("inf"), Text("inf".into()));
        assert_eq!(CompilerOptionValue::from_text("nan"), Text("nan".into()));
    }

    #[test]
    fn device_assignment_is_nested_under_field_nine() {
        let bytes = CompileOptions::on_device(3).encode();
        assert_eq!(
            bytes,
            [
                0x1a, 0x0e, 0x20, 0x01, 0x28, 0x01, 0x4a, 0x08, 0x08, 0x01, 0x10, 0x01, 0x1a, 0x02,
                0x08, 0x03
            ]
        );
    }
}
