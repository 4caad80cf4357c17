//! Source–target pairs: where each replica's value goes in a collective permute.

use core::fmt;

use super::{GroupsError, ReplicaGroups};

/// The pairs of a collective permute, e.g. `0>1,1>2,2>3` (each replica passes its value to the
/// next one, as pipeline stages pass activations). Each replica is the source of at most one
/// pair and the target of at most one; a replica that is no pair's target receives zeros.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceTargetPairs {
    pairs: Vec<(usize, usize)>,
}

impl SourceTargetPairs {
    /// Pairs as written; a replica may be the source of one pair and the target of one.
    pub fn new(pairs: Vec<(usize, usize)>) -> Result<Self, GroupsError> {
        let pairs = Self { pairs };
        let written = pairs.to_string();
        let mut sources = std::collections::HashSet::new();
        let mut targets = std::collections::HashSet::new();
        for &(source, target) in &pairs.pairs {
            for (replica, seen) in [(source, &mut sources), (target, &mut targets)] {
                if !seen.insert(replica) {
                    return Err(GroupsError::Repeated {
                        replica,
                        groups: written,
                    });
                }
            }
        }
        Ok(pairs)
    }

    /// Within each group, member `i` sends to member `i + offset`: members shifted past either
    /// end wrap around when `cyclic`, and are dropped otherwise (so the first members of a
    /// forward shift receive zeros). `shift(&[[0, 1, 2]], 1, false)` is `0>1,1>2`.
    pub fn shift(groups: &ReplicaGroups, offset: isize, cyclic: bool) -> Self {
        let size = groups.group_size() as isize;
        let pairs = groups
            .groups()
            .iter()
            .flat_map(|group| {
                group
                    .iter()
                    .enumerate()
                    .filter_map(move |(position, &source)| {
                        let target = position as isize + offset;
                        let target = if cyclic {
                            target.rem_euclid(size)
                        } else if (0..size).contains(&target) {
                            target
                        } else {
                            return None;
                        };
                        Some((source, group[target as usize]))
                    })
            })
            .collect();
        Self { pairs }
    }

    /// The pairs.
    pub fn pairs(&self) -> &[(usize, usize)] {
        &self.pairs
    }

    /// The same pairs, the other way round: the permute that carries gradients back.
    pub fn reversed(&self) -> Self {
        Self {
            pairs: self
                .pairs
                .iter()
                .map(|&(source, target)| (target, source))
                .collect(),
        }
    }

    /// The replica whose value `target` receives, if any.
    pub fn source_of(&self, target: usize) -> Option<usize> {
        self.pairs
            .iter()
            .find(|&&(_, to)| to == target)
            .map(|&(source, _)| source)
    }

    /// Checks that every replica named is one of the device's `0..replicas`.
    pub fn check_within(&self, replicas: usize) -> Result<(), GroupsError> {
        let within = self
            .pairs
            .iter()
            .all(|&(source, target)| source < replicas && target < replicas);
        if within {
            Ok(())
        } else {
            Err(GroupsError::Coverage {
                groups: self.to_string(),
                replicas,
            })
        }
    }

    /// Parses the form [`fmt::Display`] writes: `0>1,1>2` (empty: no pair).
    pub fn parse(text: &str) -> Result<Self, String> {
        let pairs = text
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (source, target) = pair
                    .split_once('>')
                    .ok_or_else(|| format!("`{pair}` is not `SOURCE>TARGET`"))?;
                let replica = |text: &str| {
                    text.trim()
                        .parse::<usize>()
                        .map_err(|_| format!("`{text}` is not a replica index"))
                };
                Ok((replica(source)?, replica(target)?))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Self::new(pairs).map_err(|error| error.to_string())
    }
}

impl fmt::Display for SourceTargetPairs {
    /// Pairs separated by `,`, each `source>target`: `0>1,1>2`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self
            .pairs
            .iter()
            .map(|(source, target)| format!("{source}>{target}"))
            .collect();
        formatter.write_str(&pairs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_pass_values_along_each_group() {
        let stages = ReplicaGroups::strided(6, 2).unwrap(); // [[0, 2, 4], [1, 3, 5]]
        let forward = SourceTargetPairs::shift(&stages, 1, false);
        assert_eq!(forward.pairs(), [(0, 2), (2, 4), (1, 3), (3, 5)]);
        assert_eq!(forward.source_of(4), Some(2));
        assert_eq!(forward.source_of(0), None);
        assert_eq!(forward.reversed().pairs(), [(2, 0), (4, 2), (3, 1), (5, 3)]);
        let around = SourceTargetPairs::shift(&stages, -1, true);
        assert_eq!(around.source_of(4), Some(0));
        assert_eq!(around.source_of(5), Some(1));
    }

    #[test]
    fn text_round_trips_and_repeated_replicas_are_refused() {
        let pairs = SourceTargetPairs::new(vec![(0, 1), (1, 0)]).unwrap();
        assert_eq!(pairs.to_string(), "0>1,1>0");
        assert_eq!(SourceTargetPairs::parse("0>1,1>0").unwrap(), pairs);
        assert_eq!(SourceTargetPairs::parse("").unwrap().pairs(), []);
        assert!(SourceTargetPairs::new(vec![(0, 1), (0, 2)]).is_err());
        assert!(SourceTargetPairs::new(vec![(0, 2), (1, 2)]).is_err());
        assert!(SourceTargetPairs::parse("0-1").is_err());
        assert!(pairs.check_within(2).is_ok());
        assert!(pairs.check_within(1).is_err());
    }
}
