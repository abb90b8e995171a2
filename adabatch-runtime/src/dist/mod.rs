//! Talking between ranks: the communicator trait and its backends, the TCP
//! rendezvous of multi-node runs, and the `--device` parser.

pub mod communicator;
pub mod cpu_threads;
pub mod device_spec;
#[cfg(feature = "nccl")]
pub mod nccl;
pub(crate) mod parameters;
#[cfg(any(test, feature = "internals", feature = "nccl"))]
pub mod rendezvous;
