//! A collective as a captured operation: [`Collective`] and its encoding as Burn's
//! `OperationIr::Custom` (the only place Burn's IR leaves for operations of a backend's own).

use core::fmt;

use burn_ir::{CustomOpIr, TensorIr};

use super::{ReplicaGroups, SourceTargetPairs};

/// The prefix of the custom operation ids of collectives, as captured.
const PREFIX: &str = "trainium.collective/";

/// The id of the custom operation that carries a collective from a Burn device to the server of
/// a Trainium device; the collective travels in its scalars ([`Collective::to_scalars`]).
pub const REMOTE_OPERATION: &str = "burn_trainium.collective";

/// How an all-reduce combines the replicas of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The sum divided by the group size.
    Mean,
    /// The elementwise maximum.
    Max,
}

impl ReduceOp {
    fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max]
            .into_iter()
            .find(|op| op.name() == text)
    }
}

/// One collective operation over the replicas of a device. Every replica of a group runs it
/// together; replica `r` sees its own input and gets its own output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Each replica gets the reduction of its group's inputs (same shape).
    AllReduce {
        /// The reduction.
        op: ReduceOp,
        /// The groups.
        groups: ReplicaGroups,
    },
    /// Each replica gets its group's inputs concatenated along `dim`, in group order.
    AllGather {
        /// The dimension that grows by the group size.
        dim: usize,
        /// The groups.
        groups: ReplicaGroups,
    },
    /// The group's inputs are summed and cut along `dim` into one chunk per member; each
    /// replica gets the chunk of its position in the group.
    ReduceScatter {
        /// The dimension that shrinks by the group size.
        dim: usize,
        /// The groups.
        groups: ReplicaGroups,
    },
    /// Each replica cuts its input along `dim` into one chunk per member of its group and sends
    /// chunk `j` to the group's `j`-th member; it gets the chunks sent to it joined along `dim`,
    /// in group order (same shape): the token exchange of expert parallelism. Its own inverse.
    AllToAll {
        /// The dimension cut and joined.
        dim: usize,
        /// The groups.
        groups: ReplicaGroups,
    },
    /// Each replica keeps the chunk of its position in its group along `dim` (no
    /// communication: the inverse of an all-gather).
    Split {
        /// The dimension that shrinks by the group size.
        dim: usize,
        /// The groups.
        groups: ReplicaGroups,
    },
    /// Each replica passes its input to the replica it is paired with (XLA's
    /// `collective-permute`); a replica that is no pair's target gets zeros.
    Permute {
        /// Who sends to whom.
        pairs: SourceTargetPairs,
    },
    /// Returns its inputs unchanged, but a compiler may not move computation across it (XLA's
    /// `opt-barrier`): recomputation stays where it is written.
    Barrier,
}

impl Collective {
    /// The custom operation that captures this collective.
    pub fn to_ir(&self, inputs: Vec<TensorIr>, outputs: Vec<TensorIr>) -> CustomOpIr {
        CustomOpIr {
            id: format!("{PREFIX}{self}"),
            inputs,
            outputs,
            scalars: Vec::new(),
        }
    }

    /// The collective as the scalars of the custom operation that carries it to a device server
    /// ([`REMOTE_OPERATION`]): the bytes of its text form.
    pub fn to_scalars(&self) -> Vec<burn_ir::ScalarIr> {
        self.to_string()
            .bytes()
            .map(|byte| burn_ir::ScalarIr::UInt(u64::from(byte)))
            .collect()
    }

    /// The collective [`to_scalars`](Self::to_scalars) encoded.
    pub fn from_scalars(scalars: &[burn_ir::ScalarIr]) -> Result<Self, String> {
        let bytes: Vec<u8> = scalars
            .iter()
            .map(|scalar| u8::try_from(scalar.elem::<u64>()))
            .collect::<Result<_, _>>()
            .map_err(|_| "a collective's scalars are bytes".to_string())?;
        let text = String::from_utf8(bytes).map_err(|error| error.to_string())?;
        Self::parse(&text).map_err(|reason| format!("collective `{text}`: {reason}"))
    }

