//! Replica groups: which replicas of a device take part in one collective together.

use core::fmt;

/// Why a set of replica groups was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupsError {
    /// No group, or an empty group.
    #[error("replica groups must be non-empty: {0}")]
    Empty(String),
    /// Groups of different sizes (all-gather and reduce-scatter need one size).
    #[error("replica groups must all have the same size: {0}")]
    UnequalSizes(String),
    /// A replica listed twice.
    #[error("replica {replica} appears twice in {groups}")]
    Repeated {
        /// The replica.
        replica: usize,
        /// The groups, as written.
        groups: String,
    },
    /// The groups do not cover the replicas of the device exactly once.
    #[error("replica groups {groups} do not cover the {replicas} replicas of the device exactly")]
    Coverage {
        /// The groups, as written.
        groups: String,
        /// The device's replica count.
        replicas: usize,
    },
}

/// A partition of a device's replicas into groups of equal size, e.g. `[[0, 1], [2, 3]]` (the
/// tensor-parallel pairs of a 2 × 2 layout) or `[[0, 1, 2, 3]]` (all of them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReplicaGroups {
    groups: Vec<Vec<usize>>,
}

impl ReplicaGroups {
    /// Groups as written; each replica may appear once, every group has the same size.
    pub fn new(groups: Vec<Vec<usize>>) -> Result<Self, GroupsError> {
        let groups = Self { groups };
        let written = groups.to_string();
        let size = groups.groups.first().map_or(0, Vec::len);
        if size == 0 {
            return Err(GroupsError::Empty(written));
        }
        if groups.groups.iter().any(|group| group.len() != size) {
            return Err(GroupsError::UnequalSizes(written));
        }
        let mut seen = std::collections::HashSet::new();
        for &replica in groups.groups.iter().flatten() {
            if !seen.insert(replica) {
                return Err(GroupsError::Repeated {
                    replica,
                    groups: written,
                });
            }
        }
        Ok(groups)
    }

    /// One group holding replicas `0..replicas`.
    pub fn all(replicas: usize) -> Self {
        Self {
            groups: vec![(0..replicas.max(1)).collect()],
        }
    }

    /// Consecutive groups of `size` replicas out of `replicas`: `[[0, 1], [2, 3]]` for
    /// `contiguous(4, 2)` (the inner dimension of a layout).
    pub fn contiguous(replicas: usize, size: usize) -> Result<Self, GroupsError> {
        Self::new(
            (0..replicas / size.max(1))
                .map(|group| (group * size..(group + 1) * size).collect())
                .collect(),
        )
    }

    /// Groups of `replicas / stride` replicas `stride` apart: `[[0, 2], [1, 3]]` for
    /// `strided(4, 2)` (the outer dimension of a layout).
    pub fn strided(replicas: usize, stride: usize) -> Result<Self, GroupsError> {
        Self::new(
            (0..stride)
                .map(|first| (first..replicas).step_by(stride.max(1)).collect())
                .collect(),
        )
    }

    /// The groups.
    pub fn groups(&self) -> &[Vec<usize>] {
        &self.groups
    }

    /// How many replicas each group holds.
    pub fn group_size(&self) -> usize {
        self.groups[0].len()
    }

    /// How many replicas the groups hold together.
    pub fn replica_count(&self) -> usize {
        self.groups.len() * self.group_size()
    }

    /// Checks that the groups cover replicas `0..replicas` exactly once.
    pub fn check_covers(&self, replicas: usize) -> Result<(), GroupsError> {
        let covered = self.replica_count() == replicas
            && self
                .groups
                .iter()
                .flatten()
                .all(|&replica| replica < replicas);
        if covered {
            Ok(())
        } else {
            Err(GroupsError::Coverage {
                groups: self.to_string(),
                replicas,
            })
        }
    }

    /// The group of `replica` and its position in it.
    pub fn locate(&self, replica: usize) -> Option<(&[usize], usize)> {
        self.groups.iter().find_map(|group| {
            group
                .iter()
                .position(|&member| member == replica)
                .map(|rank| (group.as_slice(), rank))
        })
    }

    /// Parses the form [`fmt::Display`] writes: `0,1;2,3`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let groups = text
            .split(';')
            .map(|group| {
                group
                    .split(',')
                    .map(|replica| {
                        replica
                            .trim()
                            .parse::<usize>()
                            .map_err(|_| format!("`{replica}` is not a replica index"))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(groups).map_err(|error| error.to_string())
    }
}

impl fmt::Display for ReplicaGroups {
    /// Groups separated by `;`, replicas by `,`: `0,1;2,3`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let groups: Vec<String> = self
            .groups
            .iter()
            .map(|group| {
                group
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        formatter.write_str(&groups.join(";"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_make_the_groups_of_a_two_by_two_mesh() {
        assert_eq!(
            ReplicaGroups::contiguous(4, 2).unwrap().groups(),
            [vec![0, 1], vec![2, 3]]
        );
        assert_eq!(
            ReplicaGroups::strided(4, 2).unwrap().groups(),
            [vec![0, 2], vec![1, 3]]
        );
        assert_eq!(ReplicaGroups::all(4).groups(), [vec![0, 1, 2, 3]]);
    }

    #[test]
    fn text_round_trips_and_bad_groups_are_refused() {
        let groups = ReplicaGroups::new(vec![vec![1, 0], vec![3, 2]]).unwrap();
        assert_eq!(groups.to_string(), "1,0;3,2");
        assert_eq!(ReplicaGroups::parse("1,0;3,2").unwrap(), groups);
        assert_eq!(groups.locate(2), Some(([3, 2].as_slice(), 1)));
        assert!(groups.check_covers(4).is_ok());
        assert!(groups.check_covers(8).is_err());
        assert!(matches!(
            ReplicaGroups::new(vec![vec![0, 1], vec![2]]),
            Err(GroupsError::UnequalSizes(_))
        ));
        assert!(matches!(
            ReplicaGroups::new(vec![vec![0, 1], vec![1, 2]]),
            Err(GroupsError::Repeated { replica: 1, .. })
        ));
        assert!(ReplicaGroups::new(vec![]).is_err());
        assert!(ReplicaGroups::parse("0,x").is_err());
    }
}
