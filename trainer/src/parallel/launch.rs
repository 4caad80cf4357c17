//! Where this process sits in a multi-process job, read from its launcher's environment:
//! torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`) or Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, the tasks per node,
//! the first host of `SLURM_JOB_NODELIST`). torchrun's win when both are set (`srun torchrun ...`
//! runs workers whose Slurm variables describe the launcher, not them); neither is one process.
//! A process counts as launched when `RANK`, `WORLD_SIZE`, `LOCAL_RANK` or `LOCAL_WORLD_SIZE` is
//! set (torchrun), or `SLURM_PROCID` (a task of a Slurm job step); then every variable of its set
//! must be there and agree.

use std::fmt;

/// The launcher a process group was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: one process.
    None,
    /// torchrun (or any launcher setting its variables).
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Launcher::None => "no launcher",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
        })
    }
}

/// The default port of the first process (torchrun's).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// This process's place in its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessGroup {
    /// Where the values came from.
    pub launcher: Launcher,
    /// This process's rank in the job.
    pub rank: usize,
    /// Processes in the job.
    pub world_size: usize,
    /// This process's rank on its node.
    pub local_rank: usize,
    /// Processes on each node.
    pub local_world_size: usize,
    /// Where rank 0 listens: its host.
    pub master_addr: String,
    /// And its port.
    pub master_port: u16,
}

/// Why the launcher's environment does not describe a process group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// A variable of a launcher's set is missing.
    #[error("{launcher} environment: `{variable}` is not set ({present} is)")]
    Missing {
        /// The launcher whose other variables are set.
        launcher: Launcher,
        /// The missing variable.
        variable: &'static str,
        /// One that is set.
        present: &'static str,
    },
    /// A variable has a value that cannot be used.
    #[error("{launcher} environment: `{variable}={value}`: {reason}")]
    Invalid {
        /// The launcher.
        launcher: Launcher,
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The variables disagree with one another.
    #[error("{launcher} environment is inconsistent: {reason}")]
    Inconsistent {
        /// The launcher.
        launcher: Launcher,
        /// What disagrees.
        reason: String,
    },
}

/// The variables that say a process was started by torchrun (`MASTER_ADDR` and `MASTER_PORT`
/// alone do not: they are set for other tools too).
const TORCHRUN: [&str; 4] = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"];
/// The variable that says a process is a task of a Slurm job step (an `salloc` shell has the
/// job's variables but is no task).
const SLURM: [&str; 1] = ["SLURM_PROCID"];

impl ProcessGroup {
    /// One process: rank 0 of 1.
    pub fn single() -> Self {
        ProcessGroup {
            launcher: Launcher::None,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "localhost".into(),
            master_port: DEFAULT_MASTER_PORT,
        }
    }

    /// The process group of this process's environment.
    pub fn from_env() -> Result<Self, LaunchError> {
        Self::from_variables(|name| std::env::var(name).ok())
    }