    /// The collective a custom operation captures: `None` for custom operations of others, an
    /// error for a malformed collective.
    pub fn from_ir(custom: &CustomOpIr) -> Option<Result<Self, String>> {
        let text = custom.id.strip_prefix(PREFIX)?;
        Some(Self::parse(text).map_err(|reason| format!("collective `{text}`: {reason}")))
    }

    fn parse(text: &str) -> Result<Self, String> {
        let mut parts = text.split('/');
        let kind = parts.next().unwrap_or_default();
        let mut field = |name: &str| {
            parts
                .next()
                .ok_or_else(|| format!("`{name}` is missing"))
                .map(str::to_string)
        };
        let dim = |text: String| {
            text.strip_prefix("dim=")
                .and_then(|dim| dim.parse::<usize>().ok())
                .ok_or_else(|| format!("`{text}` is not `dim=N`"))
        };
        Ok(match kind {
            "all_reduce" => {
                let op = field("op")?;
                Collective::AllReduce {
                    op: ReduceOp::parse(&op).ok_or_else(|| format!("unknown reduction `{op}`"))?,
                    groups: ReplicaGroups::parse(&field("groups")?)?,
                }
            }
            "all_gather" => Collective::AllGather {
                dim: dim(field("dim")?)?,
                groups: ReplicaGroups::parse(&field("groups")?)?,
            },
            "reduce_scatter" => Collective::ReduceScatter {
                dim: dim(field("dim")?)?,
                groups: ReplicaGroups::parse(&field("groups")?)?,
            },
            "all_to_all" => Collective::AllToAll {
                dim: dim(field("dim")?)?,
                groups: ReplicaGroups::parse(&field("groups")?)?,
            },
            "split" => Collective::Split {
                dim: dim(field("dim")?)?,
                groups: ReplicaGroups::parse(&field("groups")?)?,
            },
            "permute" => Collective::Permute {
                pairs: SourceTargetPairs::parse(&field("pairs").unwrap_or_default())?,
            },
            "barrier" => Collective::Barrier,
            other => return Err(format!("unknown collective `{other}`")),
        })
    }

    /// The groups it runs over (`None` for the barrier, which involves no other replica, and
    /// for the permute, which names pairs instead).
    pub fn groups(&self) -> Option<&ReplicaGroups> {
        match self {
            Collective::AllReduce { groups, .. }
            | Collective::AllGather { groups, .. }
            | Collective::ReduceScatter { groups, .. }
            | Collective::AllToAll { groups, .. }
            | Collective::Split { groups, .. } => Some(groups),
            Collective::Permute { .. } | Collective::Barrier => None,
        }
    }

    /// Checks that the replicas it names are the device's `0..replicas` (groups: covered
    /// exactly once).
    pub fn check_replicas(&self, replicas: usize) -> Result<(), super::GroupsError> {
        match self {
            Collective::Permute { pairs } => pairs.check_within(replicas),
            other => other
                .groups()
                .map_or(Ok(()), |groups| groups.check_covers(replicas)),
        }
    }

    /// Whether replicas exchange data (everything but the split and the barrier).
    pub fn communicates(&self) -> bool {
        !matches!(self, Collective::Split { .. } | Collective::Barrier)
    }

    /// The output shape for an input of `shape`, or why the input does not fit.
    pub fn output_shape(&self, shape: &[usize]) -> Result<Vec<usize>, String> {
        let mut out = shape.to_vec();
        match self {
            Collective::AllReduce { .. } | Collective::Permute { .. } | Collective::Barrier => {}
            Collective::AllGather { dim, groups } => {
                let size = out.get_mut(*dim).ok_or_else(|| rank_error(*dim, shape))?;
                *size *= groups.group_size();
            }
            Collective::ReduceScatter { dim, groups }
            | Collective::Split { dim, groups }
            | Collective::AllToAll { dim, groups } => {
                let size = out.get_mut(*dim).ok_or_else(|| rank_error(*dim, shape))?;
                if *size % groups.group_size() != 0 {
                    return Err(format!(
                        "dimension {dim} of {shape:?} does not divide into {} chunks",
                        groups.group_size()
                    ));
                }
                if !matches!(self, Collective::AllToAll { .. }) {
                    *size /= groups.group_size();
                }
            }
        }
        Ok(out)
    }
}

