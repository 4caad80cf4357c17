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
    pub compiler_options: Vec<(String, OptionValue)>,
}

/// The value of one option: of an XLA compiler option (`OptionOverrideProto`) or of a client
/// create option (`PJRT_NamedValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// A boolean option.
    Bool(bool),
    /// An integer option.
    Int(i64),
    /// A floating-point option.
    Float(f64),
    /// A string (or enumeration) option.
    Text(String),
}

impl OptionValue {
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

    /// The `OptionOverrideProto` of this value.
    fn proto(&self) -> proto::OptionOverrideProto {
        use proto::OverrideValue;
        let value = match self {
            Self::Text(text) => OverrideValue::Text(text.clone()),
            Self::Bool(value) => OverrideValue::Bool(*value),
            Self::Int(value) => OverrideValue::Int(*value),
            Self::Float(value) => OverrideValue::Float(*value),
        };
        proto::OptionOverrideProto { value: Some(value) }
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
        use prost::Message;
        let device_assignment =
            (!self.device_ids.is_empty()).then(|| proto::DeviceAssignmentProto {
                replica_count: self.device_ids.len() as i32,
                computation_count: 1,
                computation_devices: vec![proto::ComputationDevice {
                    replica_device_ids: self.device_ids.clone(),
                }],
            });
        proto::CompileOptionsProto {
            executable_build_options: Some(proto::ExecutableBuildOptionsProto {
                num_replicas: self.num_replicas,
                num_partitions: self.num_partitions,
                device_assignment,
            }),
            env_option_overrides: self
                .compiler_options
                .iter()
                .map(|(name, value)| (name.clone(), value.proto()))
                .collect(),
        }
        .encode_to_vec()
    }
}

/// The fields of XLA's `CompileOptionsProto` (`xla/pjrt/proto/compile_options.proto`) and
/// `DeviceAssignmentProto` (`xla/xla_data.proto`) these options set, with their field numbers.
mod proto {
    use std::collections::BTreeMap;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CompileOptionsProto {
        #[prost(message, optional, tag = "3")]
        pub executable_build_options: Option<ExecutableBuildOptionsProto>,
        #[prost(btree_map = "string, message", tag = "7")]
        pub env_option_overrides: BTreeMap<String, OptionOverrideProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExecutableBuildOptionsProto {
        #[prost(int64, tag = "4")]
        pub num_replicas: i64,
        #[prost(int64, tag = "5")]
        pub num_partitions: i64,
        #[prost(message, optional, tag = "9")]
        pub device_assignment: Option<DeviceAssignmentProto>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeviceAssignmentProto {
        #[prost(int32, tag = "1")]
        pub replica_count: i32,
        #[prost(int32, tag = "2")]
        pub computation_count: i32,
        #[prost(message, repeated, tag = "3")]
        pub computation_devices: Vec<ComputationDevice>,
    }

    /// `DeviceAssignmentProto.ComputationDevice`: the device of each replica.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ComputationDevice {
        #[prost(int64, repeated, tag = "1")]
        pub replica_device_ids: Vec<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OptionOverrideProto {
        #[prost(oneof = "OverrideValue", tags = "1, 2, 3, 4")]
        pub value: Option<OverrideValue>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum OverrideValue {
        #[prost(string, tag = "1")]
        Text(String),
        #[prost(bool, tag = "2")]
        Bool(bool),
        #[prost(int64, tag = "3")]
        Int(i64),
        #[prost(double, tag = "4")]
        Float(f64),
    }
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

    /// The replicas' device ids are one packed repeated field, in replica order.
    #[test]
    fn replicas_are_assigned_in_order() {
        let bytes = CompileOptions::replicated(&[2, 3]).encode();
        assert_eq!(
            bytes,
            [
                0x1a, 0x10, 0x20, 0x02, 0x28, 0x01, 0x4a, 0x0a, 0x08, 0x02, 0x10, 0x01, 0x1a, 0x04,
                0x0a, 0x02, 0x02, 0x03
            ]
        );
    }

    #[test]
    fn compiler_options_are_map_entries_of_field_seven() {
        let options = CompileOptions {
            compiler_options: vec![
                ("a".into(), OptionValue::Bool(true)),
                ("b".into(), OptionValue::Int(-1)),
                ("c".into(), OptionValue::Float(0.5)),
                ("d".into(), OptionValue::Text("x".into())),
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
        use OptionValue::*;
        assert_eq!(OptionValue::from_text("true"), Bool(true));
        assert_eq!(OptionValue::from_text("false"), Bool(false));
        assert_eq!(OptionValue::from_text("0"), Int(0));
        assert_eq!(OptionValue::from_text("-3"), Int(-3));
        assert_eq!(OptionValue::from_text("0.25"), Float(0.25));
        assert_eq!(OptionValue::from_text("1e3"), Float(1000.0));
        assert_eq!(OptionValue::from_text("dot"), Text("dot".into()));
        assert_eq!(OptionValue::from_text("inf"), Text("inf".into()));
        assert_eq!(OptionValue::from_text("nan"), Text("nan".into()));
    }

    #[test]
    fn device_assignment_is_nested_under_field_nine() {
        let bytes = CompileOptions::on_device(3).encode();
        assert_eq!(
            bytes,
            [
                0x1a, 0x0f, 0x20, 0x01, 0x28, 0x01, 0x4a, 0x09, 0x08, 0x01, 0x10, 0x01, 0x1a, 0x03,
                0x0a, 0x01, 0x03
            ]
        );
    }
}
