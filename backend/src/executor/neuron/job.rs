//! The Neuron runtime's settings for one process of a job of several (torchrun, Slurm): which
//! NeuronCores the process may use, and where the ranks of collective programs meet. The runtime
//! reads both when it starts (`nrt_init`), so they are set before the device opens.

use super::{ROOT_COMM_ID_ENV, VISIBLE_CORES_ENV};
use crate::TrainiumDevice;
use crate::distributed::share;

/// How far above the launcher's `MASTER_PORT` the Neuron collectives meet: torchrun's store
/// holds `MASTER_PORT` itself and the job's exchange the port after it.
pub const ROOT_COMM_PORT_OFFSET: u16 = 2;

/// One process of a job, as the Neuron runtime needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronProcess {
    /// The process's rank on its node.
    pub local_rank: usize,
    /// The device's replicas this process drives (one NeuronCore each).
    pub local_replicas: usize,
    /// The first NeuronCore of the node the job's processes use (`neuron:N`).
    pub first_core: usize,
    /// The host of rank 0.
    pub master_addr: String,
    /// The launcher's port on rank 0's host.
    pub master_port: u16,
}

/// The runtime variables of `process`: `NEURON_RT_VISIBLE_CORES` names its own cores (process
/// `l` of a node takes the `l`-th run of `local_replicas` cores from `first_core`), and
/// `NEURON_RT_ROOT_COMM_ID` is rank 0's host with [`ROOT_COMM_PORT_OFFSET`] above its
/// `MASTER_PORT`, the same in every process.
pub fn process_environment(process: &NeuronProcess) -> Result<Vec<(&'static str, String)>, String> {
    if process.local_replicas == 0 {
        return Err("a process of the job holds no replica of the device".into());
    }
    let first = process.local_rank * process.local_replicas + process.first_core;
    let last = first + process.local_replicas - 1;
    let cores = match first == last {
        true => first.to_string(),
        false => format!("{first}-{last}"),
    };
    let port = process
        .master_port
        .checked_add(ROOT_COMM_PORT_OFFSET)
        .ok_or_else(|| {
            format!(
                "MASTER_PORT {} leaves no port {ROOT_COMM_PORT_OFFSET} above it for the Neuron \
                 collectives (set {ROOT_COMM_ID_ENV}=HOST:PORT)",
                process.master_port
            )
        })?;
    Ok(vec![
        (VISIBLE_CORES_ENV, cores),
        (ROOT_COMM_ID_ENV, format!("{}:{port}", process.master_addr)),
    ])
}

/// Checks that this process (rank `rank` of its job) meets the others where rank 0 does: every
/// process publishes its `NEURON_RT_ROOT_COMM_ID` in the job's key-value store and compares it
/// with rank 0's (each process's runtime reads its own environment, so a launcher that set the
/// variable differently on some node would otherwise hang the collectives).
pub(crate) fn agree_on_root_comm_id(device: &TrainiumDevice, rank: usize) -> Result<(), String> {
    let ours = crate::settings::NEURON_RT_ROOT_COMM_ID
        .var()
        .unwrap_or_default();
    let every = share(
        &format!("burn-trainium/{device}/root-comm-id"),
        ours.as_bytes(),
    )
    .map_err(|error| error.to_string())?;
    let theirs = String::from_utf8_lossy(&every[0]);
    if theirs != ours {
        return Err(format!(
            "{ROOT_COMM_ID_ENV} is `{ours}` in process {rank} but `{theirs}` in rank 0: every \
             process must meet rank 0's collectives there (unset it to let `hlat` set it)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(local_rank: usize, local_replicas: usize, first_core: usize) -> NeuronProcess {
        NeuronProcess {
            local_rank,
            local_replicas,
            first_core,
            master_addr: "node-001".into(),
            master_port: 29500,
        }
    }

    #[test]
    fn each_process_of_a_node_sees_its_own_cores_and_all_meet_at_rank_0() {
        // trn1.32xlarge, one process per node: all 32 cores.
        assert_eq!(
            process_environment(&process(0, 32, 0)).unwrap(),
            [
                (VISIBLE_CORES_ENV, "0-31".to_string()),
                (ROOT_COMM_ID_ENV, "node-001:29502".to_string()),
            ]
        );
        // Four processes of 8 cores: the third takes 16-23.
        assert_eq!(
            process_environment(&process(2, 8, 0)).unwrap()[0],
            (VISIBLE_CORES_ENV, "16-23".to_string())
        );
        // One core each, from core 4 on.
        assert_eq!(
            process_environment(&process(1, 1, 4)).unwrap()[0],
            (VISIBLE_CORES_ENV, "5".to_string())
        );
    }

    #[test]
    fn unusable_processes_are_refused() {
        assert!(
            process_environment(&process(0, 0, 0))
                .unwrap_err()
                .contains("no replica")
        );
        let high = NeuronProcess {
            master_port: u16::MAX - 1,
            ..process(0, 1, 0)
        };
        assert!(
            process_environment(&high)
                .unwrap_err()
                .contains(ROOT_COMM_ID_ENV)
        );
    }
}
