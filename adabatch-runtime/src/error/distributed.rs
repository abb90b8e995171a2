//! Ranks, devices and communicators.

/// Ranks, devices and communicators.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistributedError {
    /// Ranks disagree on the model's parameters.
    #[error("rank {rank} has different parameters than rank 0: {detail}")]
    ParameterMismatch {
        /// The disagreeing rank.
        rank: usize,
        /// What differs.
        detail: String,
    },
    /// The run cannot continue on one rank because another rank failed.
    #[error("rank {rank} stopped because another rank failed")]
    PeerFailed {
        /// The rank reporting.
        rank: usize,
    },
    /// A rank's thread panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The device could not be used; the driver's error, if any, is the source.
    #[error("device `{spec}`: {reason}")]
    Device {
        /// The device as given (`cpu`, `cuda:1`, ...).
        spec: String,
        /// Why it cannot be used, or what failed.
        reason: String,
        /// The underlying error.
        #[source]
        source: Option<super::Cause>,
    },
    /// The multi-node rendezvous failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A call into NCCL or the CUDA driver failed; the library's error, where it
    /// is one, is the source, else `detail` holds its code.
    #[error("{library} {call}: {detail}")]
    Library {
        /// `NCCL` or `CUDA`.
        library: &'static str,
        /// The call or collective.
        call: String,
        /// The library's result code and message, or what failed.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<super::Cause>,
    },
    /// A rank waited longer than the timeout for its peers in a collective.
    #[error("{collective}: rank {rank} waited {waited:?} for its peers (a rank died or stopped calling collectives); communicator aborted")]
    PeersTimedOut {
        /// The collective.
        collective: String,
        /// The rank that waited.
        rank: usize,
        /// How long.
        waited: std::time::Duration,
    },
    /// The ranks put all-reduces of different lengths into one collective.
    #[error("all-reduce size mismatch: rank 0 sent {expected} values, rank {rank} sent {sent}")]
    AllReduceSizeMismatch {
        /// Rank 0's length.
        expected: usize,
        /// The first rank that differs.
        rank: usize,
        /// Its length.
        sent: usize,
    },
    /// A collective's inputs do not fit it: a tensor on another device, a root
    /// outside the world, a size NCCL cannot take, an id of the wrong length, a
    /// buffer not on CUDA or not contiguous, a state that arrived incomplete.
    #[error("communicator: {detail}")]
    CollectiveInput {
        /// What does not fit.
        detail: String,
    },
}

/// Why a rendezvous failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// Rank 0 waited `waited` and these ranks never arrived.
    #[error("rendezvous timed out after {waited:?}: rank(s) {missing:?} of {world_size} did not arrive at {addr}")]
    Timeout {
        /// Ranks that did not connect.
        missing: Vec<usize>,
        /// World size expected.
        world_size: usize,
        /// The rendezvous address.
        addr: String,
        /// How long rank 0 waited.
        waited: std::time::Duration,
    },
    /// A peer could not reach rank 0 before its deadline; the last I/O error,
    /// if one ended it, is the source.
    #[error("rank {rank}: rank 0 did not answer at {addr} within {waited:?} (last: {doing})")]
    MasterUnreachable {
        /// The rank reporting.
        rank: usize,
        /// The rendezvous address.
        addr: String,
        /// How long the peer tried.
        waited: std::time::Duration,
        /// What it was doing when it gave up.
        doing: String,
        /// The I/O error then.
        #[source]
        source: Option<std::sync::Arc<std::io::Error>>,
    },
    /// Rank 0 gave up and told this peer why.
    #[error("rank {rank}: rank 0 aborted the rendezvous: {message}")]
    Aborted {
        /// The rank reporting.
        rank: usize,
        /// Rank 0's message.
        message: String,
    },
    /// A peer sent something that does not fit the group.
    #[error("rendezvous protocol: {0}")]
    Protocol(String),
    /// The address could not be used; the I/O error, if any, is the source.
    #[error("rendezvous address {addr}: {detail}")]
    Address {
        /// The address.
        addr: String,
        /// What could not be done.
        detail: String,
        /// The I/O error.
        #[source]
        source: Option<std::sync::Arc<std::io::Error>>,
    },
    /// A torchrun variable is missing or malformed; the parse error, if any, is
    /// the source.
    #[error("environment variable {var}: {detail}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        detail: String,
        /// The parse error.
        #[source]
        source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
    },
}