    /// The process group the variables `variable` returns describe.
    pub fn from_variables(variable: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchError> {
        let group = if let Some(present) = TORCHRUN.iter().find(|name| variable(name).is_some()) {
            torchrun(&variable, present)?
        } else if let Some(present) = SLURM.iter().find(|name| variable(name).is_some()) {
            slurm(&variable, present)?
        } else {
            return Ok(Self::single());
        };
        group.check()?;
        Ok(group)
    }

    /// The node this process runs on (processes are numbered node by node).
    pub fn node(&self) -> usize {
        self.rank / self.local_world_size
    }

    /// Nodes in the job.
    pub fn nodes(&self) -> usize {
        self.world_size / self.local_world_size
    }

    fn check(&self) -> Result<(), LaunchError> {
        let inconsistent = |reason: String| LaunchError::Inconsistent {
            launcher: self.launcher,
            reason,
        };
        if self.rank >= self.world_size {
            return Err(inconsistent(format!(
                "rank {} is not below the world size {}",
                self.rank, self.world_size
            )));
        }
        if self.local_rank >= self.local_world_size {
            return Err(inconsistent(format!(
                "local rank {} is not below the processes per node {}",
                self.local_rank, self.local_world_size
            )));
        }
        if !self.world_size.is_multiple_of(self.local_world_size) {
            return Err(inconsistent(format!(
                "{} processes do not fill nodes of {} each (every node must run as many)",
                self.world_size, self.local_world_size
            )));
        }
        if self.rank % self.local_world_size != self.local_rank {
            return Err(inconsistent(format!(
                "rank {} is local rank {} on nodes of {}, not {}",
                self.rank,
                self.rank % self.local_world_size,
                self.local_world_size,
                self.local_rank
            )));
        }
        Ok(())
    }
}

/// Reads a variable of `launcher`'s set, which must be present.
fn required(
    variable: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    name: &'static str,
    present: &'static str,
) -> Result<String, LaunchError> {
    variable(name).ok_or(LaunchError::Missing {
        launcher,
        variable: name,
        present,
    })
}

/// Parses a count or an index.
fn number<T>(
    launcher: Launcher,
    name: &'static str,
    value: &str,
    minimum: T,
) -> Result<T, LaunchError>
where
    T: std::str::FromStr + PartialOrd + fmt::Display,
{
    let invalid = |reason: String| LaunchError::Invalid {
        launcher,
        variable: name,
        value: value.to_string(),
        reason,
    };
    let parsed: T = value
        .trim()
        .parse()
        .map_err(|_| invalid("not a whole number".into()))?;
    if parsed < minimum {
        return Err(invalid(format!("must be at least {minimum}")));
    }
    Ok(parsed)
}

fn torchrun(
    variable: &impl Fn(&str) -> Option<String>,
    present: &'static str,
) -> Result<ProcessGroup, LaunchError> {
    let launcher = Launcher::Torchrun;
    let get = |name| required(variable, launcher, name, present);
    let address = get("MASTER_ADDR")?;
    if address.trim().is_empty() {
        return Err(LaunchError::Invalid {
            launcher,
            variable: "MASTER_ADDR",
            value: address,
            reason: "empty".into(),
        });
    }
    Ok(ProcessGroup {
        launcher,
        rank: number(launcher, "RANK", &get("RANK")?, 0)?,
        world_size: number(launcher, "WORLD_SIZE", &get("WORLD_SIZE")?, 1)?,
        local_rank: number(launcher, "LOCAL_RANK", &get("LOCAL_RANK")?, 0)?,
        local_world_size: number(launcher, "LOCAL_WORLD_SIZE", &get("LOCAL_WORLD_SIZE")?, 1)?,
        master_addr: address.trim().to_string(),
        master_port: number(launcher, "MASTER_PORT", &get("MASTER_PORT")?, 1)?,
    })
}

fn slurm(
    variable: &impl Fn(&str) -> Option<String>,
    present: &'static str,
) -> Result<ProcessGroup, LaunchError> {
    let launcher = Launcher::Slurm;
    let get = |name| required(variable, launcher, name, present);
    let nodelist = get("SLURM_JOB_NODELIST")?;
    let master_addr = match variable("MASTER_ADDR") {
        Some(address) if !address.trim().is_empty() => address.trim().to_string(),
        _ => first_host(&nodelist).map_err(|reason| LaunchError::Invalid {
            launcher,
            variable: "SLURM_JOB_NODELIST",
            value: nodelist.clone(),
            reason,
        })?,
    };
    let local_world_size = match variable("SLURM_NTASKS_PER_NODE") {
        Some(count) => number(launcher, "SLURM_NTASKS_PER_NODE", &count, 1)?,
        None => {
            let spec = required(variable, launcher, "SLURM_TASKS_PER_NODE", present)?;
            uniform_tasks_per_node(&spec).map_err(|reason| LaunchError::Invalid {
                launcher,
                variable: "SLURM_TASKS_PER_NODE",
                value: spec.clone(),
                reason,
            })?
        }
    };
    let master_port = match variable("MASTER_PORT") {
        Some(port) => number(launcher, "MASTER_PORT", &port, 1)?,
        None => DEFAULT_MASTER_PORT,
    };
    Ok(ProcessGroup {
        launcher,
        rank: number(launcher, "SLURM_PROCID", &get("SLURM_PROCID")?, 0)?,
        world_size: number(launcher, "SLURM_NTASKS", &get("SLURM_NTASKS")?, 1)?,
        local_rank: number(launcher, "SLURM_LOCALID", &get("SLURM_LOCALID")?, 0)?,
        local_world_size,
        master_addr,
        master_port,
    })
}

/// The first host of a Slurm node list: `trn1-[003-005,9],login` → `trn1-003`.
pub fn first_host(nodelist: &str) -> Result<String, String> {
    let first = nodelist.trim();
    // The first entry ends at the first comma outside brackets.
    let mut depth = 0;
    let end = first
        .char_indices()
        .find(|&(_, character)| {
            match character {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => return true,
                _ => {}
            }
            false
        })
        .map_or(first.len(), |(index, _)| index);
    let entry = &first[..end];
    let host = match entry.split_once('[') {
        None => entry.to_string(),
        Some((prefix, rest)) => {
            let ranges = rest
                .strip_suffix(']')
                .ok_or_else(|| format!("`{entry}` has an unclosed `[`"))?;
            let first_range = ranges.split(',').next().unwrap_or_default();
            let start = first_range.split('-').next().unwrap_or_default();
            if start.is_empty() || !start.chars().all(|c| c.is_ascii_digit()) {
                return Err(format!("`{entry}` has no node number in its brackets"));
            }
            format!("{prefix}{start}")
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    Ok(host)
}

/// The tasks per node of a Slurm `SLURM_TASKS_PER_NODE` value (`4(x2)`, `4,4`), which must be
/// the same on every node.
fn uniform_tasks_per_node(spec: &str) -> Result<usize, String> {
    let mut counts = Vec::new();
    for part in spec.split(',') {
        let count = part.split('(').next().unwrap_or_default().trim();
        counts.push(
            count
                .parse::<usize>()
                .ok()
                .filter(|count| *count > 0)
                .ok_or_else(|| format!("`{part}` is not a task count"))?,
        );
    }
    match counts.as_slice() {
        [first, rest @ ..] if rest.iter().all(|count| count == first) => Ok(*first),
        [_, ..] => Err("nodes run different numbers of tasks; every node must run as many".into()),
        [] => Err("empty".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn group(variables: &[(&str, &str)]) -> Result<ProcessGroup, LaunchError> {
        let map: HashMap<String, String> = variables
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        ProcessGroup::from_variables(|name| map.get(name).cloned())
    }

    const TORCHRUN_RANK_5: &[(&str, &str)] = &[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29400"),
    ];

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(group(&[]).unwrap(), ProcessGroup::single());
    }

    #[test]
    fn torchrun_variables_give_rank_world_and_master() {
        let group = group(TORCHRUN_RANK_5).unwrap();
        assert_eq!(group.launcher, Launcher::Torchrun);
        assert_eq!((group.rank, group.world_size), (5, 8));
        assert_eq!((group.local_rank, group.local_world_size), (1, 4));
        assert_eq!((group.node(), group.nodes()), (1, 2));
        assert_eq!(
            (group.master_addr.as_str(), group.master_port),
            ("10.0.0.1", 29400)
        );
    }

    #[test]
    fn slurm_variables_give_rank_world_and_the_first_host() {
        let group = group(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_NODELIST", "trn1-[007-008]"),
        ])
        .unwrap();
        assert_eq!(group.launcher, Launcher::Slurm);
        assert_eq!((group.rank, group.world_size, group.local_rank), (6, 8, 2));
        assert_eq!((group.local_world_size, group.node()), (4, 1));
        assert_eq!(
            (group.master_addr.as_str(), group.master_port),
            ("trn1-007", DEFAULT_MASTER_PORT)
        );
    }

    #[test]
    fn a_shell_of_a_slurm_allocation_is_one_process() {
        let shell = [("SLURM_NTASKS", "8"), ("SLURM_JOB_NODELIST", "trn1-[1-2]")];
        assert_eq!(group(&shell).unwrap(), ProcessGroup::single());
        assert_eq!(
            group(&[("MASTER_ADDR", "x")]).unwrap(),
            ProcessGroup::single()
        );
    }

    #[test]
    fn torchrun_inside_slurm_takes_torchruns_variables() {
        let mut variables = TORCHRUN_RANK_5.to_vec();
        variables.extend([("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
        assert_eq!(group(&variables).unwrap().rank, 5);
    }

    #[test]
    fn node_lists_name_their_first_host() {
        for (list, host) in [
            ("node1", "node1"),
            ("node1,node2", "node1"),
            ("trn1-[003-005,9],login", "trn1-003"),
            ("gpu[12]", "gpu12"),
        ] {
            assert_eq!(first_host(list).unwrap(), host, "{list}");
        }
        assert!(first_host("gpu[").is_err());
        assert!(first_host("gpu[a-b]").is_err());
    }

    #[test]
    fn missing_invalid_and_inconsistent_sets_are_named() {
        let without = |name: &str| -> Vec<(&str, &str)> {
            TORCHRUN_RANK_5
                .iter()
                .copied()
                .filter(|(n, _)| *n != name)
                .collect()
        };
        let with = |name: &'static str, value: &'static str| -> Vec<(&str, &str)> {
            TORCHRUN_RANK_5
                .iter()
                .map(|&(n, v)| if n == name { (n, value) } else { (n, v) })
                .collect()
        };
        /// Variables, and what the error must name.
        type Case<'a> = (Vec<(&'a str, &'a str)>, &'a [&'a str]);
        let cases: Vec<Case<'_>> = vec![
            (without("MASTER_PORT"), &["MASTER_PORT", "torchrun"]),
            (without("LOCAL_RANK"), &["LOCAL_RANK"]),
            (
                with("WORLD_SIZE", "two"),
                &["WORLD_SIZE=two", "whole number"],
            ),
            (with("WORLD_SIZE", "0"), &["WORLD_SIZE=0", "at least 1"]),
            (with("MASTER_PORT", "70000"), &["MASTER_PORT=70000"]),
            (with("RANK", "8"), &["rank 8", "world size 8"]),
            (with("LOCAL_RANK", "4"), &["local rank 4"]),
            (with("LOCAL_RANK", "0"), &["rank 5 is local rank 1"]),
            (with("WORLD_SIZE", "6"), &["6 processes", "nodes of 4"]),
            (
                vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
                &["Slurm", "SLURM_JOB_NODELIST", "SLURM_PROCID"],
            ),
            (
                vec![
                    ("SLURM_PROCID", "0"),
                    ("SLURM_NTASKS", "3"),
                    ("SLURM_LOCALID", "0"),
                    ("SLURM_TASKS_PER_NODE", "2,1"),
                    ("SLURM_JOB_NODELIST", "a,b"),
                ],
                &["SLURM_TASKS_PER_NODE=2,1", "different numbers"],
            ),
        ];
        for (variables, names) in cases {
            let error = group(&variables).unwrap_err().to_string();
            for name in names {
                assert!(
                    error.contains(name),
                    "{variables:?}: `{name}` not in {error}"
                );
            }
        }
    }
}