fn rank_error(dim: usize, shape: &[usize]) -> String {
    format!("dimension {dim} does not exist in a tensor of shape {shape:?}")
}

impl fmt::Display for Collective {
    /// The form kept in the custom operation id: `all_reduce/sum/0,1;2,3`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Collective::AllReduce { op, groups } => {
                write!(formatter, "all_reduce/{}/{groups}", op.name())
            }
            Collective::AllGather { dim, groups } => {
                write!(formatter, "all_gather/dim={dim}/{groups}")
            }
            Collective::ReduceScatter { dim, groups } => {
                write!(formatter, "reduce_scatter/dim={dim}/{groups}")
            }
            Collective::AllToAll { dim, groups } => {
                write!(formatter, "all_to_all/dim={dim}/{groups}")
            }
            Collective::Split { dim, groups } => write!(formatter, "split/dim={dim}/{groups}"),
            Collective::Permute { pairs } => write!(formatter, "permute/{pairs}"),
            Collective::Barrier => formatter.write_str("barrier"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_collective_round_trips_through_its_custom_operation() {
        let groups = ReplicaGroups::contiguous(4, 2).unwrap();
        for collective in [
            Collective::AllReduce {
                op: ReduceOp::Mean,
                groups: groups.clone(),
            },
            Collective::AllGather {
                dim: 1,
                groups: groups.clone(),
            },
            Collective::ReduceScatter {
                dim: 0,
                groups: groups.clone(),
            },
            Collective::Split {
                dim: 2,
                groups: ReplicaGroups::all(4),
            },
            Collective::AllToAll {
                dim: 1,
                groups: groups.clone(),
            },
            Collective::Permute {
                pairs: SourceTargetPairs::shift(&groups, 1, true),
            },
            Collective::Permute {
                pairs: SourceTargetPairs::new(Vec::new()).unwrap(),
            },
            Collective::Barrier,
        ] {
            let custom = collective.to_ir(Vec::new(), Vec::new());
            assert_eq!(Collective::from_ir(&custom), Some(Ok(collective.clone())));
            assert_eq!(
                Collective::from_scalars(&collective.to_scalars()),
                Ok(collective)
            );
        }
        let other = CustomOpIr {
            id: "someone.else".into(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            scalars: Vec::new(),
        };
        assert!(Collective::from_scalars(&[burn_ir::ScalarIr::UInt(300)]).is_err());
        assert_eq!(Collective::from_ir(&other), None);
        let broken = CustomOpIr {
            id: format!("{PREFIX}all_gather/dim=x/0,1"),
            ..other
        };
        assert!(Collective::from_ir(&broken).unwrap().is_err());
    }

    #[test]
    fn shapes_grow_and_shrink_by_the_group_size() {
        let groups = ReplicaGroups::contiguous(4, 2).unwrap();
        let gather = Collective::AllGather {
            dim: 1,
            groups: groups.clone(),
        };
        assert_eq!(gather.output_shape(&[3, 5]).unwrap(), [3, 10]);
        let exchange = Collective::AllToAll {
            dim: 1,
            groups: groups.clone(),
        };
        assert_eq!(exchange.output_shape(&[3, 4]).unwrap(), [3, 4]);
        assert!(exchange.output_shape(&[3, 5]).is_err());
        let scatter = Collective::ReduceScatter { dim: 0, groups };
        assert_eq!(scatter.output_shape(&[4, 5]).unwrap(), [2, 5]);
        assert!(scatter.output_shape(&[3, 5]).is_err());
        assert!(scatter.output_shape(&[]).is_err());
    }
}
