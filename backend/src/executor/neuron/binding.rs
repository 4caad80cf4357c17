use trainium_ffi::nrt::{ModelTensorInfo, TensorUsage};

/// One tensor of a loaded NEFF tied to a position of the HLO module it was compiled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundTensor {
    /// The name `nrt_get_model_tensor_info` reports; tensor sets are keyed by it.
    pub name: String,
    /// The HLO parameter number (inputs) or the element of the result tuple (outputs).
    pub position: usize,
    /// Size in bytes, as the runtime reports it.
    pub size: usize,
}

/// How the tensors of a NEFF map to the parameters and results of its HLO module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The NEFF's inputs, in parameter order. A parameter the compiler removed (unused) has none.
    pub inputs: Vec<BoundTensor>,
    /// The NEFF's outputs, one per element of the result tuple, in order.
    pub outputs: Vec<BoundTensor>,
}

/// The number at the end of `name` after `prefix` (`input3` → 3).
fn position(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix)
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()
}

/// Binds the tensors a NEFF reports to a module with `parameters` parameters and `results`
/// elements in its result tuple.
///
/// The rule is `input<N>` for parameter N and `output<N>` for element N of the result tuple:
/// the names torch-neuronx gives NEFF tensors, which it requests through the frontend attributes
/// `neff_input_names` / `neff_output_names` that [`super::request_neff_names`] adds here too.
/// Any other name, a parameter out of range, a missing result or a duplicate is an error naming
/// every tensor, so a NEFF that does not follow the rule fails loudly instead of binding data
/// to the wrong tensor.
pub fn bind(
    infos: &[ModelTensorInfo],
    parameters: usize,
    results: usize,
) -> Result<Binding, String> {
    let listing = || {
        infos
            .iter()
            .map(|info| format!("{} ({:?}, {} bytes)", info.name, info.usage, info.size))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut inputs = Vec::new();
    let mut outputs: Vec<Option<BoundTensor>> = vec![None; results];
    for info in infos {
        let (prefix, limit) = match info.usage {
            TensorUsage::Input => ("input", parameters),
            TensorUsage::Output => ("output", results),
        };
        let index = position(&info.name, prefix).filter(|&index| index < limit).ok_or_else(|| {
            format!(
                "NEFF tensor `{}` is not `{prefix}<N>` with N below {limit}; the NEFF reports: {}",
                info.name,
                listing()
            )
        })?;
        let bound = BoundTensor {
            name: info.name.clone(),
            position: index,
            size: info.size,
        };
        let duplicate = match info.usage {
            TensorUsage::Input => {
                let seen = inputs
                    .iter()
                    .any(|input: &BoundTensor| input.position == index);
                inputs.push(bound);
                seen
            }
            TensorUsage::Output => outputs[index].replace(bound).is_some(),
        };
        if duplicate {
            return Err(format!(
                "NEFF tensor `{}` appears twice; the NEFF reports: {}",
                info.name,
                listing()
            ));
        }
    }
    inputs.sort_by_key(|input| input.position);
    let outputs = outputs
        .into_iter()
        .enumerate()
        .map(|(index, output)| {
            output.ok_or_else(|| {
                format!("the NEFF has no `output{index}`; it reports: {}", listing())
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Binding { inputs, outputs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, usage: TensorUsage, size: usize) -> ModelTensorInfo {
        ModelTensorInfo {
            name: name.to_string(),
            usage,
            size,
            dtype_code: 0,
            shape: vec![],
        }
    }

    #[test]
    fn tensors_bind_by_their_numbers_not_their_order() {
        let infos = [
            info("output1", TensorUsage::Output, 8),
            info("input2", TensorUsage::Input, 4),
            info("input0", TensorUsage::Input, 16),
            info("output0", TensorUsage::Output, 12),
        ];
        let binding = bind(&infos, 3, 2).unwrap();
        let inputs: Vec<_> = binding
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), t.position, t.size))
            .collect();
        assert_eq!(inputs, [("input0", 0, 16), ("input2", 2, 4)]);
        let outputs: Vec<_> = binding
            .outputs
            .iter()
            .map(|t| (t.name.as_str(), t.position, t.size))
            .collect();
        assert_eq!(outputs, [("output0", 0, 12), ("output1", 1, 8)]);
    }

    #[test]
    fn unexpected_names_are_reported_with_the_whole_listing() {
        let infos = [
            info("p0.1", TensorUsage::Input, 4),
            info("output0", TensorUsage::Output, 4),
        ];
        let error = bind(&infos, 1, 1).unwrap_err();
        assert!(
            error.contains("`p0.1`") && error.contains("output0 (Output, 4 bytes)"),
            "{error}"
        );

        let error = bind(&[info("input5", TensorUsage::Input, 4)], 2, 0).unwrap_err();
        assert!(error.contains("N below 2"), "{error}");

        let error = bind(&[info("output0", TensorUsage::Output, 4)], 0, 2).unwrap_err();
        assert!(error.contains("no `output1`"), "{error}");

        let twice = [
            info("input0", TensorUsage::Input, 4),
            info("input0", TensorUsage::Input, 4),
        ];
        assert!(bind(&twice, 1, 0).unwrap_err().contains("appears twice"));
    }
}
